//! Task suites and splits in the spirit of LIBERO, generated deterministically
//! from (suite, split, seed, index): task `tabletop-spatial/train/7/000042`
//! is the same scene, goal and words on every machine.
//!
//! | suite | objects | varies | goals (task types) |
//! |---|---|---|---|
//! | `spatial` | the same five in every task: two identical small red cubes, a white bowl, a blue plate | layouts; the target cube is named by a spatial relation ("the block between the bowl and the plate", "the block next to the plate", "the block on the left", "the block in front of the bowl", ...) | `place_in_bowl`, `place_on_plate` |
//! | `object` | a bowl, a plate and 2–4 blocks of different colour / shape / size | the objects and the target ("the large green cylinder") | `place_in_bowl`, `place_on_plate` |
//! | `goal` | the same five: small red cube, small green cylinder, white bowl, yellow plate, a closed drawer | one layout per seed shared by every train and unseen task; the goal | `place_in_bowl`, `place_on_plate`, `bowl_on_plate`, `open_drawer`, `place_next_to` |
//! | `long` | two blocks, a bowl, a plate, a drawer | layouts, objects; two sub-goals that must hold together | `open_then_place_in_drawer`, `in_bowl_and_on_plate`, `in_bowl_then_bowl_on_plate`, `in_drawer_then_close`, `on_plate_and_next_to` |
//!
//! Splits: `train`; `val` — the train combinations in new layouts (drawn
//! from another random stream; in the goal suite one layout per task instead
//! of the shared one); `unseen` — held-out object–goal combinations (spatial:
//! (relation, goal) pairs; object: (colour, shape, goal); goal: three of the
//! ten goals; long: (task type, colour of the first block)) that train and
//! val never ask for.
//!
//! **LIBERO's protocol** ([`initial_state`]): a task is a (scene,
//! instruction) pair — task `i` of (suite, seed) is the train task `i` as
//! [`generate`] draws it, except in the goal suite, whose seven tasks are
//! its seven train goals in the seed's one layout ([`protocol_tasks`]). Its
//! layout gives each object the centre of a square region of half-width
//! [`REGION_HALF_WIDTH`]; an initial state moves every object to a uniform
//! point of its region (redrawn until the checks below hold). The `train`,
//! `val` and `test` splits are initial states `0, 1, ...` drawn from three
//! disjoint random streams of the same tasks (LIBERO stores 50 per task,
//! `generate-tasks`' default `states`); "one demo" is one initial state per task,
//! "full SFT" every train state. New layouts (`val` above) and held-out
//! goals (`unseen`) stay the generalisation splits.
//!
//! Every task is checked when drawn: objects keep 0.04 between footprints
//! and stay clear of the drawer's full travel, a `next_to` goal's spot is
//! free and on the table, and no goal holds at reset (else the layout is
//! redrawn). `max_steps` is 100 for one goal and 200 for the long suite. A
//! task's `run` k > 0 ([`reseed`]) keeps the objects, goal and words and
//! draws another layout.
//!
//! ```
//! use embodyflow_tabletop::{Split, Suite, generate, reseed};
//! let task = generate(Suite::Spatial, Split::Train, 7, 42);
//! assert_eq!(task.task_id(), "tabletop-spatial/train/7/000042");
//! assert_eq!(task, generate(Suite::Spatial, Split::Train, 7, 42));
//! let again = reseed(&task, 1).unwrap();
//! assert_eq!((again.instruction.as_str(), &again.goals), (task.instruction.as_str(), &task.goals));
//! assert_ne!(again.objects, task.objects);
//!
//! use embodyflow_tabletop::initial_state;
//! let train = initial_state(Suite::Goal, 1, 3, Split::Train, 0).unwrap();
//! let test = initial_state(Suite::Goal, 1, 3, Split::Test, 0).unwrap();
//! assert_eq!(train.task_id(), "tabletop-goal/1/000003@train/0000");
//! assert_eq!((train.instruction.as_str(), &train.goals), (test.instruction.as_str(), &test.goals));
//! assert_ne!(train.objects, test.objects);
//! ```

use std::fmt;
use std::str::FromStr;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::TabletopError;
use crate::scene::{
    CABINET_DEPTH, Camera, Colour, Goal, HANDLE_OFFSET, Kind, ObjectSpec, Shape, Side, Size,
    TRAY_TRAVEL, TaskSpec,
};
use crate::world::World;

/// Steps allowed for a one-goal task.
pub const MAX_STEPS: u32 = 100;
/// Steps allowed for a long (two sub-goal) task.
pub const MAX_STEPS_LONG: u32 = 200;
/// Least gap between two objects' footprints at reset.
const GAP: f32 = 0.04;
/// Gap between an anchor and the spot a `next_to` goal's expert aims at.
pub const NEXT_TO_GAP: f32 = 0.04;

