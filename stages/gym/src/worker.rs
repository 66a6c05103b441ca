//! One Python worker process (`<python> -u -m embodyflow_gym.worker`) and
//! its pipes, both non-blocking and served on the driver's own thread: a
//! send queues the request's bytes and writes what the pipe takes; a
//! receive `poll`s both pipes until the reply's last byte is in, writing
//! the rest of the request as the worker reads it, so neither blocks the
//! driver and every receive has a deadline. (Serving the pipes from the
//! calling thread, not from a writer and a reader thread, saves two thread
//! wake-ups per request: at K = 1 a request carries a single step per
//! episode, and those hand-offs were a visible share of its cost.)
//!
//! Each request carries an id (`"id"`, counting from 0 per worker) that
//! its reply and progress frames echo: a frame with another id (a reply
//! sent twice, a frame too many) is malformed, never taken for the answer
//! to a later request.
//!
//! What can go wrong with a worker is a [`Fault`]: it exited (crashed), it
//! did not answer within the timeout (hung), or it sent bytes that are not
//! a frame of the protocol, or a frame that does not answer the request
//! (malformed). The caller kills it ([`Worker::kill`], also on drop) and
//! starts another. The worker runs in its own process group, and a kill
//! ends the whole group: an environment's own processes (a simulator's
//! server) die with it. The worker itself exits when its stdin ends or its
//! parent process changes (then killing its group), so none outlives the
//! driver.
//!
//! Long requests (a reset that builds many environments, an expert episode)
//! send progress frames (`{"progress": true}`) while they work: a patient
//! receive ([`Worker::receive_patiently`]) counts a worker as hung only
//! after a whole timeout without any frame, so a loaded machine slows such
//! a request down without failing it, and a worker that stopped is still
//! found within one timeout. Progress frames never count as replies. A
//! worker that has sent no frame yet is starting (the Python imports): its
//! first frame may take a longer start-up patience, and so may the next
//! frame after a progress frame that says the worker is building an
//! environment (`{"progress": true, "building": true}`: a hello's, a
//! reset's or an expert episode's; LIBERO's takes many seconds, a minute on
//! a loaded machine).
//!
//! A worker may also be one a pipeline runner keeps warm across its steps
//! ([`crate::served`]), reached over its Unix socket ([`Worker::over`])
//! with the same frames: letting it go ([`Worker::kill`] when it is idle)
//! closes the connection, its environments stay built for the next stage;
//! a fault kills its process group as a spawned worker's.
//!
//! ```no_run
//! use embodyflow_gym::worker::Worker;
//! use std::time::Duration;
//! let mut worker = Worker::spawn(std::path::Path::new(".venv/bin/python"), 0).unwrap();
//! worker.send(&serde_json::json!({"op": "close"}));
//! let reply = worker.receive(Duration::from_secs(5)).unwrap();
//! ```

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
use rustix::process::{Pid, Signal, kill_process_group};
use serde_json::Value;

use crate::protocol::{self, Frame, FrameBuffer, FrameError, MAX_FRAME};

/// The directory that holds the `embodyflow_gym` Python package.
pub const PYTHON_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/python");

/// What went wrong with a worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// It exited or closed its pipe (the exit status when known).
    Crashed(String),
    /// No reply within the timeout.
    Hung(Duration),
    /// Bytes that are not a frame of the protocol, or a reply that does
    /// not answer the request.
    Malformed(String),
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Crashed(status) => write!(f, "crashed ({status})"),
            Fault::Hung(timeout) => {
                write!(f, "hung (no reply within {:.1} s)", timeout.as_secs_f64())
            }
            Fault::Malformed(what) => write!(f, "sent a malformed frame ({what})"),
        }
    }
}

/// A worker's answer to a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// It did what was asked.
    Done(Frame),
    /// It refused: `bad_input` when the request named something that does
    /// not exist or cannot be installed-free (an env id, an adapter, a
    /// missing package), else its own failure.
    Refused {
        /// Whether the requester is at fault.
        bad_input: bool,
        /// Its message.
        message: String,
    },
}

/// The process behind a [`Worker`].
enum Process {
    /// Started by this process, talked to over its stdin and stdout.
    Spawned(Child),
    /// A served worker ([`crate::served`]) reached over its socket.
    Served {
        /// Its pid: the socket's peer, as the kernel says (never a reply's),
        /// once checked to be the process the run started at the socket
        /// ([`crate::served`]); 0 (never signalled) until then.
        pid: i32,
        /// Whether it leads its process group (a kill then ends the group).
        group: bool,
        /// Its socket.
        socket: PathBuf,
        /// The lock that marks it taken while this connection lasts.
        _taken: File,
        /// Whether it was killed already.
        killed: bool,
    },
}

