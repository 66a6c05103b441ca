//! Rows as the user gives and gets them as text: their JSON with each f32
//! column's floats written as f32 ([`json_text`]: `0.99`, not the widened
//! `0.9900000095367432`), CSV cells ([`csv_cell`], RFC 4180), and a row the
//! table writer refuses made bad input ([`refused_row`]). `table export`,
//! `table show` and the foreign imports and exports share them.
//!
//! ```text
//! json_text(0.99 read from an f32 column, f32s = true)  ->  0.99
//! csv_cell(Some("a,b"), _)                              ->  "a,b", quoted
//! csv_cell(None, _)                                     ->  an empty cell
//! ```

use embodyflow_core::Error;
use embodyflow_core::schemas::format_type;

/// A row the writer refuses (a value outside its column's declared range)
/// is bad input when the rows are the user's: exit 2, the message naming
/// the column, the value and the row's key.
pub(crate) fn refused_row(error: Error) -> Error {
    match error {
        Error::InvalidOutputValue { .. } => Error::BadInput(error.to_string()),
        other => other,
    }
}

/// Per column, whether its floats are all f32 (f32, list<f32>, …; not with
/// an f64).
pub(crate) fn f32_columns(def: &embodyflow_core::schemas::TableDef) -> Vec<bool> {
    def.columns
        .iter()
        .map(|c| {
            let ty = format_type(&c.data_type);
            ty.contains("f32") && !ty.contains("f64")
        })
        .collect()
}

/// The JSON text of `value`, its floats written as f32 when `f32s` (a
/// `serde_json::Value` widens an f32 to f64: 0.99 would read
/// 0.9900000095367432); a float keeps a `.0` so readers see a float.
pub(crate) fn json_text(value: &serde_json::Value, f32s: bool) -> String {
    use serde_json::Value;
    match value {
        Value::Number(n) if f32s && n.is_f64() => {
            let text = (n.as_f64().expect("an f64") as f32).to_string();
            if text.contains(['.', 'e', 'i', 'N']) {
                text
            } else {
                text + ".0"
            }
        }
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(|v| json_text(v, f32s)).collect();
            format!("[{}]", items.join(","))
        }
        Value::Object(map) => {
            let fields: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), json_text(v, f32s)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        other => other.to_string(),
    }
}

/// One CSV cell (RFC 4180) of a row's JSON value: empty for null, strings as
/// they are, numbers and booleans as JSON, lists and objects as JSON text
/// (floats as f32 when the column's floats are all f32, `f32s`); quoted
/// when it holds a comma, quote or line break.
pub(crate) fn csv_cell(value: Option<&serde_json::Value>, f32s: bool) -> String {
    let text = match value {
        None | Some(serde_json::Value::Null) => return String::new(),
        Some(serde_json::Value::String(text)) => text.clone(),
        Some(other) => json_text(other, f32s),
    };
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text
    }
}
