//! The threads and CPUs of a stage process, set deliberately at its start.
//!
//! A stage that runs libtorch computes on libtorch's OpenMP pool (libgomp).
//! Left alone, that pool has one thread per core of the machine and, between
//! parallel regions, its threads spin: with a second process beside it (a
//! runner's shard, another user) the spinning threads take the CPUs the
//! working ones need, and throughput collapses (measured: 85 % of
//! collect-rollouts' CPU time in libgomp's spin loop, 5× slower than with
//! `OMP_WAIT_POLICY=PASSIVE`). So every stage declares its pool in its
//! [`crate::spec::StageSpec`] ([`Threads`]), and the core sets it up in
//! [`crate::stage::Stage::start`], before any work:
//!
//! - `EMBODYFLOW_CPUS` ([`CPUS_VAR`], a CPU list such as `0-3,8`), when set,
//!   restricts the process to those CPUs (`sched_setaffinity`). The pipeline
//!   runner gives each of a step's `shards = n` processes its own equal,
//!   disjoint share of its CPUs this way ([`shares`]).
//! - [`Threads::Torch`] stages take the config keys `threads` (0, the
//!   default: `OMP_NUM_THREADS` when the environment sets it, else the CPUs
//!   this process may run on — its affinity and cgroup quota, as
//!   [`std::thread::available_parallelism`] counts them) and
//!   `omp_wait_policy` (`passive`, the default: idle threads sleep;
//!   `active`: they spin; `inherit`: `OMP_WAIT_POLICY` as the environment has
//!   it, unset meaning libgomp's own spin-then-sleep). libgomp and libtorch
//!   read `OMP_NUM_THREADS`, `MKL_NUM_THREADS` and `OMP_WAIT_POLICY` once, as
//!   the library loads, before `main`: when the environment differs from
//!   [`torch_environment`], the stage re-executes itself
//!   (`/proc/self/exe`, same arguments and pid) with it, and libtorch's
//!   intra-op pool then starts with `OMP_NUM_THREADS` threads.
//! - [`Threads::Rayon`] stages take `threads` alone: 0 leaves rayon's global
//!   pool to its default (`RAYON_NUM_THREADS`, else the CPUs this process may
//!   run on), n > 0 builds it with n threads.
//! - [`Threads::Single`] stages take no key (only `EMBODYFLOW_CPUS` applies).
//!
//! The pipeline runner makes the thread count a pure function of what a
//! step declares, the same on every backend and whatever machine or shard
//! it lands on ([`step_threads`]): the `threads` key when above 0, else the
//! step's `cpus`. It starts each stage process with that count in
//! `OMP_NUM_THREADS`, `MKL_NUM_THREADS` and `RAYON_NUM_THREADS`
//! ([`thread_environment`]), which `threads = 0` takes, and puts it into the
//! step's cache key ([`crate::numerics`]): libtorch's and rayon's
//! reductions add in an order that depends on it.
//!
//! Only the stage's own binary is set up (its file name is the stage's
//! name); a test or library calling a stage's `run` in its own process is
//! left as it is, and its summary says so. What was set goes into the run's
//! log and its summary ([`Applied::summary_lines`]):
//!
//! ```text
//! | threads | 2 (CPUs 0-1) |
//! | omp_wait_policy | passive |
//! ```
//!
//! ```
//! use embodyflow_core::threads::{CpuList, WaitPolicy, shares, torch_environment};
//! let cpus: CpuList = "0-5".parse().unwrap();
//! let split = shares(cpus.cpus(), 2);
//! assert_eq!(split[0].to_string(), "0-2");
//! assert_eq!(split[1].to_string(), "3-5");
//! let env = torch_environment(3, WaitPolicy::Passive);
//! assert!(env.contains(&("OMP_WAIT_POLICY", Some("PASSIVE".to_string()))));
//! assert!(env.contains(&("OMP_NUM_THREADS", Some("3".to_string()))));
//! ```

use std::ffi::OsString;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::checks::ensure;
use crate::error::{Error, Result};

/// The environment variable that restricts a stage process to a CPU list.
pub const CPUS_VAR: &str = "EMBODYFLOW_CPUS";

/// Set in the environment of a stage that re-executed itself, so the new
/// process neither loops nor forgets that it did; its value is where the
/// thread count came from (one of [`SOURCES`]).
const REEXEC_VAR: &str = "EMBODYFLOW_THREADS_REEXEC";

