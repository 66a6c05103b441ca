//! The report's inputs: validated tables as lazy polars scans over exactly
//! the shards their manifests list, an advantages table's lineage (the
//! rewards and steps it was computed from, checked by content hash), and
//! the one-number queries over them.
//!
//! ```text
//! scan(adv/advantages) → lineage(rewards), lineage(steps) → credit, heatmap
//! ```

use std::path::Path;

use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::TableName;
use polars::prelude::*;

use crate::{ReportError, Result, query};

/// A validated table as a lazy scan over exactly the shards its manifest
/// lists (no globbing, no hive partitions: run directories such as
/// `adv@omega=0.5` are paths, not partition keys).
pub fn scan(dir: &Path, table: TableName) -> Result<(LazyFrame, TableReader)> {
    let reader = TableReader::open(dir, table)?;
    let paths = reader
        .manifest()
        .shards
        .iter()
        .map(|shard| PlRefPath::new(dir.join(&shard.file).to_string_lossy().into_owned()));
    let args = ScanArgsParquet {
        hive_options: HiveOptions::new_disabled(),
        glob: false,
        ..ScanArgsParquet::default()
    };
    let frame = query(
        &dir.display().to_string(),
        LazyFrame::scan_parquet_sources(ScanSources::Paths(paths.collect()), args),
    )?;
    Ok((frame, reader))
}

/// `frame` without the rows of episodes that infrastructure ended (a
/// crashed, hung or malformed environment worker): they are no outcome of
/// the policy. Rewards and trajectories mark them in `infra_fault`, eval
/// rows by a `failure_reason`; a table written before those columns has
/// none.
fn without_infra_faults(frame: LazyFrame, dir: &Path) -> Result<LazyFrame> {
    let mut frame = frame;
    let schema = query(&dir.display().to_string(), frame.collect_schema())?;
    Ok(if schema.contains("infra_fault") {
        frame.filter(col("infra_fault").fill_null(lit(false)).not())
    } else if schema.contains("failure_reason") {
        frame.filter(col("failure_reason").is_null())
    } else {
        frame
    })
}

/// Means of columns of a validated table (a boolean column's mean is its
/// share of true; nulls are left out), in one lazy pass over its shards.
/// Rows of episodes ended by infrastructure are left out
/// ([`without_infra_faults`]).
pub fn column_means(dir: &Path, table: TableName, names: &[&str]) -> Result<Vec<Option<f64>>> {
    let (frame, _) = scan(dir, table)?;
    let frame = without_infra_faults(frame, dir)?;
    let means = query(
        &dir.display().to_string(),
        frame
            .select(
                names
                    .iter()
                    .map(|name| col(*name).cast(DataType::Float64).mean())
                    .collect::<Vec<_>>(),
            )
            .collect(),
    )?;
    names
        .iter()
        .map(|name| {
            let column = query(name, means.column(name).and_then(|c| c.f64().cloned()))?;
            Ok(column.get(0))
        })
        .collect()
}

/// The groups of a rewards table whose scores are not all equal — the
/// groups a group-relative estimator (GRPO, Dr. GRPO) draws a gradient
/// from — and all its groups: `(with_signal, groups)`, one lazy pass.
/// Rows of episodes ended by infrastructure (`infra_fault`) are no outcome
/// and left out (a table written before the column has none).
pub fn groups_with_signal(dir: &Path) -> Result<(u64, u64)> {
    let (frame, _) = scan(dir, TableName::Rewards)?;
    let frame = without_infra_faults(frame, dir)?;
    let counts = query(
        &dir.display().to_string(),
        frame
            .group_by([col("group_id")])
            .agg([(col("score").max() - col("score").min())
                .gt(lit(0.0))
                .alias("signal")])
            .select([
                col("signal")
                    .cast(DataType::UInt64)
                    .sum()
                    .alias("with_signal"),
                col("signal").count().alias("groups"),
            ])
            .collect(),
    )?;
    let count = |name: &str| -> Result<u64> {
        let column = query(
            name,
            counts.column(name).and_then(|c| c.cast(&DataType::UInt64)),
        )?;
        let column = query(name, column.u64().cloned())?;
        Ok(column.get(0).unwrap_or(0))
    };
    Ok((count("with_signal")?, count("groups")?))
}

/// How a list column is exploded: an empty list is no row, a null stays.
pub(crate) const EXPLODE: ExplodeOptions = ExplodeOptions {
    empty_as_null: false,
    keep_nulls: true,
};

/// The `table` an advantages table was computed from (its lineage: the
/// rewards, the steps), checked to hold the same content now, as a scan.
pub(crate) fn lineage(
    advantages: &TableReader,
    table: TableName,
) -> Result<(LazyFrame, TableReader)> {
    let input = advantages
        .manifest()
        .inputs
        .iter()
        .find(|i| i.table == table.as_str())
        .ok_or_else(|| {
            ReportError::BadInput(format!(
                "{}: its manifest names no {table} input",
                advantages.dir().display()
            ))
        })?;
    let (frame, read) = scan(&input.path, table)?;
    if read.manifest().content_hash != input.content_hash {
        return Err(ReportError::BadInput(format!(
            "{}: the {table} at {} changed since these advantages were computed (content hash {} vs {})",
            advantages.dir().display(),
            input.path.display(),
            read.manifest().content_hash,
            input.content_hash
        )));
    }
    Ok((frame, read))
}

/// The `u64` in column `name` of a one-row frame (0 when null).
pub(crate) fn u64_at(frame: &DataFrame, name: &str) -> Result<u64> {
    let column = query(
        name,
        frame.column(name).and_then(|c| c.cast(&DataType::UInt64)),
    )?;
    Ok(query(name, column.u64().cloned())?.get(0).unwrap_or(0))
}
