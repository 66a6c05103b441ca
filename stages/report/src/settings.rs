//! The settings a variant was computed with, read typed from the manifests
//! of its advantages and rewards, as the report's `settings` column:
//!
//! ```text
//! grpo_step rule (match exact, credit action_name, score action_name, omega 1.0, gate none)
//! ```

use embodyflow_core::dataset::TableReader;
use embodyflow_core::spec;
use serde::Deserialize;

use crate::Result;

/// The compute-advantages settings a variant shows, read typed from its
/// advantages manifest ([`spec::StageSpec::config_of`]).
#[derive(Debug, Deserialize)]
struct AdvantagesSettings {
    estimator: String,
    stepopsd: StepOpsdSettings,
    step: StepSettings,
}

#[derive(Debug, Deserialize)]
struct StepOpsdSettings {
    enabled: bool,
}

#[derive(Debug, Deserialize)]
struct StepSettings {
    kind: String,
    credit_target: String,
    score_source: String,
    omega: f32,
    gate: String,
}

/// The score-rewards settings a variant shows.
#[derive(Debug, Deserialize)]
struct RewardsSettings {
    #[serde(rename = "match")]
    matching: MatchSettings,
}

#[derive(Debug, Deserialize)]
struct MatchSettings {
    mode: String,
}

/// The settings a variant was computed with, from the manifests of its
/// advantages (estimator, step kind, credit target, score source, omega, gate)
/// and of its rewards (the rule match mode).
pub(crate) fn variant_settings(advantages: &TableReader, rewards: &TableReader) -> Result<String> {
    let settings: AdvantagesSettings =
        spec::COMPUTE_ADVANTAGES.config_of(advantages.manifest(), advantages.dir())?;
    let mut estimator = settings.estimator;
    if settings.stepopsd.enabled {
        // Sign-preserving reweighting of A: no A^S, no flips by construction.
        estimator.push_str(" + StepOPSD reweighting");
    }
    if !estimator.starts_with("grpo_step") {
        return Ok(estimator);
    }
    let rewards: RewardsSettings =
        spec::SCORE_REWARDS.config_of(rewards.manifest(), rewards.dir())?;
    let step = settings.step;
    Ok(format!(
        "grpo_step {} (match {}, credit {}, score {}, omega {:?}, gate {})",
        step.kind,
        rewards.matching.mode,
        step.credit_target,
        step.score_source,
        step.omega,
        step.gate,
    ))
}