/// A task suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Suite {
    /// Same objects, layouts vary, targets named by spatial relations.
    Spatial,
    /// Different objects.
    Object,
    /// Same layout, different goals.
    Goal,
    /// Two sub-goals.
    Long,
}

impl Suite {
    /// Every suite.
    pub const ALL: [Suite; 4] = [Suite::Spatial, Suite::Object, Suite::Goal, Suite::Long];

    /// The suite's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Suite::Spatial => "spatial",
            Suite::Object => "object",
            Suite::Goal => "goal",
            Suite::Long => "long",
        }
    }
}

impl fmt::Display for Suite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Suite {
    type Err = TabletopError;
    fn from_str(s: &str) -> Result<Suite, TabletopError> {
        Suite::ALL
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| TabletopError::UnknownSuite(s.to_string()))
    }
}

pub use embodyflow_core::schemas::Split;

/// The splits of the layouts protocol ([`generate`]): train, new layouts,
/// held-out combinations.
pub const LAYOUT_SPLITS: [Split; 3] = [Split::Train, Split::Val, Split::Unseen];

/// The splits of LIBERO's protocol ([`initial_state`]): disjoint initial
/// states of the same tasks.
pub const STATE_SPLITS: [Split; 3] = [Split::Train, Split::Val, Split::Test];

/// Half-width of the square region an object's initial position is drawn
/// from, around its place in the task's layout (the table is the unit
/// square; 0.05 is about a third of a small block's footprint width).
pub const REGION_HALF_WIDTH: f32 = 0.05;

/// How many tasks a suite holds under LIBERO's protocol: the goal suite's
/// seven train goals; `None` for the other suites (every index is a task
/// of its own scene).
pub fn protocol_tasks(suite: Suite) -> Option<u64> {
    (suite == Suite::Goal).then(|| GOALS.iter().filter(|(_, held_out)| !held_out).count() as u64)
}

/// Initial state `state` of `split` (`train`, `val` or `test`) of task
/// `index` of (suite, seed) under LIBERO's protocol (see the module doc).
/// Errors: a goal-suite index past its seven tasks, or the `unseen` split
/// (held-out goals are the layouts protocol's).
pub fn initial_state(
    suite: Suite,
    seed: u64,
    index: u64,
    split: Split,
    state: u32,
) -> Result<TaskSpec, TabletopError> {
    state_draw(suite, seed, index, split, state, 0)
}

fn state_draw(
    suite: Suite,
    seed: u64,
    index: u64,
    split: Split,
    state: u32,
    run: u32,
) -> Result<TaskSpec, TabletopError> {
    let refuse = |reason: String| TabletopError::NoSuchState {
        suite: suite.as_str().into(),
        reason,
    };
    if split == Split::Unseen {
        return Err(refuse(
            "train, val and test initial states; held-out goals are the layouts protocol's `unseen`"
                .into(),
        ));
    }
    let base = match protocol_tasks(suite) {
        Some(n) if index >= n => {
            return Err(refuse(format!("{n} tasks, no task {index}")));
        }
        Some(_) => {
            let key = Key {
                suite,
                split: Split::Train,
                seed,
                index,
            };
            let chosen = GOALS
                .iter()
                .filter(|(_, held_out)| !held_out)
                .nth(index as usize)
                .map(|(g, _)| *g)
                .expect("index below the train goals' count");
            let mut task = goal_in_layout(&key, 0, chosen);
            task.suite = suite.as_str().into();
            task.seed = seed;
            task.index = index;
            task
        }
        None => generate(suite, Split::Train, seed, index),
    };
    let mut attempt = 0u64;
    loop {
        let mut rng = rng_of(&[
            text_key(suite.as_str()),
            41,
            text_key(split.as_str()),
            seed,
            index,
            u64::from(state),
            u64::from(run),
            attempt,
        ]);
        if let Some(task) = perturbed(&base, &mut rng) {
            return Ok(TaskSpec {
                split: split.as_str().into(),
                run,
                state: Some(state),
                ..task
            });
        }
        attempt += 1;
    }
}

/// The task with every object moved to a uniform point of its region, if
/// the result passes the layout checks.
fn perturbed(base: &TaskSpec, rng: &mut ChaCha8Rng) -> Option<TaskSpec> {
    let r = REGION_HALF_WIDTH;
    let mut objects: Vec<ObjectSpec> = Vec::with_capacity(base.objects.len());
    for o in &base.objects {
        let mut moved = o.clone();
        moved.x += rng.random_range(-r..=r);
        moved.y += rng.random_range(-r..=r);
        if !free(&objects, &moved) {
            return None;
        }
        objects.push(moved);
    }
    for goal in &base.goals {
        if let Goal::NextTo {
            object,
            anchor,
            side,
        } = *goal
            && !next_to_free(&objects, object, anchor, side)
        {
            return None;
        }
    }
    checked(TaskSpec {
        objects,
        ..base.clone()
    })
}

