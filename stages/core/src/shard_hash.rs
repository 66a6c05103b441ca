//! A shard's BLAKE3 hash kept as the tree it is, so that a reader checks
//! exactly the bytes it decodes, and only those.
//!
//! BLAKE3 hashes its input as a binary tree of 1 KiB chunks, each subtree
//! left-balanced; every aligned [`BLOCK`] (1 MiB) of a file longer than one
//! block is a subtree, with its own chaining value (the BLAKE3 paper,
//! section 2.1). The writer ([`TreeHasher`]) hashes a shard block by block
//! as it streams out and keeps the blocks' chaining values; merging them
//! up the tree gives the file's BLAKE3 hash, the very hash of
//! `blake3::hash(file)` that the manifest has always recorded. The manifest
//! also stores the chaining values (`ShardEntry::blocks`).
//!
//! A reader ([`VerifiedShard`], a Parquet `ChunkReader`) first checks that
//! the stored chaining values merge to the recorded hash, then reads a
//! block only when Parquet asks for bytes in it, and hands them on only
//! after the block hashes to its chaining value. A projected read (GRPO
//! reads the response ids of a steps table, not its log-probs or values)
//! hashes and reads the blocks of its columns and the footer, not the
//! whole file; and the bytes checked are the bytes decoded, with no window
//! between a check and a second read of the file.
//!
//! ```
//! use embodyflow_core::shard_hash::{BLOCK, TreeHasher, root_of};
//! let data: Vec<u8> = (0..5 * BLOCK / 2).map(|i| (i * 7 % 251) as u8).collect();
//! let mut hasher = TreeHasher::default();
//! for piece in data.chunks(300_000) {
//!     hasher.update(piece);
//! }
//! let (hash, blocks) = hasher.finish();
//! assert_eq!(hash, blake3::hash(&data));
//! assert_eq!(blocks.len(), 3);
//! assert_eq!(root_of(&blocks, data.len() as u64), Some(hash));
//! ```

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use blake3::hazmat::{
    ChainingValue, HasherExt, Mode, left_subtree_len, merge_subtrees_non_root, merge_subtrees_root,
};
use bytes::Bytes;
use parquet::errors::ParquetError;
use parquet::file::reader::{ChunkReader, Length};

/// The bytes of one block: a subtree of the BLAKE3 tree of any longer file.
pub const BLOCK: u64 = 1 << 20;

/// Blocks a reader keeps checked (Parquet reads a page's header, then its
/// data, then the next page's header, each possibly in the same block).
const CACHED_BLOCKS: usize = 4;

/// The number of blocks of a file of `len` bytes: none for a file of one
/// block or less, whose hash is its one block's root hash.
pub fn block_count(len: u64) -> u64 {
    if len <= BLOCK { 0 } else { len.div_ceil(BLOCK) }
}

/// Hashes a file as it streams out, block by block.
#[derive(Default)]
pub struct TreeHasher {
    current: blake3::Hasher,
    start: u64,
    filled: u64,
    blocks: Vec<ChainingValue>,
}

impl TreeHasher {
    /// Adds the next bytes of the file.
    pub fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.filled == BLOCK {
                // A full block is a subtree only once more bytes follow (a
                // file of exactly one block is hashed as a root).
                self.blocks.push(self.current.finalize_non_root());
                self.start += BLOCK;
                self.current = blake3::Hasher::new();
                self.current.set_input_offset(self.start);
                self.filled = 0;
            }
            let take = ((BLOCK - self.filled) as usize).min(data.len());
            self.current.update(&data[..take]);
            self.filled += take as u64;
            data = &data[take..];
        }
    }

    /// The file's BLAKE3 hash and its blocks' chaining values (none for a
    /// file of one block or less).
    pub fn finish(mut self) -> (blake3::Hash, Vec<ChainingValue>) {
        if self.blocks.is_empty() {
            return (self.current.finalize(), Vec::new());
        }
        self.blocks.push(self.current.finalize_non_root());
        let len = self.start + self.filled;
        let root = root_of(&self.blocks, len).expect("a block count that matches the length");
        (root, self.blocks)
    }
}

