//! What a policy reads and writes, and the tasks-table encoding.
//!
//! The prompt is short and regular so that a tiny model can read it: the
//! instruction, one line describing the scene, the scene's actions from the
//! global list as `id: name` lines (the actions that mention something in the
//! scene, plus `put down the object in hand`), and a last line asking for the
//! JSON plan. The expert response is compact JSON in EB-ALFRED's format, with
//! `language_plan` repeating the action names.
//!
//! ```
//! use embodyflow_household::{Split, expert_plan, generate_tasks, prompt, response_json};
//! let task = &generate_tasks(Split::Val, 1, 1)[0];
//! let text = prompt(task);
//! assert!(text.starts_with("Task: ") && text.len() < 1400);
//! let answer = response_json(&expert_plan(task));
//! assert!(answer.starts_with("{\"language_plan\":["));
//! ```

use embodyflow_schemas::{PlanAction, TaskRow};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

use crate::HouseholdError;
use crate::task::{FAMILIES, Goal, Scene, Split, Task, TaskType, expert_plan, generate_tasks};
use crate::world::{Act, Object, Receptacle, Toggle, action_list, acts};

/// The last line of every prompt.
pub const ASK: &str = "Answer with JSON {\"language_plan\": [names], \"executable_plan\": [{\"action_id\": id, \"action_name\": name}]}.";

fn in_scene(task: &Task, act: Act) -> bool {
    let has_rec = |r: u8| {
        task.scene
            .receptacles
            .iter()
            .any(|x| x.receptacle as u8 == r)
    };
    let has_obj = |o: u8| task.scene.objects.iter().any(|x| x.object as u8 == o);
    let host = |t: u8| Toggle::ALL[t as usize].host() as u8;
    match act {
        Act::FindRec(r) | Act::Open(r) | Act::Close(r) => has_rec(r),
        Act::FindDevice(t) | Act::On(t) | Act::Off(t) => has_rec(host(t)),
        Act::FindObj(o) | Act::Pick(o) | Act::Slice(o) => has_obj(o),
        Act::Put => true,
    }
}

/// The ids of the actions a prompt lists for this task, in id order.
pub fn scene_action_ids(task: &Task) -> Vec<i32> {
    acts()
        .iter()
        .enumerate()
        .filter(|(_, a)| in_scene(task, **a))
        .map(|(i, _)| i as i32)
        .collect()
}

/// One line describing the scene: each receptacle (open/closed when
/// openable) with what is in/on it, e.g. `Fridge (closed): Egg; Shelf`.
pub fn describe_scene(scene: &Scene) -> String {
    let mut parts = Vec::new();
    for spot in &scene.receptacles {
        let r = spot.receptacle;
        let mut part = r.as_str().to_string();
        if r.openable() {
            part.push_str(if spot.open { " (open)" } else { " (closed)" });
        }
        let things: Vec<&str> = scene
            .objects
            .iter()
            .filter(|o| o.on == r)
            .map(|o| o.object.as_str())
            .collect();
        if !things.is_empty() {
            part.push_str(": ");
            part.push_str(&things.join(", "));
        }
        parts.push(part);
    }
    parts.join("; ")
}

/// What the policy reads: instruction, scene, the scene's actions, the ask.
pub fn prompt(task: &Task) -> String {
    let mut text = String::with_capacity(1200);
    let _ = writeln!(text, "Task: {}", task.instruction);
    let _ = writeln!(text, "Scene: {}.", describe_scene(&task.scene));
    text.push_str("Actions:\n");
    let list = action_list();
    for id in scene_action_ids(task) {
        let _ = writeln!(text, "{id}: {}", list[id as usize].name);
    }
    text.push_str(ASK);
    text
}

#[derive(Serialize)]
struct Response<'a> {
    language_plan: Vec<&'a str>,
    executable_plan: Vec<Step<'a>>,
}

#[derive(Serialize)]
struct Step<'a> {
    action_id: i32,
    action_name: &'a str,
}

/// The expert answer text for a plan of ids (ids outside the list are
/// skipped): compact JSON with `language_plan` and `executable_plan`.
pub fn response_json(plan: &[i32]) -> String {
    let list = action_list();
    let steps: Vec<Step<'_>> = plan
        .iter()
        .filter_map(|&id| usize::try_from(id).ok().and_then(|i| list.get(i)))
        .map(|a| Step {
            action_id: a.id,
            action_name: &a.name,
        })
        .collect();
    let response = Response {
        language_plan: steps.iter().map(|s| s.action_name).collect(),
        executable_plan: steps,
    };
    serde_json::to_string(&response).expect("plain strings and integers serialize")
}

