//! The wait every cluster backend shares ([`run_plan`]): which instances
//! are submitted ([`runs`]: a step whose record does not match, as
//! locally, or one reading a step that is submitted too), their preparation
//! ([`prepare`]: the step directory cleared, `spec.json` written), then
//! rounds in which the backend's [`Queue`] says which jobs are queued or
//! running and submits what may start, and every step's state follows from
//! that and the step records: pending, running, ran, failed, not run (a
//! step it reads failed). A failure is reported with a task's exit code and
//! the tail of its log, or for a job that ended without one the tail of the
//! cluster's own log of it ([`failure`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use super::figures::queue_figures;
use super::interface::{Backend, Run, SETTLE, refuse_live_jobs};
use super::journal::{TaskRecord, read_jobs, read_task, step_dir, write_file};
use super::queue::{JobState, Queue, State, Submitted};
use super::task::{TaskSpec, cluster_device};
use crate::cache::{self, KeyInputs, StepRecord, runner_dir};
use crate::check::binary;
use crate::error::{Result, RunnerError};
use crate::exec::{self, RunOptions, RunOutcome, Status, StepOutcome};
use crate::plan::{Instance, Plan};
use embodyflow_core::numerics::Machine;

/// How long the runner keeps asking a queue that does not answer before it
/// gives up on the run (its jobs may still run; a resumed run finds them).
const UNANSWERED: Duration = Duration::from_secs(300);

/// Why a step whose jobs are gone left no record: a task's exit code and
/// log tail, or the cluster's account of a job that ended without an exit
/// status.
pub(crate) fn failure(
    out: &Path,
    backend: &dyn Backend,
    queue: &mut dyn Queue,
    instance: &Instance,
    jobs: &[String],
) -> RunnerError {
    let dir = step_dir(out, backend.name(), instance);
    for i in 0..instance.shards {
        match read_task(&dir.join(format!("task-{i}.json"))) {
            Some(TaskRecord {
                code: Some(code), ..
            }) if code != 0 => {
                let log = exec::process_log(out, instance, i);
                return RunnerError::StageFailed {
                    step: instance.id.clone(),
                    stage: instance.stage.name,
                    code,
                    tail: exec::tail(&log, 20),
                    log,
                };
            }
            Some(TaskRecord { code: Some(_), .. }) => {}
            _ => {
                let lost = queue.lost(out, instance, jobs, Some(i));
                return RunnerError::JobFailed {
                    step: instance.id.clone(),
                    job: lost.job,
                    what: lost.what,
                    backend: backend.title(),
                    tail: exec::tail(&lost.log, 10),
                    log: lost.log,
                };
            }
        }
    }
    let lost = queue.lost(out, instance, jobs, None);
    let what = if instance.shards > 1 {
        "its shards succeeded and its merge job wrote no record"
    } else {
        "its stage succeeded and the job wrote no record"
    };
    RunnerError::JobFailed {
        step: instance.id.clone(),
        job: lost.job,
        what: if lost.what.is_empty() {
            what.to_string()
        } else {
            format!("{what} ({})", lost.what)
        },
        backend: backend.title(),
        tail: exec::tail(&lost.log, 10),
        log: lost.log,
    }
}

