//! Closed-loop episodes: a policy that emits action chunks as tokens, run in
//! many episodes stepped in lockstep (SimpleVLA-RL's rollout
//! loop). `collect-rollouts` (temperature T) and `evaluate` (greedy) share
//! it, as they share [`crate::run_episodes`] for one-shot plans.
//!
//! Two interfaces meet here, and neither knows the other:
//! - [`ChunkPolicy`]: observations of a batch of episodes (frames, proprio,
//!   instruction token ids, one sampling seed per row) → per episode `K × D`
//!   action tokens (bins) and their log-probs. The models crate knows no
//!   world and does not depend on this crate; its VLA is adapted here by
//!   [`vla::VlaPolicy`] (this crate depends on both), and the stages reach
//!   it through [`net::ClosedLoopNet`], generic over the network.
//! - [`ClosedLoopWorld`] (the `embodyflow_world` crate, below the models,
//!   re-exported here): `n` episodes that render into contiguous buffers
//!   and advance by one chunk of `K` actions each; the tabletop world
//!   implements it (`embodyflow_tabletop::TabletopEpisodes`: G copies of
//!   each task share its initial state), and so does the Gymnasium bridge
//!   (`embodyflow_gym::GymEpisodes`).
//!
//! One decision of the driver [`run_closed_loop`], repeated until every
//! episode has ended or `max_decisions` decisions were taken:
//!
//! ```text
//! observe all → gather the live episodes' frames and proprio (and, in a
//! world that observes text or for a policy with a history, each decision's
//! prompt: history_prompt) → one policy
//! call over them (row seed = decision_seed(episode seed, decision)) →
//! check every row (K·D tokens in 0..n_bins, finite log-probs) → decode the
//! bins to actions (ActionBins, OpenVLA's centres) → step every live
//! episode through its chunk → record one decision per live episode:
//! the observation bytes (embodyflow_core::observation), tokens, log-probs
//! ```
//!
//! An episode ends when its world says so (success, or the world's
//! `max_steps`: a failure, never an error); one still running after
//! `max_decisions` is cut there, a failure marked `truncated`. One whose
//! environment could not be started or reset
//! ([`ClosedLoopWorld::start_failure`]) ends before its first decision, a
//! failure with that reason and no decisions. A bad policy
//! output (a bin outside `0..n_bins`, a chunk of the wrong length, a NaN
//! log-prob) is an error naming the episode, its task and the decision, and
//! nothing of that decision is stepped. Row seeds depend only on the
//! episode's seed and the decision index, so an episode draws the same
//! tokens whatever batch it runs in.
//!
//! A world whose observations carry text (a Gymnasium `Text` space:
//! [`ClosedLoopWorld::observation_text`]) gives each decision its own
//! prompt, the instruction and the text on the next line
//! ([`observed_prompt`]), tokenised by the policy; it is recorded in the
//! decision's `steps.prompt_ids`, where update-policy reads it back. A
//! policy with a history ([`ChunkPolicy::history`] `= H > 0`, a VLA's
//! `history`) reads at each decision the episode's last `H` decisions too,
//! each one's observed text and its action ([`action_text`] of its tokens)
//! in verl-agent's shape ([`history_prompt`]), in any world (where no text
//! is observed, the actions alone); the episode's first decision reads the
//! prompt it would without history.
//!
//! ```no_run
//! use embodyflow_algos::action_tokens::ActionBins;
//! use embodyflow_rollout::closed_loop::{ChunkPolicy, ClosedLoopConfig, run_closed_loop};
//! use embodyflow_tabletop::{Split, Suite, TabletopEpisodes, generate};
//! # fn policy() -> impl ChunkPolicy { todo!() }
//! let tasks = vec![generate(Suite::Goal, Split::Train, 7, 0)];
//! let mut world = TabletopEpisodes::new(&tasks, 8, 32).unwrap(); // G = 8
//! let seeds: Vec<u64> = (0..8).collect();
//! let config = ClosedLoopConfig { max_decisions: 64, label: "rollouts" };
//! let run =
//!     run_closed_loop(&mut world, &mut policy(), &ActionBins::openvla(), &seeds, &config).unwrap();
//! let rows = run.episodes[0].step_rows("it0/task/d0/s0"); // one steps row per decision
//! println!("world {:.1} s, policy {:.1} s", run.world_seconds, run.policy_seconds);
//! ```
//!
//! The run reports its decisions, env steps and the seconds spent in the
//! world (render, step) and in the policy, so a stage shows which one is
//! the bottleneck.

