//! Workers kept warm across stage processes: a pipeline runner's
//! `keep_workers` ([`ServedWorkers`]) starts `N` workers that each serve a
//! Unix socket (`python -u -m embodyflow_gym.worker --serve SOCKET
//! [--adapter NAME]...`, the same frames as over a spawned worker's pipes,
//! one client at a time; it builds its Python's registered adapters and
//! only the `module:function` ones its command line lists, never one a
//! client names) and names their sockets, each with the pid of the process
//! it started to serve it, to every stage process in [`POOL_VAR`]
//! (`PID@SOCKET` entries, colon-separated as `PATH`). A stage's bridge then
//! takes idle served workers before it spawns any ([`attach`]): their
//! environments, built by an earlier stage of the run, are reset instead of
//! built again.
//!
//! Taking one: an exclusive `flock` on `SOCKET.taken` (non-blocking: a
//! worker another stage process holds is skipped; the kernel drops the
//! lock when its holder exits, `kill -9` included), a connection, and a
//! `status` request whose reply gives the worker's Python and the
//! environments it has built. The process at the other end is the
//! socket's peer as the kernel names it (`SO_PEERCRED`), never as a reply
//! names it, and it must be the very process the run started there: a
//! socket served by another user, or by any pid but the one [`POOL_VAR`]
//! gives for it, is not used (a note on stderr says why), so a fault
//! signals only a worker the run itself started, never a pid a peer merely
//! reports. (A served worker that died stays the runner's unreaped child
//! until the runner's next step, so its pid names no other process while
//! the stage that saw it die may still signal it.) A worker of another
//! Python than the stage's `bridge.python` is let go and the stage spawns its own; so does a stage
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
//! let python = std::path::Path::new(".venv/bin/python");
//! // Registered adapters, and `myenvs:make` besides (its `--adapter`).
//! let mut workers = ServedWorkers::start(dir, 2, python, &["myenvs:make".into()]).unwrap();
//! // Every stage process the runner starts gets `POOL_VAR = workers.sockets_var()`
//! // (`PID@SOCKET:PID@SOCKET`).
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
use serde_json::json;

use crate::config::{BridgeConfig, STARTUP_TIMEOUT};
use crate::worker::{Reply, Worker, command};

/// The environment variable naming the sockets of the served workers a
/// stage process may take (colon-separated).
pub const POOL_VAR: &str = "EMBODYFLOW_GYM_POOL";

/// The longest socket path served here: a Unix socket's address holds 108
/// bytes, and the worker binds `SOCKET.<pid>` before renaming it.
pub const MAX_SOCKET_PATH: usize = 96;

/// A served worker a stage may take: its socket and the pid of the process
/// the run started to serve it (the only process a stage accepts at that
/// socket and may signal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServedSocket {
    /// The socket.
    pub socket: PathBuf,
    /// The pid of the worker the run started there.
    pub pid: u32,
}

