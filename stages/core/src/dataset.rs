//! Shard datasets: every table is a directory of zstd Parquet shards plus a
//! `_manifest.parquet` ([`crate::manifest`]).
//!
//! **Writing** is atomic. [`TableWriter`] writes its shards into a hidden
//! sibling `.<table>.tmp-<pid>-<nanos>/`, hashing each shard's bytes as they
//! stream out; [`TableWriter::finish_staged`] writes the manifest and fsyncs
//! every file and the directory, and a [`Commit`] swaps it into place together
//! with the run's other outputs ([`crate::commit`]: a journal, then
//! `renameat2(RENAME_EXCHANGE)`, so an existing table is never absent while it
//! is replaced). [`TableWriter::finish`] does both for a table written alone.
//! A writer killed at any moment leaves only hidden siblings, which readers
//! never look at and the next writer into that directory removes; a killed
//! commit is completed by whoever next opens a table there.
//! Whatever order and batches a stage writes rows in, the table stores them
//! in key order and hands Parquet whole row groups, so the same rows give
//! the same bytes ([`crate::canonical`]); that is what lets
//! [`merge_tables`] rebuild an unsharded table from its shards exactly.
//!
//! **Reading** streams record batches shard by shard with column projection,
//! so memory follows the batch size and not the table size. Every shard is
//! checked before its first batch: its size against the manifest (truncation),
//! its Parquet metadata (table name and schema version, so a foreign Parquet
//! file is rejected) and its Arrow schema against `schemas/` (every column
//! present with the declared type and nullability, nothing extra). A shard of
//! an older schema version is read when every column widens losslessly to
//! the current type (wider integers or floats, non-null into nullable, lists
//! and structs of such) and every column it lacks is nullable (a column
//! added since, read as null): its batches are cast as they stream, so
//! tables written before such a change stay readable.
//!
//! ```no_run
//! # use embodyflow_core::dataset::{TableReader, TableWriter, WriteOptions};
//! # use embodyflow_core::manifest::Producer;
//! # use embodyflow_schemas::{EvalRow, TableName};
//! # fn demo(out: &std::path::Path, producer: &Producer, rows: &[EvalRow]) -> embodyflow_core::Result<()> {
//! let mut writer = TableWriter::create(out, TableName::Eval, WriteOptions::default(), false)?;
//! writer.write_rows(rows)?;
//! let manifest = writer.finish(producer, &[])?;
//! let reader = TableReader::open(&out.join("eval"), TableName::Eval)?;
//! for batch in reader.batches(Some(&["task_id", "success"]), 8192)? {
//!     let batch = batch?; // a RecordBatch with two columns
//! #   let _ = batch;
//! }
//! let rows: Vec<EvalRow> = reader.read_rows()?;
//! # let _ = (manifest, rows); Ok(()) }
//! ```

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, FieldRef, Schema};
use embodyflow_schemas::{META_TABLE, META_VERSION, Row, TableDef, TableName, format_type};
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::arrow::arrow_writer::{ArrowRowGroupWriterFactory, compute_leaves};
use parquet::arrow::{ArrowWriter, ProjectionMask};
use parquet::file::reader::ChunkReader;
use parquet::file::writer::SerializedFileWriter;

use crate::canonical::{KeyOrder, RowGroup, Sorter, Source, Ties, merge_sorted};
use crate::commit::{self, Commit, Digest, sync_dir};
use crate::error::{Error, Result};
use crate::manifest::{InputRef, MANIFEST_FILE, MANIFEST_FORMAT, Manifest, Producer, ShardEntry};
use crate::shard_hash::{self, TreeHasher, VerifiedShard};

/// How a table is cut into files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteOptions {
    /// Rows per Parquet shard file.
    pub rows_per_shard: usize,
    /// Rows per Parquet row group (the unit a reader decodes at once).
    pub row_group_rows: usize,
    /// zstd compression level.
    pub zstd_level: i32,
}

impl Default for WriteOptions {
    fn default() -> Self {
        WriteOptions {
            rows_per_shard: 262_144,
            row_group_rows: 8_192,
            zstd_level: 3,
        }
    }
}

/// A `Write` that hashes (block by block, [`crate::shard_hash`]) and
/// counts the bytes it passes on.
struct HashingFile {
    inner: BufWriter<File>,
    hasher: TreeHasher,
    bytes: u64,
}

impl Write for HashingFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A shard being written: its file name and rows, and from its first row
/// group on (which chooses the columns' codecs, [`crate::codecs`]) its file
/// under Parquet's writer ([`ParquetShard`]).
struct OpenShard {
    file: String,
    rows: u64,
    parquet: Option<ParquetShard>,
}

/// A shard's file under Parquet's file writer, and what makes its column
/// writers (the row groups are encoded column by column,
/// [`encode_row_group`]).
struct ParquetShard {
    writer: SerializedFileWriter<HashingFile>,
    columns: ShardColumns,
}