use std::time::{Duration, Instant};

use embodyflow_algos::action_tokens::ActionBins;
use embodyflow_core::observation::{self, ObservationError, ObservationShape};
use embodyflow_core::progress;
use embodyflow_core::schemas::StepRow;
use embodyflow_core::{Classify, ErrorKind};
pub use embodyflow_world::{
    ChunkDecision, ChunkPolicy, ChunkReport, ClosedLoopWorld, DecisionBatch, GraspPoint,
    PastDecision, Thought, WorldError, action_text, history_prompt, observed_prompt,
};

/// Why a closed-loop run stopped.
#[derive(Debug, thiserror::Error)]
pub enum ClosedLoopError {
    /// The policy cannot encode an episode's instruction.
    #[error("episode {episode} (task `{task}`), its instruction: {source}")]
    Instruction {
        /// The episode.
        episode: usize,
        /// Its task.
        task: String,
        /// Who must act.
        kind: ErrorKind,
        /// The policy's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The policy cannot encode a decision's own prompt (the instruction,
    /// the observed text and the decisions a policy with a history recalls).
    #[error(
        "episode {episode} (task `{task}`), decision {decision}, its prompt with the observed text: {source}"
    )]
    ObservedPrompt {
        /// The episode.
        episode: usize,
        /// Its task.
        task: String,
        /// The decision.
        decision: usize,
        /// Who must act.
        kind: ErrorKind,
        /// The policy's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The policy failed or refused its input.
    #[error("policy at decision {decision}: {source}")]
    Policy {
        /// The decision.
        decision: usize,
        /// Who must act.
        kind: ErrorKind,
        /// The policy's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The world failed while stepping.
    #[error("world at decision {decision}: {source}")]
    World {
        /// The decision.
        decision: usize,
        /// The world's error.
        source: WorldError,
    },
    /// The world's observations are not what the policy takes.
    #[error("the world's observations do not fit the policy: {0}")]
    Observation(#[from] ObservationError),
    /// A policy for another action size than the world's, or chunks of 0
    /// actions.
    #[error(
        "the policy emits chunks of {chunk_len} actions of {policy} dimensions; the world takes actions of {world} dimensions (and chunks of at least 1)"
    )]
    ActionShape {
        /// The policy's `K`.
        chunk_len: usize,
        /// The policy's `D`.
        policy: usize,
        /// The world's.
        world: usize,
    },
    /// Sampling seeds not one per episode.
    #[error("{found} sampling seeds for {episodes} episodes")]
    SeedCount {
        /// Seeds given.
        found: usize,
        /// Episodes.
        episodes: usize,
    },
    /// The policy returned another number of decisions than rows.
    #[error("policy at decision {decision}: {found} decisions for {rows} live episodes")]
    DecisionCount {
        /// The decision.
        decision: usize,
        /// Decisions returned.
        found: usize,
        /// Rows asked.
        rows: usize,
    },
    /// A decision that cannot be applied, named by episode.
    #[error("episode {episode} (task `{task}`), decision {decision}: {reason}")]
    BadDecision {
        /// The episode.
        episode: usize,
        /// Its task.
        task: String,
        /// The decision.
        decision: usize,
        /// What is wrong.
        reason: String,
    },
}

impl Classify for ClosedLoopError {
    fn kind(&self) -> ErrorKind {
        match self {
            ClosedLoopError::Policy { kind, .. }
            | ClosedLoopError::Instruction { kind, .. }
            | ClosedLoopError::ObservedPrompt { kind, .. } => *kind,
            ClosedLoopError::Observation(_)
            | ClosedLoopError::ActionShape { .. }
            | ClosedLoopError::SeedCount { .. } => ErrorKind::BadInput,
            ClosedLoopError::World { .. }
            | ClosedLoopError::DecisionCount { .. }
            | ClosedLoopError::BadDecision { .. } => ErrorKind::Failure,
        }
    }
}

