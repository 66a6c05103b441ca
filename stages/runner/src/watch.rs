//! What the runner shows while a plan runs: the running step, its stage's
//! own progress line (the last one in its log) and the run's ETA weighted
//! by what each step costs, not by how many steps are left.
//!
//! ```text
//! [00:12:31] 14/40 it1/collect (collect-rollouts) | collecting: 96/128 (75.0 %), 1.9/s, elapsed 50 s, eta 17 s | run eta ~ 9 min 40 s (measured step costs)
//! ```
//!
//! A step's cost is estimated as the mean wall time of the instances of the
//! same step (its other iterations) that ran in this run, else the wall
//! time recorded when it last ran (`_step.json`), else the mean of every
//! estimate known; the ETA is the running step's estimate less its elapsed
//! time (at least 0) plus the estimates of the steps after it:
//! `eta = max(0, c(running) - elapsed) + Σ c(later)`. A step that ran for
//! 8 minutes with one left weighs 8 minutes, where counting steps would give
//! it the weight of a 2-second one.
//!
//! On a terminal the line is an indicatif bar's message; off one (a log, a
//! cluster job) it is printed every `EMBODYFLOW_PROGRESS_SECS` seconds
//! (default 10; 0: never), as the stages print theirs
//! ([`embodyflow_core::progress`]).

use std::collections::BTreeMap;
use std::io::{IsTerminal, Read, Seek, SeekFrom};
use std::path::Path;
use std::time::{Duration, Instant};

use embodyflow_core::progress::duration;
use indicatif::{ProgressBar, ProgressStyle};

use crate::cache::{self, StepRecord};
use crate::plan::Plan;

/// Estimated step costs (wall seconds) of a plan, learnt as it runs.
#[derive(Debug, Clone, Default)]
pub struct Costs {
    /// Seconds each step name took in this run: (sum, count).
    ran: BTreeMap<String, (f64, u32)>,
    /// Recorded seconds per instance (`_step.json`), by plan index.
    recorded: Vec<Option<f64>>,
    /// Step name per plan index.
    steps: Vec<String>,
}

impl Costs {
    /// The costs recorded in the plan's step directories.
    pub fn of(plan: &Plan) -> Costs {
        Costs {
            ran: BTreeMap::new(),
            recorded: plan
                .instances
                .iter()
                .map(|i| {
                    std::fs::read_to_string(i.dir.join(cache::STEP_FILE))
                        .ok()
                        .and_then(|t| serde_json::from_str::<StepRecord>(&t).ok())
                        .map(|r| r.wall_s)
                })
                .collect(),
            steps: plan.instances.iter().map(|i| i.step.clone()).collect(),
        }
    }

    /// Costs from step names and recorded seconds (tests).
    pub fn new(steps: Vec<String>, recorded: Vec<Option<f64>>) -> Costs {
        Costs {
            ran: BTreeMap::new(),
            recorded,
            steps,
        }
    }

    /// Instance `index` ran in `wall_s` seconds.
    pub fn ran(&mut self, index: usize, wall_s: f64) {
        let entry = self.ran.entry(self.steps[index].clone()).or_default();
        entry.0 += wall_s;
        entry.1 += 1;
    }

    fn estimate(&self, index: usize) -> Option<f64> {
        self.ran
            .get(&self.steps[index])
            .map(|(sum, n)| sum / f64::from(*n))
            .or(self.recorded[index])
    }

    /// Seconds left when instance `running` has run for `elapsed` seconds
    /// (module doc); `None` while no cost is known.
    pub fn eta(&self, running: usize, elapsed: f64) -> Option<f64> {
        let known: Vec<f64> = (0..self.steps.len())
            .filter_map(|i| self.estimate(i))
            .collect();
        if known.is_empty() {
            return None;
        }
        let fallback = known.iter().sum::<f64>() / known.len() as f64;
        let cost = |i: usize| self.estimate(i).unwrap_or(fallback);
        let later: f64 = (running + 1..self.steps.len()).map(cost).sum();
        Some((cost(running) - elapsed).max(0.0) + later)
    }
}

/// The last progress line of a stage log: its last non-empty line that is
/// not a row of a Markdown table (the threads table a torch stage prints as
/// it starts), read from its last 4 KiB (`None` when the log holds no such
/// line or is unreadable).
pub fn last_line(log: &Path) -> Option<String> {
    let mut file = std::fs::File::open(log).ok()?;
    let len = file.metadata().ok()?.len();
    file.seek(SeekFrom::Start(len.saturating_sub(4096))).ok()?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).ok()?;
    let text = String::from_utf8_lossy(&tail);
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('|'))
        .map(|l| l.chars().take(160).collect())
}

