//! The `evaluate` stage: the policy answers every task of the input `tasks`
//! table greedily, in `runs` scene layouts (run 0 is the task's own scene,
//! run r > 0 the same goal in the layout the environment draws for run r),
//! and the answers are executed. Writes the `eval` table (one row per task and
//! run) and a Markdown summary with the success rate by split and by task
//! type: the mean over runs, and the spread of the per-run rates.
//!
//! `pass_at_k.samples = n` (0, off, by default) also draws n answers per task
//! and layout at `pass_at_k.temperature` and reports pass@1, pass@2, ...,
//! pass@n by split and task type (the unbiased estimator of
//! `embodyflow_algos::pass_at_k`, averaged over tasks and layouts). pass@1
//! against pass@n tells a policy that sharpened onto answers it could already
//! sample (pass@1 rises, pass@n stays) from one that learned to solve new
//! tasks. Answer k of task t in layout r draws from a stream seeded by
//! `--seed` and `<task_id>/r<r>/s<k>`. The `eval` table keeps the greedy
//! answers only.
//!
//! Closed-loop tasks (env `tabletop`) take a VLA checkpoint
//! (`init-policy --set kind=vla`); the loop is the network's, checked
//! against the tasks as `collect-rollouts` checks it
//! ([`embodyflow_rollout::check_mode`]: all tasks one-shot with a
//! plan policy or all closed-loop with a VLA; any other pairing is bad input,
//! exit 2, naming a task and the policy). Each task in each run is one
//! greedy episode (the VLA at temperature 0): run 0 is the task's own scene,
//! run r the same goal in the layout `embodyflow_tabletop::reseed(task, r)`
//! draws. Every live episode of a batch (`batch_rows` episodes) is stepped
//! in lockstep, one batched policy call per decision, until success or the
//! task's `max_steps` (`ceil(max_steps / K)` decisions). The `eval` row
//! holds `success`, `num_steps` = decisions, `env_steps` and `ever_grasped`
//! (whether an object a goal moves was ever grasped). The summary adds
//! success by suite (`split / suite`), the successful episodes that never
//! grasped (SimpleVLA-RL's pushcut), the decisions per episode, the
//! throughput (decisions/s, env steps/s) and the wall-time shares of world
//! and policy; a thinking VLA (`vla.latent_length > 0`, LaST-R1) adds the
//! share of its greedy decisions per chosen latent length and the mean
//! value-head estimate at the first decision of successful and of failed
//! episodes. pass@k draws episodes at `pass_at_k.temperature`, episode k
//! of task t in run r from `sampling_seed(--seed, "<t>/r<r>/s<k>")`;
//! `max_new_tokens` and `pass_at_k.top_p` apply to plan answers only. The
//! episodes are played by [`closed_loop`]'s pure functions over any
//! `ChunkPolicy`.
//!
//! ```text
//! evaluate --policy runs/it9/policy --input data/val --out runs/it9/eval-val --set runs=3
//! evaluate --policy runs/it9/policy --input data/val --out runs/it9/passk-val \
//!     --set runs=1 --set pass_at_k.samples=64 --set pass_at_k.temperature=1.0
//! evaluate --policy runs/vla-rl/policy --input data/tabletop-val --out runs/vla-rl/eval-val
//! ```

pub mod closed_loop;
pub mod gate;
pub mod grasp;

use embodyflow_core::{Classify, ErrorKind};
use embodyflow_rollout::PolicyRunError;

/// Why `evaluate` stopped.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// Loading or running the policy, its worlds, reading or writing tables.
    #[error(transparent)]
    Run(#[from] PolicyRunError),
    /// The policy failed a `gate.*` key (the outputs and the summary with
    /// every gate's figure are committed): exit 1.
    #[error("{0}")]
    Gate(String),
}

impl Classify for EvalError {
    fn kind(&self) -> ErrorKind {
        match self {
            EvalError::Run(error) => error.kind(),
            EvalError::Gate(_) => ErrorKind::Failure,
        }
    }
}

