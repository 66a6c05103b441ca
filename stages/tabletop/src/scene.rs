//! The scene vocabulary: object kinds, colours, shapes and sizes with their
//! dimensions, the goals a task can ask for, and the task description
//! ([`TaskSpec`]) a world is built from — the JSON a tasks-table row carries
//! in its `observation` column.
//!
//! Units: the table is the square `[0, 1] x [0, 1]` seen from above (x to
//! the right, y away from the robot, which stands at y = 0); heights are in
//! the same unit above the table top.
//!
//! | kind | footprint | height | moves | holds |
//! |---|---|---|---|---|
//! | block (cube or cylinder) | radius 0.03 (small) / 0.04 (large) | 0.05 / 0.065 | grasped, pushed | — |
//! | bowl | radius 0.065 / 0.08 | 0.05 | grasped, pushed | blocks |
//! | plate | radius 0.08 / 0.095 | 0.01 | never (flat) | blocks, bowls |
//! | drawer (cabinet + sliding tray) | 0.24 / 0.28 wide, 0.16 deep | 0.2 | its tray slides | blocks, in the open tray |
//!
//! ```
//! use embodyflow_tabletop::scene::*;
//! let block = ObjectSpec::new(Kind::Block, Colour::Red, Shape::Cube, Size::Small, 0.3, 0.4);
//! assert_eq!(block.describe(), "small red cube");
//! assert!((block.radius() - 0.03).abs() < 1e-6);
//! ```

use serde::{Deserialize, Serialize};

use crate::TabletopError;

/// Most objects a scene holds.
pub const MAX_OBJECTS: usize = 6;
/// Fewest objects a scene holds.
pub const MIN_OBJECTS: usize = 2;
/// Height of a plate's top surface.
pub const PLATE_TOP: f32 = 0.01;
/// Height of the cabinet (its top surface).
pub const CABINET_HEIGHT: f32 = 0.2;
/// Depth of the cabinet body (along y).
pub const CABINET_DEPTH: f32 = 0.16;
/// How far the drawer's tray slides out when fully open.
pub const TRAY_TRAVEL: f32 = 0.14;
/// Height of the tray's floor.
pub const TRAY_FLOOR: f32 = 0.02;
/// Distance of the handle in front of the tray's front face.
pub const HANDLE_OFFSET: f32 = 0.012;

/// What an object is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A small graspable, pushable block.
    Block,
    /// A bowl: graspable, pushable, holds blocks.
    Bowl,
    /// A flat plate fixed to the table: blocks and bowls rest on it.
    Plate,
    /// A cabinet with a drawer that slides towards the robot (−y).
    Drawer,
}

impl Kind {
    /// The kind's name in instructions.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Block => "block",
            Kind::Bowl => "bowl",
            Kind::Plate => "plate",
            Kind::Drawer => "drawer",
        }
    }

    /// Whether the gripper can pick it up (and push it).
    pub fn movable(self) -> bool {
        matches!(self, Kind::Block | Kind::Bowl)
    }
}

/// Object colour (8, distinct in the rendered image). A drawer's colour is
/// not drawn (cabinets are wood) nor named.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Colour {
    /// Red.
    Red,
    /// Green.
    Green,
    /// Blue.
    Blue,
    /// Yellow.
    Yellow,
    /// Purple.
    Purple,
    /// Orange.
    Orange,
    /// White.
    White,
    /// Black.
    Black,
}

impl Colour {
    /// Every colour.
    pub const ALL: [Colour; 8] = [
        Colour::Red,
        Colour::Green,
        Colour::Blue,
        Colour::Yellow,
        Colour::Purple,
        Colour::Orange,
        Colour::White,
        Colour::Black,
    ];

    /// The colour's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Colour::Red => "red",
            Colour::Green => "green",
            Colour::Blue => "blue",
            Colour::Yellow => "yellow",
            Colour::Purple => "purple",
            Colour::Orange => "orange",
            Colour::White => "white",
            Colour::Black => "black",
        }
    }

    /// sRGB bytes the renderer paints it with.
    pub fn rgb(self) -> [u8; 3] {
        match self {
            Colour::Red => [220, 40, 40],
            Colour::Green => [40, 190, 60],
            Colour::Blue => [50, 80, 230],
            Colour::Yellow => [240, 220, 40],
            Colour::Purple => [150, 60, 200],
            Colour::Orange => [250, 140, 20],
            Colour::White => [245, 245, 245],
            Colour::Black => [20, 20, 20],
        }
    }
}

/// Object shape: blocks are cubes or cylinders (square or round seen from
/// above); bowls, plates and drawers have one shape each and carry `cube`
/// as a placeholder that the renderer ignores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Shape {
    /// Square footprint.
    Cube,
    /// Round footprint.
    Cylinder,
}

