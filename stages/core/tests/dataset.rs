//! Round trips of every table through the shard writer and reader, and the
//! reader's rejections of bad shards.

use std::path::Path;

use arrow::array::{Array, Float32Array, RecordBatch};
use embodyflow_core::Error;
use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
use embodyflow_core::manifest::{InputRef, Producer};
use embodyflow_schemas::*;

fn producer() -> Producer {
    Producer {
        stage: "test".into(),
        version: "0".into(),
        config: serde_json::json!({"k": 1}),
        seed: 0,
        shard: "0/1".into(),
    }
}

fn write<R: Row>(
    out: &Path,
    rows: &[R],
    options: WriteOptions,
) -> embodyflow_core::manifest::Manifest {
    let mut writer = TableWriter::create(out, R::TABLE, options, false).unwrap();
    writer.write_rows(rows).unwrap();
    writer.finish(&producer(), &[]).unwrap()
}

/// A row's key values: strings (compared by bytes) or integers.
fn key_of<R: Row>(row: &R) -> Vec<(Option<String>, Option<i64>)> {
    let value = serde_json::to_value(row).unwrap();
    R::TABLE
        .def()
        .key
        .iter()
        .map(|k| (value[k].as_str().map(String::from), value[k].as_i64()))
        .collect()
}

fn round_trip<R: Examples + std::fmt::Debug + PartialEq>() {
    let dir = tempfile::tempdir().unwrap();
    // Repeat the examples so that several shards and row groups are used.
    let rows: Vec<R> = (0..50).flat_map(|_| R::examples()).collect();
    let options = WriteOptions {
        rows_per_shard: 17,
        row_group_rows: 5,
        zstd_level: 3,
    };
    let manifest = write(dir.path(), &rows, options);
    assert_eq!(manifest.num_rows, rows.len() as u64);
    assert_eq!(manifest.shards.len(), rows.len().div_ceil(17));
    let reader = TableReader::open(&dir.path().join(R::TABLE.as_str()), R::TABLE).unwrap();
    let back: Vec<R> = reader.read_rows().unwrap();
    // Stored in key order, equal keys in write order (`canonical`).
    let mut order: Vec<usize> = (0..rows.len()).collect();
    order.sort_by_key(|&i| key_of(&rows[i]));
    let expected: Vec<&R> = order.iter().map(|&i| &rows[i]).collect();
    assert_eq!(
        back.iter().collect::<Vec<_>>(),
        expected,
        "table {}",
        R::TABLE
    );
    reader.verify_hashes().unwrap();
    // Batches follow the requested size, not the shard size.
    let sizes: Vec<usize> = reader
        .batches(None, 4)
        .unwrap()
        .map(|b| b.unwrap().num_rows())
        .collect();
    assert!(sizes.iter().all(|&n| n <= 4));
    assert_eq!(sizes.iter().sum::<usize>(), rows.len());
}

#[test]
fn every_table_round_trips() {
    round_trip::<TaskRow>();
    round_trip::<TrajectoryRow>();
    round_trip::<StepRow>();
    round_trip::<RewardRow>();
    round_trip::<TeacherLogpRow>();
    round_trip::<StepGateRow>();
    round_trip::<AdvantageRow>();
    round_trip::<MetricRow>();
    round_trip::<EvalRow>();
}

#[test]
fn projection_reads_only_the_named_columns() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &StepRow::examples(), WriteOptions::default());
    let reader = TableReader::open(&dir.path().join("steps"), TableName::Steps).unwrap();
    let batches: Vec<RecordBatch> = reader
        .batches(Some(&["old_value", "trajectory_id"]), 1024)
        .unwrap()
        .map(|b| b.unwrap())
        .collect();
    let schema = batches[0].schema();
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    assert_eq!(names, ["trajectory_id", "old_value"]);
    let values = batches[0]
        .column(1)
        .as_any()
        .downcast_ref::<Float32Array>()
        .unwrap();
    assert!(values.is_null(0));
    assert_eq!(values.value(1), 0.75);
    let err = reader
        .batches(Some(&["nope"]), 8)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("`nope`") && err.contains("response_ids"),
        "{err}"
    );
}

#[test]
fn same_rows_give_the_same_hashes_and_lineage_is_recorded() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let rows: Vec<RewardRow> = (0..30).flat_map(|_| RewardRow::examples()).collect();
    let options = WriteOptions {
        rows_per_shard: 25,
        ..WriteOptions::default()
    };
    let first = write(a.path(), &rows, options);
    let second = write(b.path(), &rows, options);
    assert_eq!(first.content_hash, second.content_hash);
    assert_eq!(first.shards, second.shards);

    let input = TableReader::open(&a.path().join("rewards"), TableName::Rewards)
        .unwrap()
        .input_ref();
    let mut writer = TableWriter::create(b.path(), TableName::Advantages, options, false).unwrap();
    writer.write_rows(&AdvantageRow::examples()).unwrap();
    let manifest = writer
        .finish(&producer(), std::slice::from_ref(&input))
        .unwrap();
    assert_eq!(
        manifest.inputs,
        vec![InputRef {
            table: "rewards".into(),
            path: a.path().join("rewards"),
            content_hash: first.content_hash.clone()
        }]
    );
    let reread = TableReader::open(&b.path().join("advantages"), TableName::Advantages).unwrap();
    assert_eq!(reread.manifest().inputs, manifest.inputs);
    assert_eq!(reread.manifest().producer.config["k"], 1);
}