/// How long to run.
#[derive(Clone, Copy, Debug)]
pub struct ClosedLoopConfig<'a> {
    /// Decisions after which an episode still running is cut (a failure).
    pub max_decisions: usize,
    /// The progress bar's label.
    pub label: &'a str,
}

/// One recorded decision of an episode.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordedDecision {
    /// The observation the policy saw ([`embodyflow_core::observation`]).
    pub observation: Vec<u8>,
    /// The action tokens.
    pub tokens: Vec<u32>,
    /// Their log-probs.
    pub token_logprobs: Vec<f32>,
    /// The latent chain, stop and value of a thinking policy.
    pub thought: Option<Thought>,
    /// The anchor state the decision was taken in
    /// ([`ClosedLoopWorld::anchor_key`]).
    pub anchor_key: Option<String>,
    /// The decision's prompt when it is not the episode's: in a world that
    /// observes text, the instruction and the observed text
    /// ([`observed_prompt`]), and for a policy with a history the
    /// decisions it recalls ([`history_prompt`]), tokenised.
    pub prompt_ids: Option<Vec<i32>>,
    /// Actions of the chunk the world executed (fewer than `K` when the
    /// episode ended within it).
    pub env_steps: u32,
    /// Tokens of those actions (`env_steps × D`): the tokens after them
    /// chose actions that never ran.
    pub executed_tokens: usize,
}

/// A finished closed-loop episode.
#[derive(Clone, Debug, PartialEq)]
pub struct ClosedLoopEpisode {
    /// Its task.
    pub task_id: String,
    /// The instruction's token ids (every decision's prompt, unless the
    /// decision has its own: [`RecordedDecision::prompt_ids`]).
    pub prompt_ids: Vec<i32>,
    /// Its decisions, in order.
    pub decisions: Vec<RecordedDecision>,
    /// Whether it ended in success.
    pub success: bool,
    /// Environment steps executed.
    pub env_steps: u32,
    /// Whether it was still running after `max_decisions` (a failure).
    pub truncated: bool,
    /// Whether a goal's object was ever grasped (`None`: the world has no
    /// grasping).
    pub target_ever_grasped: Option<bool>,
    /// Where it was asked to grasp and where it did (`None`: the world
    /// does not say).
    pub grasp: Option<GraspPoint>,
    /// Why it ended outside the task ([`ChunkReport::failure`]): a failure
    /// with a reason (the `failure_reason` column).
    pub failure: Option<String>,
}

impl ClosedLoopEpisode {
    /// Whether infrastructure ended it ([`ChunkReport::failure`]: a worker
    /// that crashed, hung or sent a malformed frame, an environment that
    /// raised): no outcome of the policy, left out of learning (the
    /// `infra_fault` column).
    pub fn infra_fault(&self) -> bool {
        self.failure.is_some()
    }

    /// The episode's `steps` rows: one per decision (`step_index` = its
    /// index), the decision's prompt as `prompt_ids` (the instruction, or
    /// its own in a world that observes text), the tokens as `response_ids`,
    /// their log-probs and the observation bytes, and a thinking policy's
    /// latents, chosen length, stop log-prob and value.
    ///
    /// A chunk the episode's end cut short gets a `response_mask` true on
    /// the tokens of the actions that ran and false on the rest, so actions
    /// that never ran carry no advantage, loss or statistic (SimpleVLA-RL's
    /// mask `token < finish_step × action_token_len`, `ray_trainer.py` and
    /// `dp_rob.py`); other decisions keep a null mask. The LAPO loss counts
    /// a decision whole, as LaST-R1 does (its valid steps are
    /// `ceil(finish_step / K)`).
    pub fn step_rows(&self, trajectory_id: &str) -> Vec<StepRow> {
        self.decisions
            .iter()
            .enumerate()
            .map(|(index, d)| {
                let mut row = StepRow::one_shot(
                    trajectory_id.to_string(),
                    d.prompt_ids
                        .clone()
                        .unwrap_or_else(|| self.prompt_ids.clone()),
                    d.tokens.iter().map(|&t| t as i32).collect(),
                    d.token_logprobs.clone(),
                );
                row.step_index = index as i32;
                if d.executed_tokens < d.tokens.len() {
                    row.response_mask =
                        Some((0..d.tokens.len()).map(|t| t < d.executed_tokens).collect());
                }
                row.observation = Some(d.observation.clone());
                row.anchor_key = d.anchor_key.clone();
                if let Some(thought) = &d.thought {
                    row.latents = Some(thought.latents.clone());
                    row.latent_dim = Some(thought.latent_dim as i32);
                    row.chosen_latent_len = Some(thought.latent_len as i32);
                    row.old_latent_end_logprob = Some(thought.stop_logprob);
                    row.old_value = Some(thought.value);
                }
                row
            })
            .collect()
    }
}

