//! A world's scripted expert as behaviour-cloning data
//! (`World::demonstrations`): each task's
//! expert episode recorded as a policy would have lived it, one
//! [`DemoDecision`] per chunk of `K` actions — the observation before the
//! chunk encoded in the policy's shape
//! ([`embodyflow_core::observation::encode`]), the text it observed (a
//! world that observes text) and the chunk's actions as the policy's
//! tokens (`K × D`, fewer on the decision where the episode ended: the
//! actions after the end are not the expert's).
//!
//! `update-policy --set objective=sft` turns each successful
//! demonstration's decisions into examples and counts the failed ones; it
//! never names a world.
//!
//! ```
//! use embodyflow_world::demonstrations::{DemoDecision, Demonstration};
//! let demo = Demonstration {
//!     task_id: "t".into(),
//!     instruction: "push right".into(),
//!     success: true,
//!     decisions: vec![DemoDecision { observation: vec![], text: None, tokens: vec![255] }],
//!     step_frames: Vec::new(),
//!     failure: None,
//! };
//! assert_eq!(demo.decisions.len(), 1);
//! ```

use embodyflow_algos::action_tokens::ActionBins;
use embodyflow_core::observation::ObservationShape;

use crate::workers::WorkerSettings;

/// What a stage asks of a world's scripted expert: demonstrations of its
/// tasks as the policy will observe and act.
#[derive(Clone, Copy, Debug)]
pub struct DemoRequest<'a> {
    /// The policy's observations: a world that renders at the policy's
    /// size renders frames of `height` pixels; every observation is encoded
    /// in this shape.
    pub observation: ObservationShape,
    /// Dimensions of the policy's actions.
    pub action_dim: usize,
    /// The policy's action bins: each decision's actions become tokens
    /// with them.
    pub bins: &'a ActionBins,
    /// Actions per decision, `K`.
    pub chunk_len: usize,
    /// The expert's relative action noise, for a world whose expert takes
    /// noise (`sft.expert_noise`).
    pub noise: f32,
    /// Whether each action is labelled with what the expert planned before
    /// its noise rather than what it did (DART; `sft.expert_labels =
    /// planned`). An expert without noise does what it plans, so a world
    /// whose expert takes no noise has nothing to change.
    pub planned_labels: bool,
    /// Each task's expert seed, in task order.
    pub seeds: &'a [u64],
    /// Whether each demonstration also carries the frame of every step (a
    /// thinking VLA's warm-up); a world that cannot record them refuses.
    pub step_frames: bool,
    /// How a world played by workers runs them (the bridge's).
    pub workers: &'a WorkerSettings,
}

/// One task's expert episode, cut into decisions.
#[derive(Clone, Debug, PartialEq)]
pub struct Demonstration {
    /// The task.
    pub task_id: String,
    /// The instruction the policy reads.
    pub instruction: String,
    /// Whether the expert succeeded (a failed demonstration is left out
    /// and counted).
    pub success: bool,
    /// The decisions, in order.
    pub decisions: Vec<DemoDecision>,
    /// The frame before every step, when asked for
    /// ([`DemoRequest::step_frames`]); empty otherwise.
    pub step_frames: Vec<Vec<u8>>,
    /// Why the episode ended outside the task, when infrastructure ended
    /// it (a worker that crashed, hung or sent a malformed frame); then
    /// `success` is false. `None` for an expert that played its episode.
    pub failure: Option<String>,
}

/// One decision of a demonstration.
#[derive(Clone, Debug, PartialEq)]
pub struct DemoDecision {
    /// The observation before the chunk, encoded in the policy's shape.
    pub observation: Vec<u8>,
    /// The text it observed, in a world that observes text (the decision's
    /// prompt is then `embodyflow_world::observed_prompt` of the
    /// instruction and it).
    pub text: Option<String>,
    /// The chunk's actions as the policy's tokens (token `t` is dimension
    /// `t % D` of action `t / D`), those taken before the episode ended.
    pub tokens: Vec<u32>,
}