impl ParquetShard {
    /// Creates the shard's file at `path` under a writer with the codecs
    /// `first_group` (the first row group's batches) calls for.
    fn create(
        def: &TableDef,
        options: &WriteOptions,
        first_group: &[RecordBatch],
        path: &Path,
    ) -> Result<ParquetShard> {
        let props = crate::codecs::shard_properties(def, options, first_group)?;
        let handle = File::create(path).map_err(|e| Error::io(path, e))?;
        let sink = HashingFile {
            inner: BufWriter::with_capacity(1 << 20, handle),
            hasher: TreeHasher::default(),
            bytes: 0,
        };
        let write_batch_size = props.write_batch_size();
        let (writer, factory) = ArrowWriter::try_new(sink, def.arrow_schema(), Some(props))
            .and_then(ArrowWriter::into_serialized_writer)
            .map_err(|source| Error::ParquetWrite {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(ParquetShard {
            writer,
            columns: ShardColumns {
                factory,
                write_batch_size,
            },
        })
    }
}

impl OpenShard {
    /// Its Parquet writer, made on the first call ([`ParquetShard::create`]
    /// with `first_group`).
    fn parquet(
        &mut self,
        def: &TableDef,
        options: &WriteOptions,
        first_group: &[RecordBatch],
        path: &Path,
    ) -> Result<&mut ParquetShard> {
        let parquet = match self.parquet.take() {
            Some(parquet) => parquet,
            None => ParquetShard::create(def, options, first_group, path)?,
        };
        Ok(self.parquet.insert(parquet))
    }
}

/// The factory of a shard's column writers and their mini-batch size.
struct ShardColumns {
    factory: ArrowRowGroupWriterFactory,
    write_batch_size: usize,
}

/// Writes one table atomically (see the module doc).
pub struct TableWriter {
    table: TableName,
    def: &'static TableDef,
    options: WriteOptions,
    final_dir: PathBuf,
    tmp_dir: PathBuf,
    overwrite: bool,
    /// Whether `create` made the output directory (removed again if left empty).
    created_out: bool,
    current: Option<OpenShard>,
    shards: Vec<ShardEntry>,
    finished: bool,
    /// Keeps the rows in key order ([`crate::canonical`]).
    sorter: Sorter,
    /// Rows of the open shard's next row group ([`crate::canonical`]).
    group: RowGroup,
}

fn shard_file_name(index: usize) -> String {
    format!("part-{index:05}.parquet")
}

impl TableWriter {
    /// Starts writing table `table` into `out/<table>/`. Fails with
    /// [`Error::OutputExists`] before writing anything when the table exists
    /// and `overwrite` is false.
    pub fn create(
        out: &Path,
        table: TableName,
        options: WriteOptions,
        overwrite: bool,
    ) -> Result<TableWriter> {
        let final_dir = out.join(table.as_str());
        if final_dir.exists() && !overwrite {
            return Err(Error::OutputExists(final_dir));
        }
        let sorter = Sorter::new(table.def())?;
        let created_out = !out.exists();
        std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
        commit::clean_stale(out)?;
        let tmp_dir = out.join(commit::staging_name(table.as_str()));
        std::fs::create_dir(&tmp_dir).map_err(|e| Error::io(&tmp_dir, e))?;
        Ok(TableWriter {
            table,
            def: table.def(),
            options: WriteOptions {
                rows_per_shard: options.rows_per_shard.max(1),
                row_group_rows: options.row_group_rows.max(1),
                ..options
            },
            final_dir,
            tmp_dir,
            overwrite,
            created_out,
            current: None,
            shards: Vec::new(),
            finished: false,
            sorter,
            group: RowGroup::default(),
        })
    }

    /// Converts `rows` with the table's schema and writes them.
    pub fn write_rows<R: Row>(&mut self, rows: &[R]) -> Result<()> {
        assert_eq!(
            R::TABLE,
            self.table,
            "rows of `{}` written to table `{}`",
            R::TABLE,
            self.table
        );
        if rows.is_empty() {
            return Ok(());
        }
        let batch = rows_to_batch(self.def, rows)?;
        self.write_batch(&batch)
    }

    /// Writes a record batch whose columns follow the table's schema (names,
    /// types and nullability; list item names may differ). Rows may come in
    /// any order: the table stores them in key order ([`crate::canonical`]).
    pub fn write_batch(&mut self, batch: &RecordBatch) -> Result<()> {
        let batch = conform_batch(self.def, batch)?;
        if let Some(bad) = crate::values::first_bad_value(self.def, &batch) {
            return Err(Error::InvalidOutputValue {
                table: self.def.name.clone(),
                column: bad.column,
                key: crate::values::describe_key(self.def, &batch, bad.row)
                    .unwrap_or_else(|| format!("{} of the batch", bad.row)),
                found: bad.found,
            });
        }
        match self.sorter.admit(batch, &self.tmp_dir)? {
            Some(batch) => self.write_in_order(&batch),
            None => Ok(()),
        }
    }

    /// Appends rows that continue the key order: cuts them into shards of
    /// `rows_per_shard` and hands each shard's row groups of
    /// `row_group_rows` to Parquet whole ([`crate::canonical`]).
    fn write_in_order(&mut self, batch: &RecordBatch) -> Result<()> {
        let mut offset = 0;
        while offset < batch.num_rows() {
            let in_shard = self.current.as_ref().map_or(0, |s| s.rows as usize);
            let room = (self.options.rows_per_shard - in_shard)
                .min(self.options.row_group_rows - self.group.rows());
            let take = room.min(batch.num_rows() - offset);
            self.open_shard()?;
            self.group.push(batch.slice(offset, take));
            offset += take;
            let shard = self.current.as_mut().expect("shard opened above");
            shard.rows += take as u64;
            let shard_full = shard.rows as usize >= self.options.rows_per_shard;
            if shard_full || self.group.rows() >= self.options.row_group_rows {
                self.write_group()?;
            }
            if shard_full {
                self.close_shard()?;
            }
        }
        Ok(())
    }

    /// Hands the buffered row group to the open shard's Parquet writer.
    fn write_group(&mut self) -> Result<()> {
        let slices = self.group.take();
        if slices.is_empty() {
            return Ok(());
        }
        let shard = self
            .current
            .as_mut()
            .expect("a row group belongs to an open shard");
        let path = self.tmp_dir.join(&shard.file);
        let parquet = shard.parquet(self.def, &self.options, &slices, &path)?;
        encode_row_group(
            &mut parquet.writer,
            &parquet.columns,
            &self.def.arrow_schema(),
            slices,
        )
        .map_err(|source| Error::ParquetWrite { path, source })
    }

    fn open_shard(&mut self) -> Result<&mut OpenShard> {
        let shard = match self.current.take() {
            Some(shard) => shard,
            None => OpenShard {
                file: shard_file_name(self.shards.len()),
                rows: 0,
                parquet: None,
            },
        };
        Ok(self.current.insert(shard))
    }

    fn close_shard(&mut self) -> Result<()> {
        if self.current.is_none() {
            return Ok(());
        }
        self.write_group()?;
        let Some(shard) = self.current.take() else {
            return Ok(());
        };
        let path = self.tmp_dir.join(&shard.file);
        // A shard without rows (an empty table's) gets its file here.
        let parquet = match shard.parquet {
            Some(parquet) => parquet,
            None => ParquetShard::create(self.def, &self.options, &[], &path)?,
        };
        let mut sink = parquet
            .writer
            .into_inner()
            .map_err(|source| Error::ParquetWrite {
                path: path.clone(),
                source,
            })?;
        sink.flush().map_err(|e| Error::io(&path, e))?;
        let HashingFile {
            inner,
            hasher,
            bytes,
        } = sink;
        let file = inner
            .into_inner()
            .map_err(|e| Error::io(&path, e.into_error()))?;
        file.sync_all().map_err(|e| Error::io(&path, e))?;
        let (hash, blocks) = hasher.finish();
        self.shards.push(ShardEntry {
            file: shard.file,
            rows: shard.rows,
            bytes,
            hash: hash.to_hex().to_string(),
            blocks: shard_hash::to_hex(&blocks),
        });
        Ok(())
    }

    /// Closes the last shard and writes the manifest, everything fsynced,
    /// leaving the table staged under its hidden name for a [`Commit`]. An
    /// empty table gets one empty shard, so its schema is on disk.
    pub fn finish_staged(
        mut self,
        producer: &Producer,
        inputs: &[InputRef],
    ) -> Result<StagedTable> {
        if self.sorter.spilled() {
            // Rows came out of key order: rebuild the shards from every run.
            self.close_shard()?;
            let written: Vec<PathBuf> = std::mem::take(&mut self.shards)
                .iter()
                .map(|s| self.tmp_dir.join(&s.file))
                .collect();
            let mut sorter = std::mem::replace(&mut self.sorter, Sorter::new(self.def)?);
            sorter.merge_into(&written, &mut |batch| self.write_in_order(&batch))?;
        }
        if self.shards.is_empty() && self.current.is_none() {
            self.open_shard()?;
        }
        self.close_shard()?;
        let manifest = Manifest {
            format: MANIFEST_FORMAT.to_string(),
            table: self.def.name.clone(),
            schema_version: self.def.version,
            num_rows: self.shards.iter().map(|s| s.rows).sum(),
            content_hash: Manifest::compute_content_hash(
                &self.def.name,
                self.def.version,
                &self.shards,
            ),
            shards: std::mem::take(&mut self.shards),
            producer: producer.clone(),
            inputs: inputs.to_vec(),
        };
        manifest.write(&self.tmp_dir)?;
        sync_dir(&self.tmp_dir)?;
        self.finished = true;
        let out = self
            .final_dir
            .parent()
            .expect("a table directory has a parent")
            .to_path_buf();
        let staged = self
            .tmp_dir
            .file_name()
            .expect("a staging directory has a name")
            .to_string_lossy()
            .into_owned();
        let mut commit = Commit::new(&out);
        commit.add(
            &staged,
            self.table.as_str(),
            Digest::DirFile(MANIFEST_FILE),
            self.overwrite,
        )?;
        Ok(StagedTable { manifest, commit })
    }

    /// [`Self::finish_staged`], then commits the table alone.
    pub fn finish(self, producer: &Producer, inputs: &[InputRef]) -> Result<Manifest> {
        self.finish_staged(producer, inputs)?.commit()
    }
}

/// A complete table under its hidden staging name, not yet visible: commit
/// it (alone, or merged into a stage's [`Commit`] with
/// [`Commit::absorb`]); dropped uncommitted, it is removed.
#[derive(Debug)]
pub struct StagedTable {
    /// The table's manifest.
    pub manifest: Manifest,
    commit: Commit,
}

impl StagedTable {
    /// Commits the table alone.
    pub fn commit(self) -> Result<Manifest> {
        self.commit.apply()?;
        Ok(self.manifest)
    }

    /// The manifest and the one-entry commit, to merge into a larger commit.
    pub fn into_parts(self) -> (Manifest, Commit) {
        (self.manifest, self.commit)
    }
}

impl Drop for TableWriter {
    fn drop(&mut self) {
        if !self.finished {
            // An unfinished table is never left where a reader would look.
            let _ = std::fs::remove_dir_all(&self.tmp_dir);
            if self.created_out
                && let Some(out) = self.final_dir.parent()
            {
                let _ = std::fs::remove_dir(out); // only succeeds when empty
            }
        }
    }
}

/// Encodes one row group, given as the batches (`slices`) that make it up,
/// into `writer`, column by column, each finished column chunk going to the
/// file before the next column is encoded. The bytes are those of
/// `ArrowWriter` writing the joined batch in one call, which hands each
/// column to its encoder in one call; here:
/// - a flat column's slices are joined and encoded in one call;
/// - a list column is encoded in pieces of whole rows, each cut where the
///   one-call encoder would start a mini-batch anyway ([`list_pieces`]), so
///   the encoder sees the same mini-batches and writes the same pages, while
///   the levels and value indices it builds (12 bytes per value) are those
///   of one piece, not of the whole row group.
fn encode_row_group(
    writer: &mut SerializedFileWriter<HashingFile>,
    shard: &ShardColumns,
    schema: &Schema,
    slices: Vec<RecordBatch>,
) -> parquet::errors::Result<()> {
    let mut leaves = shard
        .factory
        .create_column_writers(writer.flushed_row_groups().len())?
        .into_iter();
    let mut row_group = writer.next_row_group()?;
    // The slices' arrays, column-major, so that each column is dropped once encoded.
    let mut by_column: Vec<Vec<ArrayRef>> =
        vec![Vec::with_capacity(slices.len()); schema.fields().len()];
    for slice in slices {
        for (column, array) in by_column.iter_mut().zip(slice.columns()) {
            column.push(array.clone());
        }
    }
    for (field, parts) in schema.fields().iter().zip(by_column) {
        let pieces = match field.data_type() {
            DataType::List(item) if item.data_type().is_primitive() => {
                list_pieces(&parts, shard.write_batch_size)?
            }
            _ => vec![join(&parts, 0, parts.iter().map(|a| a.len()).sum())?],
        };
        drop(parts);
        let mut columns = Vec::new();
        for piece in pieces {
            let piece_leaves = compute_leaves(field, &piece)?;
            if columns.is_empty() {
                columns = piece_leaves
                    .iter()
                    .map(|_| leaves.next().expect("a column writer per leaf"))
                    .collect();
            }
            for (column, leaf) in columns.iter_mut().zip(&piece_leaves) {
                column.write(leaf)?;
            }
        }
        for column in columns {
            column.close()?.append_to_row_group(&mut row_group)?;
        }
    }
    row_group.close()?;
    Ok(())
}

/// Levels (about) in each piece of a list column that [`encode_row_group`]
/// hands the encoder at once.
const PIECE_LEVELS: usize = 1 << 16;

/// A list column of a row group (its slices, `parts`) cut into pieces of
/// whole rows of about [`PIECE_LEVELS`] levels, where the encoder given the
/// whole column in one call would start a mini-batch anyway: it cuts its
/// input into runs of `write_batch_size` levels, each extended to the next
/// row's start (a row has one level per item, one when null or empty), so a
/// piece that starts at such a point and ends at one is cut the same way.
/// Every piece holds a row of two or more items, so that its repetition
/// levels vary and are written out (not stored as one repeated value, which
/// would make the encoder cut it otherwise); a column without such a row
/// stays whole.
fn list_pieces(
    parts: &[ArrayRef],
    write_batch_size: usize,
) -> parquet::errors::Result<Vec<ArrayRef>> {
    let rows: usize = parts.iter().map(|a| a.len()).sum();
    let mut cuts = vec![0];
    let (mut row, mut level) = (0, 0);
    let (mut mini_batch, mut piece) = (0, 0);
    let mut piece_varies = false;
    for part in parts {
        let list = part.as_list::<i32>();
        for i in 0..list.len() {
            if row > 0 && level >= mini_batch + write_batch_size {
                mini_batch = level;
                if level - piece >= PIECE_LEVELS && piece_varies {
                    cuts.push(row);
                    piece = level;
                    piece_varies = false;
                }
            }
            let items = if list.is_null(i) {
                0
            } else {
                list.value_length(i) as usize
            };
            piece_varies |= items >= 2;
            level += items.max(1);
            row += 1;
        }
    }
    if !piece_varies && cuts.len() > 1 {
        cuts.pop();
    }
    cuts.push(rows);
    cuts.windows(2)
        .map(|w| join(parts, w[0], w[1] - w[0]))
        .collect()
}

/// Rows `start..start + len` of the arrays `parts` taken one after the
/// other, as one array (a slice when they lie in one part, else joined).
fn join(parts: &[ArrayRef], start: usize, len: usize) -> parquet::errors::Result<ArrayRef> {
    let mut pieces: Vec<ArrayRef> = Vec::new();
    let mut offset = 0;
    for part in parts {
        let (from, to) = (start.max(offset), (start + len).min(offset + part.len()));
        if from < to {
            pieces.push(part.slice(from - offset, to - from));
        }
        offset += part.len();
    }
    match pieces.as_slice() {
        [one] => Ok(one.clone()),
        _ => {
            let refs: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
            Ok(arrow::compute::concat(&refs)?)
        }
    }
}

/// Converts rows to a record batch with the table's schema.
pub fn rows_to_batch<R: Row>(def: &TableDef, rows: &[R]) -> Result<RecordBatch> {
    let schema = def.arrow_schema();
    let fields: Vec<FieldRef> = schema.fields().iter().cloned().collect();
    let batch = serde_arrow::to_record_batch(&fields, &rows).map_err(|e| Error::RowConversion {
        table: def.name.clone(),
        reason: e.to_string(),
    })?;
    batch.with_schema(schema).map_err(|e| Error::RowConversion {
        table: def.name.clone(),
        reason: e.to_string(),
    })
}

/// Checks a batch against the table's schema and returns it with exactly the
/// schema's fields and metadata.
fn conform_batch(def: &TableDef, batch: &RecordBatch) -> Result<RecordBatch> {
    let found = batch.schema();
    let mismatch = |reason: String| Error::RowConversion {
        table: def.name.clone(),
        reason,
    };
    if found.fields().len() != def.columns.len() {
        return Err(mismatch(format!(
            "batch has columns [{}], expected [{}]",
            found
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .collect::<Vec<_>>()
                .join(", "),
            def.column_names().join(", ")
        )));
    }
    for (field, column) in found.fields().iter().zip(&def.columns) {
        if field.name() != &column.name
            || format_type(field.data_type()) != format_type(&column.data_type)
            || (field.is_nullable() && !column.nullable)
        {
            return Err(mismatch(format!(
                "column `{}` {}{} where `{}` {}{} is expected",
                field.name(),
                format_type(field.data_type()),
                if field.is_nullable() {
                    " (nullable)"
                } else {
                    ""
                },
                column.name,
                format_type(&column.data_type),
                if column.nullable { " (nullable)" } else { "" },
            )));
        }
    }
    if Arc::ptr_eq(&found, &def.arrow_schema()) {
        return Ok(batch.clone());
    }
    let columns = batch
        .columns()
        .iter()
        .zip(def.arrow_schema().fields())
        .map(|(array, field)| {
            if array.data_type() == field.data_type() {
                Ok(array.clone())
            } else {
                // Same type up to list item names: rebuild with the schema's names.
                arrow::compute::cast(array, field.data_type()).map_err(|e| mismatch(e.to_string()))
            }
        })
        .collect::<Result<Vec<_>>>()?;
    RecordBatch::try_new(def.arrow_schema(), columns).map_err(|e| mismatch(e.to_string()))
}

/// Reads one table directory (see the module doc).
#[derive(Debug, Clone)]
pub struct TableReader {
    table: TableName,
    dir: PathBuf,
    manifest: Manifest,
}

impl TableReader {
    /// Opens `dir` as table `table`: reads and checks its manifest and that
    /// every shard exists with the recorded size.
    pub fn open(dir: &Path, table: TableName) -> Result<TableReader> {
        if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
            commit::settle(parent)?;
        }
        let manifest = Manifest::read(dir)?;
        let def = table.def();
        if manifest.table != def.name {
            return Err(Error::ForeignShard {
                table: def.name.clone(),
                shard: MANIFEST_FILE.to_string(),
                field: "table".into(),
                expected: format!("`{}`", def.name),
                found: format!("`{}` ({})", manifest.table, dir.display()),
            });
        }
        // An older version is read when its columns widen losslessly to this
        // one's (checked per shard); a newer one never.
        if manifest.schema_version > def.version {
            return Err(Error::SchemaVersion {
                table: def.name.clone(),
                shard: MANIFEST_FILE.to_string(),
                expected: def.version,
                found: manifest.schema_version.to_string(),
            });
        }
        for shard in &manifest.shards {
            let path = dir.join(&shard.file);
            let bytes =
                std::fs::metadata(&path)
                    .map(|m| m.len())
                    .map_err(|e| Error::CorruptShard {
                        table: def.name.clone(),
                        shard: shard.file.clone(),
                        reason: format!("cannot be opened: {e} ({})", path.display()),
                    })?;
            if bytes != shard.bytes {
                return Err(Error::CorruptShard {
                    table: def.name.clone(),
                    shard: shard.file.clone(),
                    reason: format!(
                        "file size is {bytes} bytes, expected {} from the manifest (truncated or replaced)",
                        shard.bytes
                    ),
                });
            }
        }
        Ok(TableReader {
            table,
            dir: dir.to_path_buf(),
            manifest,
        })
    }

    /// The table read.
    pub fn table(&self) -> TableName {
        self.table
    }

    /// The table's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its manifest.
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Total rows.
    pub fn num_rows(&self) -> u64 {
        self.manifest.num_rows
    }

    /// This table as a lineage entry of a table derived from it.
    pub fn input_ref(&self) -> InputRef {
        InputRef {
            table: self.manifest.table.clone(),
            path: self.dir.clone(),
            content_hash: self.manifest.content_hash.clone(),
        }
    }

    /// Streams record batches of at most `batch_size` rows over all shards,
    /// with only `columns` (all when `None`), each shard validated first.
    pub fn batches(&self, columns: Option<&[&str]>, batch_size: usize) -> Result<Batches<'_>> {
        let def = self.table.def();
        let projection: Option<Vec<String>> = match columns {
            None => None,
            Some(names) => {
                for name in names {
                    if def.column(name).is_none() {
                        return Err(Error::BadInput(format!(
                            "table `{}` has no column `{name}`; its columns are: {}",
                            def.name,
                            def.column_names().join(", ")
                        )));
                    }
                }
                Some(names.iter().map(|s| s.to_string()).collect())
            }
        };
        Ok(Batches {
            reader: self,
            projection,
            batch_size: batch_size.max(1),
            next_shard: 0,
            current: None,
        })
    }

