//! Observations served from a memory-mapped Arrow IPC file, for stages that
//! read the same closed-loop observations (`steps.observation`) in every
//! epoch.
//!
//! An update that runs several epochs over the same decisions needs every
//! observation once per epoch, in a shuffled order. Decoding the Parquet
//! steps table each epoch pays zstd and Parquet decoding again every time;
//! holding every observation in a `Vec<Vec<u8>>` pays for all of them in the
//! process's own (anonymous) memory for the whole run. An
//! [`ObservationStore`] writes them once, in the caller's order, into an
//! Arrow IPC file (one non-null `LargeBinary` column, a record batch per
//! [`BATCH_BYTES`] of values) in a scratch directory the caller gives (the
//! stage's output directory), memory-maps it (`memmap2`) and hands out
//! [`ObservationStore::get`]`(i)` as a slice of the mapping: no copy, no
//! decoding. The pages live in the kernel's page cache, shared and
//! reclaimable, not in the process's heap. The Arrow IPC file format is the
//! columnar layout itself, so "reading" it is pointer arithmetic on validated
//! offsets (see `arrow::ipc::reader::FileDecoder`, used here over the mapped
//! buffer).
//!
//! **Writing** never leaves a half-written file under the store's name:
//! [`ObservationStoreWriter`] streams batches into
//! `.<name>.tmp-<pid>-<nanos>.part`, fsyncs it and renames it to
//! `.<name>.tmp-<pid>-<nanos>`, then fsyncs the directory. Both names are
//! hidden, carry the writer's pid, and are removed by the next writer into
//! that directory when the process died ([`crate::commit::clean_stale`]);
//! a writer dropped before [`ObservationStoreWriter::finish`] removes its
//! partial file, and a store created by a writer removes its file when it
//! is dropped.
//!
//! **Opening** ([`ObservationStore::open`]) checks the whole file before
//! serving anything: the leading and trailing `ARROW1` magic, the footer
//! (a verified flatbuffer) and its schema (exactly the store's one column),
//! every record batch's block inside the file, its message's buffers inside
//! its body, uncompressed, one column without nulls, and the column's
//! offsets (monotonic, inside the values; Arrow's full validation). A
//! truncated, corrupt or foreign file is an [`ObservationStoreError::Corrupt`]
//! naming the file, never a panic; every `get` afterwards is in bounds.
//!
//! ```
//! use embodyflow_core::observation_store::ObservationStore;
//! let scratch = tempfile::tempdir().unwrap();
//! let observations: Vec<Vec<u8>> = vec![vec![1, 2, 3], vec![], vec![4; 5000]];
//! let store = ObservationStore::write(scratch.path(), &observations).unwrap();
//! assert_eq!(store.len(), 3);
//! assert_eq!(store.get(0), [1, 2, 3]);
//! assert_eq!(store.get(2), &observations[2][..]);
//! let file = store.path().to_path_buf();
//! assert!(file.exists());
//! drop(store); // the scratch file goes with the store
//! assert!(!file.exists());
//! ```

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{
    Array, ArrayBuilder, ArrayRef, AsArray, LargeBinaryArray, LargeBinaryBuilder, RecordBatch,
};
use arrow::buffer::Buffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::error::ArrowError;
use arrow::ipc::reader::{FileDecoder, read_footer_length};
use arrow::ipc::writer::FileWriter;
use arrow::ipc::{Block, root_as_footer, root_as_message};

use crate::commit;

/// The name a store file is staged under ([`commit::staging_name`]).
pub const STORE_NAME: &str = "observations.arrow";

/// The one column of a store file.
pub const COLUMN: &str = "observation";

/// Values per record batch before the writer starts the next one: the
/// writer's memory is one batch.
pub const BATCH_BYTES: usize = 32 << 20;

/// What marks a file as a store file (schema metadata key, value
/// [`FORMAT_VERSION`]).
const FORMAT_KEY: &str = "embodyflow.observation_store";

/// The store file format version.
const FORMAT_VERSION: &str = "1";

/// `ARROW1` and its padding, at the start of every Arrow IPC file.
const LEADING_MAGIC: &[u8; 8] = b"ARROW1\0\0";

