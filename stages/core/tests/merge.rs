//! Merging the tables of a sharded run: rows are the union of the parts,
//! files are hard links (no data copied), and parts of different runs or an
//! incomplete shard set are refused.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions, merge_tables};
use embodyflow_core::manifest::{InputRef, Producer};
use embodyflow_schemas::{EvalRow, TableName};

fn producer(shard: &str, seed: u64) -> Producer {
    Producer {
        stage: "evaluate".into(),
        version: "0".into(),
        config: serde_json::json!({"runs": 1}),
        seed,
        shard: shard.into(),
    }
}

fn rows(range: std::ops::Range<i32>) -> Vec<EvalRow> {
    range
        .map(|i| EvalRow {
            task_id: format!("t{i}"),
            run: 0,
            split: "val".into(),
            task_type: None,
            policy: "p".into(),
            success: i % 2 == 0,
            num_steps: i,
            env_steps: i,
        })
        .collect()
}

fn part(out: &Path, rows: &[EvalRow], shard: &str, seed: u64) -> PathBuf {
    let options = WriteOptions {
        rows_per_shard: 3,
        ..WriteOptions::default()
    };
    let mut writer = TableWriter::create(out, TableName::Eval, options, false).unwrap();
    writer.write_rows(rows).unwrap();
    let input = InputRef {
        table: "tasks".into(),
        path: "data/val/tasks".into(),
        content_hash: "abc".into(),
    };
    writer.finish(&producer(shard, seed), &[input]).unwrap();
    out.join("eval")
}

#[test]
fn merged_parts_hold_every_row_once_as_hard_links() {
    let dir = tempfile::tempdir().unwrap();
    let a = part(&dir.path().join("s0"), &rows(0..7), "0/3", 1);
    let b = part(&dir.path().join("s1"), &[], "1/3", 1);
    let c = part(&dir.path().join("s2"), &rows(7..9), "2/3", 1);
    let dest = dir.path().join("merged/eval");
    let parts = [a.clone(), b, c];
    let manifest = merge_tables(&parts, &dest, false).unwrap();
    assert_eq!(manifest.num_rows, 9);
    assert_eq!(
        manifest.shards.len(),
        4,
        "3 + 1 files, the empty part left out"
    );
    assert_eq!(manifest.producer.shard, "0/1");
    assert_eq!(manifest.inputs.len(), 1, "the parts' common input once");
    let reader = TableReader::open(&dest, TableName::Eval).unwrap();
    reader.verify_hashes().unwrap();
    let back: Vec<EvalRow> = reader.read_rows().unwrap();
    assert_eq!(back, rows(0..9));
    let linked = std::fs::metadata(dest.join("part-00000.parquet")).unwrap();
    let original = std::fs::metadata(a.join("part-00000.parquet")).unwrap();
    assert_eq!(linked.ino(), original.ino(), "a hard link, not a copy");
    // Merging again needs overwrite.
    let again = merge_tables(&parts, &dest, false).unwrap_err().to_string();
    assert!(again.contains("already exists"), "{again}");
    let replaced = merge_tables(&parts, &dest, true).unwrap();
    assert_eq!(replaced.content_hash, manifest.content_hash);
}

#[test]
fn parts_of_other_runs_or_missing_shards_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = part(&dir.path().join("s0"), &rows(0..2), "0/2", 1);
    let b = part(&dir.path().join("s1"), &rows(2..4), "1/2", 2);
    let dest = dir.path().join("m/eval");
    let err = merge_tables(&[a.clone(), b], &dest, false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`producer`") && err.contains("seed 2"),
        "{err}"
    );
    let err = merge_tables(&[a], &dest, false).unwrap_err().to_string();
    assert!(
        err.contains("`producer.shard` is 0/2, expected 0/1"),
        "{err}"
    );
    assert!(!dir.path().join("m").exists(), "nothing written");
}