#[test]
fn existing_tables_need_overwrite_and_are_replaced_whole() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &EvalRow::examples(), WriteOptions::default());
    let err = TableWriter::create(dir.path(), TableName::Eval, WriteOptions::default(), false)
        .err()
        .unwrap();
    assert!(matches!(err, Error::OutputExists(_)));
    let mut rows = EvalRow::examples();
    rows[0].run = 99;
    let mut writer =
        TableWriter::create(dir.path(), TableName::Eval, WriteOptions::default(), true).unwrap();
    writer.write_rows(&rows).unwrap();
    writer.finish(&producer(), &[]).unwrap();
    let back: Vec<EvalRow> = TableReader::open(&dir.path().join("eval"), TableName::Eval)
        .unwrap()
        .read_rows()
        .unwrap();
    assert_eq!(back, rows);
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(leftovers, vec![std::ffi::OsString::from("eval")]);
}

#[test]
fn an_unfinished_writer_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut writer =
            TableWriter::create(dir.path(), TableName::Eval, WriteOptions::default(), false)
                .unwrap();
        writer.write_rows(&EvalRow::examples()).unwrap();
        // dropped without finish, as on an error
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    {
        let out = dir.path().join("new/out");
        let mut writer =
            TableWriter::create(&out, TableName::Eval, WriteOptions::default(), false).unwrap();
        writer.write_rows(&EvalRow::examples()).unwrap();
        assert!(out.exists());
    }
    assert!(
        !dir.path().join("new/out").exists(),
        "an output directory made by the writer is removed with it"
    );
}

#[test]
fn an_empty_table_keeps_its_schema() {
    let dir = tempfile::tempdir().unwrap();
    let writer = TableWriter::create(
        dir.path(),
        TableName::Rewards,
        WriteOptions::default(),
        false,
    )
    .unwrap();
    let manifest = writer.finish(&producer(), &[]).unwrap();
    assert_eq!(manifest.num_rows, 0);
    let reader = TableReader::open(&dir.path().join("rewards"), TableName::Rewards).unwrap();
    assert!(reader.read_rows::<RewardRow>().unwrap().is_empty());
}

#[test]
fn a_table_opened_under_the_wrong_name_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &EvalRow::examples(), WriteOptions::default());
    let err = TableReader::open(&dir.path().join("eval"), TableName::Rewards)
        .unwrap_err()
        .to_string();
    assert!(err.contains("`rewards`") && err.contains("`eval`"), "{err}");
}

/// Rewrites the table at `dir` the way tables were written before the
/// manifest moved into Parquet: `_manifest.json` beside the shards.
fn to_legacy_manifest(dir: &std::path::Path) -> std::path::PathBuf {
    let manifest = embodyflow_core::manifest::Manifest::read(dir).unwrap();
    let path = dir.join("_manifest.json");
    std::fs::write(&path, manifest.to_json()).unwrap();
    std::fs::remove_file(dir.join("_manifest.parquet")).unwrap();
    path
}

#[test]
fn a_table_with_a_legacy_json_manifest_is_still_read() {
    let dir = tempfile::tempdir().unwrap();
    let rows = EvalRow::examples();
    write(dir.path(), &rows, WriteOptions::default());
    let table = dir.path().join("eval");
    to_legacy_manifest(&table);
    let inputs = embodyflow_core::inputs::Inputs::resolve(&[dir.path().to_path_buf()]).unwrap();
    let read: Vec<EvalRow> = inputs.table(TableName::Eval).unwrap().read_rows().unwrap();
    assert_eq!(read, rows);
}

#[test]
fn a_manifest_with_a_tampered_shard_list_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &EvalRow::examples(), WriteOptions::default());
    let path = to_legacy_manifest(&dir.path().join("eval"));
    let text = std::fs::read_to_string(&path)
        .unwrap()
        .replace("\"rows\": 1", "\"rows\": 2")
        .replace("\"num_rows\": 1", "\"num_rows\": 2");
    std::fs::write(&path, text).unwrap();
    let err = TableReader::open(&dir.path().join("eval"), TableName::Eval)
        .unwrap_err()
        .to_string();
    assert!(err.contains("content_hash"), "{err}");
}

#[test]
fn float_columns_skip_dictionary_encoding() {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), &StepRow::examples(), WriteOptions::default());
    let file = std::fs::File::open(dir.path().join("steps/part-00000.parquet")).unwrap();
    let reader = SerializedFileReader::new(file).unwrap();
    let group = reader.metadata().row_group(0);
    let dictionary = |path: &str| {
        let column = group
            .columns()
            .iter()
            .find(|c| c.column_path().string() == path)
            .unwrap_or_else(|| panic!("no column {path}"));
        column.dictionary_page_offset().is_some()
    };
    assert!(!dictionary("old_logprobs.list.item"));
    assert!(!dictionary("old_value"));
    assert!(dictionary("trajectory_id"));
    assert!(dictionary("response_ids.list.item"));
}
