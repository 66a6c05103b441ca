//! Gates: what a base policy must show before RL starts from it, checked by
//! `evaluate` on the figures it has just measured (`gate.*` keys).
//!
//! RL from outcome rewards can only sharpen what the base policy already
//! does: SimpleVLA-RL starts from a VLA that imitates (full SFT 86.5 % on
//! LIBERO-Long, one-demo SFT 17.3 %) and samples at T = 1.6 with enough
//! successes to fill its groups. A pipeline states those preconditions as
//! gates on the evaluation of its base, before its RL loop:
//!
//! | key | figure | fails when |
//! |---|---|---|
//! | `gate.min_success` | greedy success over every episode | below |
//! | `gate.max_success` | greedy success over every episode | above |
//! | `gate.min_grasp_slope` | the grasp slope ([`crate::grasp`]) | below, or none measured |
//! | `gate.max_grasp_slope` | the grasp slope | above (closing points that overshoot the object's displacement), or none measured |
//! | `gate.min_mixed_groups` | share of layouts whose `pass_at_k.samples` episodes had mixed outcomes (GRPO's groups with signal) | below |
//! | `gate.min_sampled_ratio` | sampled success at `pass_at_k.temperature` over greedy success | below |
//!
//! An unset key is no gate. The summary lists every gate with its figure and
//! verdict; a failed gate then ends the stage with exit 1 naming every
//! failure (after its outputs are committed, so the figures stay), which
//! stops a pipeline before its RL steps. `gate.enforce = false` reports the
//! gates and goes on.
//!
//! ```
//! use embodyflow_evaluate::gate::{GateConfig, Measured};
//! let gates = GateConfig { min_success: Some(0.7), min_grasp_slope: Some(0.8), ..GateConfig::default() };
//! let measured = Measured { success: 0.086, grasp_slope: Some(0.02), ..Measured::default() };
//! let verdicts = gates.check(&measured).unwrap();
//! assert!(verdicts.iter().all(|v| !v.passed));
//! assert_eq!(verdicts[0].line(), ("gate gate.min_success = 0.7".into(), "0.086: FAILED".into()));
//! ```

use serde::{Deserialize, Serialize};

/// The `gate.*` keys (see the module doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, embodyflow_core::config::ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct GateConfig {
    /// Gate: lowest greedy success over every episode (unset: none).
    pub min_success: Option<f64>,
    /// Gate: highest greedy success over every episode (unset: none).
    pub max_success: Option<f64>,
    /// Gate: lowest grasp slope, closing point on target (unset: none).
    pub min_grasp_slope: Option<f64>,
    /// Gate: highest grasp slope: closing points that overshoot the target's displacement (unset: none).
    pub max_grasp_slope: Option<f64>,
    /// Gate: lowest share of layouts whose pass@k samples mix success and failure (unset: none).
    pub min_mixed_groups: Option<f64>,
    /// Gate: lowest pass@k sampled success over greedy success (unset: none).
    pub min_sampled_ratio: Option<f64>,
    /// Whether a failed gate ends the stage with exit 1 (false: reported only).
    pub enforce: bool,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            min_success: None,
            max_success: None,
            min_grasp_slope: None,
            max_grasp_slope: None,
            min_mixed_groups: None,
            min_sampled_ratio: None,
            enforce: true,
        }
    }
}

/// The figures the gates read, as the evaluation measured them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Measured {
    /// Greedy success: the mean over runs of the episodes infrastructure
    /// did not end, the figure the summary's success lines show.
    pub success: f64,
    /// The grasp slope, when measured.
    pub grasp_slope: Option<f64>,
    /// Sampled success at the pass@k temperature, when sampled.
    pub sampled_success: Option<f64>,
    /// Share of layouts whose samples had mixed outcomes, when sampled.
    pub mixed_groups: Option<f64>,
}

/// One gate's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Its key, `gate.min_success`.
    pub key: &'static str,
    /// Its threshold.
    pub threshold: f64,
    /// The figure it read (`None`: not measured, a failure).
    pub figure: Option<f64>,
    /// Whether it passed.
    pub passed: bool,
}

