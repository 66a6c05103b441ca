//! Tasks: ALFRED task types, goals, scenes, seeded generation with the
//! train/val/unseen splits, reseeding for evaluation, the expert planner and
//! the plan executor.
//!
//! Generation is deterministic: task `i` of `generate_tasks(split, seed, n)`
//! gets its own scene seed, from which the goal, the phrasing and the scene
//! (6–9 receptacles, 4–7 objects) are drawn with ChaCha8. The `unseen` split
//! holds out a fixed set of (goal object, target receptacle) pairs — see
//! [`held_out_pair`] — and one phrasing family per task type
//! ([`HELD_OUT_FAMILY`]); `train` and `val` never use either.
//!
//! ```
//! use embodyflow_household::{Split, execute_ids, expert_plan, generate_tasks};
//! let tasks = generate_tasks(Split::Train, 7, 3);
//! let plan = expert_plan(&tasks[0]);
//! assert!(execute_ids(&tasks[0], &plan).success);
//! ```

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::HouseholdError;
use crate::world::{
    Act, HELD, IN_BASE, MAX_OBJECTS, NONE, ON_LAMP, Object, Receptacle, State, Toggle, World, acts,
    id_of,
};

pub use embodyflow_schemas::Split;

/// ALFRED task type.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskType {
    /// Put an object in/on a receptacle.
    PickAndPlace,
    /// Clean it in the sink first.
    PickCleanThenPlace,
    /// Heat it in the microwave first.
    PickHeatThenPlace,
    /// Cool it in the fridge first.
    PickCoolThenPlace,
    /// Put two objects of one type in/on a receptacle.
    PickTwoObjAndPlace,
    /// Hold an object under the turned-on desk lamp.
    LookAtObjInLight,
    /// Put an object into a movable receptacle and that onto a receptacle.
    PickAndPlaceWithMovableRecep,
}

impl TaskType {
    /// Every task type.
    pub const ALL: [TaskType; 7] = [
        TaskType::PickAndPlace,
        TaskType::PickCleanThenPlace,
        TaskType::PickHeatThenPlace,
        TaskType::PickCoolThenPlace,
        TaskType::PickTwoObjAndPlace,
        TaskType::LookAtObjInLight,
        TaskType::PickAndPlaceWithMovableRecep,
    ];

    /// The ALFRED name, e.g. `pick_heat_then_place`.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskType::PickAndPlace => "pick_and_place",
            TaskType::PickCleanThenPlace => "pick_clean_then_place",
            TaskType::PickHeatThenPlace => "pick_heat_then_place",
            TaskType::PickCoolThenPlace => "pick_cool_then_place",
            TaskType::PickTwoObjAndPlace => "pick_two_obj_and_place",
            TaskType::LookAtObjInLight => "look_at_obj_in_light",
            TaskType::PickAndPlaceWithMovableRecep => "pick_and_place_with_movable_recep",
        }
    }

    /// The receptacle whose effect the task needs (Fridge, Microwave,
    /// SinkBasin, Desk for the lamp).
    pub fn effect_receptacle(self) -> Option<Receptacle> {
        match self {
            TaskType::PickCleanThenPlace => Some(Receptacle::SinkBasin),
            TaskType::PickHeatThenPlace => Some(Receptacle::Microwave),
            TaskType::PickCoolThenPlace => Some(Receptacle::Fridge),
            TaskType::LookAtObjInLight => Some(Receptacle::Desk),
            _ => None,
        }
    }
}

impl fmt::Display for TaskType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TaskType {
    type Err = HouseholdError;
    fn from_str(s: &str) -> Result<TaskType, HouseholdError> {
        TaskType::ALL
            .into_iter()
            .find(|t| t.as_str() == s)
            .ok_or_else(|| HouseholdError::UnknownTaskType(s.to_string()))
    }
}

/// What must hold at the end of the plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Goal {
    /// The goal object type.
    pub object: Object,
    /// The target receptacle (none for look_at_obj_in_light, whose place is
    /// the Desk with its lamp).
    pub receptacle: Option<Receptacle>,
    /// The movable receptacle of pick_and_place_with_movable_recep.
    pub container: Option<Object>,
}

/// A receptacle of a scene.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ReceptacleSpot {
    /// Which receptacle.
    pub receptacle: Receptacle,
    /// Whether it starts open (always false for non-openable ones).
    pub open: bool,
}