/// A running worker process.
pub struct Worker {
    index: usize,
    process: Process,
    /// Where requests go (non-blocking): its stdin or its socket; `None`
    /// once it is closed or broken.
    stdin: Option<File>,
    /// Where replies come from (non-blocking): its stdout or its socket.
    stdout: File,
    /// Request bytes the pipe has not taken yet.
    unsent: Vec<u8>,
    /// Reply bytes read and not yet a whole frame.
    replies: FrameBuffer,
    /// The id the next request gets.
    next_id: u64,
    /// The request awaiting its reply: its id and when it was sent.
    awaiting: Option<(u64, Instant)>,
    /// Whether it has sent a frame (it is up).
    started: bool,
}

/// Sets `O_NONBLOCK` on a pipe end.
fn non_blocking(fd: impl AsFd) -> std::io::Result<()> {
    let flags = fcntl_getfl(&fd)?;
    fcntl_setfl(&fd, flags | OFlags::NONBLOCK)?;
    Ok(())
}

/// The worker's command line (`<python> -u -m embodyflow_gym.worker`),
/// the package directory first on its `PYTHONPATH`, in a process group of
/// its own.
pub(crate) fn command(python: &Path) -> Command {
    let mut path = std::ffi::OsString::from(PYTHON_DIR);
    if let Some(old) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut command = Command::new(python);
    command
        .args(["-u", "-m", "embodyflow_gym.worker"])
        .env("PYTHONPATH", path)
        .process_group(0);
    die_with_parent(&mut command);
    command
}

/// Sets `PR_SET_PDEATHSIG` = SIGKILL in the worker before it runs Python,
/// so that it dies with the process (the thread) that started it even when
/// it is stuck in native code, where its own watch of its parent (a Python
/// thread) cannot run; then checks that its parent is still the one that
/// forked it: had that died before the `prctl`, nothing would signal the
/// worker, so the spawn fails instead.
#[allow(unsafe_code)]
fn die_with_parent(command: &mut Command) {
    use rustix::process::{getpid, getppid, set_parent_process_death_signal};
    let parent = getpid();
    // SAFETY: the closure runs in the forked child before `exec`, where only
    // async-signal-safe work is allowed: two system calls (prctl, getppid)
    // through rustix, and an error from an errno or an `ErrorKind`; it
    // allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            set_parent_process_death_signal(Some(Signal::KILL))?;
            if getppid() != Some(parent) {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            Ok(())
        });
    }
}

impl Worker {
    /// Starts worker `index` (its name in messages) with `python`, the
    /// package directory on its `PYTHONPATH`, in a process group of its
    /// own; stderr passes through.
    pub fn spawn(python: &Path, index: usize) -> std::io::Result<Worker> {
        let mut child = command(python)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = OwnedFd::from(child.stdin.take().expect("piped stdin"));
        let stdout = OwnedFd::from(child.stdout.take().expect("piped stdout"));
        Worker::new(index, Process::Spawned(child), stdin.into(), stdout.into())
    }

    /// Worker `index` over a connection to a served worker's `socket`
    /// (`taken`: the lock that marks it taken, held while the worker
    /// lives), with the pid and process-group leadership its `status`
    /// reply gave.
    pub(crate) fn over(
        index: usize,
        stream: UnixStream,
        socket: &Path,
        taken: File,
    ) -> std::io::Result<Worker> {
        let reader = OwnedFd::from(stream.try_clone()?);
        let process = Process::Served {
            pid: 0,
            group: false,
            socket: socket.to_path_buf(),
            _taken: taken,
            killed: false,
        };
        Worker::new(index, process, OwnedFd::from(stream).into(), reader.into())
    }

    fn new(index: usize, process: Process, stdin: File, stdout: File) -> std::io::Result<Worker> {
        non_blocking(&stdin)?;
        non_blocking(&stdout)?;
        Ok(Worker {
            index,
            process,
            stdin: Some(stdin),
            stdout,
            unsent: Vec::new(),
            replies: FrameBuffer::new(MAX_FRAME),
            next_id: 0,
            awaiting: None,
            started: false,
        })
    }

    /// Records the pid of a served worker (its socket's peer, as the
    /// kernel names it) and whether it leads its process group.
    pub(crate) fn served_as(&mut self, served_pid: i32, leads_group: bool) {
        if let Process::Served { pid, group, .. } = &mut self.process {
            (*pid, *group) = (served_pid, leads_group);
        }
    }

