//! Committing a stage's outputs together: every table, checkpoint and summary
//! a run writes appears to readers at once, or not at all.
//!
//! A writer builds each output under a hidden sibling in the output directory
//! (`.<name>.tmp-<pid>-<nanos>`), complete and fsynced. [`Commit::apply`] then
//!
//! 1. writes a **journal** `.commit-<pid>-<nanos>.json` (written under a
//!    temporary name, fsynced, renamed: it exists only whole) that lists each
//!    staged path, its target name and the BLAKE3 **digest** of the new
//!    content (a table's `_manifest.parquet`, which holds every shard's hash; a
//!    checkpoint's files; a summary file's bytes), holding an exclusive
//!    `flock` on it for the whole commit;
//! 2. swaps each staged path into place: `renameat2(RENAME_EXCHANGE)` where
//!    the filesystem has it (one atomic step: the target is never absent, and
//!    the old content lands at the staged name); elsewhere (`EINVAL`,
//!    `ENOSYS`, `EOPNOTSUPP`) the documented fallback renames the old target
//!    aside to `.<name>.old-<pid>-<nanos>`, then the staged path into place;
//! 3. removes the journal and only then the old content.
//!
//! Once every swap is done the commit is: what follows (fsyncing the
//! directory so that the swaps are durable, then removing the journal and
//! the old content, with no fsync of their own) is cleanup, and a
//! failure there is a warning, not a failed run — the journal it may leave
//! rolls forward to the very same state, and the old content under its
//! hidden name is removed by the next writer.
//!
//! **Recovery.** A process killed during step 2 leaves the journal. Whoever
//! next opens a table of that directory, or writes into it, finds the journal,
//! takes its lock (a live committer still holds it, so this waits for it) and
//! rolls the commit forward: an entry whose target already has the journal's
//! digest is done, one whose staged path has it is swapped in now, and a
//! target left absent by the fallback is never deleted around. A reader
//! therefore never sees `trajectories` without the `steps` committed with it.
//! A journal some of whose staged outputs are gone while nothing of it was
//! swapped (a run that failed right after writing its journal and removed its
//! staged outputs, but could not remove the journal) is **rolled back**: the
//! journal and what is left staged are removed, the old content stays.
//! Only a journal with an output swapped in and another lost is an error.
//! An error inside `apply` (not a kill) swaps back what it had swapped and
//! removes the journal before the staged outputs, so a run that exits
//! non-zero leaves nothing a reader accepts, and nothing that blocks one.
//!
//! Writers also clear **stale leftovers** of dead processes ([`clean_stale`]):
//! staged `.<name>.tmp-<pid>-…` and `.<name>.writing-<pid>` directories are
//! removed, and an `.<name>.old-<pid>-…` is restored to `<name>` when no
//! `<name>` is in place (removed only when one is).
//!
//! Fault injection: with `EMBODYFLOW_FAULT_AT=<point>` the process kills
//! itself with SIGKILL at that point ([`fault_point`]; points
//! `commit:staged` before the journal, `commit:journaled` after it, `commit:swapped:<k>` after the k-th swap (1-based),
//! `commit:aside:<k>` between the fallback's two renames). With
//! `EMBODYFLOW_NO_RENAME_EXCHANGE=1` the fallback is used even where the
//! exchange works, so tests reach it; with `EMBODYFLOW_FAULT_ERR=<point>` an
//! I/O step fails ([`fault_error`]; points `stage:summary`, the summary write
//! of [`crate::stage::Stage::commit`], with `ENOSPC`; `commit:journal-sync`,
//! the directory fsync right after the journal is renamed in, and
//! `commit:swapped-sync`, the one after the last swap, with `EIO`).
//!
//! ```no_run
//! # use embodyflow_core::commit::{Commit, Digest};
//! # fn demo(out: &std::path::Path, staged_table: &str, staged_summary: &str) -> embodyflow_core::Result<()> {
//! let mut commit = Commit::new(out);
//! commit.add(staged_table, "rewards", Digest::DirFile("_manifest.parquet"), false)?;
//! commit.add(staged_summary, "_summary.score-rewards.md", Digest::File, true)?;
//! commit.apply()?; // both in place, or neither
//! # Ok(()) }
//! ```

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

const JOURNAL_PREFIX: &str = ".commit-";
const JOURNAL_SUFFIX: &str = ".json";
const JOURNAL_FORMAT: &str = "embodyflow-commit-1";