/// The footer length (4 bytes) and `ARROW1`, at the end of every Arrow IPC file.
const TRAILER_LEN: usize = 10;

/// Why a store could not be written or read. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ObservationStoreError {
    /// The file system failed (create, write, fsync, rename, open, map).
    #[error("observation store {}: {what}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Arrow could not encode a batch.
    #[error("observation store {}: writing a record batch: {source}", path.display())]
    Write {
        /// The file being written.
        path: PathBuf,
        /// The cause.
        #[source]
        source: ArrowError,
    },
    /// The scratch directory's housekeeping failed (removing dead writers'
    /// leftovers, fsyncing it).
    #[error(transparent)]
    Directory(#[from] crate::Error),
    /// Not a complete, valid store file: truncated, corrupt or foreign.
    #[error("observation store {}: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong, with what was expected and found.
        reason: String,
    },
}

impl crate::Classify for ObservationStoreError {
    /// A failing disk is a failure of the run; a damaged file is treated like
    /// a corrupt shard: bad input.
    fn kind(&self) -> crate::ErrorKind {
        match self {
            ObservationStoreError::Io { .. } | ObservationStoreError::Write { .. } => {
                crate::ErrorKind::Failure
            }
            ObservationStoreError::Corrupt { .. } => crate::ErrorKind::BadInput,
            ObservationStoreError::Directory(e) => crate::Classify::kind(e),
        }
    }
}

/// The core's error of a store error, for stages whose errors wrap
/// [`crate::Error`]: the file system's failures stay failures, a damaged
/// file bad input, each naming the file.
impl From<ObservationStoreError> for crate::Error {
    fn from(error: ObservationStoreError) -> crate::Error {
        match error {
            ObservationStoreError::Io { path, source, .. } => crate::Error::Io { path, source },
            ObservationStoreError::Write { path, source } => crate::Error::Io {
                path,
                source: std::io::Error::other(source),
            },
            ObservationStoreError::Directory(error) => error,
            corrupt @ ObservationStoreError::Corrupt { .. } => {
                crate::Error::BadInput(corrupt.to_string())
            }
        }
    }
}

/// The schema of a store file.
fn schema() -> SchemaRef {
    let metadata =
        std::collections::HashMap::from([(FORMAT_KEY.to_string(), FORMAT_VERSION.to_string())]);
    Arc::new(
        Schema::new(vec![Field::new(COLUMN, DataType::LargeBinary, false)]).with_metadata(metadata),
    )
}

/// Writes a store file batch by batch (see the module doc); [`Self::finish`]
/// makes it an [`ObservationStore`].
pub struct ObservationStoreWriter {
    dir: PathBuf,
    /// The name the complete file gets.
    path: PathBuf,
    /// The name it is written under.
    part: PathBuf,
    writer: Option<FileWriter<BufWriter<File>>>,
    builder: LargeBinaryBuilder,
    rows: usize,
}

impl ObservationStoreWriter {
    /// Starts a store file in `dir` (created if missing), first removing the
    /// leftovers of dead writers there.
    pub fn create(dir: &Path) -> Result<ObservationStoreWriter, ObservationStoreError> {
        let io = |what, source| ObservationStoreError::Io {
            path: dir.to_path_buf(),
            what,
            source,
        };
        std::fs::create_dir_all(dir).map_err(|e| io("creating the directory", e))?;
        commit::clean_stale(dir)?;
        let path = dir.join(commit::staging_name(STORE_NAME));
        let mut part = path.clone().into_os_string();
        part.push(".part");
        let part = PathBuf::from(part);
        let file = File::create_new(&part).map_err(|source| ObservationStoreError::Io {
            path: part.clone(),
            what: "creating",
            source,
        })?;
        let writer = FileWriter::try_new(BufWriter::with_capacity(1 << 20, file), &schema())
            .map_err(|source| ObservationStoreError::Write {
                path: part.clone(),
                source,
            })?;
        Ok(ObservationStoreWriter {
            dir: dir.to_path_buf(),
            path,
            part,
            writer: Some(writer),
            builder: LargeBinaryBuilder::new(),
            rows: 0,
        })
    }

