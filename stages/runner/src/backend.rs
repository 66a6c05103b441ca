//! Where a pipeline's stage processes run, and what each asks for there.
//!
//! A step may say what one of its processes needs: `cpus` (per process,
//! [`DEFAULT_CPUS`] when it says none), `mem` (`512M`, `8G`; per process)
//! and `gpus` (per process; a step whose `devices` are CUDA asks for one
//! unless it says otherwise). `cpus` is also the thread count each process
//! computes with, on every backend
//! ([`embodyflow_core::threads::step_threads`]; the stage's `threads` key,
//! when set, takes precedence), so a step's results do not depend on where
//! it runs. The local backend runs the processes on this machine (a sharded
//! step's processes share its CPUs, [`crate::exec`]); the Slurm backend
//! ([`crate::slurm`]) turns them into `sbatch` requests, the Ray backend
//! ([`crate::ray`]) into Ray jobs' `entrypoint_num_cpus`,
//! `entrypoint_memory` and `entrypoint_num_gpus`.
//!
//! The `[backend]` table ([`Table`]): `kind` (the backend, listed in
//! `crate::registry`; `--backend` overrides it), `shared` and
//! `record_grace_s`, which every cluster backend reads, and each backend's
//! own keys, which its module declares and reads ([`Table::settings`]); a
//! file may hold every backend's keys, so one file serves each with
//! `--backend`:
//!
//! ```toml
//! [backend]
//! kind = "slurm"                 # "ray", or "local" (the default); `--backend` overrides
//! partition = "gpu"              # Slurm: default the cluster's default partition
//! account = "lab"
//! time = "02:00:00"              # every job's time limit
//! sbatch = ["--qos=normal"]      # extra flags of every job
//! address = "http://head:8265"   # Ray: the dashboard (else $RAY_API_SERVER_ADDRESS)
//! shared = ["/shared/me", "/shared/models"]  # filesystems every node sees
//! record_grace_s = 90            # how long a step record may take to show
//!
//! [backend.step.update]          # per step (by name)
//! time = "08:00:00"
//! sbatch = ["--constraint=h100"]
//! ```
//!
//! `shared` roots and the paths checked against them are compared with
//! their symbolic links resolved (a `/home` that links to `/mnt/home` is
//! the same filesystem). `record_grace_s` ([`DEFAULT_RECORD_GRACE_S`] by
//! default) is how long the runner waits for a step's record (`_step.json`,
//! written on the node) to show after the step's jobs left the queue before
//! it counts the step as failed: a network filesystem's attribute cache can
//! hide a file another machine wrote for 30 to 60 s (NFS's `acdirmax`
//! defaults to 60 s).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use toml::Spanned;

/// The CPUs (and threads) of a process whose step declares none: one, what
/// Slurm grants a job without `--cpus-per-task`.
pub const DEFAULT_CPUS: u32 = 1;

/// Seconds a step's record may take to show after its jobs left the queue
/// (`[backend] record_grace_s`).
pub const DEFAULT_RECORD_GRACE_S: f64 = 90.0;

/// What one process of a step asks a cluster for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// CPUs (`--cpus-per-task`) and threads; [`DEFAULT_CPUS`] when absent.
    pub cpus: Option<u32>,
    /// Memory in MiB (`--mem`); the cluster's default when absent.
    pub mem_mb: Option<u64>,
    /// GPUs (`--gres=gpu:N`).
    pub gpus: u32,
}

impl Resources {
    /// The CPUs one process gets and computes with: `cpus`, else
    /// [`DEFAULT_CPUS`].
    pub fn cpus_or_default(&self) -> u32 {
        self.cpus.unwrap_or(DEFAULT_CPUS)
    }
}

/// Reads a memory size as Slurm writes it: a whole number of MiB, or with a
/// `K`, `M`, `G` or `T` suffix (binary units, as `--mem`).
pub fn parse_mem(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, scale) = match text.chars().last()?.to_ascii_uppercase() {
        'K' => (&text[..text.len() - 1], 0.0009765625),
        'M' => (&text[..text.len() - 1], 1.0),
        'G' => (&text[..text.len() - 1], 1024.0),
        'T' => (&text[..text.len() - 1], 1024.0 * 1024.0),
        _ => (text, 1.0),
    };
    let value: u64 = digits.parse().ok()?;
    let mb = (value as f64 * scale).ceil() as u64;
    (mb > 0).then_some(mb)
}

/// The `[backend]` table of a pipeline file: the keys every backend reads,
/// and the others as written, which each backend reads for itself
/// ([`Table::settings`], [`Table::step_settings`]) and the registry checks
/// against what the listed backends declare.
#[derive(Debug, Clone, PartialEq)]
pub struct Table {
    /// The backend the file asks for and the line of `kind` (`--backend`
    /// overrides it; none: local).
    pub kind: Option<(String, usize)>,
    /// Roots of the filesystems every node sees.
    pub shared: Vec<PathBuf>,
    /// How long a step's record may take to show after its jobs left the
    /// queue.
    pub record_grace: std::time::Duration,
    /// The backends' own keys, as written.
    pub keys: toml::Table,
    /// Per step name: its `[backend.step.NAME]` keys, as written.
    pub steps: BTreeMap<String, toml::Table>,
    /// Line of `[backend]` (0 when the file has none).
    pub line: usize,
}