/// The BLAKE3 hash of a file of `len` bytes whose blocks have the chaining
/// values `blocks`; `None` when their number is not the length's
/// ([`block_count`]).
pub fn root_of(blocks: &[ChainingValue], len: u64) -> Option<blake3::Hash> {
    if blocks.len() as u64 != block_count(len) || blocks.is_empty() {
        return None;
    }
    let (left, right) = halves(blocks, len);
    Some(merge_subtrees_root(&left, &right, Mode::Hash))
}

/// The chaining values of the two children of the subtree over `blocks`
/// (`len` bytes, two blocks or more).
fn halves(blocks: &[ChainingValue], len: u64) -> (ChainingValue, ChainingValue) {
    let left_len = left_subtree_len(len);
    let split = (left_len / BLOCK) as usize;
    (
        subtree(&blocks[..split], left_len),
        subtree(&blocks[split..], len - left_len),
    )
}

/// The chaining value of the (non-root) subtree over `blocks`, `len` bytes.
fn subtree(blocks: &[ChainingValue], len: u64) -> ChainingValue {
    if blocks.len() == 1 {
        return blocks[0];
    }
    let (left, right) = halves(blocks, len);
    merge_subtrees_non_root(&left, &right, Mode::Hash)
}

/// Chaining values as the manifest stores them: 64 hex digits each, joined.
pub fn to_hex(blocks: &[ChainingValue]) -> String {
    blocks
        .iter()
        .flat_map(|cv| cv.iter().map(|b| format!("{b:02x}")))
        .collect()
}

