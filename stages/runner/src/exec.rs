//! Running a plan: for each instance in order, the cache check, the stage
//! process (or `shards` processes at once, then a merge of their tables),
//! and `_step.json` written last.
//!
//! Stage processes die with the runner: each is started with Linux's
//! `PR_SET_PDEATHSIG` = SIGKILL, which the kernel sends when the thread that
//! forked it ends. `execute` starts and waits for a step's processes on
//! one thread (the runner's main thread under `pipeline run`), so that
//! thread outlives them and the signal comes only when the runner itself is
//! gone, `kill -9` included. The run directory's lock (`Lock`) is an
//! `flock` that every stage process inherits, so a resumed run starts only
//! once the killed run's processes have all exited and none of them can
//! write into a step directory the new run is filling. The lock lies in
//! `OUT/_runner`, which belongs to the user running the runner alone (made
//! 0700, its lock 0600; see `private_runner_dir`), so another user beside
//! the run directory can neither take the lock nor hold it open.
//!
//! Every process computes with the thread count its step declares
//! (`cpus`, one by default; the stage's `threads` key when set), whatever
//! this machine has, as on the cluster backends: the runner passes it in
//! `OMP_NUM_THREADS`, `MKL_NUM_THREADS` and `RAYON_NUM_THREADS`, and
//! libtorch's dispatch level in `ATEN_CPU_CAPABILITY`
//! ([`cache::process_environment`]), which the step's cache key holds. So a
//! sharded step's shards compute exactly as its unsharded run, and a step
//! gives the same bits here, under Slurm and under Ray.
//!
//! The `shards = n` processes of a step run at once, so each gets its own
//! equal, disjoint share of the runner's CPUs (`EMBODYFLOW_CPUS` when the
//! runner's environment sets it, else the CPUs the runner may run on),
//! passed in its environment as `EMBODYFLOW_CPUS`, which the stage pins
//! itself to ([`embodyflow_core::threads`]), so n processes on n shares do
//! not fight over the same cores. With more shards than CPUs each gets one
//! CPU, in turn. A step of one process, and every step after another (the
//! runner runs one step at a time; only a step's shards run together), runs
//! on the runner's CPUs.
//!
//! The processes take the step's `devices` in turn. A CUDA device `cuda:N`
//! becomes the only GPU its process sees (`CUDA_VISIBLE_DEVICES`: GPU N, or
//! the N-th of the runner's own `CUDA_VISIBLE_DEVICES`) and the process runs
//! with `--device cuda`, as a Slurm job does on the GPU Slurm grants it
//! ([`local_device`]); a CPU process keeps the runner's environment.

use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use embodyflow_core::commit::Commit;
use embodyflow_core::dataset::stage_merged_table;
use embodyflow_core::spec::Output;
use embodyflow_core::threads::{CPUS_VAR, CpuList, env_cpus, shares};

use crate::cache::{self, BinaryHashes, KeyInputs, StepRecord, runner_dir};
use crate::check::{Checked, binary};
use crate::error::{Result, RunnerError};
use crate::plan::{Instance, Plan};

/// How to run a plan.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Where the stage binaries are.
    pub bin_dir: PathBuf,
    /// Print the plan and what is cached; run nothing.
    pub dry_run: bool,
    /// Rerun this step's instances and everything after them.
    pub from: Option<String>,
    /// Run only this step's instances (others must be complete).
    pub only: Option<String>,
}

/// What happened to an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Its outputs matched the key: not run.
    Cached,
    /// Run now.
    Ran,
    /// Dry run: would run.
    WouldRun,
    /// Not selected by `--only`: used as it is.
    Kept,
    /// Its `skip_if_empty` table had no rows: the policy was passed on.
    PassedOn,
}

impl Status {
    /// A word for tables.
    pub fn word(self) -> &'static str {
        match self {
            Status::Cached => "cached",
            Status::Ran => "ran",
            Status::WouldRun => "would run",
            Status::Kept => "kept",
            Status::PassedOn => "passed on",
        }
    }
}

/// One instance's outcome.
#[derive(Debug, Clone)]
pub struct StepOutcome {
    /// Index into the plan.
    pub index: usize,
    /// What happened.
    pub status: Status,
    /// Stage wall seconds: of this run when it ran, as recorded in
    /// `_step.json` when cached or kept (never 0 for a step that ran once).
    pub wall_s: f64,
    /// Runner seconds spent on the instance outside the stage processes
    /// (hashing, cache check, merge, record).
    pub overhead_s: f64,
}

/// A run's outcome.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// Per instance, in plan order.
    pub steps: Vec<StepOutcome>,
    /// Notes (stages not built under a dry run).
    pub notes: Vec<String>,
    /// Seconds spent planning and checking before the first stage.
    pub check_s: f64,
    /// Seconds spent hashing binaries.
    pub binary_hash_s: f64,
    /// Total wall seconds.
    pub total_s: f64,
}

/// How long a new runner waits for the stage processes of a killed runner
/// to exit (they were sent SIGKILL when it died; exiting takes milliseconds
/// unless a process is in uninterruptible I/O).
pub(crate) const LEFTOVER_WAIT: Duration = Duration::from_secs(10);