    /// Reads the whole table as rows.
    pub fn read_rows<R: Row>(&self) -> Result<Vec<R>> {
        assert_eq!(
            R::TABLE,
            self.table,
            "rows of `{}` read from table `{}`",
            R::TABLE,
            self.table
        );
        // Manifest numbers are untrusted: nothing is sized by them.
        let mut rows = Vec::new();
        for batch in self.batches(None, 8192)? {
            rows.extend(batch_to_rows::<R>(&batch?)?);
        }
        Ok(rows)
    }

    /// The entries of the table directory that the manifest does not list
    /// but that pandas, polars or duckdb, reading the directory as a dataset,
    /// would take for part of the table (their rows counted twice, or a
    /// foreign file's rows mixed in): every name but the listed shards' and
    /// the hidden ones (`.`- or `_`-prefixed, the manifest's included, which
    /// those readers skip), sorted.
    pub fn unlisted_files(&self) -> Result<Vec<String>> {
        let listed: std::collections::HashSet<&str> = self
            .manifest
            .shards
            .iter()
            .map(|s| s.file.as_str())
            .collect();
        let mut unlisted = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| Error::io(&self.dir, e))? {
            let name = entry
                .map_err(|e| Error::io(&self.dir, e))?
                .file_name()
                .to_string_lossy()
                .into_owned();
            if !name.starts_with(['.', '_']) && !listed.contains(name.as_str()) {
                unlisted.push(name);
            }
        }
        unlisted.sort();
        Ok(unlisted)
    }

    /// Recomputes every shard's content hash and compares it with the
    /// manifest (reads every byte once), and checks that its block hashes,
    /// where it has them, merge to it.
    pub fn verify_hashes(&self) -> Result<()> {
        (0..self.manifest.shards.len()).try_for_each(|index| {
            self.verify_shard_hash(index)?;
            let entry = &self.manifest.shards[index];
            if !entry.blocks.is_empty() {
                shard_hash::checked_blocks(&entry.blocks, entry.bytes, &entry.hash)
                    .map_err(|e| self.corrupt(index, e))?;
            }
            Ok(())
        })
    }

    /// Shard `index` is corrupt, for `reason`.
    fn corrupt(&self, index: usize, reason: String) -> Error {
        Error::CorruptShard {
            table: self.table.def().name.clone(),
            shard: self.manifest.shards[index].file.clone(),
            reason,
        }
    }

    /// Checks shard `index`'s BLAKE3 hash against the manifest.
    fn verify_shard_hash(&self, index: usize) -> Result<()> {
        let shard = &self.manifest.shards[index];
        let path = self.dir.join(&shard.file);
        let mut hasher = blake3::Hasher::new();
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        hasher
            .update_reader(file)
            .map_err(|e| Error::io(&path, e))?;
        self.check_hash(index, hasher.finalize())
    }

    /// Compares `found` with shard `index`'s hash in the manifest.
    fn check_hash(&self, index: usize, found: blake3::Hash) -> Result<()> {
        let expected = &self.manifest.shards[index].hash;
        let found = found.to_hex().to_string();
        if &found != expected {
            return Err(self.corrupt(
                index,
                format!(
                    "content hash is {found}, expected {expected} from the manifest (the file changed after it was written)"
                ),
            ));
        }
        Ok(())
    }

    /// The key of row `row` of shard `index` (for messages; reads the key
    /// columns of that shard again).
    fn key_in_shard(&self, index: usize, row: usize) -> String {
        let def = self.table.def();
        let position = format!("{row} of the shard");
        let keys: Vec<String> = def.key.clone();
        let Ok((mut reader, _)) = self.open_shard(index, Some(&keys), 8192, false) else {
            return position;
        };
        let mut seen = 0;
        while let Some(Ok(batch)) = reader.next() {
            if row < seen + batch.num_rows() {
                return crate::values::describe_key(def, &batch, row - seen)
                    .map_or(position.clone(), |key| format!("{key} ({position})"));
            }
            seen += batch.num_rows();
        }
        position
    }

    /// Opens shard `index`, validates it and builds its batch reader.
    /// With `verify` (unless `EMBODYFLOW_VERIFY_HASHES=0`), every byte is
    /// checked against the shard's BLAKE3 hash before it is decoded, since a
    /// same-size byte flip would otherwise decode into changed values: the
    /// blocks Parquet reads, each against its chaining value in the
    /// manifest ([`crate::shard_hash`]); a shard of one block, read once;
    /// a larger shard whose manifest has no block hashes, whole, first.
    fn open_shard(
        &self,
        index: usize,
        projection: Option<&[String]>,
        batch_size: usize,
        verify: bool,
    ) -> Result<(ParquetRecordBatchReader, bool)> {
        let entry = &self.manifest.shards[index];
        let path = self.dir.join(&entry.file);
        if !(verify && verify_hashes_on_read()) {
            let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
            return self.shard_reader(index, file, projection, batch_size);
        }
        if !entry.blocks.is_empty() {
            // Every block Parquet reads is checked before it is decoded.
            let shard = VerifiedShard::open(&path, entry.bytes, &entry.hash, &entry.blocks)
                .map_err(|e| self.corrupt(index, e))?;
            return self.shard_reader(index, shard, projection, batch_size);
        }
        if entry.bytes <= shard_hash::BLOCK {
            // One block: read once, checked, decoded from memory.
            let mut bytes = vec![0u8; entry.bytes as usize];
            File::open(&path)
                .and_then(|mut file| std::io::Read::read_exact(&mut file, &mut bytes))
                .map_err(|e| Error::io(&path, e))?;
            self.check_hash(index, blake3::hash(&bytes))?;
            return self.shard_reader(index, bytes::Bytes::from(bytes), projection, batch_size);
        }
        // A larger shard of a manifest without block hashes (written
        // before them): the whole file is hashed, then read again.
        self.verify_shard_hash(index)?;
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        self.shard_reader(index, file, projection, batch_size)
    }

    /// Shard `index`'s batch reader over `source`, after its Parquet
    /// metadata, schema and row count are checked against the table.
    fn shard_reader<T: ChunkReader + 'static>(
        &self,
        index: usize,
        source: T,
        projection: Option<&[String]>,
        batch_size: usize,
    ) -> Result<(ParquetRecordBatchReader, bool)> {
        let def = self.table.def();
        let entry = &self.manifest.shards[index];
        let corrupt = |reason: String| self.corrupt(index, reason);
        let builder = ParquetRecordBatchReaderBuilder::try_new(source)
            .map_err(|e| corrupt(format!("not a readable Parquet file: {e}")))?;
        let metadata = builder.metadata().file_metadata().key_value_metadata();
        let lookup = |key: &str| {
            metadata
                .and_then(|kvs| kvs.iter().find(|kv| kv.key == key))
                .and_then(|kv| kv.value.clone())
        };
        match lookup(META_TABLE) {
            Some(name) if name == def.name => {}
            found => {
                return Err(Error::ForeignShard {
                    table: def.name.clone(),
                    shard: entry.file.clone(),
                    field: META_TABLE.to_string(),
                    expected: format!("`{}`", def.name),
                    found: found.map_or("absent".to_string(), |n| format!("`{n}`")),
                });
            }
        }
        let found_version = lookup(META_VERSION);
        let upgrade = match found_version.as_deref().map(str::parse::<u32>) {
            Some(Ok(version)) if version == def.version => {
                check_schema(def, &entry.file, builder.schema())?;
                false
            }
            Some(Ok(version)) if version < def.version && widens_to(def, builder.schema()) => true,
            _ => {
                return Err(Error::SchemaVersion {
                    table: def.name.clone(),
                    shard: entry.file.clone(),
                    expected: def.version,
                    found: found_version.unwrap_or_else(|| "absent".into()),
                });
            }
        };
        let stored_rows = builder.metadata().file_metadata().num_rows();
        if u64::try_from(stored_rows).ok() != Some(entry.rows) {
            return Err(corrupt(format!(
                "holds {stored_rows} rows, expected {} from the manifest",
                entry.rows
            )));
        }
        let schema = builder.schema().clone();
        // An older shard may lack a column added since (`widens_to`): it is
        // filled with nulls by `upgrade_batch`, not read.
        let indices: Vec<usize> = match projection {
            None => (0..schema.fields().len()).collect(),
            Some(names) => names
                .iter()
                .filter_map(|n| {
                    let index = schema.index_of(n).ok();
                    assert!(upgrade || index.is_some(), "checked by check_schema");
                    index
                })
                .collect(),
        };
        let mask = ProjectionMask::roots(builder.parquet_schema(), indices);
        let reader = builder
            .with_projection(mask)
            .with_batch_size(batch_size)
            .build()
            .map_err(|e| corrupt(format!("cannot be decoded: {e}")))?;
        Ok((reader, upgrade))
    }
}

