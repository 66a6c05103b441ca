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
//! worker that has sent no frame yet is starting (the Python imports, the
//! first environment built): its first frame may take a longer start-up
//! patience.
//!
//! ```no_run
//! use embodyflow_gym::worker::Worker;
//! use std::time::Duration;
//! let mut worker = Worker::spawn(std::path::Path::new(".venv/bin/python"), 0).unwrap();
//! worker.send(&serde_json::json!({"op": "close"}));
//! let reply = worker.receive(Duration::from_secs(5)).unwrap();
//! ```

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
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

/// A running worker process.
pub struct Worker {
    index: usize,
    child: Child,
    /// Its stdin (non-blocking); `None` once it is closed or broken.
    stdin: Option<ChildStdin>,
    /// Its stdout (non-blocking).
    stdout: ChildStdout,
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

impl Worker {
    /// Starts worker `index` (its name in messages) with `python`, the
    /// package directory on its `PYTHONPATH`, in a process group of its
    /// own; stderr passes through.
    pub fn spawn(python: &Path, index: usize) -> std::io::Result<Worker> {
        let mut path = std::ffi::OsString::from(PYTHON_DIR);
        if let Some(old) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
            path.push(":");
            path.push(old);
        }
        let mut child = Command::new(python)
            .args(["-u", "-m", "embodyflow_gym.worker"])
            .env("PYTHONPATH", path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        non_blocking(&stdin)?;
        non_blocking(&stdout)?;
        Ok(Worker {
            index,
            child,
            stdin: Some(stdin),
            stdout,
            unsent: Vec::new(),
            replies: FrameBuffer::new(MAX_FRAME),
            next_id: 0,
            awaiting: None,
            started: false,
        })
    }

    /// Whether a request awaits its reply.
    pub fn busy(&self) -> bool {
        self.awaiting.is_some()
    }

    /// `worker <index> (pid <pid>)`.
    pub fn name(&self) -> String {
        format!("worker {} (pid {})", self.index, self.child.id())
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
    /// without any frame (`start` while the worker has sent none yet, when
    /// longer): each progress frame starts the wait again. A frame that
    /// arrived while the caller waited on another worker counts from when
    /// it is read, so the wait can only be longer than the worker's real
    /// silence, never shorter.
    pub fn receive_patiently(
        &mut self,
        patience: Duration,
        start: Duration,
    ) -> Result<Reply, Fault> {
        let first = if self.started {
            patience
        } else {
            patience.max(start)
        };
        self.receive_until(first, Some(patience))
    }

    /// The next frame that answers the request sent last and is not a
    /// progress frame, polling the pipes until `wait` after the send
    /// (moved to `patience` after each progress frame).
    fn receive_until(
        &mut self,
        mut wait: Duration,
        patience: Option<Duration>,
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
                    if let Some(patience) = patience {
                        deadline = Instant::now() + patience;
                        wait = patience;
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
    /// stdout, so it is exiting).
    fn exit_status(&mut self) -> String {
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => return status.to_string(),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
                Ok(None) => return "closed its stdout, still running".into(),
                Err(e) => return format!("exit status unknown: {e}"),
            }
        }
    }

    /// Kills its process group (the worker and every process it or its
    /// environments started) and reaps the worker. The group id stays
    /// taken while any member lives, so it names no other group.
    pub fn kill(&mut self) {
        self.stdin = None;
        let _ = kill_process_group(Pid::from_child(&self.child), Signal::KILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}