/// An object instance of a scene and where it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ObjectSpot {
    /// The object type.
    pub object: Object,
    /// The receptacle it starts in/on.
    pub on: Receptacle,
}

/// The initial layout of a scene (toggleables start off; the Faucet and the
/// DeskLamp exist where the SinkBasin and the Desk do).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Scene {
    /// Scene draw: 0 for the generated layout, `run` after [`reseed`].
    pub run: u32,
    /// Receptacles, in catalog order.
    pub receptacles: Vec<ReceptacleSpot>,
    /// Object instances (at most [`MAX_OBJECTS`]); order matters for which
    /// instance `find a X` reaches first.
    pub objects: Vec<ObjectSpot>,
}

/// One task instance.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    /// `household/<split>/<seed>/<index:06>`.
    pub task_id: String,
    /// Split.
    pub split: Split,
    /// ALFRED task type.
    pub task_type: TaskType,
    /// Scene seed of the task (the layout of run r is drawn from it and r).
    pub seed: i64,
    /// Natural-language instruction.
    pub instruction: String,
    /// Phrasing family of the instruction (0..[`FAMILIES`]).
    pub family: u8,
    /// Goal.
    pub goal: Goal,
    /// Initial layout.
    pub scene: Scene,
}

/// Result of executing a plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    /// Per plan step, whether it was valid (an invalid step has no effect
    /// and the plan goes on, as in EB-ALFRED).
    pub step_valid: Vec<bool>,
    /// Whether the goal holds after the last step.
    pub success: bool,
    /// Environment steps taken: every step is attempted, so the plan length.
    pub env_steps: usize,
}

/// A plan step as a policy predicted it: the id wins when present (an id out
/// of range is an invalid step), else the name is looked up.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PlanStep {
    /// Predicted action id.
    pub action_id: Option<i64>,
    /// Predicted action name.
    pub action_name: Option<String>,
}

/// Instruction phrasing families per task type.
pub const FAMILIES: u8 = 4;
/// The family used only in the `unseen` split.
pub const HELD_OUT_FAMILY: u8 = 3;

/// Whether (goal object, target receptacle) is held out for `unseen` (for
/// look_at_obj_in_light the receptacle is the Desk). About one pair in five.
pub fn held_out_pair(object: Object, receptacle: Receptacle) -> bool {
    (object.index() * 7 + receptacle.index() * 3).is_multiple_of(5)
}

/// The receptacle of the (object, receptacle) pair a goal uses for the splits.
pub fn goal_pair(goal: &Goal) -> (Object, Receptacle) {
    (goal.object, goal.receptacle.unwrap_or(Receptacle::Desk))
}

// ---------------------------------------------------------------- compiling

#[derive(Debug, Clone, Copy)]
struct CGoal {
    ty: TaskType,
    obj: u8,
    rec: u8,
    cont: u8,
}

fn compile(task: &Task) -> (World, State, CGoal) {
    compile_parts(&task.scene, task.task_type, &task.goal)
}

fn compile_parts(scene: &Scene, ty: TaskType, goal: &Goal) -> (World, State, CGoal) {
    let mut w = World {
        present: 0,
        n: 0,
        kind: [NONE; MAX_OBJECTS],
    };
    let mut s = State {
        loc: [NONE; MAX_OBJECTS],
        heated: 0,
        cooled: 0,
        cleaned: 0,
        sliced: 0,
        open: 0,
        on: 0,
        held: NONE,
        place: NONE,
        focus: NONE,
    };
    for r in &scene.receptacles {
        w.present |= 1 << r.receptacle as u16;
        if r.open && r.receptacle.openable() {
            s.open |= 1 << r.receptacle as u16;
        }
    }
    for (i, o) in scene.objects.iter().take(MAX_OBJECTS).enumerate() {
        w.kind[i] = o.object as u8;
        s.loc[i] = o.on as u8;
        w.n += 1;
    }
    w.settle(&mut s);
    let g = CGoal {
        ty,
        obj: goal.object as u8,
        rec: goal.receptacle.map_or(NONE, |r| r as u8),
        cont: goal.container.map_or(NONE, |o| o as u8),
    };
    (w, s, g)
}

