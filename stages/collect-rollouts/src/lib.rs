//! The `collect-rollouts` stage: draws tasks from the input `tasks` table,
//! samples `group_size` answers per task at `temperature` (defaults G = 8,
//! T = 1.6, SimpleVLA-RL's values), executes each in its environment and
//! writes `trajectories` (one row per answer: success, environment steps,
//! the decoded answer) and `steps` (prompt and response ids with the
//! behaviour log-probs from `logits / T`).
//!
//! `temperature = 0` is greedy decoding, as transformers'
//! `generate(do_sample=False)`: the arg max token at each step (of a plan
//! policy, ours or a Hugging Face decoder, and of every action token of a
//! VLA), the same answer for every seed. Its tokens are stored as sampled
//! ones are, each with its log-softmax at T = 1 (a distribution at T → 0
//! gives every chosen token log-prob 0): the log-probs PPO's
//! `old_logprobs` need, since update-policy scores a rollout of
//! temperature 0 at 1. The `trajectories` rows record temperature 0.
//!
//! Task draws: the whole tasks table is shuffled with a stream seeded by
//! `--seed` and `iteration`; draw `d` takes the `d % tasks`-th task of that
//! order. A run fills `tasks_per_iteration` slots (every task once when
//! unset): slot `s` starts with draw `s`. Ids are stable: group
//! `it<iteration>/<task_id>/d<draw>`, trajectory `<group>/s<k>`, and each
//! answer's sampling seed is a hash of `--seed` and its trajectory id.
//! Slots are sampled in batches of `batch_rows / group_size` consecutive
//! slots (at least one), each batch on its own.
//! `--shard i/n` fills whole batches, those whose first group id it owns
//! (`ShardSpec::owned_batches`), so the shards split the unsharded run's
//! draw and sample every group in the same batch as it does: with
//! `tasks_per_iteration = 16`, shards `0/2` and `1/2` write 16 groups
//! together, the very rows the unsharded run writes, log-probs included.
//!
//! Dynamic sampling (`dynamic_sampling.enabled`): a group whose answers all
//! succeed or all fail carries no GRPO signal; it is dropped and its slot
//! draws again: slot `s` takes draws `s`, `s + P`, `s + 2P`, … (P =
//! `tasks_per_iteration`) below `P + dynamic_sampling.max_extra_draws` and
//! keeps its first group with mixed outcomes, so a run makes at most
//! `max_extra_draws` extra draws and an all-solved task set ends instead of
//! looping. A batch redraws for its open slots together, so what a slot
//! keeps depends on its batch alone, not on the sharding. Dropped groups are
//! not written; a slot whose every draw was dropped writes nothing.
//! Outcomes are judged over the episodes that really ran: an episode ended
//! by infrastructure (`infra_fault`) is no outcome, and a group left with
//! fewer than 2 that ran is dropped as too few valid ([`Verdict`]). The
//! summary counts the dropped groups by reason (all success, all failure,
//! too few valid after faults), and a run that leaves slots empty says so
//! on stderr and in the summary (`warning`): after a saturating SFT every
//! group is all-success and an RL iteration would otherwise learn nothing
//! without a word.
//!
//! Closed-loop tasks (env `tabletop`, or `gym:<adapter>`, a
//! Gymnasium environment through the bridge; the world is built
//! by `embodyflow_worlds`, workers set by `bridge.*`) need a VLA checkpoint
//! (`init-policy --set kind=vla`; `embodyflow_rollout::check_mode`): each group is `G`
//! episodes of its task sharing the initial state (`TabletopEpisodes`),
//! every live episode of a batch stepped in lockstep with one batched VLA
//! call per decision (`run_closed_loop`, the network's `ClosedLoopNet::policy`
//! at `temperature`;
//! `top_p` and `max_new_tokens` do not apply). Episode `<group>/s<k>` draws
//! from `sampling_seed(--seed, trajectory id)` as an answer does; it ends
//! at success or at the task's `max_steps` (a failure), so the run allows
//! `ceil(max_steps / K)` decisions (`K` = the checkpoint's `chunk_len`).
//! One `trajectories` row per episode (`num_steps` = decisions, `env_steps`,
//! `complete` = success, `response_text` null, `ever_grasped`: whether an
//! object a goal moves was ever grasped) and one `steps` row per
//! decision (the instruction ids, the `K × D` action tokens and their
//! log-probs, the observation bytes of `embodyflow_core::observation`; a
//! thinking VLA's (LaST-R1) also its latents, chosen length, stop log-prob
//! and value, its latents explored with `latent_noise_std`).
//! Batches, shards, ids and dynamic sampling (on the episodes' successes)
//! are as above, `batch_rows` counting episodes. The tasks must all be
//! one-shot or all closed-loop, and the policy of the matching kind: any
//! other pairing is bad input naming a task and the policy.
//!
//! ```text
//! collect-rollouts --policy runs/it0/policy --input data/train --out runs/it0/rollouts \
//!     --set iteration=0 --set tasks_per_iteration=32 --set dynamic_sampling.enabled=true
//! ```

