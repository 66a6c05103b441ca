//! The command line every stage shares (docs/src/command-line.md), and the one path by which
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
//! reading or writing anything (see [`crate::config::ConfigReport`]); it needs
//! no `--out`, `--input` or checkpoint flag (`STAGE --print-config --set k=v`).
//! `--out`, `--policy` and `--teacher` are required otherwise; their hidden
//! default `.` only fills the field under `--print-config`, which exits before
//! it is read, so stages keep plain paths. Exit codes:
//! 0 done, 2 bad usage or bad input (nothing written), 1 failure while running.
//!
//! Logs ([`main_with`], [`init_logging`]): warnings and errors go to stderr;
//! INFO lines go to `<out>/_log.<stage>.txt` ([`log_path`]; `.<i>-of-<n>`
//! before `.txt` for a shard), beside the output tables, and to stderr as
//! well only with `EMBODYFLOW_LOG=stderr`. `RUST_LOG` sets what is logged
//! (default `info`); a binary without `--out` (`table`, `pipeline`) writes
//! no log file and shows `RUST_LOG`'s selection on stderr. Progress goes to
//! stderr ([`crate::progress`]).

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
    /// Required, except with `--print-config` (which writes nothing).
    // `--print-config` exits before `out` is read, so its hidden default
    // never reaches a stage: every stage keeps a plain path.
    #[arg(
        long,
        value_name = "DIR",
        required_unless_present = "print_config",
        default_value = ".",
        hide_default_value = true
    )]
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
    /// and exit: 0 when it resolves, 2 when a key or value is bad. Reads no
    /// input and writes nothing, so `--out`, `--policy` and `--teacher` may
    /// be left out; the pipeline runner uses it to check every step's keys
    /// before any stage runs.
    // The JSON is a `crate::config::ConfigReport`. (Plain comments: clap
    // turns doc comments into `--help` text, where rustdoc links would show.)
    #[arg(long)]
    pub print_config: bool,
}

/// `--policy CKPT` for stages that run the policy.
#[derive(Debug, Clone, clap::Args)]
pub struct PolicyArg {
    /// Policy checkpoint directory (model.safetensors, config.json, tokenizer.json).
    #[arg(
        long,
        value_name = "CKPT",
        required_unless_present = "print_config",
        default_value = ".",
        hide_default_value = true
    )]
    pub policy: PathBuf,
}

/// `--teacher CKPT` for stages that run a teacher.
#[derive(Debug, Clone, clap::Args)]
pub struct TeacherArg {
    /// Teacher checkpoint directory (or `self`: the policy).
    #[arg(
        long,
        value_name = "CKPT",
        required_unless_present = "print_config",
        default_value = ".",
        hide_default_value = true
    )]
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

/// The environment variable that sends INFO lines to stderr too: `stderr`.
pub const LOG_VAR: &str = "EMBODYFLOW_LOG";

/// Where a run's log goes: `<out>/_log.<stage>.txt`, or
/// `<out>/_log.<stage>.<i>-of-<n>.txt` for shard i of n (several processes
/// share one `--out` only when sharded). The file is beside the output
/// tables, not one of them: it is not in any manifest or commit.
pub fn log_path(out: &std::path::Path, stage: &str, shard: ShardSpec) -> PathBuf {
    if shard.count == 1 {
        out.join(format!("_log.{stage}.txt"))
    } else {
        out.join(format!(
            "_log.{stage}.{}-of-{}.txt",
            shard.index, shard.count
        ))
    }
}

/// A run's log file, opened only once the output directory exists: lines
/// logged before the stage created `--out` wait in memory (so a stage that
/// insists on a new output directory still gets one, and a run that fails
/// on bad input before writing leaves nothing), and are written when the
/// directory appears or the process ends with it present.
pub struct RunLog {
    path: PathBuf,
    state: std::sync::Mutex<LogState>,
}

enum LogState {
    Waiting(Vec<u8>),
    Open(std::fs::File),
    Closed,
}

/// Lines kept in memory while `--out` does not exist yet (then dropped).
const LOG_BUFFER_LIMIT: usize = 4 << 20;

impl RunLog {
    /// A log to be written at `path` once its directory exists.
    pub fn new(path: PathBuf) -> RunLog {
        RunLog {
            path,
            state: std::sync::Mutex::new(LogState::Waiting(Vec::new())),
        }
    }