/// The task `index` of (suite, split, seed) under the layouts protocol
/// ([`LAYOUT_SPLITS`]; `test` draws as `val` does, from a stream of its own).
pub fn generate(suite: Suite, split: Split, seed: u64, index: u64) -> TaskSpec {
    draw(suite, split, seed, index, 0)
}

/// The same task (objects, goals, words) in another layout, drawn from
/// its key and `run`; run 0 is the task as generated.
pub fn reseed(task: &TaskSpec, run: u32) -> Result<TaskSpec, TabletopError> {
    let suite: Suite = task.suite.parse()?;
    let split: Split = task.split.parse()?;
    let drawn = match task.state {
        Some(state) => state_draw(suite, task.seed, task.index, split, state, run)?,
        None => draw(suite, split, task.seed, task.index, run),
    };
    Ok(TaskSpec {
        camera: task.camera,
        ..drawn
    })
}

/// A 64-bit seed for the tasks table's `seed` column, from the task's key
/// (suite and split by name) and its initial state, if any.
pub fn task_seed(suite: &str, split: &str, seed: u64, index: u64, state: Option<u32>) -> u64 {
    match state {
        None => mix(&[text_key(suite), text_key(split), seed, index]),
        Some(state) => mix(&[
            text_key(suite),
            text_key(split),
            seed,
            index,
            1 << 32 | u64::from(state),
        ]),
    }
}

/// splitmix64 over the parts: portable, stable across versions.
fn mix(parts: &[u64]) -> u64 {
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15;
    for &p in parts {
        h ^= p;
        h = h.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = h;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        h = z ^ (z >> 31);
    }
    h
}

/// FNV-1a of a name.
fn text_key(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn rng_of(parts: &[u64]) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(mix(parts))
}

/// The (combination, layout) draw of one task.
struct Key {
    suite: Suite,
    split: Split,
    seed: u64,
    index: u64,
}

impl Key {
    fn base(&self) -> [u64; 3] {
        [text_key(self.suite.as_str()), self.seed, self.index]
    }

    /// The random stream of the task's combination: independent of the
    /// layout, of the run and of val vs train (val draws train's
    /// combinations).
    fn combo_rng(&self, attempt: u64) -> ChaCha8Rng {
        let split = match self.split {
            Split::Unseen => 1,
            Split::Train | Split::Val | Split::Test => 0,
        };
        let [s, seed, index] = self.base();
        rng_of(&[s, 11, split, seed, index, attempt])
    }

    /// The random stream of a layout.
    fn layout_rng(&self, run: u32, attempt: u64) -> ChaCha8Rng {
        let [s, seed, index] = self.base();
        rng_of(&[
            s,
            23,
            text_key(self.split.as_str()),
            seed,
            index,
            u64::from(run),
            attempt,
        ])
    }

    /// The goal suite's layout shared by every train and unseen task of a
    /// seed.
    fn shared_layout_rng(&self, run: u32, attempt: u64) -> ChaCha8Rng {
        let [s, seed, _] = self.base();
        rng_of(&[s, 37, seed, u64::from(run), attempt])
    }

    /// Whether a combination (given by its key) is held out for `unseen`.
    fn wants(&self, held_out: bool) -> bool {
        held_out == (self.split == Split::Unseen)
    }
}

fn draw(suite: Suite, split: Split, seed: u64, index: u64, run: u32) -> TaskSpec {
    let key = Key {
        suite,
        split,
        seed,
        index,
    };
    let mut task = match suite {
        Suite::Spatial => spatial(&key, run),
        Suite::Object => object(&key, run),
        Suite::Goal => goal(&key, run),
        Suite::Long => long(&key, run),
    };
    task.suite = suite.as_str().into();
    task.split = split.as_str().into();
    task.seed = seed;
    task.index = index;
    task.run = run;
    task
}

/// A task under construction.
fn task(
    task_type: &str,
    instruction: String,
    objects: Vec<ObjectSpec>,
    goals: Vec<Goal>,
    max_steps: u32,
) -> TaskSpec {
    TaskSpec {
        suite: String::new(),
        split: String::new(),
        seed: 0,
        index: 0,
        run: 0,
        state: None,
        task_type: task_type.into(),
        instruction,
        objects,
        goals,
        max_steps,
        camera: Camera::Point,
    }
}

/// Whether `o` keeps `GAP` from every object in `placed`, clear of the
/// drawer's full travel, with its footprint 0.03 inside the table and
/// y ≥ 0.15.
fn free(placed: &[ObjectSpec], o: &ObjectSpec) -> bool {
    let r = o.radius();
    if !o.x.is_finite() || !o.y.is_finite() {
        return false;
    }
    if o.kind != Kind::Drawer
        && (o.x < r + 0.03 || o.x > 1.0 - r - 0.03 || o.y < r.max(0.15) || o.y > 1.0 - r - 0.03)
    {
        return false;
    }
    placed.iter().all(|p| !too_close(p, o))
}