use std::collections::HashMap;
use std::ops::Range;
use std::time::Instant;

use embodyflow_core::Error;
use embodyflow_core::cli::{PolicyArg, StageArgs};
use embodyflow_core::config::{ConfigKeys, at_least, ensure, keys_of};
use embodyflow_core::schemas::{StepRow, TableName, TaskRow, TrajectoryRow};
use embodyflow_core::spec;
use embodyflow_core::stage::{OutputConfig, Stage, StageConfig, Summary};
use embodyflow_envs::TaskEnv;
use embodyflow_models::checkpoint::Checkpoint;
use embodyflow_models::policy::{PlanNet, Sampling};
use embodyflow_models::registry::policy_net;
use embodyflow_rollout::closed_loop::net::ClosedLoopNet;
use embodyflow_rollout::closed_loop::{
    ChunkPolicy, ClosedLoopConfig, ClosedLoopEpisode, RunTotals, run_closed_loop,
};
use embodyflow_rollout::{Episode, Request, check_mode, run_episodes, sampling_seed};
use embodyflow_worlds::{BridgeKeys, WorldOptions, WorldTask, Worlds, max_decisions, task_of};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Command line of `collect-rollouts`.
#[derive(Debug, clap::Parser)]
#[command(
    name = spec::COLLECT_ROLLOUTS.name,
    version,
    about = spec::COLLECT_ROLLOUTS.purpose,
    after_help = spec::COLLECT_ROLLOUTS.help_with_config::<Config>()
)]
pub struct Args {
    #[command(flatten)]
    stage: StageArgs,
    #[command(flatten)]
    policy: PolicyArg,
}

/// Why `collect-rollouts` stopped.
pub use embodyflow_rollout::PolicyRunError as CollectError;

/// `dynamic_sampling.*` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct DynamicSampling {
    /// Drop all-success / all-failure groups and draw replacements (DAPO
    /// filter_groups).
    pub enabled: bool,
    /// Most replacement draws per run.
    pub max_extra_draws: usize,
}

impl Default for DynamicSampling {
    fn default() -> Self {
        DynamicSampling {
            enabled: false,
            max_extra_draws: 64,
        }
    }
}

/// The stage's config. Each field's doc comment is its key's meaning
/// (`--help`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Iteration recorded in the ids and rows.
    pub iteration: i32,
    /// Answers per task draw, G (veRL rollout.n).
    pub group_size: usize,
    /// Sampling temperature T >= 0 (SimpleVLA-RL's 1.6; veRL's default is
    /// 1.0); 0: greedy, the arg max each step, log-probs at T = 1.
    pub temperature: f64,
    /// Nucleus sampling mass (1: off).
    pub top_p: f64,
    /// Most tokens per answer.
    pub max_new_tokens: usize,
    /// Groups per run, as slots of the draw (unset: every task once).
    pub tasks_per_iteration: Option<usize>,
    /// Sequences per sampling batch.
    pub batch_rows: usize,
    /// Dynamic sampling.
    #[keys(section)]
    pub dynamic_sampling: DynamicSampling,
    /// Exploration noise (std) on each latent of a thinking VLA (LaST-R1),
    /// >= 0 (0: the policy's mean).
    pub latent_noise_std: f64,
    /// The gym bridge's workers (bridge tasks).
    #[keys(section)]
    pub bridge: BridgeKeys,
    /// Output layout.
    #[keys(skip)]
    pub output: OutputConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            iteration: 0,
            group_size: 8,
            temperature: 1.6,
            top_p: 1.0,
            max_new_tokens: 256,
            tasks_per_iteration: None,
            batch_rows: 128,
            dynamic_sampling: DynamicSampling::default(),
            latent_noise_std: 0.0,
            bridge: BridgeKeys::default(),
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
        at_least("iteration", self.iteration, 0)?;
        at_least("group_size", self.group_size, 1)?;
        ensure(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "temperature",
            "a finite number >= 0 (0: greedy)",
            self.temperature,
        )?;
        self.bridge.validate("")?;
        ensure(
            self.latent_noise_std.is_finite() && self.latent_noise_std >= 0.0,
            "latent_noise_std",
            "a finite number >= 0",
            self.latent_noise_std,
        )?;
        ensure(
            self.top_p > 0.0 && self.top_p <= 1.0,
            "top_p",
            "a number in (0, 1]",
            self.top_p,
        )?;
        at_least("max_new_tokens", self.max_new_tokens, 1)?;
        if let Some(n) = self.tasks_per_iteration {
            at_least("tasks_per_iteration", n, 1)?;
        }
        at_least("batch_rows", self.batch_rows, 1)
    }
}