    /// Whether it is a served worker.
    pub fn served(&self) -> bool {
        matches!(self.process, Process::Served { .. })
    }

    /// Whether a request awaits its reply.
    pub fn busy(&self) -> bool {
        self.awaiting.is_some()
    }

    /// `worker <index> (pid <pid>)`, `worker <index> (pid <pid>, served at
    /// <socket>)`.
    pub fn name(&self) -> String {
        match &self.process {
            Process::Spawned(child) => format!("worker {} (pid {})", self.index, child.id()),
            Process::Served { pid, socket, .. } => format!(
                "worker {} (pid {pid}, served at {})",
                self.index,
                socket.display()
            ),
        }
    }

    /// Sends a request (`header`, a JSON object, with the request's id
    /// added): writes what the pipe takes now and keeps the rest for the
    /// next receive; never blocks (a worker that is gone shows at the next
    /// receive). One request at a time: its reply is received before the
    /// next is sent.
    pub fn send(&mut self, header: &Value) {
        debug_assert!(self.awaiting.is_none(), "a request awaits its reply");
        let id = self.next_id;
        self.next_id += 1;
        let mut header = header.clone();
        header["id"] = id.into();
        self.unsent
            .extend_from_slice(&protocol::encode_frame(&header, &[]));
        self.awaiting = Some((id, Instant::now()));
        self.write_unsent();
    }