/// What identifies the new content of an entry (recorded in the journal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Digest {
    /// The entry is a file: its bytes.
    File,
    /// The entry is a directory identified by one file in it (a table's
    /// `_manifest.parquet`, which lists every shard's hash).
    DirFile(&'static str),
    /// The entry is a directory: every file in it, by name and bytes.
    DirAll,
}

impl Digest {
    fn code(self) -> String {
        match self {
            Digest::File => "file".into(),
            Digest::DirFile(name) => format!("dir:{name}"),
            Digest::DirAll => "dir".into(),
        }
    }
}

/// One output of a commit, as the journal records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct JournalEntry {
    /// Name of the staged path in the output directory.
    staged: String,
    /// Name it takes when committed.
    target: String,
    /// How the digest is computed (`file`, `dir`, `dir:<file>`).
    digest_of: String,
    /// BLAKE3 of the new content.
    digest: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Journal {
    format: String,
    pid: u32,
    entries: Vec<JournalEntry>,
}

/// A pending entry: staged name, target name, digest kind, replace allowed.
#[derive(Debug, Clone)]
struct Pending {
    staged: String,
    target: String,
    digest: Digest,
    replace: bool,
}

/// The outputs of one run, committed together (see the module doc).
#[derive(Debug)]
pub struct Commit {
    out: PathBuf,
    pending: Vec<Pending>,
}

/// How one entry was swapped in, to undo it.
enum Swapped {
    /// Exchanged: the old content (if any) is at the staged name.
    Exchanged { had_old: bool },
    /// Fallback: the old content (if any) is at this aside path.
    Renamed { aside: Option<PathBuf> },
}

/// A unique suffix `<pid>-<nanos>` for hidden names.
pub fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{}-{nanos}", std::process::id())
}

/// The hidden staging name for output `name`: `.<name>.tmp-<pid>-<nanos>`.
pub fn staging_name(name: &str) -> String {
    format!(".{name}.tmp-{}", unique_suffix())
}

/// Kills this process with SIGKILL when `EMBODYFLOW_FAULT_AT` names `point`
/// (a test hook: a kill at an exact point, as `kill -9` would land there).
pub fn fault_point(point: &str) {
    if std::env::var("EMBODYFLOW_FAULT_AT").is_ok_and(|p| p == point) {
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        std::process::abort(); // not reached
    }
}

/// Fails with OS error `errno` when `EMBODYFLOW_FAULT_ERR` names `point` (a
/// test hook: a full disk or a failing one at an exact point of a run).
pub fn fault_error(point: &str, errno: rustix::io::Errno) -> std::io::Result<()> {
    if std::env::var("EMBODYFLOW_FAULT_ERR").is_ok_and(|p| p == point) {
        return Err(errno.into());
    }
    Ok(())
}

/// fsyncs a directory (so renames in it are durable).
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(|e| Error::io(dir, e))
}

/// [`sync_dir`] at fault point `point` (which fails it with `EIO`).
fn sync_dir_at(dir: &Path, point: &str) -> Result<()> {
    fault_error(point, rustix::io::Errno::IO)
        .and_then(|_| File::open(dir)?.sync_all())
        .map_err(|e| Error::io(dir, e))
}

/// fsyncs every file under `dir` and the directories themselves.
pub fn sync_tree(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let path = entry.map_err(|e| Error::io(dir, e))?.path();
        if path.is_dir() {
            sync_tree(&path)?;
        } else {
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| Error::io(&path, e))?;
        }
    }
    sync_dir(dir)
}

fn hash_file(path: &Path, hasher: &mut blake3::Hasher) -> Result<()> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    hasher.update_reader(file).map_err(|e| Error::io(path, e))?;
    Ok(())
}

fn hash_tree(dir: &Path, prefix: &str, hasher: &mut blake3::Hasher) -> Result<()> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| Error::io(dir, e))?
        .map(|e| {
            e.map(|e| e.file_name().to_string_lossy().into_owned())
                .map_err(|e| Error::io(dir, e))
        })
        .collect::<Result<_>>()?;
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let rel = format!("{prefix}{name}");
        if path.is_dir() {
            hash_tree(&path, &format!("{rel}/"), hasher)?;
        } else {
            hasher.update(rel.as_bytes());
            hasher.update(&[0]);
            hash_file(&path, hasher)?;
            hasher.update(&[0]);
        }
    }
    Ok(())
}