impl Shape {
    /// The shape's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Shape::Cube => "cube",
            Shape::Cylinder => "cylinder",
        }
    }
}

/// Object size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Size {
    /// Small.
    Small,
    /// Large.
    Large,
}

impl Size {
    /// The size's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Size::Small => "small",
            Size::Large => "large",
        }
    }
}

/// Which side of an anchor object a `next_to` goal means, seen from the
/// robot (left = −x, behind = +y).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// −x.
    Left,
    /// +x.
    Right,
    /// −y (towards the robot).
    Front,
    /// +y.
    Behind,
}

impl Side {
    /// Every side.
    pub const ALL: [Side; 4] = [Side::Left, Side::Right, Side::Front, Side::Behind];

    /// The unit direction on the table.
    pub fn direction(self) -> [f32; 2] {
        match self {
            Side::Left => [-1.0, 0.0],
            Side::Right => [1.0, 0.0],
            Side::Front => [0.0, -1.0],
            Side::Behind => [0.0, 1.0],
        }
    }

    /// The side in an instruction ("to the left of").
    pub fn phrase(self) -> &'static str {
        match self {
            Side::Left => "to the left of",
            Side::Right => "to the right of",
            Side::Front => "in front of",
            Side::Behind => "behind",
        }
    }
}

/// One object of a scene as a task describes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectSpec {
    /// What it is.
    pub kind: Kind,
    /// Its colour.
    pub colour: Colour,
    /// Its shape (blocks only; others carry `cube`).
    pub shape: Shape,
    /// Its size.
    pub size: Size,
    /// Centre x on the table (for a drawer: the cabinet body's centre).
    pub x: f32,
    /// Centre y on the table.
    pub y: f32,
    /// Drawers only: how far the tray is pulled out at reset, in
    /// `[0, TRAY_TRAVEL]`.
    #[serde(default)]
    pub open: f32,
}

impl ObjectSpec {
    /// An object at (x, y) (a drawer closed).
    pub fn new(kind: Kind, colour: Colour, shape: Shape, size: Size, x: f32, y: f32) -> Self {
        ObjectSpec {
            kind,
            colour,
            shape,
            size,
            x,
            y,
            open: 0.0,
        }
    }

    /// Footprint radius (a drawer: half its width).
    pub fn radius(&self) -> f32 {
        dims(self.kind, self.size).0
    }

    /// Height of the object's top above its bottom.
    pub fn height(&self) -> f32 {
        dims(self.kind, self.size).1
    }

    /// How an instruction names it ("small red cube", "white bowl").
    pub fn describe(&self) -> String {
        match self.kind {
            Kind::Block => format!(
                "{} {} {}",
                self.size.as_str(),
                self.colour.as_str(),
                self.shape.as_str()
            ),
            Kind::Drawer => "drawer".into(),
            other => format!("{} {}", self.colour.as_str(), other.as_str()),
        }
    }
}

/// (footprint radius, height) of a kind and size; for a drawer the radius is
/// half the cabinet's width.
pub fn dims(kind: Kind, size: Size) -> (f32, f32) {
    match (kind, size) {
        (Kind::Block, Size::Small) => (0.03, 0.05),
        (Kind::Block, Size::Large) => (0.04, 0.065),
        (Kind::Bowl, Size::Small) => (0.065, 0.05),
        (Kind::Bowl, Size::Large) => (0.08, 0.05),
        (Kind::Plate, Size::Small) => (0.08, PLATE_TOP),
        (Kind::Plate, Size::Large) => (0.095, PLATE_TOP),
        (Kind::Drawer, Size::Small) => (0.12, CABINET_HEIGHT),
        (Kind::Drawer, Size::Large) => (0.14, CABINET_HEIGHT),
    }
}

/// What a task asks for; a task's goals must all hold at the same step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Goal {
    /// `object` rests in/on `target` (a bowl, a plate or a drawer's tray),
    /// not held.
    PlaceIn {
        /// Index of the object to move.
        object: usize,
        /// Index of the receptacle.
        target: usize,
    },
    /// `object` rests on the table on `side` of `anchor`, within reach:
    /// gap between footprints at most 0.1, off-axis offset at most 0.06.
    NextTo {
        /// Index of the object to move.
        object: usize,
        /// Index of the reference object.
        anchor: usize,
        /// The side.
        side: Side,
    },
    /// The drawer is at least 80 % open.
    OpenDrawer {
        /// Index of the drawer.
        drawer: usize,
    },
    /// The drawer is closed (tray out by at most 0.01).
    CloseDrawer {
        /// Index of the drawer.
        drawer: usize,
    },
}

impl Goal {
    /// The object the goal moves (for the "ever grasped" record), if any.
    pub fn moved_object(&self) -> Option<usize> {
        match *self {
            Goal::PlaceIn { object, .. } | Goal::NextTo { object, .. } => Some(object),
            Goal::OpenDrawer { .. } | Goal::CloseDrawer { .. } => None,
        }
    }
}