/// What a closed-loop run produced, and where its time went.
#[derive(Clone, Debug, PartialEq)]
pub struct ClosedLoopRun {
    /// The episodes, in the world's order.
    pub episodes: Vec<ClosedLoopEpisode>,
    /// Policy rows decided (decisions over all episodes).
    pub decisions: u64,
    /// Environment steps over all episodes.
    pub env_steps: u64,
    /// Seconds in the world: rendering and stepping.
    pub world_seconds: f64,
    /// Seconds in the policy's calls.
    pub policy_seconds: f64,
}

/// Closed-loop runs added up for a stage's summary: decisions, env steps
/// and where the wall time went.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RunTotals {
    /// Policy rows decided.
    pub decisions: u64,
    /// Environment steps.
    pub env_steps: u64,
    /// Seconds in the world.
    pub world_seconds: f64,
    /// Seconds in the policy.
    pub policy_seconds: f64,
    /// Wall-clock seconds of the runs (the caller's measure, which may
    /// include its own work between runs).
    pub seconds: f64,
}

impl RunTotals {
    /// Adds a run's counts and world / policy seconds (not its wall time:
    /// add that to `seconds`).
    pub fn add(&mut self, run: &ClosedLoopRun) {
        self.decisions += run.decisions;
        self.env_steps += run.env_steps;
        self.world_seconds += run.world_seconds;
        self.policy_seconds += run.policy_seconds;
    }

    /// `"<d> decisions/s, <e> env steps/s (<s> s, <detail>)"`.
    pub fn throughput(&self, detail: &str) -> String {
        let seconds = self.seconds.max(1e-9);
        format!(
            "{:.1} decisions/s, {:.0} env steps/s ({:.1} s, {detail})",
            self.decisions as f64 / seconds,
            self.env_steps as f64 / seconds,
            self.seconds
        )
    }

    /// `"world <w> %, policy <p> %, other <o> %"` of the wall time.
    pub fn wall_time(&self) -> String {
        let share = |part: f64| 100.0 * part / self.seconds.max(1e-9);
        let (world, policy) = (share(self.world_seconds), share(self.policy_seconds));
        format!(
            "world {world:.1} %, policy {policy:.1} %, other {:.1} %",
            (100.0 - world - policy).max(0.0)
        )
    }
}

/// The sampling seed of one decision of an episode: BLAKE3 of the episode's
/// seed and the decision index.
pub fn decision_seed(episode_seed: u64, decision: usize) -> u64 {
    let mut hasher = blake3::Hasher::new();
    hasher.update(&episode_seed.to_le_bytes());
    hasher.update(&(decision as u64).to_le_bytes());
    let bytes = hasher.finalize();
    u64::from_le_bytes(bytes.as_bytes()[..8].try_into().expect("8 bytes"))
}

