//! compute-advantages' `diagnostics.json` as the reports read it: the
//! figures the report tool and the pipeline runner's ablation table show
//! (groups kept by dynamic sampling, the episode advantages' spread, the
//! step path's sign flips), typed, so that a file without one of them is an
//! error naming it. Read without any query engine, by every crate that
//! shows them.
//!
//! ```
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join(embodyflow_core::spec::DIAGNOSTICS_FILE);
//! std::fs::write(&path, r#"{"estimator": "grpo", "groups": 4, "kept_groups": 3}"#).unwrap();
//! let read = embodyflow_core::diagnostics::VariantDiagnostics::read(dir.path()).unwrap().unwrap();
//! assert_eq!((read.kept_groups, read.groups), (3, 4));
//! ```

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::spec;

/// The parts of compute-advantages' `diagnostics.json` that the reports
/// show (the report tool's and the pipeline runner's ablation tables), typed: a
/// file without one of them is an error naming it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct VariantDiagnostics {
    /// Estimator.
    #[serde(default)]
    pub estimator: String,
    /// Groups in the input.
    pub groups: u64,
    /// Groups kept by dynamic sampling.
    pub kept_groups: u64,
    /// Standard deviation of the episode advantages written (absent in
    /// diagnostics written before it was recorded).
    #[serde(default)]
    pub episode_adv_std: Option<f64>,
    /// The step path's figures.
    #[serde(default)]
    pub step: Option<StepPart>,
}

impl VariantDiagnostics {
    /// Reads `dir/diagnostics.json` of a compute-advantages output; `None`
    /// when there is none.
    pub fn read(dir: &Path) -> Result<Option<VariantDiagnostics>> {
        let path = dir.join(spec::DIAGNOSTICS_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| Error::BadInput(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(&path, e)),
        }
    }
}

/// Step-path figures of `diagnostics.json`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StepPart {
    /// Responses processed.
    pub responses: u64,
    /// Responses with at least one non-zero A^S token.
    pub responses_with_step_adv: u64,
    /// Sign flips over all credit-target tokens.
    pub sign_flips: FlipPart,
    /// Sign flips on rule-correct steps.
    pub sign_flips_rule_correct: FlipPart,
    /// Sign flips on rule-wrong steps.
    pub sign_flips_rule_wrong: FlipPart,
    /// AUC of A^S between rule-correct and rule-wrong steps (forward_proxy).
    pub step_adv_auc: Option<f64>,
}

/// A flip count.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
pub struct FlipPart {
    /// Flipped tokens.
    pub flipped: u64,
    /// Tokens.
    pub tokens: u64,
}