/// Where a thread count comes from: the key, the library's variable, or the
/// CPUs this process may run on.
const SOURCES: &[&str] = &[
    "threads",
    "OMP_NUM_THREADS",
    "RAYON_NUM_THREADS",
    "the CPUs",
];

/// The most threads a `threads` key accepts.
pub const MAX_THREADS: usize = 1024;

/// Which thread pool a stage computes on, as its spec declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Threads {
    /// libtorch's OpenMP pool: keys `threads` and `omp_wait_policy`.
    Torch,
    /// rayon's global pool: key `threads`.
    Rayon,
    /// One thread: no key.
    Single,
}

impl Threads {
    /// The config keys this pool adds to the stage's, with their meanings.
    pub fn keys(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Threads::Torch => &[
                (
                    "threads",
                    "libtorch intra-op threads; 0 = OMP_NUM_THREADS if set, else the CPUs this process may run on",
                ),
                (
                    "omp_wait_policy",
                    "how idle OpenMP threads wait: passive (sleep), active (spin) or inherit (the environment's OMP_WAIT_POLICY)",
                ),
            ],
            Threads::Rayon => &[(
                "threads",
                "rayon threads; 0 = RAYON_NUM_THREADS if set, else the CPUs this process may run on",
            )],
            Threads::Single => &[],
        }
    }

    /// The defaults of [`Self::keys`], as a config tree's top-level entries.
    pub fn defaults(self) -> Map<String, Value> {
        let mut map = Map::new();
        if self != Threads::Single {
            map.insert("threads".into(), Value::from(0));
        }
        if self == Threads::Torch {
            map.insert("omp_wait_policy".into(), Value::from("passive"));
        }
        map
    }
}

/// How idle OpenMP threads wait for work (`omp_wait_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WaitPolicy {
    /// `OMP_WAIT_POLICY=PASSIVE`: they sleep (no CPU taken from others).
    #[default]
    Passive,
    /// `OMP_WAIT_POLICY=ACTIVE`: they spin (fastest alone on idle cores).
    Active,
    /// `OMP_WAIT_POLICY` as the environment has it (unset: libgomp spins
    /// for a while, then sleeps).
    Inherit,
}

impl fmt::Display for WaitPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WaitPolicy::Passive => "passive",
            WaitPolicy::Active => "active",
            WaitPolicy::Inherit => "inherit",
        })
    }
}

/// The resolved values of a stage's thread keys ([`Threads::keys`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ThreadsConfig {
    /// `threads`: 0 = automatic.
    #[serde(default)]
    pub threads: usize,
    /// `omp_wait_policy` (torch stages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub omp_wait_policy: Option<WaitPolicy>,
}

impl ThreadsConfig {
    /// Takes this pool's keys out of a resolved config tree (the rest is the
    /// stage's own config) and checks them; an error names the key.
    pub fn take_from(tree: &mut Value, threads: Threads) -> Result<ThreadsConfig> {
        let mut taken = Map::new();
        if let Value::Object(map) = tree {
            for (key, _) in threads.keys() {
                if let Some(value) = map.remove(*key) {
                    taken.insert((*key).to_string(), value);
                }
            }
        }
        let config: ThreadsConfig = serde_path_to_error::deserialize(Value::Object(taken))
            .map_err(|e| Error::BadValue {
                key: e.path().to_string(),
                reason: e.inner().to_string(),
            })?;
        ensure(
            config.threads <= MAX_THREADS,
            "threads",
            format!("a thread count from 0 (the CPUs this process may run on) to {MAX_THREADS}"),
            config.threads,
        )?;
        Ok(config)
    }
}

/// A set of CPU numbers, written as Linux writes CPU lists (`0-3,8,10-11`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuList(Vec<usize>);

impl CpuList {
    /// A list of these CPUs (sorted, duplicates removed).
    pub fn new(mut cpus: Vec<usize>) -> CpuList {
        cpus.sort_unstable();
        cpus.dedup();
        CpuList(cpus)
    }

    /// The CPU numbers, ascending.
    pub fn cpus(&self) -> &[usize] {
        &self.0
    }

    /// How many CPUs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The CPUs the calling thread may run on (`sched_getaffinity`).
    pub fn of_this_thread() -> std::io::Result<CpuList> {
        let set = rustix::thread::sched_getaffinity(None)?;
        Ok(CpuList(
            (0..rustix::thread::CpuSet::MAX_CPU)
                .filter(|&cpu| set.is_set(cpu))
                .collect(),
        ))
    }

