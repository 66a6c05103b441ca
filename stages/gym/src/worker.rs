//! One Python worker process (`<python> -u -m embodyflow_gym.worker`) and
//! its pipes: a writer thread and a reader thread, so that neither a send
//! nor a receive can block the driver; every receive has a deadline.
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

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::protocol::{self, Frame, FrameError, MAX_FRAME};

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
    requests: Option<Sender<Vec<u8>>>,
    replies: Receiver<Result<Frame, FrameError>>,
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
        let mut stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = child.stdout.take().expect("piped stdout");
        let (request_tx, request_rx) = mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            for bytes in request_rx {
                if stdin
                    .write_all(&bytes)
                    .and_then(|()| stdin.flush())
                    .is_err()
                {
                    break;
                }
            }
        });
        let (reply_tx, reply_rx) = mpsc::channel();
        std::thread::spawn(move || {
            loop {
                let frame = protocol::read_frame(&mut stdout, MAX_FRAME);
                let end = frame.is_err();
                if reply_tx.send(frame).is_err() || end {
                    break;
                }
            }
        });
        Ok(Worker {
            index,
            child,
            requests: Some(request_tx),
            replies: reply_rx,
        })
    }

    /// `worker <index> (pid <pid>)`.
    pub fn name(&self) -> String {
        format!("worker {} (pid {})", self.index, self.child.id())
    }

    /// Queues a request; never blocks (a worker that is gone shows at the
    /// next receive).
    pub fn send(&mut self, header: &Value) {
        if let Some(requests) = &self.requests {
            let _ = requests.send(protocol::encode_frame(header, &[]));
        }
    }

    /// The next reply, waiting until `deadline` (progress frames do not
    /// move it).
    pub fn receive(&mut self, deadline: Instant) -> Result<Reply, Fault> {
        let wait = deadline.saturating_duration_since(Instant::now());
        self.receive_until(deadline, wait, None)
    }

    /// The next reply, hung only after `patience` without any frame: each
    /// progress frame starts the wait again. A frame queued while the
    /// caller waited on another worker counts from when it is read, so the
    /// wait can only be longer than the worker's real silence, never shorter.
    pub fn receive_patiently(&mut self, patience: Duration) -> Result<Reply, Fault> {
        self.receive_until(Instant::now() + patience, patience, Some(patience))
    }

    fn receive_until(
        &mut self,
        mut deadline: Instant,
        mut wait: Duration,
        patience: Option<Duration>,
    ) -> Result<Reply, Fault> {
        let frame = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let frame = match self.replies.recv_timeout(left) {
                Ok(Ok(frame)) => frame,
                Ok(Err(FrameError::Eof)) | Err(RecvTimeoutError::Disconnected) => {
                    return Err(Fault::Crashed(self.exit_status()));
                }
                Ok(Err(FrameError::Io(e))) => return Err(Fault::Crashed(format!("pipe: {e}"))),
                Ok(Err(e)) => return Err(Fault::Malformed(e.to_string())),
                Err(RecvTimeoutError::Timeout) => return Err(Fault::Hung(wait)),
            };
            if frame.header.get("progress") != Some(&Value::Bool(true)) {
                break frame;
            }
            if let Some(patience) = patience {
                deadline = Instant::now() + patience;
                wait = patience;
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
        self.requests = None;
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
