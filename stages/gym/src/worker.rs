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
//! What can go wrong with a worker is a [`Fault`]: it exited (crashed), it
//! did not answer within the timeout (hung), or it sent bytes that are not
//! a frame of the protocol (malformed). The caller kills it
//! ([`Worker::kill`], also on drop) and starts another. The worker itself
//! exits when its stdin ends or its parent process changes, so none
//! outlives the driver.
//!
//! Long requests (a reset that builds many environments, an expert episode)
//! send progress frames (`{"progress": true}`) while they work: a patient
//! receive ([`Worker::receive_patiently`]) counts a worker as hung only
//! after a whole timeout without any frame, so a loaded machine slows such
//! a request down without failing it, and a worker that stopped is still
//! found within one timeout. Progress frames never count as replies.
//!
//! ```no_run
//! use embodyflow_gym::worker::Worker;
//! use std::time::{Duration, Instant};
//! let mut worker = Worker::spawn(std::path::Path::new(".venv/bin/python"), 0).unwrap();
//! worker.send(&serde_json::json!({"op": "close"}));
//! let reply = worker.receive(Instant::now() + Duration::from_secs(5)).unwrap();
//! ```

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::fs::{OFlags, fcntl_getfl, fcntl_setfl};
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
}

/// Sets `O_NONBLOCK` on a pipe end.
fn non_blocking(fd: impl AsFd) -> std::io::Result<()> {
    let flags = fcntl_getfl(&fd)?;
    fcntl_setfl(&fd, flags | OFlags::NONBLOCK)?;
    Ok(())
}

impl Worker {
    /// Starts worker `index` (its name in messages) with `python`, the
    /// package directory on its `PYTHONPATH`; stderr passes through.
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
        })
    }

    /// `worker <index> (pid <pid>)`.
    pub fn name(&self) -> String {
        format!("worker {} (pid {})", self.index, self.child.id())
    }

    /// Sends a request: writes what the pipe takes now and keeps the rest
    /// for the next receive; never blocks (a worker that is gone shows at
    /// the next receive).
    pub fn send(&mut self, header: &Value) {
        self.unsent
            .extend_from_slice(&protocol::encode_frame(header, &[]));
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

    /// The next reply, waiting until `deadline` (progress frames do not
    /// move it).
    pub fn receive(&mut self, deadline: Instant) -> Result<Reply, Fault> {
        let wait = deadline.saturating_duration_since(Instant::now());
        self.receive_until(deadline, wait, None)
    }

    /// The next reply, hung only after `patience` without any frame: each
    /// progress frame starts the wait again. A frame that arrived while the
    /// caller waited on another worker counts from when it is read, so the
    /// wait can only be longer than the worker's real silence, never shorter.
    pub fn receive_patiently(&mut self, patience: Duration) -> Result<Reply, Fault> {
        self.receive_until(Instant::now() + patience, patience, Some(patience))
    }

    /// The next frame that is not a progress frame, polling the pipes until
    /// `deadline` (moved by `patience` at each progress frame).
    fn receive_until(
        &mut self,
        mut deadline: Instant,
        mut wait: Duration,
        patience: Option<Duration>,
    ) -> Result<Reply, Fault> {
        let frame = loop {
            match self.replies.next_frame() {
                Ok(Some(frame)) if frame.header.get("progress") == Some(&Value::Bool(true)) => {
                    if let Some(patience) = patience {
                        deadline = Instant::now() + patience;
                        wait = patience;
                    }
                    continue;
                }
                Ok(Some(frame)) => break frame,
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
        self.receive(Instant::now() + timeout)
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

    /// Kills the process and reaps it.
    pub fn kill(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Asks the worker to exit (`close`), killing it if it does not answer
    /// within `timeout`.
    pub fn close(mut self, timeout: Duration) {
        let _ = self.request(&serde_json::json!({"op": "close"}), timeout);
        self.kill();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}