/// What the stage's steps fail with, as [`PolicyRunError`].
macro_rules! through_policy_run {
    ($($error:ty),*) => {$(
        impl From<$error> for EvalError {
            fn from(error: $error) -> Self {
                EvalError::Run(error.into())
            }
        }
    )*};
}
through_policy_run!(
    embodyflow_core::Error,
    ModelError,
    embodyflow_rollout::closed_loop::ClosedLoopError,
    embodyflow_worlds::WorldsError
);

use std::collections::{BTreeMap, HashMap};

use embodyflow_algos::pass_at_k::{pass_at_k, reported_ks};
use embodyflow_core::cli::{PolicyArg, StageArgs};
use embodyflow_core::config::{ConfigKeys, at_least, ensure, keys_of, positive};
use embodyflow_core::schemas::{self, EvalRow, TableName, TaskRow};
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use embodyflow_envs::TaskEnv;
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::Checkpoint;
use embodyflow_models::policy::{PlanNet, Sampling};
use embodyflow_models::registry::policy_net;
use embodyflow_rollout::closed_loop::net::ClosedLoopNet;
use embodyflow_rollout::closed_loop::{ChunkPolicy, GraspPoint};
use embodyflow_rollout::{Episode, Request, check_mode, run_episodes, sampling_seed};
use embodyflow_worlds::{BridgeKeys, WorldOptions};
use gate::{GateConfig, Measured};
use serde::{Deserialize, Serialize};

/// Command line of `evaluate`.
#[derive(Debug, clap::Parser)]
#[command(
    name = spec::EVALUATE.name,
    version,
    about = spec::EVALUATE.purpose,
    after_help = spec::EVALUATE.help_with_config::<Config>()
)]
pub struct Args {
    #[command(flatten)]
    stage: StageArgs,
    #[command(flatten)]
    policy: PolicyArg,
}

/// The stage's config. Each field's doc comment is its key's meaning
/// (`--help`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Scene layouts per task.
    pub runs: u32,
    /// Most tokens per answer (plan policies).
    pub max_new_tokens: usize,
    /// Sequences per decoding batch (closed loop: episodes stepped
    /// together).
    pub batch_rows: usize,
    /// Sampled answers for pass@k.
    #[keys(section)]
    pub pass_at_k: PassAtKConfig,
    /// The gym bridge's workers (bridge tasks).
    #[keys(section)]
    pub bridge: BridgeKeys,
    /// What the policy must show ([`gate`]): unset keys are no gate.
    #[keys(section)]
    pub gate: GateConfig,
    /// Output layout.
    #[keys(skip)]
    pub output: OutputConfig,
}

/// pass@k: `samples` answers per task and layout at `temperature`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct PassAtKConfig {
    /// Sampled answers per task and layout for pass@k (0: no pass@k).
    pub samples: usize,
    /// pass@k sampling temperature (> 0).
    pub temperature: f64,
    /// pass@k nucleus sampling mass (1: off; plan policies).
    pub top_p: f64,
}

impl Default for PassAtKConfig {
    fn default() -> Self {
        PassAtKConfig {
            samples: 0,
            temperature: 1.0,
            top_p: 1.0,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            runs: 3,
            max_new_tokens: 256,
            batch_rows: 128,
            pass_at_k: PassAtKConfig::default(),
            bridge: BridgeKeys::default(),
            gate: GateConfig::default(),
            output: OutputConfig::default(),
        }
    }
}

impl StageConfig for Config {
    fn key_docs() -> Vec<(String, &'static str)> {
        keys_of::<Config>()
    }

    fn output(&self) -> &OutputConfig {
        &self.output
    }

