//! The closed-loop world interface: `n` episodes of a world that render into
//! contiguous buffers and advance by one chunk of `K` actions each, stepped
//! in lockstep (SimpleVLA-RL's rollout loop; a batch of episodes as
//! Gymnasium's vector environments step theirs, with an action chunk per
//! step as OpenVLA-OFT emits them).
//!
//! This crate sits below the models and knows none of them: a world
//! implements [`ClosedLoopWorld`] with plain data (frames as bytes,
//! proprio and actions as `f32`, the shape as an
//! [`ObservationShape`]), and the rollout driver
//! (`embodyflow_rollout::closed_loop::run_closed_loop`) runs a policy over
//! any implementation. The policy's side is here too ([`policy`]:
//! [`ChunkPolicy`], the batch it sees and the decisions it answers), so a
//! world can offer a scripted policy of its own (the tabletop world's
//! `ExpertPolicy`) without linking the models. The tabletop world (`embodyflow_tabletop::TabletopEpisodes`)
//! and the Gymnasium bridge (`embodyflow_gym::GymEpisodes`) implement it,
//! so neither links libtorch; `embodyflow_worlds` chooses one per task row.
//!
//! What a world declares to the stages is here too, so a world is one
//! crate implementing these interfaces and one line of the registry
//! (`embodyflow_worlds::WORLDS`): [`world`] (the [`World`](world::World)
//! trait, a task of any world, a batch's options, a policy's shape),
//! [`generator`] (how `generate-tasks` writes its tasks),
//! [`demonstrations`] (its scripted expert's episodes for behaviour
//! cloning) and [`workers`] (a world's own settings, passed on unread).
//!
//! One decision of the driver, in the interface's terms: [`observe`] every
//! episode, read the live episodes' [`frames`] and [`proprio`] (and, in a
//! world that observes text, each one's [`observation_text`], joined to the
//! instruction by [`observed_prompt`]; with a policy that recalls its last
//! decisions, [`history_prompt`]), ask the policy, then
//! [`step_chunks`] with `len() × K × action_dim()` actions; each episode's
//! [`ChunkReport`] says how many actions it executed and whether it ended
//! (success, the world's `max_steps`, or a fault of its environment: a
//! failure with a reason, never an error).
//!
//! A world of one cell per episode that succeeds once an action pushes
//! right, stepped as the driver steps it:
//!
//! ```
//! use embodyflow_core::observation::ObservationShape;
//! use embodyflow_world::{ChunkReport, ClosedLoopWorld, WorldError};
//!
//! struct Push { done: Vec<bool>, frames: Vec<u8>, proprio: Vec<f32> }
//!
//! impl ClosedLoopWorld for Push {
//!     fn len(&self) -> usize { self.done.len() }
//!     fn observation_shape(&self) -> ObservationShape {
//!         ObservationShape { height: 1, width: 1, channels: 1, proprio: 1 }
//!     }
//!     fn image_names(&self) -> &[String] { &[] }
//!     fn action_dim(&self) -> usize { 1 }
//!     fn task_id(&self, _: usize) -> &str { "push" }
//!     fn instruction(&self, _: usize) -> &str { "push right" }
//!     fn running(&self, i: usize) -> bool { !self.done[i] }
//!     fn observe(&mut self) {
//!         self.frames = self.done.iter().map(|&d| 255 * u8::from(d)).collect();
//!         self.proprio = self.done.iter().map(|&d| f32::from(u8::from(d))).collect();
//!     }
//!     fn frames(&self) -> &[u8] { &self.frames }
//!     fn proprio(&self) -> &[f32] { &self.proprio }
//!     fn step_chunks(&mut self, actions: &[f32], k: usize) -> Result<Vec<ChunkReport>, WorldError> {
//!         let mut reports = Vec::new();
//!         for (i, chunk) in actions.chunks(k).enumerate() {
//!             let mut report = ChunkReport { env_steps: 0, done: self.done[i], success: self.done[i], failure: None };
//!             for &a in chunk {
//!                 if self.done[i] {
//!                     break;
//!                 }
//!                 report.env_steps += 1;
//!                 self.done[i] = a > 0.0;
//!                 (report.done, report.success) = (self.done[i], self.done[i]);
//!             }
//!             reports.push(report);
//!         }
//!         Ok(reports)
//!     }
//!     fn target_ever_grasped(&self, _: usize) -> Option<bool> { None }
//!     fn observation_text(&self, _: usize) -> Option<&str> { None }
//!     fn start_failure(&self, _: usize) -> Option<&str> { None }
//! }
//!
//! let mut world = Push { done: vec![false; 2], frames: vec![], proprio: vec![] };
//! world.observe();
//! assert_eq!(world.frames().len(), world.len() * world.observation_shape().pixel_len());
//! // K = 2: episode 0 pushes left then right, episode 1 right at once.
//! let reports = world.step_chunks(&[-1.0, 1.0, 1.0, 0.0], 2).unwrap();
//! assert_eq!((reports[0].env_steps, reports[0].success), (2, true));
//! assert_eq!((reports[1].env_steps, reports[1].success), (1, true));
//! assert!(!world.running(0) && !world.running(1));
//! ```
//!
//! [`observe`]: ClosedLoopWorld::observe
//! [`frames`]: ClosedLoopWorld::frames
//! [`proprio`]: ClosedLoopWorld::proprio
//! [`observation_text`]: ClosedLoopWorld::observation_text
//! [`step_chunks`]: ClosedLoopWorld::step_chunks