    /// Appends one observation (row [`Self::len`] of the store).
    pub fn push(&mut self, observation: &[u8]) -> Result<(), ObservationStoreError> {
        self.builder.append_value(observation);
        self.rows += 1;
        if self.builder.values_slice().len() >= BATCH_BYTES {
            self.write_batch()?;
        }
        Ok(())
    }

    /// Observations pushed so far.
    pub fn len(&self) -> usize {
        self.rows
    }

    /// Whether nothing was pushed yet.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    fn write_batch(&mut self) -> Result<(), ObservationStoreError> {
        if self.builder.is_empty() {
            return Ok(());
        }
        let column: ArrayRef = Arc::new(self.builder.finish());
        let writer = self
            .writer
            .as_mut()
            .expect("the writer is open until finish");
        RecordBatch::try_new(schema(), vec![column])
            .and_then(|batch| writer.write(&batch))
            .map_err(|source| ObservationStoreError::Write {
                path: self.part.clone(),
                source,
            })
    }

    /// Writes the last batch and the footer, fsyncs the file, renames it to
    /// its final name, fsyncs the directory and opens the store (which then
    /// removes the file when dropped).
    pub fn finish(mut self) -> Result<ObservationStore, ObservationStoreError> {
        self.write_batch()?;
        let mut writer = self.writer.take().expect("the writer is open until finish");
        let write_error = |source| ObservationStoreError::Write {
            path: self.part.clone(),
            source,
        };
        writer.finish().map_err(write_error)?;
        let buffered = writer.into_inner().map_err(write_error)?;
        let io = |what, source| ObservationStoreError::Io {
            path: self.part.clone(),
            what,
            source,
        };
        let file = buffered
            .into_inner()
            .map_err(|e| io("flushing", e.into_error()))?;
        file.sync_all().map_err(|e| io("fsyncing", e))?;
        drop(file);
        std::fs::rename(&self.part, &self.path).map_err(|e| io("renaming", e))?;
        commit::sync_dir(&self.dir)?;
        let opened = ObservationStore::open(&self.path).and_then(|store| {
            if store.len() == self.rows {
                Ok(store)
            } else {
                Err(ObservationStoreError::Corrupt {
                    path: self.path.clone(),
                    reason: format!(
                        "holds {} observations after writing {}",
                        store.len(),
                        self.rows
                    ),
                })
            }
        });
        match opened {
            Ok(mut store) => {
                store.owned = true;
                Ok(store)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&self.path);
                Err(e)
            }
        }
    }
}

impl Drop for ObservationStoreWriter {
    fn drop(&mut self) {
        // Unfinished or failed: the partial file never outlives its writer
        // (after a finish it has been renamed, and this finds nothing).
        self.writer = None;
        let _ = std::fs::remove_file(&self.part);
    }
}

/// Observations in a memory-mapped Arrow IPC file, by index (see the module
/// doc).
pub struct ObservationStore {
    path: PathBuf,
    /// The record batches' columns, over the mapping.
    batches: Vec<LargeBinaryArray>,
    /// The store index of each batch's first row (ascending, from 0).
    starts: Vec<usize>,
    len: usize,
    /// The whole mapped file.
    map: Buffer,
    /// Whether dropping the store removes its file (a store a writer made).
    owned: bool,
}

impl ObservationStore {
    /// Writes `observations` in order into a new store file in `dir` (see
    /// [`ObservationStoreWriter`]) and opens it.
    pub fn write<T: AsRef<[u8]>>(
        dir: &Path,
        observations: impl IntoIterator<Item = T>,
    ) -> Result<ObservationStore, ObservationStoreError> {
        let mut writer = ObservationStoreWriter::create(dir)?;
        for observation in observations {
            writer.push(observation.as_ref())?;
        }
        writer.finish()
    }