#[inline]
fn holds(w: &World, s: &State, g: &CGoal) -> bool {
    let n = w.n as usize;
    let direct = |i: usize| w.kind[i] == g.obj && s.loc[i] == g.rec;
    match g.ty {
        TaskType::PickAndPlace => (0..n).any(direct),
        TaskType::PickCleanThenPlace => (0..n).any(|i| direct(i) && s.cleaned & (1 << i) != 0),
        TaskType::PickHeatThenPlace => (0..n).any(|i| direct(i) && s.heated & (1 << i) != 0),
        TaskType::PickCoolThenPlace => (0..n).any(|i| direct(i) && s.cooled & (1 << i) != 0),
        TaskType::PickTwoObjAndPlace => (0..n).filter(|&i| direct(i)).count() >= 2,
        TaskType::LookAtObjInLight => {
            s.held != NONE
                && w.kind[s.held as usize] == g.obj
                && s.on & ON_LAMP != 0
                && s.place == Receptacle::Desk as u8
        }
        TaskType::PickAndPlaceWithMovableRecep => (0..n).any(|i| {
            if w.kind[i] != g.obj || s.loc[i] < IN_BASE || s.loc[i] == HELD || s.loc[i] == NONE {
                return false;
            }
            let m = (s.loc[i] - IN_BASE) as usize;
            w.kind[m] == g.cont && s.loc[m] == g.rec
        }),
    }
}

// ---------------------------------------------------------------- executing

/// Executes a plan of action ids (the fast path): ids outside the action list
/// are invalid steps.
pub fn execute_ids(task: &Task, plan: &[i32]) -> Execution {
    let (w, mut s, g) = compile(task);
    let table = acts();
    let step_valid = plan
        .iter()
        .map(
            |&id| match usize::try_from(id).ok().and_then(|i| table.get(i)) {
                Some(&act) => w.step(&mut s, act),
                None => false,
            },
        )
        .collect();
    Execution {
        step_valid,
        success: holds(&w, &s, &g),
        env_steps: plan.len(),
    }
}

/// Executes a predicted plan: each step's id when present, else its name
/// looked up with [`crate::action_id`]; anything unknown is an invalid step.
pub fn execute(task: &Task, plan: &[PlanStep]) -> Execution {
    execute_ids(task, &plan_ids(plan))
}

/// What the rule judge says about one plan step (the gates of the
/// `step_gates` table; see [`judge`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepJudgement {
    /// 1 for a step that chooses an object or receptacle (find, pick up) or
    /// names no known action; 0.5 for a step its earlier choices determine
    /// (put down, open, close, turn on/off, slice).
    pub decision: f32,
    /// A valid step that changes nothing the goal needs: it leaves the state
    /// as it was (e.g. a repeated find), or the plan succeeds and still
    /// succeeds without it.
    pub redundant: bool,
    /// False for the steps after the first invalid one (their outcome no
    /// longer follows from the plan as written).
    pub causal: bool,
    /// Short reason: `invalid`, `no-op`, `removable`, `after an invalid step` or `ok`.
    pub reason: &'static str,
}

/// The built-in rule judge: executes the plan step by step and judges each
/// step (see [`StepJudgement`]).
pub fn judge(task: &Task, plan: &[PlanStep]) -> Vec<StepJudgement> {
    let ids = plan_ids(plan);
    let (w, mut s, _) = compile(task);
    let table = acts();
    let success = execute_ids(task, &ids).success;
    let mut seen_invalid = false;
    let mut judged = Vec::with_capacity(ids.len());
    for (k, &id) in ids.iter().enumerate() {
        let act = usize::try_from(id).ok().and_then(|i| table.get(i)).copied();
        let before = s;
        let valid = act.is_some_and(|act| w.step(&mut s, act));
        let causal = !seen_invalid;
        let no_op = valid && s == before;
        let removable = valid && !no_op && success && {
            let mut without = ids.clone();
            without.remove(k);
            execute_ids(task, &without).success
        };
        let reason = if !valid {
            "invalid"
        } else if no_op {
            "no-op"
        } else if removable {
            "removable"
        } else if !causal {
            "after an invalid step"
        } else {
            "ok"
        };
        seen_invalid |= !valid;
        let decision = match act {
            Some(Act::FindRec(_) | Act::FindDevice(_) | Act::FindObj(_) | Act::Pick(_)) | None => {
                1.0
            }
            Some(_) => 0.5,
        };
        judged.push(StepJudgement {
            decision,
            redundant: no_op || removable,
            causal,
            reason,
        });
    }
    judged
}

