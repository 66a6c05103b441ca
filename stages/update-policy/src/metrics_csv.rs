//! `<out>/metrics.csv`: the `metrics` table as a CSV file, for curves in any
//! CSV reader (pandas, polars, a spreadsheet, gnuplot) without Parquet.
//!
//! The format is `table export --format csv`'s (RFC 4180): a header with the
//! `metrics` columns in schema order, then one record per optimizer step; a
//! null (a figure the objective does not compute, e.g. `kl_loss` without a
//! KL penalty) is an empty cell, floats are written in their shortest f32
//! form (`0.0001`, not `0.00009999999747378752`), integers as they are. It is
//! staged and committed with the run's other outputs.
//!
//! ```text
//! iteration,update,loss,pg_loss,clipfrac,...,grad_norm,lr
//! 0,0,0.6931,0.6931,0,...,1.25,0.00001
//! ```

use embodyflow_core::commit::{self, Digest};
use embodyflow_core::schemas::{MetricRow, TableName};
use embodyflow_core::stage::{Stage, StageConfig};
use embodyflow_core::{Error, Result};

/// The output's name in `<out>`.
pub const METRICS_CSV: &str = "metrics.csv";

/// The CSV text of `rows` (every metrics column is a number or null).
pub fn metrics_csv(rows: &[MetricRow]) -> String {
    let columns = TableName::Metrics.def().column_names();
    let mut text = columns.join(",") + "\n";
    for row in rows {
        let value = serde_json::to_value(row).expect("metric rows serialise");
        let cells: Vec<String> = columns
            .iter()
            .map(|c| match value.get(*c) {
                None | Some(serde_json::Value::Null) => String::new(),
                // Every float column is f32; a Value holds it widened to f64.
                Some(serde_json::Value::Number(n)) if n.is_f64() => {
                    let text = (n.as_f64().expect("an f64") as f32).to_string();
                    if text.contains(['.', 'e', 'i', 'N']) {
                        text
                    } else {
                        text + ".0"
                    }
                }
                Some(v) => v.to_string(),
            })
            .collect();
        text.push_str(&cells.join(","));
        text.push('\n');
    }
    text
}

/// Writes `rows` as [`METRICS_CSV`] under a staged name, fsynced, to be
/// committed with the stage's other outputs.
pub fn stage_metrics_csv<C: StageConfig>(stage: &Stage<C>, rows: &[MetricRow]) -> Result<()> {
    let staged = commit::staging_name(METRICS_CSV);
    let path = stage.args.out.join(&staged);
    std::fs::write(&path, metrics_csv(rows))
        .and_then(|()| std::fs::File::open(&path)?.sync_all())
        .map_err(|e| Error::io(&path, e))?;
    stage.stage_output(&staged, METRICS_CSV, Digest::File)
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_core::schemas::Examples;

    #[test]
    fn one_record_per_row_with_the_schema_columns_and_empty_nulls() {
        let rows = MetricRow::examples();
        let text = metrics_csv(&rows);
        let lines: Vec<&str> = text.lines().collect();
        let columns = TableName::Metrics.def().column_names();
        assert_eq!(lines[0], columns.join(","));
        assert_eq!(lines.len(), rows.len() + 1);
        for (line, row) in lines[1..].iter().zip(&rows) {
            let cells: Vec<&str> = line.split(',').collect();
            assert_eq!(cells.len(), columns.len(), "{line}");
            let at = |name: &str| cells[columns.iter().position(|c| *c == name).unwrap()];
            assert_eq!(at("loss").parse::<f32>().unwrap(), row.loss);
            assert_eq!(at("lr").parse::<f32>().unwrap(), row.lr);
            assert!(at("lr").len() <= 12, "not the f32's shortest form: {line}");
            assert_eq!(at("kl_loss").is_empty(), row.kl_loss.is_none(), "{line}");
        }
    }
}
