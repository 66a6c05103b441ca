//! The tabletop world as the stages see it (`env = tabletop`), one line
//! of the registry (`embodyflow_worlds::WORLDS`): [`TABLETOP`] implements
//! the world interfaces of `embodyflow_world` (`World` and `Generator`) in
//! process: a row's scene spec ([`task_from_row`](crate::task_from_row)),
//! run `r` another layout ([`reseed`](crate::reseed)), episodes
//! rendered at the policy's frame size ([`TabletopEpisodes`]) within
//! [`MIN_FRAME_SIZE`](tt::MIN_FRAME_SIZE)`..=`[`MAX_FRAME_SIZE`](tt::MAX_FRAME_SIZE),
//! train tasks of the four suites in turn, and the scripted expert's
//! grasping demonstrations (`embodyflow_tabletop::demonstration`, noise
//! and seed per task) cut into the policy's chunks at its frame size.
//!
//! Its tasks (`generate-tasks --set env=tabletop`): `suite` (`spatial` |
//! `object` | `goal` | `long` | `all`; unset means `all`) picks the suites;
//! with `all`, task `i` belongs to suite `i mod 4` (spatial, object, goal,
//! long) with index `i div 4` in it. A row carries the whole scene spec as
//! JSON in `observation` (`embodyflow_tabletop::rows`), its id reads
//! `tabletop-<suite>/<split>/<seed>/<index>`. Under `protocol = layouts`
//! val holds the train combinations in new layouts and unseen the held-out
//! goals; under `initial-states` (LIBERO's protocol,
//! `embodyflow_tabletop::initial_state`) it writes `count` tasks of one
//! `suite` (the goal suite has seven), each at `states` initial states of
//! the split, state-major (every task's state 0, then state 1, ...), ids
//! `tabletop-<suite>/<seed>/<index>@<split>/<state>`. `camera` (`point` |
//! `area`; unset means `point`) is stored in every task's spec and sets
//! how its frames are sampled ([`Camera`](tt::Camera)). The summary counts
//! tasks by suite and type.
//!
//! ```
//! use embodyflow_tabletop::declaration::TABLETOP;
//! use embodyflow_tabletop::{Split, Suite, generate, task_row};
//! use embodyflow_world::world::World;
//! let spec = generate(Suite::Goal, Split::Train, 7, 0);
//! let task = TABLETOP.task(&task_row(&spec)).unwrap();
//! assert_eq!((task.env(), task.max_steps()), ("tabletop", spec.max_steps));
//! assert_ne!(task.reseed(1).unwrap(), task); // another layout
//! ```

use std::collections::BTreeMap;
use std::ops::RangeInclusive;

use crate as tt;
use crate::{ExpertConfig, Strategy, TabletopEpisodes, TaskSpec};
use embodyflow_core::cli::ShardSpec;
use embodyflow_core::config::{ConfigKeys, ensure};
use embodyflow_core::schemas::TaskRow;
use embodyflow_core::section::SectionConfig;
use embodyflow_core::{Error, observation, progress};
use serde::{Deserialize, Serialize};

use embodyflow_world::demonstrations::{DemoDecision, DemoRequest, Demonstration};
use embodyflow_world::generator::{Generator, ROOT, Settings, TaskRequest, TaskSink};
use embodyflow_world::workers::WorkerSettings;
use embodyflow_world::world::{
    Kept, PolicyShape, World, WorldEpisodes, WorldOptions, WorldTask, WorldsError, specs,
};

/// `env = tabletop`.
pub static TABLETOP: Tabletop = Tabletop;

/// The tabletop world.
pub struct Tabletop;

/// The shape of a policy for the tabletop world at frames of `image_size`
/// pixels: its proprio and action sizes, any bins over `[-1, 1]`.
pub fn shape(image_size: usize) -> PolicyShape {
    PolicyShape {
        observation: tt::observation_shape(image_size),
        action_dim: tt::ACTION_DIM,
        bins: None,
        observation_text: 0,
    }
}

fn bad(e: tt::TabletopError) -> Error {
    Error::BadInput(format!("tasks table: {e}"))
}

impl Tabletop {
    fn task_of(&'static self, spec: TaskSpec) -> WorldTask {
        WorldTask::new(
            self,
            tt::ENV,
            spec.task_id(),
            spec.instruction.clone(),
            spec.max_steps,
            spec,
        )
    }
}