fn too_close(a: &ObjectSpec, b: &ObjectSpec) -> bool {
    match (a.kind == Kind::Drawer, b.kind == Kind::Drawer) {
        (false, false) => {
            let (dx, dy) = (a.x - b.x, a.y - b.y);
            (dx * dx + dy * dy).sqrt() < a.radius() + b.radius() + GAP
        }
        (true, true) => true,
        (true, false) => near_drawer(b, a),
        (false, true) => near_drawer(a, b),
    }
}

/// Whether a disc comes within `GAP` of the drawer's cabinet or its tray at
/// full travel.
fn near_drawer(disc: &ObjectSpec, drawer: &ObjectSpec) -> bool {
    let r = drawer.radius();
    let lo = [
        drawer.x - r,
        drawer.y - CABINET_DEPTH / 2.0 - TRAY_TRAVEL - HANDLE_OFFSET,
    ];
    let hi = [drawer.x + r, drawer.y + CABINET_DEPTH / 2.0];
    let cx = disc.x.clamp(lo[0], hi[0]);
    let cy = disc.y.clamp(lo[1], hi[1]);
    let (dx, dy) = (disc.x - cx, disc.y - cy);
    (dx * dx + dy * dy).sqrt() < disc.radius() + GAP
}

/// Places `o` at a uniform spot where it is [`free`] (40 tries).
fn place_anywhere(
    rng: &mut ChaCha8Rng,
    placed: &mut Vec<ObjectSpec>,
    mut o: ObjectSpec,
) -> Option<usize> {
    for _ in 0..40 {
        o.x = rng.random_range(0.05..0.95);
        o.y = rng.random_range(0.15..0.95);
        if free(placed, &o) {
            placed.push(o);
            return Some(placed.len() - 1);
        }
    }
    None
}

/// Places `o` at (x, y) if it is free there.
fn place_at(placed: &mut Vec<ObjectSpec>, mut o: ObjectSpec, x: f32, y: f32) -> Option<usize> {
    o.x = x;
    o.y = y;
    free(placed, &o).then(|| {
        placed.push(o);
        placed.len() - 1
    })
}

/// A drawer against the far edge, its tray sliding towards the robot.
fn drawer(rng: &mut ChaCha8Rng, open: f32) -> ObjectSpec {
    let size = if rng.random_bool(0.5) {
        Size::Small
    } else {
        Size::Large
    };
    let mut d = ObjectSpec::new(Kind::Drawer, Colour::Orange, Shape::Cube, size, 0.0, 0.0);
    let r = d.radius();
    d.x = rng.random_range(r + 0.05..1.0 - r - 0.05);
    d.y = rng.random_range(0.82..0.9);
    d.open = open;
    d
}

fn block(colour: Colour, shape: Shape, size: Size) -> ObjectSpec {
    ObjectSpec::new(Kind::Block, colour, shape, size, 0.0, 0.0)
}

fn bowl(colour: Colour, size: Size) -> ObjectSpec {
    ObjectSpec::new(Kind::Bowl, colour, Shape::Cube, size, 0.0, 0.0)
}

fn plate(colour: Colour, size: Size) -> ObjectSpec {
    ObjectSpec::new(Kind::Plate, colour, Shape::Cube, size, 0.0, 0.0)
}

/// The spot a `next_to` goal's object is aimed at: `NEXT_TO_GAP` beyond
/// the anchor's footprint on `side`.
pub fn next_to_spot(
    anchor: [f32; 2],
    anchor_radius: f32,
    object_radius: f32,
    side: Side,
) -> [f32; 2] {
    let d = side.direction();
    let reach = anchor_radius + object_radius + NEXT_TO_GAP;
    [anchor[0] + d[0] * reach, anchor[1] + d[1] * reach]
}

/// Whether the spot of `next_to(object, anchor, side)` is on the table and
/// free of the other objects.
fn next_to_free(objects: &[ObjectSpec], object: usize, anchor: usize, side: Side) -> bool {
    let mut o = objects[object].clone();
    let a = &objects[anchor];
    [o.x, o.y] = next_to_spot([a.x, a.y], a.radius(), o.radius(), side);
    let others: Vec<ObjectSpec> = objects
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != object && i != anchor)
        .map(|(_, p)| p.clone())
        .collect();
    let r = o.radius();
    let on_table =
        o.x >= r + 0.02 && o.x <= 1.0 - r - 0.02 && o.y >= r + 0.02 && o.y <= 1.0 - r - 0.02;
    on_table
        && others.iter().all(|p| match p.kind {
            Kind::Drawer => !near_drawer(&o, p),
            _ => {
                let (dx, dy) = (p.x - o.x, p.y - o.y);
                (dx * dx + dy * dy).sqrt() >= p.radius() + r + 0.02
            }
        })
}