impl Verdict {
    /// Its summary line: (`gate gate.min_success = 0.7`, `0.086: FAILED`).
    pub fn line(&self) -> (String, String) {
        let figure = self
            .figure
            .map_or_else(|| "not measured".to_string(), |f| format!("{f:.3}"));
        let verdict = if self.passed { "passed" } else { "FAILED" };
        (
            format!("gate {} = {}", self.key, self.threshold),
            format!("{figure}: {verdict}"),
        )
    }

    /// Why it failed, in words: `greedy success 0.086 is below gate.min_success = 0.7`.
    pub fn failure(&self) -> String {
        let (what, side) = match self.key {
            "gate.min_success" => ("greedy success", "below"),
            "gate.max_success" => ("greedy success", "above"),
            "gate.min_grasp_slope" => ("the grasp slope", "below"),
            "gate.max_grasp_slope" => ("the grasp slope", "above"),
            "gate.min_mixed_groups" => {
                ("the share of layouts with mixed sampled outcomes", "below")
            }
            _ => ("sampled over greedy success", "below"),
        };
        match self.figure {
            Some(f) => format!("{what} {f:.3} is {side} {} = {}", self.key, self.threshold),
            None => format!(
                "{what} was not measured, which {} = {} needs",
                self.key, self.threshold
            ),
        }
    }
}

impl GateConfig {
    /// Checks the thresholds when the config is loaded: each a finite
    /// number, the shares and the success bounds within [0, 1], the success
    /// bounds in order.
    pub fn validate(&self) -> embodyflow_core::Result<()> {
        let shares = [
            ("gate.min_success", self.min_success),
            ("gate.max_success", self.max_success),
            ("gate.min_mixed_groups", self.min_mixed_groups),
        ];
        for (key, value) in shares {
            if let Some(v) = value {
                embodyflow_core::config::ensure(
                    (0.0..=1.0).contains(&v),
                    key,
                    "a number in [0, 1]",
                    v,
                )?;
            }
        }
        for (key, value) in [
            ("gate.min_grasp_slope", self.min_grasp_slope),
            ("gate.max_grasp_slope", self.max_grasp_slope),
            ("gate.min_sampled_ratio", self.min_sampled_ratio),
        ] {
            if let Some(v) = value {
                embodyflow_core::config::ensure(v.is_finite(), key, "a finite number", v)?;
            }
        }
        let bounds = [
            ("gate.max_success", self.min_success, self.max_success),
            (
                "gate.max_grasp_slope",
                self.min_grasp_slope,
                self.max_grasp_slope,
            ),
        ];
        for (key, lo, hi) in bounds {
            if let (Some(lo), Some(hi)) = (lo, hi) {
                let min = key.replace("max", "min");
                embodyflow_core::config::ensure(
                    lo <= hi,
                    key,
                    format!("at least {min} = {lo}"),
                    hi,
                )?;
            }
        }
        Ok(())
    }

    /// The gates that need pass@k samples, by key, when one is set.
    pub fn needs_samples(&self) -> Option<&'static str> {
        if self.min_mixed_groups.is_some() {
            Some("gate.min_mixed_groups")
        } else if self.min_sampled_ratio.is_some() {
            Some("gate.min_sampled_ratio")
        } else {
            None
        }
    }

    /// Every set gate's verdict on `measured`, in the keys' order.
    pub fn check(&self, measured: &Measured) -> Option<Vec<Verdict>> {
        let ratio = measured
            .sampled_success
            .filter(|_| measured.success > 0.0)
            .map(|s| s / measured.success);
        let gates: [(&'static str, Option<f64>, Option<f64>, bool); 6] = [
            (
                "gate.min_success",
                self.min_success,
                Some(measured.success),
                true,
            ),
            (
                "gate.max_success",
                self.max_success,
                Some(measured.success),
                false,
            ),
            (
                "gate.min_grasp_slope",
                self.min_grasp_slope,
                measured.grasp_slope,
                true,
            ),
            (
                "gate.max_grasp_slope",
                self.max_grasp_slope,
                measured.grasp_slope,
                false,
            ),
            (
                "gate.min_mixed_groups",
                self.min_mixed_groups,
                measured.mixed_groups,
                true,
            ),
            (
                "gate.min_sampled_ratio",
                self.min_sampled_ratio,
                ratio,
                true,
            ),
        ];
        let verdicts: Vec<Verdict> = gates
            .into_iter()
            .filter_map(|(key, threshold, figure, at_least)| {
                let threshold = threshold?;
                let passed = figure.is_some_and(|f| {
                    if at_least {
                        f >= threshold
                    } else {
                        f <= threshold
                    }
                });
                Some(Verdict {
                    key,
                    threshold,
                    figure,
                    passed,
                })
            })
            .collect();
        (!verdicts.is_empty()).then_some(verdicts)
    }
}

