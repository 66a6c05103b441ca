//! The world's state and its kinematics: a gripper over the table, the
//! objects, one control step per action, the success predicate and the
//! proprio vector.
//!
//! **Actions.** `[dx, dy, dz, grip]`, each in `[-1, 1]` (anything else, or a
//! non-finite value, is [`TabletopError::ActionOutOfRange`]). One step moves
//! the gripper by `(dx, dy) * MAX_DXY` and `dz * MAX_DZ` (0.05 table units
//! each; the table is 1 × 1), clamped to the table and to heights
//! `[0, Z_MAX]`; `grip > 0` closes the gripper, `grip <= 0` opens it. The
//! gripper command is applied first, then the motion.
//!
//! **Kinematics rules** (rigid, positional; no velocities, no friction):
//! 1. *Grasp.* Closing an open gripper grasps the highest movable object
//!    (block or bowl) whose height range contains the fingertips
//!    (`z` between the object's bottom and top) and whose centre lies within
//!    0.7 × its radius of the gripper; failing that, the drawer's handle
//!    when within 0.035 and `z <= 0.12`; failing that it closes on nothing.
//! 2. *Carry.* A grasped object keeps its offset to the gripper (its bottom
//!    never below the table); whatever rests in it moves with it.
//! 3. *Handle.* While the handle is held, only `dy` acts: it slides the
//!    tray (out for −y) within `[0, TRAY_TRAVEL]`, with its contents, and
//!    the gripper follows the handle.
//! 4. *Push.* A gripper below an object's top that moves into it — its
//!    centre was at least `radius + GRIPPER_RADIUS` (the reach) away, came
//!    closer and is now within the reach — pushes it out along the line
//!    between the centres to the reach; motion is resolved in sub-steps of
//!    0.02, so a full step never jumps past an object. Fingers lowered
//!    around or beside an object (inside its reach) push nothing until they
//!    have left and come back. Only objects resting on the table or a plate are pushed;
//!    a pushed object pushes the objects it then overlaps (three passes),
//!    stays on the table and out of the cabinet, and rests on a plate when
//!    its centre ends over one. A low gripper moving +y into the open tray's
//!    front pushes the drawer closed. The cabinet body stops a gripper
//!    below its top. Only the fingers push: a carried object passes over
//!    (or through) what it meets.
//! 5. *Release.* Opening the gripper drops the object where it is, onto
//!    the first receptacle under its centre: a bowl (blocks; snapped to the
//!    bowl's centre), the open tray (blocks, when it is open wider than the
//!    block), the cabinet's top, a plate, else the table; then overlaps are
//!    resolved as for pushes.
//!
//! **Episode.** The task's goals must hold at the same step
//! ([`World::step`] reports success and ends the episode); after
//! `max_steps` steps without success the episode ends as a failure, which
//! is an outcome, not an error. Stepping an ended episode is
//! [`TabletopError::EpisodeOver`].
//!
//! **Proprio** ([`World::proprio`], `PROPRIO_DIM` = 5):
//! `[x, y, z, closed, holding]` — gripper position (table units), 1.0 when
//! the gripper is closed, 1.0 when it holds an object or the handle.
//!
//! ```
//! use embodyflow_tabletop::{Split, Suite, World, generate};
//! let task = generate(Suite::Goal, Split::Train, 7, 0);
//! let mut world = World::new(&task).unwrap();
//! let out = world.step(&[0.5, -0.2, -1.0, -1.0]).unwrap();
//! assert_eq!(out.steps, 1);
//! assert!(world.step(&[2.0, 0.0, 0.0, 0.0]).is_err());
//! ```

use crate::TabletopError;
use crate::scene::{
    CABINET_DEPTH, CABINET_HEIGHT, Camera, Colour, Goal, HANDLE_OFFSET, Kind, PLATE_TOP, Shape,
    Size, TRAY_FLOOR, TRAY_TRAVEL, TaskSpec, dims,
};