/// A drawn group before it is written: G one-shot answers or G closed-loop
/// episodes of one task draw, with their sampling seeds.
struct Group<'a, E> {
    task: &'a TaskRow,
    draw: usize,
    episodes: Vec<E>,
    seeds: Vec<u64>,
}

/// The columns of a `trajectories` row that come from its episode.
struct Facts {
    num_steps: i32,
    env_steps: i32,
    complete: bool,
    response_text: Option<String>,
    ever_grasped: Option<bool>,
    failure_reason: Option<String>,
    infra_fault: bool,
}

/// What an episode of either loop contributes to its rows.
trait Written {
    /// Decisions, env steps, success, the answer text (one-shot only) and
    /// whether a goal's object was ever grasped (closed loop only).
    fn facts(&self) -> Facts;
    /// Its `steps` rows under `trajectory_id`.
    fn steps(&self, trajectory_id: &str) -> Vec<StepRow>;
    /// `(success, infra_fault)`, what dynamic sampling judges ([`Verdict::of`]).
    fn outcome(&self) -> (bool, bool);
}

impl Written for Episode {
    fn facts(&self) -> Facts {
        Facts {
            num_steps: 1,
            env_steps: self.outcome.env_steps as i32,
            complete: self.outcome.success,
            response_text: Some(self.text.clone()),
            ever_grasped: None,
            failure_reason: None,
            infra_fault: false,
        }
    }
    fn steps(&self, trajectory_id: &str) -> Vec<StepRow> {
        vec![StepRow {
            observation: self.observation.clone(),
            ..StepRow::one_shot(
                trajectory_id.to_string(),
                self.prompt_ids.clone(),
                self.response_ids.clone(),
                self.logprobs.clone(),
            )
        }]
    }
    fn outcome(&self) -> (bool, bool) {
        (self.outcome.success, false)
    }
}

impl Written for ClosedLoopEpisode {
    fn facts(&self) -> Facts {
        Facts {
            num_steps: self.decisions.len() as i32,
            env_steps: self.env_steps as i32,
            complete: self.success,
            response_text: None,
            ever_grasped: self.target_ever_grasped,
            failure_reason: self.failure.clone(),
            infra_fault: self.infra_fault(),
        }
    }
    fn steps(&self, trajectory_id: &str) -> Vec<StepRow> {
        self.step_rows(trajectory_id)
    }
    fn outcome(&self) -> (bool, bool) {
        (self.success, self.infra_fault())
    }
}

/// Dynamic sampling's verdict on a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Outcomes differ among the episodes that ran: GRPO has a signal.
    Mixed,
    /// Every episode that ran succeeded.
    AllSuccess,
    /// Every episode that ran failed.
    AllFailure,
    /// Faults left fewer than 2 episodes that ran.
    TooFewValid,
}

impl Verdict {
    /// The verdict on a group from each episode's `(success, infra_fault)`.
    /// A group without faults is judged on all its episodes (a group of one
    /// is uniform); faulted episodes are no outcome, and a group they leave
    /// with fewer than 2 episodes that ran is [`Verdict::TooFewValid`].
    ///
    /// ```text
    /// (success, fault): [(true, no), (false, no)]             → Mixed
    ///                   [(true, no), (false, yes), (true, no)] → AllSuccess
    ///                   [(false, no), (false, yes)]           → TooFewValid
    /// ```
    pub fn of(outcomes: impl IntoIterator<Item = (bool, bool)>) -> Verdict {
        let (mut ran, mut wins, mut faults) = (0usize, 0usize, 0usize);
        for (success, fault) in outcomes {
            if fault {
                faults += 1;
            } else {
                ran += 1;
                wins += usize::from(success);
            }
        }
        if faults > 0 && ran < 2 {
            Verdict::TooFewValid
        } else if wins == 0 {
            Verdict::AllFailure
        } else if wins == ran {
            Verdict::AllSuccess
        } else {
            Verdict::Mixed
        }
    }
}

/// Groups dynamic sampling dropped, by reason.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Dropped {
    /// Every episode that ran succeeded.
    pub all_success: usize,
    /// Every episode that ran failed.
    pub all_failure: usize,
    /// Faults left fewer than 2 that ran.
    pub too_few_valid: usize,
}