/// Whether a value of type `from` (nullable or not) converts to `to`
/// without loss: the same type, a wider integer or float, a non-null column
/// into a nullable one, and lists and structs (same field names, in order)
/// of such.
fn widens(from: &DataType, from_nullable: bool, to: &DataType, to_nullable: bool) -> bool {
    use DataType::*;
    if from_nullable && !to_nullable {
        return false;
    }
    match (from, to) {
        (List(a), List(b)) => widens(
            a.data_type(),
            a.is_nullable(),
            b.data_type(),
            b.is_nullable(),
        ),
        (Struct(a), Struct(b)) => {
            a.len() == b.len()
                && a.iter().zip(b.iter()).all(|(x, y)| {
                    x.name() == y.name()
                        && widens(
                            x.data_type(),
                            x.is_nullable(),
                            y.data_type(),
                            y.is_nullable(),
                        )
                })
        }
        (Int8, Int32 | Int64) | (Int32, Int64) | (Float32, Float64) => true,
        _ => format_type(from) == format_type(to),
    }
}

/// Whether a shard of an older schema version can be read as this version:
/// each of its columns is one of this version's, widening losslessly
/// ([`widens`]), and each column it lacks is nullable (added since). Such a
/// shard is read and its batches cast ([`upgrade_batch`]), so tables written
/// before a type was widened (`action_id` i32 -> i64), a column became
/// nullable or a nullable column was added (`ever_grasped`) stay readable.
fn widens_to(def: &TableDef, found: &Schema) -> bool {
    found
        .fields()
        .iter()
        .all(|field| def.column(field.name()).is_some())
        && def
            .columns
            .iter()
            .all(|column| match found.field_with_name(&column.name) {
                Ok(field) => widens(
                    field.data_type(),
                    field.is_nullable(),
                    &column.data_type,
                    column.nullable,
                ),
                Err(_) => column.nullable,
            })
}