/// Finishes a drawn task: rejects it when a world cannot be built from it
/// or a goal already holds at reset.
fn checked(t: TaskSpec) -> Option<TaskSpec> {
    let world = World::new(&t).ok()?;
    (!t.goals.iter().any(|g| world.holds(g))).then_some(t)
}

/// Draws layouts (attempt 0, 1, ...) until `build` returns a task.
fn first_layout(
    key: &Key,
    run: u32,
    mut build: impl FnMut(&mut ChaCha8Rng) -> Option<TaskSpec>,
) -> TaskSpec {
    let mut attempt = 0u64;
    loop {
        let mut rng = key.layout_rng(run, attempt);
        if let Some(t) = build(&mut rng).and_then(checked) {
            return t;
        }
        attempt += 1;
    }
}

// ---------------------------------------------------------------- spatial

/// How the spatial suite names its target cube.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Relation {
    Between,
    NearBowl,
    NearPlate,
    Left,
    Right,
    FrontOfBowl,
    BehindPlate,
}

impl Relation {
    const ALL: [Relation; 7] = [
        Relation::Between,
        Relation::NearBowl,
        Relation::NearPlate,
        Relation::Left,
        Relation::Right,
        Relation::FrontOfBowl,
        Relation::BehindPlate,
    ];

    fn phrase(self) -> &'static str {
        match self {
            Relation::Between => "the block between the bowl and the plate",
            Relation::NearBowl => "the block next to the bowl",
            Relation::NearPlate => "the block next to the plate",
            Relation::Left => "the block on the left",
            Relation::Right => "the block on the right",
            Relation::FrontOfBowl => "the block in front of the bowl",
            Relation::BehindPlate => "the block behind the plate",
        }
    }
}

/// (relation, goal is the plate) pairs held out for `unseen`.
const SPATIAL_HELD_OUT: [(Relation, bool); 3] = [
    (Relation::Between, true),
    (Relation::NearPlate, false),
    (Relation::Right, true),
];

fn spatial(key: &Key, run: u32) -> TaskSpec {
    let (relation, on_plate) = {
        let mut attempt = 0;
        loop {
            let mut rng = key.combo_rng(attempt);
            let r = Relation::ALL[rng.random_range(0..Relation::ALL.len())];
            let p = rng.random_bool(0.5);
            if key.wants(SPATIAL_HELD_OUT.contains(&(r, p))) {
                break (r, p);
            }
            attempt += 1;
        }
    };
    first_layout(key, run, |rng| {
        let cube = block(Colour::Red, Shape::Cube, Size::Small);
        let mut objects = Vec::new();
        let b = place_anywhere(rng, &mut objects, bowl(Colour::White, Size::Small))?;
        let p = place_anywhere(rng, &mut objects, plate(Colour::Blue, Size::Large))?;
        let (bo, po) = (objects[b].clone(), objects[p].clone());
        let jitter = |rng: &mut ChaCha8Rng| rng.random_range(-0.015f32..0.015);
        let target = match relation {
            Relation::Between => {
                let d = ((bo.x - po.x).powi(2) + (bo.y - po.y).powi(2)).sqrt();
                if !(0.34..=0.55).contains(&d) {
                    return None;
                }
                let (x, y) = (
                    (bo.x + po.x) / 2.0 + jitter(rng),
                    (bo.y + po.y) / 2.0 + jitter(rng),
                );
                place_at(&mut objects, cube.clone(), x, y)?
            }
            Relation::NearBowl
            | Relation::NearPlate
            | Relation::FrontOfBowl
            | Relation::BehindPlate => {
                let (anchor, angle) = match relation {
                    Relation::NearBowl => (&bo, rng.random_range(0.0..std::f32::consts::TAU)),
                    Relation::NearPlate => (&po, rng.random_range(0.0..std::f32::consts::TAU)),
                    Relation::FrontOfBowl => (&bo, -std::f32::consts::FRAC_PI_2),
                    _ => (&po, std::f32::consts::FRAC_PI_2),
                };
                let reach = anchor.radius() + cube.radius() + GAP + rng.random_range(0.0..0.015);
                let (x, y) = (
                    anchor.x + reach * angle.cos(),
                    anchor.y + reach * angle.sin(),
                );
                place_at(&mut objects, cube.clone(), x, y)?
            }
            Relation::Left | Relation::Right => place_anywhere(rng, &mut objects, cube.clone())?,
        };
        let other = place_anywhere(rng, &mut objects, cube.clone())?;
        let (t, o) = (&objects[target], &objects[other]);
        // The relation must name the target alone.
        let far = |a: &ObjectSpec, from: &ObjectSpec| {
            ((a.x - from.x).powi(2) + (a.y - from.y).powi(2)).sqrt()
                >= from.radius() + a.radius() + 0.15
        };
        let unique = match relation {
            Relation::Between => {
                // The other cube is far from the segment bowl–plate.
                let (ax, ay, bx, by) = (bo.x, bo.y, po.x, po.y);
                let (vx, vy) = (bx - ax, by - ay);
                let u = (((o.x - ax) * vx + (o.y - ay) * vy) / (vx * vx + vy * vy)).clamp(0.0, 1.0);
                let (cx, cy) = (ax + u * vx, ay + u * vy);
                ((o.x - cx).powi(2) + (o.y - cy).powi(2)).sqrt() >= 0.15
            }
            Relation::NearBowl | Relation::FrontOfBowl => far(o, &bo),
            Relation::NearPlate | Relation::BehindPlate => far(o, &po),
            Relation::Left => t.x < o.x - 0.25,
            Relation::Right => t.x > o.x + 0.25,
        };
        if !unique {
            return None;
        }
        let (goal, words, task_type) = if on_plate {
            (
                Goal::PlaceIn {
                    object: target,
                    target: p,
                },
                "on the plate",
                "place_on_plate",
            )
        } else {
            (
                Goal::PlaceIn {
                    object: target,
                    target: b,
                },
                "in the bowl",
                "place_in_bowl",
            )
        };
        Some(task(
            task_type,
            format!("put {} {words}", relation.phrase()),
            objects,
            vec![goal],
            MAX_STEPS,
        ))
    })
}