fn plan_ids(plan: &[PlanStep]) -> Vec<i32> {
    plan.iter()
        .map(|step| match (step.action_id, &step.action_name) {
            (Some(id), _) => i32::try_from(id).unwrap_or(-1),
            (None, Some(name)) => crate::action_id(name).unwrap_or(-1),
            (None, None) => -1,
        })
        .collect()
}

// ---------------------------------------------------------------- planning

/// Breadth-first search over `actions` (tried in this order, so the plan is
/// the first shortest one in that order); `None` past `max_depth`.
fn bfs(
    w: &World,
    start: State,
    g: &CGoal,
    actions: &[(i32, Act)],
    max_depth: usize,
    max_states: usize,
) -> Option<Vec<i32>> {
    if holds(w, &start, g) {
        return Some(Vec::new());
    }
    let mut nodes: Vec<(State, u32, u16, u8)> = vec![(start, u32::MAX, 0, 0)];
    let mut seen: HashSet<State> = HashSet::new();
    seen.insert(start);
    let mut head = 0;
    while head < nodes.len() {
        let (state, _, _, depth) = nodes[head];
        if depth as usize >= max_depth || nodes.len() > max_states {
            return None;
        }
        for (k, &(_, act)) in actions.iter().enumerate() {
            let mut next = state;
            if !w.step(&mut next, act) || !seen.insert(next) {
                continue;
            }
            nodes.push((next, head as u32, k as u16, depth + 1));
            if holds(w, &next, g) {
                let mut plan = Vec::new();
                let mut at = nodes.len() - 1;
                while nodes[at].1 != u32::MAX {
                    plan.push(actions[nodes[at].2 as usize].0);
                    at = nodes[at].1 as usize;
                }
                plan.reverse();
                return Some(plan);
            }
        }
        head += 1;
    }
    None
}

/// The actions the expert considers, in its order of preference.
fn expert_actions(scene: &Scene, ty: TaskType, goal: &Goal) -> Vec<(i32, Act)> {
    let mut list: Vec<Act> = Vec::new();
    let o = goal.object as u8;
    let mut places: Vec<Receptacle> = scene
        .objects
        .iter()
        .filter(|x| x.object == goal.object || Some(x.object) == goal.container)
        .map(|x| x.on)
        .collect();
    list.push(Act::FindObj(o));
    for p in &places {
        list.push(Act::Open(*p as u8));
    }
    list.push(Act::Pick(o));
    if let Some(m) = goal.container {
        list.push(Act::FindObj(m as u8));
        list.push(Act::Pick(m as u8));
    }
    match ty {
        TaskType::PickCleanThenPlace => list.push(Act::FindDevice(Toggle::Faucet as u8)),
        TaskType::LookAtObjInLight => list.push(Act::FindDevice(Toggle::DeskLamp as u8)),
        _ => {}
    }
    if let Some(e) = ty.effect_receptacle() {
        list.push(Act::FindRec(e as u8));
        places.push(e);
    }
    if let Some(r) = goal.receptacle {
        list.push(Act::FindRec(r as u8));
        places.push(r);
    }
    for p in &places {
        list.push(Act::FindRec(*p as u8));
        list.push(Act::Open(*p as u8));
    }
    list.push(Act::Put);
    match ty {
        TaskType::PickHeatThenPlace => list.push(Act::On(Toggle::Microwave as u8)),
        TaskType::PickCleanThenPlace => list.push(Act::On(Toggle::Faucet as u8)),
        TaskType::LookAtObjInLight => list.push(Act::On(Toggle::DeskLamp as u8)),
        _ => {}
    }
    let mut out: Vec<(i32, Act)> = Vec::new();
    for a in list {
        if acts().contains(&a) && !out.iter().any(|(_, b)| *b == a) {
            out.push((id_of(a), a));
        }
    }
    out
}

fn plan_parts(scene: &Scene, ty: TaskType, goal: &Goal) -> Option<Vec<i32>> {
    let (w, s, g) = compile_parts(scene, ty, goal);
    let actions = expert_actions(scene, ty, goal);
    bfs(&w, s, &g, &actions, 24, 2_000_000)
}

/// A shortest valid plan (action ids) for the task; empty when the goal
/// already holds or (for a hand-edited task) no plan exists.
pub fn expert_plan(task: &Task) -> Vec<i32> {
    plan_parts(&task.scene, task.task_type, &task.goal).unwrap_or_default()
}