    /// Maps and checks an existing store file (see the module doc). The
    /// file is left in place when the store is dropped.
    pub fn open(path: &Path) -> Result<ObservationStore, ObservationStoreError> {
        let file = File::open(path).map_err(|source| ObservationStoreError::Io {
            path: path.to_path_buf(),
            what: "opening",
            source,
        })?;
        let map = map_file(&file).map_err(|source| ObservationStoreError::Io {
            path: path.to_path_buf(),
            what: "memory-mapping",
            source,
        })?;
        let corrupt = |reason: String| ObservationStoreError::Corrupt {
            path: path.to_path_buf(),
            reason,
        };
        let batches = read_batches(&map).map_err(corrupt)?;
        let mut starts = Vec::with_capacity(batches.len());
        let mut len = 0usize;
        for batch in &batches {
            starts.push(len);
            len += batch.len();
        }
        Ok(ObservationStore {
            path: path.to_path_buf(),
            batches,
            starts,
            len,
            map,
            owned: false,
        })
    }

    /// The observations stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the store holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Observation `index`, a slice of the mapped file.
    ///
    /// # Panics
    ///
    /// When `index >= self.len()`, as slice indexing does.
    pub fn get(&self, index: usize) -> &[u8] {
        assert!(
            index < self.len,
            "observation {index} of a store of {} ({})",
            self.len,
            self.path.display()
        );
        let batch = self.starts.partition_point(|&start| start <= index) - 1;
        self.batches[batch].value(index - self.starts[batch])
    }

    /// The store file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The size of the mapped file in bytes.
    pub fn file_bytes(&self) -> usize {
        self.map.len()
    }
}

impl std::fmt::Debug for ObservationStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObservationStore")
            .field("path", &self.path)
            .field("len", &self.len)
            .field("batches", &self.batches.len())
            .field("file_bytes", &self.map.len())
            .field("owned", &self.owned)
            .finish()
    }
}