/// Action dimensions: `[dx, dy, dz, grip]`.
pub const ACTION_DIM: usize = 4;
/// Proprio dimensions: `[x, y, z, closed, holding]`.
pub const PROPRIO_DIM: usize = 5;
/// Horizontal displacement of a full-scale action per step.
pub const MAX_DXY: f32 = 0.05;
/// Vertical displacement of a full-scale action per step.
pub const MAX_DZ: f32 = 0.05;
/// Highest gripper height.
pub const Z_MAX: f32 = 0.3;
/// Radius of the gripper's fingers' footprint.
pub const GRIPPER_RADIUS: f32 = 0.02;
/// Gripper position at reset (open).
pub const GRIPPER_START: [f32; 3] = [0.5, 0.12, 0.25];
/// A grasp needs the object's centre within this fraction of its radius.
pub const GRASP_FRACTION: f32 = 0.7;
/// A grasp of the handle needs the gripper this close to it.
pub const HANDLE_REACH: f32 = 0.035;
/// A grasp of the handle needs the gripper at most this high.
pub const HANDLE_MAX_Z: f32 = 0.12;
/// Longest gripper motion resolved as one push sub-step (below the
/// smallest reach, 0.05, so no step jumps past an object's centre).
const PUSH_SUBSTEP: f32 = 0.02;
/// No pushable object reaches this high (a large block on a plate: 0.075).
const PUSH_CEILING: f32 = 0.08;
/// A gripper this close inside an object's reach still counts as touching
/// it from outside (float error of the previous push).
const CONTACT_SLACK: f32 = 1e-4;
/// The open tray's front face pushes back a gripper below this height.
const TRAY_WALL: f32 = 0.08;
/// Height of a bowl's inner floor above its bottom.
const BOWL_FLOOR: f32 = 0.01;
/// The drawer counts as open from this fraction of its travel.
const OPEN_FRACTION: f32 = 0.8;
/// The drawer counts as closed up to this much travel.
const CLOSED_TRAVEL: f32 = 0.01;

/// What an object rests on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// The table top.
    Table,
    /// In or on object `k`: a bowl, a plate or a drawer's tray.
    On(usize),
    /// On top of the cabinet of drawer `k`.
    Top(usize),
    /// In the gripper.
    Held,
}

/// The gripper's fingers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Grip {
    /// Open.
    Open,
    /// Closed on nothing.
    Closed,
    /// Closed on object `index`, which keeps `offset` (object − gripper in
    /// x, y; gripper − object bottom in z).
    Object {
        /// The grasped object.
        index: usize,
        /// Its offset.
        offset: [f32; 3],
    },
    /// Closed on drawer `drawer`'s handle.
    Handle {
        /// The drawer.
        drawer: usize,
    },
}

/// An object's state.
#[derive(Clone, Debug, PartialEq)]
pub struct Body {
    /// What it is.
    pub kind: Kind,
    /// Colour.
    pub colour: Colour,
    /// Shape.
    pub shape: Shape,
    /// Size.
    pub size: Size,
    /// Footprint radius (a drawer: half the cabinet's width).
    pub radius: f32,
    /// Height.
    pub height: f32,
    /// Centre on the table.
    pub pos: [f32; 2],
    /// Height of its bottom above the table.
    pub z: f32,
    /// What it rests on.
    pub support: Support,
    /// Drawers: how far the tray is out.
    pub open: f32,
}

impl Body {
    fn top(&self) -> f32 {
        self.z + self.height
    }

    /// Drawers: y of the cabinet body's front face.
    fn body_front(&self) -> f32 {
        self.pos[1] - CABINET_DEPTH / 2.0
    }

    /// Drawers: the handle's position on the table.
    pub fn handle(&self) -> [f32; 2] {
        [self.pos[0], self.body_front() - self.open - HANDLE_OFFSET]
    }

    /// Drawers: whether `p` lies over the cabinet body.
    fn over_body(&self, p: [f32; 2]) -> bool {
        (p[0] - self.pos[0]).abs() <= self.radius
            && (p[1] - self.pos[1]).abs() <= CABINET_DEPTH / 2.0
    }

    /// Drawers: the tray's inner rectangle as it is pulled out now
    /// (`lo`, `hi`).
    pub fn tray(&self) -> ([f32; 2], [f32; 2]) {
        let front = self.body_front();
        (
            [self.pos[0] - self.radius + 0.02, front - self.open],
            [self.pos[0] + self.radius - 0.02, front],
        )
    }
}