    fn validate(&self) -> embodyflow_core::Result<()> {
        // Run indices are recorded as i32.
        ensure(
            (1..=i32::MAX as u32).contains(&self.runs),
            "runs",
            format!("1 to {}", i32::MAX),
            self.runs,
        )?;
        at_least("max_new_tokens", self.max_new_tokens, 1)?;
        at_least("batch_rows", self.batch_rows, 1)?;
        self.bridge.validate("")?;
        positive("pass_at_k.temperature", self.pass_at_k.temperature)?;
        ensure(
            self.pass_at_k.top_p > 0.0 && self.pass_at_k.top_p <= 1.0,
            "pass_at_k.top_p",
            "a number in (0, 1]",
            self.pass_at_k.top_p,
        )?;
        self.gate.validate()?;
        if let Some(key) = self.gate.needs_samples() {
            ensure(
                self.pass_at_k.samples >= 2,
                "pass_at_k.samples",
                format!("at least 2 (sampled episodes per layout) for {key}"),
                self.pass_at_k.samples,
            )?;
        }
        Ok(())
    }
}

/// Success rates of `rows` grouped by `key`: for each group, the mean over
/// runs and the lowest and highest per-run rate. Episodes that
/// infrastructure ended (a `failure_reason`: a crashed or hung environment
/// worker) are no outcome of the policy and are left out; the summary
/// counts them on their own line.
pub fn success_by<F: Fn(&EvalRow) -> String>(
    rows: &[EvalRow],
    key: F,
) -> BTreeMap<String, (f64, f64, f64, usize)> {
    let mut counts: BTreeMap<String, BTreeMap<i32, (usize, usize)>> = BTreeMap::new();
    for row in rows.iter().filter(|r| r.failure_reason.is_none()) {
        let per_run = counts
            .entry(key(row))
            .or_default()
            .entry(row.run)
            .or_default();
        per_run.0 += row.success as usize;
        per_run.1 += 1;
    }
    counts
        .into_iter()
        .map(|(group, runs)| {
            let rates: Vec<f64> = runs
                .values()
                .map(|&(wins, n)| wins as f64 / n as f64)
                .collect();
            let mean = rates.iter().sum::<f64>() / rates.len() as f64;
            let low = rates.iter().cloned().fold(f64::INFINITY, f64::min);
            let high = rates.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let tasks = runs.values().map(|&(_, n)| n).max().unwrap_or(0);
            (group, (mean, low, high, tasks))
        })
        .collect()
}

/// One task in one layout, with the outcomes of its sampled answers.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledTask {
    /// Grouping key (a split, or a split and task type).
    pub group: String,
    /// Answers that reached the goal.
    pub successes: usize,
}

/// pass@k of one group of tasks.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupPassAtK {
    /// The grouping key.
    pub group: String,
    /// `(k, pass@k)` for each k of [`reported_ks`].
    pub estimates: Vec<(usize, f64)>,
    /// Tasks (in layouts) averaged.
    pub tasks: usize,
}

/// pass@k for each k of [`reported_ks`] by group: the unbiased estimate per
/// task and layout, averaged over them; each task drew `samples` answers.
pub fn pass_at_k_by(tasks: &[SampledTask], samples: usize) -> Vec<GroupPassAtK> {
    let mut groups: BTreeMap<&str, Vec<&SampledTask>> = BTreeMap::new();
    for task in tasks {
        groups.entry(&task.group).or_default().push(task);
    }
    groups
        .into_iter()
        .map(|(group, members)| {
            let estimates = reported_ks(samples)
                .into_iter()
                .map(|k| {
                    let sum: f64 = members
                        .iter()
                        .map(|t| pass_at_k(samples, t.successes, k))
                        .sum();
                    (k, sum / members.len() as f64)
                })
                .collect();
            GroupPassAtK {
                group: group.to_string(),
                estimates,
                tasks: members.len(),
            }
        })
        .collect()
}

