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
use embodyflow_tests::{Run, fixture_producer, forge_first_shard, reseal, run, run_with_env};

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

/// The metadata of a current rewards shard (schema version 4).
fn ours() -> [(&'static str, &'static str); 2] {
    [(META_TABLE, "rewards"), (META_VERSION, "4")]
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
        &[(META_TABLE, "rewards"), (META_VERSION, "5")],
    );
    assert_rejected(
        &validate(&table),
        &[
            "`rewards`",
            "`part-00000.parquet`",
            "`schema_version`",
            "expected 4",
            "is 5",
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
            "`_manifest.parquet`",
            "`schema_version`",
            "expected 4",
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

    // Truncated and the manifest's size patched to match: the hash checked
    // on read tells, and with that check off the Parquet footer is gone.
    let mut manifest = Manifest::read(&table).unwrap();
    manifest.shards[0].bytes = (bytes.len() / 2) as u64;
    reseal(&table, manifest);
    assert_rejected(
        &validate(&table),
        &["`rewards`", "`part-00000.parquet`", "content hash is"],
    );
    assert_rejected(
        &run_with_env(
            "table",
            &["validate", table.to_str().unwrap()],
            &[("EMBODYFLOW_VERIFY_HASHES", "0")],
        ),
        &[
            "`rewards`",
            "`part-00000.parquet`",
            "not a readable Parquet file",
        ],
    );
}

#[test]
fn a_same_size_byte_flip_is_caught_on_every_read() {
    let dir = tempfile::tempdir().unwrap();
    let table = rewards_table(dir.path());
    let shard = table.join("part-00000.parquet");
    let mut bytes = std::fs::read(&shard).unwrap();
    // A byte in the middle of the data pages, size unchanged.
    let at = bytes.len() / 3;
    bytes[at] ^= 0x01;
    std::fs::write(&shard, &bytes).unwrap();
    // Not only `validate --deep`: a stage's ordinary read refuses it.
    assert_rejected(
        &validate(&table),
        &[
            "`rewards`",
            "`part-00000.parquet`",
            "content hash is",
            "expected",
        ],
    );
    let reader = TableReader::open(&table, TableName::Rewards).unwrap();
    let err = reader.read_rows::<RewardRow>().unwrap_err().to_string();
    assert!(err.contains("content hash is"), "{err}");
}

#[test]
fn a_nan_score_is_named_by_table_shard_column_and_row_key() {
    let dir = tempfile::tempdir().unwrap();
    let table = rewards_table(dir.path());
    let batch = original_batch(&table);
    let index = batch.schema().index_of("score").unwrap();
    let mut scores: Vec<Option<f32>> = batch
        .column(index)
        .as_any()
        .downcast_ref::<arrow::array::Float32Array>()
        .unwrap()
        .iter()
        .collect();
    let last = scores.len() - 1;
    scores[last] = Some(f32::NAN);
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns[index] = Arc::new(arrow::array::Float32Array::from(scores));
    let forged = RecordBatch::try_new(batch.schema(), columns).unwrap();
    forge_first_shard(&table, &forged, &ours());
    let ids = batch
        .column(batch.schema().index_of("trajectory_id").unwrap())
        .as_any()
        .downcast_ref::<arrow::array::StringArray>()
        .unwrap();
    let key = format!("trajectory_id={}", ids.value(last));
    assert_rejected(
        &validate(&table),
        &["`rewards`", "`part-00000.parquet`", "`score`", "NaN", &key],
    );
    // A projection without the key column still names the row by its key.
    let reader = TableReader::open(&table, TableName::Rewards).unwrap();
    let err = reader
        .batches(Some(&["score"]), 1024)
        .unwrap()
        .find_map(|b| b.err())
        .unwrap()
        .to_string();
    assert!(err.contains(&key), "{err}");
}

#[test]
fn a_manifest_claiming_2_pow_62_rows_is_an_error_not_an_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let table = rewards_table(dir.path());
    let mut manifest = Manifest::read(&table).unwrap();
    manifest.shards[0].rows = 1 << 62;
    reseal(&table, manifest);
    let result = validate(&table);
    assert_rejected(
        &result,
        &["`part-00000.parquet`", &format!("expected {}", 1u64 << 62)],
    );
    let reader = TableReader::open(&table, TableName::Rewards).unwrap();
    assert!(reader.read_rows::<RewardRow>().is_err());

    // Row counts whose sum overflows u64, and a shard path outside the table.
    let mut manifest = Manifest::read(&table).unwrap();
    manifest.shards.push(manifest.shards[0].clone());
    manifest.shards[1].rows = u64::MAX;
    manifest.num_rows = 0;
    manifest.write(&table).unwrap();
    assert_rejected(&validate(&table), &["overflows"]);

    let other = tempfile::tempdir().unwrap();
    let table = rewards_table(other.path());
    let mut manifest = Manifest::read(&table).unwrap();
    manifest.shards[0].file = "../../etc/passwd.parquet".into();
    reseal(&table, manifest);
    assert_rejected(&validate(&table), &["inside the table directory"]);
}