/// Which instances run: a miss, a forced step (`--from`, `--only`), or a
/// step reading one that runs. Returns every instance's outcome so far
/// (cached, kept, or to run) and the set that runs.
pub(crate) fn runs(
    plan: &Plan,
    options: &RunOptions,
    keys: &[Option<KeyInputs>],
) -> Result<(Vec<StepOutcome>, BTreeSet<usize>)> {
    let selection = exec::Selection::of(plan, options)?;
    let mut steps: Vec<StepOutcome> = Vec::new();
    let mut to_run: BTreeSet<usize> = BTreeSet::new();
    for (index, instance) in plan.instances.iter().enumerate() {
        let mut outcome = StepOutcome {
            index,
            status: Status::Cached,
            wall_s: 0.0,
            overhead_s: 0.0,
        };
        if selection.kept(plan, index, options.dry_run)? {
            outcome.status = Status::Kept;
            steps.push(outcome);
            continue;
        }
        let forced = selection.forced(index);
        let blocked = instance.deps.iter().any(|d| to_run.contains(d));
        let hit = match &keys[index] {
            Some(inputs) if !forced && !blocked => {
                let (key, _) = cache::step_key(instance, inputs)?;
                cache::cached(instance, &key)
            }
            _ => None,
        };
        match hit {
            Some(record) => outcome.wall_s = record.wall_s,
            None => {
                outcome.status = if options.dry_run {
                    Status::WouldRun
                } else {
                    Status::Ran
                };
                to_run.insert(index);
            }
        }
        steps.push(outcome);
    }
    Ok((steps, to_run))
}

/// Clears an instance that runs (its step directory, its earlier backend
/// directory and logs) and writes its `spec.json`.
fn prepare(
    run: &Run,
    backend: &str,
    index: usize,
    keys: &[Option<KeyInputs>],
    machine: &Machine,
) -> Result<Submitted> {
    let (plan, options) = (run.plan, run.options);
    let instance = &plan.instances[index];
    exec::clear(instance)?;
    let dir = step_dir(&plan.out, backend, instance);
    let logs = runner_dir(&plan.out).join("logs").join(&instance.id);
    for old in [&dir, &logs] {
        if old.exists() {
            std::fs::remove_dir_all(old).map_err(|e| RunnerError::io(old, e))?;
        }
    }
    std::fs::create_dir_all(&dir).map_err(|e| RunnerError::io(&dir, e))?;
    let bin = binary(&options.bin_dir, instance.stage.name);
    let commands: Vec<Vec<String>> = (0..instance.shards)
        .map(|i| {
            let device = &instance.devices[i as usize % instance.devices.len()];
            exec::stage_command(instance, &bin, i, cluster_device(device))
        })
        .collect();
    let spec_path = dir.join("spec.json");
    let spec = TaskSpec {
        out: plan.out.clone(),
        instance: instance.clone(),
        key_inputs: keys[index]
            .clone()
            .expect("checked: every stage is built and every config resolved"),
        commands,
        environment: cache::process_environment(instance, machine),
        cpu_capability: machine.cpu_capability,
    };
    write_file(
        &spec_path,
        &serde_json::to_string_pretty(&spec).expect("a task spec serialises"),
    )?;
    Ok(Submitted {
        index,
        spec: spec_path,
        commands: spec.commands,
        jobs: Vec::new(),
        label: String::new(),
        submitted_unix: 0.0,
        state: State::Pending,
        gone_since: None,
    })
}

/// The verdicts of this round on the steps a step reads: those that failed
/// (or did not run) and those not finished.
struct Verdicts {
    failed: BTreeSet<usize>,
    unfinished: BTreeSet<usize>,
}