/// A breakdown of the summary: its label and a task's group in it.
pub type Breakdown = (&'static str, fn(&TaskRow) -> String);

/// Success by split.
pub const BY_SPLIT: Breakdown = ("split", |t| t.split.clone());
/// Success by suite within a split (`val / tabletop-long`).
pub const BY_SUITE: Breakdown = ("suite", |t| format!("{} / {}", t.split, t.suite));
/// Success by task type within a split (`val / place_in_bowl`).
pub const BY_TYPE: Breakdown = ("task type", |t| {
    format!("{} / {}", t.split, t.task_type.as_deref().unwrap_or("-"))
});

/// Summary rows: success of `rows` by each breakdown (the mean over runs
/// and the range of per-run rates); `tasks` holds every row's task.
pub fn add_success(
    summary: &mut Summary,
    rows: &[EvalRow],
    tasks: &HashMap<&str, &TaskRow>,
    breakdowns: &[Breakdown],
) {
    for (label, key) in breakdowns {
        for (group, (mean, low, high, n)) in success_by(rows, |r| key(tasks[r.task_id.as_str()])) {
            summary.add(
                format!("success, {label} {group}"),
                format!("{mean:.3} (runs {low:.3}..{high:.3}, {n} tasks)"),
            );
        }
    }
}

/// Summary rows: pass@k by each breakdown; `successes[i]` of `n` samples
/// of the task in layout `i` (`tasks[i]`).
pub fn add_pass_at_k(
    summary: &mut Summary,
    tasks: &[&TaskRow],
    successes: &[usize],
    n: usize,
    breakdowns: &[Breakdown],
) {
    for (label, key) in breakdowns {
        let sampled: Vec<SampledTask> = tasks
            .iter()
            .zip(successes)
            .map(|(task, &successes)| SampledTask {
                group: key(task),
                successes,
            })
            .collect();
        for GroupPassAtK {
            group,
            estimates,
            tasks,
        } in pass_at_k_by(&sampled, n)
        {
            let figures: Vec<String> = estimates
                .iter()
                .map(|(k, p)| format!("@{k} {p:.3}"))
                .collect();
            summary.add(
                format!("pass@k, {label} {group}"),
                format!("{} ({tasks} task layouts)", figures.join(", ")),
            );
        }
    }
}

/// Runs the stage.
pub fn run(args: Args) -> Result<(), EvalError> {
    let stage = Stage::<Config>::start(&spec::EVALUATE, env!("CARGO_PKG_VERSION"), &args.stage)?;
    stage.check_outputs(&[TableName::Eval])?;
    let config = &stage.config;
    let device = embodyflow_models::device::tch_device(args.stage.device)?;
    let all_tasks: Vec<TaskRow> = stage.input(TableName::Tasks)?.read_rows()?;
    // The network the checkpoint holds, whose role (one-shot or closed
    // loop) the tasks must suit.
    let net = policy_net(&args.policy.policy)?;
    check_mode(&all_tasks, net.kind, &args.policy.policy)?;
    let layouts: Vec<(u32, &TaskRow)> = (0..config.runs)
        .flat_map(|run| all_tasks.iter().map(move |task| (run, task)))
        .collect();
    // A shard plays whole batches of the unsharded run: greedy answers
    // depend on the episodes batched together (`ShardSpec::owned_batches`).
    let owned: Vec<(u32, &TaskRow)> = args
        .stage
        .shard
        .owned_batches(layouts.len(), config.batch_rows, |i| {
            format!("{}/r{}", layouts[i].1.task_id, layouts[i].0)
        })
        .into_iter()
        .flat_map(|batch| layouts[batch].iter().copied())
        .collect();
    let tasks: HashMap<&str, &TaskRow> = owned
        .iter()
        .map(|&(_, task)| (task.task_id.as_str(), task))
        .collect();
    let mut summary = Summary::new("evaluate");
    let (rows, figures) = embodyflow_models::with_net!(
        net,
        plan: |M| one_shot::<M>(&stage, &args, &owned, &tasks, device, &mut summary)?,
        closed_loop: |M| closed_loop_episodes::<M>(&stage, &args, &owned, &tasks, device, &mut summary)?,
    );
    let verdicts = config.gate.check(&figures.measured(&rows));
    for verdict in verdicts.iter().flatten() {
        let (key, value) = verdict.line();
        summary.add(key, value);
    }
    let mut writer = stage.writer(TableName::Eval)?;
    writer.write_rows(&rows)?;
    stage.finish(writer)?;
    stage.commit(&summary)?;
    let failed: Vec<String> = verdicts
        .iter()
        .flatten()
        .filter(|v| !v.passed)
        .map(gate::Verdict::failure)
        .collect();
    if !failed.is_empty() && config.gate.enforce {
        return Err(EvalError::Gate(format!(
            "{}: the policy failed {} of its gates: {} (the figures are in {}; `--set gate.enforce=false` reports the gates and goes on)",
            args.policy.policy.display(),
            failed.len(),
            failed.join("; "),
            args.stage.out.join("_summary.evaluate.md").display()
        )));
    }
    Ok(())
}

/// What an evaluation measured besides its rows, for the gates.
#[derive(Debug, Default)]
struct Figures {
    /// Successes among `n` samples per layout, when pass@k sampled.
    samples: Option<(Vec<usize>, usize)>,
    /// The grasp slope, when the world says where its goals are.
    grasp_slope: Option<f64>,
}

impl Figures {
    /// The gates' figures: greedy success as the summary reports it
    /// ([`success_by`] over every row), the grasp slope, and when sampled the sampled success
    /// and the share of layouts with mixed outcomes.
    fn measured(&self, rows: &[EvalRow]) -> Measured {
        let success = success_by(rows, |_| String::new())
            .into_values()
            .next()
            .map_or(0.0, |(mean, ..)| mean);
        let sampled_success = self.samples.as_ref().map(|(successes, n)| {
            successes.iter().sum::<usize>() as f64 / (successes.len() * n).max(1) as f64
        });
        Measured {
            success,
            grasp_slope: self.grasp_slope,
            sampled_success,
            mixed_groups: self
                .samples
                .as_ref()
                .and_then(|(successes, n)| gate::mixed_share(successes, *n)),
        }
    }
}

/// "`rows` (`tasks` tasks x `runs` runs, greedy)".
fn episodes_line(rows: usize, tasks: usize, runs: u32) -> String {
    format!("{rows} ({tasks} tasks x {runs} runs, greedy)")
}

/// Plan answers on one-shot tasks: the greedy `eval` rows of the `owned`
/// layouts, their summary lines, and pass@k when asked; the policy is ours
/// ([`Gpt`]), a Hugging Face decoder ([`HfNet`]) or vision-language model
/// ([`VlPolicy`], shown each run's scene image).
fn one_shot<M: PlanNet>(
    stage: &Stage<Config>,
    args: &Args,
    owned: &[(u32, &TaskRow)],
    tasks: &HashMap<&str, &TaskRow>,
    device: tch::Device,
    summary: &mut Summary,
) -> Result<(Vec<EvalRow>, Figures), EvalError> {
    let config = &stage.config;
    let policy = Checkpoint::<M>::load_kind(&args.policy.policy, device)?;
    let mut envs = Vec::new();
    for &(run, task) in owned {
        envs.push((run, task, TaskEnv::from_row(task, run)?));
    }
    let requests: Vec<Request> = envs
        .iter()
        .map(|(_, _, env)| Request { env, seed: 0 })
        .collect();
    let greedy = Sampling {
        temperature: 0.0,
        top_p: 1.0,
        max_new_tokens: config.max_new_tokens,
    };
    let episodes = run_episodes(&policy, &requests, &greedy, config.batch_rows, "evaluating")?;
    let rows: Vec<EvalRow> = envs
        .iter()
        .zip(&episodes)
        .map(|((run, task, _), episode)| EvalRow {
            failure_reason: None,
            task_id: task.task_id.clone(),
            run: *run as i32,
            split: task.split.clone(),
            task_type: task.task_type.clone(),
            policy: policy.manifest.id.clone(),
            success: episode.outcome.success,
            num_steps: episode.outcome.step_valid.len() as i32,
            env_steps: episode.outcome.env_steps as i32,
            ever_grasped: None,
        })
        .collect();
    summary.add("policy", &policy.manifest.id).add(
        "episodes",
        episodes_line(rows.len(), tasks.len(), config.runs),
    );
    let parsed = episodes.iter().filter(|e| e.outcome.parsed).count();
    summary.add(
        "answers with a plan",
        format!("{parsed} of {}", episodes.len()),
    );
    let breakdowns = [BY_SPLIT, BY_TYPE];
    add_success(summary, &rows, tasks, &breakdowns);
    let mut figures = Figures::default();
    if config.pass_at_k.samples > 0 {
        let n = config.pass_at_k.samples;
        let sampled = sample_answers(&policy, &envs, config, args.stage.seed)?;
        summary.add(
            "pass@k answers",
            format!(
                "{} ({} tasks x {} runs x {n} samples, T {})",
                sampled.len(),
                tasks.len(),
                config.runs,
                config.pass_at_k.temperature
            ),
        );
        let successes: Vec<usize> = sampled
            .chunks(n)
            .map(|answers| answers.iter().filter(|e| e.outcome.success).count())
            .collect();
        let layout_tasks: Vec<&TaskRow> = owned.iter().map(|&(_, task)| task).collect();
        add_pass_at_k(summary, &layout_tasks, &successes, n, &breakdowns);
        figures.samples = Some((successes, n));
    }
    Ok((rows, figures))
}

type TaskInLayout<'a> = (u32, &'a TaskRow, TaskEnv);