/// Holds `OUT/_runner/lock` while a runner uses the run directory: an
/// exclusive `flock` on the file, which also names the runner's pid. Its
/// descriptor stays open across `exec`, so every stage process the runner
/// starts holds the lock too (a stage re-executing itself keeps it), and it
/// is free again only when the runner and all of them have exited. A
/// stage's helper processes do not hold it: the Gymnasium bridge's workers
/// close the descriptors they inherit when they start, so a worker stuck in
/// native code after its stage is gone cannot keep a run from resuming.
pub(crate) struct Lock {
    _file: File,
}

impl Lock {
    /// Takes the lock, waiting up to `wait` for the stage processes of a
    /// runner that is gone.
    pub(crate) fn take(out: &Path, wait: Duration) -> Result<Lock> {
        use rustix::fs::{FlockOperation, flock};
        let dir = runner_dir(out);
        let path = dir.join("lock");
        let mut file = private_lock_file(&private_runner_dir(out)?, &path)?;
        let started = Instant::now();
        loop {
            match flock(&file, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => break,
                Err(rustix::io::Errno::WOULDBLOCK) => {
                    let holder = std::fs::read_to_string(&path)
                        .ok()
                        .and_then(|t| t.trim().parse::<u32>().ok());
                    if let Some(pid) = holder
                        && Path::new("/proc").join(pid.to_string()).exists()
                    {
                        return Err(RunnerError::Locked {
                            dir: out.to_path_buf(),
                            pid,
                            lock: path,
                        });
                    }
                    // The runner that took it is gone; its stage processes,
                    // killed with it, have not finished exiting yet.
                    if started.elapsed() > wait {
                        return Err(RunnerError::Leftovers {
                            dir: out.to_path_buf(),
                            pid: holder,
                            lock: path,
                            waited_s: wait.as_secs_f64(),
                        });
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(RunnerError::io(&path, e.into())),
            }
        }
        file.set_len(0)
            .and_then(|()| file.write_all(std::process::id().to_string().as_bytes()))
            .map_err(|e| RunnerError::io(&path, e))?;
        rustix::io::fcntl_setfd(&file, rustix::io::FdFlags::empty())
            .map_err(|e| RunnerError::io(&path, e.into()))?;
        Ok(Lock { _file: file })
    }
}

/// Opens `OUT/_runner`, the runner's own directory, for the user running
/// it alone ([`embodyflow_core::private_dir`]): where it is new it is
/// created (exclusively) with mode 0700; where it exists it must be a
/// directory (not a symbolic link) of this user that neither group nor
/// others may write into, and is made 0700. Otherwise another user could
/// put their own lock there, or open it and so block every run on the
/// directory.
pub(crate) fn private_runner_dir(out: &Path) -> Result<std::os::fd::OwnedFd> {
    use embodyflow_core::private_dir::{IfExists, PrivateDirError, private_dir};
    private_dir(&runner_dir(out), IfExists::Reuse).map_err(|e| match e {
        PrivateDirError::Io { path, source } => RunnerError::io(&path, source),
        PrivateDirError::Unsafe { path, problem } => unsafe_path(&path, problem),
    })
}

/// Opens (creating it with mode 0600) the lock file in the runner's
/// directory `dir`, refusing a symbolic link or a file of another user; a
/// lock of this user that others may read (0644, as runners made it
/// before) is made 0600, since `flock` needs only a read descriptor.
fn private_lock_file(dir: &std::os::fd::OwnedFd, path: &Path) -> Result<File> {
    use rustix::fs::{FileType, Mode, OFlags, fchmod, fstat, openat};
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = match openat(dir, "lock", flags, Mode::RUSR | Mode::WUSR) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::LOOP) => {
            return Err(unsafe_path(path, "is a symbolic link".into()));
        }
        Err(e) => return Err(RunnerError::io(path, e.into())),
    };
    let stat = fstat(&fd).map_err(|e| RunnerError::io(path, e.into()))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(unsafe_path(path, "is not a regular file".into()));
    }
    owned_by_this_user(path, stat.st_uid)?;
    if stat.st_mode & 0o7777 != 0o600 {
        fchmod(&fd, Mode::RUSR | Mode::WUSR).map_err(|e| RunnerError::io(path, e.into()))?;
    }
    Ok(File::from(fd))
}

fn owned_by_this_user(path: &Path, uid: u32) -> Result<()> {
    let me = rustix::process::geteuid().as_raw();
    if uid == me {
        Ok(())
    } else {
        Err(unsafe_path(
            path,
            format!("is owned by uid {uid}, not by this user (uid {me})"),
        ))
    }
}

fn unsafe_path(path: &Path, problem: String) -> RunnerError {
    RunnerError::UnsafeRunDir {
        path: path.to_path_buf(),
        problem,
    }
}

/// The last `lines` lines of a log.
pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The CPUs the runner shares among a step's processes: `EMBODYFLOW_CPUS`
/// when its environment sets it (a bad list is a usage error), else the
/// CPUs it may run on.
fn runner_cpus() -> Result<CpuList> {
    match env_cpus().map_err(RunnerError::Usage)? {
        Some(cpus) => Ok(cpus),
        None => CpuList::of_this_thread()
            .map_err(|e| RunnerError::io("/proc/self (sched_getaffinity)", e)),
    }
}