/// Casts a batch of an older, widening shard to this version's column types,
/// in this version's column order: the columns of `projection` (all when
/// `None`), a column the shard lacks as nulls.
fn upgrade_batch(
    def: &TableDef,
    batch: &RecordBatch,
    projection: Option<&[String]>,
) -> std::result::Result<RecordBatch, String> {
    let wanted = |name: &str| projection.is_none_or(|names| names.iter().any(|n| n == name));
    let mut fields = Vec::with_capacity(def.columns.len());
    let mut columns = Vec::with_capacity(def.columns.len());
    for column in def.columns.iter().filter(|c| wanted(&c.name)) {
        let array = match batch.column_by_name(&column.name) {
            Some(array) => {
                arrow::compute::cast(array, &column.data_type).map_err(|e| e.to_string())?
            }
            None => arrow::array::new_null_array(&column.data_type, batch.num_rows()),
        };
        fields.push(arrow::datatypes::Field::new(
            column.name.as_str(),
            column.data_type.clone(),
            column.nullable,
        ));
        columns.push(array);
    }
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    RecordBatch::try_new_with_options(Arc::new(Schema::new(fields)), columns, &options)
        .map_err(|e| e.to_string())
}

/// Checks a shard's Arrow schema against the table definition.
fn check_schema(def: &TableDef, shard: &str, found: &Schema) -> Result<()> {
    let describe = |data_type: &arrow::datatypes::DataType, nullable: bool| {
        format!(
            "{}{}",
            format_type(data_type),
            if nullable {
                " (nullable)"
            } else {
                " (not null)"
            }
        )
    };
    for column in &def.columns {
        match found.field_with_name(&column.name) {
            Err(_) => {
                return Err(Error::MissingColumn {
                    table: def.name.clone(),
                    shard: shard.to_string(),
                    field: column.name.clone(),
                    expected: describe(&column.data_type, column.nullable),
                });
            }
            Ok(field) => {
                let same_type = format_type(field.data_type()) == format_type(&column.data_type);
                if !same_type || (field.is_nullable() && !column.nullable) {
                    return Err(Error::SchemaMismatch {
                        table: def.name.clone(),
                        shard: shard.to_string(),
                        field: column.name.clone(),
                        expected: describe(&column.data_type, column.nullable),
                        found: describe(field.data_type(), field.is_nullable()),
                    });
                }
            }
        }
    }
    if let Some(extra) = found
        .fields()
        .iter()
        .find(|f| def.column(f.name()).is_none())
    {
        return Err(Error::UnexpectedColumn {
            table: def.name.clone(),
            shard: shard.to_string(),
            field: extra.name().clone(),
            expected: def.column_names().join(", "),
            found: format_type(extra.data_type()),
        });
    }
    Ok(())
}