/// The digest of `path` by `digest_of` (`file`, `dir`, `dir:<file>`); `None`
/// when the path (or its identifying file) does not exist.
fn digest(path: &Path, digest_of: &str) -> Result<Option<String>> {
    let mut hasher = blake3::Hasher::new();
    match digest_of {
        "file" => {
            if !path.is_file() {
                return Ok(None);
            }
            hash_file(path, &mut hasher)?;
        }
        "dir" => {
            if !path.is_dir() {
                return Ok(None);
            }
            hash_tree(path, "", &mut hasher)?;
        }
        other => {
            let Some(file) = other.strip_prefix("dir:") else {
                return Err(Error::BadInput(format!(
                    "commit journal in {}: unknown digest kind `{other}`, expected file, dir or dir:<file>",
                    path.parent().unwrap_or(path).display()
                )));
            };
            let marker = path.join(file);
            if !path.is_dir() || !marker.is_file() {
                return Ok(None);
            }
            hash_file(&marker, &mut hasher)?;
        }
    }
    Ok(Some(hasher.finalize().to_hex().to_string()))
}

fn remove_path(path: &Path) -> Result<()> {
    let result = if path.is_dir() {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(path, e)),
    }
}

fn exchange_disabled() -> bool {
    std::env::var("EMBODYFLOW_NO_RENAME_EXCHANGE").is_ok_and(|v| v == "1")
}

/// Whether a `renameat2` error means the filesystem lacks the flag.
fn unsupported(e: &rustix::io::Errno) -> bool {
    use rustix::io::Errno;
    [Errno::INVAL, Errno::NOSYS, Errno::OPNOTSUPP].contains(e)
}

/// Puts `staged` at `target` (see the module doc). `k` numbers the swap for
/// fault points.
fn swap_in(out: &Path, staged: &str, target: &str, k: usize) -> Result<Swapped> {
    let from = out.join(staged);
    let to = out.join(target);
    let exists = std::fs::symlink_metadata(&to).is_ok();
    if !exists {
        std::fs::rename(&from, &to).map_err(|e| Error::io(&to, e))?;
        return Ok(Swapped::Renamed { aside: None });
    }
    if !exchange_disabled() {
        match rustix::fs::renameat_with(
            rustix::fs::CWD,
            &from,
            rustix::fs::CWD,
            &to,
            rustix::fs::RenameFlags::EXCHANGE,
        ) {
            Ok(()) => return Ok(Swapped::Exchanged { had_old: true }),
            Err(e) if unsupported(&e) => {}
            Err(e) => return Err(Error::io(&to, e.into())),
        }
    }
    let aside = out.join(format!(".{target}.old-{}", unique_suffix()));
    std::fs::rename(&to, &aside).map_err(|e| Error::io(&to, e))?;
    fault_point(&format!("commit:aside:{k}"));
    std::fs::rename(&from, &to).map_err(|e| Error::io(&to, e))?;
    Ok(Swapped::Renamed { aside: Some(aside) })
}

/// Undoes [`swap_in`].
fn swap_back(out: &Path, staged: &str, target: &str, how: &Swapped) -> Result<()> {
    let from = out.join(staged);
    let to = out.join(target);
    match how {
        Swapped::Exchanged { had_old: true } => rustix::fs::renameat_with(
            rustix::fs::CWD,
            &from,
            rustix::fs::CWD,
            &to,
            rustix::fs::RenameFlags::EXCHANGE,
        )
        .map_err(|e| Error::io(&to, e.into())),
        Swapped::Exchanged { had_old: false } | Swapped::Renamed { aside: None } => {
            std::fs::rename(&to, &from).map_err(|e| Error::io(&to, e))
        }
        Swapped::Renamed { aside: Some(aside) } => {
            std::fs::rename(&to, &from).map_err(|e| Error::io(&to, e))?;
            std::fs::rename(aside, &to).map_err(|e| Error::io(aside, e))
        }
    }
}

/// Where the old content of a swapped entry now is.
fn old_location(out: &Path, staged: &str, how: &Swapped) -> Option<PathBuf> {
    match how {
        Swapped::Exchanged { had_old: true } => Some(out.join(staged)),
        Swapped::Renamed { aside } => aside.clone(),
        Swapped::Exchanged { had_old: false } => None,
    }
}

impl Commit {
    /// An empty commit into `out`.
    pub fn new(out: &Path) -> Commit {
        Commit {
            out: out.to_path_buf(),
            pending: Vec::new(),
        }
    }