/// `pass_at_k.samples` answers for each task and layout, in `envs` order.
fn sample_answers<M: PlanNet>(
    policy: &Checkpoint<M>,
    envs: &[TaskInLayout<'_>],
    config: &Config,
    seed: u64,
) -> Result<Vec<Episode>, ModelError> {
    let n = config.pass_at_k.samples;
    let requests: Vec<Request> = envs
        .iter()
        .flat_map(|(run, task, env)| {
            (0..n).map(move |k| Request {
                env,
                seed: sampling_seed(seed, &format!("{}/r{run}/s{k}", task.task_id)),
            })
        })
        .collect();
    let sampling = Sampling {
        temperature: config.pass_at_k.temperature,
        top_p: config.pass_at_k.top_p,
        max_new_tokens: config.max_new_tokens,
    };
    run_episodes(
        policy,
        &requests,
        &sampling,
        config.batch_rows,
        "sampling for pass@k",
    )
}

/// Greedy VLA episodes on closed-loop tasks (see the module doc): the
/// `eval` rows of the `owned` layouts, their summary lines, and pass@k when
/// asked.
fn closed_loop_episodes<M: ClosedLoopNet>(
    stage: &Stage<Config>,
    args: &Args,
    owned: &[(u32, &TaskRow)],
    tasks: &HashMap<&str, &TaskRow>,
    device: tch::Device,
    summary: &mut Summary,
) -> Result<(Vec<EvalRow>, Figures), EvalError> {
    let config = &stage.config;
    let checkpoint = Checkpoint::<M>::load_kind(&args.policy.policy, device)?;
    let layouts = closed_loop::layouts(owned)?;
    let mut greedy = M::policy(&checkpoint, 0.0, 0.0)?;
    let chunk_len = greedy.chunk_len() as i64;
    let options = WorldOptions {
        image_size: greedy.observation_shape().height,
        bins: M::bins(&checkpoint)?,
        workers: config.bridge.settings(),
    };
    let (rows, played) = closed_loop::evaluate_layouts(
        &mut greedy,
        &options,
        &layouts,
        &checkpoint.manifest.id,
        config.batch_rows,
    )?;
    summary
        .add(
            "policy",
            format!("{} ({}, closed loop)", checkpoint.manifest.id, M::NAME),
        )
        .add(
            "episodes",
            episodes_line(rows.len(), tasks.len(), config.runs),
        );
    add_success(summary, &rows, tasks, &[BY_SPLIT, BY_SUITE, BY_TYPE]);
    let slope = add_closed_loop_lines(summary, &rows, &played, chunk_len, "greedy");
    let mut figures = Figures {
        samples: None,
        grasp_slope: slope.map(|s| s.slope),
    };
    if config.pass_at_k.samples > 0 {
        let n = config.pass_at_k.samples;
        let mut sampler = M::policy(&checkpoint, config.pass_at_k.temperature, 0.0)?;
        let (successes, sampled) = closed_loop::sample_layouts(
            &mut sampler,
            &options,
            &layouts,
            n,
            args.stage.seed,
            config.batch_rows,
        )?;
        summary.add(
            "pass@k episodes",
            format!(
                "{} ({} tasks x {} runs x {n} samples, T {})",
                sampled.outcomes.len(),
                tasks.len(),
                config.runs,
                config.pass_at_k.temperature
            ),
        );
        let layout_tasks: Vec<&TaskRow> = layouts.iter().map(|l| l.task).collect();
        add_pass_at_k(
            summary,
            &layout_tasks,
            &successes,
            n,
            &[BY_SPLIT, BY_SUITE, BY_TYPE],
        );
        summary.add(
            "pass@k throughput",
            sampled.totals.throughput(&format!(
                "K = {chunk_len}, T = {}",
                config.pass_at_k.temperature
            )),
        );
        figures.samples = Some((successes, n));
    }
    Ok((rows, figures))
}

/// Summary rows of greedy closed-loop episodes: successes that never
/// grasped, episodes cut at the decision limit, decisions per episode,
/// throughput and the wall-time shares of world and policy; for a thinking
/// VLA also the chosen latent lengths over all its decisions and the mean
/// value at the first decision of successful and failed episodes
/// ([`closed_loop::Thinking`]); and where the world says where its goals
/// are, the grasp slope ([`grasp`]), which it returns.
pub fn add_closed_loop_lines(
    summary: &mut Summary,
    rows: &[EvalRow],
    played: &closed_loop::Played,
    chunk_len: i64,
    sampling: &str,
) -> Option<grasp::GraspSlope> {
    let (ungrasped, successes) = closed_loop::ungrasped_successes(rows);
    let truncated = played.outcomes.iter().filter(|o| o.truncated).count();
    summary.add(
        "successful episodes that never grasped",
        if rows.iter().any(|r| r.ever_grasped.is_some()) {
            format!("{ungrasped} of {successes}")
        } else {
            "- (the world has no grasp fact)".to_string()
        },
    );
    let points: Vec<(&str, GraspPoint)> = rows
        .iter()
        .zip(&played.outcomes)
        .filter_map(|(row, o)| Some((schemas::task_key(&row.task_id), o.grasp?)))
        .collect();
    let slope = grasp::grasp_slope(&points);
    if !points.is_empty() {
        summary.add(
            "grasp slope (closing point on target, within tasks)",
            grasp::grasp_slope_line(slope, points.len()),
        );
    }
    summary
        .add(
            "episodes cut at the decision limit",
            format!("{truncated} of {}", played.outcomes.len()),
        )
        .add(
            "mean decisions per episode",
            format!(
                "{:.1}",
                played.totals.decisions as f64 / played.outcomes.len().max(1) as f64
            ),
        )
        .add(
            "closed-loop throughput",
            played
                .totals
                .throughput(&format!("K = {chunk_len}, {sampling}")),
        )
        .add("wall time", played.totals.wall_time());
    if let Some(faults) = &played.faults {
        let failed = played
            .outcomes
            .iter()
            .filter(|o| o.failure.is_some())
            .count();
        summary.add(
            "gym bridge faults",
            format!("{faults} ({failed} episodes ended by a worker fault, left out of the success rates)"),
        );
    }
    if let Some(thinking) = &played.thinking {
        summary
            .add(
                format!("latent lengths ({sampling} decisions)"),
                closed_loop::latent_length_line(&thinking.lengths),
            )
            .add(
                "value at the first decision",
                closed_loop::first_value_line(&thinking.first_values),
            );
    }
    slope
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_core::config::refused_key;

    #[test]
    fn config_values_are_checked_when_loaded() {
        assert_eq!(refused_key::<Config>(&[]), None, "the defaults pass");
        assert_eq!(
            refused_key::<Config>(&["runs=1", "pass_at_k.samples=4", "pass_at_k.top_p=0.9"]),
            None
        );
        for (set, key) in [
            ("runs=0", "runs"),
            ("runs=-1", "runs"),
            ("runs=2147483648", "runs"),
            ("max_new_tokens=0", "max_new_tokens"),
            ("batch_rows=0", "batch_rows"),
            ("pass_at_k.temperature=0", "pass_at_k.temperature"),
            ("pass_at_k.top_p=0", "pass_at_k.top_p"),
            ("pass_at_k.top_p=1.1", "pass_at_k.top_p"),
        ] {
            assert_eq!(refused_key::<Config>(&[set]).as_deref(), Some(key), "{set}");
        }
    }

    fn row(split: &str, run: i32, success: bool) -> EvalRow {
        EvalRow {
            failure_reason: None,
            task_id: format!("t{run}"),
            run,
            split: split.into(),
            task_type: None,
            policy: "p".into(),
            success,
            num_steps: 1,
            env_steps: 1,
            ever_grasped: None,
        }
    }

    #[test]
    fn pass_at_k_averages_the_per_task_estimates_by_group() {
        let task = |group: &str, successes| SampledTask {
            group: group.into(),
            successes,
        };
        let tasks = vec![
            task("val", 0),
            task("val", 1),
            task("val", 4),
            task("unseen", 2),
        ];
        let by_group = pass_at_k_by(&tasks, 4);
        assert_eq!(by_group[0].group, "unseen");
        // pass@2 of 2 in 4: 1 - C(2,2)/C(4,2) = 5/6.
        let unseen = &by_group[0].estimates;
        assert_eq!(unseen[0], (1, 0.5));
        assert!((unseen[1].1 - 5.0 / 6.0).abs() < 1e-12);
        assert_eq!(unseen[2], (4, 1.0));
        // val: pass@1 = (0 + 1/4 + 1) / 3; pass@4 = (0 + 1 + 1) / 3.
        let val = &by_group[1].estimates;
        assert_eq!((by_group[1].group.as_str(), by_group[1].tasks), ("val", 3));
        assert!((val[0].1 - 1.25 / 3.0).abs() < 1e-12);
        assert!((val[2].1 - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn success_is_the_mean_of_per_run_rates() {
        let rows = vec![
            row("val", 0, true),
            row("val", 0, false),
            row("val", 1, true),
            row("val", 1, true),
            row("unseen", 0, false),
        ];
        let by_split = success_by(&rows, |r| r.split.clone());
        assert_eq!(by_split["val"], (0.75, 0.5, 1.0, 2));
        assert_eq!(by_split["unseen"], (0.0, 0.0, 0.0, 1));
    }

    #[test]
    fn episodes_ended_by_a_worker_fault_are_left_out_of_success() {
        let faulted = EvalRow {
            failure_reason: Some("worker crashed (signal 9)".into()),
            ..row("val", 0, false)
        };
        let rows = vec![row("val", 0, true), faulted.clone(), row("val", 1, false)];
        let by_split = success_by(&rows, |r| r.split.clone());
        assert_eq!(by_split["val"], (0.5, 0.0, 1.0, 1));
        assert!(success_by(&[faulted], |r| r.split.clone()).is_empty());
    }
}

/// The fields' doc comments document exactly the config's keys.
#[cfg(test)]
mod config_keys {
    #[test]
    fn every_config_key_has_a_one_line_meaning() {
        embodyflow_core::config::check_key_docs::<super::Config>().unwrap();
    }
}
