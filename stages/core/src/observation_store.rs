//! Observations served from a memory-mapped Arrow IPC file, for stages that
//! read the same closed-loop observations (`steps.observation`) in every
//! epoch.
//!
//! An update that runs several epochs over the same decisions needs every
//! observation once per epoch, in a shuffled order. Decoding the Parquet
//! steps table each epoch pays zstd and Parquet decoding again every time;
//! holding every observation in a `Vec<Vec<u8>>` pays an allocation per
//! observation in the process's heap for the whole run. An
//! [`ObservationStore`] writes them once, in the caller's order, into an
//! Arrow IPC file (one non-null `LargeBinary` column, a record batch per
//! [`BATCH_BYTES`] of values) held in a **sealed memory file**, memory-maps
//! it (`memmap2`) and hands out [`ObservationStore::get`]`(i)` as a slice of
//! the mapping: no copy, no decoding. The Arrow IPC file format is the
//! columnar layout itself, so "reading" it is pointer arithmetic on
//! validated offsets (see `arrow::ipc::reader::FileDecoder`, used here over
//! the mapped buffer).
//!
//! **Why a sealed memory file, not a file on disk.** A mapped file that
//! another process truncates turns the next access past its new end into
//! `SIGBUS`, a signal that kills the stage mid-training; one whose bytes
//! another process rewrites changes what is trained on, silently. Neither can
//! be guarded on an ordinary file: advisory locks do not stop `truncate`, and
//! checking the size or a hash after mapping says nothing about the next
//! minute. The store therefore lives in a memory file (`memfd_create`): it
//! has no name in any directory, and once written it is sealed
//! (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL`), after which
//! the kernel refuses every truncation and every write to it, from any
//! process and by any path (`/proc/<pid>/fd/<n>` included), with `EPERM`: an
//! error to whoever tries, never a signal here. Its pages are shared memory
//! (`RssShmem`), not heap allocations; the price is that the kernel can
//! reclaim them only to swap, where a file's clean pages could be dropped.
//!
//! **Writing** ([`ObservationStoreWriter`]) streams the batches into the
//! memory file, hashing every byte (BLAKE3) as it goes;
//! [`ObservationStoreWriter::finish`] seals the file, maps it and checks, as a
//! table's shards are checked against their manifest, that the mapped bytes
//! hash to what was written (a write through `/proc` before the seal is
//! caught there, and none can come after it). Nothing is written to disk and
//! nothing outlives the store: the kernel frees the memory file with its last
//! descriptor and mapping, also when the process is killed.
//!
//! **Opening** ([`ObservationStore::open`]) an existing store file copies it
//! into a sealed memory file, then checks the whole of it before serving
//! anything: the leading and trailing `ARROW1` magic, the footer (a verified
//! flatbuffer) and its schema (exactly the store's one column), every record
//! batch's block inside the file, its message's buffers inside its body,
//! uncompressed, one column without nulls, and the column's offsets
//! (monotonic, inside the values; Arrow's full validation). A truncated,
//! corrupt or foreign file is an [`ObservationStoreError::Corrupt`] naming
//! the file, never a panic; every `get` afterwards is in bounds. A written
//! store gets the same checks.
//!
//! ```
//! use embodyflow_core::observation_store::ObservationStore;
//! let observations: Vec<Vec<u8>> = vec![vec![1, 2, 3], vec![], vec![4; 5000]];
//! let store = ObservationStore::write(&observations).unwrap();
//! assert_eq!(store.len(), 3);
//! assert_eq!(store.get(0), [1, 2, 3]);
//! assert_eq!(store.get(2), &observations[2][..]);
//! // Sealed: no process can shrink it under the mapping.
//! let file = std::fs::OpenOptions::new().write(true).open(store.path()).unwrap();
//! assert!(file.set_len(0).is_err());
//! ```

use std::fs::File;
use std::io::{BufWriter, Write};
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

/// The name of a store's memory file (as `/proc/<pid>/fd` lists it).
pub const STORE_NAME: &str = "embodyflow-observations";

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
    /// The system failed (create, write, seal, open, copy, map).
    #[error("observation store {}: {what}: {source}", path.display())]
    Io {
        /// The file.
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
    /// Not a complete, valid store file: truncated, corrupt, foreign, or
    /// not the bytes its writer wrote.
    #[error("observation store {}: {reason}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong, with what was expected and found.
        reason: String,
    },
}

impl crate::Classify for ObservationStoreError {
    /// A failing system is a failure of the run; a damaged file is treated
    /// like a corrupt shard: bad input.
    fn kind(&self) -> crate::ErrorKind {
        match self {
            ObservationStoreError::Io { .. } | ObservationStoreError::Write { .. } => {
                crate::ErrorKind::Failure
            }
            ObservationStoreError::Corrupt { .. } => crate::ErrorKind::BadInput,
        }
    }
}

