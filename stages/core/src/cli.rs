//! The command line every stage shares (DESIGN §3), and the one path by which
//! binaries report errors and choose their exit code.
//!
//! ```text
//! STAGE --input DIR [--input DIR ...] --out DIR
//!       [--config FILE.toml] [--set dotted.key=value ...]
//!       [--shard i/n] [--device cpu|cuda:N] [--seed N] [--overwrite]
//! ```
//! A stage flattens [`StageArgs`] into its own clap struct and adds
//! [`PolicyArg`] / [`TeacherArg`] where it loads a checkpoint.
//! `--print-config` resolves the config, prints it as JSON and exits without
//! reading or writing anything (see [`crate::config::ConfigReport`]). Exit codes:
//! 0 done, 2 bad usage or bad input (nothing written), 1 failure while running.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::error::{Classify, Error, ErrorKind};

/// The flags every stage takes.
#[derive(Debug, Clone, clap::Args)]
pub struct StageArgs {
    /// Input dataset or table directory; repeat for several. Tables are found by name.
    #[arg(long = "input", value_name = "DIR")]
    pub inputs: Vec<PathBuf>,
    /// Output directory; each output table becomes a subdirectory.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// TOML config file, applied over the stage's defaults.
    #[arg(long, value_name = "FILE.toml")]
    pub config: Option<PathBuf>,
    /// Override one config value, `dotted.key=value`; repeatable, later wins.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub sets: Vec<String>,
    /// Process only shard i of n (0-based); the shards' outputs together equal the unsharded output.
    #[arg(long, value_name = "i/n", default_value = "0/1")]
    pub shard: ShardSpec,
    /// Compute device.
    #[arg(long, value_name = "cpu|cuda:N", default_value = "cpu")]
    pub device: Device,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Replace output tables that exist (atomically, once the new ones are complete).
    #[arg(long)]
    pub overwrite: bool,
    /// Resolve the config (defaults, `--config`, `--set`), print it as JSON
    /// ([`crate::config::ConfigReport`]) and exit: 0 when it resolves, 2 when
    /// a key or value is bad. Reads no input and writes nothing; the pipeline
    /// runner uses it to check every step's keys before any stage runs.
    #[arg(long)]
    pub print_config: bool,
}

/// `--policy CKPT` for stages that run the policy.
#[derive(Debug, Clone, clap::Args)]
pub struct PolicyArg {
    /// Policy checkpoint directory (model.safetensors, config.json, tokenizer.json).
    #[arg(long, value_name = "CKPT")]
    pub policy: PathBuf,
}

/// `--teacher CKPT` for stages that run a teacher.
#[derive(Debug, Clone, clap::Args)]
pub struct TeacherArg {
    /// Teacher checkpoint directory.
    #[arg(long, value_name = "CKPT")]
    pub teacher: PathBuf,
}

/// Which slice of the work a process does: shard `index` of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardSpec {
    /// 0-based shard index.
    pub index: u32,
    /// Number of shards.
    pub count: u32,
}

impl ShardSpec {
    /// The whole dataset.
    pub const ALL: ShardSpec = ShardSpec { index: 0, count: 1 };

    /// Whether the row with this key belongs to this shard. Keys are assigned
    /// by a stable hash (BLAKE3), so the split is the same on every machine
    /// and rerun; shard by the grouping key (e.g. `group_id`) to keep groups whole.
    pub fn owns(&self, key: &str) -> bool {
        if self.count == 1 {
            return true;
        }
        let hash = blake3::hash(key.as_bytes());
        let first = u64::from_le_bytes(hash.as_bytes()[..8].try_into().expect("8 bytes"));
        first % u64::from(self.count) == u64::from(self.index)
    }

    /// The batches this shard computes when a stage runs a model over `len`
    /// items in batches of `batch` (in an order every shard agrees on).
    ///
    /// A model's numbers for one item depend on the items batched with it
    /// (padding, matrix shapes change the floating-point rounding), so a
    /// shard that batched only its own items would write other log-probs
    /// than the unsharded run in their last bits. Instead every shard cuts
    /// the items into the unsharded run's batches, `[0, batch)`, `[batch,
    /// 2 batch)`, …, and owns whole batches: the one starting at item `s`
    /// when it [`owns`](Self::owns) `key(s)`. Each owned batch is then
    /// computed exactly as in the unsharded run. Every batch but the last is
    /// full, so the owned items, batched again by `batch`, form the same
    /// batches.
    pub fn owned_batches(
        &self,
        len: usize,
        batch: usize,
        key: impl Fn(usize) -> String,
    ) -> Vec<std::ops::Range<usize>> {
        let batch = batch.max(1);
        (0..len)
            .step_by(batch)
            .map(|start| start..(start + batch).min(len))
            .filter(|range| self.owns(&key(range.start)))
            .collect()
    }
}