/// The `EMBODYFLOW_CPUS` of each of a step's `n` processes: none for one
/// process (it inherits the runner's), an equal disjoint share of `cpus`
/// each for several.
fn shard_cpus(cpus: &CpuList, n: u32) -> Vec<Option<CpuList>> {
    if n <= 1 {
        return vec![None; n as usize];
    }
    shares(cpus.cpus(), n as usize)
        .into_iter()
        .map(Some)
        .collect()
}

/// Starts a stage process that receives SIGKILL when the calling thread
/// ends (see the module documentation: call it from the thread that waits
/// for the process), with `env` added to its environment (its CPUs,
/// `EMBODYFLOW_CPUS`, and GPU, `CUDA_VISIBLE_DEVICES`).
pub(crate) fn spawn(
    bin: &Path,
    args: &[String],
    log: &Path,
    env: &[(String, String)],
) -> Result<Child> {
    let file = File::create(log).map_err(|e| RunnerError::io(log, e))?;
    let err = file.try_clone().map_err(|e| RunnerError::io(log, e))?;
    let mut command = Command::new(bin);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err);
    command.envs(env.iter().map(|(k, v)| (k, v)));
    die_with_runner(&mut command);
    command.spawn().map_err(|e| RunnerError::io(bin, e))
}

/// The variable naming the GPUs a CUDA process sees.
pub(crate) const GPUS_VAR: &str = "CUDA_VISIBLE_DEVICES";

/// The `--device` of a local process of a step and the
/// `CUDA_VISIBLE_DEVICES` it runs with, for the device `device` of the
/// step's list: `cuda:N` is the runner's N-th GPU (the N-th entry of its own
/// `CUDA_VISIBLE_DEVICES` when `visible` has it, else GPU N), the only one
/// the process sees, so its device is `cuda` (as under Slurm, where Slurm
/// sets the variable); a CPU device is passed as it is, the environment
/// untouched. A GPU beyond the runner's visible ones is an error.
pub fn local_device(
    device: &str,
    visible: Option<&str>,
) -> std::result::Result<(String, Option<String>), String> {
    use embodyflow_core::cli::Device;
    match device.parse::<Device>().map_err(|e| e.to_string())? {
        Device::Cpu => Ok((device.to_string(), None)),
        Device::Cuda(n) => {
            let gpu = match visible {
                None => n.to_string(),
                Some(list) => {
                    let ids: Vec<&str> = list
                        .split(',')
                        .map(str::trim)
                        .filter(|id| !id.is_empty())
                        .collect();
                    ids.get(n).map(|id| id.to_string()).ok_or_else(|| {
                        format!(
                            "device {device}, and the runner's {GPUS_VAR}={list:?} makes {} GPU(s) visible",
                            ids.len()
                        )
                    })?
                }
            };
            Ok(("cuda".to_string(), Some(gpu)))
        }
    }
}

/// Sets `PR_SET_PDEATHSIG` = SIGKILL in the child before it runs the stage,
/// then checks that its parent is still the runner: had the runner died
/// before the `prctl`, nothing would ever signal the child, so it gives up
/// instead (the spawn fails).
#[allow(unsafe_code)]
fn die_with_runner(command: &mut Command) {
    use rustix::process::{Signal, getpid, getppid, set_parent_process_death_signal};
    let runner = getpid();
    // SAFETY: the closure runs in the forked child before `exec`, where only
    // async-signal-safe work is allowed. It makes two system calls (prctl,
    // getppid) through rustix, and builds its error from an errno or an
    // `ErrorKind`: it allocates nothing and takes no lock.
    unsafe {
        command.pre_exec(move || {
            set_parent_process_death_signal(Some(Signal::KILL))?;
            if getppid() != Some(runner) {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            Ok(())
        });
    }
}

/// The first output the stage declares that `out` (one process's `--out`)
/// lacks.
pub(crate) fn missing_output(instance: &Instance, out: &Path) -> Option<PathBuf> {
    instance.stage.writes.iter().find_map(|output| {
        let path = out.join(output.path());
        let present = match output {
            Output::Table(_) => embodyflow_core::manifest::is_table_dir(&path),
            Output::Checkpoint(_) => path.join("manifest.json").is_file(),
            Output::File(_) => path.is_file(),
        };
        (!present).then_some(path)
    })
}

/// The output directory of process `i` of an instance: the step's
/// directory, or `_shards/<i>/` in it when the step is sharded.
pub fn process_out(instance: &Instance, i: u32) -> PathBuf {
    if instance.shards == 1 {
        instance.dir.clone()
    } else {
        instance.dir.join("_shards").join(i.to_string())
    }
}

/// The command line of process `i` of an instance, binary first: the
/// stage's arguments, `--out`, `--device` and, for a sharded step,
/// `--shard i/n`. Every backend runs exactly this.
pub fn stage_command(instance: &Instance, bin: &Path, i: u32, device: &str) -> Vec<String> {
    let mut command = vec![bin.display().to_string()];
    command.extend(instance.stage_args());
    command.extend([
        "--out".to_string(),
        process_out(instance, i).display().to_string(),
        "--device".to_string(),
        device.to_string(),
    ]);
    if instance.shards > 1 {
        command.extend(["--shard".to_string(), format!("{i}/{}", instance.shards)]);
    }
    command
}

/// Where the log of process `i` of an instance is written while it runs
/// (it moves into the step directory when the step completes).
pub fn process_log(out: &Path, instance: &Instance, i: u32) -> PathBuf {
    runner_dir(out)
        .join("logs")
        .join(&instance.id)
        .join(format!("{i}.log"))
}

/// Moves the logs of a completed step's processes into its directory
/// (`_stage.log`, or `_stage.<i>.log` for a sharded step).
pub(crate) fn keep_logs(out: &Path, instance: &Instance) {
    for i in 0..instance.shards {
        let name = if instance.shards == 1 {
            "_stage.log".to_string()
        } else {
            format!("_stage.{i}.log")
        };
        let _ = std::fs::rename(process_log(out, instance, i), instance.dir.join(name));
    }
    let _ = std::fs::remove_dir(runner_dir(out).join("logs").join(&instance.id));
}

/// Removes a step's record and directory before it runs again: a run
/// killed from here on is never taken for complete.
pub(crate) fn clear(instance: &Instance) -> Result<()> {
    let dir = &instance.dir;
    let _ = std::fs::remove_file(dir.join(cache::STEP_FILE));
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| RunnerError::io(dir, e))?;
    }
    Ok(())
}