/// The state of submitted step `s` this round, from the jobs `live` says
/// are queued or running, its record, and the verdicts on the steps it
/// reads; with the error of a step that failed. A step whose jobs are gone
/// without a record fails at once when a task recorded a non-zero exit,
/// else once its record has not shown for `[backend] record_grace_s` (a
/// network filesystem may show a file written on a node late).
fn next_state(
    run: &Run,
    backend: &dyn Backend,
    queue: &mut dyn Queue,
    s: &mut Submitted,
    live: &BTreeMap<String, Vec<JobState>>,
    verdicts: &Verdicts,
) -> (State, Option<RunnerError>) {
    let plan = run.plan;
    let (failed, unfinished) = (&verdicts.failed, &verdicts.unfinished);
    let instance = &plan.instances[s.index];
    let states: Vec<JobState> = s
        .jobs
        .iter()
        .filter_map(|j| live.get(j))
        .flatten()
        .copied()
        .collect();
    let record = std::fs::read_to_string(instance.dir.join(cache::STEP_FILE))
        .ok()
        .and_then(|t| serde_json::from_str::<StepRecord>(&t).ok());
    if !states.is_empty() {
        s.gone_since = None;
    }
    let new = if let Some(record) = record {
        State::Done(record)
    } else if let Some(dep) = instance.deps.iter().find(|d| failed.contains(d)) {
        State::NotRun(plan.instances[*dep].id.clone())
    } else if states.contains(&JobState::Running) {
        State::Running
    } else if !states.is_empty() {
        // A sharded step whose merge job waits has been running.
        if s.state == State::Running {
            State::Running
        } else {
            State::Pending
        }
    } else if s.jobs.is_empty() || instance.deps.iter().any(|d| unfinished.contains(d)) {
        // Not submitted yet, or Slurm cancels a job whose input
        // failed: wait for the verdict on what it reads.
        s.state.clone()
    } else {
        let gone = *s.gone_since.get_or_insert_with(Instant::now);
        let why = failure(&plan.out, backend, queue, instance, &s.jobs);
        if matches!(why, RunnerError::StageFailed { .. })
            || gone.elapsed() >= run.table.record_grace
        {
            let text = why.to_string();
            return (State::Failed(text), Some(why));
        }
        s.state.clone()
    };
    (new, None)
}

/// What the checks before a submission found: every instance's outcome so
/// far, the instances that run, what each one's key is computed from, and
/// the run directory's lock (none for a dry run).
struct Checked {
    steps: Vec<StepOutcome>,
    to_run: BTreeSet<usize>,
    keys: Vec<Option<KeyInputs>>,
    machine: Machine,
    notes: Vec<String>,
    check_s: f64,
    binary_hash_s: f64,
    _lock: Option<exec::Lock>,
}

/// Submits the steps that must run through `queue` and waits for them;
/// `say` receives a line per step whenever its state changes.
pub(crate) fn run_plan(
    run: &Run,
    backend: &dyn Backend,
    queue: &mut dyn Queue,
    say: &mut dyn FnMut(&str),
) -> Result<RunOutcome> {
    let started = Instant::now();
    let checked = check(run, queue, started)?;
    for step in &checked.steps {
        if step.status == Status::Cached || step.status == Status::Kept {
            let detail = if step.status == Status::Cached {
                format!("(ran in {:.1} s)", step.wall_s)
            } else {
                String::new()
            };
            say(&progress(run.plan, step.index, step.status.word(), &detail));
            if let Some(log) = run.log {
                log.done(step.index)?;
            }
        }
    }
    if run.options.dry_run {
        describe(run, queue, &checked.to_run, say);
        return Ok(outcome(checked, started));
    }
    let mut submitted: Vec<Submitted> = checked
        .to_run
        .iter()
        .map(|&index| {
            let keys = &checked.keys;
            prepare(run, backend.name(), index, keys, &checked.machine)
        })
        .collect::<Result<_>>()?;
    let (ids, mut failures) = wait(run, backend, queue, &mut submitted, say)?;
    let mut checked = checked;
    record(&submitted, &mut checked.steps);
    let entries = read_jobs(&run.plan.out, backend.name())?;
    let when_ready = queue.submits_when_ready();
    if let Some(figures) = queue_figures(&run.plan.out, backend.name(), &entries, &ids, when_ready)
    {
        say(&figures);
    }
    if !failures.is_empty() {
        let count = failures.len();
        let first = failures.remove(0);
        if count > 1 {
            say(&format!("{count} steps failed; the first:"));
        }
        return Err(first);
    }
    Ok(outcome(checked, started))
}