/// The gripper's state.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gripper {
    /// Position: x, y on the table, z above it (fingertips).
    pub pos: [f32; 3],
    /// Fingers.
    pub grip: Grip,
}

/// Where an episode stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Still running.
    Running,
    /// The goals held: success.
    Success,
    /// `max_steps` reached without success: failure.
    TimedOut,
}

/// What one step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepOutcome {
    /// Steps taken in the episode so far.
    pub steps: u32,
    /// Whether the goals hold now.
    pub success: bool,
    /// Whether the episode has ended (success or `max_steps`).
    pub done: bool,
}

/// A running episode of one task.
#[derive(Clone, Debug, PartialEq)]
pub struct World {
    task_id: String,
    instruction: String,
    bodies: Vec<Body>,
    gripper: Gripper,
    goals: Vec<Goal>,
    drawer: Option<usize>,
    max_steps: u32,
    camera: Camera,
    steps: u32,
    status: Status,
    grasped: u8,
    targets: u8,
}

impl World {
    /// The task's initial state (a clear error when the task cannot be
    /// built: see [`TaskSpec::validate`]).
    pub fn new(task: &TaskSpec) -> Result<World, TabletopError> {
        task.validate()?;
        let mut bodies = Vec::with_capacity(task.objects.len());
        for o in &task.objects {
            let (radius, height) = dims(o.kind, o.size);
            bodies.push(Body {
                kind: o.kind,
                colour: o.colour,
                shape: o.shape,
                size: o.size,
                radius,
                height,
                pos: [o.x, o.y],
                z: 0.0,
                support: Support::Table,
                open: o.open,
            });
        }
        let mut world = World {
            task_id: task.task_id(),
            instruction: task.instruction.clone(),
            drawer: bodies.iter().position(|b| b.kind == Kind::Drawer),
            bodies,
            gripper: Gripper {
                pos: GRIPPER_START,
                grip: Grip::Open,
            },
            targets: task
                .goals
                .iter()
                .filter_map(Goal::moved_object)
                .fold(0, |m, i| m | (1 << i)),
            goals: task.goals.clone(),
            max_steps: task.max_steps,
            camera: task.camera,
            steps: 0,
            status: Status::Running,
            grasped: 0,
        };
        for i in 0..world.bodies.len() {
            if world.bodies[i].kind.movable() {
                world.bodies[i].support = world.plate_under(i).map_or(Support::Table, Support::On);
            }
        }
        world.update_heights();
        Ok(world)
    }

    /// Applies one action (see the module doc); a bad action changes nothing.
    pub fn step(&mut self, action: &[f32]) -> Result<StepOutcome, TabletopError> {
        if action.len() != ACTION_DIM {
            return Err(TabletopError::ActionLength {
                expected: ACTION_DIM,
                found: action.len(),
            });
        }
        for (dim, &value) in action.iter().enumerate() {
            if !(-1.0..=1.0).contains(&value) {
                return Err(TabletopError::ActionOutOfRange {
                    dim,
                    name: ["dx", "dy", "dz", "grip"][dim],
                    value,
                });
            }
        }
        if self.status != Status::Running {
            return Err(TabletopError::EpisodeOver {
                task: self.task_id.clone(),
                steps: self.steps,
            });
        }
        self.apply([action[0], action[1], action[2], action[3]]);
        self.steps += 1;
        let success = self.success();
        if success {
            self.status = Status::Success;
        } else if self.steps >= self.max_steps {
            self.status = Status::TimedOut;
        }
        Ok(StepOutcome {
            steps: self.steps,
            success,
            done: self.status != Status::Running,
        })
    }

    /// Whether every goal holds now.
    pub fn success(&self) -> bool {
        self.goals.iter().all(|g| self.holds(g))
    }

