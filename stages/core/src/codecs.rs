//! How each column of a shard is stored: the Parquet writer settings of one
//! shard, chosen from the rows of its first row group.
//!
//! Every column is zstd-compressed at `output.zstd_level`, except a float
//! column whose values zstd cannot shrink: log-probs, values, advantages
//! and returns of a real run are close to uniformly random in their
//! mantissas, and zstd spends about a fifth of a GAE run's CPU to save
//! 8–11 % of their bytes. Such a column is stored uncompressed (Parquet's
//! `UNCOMPRESSED` codec, plain encoding), chosen per shard and per column
//! by compressing a sample: the first [`SAMPLE_BYTES`] of the column's
//! values in the shard's first row group, laid out as the plain encoding
//! lays them out. The column is compressed when zstd shrinks that sample by
//! at least [`MIN_SAVING`]; a column of repeated values (GRPO's advantage,
//! one per response, broadcast to its tokens) shrinks to a few bytes and is
//! compressed as before. Any Parquet reader reads both codecs: a column
//! chunk names its own.
//!
//! Float columns also never use a dictionary (their values almost never
//! repeat), and a float list column (one value per token) carries no
//! min/max statistics: no reader prunes row groups on a token's value, and
//! computing them cost 2–4 % of a run. Flat float columns (a score, a
//! value per step) keep theirs.
//!
//! ```
//! # use embodyflow_core::codecs::compression_pays;
//! let repeated = vec![0.25f32; 4096];
//! let noisy: Vec<f32> = (0..4096u32)
//!     .map(|i| (i.wrapping_mul(2_654_435_761) >> 8) as f32 / 16_777_216.0)
//!     .collect();
//! let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
//! assert!(compression_pays(&bytes(&repeated), 3));
//! assert!(!compression_pays(&bytes(&noisy), 3));
//! ```

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Float32Type, Float64Type};
use embodyflow_schemas::{META_TABLE, META_VERSION, TableDef};
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::schema::types::ColumnPath;

use crate::dataset::WriteOptions;
use crate::error::{Error, Result};

/// The bytes of a float column's values that decide its codec.
pub const SAMPLE_BYTES: usize = 1 << 16;

/// The least share of the sample zstd must save for a float column to be
/// compressed: random float32 values save 8–11 %, anything with structure
/// (repeats, few distinct values, zeros) far more.
pub const MIN_SAVING: f64 = 0.2;

/// The Parquet settings of a shard whose first row group is `first_group`
/// (the batches that make it up; empty for a shard without rows): zstd at
/// `options.zstd_level` but for the float columns whose sample does not
/// pay it (see the module doc), row groups of `options.row_group_rows`, the
/// table's name and schema version in the file metadata.
pub fn shard_properties(
    def: &TableDef,
    options: &WriteOptions,
    first_group: &[RecordBatch],
) -> Result<WriterProperties> {
    let level = ZstdLevel::try_new(options.zstd_level)
        .map_err(|e| Error::Usage(format!("zstd level {}: {e}", options.zstd_level)))?;
    let mut props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(level))
        .set_max_row_group_row_count(Some(options.row_group_rows))
        .set_key_value_metadata(Some(vec![
            KeyValue::new(META_TABLE.to_string(), def.name.clone()),
            KeyValue::new(META_VERSION.to_string(), def.version.to_string()),
        ]));
    for (index, column) in def.columns.iter().enumerate() {
        if !float_leaf(&column.data_type) {
            continue;
        }
        let (path, per_token) = match &column.data_type {
            DataType::List(item) => (
                vec![column.name.clone(), "list".into(), item.name().clone()],
                true,
            ),
            _ => (vec![column.name.clone()], false),
        };
        let path = ColumnPath::new(path);
        props = props.set_column_dictionary_enabled(path.clone(), false);
        if per_token {
            props = props.set_column_statistics_enabled(path.clone(), EnabledStatistics::None);
        }
        if !compression_pays(&sample(first_group, index), options.zstd_level) {
            props = props.set_column_compression(path, Compression::UNCOMPRESSED);
        }
    }
    Ok(props.build())
}

/// Whether zstd at `level` shrinks `sample` by at least [`MIN_SAVING`]
/// (an empty sample: yes, the default codec).
pub fn compression_pays(sample: &[u8], level: i32) -> bool {
    if sample.is_empty() {
        return true;
    }
    match zstd::bulk::compress(sample, level) {
        Ok(compressed) => (compressed.len() as f64) <= (1.0 - MIN_SAVING) * sample.len() as f64,
        Err(_) => true,
    }
}