/// The checks before anything is submitted: the backend's preflight, every
/// stage's config, the run directory's lock and its earlier jobs; then the
/// keys and which instances run.
fn check(run: &Run, queue: &mut dyn Queue, started: Instant) -> Result<Checked> {
    let (plan, options) = (run.plan, run.options);
    let exe = std::env::current_exe().map_err(|e| RunnerError::io("pipeline", e))?;
    queue.preflight(plan, options, &exe)?;
    let checked = crate::check::check_plan(plan, &options.bin_dir, options.dry_run)?;
    let machine = cache::machine(&options.bin_dir);
    let check_s = started.elapsed().as_secs_f64();
    let lock = if options.dry_run {
        None
    } else {
        Some(exec::Lock::take(&plan.out, exec::LEFTOVER_WAIT)?)
    };
    refuse_live_jobs(&plan.out, run.backends)?;
    let hash_started = Instant::now();
    let binaries = exec::hash_binaries(plan, options)?;
    let binary_hash_s = hash_started.elapsed().as_secs_f64();
    let keys: Vec<Option<KeyInputs>> = (0..plan.instances.len())
        .map(|index| exec::key_inputs(plan, &checked, &binaries, &machine, index))
        .collect();
    let (steps, to_run) = runs(plan, options, &keys)?;
    Ok(Checked {
        steps,
        to_run,
        keys,
        machine,
        notes: checked.notes,
        check_s,
        binary_hash_s,
        _lock: lock,
    })
}

/// A dry run's lines: what would be submitted for each instance that runs.
fn describe(run: &Run, queue: &dyn Queue, to_run: &BTreeSet<usize>, say: &mut dyn FnMut(&str)) {
    for &index in to_run {
        let instance = &run.plan.instances[index];
        let after: Vec<String> = instance
            .deps
            .iter()
            .filter(|d| to_run.contains(d))
            .map(|d| run.plan.instances[*d].id.clone())
            .collect();
        say(&queue.describe(run.plan, instance, &after));
    }
}

/// The run's outcome once its steps are decided.
fn outcome(checked: Checked, started: Instant) -> RunOutcome {
    RunOutcome {
        steps: checked.steps,
        notes: checked.notes,
        check_s: checked.check_s,
        binary_hash_s: checked.binary_hash_s,
        total_s: started.elapsed().as_secs_f64(),
    }
}

/// A step's progress line: `[  3/12] it0/collect  collect-rollouts  running  job 41`.
fn progress(plan: &Plan, index: usize, word: &str, detail: &str) -> String {
    let instance = &plan.instances[index];
    format!(
        "[{:>3}/{}] {:<40} {:<19} {:<9} {detail}",
        index + 1,
        plan.instances.len(),
        instance.id,
        instance.stage.name,
        word
    )
}

/// The rounds of the wait, until every submitted step is decided and its
/// jobs have left the queue (or [`SETTLE`] passed); returns the ids of the
/// jobs submitted and the errors of the steps that failed.
fn wait(
    run: &Run,
    backend: &dyn Backend,
    queue: &mut dyn Queue,
    submitted: &mut [Submitted],
    say: &mut dyn FnMut(&str),
) -> Result<(Vec<String>, Vec<RunnerError>)> {
    let mut ids: Vec<String> = Vec::new();
    let mut unanswered: Option<Instant> = None;
    let mut failures: Vec<RunnerError> = Vec::new();
    let mut settling: Option<Instant> = None;
    loop {
        let Some(mut live) = ask(backend, queue, &ids, &mut unanswered, say)? else {
            std::thread::sleep(run.poll);
            continue;
        };
        let new = advance(run.plan, queue, submitted, say)?;
        for s in submitted.iter() {
            for job in &s.jobs {
                if !ids.contains(job) {
                    ids.push(job.clone());
                    live.insert(job.clone(), vec![JobState::Queued]);
                }
            }
        }
        failures.extend(update_states(run, backend, queue, submitted, &live, say));
        // After the states of this round, which made them submittable.
        for &k in &new {
            let s = &submitted[k];
            say(&progress(run.plan, s.index, "submitted", &s.label));
        }
        if submitted.iter().all(|s| s.state.finished()) {
            let since = *settling.get_or_insert_with(Instant::now);
            if live.is_empty() || since.elapsed() >= SETTLE {
                return Ok((ids, failures));
            }
        }
        std::thread::sleep(run.poll);
    }
}

