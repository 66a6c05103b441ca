//! The pure maths of the pipeline, on flat slices, with no I/O: the stages
//! gather columns from shards, call these functions, and write the results.
//!
//! - [`grpo`]: episode advantages normalised within groups (GRPO, Dr. GRPO),
//!   with veRL's numerics;
//! - [`gigpo`]: GiGPO's group-in-group advantages (episode GRPO plus
//!   anchor-state step groups over discounted step returns), with
//!   verl-agent's numerics;
//! - [`outcome`]: veRL's other outcome estimators (RLOO, OPO, GPG, GRPO
//!   pass@k, REINFORCE++-baseline), one advantage per trajectory from its
//!   group's scores;
//! - [`gae`]: generalised advantage estimation at token level (veRL's
//!   `compute_gae_advantage_return`; without a critic, REINFORCE++) and at
//!   decision level (LaST-R1), and veRL's masked whitening;
//! - [`pass_at_k`]: the unbiased pass@k estimator (Chen et al. 2021);
//! - [`action_tokens`]: OpenVLA's 256-bin action tokenizer (continuous
//!   actions <-> tokens of a closed-loop policy);
//! - [`action_stats`]: an OpenVLA checkpoint's `dataset_statistics.json`
//!   and the action / proprio (un)normalisation it defines.

pub mod action_stats;
pub mod action_tokens;
pub mod gae;
pub mod gigpo;
pub mod grpo;
pub mod json_spans;
pub mod outcome;
pub mod pass_at_k;
pub mod plan;
pub mod rewards;
pub mod spans;
pub mod step_adv;

/// Errors of the maths: inputs that make a formula undefined.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AlgoError {
    /// Whitening needs at least two values (veRL raises on a mask sum of 0 or 1).
    #[error("whitening needs at least two valid positions, found {0}")]
    TooFewToWhiten(usize),
    /// A group has fewer trajectories than the estimator needs (veRL raises).
    #[error("at least {needed} trajectories per group needed, group {group} has {size}")]
    GroupTooSmall {
        /// The group's dense index.
        group: u32,
        /// Trajectories in it.
        size: usize,
        /// Trajectories needed.
        needed: usize,
    },
    /// Two inputs that must have the same length do not.
    #[error("{what}: length {found}, expected {expected}")]
    LengthMismatch {
        /// Which input.
        what: &'static str,
        /// Length expected.
        expected: usize,
        /// Length found.
        found: usize,
    },
}
