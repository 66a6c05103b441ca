//! SFT of a VLA on demonstrations read from a table directory
//! (`sft.demonstrations = DIR`): its `tasks`, `trajectories` and `steps`,
//! as `table import --format libero-hdf5` writes them (or any closed-loop
//! rollouts of the same shape). Each steps row is one example, as a
//! collected decision is: its `prompt_ids`, its `response_ids` (action
//! tokens, the other SFT sources' tokenisation: a chunk of `K × D` bins,
//! fewer on a demonstration's last decision) and its `observation` bytes.
//!
//! Which demonstrations: those whose task ([`TaskRow::task_key`]) is one of
//! the `--input` tasks', the first `sft.demos_per_task` of each task in
//! table order (`all`: every one); a demonstration marked incomplete, or
//! ended by an infrastructure fault, is dropped and counted. When none is
//! left (every one dropped, or none of an `--input` task) the stage exits
//! 2 saying which.
//!
//! Checked before training, naming the trajectory and step (bad input): a
//! prompt that is not the checkpoint's tokenisation of the task's
//! instruction (the table was tokenised with another policy's tokenizer:
//! import it again with `--tokenizer` of this checkpoint), a decision that
//! is not `chunk_len × action_dim` tokens but a demonstration's last
//! (imported with another `--chunk-len`), steps missing or numbered out of
//! order, a table whose manifest names other action bins than the
//! checkpoint's; [`super::Vla`]'s `check_examples` then checks shapes,
//! vocabulary and bins as for every source.
//!
//! ```text
//! table import --format libero-hdf5 --from demos/*.hdf5 --tokenizer runs/vla --chunk-len 8 \
//!     --out runs/demos
//! update-policy --policy runs/vla --input runs/demos/tasks --out runs/bc \
//!     --set objective=sft --set sft.demonstrations=runs/demos --set sft.demos_per_task=all
//! ```

use std::collections::{HashMap, HashSet};
use std::path::Path;

use embodyflow_core::Error;
use embodyflow_core::dataset::TableReader;
use embodyflow_core::manifest::Manifest;
use embodyflow_core::schemas::{StepRow, TableName, TaskRow, TrajectoryRow};
use embodyflow_models::ModelError;
use embodyflow_models::checkpoint::Checkpoint;
use embodyflow_models::vla::Vla;
use embodyflow_rollout::closed_loop::ChunkPolicy;
use embodyflow_rollout::closed_loop::vla::VlaPolicy;

use super::decisions::{Dropped, all_dropped, demonstration_example, dropped_note};
use super::thinking;
use crate::{DemosPerTask, SftConfig, SftSet};