    /// The output directory.
    pub fn out(&self) -> &Path {
        &self.out
    }

    /// Adds staged path `staged` (a name in the output directory) to be
    /// committed as `target`. Without `replace`, an existing `target` fails
    /// the commit with [`Error::OutputExists`] before anything moves.
    pub fn add(&mut self, staged: &str, target: &str, digest: Digest, replace: bool) -> Result<()> {
        if self.pending.iter().any(|p| p.target == target) {
            return Err(Error::Usage(format!(
                "output `{target}` is written twice in one run of {}",
                self.out.display()
            )));
        }
        self.pending.push(Pending {
            staged: staged.to_string(),
            target: target.to_string(),
            digest,
            replace,
        });
        Ok(())
    }

    /// Moves `other`'s entries into this commit (same output directory).
    pub fn absorb(&mut self, mut other: Commit) -> Result<()> {
        if other.out != self.out {
            return Err(Error::Usage(format!(
                "outputs of one run go to one directory: {} and {}",
                self.out.display(),
                other.out.display()
            )));
        }
        for p in std::mem::take(&mut other.pending) {
            let taken = self.add(&p.staged, &p.target, p.digest, p.replace);
            if taken.is_err() {
                let _ = remove_path(&self.out.join(&p.staged));
            }
            taken?;
        }
        Ok(())
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Commits every entry (see the module doc).
    pub fn apply(mut self) -> Result<()> {
        let pending = self.pending.clone();
        if pending.is_empty() {
            return Ok(());
        }
        let out = self.out.clone();
        settle(&out)?;
        for p in &pending {
            let target = out.join(&p.target);
            if !p.replace && std::fs::symlink_metadata(&target).is_ok() {
                return Err(Error::OutputExists(target));
            }
        }
        fault_point("commit:staged");
        let mut entries = Vec::with_capacity(pending.len());
        for p in &pending {
            let digest_of = p.digest.code();
            let staged = out.join(&p.staged);
            let digest = digest(&staged, &digest_of)?.ok_or_else(|| {
                Error::BadInput(format!(
                    "staged output {} is missing or incomplete",
                    staged.display()
                ))
            })?;
            entries.push(JournalEntry {
                staged: p.staged.clone(),
                target: p.target.clone(),
                digest_of,
                digest,
            });
        }
        let journal = Journal {
            format: JOURNAL_FORMAT.into(),
            pid: std::process::id(),
            entries,
        };
        let name = format!("{JOURNAL_PREFIX}{}{JOURNAL_SUFFIX}", unique_suffix());
        let path = out.join(&name);
        let tmp = out.join(format!("{name}.tmp"));
        let mut file = File::create(&tmp).map_err(|e| Error::io(&tmp, e))?;
        file.lock().map_err(|e| Error::io(&tmp, e))?;
        let text = serde_json::to_string_pretty(&journal).expect("a journal serialises");
        let written = file
            .write_all(text.as_bytes())
            .and_then(|_| file.sync_all())
            .map_err(|e| Error::io(&tmp, e))
            .and_then(|_| std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e)))
            .and_then(|_| sync_dir_at(&out, "commit:journal-sync"));
        if let Err(e) = written {
            // Nothing was swapped: the journal goes before the staged
            // outputs do (when this returns), so no reader finds a journal
            // whose outputs are gone; one left all the same (its removal
            // failed too) is rolled back by the next reader.
            let _ = std::fs::remove_file(&tmp);
            let _ = std::fs::remove_file(&path);
            let _ = sync_dir(&out);
            return Err(e);
        }
        // From here the journal owns the staged paths.
        self.pending.clear();
        fault_point("commit:journaled");
        let mut done: Vec<(usize, Swapped)> = Vec::new();
        for (k, entry) in journal.entries.iter().enumerate() {
            match swap_in(&out, &entry.staged, &entry.target, k + 1) {
                Ok(how) => done.push((k, how)),
                Err(error) => {
                    // Undo in reverse; then the journal has nothing to redo.
                    for (j, how) in done.iter().rev() {
                        let e = &journal.entries[*j];
                        if let Err(undo) = swap_back(&out, &e.staged, &e.target, how) {
                            return Err(Error::BadInput(format!(
                                "{error}; undoing the commit also failed ({undo}): {} is left for the next reader to complete",
                                path.display()
                            )));
                        }
                    }
                    let _ = std::fs::remove_file(&path);
                    let _ = sync_dir(&out);
                    for e in &journal.entries {
                        let _ = remove_path(&out.join(&e.staged));
                    }
                    return Err(error);
                }
            }
            fault_point(&format!("commit:swapped:{}", k + 1));
        }
        // Every output is in place: the commit is done, the rest is cleanup.
        // The swaps are made durable before the journal goes; its removal
        // needs no fsync of its own: a journal that a crash brings back
        // rolls forward to this very state.
        let cleanup = sync_dir_at(&out, "commit:swapped-sync")
            .and_then(|_| std::fs::remove_file(&path).map_err(|e| Error::io(&path, e)));
        drop(file); // releases the lock
        let olds = done
            .iter()
            .filter_map(|(k, how)| old_location(&out, &journal.entries[*k].staged, how));
        let cleanup = olds.fold(cleanup, |result, old| result.and(remove_path(&old)));
        if let Err(error) = cleanup {
            tracing::warn!(
                out = %out.display(),
                error = ?error,
                "the outputs are committed; cleaning up after the commit failed, and the next writer into the directory finishes it"
            );
        }
        Ok(())
    }
}