/// Length of a shortest plan found by breadth-first search over the whole
/// action list (the reference the expert is tested against); `None` when
/// there is none within `max_depth` steps.
pub fn bfs_shortest_len(task: &Task, max_depth: usize) -> Option<usize> {
    let (w, s, g) = compile(task);
    let all: Vec<(i32, Act)> = acts()
        .iter()
        .enumerate()
        .map(|(i, a)| (i as i32, *a))
        .collect();
    bfs(&w, s, &g, &all, max_depth, usize::MAX).map(|p| p.len())
}

// ---------------------------------------------------------------- generating

fn mix(mut x: u64) -> u64 {
    // splitmix64 finaliser
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn task_seed(split: Split, seed: u64, index: usize) -> i64 {
    let tag = match split {
        Split::Train => 1u64,
        Split::Val => 2,
        Split::Unseen => 3,
        Split::Test => 4,
    };
    (mix(mix(mix(seed) ^ tag) ^ index as u64) >> 1) as i64
}

fn scene_rng(seed: i64, run: u32) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(mix(seed as u64 ^ mix(u64::from(run) + 0x5CE)))
}

/// Every goal a task type can have (before the split filter).
pub fn candidate_goals(ty: TaskType) -> Vec<Goal> {
    let mut goals = Vec::new();
    let place = |o: Object, r: Receptacle| Goal {
        object: o,
        receptacle: Some(r),
        container: None,
    };
    for &o in Object::ALL {
        match ty {
            TaskType::LookAtObjInLight => {
                if !o.food() && !o.kitchenware() {
                    goals.push(Goal {
                        object: o,
                        receptacle: None,
                        container: None,
                    });
                }
            }
            TaskType::PickAndPlaceWithMovableRecep => {
                if o.movable_receptacle() {
                    continue;
                }
                for &m in Object::ALL.iter().filter(|m| contains_fits(o, **m)) {
                    for &r in Receptacle::ALL {
                        if m.fits(r) && o.fits(r) {
                            goals.push(Goal {
                                object: o,
                                receptacle: Some(r),
                                container: Some(m),
                            });
                        }
                    }
                }
            }
            _ => {
                let effect = ty.effect_receptacle();
                if let Some(e) = effect
                    && !o.fits(e)
                {
                    continue;
                }
                for &r in Receptacle::ALL {
                    if o.fits(r) && Some(r) != effect {
                        goals.push(place(o, r));
                    }
                }
            }
        }
    }
    goals
}

fn contains_fits(o: Object, m: Object) -> bool {
    use Object::*;
    match m {
        Mug => matches!(o, Pen | Pencil | Spoon | Knife | Ladle),
        Box => matches!(
            o,
            Pen | Pencil | CellPhone | KeyChain | CreditCard | RemoteControl | Book
        ),
        Bowl | Plate => o.food() || matches!(o, Spoon | Knife | KeyChain | CreditCard),
        Pan | Pot => o.food() || matches!(o, Ladle | Spoon),
        _ => false,
    }
}

fn article(words: &str) -> &'static str {
    if words.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

fn with_article(words: &str) -> String {
    format!("{} {words}", article(words))
}