/// Runs every episode of `world` under `policy` (see the module doc);
/// `seeds` holds one sampling seed per episode.
pub fn run_closed_loop<W: ClosedLoopWorld + ?Sized, P: ChunkPolicy + ?Sized>(
    world: &mut W,
    policy: &mut P,
    bins: &ActionBins,
    seeds: &[u64],
    config: &ClosedLoopConfig<'_>,
) -> Result<ClosedLoopRun, ClosedLoopError> {
    let fit = Fit::check(world, policy, seeds)?;
    let mut episodes = start_episodes(world, policy)?;
    let n = episodes.len();
    let mut lockstep = Lockstep::new(fit, bins, seeds, policy.history());
    let mut live: Vec<usize> = (0..n).filter(|&i| world.running(i)).collect();
    let bar = progress::bar(n as u64, config.label);
    bar.inc((n - live.len()) as u64);
    let mut decision = 0;
    while !live.is_empty() && decision < config.max_decisions {
        let reports = lockstep.decide(world, policy, &live, decision, &mut episodes)?;
        let before = live.len();
        live.retain(|&i| !reports[i].done);
        bar.inc((before - live.len()) as u64);
        decision += 1;
    }
    bar.finish_and_clear();
    for &i in &live {
        episodes[i].truncated = true;
    }
    for (i, episode) in episodes.iter_mut().enumerate() {
        episode.target_ever_grasped = world.target_ever_grasped(i);
        episode.grasp = world.grasp_point(i);
    }
    Ok(ClosedLoopRun {
        decisions: episodes.iter().map(|e| e.decisions.len() as u64).sum(),
        env_steps: episodes.iter().map(|e| u64::from(e.env_steps)).sum(),
        episodes,
        world_seconds: lockstep.world_time.as_secs_f64(),
        policy_seconds: lockstep.policy_time.as_secs_f64(),
    })
}

/// What the world and the policy agree on, checked before any episode
/// starts: one seed per episode, the chunk (`k` actions of `d`
/// dimensions), the observation shape and its images' names.
struct Fit {
    k: usize,
    d: usize,
    shape: ObservationShape,
    image_names: Vec<String>,
}

impl Fit {
    fn check<W: ClosedLoopWorld + ?Sized, P: ChunkPolicy + ?Sized>(
        world: &W,
        policy: &P,
        seeds: &[u64],
    ) -> Result<Fit, ClosedLoopError> {
        if seeds.len() != world.len() {
            return Err(ClosedLoopError::SeedCount {
                found: seeds.len(),
                episodes: world.len(),
            });
        }
        let (k, d) = (policy.chunk_len(), world.action_dim());
        if k == 0 || policy.action_dim() != d {
            return Err(ClosedLoopError::ActionShape {
                chunk_len: k,
                policy: policy.action_dim(),
                world: d,
            });
        }
        let (shape, wanted) = (world.observation_shape(), policy.observation_shape());
        if shape != wanted {
            return Err(ObservationError::ShapeMismatch {
                expected: wanted,
                found: shape,
            }
            .into());
        }
        Ok(Fit {
            k,
            d,
            shape,
            image_names: world.image_names().to_vec(),
        })
    }

    /// Action tokens (and actions) in one chunk: `k · d`.
    fn per_chunk(&self) -> usize {
        self.k * self.d
    }
}

/// Every episode before its first decision: its task, its instruction's
/// token ids, and why it could not start, if it could not.
fn start_episodes<W: ClosedLoopWorld + ?Sized, P: ChunkPolicy + ?Sized>(
    world: &W,
    policy: &P,
) -> Result<Vec<ClosedLoopEpisode>, ClosedLoopError> {
    (0..world.len())
        .map(|i| {
            let prompt_ids = policy.instruction_ids(world.instruction(i)).map_err(|e| {
                ClosedLoopError::Instruction {
                    episode: i,
                    task: world.task_id(i).to_string(),
                    kind: e.kind(),
                    source: Box::new(e),
                }
            })?;
            Ok(ClosedLoopEpisode {
                task_id: world.task_id(i).to_string(),
                prompt_ids,
                decisions: Vec::new(),
                success: false,
                env_steps: 0,
                truncated: false,
                target_ever_grasped: None,
                grasp: None,
                failure: world.start_failure(i).map(str::to_string),
            })
        })
        .collect()
}

/// The driver's state across decisions: what every decision uses (the
/// fit, the bins, the episodes' seeds, the policy's history length), each
/// episode's decisions as its prompts recall them, the buffers one decision
/// fills (the live episodes' frames and proprio, every episode's chunk of
/// actions) and the time spent in the world and in the policy.
struct Lockstep<'a> {
    fit: Fit,
    bins: &'a ActionBins,
    seeds: &'a [u64],
    history: usize,
    past: Vec<Vec<PastDecision>>,
    frames: Vec<u8>,
    proprio: Vec<f32>,
    actions: Vec<f32>,
    world_time: Duration,
    policy_time: Duration,
}