/// Writes the record of a step that completed (`_step.json`, last).
pub(crate) fn complete(
    instance: &Instance,
    (key, key_parts): (String, serde_json::Value),
    commands: Vec<Vec<String>>,
    wall_s: f64,
) -> Result<()> {
    let record = StepRecord {
        format: cache::STEP_FORMAT.into(),
        key,
        key_parts,
        id: instance.id.clone(),
        stage: instance.stage.name.to_string(),
        commands,
        outputs: cache::outputs_of(instance)?,
        wall_s,
        finished_unix: unix_now(),
    };
    cache::write_record(&instance.dir, &record)
}

/// Runs one instance into its directory, each process with `env` added to
/// its environment ([`cache::process_environment`]); returns the command
/// lines and the stage wall seconds.
fn execute(
    instance: &Instance,
    bin: &Path,
    out: &Path,
    env: &[(String, String)],
    watch: &mut dyn FnMut(&Path),
) -> Result<(Vec<Vec<String>>, f64)> {
    let dir = &instance.dir;
    clear(instance)?;
    // The stage creates its output directory (init-policy insists on a new
    // one); logs go to the runner's directory and move in on success.
    let log_base = runner_dir(out).join("logs").join(&instance.id);
    std::fs::create_dir_all(&log_base).map_err(|e| RunnerError::io(&log_base, e))?;
    let started = Instant::now();
    let n = instance.shards;
    let cpus = if n > 1 {
        shard_cpus(&runner_cpus()?, n)
    } else {
        vec![None]
    };
    let mut commands = Vec::new();
    let mut children = Vec::new();
    if n > 1 {
        let shards = dir.join("_shards");
        std::fs::create_dir_all(&shards).map_err(|e| RunnerError::io(&shards, e))?;
    }
    let visible = std::env::var(GPUS_VAR).ok();
    for i in 0..n {
        let log = process_log(out, instance, i);
        let device = &instance.devices[i as usize % instance.devices.len()];
        let (device, gpu) = local_device(device, visible.as_deref())
            .map_err(|message| RunnerError::Usage(format!("step `{}`: {message}", instance.id)))?;
        let command = stage_command(instance, bin, i, &device);
        let mut env = env.to_vec();
        if let Some(cpus) = &cpus[i as usize] {
            env.push((CPUS_VAR.to_string(), cpus.to_string()));
        }
        if let Some(gpu) = gpu {
            env.push((GPUS_VAR.to_string(), gpu));
        }
        children.push((spawn(bin, &command[1..], &log, &env)?, log));
        commands.push(command);
    }
    let mut failure = None;
    let mut logs_done = Vec::new();
    for (status, log) in wait_watching(children, bin, watch)? {
        if !status.success() && failure.is_none() {
            failure = Some(RunnerError::StageFailed {
                step: instance.id.clone(),
                stage: instance.stage.name,
                code: status.code().unwrap_or(-1),
                tail: tail(&log, 20),
                log: log.clone(),
            });
        }
        logs_done.push(log);
    }
    if let Some(failure) = failure {
        return Err(failure);
    }
    for (i, log) in (0..n).zip(&logs_done) {
        if let Some(path) = missing_output(instance, &process_out(instance, i)) {
            return Err(RunnerError::MissingOutput {
                step: instance.id.clone(),
                stage: instance.stage.name,
                path,
                log: log.clone(),
            });
        }
    }
    let wall = started.elapsed().as_secs_f64();
    if n > 1 {
        merge_shards(instance, dir)?;
    }
    std::fs::create_dir_all(dir).map_err(|e| RunnerError::io(dir, e))?;
    keep_logs(out, instance);
    Ok((commands, wall))
}

/// How often a running step's log is looked at.
const WATCH_EVERY: Duration = Duration::from_millis(250);