use embodyflow_algos::action_tokens::ActionBins;
use embodyflow_core::observation::ObservationShape;

pub mod demonstrations;
pub mod generator;
pub mod policy;
pub mod workers;
pub mod world;

pub use policy::{ChunkDecision, ChunkPolicy, DecisionBatch, Thought};

/// An error of a world while stepping (the driver checks actions first, so
/// this is a failure of the world).
pub type WorldError = Box<dyn std::error::Error + Send + Sync>;

/// What one chunk did to one episode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkReport {
    /// Actions of the chunk executed (0 for an episode that had ended).
    pub env_steps: u32,
    /// Whether the episode has ended.
    pub done: bool,
    /// Whether it ended in success.
    pub success: bool,
    /// Why the episode ended outside the task (its environment worker
    /// crashed, hung or sent a malformed frame): a failure with a reason,
    /// never dropped. `None` when the world ran it.
    pub failure: Option<String>,
}

/// Where an episode was asked to grasp and where it did: the point a goal
/// needs the fingers to close on (the object it moves, a drawer's handle) at
/// the episode's start, and where the gripper stood when the fingers first
/// closed (`None`: they never closed). Over held-out initial states the
/// regression of `closed_at` on `target` tells a policy that looks where
/// the object is (slope 1) from one that replays a mean trajectory (slope
/// 0): evaluate's grasp slope.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GraspPoint {
    /// The grasp target's (x, y) at the episode's start.
    pub target: [f32; 2],
    /// The gripper's (x, y) when the fingers first closed.
    pub closed_at: Option<[f32; 2]>,
}