impl<'a> Lockstep<'a> {
    fn new(fit: Fit, bins: &'a ActionBins, seeds: &'a [u64], history: usize) -> Lockstep<'a> {
        let actions = vec![0.0f32; seeds.len() * fit.per_chunk()];
        Lockstep {
            fit,
            bins,
            seeds,
            history,
            past: vec![Vec::new(); seeds.len()],
            frames: Vec::new(),
            proprio: Vec::new(),
            actions,
            world_time: Duration::ZERO,
            policy_time: Duration::ZERO,
        }
    }

    /// One decision of the `live` episodes (the module doc's cycle):
    /// observe, ask the policy, check and decode its chunks, step the
    /// world, record; returns the world's reports, one per episode.
    fn decide<W: ClosedLoopWorld + ?Sized, P: ChunkPolicy + ?Sized>(
        &mut self,
        world: &mut W,
        policy: &mut P,
        live: &[usize],
        decision: usize,
        episodes: &mut [ClosedLoopEpisode],
    ) -> Result<Vec<ChunkReport>, ClosedLoopError> {
        self.observe(world, live);
        let prompts = decision_prompts(world, policy, live, decision, self.history, &self.past)?;
        let instructions: Vec<&[i32]> = live
            .iter()
            .zip(&prompts)
            .map(|(&i, own)| own.as_deref().unwrap_or(&episodes[i].prompt_ids))
            .collect();
        let row_seeds: Vec<u64> = live
            .iter()
            .map(|&i| decision_seed(self.seeds[i], decision))
            .collect();
        let batch = DecisionBatch {
            shape: self.fit.shape,
            frames: &self.frames,
            proprio: &self.proprio,
            instructions: &instructions,
            episodes: live,
            seeds: &row_seeds,
            decision,
        };
        let started = Instant::now();
        let chosen = policy.decide(&batch).map_err(|e| ClosedLoopError::Policy {
            decision,
            kind: e.kind(),
            source: Box::new(e),
        })?;
        self.policy_time += started.elapsed();
        if chosen.len() != live.len() {
            return Err(ClosedLoopError::DecisionCount {
                decision,
                found: chosen.len(),
                rows: live.len(),
            });
        }
        let anchors: Vec<Option<String>> = live.iter().map(|&i| world.anchor_key(i)).collect();
        // What the episodes' later prompts recall of this decision.
        let recalled: Vec<PastDecision> = match self.history {
            0 => Vec::new(),
            _ => live
                .iter()
                .zip(&chosen)
                .map(|(&i, c)| PastDecision {
                    text: world.observation_text(i).map(str::to_string),
                    action: action_text(&c.tokens, self.fit.d, self.bins),
                })
                .collect(),
        };
        let observations = decode_chunks(
            &self.fit,
            world,
            self.bins,
            &batch,
            &chosen,
            &mut self.actions,
        )?;
        let started = Instant::now();
        let reports = world
            .step_chunks(&self.actions, self.fit.k)
            .map_err(|source| ClosedLoopError::World { decision, source })?;
        self.world_time += started.elapsed();
        for (&i, past) in live.iter().zip(recalled) {
            self.past[i].push(past);
        }
        let recorded = live.iter().zip(chosen).zip(observations).zip(anchors);
        for ((((&i, chosen), observation), anchor_key), prompt_ids) in recorded.zip(prompts) {
            let report = &reports[i];
            let episode = &mut episodes[i];
            episode.decisions.push(RecordedDecision {
                observation,
                tokens: chosen.tokens,
                token_logprobs: chosen.token_logprobs,
                thought: chosen.thought,
                anchor_key,
                prompt_ids,
                env_steps: report.env_steps,
                executed_tokens: report.env_steps as usize * self.fit.d,
            });
            episode.env_steps += report.env_steps;
            episode.success = report.success && report.failure.is_none();
            if report.failure.is_some() {
                episode.failure.clone_from(&report.failure);
            }
        }
        Ok(reports)
    }

    /// Renders the world and gathers the live episodes' frames and proprio.
    fn observe<W: ClosedLoopWorld + ?Sized>(&mut self, world: &mut W, live: &[usize]) {
        let (pixel_len, proprio_len) = (self.fit.shape.pixel_len(), self.fit.shape.proprio);
        let started = Instant::now();
        world.observe();
        self.world_time += started.elapsed();
        self.frames.clear();
        self.proprio.clear();
        for &i in live {
            let frame = &world.frames()[i * pixel_len..(i + 1) * pixel_len];
            self.frames.extend_from_slice(frame);
            let proprio = &world.proprio()[i * proprio_len..(i + 1) * proprio_len];
            self.proprio.extend_from_slice(proprio);
        }
    }
}