// ----------------------------------------------------------------- object

fn object_held_out(colour: Colour, shape: Shape, on_plate: bool) -> bool {
    mix(&[
        text_key(colour.as_str()),
        text_key(shape.as_str()),
        u64::from(on_plate),
        5,
    ])
    .is_multiple_of(4)
}

fn random_colour(rng: &mut ChaCha8Rng) -> Colour {
    Colour::ALL[rng.random_range(0..Colour::ALL.len())]
}

fn random_size(rng: &mut ChaCha8Rng) -> Size {
    if rng.random_bool(0.5) {
        Size::Small
    } else {
        Size::Large
    }
}

fn random_shape(rng: &mut ChaCha8Rng) -> Shape {
    if rng.random_bool(0.5) {
        Shape::Cube
    } else {
        Shape::Cylinder
    }
}

fn object(key: &Key, run: u32) -> TaskSpec {
    let (colour, shape, on_plate) = {
        let mut attempt = 0;
        loop {
            let mut rng = key.combo_rng(attempt);
            let c = (
                random_colour(&mut rng),
                random_shape(&mut rng),
                rng.random_bool(0.5),
            );
            if key.wants(object_held_out(c.0, c.1, c.2)) {
                break c;
            }
            attempt += 1;
        }
    };
    // The distractors and sizes belong to the task, not to the layout.
    let mut rng = key.combo_rng(1000);
    let size = random_size(&mut rng);
    let target_spec = block(colour, shape, size);
    let distractors = rng.random_range(1..=3usize);
    let mut blocks = vec![target_spec.clone()];
    while blocks.len() <= distractors {
        let d = block(
            random_colour(&mut rng),
            random_shape(&mut rng),
            random_size(&mut rng),
        );
        if blocks.iter().all(|b| b.describe() != d.describe()) {
            blocks.push(d);
        }
    }
    let bowl_colour = random_colour(&mut rng);
    let mut plate_colour = random_colour(&mut rng);
    while plate_colour == bowl_colour {
        plate_colour = random_colour(&mut rng);
    }
    let bowl_size = random_size(&mut rng);
    first_layout(key, run, |rng| {
        let mut objects = Vec::new();
        let b = place_anywhere(rng, &mut objects, bowl(bowl_colour, bowl_size))?;
        let p = place_anywhere(rng, &mut objects, plate(plate_colour, Size::Large))?;
        let target = place_anywhere(rng, &mut objects, blocks[0].clone())?;
        for d in &blocks[1..] {
            place_anywhere(rng, &mut objects, d.clone())?;
        }
        let (goal, words, task_type) = if on_plate {
            (
                Goal::PlaceIn {
                    object: target,
                    target: p,
                },
                format!("on the {}", objects[p].describe()),
                "place_on_plate",
            )
        } else {
            (
                Goal::PlaceIn {
                    object: target,
                    target: b,
                },
                format!("in the {}", objects[b].describe()),
                "place_in_bowl",
            )
        };
        Some(task(
            task_type,
            format!("put the {} {words}", objects[target].describe()),
            objects,
            vec![goal],
            MAX_STEPS,
        ))
    })
}

// ------------------------------------------------------------------- goal