/// Episodes of a closed-loop world, stepped together.
pub trait ClosedLoopWorld {
    /// Number of episodes.
    fn len(&self) -> usize;
    /// Whether there is no episode.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The shape of every episode's observation.
    fn observation_shape(&self) -> ObservationShape;
    /// The names of the images each frame joins along its channels (a
    /// robot's cameras, e.g. `agentview`, `wrist`), in channel order; empty
    /// for one unnamed image. The driver writes them into every decision's
    /// observation ([`embodyflow_core::observation::encode_named`], format
    /// version 2). No default: a world that wraps others must pass them on.
    fn image_names(&self) -> &[String];
    /// Dimensions of one action.
    fn action_dim(&self) -> usize;
    /// Episode `i`'s task id.
    fn task_id(&self, i: usize) -> &str;
    /// Episode `i`'s instruction in words.
    fn instruction(&self, i: usize) -> &str;
    /// Whether episode `i` is still running.
    fn running(&self, i: usize) -> bool;
    /// Renders every episode into [`ClosedLoopWorld::frames`] and
    /// [`ClosedLoopWorld::proprio`].
    fn observe(&mut self);
    /// The frames, episode after episode (`pixel_len()` bytes each).
    fn frames(&self) -> &[u8];
    /// The proprio vectors, episode after episode.
    fn proprio(&self) -> &[f32];
    /// Steps each running episode through its chunk of `k` actions
    /// (`len() × k × action_dim()` values; an ended episode's are ignored).
    fn step_chunks(&mut self, actions: &[f32], k: usize) -> Result<Vec<ChunkReport>, WorldError>;
    /// Whether an object a goal of episode `i` moves was ever grasped; `None`
    /// for a world without grasping.
    fn target_ever_grasped(&self, i: usize) -> Option<bool>;
    /// Episode `i`'s grasp point so far ([`GraspPoint`]); `None` for a
    /// world that does not say where its goals are.
    fn grasp_point(&self, i: usize) -> Option<GraspPoint> {
        let _ = i;
        None
    }
    /// The anchor state of episode `i` as last observed (GiGPO's step
    /// groups): a hex hash of the world's exact state, equal exactly when
    /// two episodes are in the same state; `None` for a world that cannot
    /// say.
    fn anchor_key(&self, i: usize) -> Option<String> {
        let _ = i;
        None
    }
    /// The text episode `i` observes as last observed (a Gymnasium `Text`
    /// observation), which the driver appends to the instruction in the
    /// decision's prompt ([`observed_prompt`]); `None` for a world whose
    /// observations carry no text. No default: a world that wraps others
    /// must pass it on.
    fn observation_text(&self, i: usize) -> Option<&str>;
    /// Why episode `i` ended before its first decision (its environment
    /// could not be started or reset: a failure with a reason, as
    /// [`ChunkReport::failure`]); `None` for an episode that started. No
    /// default: a world that wraps others must pass it on.
    fn start_failure(&self, i: usize) -> Option<&str>;
}

/// The prompt of a decision in a world that observes text: the instruction,
/// then the observation's text on the next line (the text alone when there
/// is no instruction). The driver and a demonstration's decisions
/// (update-policy's behaviour cloning) both build it here.
///
/// ```
/// use embodyflow_world::observed_prompt;
/// assert_eq!(observed_prompt("find the key", "you are in room 1"), "find the key\nyou are in room 1");
/// assert_eq!(observed_prompt("", "you are in room 1"), "you are in room 1");
/// ```
pub fn observed_prompt(instruction: &str, text: &str) -> String {
    if instruction.is_empty() {
        text.to_string()
    } else {
        format!("{instruction}\n{text}")
    }
}

/// One earlier decision of an episode as a history prompt recalls it
/// ([`history_prompt`]): the text it observed (`None` in a world whose
/// observations carry no text) and the action it took, in words
/// ([`action_text`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PastDecision {
    /// The observation's text at that decision.
    pub text: Option<String>,
    /// The action taken, as [`action_text`] writes it.
    pub action: String,
}

