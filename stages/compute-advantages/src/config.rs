//! The stage's config: which estimator runs and its settings, read from the
//! layered TOML config and `--set key=value` (see `embodyflow_core::config`).
//! Every table is `deny_unknown_fields`, so a misspelt key is an error that
//! names it before any work.
//!
//! ```text
//! estimator = "gae"          # grpo | dr_grpo | gae | grpo_step | gigpo
//! batch_rows = 256           # rows per record batch read from steps
//! [gae]
//! gamma = 0.99
//! lam = 0.95
//! level = "decision"         # token | decision
//! hold_mib = 48              # raw advantages kept from pass 1 (else a 2nd pass)
//! [filter]
//! dynamic_sampling = true    # drop groups whose scores are all equal
//! [gigpo]
//! gamma = 0.95               # discount of the step returns
//! step_weight = 1.0          # omega in A = A^E + omega * A^S
//! norm = "std"               # std | mean (both levels)
//! eps = 1e-6
//! episode_stats = "episodes" # episodes | steps (verl-agent's weighting)
//! ```

use embodyflow_algos::gigpo::{EpisodeStats, StepNorm};
use embodyflow_core::config::{ConfigKeys, at_least, ensure, in_range, keys_of, positive};
use embodyflow_core::stage::{OutputConfig, StageConfig};
use embodyflow_core::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::step::{Gate, StepConfig, StepKind, StepOpsdConfig};

/// The advantage estimator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Estimator {
    /// Group-normalised outcome (GRPO).
    Grpo,
    /// Group-centred outcome (Dr. GRPO).
    DrGrpo,
    /// Generalised advantage estimation with a critic.
    Gae,
    /// GRPO plus omega times a step advantage on plan-step tokens.
    GrpoStep,
    /// GiGPO: GRPO plus omega times the discounted step return normalised
    /// among the group's steps from the same anchor state.
    Gigpo,
}

impl Estimator {
    /// The name written into every row's `estimator` column.
    pub fn name(self) -> &'static str {
        match self {
            Estimator::Grpo => "grpo",
            Estimator::DrGrpo => "dr_grpo",
            Estimator::Gae => "gae",
            Estimator::GrpoStep => "grpo_step",
            Estimator::Gigpo => "gigpo",
        }
    }

    /// Whether its advantages compare a trajectory with its group's (every
    /// estimator but GAE, whose critic needs no siblings): a group that
    /// faults leave with fewer than 2 trajectories has no signal then.
    pub fn group_relative(self) -> bool {
        self != Estimator::Gae
    }
}

/// Where GAE's values live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GaeLevel {
    /// One value per response token (`steps.old_values`).
    Token,
    /// One value per decision step (`steps.old_value`).
    Decision,
}

/// `grpo.*` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct GrpoConfig {
    /// Added to the group's standard deviation (grpo).
    pub eps: f64,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        GrpoConfig { eps: 1e-6 }
    }
}

/// `gae.*` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct GaeConfig {
    /// GAE discount gamma.
    pub gamma: f32,
    /// GAE lambda.
    pub lam: f32,
    /// Critic values per token or per decision step: token or decision.
    pub level: GaeLevel,
    /// MiB of raw advantages and returns kept from the first pass; a larger
    /// input is read twice.
    pub hold_mib: usize,
}

impl Default for GaeConfig {
    fn default() -> Self {
        GaeConfig {
            gamma: 0.99,
            lam: 0.95,
            level: GaeLevel::Token,
            hold_mib: 48,
        }
    }
}

/// `gigpo.*` settings (defaults: verl-agent's example runs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct GigpoConfig {
    /// gigpo: discount of the step returns.
    pub gamma: f32,
    /// gigpo: weight omega of A^S in A = A^E + omega * A^S (verl-agent's
    /// `step_advantage_w`).
    pub step_weight: f32,
    /// gigpo: std (mean-std normalisation) or mean (centring only), at both
    /// levels.
    pub norm: StepNorm,
    /// gigpo: added to the group's and the step group's standard deviation.
    pub eps: f64,
    /// gigpo: A^E's group statistics over one score per trajectory
    /// (episodes) or per step row (steps, verl-agent).
    pub episode_stats: EpisodeStats,
}