/// The goal suite's objects: 0 red cube, 1 green cylinder, 2 bowl, 3 plate,
/// 4 drawer.
const GOAL_RED: usize = 0;
const GOAL_GREEN: usize = 1;
const GOAL_BOWL: usize = 2;
const GOAL_PLATE: usize = 3;
const GOAL_DRAWER: usize = 4;

/// The goal suite's ten goals; `true` marks the three held out for `unseen`.
const GOALS: [(Goal, bool); 10] = [
    (
        Goal::PlaceIn {
            object: GOAL_RED,
            target: GOAL_BOWL,
        },
        false,
    ),
    (
        Goal::PlaceIn {
            object: GOAL_GREEN,
            target: GOAL_BOWL,
        },
        true,
    ),
    (
        Goal::PlaceIn {
            object: GOAL_RED,
            target: GOAL_PLATE,
        },
        true,
    ),
    (
        Goal::PlaceIn {
            object: GOAL_GREEN,
            target: GOAL_PLATE,
        },
        false,
    ),
    (
        Goal::PlaceIn {
            object: GOAL_BOWL,
            target: GOAL_PLATE,
        },
        false,
    ),
    (
        Goal::OpenDrawer {
            drawer: GOAL_DRAWER,
        },
        false,
    ),
    (
        Goal::NextTo {
            object: GOAL_RED,
            anchor: GOAL_BOWL,
            side: Side::Left,
        },
        false,
    ),
    (
        Goal::NextTo {
            object: GOAL_GREEN,
            anchor: GOAL_PLATE,
            side: Side::Right,
        },
        false,
    ),
    (
        Goal::NextTo {
            object: GOAL_RED,
            anchor: GOAL_PLATE,
            side: Side::Front,
        },
        true,
    ),
    (
        Goal::NextTo {
            object: GOAL_GREEN,
            anchor: GOAL_BOWL,
            side: Side::Behind,
        },
        false,
    ),
];

/// The instruction and task type of a goal over `objects`.
fn describe_goal(objects: &[ObjectSpec], goal: &Goal) -> (String, &'static str) {
    let name = |i: usize| objects[i].describe();
    match *goal {
        Goal::PlaceIn { object, target } => match objects[target].kind {
            Kind::Plate if objects[object].kind == Kind::Bowl => (
                format!("put the {} on the {}", name(object), name(target)),
                "bowl_on_plate",
            ),
            Kind::Plate => (
                format!("put the {} on the {}", name(object), name(target)),
                "place_on_plate",
            ),
            Kind::Drawer => (
                format!("put the {} in the drawer", name(object)),
                "place_in_drawer",
            ),
            _ => (
                format!("put the {} in the {}", name(object), name(target)),
                "place_in_bowl",
            ),
        },
        Goal::NextTo {
            object,
            anchor,
            side,
        } => (
            format!(
                "put the {} {} the {}",
                name(object),
                side.phrase(),
                name(anchor)
            ),
            "place_next_to",
        ),
        Goal::OpenDrawer { .. } => ("open the drawer".into(), "open_drawer"),
        Goal::CloseDrawer { .. } => ("close the drawer".into(), "close_drawer"),
    }
}

fn goal_objects() -> [ObjectSpec; 4] {
    [
        block(Colour::Red, Shape::Cube, Size::Small),
        block(Colour::Green, Shape::Cylinder, Size::Small),
        bowl(Colour::White, Size::Small),
        plate(Colour::Yellow, Size::Large),
    ]
}

/// A goal-suite layout: valid, every `next_to` spot of the ten goals free,
/// no goal holding at reset.
fn goal_layout(rng: &mut ChaCha8Rng) -> Option<Vec<ObjectSpec>> {
    let mut objects = Vec::new();
    let d = drawer(rng, 0.0);
    let mut placed = vec![d.clone()];
    for o in goal_objects() {
        place_anywhere(rng, &mut placed, o)?;
    }
    objects.extend(placed.drain(1..));
    objects.push(d);
    for (g, _) in GOALS {
        if let Goal::NextTo {
            object,
            anchor,
            side,
        } = g
            && !next_to_free(&objects, object, anchor, side)
        {
            return None;
        }
    }
    let probe = task(
        "probe",
        "probe".into(),
        objects.clone(),
        GOALS.iter().map(|(g, _)| *g).collect(),
        1,
    );
    let world = World::new(&probe).ok()?;
    (!GOALS.iter().any(|(g, _)| world.holds(g))).then_some(objects)
}

fn goal(key: &Key, run: u32) -> TaskSpec {
    let chosen = {
        let mut attempt = 0;
        loop {
            let mut rng = key.combo_rng(attempt);
            let (g, held_out) = GOALS[rng.random_range(0..GOALS.len())];
            if key.wants(held_out) {
                break g;
            }
            attempt += 1;
        }
    };
    goal_in_layout(key, run, chosen)
}

