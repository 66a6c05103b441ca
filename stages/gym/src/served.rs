//! Workers kept warm across stage processes: a pipeline runner's
//! `keep_workers` ([`ServedWorkers`]) starts `N` workers that each serve a
//! Unix socket (`python -u -m embodyflow_gym.worker --serve SOCKET`, the
//! same frames as over a spawned worker's pipes, one client at a time) and
//! names their sockets to every stage process in [`POOL_VAR`]
//! (colon-separated, as `PATH`). A stage's bridge then takes idle served
//! workers before it spawns any ([`attach`]): their environments, built by
//! an earlier stage of the run, are reset instead of built again.
//!
//! Taking one: an exclusive `flock` on `SOCKET.taken` (non-blocking: a
//! worker another stage process holds is skipped; the kernel drops the
//! lock when its holder exits, `kill -9` included), a connection, and a
//! `status` request whose reply gives the worker's Python, pid and the
//! environments it has built. A worker of another Python than the stage's
//! `bridge.python` is let go and the stage spawns its own; so does a stage
//! that needs more workers than are idle. A socket that is missing or
//! refuses the connection (its worker died, the variable names a wrong
//! path) is not an error: a note on stderr names it and the stage spawns a
//! worker of its own, so the run's results are the same, only slower.
//!
//! Faults are a spawned worker's ([`crate::episodes`]): a served worker
//! that crashes, hangs or sends a malformed frame is killed with its
//! process group and replaced, for the rest of the stage, by another idle
//! served worker or a spawned one; [`ServedWorkers::revive`] starts a new
//! one at the socket before the runner's next step. Letting a worker go
//! that awaits no reply (the stage ends) only closes the connection.
//!
//! ```no_run
//! use embodyflow_gym::served::{POOL_VAR, ServedWorkers};
//! let dir = std::path::Path::new("runs/demo/_runner/workers");
//! let mut workers = ServedWorkers::start(dir, 2, std::path::Path::new(".venv/bin/python")).unwrap();
//! // Every stage process the runner starts gets `POOL_VAR = workers.sockets_var()`.
//! std::process::Command::new("target/release/evaluate")
//!     .env(POOL_VAR, workers.sockets_var())
//!     .status()
//!     .unwrap();
//! workers.revive().unwrap(); // before the next step: a worker that died is started again
//! println!("{:?}", workers.status(std::time::Duration::from_secs(5)));
//! ```

use std::fs::{File, OpenOptions};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rustix::fs::{FlockOperation, flock};
use rustix::process::{Pid, Signal, kill_process_group};
use serde_json::{Value, json};

use crate::config::{BridgeConfig, STARTUP_TIMEOUT};
use crate::worker::{Reply, Worker, command};

/// The environment variable naming the sockets of the served workers a
/// stage process may take (colon-separated).
pub const POOL_VAR: &str = "EMBODYFLOW_GYM_POOL";

/// The longest socket path served here: a Unix socket's address holds 108
/// bytes, and the worker binds `SOCKET.<pid>` before renaming it.
pub const MAX_SOCKET_PATH: usize = 96;

/// What a served worker says of itself (`status`).
#[derive(Clone, Debug, PartialEq)]
pub struct ServedStatus {
    /// Its socket.
    pub socket: PathBuf,
    /// Its Python (`sys.executable`).
    pub python: PathBuf,
    /// Its pid.
    pub pid: u32,
    /// Environments it has built since it started.
    pub builds: u64,
}

/// Why served workers could not be started.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A file of theirs could not be made, or the Python not started.
    #[error("{path}: {source}")]
    Io {
        /// The file or the interpreter.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A worker exited or did not listen on its socket in time.
    #[error("the served worker at {socket} {what} (python `{python}`; its output is in {log})")]
    Start {
        /// Its socket.
        socket: PathBuf,
        /// What happened.
        what: String,
        /// The interpreter.
        python: PathBuf,
        /// Its log.
        log: PathBuf,
    },
}

/// One served worker: its socket and its process.
struct Served {
    socket: PathBuf,
    child: Child,
}

/// `N` workers serving sockets in a directory, killed (with their process
/// groups) when dropped.
pub struct ServedWorkers {
    dir: PathBuf,
    python: PathBuf,
    workers: Vec<Served>,
    /// A directory made for the sockets (removed on drop) when `dir` is too
    /// long for a socket's address.
    own_dir: bool,
}

/// The lock file that marks `socket`'s worker taken.
fn taken_path(socket: &Path) -> PathBuf {
    let mut path = socket.as_os_str().to_owned();
    path.push(".taken");
    PathBuf::from(path)
}

