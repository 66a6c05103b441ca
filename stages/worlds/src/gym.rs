//! Gymnasium environments through the bridge (`env = gym:<adapter>`,
//! [`embodyflow_gym`]): a row's task spec ([`embodyflow_gym::task_from_row`]),
//! run `r` the reset seed `seed + r * RUN_SEED_STRIDE`, the policy's shape
//! as the adapter reports it (a fresh worker's probe) and episodes on the
//! bridge's workers, which the stage's next batch reuses
//! ([`GymEpisodes::with_pool`]); their fault counts go to its summary.
//! Its demonstrations are the adapter's scripted expert playing each task
//! in a worker ([`embodyflow_gym::expert_demonstrations`]): the observation
//! the worker encoded, the text it observed, the chunk's actions as tokens
//! (a discrete action's index is its bin, a box action's values are
//! `bins.encode`d); demonstrations a worker fault ended count as failed.
//!
//! ```
//! use embodyflow_gym::{GymTask, GymTaskSpec};
//! use embodyflow_worlds::RUN_SEED_STRIDE;
//! let spec = GymTaskSpec::new("babyai", "BabyAI-GoToLocal-v0", 7, 64);
//! let task = embodyflow_worlds::gym::task(GymTask { task_id: "goto/7".into(), spec });
//! assert_eq!((task.env(), task.max_steps()), ("gym:babyai", 64));
//! let run = task.reseed(2).unwrap();
//! assert_eq!(run.spec::<GymTask>().unwrap().spec.seed, 7 + 2 * RUN_SEED_STRIDE);
//! ```

use embodyflow_core::Error;
use embodyflow_core::schemas::TaskRow;
use embodyflow_gym::{
    self as bridge, BridgeConfig, ENV_PREFIX, GymEpisodes, GymTask, Pool, task_from_row,
};

use crate::demonstrations::{DemoDecision, DemoRequest, Demonstration};
use crate::world::{Kept, World, WorldEpisodes, WorldTask, specs};
use crate::{PolicyShape, RUN_SEED_STRIDE, WorldOptions, WorldsError};

/// `env = gym:<adapter>`.
pub static GYM: Gym = Gym;

/// The Gymnasium bridge's environments.
pub struct Gym;

/// The world's task of a bridge task (`env = gym:<adapter>`).
pub fn task(task: GymTask) -> WorldTask {
    WorldTask::new(
        &GYM,
        &format!("{ENV_PREFIX}{}", task.spec.adapter),
        task.task_id.clone(),
        task.spec.instruction.clone().unwrap_or_default(),
        task.spec.max_steps,
        task,
    )
}