/// The chaining values of `text` ([`to_hex`]'s form) for a file of `len`
/// bytes: every size is checked against the length before anything is
/// allocated.
pub fn from_hex(text: &str, len: u64) -> Result<Vec<ChainingValue>, String> {
    let expected = block_count(len);
    if text.len() as u64 != 64 * expected {
        return Err(format!(
            "`blocks` has {} hex digits, expected {} for {expected} blocks of a {len}-byte file",
            text.len(),
            64 * expected
        ));
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    text.as_bytes()
        .chunks(64)
        .map(|hex| {
            let mut cv = [0u8; 32];
            for (byte, pair) in cv.iter_mut().zip(hex.chunks(2)) {
                *byte = digit(pair[0])
                    .zip(digit(pair[1]))
                    .map(|(h, l)| h << 4 | l)
                    .ok_or("`blocks` holds a character that is no lowercase hex digit")?;
            }
            Ok(cv)
        })
        .collect()
}

/// The chaining values `text` stores ([`to_hex`]'s form) for a file of
/// `len` bytes whose BLAKE3 hash is `hash` (hex), once they are checked to
/// merge to it; a message naming what is wrong otherwise.
pub fn checked_blocks(text: &str, len: u64, hash: &str) -> Result<Vec<ChainingValue>, String> {
    let blocks = from_hex(text, len)?;
    let root = root_of(&blocks, len)
        .ok_or_else(|| format!("{} block hashes for a {len}-byte file", blocks.len()))?;
    if root.to_hex().as_str() != hash {
        return Err(format!(
            "its block hashes merge to {}, not to the content hash {hash} of the manifest (the manifest is damaged)",
            root.to_hex()
        ));
    }
    Ok(blocks)
}

/// A shard read through its block hashes (see the module doc): cheap to
/// clone, each clone sharing the file and the checked blocks.
#[derive(Clone)]
pub struct VerifiedShard {
    inner: Arc<Inner>,
}

struct Inner {
    file: File,
    path: PathBuf,
    len: u64,
    blocks: Vec<ChainingValue>,
    checked: Mutex<VecDeque<(u64, Bytes)>>,
}

impl VerifiedShard {
    /// Opens `path`, `len` bytes by the manifest, whose BLAKE3 hash is
    /// `hash` (hex) and whose blocks' chaining values `blocks` stores
    /// ([`checked_blocks`]); fails, naming what, when they do not merge to
    /// the hash.
    pub fn open(path: &Path, len: u64, hash: &str, blocks: &str) -> Result<VerifiedShard, String> {
        let blocks = checked_blocks(blocks, len, hash)?;
        let file = File::open(path).map_err(|e| format!("cannot be opened: {e}"))?;
        Ok(VerifiedShard {
            inner: Arc::new(Inner {
                file,
                path: path.to_path_buf(),
                len,
                blocks,
                checked: Mutex::new(VecDeque::with_capacity(CACHED_BLOCKS)),
            }),
        })
    }

    /// Block `index`, read and checked (or taken from the blocks checked last).
    fn block(&self, index: u64) -> Result<Bytes, ParquetError> {
        let inner = &self.inner;
        if let Some((_, bytes)) = inner
            .checked
            .lock()
            .expect("block cache lock")
            .iter()
            .find(|(i, _)| *i == index)
        {
            return Ok(bytes.clone());
        }
        let start = index * BLOCK;
        let len = BLOCK.min(inner.len - start) as usize;
        let mut data = vec![0u8; len];
        inner.file.read_exact_at(&mut data, start).map_err(|e| {
            ParquetError::General(format!(
                "{}: block {index} cannot be read ({e}): the file is shorter than the manifest says",
                inner.path.display()
            ))
        })?;
        let mut hasher = blake3::Hasher::new();
        hasher.set_input_offset(start);
        hasher.update(&data);
        let found = hasher.finalize_non_root();
        let expected = &inner.blocks[index as usize];
        if &found != expected {
            return Err(ParquetError::General(format!(
                "content hash is {}, expected {} from the manifest for bytes {start}..{} (block {index}; the file changed after it was written)",
                to_hex(&[found]),
                to_hex(std::slice::from_ref(expected)),
                start + len as u64,
            )));
        }
        let bytes = Bytes::from(data);
        let mut checked = inner.checked.lock().expect("block cache lock");
        if checked.len() == CACHED_BLOCKS {
            checked.pop_front();
        }
        checked.push_back((index, bytes.clone()));
        Ok(bytes)
    }

    /// Bytes `start..start + length`, every block they touch checked.
    fn range(&self, start: u64, length: usize) -> Result<Bytes, ParquetError> {
        let end = start
            .checked_add(length as u64)
            .filter(|&end| end <= self.inner.len)
            .ok_or_else(|| {
                ParquetError::EOF(format!(
                    "bytes {start}..+{length} are past the end of {} ({} bytes)",
                    self.inner.path.display(),
                    self.inner.len
                ))
            })?;
        if length == 0 {
            return Ok(Bytes::new());
        }
        let (first, last) = (start / BLOCK, (end - 1) / BLOCK);
        if first == last {
            let offset = (start - first * BLOCK) as usize;
            return Ok(self.block(first)?.slice(offset..offset + length));
        }
        let mut joined = Vec::with_capacity(length);
        for index in first..=last {
            let block = self.block(index)?;
            let from = start.saturating_sub(index * BLOCK) as usize;
            let to = ((end - index * BLOCK) as usize).min(block.len());
            joined.extend_from_slice(&block[from..to]);
        }
        Ok(Bytes::from(joined))
    }
}

impl Length for VerifiedShard {
    fn len(&self) -> u64 {
        self.inner.len
    }
}

impl ChunkReader for VerifiedShard {
    type T = CheckedRead;

    fn get_read(&self, start: u64) -> Result<CheckedRead, ParquetError> {
        if start > self.inner.len {
            return Err(ParquetError::EOF(format!(
                "offset {start} is past the end of {}",
                self.inner.path.display()
            )));
        }
        Ok(CheckedRead {
            shard: self.clone(),
            position: start,
        })
    }

    fn get_bytes(&self, start: u64, length: usize) -> Result<Bytes, ParquetError> {
        self.range(start, length)
    }
}

/// Sequential reading from a [`VerifiedShard`], block by checked block.
pub struct CheckedRead {
    shard: VerifiedShard,
    position: u64,
}

impl Read for CheckedRead {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.shard.inner.len - self.position;
        if left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let index = self.position / BLOCK;
        let block = self.shard.block(index).map_err(std::io::Error::other)?;
        let offset = (self.position - index * BLOCK) as usize;
        let n = buf.len().min(block.len() - offset);
        buf[..n].copy_from_slice(&block[offset..offset + n]);
        self.position += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn data(len: u64) -> Vec<u8> {
        (0..len)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect()
    }

    fn hashed(bytes: &[u8], piece: usize) -> (blake3::Hash, Vec<ChainingValue>) {
        let mut hasher = TreeHasher::default();
        for part in bytes.chunks(piece.max(1)) {
            hasher.update(part);
        }
        hasher.finish()
    }

    #[test]
    fn the_tree_hash_is_blake3_at_every_block_boundary() {
        for len in [
            0,
            1,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            2 * BLOCK,
            2 * BLOCK + 1,
            3 * BLOCK,
            5 * BLOCK + 17,
            8 * BLOCK,
            9 * BLOCK - 1,
        ] {
            let bytes = data(len);
            let (hash, blocks) = hashed(&bytes, 777_777);
            assert_eq!(hash, blake3::hash(&bytes), "{len} bytes");
            assert_eq!(blocks.len() as u64, block_count(len), "{len} bytes");
            assert_eq!(from_hex(&to_hex(&blocks), len).unwrap(), blocks);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn any_length_and_any_write_sizes_give_blake3(len in 0u64..(6 * BLOCK), piece in 1usize..3_000_000) {
            let bytes = data(len);
            prop_assert_eq!(hashed(&bytes, piece).0, blake3::hash(&bytes));
        }
    }

    fn shard(len: u64) -> (tempfile::TempDir, PathBuf, Vec<u8>, VerifiedShard) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("part-00000.parquet");
        let bytes = data(len);
        std::fs::write(&path, &bytes).unwrap();
        let (hash, blocks) = hashed(&bytes, 1 << 16);
        let shard =
            VerifiedShard::open(&path, len, hash.to_hex().as_str(), &to_hex(&blocks)).unwrap();
        (dir, path, bytes, shard)
    }

    #[test]
    fn ranges_and_reads_give_the_file_bytes() {
        let len = 3 * BLOCK + 1000;
        let (_dir, _path, bytes, shard) = shard(len);
        for (start, length) in [
            (0, 10),
            (BLOCK - 5, 10),
            (BLOCK - 5, (2 * BLOCK) as usize),
            (len - 8, 8),
            (len, 0),
        ] {
            let got = shard.get_bytes(start, length).unwrap();
            assert_eq!(&got[..], &bytes[start as usize..start as usize + length]);
        }
        assert!(shard.get_bytes(len - 4, 8).is_err(), "past the end");
        let mut read = Vec::new();
        shard
            .get_read(BLOCK / 2)
            .unwrap()
            .read_to_end(&mut read)
            .unwrap();
        assert_eq!(&read[..], &bytes[(BLOCK / 2) as usize..]);
    }

    #[test]
    fn a_changed_byte_fails_the_blocks_that_hold_it_and_no_other() {
        let len = 3 * BLOCK + 1000;
        let (_dir, path, mut bytes, _) = shard(len);
        let (hash, blocks) = hashed(&bytes, 1 << 20);
        bytes[(BLOCK + 12) as usize] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let shard =
            VerifiedShard::open(&path, len, hash.to_hex().as_str(), &to_hex(&blocks)).unwrap();
        assert!(shard.get_bytes(0, 100).is_ok(), "block 0 is intact");
        assert!(shard.get_bytes(2 * BLOCK, 100).is_ok(), "block 2 is intact");
        let error = shard.get_bytes(BLOCK + 10, 4).unwrap_err().to_string();
        assert!(error.contains("content hash is"), "{error}");
        assert!(error.contains("block 1;"), "{error}");
        let mut read = Vec::new();
        assert!(shard.get_read(0).unwrap().read_to_end(&mut read).is_err());
        // Block hashes that do not merge to the manifest's hash are refused.
        let mut wrong = blocks;
        wrong[1][0] ^= 1;
        let error = VerifiedShard::open(&path, len, hash.to_hex().as_str(), &to_hex(&wrong))
            .err()
            .unwrap();
        assert!(error.contains("manifest is damaged"), "{error}");
    }

    #[test]
    fn block_hashes_of_the_wrong_size_or_alphabet_are_refused_before_allocating() {
        assert!(from_hex("", BLOCK).unwrap().is_empty());
        assert!(from_hex("ab", 3 * BLOCK).is_err());
        assert!(from_hex(&"g".repeat(128), 2 * BLOCK).is_err());
        assert!(from_hex(&"A".repeat(128), 2 * BLOCK).is_err());
        assert_eq!(from_hex(&"0".repeat(128), 2 * BLOCK).unwrap().len(), 2);
        assert!(from_hex("", u64::MAX).is_err());
    }
}