impl ServedWorkers {
    /// Starts `n` workers with `python`, serving `dir/<i>.sock` (their
    /// output in `dir/<i>.log`), and waits until each listens. When `dir`
    /// is too long for a socket's address ([`MAX_SOCKET_PATH`]) the sockets
    /// go to a new directory under the system's temporary one instead.
    pub fn start(dir: &Path, n: usize, python: &Path) -> Result<ServedWorkers, ServeError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ServeError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let probe = dir.join(format!("{}.sock", n.saturating_sub(1)));
        let (dir, own_dir) = if probe.as_os_str().len() <= MAX_SOCKET_PATH {
            (dir.to_path_buf(), false)
        } else {
            static MADE: AtomicUsize = AtomicUsize::new(0);
            let short = std::env::temp_dir().join(format!(
                "embodyflow-workers-{}-{}",
                std::process::id(),
                MADE.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&short);
            std::fs::create_dir_all(&short).map_err(io(&short))?;
            (short, true)
        };
        let mut workers = ServedWorkers {
            dir,
            python: python.to_path_buf(),
            workers: Vec::with_capacity(n),
            own_dir,
        };
        for i in 0..n {
            let socket = workers.dir.join(format!("{i}.sock"));
            let child = workers.serve(&socket)?;
            workers.workers.push(Served { socket, child });
        }
        for i in 0..n {
            workers.wait_listening(i)?;
        }
        Ok(workers)
    }

