//! Progress of long loops, visible on a terminal and off one.
//!
//! On a terminal (stderr is a tty) a [`Progress`] is an indicatif bar. Off a
//! terminal (nohup, a cluster job, a pipeline runner's log) it prints one plain
//! line to stderr every `EMBODYFLOW_PROGRESS_SECS` seconds (default 10;
//! fractions allowed; `0` turns the lines off) while the loop runs:
//!
//! ```text
//! scoring: 4096/16384 (25.0 %), 409.6/s, elapsed 10 s, eta 30 s
//! ```
//!
//! rate = done / elapsed, eta = (total - done) / rate. A loop that printed
//! at least one such line prints a last `…: done 16384/16384 in 40 s` when it
//! finishes, so a log shows where time went; loops shorter than the interval
//! print nothing.
//!
//! ```
//! let bar = embodyflow_core::progress::bar(3, "scoring");
//! for _ in 0..3 { bar.inc(1); }
//! bar.finish_and_clear();
//! ```

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

/// The environment variable holding the plain lines' interval in seconds.
pub const INTERVAL_VAR: &str = "EMBODYFLOW_PROGRESS_SECS";

/// The plain lines' interval when [`INTERVAL_VAR`] is unset.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// The interval from [`INTERVAL_VAR`]; `None` when it is `0` (no lines).
/// An unparsable value falls back to [`DEFAULT_INTERVAL`].
pub fn interval() -> Option<Duration> {
    let Ok(text) = std::env::var(INTERVAL_VAR) else {
        return Some(DEFAULT_INTERVAL);
    };
    match text.trim().parse::<f64>() {
        Ok(0.0) => None,
        Ok(secs) if secs.is_finite() && secs > 0.0 => Some(Duration::from_secs_f64(secs)),
        _ => Some(DEFAULT_INTERVAL),
    }
}

/// A bar over `len` items labelled `label`: an indicatif bar on a terminal,
/// periodic plain lines on stderr otherwise (see the module docs).
pub fn bar(len: u64, label: &str) -> Progress {
    if std::io::stderr().is_terminal() {
        let bar = ProgressBar::new(len);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:>14} [{elapsed_precise}] {wide_bar} {human_pos}/{human_len} ({per_sec}, eta {eta})",
            )
            .expect("valid template"),
        );
        bar.set_message(label.to_string());
        Progress::Bar(bar)
    } else {
        match interval() {
            Some(every) => {
                Progress::Plain(Plain::start(len, label, every, Box::new(std::io::stderr())))
            }
            None => Progress::Hidden,
        }
    }
}

/// Progress of one loop; see [`bar`].
pub enum Progress {
    /// An indicatif bar (stderr is a terminal).
    Bar(ProgressBar),
    /// Periodic plain lines (stderr is not a terminal).
    Plain(Plain),
    /// Nothing (off a terminal with `EMBODYFLOW_PROGRESS_SECS=0`).
    Hidden,
}

impl Progress {
    /// Counts `delta` more items done.
    pub fn inc(&self, delta: u64) {
        match self {
            Progress::Bar(bar) => bar.inc(delta),
            Progress::Plain(plain) => plain.update(|s| s.done += delta),
            Progress::Hidden => {}
        }
    }

    /// Shows `message` beside the count (the bar's label; appended to plain lines).
    pub fn set_message(&self, message: impl Into<String>) {
        let message = message.into();
        match self {
            Progress::Bar(bar) => bar.set_message(message),
            Progress::Plain(plain) => plain.update(|s| s.message = Some(message)),
            Progress::Hidden => {}
        }
    }

    /// Runs `f` with the bar hidden, so that what it prints is not drawn over.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match self {
            Progress::Bar(bar) => bar.suspend(f),
            _ => f(),
        }
    }

    /// Ends the loop: clears the bar, or stops the plain lines (with a last
    /// line when any was printed).
    pub fn finish_and_clear(&self) {
        match self {
            Progress::Bar(bar) => bar.finish_and_clear(),
            Progress::Plain(plain) => plain.finish(),
            Progress::Hidden => {}
        }
    }
}

/// What the plain lines report.
struct State {
    done: u64,
    message: Option<String>,
    finished: bool,
    lines: u64,
}

struct Shared {
    label: String,
    total: u64,
    started: Instant,
    state: Mutex<State>,
    wake: Condvar,
    out: Mutex<Box<dyn Write + Send>>,
}