/// Column `name` of a batch read from a validated table, as Arrow array type
/// `A`. The reader has checked every shard against the schema, so a missing
/// column or another type here is a bug in the calling stage, not bad input.
pub fn column<'a, A: arrow::array::Array + 'static>(batch: &'a RecordBatch, name: &str) -> &'a A {
    batch
        .column_by_name(name)
        .unwrap_or_else(|| panic!("column `{name}` was not read (add it to the projection)"))
        .as_any()
        .downcast_ref::<A>()
        .unwrap_or_else(|| panic!("column `{name}` is not a {}", std::any::type_name::<A>()))
}

/// Converts a record batch of a table (all columns) to rows.
pub fn batch_to_rows<R: Row>(batch: &RecordBatch) -> Result<Vec<R>> {
    serde_arrow::from_record_batch(batch).map_err(|e| Error::RowConversion {
        table: R::TABLE.to_string(),
        reason: e.to_string(),
    })
}

/// Whether shards are hash-checked as they are opened for reading: yes,
/// unless the environment sets `EMBODYFLOW_VERIFY_HASHES=0`.
pub fn verify_hashes_on_read() -> bool {
    std::env::var("EMBODYFLOW_VERIFY_HASHES").map_or(true, |v| v != "0")
}

/// The record batches of a table, shard after shard. Each batch's values are
/// checked ([`crate::values`]) and each shard's decoded rows are counted
/// against the manifest.
pub struct Batches<'a> {
    reader: &'a TableReader,
    projection: Option<Vec<String>>,
    batch_size: usize,
    next_shard: usize,
    /// The open shard: index, reader, rows decoded so far, whether its
    /// batches are cast from an older schema version.
    current: Option<(usize, ParquetRecordBatchReader, u64, bool)>,
}

impl Batches<'_> {
    fn fail(&mut self, error: Error) -> Option<Result<RecordBatch>> {
        self.current = None;
        self.next_shard = self.reader.manifest.shards.len();
        Some(Err(error))
    }
}

impl Iterator for Batches<'_> {
    type Item = Result<RecordBatch>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some((index, current, decoded, upgrade)) = &mut self.current {
                let (index, upgrade) = (*index, *upgrade);
                let shard = &self.reader.manifest.shards[index];
                let corrupt = |reason: String| Error::CorruptShard {
                    table: self.reader.manifest.table.clone(),
                    shard: shard.file.clone(),
                    reason,
                };
                match current.next() {
                    Some(Ok(batch)) => {
                        let first_row = *decoded;
                        *decoded += batch.num_rows() as u64;
                        if *decoded > shard.rows {
                            let error = corrupt(format!(
                                "decodes to more than the {} rows its manifest lists",
                                shard.rows
                            ));
                            return self.fail(error);
                        }
                        let def = self.reader.table.def();
                        let batch = if upgrade {
                            match upgrade_batch(def, &batch, self.projection.as_deref()) {
                                Ok(batch) => batch,
                                Err(e) => {
                                    let error = corrupt(format!(
                                        "cannot be read as schema version {}: {e}",
                                        def.version
                                    ));
                                    return self.fail(error);
                                }
                            }
                        } else {
                            batch
                        };
                        if let Some(bad) = crate::values::first_bad_value(def, &batch) {
                            let row = first_row as usize + bad.row;
                            let key = crate::values::describe_key(def, &batch, bad.row)
                                .map(|key| format!("{key} ({row} of the shard)"))
                                .unwrap_or_else(|| self.reader.key_in_shard(index, row));
                            let error = Error::InvalidValue {
                                table: def.name.clone(),
                                shard: shard.file.clone(),
                                column: bad.column,
                                key,
                                found: bad.found,
                            };
                            return self.fail(error);
                        }
                        return Some(Ok(batch));
                    }
                    Some(Err(e)) => {
                        let error = corrupt(format!("cannot be decoded: {e}"));
                        return self.fail(error);
                    }
                    None => {
                        if *decoded != shard.rows {
                            let error = corrupt(format!(
                                "decodes to {} rows, expected {} from the manifest",
                                *decoded, shard.rows
                            ));
                            return self.fail(error);
                        }
                        self.current = None;
                    }
                }
            }
            if self.next_shard >= self.reader.manifest.shards.len() {
                return None;
            }
            let index = self.next_shard;
            self.next_shard += 1;
            match self
                .reader
                .open_shard(index, self.projection.as_deref(), self.batch_size, true)
            {
                Ok((reader, upgrade)) => self.current = Some((index, reader, 0, upgrade)),
                Err(e) => return self.fail(e),
            }
        }
    }
}

