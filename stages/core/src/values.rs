//! Value checks on every batch a table reader yields or a writer takes: float
//! values (also inside lists) must be finite, and integer columns that declare
//! `range = [lo, hi]` in their schema file must hold values inside it. One NaN
//! in `steps.old_values` would otherwise turn every advantage of a GAE batch
//! into NaN with exit 0; a `step_index` of `i32::MAX` would size buffers.
//!
//! ```
//! # use std::sync::Arc;
//! # use arrow::array::{Float32Array, RecordBatch};
//! # use arrow::datatypes::{DataType, Field, Schema};
//! # use embodyflow_core::values::first_bad_value;
//! # use embodyflow_schemas::TableName;
//! let def = TableName::Rewards.def();
//! let schema = Arc::new(Schema::new(vec![Field::new("score", DataType::Float32, false)]));
//! let scores = Float32Array::from(vec![1.0, f32::NAN]);
//! let batch = RecordBatch::try_new(schema, vec![Arc::new(scores)]).unwrap();
//! let bad = first_bad_value(def, &batch).unwrap();
//! assert_eq!((bad.column.as_str(), bad.row), ("score", 1));
//! ```

use arrow::array::{Array, ArrayRef, AsArray, ListArray, RecordBatch};
use arrow::datatypes::{DataType, Float32Type, Float64Type, Int8Type, Int32Type, Int64Type};
use embodyflow_schemas::TableDef;

/// The first value of a batch that breaks its column's rule.
#[derive(Debug, Clone, PartialEq)]
pub struct BadValue {
    /// Column name.
    pub column: String,
    /// Row index inside the batch.
    pub row: usize,
    /// What was found and what is allowed, e.g. `NaN (floats must be finite)`.
    pub found: String,
}

/// Whether every value is finite: blocks of 256 checked without branching
/// (the compiler vectorises the block), the search stopping at the first
/// block that fails.
fn all_finite<T>(values: &[T], finite: impl Fn(&T) -> bool) -> bool {
    values
        .chunks(256)
        .all(|block| block.iter().fold(true, |all, v| all & finite(v)))
}

/// Index of the first non-finite non-null value of a float array.
fn first_non_finite(array: &dyn Array) -> Option<(usize, f64)> {
    let check = |i: usize, v: f64| (!v.is_finite() && array.is_valid(i)).then_some((i, v));
    match array.data_type() {
        DataType::Float32 => {
            let values = array.as_primitive::<Float32Type>().values();
            if all_finite(values, |v: &f32| v.is_finite()) {
                return None;
            }
            values
                .iter()
                .enumerate()
                .find_map(|(i, &v)| check(i, v as f64))
        }
        DataType::Float64 => {
            let values = array.as_primitive::<Float64Type>().values();
            if all_finite(values, |v: &f64| v.is_finite()) {
                return None;
            }
            values.iter().enumerate().find_map(|(i, &v)| check(i, v))
        }
        _ => None,
    }
}

/// Index and value of the first non-null integer outside `[lo, hi]`.
fn first_out_of_range(array: &dyn Array, lo: i64, hi: i64) -> Option<(usize, i64)> {
    let values: Box<dyn Iterator<Item = (usize, i64)>> = match array.data_type() {
        DataType::Int8 => Box::new(
            array
                .as_primitive::<Int8Type>()
                .values()
                .iter()
                .enumerate()
                .map(|(i, &v)| (i, v as i64)),
        ),
        DataType::Int32 => Box::new(
            array
                .as_primitive::<Int32Type>()
                .values()
                .iter()
                .enumerate()
                .map(|(i, &v)| (i, v as i64)),
        ),
        DataType::Int64 => Box::new(
            array
                .as_primitive::<Int64Type>()
                .values()
                .iter()
                .enumerate()
                .map(|(i, &v)| (i, v)),
        ),
        _ => return None,
    };
    let mut values = values;
    values.find(|&(i, v)| (v < lo || v > hi) && array.is_valid(i))
}

/// The first bad value of `batch` (columns named as in `def`; columns the
/// batch does not hold are not checked), in column order.
pub fn first_bad_value(def: &TableDef, batch: &RecordBatch) -> Option<BadValue> {
    for (field, array) in batch.schema().fields().iter().zip(batch.columns()) {
        let Some(column) = def.column(field.name()) else {
            continue;
        };
        if let Some([lo, hi]) = column.range
            && let Some((row, v)) = first_out_of_range(array.as_ref(), lo, hi)
        {
            return Some(BadValue {
                column: column.name.clone(),
                row,
                found: format!("{v} (allowed: {lo} to {hi})"),
            });
        }
        let found = match array.data_type() {
            DataType::Float32 | DataType::Float64 => first_non_finite(array.as_ref()),
            DataType::List(_) => {
                let list = array.as_list::<i32>();
                let offsets = list.value_offsets();
                let (start, items) = list_items(list);
                first_non_finite(items.as_ref()).and_then(|(j, v)| {
                    let item = start + j;
                    // The row whose [offset, next offset) holds the item.
                    let row = offsets.partition_point(|&o| o as usize <= item) - 1;
                    list.is_valid(row).then_some((row, v))
                })
            }
            _ => None,
        };
        if let Some((row, v)) = found {
            return Some(BadValue {
                column: column.name.clone(),
                row,
                found: format!("{v} (floats must be finite)"),
            });
        }
    }
    None
}

/// The items of `list`'s rows (a list array may be a slice of a longer
/// one, whose `values()` hold other rows' items too), and where the first
/// of them sits in `values()`.
pub(crate) fn list_items(list: &ListArray) -> (usize, ArrayRef) {
    let offsets = list.value_offsets();
    let (start, end) = (offsets[0] as usize, offsets[list.len()] as usize);
    (start, list.values().slice(start, end - start))
}

/// The key of row `row` of `batch` as `name=value, …`, with the key columns
/// the batch holds (`None` when it holds none).
pub fn describe_key(def: &TableDef, batch: &RecordBatch, row: usize) -> Option<String> {
    let parts: Vec<String> = def
        .key
        .iter()
        .filter_map(|name| {
            let array = batch.column_by_name(name)?;
            let value = arrow::util::display::array_value_to_string(array, row).ok()?;
            Some(format!("{name}={value}"))
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}