/// The instruction of a goal in phrasing family `family`.
pub fn instruction(ty: TaskType, goal: &Goal, family: u8) -> String {
    let o = goal.object.words();
    let ao = with_article(o);
    let r = goal.receptacle.map_or("desk", Receptacle::words);
    let p = goal.receptacle.map_or("on", Receptacle::preposition);
    let f = family % FAMILIES;
    match ty {
        TaskType::PickAndPlace => match f {
            0 => format!("Put {ao} {p} the {r}."),
            1 => format!("Place {ao} {p} the {r}."),
            2 => format!("Move {ao} to the {r}."),
            _ => format!("Pick up {ao} and leave it {p} the {r}."),
        },
        TaskType::PickCleanThenPlace => match f {
            0 => format!("Put a clean {o} {p} the {r}."),
            1 => format!("Rinse {ao} and place it {p} the {r}."),
            2 => format!("Place a washed {o} {p} the {r}."),
            _ => format!("Wash {ao} in the sink, then set it {p} the {r}."),
        },
        TaskType::PickHeatThenPlace => match f {
            0 => format!("Put a warm {o} {p} the {r}."),
            1 => format!("Heat {ao} and place it {p} the {r}."),
            2 => format!("Place a microwaved {o} {p} the {r}."),
            _ => format!("Cook {ao} in the microwave, then put it {p} the {r}."),
        },
        TaskType::PickCoolThenPlace => match f {
            0 => format!("Put a cold {o} {p} the {r}."),
            1 => format!("Chill {ao} and place it {p} the {r}."),
            2 => format!("Place a cooled {o} {p} the {r}."),
            _ => format!("Cool {ao} in the fridge, then set it {p} the {r}."),
        },
        TaskType::PickTwoObjAndPlace => {
            let os = goal.object.plural();
            match f {
                0 => format!("Put two {os} {p} the {r}."),
                1 => format!("Place both {os} {p} the {r}."),
                2 => format!("Move two {os} to the {r}."),
                _ => format!("Find two {os} and put them {p} the {r}."),
            }
        }
        TaskType::LookAtObjInLight => match f {
            0 => format!("Look at {ao} under the desk lamp."),
            1 => format!("Examine {ao} by the light of the lamp."),
            2 => format!("Hold {ao} and turn on the desk lamp."),
            _ => format!("Inspect {ao} in the lamp light."),
        },
        TaskType::PickAndPlaceWithMovableRecep => {
            let m = goal.container.map_or(Object::Bowl, |m| m);
            let am = with_article(m.words());
            let mp = if m == Object::Plate { "on" } else { "in" };
            match f {
                0 => format!("Put {ao} {mp} {am} {p} the {r}."),
                1 => format!("Place {am} with {ao} {mp} it {p} the {r}."),
                2 => format!("Move {ao} {mp} {am} to the {r}."),
                _ => format!("Set {am} holding {ao} {p} the {r}."),
            }
        }
    }
}

/// Draws a scene for a goal: the required receptacles plus random others,
/// the goal objects away from their target and effect receptacles, random
/// distractors, openable receptacles open or closed at random. `None` when
/// the draw is unusable (goal already holds, or no plan): draw again.
fn draw_scene(
    rng: &mut ChaCha8Rng,
    ty: TaskType,
    goal: &Goal,
    run: u32,
) -> Option<(Scene, Vec<i32>)> {
    let mut present: Vec<Receptacle> = Vec::new();
    present.extend(goal.receptacle);
    present.extend(ty.effect_receptacle());
    let mut others: Vec<Receptacle> = Receptacle::ALL
        .iter()
        .copied()
        .filter(|r| !present.contains(r))
        .collect();
    others.shuffle(rng);
    let n_rec = rng.random_range(6..=9usize);
    for r in others {
        if present.len() >= n_rec {
            break;
        }
        present.push(r);
    }
    let forbidden: Vec<Receptacle> = goal
        .receptacle
        .into_iter()
        .chain(
            ty.effect_receptacle()
                .filter(|_| ty != TaskType::LookAtObjInLight),
        )
        .collect();
    let mut goal_objects = vec![goal.object];
    if ty == TaskType::PickTwoObjAndPlace {
        goal_objects.push(goal.object);
    }
    goal_objects.extend(goal.container);
    let mut objects: Vec<ObjectSpot> = Vec::new();
    for &o in &goal_objects {
        let mut spots: Vec<Receptacle> = present
            .iter()
            .copied()
            .filter(|r| o.fits(*r) && !forbidden.contains(r))
            .collect();
        if spots.is_empty() {
            let extra = [
                Receptacle::CounterTop,
                Receptacle::DiningTable,
                Receptacle::Shelf,
            ]
            .into_iter()
            .find(|r| !forbidden.contains(r) && !present.contains(r))?;
            present.push(extra);
            spots.push(extra);
        }
        objects.push(ObjectSpot {
            object: o,
            on: *spots.choose(rng)?,
        });
    }
    let n_obj = rng.random_range(4..=7usize).max(objects.len());
    let mut distractors: Vec<Object> = Object::ALL
        .iter()
        .copied()
        .filter(|o| !goal_objects.contains(o))
        .collect();
    distractors.shuffle(rng);
    for o in distractors {
        if objects.len() >= n_obj {
            break;
        }
        let spots: Vec<Receptacle> = present.iter().copied().filter(|r| o.fits(*r)).collect();
        if let Some(r) = spots.choose(rng) {
            objects.push(ObjectSpot { object: o, on: *r });
        }
    }
    objects.shuffle(rng);
    present.sort();
    let receptacles = present
        .into_iter()
        .map(|r| ReceptacleSpot {
            receptacle: r,
            open: r.openable() && rng.random_bool(0.5),
        })
        .collect();
    let scene = Scene {
        run,
        receptacles,
        objects,
    };
    let plan = plan_parts(&scene, ty, goal)?;
    if plan.is_empty() {
        return None;
    }
    Some((scene, plan))
}