impl Default for GigpoConfig {
    fn default() -> Self {
        GigpoConfig {
            gamma: 0.95,
            step_weight: 1.0,
            norm: StepNorm::Std,
            eps: 1e-6,
            episode_stats: EpisodeStats::Episodes,
        }
    }
}

/// `filter.*` settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct FilterConfig {
    /// Drop groups whose scores are all equal.
    pub dynamic_sampling: bool,
}

/// The stage's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Advantage estimator: grpo, dr_grpo, gae, grpo_step or gigpo.
    pub estimator: Estimator,
    /// GRPO settings.
    #[keys(section)]
    pub grpo: GrpoConfig,
    /// GAE settings.
    #[keys(section)]
    pub gae: GaeConfig,
    /// Group filter.
    #[keys(section)]
    pub filter: FilterConfig,
    /// GiGPO settings.
    #[keys(section)]
    pub gigpo: GigpoConfig,
    /// grpo_step settings.
    #[keys(section)]
    pub step: StepConfig,
    /// StepOPSD reweighting (grpo, dr_grpo, grpo_step).
    #[keys(section)]
    pub stepopsd: StepOpsdConfig,
    /// Rows per record batch read from the steps table.
    pub batch_rows: usize,
    /// Output layout.
    #[keys(skip)]
    pub output: OutputConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            estimator: Estimator::Grpo,
            grpo: GrpoConfig::default(),
            gae: GaeConfig::default(),
            filter: FilterConfig::default(),
            gigpo: GigpoConfig::default(),
            step: StepConfig::default(),
            stepopsd: StepOpsdConfig::default(),
            batch_rows: 256,
            output: OutputConfig::default(),
        }
    }
}

impl StageConfig for Config {
    fn key_docs() -> Vec<(String, &'static str)> {
        keys_of::<Config>()
    }

    fn output(&self) -> &OutputConfig {
        &self.output
    }