impl World for Tabletop {
    fn env(&self) -> &'static str {
        tt::ENV
    }

    fn claims(&self, env: &str) -> bool {
        env == tt::ENV
    }

    fn task(&'static self, row: &TaskRow) -> Result<WorldTask, Error> {
        tt::task_from_row(row)
            .map(|spec| self.task_of(spec))
            .map_err(bad)
    }

    fn reseed(&'static self, task: &WorldTask, run: u32) -> Result<WorldTask, Error> {
        let spec = task.spec::<TaskSpec>().expect("a tabletop task");
        tt::reseed(spec, run)
            .map(|spec| self.task_of(spec))
            .map_err(bad)
    }

    fn policy_shape(
        &self,
        _: &WorldTask,
        image_size: usize,
        _: &WorkerSettings,
    ) -> Result<PolicyShape, WorldsError> {
        Ok(shape(image_size))
    }

    fn episodes(
        &self,
        tasks: &[WorldTask],
        group: usize,
        options: &WorldOptions,
        _: &mut Kept,
    ) -> Result<Box<dyn WorldEpisodes>, WorldsError> {
        TabletopEpisodes::new(&specs::<TaskSpec>(tasks), group, options.image_size)
            .map(|episodes| Box::new(episodes) as Box<dyn WorldEpisodes>)
            .map_err(|e| bad(e).into())
    }

    fn frame_sizes(&self) -> Option<RangeInclusive<usize>> {
        Some(tt::MIN_FRAME_SIZE..=tt::MAX_FRAME_SIZE)
    }

    /// Task `i` is index `i / 4` of suite `i % 4` (spatial, object, goal,
    /// long).
    fn train_tasks(&'static self, count: usize, seed: u64) -> Option<Vec<WorldTask>> {
        let suites = tt::Suite::ALL.len();
        let task = |i: usize| {
            let (suite, index) = (tt::Suite::ALL[i % suites], (i / suites) as u64);
            self.task_of(tt::generate(suite, tt::Split::Train, seed, index))
        };
        Some((0..count).map(task).collect())
    }

    fn demonstrations(
        &self,
        tasks: &[WorldTask],
        request: &DemoRequest<'_>,
        each: &mut dyn FnMut(Demonstration) -> Result<(), Error>,
    ) -> Result<String, Error> {
        let policy = (request.action_dim, request.observation.proprio);
        if policy != (tt::ACTION_DIM, tt::PROPRIO_DIM) {
            return Err(Error::BadInput(format!(
                "the VLA takes actions of {} and proprio of {}; the tabletop world's are {} and {}",
                policy.0,
                policy.1,
                tt::ACTION_DIM,
                tt::PROPRIO_DIM
            )));
        }
        let bar = progress::bar(tasks.len() as u64, "demonstrations");
        for (task, &seed) in tasks.iter().zip(request.seeds) {
            let expert = ExpertConfig {
                noise: request.noise,
                seed,
            };
            each(demonstration(task, request, expert)?)?;
            bar.inc(1);
        }
        bar.finish_and_clear();
        let labels = if request.planned_labels {
            ", planned labels"
        } else {
            ""
        };
        Ok(format!("grasp, noise {}{labels}", request.noise))
    }
}