/// Whether a column's values are floats (directly or as list items).
fn float_leaf(data_type: &DataType) -> bool {
    match data_type {
        DataType::Float32 | DataType::Float64 => true,
        DataType::List(item) => float_leaf(item.data_type()),
        _ => false,
    }
}

/// Up to [`SAMPLE_BYTES`] of column `index`'s float values in `batches`,
/// little-endian as the plain encoding writes them.
fn sample(batches: &[RecordBatch], index: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for batch in batches {
        if bytes.len() >= SAMPLE_BYTES {
            break;
        }
        append_floats(batch.column(index).as_ref(), &mut bytes);
    }
    bytes.truncate(SAMPLE_BYTES);
    bytes
}

/// Appends `array`'s float values (a list's items, recursively) to `bytes`
/// until it holds [`SAMPLE_BYTES`].
fn append_floats(array: &dyn Array, bytes: &mut Vec<u8>) {
    let room = SAMPLE_BYTES.saturating_sub(bytes.len());
    match array.data_type() {
        DataType::Float32 => {
            let values = array.as_primitive::<Float32Type>().values();
            let take = values.len().min(room / 4);
            bytes.extend(values[..take].iter().flat_map(|v| v.to_le_bytes()));
        }
        DataType::Float64 => {
            let values = array.as_primitive::<Float64Type>().values();
            let take = values.len().min(room / 8);
            bytes.extend(values[..take].iter().flat_map(|v| v.to_le_bytes()));
        }
        DataType::List(_) => {
            let (_, items) = crate::values::list_items(array.as_list::<i32>());
            append_floats(items.as_ref(), bytes);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float32Array, ListArray};
    use arrow::datatypes::Float32Type;
    use embodyflow_schemas::TableName;
    use std::sync::Arc;

    fn uniform(i: u64) -> f32 {
        let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
    }

    /// The advantages table's first row group: `rows` responses of 256
    /// tokens whose per-token advantages are `value(row, token)`.
    fn advantages(rows: usize, value: impl Fn(usize, usize) -> f32) -> RecordBatch {
        let def = TableName::Advantages.def();
        let rows: Vec<embodyflow_schemas::AdvantageRow> = (0..rows)
            .map(|r| embodyflow_schemas::AdvantageRow {
                trajectory_id: format!("t{r:05}"),
                step_index: 0,
                advantages: (0..256).map(|t| value(r, t)).collect(),
                returns: None,
                episode_adv: 0.5,
                step_adv: None,
                estimator: "test".into(),
            })
            .collect();
        crate::dataset::rows_to_batch(def, &rows).unwrap()
    }

    fn codec_of(props: &WriterProperties, column: &str) -> Compression {
        props.compression(&ColumnPath::new(vec![
            column.into(),
            "list".into(),
            "item".into(),
        ]))
    }

    #[test]
    fn random_per_token_floats_are_stored_uncompressed_and_repeated_ones_compressed() {
        let def = TableName::Advantages.def();
        let options = WriteOptions::default();
        let random = advantages(64, |r, t| uniform((r * 256 + t) as u64) - 0.5);
        let props = shard_properties(def, &options, &[random]).unwrap();
        assert_eq!(codec_of(&props, "advantages"), Compression::UNCOMPRESSED);
        let broadcast = advantages(64, |r, _| r as f32 / 64.0 - 0.5);
        let props = shard_properties(def, &options, &[broadcast]).unwrap();
        assert!(matches!(
            codec_of(&props, "advantages"),
            Compression::ZSTD(_)
        ));
        // Non-float columns always keep zstd; an empty shard keeps it everywhere.
        let key = ColumnPath::new(vec!["trajectory_id".into()]);
        assert!(matches!(props.compression(&key), Compression::ZSTD(_)));
        let empty = shard_properties(def, &options, &[]).unwrap();
        assert!(matches!(
            codec_of(&empty, "advantages"),
            Compression::ZSTD(_)
        ));
    }

    #[test]
    fn the_sample_reads_a_sliced_list_from_its_own_first_item() {
        let list = ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
            Some(vec![Some(1.0), Some(2.0)]),
            Some(vec![Some(3.0)]),
            Some(vec![Some(4.0), Some(5.0)]),
        ]);
        let sliced = list.slice(1, 2);
        let mut bytes = Vec::new();
        append_floats(&sliced, &mut bytes);
        let expected: Vec<u8> = [3.0f32, 4.0, 5.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(bytes, expected);
        let flat: Arc<dyn Array> = Arc::new(Float32Array::from(vec![0.5f32; 40_000]));
        let mut bytes = Vec::new();
        append_floats(flat.as_ref(), &mut bytes);
        assert_eq!(bytes.len(), SAMPLE_BYTES, "the sample stops at its bound");
    }
}