impl Dropped {
    /// Counts a group `verdict` drops; whether it drops it (every verdict
    /// but [`Verdict::Mixed`]).
    pub fn count(&mut self, verdict: Verdict) -> bool {
        match verdict {
            Verdict::Mixed => return false,
            Verdict::AllSuccess => self.all_success += 1,
            Verdict::AllFailure => self.all_failure += 1,
            Verdict::TooFewValid => self.too_few_valid += 1,
        }
        true
    }

    /// Groups dropped.
    pub fn total(&self) -> usize {
        self.all_success + self.all_failure + self.too_few_valid
    }

    /// The warning of a run with dynamic sampling that filled `kept` of its
    /// `slots`: `None` when every slot kept a group.
    ///
    /// ```text
    /// dynamic sampling filled 0 of 2 slots; 4 groups dropped (4 all success, 0 all failure,
    /// 0 too few valid after faults) within dynamic_sampling.max_extra_draws; no group written:
    /// the update has nothing to learn from
    /// ```
    pub fn warning(&self, kept: usize, slots: usize) -> Option<String> {
        (kept < slots).then(|| {
            let consequence = if kept == 0 {
                "no group written: the update has nothing to learn from"
            } else {
                "the update learns from fewer groups than asked"
            };
            format!(
                "dynamic sampling filled {kept} of {slots} slots; {self} within dynamic_sampling.max_extra_draws; {consequence}"
            )
        })
    }
}

impl std::fmt::Display for Dropped {
    /// `"<n> groups dropped (<a> all success, <b> all failure, <c> too few valid after faults)"`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} groups dropped ({} all success, {} all failure, {} too few valid after faults)",
            self.total(),
            self.all_success,
            self.all_failure,
            self.too_few_valid
        )
    }
}

/// Adds the dynamic sampling lines to a summary: the draws and the groups
/// dropped by reason, and a warning (also on stderr) when slots stayed empty.
fn add_draws(
    summary: &mut Summary,
    config: &Config,
    draws: usize,
    dropped: &Dropped,
    kept: usize,
    slots: usize,
) {
    summary.add("task draws", format!("{draws} ({dropped})"));
    if !config.dynamic_sampling.enabled {
        return;
    }
    if let Some(warning) = dropped.warning(kept, slots) {
        tracing::warn!("{warning}");
        summary.add("warning", warning);
    }
}

/// The `trajectories` and `steps` rows of kept groups: sample `k` of a group
/// is trajectory `<group id>/s<k>`.
fn rows_of<E: Written>(
    groups: &[Group<'_, E>],
    config: &Config,
    policy_id: &str,
) -> (Vec<TrajectoryRow>, Vec<StepRow>) {
    let (mut trajectory_rows, mut step_rows) = (Vec::new(), Vec::new());
    for group in groups {
        let group_id = group_id(config.iteration, &group.task.task_id, group.draw);
        for (k, (episode, &seed)) in group.episodes.iter().zip(&group.seeds).enumerate() {
            let trajectory_id = format!("{group_id}/s{k}");
            let Facts {
                num_steps,
                env_steps,
                complete,
                response_text,
                ever_grasped,
                failure_reason,
                infra_fault,
            } = episode.facts();
            step_rows.extend(episode.steps(&trajectory_id));
            trajectory_rows.push(TrajectoryRow {
                source_row: None,
                trajectory_id,
                group_id: group_id.clone(),
                task_id: group.task.task_id.clone(),
                sample_index: k as i32,
                iteration: config.iteration,
                policy: policy_id.to_string(),
                temperature: config.temperature as f32,
                num_steps,
                env_steps,
                complete,
                response_text,
                seed: seed as i64,
                ever_grasped,
                failure_reason,
                infra_fault: Some(infra_fault),
            });
        }
    }
    (trajectory_rows, step_rows)
}

fn group_id(iteration: i32, task_id: &str, draw: usize) -> String {
    format!("it{iteration}/{task_id}/d{draw}")
}

/// The run's task draws (see the module doc): which task a draw takes,
/// the draws a slot may make, and each draw's group id and sampling seeds.
struct Draws<'a> {
    tasks: &'a [TaskRow],
    order: Vec<usize>,
    /// Slots (groups wanted).
    wanted: usize,
    /// Draws below this bound may be made.
    limit: usize,
    /// The iteration in the group ids.
    iteration: i32,
    /// Episodes per draw, G.
    group_size: usize,
    /// `--seed`, which every sampling seed hashes.
    seed: u64,
}