/// The share of layouts whose `n` samples had mixed outcomes (`0 < k < n`);
/// `None` with fewer than two samples per layout or no layout.
pub fn mixed_share(successes: &[usize], n: usize) -> Option<f64> {
    (n >= 2 && !successes.is_empty()).then(|| {
        let mixed = successes.iter().filter(|&&k| k > 0 && k < n).count();
        mixed as f64 / successes.len() as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_gate_reads_its_figure_and_unset_gates_are_none() {
        assert_eq!(GateConfig::default().check(&Measured::default()), None);
        let gates = GateConfig {
            min_success: Some(0.05),
            max_success: Some(0.35),
            min_grasp_slope: Some(0.8),
            max_grasp_slope: Some(1.25),
            min_mixed_groups: Some(0.25),
            min_sampled_ratio: Some(0.5),
            enforce: true,
        };
        let measured = Measured {
            success: 0.2,
            grasp_slope: Some(0.9),
            sampled_success: Some(0.08),
            mixed_groups: Some(0.3),
        };
        let verdicts = gates.check(&measured).unwrap();
        let passed: Vec<(&str, bool)> = verdicts.iter().map(|v| (v.key, v.passed)).collect();
        assert_eq!(
            passed,
            [
                ("gate.min_success", true),
                ("gate.max_success", true),
                ("gate.min_grasp_slope", true),
                ("gate.max_grasp_slope", true),
                ("gate.min_mixed_groups", true),
                // 0.08 / 0.2 = 0.4 < 0.5
                ("gate.min_sampled_ratio", false),
            ]
        );
        assert_eq!(
            verdicts[5].failure(),
            "sampled over greedy success 0.400 is below gate.min_sampled_ratio = 0.5"
        );
        // Closing points that overshoot the object's displacement are no imitation.
        let overshoot = Measured {
            grasp_slope: Some(2.5),
            ..measured
        };
        let verdicts = gates.check(&overshoot).unwrap();
        assert!(verdicts[2].passed && !verdicts[3].passed);
        assert_eq!(
            verdicts[3].failure(),
            "the grasp slope 2.500 is above gate.max_grasp_slope = 1.25"
        );
        // Above the one-demo band, no slope measured: both fail and say so.
        let blind = Measured {
            success: 0.5,
            ..Measured::default()
        };
        let verdicts = gates.check(&blind).unwrap();
        assert!(!verdicts[1].passed && !verdicts[2].passed);
        assert_eq!(
            verdicts[2].failure(),
            "the grasp slope was not measured, which gate.min_grasp_slope = 0.8 needs"
        );
        assert_eq!(verdicts[1].line().1, "0.500: FAILED");
    }

    #[test]
    fn thresholds_are_checked_when_loaded() {
        let bad = |gates: GateConfig| gates.validate().unwrap_err().to_string();
        assert!(
            bad(GateConfig {
                min_success: Some(1.5),
                ..GateConfig::default()
            })
            .contains("gate.min_success")
        );
        assert!(
            bad(GateConfig {
                min_success: Some(0.5),
                max_success: Some(0.3),
                ..GateConfig::default()
            })
            .contains("gate.max_success")
        );
        assert!(
            bad(GateConfig {
                min_grasp_slope: Some(f64::NAN),
                ..GateConfig::default()
            })
            .contains("gate.min_grasp_slope")
        );
        assert!(
            bad(GateConfig {
                min_grasp_slope: Some(0.8),
                max_grasp_slope: Some(0.5),
                ..GateConfig::default()
            })
            .contains("gate.max_grasp_slope")
        );
    }

    #[test]
    fn mixed_groups_are_layouts_with_some_but_not_all_successes() {
        assert_eq!(mixed_share(&[0, 3, 8, 1], 8), Some(0.5));
        assert_eq!(mixed_share(&[1], 1), None);
        assert_eq!(mixed_share(&[], 8), None);
    }
}