    /// Whether one goal holds now.
    pub fn holds(&self, goal: &Goal) -> bool {
        match *goal {
            Goal::PlaceIn { object, target } => self.bodies[object].support == Support::On(target),
            Goal::NextTo {
                object,
                anchor,
                side,
            } => {
                let (o, a) = (&self.bodies[object], &self.bodies[anchor]);
                let resting = match o.support {
                    Support::Table => true,
                    Support::On(k) => self.bodies[k].kind == Kind::Plate && k != anchor,
                    Support::Top(_) | Support::Held => false,
                };
                let dir = side.direction();
                let d = [o.pos[0] - a.pos[0], o.pos[1] - a.pos[1]];
                let along = d[0] * dir[0] + d[1] * dir[1];
                let perp = (d[0] * dir[1] - d[1] * dir[0]).abs();
                let gap = along - o.radius - a.radius;
                resting && (-0.005..=0.1).contains(&gap) && perp <= 0.06
            }
            Goal::OpenDrawer { drawer } => self.bodies[drawer].open >= OPEN_FRACTION * TRAY_TRAVEL,
            Goal::CloseDrawer { drawer } => self.bodies[drawer].open <= CLOSED_TRAVEL,
        }
    }

    /// `[x, y, z, closed, holding]`.
    pub fn proprio(&self) -> [f32; PROPRIO_DIM] {
        let p = self.gripper.pos;
        let (closed, holding) = match self.gripper.grip {
            Grip::Open => (0.0, 0.0),
            Grip::Closed => (1.0, 0.0),
            Grip::Object { .. } | Grip::Handle { .. } => (1.0, 1.0),
        };
        [p[0], p[1], p[2], closed, holding]
    }

    /// The task's id.
    pub fn task_id(&self) -> &str {
        &self.task_id
    }

    /// The instruction in words.
    pub fn instruction(&self) -> &str {
        &self.instruction
    }

    /// The objects, in the task's order.
    pub fn bodies(&self) -> &[Body] {
        &self.bodies
    }

    /// The gripper.
    pub fn gripper(&self) -> &Gripper {
        &self.gripper
    }

    /// How the camera samples the scene.
    pub fn camera(&self) -> Camera {
        self.camera
    }

    /// The task's goals.
    pub fn goals(&self) -> &[Goal] {
        &self.goals
    }

    /// Steps taken.
    pub fn steps(&self) -> u32 {
        self.steps
    }

    /// The step limit.
    pub fn max_steps(&self) -> u32 {
        self.max_steps
    }

    /// Where the episode stands.
    pub fn status(&self) -> Status {
        self.status
    }

    /// Whether object `i` has been grasped at any step of the episode.
    pub fn ever_grasped(&self, i: usize) -> bool {
        i < 8 && self.grasped & (1 << i) != 0
    }

    /// Where the first goal asks the fingers to close, as things stand now:
    /// the object it moves, or the drawer's handle for a drawer goal. Read
    /// at reset, it is the point a policy that looks at the scene grasps at
    /// (evaluate's grasp slope).
    ///
    /// ```
    /// use embodyflow_tabletop::{Split, Suite, World, generate};
    /// let task = generate(Suite::Spatial, Split::Train, 7, 0);
    /// let world = World::new(&task).unwrap();
    /// let object = task.goals[0].moved_object().unwrap();
    /// assert_eq!(world.grasp_target(), Some(world.bodies()[object].pos));
    /// ```
    pub fn grasp_target(&self) -> Option<[f32; 2]> {
        match *self.goals.first()? {
            Goal::PlaceIn { object, .. } | Goal::NextTo { object, .. } => {
                Some(self.bodies[object].pos)
            }
            Goal::OpenDrawer { drawer } | Goal::CloseDrawer { drawer } => {
                Some(self.bodies[drawer].handle())
            }
        }
    }

    /// Whether an object a goal moves has been grasped at any step (false
    /// for a task that moves none, e.g. opening the drawer).
    pub fn target_ever_grasped(&self) -> bool {
        self.grasped & self.targets != 0
    }