/// The grasping expert's demonstration of `task`, its decisions (and the
/// frame before every step, when asked for) only when it succeeded.
fn demonstration(
    task: &WorldTask,
    request: &DemoRequest<'_>,
    expert: ExpertConfig,
) -> Result<Demonstration, Error> {
    let id = task.task_id();
    let named =
        |e: &dyn std::fmt::Display| Error::BadInput(format!("tasks table: task `{id}`: {e}"));
    let spec = task.spec::<TaskSpec>().expect("a tabletop task");
    let (k, size) = (request.chunk_len, request.observation.height);
    let labels = if request.planned_labels {
        tt::Labels::Planned
    } else {
        tt::Labels::Executed
    };
    let demo =
        tt::demonstration(spec, Strategy::Grasp, expert, labels, k, size).map_err(|e| named(&e))?;
    let mut out = Demonstration {
        task_id: id.clone(),
        instruction: spec.instruction.clone(),
        success: demo.episode.success,
        decisions: Vec::new(),
        step_frames: Vec::new(),
        failure: None,
    };
    if !out.success {
        return Ok(out);
    }
    if request.step_frames {
        let per_step = tt::demonstration(spec, Strategy::Grasp, expert, labels, 1, size)
            .map_err(|e| named(&e))?;
        if per_step.episode != demo.episode {
            return Err(Error::Usage(format!(
                "task `{id}`: the expert's episode differs when recorded step by step"
            )));
        }
        out.step_frames = per_step.decisions.into_iter().map(|d| d.frame).collect();
    }
    let steps = demo.episode.steps as usize;
    for (i, decision) in demo.decisions.iter().enumerate() {
        let source =
            |e: &dyn std::fmt::Display| Error::BadInput(format!("task `{id}` decision {i}: {e}"));
        // The actions taken before the episode ended (decision i began while it ran).
        let valid = (steps - i * k).min(k);
        let actions: Vec<f32> = decision.actions[..valid].concat();
        let tokens = request.bins.encode(&actions).map_err(|e| source(&e))?;
        let observation =
            observation::encode(&request.observation, &decision.frame, &decision.proprio)
                .map_err(|e| source(&e))?;
        out.decisions.push(DemoDecision {
            observation,
            text: None,
            tokens,
        });
    }
    Ok(out)
}

/// The tabletop suites a run generates (`suite`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SuiteChoice {
    /// Spatial relations.
    Spatial,
    /// New objects.
    Object,
    /// One layout, many goals.
    Goal,
    /// Two sub-goals.
    Long,
    /// The four in turn.
    All,
}

impl SuiteChoice {
    /// The suite of task `i` and its index within the suite.
    fn task(self, i: usize) -> (tt::Suite, u64) {
        let one = |s| (s, i as u64);
        match self {
            SuiteChoice::Spatial => one(tt::Suite::Spatial),
            SuiteChoice::Object => one(tt::Suite::Object),
            SuiteChoice::Goal => one(tt::Suite::Goal),
            SuiteChoice::Long => one(tt::Suite::Long),
            SuiteChoice::All => (tt::Suite::ALL[i % 4], (i / 4) as u64),
        }
    }
}

/// The tabletop world's keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct TabletopKeys {
    /// Tabletop suite: spatial, object, goal, long or all (all when unset;
    /// env = tabletop only).
    pub suite: Option<SuiteChoice>,
    /// How the tasks' camera samples the scene: `point` (a pixel shows
    /// what lies under its centre; point when unset) or `area` (a pixel is
    /// the mean colour over its square); env = tabletop only.
    pub camera: Option<tt::Camera>,
}

impl SectionConfig<TaskRequest> for TabletopKeys {
    /// A suite only for tabletop tasks; LIBERO's protocol draws the tasks
    /// of one suite, at most as many as it holds.
    fn check(&self, config: &TaskRequest) -> embodyflow_core::Result<()> {
        if !config.is(tt::ENV) {
            ensure(
                self.camera.is_none(),
                "camera",
                &format!(
                    "no camera with env = {} (the key sets the tabletop world's camera)",
                    config.others(tt::ENV)
                ),
                format!("camera = {:?}", self.camera).to_lowercase(),
            )?;
            return ensure(
                self.suite.is_none(),
                "suite",
                &format!(
                    "no suite with env = {} (suites are the tabletop world's)",
                    config.others(tt::ENV)
                ),
                format!(
                    "suite = {}",
                    self.suite
                        .map_or("unset".into(), |s| format!("{s:?}").to_lowercase())
                ),
            );
        }
        if !config.initial_states() {
            return Ok(());
        }
        let suite = match self.suite {
            None | Some(SuiteChoice::All) => None,
            Some(choice) => Some(choice.task(0).0),
        };
        let suite = suite.ok_or_else(|| Error::BadValue {
            key: "suite".into(),
            reason:
                "protocol = initial-states draws the tasks of one suite: spatial, object, goal or long"
                    .into(),
        })?;
        match tt::protocol_tasks(suite) {
            Some(n) => ensure(
                config.count as u64 <= n,
                "count",
                &format!("at most {n}: the {suite} suite's tasks under protocol = initial-states"),
                config.count,
            ),
            None => Ok(()),
        }
    }
}

