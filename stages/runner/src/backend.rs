//! Where a pipeline's stage processes run, and what each asks for there.
//!
//! A step may say what one of its processes needs on a cluster: `cpus`
//! (per process), `mem` (`512M`, `8G`; per process) and `gpus` (per
//! process; a step whose `devices` are CUDA asks for one unless it says
//! otherwise). The local backend runs the processes on this machine as
//! before (a sharded step's processes share its CPUs, [`crate::exec`]); the
//! Slurm backend ([`crate::slurm`]) turns them into `sbatch` requests, the
//! Ray backend ([`crate::ray`]) into Ray jobs' `entrypoint_num_cpus`,
//! `entrypoint_memory` and `entrypoint_num_gpus`.
//!
//! ```toml
//! [backend]
//! kind = "slurm"                 # "ray", or "local" (the default); `--backend` overrides
//! partition = "gpu"              # default: the cluster's default partition
//! account = "lab"
//! time = "02:00:00"              # every job's time limit
//! sbatch = ["--qos=normal"]      # extra flags of every job
//! shared = ["/shared/me", "/shared/models"]  # filesystems every node sees
//!
//! [backend.step.update]          # per step (by name)
//! time = "08:00:00"
//! sbatch = ["--constraint=h100"]
//! ```
//!
//! Ray reads `address` (its dashboard's HTTP address, else
//! `$RAY_API_SERVER_ADDRESS`) and `shared`; the Slurm keys are left to
//! Slurm, so one file serves both with `--backend`:
//!
//! ```toml
//! [backend]
//! kind = "ray"
//! address = "http://head:8265"
//! shared = ["/shared/me"]
//! ```

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use toml::Spanned;

/// What one process of a step asks a cluster for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resources {
    /// CPUs (`--cpus-per-task`); the cluster's default when absent.
    pub cpus: Option<u32>,
    /// Memory in MiB (`--mem`); the cluster's default when absent.
    pub mem_mb: Option<u64>,
    /// GPUs (`--gres=gpu:N`).
    pub gpus: u32,
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

/// Which backend runs the stage processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// This machine.
    #[default]
    Local,
    /// A Slurm cluster: one job (or job array) per step.
    Slurm,
    /// A Ray cluster: one Ray job per process of a step.
    Ray,
}

/// The `[backend]` table of a pipeline file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Backend {
    /// The backend the file asks for (`--backend` overrides it).
    pub kind: Kind,
    /// Slurm partition.
    pub partition: Option<String>,
    /// Slurm account.
    pub account: Option<String>,
    /// Time limit of every job.
    pub time: Option<String>,
    /// Extra `sbatch` flags of every job.
    pub sbatch: Vec<String>,
    /// Roots of the filesystems every node sees.
    pub shared: Vec<PathBuf>,
    /// The Ray dashboard's HTTP address (`http://head:8265`).
    pub address: Option<String>,
    /// Per step name: its time limit and extra flags.
    pub steps: BTreeMap<String, StepBackend>,
    /// Line of `[backend]` (0 when the file has none).
    pub line: usize,
}

/// A step's own `[backend.step.NAME]` settings.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepBackend {
    /// Its jobs' time limit (replaces the backend's).
    pub time: Option<String>,
    /// Extra `sbatch` flags, after the backend's.
    #[serde(default)]
    pub sbatch: Vec<String>,
}

/// `[backend]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawBackend {
    kind: Option<Spanned<String>>,
    partition: Option<String>,
    account: Option<String>,
    time: Option<String>,
    #[serde(default)]
    sbatch: Vec<String>,
    #[serde(default)]
    shared: Vec<String>,
    address: Option<String>,
    #[serde(default)]
    step: BTreeMap<Spanned<String>, StepBackend>,
}

impl RawBackend {
    /// Checks the table; `line` gives the line of a span, `is_step` says
    /// whether a name is one of the pipeline's steps. Errors come with their
    /// line.
    pub(crate) fn check(
        self,
        at: usize,
        line: &dyn Fn(std::ops::Range<usize>) -> usize,
        steps: &[&str],
    ) -> Result<Backend, (usize, String)> {
        let kind = match &self.kind {
            None => Kind::Local,
            Some(kind) => match kind.get_ref().as_str() {
                "local" => Kind::Local,
                "slurm" => Kind::Slurm,
                "ray" => Kind::Ray,
                other => {
                    return Err((
                        line(kind.span()),
                        format!("[backend] kind `{other}`: expected `local`, `slurm` or `ray`"),
                    ));
                }
            },
        };
        if let Some(root) = self.shared.iter().find(|r| r.trim().is_empty()) {
            return Err((at, format!("[backend] shared: an empty path ({root:?})")));
        }
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
        Ok(Backend {
            kind,
            partition: self.partition,
            account: self.account,
            time: self.time,
            sbatch: self.sbatch,
            shared: self.shared.iter().map(PathBuf::from).collect(),
            address: self.address,
            steps: per_step,
            line: at,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