/// Each live episode's own prompt at `decision`, in a world that observes
/// text or for a policy that recalls the episode's last `history`
/// decisions (`past`, by episode: [`history_prompt`], tokenised by the
/// policy); `None` where the episode's instruction serves (no text, nothing
/// to recall).
fn decision_prompts<W: ClosedLoopWorld + ?Sized, P: ChunkPolicy + ?Sized>(
    world: &W,
    policy: &P,
    live: &[usize],
    decision: usize,
    history: usize,
    past: &[Vec<PastDecision>],
) -> Result<Vec<Option<Vec<i32>>>, ClosedLoopError> {
    live.iter()
        .map(|&i| {
            let text = world.observation_text(i);
            if text.is_none() && (history == 0 || past[i].is_empty()) {
                return Ok(None);
            }
            let prompt = history_prompt(world.instruction(i), history, &past[i], text);
            policy
                .instruction_ids(&prompt)
                .map(Some)
                .map_err(|e| ClosedLoopError::ObservedPrompt {
                    episode: i,
                    task: world.task_id(i).to_string(),
                    decision,
                    kind: e.kind(),
                    source: Box::new(e),
                })
        })
        .collect()
}

/// Checks every row the policy chose (`k · d` tokens, log-probs finite and
/// `<= 0`), decodes its bins into its episode's slot of `actions` (the
/// rest zero) and encodes the observation it saw; an error names the
/// episode, its task and the decision, before anything is stepped.
fn decode_chunks<W: ClosedLoopWorld + ?Sized>(
    fit: &Fit,
    world: &W,
    bins: &ActionBins,
    batch: &DecisionBatch<'_>,
    chosen: &[ChunkDecision],
    actions: &mut [f32],
) -> Result<Vec<Vec<u8>>, ClosedLoopError> {
    let (k, d, per) = (fit.k, fit.d, fit.per_chunk());
    let names: Vec<&str> = fit.image_names.iter().map(String::as_str).collect();
    actions.fill(0.0);
    let mut observations = Vec::with_capacity(chosen.len());
    for (r, (&i, c)) in batch.episodes.iter().zip(chosen).enumerate() {
        let bad = |reason: String| ClosedLoopError::BadDecision {
            episode: i,
            task: world.task_id(i).to_string(),
            decision: batch.decision,
            reason,
        };
        if c.tokens.len() != per || c.token_logprobs.len() != per {
            return Err(bad(format!(
                "{} tokens and {} log-probs, a chunk of {k} actions x {d} dimensions has {per}",
                c.tokens.len(),
                c.token_logprobs.len()
            )));
        }
        if let Some((at, lp)) = c
            .token_logprobs
            .iter()
            .enumerate()
            .find(|(_, lp)| !(lp.is_finite() && **lp <= 0.0))
        {
            return Err(bad(format!(
                "log-prob {lp} of token {at} is not a finite number <= 0"
            )));
        }
        let values = bins.decode(&c.tokens).map_err(|e| bad(e.to_string()))?;
        actions[i * per..(i + 1) * per].copy_from_slice(&values);
        observations.push(
            observation::encode_named(&fit.shape, &names, batch.frame(r), batch.proprio_of(r))
                .map_err(|e| bad(format!("its observation: {e}")))?,
        );
    }
    Ok(observations)
}

pub mod net;
pub mod vla;

#[cfg(test)]
mod tests;