/// Merges the outputs of one stage run split with `--shard i/n` (the same
/// table written by shards `0/n` … `n-1/n`, given in any order) into
/// `out/<table>`, and commits it ([`crate::commit`]: a merge killed midway
/// leaves no table). See [`stage_merged_table`].
pub fn merge_tables(parts: &[PathBuf], out: &Path, overwrite: bool) -> Result<Manifest> {
    stage_merged_table(parts, out, overwrite)?.commit()
}

/// Merges the parts of a sharded table into `out/<table>`, staged for a
/// [`Commit`] (so that a stage's several outputs appear together).
///
/// The result is the table the unsharded run writes, byte for byte
/// ([`crate::canonical`]): the parts' rows are merged by key and written
/// with the layout of the parts' producer config (`output.rows_per_shard`,
/// `output.row_group_rows`, `output.zstd_level`; `table import`'s top-level
/// `rows_per_shard` and `row_group_rows`; the defaults for what neither
/// names). The merged producer is the parts' with shard `0/1` and their
/// lineage, as the unsharded run records them.
///
/// Refused as bad input before anything is written: parts of different
/// tables, schema versions, stages, stage versions, configs or seeds; parts
/// that read different inputs (table and content hash); a shard set other
/// than `0/n` … `n-1/n`, each once. While merging (nothing is committed):
/// a row key in two parts (overlap) or a part out of key order.
pub fn stage_merged_table(parts: &[PathBuf], out: &Path, overwrite: bool) -> Result<StagedTable> {
    let manifests = parts
        .iter()
        .map(|p| Manifest::read(p))
        .collect::<Result<Vec<_>>>()?;
    let Some(first) = manifests.first() else {
        return Err(Error::Usage("merge: no parts to merge".into()));
    };
    let table: TableName = first
        .table
        .parse()
        .map_err(|e: embodyflow_schemas::UnknownTable| Error::BadManifest {
            dir: parts[0].clone(),
            reason: e.to_string(),
        })?;
    check_parts(parts, &manifests)?;
    let readers = parts
        .iter()
        .map(|p| TableReader::open(p, table))
        .collect::<Result<Vec<_>>>()?;
    let mut writer = TableWriter::create(out, table, layout_of(&first.producer), overwrite)?;
    let order = KeyOrder::new(table.def())?;
    let mut sources = Vec::with_capacity(readers.len());
    for (reader, dir) in readers.iter().zip(parts) {
        let name = format!(
            "part {} ({})",
            reader.manifest().producer.shard,
            dir.display()
        );
        sources.push(Source::new(name, reader.batches(None, 4096)?));
    }
    merge_sorted(&order, sources, Ties::Refuse, &mut |batch| {
        writer.write_batch(&batch)
    })?;
    let producer = Producer {
        shard: "0/1".into(),
        ..first.producer.clone()
    };
    writer.finish_staged(&producer, &first.inputs)
}