    /// Starts a worker serving `socket` (a stale socket file is removed
    /// first, so that only the new worker's counts as listening).
    fn serve(&self, socket: &Path) -> Result<Child, ServeError> {
        let _ = std::fs::remove_file(socket);
        let log = socket.with_extension("log");
        let out = File::create(&log).map_err(|source| ServeError::Io {
            path: log.clone(),
            source,
        })?;
        let err = out.try_clone().map_err(|source| ServeError::Io {
            path: log.clone(),
            source,
        })?;
        command(&self.python)
            .arg("--serve")
            .arg(socket)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|source| ServeError::Io {
                path: self.python.clone(),
                source,
            })
    }

    /// Waits until worker `i`'s socket is in place (it appears once the
    /// worker listens), at most [`STARTUP_TIMEOUT`].
    fn wait_listening(&mut self, i: usize) -> Result<(), ServeError> {
        let until = Instant::now() + STARTUP_TIMEOUT;
        let served = &mut self.workers[i];
        let failed = |what: String| ServeError::Start {
            socket: served.socket.clone(),
            what,
            python: self.python.clone(),
            log: served.socket.with_extension("log"),
        };
        loop {
            if served.socket.exists() {
                return Ok(());
            }
            if let Ok(Some(status)) = served.child.try_wait() {
                return Err(failed(format!("exited ({status}) before it listened")));
            }
            if Instant::now() >= until {
                return Err(failed(format!(
                    "did not listen within {} s",
                    STARTUP_TIMEOUT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Starts a new worker at the socket of each that has exited (a stage
    /// killed it after a fault); returns how many.
    pub fn revive(&mut self) -> Result<usize, ServeError> {
        let mut revived = 0;
        for i in 0..self.workers.len() {
            if matches!(self.workers[i].child.try_wait(), Ok(None)) {
                continue;
            }
            let socket = self.workers[i].socket.clone();
            self.workers[i].child = self.serve(&socket)?;
            self.wait_listening(i)?;
            revived += 1;
        }
        Ok(revived)
    }

    /// The value of [`POOL_VAR`] that names their sockets.
    pub fn sockets_var(&self) -> std::ffi::OsString {
        std::env::join_paths(self.workers.iter().map(|w| &w.socket))
            .expect("socket paths are made without colons")
    }

    /// Their sockets.
    pub fn sockets(&self) -> Vec<PathBuf> {
        self.workers.iter().map(|w| w.socket.clone()).collect()
    }

    /// Their pids, in order.
    pub fn pids(&self) -> Vec<u32> {
        self.workers.iter().map(|w| w.child.id()).collect()
    }

    /// Each worker's pid and the environments it has built, asked over its
    /// socket ([`ServedWorkers::status`]); why, for the first that is taken
    /// or does not answer within `timeout`.
    pub fn builds(&self, timeout: Duration) -> Result<Vec<(u32, u64)>, String> {
        self.pids()
            .into_iter()
            .zip(self.status(timeout))
            .map(|(pid, status)| Ok((pid, status?.builds)))
            .collect()
    }

    /// What each says of itself, asked over its socket (each reply within
    /// `timeout`); a worker that is taken or does not answer gives why.
    pub fn status(&self, timeout: Duration) -> Vec<Result<ServedStatus, String>> {
        self.workers
            .iter()
            .map(|w| match take(&w.socket, 0, timeout) {
                Ok(Some((_, status))) => Ok(status),
                Ok(None) => Err(format!("{} is taken", w.socket.display())),
                Err(why) => Err(why),
            })
            .collect()
    }
}

impl Drop for ServedWorkers {
    /// Kills every worker's process group and reaps the worker.
    fn drop(&mut self) {
        for served in &mut self.workers {
            let _ = kill_process_group(Pid::from_child(&served.child), Signal::KILL);
            let _ = served.child.kill();
            let _ = served.child.wait();
            let _ = std::fs::remove_file(&served.socket);
            let _ = std::fs::remove_file(taken_path(&served.socket));
        }
        if self.own_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Takes the served worker at `socket` as worker `index` of a stage: its
/// `taken` lock, a connection and its `status` (within `timeout`); `None`
/// when another process holds it, why when it cannot be reached.
fn take(
    socket: &Path,
    index: usize,
    timeout: Duration,
) -> Result<Option<(Worker, ServedStatus)>, String> {
    let lock = taken_path(socket);
    let taken = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock)
        .map_err(|e| format!("{}: {e}", lock.display()))?;
    match flock(&taken, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", lock.display())),
    }
    let stream = UnixStream::connect(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    let mut worker = Worker::over(index, stream, socket, taken)
        .map_err(|e| format!("{}: {e}", socket.display()))?;
    let header = match worker.request(&json!({"op": "status"}), timeout) {
        Ok(Reply::Done(frame)) => frame.header,
        Ok(Reply::Refused { message, .. }) => {
            return Err(format!("{}: status refused: {message}", socket.display()));
        }
        Err(fault) => return Err(format!("{}: {fault}", socket.display())),
    };
    let field = |key: &str| {
        header
            .get(key)
            .ok_or_else(|| format!("{}: a status reply without `{key}`", socket.display()))
    };
    let status = ServedStatus {
        socket: socket.to_path_buf(),
        python: PathBuf::from(field("python")?.as_str().unwrap_or_default()),
        pid: field("pid")?
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .unwrap_or(0),
        builds: field("builds")?.as_u64().unwrap_or(0),
    };
    let leads = header.get("group").and_then(Value::as_bool) == Some(true);
    worker.served_as(status.pid as i32, leads);
    Ok(Some((worker, status)))
}

/// Whether `a` and `b` name the same interpreter: the same file name in
/// the same directory once its links are resolved (a venv's `bin/python`
/// links to the system's, so the file itself is not resolved: two venvs
/// of one Python differ by their packages).
fn same_python(a: &Path, b: &Path) -> bool {
    let resolved = |p: &Path| {
        let dir = p.parent()?.canonicalize().ok()?;
        Some(dir.join(p.file_name()?))
    };
    a == b || resolved(a).is_some_and(|r| Some(r) == resolved(b))
}

/// The sockets [`POOL_VAR`] names (none when it is unset).
pub fn from_env() -> Vec<PathBuf> {
    std::env::var_os(POOL_VAR)
        .map(|list| {
            std::env::split_paths(&list)
                .filter(|p| !p.as_os_str().is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// An idle one of the served workers at `sockets` that runs
/// `config.python`, as worker `index` of a stage's pool; `None` when none
/// is idle, reachable and of that Python (a note on stderr says why for
/// each that cannot be reached, and for one of another Python).
pub(crate) fn attach(config: &BridgeConfig, sockets: &[PathBuf], index: usize) -> Option<Worker> {
    for socket in sockets {
        match take(socket, index, config.timeout) {
            Ok(Some((worker, status))) if same_python(&status.python, &config.python) => {
                return Some(worker);
            }
            Ok(Some((_, status))) => {
                eprintln!(
                    "note: the served worker at {} runs {}, this stage's bridge {}: it starts its own workers",
                    socket.display(),
                    status.python.display(),
                    config.python.display()
                );
                return None;
            }
            Ok(None) => {}
            Err(why) => eprintln!(
                "note: the served worker at {} cannot be reached ({why}); this stage starts a worker of its own",
                socket.display()
            ),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_python_is_its_resolved_directory_and_its_own_name() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("venv/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(dir.path().join("other/bin")).unwrap();
        std::os::unix::fs::symlink(dir.path().join("venv"), dir.path().join("link")).unwrap();
        let python = bin.join("python");
        assert!(same_python(&python, &dir.path().join("link/bin/python")));
        assert!(same_python(
            &python,
            &dir.path().join("venv/bin/../bin/python")
        ));
        assert!(!same_python(&python, &bin.join("python3")));
        assert!(!same_python(&python, &dir.path().join("other/bin/python")));
    }
}