/// compute-advantages over `rollouts` and `rewards` into `out`.
fn compute_advantages(rollouts: &Path, rewards: &Path, out: &Path, extra: &[&str]) -> Run {
    let mut args = vec![
        "--input",
        rollouts.to_str().unwrap(),
        "--input",
        rewards.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run("compute-advantages", &args)
}

#[test]
fn a_forged_row_count_fails_compute_advantages_as_bad_input_not_an_allocation() {
    // A manifest whose shard list, row total and content hash agree, but
    // whose counts no file holds: nothing may be sized by them.
    for rows in [1u64 << 62, 1 << 36] {
        for table in ["trajectories", "rewards"] {
            let dir = tempfile::tempdir().unwrap();
            let (rollouts, rewards) =
                embodyflow_tests::rollout_set(dir.path(), &[vec![1.0, 0.0]], 1, 2);
            let table_dir = if table == "rewards" {
                rewards.join(table)
            } else {
                rollouts.join(table)
            };
            let mut manifest = Manifest::read(&table_dir).unwrap();
            manifest.shards[0].rows = rows;
            reseal(&table_dir, manifest);
            let out = dir.path().join("adv");
            let result = compute_advantages(&rollouts, &rewards, &out, &[]);
            assert_rejected(
                &result,
                &[
                    &format!("`{table}`"),
                    "`part-00000.parquet`",
                    &format!("expected {rows}"),
                ],
            );
            assert!(!out.join("advantages").exists());
        }
    }
}

#[test]
fn a_directory_without_a_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let table = rewards_table(dir.path());
    std::fs::remove_file(table.join("_manifest.parquet")).unwrap();
    assert_rejected(&validate(&table), &["_manifest.parquet", "not a table"]);
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

#[test]
fn a_shard_file_the_manifest_does_not_list_is_an_error() {
    // pandas, polars and duckdb read every file of the directory: a copy of
    // a shard doubles the table for them while the manifest says 2 rows.
    let dir = tempfile::tempdir().unwrap();
    let table = rewards_table(dir.path());
    std::fs::copy(
        table.join("part-00000.parquet"),
        table.join("part-00001.parquet"),
    )
    .unwrap();
    for deep in [&["--deep"][..], &[]] {
        let mut args = vec!["validate"];
        args.extend_from_slice(deep);
        args.push(table.to_str().unwrap());
        assert_rejected(
            &run("table", &args),
            &[
                "`rewards`",
                "not listed in its manifest",
                "part-00001.parquet",
                "2 rows",
            ],
        );
    }
    // Hidden names (a writer's leftovers, the manifest) are not read by them.
    std::fs::rename(
        table.join("part-00001.parquet"),
        table.join(".part-00001.parquet"),
    )
    .unwrap();
    let result = run("table", &["validate", "--deep", table.to_str().unwrap()]);
    assert_eq!(result.code, 0, "{result}");
}

#[test]
fn an_imported_step_index_outside_its_range_is_bad_input() {
    use embodyflow_core::schemas::StepRow;
    let dir = tempfile::tempdir().unwrap();
    let (rollouts, _) = embodyflow_tests::rollout_set(dir.path(), &[vec![1.0]], 1, 2);
    let mut rows: Vec<StepRow> = TableReader::open(&rollouts.join("steps"), TableName::Steps)
        .unwrap()
        .read_rows()
        .unwrap();
    rows[0].step_index = i32::MAX;
    let jsonl = dir.path().join("steps.jsonl");
    let text: String = rows
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    std::fs::write(&jsonl, text).unwrap();
    let out = dir.path().join("imported");
    let result = run(
        "table",
        &[
            "import",
            "--table",
            "steps",
            "--from",
            jsonl.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_rejected(
        &result,
        &[
            "`steps`",
            "`step_index`",
            &format!("{} (allowed: 0 to 1000000)", i32::MAX),
            &rows[0].trajectory_id,
        ],
    );
    assert!(!out.join("steps").exists());
}

#[test]
fn one_nan_old_value_fails_a_gae_run_instead_of_poisoning_it() {
    use embodyflow_core::dataset::rows_to_batch;
    use embodyflow_core::schemas::StepRow;
    let dir = tempfile::tempdir().unwrap();
    let (rollouts, rewards) = embodyflow_tests::rollout_set(dir.path(), &[vec![1.0, 0.0]], 2, 3);
    let steps_dir = rollouts.join("steps");
    // The first shard's rows, one old value made NaN, forged in place.
    let reader = TableReader::open(&steps_dir, TableName::Steps).unwrap();
    let first = Manifest::read(&steps_dir).unwrap().shards[0].rows as usize;
    let mut rows: Vec<StepRow> = reader.read_rows().unwrap();
    rows.truncate(first);
    let victim = rows.len() - 1;
    rows[victim].old_values.as_mut().unwrap()[1] = f32::NAN;
    let batch = rows_to_batch(TableName::Steps.def(), &rows).unwrap();
    forge_first_shard(
        &steps_dir,
        &batch,
        &[(META_TABLE, "steps"), (META_VERSION, "1")],
    );
    let out = dir.path().join("adv");
    let result = compute_advantages(&rollouts, &rewards, &out, &["--set", "estimator=gae"]);
    let key = format!(
        "trajectory_id={}, step_index={}",
        rows[victim].trajectory_id, rows[victim].step_index
    );
    assert_rejected(
        &result,
        &[
            "`steps`",
            "`part-00000.parquet`",
            "`old_values`",
            "NaN",
            &key,
        ],
    );
    assert!(!out.join("advantages").exists());
}

#[test]
fn a_step_index_outside_its_declared_range_is_rejected() {
    use embodyflow_core::dataset::rows_to_batch;
    use embodyflow_core::schemas::StepRow;
    for bad in [i32::MAX, -1] {
        let dir = tempfile::tempdir().unwrap();
        let (rollouts, _) = embodyflow_tests::rollout_set(dir.path(), &[vec![1.0]], 1, 2);
        let steps_dir = rollouts.join("steps");
        let mut rows: Vec<StepRow> = TableReader::open(&steps_dir, TableName::Steps)
            .unwrap()
            .read_rows()
            .unwrap();
        rows[0].step_index = bad;
        let batch = rows_to_batch(TableName::Steps.def(), &rows).unwrap();
        forge_first_shard(
            &steps_dir,
            &batch,
            &[(META_TABLE, "steps"), (META_VERSION, "1")],
        );
        assert_rejected(
            &validate(&steps_dir),
            &[
                "`steps`",
                "`step_index`",
                &format!("{bad} (allowed: 0 to 1000000)"),
            ],
        );
    }
}

/// `table`'s first shard rewritten as schema version `version` with the
/// columns `batch` holds (an older writer's shard), manifest to match.
fn as_older_version(table: &Path, batch: &RecordBatch, name: &str, version: u32) {
    let version_text = version.to_string();
    forge_first_shard(
        table,
        batch,
        &[(META_TABLE, name), (META_VERSION, &version_text)],
    );
    let mut manifest = Manifest::read(table).unwrap();
    manifest.schema_version = version;
    reseal(table, manifest);
}

/// `batch` with column `name` cast to `data_type` (nullability `nullable`).
fn with_column(
    batch: &RecordBatch,
    name: &str,
    data_type: DataType,
    nullable: bool,
) -> RecordBatch {
    let index = batch.schema().index_of(name).unwrap();
    let mut fields: Vec<Field> = batch
        .schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields[index] = Field::new(name, data_type.clone(), nullable);
    let mut columns: Vec<ArrayRef> = batch.columns().to_vec();
    columns[index] = cast(&columns[index], &data_type).unwrap();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

#[test]
fn tables_of_an_older_schema_version_are_read_when_their_columns_widen() {
    use embodyflow_core::schemas::{MetricRow, TaskRow};
    // tasks v1: gt_actions.action_id was i32 (v2: i64).
    let dir = tempfile::tempdir().unwrap();
    embodyflow_tests::write_table(dir.path(), &TaskRow::examples());
    let table = dir.path().join("tasks");
    let reader = TableReader::open(&table, TableName::Tasks).unwrap();
    let rows: Vec<TaskRow> = reader.read_rows().unwrap();
    let batch = reader.batches(None, 1024).unwrap().next().unwrap().unwrap();
    let DataType::List(item) = batch
        .schema()
        .field_with_name("gt_actions")
        .unwrap()
        .data_type()
        .clone()
    else {
        panic!("gt_actions is a list")
    };
    let DataType::Struct(fields) = item.data_type().clone() else {
        panic!("of structs")
    };
    let v1_fields: Vec<Field> = fields
        .iter()
        .map(|f| match f.name().as_str() {
            "action_id" => Field::new("action_id", DataType::Int32, f.is_nullable()),
            _ => f.as_ref().clone(),
        })
        .collect();
    let v1_type = DataType::List(Arc::new(Field::new(
        item.name(),
        DataType::Struct(v1_fields.into()),
        item.is_nullable(),
    )));
    let v1 = with_column(&batch, "gt_actions", v1_type, true);
    as_older_version(&table, &v1, "tasks", 1);
    let read: Vec<TaskRow> = TableReader::open(&table, TableName::Tasks)
        .unwrap()
        .read_rows()
        .unwrap();
    assert_eq!(read, rows);
    assert_eq!(validate(&table).code, 0);

    // metrics v1: clipfrac was not null (v2: nullable).
    let dir = tempfile::tempdir().unwrap();
    let metrics: Vec<MetricRow> = MetricRow::examples()
        .into_iter()
        .map(|m| MetricRow {
            clipfrac: Some(m.clipfrac.unwrap_or(0.0)),
            ..m
        })
        .collect();
    embodyflow_tests::write_table(dir.path(), &metrics);
    let table = dir.path().join("metrics");
    let batch = original_batch_of(&table, TableName::Metrics);
    let v1 = with_column(&batch, "clipfrac", DataType::Float32, false);
    as_older_version(&table, &v1, "metrics", 1);
    let read: Vec<MetricRow> = TableReader::open(&table, TableName::Metrics)
        .unwrap()
        .read_rows()
        .unwrap();
    assert_eq!(read, metrics);

    // A narrowing is no upgrade: an older shard with f64 scores is refused.
    let dir = tempfile::tempdir().unwrap();
    let table = rewards_table(dir.path());
    let batch = original_batch(&table);
    let v0 = with_column(&batch, "score", DataType::Float64, false);
    as_older_version(&table, &v0, "rewards", 0);
    assert_rejected(
        &validate(&table),
        &["`schema_version`", "is 0", "expected 4"],
    );
}

/// `batch` without column `name` (a shard written before it was added).
fn without_column(batch: &RecordBatch, name: &str) -> RecordBatch {
    let mut batch = batch.clone();
    batch.remove_column(batch.schema().index_of(name).unwrap());
    batch
}

#[test]
fn version_2_steps_and_rewards_are_read_with_the_version_3_columns_null() {
    use embodyflow_core::schemas::StepRow;
    let dir = tempfile::tempdir().unwrap();
    let steps = StepRow::examples();
    assert!(steps.iter().any(|r| r.response_mask.is_some()));
    embodyflow_tests::write_table(dir.path(), &steps);
    let table = dir.path().join("steps");
    let batch = original_batch_of(&table, TableName::Steps);
    as_older_version(&table, &without_column(&batch, "response_mask"), "steps", 2);
    let read: Vec<StepRow> = TableReader::open(&table, TableName::Steps)
        .unwrap()
        .read_rows()
        .unwrap();
    let nulled: Vec<StepRow> = steps
        .into_iter()
        .map(|r| StepRow {
            response_mask: None,
            ..r
        })
        .collect();
    assert_eq!(read, nulled);

    let rewards = RewardRow::examples();
    assert!(rewards.iter().any(|r| r.token_rewards.is_some()));
    embodyflow_tests::write_table(dir.path(), &rewards);
    let table = dir.path().join("rewards");
    let batch = original_batch_of(&table, TableName::Rewards);
    as_older_version(
        &table,
        &without_column(&without_column(&batch, "token_rewards"), "infra_fault"),
        "rewards",
        2,
    );
    let read: Vec<RewardRow> = TableReader::open(&table, TableName::Rewards)
        .unwrap()
        .read_rows()
        .unwrap();
    let nulled: Vec<RewardRow> = rewards
        .into_iter()
        .map(|r| RewardRow {
            infra_fault: None,
            token_rewards: None,
            ..r
        })
        .collect();
    assert_eq!(read, nulled);
    assert_eq!(validate(&table).code, 0);
}

#[test]
fn version_4_trajectories_are_read_with_source_row_null() {
    use embodyflow_core::schemas::TrajectoryRow;
    let dir = tempfile::tempdir().unwrap();
    let imported: Vec<TrajectoryRow> = TrajectoryRow::examples()
        .into_iter()
        .zip(0..)
        .map(|(r, row)| TrajectoryRow {
            source_row: Some(row),
            ..r
        })
        .collect();
    embodyflow_tests::write_table(dir.path(), &imported);
    let table = dir.path().join("trajectories");
    let batch = original_batch_of(&table, TableName::Trajectories);
    assert_eq!(
        TableReader::open(&table, TableName::Trajectories)
            .unwrap()
            .read_rows::<TrajectoryRow>()
            .unwrap(),
        imported,
        "version 5 keeps the dump's rows"
    );
    as_older_version(
        &table,
        &without_column(&batch, "source_row"),
        "trajectories",
        4,
    );
    let read: Vec<TrajectoryRow> = TableReader::open(&table, TableName::Trajectories)
        .unwrap()
        .read_rows()
        .unwrap();
    let collected: Vec<TrajectoryRow> = imported
        .into_iter()
        .map(|r| TrajectoryRow {
            source_row: None,
            ..r
        })
        .collect();
    assert_eq!(read, collected);
    assert_eq!(validate(&table).code, 0);
}

#[test]
fn version_1_tables_without_the_columns_added_since_are_read_with_them_null() {
    use embodyflow_core::schemas::{EvalRow, Row, StepRow, TrajectoryRow};
    /// Writes `R`'s examples with every column added since version 1 set
    /// (`fill(row, true)`), drops those columns from the shard and labels it
    /// version 1: it reads back with them null (`fill(row, false)`).
    fn check<R: Row + Examples + PartialEq + std::fmt::Debug>(
        name: &str,
        added: &[&str],
        fill: fn(&mut R, bool),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut rows = R::examples();
        for row in &mut rows {
            fill(row, true);
        }
        embodyflow_tests::write_table(dir.path(), &rows);
        let table = dir.path().join(name);
        let mut batch = original_batch_of(&table, R::TABLE);
        for column in added {
            batch = without_column(&batch, column);
        }
        as_older_version(&table, &batch, name, 1);
        let reader = TableReader::open(&table, R::TABLE).unwrap();
        let read: Vec<R> = reader.read_rows().unwrap();
        for row in &mut rows {
            fill(row, false);
        }
        assert_eq!(read, rows, "{name}");
        // A projection naming an added column gets nulls, in schema order.
        let key = R::TABLE.def().key[0].clone();
        let projected = reader
            .batches(Some(&[added[0], key.as_str()]), 1024)
            .unwrap()
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(projected.num_columns(), 2, "{name}");
        assert_eq!(projected.schema().field(0).name(), &key, "{name}");
        let column = projected.column_by_name(added[0]).unwrap();
        assert_eq!(column.null_count(), rows.len(), "{name}");
        assert_eq!(validate(&table).code, 0, "{name}");
    }
    check::<TrajectoryRow>(
        "trajectories",
        &[
            "ever_grasped",
            "failure_reason",
            "infra_fault",
            "source_row",
        ],
        |r, set| {
            r.ever_grasped = set.then_some(true);
            r.failure_reason = set.then(|| "worker 0 crashed".to_string());
            r.infra_fault = set.then_some(true);
            r.source_row = set.then_some(7);
        },
    );
    check::<RewardRow>(
        "rewards",
        &["ever_grasped", "token_rewards", "infra_fault"],
        |r, set| {
            r.ever_grasped = set.then_some(true);
            r.token_rewards = set.then(|| vec![r.score]);
            r.infra_fault = set.then_some(true);
        },
    );
    check::<EvalRow>("eval", &["ever_grasped", "failure_reason"], |r, set| {
        r.ever_grasped = set.then_some(true);
        r.failure_reason = set.then(|| "worker 0 hung".to_string());
    });
    check::<StepRow>("steps", &["anchor_key", "response_mask"], |r, set| {
        r.anchor_key = set.then(|| "00ff".to_string());
        r.response_mask = set.then(|| vec![true; r.response_ids.len()]);
    });

    // Only a nullable column may be missing: a v1 eval shard without
    // `success` (not null) is refused.
    let dir = tempfile::tempdir().unwrap();
    embodyflow_tests::write_table(dir.path(), &EvalRow::examples());
    let table = dir.path().join("eval");
    let batch = original_batch_of(&table, TableName::Eval);
    as_older_version(&table, &without_column(&batch, "success"), "eval", 1);
    let current = TableName::Eval.def().version.to_string();
    assert_rejected(
        &validate(&table),
        &[
            "`eval`",
            "`schema_version`",
            "is 1",
            &format!("expected {current}"),
        ],
    );
}

fn original_batch_of(table_dir: &Path, table: TableName) -> RecordBatch {
    let reader = TableReader::open(table_dir, table).unwrap();
    reader.batches(None, 1024).unwrap().next().unwrap().unwrap()
}