/// The prompt of a decision that recalls the episode's last `history`
/// decisions: the instruction, one line per recalled decision, then the
/// current observation's text (absent in a world without text), joined by
/// newlines; `past` is every earlier decision of the episode, oldest first.
///
/// The shape is verl-agent's history prompt
/// (`agent_system/environments/prompts/alfworld.py`'s `ALFWORLD_TEMPLATE`,
/// filled by `env_manager.py`'s `build_text_obs`): the task, the most
/// recent `history_length` observations with the action taken after each,
/// as its `SimpleMemory.fetch` writes them,
/// `[Observation {n}: '{obs}', Action {n}: '{act}']` with `n` counted from
/// the episode's first decision (1), then the current observation.
/// Its prose around them ("Prior to this step, you have already taken ..."),
/// the admissible actions and the reasoning instructions are left out: our
/// VLAs read a few dozen prompt tokens and answer in action bins. A
/// decision of a world without text is recalled by its action alone,
/// `[Action {n}: '{act}']`. With `history = 0`, or at an episode's first
/// decision (verl-agent's `*_TEMPLATE_NO_HIS`), the prompt is
/// [`observed_prompt`]'s (the instruction alone in a world without text).
/// The rollout driver and update-policy's behaviour cloning both build
/// their prompts here, so training and acting read the same text.
///
/// ```
/// use embodyflow_world::{PastDecision, history_prompt, observed_prompt};
/// let past = |text: &str, action: &str| PastDecision { text: Some(text.into()), action: action.into() };
/// let episode = [past("in room 0", "1"), past("in room 1", "1"), past("in room 2", "0")];
/// assert_eq!(
///     history_prompt("find the key", 2, &episode, Some("in room 1")),
///     "find the key\n[Observation 2: 'in room 1', Action 2: '1']\n\
///      [Observation 3: 'in room 2', Action 3: '0']\nin room 1"
/// );
/// assert_eq!(history_prompt("find the key", 0, &episode, Some("in room 1")), observed_prompt("find the key", "in room 1"));
/// let blind = [PastDecision { text: None, action: "2".into() }];
/// assert_eq!(history_prompt("go to the door", 2, &blind, None), "go to the door\n[Action 1: '2']");
/// ```
pub fn history_prompt(
    instruction: &str,
    history: usize,
    past: &[PastDecision],
    current: Option<&str>,
) -> String {
    let first = past.len() - past.len().min(history);
    let mut lines: Vec<String> = Vec::with_capacity(history + 2);
    if !instruction.is_empty() {
        lines.push(instruction.to_string());
    }
    for (at, decision) in past.iter().enumerate().skip(first) {
        let n = at + 1;
        lines.push(match &decision.text {
            Some(text) => format!(
                "[Observation {n}: '{text}', Action {n}: '{}']",
                decision.action
            ),
            None => format!("[Action {n}: '{}']", decision.action),
        });
    }
    lines.extend(current.map(str::to_string));
    lines.join("\n")
}