impl Drop for Commit {
    fn drop(&mut self) {
        // Staged outputs of a run that never committed are never left behind.
        for p in &self.pending {
            let _ = remove_path(&self.out.join(&p.staged));
        }
    }
}

/// Completes every interrupted commit in `dir` (see the module doc): waits for
/// a live committer, rolls a dead one's journal forward (or back, when its
/// staged outputs are gone and nothing was swapped). Returns the targets of
/// the commits it completed. Cheap when there is none (one directory
/// listing).
pub fn settle(dir: &Path) -> Result<Vec<String>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut journals: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(JOURNAL_PREFIX) && name.ends_with(JOURNAL_SUFFIX)
        })
        .map(|e| e.path())
        .collect();
    journals.sort();
    let mut completed = Vec::new();
    for journal in journals {
        completed.extend(roll_forward(dir, &journal)?);
    }
    Ok(completed)
}

/// Where one entry of a dead run's journal stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EntryState {
    /// The target holds the new content; `swapped` when the old content is
    /// evidently aside (at the staged name or an `.old-` name of the run).
    InPlace { swapped: bool },
    /// The staged path holds the new content, intact.
    Staged,
    /// Neither: the staged output is gone.
    Lost,
}

/// Where `entry` of the journal of process `pid` stands in `dir`.
fn entry_state(dir: &Path, entry: &JournalEntry, pid: u32) -> Result<EntryState> {
    let new = Some(entry.digest.as_str());
    let staged = dir.join(&entry.staged);
    let staged_digest = digest(&staged, &entry.digest_of)?;
    if digest(&dir.join(&entry.target), &entry.digest_of)?.as_deref() == new {
        let aside = format!(".{}.old-{pid}-", entry.target);
        let swapped = (std::fs::symlink_metadata(&staged).is_ok()
            && staged_digest.as_deref() != new)
            || std::fs::read_dir(dir)
                .map_err(|e| Error::io(dir, e))?
                .flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with(&aside));
        return Ok(EntryState::InPlace { swapped });
    }
    Ok(if staged_digest.as_deref() == new {
        EntryState::Staged
    } else {
        EntryState::Lost
    })
}