/// A task: the scene, the goals and the words, plus the generator key that
/// produced it (`suite`, `split`, `seed`, `index`, `run`). A world is built
/// from it exactly; it is what a tasks-table row stores.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Suite name (`spatial`, `object`, `goal`, `long`).
    pub suite: String,
    /// Split name (`train`, `val`, `unseen`).
    pub split: String,
    /// The generator's seed.
    pub seed: u64,
    /// Index of the task within (suite, split, seed).
    pub index: u64,
    /// Layout draw: 0 is the task as generated, k > 0 the same goal in
    /// another layout (evaluation averages over runs); for an initial
    /// state, k > 0 is another draw from the same regions.
    #[serde(default)]
    pub run: u32,
    /// Under LIBERO's protocol ([`crate::suite::initial_state`]): the index
    /// of this initial state within its split (`train`, `val` or `test`),
    /// the task's objects each moved within its region; `None` for a task
    /// as the layouts protocol draws it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<u32>,
    /// Task family (`place_in_bowl`, `open_drawer`, `in_bowl_then_on_plate`, ...).
    pub task_type: String,
    /// The instruction in words.
    pub instruction: String,
    /// The objects.
    pub objects: Vec<ObjectSpec>,
    /// The goals, all of which must hold at once.
    pub goals: Vec<Goal>,
    /// Episode length limit in control steps; reaching it is a failure.
    pub max_steps: u32,
    /// How the camera samples the scene (`point` when absent).
    #[serde(default, skip_serializing_if = "Camera::is_point")]
    pub camera: Camera,
}

/// How the camera turns the scene into pixels.
///
/// - `point`: a pixel shows what lies under its centre, so an edge moves
///   a whole pixel at a time and a 32 px frame places a block to within
///   about a third of a pixel (0.01 of the table) at best.
/// - `area`: a pixel is the mean colour over its square, as a sensor
///   integrates light; an edge moving by a tenth of a pixel changes the
///   pixels it crosses by a tenth of the contrast, so positions can be read
///   to a fraction of a pixel. Parts are drawn at their true size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Camera {
    /// A pixel shows what lies under its centre.
    #[default]
    Point,
    /// A pixel is the mean colour over its square (8 × 8 samples).
    Area,
}

impl Camera {
    /// Whether this is the default, point-sampling camera.
    pub fn is_point(&self) -> bool {
        *self == Camera::Point
    }
}

/// `tabletop-<suite>/<split>/<seed>/<index, six digits>`.
pub fn task_id_of(suite: &str, split: &str, seed: u64, index: u64) -> String {
    format!("tabletop-{suite}/{split}/{seed}/{index:06}")
}

/// An initial state's id: `tabletop-<suite>/<seed>/<index, six
/// digits>@<split>/<state, four digits>` (the task before `@`, see
/// `TaskRow::task_key`).
pub fn state_id_of(suite: &str, split: &str, seed: u64, index: u64, state: u32) -> String {
    format!(
        "tabletop-{suite}/{seed}/{index:06}{}{split}/{state:04}",
        embodyflow_core::schemas::INITIAL_STATE_SEPARATOR
    )
}

impl TaskSpec {
    /// The task id: `tabletop-<suite>/<split>/<seed>/<index>` (index with six
    /// digits); an initial state's reads
    /// `tabletop-<suite>/<seed>/<index>@<split>/<state>` (state with four
    /// digits), so the rows of one task share the part before `@`.
    pub fn task_id(&self) -> String {
        match self.state {
            Some(state) => state_id_of(&self.suite, &self.split, self.seed, self.index, state),
            None => task_id_of(&self.suite, &self.split, self.seed, self.index),
        }
    }