/// A chunk of action tokens (`K × D`, token `t` is dimension `t % D` of
/// action `t / D`) in words for a history prompt ([`history_prompt`]):
/// each action's dimensions as the bins they execute, separated by
/// spaces, the chunk's actions by `, `. A bin is the index of the centre
/// its token decodes to (`min(token, n_bins - 2)`: OpenVLA's top bin
/// shares the centre below it), so for a discrete action space, whose
/// policy has one bin per action and one more
/// (`embodyflow_gym::ActionSpace::bins`), it is the action's index as the
/// bridge sends it to the environment; for a box it is the bin of each
/// dimension, whose centre is the value executed.
///
/// ```
/// use embodyflow_algos::action_tokens::ActionBins;
/// use embodyflow_world::action_text;
/// let discrete = ActionBins::new(8, -1.0, 1.0).unwrap(); // Discrete(7)
/// assert_eq!(action_text(&[2], 1, &discrete), "2");
/// assert_eq!(action_text(&[7], 1, &discrete), "6"); // the top bin executes action 6
/// assert_eq!(action_text(&[0, 255, 3, 4], 2, &ActionBins::openvla()), "0 254, 3 4");
/// ```
pub fn action_text(tokens: &[u32], action_dim: usize, bins: &ActionBins) -> String {
    let top = bins.n_bins().saturating_sub(2) as u32;
    tokens
        .chunks(action_dim.max(1))
        .map(|action| {
            action
                .iter()
                .map(|&t| t.min(top).to_string())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(text: &str, action: &str) -> PastDecision {
        PastDecision {
            text: Some(text.to_string()),
            action: action.to_string(),
        }
    }

    /// The key-room's sentences and actions (0 west, 1 east, 2 pick up).
    fn keyroom() -> Vec<PastDecision> {
        vec![
            seen("you are in room 0; the key is in room 2", "1"),
            seen("you are in room 1; the key is in room 2", "0"),
            seen("you are in room 0; the key is in room 2", "1"),
        ]
    }

    #[test]
    fn a_history_prompt_recalls_the_last_decisions_numbered_from_the_first() {
        let now = "you are in room 1; the key is in room 2";
        assert_eq!(
            history_prompt("find the key", 2, &keyroom(), Some(now)),
            "find the key\n\
             [Observation 2: 'you are in room 1; the key is in room 2', Action 2: '0']\n\
             [Observation 3: 'you are in room 0; the key is in room 2', Action 3: '1']\n\
             you are in room 1; the key is in room 2"
        );
        assert_eq!(
            history_prompt("find the key", 1, &keyroom(), Some(now)),
            "find the key\n\
             [Observation 3: 'you are in room 0; the key is in room 2', Action 3: '1']\n\
             you are in room 1; the key is in room 2"
        );
    }

    #[test]
    fn without_history_the_prompt_is_the_memoryless_one() {
        let now = "you are in room 1; the key is in room 2";
        for instruction in ["find the key", ""] {
            assert_eq!(
                history_prompt(instruction, 0, &keyroom(), Some(now)),
                observed_prompt(instruction, now)
            );
            // An episode's first decision has nothing to recall.
            assert_eq!(
                history_prompt(instruction, 3, &[], Some(now)),
                observed_prompt(instruction, now)
            );
        }
        assert_eq!(
            history_prompt("find the key", 0, &keyroom(), Some(now)),
            "find the key\nyou are in room 1; the key is in room 2"
        );
        assert_eq!(
            history_prompt("go to the door", 0, &[], None),
            "go to the door"
        );
    }

    #[test]
    fn a_history_longer_than_the_episode_so_far_recalls_all_of_it() {
        let episode = keyroom();
        let whole = history_prompt("find the key", 3, &episode, Some("now"));
        for history in [4, 8, 1000] {
            assert_eq!(
                history_prompt("find the key", history, &episode, Some("now")),
                whole
            );
        }
        assert_eq!(
            history_prompt("find the key", 8, &episode[..1], Some("now")),
            "find the key\n[Observation 1: 'you are in room 0; the key is in room 2', Action 1: '1']\nnow"
        );
    }

    #[test]
    fn a_world_without_text_recalls_its_actions_alone() {
        let blind = |action: &str| PastDecision {
            text: None,
            action: action.to_string(),
        };
        let episode = [blind("0"), blind("0"), blind("2")];
        assert_eq!(
            history_prompt("go to the red ball", 2, &episode, None),
            "go to the red ball\n[Action 2: '0']\n[Action 3: '2']"
        );
        assert_eq!(
            history_prompt("", 2, &episode, None),
            "[Action 2: '0']\n[Action 3: '2']"
        );
    }

    #[test]
    fn an_action_is_written_as_the_bins_it_executes() {
        // Discrete(3) as the bridge's policies have it: 4 bins, the top one
        // executing action 2 as the bridge does.
        let discrete = ActionBins::new(4, -1.0, 1.0).unwrap();
        let words: Vec<String> = (0..4).map(|t| action_text(&[t], 1, &discrete)).collect();
        assert_eq!(words, ["0", "1", "2", "2"]);
        // K = 2 actions of D = 3 dimensions.
        let box_bins = ActionBins::openvla();
        assert_eq!(
            action_text(&[0, 127, 255, 3, 4, 5], 3, &box_bins),
            "0 127 254, 3 4 5"
        );
        assert_eq!(action_text(&[], 1, &box_bins), "");
    }
}
