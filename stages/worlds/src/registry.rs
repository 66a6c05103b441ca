//! The registry of worlds: [`WORLDS`], one line per world, one-shot and
//! closed-loop alike, and every lookup over it — a task row's world and
//! task ([`world_of`], [`task_of`]), the generators `generate-tasks`
//! iterates ([`generators`]), the default world of a VLA made without
//! tasks ([`default_world`]), whether an `env` is closed-loop
//! ([`is_closed_loop`]) or a one-shot environment ([`one_shot`]) — and a
//! stage's batches of episodes over its run ([`Worlds`], [`Episodes`]).
//! The interfaces a world implements are `embodyflow_world`'s, which knows
//! no world and no registry ([`embodyflow_world::world`],
//! [`embodyflow_world::generator`], [`embodyflow_world::demonstrations`]).
//!
//! A stage keeps one [`Worlds`] for its run: the bridge's worker pool
//! outlives a batch (workers start once, not per batch) and its fault
//! counts (crashed, hung, malformed, restarts) add up for the summary.
//!
//! ```no_run
//! use embodyflow_algos::action_tokens::ActionBins;
//! use embodyflow_worlds::{WorldOptions, WorldTask, Worlds, task_of};
//! # let rows: Vec<embodyflow_core::schemas::TaskRow> = todo!();
//! let tasks: Vec<WorldTask> = rows.iter().map(task_of).collect::<Result<_, _>>().unwrap();
//! let options = WorldOptions { image_size: 32, bins: ActionBins::openvla(), workers: Default::default() };
//! let mut worlds = Worlds::new(options);
//! let episodes = worlds.episodes(&tasks, 8).unwrap(); // G = 8 copies of each task
//! // ... run_closed_loop(&mut episodes, ...)
//! worlds.done(episodes);
//! ```

use embodyflow_core::Error;
use embodyflow_core::observation::ObservationShape;
use embodyflow_core::schemas::TaskRow;
use embodyflow_envs::TaskEnv;
use embodyflow_world::{
    ChunkReport, ClosedLoopWorld, GraspPoint, PastDecision, WorldError, action_text, history_prompt,
};

use crate::household;
use embodyflow_core::checks::either;
use embodyflow_world::generator::Generator;
use embodyflow_world::workers::WorkerSettings;
use embodyflow_world::world::{
    Kept, PolicyShape, World, WorldEpisodes, WorldOptions, WorldTask, WorldsError,
};

/// A world of the registry: how `generate-tasks` writes its tasks and,
/// for a closed-loop world, how its episodes run.
#[derive(Clone, Copy)]
pub struct Registered {
    /// Its tasks' generator (`generate-tasks --set env=NAME`).
    pub tasks: &'static dyn Generator,
    /// The world its episodes run in; `None` for a one-shot world (a plan
    /// per task, run by `embodyflow_envs`).
    pub closed_loop: Option<&'static dyn World>,
}

impl Registered {
    /// A closed-loop world, which generates its tasks too.
    pub const fn closed_loop<W: World + Generator>(world: &'static W) -> Registered {
        Registered {
            tasks: world,
            closed_loop: Some(world),
        }
    }

    /// A one-shot world: its tasks' generator.
    pub const fn one_shot<G: Generator>(world: &'static G) -> Registered {
        Registered {
            tasks: world,
            closed_loop: None,
        }
    }
}

/// Every world the stages know, one line each, in the order messages name
/// them: the first is `generate-tasks`' default `env`, the first
/// closed-loop one the world a VLA is made for without a tasks table
/// ([`default_world`]).
pub static WORLDS: &[Registered] = &[
    Registered::one_shot(&household::HOUSEHOLD),
    Registered::closed_loop(&embodyflow_tabletop::declaration::TABLETOP),
    Registered::closed_loop(&embodyflow_gym::declaration::GYM),
    #[cfg(test)]
    Registered::closed_loop(&embodyflow_toy_world::TOY),
];

/// The closed-loop worlds of [`WORLDS`], in its order.
pub fn closed_loop_worlds() -> impl Iterator<Item = &'static dyn World> {
    WORLDS.iter().filter_map(|w| w.closed_loop)
}

/// The world whose task rows have `env`; `None` for an `env` that is not a
/// closed-loop world (a one-shot environment, or none at all).
pub fn world_of(env: &str) -> Option<&'static dyn World> {
    closed_loop_worlds().find(|w| w.claims(env))
}