impl Generator for Tabletop {
    fn name(&self) -> &'static str {
        tt::ENV
    }

    fn settings(&self) -> Option<Settings> {
        Some(Settings::of::<TabletopKeys>(ROOT))
    }

    fn initial_states(&self) -> bool {
        true
    }

    /// The shard's tasks (layouts, or tasks x initial states), counted by
    /// suite and type.
    fn write(
        &self,
        config: &TaskRequest,
        shard: ShardSpec,
        seed: u64,
        sink: &mut TaskSink,
    ) -> Result<(), WorldsError> {
        let keys: TabletopKeys = config.keys()?;
        let split = config.split;
        let choice = keys.suite.unwrap_or(SuiteChoice::All);
        // (task index within its suite, initial state) in table order.
        let draws: Vec<(usize, Option<u32>)> = match config.initial_states() {
            false => (0..config.count).map(|i| (i, None)).collect(),
            true => (0..config.states)
                .flat_map(|state| (0..config.count).map(move |i| (i, Some(state))))
                .collect(),
        };
        let mut by_type: BTreeMap<String, usize> = BTreeMap::new();
        let mut owned = 0usize;
        for (i, state) in draws {
            let (suite, index) = choice.task(i);
            let (name, split_name) = (suite.as_str(), split.as_str());
            let id = match state {
                Some(state) => tt::scene::state_id_of(name, split_name, seed, index, state),
                None => tt::scene::task_id_of(name, split_name, seed, index),
            };
            if !shard.owns(&id) {
                continue;
            }
            let task = match state {
                Some(state) => tt::initial_state(suite, seed, index, split, state)
                    .map_err(|e| Error::BadInput(e.to_string()))?,
                None => tt::generate(suite, split, seed, index),
            };
            let task = TaskSpec {
                camera: keys.camera.unwrap_or_default(),
                ..task
            };
            *by_type
                .entry(format!("{suite}: {}", task.task_type))
                .or_default() += 1;
            owned += 1;
            sink.push(tt::task_row(&task))?;
        }
        sink.summary.add("env", tt::ENV).add("tasks", owned);
        if config.initial_states() {
            sink.summary
                .add("protocol", "initial-states")
                .add("initial states per task", config.states);
        }
        sink.add_counts(by_type);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use embodyflow_algos::action_tokens::ActionBins;

    use super::*;

    #[test]
    fn train_tasks_are_the_four_suites_in_turn_at_the_frame_sizes_it_renders() {
        let world = &TABLETOP;
        let tasks = world.train_tasks(8, 3).unwrap();
        assert_eq!(tasks.len(), 8);
        for (i, task) in tasks.iter().enumerate() {
            let suite = tt::Suite::ALL[i % 4];
            let spec = tt::generate(suite, tt::Split::Train, 3, (i / 4) as u64);
            assert_eq!(task.spec::<TaskSpec>(), Some(&spec));
            assert_eq!(task.instruction(), spec.instruction);
        }
        assert_ne!(world.train_tasks(8, 4).unwrap(), tasks, "seeded");
        assert_eq!(
            world.frame_sizes(),
            Some(tt::MIN_FRAME_SIZE..=tt::MAX_FRAME_SIZE)
        );
    }

    #[test]
    fn all_suites_take_turns() {
        let suites: Vec<_> = (0..8).map(|i| SuiteChoice::All.task(i)).collect();
        assert_eq!(suites[5], (tt::Suite::Object, 1));
        assert_eq!(SuiteChoice::Goal.task(5), (tt::Suite::Goal, 5));
    }

    #[test]
    fn a_policy_of_another_shape_gets_no_demonstrations() {
        let tasks = TABLETOP.train_tasks(1, 3).unwrap();
        let (bins, workers) = (ActionBins::openvla(), WorkerSettings::default());
        let mut observation = tt::observation_shape(32);
        observation.proprio += 1;
        let request = DemoRequest {
            observation,
            action_dim: tt::ACTION_DIM,
            bins: &bins,
            chunk_len: 4,
            noise: 0.0,
            planned_labels: false,
            seeds: &[0],
            step_frames: false,
            workers: &workers,
        };
        let error = TABLETOP
            .demonstrations(&tasks, &request, &mut |_| panic!("no demonstration"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("the tabletop world's are 4 and"), "{error}");
    }
}