/// The `observation` column of a household task: everything needed to
/// rebuild it, as JSON, and the side of its scene image when the task
/// carries one (`image_size`, absent otherwise: rows without an image are
/// the bytes they were before images existed).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Observation {
    split: Split,
    task_type: TaskType,
    family: u8,
    goal: Goal,
    scene: Scene,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    image_size: Option<usize>,
}

/// The tasks-table row of a task (suite and env `household`, the expert plan
/// as `gt_actions`), without a scene image.
pub fn task_row(task: &Task) -> TaskRow {
    image_task_row(task, None).expect("a row without an image has no size to refuse")
}

/// The tasks-table row of a task that carries its scene image
/// ([`crate::render`]) of `image_size × image_size` pixels (`None`: none,
/// [`task_row`]); a size the renderer refuses is an error naming it.
pub fn image_task_row(task: &Task, image_size: Option<usize>) -> Result<TaskRow, HouseholdError> {
    if let Some(size) = image_size {
        crate::render::check_size(size)?;
    }
    let observation = Observation {
        split: task.split,
        task_type: task.task_type,
        family: task.family,
        goal: task.goal,
        scene: task.scene.clone(),
        image_size,
    };
    let list = action_list();
    Ok(TaskRow {
        task_id: task.task_id.clone(),
        suite: "household".into(),
        env: "household".into(),
        split: task.split.to_string(),
        task_type: Some(task.task_type.as_str().to_string()),
        seed: task.seed,
        instruction: task.instruction.clone(),
        observation: Some(serde_json::to_vec(&observation).expect("observation serializes")),
        gt_actions: Some(
            expert_plan(task)
                .into_iter()
                .map(|id| PlanAction {
                    action_id: i64::from(id),
                    action_name: list[id as usize].name.clone(),
                })
                .collect(),
        ),
    })
}

/// Rebuilds a task from its tasks-table row.
pub fn task_from_row(row: &TaskRow) -> Result<Task, HouseholdError> {
    Ok(read_row(row)?.0)
}

/// The scene image a tasks-table row carries: its side and its RGB bytes
/// ([`crate::render::render`] of the row's task); `None` for a row without
/// one.
pub fn task_image(row: &TaskRow) -> Result<Option<(usize, Vec<u8>)>, HouseholdError> {
    let (task, image_size) = read_row(row)?;
    image_size
        .map(|size| Ok((size, crate::render::render(&task, size)?)))
        .transpose()
}

/// The side of the scene image a tasks-table row carries (`None`: none).
pub fn image_size(row: &TaskRow) -> Result<Option<usize>, HouseholdError> {
    Ok(read_row(row)?.1)
}

/// The task of a row and the side of the image it carries.
fn read_row(row: &TaskRow) -> Result<(Task, Option<usize>), HouseholdError> {
    let bad = |reason: String| HouseholdError::BadTask {
        task_id: row.task_id.clone(),
        reason,
    };
    if row.env != "household" {
        return Err(bad(format!("env is `{}`, expected `household`", row.env)));
    }
    let bytes = row
        .observation
        .as_deref()
        .ok_or_else(|| bad("no observation (expected the household scene JSON)".into()))?;
    let obs: Observation =
        serde_json::from_slice(bytes).map_err(|e| bad(format!("bad observation JSON: {e}")))?;
    if obs.family >= FAMILIES {
        return Err(bad(format!(
            "phrasing family {} out of range 0..{FAMILIES}",
            obs.family
        )));
    }
    let task = Task {
        task_id: row.task_id.clone(),
        split: obs.split,
        task_type: obs.task_type,
        seed: row.seed,
        instruction: row.instruction.clone(),
        family: obs.family,
        goal: obs.goal,
        scene: obs.scene,
    };
    crate::task::validate(&task).map_err(bad)?;
    if let Some(size) = obs.image_size {
        crate::render::check_size(size).map_err(|e| bad(e.to_string()))?;
    }
    Ok((task, obs.image_size))
}

/// Prompts and expert responses of `count` generated train tasks (two
/// strings per task), for training a tokenizer.
pub fn corpus(count: usize, seed: u64) -> Vec<String> {
    let mut out = Vec::with_capacity(2 * count);
    for task in generate_tasks(Split::Train, seed, count) {
        out.push(prompt(&task));
        out.push(response_json(&expert_plan(&task)));
    }
    out
}

/// Every word that can appear in household text (object and receptacle
/// names), handy for tokenizer special cases.
pub fn vocabulary() -> Vec<&'static str> {
    Receptacle::ALL
        .iter()
        .map(|r| r.as_str())
        .chain(Object::ALL.iter().map(|o| o.as_str()))
        .chain(["Faucet", "DeskLamp"])
        .collect()
}
