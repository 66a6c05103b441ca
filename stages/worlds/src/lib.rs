//! The worlds the stages know, listed once in [`WORLDS`] ([`registry`]),
//! one-shot and closed-loop alike: each declares how `generate-tasks`
//! writes its tasks ([`Generator`], [`generate`]) and, for a closed-loop
//! world, how its episodes run: a [`World`] (a `pub static` value of its
//! own crate) that builds [`WorldTask`]s from its rows and batches of their
//! episodes ([`Episodes`], a
//! [`ClosedLoopWorld`](embodyflow_world::ClosedLoopWorld) the driver
//! steps). `generate-tasks`, `collect-rollouts`, `evaluate`, `init-policy`
//! and update-policy's demonstrations go through here, so a closed-loop
//! world plugs in as one crate implementing `embodyflow_world`'s
//! interfaces and one line of [`WORLDS`], and no stage names a world.
//!
//! | `env` | world | a task's run `r > 0` |
//! |---|---|---|
//! | `household` | the household planning world, one-shot ([`household::HOUSEHOLD`]; its plans run in `embodyflow_envs`) | another scene (`embodyflow_household::reseed`) |
//! | `tabletop` | the embedded tabletop world, in process ([`embodyflow_tabletop::declaration::TABLETOP`]) | another layout ([`embodyflow_tabletop::reseed`]) |
//! | `gym:<adapter>` | a Gymnasium environment through the bridge ([`embodyflow_gym::declaration::GYM`]) | reset seed `seed + r * RUN_SEED_STRIDE` |
//!
//! The interfaces a world implements are `embodyflow_world`'s ([`world`],
//! [`generator`], [`demonstrations`], re-exported here), below the models;
//! the world crates and the household module import only them; the
//! registry imports the worlds; the stage ([`generate`]) the registry.

pub mod generate;
pub mod household;
pub mod registry;
#[cfg(test)]
mod toy_tests;

pub use embodyflow_gym::declaration::{BridgeKeys, RUN_SEED_STRIDE};
pub use embodyflow_world::generator::Generator;
pub use embodyflow_world::workers::WorkerSettings;
pub use embodyflow_world::world::{
    Kept, PolicyShape, World, WorldEpisodes, WorldOptions, WorldTask, WorldsError,
};
pub use embodyflow_world::{demonstrations, generator, world};
pub use registry::{
    Episodes, Probe, Registered, WORLDS, Worlds, closed_loop_worlds, default_world, generator,
    generators, is_closed_loop, max_decisions, one_shot, policy_shape, probe_prompts, task_of,
    world_of, world_of_tasks,
};