/// Waits for every process of a step on this thread (see the module
/// documentation), calling `watch` with the log of the first one still
/// running every [`WATCH_EVERY`]; the exit statuses in order.
fn wait_watching(
    mut children: Vec<(Child, PathBuf)>,
    bin: &Path,
    watch: &mut dyn FnMut(&Path),
) -> Result<Vec<(std::process::ExitStatus, PathBuf)>> {
    let mut statuses = vec![None; children.len()];
    loop {
        for (k, (child, _)) in children.iter_mut().enumerate() {
            if statuses[k].is_none() {
                statuses[k] = child.try_wait().map_err(|e| RunnerError::io(bin, e))?;
            }
        }
        match statuses.iter().position(Option::is_none) {
            Some(k) => watch(&children[k].1),
            None => break,
        }
        std::thread::sleep(WATCH_EVERY);
    }
    Ok(statuses
        .into_iter()
        .zip(children)
        .map(|(status, (_, log))| (status.expect("every process exited"), log))
        .collect())
}

/// Merges the tables the stage declares from `dir/_shards/<i>/` into `dir/`
/// and joins the shards' summaries (a declared file, not a table, stays in
/// each shard's directory).
pub(crate) fn merge_shards(instance: &Instance, dir: &Path) -> Result<()> {
    let shard_dirs: Vec<PathBuf> = (0..instance.shards)
        .map(|i| dir.join("_shards").join(i.to_string()))
        .collect();
    // Every table equals the unsharded run's (same content hash); a stage's
    // tables are committed together, as the stage commits them.
    let mut commit = Commit::new(dir);
    for table in instance.stage.written_tables() {
        let parts: Vec<PathBuf> = shard_dirs.iter().map(|s| s.join(table.as_str())).collect();
        let (_, staged) = stage_merged_table(&parts, dir, false)?.into_parts();
        commit.absorb(staged)?;
    }
    commit.apply()?;
    let summary_name = format!("_summary.{}.md", instance.stage.name);
    let mut summary = String::new();
    for (i, shard) in shard_dirs.iter().enumerate() {
        if let Ok(text) = std::fs::read_to_string(shard.join(&summary_name)) {
            summary.push_str(&format!("<!-- shard {i}/{} -->\n{text}\n", instance.shards));
        }
    }
    if !summary.is_empty() {
        let path = dir.join(&summary_name);
        std::fs::write(&path, summary).map_err(|e| RunnerError::io(&path, e))?;
    }
    Ok(())
}

/// Whether the `skip_if_empty` table holds no rows.
pub(crate) fn is_empty(table: Option<&Path>) -> Result<bool> {
    match table {
        None => Ok(false),
        Some(dir) => Ok(embodyflow_core::manifest::Manifest::read(dir)?.num_rows == 0),
    }
}