/// Plain progress lines written by a thread every interval until finished.
pub struct Plain {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// `12 s`, `3 min 05 s`, `2 h 03 min`.
pub fn duration(secs: f64) -> String {
    let secs = secs.max(0.0).round() as u64;
    if secs < 60 {
        format!("{secs} s")
    } else if secs < 3600 {
        format!("{} min {:02} s", secs / 60, secs % 60)
    } else {
        format!("{} h {:02} min", secs / 3600, secs % 3600 / 60)
    }
}

/// Items per second with three significant figures at most.
fn rate(per_sec: f64) -> String {
    if per_sec >= 100.0 {
        format!("{per_sec:.0}/s")
    } else if per_sec >= 1.0 {
        format!("{per_sec:.1}/s")
    } else {
        format!("{per_sec:.3}/s")
    }
}

impl Shared {
    /// One line: `label: done/total (pct), rate, elapsed, eta[, message]`.
    fn line(&self, state: &State) -> String {
        let elapsed = self.started.elapsed().as_secs_f64();
        let per_sec = state.done as f64 / elapsed.max(1e-9);
        let mut line = if state.finished {
            format!(
                "{}: done {}/{} in {} ({})",
                self.label,
                state.done,
                self.total,
                duration(elapsed),
                rate(per_sec)
            )
        } else {
            let pct = 100.0 * state.done as f64 / (self.total.max(1)) as f64;
            let eta = if state.done == 0 {
                "?".to_string()
            } else {
                duration(self.total.saturating_sub(state.done) as f64 / per_sec)
            };
            format!(
                "{}: {}/{} ({pct:.1} %), {}, elapsed {}, eta {eta}",
                self.label,
                state.done,
                self.total,
                rate(per_sec),
                duration(elapsed)
            )
        };
        if let Some(message) = &state.message
            && *message != self.label
        {
            line.push_str(", ");
            line.push_str(message);
        }
        line
    }

    fn print(&self, line: &str) {
        let mut out = self.out.lock().expect("progress output");
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
}

impl Plain {
    /// Starts the thread that writes a line to `out` every `every`.
    pub fn start(total: u64, label: &str, every: Duration, out: Box<dyn Write + Send>) -> Plain {
        let shared = Arc::new(Shared {
            label: label.to_string(),
            total,
            started: Instant::now(),
            state: Mutex::new(State {
                done: 0,
                message: None,
                finished: false,
                lines: 0,
            }),
            wake: Condvar::new(),
            out: Mutex::new(out),
        });
        let ticker = Arc::clone(&shared);
        let thread = std::thread::spawn(move || {
            let mut state = ticker.state.lock().expect("progress state");
            let mut next = Instant::now() + every;
            loop {
                let now = Instant::now();
                if state.finished {
                    break;
                }
                if now >= next {
                    let line = ticker.line(&state);
                    state.lines += 1;
                    ticker.print(&line);
                    next += every;
                    continue;
                }
                state = ticker
                    .wake
                    .wait_timeout(state, next - now)
                    .expect("progress state")
                    .0;
            }
        });
        Plain {
            shared,
            thread: Mutex::new(Some(thread)),
        }
    }

    fn update(&self, change: impl FnOnce(&mut State)) {
        change(&mut self.shared.state.lock().expect("progress state"));
    }

    /// Stops the thread; prints the last line when any line was printed.
    fn finish(&self) {
        let last = {
            let mut state = self.shared.state.lock().expect("progress state");
            if state.finished {
                return;
            }
            state.finished = true;
            (state.lines > 0).then(|| self.shared.line(&state))
        };
        self.shared.wake.notify_all();
        if let Some(thread) = self.thread.lock().expect("progress thread").take() {
            let _ = thread.join();
        }
        if let Some(line) = last {
            self.shared.print(&line);
        }
    }
}

impl Drop for Plain {
    fn drop(&mut self) {
        self.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn plain_lines_report_count_rate_and_eta_then_a_last_line() {
        let sink = Sink::default();
        let plain = Plain::start(
            100,
            "scoring",
            Duration::from_millis(30),
            Box::new(sink.clone()),
        );
        let progress = Progress::Plain(plain);
        progress.inc(25);
        progress.set_message("shard 3");
        std::thread::sleep(Duration::from_millis(100));
        progress.inc(75);
        progress.finish_and_clear();
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.len() >= 3, "{text}");
        let first = lines[0];
        assert!(first.starts_with("scoring: 25/100 (25.0 %), "), "{first}");
        assert!(
            first.contains("/s, elapsed ") && first.contains(", eta "),
            "{first}"
        );
        assert!(first.ends_with(", shard 3"), "{first}");
        let last = lines.last().unwrap();
        assert!(last.starts_with("scoring: done 100/100 in "), "{last}");
    }

    #[test]
    fn a_loop_shorter_than_the_interval_prints_nothing() {
        let sink = Sink::default();
        let progress = Progress::Plain(Plain::start(
            10,
            "quick",
            Duration::from_secs(60),
            Box::new(sink.clone()),
        ));
        progress.inc(10);
        let started = Instant::now();
        progress.finish_and_clear();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "finish waits for the tick"
        );
        assert!(sink.0.lock().unwrap().is_empty());
    }

    #[test]
    fn durations_and_rates_read_naturally() {
        assert_eq!(duration(12.4), "12 s");
        assert_eq!(duration(185.0), "3 min 05 s");
        assert_eq!(duration(7380.0), "2 h 03 min");
        assert_eq!(rate(409.6), "410/s");
        assert_eq!(rate(2.26), "2.3/s");
        assert_eq!(rate(0.5), "0.500/s");
    }
}