/// The goal-suite task of `chosen`: in the seed's shared layout, or (val)
/// in a layout of its own.
fn goal_in_layout(key: &Key, run: u32, chosen: Goal) -> TaskSpec {
    let make = |objects: Vec<ObjectSpec>| {
        let (instruction, task_type) = describe_goal(&objects, &chosen);
        task(task_type, instruction, objects, vec![chosen], MAX_STEPS)
    };
    if matches!(key.split, Split::Val | Split::Test) {
        return first_layout(key, run, |rng| goal_layout(rng).map(make));
    }
    // One layout per (seed, run), shared by every train and unseen task.
    let mut attempt = 0u64;
    loop {
        if let Some(objects) = goal_layout(&mut key.shared_layout_rng(run, attempt)) {
            return make(objects);
        }
        attempt += 1;
    }
}

// ------------------------------------------------------------------- long

/// The long suite's task types.
const LONG_TYPES: [&str; 5] = [
    "open_then_place_in_drawer",
    "in_bowl_and_on_plate",
    "in_bowl_then_bowl_on_plate",
    "in_drawer_then_close",
    "on_plate_and_next_to",
];

fn long_held_out(kind: usize, colour: Colour) -> bool {
    mix(&[kind as u64, text_key(colour.as_str()), 17]).is_multiple_of(4)
}

fn long(key: &Key, run: u32) -> TaskSpec {
    let (kind, first) = {
        let mut attempt = 0;
        loop {
            let mut rng = key.combo_rng(attempt);
            let c = (
                rng.random_range(0..LONG_TYPES.len()),
                random_colour(&mut rng),
            );
            if key.wants(long_held_out(c.0, c.1)) {
                break c;
            }
            attempt += 1;
        }
    };
    let mut rng = key.combo_rng(1000);
    let mut second = random_colour(&mut rng);
    while second == first {
        second = random_colour(&mut rng);
    }
    let blocks = [
        block(first, random_shape(&mut rng), random_size(&mut rng)),
        block(second, random_shape(&mut rng), random_size(&mut rng)),
    ];
    let bowl_colour = random_colour(&mut rng);
    let mut plate_colour = random_colour(&mut rng);
    while plate_colour == bowl_colour {
        plate_colour = random_colour(&mut rng);
    }
    let side = Side::ALL[rng.random_range(0..Side::ALL.len())];
    let start_open = if kind == 3 { TRAY_TRAVEL } else { 0.0 };
    first_layout(key, run, |rng| {
        let d = drawer(rng, start_open);
        let mut objects = vec![d];
        let a = place_anywhere(rng, &mut objects, blocks[0].clone())?;
        let b2 = place_anywhere(rng, &mut objects, blocks[1].clone())?;
        let bw = place_anywhere(rng, &mut objects, bowl(bowl_colour, Size::Large))?;
        let pl = place_anywhere(rng, &mut objects, plate(plate_colour, Size::Large))?;
        let dr = 0;
        let name = |i: usize| objects[i].describe();
        let (goals, instruction) = match kind {
            0 => (
                vec![
                    Goal::OpenDrawer { drawer: dr },
                    Goal::PlaceIn {
                        object: a,
                        target: dr,
                    },
                ],
                format!("open the drawer and put the {} in it", name(a)),
            ),
            1 => (
                vec![
                    Goal::PlaceIn {
                        object: a,
                        target: bw,
                    },
                    Goal::PlaceIn {
                        object: b2,
                        target: pl,
                    },
                ],
                format!(
                    "put the {} in the {} and the {} on the {}",
                    name(a),
                    name(bw),
                    name(b2),
                    name(pl)
                ),
            ),
            2 => (
                vec![
                    Goal::PlaceIn {
                        object: a,
                        target: bw,
                    },
                    Goal::PlaceIn {
                        object: bw,
                        target: pl,
                    },
                ],
                format!(
                    "put the {} in the {}, then put the bowl on the {}",
                    name(a),
                    name(bw),
                    name(pl)
                ),
            ),
            3 => (
                vec![
                    Goal::PlaceIn {
                        object: a,
                        target: dr,
                    },
                    Goal::CloseDrawer { drawer: dr },
                ],
                format!("put the {} in the drawer and close it", name(a)),
            ),
            _ => {
                if !next_to_free(&objects, b2, bw, side) {
                    return None;
                }
                (
                    vec![
                        Goal::PlaceIn {
                            object: a,
                            target: pl,
                        },
                        Goal::NextTo {
                            object: b2,
                            anchor: bw,
                            side,
                        },
                    ],
                    format!(
                        "put the {} on the {} and the {} {} the {}",
                        name(a),
                        name(pl),
                        name(b2),
                        side.phrase(),
                        name(bw)
                    ),
                )
            }
        };
        Some(task(
            LONG_TYPES[kind],
            instruction,
            objects,
            goals,
            MAX_STEPS_LONG,
        ))
    })
}