/// The queued and running jobs among `ids`, or `None` while the queue does
/// not answer (an error once it has not answered for [`UNANSWERED`]).
fn ask(
    backend: &dyn Backend,
    queue: &mut dyn Queue,
    ids: &[String],
    unanswered: &mut Option<Instant>,
    say: &mut dyn FnMut(&str),
) -> Result<Option<BTreeMap<String, Vec<JobState>>>> {
    match queue.live(ids) {
        Ok(live) => {
            *unanswered = None;
            Ok(Some(live))
        }
        Err(e) => {
            let since = *unanswered.get_or_insert_with(|| {
                say(&format!(
                    "{} does not answer (retrying): {e}",
                    backend.title()
                ));
                Instant::now()
            });
            if since.elapsed() >= UNANSWERED {
                return Err(RunnerError::Cluster {
                    backend: backend.title(),
                    message: format!(
                        "no answer for {} s, giving up (jobs may still run; a resumed run waits for them): {e}",
                        UNANSWERED.as_secs()
                    ),
                });
            }
            Ok(None)
        }
    }
}

/// Submits what may be submitted now; a failed submission cancels the jobs
/// submitted before it.
fn advance(
    plan: &Plan,
    queue: &mut dyn Queue,
    submitted: &mut [Submitted],
    say: &mut dyn FnMut(&str),
) -> Result<Vec<usize>> {
    queue.advance(plan, submitted).inspect_err(|_| {
        let all: Vec<String> = submitted.iter().flat_map(|s| s.jobs.clone()).collect();
        if !all.is_empty() {
            let _ = queue.cancel(&all);
            say(&format!(
                "cancelled the jobs submitted before the failure: {}",
                all.join(", ")
            ));
        }
    })
}

/// This round's state of every undecided step, in plan order (so that a
/// step sees this round's verdict on the steps it reads), with a line for
/// each change; returns the errors of the steps that failed.
fn update_states(
    run: &Run,
    backend: &dyn Backend,
    queue: &mut dyn Queue,
    submitted: &mut [Submitted],
    live: &BTreeMap<String, Vec<JobState>>,
    say: &mut dyn FnMut(&str),
) -> Vec<RunnerError> {
    let mut verdicts = Verdicts {
        unfinished: submitted
            .iter()
            .filter(|s| !s.state.finished())
            .map(|s| s.index)
            .collect(),
        failed: submitted
            .iter()
            .filter(|s| matches!(s.state, State::Failed(_) | State::NotRun(_)))
            .map(|s| s.index)
            .collect(),
    };
    let mut failures = Vec::new();
    for s in submitted.iter_mut().filter(|s| !s.state.finished()) {
        let (new, error) = next_state(run, backend, queue, s, live, &verdicts);
        if new.finished() {
            verdicts.unfinished.remove(&s.index);
        }
        if matches!(new, State::Failed(_) | State::NotRun(_)) {
            verdicts.failed.insert(s.index);
        }
        if new == s.state {
            continue;
        }
        let (word, detail) = match &new {
            State::Done(record) if record.commands.is_empty() => {
                (Status::PassedOn.word(), String::new())
            }
            State::Done(record) => (Status::Ran.word(), format!("{:.1} s", record.wall_s)),
            State::NotRun(dep) => (new.word(), format!("(it reads {dep}, which failed)")),
            State::Failed(_) => (new.word(), String::new()),
            _ => (new.word(), s.label.clone()),
        };
        say(&progress(run.plan, s.index, word, &detail));
        if let (State::Done(_), Some(log)) = (&new, run.log)
            && let Err(e) = log.done(s.index)
        {
            failures.push(e);
        }
        if let Some(error) = error {
            // Indented: only the state lines start with `[`.
            for text in error.to_string().lines() {
                say(&format!("    {text}"));
            }
            failures.push(error);
        }
        s.state = new;
    }
    failures
}