/// An update with nothing to learn from: `policy/` links to the input policy.
pub(crate) fn pass_on(instance: &Instance) -> Result<()> {
    let dir = &instance.dir;
    clear(instance)?;
    std::fs::create_dir_all(dir).map_err(|e| RunnerError::io(dir, e))?;
    let policy = instance
        .policy
        .as_ref()
        .expect("checked: skip_if_empty needs a policy");
    let target = std::fs::canonicalize(policy).map_err(|e| RunnerError::io(policy, e))?;
    let link = dir.join("policy");
    std::os::unix::fs::symlink(&target, &link).map_err(|e| RunnerError::io(&link, e))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// The stage wall seconds recorded in a completed step's `_step.json`
/// (0 when unreadable), so that steps a run keeps report their last timing.
fn recorded_wall_s(dir: &Path) -> f64 {
    std::fs::read_to_string(dir.join(cache::STEP_FILE))
        .ok()
        .and_then(|text| serde_json::from_str::<StepRecord>(&text).ok())
        .map_or(0.0, |record| record.wall_s)
}

/// The BLAKE3 hash of each stage binary the plan runs, by stage (those
/// built; remembered in `_runner/binaries.json` unless `dry_run`).
pub(crate) fn hash_binaries(
    plan: &Plan,
    options: &RunOptions,
) -> Result<std::collections::BTreeMap<String, String>> {
    let hashes_path = runner_dir(&plan.out).join("binaries.json");
    let mut hashes = BinaryHashes::load(&hashes_path);
    let mut binaries = std::collections::BTreeMap::new();
    for stage in plan
        .instances
        .iter()
        .map(|i| i.stage.name)
        .collect::<BTreeSet<_>>()
    {
        let bin = binary(&options.bin_dir, stage);
        if bin.is_file() {
            binaries.insert(stage.to_string(), hashes.hash(&bin)?);
        }
    }
    if !options.dry_run {
        hashes.save(&hashes_path)?;
    }
    Ok(binaries)
}

/// The steps `--from` and `--only` name, for every backend: forced to
/// run, or kept as they are.
pub(crate) struct Selection {
    from: Option<usize>,
    only: Option<BTreeSet<usize>>,
}

impl Selection {
    pub(crate) fn of(plan: &Plan, options: &RunOptions) -> Result<Selection> {
        Ok(Selection {
            from: match &options.from {
                Some(name) => plan.select(name)?.into_iter().next(),
                None => None,
            },
            only: match &options.only {
                Some(name) => Some(plan.select(name)?),
                None => None,
            },
        })
    }

    /// Runs whatever the cache says: from `--from` on, or named by `--only`.
    pub(crate) fn forced(&self, index: usize) -> bool {
        self.from.is_some_and(|f| index >= f)
            || self.only.as_ref().is_some_and(|o| o.contains(&index))
    }

    /// Kept as it is: outside `--only`, which needs the step completed
    /// (a dry run does not ask).
    pub(crate) fn kept(&self, plan: &Plan, index: usize, dry_run: bool) -> Result<bool> {
        let Some(only) = &self.only else {
            return Ok(false);
        };
        if only.contains(&index) {
            return Ok(false);
        }
        let instance = &plan.instances[index];
        if !dry_run && !instance.dir.join(cache::STEP_FILE).is_file() {
            return Err(RunnerError::Usage(format!(
                "--only: step `{}` has not completed in {}; run the pipeline without --only first",
                instance.id,
                plan.out.display()
            )));
        }
        Ok(true)
    }
}

/// Runs (or under `dry_run`, describes) the plan. `say` receives one line per
/// instance as it completes, and `log` each completed instance.
pub fn run_plan(
    plan: &Plan,
    options: &RunOptions,
    log: Option<&crate::runlog::Live>,
    say: &mut dyn FnMut(&str),
) -> Result<RunOutcome> {
    let started = Instant::now();
    let checked = crate::check::check_plan(plan, &options.bin_dir, options.dry_run)?;
    let machine = cache::machine(&options.bin_dir);
    let visible = std::env::var(GPUS_VAR).ok();
    for instance in &plan.instances {
        for device in &instance.devices {
            local_device(device, visible.as_deref()).map_err(|message| {
                RunnerError::Usage(format!("step `{}`: {message}", instance.id))
            })?;
        }
    }
    let check_s = started.elapsed().as_secs_f64();
    let selection = Selection::of(plan, options)?;
    let _lock = if options.dry_run {
        None
    } else {
        Some(Lock::take(&plan.out, LEFTOVER_WAIT)?)
    };
    // Declared after the lock: dropped first, so the workers are gone
    // before the run directory is free again.
    let mut kept = (plan.keep_workers > 0 && !options.dry_run).then(|| {
        let adapters = crate::workers::named_adapters(&checked.configs);
        crate::workers::KeptWorkers::new(&plan.out, plan.keep_workers, adapters)
    });
    let hash_started = Instant::now();
    let binaries = hash_binaries(plan, options)?;
    let binary_hash_s = hash_started.elapsed().as_secs_f64();
    let mut display = crate::watch::Status::new(plan.instances.len() as u64);
    let mut costs = crate::watch::Costs::of(plan);
    let mut steps = Vec::new();
    let mut pending: BTreeSet<usize> = BTreeSet::new();
    for (index, instance) in plan.instances.iter().enumerate() {
        let t0 = Instant::now();
        let forced = selection.forced(index);
        let bin = binary(&options.bin_dir, instance.stage.name);
        let mut outcome = StepOutcome {
            index,
            status: Status::Cached,
            wall_s: 0.0,
            overhead_s: 0.0,
        };
        if selection.kept(plan, index, options.dry_run)? {
            outcome.status = Status::Kept;
            outcome.wall_s = recorded_wall_s(&instance.dir);
        } else if options.dry_run {
            let blocked = instance.deps.iter().any(|d| pending.contains(d));
            let hit = (!forced && !blocked)
                .then(|| key_inputs(plan, &checked, &binaries, &machine, index))
                .flatten()
                .and_then(|inputs| cache::step_key(instance, &inputs).ok())
                .and_then(|(key, _)| cache::cached(instance, &key));
            match hit {
                Some(record) => outcome.wall_s = record.wall_s,
                None => {
                    outcome.status = Status::WouldRun;
                    pending.insert(index);
                }
            }
        } else {
            let inputs = key_inputs(plan, &checked, &binaries, &machine, index)
                .expect("checked: every stage is built and every config resolved");
            let (key, parts) = cache::step_key(instance, &inputs)?;
            match (!forced).then(|| cache::cached(instance, &key)).flatten() {
                Some(record) => outcome.wall_s = record.wall_s,
                None => {
                    let (commands, wall, status) = if is_empty(instance.skip_if_empty.as_deref())? {
                        pass_on(instance)?;
                        (Vec::new(), 0.0, Status::PassedOn)
                    } else {
                        let mut env = cache::process_environment(instance, &machine);
                        if let Some(kept) = &mut kept {
                            env.push(kept.env()?);
                        }
                        let started = Instant::now();
                        let mut watch = |log: &Path| {
                            let line = crate::watch::last_line(log);
                            let eta = costs.eta(index, started.elapsed().as_secs_f64());
                            display.show(&crate::watch::status_text(
                                &instance.id,
                                instance.stage.name,
                                line.as_deref(),
                                eta,
                            ));
                        };
                        let (commands, wall) =
                            execute(instance, &bin, &plan.out, &env, &mut watch)?;
                        costs.ran(index, wall);
                        (commands, wall, Status::Ran)
                    };
                    complete(instance, (key, parts), commands, wall)?;
                    outcome.status = status;
                    outcome.wall_s = wall;
                }
            }
        }
        if let Some(log) = log
            && outcome.status != Status::WouldRun
        {
            log.done(index)?;
        }
        let spent = t0.elapsed().as_secs_f64();
        outcome.overhead_s = if outcome.status == Status::Ran {
            (spent - outcome.wall_s).max(0.0)
        } else {
            spent
        };
        let text = format!(
            "[{:>3}/{}] {:<40} {:<19} {:<9} {}",
            index + 1,
            plan.instances.len(),
            instance.id,
            instance.stage.name,
            outcome.status.word(),
            match outcome.status {
                Status::Ran => format!("{:.1} s", outcome.wall_s),
                Status::Cached => format!("(ran in {:.1} s)", outcome.wall_s),
                _ => String::new(),
            }
        );
        display.suspend(|| say(&text));
        display.inc();
        steps.push(outcome);
    }
    display.finish();
    if let Some(line) = kept.as_ref().and_then(|k| k.summary()) {
        say(&line);
    }
    Ok(RunOutcome {
        steps,
        notes: checked.notes,
        check_s,
        binary_hash_s,
        total_s: started.elapsed().as_secs_f64(),
    })
}

/// The key inputs of instance `index` ([`KeyInputs::of`]); none when its
/// stage is not built (a dry run).
pub(crate) fn key_inputs(
    plan: &Plan,
    checked: &Checked,
    binaries: &std::collections::BTreeMap<String, String>,
    machine: &embodyflow_core::numerics::Machine,
    index: usize,
) -> Option<KeyInputs> {
    let instance = &plan.instances[index];
    let binary = binaries.get(instance.stage.name)?;
    let config = checked.configs.get(index)?.as_ref()?;
    Some(KeyInputs::of(instance, binary, config, machine))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_pid(out: &Path, pid: u32) {
        std::fs::write(runner_dir(out).join("lock"), pid.to_string()).unwrap();
    }

    /// A pid that no process has now.
    fn dead_pid() -> u32 {
        let mut child = Command::new("true").spawn().unwrap();
        child.wait().unwrap();
        child.id()
    }

    #[test]
    fn the_lock_is_held_until_the_runner_and_its_stage_processes_are_gone() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path();
        let wait = Duration::from_millis(300);
        let lock = Lock::take(out, wait).unwrap();
        // A stage process started now inherits the lock.
        let mut stage = Command::new("sleep").arg("30").spawn().unwrap();
        let err = Lock::take(out, wait).err().expect("held by this process");
        assert!(
            matches!(err, RunnerError::Locked { pid, .. } if pid == std::process::id()),
            "{err}"
        );
        // The runner is gone (its lock closed, its pid dead); its stage
        // process still holds the lock.
        drop(lock);
        write_pid(out, dead_pid());
        let started = Instant::now();
        let err = Lock::take(out, wait)
            .err()
            .expect("held by the stage process");
        assert!(started.elapsed() >= wait);
        assert!(
            matches!(err, RunnerError::Leftovers { .. }) && err.to_string().contains("fuser -v"),
            "{err}"
        );
        stage.kill().unwrap();
        stage.wait().unwrap();
        let _lock = Lock::take(out, wait).unwrap();
        let text = std::fs::read_to_string(runner_dir(out).join("lock")).unwrap();
        assert_eq!(text, std::process::id().to_string());
    }

    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    }

    /// The lock file as `Lock::take` opens it, without taking it: a lock
    /// taken here would be inherited by the processes other tests start.
    fn open_lock(out: &Path) -> Result<File> {
        private_lock_file(&private_runner_dir(out)?, &runner_dir(out).join("lock"))
    }

    fn refusal(out: &Path) -> String {
        use embodyflow_core::Classify as _;
        let err = open_lock(out).err().expect("refused");
        assert!(matches!(err, RunnerError::UnsafeRunDir { .. }), "{err}");
        assert_eq!(err.kind(), embodyflow_core::ErrorKind::BadInput, "{err}");
        err.to_string()
    }

    #[test]
    fn the_runner_directory_and_its_lock_are_the_users_alone() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        let runner = runner_dir(&out);
        let lock = runner.join("lock");
        open_lock(&out).unwrap();
        assert_eq!(mode(&runner), 0o700);
        assert_eq!(mode(&lock), 0o600);

        // A lock others may read (as runners made it before) is made 0600.
        std::fs::set_permissions(&lock, std::fs::Permissions::from_mode(0o644)).unwrap();
        open_lock(&out).unwrap();
        assert_eq!(mode(&lock), 0o600);
        // A `_runner` of this user that others may only read is kept.
        std::fs::set_permissions(&runner, std::fs::Permissions::from_mode(0o755)).unwrap();
        open_lock(&out).unwrap();

        // Writable by others: refused, naming the directory and the mode.
        for (bits, whom) in [(0o777, "all users"), (0o770, "its group")] {
            std::fs::set_permissions(&runner, std::fs::Permissions::from_mode(bits)).unwrap();
            let message = refusal(&out);
            assert!(
                message.contains(&format!(
                    "{} is writable by {whom} (mode 0{bits:o})",
                    runner.display()
                )),
                "{message}"
            );
        }
        std::fs::set_permissions(&runner, std::fs::Permissions::from_mode(0o700)).unwrap();

        // A lock that is a symbolic link is not followed.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, "").unwrap();
        std::fs::remove_file(&lock).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &lock).unwrap();
        let message = refusal(&out);
        assert!(
            message.contains(&format!("{} is a symbolic link", lock.display())),
            "{message}"
        );
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "");
        std::fs::remove_file(&lock).unwrap();

        // Nor is a `_runner` that is one.
        let other = dir.path().join("other");
        std::fs::create_dir(&other).unwrap();
        let linked = dir.path().join("linked");
        std::fs::create_dir(&linked).unwrap();
        std::os::unix::fs::symlink(&other, runner_dir(&linked)).unwrap();
        let message = refusal(&linked);
        assert!(message.contains("_runner is a symbolic link"), "{message}");
        assert!(!other.join("lock").exists());

        // Another user's directory or lock (only root can make them here).
        if rustix::process::geteuid().is_root() {
            let nobody = Some(65534);
            std::os::unix::fs::chown(&runner, nobody, nobody).unwrap();
            let message = refusal(&out);
            assert!(
                message.contains(&format!(
                    "{} is owned by uid 65534, not by this user (uid 0)",
                    runner.display()
                )),
                "{message}"
            );
            std::os::unix::fs::chown(&runner, Some(0), Some(0)).unwrap();
            open_lock(&out).unwrap();
            std::os::unix::fs::chown(&lock, nobody, nobody).unwrap();
            let message = refusal(&out);
            assert!(
                message.contains(&format!("{} is owned by uid 65534", lock.display())),
                "{message}"
            );
        }
    }

    #[test]
    fn the_shards_of_a_step_get_disjoint_cpu_shares() {
        let four: CpuList = "0-3".parse().unwrap();
        assert_eq!(shard_cpus(&four, 1), vec![None], "one process inherits");
        let two: Vec<String> = shard_cpus(&four, 2)
            .into_iter()
            .map(|c| c.unwrap().to_string())
            .collect();
        assert_eq!(two, ["0-1", "2-3"]);
        let three: Vec<String> = shard_cpus(&four, 3)
            .into_iter()
            .map(|c| c.unwrap().to_string())
            .collect();
        assert_eq!(three, ["0-1", "2", "3"]);
        // The runner's own CPUs, shared among as many shards as it has.
        let mine = runner_cpus().unwrap();
        let n = mine.len() as u32;
        let mut seen: Vec<usize> = shard_cpus(&mine, n)
            .into_iter()
            .flat_map(|c| c.unwrap().cpus().to_vec())
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, mine.cpus(), "disjoint and covering");
    }

    #[test]
    fn a_cuda_shard_sees_only_its_gpu_and_runs_on_cuda() {
        let cases: [(&str, Option<&str>, Result<(&str, Option<&str>), &str>); 7] = [
            ("cpu", None, Ok(("cpu", None))),
            ("cpu", Some("0,1"), Ok(("cpu", None))),
            ("cuda", None, Ok(("cuda", Some("0")))),
            ("cuda:3", None, Ok(("cuda", Some("3")))),
            ("cuda:1", Some("4, 6"), Ok(("cuda", Some("6")))),
            ("cuda:0", Some("GPU-1a2b"), Ok(("cuda", Some("GPU-1a2b")))),
            ("cuda:2", Some("4,6"), Err("makes 2 GPU(s) visible")),
        ];
        for (device, visible, expected) in cases {
            let got = local_device(device, visible);
            match (got, expected) {
                (Ok((d, gpu)), Ok((want_d, want_gpu))) => {
                    assert_eq!((d.as_str(), gpu.as_deref()), (want_d, want_gpu), "{device}")
                }
                (Err(e), Err(says)) => assert!(e.contains(says), "{device}: {e}"),
                (got, _) => panic!("{device} with {visible:?}: {got:?}"),
            }
        }
    }

    #[test]
    fn a_stage_process_is_given_its_cpus_in_its_environment() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("env.log");
        let cpus: CpuList = "0".parse().unwrap();
        let env = [
            (CPUS_VAR.to_string(), cpus.to_string()),
            (GPUS_VAR.to_string(), "3".to_string()),
        ];
        let mut child = spawn(Path::new("env"), &[], &log, &env).unwrap();
        assert!(child.wait().unwrap().success());
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.lines().any(|l| l == "EMBODYFLOW_CPUS=0"), "{text}");
        assert!(
            text.lines().any(|l| l == "CUDA_VISIBLE_DEVICES=3"),
            "{text}"
        );
    }

    #[test]
    fn a_stage_process_dies_with_the_thread_that_started_it() {
        use std::os::unix::process::ExitStatusExt as _;
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sleep.log");
        // PR_SET_PDEATHSIG fires when the forking thread ends, which is why
        // `execute` starts and waits for its processes on one thread.
        let mut child = std::thread::scope(|scope| {
            scope
                .spawn(|| spawn(Path::new("sleep"), &["30".into()], &log, &[]).unwrap())
                .join()
                .unwrap()
        });
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "sleep {} outlived the thread that started it",
                child.id()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(status.signal(), Some(9), "{status:?}");
    }
}