    /// The file's path.
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Opens the file when its directory exists, writing what waited.
    fn open_if_ready(&self, state: &mut LogState) {
        let LogState::Waiting(buffer) = state else {
            return;
        };
        if !self.path.parent().is_some_and(std::path::Path::is_dir) {
            return;
        }
        *state = match std::fs::File::create(&self.path) {
            Ok(mut file) => {
                use std::io::Write;
                let _ = file.write_all(buffer);
                LogState::Open(file)
            }
            Err(_) => LogState::Closed,
        };
    }

    /// Ends the log as the process exits: writes what waited when the
    /// output directory exists; under `remove` (bad input: nothing written)
    /// deletes the file instead. The log is not fsynced: it is a record of
    /// the run, not an output a later step reads, and the kernel keeps it
    /// whatever happens to the process.
    pub fn close(&self, remove: bool) {
        let mut state = self.state.lock().expect("log lock");
        if remove {
            if matches!(*state, LogState::Open(_)) {
                let _ = std::fs::remove_file(&self.path);
            }
        } else {
            self.open_if_ready(&mut state);
        }
        *state = LogState::Closed;
    }
}

impl std::io::Write for &RunLog {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let mut state = self.state.lock().expect("log lock");
        self.open_if_ready(&mut state);
        match &mut *state {
            LogState::Waiting(buffer) => {
                if buffer.len() + data.len() <= LOG_BUFFER_LIMIT {
                    buffer.extend_from_slice(data);
                }
            }
            LogState::Open(file) => file.write_all(data)?,
            LogState::Closed => {}
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match &mut *self.state.lock().expect("log lock") {
            LogState::Open(file) => file.flush(),
            _ => Ok(()),
        }
    }
}

/// The filter for INFO lines: `RUST_LOG`, else `info`.
fn info_filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
}

/// Starts logging. Warnings and errors always go to stderr. INFO lines (or
/// what `RUST_LOG` selects) go to `log` when there is one, and to stderr
/// too when `EMBODYFLOW_LOG=stderr` — or when there is no log file and
/// `RUST_LOG` is set.
pub fn init_logging(log: Option<std::sync::Arc<RunLog>>) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let verbose = std::env::var(LOG_VAR).is_ok_and(|v| v == "stderr")
        || (log.is_none() && std::env::var_os("RUST_LOG").is_some());
    let stderr_filter = if verbose {
        info_filter()
    } else {
        tracing_subscriber::EnvFilter::new("warn")
    };
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .with_filter(stderr_filter);
    let file = log.map(|log| {
        tracing_subscriber::fmt::layer()
            .with_writer(log)
            .with_ansi(false)
            .with_target(false)
            .with_filter(info_filter())
    });
    let _ = tracing_subscriber::registry()
        .with(stderr)
        .with(file)
        .try_init();
}

/// The run log of a binary whose top-level arguments have `--out` (not
/// under `--print-config`): [`log_path`] with the binary's file name.
fn run_log(matches: &clap::ArgMatches) -> Option<std::sync::Arc<RunLog>> {
    let out = matches.try_get_one::<PathBuf>("out").ok().flatten()?;
    if matches
        .try_get_one::<bool>("print_config")
        .ok()
        .flatten()
        .copied()
        .unwrap_or(false)
    {
        return None;
    }
    let shard = matches
        .try_get_one::<ShardSpec>("shard")
        .ok()
        .flatten()
        .copied()
        .unwrap_or(ShardSpec::ALL);
    let stage = std::env::args_os()
        .next()
        .map(PathBuf::from)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "stage".to_string());
    Some(std::sync::Arc::new(RunLog::new(log_path(
        out, &stage, shard,
    ))))
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

/// The body of every binary's `main`: parsing (clap exits 2 on bad usage),
/// logging ([`init_logging`], into [`log_path`] under `--out` when the binary
/// has one), running, and the exit code from the error's [`ErrorKind`].
pub fn main_with<A, E>(run: impl FnOnce(A) -> Result<(), E>) -> std::process::ExitCode
where
    A: clap::Parser,
    E: Classify,
{
    let matches = A::command().get_matches();
    let log = run_log(&matches);
    init_logging(log.clone());
    let args = match A::from_arg_matches(&matches) {
        Ok(args) => args,
        Err(error) => error.format(&mut A::command()).exit(),
    };
    let result = run(args);
    if let Some(log) = &log {
        let bad_input = matches!(&result, Err(e) if e.kind() == ErrorKind::BadInput);
        log.close(bad_input);
    }
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(done) if done.kind() == ErrorKind::Done => {
            println!("{done}");
            std::process::ExitCode::SUCCESS
        }
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
