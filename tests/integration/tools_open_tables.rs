//! Every table directory opens as it is in the tools researchers analyse
//! data with — polars (`read_parquet(dir)`, `scan_parquet(dir)`), pandas and
//! pyarrow datasets, duckdb (`read_parquet('dir/*.parquet')`) — with its rows
//! and natural column types. The tools come from the project's `.venv`
//! (`scripts/setup`); `tests/python/open_tables.py` does the opening.

use std::path::Path;
use std::process::Command;

use embodyflow_core::dataset::{TableWriter, WriteOptions};
use embodyflow_core::schemas::{Examples, TableName, format_type, with_row_type};
use embodyflow_tests::fixture_producer;

fn write_examples<R: Examples>(out: &Path) -> usize {
    let rows = R::examples();
    // Two shards, so the tools read a directory of several files.
    let options = WriteOptions {
        rows_per_shard: rows.len().div_ceil(2).max(1),
        ..WriteOptions::default()
    };
    let mut writer = TableWriter::create(out, R::TABLE, options, false).unwrap();
    writer.write_rows(&rows).unwrap();
    writer.finish(&fixture_producer(), &[]).unwrap();
    rows.len()
}

#[test]
fn every_table_opens_in_polars_pandas_pyarrow_and_duckdb() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = root.join(".venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run scripts/setup",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let mut expected = Vec::new();
    for &table in TableName::ALL {
        let rows = with_row_type!(table, R => write_examples::<R>(dir.path()));
        // In storage order: [name, type] pairs.
        let columns: Vec<[String; 2]> = table
            .def()
            .columns
            .iter()
            .map(|c| [c.name.clone(), format_type(&c.data_type)])
            .collect();
        expected.push(serde_json::json!({
            "dir": dir.path().join(table.as_str()),
            "rows": rows,
            "columns": columns,
        }));
    }
    let spec = dir.path().join("expected.json");
    std::fs::write(&spec, serde_json::to_string(&expected).unwrap()).unwrap();
    let output = Command::new(&python)
        .arg(root.join("tests/python/open_tables.py"))
        .arg(&spec)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "open_tables.py failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(&format!("{} passed, 0 failed", TableName::ALL.len() * 5)),
        "{stdout}"
    );
}