/// The core's error of a store error, for stages whose errors wrap
/// [`crate::Error`]: the system's failures stay failures, a damaged file bad
/// input, each naming the file.
impl From<ObservationStoreError> for crate::Error {
    fn from(error: ObservationStoreError) -> crate::Error {
        match error {
            ObservationStoreError::Io { path, source, .. } => crate::Error::Io { path, source },
            ObservationStoreError::Write { path, source } => crate::Error::Io {
                path,
                source: std::io::Error::other(source),
            },
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

/// A new, empty, sealable memory file and the path that reaches it
/// (`/proc/<pid>/fd/<n>`, for messages).
fn memory_file() -> Result<(File, PathBuf), ObservationStoreError> {
    use rustix::fs::MemfdFlags;
    let fd = rustix::fs::memfd_create(STORE_NAME, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
        .map_err(|e| ObservationStoreError::Io {
            path: PathBuf::from(STORE_NAME),
            what: "creating a memory file",
            source: e.into(),
        })?;
    let path = PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    ));
    Ok((File::from(fd), path))
}

/// A memory file that hashes every byte written to it.
struct HashedFile {
    file: File,
    hasher: blake3::Hasher,
}

impl Write for HashedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let written = self.file.write(buf)?;
        self.hasher.update(&buf[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Writes a store file batch by batch into a memory file (see the module
/// doc); [`Self::finish`] makes it an [`ObservationStore`].
pub struct ObservationStoreWriter {
    /// The path that reaches the memory file (for messages).
    path: PathBuf,
    writer: Option<FileWriter<BufWriter<HashedFile>>>,
    builder: LargeBinaryBuilder,
    rows: usize,
}

impl ObservationStoreWriter {
    /// Starts a store in a new memory file.
    pub fn create() -> Result<ObservationStoreWriter, ObservationStoreError> {
        let (file, path) = memory_file()?;
        let hashed = HashedFile {
            file,
            hasher: blake3::Hasher::new(),
        };
        let writer = FileWriter::try_new(BufWriter::with_capacity(1 << 20, hashed), &schema())
            .map_err(|source| ObservationStoreError::Write {
                path: path.clone(),
                source,
            })?;
        Ok(ObservationStoreWriter {
            path,
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
                path: self.path.clone(),
                source,
            })
    }

    /// Writes the last batch and the footer, then seals, maps and checks
    /// the memory file (its hash against the bytes written, its structure).
    pub fn finish(mut self) -> Result<ObservationStore, ObservationStoreError> {
        self.write_batch()?;
        let mut writer = self.writer.take().expect("the writer is open until finish");
        let write_error = |source| ObservationStoreError::Write {
            path: self.path.clone(),
            source,
        };
        writer.finish().map_err(write_error)?;
        let buffered = writer.into_inner().map_err(write_error)?;
        let HashedFile { file, hasher } =
            buffered
                .into_inner()
                .map_err(|e| ObservationStoreError::Io {
                    path: self.path.clone(),
                    what: "writing",
                    source: e.into_error(),
                })?;
        let store = ObservationStore::from_memory_file(file, self.path, Some(hasher.finalize()))?;
        if store.len() != self.rows {
            return Err(ObservationStoreError::Corrupt {
                path: store.path,
                reason: format!(
                    "holds {} observations after writing {}",
                    store.len, self.rows
                ),
            });
        }
        Ok(store)
    }
}

/// Observations in a sealed, memory-mapped Arrow IPC memory file, by index
/// (see the module doc).
pub struct ObservationStore {
    /// The path that reaches the memory file (or the file it was copied
    /// from), for messages.
    path: PathBuf,
    /// The record batches' columns, over the mapping.
    batches: Vec<LargeBinaryArray>,
    /// The store index of each batch's first row (ascending, from 0).
    starts: Vec<usize>,
    len: usize,
    /// The whole mapped file.
    map: Buffer,
    /// The sealed memory file (kept open, so `path` reaches it).
    _file: File,
}

impl ObservationStore {
    /// Writes `observations` in order into a new store (see
    /// [`ObservationStoreWriter`]) and opens it.
    pub fn write<T: AsRef<[u8]>>(
        observations: impl IntoIterator<Item = T>,
    ) -> Result<ObservationStore, ObservationStoreError> {
        let mut writer = ObservationStoreWriter::create()?;
        for observation in observations {
            writer.push(observation.as_ref())?;
        }
        writer.finish()
    }

    /// Copies the store file at `path` into a sealed memory file, maps it
    /// and checks it (see the module doc). The file itself is only read.
    pub fn open(path: &Path) -> Result<ObservationStore, ObservationStoreError> {
        let io = |what, source| ObservationStoreError::Io {
            path: path.to_path_buf(),
            what,
            source,
        };
        let mut source = File::open(path).map_err(|e| io("opening", e))?;
        let (mut file, _) = memory_file()?;
        std::io::copy(&mut source, &mut file).map_err(|e| io("copying into memory", e))?;
        ObservationStore::from_memory_file(file, path.to_path_buf(), None)
    }

    /// Seals the memory file `file` (reached by `path`), maps it, checks
    /// its hash against `written` (when known) and its structure.
    fn from_memory_file(
        file: File,
        path: PathBuf,
        written: Option<blake3::Hash>,
    ) -> Result<ObservationStore, ObservationStoreError> {
        use rustix::fs::SealFlags;
        let io = |what, source| ObservationStoreError::Io {
            path: path.clone(),
            what,
            source,
        };
        rustix::fs::fcntl_add_seals(
            &file,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE | SealFlags::SEAL,
        )
        .map_err(|e| io("sealing", e.into()))?;
        let map = map_file(&file).map_err(|e| io("memory-mapping", e))?;
        let corrupt = |reason: String| ObservationStoreError::Corrupt {
            path: path.clone(),
            reason,
        };
        if let Some(written) = written {
            let found = blake3::hash(&map);
            if found != written {
                return Err(corrupt(format!(
                    "content hash is {found}, expected {written} from its writer (changed before it was sealed)"
                )));
            }
        }
        let batches = read_batches(&map).map_err(corrupt)?;
        let mut starts = Vec::with_capacity(batches.len());
        let mut len = 0usize;
        for batch in &batches {
            starts.push(len);
            len += batch.len();
        }
        Ok(ObservationStore {
            path,
            batches,
            starts,
            len,
            map,
            _file: file,
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

    /// The path that reaches the store's memory file
    /// (`/proc/<pid>/fd/<n>`), or the file it was copied from.
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
            .finish()
    }
}

/// Maps the sealed memory file `file` read-only, as an Arrow buffer that
/// owns the mapping.
#[allow(unsafe_code)]
fn map_file(file: &File) -> std::io::Result<Buffer> {
    // SAFETY: `Mmap::map` is unsafe because the mapped bytes change if the
    // file is modified while mapped, and a truncation would fault on
    // access. The file is a memory file sealed against writes, shrinking and
    // growth before it is mapped (`from_memory_file`): the kernel refuses
    // both to every process, so neither can happen; every offset read from
    // it is validated once, before any slice is handed out.
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

    /// A complete store file's bytes.
    fn store_bytes(rows: &[Vec<u8>]) -> Vec<u8> {
        let store = ObservationStore::write(rows).unwrap();
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
        let store = ObservationStore::write(&rows).unwrap();
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
        let store = ObservationStore::write(&rows).unwrap();
        let map = store.map.as_ptr_range();
        for i in 0..rows.len() {
            let value = store.get(i).as_ptr_range();
            assert!(map.start <= value.start && value.end <= map.end, "row {i}");
        }
    }

    #[test]
    fn an_empty_store_is_valid() {
        let store = ObservationStore::write(Vec::<Vec<u8>>::new()).unwrap();
        assert!(store.is_empty());
        assert_eq!(ObservationStore::open(store.path()).unwrap().len(), 0);
    }

    #[test]
    #[should_panic(expected = "observation 3 of a store of 3")]
    fn an_index_past_the_end_panics_like_a_slice() {
        let store = ObservationStore::write(observations(3)).unwrap();
        let _ = store.get(3);
    }

    #[test]
    fn no_process_can_truncate_or_rewrite_a_store_under_its_mapping() {
        // Through the one path that reaches the memory file, as another
        // process of the same user would: truncation and writes are refused
        // with an error (on a mapped file on disk, the truncation succeeds
        // and the next `get` past the new end is SIGBUS).
        let rows = observations(30);
        let store = ObservationStore::write(&rows).unwrap();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(store.path())
            .unwrap();
        for (what, refused) in [
            ("truncate", file.set_len(0)),
            ("grow", file.set_len(store.file_bytes() as u64 + 4096)),
            (
                "rewrite",
                std::os::unix::fs::FileExt::write_at(&file, &[0xff; 64], 100).map(drop),
            ),
        ] {
            let error = refused.expect_err(what);
            assert_eq!(error.raw_os_error(), Some(1), "{what}: {error}"); // EPERM
        }
        assert!((0..rows.len()).all(|i| store.get(i) == rows[i]));
        // Nothing of it is in any directory: the path is the process's fd.
        let path = store.path().to_string_lossy().into_owned();
        assert!(path.starts_with("/proc/"), "{path}");
    }

    #[test]
    fn bytes_changed_before_the_seal_are_caught_by_the_hash() {
        let rows = observations(20);
        let mut writer = ObservationStoreWriter::create().unwrap();
        for row in &rows {
            writer.push(row).unwrap();
        }
        writer.write_batch().unwrap();
        // A value byte rewritten through the file, behind the writer's back.
        let buffered = writer.writer.as_mut().unwrap().get_mut();
        buffered.flush().unwrap();
        std::os::unix::fs::FileExt::write_at(&buffered.get_ref().file, &[0x5a], 200).unwrap();
        match writer.finish() {
            Err(e @ ObservationStoreError::Corrupt { .. }) => {
                assert!(e.to_string().contains("content hash"), "{e}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
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