impl World for Gym {
    fn env(&self) -> &'static str {
        "gym:<adapter>"
    }

    fn claims(&self, env: &str) -> bool {
        env.starts_with(ENV_PREFIX)
    }

    fn task(&'static self, row: &TaskRow) -> Result<WorldTask, Error> {
        task_from_row(row)
            .map(task)
            .map_err(|e| Error::BadInput(format!("tasks table: {e}")))
    }

    fn reseed(&'static self, task: &WorldTask, run: u32) -> Result<WorldTask, Error> {
        let mut task = task.spec::<GymTask>().expect("a bridge task").clone();
        task.spec.seed = task
            .spec
            .seed
            .checked_add(u64::from(run) * RUN_SEED_STRIDE)
            .ok_or_else(|| {
                Error::BadInput(format!(
                    "task `{}`: seed {} has no run {run} (overflow)",
                    task.task_id, task.spec.seed
                ))
            })?;
        Ok(self::task(task))
    }

    fn policy_shape(
        &self,
        task: &WorldTask,
        _: usize,
        bridge: &BridgeConfig,
    ) -> Result<PolicyShape, WorldsError> {
        let task = task.spec::<GymTask>().expect("a bridge task");
        let info = bridge::probe(bridge, &task.spec)?;
        Ok(PolicyShape {
            observation: info.shape,
            action_dim: info.action.dim(),
            bins: Some(info.action.bins()),
            observation_text: info.text,
        })
    }

    fn episodes(
        &self,
        tasks: &[WorldTask],
        group: usize,
        options: &WorldOptions,
        kept: &mut Kept,
    ) -> Result<Box<dyn WorldEpisodes>, WorldsError> {
        let pool = match kept.state.take().map(|state| state.downcast::<Pool>()) {
            Some(Ok(pool)) => *pool,
            _ => Pool::new(&options.bridge)?,
        };
        let episodes =
            GymEpisodes::with_pool(pool, &specs::<GymTask>(tasks), group, &options.bins)?;
        Ok(Box::new(episodes))
    }

    fn demonstrations(
        &self,
        tasks: &[WorldTask],
        request: &DemoRequest<'_>,
        each: &mut dyn FnMut(Demonstration) -> Result<(), Error>,
    ) -> Result<String, Error> {
        let bad = |e: &dyn std::fmt::Display| Error::BadInput(format!("tasks table: {e}"));
        if request.step_frames {
            return Err(Error::BadInput(
                "a thinking VLA's warm-up needs the tabletop expert's per-step frames; bridge tasks train a VLA without latents".into(),
            ));
        }
        let tasks = specs::<GymTask>(tasks);
        let Some(first) = tasks.first().map(|t| &t.spec) else {
            return Err(bad(&"no task to demonstrate"));
        };
        let info = bridge::probe(request.bridge, first).map_err(|e| bad(&e))?;
        info.action
            .check_bins(request.bins)
            .map_err(|e| Error::BadInput(format!("the checkpoint's action bins: {e}")))?;
        let demos = bridge::expert_demonstrations(request.bridge, &tasks, request.chunk_len)
            .map_err(|e| bad(&e))?;
        for demo in demos {
            let mut decisions = Vec::new();
            // A failed demonstration is left out: its decisions are not needed.
            let played = if demo.success {
                demo.decisions
            } else {
                Vec::new()
            };
            for (i, decision) in played.into_iter().enumerate() {
                let tokens = info
                    .action
                    .tokens(request.bins, &decision.actions)
                    .map_err(|e| {
                        Error::BadInput(format!("task `{}` decision {i}: {e}", demo.task_id))
                    })?;
                decisions.push(DemoDecision {
                    observation: decision.observation,
                    text: decision.text,
                    tokens,
                });
            }
            each(Demonstration {
                task_id: demo.task_id,
                instruction: demo.instruction,
                success: demo.success,
                decisions,
                step_frames: Vec::new(),
            })?;
        }
        Ok(format!("{ENV_PREFIX}{}", first.adapter))
    }
}

impl WorldEpisodes for GymEpisodes {
    fn finish(self: Box<Self>, kept: &mut Kept) {
        kept.faults = Some(self.faults());
        kept.state = Some(Box::new(self.into_pool()));
    }
}

#[cfg(test)]
mod tests {
    use embodyflow_algos::action_tokens::ActionBins;
    use embodyflow_gym::GymTaskSpec;

    use super::*;

    #[test]
    fn a_thinking_vlas_step_frames_are_refused_before_any_worker_starts() {
        let spec = GymTaskSpec::new("babyai", "BabyAI-GoToLocal-v0", 7, 64);
        let tasks = [task(GymTask {
            task_id: "goto/7".into(),
            spec,
        })];
        let (bins, bridge) = (ActionBins::openvla(), BridgeConfig::default());
        let request = DemoRequest {
            observation: embodyflow_core::observation::ObservationShape {
                height: 7,
                width: 7,
                channels: 3,
                proprio: 4,
            },
            action_dim: 1,
            bins: &bins,
            chunk_len: 1,
            noise: 0.0,
            seeds: &[0],
            step_frames: true,
            bridge: &bridge,
        };
        let error = GYM
            .demonstrations(&tasks, &request, &mut |_| panic!("no demonstration"))
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("bridge tasks train a VLA without latents"),
            "{error}"
        );
    }
}