/// The checks of [`stage_merged_table`] that need only the manifests.
fn check_parts(parts: &[PathBuf], manifests: &[Manifest]) -> Result<()> {
    let first = &manifests[0];
    let n = manifests.len();
    let lineage = |m: &Manifest| -> Vec<(String, String)> {
        m.inputs
            .iter()
            .map(|i| (i.table.clone(), i.content_hash.clone()))
            .collect()
    };
    let mut seen: Vec<Option<&Path>> = vec![None; n];
    for (manifest, dir) in manifests.iter().zip(parts) {
        let mismatch = |field: &str, expected: String, found: String| {
            Err(Error::BadInput(format!(
                "cannot merge {} with {}: field `{field}` is {found}, expected {expected} (the parts must be the shards of one run)",
                dir.display(),
                parts[0].display(),
            )))
        };
        if manifest.table != first.table {
            return mismatch("table", first.table.clone(), manifest.table.clone());
        }
        if manifest.schema_version != first.schema_version {
            return mismatch(
                "schema_version",
                first.schema_version.to_string(),
                manifest.schema_version.to_string(),
            );
        }
        let p = &manifest.producer;
        let q = &first.producer;
        if (&p.stage, &p.version, p.seed) != (&q.stage, &q.version, q.seed) {
            return mismatch(
                "producer",
                format!("{} {} seed {}", q.stage, q.version, q.seed),
                format!("{} {} seed {}", p.stage, p.version, p.seed),
            );
        }
        if p.config != q.config {
            return mismatch(
                "producer.config",
                q.config.to_string(),
                p.config.to_string(),
            );
        }
        if lineage(manifest) != lineage(first) {
            let show = |m: &Manifest| {
                lineage(m)
                    .iter()
                    .map(|(t, h)| format!("{t} {h}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            return mismatch(
                "inputs",
                format!("[{}]", show(first)),
                format!("[{}]", show(manifest)),
            );
        }
        let index = p
            .shard
            .parse::<crate::cli::ShardSpec>()
            .ok()
            .filter(|s| s.count as usize == n)
            .map(|s| s.index as usize);
        let Some(index) = index else {
            return mismatch(
                "producer.shard",
                format!("i/{n} ({n} parts given)"),
                p.shard.clone(),
            );
        };
        if let Some(other) = seen[index] {
            return Err(Error::BadInput(format!(
                "cannot merge: {} and {} are both shard {}",
                other.display(),
                dir.display(),
                p.shard
            )));
        }
        seen[index] = Some(dir);
    }
    Ok(())
}

/// The table layout a producer config asks for (see [`stage_merged_table`]).
fn layout_of(producer: &Producer) -> WriteOptions {
    let config = &producer.config;
    let output = config.get("output").unwrap_or(config);
    let defaults = WriteOptions::default();
    let size = |key: &str, default: usize| {
        output
            .get(key)
            .and_then(serde_json::Value::as_u64)
            .and_then(|v| usize::try_from(v).ok())
            .unwrap_or(default)
    };
    WriteOptions {
        rows_per_shard: size("rows_per_shard", defaults.rows_per_shard),
        row_group_rows: size("row_group_rows", defaults.row_group_rows),
        zstd_level: output
            .get("zstd_level")
            .and_then(serde_json::Value::as_i64)
            .and_then(|v| i32::try_from(v).ok())
            .unwrap_or(defaults.zstd_level),
    }
}

#[cfg(test)]
mod tests {
    use embodyflow_schemas::StepRow;

    use super::*;

    /// Steps rows in key order with lists of every kind of length: long
    /// (several pieces per row group), null, empty, one item, and runs of
    /// rows with at most one item (pieces whose repetition levels would not
    /// vary), drawn from a seeded xorshift; log-probs random (a column
    /// stored uncompressed), values regular (compressed).
    fn steps(count: usize, seed: u64) -> Vec<StepRow> {
        let mut state = seed | 1;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n) as usize
        };
        (0..count)
            .map(|i| {
                let short_run = (i / 40) % 3 == 1;
                let tokens = match next(10) {
                    _ if short_run => next(2),
                    0 => 0,
                    1 => 1,
                    2 => next(3000),
                    _ => next(1200),
                };
                let values =
                    (next(7) != 0).then(|| (0..tokens).map(|t| t as f32 * 0.5 - 3.0).collect());
                StepRow {
                    anchor_key: None,
                    response_mask: None,
                    trajectory_id: format!("t{i:06}"),
                    step_index: 0,
                    prompt_ids: (0..next(5) as i32).collect(),
                    response_ids: (0..tokens).map(|t| (t * 7 % 301) as i32).collect(),
                    old_logprobs: (0..tokens)
                        .map(|_| -(next(1 << 24) as f32) / 1_048_576.0)
                        .collect(),
                    observation: None,
                    old_value: None,
                    old_values: values,
                    latents: None,
                    latent_dim: None,
                    chosen_latent_len: None,
                    old_latent_end_logprob: None,
                }
            })
            .collect()
    }

    /// The producer of the tables these tests write.
    fn test_producer() -> Producer {
        Producer {
            stage: "test".into(),
            version: "0".into(),
            config: serde_json::json!({}),
            seed: 0,
            shard: "0/1".into(),
        }
    }

    /// Where column `name`'s chunk lies in a shard's first row group.
    fn chunk_range(shard: &Path, name: &str) -> std::ops::Range<u64> {
        let file =
            parquet::file::reader::SerializedFileReader::new(File::open(shard).unwrap()).unwrap();
        let group = parquet::file::reader::FileReader::metadata(&file).row_group(0);
        let column = group
            .columns()
            .iter()
            .find(|c| c.column_path().string().starts_with(&format!("{name}.")))
            .unwrap();
        let (start, len) = column.byte_range();
        start..start + len
    }

    #[test]
    fn a_read_checks_the_blocks_it_decodes_and_a_changed_byte_elsewhere_is_left_to_full_checks() {
        let rows = steps(3000, 7);
        let dir = tempfile::tempdir().unwrap();
        let mut writer =
            TableWriter::create(dir.path(), TableName::Steps, WriteOptions::default(), false)
                .unwrap();
        writer.write_rows(&rows).unwrap();
        let manifest = writer.finish(&test_producer(), &[]).unwrap();
        let table = dir.path().join("steps");
        let shard = table.join(shard_file_name(0));
        assert!(manifest.shards[0].bytes > 2 * shard_hash::BLOCK);
        assert!(!manifest.shards[0].blocks.is_empty());
        let ids = ["trajectory_id".to_string(), "response_ids".to_string()];
        let read = |columns: Option<&[String]>| -> Result<usize> {
            let reader = TableReader::open(&table, TableName::Steps)?;
            let names: Option<Vec<&str>> = columns.map(|c| c.iter().map(String::as_str).collect());
            let mut rows = 0;
            for batch in reader.batches(names.as_deref(), 1024)? {
                rows += batch?.num_rows();
            }
            Ok(rows)
        };
        assert_eq!(read(None).unwrap(), 3000);
        // A byte of the log-probs, far from the ids' blocks, changes.
        let logprobs = chunk_range(&shard, "old_logprobs");
        let id_blocks = {
            let r = chunk_range(&shard, "response_ids");
            r.start / shard_hash::BLOCK..=r.end / shard_hash::BLOCK
        };
        let at = (logprobs.start..logprobs.end)
            .find(|&b| !id_blocks.contains(&(b / shard_hash::BLOCK)) && b % 4093 == 0)
            .expect("a log-prob byte outside the ids' blocks");
        let mut bytes = std::fs::read(&shard).unwrap();
        bytes[at as usize] ^= 0x40;
        std::fs::write(&shard, &bytes).unwrap();
        assert_eq!(
            read(Some(&ids)).unwrap(),
            3000,
            "the ids' blocks are intact"
        );
        let error = read(None).unwrap_err().to_string();
        assert!(
            error.contains("content hash is") && error.contains("part-00000.parquet"),
            "{error}"
        );
        let reader = TableReader::open(&table, TableName::Steps).unwrap();
        assert!(reader.verify_hashes().is_err());
        // A byte of the ids changes: the projected read fails too.
        bytes[at as usize] ^= 0x40;
        let ids_at = chunk_range(&shard, "response_ids").start + 100;
        bytes[ids_at as usize] ^= 0x40;
        std::fs::write(&shard, &bytes).unwrap();
        let error = read(Some(&ids)).unwrap_err().to_string();
        assert!(error.contains("content hash is"), "{error}");
        // Block hashes that do not merge to the shard's hash: every read and
        // the full check refuse them.
        bytes[ids_at as usize] ^= 0x40;
        std::fs::write(&shard, &bytes).unwrap();
        let mut damaged = Manifest::read(&table).unwrap();
        let digit = if damaged.shards[0].blocks.starts_with('0') {
            "1"
        } else {
            "0"
        };
        damaged.shards[0].blocks.replace_range(0..1, digit);
        damaged.write(&table).unwrap();
        let error = read(Some(&ids)).unwrap_err().to_string();
        assert!(error.contains("manifest is damaged"), "{error}");
        let reader = TableReader::open(&table, TableName::Steps).unwrap();
        let error = reader.verify_hashes().unwrap_err().to_string();
        assert!(error.contains("manifest is damaged"), "{error}");
    }

    #[test]
    fn shards_are_the_bytes_of_arrow_writer_writing_each_row_group_in_one_call() {
        let def = TableName::Steps.def();
        for (seed, count, row_group_rows, chunk) in [
            (1, 1500, 8192, 64),
            (2, 500, 150, 37),
            (3, 300, 1000, 300),
            (4, 90, 8192, 1),
        ] {
            let rows = steps(count, seed);
            let options = WriteOptions {
                row_group_rows,
                ..WriteOptions::default()
            };
            let dir = tempfile::tempdir().unwrap();
            let mut writer =
                TableWriter::create(dir.path(), TableName::Steps, options, false).unwrap();
            for part in rows.chunks(chunk) {
                writer.write_rows(part).unwrap();
            }
            writer.finish(&test_producer(), &[]).unwrap();
            let ours = std::fs::read(dir.path().join("steps").join(shard_file_name(0))).unwrap();

            let first_group = rows_to_batch(def, &rows[..row_group_rows.min(count)]).unwrap();
            let props = crate::codecs::shard_properties(def, &options, &[first_group]).unwrap();
            let mut reference =
                ArrowWriter::try_new(Vec::new(), def.arrow_schema(), Some(props)).unwrap();
            for group in rows.chunks(row_group_rows) {
                reference
                    .write(&rows_to_batch(def, group).unwrap())
                    .unwrap();
            }
            let theirs = reference.into_inner().unwrap();
            assert!(
                ours == theirs,
                "seed {seed}: {} vs {} bytes",
                ours.len(),
                theirs.len()
            );
            // Random log-probs are stored as they are, regular values compressed.
            let file =
                parquet::file::reader::SerializedFileReader::new(bytes::Bytes::from(ours)).unwrap();
            let group = parquet::file::reader::FileReader::metadata(&file).row_group(0);
            let codec = |name: &str| {
                group
                    .columns()
                    .iter()
                    .find(|c| c.column_path().string() == format!("{name}.list.item"))
                    .unwrap()
                    .compression()
            };
            assert_eq!(
                codec("old_logprobs"),
                parquet::basic::Compression::UNCOMPRESSED
            );
            assert!(matches!(
                codec("old_values"),
                parquet::basic::Compression::ZSTD(_)
            ));
        }
    }
}