impl FromStr for ShardSpec {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self, Error> {
        let bad = || {
            Error::Usage(format!(
                "--shard `{text}`: expected i/n with 0 <= i < n, e.g. 0/4"
            ))
        };
        let (index, count) = text.split_once('/').ok_or_else(bad)?;
        let index: u32 = index.trim().parse().map_err(|_| bad())?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(ShardSpec { index, count })
    }
}

impl fmt::Display for ShardSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

/// A compute device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    /// The CPU.
    Cpu,
    /// CUDA device N.
    Cuda(usize),
}

impl FromStr for Device {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self, Error> {
        match text {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            _ => text
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| {
                    Error::Usage(format!("--device `{text}`: expected cpu, cuda or cuda:N"))
                }),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// Starts logging to stderr (`RUST_LOG` overrides the default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .try_init();
}

/// Prints an error with its chain of causes, one `caused by:` line each.
pub fn report(error: &dyn std::error::Error) {
    eprintln!("error: {error}");
    let mut source = error.source();
    while let Some(cause) = source {
        eprintln!("  caused by: {cause}");
        source = cause.source();
    }
}

/// The body of every binary's `main`: logging, parsing (clap exits 2 on bad
/// usage), running, and the exit code from the error's [`ErrorKind`].
pub fn main_with<A, E>(run: impl FnOnce(A) -> Result<(), E>) -> std::process::ExitCode
where
    A: clap::Parser,
    E: Classify,
{
    init_logging();
    let args = A::parse();
    match run(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            report(&error);
            let code = error.kind().exit_code();
            if error.kind() == ErrorKind::BadInput {
                eprintln!("(bad input or usage: nothing was written)");
            }
            std::process::ExitCode::from(code as u8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_specs_parse_and_reject_nonsense() {
        assert_eq!(
            "2/4".parse::<ShardSpec>().unwrap(),
            ShardSpec { index: 2, count: 4 }
        );
        for bad in ["4/4", "1/0", "x/2", "3", "-1/2"] {
            let err = bad.parse::<ShardSpec>().unwrap_err().to_string();
            assert!(err.contains(bad), "{err}");
        }
    }

    #[test]
    fn shards_partition_the_keys() {
        let keys: Vec<String> = (0..1000).map(|i| format!("it0/task{i}/d0")).collect();
        let specs: Vec<ShardSpec> = (0..3).map(|i| ShardSpec { index: i, count: 3 }).collect();
        for key in &keys {
            assert_eq!(specs.iter().filter(|s| s.owns(key)).count(), 1);
        }
        let first = keys.iter().filter(|k| specs[0].owns(k)).count();
        assert!((250..420).contains(&first), "unbalanced split: {first}");
    }

    #[test]
    fn shards_own_whole_batches_of_the_unsharded_run() {
        let key = |i: usize| format!("it0/task{i}/d0");
        let whole = ShardSpec::ALL.owned_batches(23, 5, key);
        assert_eq!(whole, vec![0..5, 5..10, 10..15, 15..20, 20..23]);
        let parts: Vec<Vec<std::ops::Range<usize>>> = (0..3)
            .map(|index| ShardSpec { index, count: 3 }.owned_batches(23, 5, key))
            .collect();
        let mut all: Vec<std::ops::Range<usize>> = parts.concat();
        all.sort_by_key(|r| r.start);
        assert_eq!(all, whole, "each batch in exactly one shard");
        for (index, part) in parts.iter().enumerate() {
            let spec = ShardSpec {
                index: index as u32,
                count: 3,
            };
            assert!(part.iter().all(|r| spec.owns(&key(r.start))));
        }
    }

    #[test]
    fn devices_parse() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("cuda:1".parse::<Device>().unwrap(), Device::Cuda(1));
        assert!(
            "gpu"
                .parse::<Device>()
                .unwrap_err()
                .to_string()
                .contains("gpu")
        );
    }
}
