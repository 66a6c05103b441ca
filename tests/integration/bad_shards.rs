//! Every kind of bad shard makes a reader exit 2 with a message naming the
//! table, the shard, the field, what was expected and what was found.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, Float64Array, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Schema};
use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
use embodyflow_core::manifest::Manifest;
use embodyflow_core::schemas::{Examples, META_TABLE, META_VERSION, RewardRow, TableName};
use embodyflow_tests::{Run, fixture_producer, forge_first_shard, reseal, run};

fn rewards_table(dir: &Path) -> PathBuf {
    let mut writer =
        TableWriter::create(dir, TableName::Rewards, WriteOptions::default(), false).unwrap();
    writer.write_rows(&RewardRow::examples()).unwrap();
    let producer = fixture_producer();
    writer.finish(&producer, &[]).unwrap();
    dir.join("rewards")
}

fn original_batch(table_dir: &Path) -> RecordBatch {
    let reader = TableReader::open(table_dir, TableName::Rewards).unwrap();
    reader.batches(None, 1024).unwrap().next().unwrap().unwrap()
}

fn validate(table_dir: &Path) -> Run {
    run("table", &["validate", table_dir.to_str().unwrap()])
}

fn assert_rejected(result: &Run, needles: &[&str]) {
    assert_eq!(result.code, 2, "{result}");
    for needle in needles {
        assert!(
            result.stderr.contains(needle),
            "stderr lacks `{needle}`:\n{result}"
        );
    }
}

fn ours() -> [(&'static str, &'static str); 2] {
    [(META_TABLE, "rewards"), (META_VERSION, "1")]
}

#[test]
fn a_column_of_the_wrong_type() {
    let dir = tempfile::tempdir().unwrap();
    let table = rewards_table(dir.path());
    let batch = original_batch(&table);
    let index = batch.schema().index_of("score").unwrap();
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields[index] = Field::new("score", DataType::Float64, false);
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns[index] = cast(&columns[index], &DataType::Float64).unwrap();
    assert!(
        columns[index]
            .as_any()
            .downcast_ref::<Float64Array>()
            .is_some()
    );
    let forged = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap();
    forge_first_shard(&table, &forged, &ours());
    assert_rejected(
        &validate(&table),
        &[
            "`rewards`",
            "`part-00000.parquet`",
            "`score`",
            "expected f32",
            "type f64",
        ],
    );
}

#[test]
fn a_missing_column() {
    let dir = tempfile::tempdir().unwrap();
    let table = rewards_table(dir.path());
    let mut batch = original_batch(&table);
    batch.remove_column(batch.schema().index_of("accuracy").unwrap());
    forge_first_shard(&table, &batch, &ours());
    assert_rejected(
        &validate(&table),
        &[
            "`rewards`",
            "`part-00000.parquet`",
            "`accuracy`",
            "expected f32",
            "found no such column",
        ],
    );
}

#[test]
fn a_wrong_schema_version_in_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    let table = rewards_table(dir.path());
    let batch = original_batch(&table);
    forge_first_shard(
        &table,
        &batch,
        &[(META_TABLE, "rewards"), (META_VERSION, "2")],
    );
    assert_rejected(
        &validate(&table),
        &[
            "`rewards`",
            "`part-00000.parquet`",
            "`schema_version`",
            "expected 1",
            "is 2",
        ],
    );
}

#[test]
fn a_wrong_schema_version_in_the_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let table = rewards_table(dir.path());
    let mut manifest = Manifest::read(&table).unwrap();
    manifest.schema_version = 7;
    reseal(&table, manifest);
    assert_rejected(
        &validate(&table),
        &[
            "`rewards`",
            "`_manifest.json`",
            "`schema_version`",
            "expected 1",
            "is 7",
        ],
    );
}

#[test]
fn a_foreign_parquet_file() {
    let dir = tempfile::tempdir().unwrap();
    let table = rewards_table(dir.path());
    // Plain Parquet with the right columns but not written by the pipeline.
    let batch = original_batch(&table);
    let plain = RecordBatch::try_new(
        Arc::new(Schema::new(batch.schema().fields().clone())),
        batch.columns().to_vec(),
    )
    .unwrap();
    forge_first_shard(&table, &plain, &[]);
    assert_rejected(
        &validate(&table),
        &[
            "`rewards`",
            "`part-00000.parquet`",
            "`embodyflow.table`",
            "expected `rewards`",
            "absent",
        ],
    );
}

#[test]
fn a_truncated_file() {
    let dir = tempfile::tempdir().unwrap();
    let table = rewards_table(dir.path());
    let shard = table.join("part-00000.parquet");
    let bytes = std::fs::read(&shard).unwrap();
    std::fs::write(&shard, &bytes[..bytes.len() / 2]).unwrap();
    let expected = format!("expected {}", bytes.len());
    let found = format!("is {} bytes", bytes.len() / 2);
    assert_rejected(
        &validate(&table),
        &[
            "`rewards`",
            "`part-00000.parquet`",
            "file size",
            &expected,
            &found,
        ],
    );

    // Truncated and the manifest patched to match: the Parquet footer is gone.
    let mut manifest = Manifest::read(&table).unwrap();
    manifest.shards[0].bytes = (bytes.len() / 2) as u64;
    reseal(&table, manifest);
    assert_rejected(
        &validate(&table),
        &[
            "`rewards`",
            "`part-00000.parquet`",
            "not a readable Parquet file",
        ],
    );
}

#[test]
fn a_directory_without_a_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let table = rewards_table(dir.path());
    std::fs::remove_file(table.join("_manifest.json")).unwrap();
    assert_rejected(&validate(&table), &["_manifest.json", "not a table"]);
}

#[test]
fn a_sound_table_validates_deeply() {
    let dir = tempfile::tempdir().unwrap();
    let table = rewards_table(dir.path());
    let result = run("table", &["validate", "--deep", table.to_str().unwrap()]);
    assert_eq!(result.code, 0, "{result}");
    assert!(result.stdout.starts_with("ok rewards 2 rows"), "{result}");
    // And the deep check notices a flipped byte that keeps the size.
    let shard = table.join("part-00000.parquet");
    let mut bytes = std::fs::read(&shard).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(&shard, &bytes).unwrap();
    let result = run("table", &["validate", "--deep", table.to_str().unwrap()]);
    assert_ne!(result.code, 0, "{result}");
}