/// Completes the commit of journal `path` (see the module doc); returns the
/// targets it committed (none when it rolled back, or another process
/// finished it meanwhile).
fn roll_forward(dir: &Path, path: &Path) -> Result<Vec<String>> {
    let file = match File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()), // finished meanwhile
        Err(e) => return Err(Error::io(path, e)),
    };
    file.lock().map_err(|e| Error::io(path, e))?;
    // The committer may have finished (and removed the journal) while we waited.
    let same = std::fs::metadata(path).ok().is_some_and(|now| {
        use std::os::unix::fs::MetadataExt;
        file.metadata()
            .is_ok_and(|held| held.ino() == now.ino() && held.dev() == now.dev())
    });
    if !same {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let bad = |reason: String| Error::BadManifest {
        dir: dir.to_path_buf(),
        reason: format!("interrupted commit {}: {reason}", path.display()),
    };
    let journal: Journal =
        serde_json::from_str(&text).map_err(|e| bad(format!("unreadable journal: {e}")))?;
    if journal.format != JOURNAL_FORMAT {
        return Err(bad(format!(
            "format is `{}`, expected `{JOURNAL_FORMAT}`",
            journal.format
        )));
    }
    let states = journal
        .entries
        .iter()
        .map(|entry| entry_state(dir, entry, journal.pid))
        .collect::<Result<Vec<_>>>()?;
    if let Some(lost) = states.iter().position(|s| *s == EntryState::Lost) {
        let entry = &journal.entries[lost];
        if let Some(swapped) = states
            .iter()
            .position(|s| *s == EntryState::InPlace { swapped: true })
        {
            return Err(bad(format!(
                "output `{}` is committed but `{}` is neither committed nor staged intact at {}; restore it from the run that wrote them, or remove the journal and rerun that stage",
                journal.entries[swapped].target,
                entry.target,
                dir.join(&entry.staged).display()
            )));
        }
        // Nothing was swapped: the old content is whole where it was.
        std::fs::remove_file(path).map_err(|e| Error::io(path, e))?;
        sync_dir(dir)?;
        drop(file);
        for (entry, state) in journal.entries.iter().zip(&states) {
            if *state == EntryState::Staged {
                remove_path(&dir.join(&entry.staged))?;
            }
        }
        tracing::warn!(
            journal = %path.display(),
            lost = %entry.target,
            "rolled back an interrupted commit whose staged outputs are gone; the old contents stay"
        );
        return Ok(Vec::new());
    }
    let mut olds = Vec::new();
    for (k, (entry, state)) in journal.entries.iter().zip(&states).enumerate() {
        if let EntryState::InPlace { .. } = state {
            olds.push(dir.join(&entry.staged)); // done; the staged name holds the old, if anything
            continue;
        }
        let how = swap_in(dir, &entry.staged, &entry.target, k + 1)?;
        olds.extend(old_location(dir, &entry.staged, &how));
    }
    sync_dir(dir)?;
    std::fs::remove_file(path).map_err(|e| Error::io(path, e))?;
    sync_dir(dir)?;
    drop(file);
    for old in olds {
        remove_path(&old)?;
    }
    // A fallback swap killed between its renames left `.<target>.old-…`
    // beside a committed target: it is the old content, now unneeded.
    clean_stale(dir)?;
    tracing::warn!(journal = %path.display(), "completed an interrupted commit");
    Ok(journal.entries.into_iter().map(|e| e.target).collect())
}

/// Whether process `pid` (from a hidden name) may still use what it named:
/// this process, or a live one. Anything unparsable counts as alive (left be).
fn alive(pid: &str) -> bool {
    pid.is_empty()
        || !pid.bytes().all(|b| b.is_ascii_digit())
        || pid == std::process::id().to_string()
        || Path::new("/proc").join(pid).exists()
}

/// Removes or restores the hidden leftovers of dead writers in `dir` (see the
/// module doc). Interrupted commits are completed first ([`settle`], whose
/// completed targets it returns).
pub fn clean_stale(dir: &Path) -> Result<Vec<String>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut names: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    if names
        .iter()
        .any(|n| n.starts_with(JOURNAL_PREFIX) && n.ends_with(JOURNAL_SUFFIX))
    {
        return settle(dir);
    }
    for name in names {
        let Some(hidden) = name.strip_prefix('.') else {
            continue;
        };
        let path = dir.join(&name);
        if let Some(rest) = hidden.strip_prefix("commit-")
            && let Some(rest) = rest.strip_suffix(".json.tmp")
        {
            if !alive(rest.split('-').next().unwrap_or_default()) {
                remove_path(&path)?;
            }
            continue;
        }
        for marker in [".tmp-", ".writing-", ".old-"] {
            let Some(at) = hidden.rfind(marker) else {
                continue;
            };
            let target = &hidden[..at];
            let pid = hidden[at + marker.len()..]
                .split('-')
                .next()
                .unwrap_or_default();
            if target.is_empty() || alive(pid) {
                break;
            }
            let in_place = dir.join(target);
            if marker == ".old-" && std::fs::symlink_metadata(&in_place).is_err() {
                std::fs::rename(&path, &in_place).map_err(|e| Error::io(&path, e))?;
                sync_dir(dir)?;
                tracing::warn!(restored = %in_place.display(), "restored a table moved aside by a killed writer");
            } else {
                remove_path(&path)?;
            }
            break;
        }
    }
    Ok(Vec::new())
}