fn scene_for(seed: i64, run: u32, ty: TaskType, goal: &Goal, avoid: Option<&Scene>) -> Scene {
    let mut rng = scene_rng(seed, run);
    for _ in 0..1000 {
        if let Some((scene, _)) = draw_scene(&mut rng, ty, goal, run)
            && avoid
                .is_none_or(|a| a.receptacles != scene.receptacles || a.objects != scene.objects)
        {
            return scene;
        }
    }
    panic!(
        "no usable scene for {} {goal:?} after 1000 draws",
        ty.as_str()
    )
}

/// Generates `count` tasks of a split, deterministically from `seed`; task
/// ids are `household/<split>/<seed>/<index:06>`.
pub fn generate_tasks(split: Split, seed: u64, count: usize) -> Vec<Task> {
    (0..count).map(|i| generate_task(split, seed, i)).collect()
}

/// Task `index` of `generate_tasks(split, seed, _)`.
pub fn generate_task(split: Split, seed: u64, index: usize) -> Task {
    let tseed = task_seed(split, seed, index);
    let mut rng = ChaCha8Rng::seed_from_u64(tseed as u64);
    let task_type = *TaskType::ALL.choose(&mut rng).expect("non-empty");
    let goals: Vec<Goal> = candidate_goals(task_type)
        .into_iter()
        .filter(|g| {
            let (o, r) = goal_pair(g);
            held_out_pair(o, r) == (split == Split::Unseen)
        })
        .collect();
    let goal = *goals
        .choose(&mut rng)
        .expect("every task type has goals in every split");
    let family = match split {
        Split::Unseen if rng.random_bool(0.5) => HELD_OUT_FAMILY,
        _ => rng.random_range(0..HELD_OUT_FAMILY),
    };
    let scene = scene_for(tseed, 0, task_type, &goal, None);
    Task {
        task_id: format!("household/{split}/{seed}/{index:06}"),
        split,
        task_type,
        seed: tseed,
        instruction: instruction(task_type, &goal, family),
        family,
        goal,
        scene,
    }
}

/// The same task (type, goal, instruction, id) in a new scene layout drawn
/// from (seed, run); run 0 returns the task unchanged.
pub fn reseed(task: &Task, run: u32) -> Task {
    if run == 0 {
        return task.clone();
    }
    let scene = scene_for(
        task.seed,
        run,
        task.task_type,
        &task.goal,
        Some(&task.scene),
    );
    Task {
        scene,
        ..task.clone()
    }
}

/// Checks a task read back from a row: sizes, presence of the goal's
/// receptacles and of every object's receptacle.
pub(crate) fn validate(task: &Task) -> Result<(), String> {
    let s = &task.scene;
    if s.objects.len() > MAX_OBJECTS {
        return Err(format!(
            "scene has {} objects, at most {MAX_OBJECTS} allowed",
            s.objects.len()
        ));
    }
    let present: Vec<Receptacle> = s.receptacles.iter().map(|r| r.receptacle).collect();
    for (i, r) in present.iter().enumerate() {
        if present[..i].contains(r) {
            return Err(format!("receptacle {} listed twice", r.as_str()));
        }
    }
    for o in &s.objects {
        if !present.contains(&o.on) {
            return Err(format!(
                "object {} is on {}, which is not in the scene",
                o.object.as_str(),
                o.on.as_str()
            ));
        }
    }
    let needs = task
        .goal
        .receptacle
        .into_iter()
        .chain(task.task_type.effect_receptacle());
    for r in needs {
        if !present.contains(&r) {
            return Err(format!(
                "goal needs {}, which is not in the scene",
                r.as_str()
            ));
        }
    }
    if (task.task_type == TaskType::PickAndPlaceWithMovableRecep) != task.goal.container.is_some() {
        return Err(
            "a movable receptacle goal needs exactly the movable-receptacle task type".into(),
        );
    }
    if task.task_type != TaskType::LookAtObjInLight && task.goal.receptacle.is_none() {
        return Err(format!(
            "task type {} needs a goal receptacle",
            task.task_type
        ));
    }
    Ok(())
}