impl<'a> Draws<'a> {
    fn task(&self, draw: usize) -> &'a TaskRow {
        &self.tasks[self.order[draw % self.order.len()]]
    }

    /// The draws slot `slot` may make, in order.
    fn of_slot(&self, slot: usize) -> impl Iterator<Item = usize> + use<'_, 'a> {
        (slot..self.limit).step_by(self.wanted)
    }

    /// Draw `draw`'s group id, `it<iteration>/<task_id>/d<draw>`.
    fn group_id(&self, draw: usize) -> String {
        group_id(self.iteration, &self.task(draw).task_id, draw)
    }

    /// The sampling seeds of draw `draw`'s G episodes: sample `k` draws
    /// from `sampling_seed(--seed, "<group id>/s<k>")`.
    fn seeds(&self, draw: usize) -> impl Iterator<Item = u64> + use<'_, 'a> {
        let group = self.group_id(draw);
        (0..self.group_size).map(move |k| sampling_seed(self.seed, &format!("{group}/s{k}")))
    }

    /// `build` of every task the slots of `batches` may draw, once per
    /// task, in draw order (the first error stops), before any episode runs.
    fn build_each<T, E>(
        &self,
        batches: &[Range<usize>],
        mut build: impl FnMut(&'a TaskRow) -> Result<T, E>,
    ) -> Result<HashMap<&'a str, T>, E> {
        let mut built = HashMap::new();
        for slot in batches.iter().flat_map(|b| b.clone()) {
            for draw in self.of_slot(slot) {
                let task = self.task(draw);
                if !built.contains_key(task.task_id.as_str()) {
                    built.insert(task.task_id.as_str(), build(task)?);
                }
            }
        }
        Ok(built)
    }
}

/// Runs the stage.
pub fn run(args: Args) -> Result<(), CollectError> {
    let stage = Stage::<Config>::start(
        &spec::COLLECT_ROLLOUTS,
        env!("CARGO_PKG_VERSION"),
        &args.stage,
    )?;
    stage.check_outputs(&[TableName::Trajectories, TableName::Steps])?;
    let config = &stage.config;
    let device = embodyflow_models::device::tch_device(args.stage.device)?;
    let tasks: Vec<TaskRow> = stage.input(TableName::Tasks)?.read_rows()?;
    // The network the checkpoint holds, whose role (one-shot or closed
    // loop) the tasks must suit.
    let net = policy_net(&args.policy.policy)?;
    check_mode(&tasks, net.kind, &args.policy.policy)?;
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    order.shuffle(&mut ChaCha8Rng::seed_from_u64(
        args.stage.seed ^ ((config.iteration as u64) << 32),
    ));
    let wanted = config.tasks_per_iteration.unwrap_or(tasks.len());
    let draws = Draws {
        tasks: &tasks,
        order,
        wanted,
        limit: wanted
            + if config.dynamic_sampling.enabled {
                config.dynamic_sampling.max_extra_draws
            } else {
                0
            },
        iteration: config.iteration,
        group_size: config.group_size,
        seed: args.stage.seed,
    };
    // The slots this shard fills: whole sampling batches of the unsharded
    // run (a group's log-probs depend on the groups sampled with it).
    let batches = args.stage.shard.owned_batches(
        wanted,
        (config.batch_rows / config.group_size).max(1),
        |s| draws.group_id(s),
    );
    embodyflow_models::with_net!(
        net,
        plan: |M| one_shot::<M>(&stage, &args, &draws, batches, device),
        closed_loop: |M| closed_loop::<M>(&stage, &args, &draws, batches, device),
    )
}

/// What a shard's draws came to: the slots it filled, the draws made, the
/// groups dynamic sampling dropped, the groups and trajectories written,
/// and the seconds spent sampling them.
#[derive(Debug, Default)]
struct Tally {
    slots: usize,
    draws: usize,
    dropped: Dropped,
    groups: usize,
    trajectories: usize,
    seconds: f64,
}

/// Fills the shard's slots batch by batch and writes each batch's kept
/// groups when it ends (the writers keep the key order, so memory holds one
/// batch of episodes); `sample` runs the episodes of a round's draws (G per
/// draw, their seeds in order) and `seen` sees every group drawn, kept or
/// dropped.
fn collect<'a, E: Written>(
    stage: &Stage<Config>,
    draws: &Draws<'a>,
    batches: Vec<Range<usize>>,
    policy_id: &str,
    mut sample: impl FnMut(&[usize], &[u64]) -> Result<Vec<E>, CollectError>,
    mut seen: impl FnMut(&[E]),
) -> Result<Tally, CollectError> {
    let config = &stage.config;
    let mut trajectories = stage.writer(TableName::Trajectories)?;
    let mut steps = stage.writer(TableName::Steps)?;
    let mut tally = Tally {
        slots: batches.iter().map(|b| b.len()).sum(),
        ..Tally::default()
    };
    for batch in batches {
        let started = Instant::now();
        let kept = fill_batch(draws, config, batch, &mut tally, &mut sample, &mut seen)?;
        tally.seconds += started.elapsed().as_secs_f64();
        let (trajectory_rows, step_rows) = rows_of(&kept, config, policy_id);
        trajectories.write_rows(&trajectory_rows)?;
        steps.write_rows(&step_rows)?;
        tally.groups += kept.len();
        tally.trajectories += trajectory_rows.len();
    }
    stage.finish(trajectories)?;
    stage.finish(steps)?;
    Ok(tally)
}