/// What a served worker says of itself (`status`).
#[derive(Clone, Debug, PartialEq)]
pub struct ServedStatus {
    /// Its socket.
    pub socket: PathBuf,
    /// Its Python (`sys.executable`).
    pub python: PathBuf,
    /// Its pid: the socket's peer, as the kernel says.
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
    /// A directory for the sockets that others could reach or that this
    /// run did not make.
    #[error("{path} {why}")]
    Unsafe {
        /// The directory.
        path: PathBuf,
        /// Why it is not used.
        why: String,
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
    /// The `module:function` adapters on every worker's command line
    /// (`--adapter NAME`): the only ones beyond the registered entry
    /// points that a client may name.
    adapters: Vec<String>,
    workers: Vec<Served>,
    /// A directory made for the sockets (removed on drop) when `dir` is too
    /// long for a socket's address.
    own_dir: bool,
}

/// Makes `dir` for sockets for this user alone
/// ([`embodyflow_core::private_dir`]: created exclusively with mode 0700,
/// never through a symbolic link). With `existing`, a directory already
/// there (the run's own, from an earlier start) is kept if it is this
/// user's and no one else may write into it, and is made 0700; without,
/// `dir` must not exist (a directory in a shared temporary directory that
/// another user made first is never used).
fn private_dir(dir: &Path, existing: bool) -> Result<(), ServeError> {
    use embodyflow_core::private_dir::{IfExists, MADE_BY_SOMEONE_ELSE, PrivateDirError};
    let if_exists = if existing {
        IfExists::Reuse
    } else {
        IfExists::Refuse
    };
    match embodyflow_core::private_dir::private_dir(dir, if_exists) {
        Ok(_) => Ok(()),
        Err(PrivateDirError::Io { path, source }) => Err(ServeError::Io { path, source }),
        Err(PrivateDirError::Unsafe { path, problem }) => {
            let remedy = if problem == MADE_BY_SOMEONE_ELSE {
                " (remove it, or set TMPDIR to a directory of your own)"
            } else {
                ""
            };
            Err(ServeError::Unsafe {
                path,
                why: format!("{problem}: the workers' sockets are not put there{remedy}"),
            })
        }
    }
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
    /// Either is made 0700 and must be this user's; the temporary one must
    /// not exist before (one another user made first is refused).
    ///
    /// `adapters` is the explicit allow-list of `module:function` adapters
    /// the workers build besides their Python's registered ones (each
    /// passed as `--adapter NAME`, also to a worker started again by
    /// [`ServedWorkers::revive`]); a client naming any other is refused.
    pub fn start(
        dir: &Path,
        n: usize,
        python: &Path,
        adapters: &[String],
    ) -> Result<ServedWorkers, ServeError> {
        private_dir(dir, true)?;
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
            private_dir(&short, false)?;
            (short, true)
        };
        let mut workers = ServedWorkers {
            dir,
            python: python.to_path_buf(),
            adapters: adapters.to_vec(),
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
        let mut command = command(&self.python);
        command.arg("--serve").arg(socket);
        for adapter in &self.adapters {
            command.arg("--adapter").arg(adapter);
        }
        command
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

    /// The value of [`POOL_VAR`] that names their sockets, each with the
    /// pid of its worker (`PID@SOCKET`, colon-separated).
    pub fn sockets_var(&self) -> std::ffi::OsString {
        let entries = self.sockets().into_iter().map(|s| {
            let mut entry = std::ffi::OsString::from(format!("{}@", s.pid));
            entry.push(s.socket);
            entry
        });
        std::env::join_paths(entries).expect("socket paths are made without colons")
    }

    /// Their sockets, each with the pid of the worker started there.
    pub fn sockets(&self) -> Vec<ServedSocket> {
        self.workers
            .iter()
            .map(|w| ServedSocket {
                socket: w.socket.clone(),
                pid: w.child.id(),
            })
            .collect()
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
        self.sockets()
            .iter()
            .map(|w| match take(w, 0, timeout) {
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

/// Takes the served worker at `served.socket` as worker `index` of a
/// stage: its `taken` lock, a connection to the process the run started
/// there (`served.pid`, checked against the kernel's peer credentials) and
/// its `status` (within `timeout`); `None` when another process holds it,
/// why when it cannot be reached or is served by any other process.
fn take(
    served: &ServedSocket,
    index: usize,
    timeout: Duration,
) -> Result<Option<(Worker, ServedStatus)>, String> {
    let socket = served.socket.as_path();
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
    // The process at the other end, as the kernel says (never as a reply
    // says): of this user and the very process the run started there, else
    // refused; the only pid a fault may signal.
    let peer = rustix::net::sockopt::socket_peercred(&stream)
        .map_err(|e| format!("{}: its peer's credentials: {e}", socket.display()))?;
    let me = rustix::process::geteuid();
    if peer.uid != me {
        return Err(format!(
            "{}: served by uid {}, not this user (uid {}): not used",
            socket.display(),
            peer.uid.as_raw(),
            me.as_raw()
        ));
    }
    let pid = peer.pid.as_raw_nonzero().get();
    if u32::try_from(pid).ok() != Some(served.pid) {
        return Err(format!(
            "{}: served by pid {pid}, not by the worker this run started there (pid {}): not used",
            socket.display(),
            served.pid
        ));
    }
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
        pid: served.pid,
        builds: field("builds")?.as_u64().unwrap_or(0),
    };
    // Whether it leads its process group, as the kernel says.
    let leads = rustix::process::getpgid(Some(peer.pid)).ok() == Some(peer.pid);
    worker.served_as(pid, leads);
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

/// The served workers [`POOL_VAR`] names (none when it is unset); an
/// entry that is not `PID@SOCKET` is left out, a note on stderr naming it
/// (a socket without the pid of the worker the run started there is never
/// used).
pub fn from_env() -> Vec<ServedSocket> {
    std::env::var_os(POOL_VAR)
        .map(|list| parse_pool(&list))
        .unwrap_or_default()
}

/// The entries of a [`POOL_VAR`] value (see [`from_env`]).
fn parse_pool(list: &std::ffi::OsStr) -> Vec<ServedSocket> {
    use std::os::unix::ffi::OsStrExt as _;
    std::env::split_paths(list)
        .filter(|p| !p.as_os_str().is_empty())
        .filter_map(|entry| {
            let bytes = entry.as_os_str().as_bytes();
            let parsed = bytes.iter().position(|&b| b == b'@').and_then(|at| {
                let pid = std::str::from_utf8(&bytes[..at]).ok()?;
                let pid = pid.parse::<u32>().ok().filter(|&p| p > 0)?;
                let socket = PathBuf::from(std::ffi::OsStr::from_bytes(&bytes[at + 1..]));
                (!socket.as_os_str().is_empty()).then_some(ServedSocket { socket, pid })
            });
            if parsed.is_none() {
                eprintln!(
                    "note: {POOL_VAR} entry `{}` is not PID@SOCKET (the pid of the worker the run started at the socket): not used",
                    entry.display()
                );
            }
            parsed
        })
        .collect()
}

/// An idle one of the served workers at `sockets` that runs
/// `config.python`, as worker `index` of a stage's pool; `None` when none
/// is idle, reachable and of that Python (a note on stderr says why for
/// each that cannot be reached, and for one of another Python).
pub(crate) fn attach(
    config: &BridgeConfig,
    sockets: &[ServedSocket],
    index: usize,
) -> Option<Worker> {
    for served in sockets {
        let socket = &served.socket;
        match take(served, index, config.timeout) {
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

    /// Waits (at most 20 s) until `path` exists.
    fn wait_for(path: &Path) {
        let until = Instant::now() + Duration::from_secs(20);
        while !path.exists() {
            assert!(Instant::now() < until, "{} never appeared", path.display());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether `child` still runs after up to `within`.
    fn alive_after(child: &mut Child, within: Duration) -> bool {
        let until = Instant::now() + within;
        loop {
            if child.try_wait().unwrap().is_some() {
                return false;
            }
            if Instant::now() >= until {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_socket_directory_someone_made_first_is_refused_and_a_new_one_is_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let taken = tmp.path().join("embodyflow-workers-1-0");
        std::fs::create_dir(&taken).unwrap();
        std::fs::set_permissions(&taken, std::fs::Permissions::from_mode(0o777)).unwrap();
        let message = private_dir(&taken, false).unwrap_err().to_string();
        assert!(
            message.contains(&taken.display().to_string())
                && message.contains("exists already, made by someone other than this run"),
            "{message}"
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&taken), 0o777, "left as it was, and unused");

        let fresh = tmp.path().join("fresh");
        private_dir(&fresh, false).unwrap();
        assert_eq!(mode(&fresh), 0o700);
        // The run's own directory (OUT/_runner/workers) is made 0700 too,
        // and one of this user's found open is closed.
        let own = tmp.path().join("run/_runner/workers");
        private_dir(&own, true).unwrap();
        assert_eq!(mode(&own), 0o700);
        std::fs::set_permissions(&own, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&own, true).unwrap();
        assert_eq!(mode(&own), 0o700);
    }

    /// `sleep 60` in a process group of its own.
    fn bystander() -> Child {
        use std::os::unix::process::CommandExt as _;
        std::process::Command::new("sleep")
            .arg("60")
            .process_group(0)
            .spawn()
            .unwrap()
    }

    /// A fake served worker at `socket` (in a process group of its own)
    /// whose status names `reply_pid` (and says it leads its group), then
    /// waits (also when its client hangs up); returns once it listens.
    fn fake_worker(socket: &Path, reply_pid: u32) -> Child {
        use std::os::unix::process::CommandExt as _;
        let script = format!(
            r#"
import os, socket, time
from embodyflow_gym import protocol
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("{sock}.tmp"); s.listen(4); os.rename("{sock}.tmp", "{sock}")
conn, _ = s.accept()
try:
    header, _ = protocol.read_frame(conn.makefile("rb"))
    out = conn.makefile("wb")
    protocol.write_frame(out, {{"id": header["id"], "ok": True, "python": "x", "pid": {reply_pid}, "group": True, "builds": 0}})
    out.flush()
except Exception:
    pass  # a client that hung up: wait all the same
time.sleep(60)
"#,
            sock = socket.display(),
        );
        let fake = std::process::Command::new("python3")
            .args(["-c", &script])
            .env("PYTHONPATH", crate::worker::PYTHON_DIR)
            .process_group(0)
            .spawn()
            .unwrap();
        wait_for(socket);
        fake
    }

    fn reap(mut child: Child) {
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_fault_signals_the_sockets_peer_never_a_pid_its_reply_names() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("fake.sock");
        let mut bystander = bystander();
        let mut fake = fake_worker(&socket, bystander.id());
        // The run started `fake` at the socket.
        let served = ServedSocket {
            socket: socket.clone(),
            pid: fake.id(),
        };
        let (mut worker, status) = take(&served, 0, Duration::from_secs(20)).unwrap().unwrap();
        assert_eq!(status.pid, fake.id(), "the peer, not the reply's pid");
        worker.kill();
        assert!(
            alive_after(&mut bystander, Duration::from_millis(500)),
            "the pid a reply named was signalled"
        );
        assert!(
            !alive_after(&mut fake, Duration::from_secs(5)),
            "the socket's peer was not killed"
        );
        reap(bystander);
    }

    #[test]
    fn a_socket_served_by_a_process_the_run_did_not_start_is_not_taken_nor_signalled() {
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("impostor.sock");
        // The run started `ours` for the socket; another process serves it.
        let mut ours = bystander();
        let mut impostor = fake_worker(&socket, ours.id());
        let served = ServedSocket {
            socket: socket.clone(),
            pid: ours.id(),
        };
        let why = take(&served, 0, Duration::from_secs(20))
            .err()
            .expect("refused");
        assert_eq!(
            why,
            format!(
                "{}: served by pid {}, not by the worker this run started there (pid {}): not used",
                socket.display(),
                impostor.id(),
                ours.id()
            )
        );
        // A stage's pool passes it by (and would spawn its own worker).
        let config = BridgeConfig {
            timeout: Duration::from_secs(20),
            ..BridgeConfig::default()
        };
        assert!(attach(&config, std::slice::from_ref(&served), 0).is_none());
        assert!(
            alive_after(&mut impostor, Duration::from_millis(500))
                && alive_after(&mut ours, Duration::from_millis(10)),
            "a process was signalled"
        );
        reap(impostor);
        reap(ours);
    }

    #[test]
    fn the_pool_variable_names_each_socket_with_the_pid_the_run_started_there() {
        let entry = |pid: u32, socket: &str| ServedSocket {
            socket: PathBuf::from(socket),
            pid,
        };
        let parsed = parse_pool(std::ffi::OsStr::new(
            "4242@/run/w/0.sock:/run/w/1.sock:x@/run/w/2.sock:0@/run/w/3.sock:7@::12@/run/a@b.sock",
        ));
        assert_eq!(
            parsed,
            [entry(4242, "/run/w/0.sock"), entry(12, "/run/a@b.sock")]
        );
    }

    #[test]
    fn a_served_worker_runs_no_adapter_a_client_names_and_its_socket_is_the_users_only() {
        // Started with `--adapter allowed:make`: that one it builds, no
        // other `module:function` a client names.
        use std::os::unix::fs::PermissionsExt as _;
        use std::os::unix::process::CommandExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let socket = tmp.path().join("w.sock");
        let marker = tmp.path().join("imported");
        std::fs::write(
            tmp.path().join("marked.py"),
            format!(
                "open({:?}, 'w').close()\ndef make(env_id, kwargs, seed):\n    raise SystemExit\n",
                marker.display().to_string()
            ),
        )
        .unwrap();
        std::fs::write(
            tmp.path().join("allowed.py"),
            "from embodyflow_gym.adapters.faulty import make\n",
        )
        .unwrap();
        let python = BridgeConfig::python(None);
        let mut served = std::process::Command::new("sh")
            .args([
                "-c",
                "umask 000; exec \"$0\" -u -m embodyflow_gym.worker --serve \"$1\" --adapter allowed:make",
            ])
            .arg(&python)
            .arg(&socket)
            .env(
                "PYTHONPATH",
                format!("{}:{}", crate::worker::PYTHON_DIR, tmp.path().display()),
            )
            .process_group(0)
            .spawn()
            .unwrap();
        wait_for(&socket);
        let mode = std::fs::symlink_metadata(&socket)
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600, "under umask 000");
        let served_socket = ServedSocket {
            socket: socket.clone(),
            pid: served.id(),
        };
        let (mut worker, _) = take(&served_socket, 0, Duration::from_secs(20))
            .unwrap()
            .unwrap();
        for (adapter, kwargs, says) in [
            (
                "timeit:timeit",
                json!({}),
                "does not serve adapter `timeit:timeit`",
            ),
            (
                "marked:make",
                json!({}),
                "does not serve adapter `marked:make`: it serves the registered adapters and ['allowed:make']",
            ),
            (
                "faulty",
                json!("a string"),
                "`kwargs` must be a JSON object",
            ),
        ] {
            let hello = json!({"op": "hello", "adapter": adapter, "env_id": "Counter-v0",
                "kwargs": kwargs, "seed": 0, "max_steps": 5});
            match worker.request(&hello, Duration::from_secs(20)) {
                Ok(Reply::Refused { bad_input, message }) => {
                    assert!(bad_input && message.contains(says), "{adapter}: {message}");
                }
                Ok(Reply::Done(frame)) => panic!("{adapter}: answered {:?}", frame.header),
                Err(fault) => panic!("{adapter}: {fault}"),
            }
        }
        assert!(!marker.exists(), "a module a client named was imported");
        let hello = json!({"op": "hello", "adapter": "allowed:make", "env_id": "Counter-v0",
            "kwargs": {}, "seed": 0, "max_steps": 5});
        match worker.request(&hello, Duration::from_secs(20)) {
            Ok(Reply::Done(frame)) => assert!(frame.header.contains_key("height"), "{frame:?}"),
            other => panic!("allowed:make, on the command line: {other:?}"),
        }
        drop(worker);
        let _ = served.kill();
        let _ = served.wait();
        let _ = kill_process_group(Pid::from_child(&served), Signal::KILL);
    }
}