/// The world a VLA is made for when no tasks table names one
/// (`init-policy --set kind=vla` without `--input`): the first closed-loop
/// world of [`WORLDS`], which generates its own train tasks
/// ([`World::train_tasks`]).
pub fn default_world() -> &'static dyn World {
    closed_loop_worlds()
        .next()
        .expect("the registry holds a closed-loop world")
}

/// The one world of `tasks`; tasks of two worlds are bad input naming a
/// task of each (a batch, or a set of demonstrations, runs one).
pub fn world_of_tasks(tasks: &[WorldTask]) -> Result<&'static dyn World, Error> {
    let world = tasks.first().map_or(default_world(), WorldTask::world);
    match tasks.iter().find(|t| !std::ptr::addr_eq(t.world(), world)) {
        None => Ok(world),
        Some(other) => Err(Error::BadInput(format!(
            "tasks `{}` ({}) and `{}` ({}) are of different worlds; a batch runs one",
            tasks[0].task_id(),
            tasks[0].env(),
            other.task_id(),
            other.env()
        ))),
    }
}

/// The task of `row` (its `env` names the world, [`world_of`]); a row its
/// world cannot build, or a world that is not closed-loop, is bad input
/// naming the task.
pub fn task_of(row: &TaskRow) -> Result<WorldTask, Error> {
    match world_of(&row.env) {
        Some(world) => world.task(row),
        None => Err(Error::BadInput(format!(
            "task `{}`: environment `{}` is not a closed-loop world (known: {})",
            row.task_id,
            row.env,
            closed_loop_worlds()
                .map(|w| w.env())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Every world's generator, in the order of [`WORLDS`].
pub fn generators() -> impl Iterator<Item = &'static dyn Generator> {
    WORLDS.iter().map(|w| w.tasks)
}

/// The generator of `env = name`.
///
/// ```
/// use embodyflow_worlds::generator;
/// let household = generator("household").unwrap();
/// assert!(household.settings().is_some() && !household.initial_states());
/// ```
pub fn generator(name: &str) -> Option<&'static dyn Generator> {
    generators().find(|g| g.name() == name)
}

/// The names of the worlds `keep` keeps, as `a, b or c`.
pub fn names_where(keep: impl Fn(&dyn Generator) -> bool) -> String {
    let names: Vec<&str> = generators()
        .filter(|g| keep(*g))
        .map(|g| g.name())
        .collect();
    either(&names)
}

/// Whether `env` names a closed-loop world (`tabletop`, or
/// `gym:<adapter>`, a Gymnasium environment through the bridge): its
/// trajectories are episodes of decisions with an outcome, not one-shot
/// plans.
pub fn is_closed_loop(env: &str) -> bool {
    world_of(env).is_some()
}

/// The one-shot environment of `row` in run `run`
/// ([`TaskEnv::from_row`]); a row of a closed-loop world is bad input
/// saying so, for a stage that runs one-shot plans.
///
/// ```
/// use embodyflow_household::{Split, generate_tasks, task_row};
/// use embodyflow_worlds::one_shot;
/// let mut row = task_row(&generate_tasks(Split::Train, 1, 21)[0]);
/// assert!(one_shot(&row, 0).is_ok());
/// for (env, words) in [
///     ("tabletop", "`tabletop` is a closed-loop world"),
///     ("gym:babyai", "`gym:babyai` is a closed-loop world"),
///     ("gym", "`gym` is not built in (known: household)"),
/// ] {
///     row.env = env.into();
///     let error = one_shot(&row, 0).unwrap_err().to_string();
///     assert!(error.contains(words) && error.contains(&row.task_id), "{error}");
/// }
/// ```
pub fn one_shot(row: &TaskRow, run: u32) -> Result<TaskEnv, Error> {
    if is_closed_loop(&row.env) {
        return Err(Error::BadInput(format!(
            "task `{}`: environment `{}` is a closed-loop world (actions step by step); \
             this stage runs one-shot plans ({}) only",
            row.task_id,
            row.env,
            embodyflow_envs::ONE_SHOT.join(", ")
        )));
    }
    TaskEnv::from_row(row, run)
}

/// The shape of a policy for `task`'s world ([`World::policy_shape`]): the
/// tabletop world's frames of `image_size` pixels and its proprio and
/// action sizes, or what the bridge's adapter reports for its environment
/// (asked of a fresh worker).
pub fn policy_shape(
    task: &WorldTask,
    image_size: usize,
    workers: &WorkerSettings,
) -> Result<PolicyShape, WorldsError> {
    task.world().policy_shape(task, image_size, workers)
}

/// The decisions of `chunk_len` actions after which every episode of
/// `tasks` has ended at its task's `max_steps` (a failure, not a cut):
/// `ceil(max(max_steps) / chunk_len)`.
pub fn max_decisions(tasks: &[WorldTask], chunk_len: usize) -> usize {
    let max_steps = tasks.iter().map(WorldTask::max_steps).max().unwrap_or(0) as usize;
    max_steps.div_ceil(chunk_len.max(1))
}

/// What [`probe_prompts`] plays: how many episodes, and the policy's
/// decisions (actions per decision, and the earlier decisions each prompt
/// recalls).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    /// Episodes, one of each of the first tasks.
    pub episodes: usize,
    /// Actions per decision, `K` (at least 1).
    pub chunk_len: usize,
    /// Earlier decisions each prompt recalls, `H` ([`history_prompt`]).
    pub history: usize,
}

/// The prompts a policy would read in probe episodes: one episode of each
/// of the first `probe.episodes` tasks, random chunks of `probe.chunk_len`
/// actions (a hash of `seed`, the decision and the value's index) until it
/// ends, and at each decision whose prompt is not the instruction alone the
/// prompt the driver builds ([`history_prompt`]: the instruction, the last
/// `probe.history` decisions' observed texts and actions, the observed
/// text; [`embodyflow_world::observed_prompt`] without a history). `init-policy` trains the
/// tokenizer on them and bounds `vla.max_instruction` by the longest in
/// tokens. Empty for a world without text and a policy without history.
pub fn probe_prompts(
    tasks: &[WorldTask],
    options: &WorldOptions,
    probe: &Probe,
    seed: u64,
) -> Result<Vec<String>, WorldsError> {
    let tasks = &tasks[..probe.episodes.min(tasks.len())];
    if tasks.is_empty() {
        return Ok(Vec::new());
    }
    let mut worlds = Worlds::new(options.clone());
    let mut world = worlds.episodes(tasks, 1)?;
    let (n, dim, k, history) = (
        world.len(),
        world.action_dim(),
        probe.chunk_len.max(1),
        probe.history,
    );
    let n_bins = options.bins.n_bins() as u64;
    let mut prompts = Vec::new();
    let mut past: Vec<Vec<PastDecision>> = vec![Vec::new(); n];
    for decision in 0..=max_decisions(tasks, k) {
        let live: Vec<usize> = (0..n).filter(|&i| world.running(i)).collect();
        for &i in &live {
            let text = world.observation_text(i);
            if text.is_some() || (history > 0 && !past[i].is_empty()) {
                prompts.push(history_prompt(
                    world.instruction(i),
                    history,
                    &past[i],
                    text,
                ));
            }
        }
        if live.is_empty() {
            break;
        }
        let tokens: Vec<u32> = (0..n * k * dim)
            .map(|j| {
                let mut hasher = blake3::Hasher::new();
                hasher.update(&seed.to_le_bytes());
                hasher.update(&(decision as u64).to_le_bytes());
                hasher.update(&(j as u64).to_le_bytes());
                let bytes = hasher.finalize();
                let value = u64::from_le_bytes(bytes.as_bytes()[..8].try_into().expect("8 bytes"));
                (value % n_bins) as u32
            })
            .collect();
        if history > 0 {
            for &i in &live {
                past[i].push(PastDecision {
                    text: world.observation_text(i).map(str::to_string),
                    action: action_text(
                        &tokens[i * k * dim..(i + 1) * k * dim],
                        dim,
                        &options.bins,
                    ),
                });
            }
        }
        let actions = options
            .bins
            .decode(&tokens)
            .map_err(|e| Error::BadInput(format!("probe episodes: {e}")))?;
        world
            .step_chunks(&actions, k)
            .map_err(|e| Error::BadInput(format!("probe episodes: {e}")))?;
    }
    worlds.done(world);
    Ok(prompts)
}

/// A batch of episodes of one closed-loop world: `G` copies of each task,
/// sharing its initial state (episode `t * G + g` is copy `g` of task `t`).
pub struct Episodes {
    /// Its world's index among the [`closed_loop_worlds`].
    world: usize,
    episodes: Box<dyn WorldEpisodes>,
}

impl Episodes {
    fn world(&self) -> &dyn ClosedLoopWorld {
        self.episodes.as_ref()
    }

    fn world_mut(&mut self) -> &mut dyn ClosedLoopWorld {
        self.episodes.as_mut()
    }
}

/// A stage's closed-loop worlds over its run: builds each batch's
/// [`Episodes`] and keeps what a world reuses between batches (the
/// bridge's workers).
pub struct Worlds {
    options: WorldOptions,
    kept: Vec<Kept>,
}

impl Worlds {
    /// No episodes yet; the bridge starts its workers with the first batch
    /// of bridge tasks.
    pub fn new(options: WorldOptions) -> Worlds {
        Worlds {
            options,
            kept: closed_loop_worlds().map(|_| Kept::default()).collect(),
        }
    }

    /// `group` episodes of each of `tasks`, which must all be of one world
    /// (bad input naming two tasks otherwise). A bridge batch runs on the
    /// workers of the previous one, if any ([`Worlds::done`]).
    pub fn episodes(&mut self, tasks: &[WorldTask], group: usize) -> Result<Episodes, WorldsError> {
        let world = world_of_tasks(tasks)?;
        let index = closed_loop_worlds()
            .position(|w| std::ptr::addr_eq(w, world))
            .expect("a task's world is listed in WORLDS");
        let episodes = world.episodes(tasks, group, &self.options, &mut self.kept[index])?;
        Ok(Episodes {
            world: index,
            episodes,
        })
    }

    /// Takes back a batch's episodes: the bridge's workers serve the next
    /// batch, and their fault counts are kept for [`Worlds::faults`].
    pub fn done(&mut self, episodes: Episodes) {
        episodes.episodes.finish(&mut self.kept[episodes.world]);
    }

    /// The bridge's fault counts so far, in words (`worker faults: 0
    /// crashed, ...`); `None` when no bridge task ran.
    pub fn faults(&self) -> Option<String> {
        self.kept.iter().find_map(|k| k.faults.clone())
    }
}

impl ClosedLoopWorld for Episodes {
    fn len(&self) -> usize {
        self.world().len()
    }
    fn observation_shape(&self) -> ObservationShape {
        self.world().observation_shape()
    }
    fn image_names(&self) -> &[String] {
        self.world().image_names()
    }
    fn action_dim(&self) -> usize {
        self.world().action_dim()
    }
    fn task_id(&self, i: usize) -> &str {
        self.world().task_id(i)
    }
    fn instruction(&self, i: usize) -> &str {
        self.world().instruction(i)
    }
    fn running(&self, i: usize) -> bool {
        self.world().running(i)
    }
    fn observe(&mut self) {
        self.world_mut().observe()
    }
    fn frames(&self) -> &[u8] {
        self.world().frames()
    }
    fn proprio(&self) -> &[f32] {
        self.world().proprio()
    }
    fn step_chunks(&mut self, actions: &[f32], k: usize) -> Result<Vec<ChunkReport>, WorldError> {
        self.world_mut().step_chunks(actions, k)
    }
    fn target_ever_grasped(&self, i: usize) -> Option<bool> {
        self.world().target_ever_grasped(i)
    }
    fn grasp_point(&self, i: usize) -> Option<GraspPoint> {
        self.world().grasp_point(i)
    }
    fn anchor_key(&self, i: usize) -> Option<String> {
        self.world().anchor_key(i)
    }
    fn observation_text(&self, i: usize) -> Option<&str> {
        self.world().observation_text(i)
    }
    fn start_failure(&self, i: usize) -> Option<&str> {
        self.world().start_failure(i)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_registrys_one_shot_worlds_are_the_environments_that_run_plans() {
        let one_shot: Vec<&str> = super::WORLDS
            .iter()
            .filter(|w| w.closed_loop.is_none())
            .map(|w| w.tasks.name())
            .collect();
        assert_eq!(one_shot, embodyflow_envs::ONE_SHOT);
    }

    #[test]
    fn the_first_closed_loop_world_is_the_default_one() {
        let tabletop = super::world_of("tabletop").unwrap();
        assert!(std::ptr::addr_eq(tabletop, super::default_world()));
    }
}