    /// Restricts the calling thread (and the threads and programs it starts)
    /// to these CPUs (`sched_setaffinity`).
    pub fn pin_this_thread(&self) -> std::io::Result<()> {
        let mut set = rustix::thread::CpuSet::new();
        for &cpu in &self.0 {
            set.set(cpu);
        }
        rustix::thread::sched_setaffinity(None, &set)?;
        Ok(())
    }
}

impl FromStr for CpuList {
    type Err = String;

    /// Parses `0-3,8`; an empty list, a reversed range or a CPU number of
    /// [`rustix::thread::CpuSet::MAX_CPU`] or more is an error.
    fn from_str(text: &str) -> std::result::Result<CpuList, String> {
        let max = rustix::thread::CpuSet::MAX_CPU;
        let number = |part: &str| -> std::result::Result<usize, String> {
            part.trim()
                .parse::<usize>()
                .ok()
                .filter(|&cpu| cpu < max)
                .ok_or_else(|| {
                    format!(
                        "`{}` is not a CPU number from 0 to {}",
                        part.trim(),
                        max - 1
                    )
                })
        };
        let mut cpus = Vec::new();
        for part in text.split(',').filter(|p| !p.trim().is_empty()) {
            match part.split_once('-') {
                Some((low, high)) => {
                    let (low, high) = (number(low)?, number(high)?);
                    if low > high {
                        return Err(format!("`{}` is a reversed range", part.trim()));
                    }
                    cpus.extend(low..=high);
                }
                None => cpus.push(number(part)?),
            }
        }
        if cpus.is_empty() {
            return Err("no CPU in the list".into());
        }
        Ok(CpuList::new(cpus))
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut i = 0;
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                i += 1;
                end = self.0[i];
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if end == start {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

/// The CPU list `EMBODYFLOW_CPUS` gives, if the environment sets it (empty
/// counts as unset); `Err` names the variable and says what is wrong.
pub fn env_cpus() -> std::result::Result<Option<CpuList>, String> {
    match std::env::var(CPUS_VAR) {
        Ok(text) if !text.trim().is_empty() => text
            .parse()
            .map(Some)
            .map_err(|why| format!("{CPUS_VAR}=`{text}`: {why}")),
        _ => Ok(None),
    }
}

/// `cpus` split among `n` processes that run at once: equal, disjoint,
/// contiguous shares covering every CPU (the first `len % n` shares one CPU
/// larger). With more processes than CPUs each gets one CPU, taken in turn
/// (so shares repeat).
pub fn shares(cpus: &[usize], n: usize) -> Vec<CpuList> {
    let c = cpus.len();
    if c == 0 {
        return vec![CpuList::default(); n];
    }
    if n > c {
        return (0..n).map(|i| CpuList(vec![cpus[i % c]])).collect();
    }
    let (base, extra) = (c / n, c % n);
    let mut start = 0;
    (0..n)
        .map(|i| {
            let len = base + usize::from(i < extra);
            let share = CpuList::new(cpus[start..start + len].to_vec());
            start += len;
            share
        })
        .collect()
}

/// The environment a torch stage with `threads` threads and `wait` wants
/// libgomp and MKL to find as they load: each variable with its value, or
/// `None` where it is left as it is (`inherit`).
pub fn torch_environment(threads: usize, wait: WaitPolicy) -> Vec<(&'static str, Option<String>)> {
    let wait = match wait {
        WaitPolicy::Passive => Some("PASSIVE".to_string()),
        WaitPolicy::Active => Some("ACTIVE".to_string()),
        WaitPolicy::Inherit => None,
    };
    vec![
        ("OMP_NUM_THREADS", Some(threads.to_string())),
        ("MKL_NUM_THREADS", Some(threads.to_string())),
        ("OMP_WAIT_POLICY", wait),
    ]
}

/// The thread count of a stage process whose step declares `cpus` CPUs
/// per process and whose resolved thread keys are `config`: the `threads`
/// key when above 0, else `cpus`; `None` for a [`Threads::Single`] stage.
/// A pure function of the step's declaration: the pipeline runner starts
/// the process with it ([`thread_environment`]) on every backend and keys
/// its cache on it.
///
/// ```
/// use embodyflow_core::threads::{Threads, ThreadsConfig, step_threads};
/// let auto = ThreadsConfig::default();
/// assert_eq!(step_threads(Threads::Torch, &auto, 4), Some(4));
/// let two = ThreadsConfig { threads: 2, ..auto };
/// assert_eq!(step_threads(Threads::Rayon, &two, 4), Some(2));
/// assert_eq!(step_threads(Threads::Single, &two, 4), None);
/// ```
pub fn step_threads(pool: Threads, config: &ThreadsConfig, cpus: usize) -> Option<usize> {
    (pool != Threads::Single).then(|| {
        if config.threads > 0 {
            config.threads
        } else {
            cpus.max(1)
        }
    })
}

/// The environment that gives a stage process `threads` threads whatever
/// its pool, as `threads = 0` reads it in [`apply`]: `OMP_NUM_THREADS` and
/// `MKL_NUM_THREADS` (libtorch's pool) and `RAYON_NUM_THREADS` (rayon's).
pub fn thread_environment(threads: usize) -> Vec<(&'static str, String)> {
    ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"]
        .into_iter()
        .map(|var| (var, threads.to_string()))
        .collect()
}

/// What a stage process runs with, once [`apply`] has set it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The stage's pool.
    pub pool: Threads,
    /// Threads of that pool (for a test run inside another program, the
    /// number it would have had).
    pub threads: usize,
    /// Where the count came from (`threads`, `OMP_NUM_THREADS`, `the CPUs`).
    pub source: &'static str,
    /// The CPUs the process may run on.
    pub cpus: CpuList,
    /// Whether `EMBODYFLOW_CPUS` restricted them.
    pub pinned: bool,
    /// The OpenMP wait policy (torch stages).
    pub wait: Option<WaitPolicy>,
    /// Whether this process re-executed itself to set the environment.
    pub reexecuted: bool,
    /// False when the stage runs inside another program (a test): nothing
    /// was set.
    pub set_up: bool,
}

impl Applied {
    /// The summary lines of a run (none for a [`Threads::Single`] stage).
    pub fn summary_lines(&self) -> Vec<(&'static str, String)> {
        if self.pool == Threads::Single {
            return Vec::new();
        }
        let mut lines = Vec::new();
        let threads = if self.set_up {
            format!("{} (CPUs {})", self.threads, self.cpus)
        } else {
            format!(
                "{} would be set (CPUs {}); not set: the stage ran inside another program",
                self.threads, self.cpus
            )
        };
        lines.push(("threads", threads));
        if let Some(wait) = self.wait {
            let text = match (wait, std::env::var("OMP_WAIT_POLICY")) {
                (WaitPolicy::Inherit, Ok(value)) => format!("inherit (OMP_WAIT_POLICY={value})"),
                (WaitPolicy::Inherit, Err(_)) => "inherit (OMP_WAIT_POLICY unset)".into(),
                (wait, _) => wait.to_string(),
            };
            lines.push(("omp_wait_policy", text));
        }
        lines
    }
}

/// The number in environment variable `var`, when it holds one above 0.
fn env_count(var: &str) -> Option<usize> {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
}

/// Whether this process is stage `name`'s own binary (not a test or another
/// program calling the stage's `run`).
fn is_stage_binary(name: &str) -> bool {
    std::env::current_exe().ok().is_some_and(|exe| {
        exe.file_name().is_some_and(|file| {
            let file = file.to_string_lossy();
            file.strip_suffix(" (deleted)").unwrap_or(&file) == name
        })
    })
}

/// Sets up the threads and CPUs of stage `name`'s process as the module
/// documentation says; may re-execute the process (then it does not
/// return). Call it before any other thread starts and before any torch or
/// rayon work. A bad `EMBODYFLOW_CPUS` is a usage error naming it.
pub fn apply(name: &str, pool: Threads, config: &ThreadsConfig) -> Result<Applied> {
    let set_up = is_stage_binary(name);
    let mut pinned = false;
    if set_up && let Some(list) = env_cpus().map_err(Error::Usage)? {
        list.pin_this_thread().map_err(|e| {
            Error::Usage(format!(
                "{CPUS_VAR}=`{list}`: cannot run on these CPUs: {e} (this process may run on {})",
                CpuList::of_this_thread().map_or_else(|e| e.to_string(), |c| c.to_string())
            ))
        })?;
        pinned = true;
    }
    let cpus =
        CpuList::of_this_thread().map_err(|e| Error::io("/proc/self (sched_getaffinity)", e))?;
    let available = std::thread::available_parallelism().map_or(cpus.len().max(1), |n| n.get());
    let library_var = match pool {
        Threads::Torch => Some("OMP_NUM_THREADS"),
        Threads::Rayon => Some("RAYON_NUM_THREADS"),
        Threads::Single => None,
    };
    let (threads, mut source) = if config.threads > 0 {
        (config.threads, "threads")
    } else if let Some((var, n)) = library_var.and_then(|v| env_count(v).map(|n| (v, n))) {
        (n, var)
    } else {
        (available, "the CPUs")
    };
    let wait = (pool == Threads::Torch).then(|| config.omp_wait_policy.unwrap_or_default());
    // A re-executed process finds OMP_NUM_THREADS set by its first self;
    // where the count came from is what that one decided.
    let reexecuted = match std::env::var(REEXEC_VAR) {
        Ok(first) => {
            source = SOURCES
                .iter()
                .copied()
                .find(|s| *s == first)
                .unwrap_or(source);
            true
        }
        Err(_) => false,
    };
    let applied = Applied {
        pool,
        threads,
        source,
        cpus,
        pinned,
        wait,
        reexecuted,
        set_up,
    };
    if !set_up {
        return Ok(applied);
    }
    match pool {
        Threads::Torch => {
            let wanted = torch_environment(threads, wait.unwrap_or_default());
            let differs: Vec<&str> = wanted
                .iter()
                .filter(|(var, value)| {
                    value
                        .as_ref()
                        .is_some_and(|v| std::env::var_os(var) != Some(OsString::from(v)))
                })
                .map(|(var, _)| *var)
                .collect();
            if !differs.is_empty() {
                if reexecuted {
                    return Err(Error::Usage(format!(
                        "{name}: the environment still differs after re-executing ({}); \
                         is something rewriting it?",
                        differs.join(", ")
                    )));
                }
                return Err(reexec(&wanted, source));
            }
        }
        Threads::Rayon if config.threads > 0 => {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build_global()
                .map_err(|e| {
                    Error::Usage(format!("{name}: cannot start {threads} rayon threads: {e}"))
                })?;
        }
        Threads::Rayon | Threads::Single => {}
    }
    tracing::info!(
        threads,
        source,
        cpus = %applied.cpus,
        pinned,
        omp_wait_policy = ?applied.wait,
        reexecuted,
        omp_num_threads = ?std::env::var("OMP_NUM_THREADS").ok(),
        omp_wait_policy_env = ?std::env::var("OMP_WAIT_POLICY").ok(),
        "threads set up"
    );
    Ok(applied)
}

/// Re-executes this process with `wanted` set in its environment; returns
/// only the error when `exec` fails.
fn reexec(wanted: &[(&'static str, Option<String>)], source: &str) -> Error {
    use std::os::unix::process::CommandExt as _;
    let exe = "/proc/self/exe";
    let mut args = std::env::args_os();
    let mut command = std::process::Command::new(exe);
    if let Some(arg0) = args.next() {
        command.arg0(arg0);
    }
    command.args(args).env(REEXEC_VAR, source);
    for (var, value) in wanted {
        if let Some(value) = value {
            command.env(var, value);
        }
    }
    let error = command.exec();
    Error::io(exe, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse_and_print_as_linux_writes_them() {
        for (text, cpus, printed) in [
            ("0", vec![0], "0"),
            ("0-3", vec![0, 1, 2, 3], "0-3"),
            ("3,0-1,8,9,10", vec![0, 1, 3, 8, 9, 10], "0-1,3,8-10"),
            (" 2 , 2 ,", vec![2], "2"),
        ] {
            let list: CpuList = text.parse().unwrap();
            assert_eq!(list.cpus(), cpus.as_slice(), "{text}");
            assert_eq!(list.to_string(), printed, "{text}");
            assert_eq!(printed.parse::<CpuList>().unwrap(), list);
        }
        for (bad, why) in [
            ("", "no CPU"),
            ("x", "`x` is not a CPU number"),
            ("3-1", "`3-1` is a reversed range"),
            ("-1", "`` is not a CPU number"),
            ("1-", "`` is not a CPU number"),
            ("99999", "`99999` is not a CPU number"),
        ] {
            let err = bad.parse::<CpuList>().unwrap_err();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn shares_are_equal_disjoint_and_cover_the_cpus() {
        let cpus: Vec<usize> = (0..10).collect();
        for n in 1..=10 {
            let split = shares(&cpus, n);
            assert_eq!(split.len(), n);
            let mut all: Vec<usize> = split.iter().flat_map(|s| s.cpus().to_vec()).collect();
            assert_eq!(all.len(), 10, "{n}: disjoint");
            all.sort_unstable();
            assert_eq!(all, cpus, "{n}: covering");
            let sizes: Vec<usize> = split.iter().map(CpuList::len).collect();
            assert!(
                sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1,
                "{n}: {sizes:?}"
            );
        }
        let odd = shares(&[2, 3, 6, 7, 9], 2);
        assert_eq!(
            odd.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            ["2-3,6", "7,9"]
        );
        // More processes than CPUs: one CPU each, in turn.
        let over = shares(&[4, 5], 3);
        assert_eq!(
            over.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
            ["4", "5", "4"]
        );
    }

    #[test]
    fn the_keys_are_checked_and_named() {
        let take = |json: Value, pool: Threads| {
            let mut tree = json;
            ThreadsConfig::take_from(&mut tree, pool).map(|c| (c, tree))
        };
        let (config, rest) = take(
            serde_json::json!({"threads": 3, "omp_wait_policy": "active", "lr": 1}),
            Threads::Torch,
        )
        .unwrap();
        assert_eq!(config.threads, 3);
        assert_eq!(config.omp_wait_policy, Some(WaitPolicy::Active));
        assert_eq!(
            rest,
            serde_json::json!({"lr": 1}),
            "the stage's own keys stay"
        );
        for (json, key, reason) in [
            (
                serde_json::json!({"threads": -1}),
                "threads",
                "expected usize",
            ),
            (
                serde_json::json!({"threads": "many"}),
                "threads",
                "expected usize",
            ),
            (
                serde_json::json!({"threads": 5000}),
                "threads",
                "expected a thread count from 0",
            ),
            (
                serde_json::json!({"omp_wait_policy": "lazy"}),
                "omp_wait_policy",
                "unknown variant `lazy`, expected one of `passive`, `active`, `inherit`",
            ),
        ] {
            match take(json.clone(), Threads::Torch) {
                Err(Error::BadValue { key: k, reason: r }) => {
                    assert_eq!(k, key, "{json}");
                    assert!(r.contains(reason), "{json}: {r}");
                }
                other => panic!("{json}: {other:?}"),
            }
        }
        // A rayon stage has no wait policy: the key stays with the stage's
        // own config, whose loader refuses it as unknown.
        let (config, rest) = take(
            serde_json::json!({"threads": 2, "omp_wait_policy": "active"}),
            Threads::Rayon,
        )
        .unwrap();
        assert_eq!(config.omp_wait_policy, None);
        assert_eq!(rest, serde_json::json!({"omp_wait_policy": "active"}));
        assert_eq!(Threads::Single.keys(), &[]);
        assert!(Threads::Single.defaults().is_empty());
        for pool in [Threads::Torch, Threads::Rayon] {
            let keys: Vec<&str> = pool.keys().iter().map(|(k, _)| *k).collect();
            let defaults: Vec<String> = pool.defaults().keys().cloned().collect();
            let mut sorted = keys.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, defaults, "{pool:?}: every key has a default");
            let mut tree = Value::Object(pool.defaults());
            let config = ThreadsConfig::take_from(&mut tree, pool).unwrap();
            assert_eq!(config.threads, 0);
        }
    }

    #[test]
    fn torch_environment_sets_every_variable_libgomp_and_mkl_read() {
        assert_eq!(
            torch_environment(1, WaitPolicy::Active),
            vec![
                ("OMP_NUM_THREADS", Some("1".into())),
                ("MKL_NUM_THREADS", Some("1".into())),
                ("OMP_WAIT_POLICY", Some("ACTIVE".into())),
            ]
        );
        assert_eq!(
            torch_environment(4, WaitPolicy::Inherit)[2],
            ("OMP_WAIT_POLICY", None)
        );
    }

    #[test]
    fn a_test_process_is_not_a_stage_binary_and_is_left_as_it_is() {
        assert!(!is_stage_binary("collect-rollouts"));
        let config = ThreadsConfig {
            threads: 3,
            omp_wait_policy: Some(WaitPolicy::Active),
        };
        let before = CpuList::of_this_thread().unwrap();
        let applied = apply("collect-rollouts", Threads::Torch, &config).unwrap();
        assert!(!applied.set_up && !applied.pinned && !applied.reexecuted);
        assert_eq!((applied.threads, applied.source), (3, "threads"));
        assert_eq!(applied.cpus, before);
        assert_eq!(CpuList::of_this_thread().unwrap(), before);
        let lines = applied.summary_lines();
        assert_eq!(lines[0].0, "threads");
        assert!(lines[0].1.starts_with("3 would be set"), "{lines:?}");
        assert_eq!(lines[1], ("omp_wait_policy", "active".to_string()));
    }
}