/// The status text of a running step.
pub fn status_text(id: &str, stage: &str, line: Option<&str>, eta: Option<f64>) -> String {
    let mut text = format!("{id} ({stage})");
    if let Some(line) = line {
        text.push_str(" | ");
        text.push_str(line);
    }
    text.push_str(&match eta {
        Some(eta) => format!(" | run eta ~ {} (measured step costs)", duration(eta)),
        None => " | run eta ? (no step cost measured yet)".to_string(),
    });
    text
}

/// The runner's status line: a bar on a terminal, periodic lines off one.
pub struct Status {
    bar: Option<ProgressBar>,
    every: Option<Duration>,
    last: Instant,
    done: u64,
    len: u64,
}

impl Status {
    /// A status over `len` steps.
    pub fn new(len: u64) -> Status {
        let terminal = std::io::stderr().is_terminal();
        let bar = terminal.then(|| {
            let bar = ProgressBar::new(len);
            bar.set_style(
                ProgressStyle::with_template("[{elapsed_precise}] {pos}/{len} {wide_msg}")
                    .expect("valid template"),
            );
            bar
        });
        let every = embodyflow_core::progress::interval();
        Status {
            bar,
            every,
            last: Instant::now(),
            done: 0,
            len,
        }
    }

    /// Shows `text` (off a terminal: prints it when an interval has passed).
    pub fn show(&mut self, text: &str) {
        match &self.bar {
            Some(bar) => bar.set_message(text.to_string()),
            None => {
                if let Some(every) = self.every
                    && self.last.elapsed() >= every
                {
                    self.last = Instant::now();
                    eprintln!("[{}/{}] {text}", self.done, self.len);
                }
            }
        }
    }

    /// Runs `f` with the bar hidden.
    pub fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.bar {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    /// One more step done.
    pub fn inc(&mut self) {
        self.done += 1;
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    /// Clears the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eta_weighs_steps_by_their_measured_cost() {
        let steps = ["collect", "update", "collect", "update"]
            .map(String::from)
            .to_vec();
        let mut costs = Costs::new(steps, vec![None; 4]);
        assert_eq!(costs.eta(0, 5.0), None, "nothing measured yet");
        costs.ran(0, 480.0);
        // The update after the 8-minute collect: nothing known of updates,
        // so each weighs the mean known cost (480 s), not 1/4 of the run.
        assert_eq!(costs.eta(1, 0.0), Some(480.0 * 3.0));
        costs.ran(1, 2.0);
        // Second collect running for 100 s: 380 s left of it, then 2 s.
        assert_eq!(costs.eta(2, 100.0), Some(380.0 + 2.0));
        // A step past its estimate counts 0, not negative.
        assert_eq!(costs.eta(2, 600.0), Some(2.0));
        // Recorded costs of an earlier run count before any ran now.
        let recorded = Costs::new(vec!["a".into(), "b".into()], vec![Some(10.0), Some(30.0)]);
        assert_eq!(recorded.eta(0, 4.0), Some(6.0 + 30.0));
    }

    #[test]
    fn the_status_shows_the_stages_last_line() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        assert_eq!(last_line(&log), None);
        std::fs::write(
            &log,
            "INFO start\ncollecting: 4/16 (25.0 %), 1.0/s, elapsed 4 s, eta 12 s\n\n",
        )
        .unwrap();
        let line = last_line(&log).unwrap();
        assert_eq!(
            line,
            "collecting: 4/16 (25.0 %), 1.0/s, elapsed 4 s, eta 12 s"
        );
        // A table row printed after it (the threads table) is no progress.
        std::fs::write(
            &log,
            "collecting: 4/16 (25.0 %), 1.0/s, elapsed 4 s, eta 12 s\n| threads | 2 |\n| omp_wait_policy | passive |\n",
        )
        .unwrap();
        assert_eq!(last_line(&log).unwrap(), line);
        std::fs::write(&log, "| threads | 2 |\n").unwrap();
        assert_eq!(last_line(&log), None);
        assert_eq!(
            status_text("it0/collect", "collect-rollouts", Some(&line), Some(185.0)),
            "it0/collect (collect-rollouts) | collecting: 4/16 (25.0 %), 1.0/s, elapsed 4 s, eta 12 s | run eta ~ 3 min 05 s (measured step costs)"
        );
    }
}