/// The kept groups of one batch: each round draws once for every slot of
/// the batch still open, in one `sample` call, so what a slot draws depends
/// on its batch alone (see the module doc); with dynamic sampling a group
/// without signal is dropped and its slot draws again.
fn fill_batch<'a, E: Written>(
    draws: &Draws<'a>,
    config: &Config,
    batch: Range<usize>,
    tally: &mut Tally,
    sample: &mut impl FnMut(&[usize], &[u64]) -> Result<Vec<E>, CollectError>,
    seen: &mut impl FnMut(&[E]),
) -> Result<Vec<Group<'a, E>>, CollectError> {
    let group_size = draws.group_size;
    let mut kept = Vec::new();
    let mut pending: Vec<usize> = batch.collect();
    while !pending.is_empty() {
        let seeds: Vec<u64> = pending.iter().flat_map(|&draw| draws.seeds(draw)).collect();
        let mut episodes = sample(&pending, &seeds)?.into_iter();
        let mut next = Vec::new();
        for (index, &draw) in pending.iter().enumerate() {
            let group: Vec<E> = episodes.by_ref().take(group_size).collect();
            tally.draws += 1;
            seen(&group);
            let verdict = Verdict::of(group.iter().map(E::outcome));
            if config.dynamic_sampling.enabled && tally.dropped.count(verdict) {
                if draw + draws.wanted < draws.limit {
                    next.push(draw + draws.wanted);
                }
                continue;
            }
            let first = index * group_size;
            kept.push(Group {
                task: draws.task(draw),
                draw,
                seeds: seeds[first..first + group_size].to_vec(),
                episodes: group,
            });
        }
        pending = next;
    }
    Ok(kept)
}

/// The summary's first lines, whatever the loop: the policy, the
/// iteration, the groups written of those wanted, the draws and the groups
/// dropped (and a warning when slots stayed empty).
fn summary_head(
    args: &Args,
    config: &Config,
    policy: &str,
    wanted: usize,
    tally: &Tally,
) -> Summary {
    let mut summary = Summary::new("collect-rollouts");
    summary
        .add("policy", policy)
        .add("iteration", config.iteration)
        .add(
            "groups written",
            groups_written(args, tally.groups, wanted, tally.slots, tally.trajectories),
        );
    add_draws(
        &mut summary,
        config,
        tally.draws,
        &tally.dropped,
        tally.groups,
        tally.slots,
    );
    summary
}

/// "`kept` of `wanted` wanted (…, `rows` trajectories)".
fn groups_written(args: &Args, kept: usize, wanted: usize, slots: usize, rows: usize) -> String {
    format!(
        "{kept} of {wanted} wanted{} ({rows} trajectories)",
        if args.stage.shard.count > 1 {
            format!(", {slots} slots in shard {}", args.stage.shard)
        } else {
            String::new()
        },
    )
}

/// One-shot answers of a plan policy (household tasks): ours ([`Gpt`]), a
/// Hugging Face decoder ([`HfNet`]) or vision-language model
/// ([`VlPolicy`], shown each task's scene image).
fn one_shot<M: PlanNet>(
    stage: &Stage<Config>,
    args: &Args,
    draws: &Draws<'_>,
    batches: Vec<Range<usize>>,
    device: tch::Device,
) -> Result<(), CollectError> {
    let config = &stage.config;
    let policy = Checkpoint::<M>::load_kind(&args.policy.policy, device)?;
    let envs = draws.build_each(&batches, |task| TaskEnv::from_row(task, 0))?;
    let sampling = Sampling {
        temperature: config.temperature,
        top_p: config.top_p,
        max_new_tokens: config.max_new_tokens,
    };
    let group_size = config.group_size;
    let sample = |pending: &[usize], seeds: &[u64]| -> Result<Vec<Episode>, CollectError> {
        let requests: Vec<Request<'_>> = pending
            .iter()
            .flat_map(|&draw| {
                std::iter::repeat_n(&envs[draws.task(draw).task_id.as_str()], group_size)
            })
            .zip(seeds)
            .map(|(env, &seed)| Request { env, seed })
            .collect();
        Ok(run_episodes(
            &policy,
            &requests,
            &sampling,
            config.batch_rows,
            "sampling",
        )?)
    };
    let (mut successes, mut tokens) = (0usize, 0usize);
    let seen = |group: &[Episode]| {
        successes += group.iter().filter(|e| e.outcome.success).count();
        tokens += group.iter().map(|e| e.response_ids.len()).sum::<usize>();
    };
    let tally = collect(stage, draws, batches, &policy.manifest.id, sample, seen)?;
    let (samples, seconds) = (tally.draws * group_size, tally.seconds);
    let mut summary = summary_head(args, config, &policy.manifest.id, draws.wanted, &tally);
    summary
        .add(
            "success rate (all drawn samples)",
            format!(
                "{:.3} ({successes} of {samples})",
                successes as f64 / samples.max(1) as f64
            ),
        )
        .add(
            "mean response tokens",
            format!("{:.1}", tokens as f64 / samples.max(1) as f64),
        )
        .add(
            "sampling throughput",
            format!(
                "{:.0} response tokens/s ({:.1} s, T = {})",
                tokens as f64 / seconds.max(1e-9),
                seconds,
                config.temperature
            ),
        );
    stage.commit(&summary)?;
    Ok(())
}