    /// Checks that a world can be built from the task: 2–6 objects, finite
    /// coordinates on the table, at most one drawer, no two footprints
    /// overlapping, goals that name existing objects of fitting kinds, a
    /// non-empty instruction and `max_steps` ≥ 1.
    pub fn validate(&self) -> Result<(), TabletopError> {
        let bad = |reason: String| TabletopError::BadTask {
            task: self.task_id(),
            reason,
        };
        let n = self.objects.len();
        if !(MIN_OBJECTS..=MAX_OBJECTS).contains(&n) {
            return Err(bad(format!(
                "{n} objects, expected {MIN_OBJECTS} to {MAX_OBJECTS}"
            )));
        }
        if self.instruction.trim().is_empty() {
            return Err(bad("the instruction is empty".into()));
        }
        if self.max_steps == 0 {
            return Err(bad("max_steps is 0".into()));
        }
        if self.goals.is_empty() {
            return Err(bad("no goal".into()));
        }
        let mut drawers = 0;
        for (i, o) in self.objects.iter().enumerate() {
            for (name, v) in [("x", o.x), ("y", o.y), ("open", o.open)] {
                if !v.is_finite() {
                    return Err(bad(format!("object {i}: {name} is {v}, not finite")));
                }
            }
            let (lo, hi) = footprint(o);
            if lo[0] < 0.0 || lo[1] < 0.0 || hi[0] > 1.0 || hi[1] > 1.0 {
                return Err(bad(format!(
                    "object {i} ({}) at ({}, {}) reaches off the table",
                    o.describe(),
                    o.x,
                    o.y
                )));
            }
            if o.kind == Kind::Drawer {
                drawers += 1;
                if !(0.0..=TRAY_TRAVEL).contains(&o.open) {
                    return Err(bad(format!(
                        "object {i} (drawer): open {} outside [0, {TRAY_TRAVEL}]",
                        o.open
                    )));
                }
                let tray_front = o.y - CABINET_DEPTH / 2.0 - o.open;
                if tray_front - HANDLE_OFFSET < 0.0 {
                    return Err(bad(format!(
                        "object {i} (drawer): its open tray reaches off the table"
                    )));
                }
            } else if o.open != 0.0 {
                return Err(bad(format!(
                    "object {i} ({}): `open` is only for drawers",
                    o.describe()
                )));
            }
        }
        if drawers > 1 {
            return Err(bad(format!("{drawers} drawers, at most one")));
        }
        for i in 0..n {
            for j in i + 1..n {
                if overlap(&self.objects[i], &self.objects[j]) {
                    return Err(bad(format!(
                        "objects {i} ({}) and {j} ({}) overlap",
                        self.objects[i].describe(),
                        self.objects[j].describe()
                    )));
                }
            }
        }
        for (g, goal) in self.goals.iter().enumerate() {
            let kind_of = |i: usize| -> Result<Kind, TabletopError> {
                self.objects
                    .get(i)
                    .map(|o| o.kind)
                    .ok_or_else(|| bad(format!("goal {g} names object {i}; the scene has {n}")))
            };
            let ok = match *goal {
                Goal::PlaceIn { object, target } => {
                    let (o, t) = (kind_of(object)?, kind_of(target)?);
                    object != target
                        && match t {
                            Kind::Bowl | Kind::Drawer => o == Kind::Block,
                            Kind::Plate => o.movable(),
                            Kind::Block => false,
                        }
                }
                Goal::NextTo { object, anchor, .. } => {
                    kind_of(object)?.movable()
                        && kind_of(anchor)? != Kind::Drawer
                        && object != anchor
                }
                Goal::OpenDrawer { drawer } | Goal::CloseDrawer { drawer } => {
                    kind_of(drawer)? == Kind::Drawer
                }
            };
            if !ok {
                return Err(bad(format!(
                    "goal {g} ({goal:?}) does not fit the objects' kinds"
                )));
            }
        }
        Ok(())
    }
}

/// Axis-aligned footprint of an object (a drawer: cabinet plus open tray).
pub(crate) fn footprint(o: &ObjectSpec) -> ([f32; 2], [f32; 2]) {
    let r = o.radius();
    if o.kind == Kind::Drawer {
        let front = o.y - CABINET_DEPTH / 2.0 - o.open;
        ([o.x - r, front], [o.x + r, o.y + CABINET_DEPTH / 2.0])
    } else {
        ([o.x - r, o.y - r], [o.x + r, o.y + r])
    }
}

/// Whether two objects' footprints overlap (discs; a drawer's box, including
/// the reach of its tray when fully open).
pub(crate) fn overlap(a: &ObjectSpec, b: &ObjectSpec) -> bool {
    match (a.kind == Kind::Drawer, b.kind == Kind::Drawer) {
        (false, false) => {
            let (dx, dy) = (a.x - b.x, a.y - b.y);
            let r = a.radius() + b.radius();
            dx * dx + dy * dy < r * r
        }
        (true, true) => true,
        (true, false) => disc_hits_drawer_zone(b, a),
        (false, true) => disc_hits_drawer_zone(a, b),
    }
}

fn disc_hits_drawer_zone(disc: &ObjectSpec, drawer: &ObjectSpec) -> bool {
    let r = drawer.radius();
    let lo = [
        drawer.x - r,
        drawer.y - CABINET_DEPTH / 2.0 - TRAY_TRAVEL - HANDLE_OFFSET,
    ];
    let hi = [drawer.x + r, drawer.y + CABINET_DEPTH / 2.0];
    let cx = disc.x.clamp(lo[0], hi[0]);
    let cy = disc.y.clamp(lo[1], hi[1]);
    let (dx, dy) = (disc.x - cx, disc.y - cy);
    let rr = disc.radius();
    dx * dx + dy * dy < rr * rr
}