/// The outcome of each step that ran: its time, and its overhead from the
/// first submission to its record.
fn record(submitted: &[Submitted], steps: &mut [StepOutcome]) {
    for s in submitted {
        let step = &mut steps[s.index];
        if let State::Done(record) = &s.state {
            step.wall_s = record.wall_s;
            step.status = if record.commands.is_empty() {
                Status::PassedOn
            } else {
                Status::Ran
            };
            step.overhead_s =
                (record.finished_unix as f64 - s.submitted_unix - record.wall_s).max(0.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::backend::Table;
    use crate::cluster::Lost;
    use crate::plan::one_step;

    /// A queue whose jobs have all left it, leaving no exit status.
    struct Gone;

    impl Queue for Gone {
        fn submits_when_ready(&self) -> bool {
            false
        }
        fn preflight(&mut self, _: &Plan, _: &RunOptions, _: &Path) -> Result<()> {
            Ok(())
        }
        fn describe(&self, _: &Plan, _: &Instance, _: &[String]) -> String {
            String::new()
        }
        fn advance(&mut self, _: &Plan, _: &mut [Submitted]) -> Result<Vec<usize>> {
            Ok(Vec::new())
        }
        fn live(
            &mut self,
            _: &[String],
        ) -> std::result::Result<BTreeMap<String, Vec<JobState>>, String> {
            Ok(BTreeMap::new())
        }
        fn lost(&mut self, out: &Path, _: &Instance, jobs: &[String], _: Option<u32>) -> Lost {
            Lost {
                job: jobs[0].clone(),
                what: "ended without an exit status".into(),
                log: out.join("slurm-0.out"),
            }
        }
        fn cancel(&mut self, _: &[String]) -> std::result::Result<(), String> {
            Ok(())
        }
    }

    #[test]
    fn a_record_that_shows_late_on_a_shared_filesystem_is_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let plan = one_step(&dir.path().join("run"));
        let instance = &plan.instances[0];
        std::fs::create_dir_all(&instance.dir).unwrap();
        let mut step = Submitted {
            index: 0,
            spec: PathBuf::new(),
            commands: Vec::new(),
            jobs: vec!["7".into()],
            label: String::new(),
            submitted_unix: 0.0,
            state: State::Running,
            // The job left the queue 4 s ago; its record is not visible yet
            // (an NFS attribute cache hides it for 30 to 60 s).
            gone_since: Some(Instant::now() - Duration::from_secs(4)),
        };
        let verdicts = Verdicts {
            failed: BTreeSet::new(),
            unfinished: BTreeSet::new(),
        };
        let options = RunOptions {
            bin_dir: PathBuf::new(),
            dry_run: false,
            from: None,
            only: None,
        };
        let round = |grace: Duration, step: &mut Submitted| {
            let table = Table {
                record_grace: grace,
                ..Table::default()
            };
            let run = Run {
                plan: &plan,
                options: &options,
                table: &table,
                poll: Duration::ZERO,
                backends: &[],
                log: None,
            };
            let live = BTreeMap::new();
            next_state(&run, &crate::fake::FAKE, &mut Gone, step, &live, &verdicts)
        };
        let grace = Table::default().record_grace;
        assert!(grace >= Duration::from_secs(60), "{grace:?}");
        let (state, error) = round(grace, &mut step);
        assert_eq!(state, State::Running, "still waiting for the record");
        assert!(error.is_none());
        // The record shows: the step ran.
        let record = cache::test_record(&instance, 1.0, 0);
        cache::write_record(&instance.dir, &record).unwrap();
        assert!(matches!(round(grace, &mut step).0, State::Done(_)));
        // Past a shorter grace, a step without a record has failed.
        std::fs::remove_file(instance.dir.join(cache::STEP_FILE)).unwrap();
        let (state, error) = round(Duration::from_secs(3), &mut step);
        assert!(matches!(state, State::Failed(_)), "{state:?}");
        assert!(
            matches!(error, Some(RunnerError::JobFailed { .. })),
            "{error:?}"
        );
    }
}