    /// Writes queued request bytes until the pipe is full; a broken pipe
    /// (the worker exited) drops them.
    fn write_unsent(&mut self) {
        let Some(stdin) = &mut self.stdin else {
            self.unsent.clear();
            return;
        };
        while !self.unsent.is_empty() {
            match stdin.write(&self.unsent) {
                Ok(n) => {
                    self.unsent.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(_) => break,
            }
        }
        if !self.unsent.is_empty() {
            self.stdin = None;
            self.unsent.clear();
        }
    }

    /// The reply to the request sent last, waiting at most `timeout` from
    /// its send (progress frames do not move that deadline).
    pub fn receive(&mut self, timeout: Duration) -> Result<Reply, Fault> {
        self.receive_until(timeout, None)
    }

    /// The reply to the request sent last, hung only after `patience`
    /// without any frame (`start` when longer, while the worker has sent
    /// none yet and after a progress frame saying it builds an
    /// environment): each progress frame starts the wait again. A frame
    /// that arrived while the caller waited on another worker counts from
    /// when it is read, so the wait can only be longer than the worker's
    /// real silence, never shorter.
    pub fn receive_patiently(
        &mut self,
        patience: Duration,
        start: Duration,
    ) -> Result<Reply, Fault> {
        let start = patience.max(start);
        let first = if self.started { patience } else { start };
        self.receive_until(first, Some((patience, start)))
    }

    /// The next frame that answers the request sent last and is not a
    /// progress frame, polling the pipes until `wait` after the send
    /// (moved to `patience.0` after each progress frame, to `patience.1`
    /// after one that says the worker builds an environment).
    fn receive_until(
        &mut self,
        mut wait: Duration,
        patience: Option<(Duration, Duration)>,
    ) -> Result<Reply, Fault> {
        let Some((id, sent)) = self.awaiting else {
            return Err(Fault::Malformed("a reply awaited without a request".into()));
        };
        let mut deadline = sent + wait;
        let frame = loop {
            match self.replies.next_frame() {
                Ok(Some(frame)) => {
                    self.started = true;
                    let answers = frame.header.get("id").and_then(Value::as_u64);
                    if answers != Some(id) {
                        return Err(Fault::Malformed(match frame.header.get("id") {
                            Some(other) => {
                                format!("a frame for request {other}, awaiting request {id}")
                            }
                            None => format!("a frame without a request id, awaiting request {id}"),
                        }));
                    }
                    if frame.header.get("progress") != Some(&Value::Bool(true)) {
                        break frame;
                    }
                    if let Some((patience, build)) = patience {
                        let building = frame.header.get("building") == Some(&Value::Bool(true));
                        wait = if building { build } else { patience };
                        deadline = Instant::now() + wait;
                    }
                    continue;
                }
                Ok(None) => {}
                Err(e) => return Err(Fault::Malformed(e.to_string())),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            let timeout = Timespec::try_from(left).expect("a wait shorter than 2^63 s");
            let (readable, writable) = {
                let mut fds = vec![PollFd::new(&self.stdout, PollFlags::IN)];
                if !self.unsent.is_empty()
                    && let Some(stdin) = &self.stdin
                {
                    fds.push(PollFd::new(stdin, PollFlags::OUT));
                }
                match poll(&mut fds, Some(&timeout)) {
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => continue,
                    Err(e) => return Err(Fault::Crashed(format!("polling its pipes: {e}"))),
                }
                (
                    !fds[0].revents().is_empty(),
                    fds.get(1).is_some_and(|fd| !fd.revents().is_empty()),
                )
            };
            if writable {
                self.write_unsent();
            }
            if readable {
                self.read_available()?;
            } else if !writable && Instant::now() >= deadline {
                return Err(Fault::Hung(wait));
            }
        };
        self.awaiting = None;
        match frame.header.get("ok") {
            Some(Value::Bool(true)) => Ok(Reply::Done(frame)),
            Some(Value::Bool(false)) => Ok(Reply::Refused {
                bad_input: frame.header.get("kind").and_then(Value::as_str) == Some("bad_input"),
                message: frame
                    .header
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or("no message")
                    .to_string(),
            }),
            _ => Err(Fault::Malformed("a reply without a boolean `ok`".into())),
        }
    }

    /// Reads what the stdout pipe holds into the frame buffer; the end of
    /// the stream is the worker's exit (between frames) or a malformed
    /// frame (inside one).
    fn read_available(&mut self) -> Result<(), Fault> {
        let mut chunk = [0u8; 1 << 16];
        loop {
            match self.stdout.read(&mut chunk) {
                Ok(0) => {
                    // Whole frames before the end are still replies.
                    if self.replies.has_frame() {
                        return Ok(());
                    }
                    return Err(match self.replies.end() {
                        FrameError::Eof => Fault::Crashed(self.exit_status()),
                        e => Fault::Malformed(e.to_string()),
                    });
                }
                Ok(n) => self.replies.push(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(Fault::Crashed(format!("pipe: {e}"))),
            }
        }
    }

    /// Sends `header` and waits for the reply at most `timeout`.
    pub fn request(&mut self, header: &Value, timeout: Duration) -> Result<Reply, Fault> {
        self.send(header);
        self.receive(timeout)
    }

    /// How the process ended, waiting for it a moment (it closed its
    /// stdout, so it is exiting); a served worker's parent is the runner,
    /// which alone can tell.
    fn exit_status(&mut self) -> String {
        let child = match &mut self.process {
            Process::Spawned(child) => child,
            Process::Served { .. } => return "closed its connection".into(),
        };
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status.to_string(),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => return "closed its stdout, still running".into(),
                Err(e) => return format!("exit status unknown: {e}"),
            }
        }
    }

    /// Kills its process group (the worker and every process it or its
    /// environments started) and reaps the worker. The group id stays
    /// taken while any member lives, so it names no other group. A served
    /// worker's group is killed the same way (the runner reaps it and
    /// starts another for its next step).
    pub fn kill(&mut self) {
        self.stdin = None;
        match &mut self.process {
            Process::Spawned(child) => {
                let _ = kill_process_group(Pid::from_child(child), Signal::KILL);
                let _ = child.kill();
                let _ = child.wait();
            }
            Process::Served {
                pid, group, killed, ..
            } => {
                if let Some(pid) = Pid::from_raw(*pid).filter(|_| !*killed) {
                    let _ = if *group {
                        kill_process_group(pid, Signal::KILL)
                    } else {
                        rustix::process::kill_process(pid, Signal::KILL)
                    };
                }
                *killed = true;
            }
        }
    }
}

impl Drop for Worker {
    /// Kills a spawned worker ([`Worker::kill`]); a served one that awaits
    /// no reply is let go (the connection closes, the worker waits for its
    /// next client with its environments built), one that does is killed.
    fn drop(&mut self) {
        if !self.served() || self.busy() {
            self.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_dies_with_the_thread_that_started_it_without_its_python_watch() {
        // Its Python watch looks for a new parent, which a thread's end does
        // not give: only the parent-death signal set before exec ends it.
        let python = crate::BridgeConfig::python(None);
        let mut worker = std::thread::scope(|scope| {
            scope
                .spawn(|| Worker::spawn(&python, 0).unwrap())
                .join()
                .unwrap()
        });
        let Process::Spawned(child) = &mut worker.process else {
            unreachable!("spawned")
        };
        let until = Instant::now() + Duration::from_secs(5);
        while child.try_wait().unwrap().is_none() {
            assert!(
                Instant::now() < until,
                "worker {} outlived the thread that started it",
                child.id()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
