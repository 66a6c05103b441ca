//! The report's inputs: validated tables as lazy polars scans over exactly
//! the shards their manifests list, an advantages table's lineage (the
//! rewards and steps it was computed from, checked by content hash).
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
