//! The scripted expert: demonstrations for supervised fine-tuning, and the
//! push strategy that shows a task can be solved without grasping.
//!
//! The expert turns each goal into primitives (pick an object, place it in /
//! on a receptacle or at a spot, open or close the drawer, push an object
//! to a point) and each primitive, when it starts, into waypoints computed
//! from the world as it is then. A waypoint is reached by a proportional
//! controller: `a = (target − position) / MAX_D`, scaled down as a whole when
//! a component exceeds 1 (so the gripper moves in straight lines), plus
//! Gaussian noise `N(0, (noise · max|a|)²)` on dx, dy, dz (clamped to
//! [-1, 1]; the grip command is exact): proportional to the commanded
//! motion, so paths wander while the expert still arrives where it aims
//! (within 0.002). A failed grasp restarts its primitive; when the plan
//! is done but a goal does not hold, the expert plans again for the goals
//! that do not hold (at most three times). Everything is deterministic given
//! the world and `seed`.
//!
//! [`demonstration`] records an expert episode as decisions of `k` actions
//! (the frame and proprio at each chunk's start, then the chunk), the
//! supervised data of an action-chunk policy.
//!
//! [`Strategy::Grasp`] picks and places (every goal); [`Strategy::Push`]
//! never closes the gripper on an object: it lowers the gripper behind the
//! object on the line from the object to its target and pushes it there
//! (goals "on a plate" and "next to"; other goals are
//! [`TabletopError::NotPushable`]).
//!
//! ```
//! use embodyflow_tabletop::{Expert, ExpertConfig, Split, Strategy, Suite, World, generate, run_episode};
//! let task = generate(Suite::Object, Split::Train, 7, 3);
//! let mut world = World::new(&task).unwrap();
//! let mut expert = Expert::new(&world, Strategy::Grasp, ExpertConfig::default()).unwrap();
//! let episode = run_episode(&mut world, |w| expert.act(w)).unwrap();
//! assert!(episode.success && episode.target_ever_grasped);
//! ```

use std::collections::VecDeque;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::TabletopError;
use crate::render::frame_len;
use crate::scene::{CABINET_DEPTH, Goal, HANDLE_OFFSET, Kind, Side, TRAY_TRAVEL, TaskSpec};
use crate::suite::next_to_spot;
use crate::world::{
    ACTION_DIM, GRIPPER_RADIUS, Grip, MAX_DXY, MAX_DZ, PROPRIO_DIM, Status, Support, World,
};

/// Travel height: above every object and the cabinet.
const Z_TRAVEL: f32 = 0.25;
/// Gripper height when releasing an object.
const Z_RELEASE: f32 = 0.12;
/// Gripper height when pushing.
const Z_PUSH: f32 = 0.015;
/// Gripper height at the drawer's handle.
const Z_HANDLE: f32 = 0.05;
/// A waypoint is reached when every coordinate is this close.
const TOLERANCE: f32 = 0.002;
/// How often the expert plans again for goals that do not hold.
const REPLANS: u32 = 3;

/// How the expert moves objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Pick and place.
    Grasp,
    /// Push along the table, never grasping an object.
    Push,
}

/// The expert's knobs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExpertConfig {
    /// Standard deviation of the Gaussian noise on dx, dy, dz, relative to
    /// the largest commanded component (0: none).
    pub noise: f32,
    /// Seed of the noise.
    pub seed: u64,
}