    /// Every field of the state, encoded exactly (floats by their bits,
    /// strings and lists length-prefixed, enums by tag): two worlds give
    /// equal bytes exactly when they are equal, step count and grasp history
    /// included (so also the time left and what they can still achieve).
    /// Hashed, it keys GiGPO's anchor states (`anchor_key` in the steps
    /// table): the G copies of a task start with equal bytes, and copies
    /// that took different actions part.
    pub fn state_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(64 + 48 * self.bodies.len());
        let text = |out: &mut Vec<u8>, s: &str| {
            out.extend((s.len() as u64).to_le_bytes());
            out.extend(s.as_bytes());
        };
        let float = |out: &mut Vec<u8>, x: f32| out.extend(x.to_bits().to_le_bytes());
        let index = |out: &mut Vec<u8>, i: usize| out.extend((i as u64).to_le_bytes());
        text(&mut out, &self.task_id);
        text(&mut out, &self.instruction);
        index(&mut out, self.bodies.len());
        for b in &self.bodies {
            // The enums' Debug names are their variant names.
            text(
                &mut out,
                &format!("{:?}/{:?}/{:?}/{:?}", b.kind, b.colour, b.shape, b.size),
            );
            for x in [b.radius, b.height, b.pos[0], b.pos[1], b.z, b.open] {
                float(&mut out, x);
            }
            let (tag, k) = match b.support {
                Support::Table => (0u8, 0),
                Support::On(k) => (1, k),
                Support::Top(k) => (2, k),
                Support::Held => (3, 0),
            };
            out.push(tag);
            index(&mut out, k);
        }
        for x in self.gripper.pos {
            float(&mut out, x);
        }
        match self.gripper.grip {
            Grip::Open => out.push(0),
            Grip::Closed => out.push(1),
            Grip::Object { index: i, offset } => {
                out.push(2);
                index(&mut out, i);
                for x in offset {
                    float(&mut out, x);
                }
            }
            Grip::Handle { drawer } => {
                out.push(3);
                index(&mut out, drawer);
            }
        }
        index(&mut out, self.goals.len());
        for goal in &self.goals {
            text(&mut out, &format!("{goal:?}"));
        }
        out.extend(self.drawer.map_or(u64::MAX, |d| d as u64).to_le_bytes());
        out.extend(self.max_steps.to_le_bytes());
        out.extend(self.steps.to_le_bytes());
        out.push(match self.status {
            Status::Running => 0,
            Status::Success => 1,
            Status::TimedOut => 2,
        });
        out.push(self.grasped);
        out.push(self.targets);
        out
    }

    fn apply(&mut self, a: [f32; 4]) {
        let close = a[3] > 0.0;
        match (close, self.gripper.grip) {
            (true, Grip::Open) => self.gripper.grip = self.try_grasp(),
            (false, Grip::Object { index, .. }) => {
                self.gripper.grip = Grip::Open;
                self.release(index);
            }
            (false, _) => self.gripper.grip = Grip::Open,
            (true, _) => {}
        }
        let d = [a[0] * MAX_DXY, a[1] * MAX_DXY, a[2] * MAX_DZ];
        if let Grip::Handle { drawer } = self.gripper.grip {
            self.slide_tray(drawer, -d[1]);
            let h = self.bodies[drawer].handle();
            self.gripper.pos[0] = h[0];
            self.gripper.pos[1] = h[1];
        } else {
            self.move_gripper(d);
        }
        self.update_heights();
    }

    fn try_grasp(&mut self) -> Grip {
        let g = self.gripper.pos;
        let mut best: Option<(usize, f32)> = None;
        for (j, b) in self.bodies.iter().enumerate() {
            if !b.kind.movable() || b.support == Support::Held {
                continue;
            }
            if g[2] > b.top() || g[2] < b.z - 0.005 {
                continue;
            }
            if dist(b.pos, [g[0], g[1]]) > GRASP_FRACTION * b.radius {
                continue;
            }
            if best.is_none_or(|(_, z)| b.z > z) {
                best = Some((j, b.z));
            }
        }
        if let Some((j, _)) = best {
            let b = &mut self.bodies[j];
            b.support = Support::Held;
            self.grasped |= 1 << j;
            return Grip::Object {
                index: j,
                offset: [b.pos[0] - g[0], b.pos[1] - g[1], (g[2] - b.z).max(0.0)],
            };
        }
        if let Some(k) = self.drawer {
            let h = self.bodies[k].handle();
            if g[2] <= HANDLE_MAX_Z && dist(h, [g[0], g[1]]) <= HANDLE_REACH {
                return Grip::Handle { drawer: k };
            }
        }
        Grip::Closed
    }

    fn move_gripper(&mut self, d: [f32; 3]) {
        let old = self.gripper.pos;
        let floor = match self.gripper.grip {
            Grip::Object { offset, .. } => offset[2],
            _ => 0.0,
        };
        let mut z = (old[2] + d[2]).clamp(floor.min(Z_MAX), Z_MAX);
        let mut xy = [
            (old[0] + d[0]).clamp(0.0, 1.0),
            (old[1] + d[1]).clamp(0.0, 1.0),
        ];
        if let Some(k) = self.drawer {
            let cab = &self.bodies[k];
            if cab.over_body([old[0], old[1]]) {
                z = z.max(CABINET_HEIGHT);
            }
            if z < CABINET_HEIGHT && cab.over_body(xy) {
                let (x_only, y_only) = ([xy[0], old[1]], [old[0], xy[1]]);
                xy = if !cab.over_body(x_only) {
                    x_only
                } else if !cab.over_body(y_only) {
                    y_only
                } else {
                    [old[0], old[1]]
                };
            }
        }
        self.gripper.pos = [xy[0], xy[1], z];
        self.push_along(old, self.gripper.pos);
        self.push_tray(old, self.gripper.pos);
        if let Grip::Object { index, offset } = self.gripper.grip {
            let b = &self.bodies[index];
            let target = [
                (xy[0] + offset[0]).clamp(b.radius, 1.0 - b.radius),
                (xy[1] + offset[1]).clamp(b.radius, 1.0 - b.radius),
            ];
            self.translate(index, [target[0] - b.pos[0], target[1] - b.pos[1]]);
        }
    }

    /// Rule 4: the fingers push the objects they move into, resolved in
    /// sub-steps of at most `PUSH_SUBSTEP` so that a full step never jumps
    /// past an object's centre.
    fn push_along(&mut self, old: [f32; 3], new: [f32; 3]) {
        if old[2].min(new[2]) >= PUSH_CEILING {
            return;
        }
        let length = dist([old[0], old[1]], [new[0], new[1]]);
        let n = ((length / PUSH_SUBSTEP).ceil() as usize).max(1);
        let mut prev = [old[0], old[1]];
        for s in 1..=n {
            let t = s as f32 / n as f32;
            let at = [
                old[0] + (new[0] - old[0]) * t,
                old[1] + (new[1] - old[1]) * t,
            ];
            let z = old[2] + (new[2] - old[2]) * t;
            self.push_objects(prev, at, z);
            prev = at;
        }
    }

    /// One sub-step of rule 4.
    fn push_objects(&mut self, old: [f32; 2], new: [f32; 2], z: f32) {
        let mut moved = 0u8;
        for j in 0..self.bodies.len() {
            if !self.pushable(j) {
                continue;
            }
            let b = &self.bodies[j];
            if z >= b.top() {
                continue;
            }
            let reach = b.radius + GRIPPER_RADIUS;
            let (nd, od) = (dist(b.pos, new), dist(b.pos, old));
            // Only a gripper that was outside (or just touching) and came
            // closer pushes: fingers lowered around or beside an object
            // leave it where it is.
            if nd >= reach || nd >= od || od < reach - CONTACT_SLACK {
                continue;
            }
            let dir = [
                (b.pos[0] - new[0]) / nd.max(1e-6),
                (b.pos[1] - new[1]) / nd.max(1e-6),
            ];
            let push = reach - nd;
            self.translate(j, [dir[0] * push, dir[1] * push]);
            moved |= 1 << j;
        }
        if moved != 0 {
            self.settle(moved);
        }
    }

    /// A low gripper moving +y into the open tray's front closes it.
    fn push_tray(&mut self, old: [f32; 3], new: [f32; 3]) {
        let Some(k) = self.drawer else { return };
        let cab = &self.bodies[k];
        if cab.open <= 0.0 || new[2] >= TRAY_WALL || (new[0] - cab.pos[0]).abs() > cab.radius {
            return;
        }
        let face = cab.handle()[1];
        if old[1] + GRIPPER_RADIUS <= face + 1e-4 && new[1] + GRIPPER_RADIUS > face {
            let push = new[1] + GRIPPER_RADIUS - face;
            self.slide_tray(k, -push);
        }
    }

    /// Moves the tray by `delta` (positive: out), clamped, with its contents.
    fn slide_tray(&mut self, k: usize, delta: f32) {
        let cab = &mut self.bodies[k];
        let open = (cab.open + delta).clamp(0.0, TRAY_TRAVEL);
        let moved = open - cab.open;
        cab.open = open;
        if moved != 0.0 {
            for j in 0..self.bodies.len() {
                if self.bodies[j].support == Support::On(k) {
                    self.translate(j, [0.0, -moved]);
                }
            }
        }
    }

    /// Moves object `i` and everything resting in/on it.
    fn translate(&mut self, i: usize, d: [f32; 2]) {
        self.bodies[i].pos[0] += d[0];
        self.bodies[i].pos[1] += d[1];
        if self.bodies[i].kind == Kind::Bowl {
            for j in 0..self.bodies.len() {
                if self.bodies[j].support == Support::On(i) {
                    self.translate(j, d);
                }
            }
        }
    }

    /// Objects the fingers can push: movable ones resting on the table or
    /// on a plate.
    fn pushable(&self, j: usize) -> bool {
        let b = &self.bodies[j];
        b.kind.movable()
            && match b.support {
                Support::Table => true,
                Support::On(k) => self.bodies[k].kind == Kind::Plate,
                Support::Top(_) | Support::Held => false,
            }
    }

    /// Resolves the overlaps of the objects in `moved` with the table's
    /// edges, the cabinet and each other (three passes), then sets what each
    /// moved object rests on.
    fn settle(&mut self, mut moved: u8) {
        let n = self.bodies.len();
        for _ in 0..3 {
            let mut again = 0u8;
            for j in 0..n {
                if moved & (1 << j) == 0 || !self.pushable(j) {
                    continue;
                }
                self.keep_on_table(j);
                for k in 0..n {
                    if k == j || !self.pushable(k) {
                        continue;
                    }
                    let (a, b) = (&self.bodies[j], &self.bodies[k]);
                    let reach = a.radius + b.radius;
                    let d = dist(a.pos, b.pos);
                    if d >= reach {
                        continue;
                    }
                    let dir = if d > 1e-6 {
                        [(b.pos[0] - a.pos[0]) / d, (b.pos[1] - a.pos[1]) / d]
                    } else {
                        [1.0, 0.0]
                    };
                    let push = reach - d;
                    self.translate(k, [dir[0] * push, dir[1] * push]);
                    self.keep_on_table(k);
                    again |= 1 << k;
                }
            }
            for j in 0..n {
                if (moved | again) & (1 << j) != 0 && self.pushable(j) {
                    self.bodies[j].support =
                        self.plate_under(j).map_or(Support::Table, Support::On);
                }
            }
            moved = again;
            if moved == 0 {
                break;
            }
        }
    }

    /// Keeps object `j`'s footprint on the table and out of the cabinet (and
    /// its open tray).
    fn keep_on_table(&mut self, j: usize) {
        let r = self.bodies[j].radius;
        let mut p = self.bodies[j].pos;
        p[0] = p[0].clamp(r, 1.0 - r);
        p[1] = p[1].clamp(r, 1.0 - r);
        if let Some(k) = self.drawer {
            let cab = &self.bodies[k];
            let lo = [cab.pos[0] - cab.radius - r, cab.handle()[1] - r];
            let hi = [
                cab.pos[0] + cab.radius + r,
                cab.pos[1] + CABINET_DEPTH / 2.0 + r,
            ];
            if p[0] > lo[0] && p[0] < hi[0] && p[1] > lo[1] && p[1] < hi[1] {
                // Out through the nearest face that keeps it on the table.
                let exits = [
                    (p[0] - lo[0], [lo[0], p[1]]),
                    (hi[0] - p[0], [hi[0], p[1]]),
                    (p[1] - lo[1], [p[0], lo[1]]),
                    (hi[1] - p[1], [p[0], hi[1]]),
                ];
                let on_table =
                    |q: [f32; 2]| q[0] >= r && q[0] <= 1.0 - r && q[1] >= r && q[1] <= 1.0 - r;
                if let Some((_, q)) = exits
                    .iter()
                    .filter(|(_, q)| on_table(*q))
                    .min_by(|a, b| a.0.total_cmp(&b.0))
                {
                    p = *q;
                }
            }
        }
        let d = [p[0] - self.bodies[j].pos[0], p[1] - self.bodies[j].pos[1]];
        if d != [0.0, 0.0] {
            self.translate(j, d);
        }
    }

    /// The plate under object `j`'s centre, if any.
    fn plate_under(&self, j: usize) -> Option<usize> {
        let p = self.bodies[j].pos;
        self.bodies
            .iter()
            .position(|b| b.kind == Kind::Plate && dist(b.pos, p) < b.radius)
    }

    /// Rule 5: object `i` leaves the gripper and comes to rest.
    fn release(&mut self, i: usize) {
        let (kind, r, c) = {
            let b = &self.bodies[i];
            (b.kind, b.radius, b.pos)
        };
        let mut rest = None;
        for (k, b) in self.bodies.iter().enumerate() {
            if k == i || self.inside(k, i) {
                continue;
            }
            let (rank, support) = match b.kind {
                Kind::Bowl if kind == Kind::Block && dist(b.pos, c) < b.radius => {
                    (0, Support::On(k))
                }
                Kind::Drawer => {
                    let (lo, hi) = b.tray();
                    let in_tray = c[0] >= lo[0] && c[0] <= hi[0] && c[1] >= lo[1] && c[1] <= hi[1];
                    if in_tray && kind == Kind::Block && b.open >= 2.0 * r + 0.004 {
                        (1, Support::On(k))
                    } else if b.over_body(c) {
                        (2, Support::Top(k))
                    } else {
                        continue;
                    }
                }
                Kind::Plate if dist(b.pos, c) < b.radius => (3, Support::On(k)),
                _ => continue,
            };
            if rest.is_none_or(|(best, _)| rank < best) {
                rest = Some((rank, support));
            }
        }
        let support = rest.map_or(Support::Table, |(_, s)| s);
        self.bodies[i].support = support;
        match support {
            Support::On(k) if self.bodies[k].kind == Kind::Bowl => {
                let to = self.bodies[k].pos;
                self.translate(i, [to[0] - c[0], to[1] - c[1]]);
            }
            Support::On(k) if self.bodies[k].kind == Kind::Drawer => {
                let (lo, hi) = self.bodies[k].tray();
                let to = [
                    c[0].clamp(lo[0] + r, hi[0] - r),
                    c[1].clamp(lo[1] + r, hi[1] - r),
                ];
                self.translate(i, [to[0] - c[0], to[1] - c[1]]);
            }
            Support::Top(_) => {}
            _ => self.settle(1 << i),
        }
    }

    /// Whether `k` rests, directly or not, in/on `i`.
    fn inside(&self, k: usize, i: usize) -> bool {
        let mut at = k;
        for _ in 0..self.bodies.len() {
            match self.bodies[at].support {
                Support::On(s) if s == i => return true,
                Support::On(s) => at = s,
                _ => return false,
            }
        }
        false
    }

    /// Sets every object's height from what it rests on.
    fn update_heights(&mut self) {
        for i in 0..self.bodies.len() {
            self.bodies[i].z = self.height_of(i, 0);
        }
    }

    fn height_of(&self, i: usize, depth: usize) -> f32 {
        if depth > self.bodies.len() {
            return 0.0;
        }
        match self.bodies[i].support {
            Support::Table => 0.0,
            Support::Top(_) => CABINET_HEIGHT,
            Support::Held => match self.gripper.grip {
                Grip::Object { offset, .. } => (self.gripper.pos[2] - offset[2]).max(0.0),
                _ => 0.0,
            },
            Support::On(k) => match self.bodies[k].kind {
                Kind::Plate => PLATE_TOP,
                Kind::Drawer => TRAY_FLOOR,
                _ => self.height_of(k, depth + 1) + BOWL_FLOOR,
            },
        }
    }
}

/// Euclidean distance on the table.
pub(crate) fn dist(a: [f32; 2], b: [f32; 2]) -> f32 {
    let (dx, dy) = (a[0] - b[0], a[1] - b[1]);
    (dx * dx + dy * dy).sqrt()
}

#[cfg(test)]
mod state_bytes_tests;