impl Default for Table {
    fn default() -> Table {
        Table {
            kind: None,
            shared: Vec::new(),
            record_grace: std::time::Duration::from_secs_f64(DEFAULT_RECORD_GRACE_S),
            keys: toml::Table::new(),
            steps: BTreeMap::new(),
            line: 0,
        }
    }
}

impl Table {
    /// A backend's settings read from the table's keys (a settings type
    /// reads its own keys and leaves the other backends' alone).
    pub fn settings<T: DeserializeOwned>(&self) -> std::result::Result<T, String> {
        toml::Value::Table(self.keys.clone())
            .try_into()
            .map_err(|e: toml::de::Error| format!("[backend] {}", e.message().trim()))
    }

    /// A backend's settings of step `name` (its defaults when the step has
    /// no `[backend.step.NAME]`).
    pub fn step_settings<T: DeserializeOwned>(&self, name: &str) -> std::result::Result<T, String> {
        let keys = self.steps.get(name).cloned().unwrap_or_default();
        toml::Value::Table(keys)
            .try_into()
            .map_err(|e: toml::de::Error| format!("[backend.step.{name}] {}", e.message().trim()))
    }
}

/// `[backend]` as written.
#[derive(Debug, Deserialize)]
pub(crate) struct RawBackend {
    kind: Option<Spanned<String>>,
    #[serde(default)]
    shared: Vec<String>,
    record_grace_s: Option<Spanned<f64>>,
    #[serde(default)]
    step: BTreeMap<Spanned<String>, toml::Table>,
    /// The backends' own keys.
    #[serde(flatten)]
    keys: toml::Table,
}

impl RawBackend {
    /// Checks the keys every backend reads; `line` gives the line of a
    /// span, `steps` names the pipeline's steps. Errors come with their
    /// line. The backends' own keys are checked by the registry.
    pub(crate) fn check(
        self,
        at: usize,
        line: &dyn Fn(std::ops::Range<usize>) -> usize,
        steps: &[&str],
    ) -> Result<Table, (usize, String)> {
        let kind = self
            .kind
            .map(|kind| (kind.get_ref().clone(), line(kind.span())));
        if let Some(root) = self.shared.iter().find(|r| r.trim().is_empty()) {
            return Err((at, format!("[backend] shared: an empty path ({root:?})")));
        }
        let record_grace_s = match &self.record_grace_s {
            None => DEFAULT_RECORD_GRACE_S,
            Some(grace) => {
                let seconds = *grace.get_ref();
                if !(seconds.is_finite() && (0.0..=86400.0).contains(&seconds)) {
                    return Err((
                        line(grace.span()),
                        format!(
                            "[backend] record_grace_s = {seconds}: expected seconds from 0 to 86400"
                        ),
                    ));
                }
                seconds
            }
        };
        let mut per_step = BTreeMap::new();
        for (name, settings) in self.step {
            if !steps.contains(&name.get_ref().as_str()) {
                return Err((
                    line(name.span()),
                    format!(
                        "[backend.step.{}]: no step of that name; steps: {}",
                        name.get_ref(),
                        steps.join(", ")
                    ),
                ));
            }
            per_step.insert(name.into_inner(), settings);
        }
        Ok(Table {
            kind,
            shared: self.shared.iter().map(PathBuf::from).collect(),
            record_grace: std::time::Duration::from_secs_f64(record_grace_s),
            keys: self.keys,
            steps: per_step,
            line: at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_grace_is_seconds_with_a_default_for_nfs() {
        let parse = |backend: &str| {
            crate::pipeline::Pipeline::parse(
                std::path::Path::new("p.toml"),
                &format!(
                    "[[step]]\nname = \"t\"\nstage = \"generate-tasks\"\n\n[backend]\n{backend}\n"
                ),
            )
            .map(|p| p.backend.record_grace.as_secs_f64())
        };
        assert_eq!(parse("").unwrap(), DEFAULT_RECORD_GRACE_S);
        assert_eq!(
            Table::default().record_grace.as_secs_f64(),
            DEFAULT_RECORD_GRACE_S
        );
        assert_eq!(parse("record_grace_s = 120").unwrap(), 120.0);
        assert_eq!(parse("record_grace_s = 2.5").unwrap(), 2.5);
        for bad in ["-1", "inf", "1e9"] {
            let err = parse(&format!("record_grace_s = {bad}"))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("p.toml:6: [backend] record_grace_s = ")
                    && err.contains("expected seconds from 0 to 86400"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn memory_sizes_read_as_slurm_reads_them() {
        for (text, mb) in [
            ("512", Some(512)),
            ("512M", Some(512)),
            ("8G", Some(8192)),
            ("8g", Some(8192)),
            ("1T", Some(1 << 20)),
            ("2048K", Some(2)),
            ("1K", Some(1)),
            ("0", None),
            ("G", None),
            ("1.5G", None),
            ("", None),
        ] {
            assert_eq!(parse_mem(text), mb, "{text:?}");
        }
    }
}