/// Behaviour-cloning examples from the demonstrations table at `dir` (see
/// the module doc), for the `--input` tasks `tasks`.
pub fn sft_examples(
    policy: &Checkpoint<Vla>,
    tasks: &[TaskRow],
    dir: &Path,
    sft: &SftConfig,
) -> Result<SftSet, ModelError> {
    let bad = |what: String| ModelError::from(Error::BadInput(what));
    if thinking::latent_of(policy).is_some() {
        return Err(bad(
            "sft.demonstrations: a thinking VLA's warm-up needs the tabletop expert's per-step frames; a demonstrations table trains a VLA without latents".into(),
        ));
    }
    let read = |table: TableName| TableReader::open(&dir.join(table.as_str()), table);
    let demo_tasks: Vec<TaskRow> = read(TableName::Tasks)?.read_rows()?;
    let trajectories: Vec<TrajectoryRow> = read(TableName::Trajectories)?.read_rows()?;
    let steps: Vec<StepRow> = read(TableName::Steps)?.read_rows()?;
    let config = policy.model.config();
    check_bins(&dir.join(TableName::Steps.as_str()), config)?;
    let sampler = VlaPolicy::new(policy, 0.0)?;
    let per = sampler.chunk_len() * sampler.action_dim();

    let wanted: HashSet<&str> = tasks.iter().map(TaskRow::task_key).collect();
    let instruction: HashMap<&str, &TaskRow> =
        demo_tasks.iter().map(|t| (t.task_id.as_str(), t)).collect();
    let mut by_trajectory: HashMap<&str, Vec<&StepRow>> = HashMap::new();
    for step in &steps {
        by_trajectory
            .entry(step.trajectory_id.as_str())
            .or_default()
            .push(step);
    }
    let mut per_task: HashMap<&str, usize> = HashMap::new();
    let (mut examples, mut dropped, mut used, mut other_tasks) =
        (Vec::new(), Vec::new(), 0usize, 0usize);
    let mut prompts: HashMap<&str, Vec<i32>> = HashMap::new();
    for trajectory in &trajectories {
        let id = trajectory.trajectory_id.as_str();
        let task = instruction
            .get(trajectory.task_id.as_str())
            .ok_or_else(|| {
                bad(format!(
                    "{}: trajectory `{id}`'s task `{}` has no row in its tasks table",
                    dir.display(),
                    trajectory.task_id
                ))
            })?;
        if !wanted.contains(task.task_key()) {
            other_tasks += 1;
            continue;
        }
        let count = per_task.entry(task.task_key()).or_default();
        *count += 1;
        if let DemosPerTask::First(limit) = sft.demos_per_task
            && *count > limit
        {
            continue;
        }
        if !trajectory.complete || trajectory.faulted() {
            dropped.push(Dropped {
                what: format!("trajectory `{id}`"),
                fault: trajectory.faulted().then(|| {
                    trajectory
                        .failure_reason
                        .clone()
                        .unwrap_or_else(|| "infra_fault".into())
                }),
            });
            continue;
        }
        used += 1;
        let prompt = match prompts.get(task.task_id.as_str()) {
            Some(prompt) => prompt.clone(),
            None => {
                let ids = sampler.instruction_ids(&task.instruction).map_err(|e| {
                    bad(format!("task `{}` of {}: {e}", task.task_id, dir.display()))
                })?;
                prompts.insert(task.task_id.as_str(), ids.clone());
                ids
            }
        };
        let mut rows = by_trajectory.remove(id).unwrap_or_default();
        rows.sort_by_key(|s| s.step_index);
        let indices: Vec<i32> = rows.iter().map(|s| s.step_index).collect();
        if indices != (0..trajectory.num_steps).collect::<Vec<_>>() {
            return Err(bad(format!(
                "{}: trajectory `{id}` has num_steps {} but steps {indices:?} in its steps table",
                dir.display(),
                trajectory.num_steps
            )));
        }
        let last = rows.len() - 1;
        for (i, step) in rows.into_iter().enumerate() {
            let source = format!("trajectory `{id}` step {i}");
            if step.prompt_ids != prompt {
                return Err(bad(format!(
                    "{source}: its prompt ids are not this checkpoint's tokens of `{}` (the table was tokenised with another tokenizer: import it again with --tokenizer of this policy's directory)",
                    task.instruction
                )));
            }
            if i < last && step.response_ids.len() != per {
                return Err(bad(format!(
                    "{source}: {} action tokens, the checkpoint's decisions have chunk_len x action_dim = {per} (import the demonstrations again with --chunk-len {})",
                    step.response_ids.len(),
                    sampler.chunk_len()
                )));
            }
            let observation = step
                .observation
                .clone()
                .ok_or_else(|| bad(format!("{source}: no observation")))?;
            let tokens: Vec<u32> = step.response_ids.iter().map(|&t| t as u32).collect();
            examples.push(demonstration_example(source, &prompt, &tokens, observation));
        }
    }
    if used == 0 && !dropped.is_empty() {
        return Err(all_dropped(&dropped, &format!("of {}", dir.display())).into());
    }
    if used == 0 && other_tasks > 0 {
        return Err(bad(format!(
            "no training examples: the {other_tasks} demonstrations of {} are all of tasks not in --input",
            dir.display()
        )));
    }
    let notes = vec![
        (
            "demonstrations".to_string(),
            format!(
                "{used} demonstrations of {} ({} decisions); {other_tasks} of tasks not in --input left out",
                dir.display(),
                examples.len()
            ),
        ),
        dropped_note(&dropped),
    ];
    Ok(SftSet {
        examples,
        notes,
        frame_encoder: None,
    })
}

/// The action bins the steps table's manifest names (`table import`'s
/// `bins`), when it names them, against the checkpoint's.
fn check_bins(steps: &Path, config: &embodyflow_models::vla::VlaConfig) -> Result<(), Error> {
    let manifest = Manifest::read(steps)?;
    let Some(bins) = manifest.producer.config.get("bins") else {
        return Ok(());
    };
    let table = (
        bins.get("n").and_then(serde_json::Value::as_i64),
        bins.get("low").and_then(serde_json::Value::as_f64),
        bins.get("high").and_then(serde_json::Value::as_f64),
    );
    if table
        != (
            Some(config.n_bins),
            Some(config.action_low),
            Some(config.action_high),
        )
    {
        return Err(Error::BadInput(format!(
            "{}: its actions are tokens of the bins {bins}, the checkpoint's are {} over [{}, {}]",
            steps.display(),
            config.n_bins,
            config.action_low,
            config.action_high
        )));
    }
    Ok(())
}