/// What a run's closed-loop episodes came to, beside their success: those
/// cut at the decision limit, those infrastructure ended, and the
/// successes that never grasped (`grasp_known`: whether the world tells).
#[derive(Clone, Copy, Debug, Default)]
struct EpisodeCounts {
    successes: usize,
    truncated: usize,
    failed: usize,
    ungrasped_successes: usize,
    grasp_known: bool,
}

impl EpisodeCounts {
    fn add(&mut self, group: &[ClosedLoopEpisode]) {
        self.successes += group.iter().filter(|e| e.success).count();
        self.truncated += group.iter().filter(|e| e.truncated).count();
        self.failed += group.iter().filter(|e| e.infra_fault()).count();
        self.grasp_known |= group.iter().any(|e| e.target_ever_grasped.is_some());
        self.ungrasped_successes += group
            .iter()
            .filter(|e| e.success && e.target_ever_grasped == Some(false))
            .count();
    }

    /// The summary's closed-loop lines: the success rate over the episodes
    /// that ran (`samples` drawn), the successes that never grasped, the
    /// decisions per episode, the throughput (`K = chunk_len`, `T`) and
    /// where the wall time went.
    fn add_lines(
        &self,
        summary: &mut Summary,
        samples: usize,
        totals: &RunTotals,
        chunk_len: usize,
        temperature: f64,
    ) {
        let EpisodeCounts {
            successes,
            truncated,
            failed,
            ungrasped_successes,
            grasp_known,
        } = *self;
        // Faulted episodes are no outcome: the rate is over the episodes that ran.
        let ran = samples - failed;
        summary
            .add(
                "success rate (all drawn episodes)",
                format!(
                    "{:.3} ({successes} of {ran}; {truncated} cut at the decision limit; {failed} ended by an infrastructure fault, left out)",
                    successes as f64 / ran.max(1) as f64
                ),
            )
            .add(
                "successes that never grasped",
                if grasp_known {
                    format!("{ungrasped_successes} of {successes}")
                } else {
                    "- (the world has no grasp fact)".to_string()
                },
            )
            .add(
                "mean decisions per episode",
                format!("{:.1}", totals.decisions as f64 / samples.max(1) as f64),
            )
            .add(
                "closed-loop throughput",
                totals.throughput(&format!("K = {chunk_len}, T = {temperature}")),
            )
            .add("wall time", totals.wall_time());
    }
}