impl Default for ExpertConfig {
    fn default() -> Self {
        ExpertConfig {
            noise: 0.0,
            seed: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Primitive {
    Pick(usize),
    PlaceIn(usize),
    PlaceNextTo { anchor: usize, side: Side },
    OpenDrawer(usize),
    CloseDrawer(usize),
    Push { object: usize, to: PushTarget },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum PushTarget {
    Centre(usize),
    NextTo { anchor: usize, side: Side },
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Waypoint {
    /// Move the gripper to a point.
    Move([f32; 3]),
    /// Close (true) or open the gripper, one step.
    Grip(bool),
    /// The gripper must now hold object `i` (else the primitive restarts).
    Holding(usize),
    /// The gripper must now hold drawer `k`'s handle.
    HoldingHandle(usize),
}

/// A scripted expert for one episode.
#[derive(Clone, Debug)]
pub struct Expert {
    strategy: Strategy,
    goals: Vec<Goal>,
    queue: VecDeque<Primitive>,
    current: Option<Primitive>,
    waypoints: Vec<Waypoint>,
    at: usize,
    closed: bool,
    noise: f32,
    rng: ChaCha8Rng,
    replans: u32,
}

impl Expert {
    /// An expert for `world`'s task; the push strategy refuses a task with
    /// a goal it cannot push.
    pub fn new(
        world: &World,
        strategy: Strategy,
        config: ExpertConfig,
    ) -> Result<Expert, TabletopError> {
        if !(config.noise.is_finite() && config.noise >= 0.0) {
            return Err(TabletopError::BadNoise(config.noise));
        }
        let goals = world.goals().to_vec();
        let mut expert = Expert {
            strategy,
            goals,
            queue: VecDeque::new(),
            current: None,
            waypoints: Vec::with_capacity(8),
            at: 0,
            closed: false,
            noise: config.noise,
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            replans: 0,
        };
        let all: Vec<Goal> = expert.goals.clone();
        expert.plan(world, &all)?;
        Ok(expert)
    }

    fn plan(&mut self, world: &World, goals: &[Goal]) -> Result<(), TabletopError> {
        let not_pushable = |goal: &Goal| TabletopError::NotPushable {
            task: world.task_id().to_string(),
            goal: format!("{goal:?}"),
        };
        for goal in goals {
            match (*goal, self.strategy) {
                (Goal::OpenDrawer { drawer }, Strategy::Grasp) => {
                    self.queue.push_back(Primitive::OpenDrawer(drawer));
                }
                (Goal::OpenDrawer { .. }, Strategy::Push) => return Err(not_pushable(goal)),
                (Goal::CloseDrawer { drawer }, _) => {
                    self.queue.push_back(Primitive::CloseDrawer(drawer));
                }
                (Goal::PlaceIn { object, target }, Strategy::Grasp) => {
                    self.queue.push_back(Primitive::Pick(object));
                    self.queue.push_back(Primitive::PlaceIn(target));
                }
                (Goal::PlaceIn { object, target }, Strategy::Push) => {
                    if world.bodies()[target].kind != Kind::Plate {
                        return Err(not_pushable(goal));
                    }
                    self.queue.push_back(Primitive::Push {
                        object,
                        to: PushTarget::Centre(target),
                    });
                }
                (
                    Goal::NextTo {
                        object,
                        anchor,
                        side,
                    },
                    Strategy::Grasp,
                ) => {
                    self.queue.push_back(Primitive::Pick(object));
                    self.queue
                        .push_back(Primitive::PlaceNextTo { anchor, side });
                }
                (
                    Goal::NextTo {
                        object,
                        anchor,
                        side,
                    },
                    Strategy::Push,
                ) => {
                    self.queue.push_back(Primitive::Push {
                        object,
                        to: PushTarget::NextTo { anchor, side },
                    });
                }
            }
        }
        Ok(())
    }

    /// The next action for `world` (hold still with the gripper as it is
    /// when nothing is left to do).
    pub fn act(&mut self, world: &World) -> [f32; ACTION_DIM] {
        self.act_and_plan(world).0
    }

    /// The next action for `world` and the action it plans before its noise
    /// (equal without noise): DART's label (Laskey et al. 2017), so that a
    /// demonstration wanders with the noise while every label leads back to
    /// the plan.
    pub fn act_and_plan(&mut self, world: &World) -> ([f32; ACTION_DIM], [f32; ACTION_DIM]) {
        // Each pass either returns or advances; waypoint lists are short,
        // so a bounded loop covers a primitive's expansion and its checks.
        for _ in 0..64 {
            if self.at >= self.waypoints.len() && !self.next_primitive(world) {
                break;
            }
            let pos = world.gripper().pos;
            match self.waypoints[self.at] {
                Waypoint::Move(target) => {
                    let diff = [target[0] - pos[0], target[1] - pos[1], target[2] - pos[2]];
                    if diff.iter().all(|d| d.abs() <= TOLERANCE) {
                        self.at += 1;
                        continue;
                    }
                    let mut a = [diff[0] / MAX_DXY, diff[1] / MAX_DXY, diff[2] / MAX_DZ];
                    let m = a.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                    if m > 1.0 {
                        a = a.map(|v| v / m);
                    }
                    let plan = [a[0], a[1], a[2], self.grip_command()];
                    if self.noise > 0.0 {
                        let scale = self.noise * a.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                        for v in &mut a {
                            *v += scale * gaussian(&mut self.rng);
                        }
                    }
                    let a = a.map(|v| v.clamp(-1.0, 1.0));
                    return ([a[0], a[1], a[2], self.grip_command()], plan);
                }
                Waypoint::Grip(close) => {
                    self.closed = close;
                    self.at += 1;
                    let grip = [0.0, 0.0, 0.0, self.grip_command()];
                    return (grip, grip);
                }
                Waypoint::Holding(i) => {
                    if matches!(world.gripper().grip, Grip::Object { index, .. } if index == i) {
                        self.at += 1;
                    } else {
                        self.restart(world);
                    }
                }
                Waypoint::HoldingHandle(k) => {
                    if world.gripper().grip == (Grip::Handle { drawer: k }) {
                        self.at += 1;
                    } else {
                        self.restart(world);
                    }
                }
            }
        }
        let still = [0.0, 0.0, 0.0, self.grip_command()];
        (still, still)
    }

    fn grip_command(&self) -> f32 {
        if self.closed { 1.0 } else { -1.0 }
    }

    /// Starts the next primitive (planning again when the plan is done and
    /// a goal does not hold); false when nothing is left.
    fn next_primitive(&mut self, world: &World) -> bool {
        if self.queue.is_empty() && world.status() == Status::Running && self.replans < REPLANS {
            let open: Vec<Goal> = self
                .goals
                .iter()
                .copied()
                .filter(|g| !world.holds(g))
                .collect();
            self.replans += 1;
            if self.plan(world, &open).is_err() {
                self.queue.clear();
            }
        }
        let Some(p) = self.queue.pop_front() else {
            return false;
        };
        self.current = Some(p);
        self.expand(world, p);
        true
    }

    /// Expands the current primitive again from the world as it is now.
    fn restart(&mut self, world: &World) {
        if let Some(p) = self.current {
            self.expand(world, p);
        }
    }

    fn expand(&mut self, world: &World, p: Primitive) {
        let w = &mut self.waypoints;
        w.clear();
        self.at = 0;
        let g = world.gripper().pos;
        let b = world.bodies();
        // Every primitive starts by rising straight up.
        w.push(Waypoint::Move([g[0], g[1], Z_TRAVEL.max(g[2])]));
        match p {
            Primitive::Pick(i) => {
                let o = &b[i];
                let mut xy = o.pos;
                // A bowl holding something is taken by its rim.
                if o.kind == Kind::Bowl && b.iter().any(|c| c.support == Support::On(i)) {
                    xy[0] += 0.04;
                }
                let z = o.z + 0.4 * o.height;
                w.push(Waypoint::Grip(false));
                w.push(Waypoint::Move([xy[0], xy[1], Z_TRAVEL]));
                w.push(Waypoint::Move([xy[0], xy[1], z]));
                w.push(Waypoint::Grip(true));
                w.push(Waypoint::Holding(i));
                w.push(Waypoint::Move([xy[0], xy[1], Z_TRAVEL]));
            }
            Primitive::PlaceIn(k) => {
                let r = &b[k];
                let xy = if r.kind == Kind::Drawer {
                    let (lo, hi) = r.tray();
                    [(lo[0] + hi[0]) / 2.0, (lo[1] + hi[1]) / 2.0]
                } else {
                    r.pos
                };
                place(w, xy);
            }
            Primitive::PlaceNextTo { anchor, side } => {
                let held = match world.gripper().grip {
                    Grip::Object { index, .. } => b[index].radius,
                    _ => 0.0,
                };
                let a = &b[anchor];
                place(w, next_to_spot(a.pos, a.radius, held, side));
            }
            Primitive::OpenDrawer(k) => {
                let h = b[k].handle();
                let full = b[k].pos[1] - CABINET_DEPTH / 2.0 - TRAY_TRAVEL - HANDLE_OFFSET;
                w.push(Waypoint::Grip(false));
                w.push(Waypoint::Move([h[0], h[1], Z_TRAVEL]));
                w.push(Waypoint::Move([h[0], h[1], Z_HANDLE]));
                w.push(Waypoint::Grip(true));
                w.push(Waypoint::HoldingHandle(k));
                w.push(Waypoint::Move([h[0], full, Z_HANDLE]));
                w.push(Waypoint::Grip(false));
                w.push(Waypoint::Move([h[0], full, Z_TRAVEL]));
            }
            Primitive::CloseDrawer(k) => {
                let h = b[k].handle();
                let start = h[1] - GRIPPER_RADIUS - 0.03;
                let closed =
                    b[k].pos[1] - CABINET_DEPTH / 2.0 - HANDLE_OFFSET - GRIPPER_RADIUS + 0.002;
                w.push(Waypoint::Grip(false));
                w.push(Waypoint::Move([h[0], start, Z_TRAVEL]));
                w.push(Waypoint::Move([h[0], start, 0.04]));
                w.push(Waypoint::Move([h[0], closed, 0.04]));
                w.push(Waypoint::Move([h[0], closed, Z_TRAVEL]));
            }
            Primitive::Push { object, to } => {
                let o = &b[object];
                let target = match to {
                    PushTarget::Centre(k) => b[k].pos,
                    PushTarget::NextTo { anchor, side } => {
                        next_to_spot(b[anchor].pos, b[anchor].radius, o.radius, side)
                    }
                };
                let d = [target[0] - o.pos[0], target[1] - o.pos[1]];
                let n = (d[0] * d[0] + d[1] * d[1]).sqrt().max(1e-6);
                let u = [d[0] / n, d[1] / n];
                let behind = o.radius + GRIPPER_RADIUS + 0.03;
                let contact = o.radius + GRIPPER_RADIUS;
                let start = [o.pos[0] - u[0] * behind, o.pos[1] - u[1] * behind];
                let end = [target[0] - u[0] * contact, target[1] - u[1] * contact];
                w.push(Waypoint::Grip(false));
                w.push(Waypoint::Move([start[0], start[1], Z_TRAVEL]));
                w.push(Waypoint::Move([start[0], start[1], Z_PUSH]));
                w.push(Waypoint::Move([end[0], end[1], Z_PUSH]));
                w.push(Waypoint::Move([end[0], end[1], Z_TRAVEL]));
            }
        }
    }
}

/// The waypoints that carry the held object over `xy` and let it go.
fn place(w: &mut Vec<Waypoint>, xy: [f32; 2]) {
    w.push(Waypoint::Move([xy[0], xy[1], Z_TRAVEL]));
    w.push(Waypoint::Move([xy[0], xy[1], Z_RELEASE]));
    w.push(Waypoint::Grip(false));
    w.push(Waypoint::Move([xy[0], xy[1], Z_TRAVEL]));
}

/// A standard normal draw (Box–Muller).
fn gaussian(rng: &mut ChaCha8Rng) -> f32 {
    let u1: f32 = rng.random::<f32>().max(f32::MIN_POSITIVE);
    let u2: f32 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

/// One decision of a demonstration: what the policy sees at the chunk's
/// start and the chunk of actions the expert then took.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The frame (`size × size × 3` bytes, see [`crate::render`]).
    pub frame: Vec<u8>,
    /// The proprio vector.
    pub proprio: [f32; PROPRIO_DIM],
    /// `k` actions; those after the episode ended hold still with the
    /// gripper as it was (`[0, 0, 0, grip]`).
    pub actions: Vec<[f32; ACTION_DIM]>,
}

/// An expert episode cut into decisions of `k` actions, for behaviour
/// cloning of an action-chunk policy.
#[derive(Clone, Debug, PartialEq)]
pub struct Demonstration {
    /// The decisions, in order (`ceil(steps / k)` of them).
    pub decisions: Vec<Decision>,
    /// How the episode ended.
    pub episode: Episode,
}

/// Runs the expert on `task` and records it as decisions of `k` actions
/// observed at `size` pixels, each action as `labels` says (the one taken,
/// or the one planned before the noise).
pub fn demonstration(
    task: &TaskSpec,
    strategy: Strategy,
    config: ExpertConfig,
    labels: Labels,
    k: usize,
    size: usize,
) -> Result<Demonstration, TabletopError> {
    let mut world = World::new(task)?;
    let mut expert = Expert::new(&world, strategy, config)?;
    if k == 0 {
        return Err(TabletopError::ChunkShape {
            episodes: 1,
            k,
            found: 0,
        });
    }
    let mut decisions = Vec::new();
    while world.status() == Status::Running {
        let mut frame = vec![0u8; frame_len(size)];
        world.render(size, &mut frame)?;
        let proprio = world.proprio();
        let mut actions = Vec::with_capacity(k);
        for _ in 0..k {
            if world.status() == Status::Running {
                let (a, plan) = expert.act_and_plan(&world);
                world.step(&a)?;
                actions.push(match labels {
                    Labels::Executed => a,
                    Labels::Planned => plan,
                });
            } else {
                actions.push([0.0, 0.0, 0.0, expert.grip_command()]);
            }
        }
        decisions.push(Decision {
            frame,
            proprio,
            actions,
        });
    }
    Ok(Demonstration {
        decisions,
        episode: Episode {
            success: world.status() == Status::Success,
            steps: world.steps(),
            target_ever_grasped: world.target_ever_grasped(),
            any_grasped: (0..world.bodies().len()).any(|i| world.ever_grasped(i)),
        },
    })
}

/// Which action a demonstration records for each step it took.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Labels {
    /// The action the world received, noise included.
    #[default]
    Executed,
    /// The action the expert planned before its noise (DART: the episode
    /// still runs the noisy action, so it visits states off the plan, and
    /// every label steers back towards it; without noise the two agree).
    Planned,
}

/// What an episode came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Episode {
    /// Whether the goals held (before `max_steps`).
    pub success: bool,
    /// Steps taken.
    pub steps: u32,
    /// Whether an object a goal moves was ever grasped.
    pub target_ever_grasped: bool,
    /// Whether any object was ever grasped.
    pub any_grasped: bool,
}

/// Runs `policy` in `world` until the episode ends (success or
/// `max_steps`).
pub fn run_episode(
    world: &mut World,
    mut policy: impl FnMut(&World) -> [f32; ACTION_DIM],
) -> Result<Episode, TabletopError> {
    while world.status() == Status::Running {
        let action = policy(world);
        world.step(&action)?;
    }
    Ok(Episode {
        success: world.status() == Status::Success,
        steps: world.steps(),
        target_ever_grasped: world.target_ever_grasped(),
        any_grasped: (0..world.bodies().len()).any(|i| world.ever_grasped(i)),
    })
}