    /// Ranges (`grpo.eps` above 0, `gae.gamma` and `gae.lam` in [0, 1],
    /// `batch_rows` at least 1, the `step.*` and `stepopsd.*` ranges) and the
    /// relations between keys: StepOPSD reweights grpo, dr_grpo or grpo_step
    /// (with gae it would be ignored), and grpo_step's residual_contrast gate
    /// needs `step.kind = forward_proxy`.
    fn validate(&self) -> Result<()> {
        positive("grpo.eps", self.grpo.eps)?;
        in_range("gae.gamma", f64::from(self.gae.gamma), 0.0, 1.0)?;
        in_range("gae.lam", f64::from(self.gae.lam), 0.0, 1.0)?;
        in_range("gigpo.gamma", f64::from(self.gigpo.gamma), 0.0, 1.0)?;
        let omega = self.gigpo.step_weight;
        ensure(
            omega.is_finite() && omega >= 0.0,
            "gigpo.step_weight",
            "a finite number at least 0",
            omega,
        )?;
        positive("gigpo.eps", self.gigpo.eps)?;
        at_least("batch_rows", self.batch_rows, 1)?;
        self.step.validate()?;
        self.stepopsd.validate()?;
        ensure(
            !(self.stepopsd.enabled && self.estimator == Estimator::Gae),
            "stepopsd.enabled",
            "false with estimator = gae (StepOPSD reweights grpo, dr_grpo or grpo_step)",
            true,
        )?;
        ensure(
            !(self.stepopsd.enabled && self.estimator == Estimator::Gigpo),
            "stepopsd.enabled",
            "false with estimator = gigpo (StepOPSD reweights grpo, dr_grpo or grpo_step)",
            true,
        )?;
        if self.step.position_norm && self.step.kind != StepKind::Rule {
            return Err(Error::BadValue {
                key: "step.position_norm".into(),
                reason: "normalises the rule's step scores per plan step: it needs step.kind = rule (forward_proxy scores exist only per response)".into(),
            });
        }
        if self.estimator == Estimator::GrpoStep
            && self.step.gate == Gate::ResidualContrast
            && self.step.kind != StepKind::ForwardProxy
        {
            return Err(Error::BadValue {
                key: "step.gate".into(),
                reason: "residual_contrast gates the teacher-student contrast: it needs step.kind = forward_proxy".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use embodyflow_core::config::refused_key;

    #[test]
    fn config_values_are_checked_when_loaded() {
        assert_eq!(refused_key::<Config>(&[]), None, "the defaults pass");
        let fine = [
            "estimator=grpo_step",
            "step.kind=forward_proxy",
            "step.gate=residual_contrast",
            "gae.gamma=1",
            "gae.lam=0",
            "batch_rows=1",
            "gigpo.gamma=1",
            "gigpo.step_weight=0",
            "gigpo.norm=mean",
            "gigpo.episode_stats=steps",
        ];
        assert_eq!(refused_key::<Config>(&fine), None);
        for (set, key) in [
            ("grpo.eps=0", "grpo.eps"),
            ("gae.gamma=1.5", "gae.gamma"),
            ("gae.lam=-0.1", "gae.lam"),
            ("batch_rows=0", "batch_rows"),
            ("step.omega=-1", "step.omega"),
            ("gigpo.gamma=1.01", "gigpo.gamma"),
            ("gigpo.step_weight=-0.5", "gigpo.step_weight"),
            ("gigpo.eps=0", "gigpo.eps"),
            ("gigpo.norm=std_mean", "gigpo.norm"),
            ("gigpo.episode_stats=tokens", "gigpo.episode_stats"),
            ("gigpo.omega=1", "gigpo.omega"),
            ("stepopsd.alpha_clip=2", "stepopsd.alpha_clip"),
        ] {
            assert_eq!(refused_key::<Config>(&[set]).as_deref(), Some(key), "{set}");
        }
        // Enums name their variants.
        for (set, key) in [
            ("estimator=ppo", "estimator"),
            ("gae.level=episode", "gae.level"),
            ("step.kind=judge", "step.kind"),
            ("step.squash=tanh", "step.squash"),
            ("step.credit_target=all", "step.credit_target"),
            ("step.gate=always", "step.gate"),
        ] {
            assert_eq!(refused_key::<Config>(&[set]).as_deref(), Some(key), "{set}");
        }
        let gae_with_stepopsd = ["estimator=gae", "stepopsd.enabled=true"];
        assert_eq!(
            refused_key::<Config>(&gae_with_stepopsd).as_deref(),
            Some("stepopsd.enabled")
        );
        assert_eq!(
            refused_key::<Config>(&["estimator=gigpo", "stepopsd.enabled=true"]).as_deref(),
            Some("stepopsd.enabled")
        );
        assert_eq!(
            refused_key::<Config>(&["estimator=grpo", "stepopsd.enabled=true"]),
            None
        );
        assert_eq!(
            refused_key::<Config>(&["estimator=grpo_step", "step.position_norm=true"]),
            None
        );
        let proxy_by_position = ["step.kind=forward_proxy", "step.position_norm=true"];
        assert_eq!(
            refused_key::<Config>(&proxy_by_position).as_deref(),
            Some("step.position_norm")
        );
        let rule_with_residual = ["estimator=grpo_step", "step.gate=residual_contrast"];
        assert_eq!(
            refused_key::<Config>(&rule_with_residual).as_deref(),
            Some("step.gate")
        );
    }
}

/// The derived key meanings document exactly the config's keys.
#[cfg(test)]
mod config_keys {
    #[test]
    fn every_config_key_has_a_one_line_meaning() {
        embodyflow_core::config::check_key_docs::<super::Config>().unwrap();
    }
}