impl Drop for ObservationStore {
    fn drop(&mut self) {
        if self.owned {
            // The mapping stays valid after the unlink until it is dropped.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Maps `file` read-only, as an Arrow buffer that owns the mapping.
#[allow(unsafe_code)]
fn map_file(file: &File) -> std::io::Result<Buffer> {
    // SAFETY: `Mmap::map` is unsafe because the mapped bytes change if the
    // file is modified while mapped (and a truncation would fault on
    // access). A store file lives under a hidden, pid-stamped name in the
    // running stage's own scratch directory, is complete (fsynced and
    // renamed into place) before it is mapped, and nothing writes it
    // afterwards; every offset read from it is validated once, here, before
    // any slice is handed out.
    let map = unsafe { memmap2::Mmap::map(file)? };
    Ok(Buffer::from(bytes::Bytes::from_owner(map)))
}

/// The columns of every record batch of the store file `map`, checked (see
/// the module doc); the reason when it is not a valid store file.
fn read_batches(map: &Buffer) -> Result<Vec<LargeBinaryArray>, String> {
    let len = map.len();
    if len < LEADING_MAGIC.len() + TRAILER_LEN {
        return Err(format!(
            "{len} bytes, shorter than an Arrow IPC file's magic and trailer ({} bytes): truncated",
            LEADING_MAGIC.len() + TRAILER_LEN
        ));
    }
    if map[..6] != LEADING_MAGIC[..6] {
        return Err(format!(
            "starts with {:?}, expected the Arrow IPC magic \"ARROW1\"",
            String::from_utf8_lossy(&map[..6])
        ));
    }
    let trailer: [u8; TRAILER_LEN] = map[len - TRAILER_LEN..]
        .try_into()
        .expect("TRAILER_LEN bytes");
    let footer_len = read_footer_length(trailer)
        .map_err(|e| format!("trailer: {e} (truncated, or not an Arrow IPC file)"))?;
    let footer_end = len - TRAILER_LEN;
    let Some(footer_start) = footer_end
        .checked_sub(footer_len)
        .filter(|&start| start >= LEADING_MAGIC.len())
    else {
        return Err(format!(
            "footer of {footer_len} bytes does not fit in the file of {len} bytes"
        ));
    };
    let footer = root_as_footer(&map[footer_start..footer_end])
        .map_err(|e| format!("footer is not a valid Arrow IPC footer: {e}"))?;
    let found = footer
        .schema()
        .ok_or_else(|| "footer has no schema".to_string())
        .and_then(|fb| {
            arrow::ipc::convert::try_fb_to_schema(fb)
                .map_err(|e| format!("footer schema is unreadable: {e}"))
        })?;
    let expected = schema();
    if found != *expected {
        return Err(format!(
            "schema is {found:?}, expected {expected:?} (not an observation store file)"
        ));
    }
    if footer.dictionaries().is_some_and(|d| !d.is_empty()) {
        return Err("has dictionary batches; a store file has none".into());
    }
    let decoder = FileDecoder::new(expected, footer.version());
    let blocks: Vec<Block> = footer
        .recordBatches()
        .map(|blocks| blocks.iter().copied().collect())
        .unwrap_or_default();
    let mut batches = Vec::with_capacity(blocks.len());
    for (index, block) in blocks.iter().enumerate() {
        let data = checked_block(map, block, footer_start)
            .map_err(|reason| format!("record batch {index}: {reason}"))?;
        let batch = decoder
            .read_record_batch(block, &data)
            .map_err(|e| format!("record batch {index}: {e}"))?
            .ok_or_else(|| format!("record batch {index}: an empty message"))?;
        let column = batch.column(0);
        if column.null_count() != 0 {
            return Err(format!(
                "record batch {index}: {} null observations, expected none",
                column.null_count()
            ));
        }
        batches.push(column.as_binary::<i64>().clone());
    }
    Ok(batches)
}

/// The bytes of one record batch's block, after checking that the block lies
/// between the leading magic and the footer and that its message (a
/// verified flatbuffer) is an uncompressed record batch of one column whose
/// buffers lie inside its body: Arrow's decoder slices them unchecked.
fn checked_block(map: &Buffer, block: &Block, footer_start: usize) -> Result<Buffer, String> {
    let (offset, meta, body) = (block.offset(), block.metaDataLength(), block.bodyLength());
    let place = format!("block at {offset} (metadata {meta} bytes, body {body} bytes)");
    let (Ok(offset), Ok(meta), Ok(body)) = (
        usize::try_from(offset),
        usize::try_from(meta),
        usize::try_from(body),
    ) else {
        return Err(format!("{place}: a negative offset or length"));
    };
    let end = offset
        .checked_add(meta)
        .and_then(|end| end.checked_add(body));
    if offset < LEADING_MAGIC.len() || meta < 8 || end.is_none_or(|end| end > footer_start) {
        return Err(format!(
            "{place} lies outside the file's batches (bytes {} to {footer_start})",
            LEADING_MAGIC.len()
        ));
    }
    let metadata = &map[offset..offset + meta];
    // An encapsulated message: 0xFFFFFFFF, its length, the flatbuffer.
    let flatbuffer = if metadata[..4] == [0xff; 4] {
        &metadata[8..]
    } else {
        &metadata[4..]
    };
    let message =
        root_as_message(flatbuffer).map_err(|e| format!("{place}: unreadable message: {e}"))?;
    let batch = message
        .header_as_record_batch()
        .ok_or_else(|| format!("{place}: the message is not a record batch"))?;
    if usize::try_from(message.bodyLength()).ok() != Some(body) {
        return Err(format!(
            "{place}: the message announces a body of {} bytes",
            message.bodyLength()
        ));
    }
    if batch.compression().is_some() {
        return Err(format!("{place}: compressed; a store file is not"));
    }
    let nodes: Vec<_> = batch
        .nodes()
        .map(|n| n.iter().collect())
        .unwrap_or_default();
    let [node] = nodes[..] else {
        return Err(format!("{place}: {} columns, expected 1", nodes.len()));
    };
    if batch.length() < 0 || node.length() != batch.length() || node.null_count() != 0 {
        return Err(format!(
            "{place}: a column of {} rows with {} nulls in a batch of {} rows, expected the batch's rows without nulls",
            node.length(),
            node.null_count(),
            batch.length()
        ));
    }
    for buffer in batch
        .buffers()
        .map(|b| b.iter().collect::<Vec<_>>())
        .unwrap_or_default()
    {
        let inside = usize::try_from(buffer.offset())
            .ok()
            .zip(usize::try_from(buffer.length()).ok())
            .and_then(|(start, length)| start.checked_add(length))
            .is_some_and(|end| end <= body);
        if !inside {
            return Err(format!(
                "{place}: a buffer at {} of {} bytes lies outside the body",
                buffer.offset(),
                buffer.length()
            ));
        }
    }
    Ok(map.slice_with_length(offset, meta + body))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Observations of varied lengths, each distinct.
    fn observations(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| (0..(i * 37) % 700).map(|j| (i * 31 + j) as u8).collect())
            .collect()
    }

    /// The files in `dir`.
    fn files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// A complete store file's bytes, written by a store kept open.
    fn store_bytes(rows: &[Vec<u8>]) -> Vec<u8> {
        let dir = tempfile::tempdir().unwrap();
        let store = ObservationStore::write(dir.path(), rows).unwrap();
        std::fs::read(store.path()).unwrap()
    }

    /// Opening `bytes` written to a file: the error must be `Corrupt` naming
    /// the file.
    fn open_bytes(bytes: &[u8]) -> Result<ObservationStore, ObservationStoreError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("damaged.arrow");
        std::fs::write(&path, bytes).unwrap();
        ObservationStore::open(&path)
    }

    fn assert_corrupt(result: Result<ObservationStore, ObservationStoreError>, what: &str) {
        match result {
            Err(e @ ObservationStoreError::Corrupt { .. }) => {
                assert!(e.to_string().contains("damaged.arrow"), "{what}: {e}");
            }
            Err(e) => panic!("{what}: expected Corrupt, got {e}"),
            Ok(store) => panic!("{what}: opened with {} rows", store.len()),
        }
    }

    #[test]
    fn serves_every_observation_in_order_across_batches() {
        // Rows of 1 MiB cut the file into several record batches.
        let mut rows = observations(50);
        rows.extend((0..70u8).map(|i| vec![i; 1 << 20]));
        let dir = tempfile::tempdir().unwrap();
        let store = ObservationStore::write(dir.path(), &rows).unwrap();
        assert!(store.batches.len() >= 2, "{} batches", store.batches.len());
        assert_eq!(store.len(), rows.len());
        for (i, row) in rows.iter().enumerate() {
            assert_eq!(store.get(i), &row[..], "row {i}");
        }
        // Reopened from the file alone, it serves the same.
        let again = ObservationStore::open(store.path()).unwrap();
        assert_eq!(again.len(), rows.len());
        assert!((0..rows.len()).all(|i| again.get(i) == rows[i]));
    }

    #[test]
    fn get_is_a_slice_of_the_mapping() {
        let rows = observations(40);
        let dir = tempfile::tempdir().unwrap();
        let store = ObservationStore::write(dir.path(), &rows).unwrap();
        let map = store.map.as_ptr_range();
        for i in 0..rows.len() {
            let value = store.get(i).as_ptr_range();
            assert!(map.start <= value.start && value.end <= map.end, "row {i}");
        }
    }

    #[test]
    fn an_empty_store_is_valid() {
        let dir = tempfile::tempdir().unwrap();
        let store = ObservationStore::write(dir.path(), Vec::<Vec<u8>>::new()).unwrap();
        assert!(store.is_empty());
        assert_eq!(ObservationStore::open(store.path()).unwrap().len(), 0);
    }

    #[test]
    #[should_panic(expected = "observation 3 of a store of 3")]
    fn an_index_past_the_end_panics_like_a_slice() {
        let dir = tempfile::tempdir().unwrap();
        let store = ObservationStore::write(dir.path(), observations(3)).unwrap();
        let _ = store.get(3);
    }

    #[test]
    fn files_never_outlive_their_store_or_writer() {
        let dir = tempfile::tempdir().unwrap();
        let store = ObservationStore::write(dir.path(), observations(5)).unwrap();
        let name = store
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(name.starts_with(".observations.arrow.tmp-"), "{name}");
        assert_eq!(files(dir.path()), [name.clone()]);
        // Opened (not written) here: dropping it leaves the file.
        drop(ObservationStore::open(store.path()).unwrap());
        assert_eq!(files(dir.path()), [name]);
        drop(store);
        assert!(files(dir.path()).is_empty());
        // A writer dropped unfinished removes its partial file.
        let mut writer = ObservationStoreWriter::create(dir.path()).unwrap();
        writer.push(b"abc").unwrap();
        assert_eq!(files(dir.path()).len(), 1);
        assert!(files(dir.path())[0].ends_with(".part"));
        drop(writer);
        assert!(files(dir.path()).is_empty());
    }

    #[test]
    fn a_dead_writers_files_are_removed_by_the_next_writer() {
        let dir = tempfile::tempdir().unwrap();
        // pid 4194305 is above Linux's pid_max limit: never alive.
        for name in [
            ".observations.arrow.tmp-4194305-1",
            ".observations.arrow.tmp-4194305-2.part",
        ] {
            std::fs::write(dir.path().join(name), b"left by a killed run").unwrap();
        }
        let store = ObservationStore::write(dir.path(), observations(2)).unwrap();
        let own = store
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert_eq!(files(dir.path()), [own]);
    }

    #[test]
    fn a_truncated_file_is_an_error_naming_it() {
        let bytes = store_bytes(&observations(30));
        for cut in [
            0,
            5,
            17,
            bytes.len() / 3,
            bytes.len() / 2,
            bytes.len() - 11,
            bytes.len() - 1,
        ] {
            assert_corrupt(open_bytes(&bytes[..cut]), &format!("cut at {cut}"));
        }
    }

    #[test]
    fn a_corrupted_footer_is_an_error_naming_it() {
        let bytes = store_bytes(&observations(30));
        let footer_len = read_footer_length(bytes[bytes.len() - 10..].try_into().unwrap()).unwrap();
        let footer = bytes.len() - 10 - footer_len..bytes.len() - 10;
        let mut garbage = bytes.clone();
        garbage[footer.clone()].fill(0xff);
        assert_corrupt(open_bytes(&garbage), "footer of 0xff");
        let mut zeros = bytes.clone();
        zeros[footer.clone()].fill(0);
        assert_corrupt(open_bytes(&zeros), "footer of zeros");
        // A footer length past the start of the file.
        let mut long = bytes.clone();
        let at = bytes.len() - 10;
        long[at..at + 4].copy_from_slice(&(bytes.len() as i32).to_le_bytes());
        assert_corrupt(open_bytes(&long), "footer length");
    }

    #[test]
    fn a_foreign_arrow_file_is_refused() {
        let batch = RecordBatch::try_from_iter([(
            "x",
            Arc::new(arrow::array::Int32Array::from(vec![1, 2])) as _,
        )])
        .unwrap();
        let mut bytes = Vec::new();
        let mut writer = FileWriter::try_new(&mut bytes, &batch.schema()).unwrap();
        writer.write(&batch).unwrap();
        writer.finish().unwrap();
        drop(writer);
        assert_corrupt(open_bytes(&bytes), "an Int32 file");
        assert_corrupt(
            open_bytes(b"PAR1 not arrow at all, but long enough"),
            "Parquet-ish",
        );
    }

    #[test]
    fn any_single_damaged_byte_is_an_error_or_reads_back_the_same_shape() {
        // Flip each byte of the file's structure (everything but the values,
        // whose bytes no format can check) in turn: never a panic, and a
        // file that still opens serves every row in bounds.
        let rows = observations(12);
        let bytes = store_bytes(&rows);
        let values: usize = rows.iter().map(Vec::len).sum();
        let mut opened = 0;
        for at in 0..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x5a;
            if let Ok(store) = open_bytes(&damaged) {
                opened += 1;
                let served: usize = (0..store.len()).map(|i| store.get(i).len()).sum();
                assert!(served <= store.file_bytes(), "byte {at}");
            }
        }
        // The values region (and padding) opens unchanged; structure does not.
        assert!(
            opened >= values,
            "{opened} of {} damaged files opened",
            bytes.len()
        );
        assert!(opened < bytes.len(), "no damage was detected");
    }
}