/// Closed-loop episodes of a closed-loop network (a VLA) on tabletop or
/// bridge tasks (see the module doc).
fn closed_loop<M: ClosedLoopNet>(
    stage: &Stage<Config>,
    args: &Args,
    draws: &Draws<'_>,
    batches: Vec<Range<usize>>,
    device: tch::Device,
) -> Result<(), CollectError> {
    let config = &stage.config;
    let group_size = config.group_size;
    let policy = Checkpoint::<M>::load_kind(&args.policy.policy, device)?;
    let specs = draws.build_each(&batches, task_of)?;
    let mut sampler = M::policy(&policy, config.temperature, config.latent_noise_std)?;
    let chunk_len = sampler.chunk_len();
    // Every instruction fits the checkpoint before anything is written.
    for (task_id, spec) in &specs {
        sampler
            .instruction_ids(spec.instruction())
            .map_err(|e| Error::BadInput(format!("task `{task_id}`: {e}")))?;
    }
    let bins = M::bins(&policy)?;
    let mut worlds = Worlds::new(WorldOptions {
        image_size: sampler.observation_shape().height,
        bins: bins.clone(),
        workers: config.bridge.settings(),
    });
    let mut totals = RunTotals::default();
    let sample = |pending: &[usize], seeds: &[u64]| -> Result<_, CollectError> {
        let tasks: Vec<WorldTask> = pending
            .iter()
            .map(|&draw| specs[draws.task(draw).task_id.as_str()].clone())
            .collect();
        let mut world = worlds.episodes(&tasks, group_size)?;
        let run = run_closed_loop(
            &mut world,
            &mut sampler,
            &bins,
            seeds,
            &ClosedLoopConfig {
                max_decisions: max_decisions(&tasks, chunk_len),
                label: "episodes",
            },
        )?;
        worlds.done(world);
        totals.add(&run);
        Ok(run.episodes)
    };
    let mut counts = EpisodeCounts::default();
    let tally = collect(
        stage,
        draws,
        batches,
        &policy.manifest.id,
        sample,
        |group| counts.add(group),
    )?;
    totals.seconds = tally.seconds;
    let samples = tally.draws * group_size;
    let policy_line = format!("{} ({}, closed loop)", policy.manifest.id, M::NAME);
    let mut summary = summary_head(args, config, &policy_line, draws.wanted, &tally);
    counts.add_lines(
        &mut summary,
        samples,
        &totals,
        chunk_len,
        config.temperature,
    );
    let failed = counts.failed;
    if let Some(faults) = worlds.faults() {
        summary.add(
            "gym bridge faults",
            format!("{faults} ({failed} episodes failed by a worker fault)"),
        );
    }
    stage.commit(&summary)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_core::config::refused_key;

    #[test]
    fn dynamic_sampling_judges_the_episodes_that_ran_and_names_why_it_drops() {
        let of = |o: &[(bool, bool)]| Verdict::of(o.iter().copied());
        assert_eq!(of(&[(true, false), (false, false)]), Verdict::Mixed);
        assert_eq!(of(&[(true, false), (true, false)]), Verdict::AllSuccess);
        assert_eq!(of(&[(false, false), (false, false)]), Verdict::AllFailure);
        // A group of one without faults is uniform, as before faults counted.
        assert_eq!(of(&[(true, false)]), Verdict::AllSuccess);
        // A faulted episode is no failure: the rest all succeeded.
        assert_eq!(
            of(&[(true, false), (false, true), (true, false)]),
            Verdict::AllSuccess
        );
        assert_eq!(
            of(&[(true, false), (false, true), (false, false)]),
            Verdict::Mixed
        );
        assert_eq!(of(&[(true, false), (false, true)]), Verdict::TooFewValid);
        assert_eq!(of(&[(false, true), (false, true)]), Verdict::TooFewValid);

        let mut dropped = Dropped::default();
        for verdict in [
            Verdict::AllSuccess,
            Verdict::Mixed,
            Verdict::AllSuccess,
            Verdict::AllFailure,
            Verdict::TooFewValid,
        ] {
            assert_eq!(dropped.count(verdict), verdict != Verdict::Mixed);
        }
        assert_eq!(
            dropped.to_string(),
            "4 groups dropped (2 all success, 1 all failure, 1 too few valid after faults)"
        );
        assert_eq!(dropped.warning(3, 3), None, "every slot filled");
        let some = dropped.warning(1, 3).unwrap();
        assert!(
            some.starts_with(
                "dynamic sampling filled 1 of 3 slots; 4 groups dropped (2 all success"
            ) && some.ends_with("the update learns from fewer groups than asked"),
            "{some}"
        );
        let none = dropped.warning(0, 3).unwrap();
        assert!(
            none.ends_with("no group written: the update has nothing to learn from"),
            "{none}"
        );
    }

    #[test]
    fn config_values_are_checked_when_loaded() {
        assert_eq!(refused_key::<Config>(&[]), None, "the defaults pass");
        assert_eq!(
            refused_key::<Config>(&["top_p=1", "tasks_per_iteration=1"]),
            None
        );
        assert_eq!(refused_key::<Config>(&["temperature=0"]), None, "greedy");
        for (set, key) in [
            ("group_size=0", "group_size"),
            ("temperature=-1.6", "temperature"),
            ("temperature=inf", "temperature"),
            ("top_p=0", "top_p"),
            ("top_p=1.5", "top_p"),
            ("max_new_tokens=0", "max_new_tokens"),
            ("tasks_per_iteration=0", "tasks_per_iteration"),
            ("batch_rows=0", "batch_rows"),
            ("iteration=-1", "iteration"),
            ("output.zstd_level=0", "output.zstd_level"),
        ] {
            assert_eq!(refused_key::<Config>(&[set]).as_deref(), Some(key), "{set}");
        }
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
