//! The estimators, listed once ([`ESTIMATORS`]), and the stage's config
//! built from their declarations: the sections they declare (each once,
//! whoever declares it first), `estimator = NAME` checked against their
//! names, the key docs gathered from the sections' doc comments, and the
//! checks run in order — `batch_rows`, each section's values, a section
//! switched on for an estimator that does not declare it
//! (`stepopsd.enabled` with gae), the chosen estimator's own relations.
//! `--help` (the `estimator` key's meaning and the list of estimators with
//! what each computes, [`listing`]), `--print-config`, the runner's
//! pre-check and the run all see the same list.
//!
//! ```
//! use embodyflow_compute_advantages::ESTIMATORS;
//! let names: Vec<&str> = ESTIMATORS.iter().map(|e| e.name).collect();
//! assert_eq!(&names[..5], ["grpo", "dr_grpo", "gae", "grpo_step", "gigpo"]);
//! assert!(names.contains(&"rloo"));
//! ```

use std::sync::LazyLock;

use embodyflow_core::checks::either;
use embodyflow_core::config::{at_least, keys_of};
use embodyflow_core::schemas::TableName;
use embodyflow_core::section;
use embodyflow_core::stage::{OutputConfig, StageConfig};
use embodyflow_core::{Error, Result};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::config::{Common, Config, Section};
use crate::estimator::Estimator;
use crate::{gae, gigpo, grpo, outcome, step};

/// Every estimator the stage runs, in the order `--help` names them.
pub static ESTIMATORS: &[&Estimator] = &[
    &grpo::GRPO,
    &grpo::DR_GRPO,
    &gae::GAE,
    &step::GRPO_STEP,
    &gigpo::GIGPO,
    &outcome::RLOO,
    &outcome::OPO,
    &outcome::GPG,
    &outcome::GRPO_PASSK,
    &gae::REINFORCE_PLUS_PLUS,
    &outcome::REINFORCE_PLUS_PLUS_BASELINE,
    #[cfg(test)]
    &crate::toy::TOY,
];

/// The estimator named `name`.
pub(crate) fn estimator(name: &str) -> Option<&'static Estimator> {
    ESTIMATORS.iter().copied().find(|e| e.name == name)
}

/// The chosen estimator of a loaded config.
pub(crate) fn chosen(config: &Config) -> &'static Estimator {
    estimator(&config.estimator).expect("`estimator` was checked at load")
}

/// Every declared section, once, in the order of first declaration.
pub(crate) fn sections() -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    for section in ESTIMATORS.iter().flat_map(|e| e.sections) {
        if !out.iter().any(|s| s.name == section.name) {
            out.push(*section);
        }
    }
    out
}

/// `--help`'s list of the estimators, each with what it computes.
pub(crate) fn listing() -> String {
    let width = ESTIMATORS.iter().map(|e| e.name.len()).max().unwrap_or(0);
    let mut text = String::from("Estimators (estimator = NAME):\n");
    for estimator in ESTIMATORS {
        text.push_str(&format!(
            "  {:<width$}   {}\n",
            estimator.name, estimator.about
        ));
    }
    text
}

/// The meaning of `estimator`, naming every registered estimator.
static ESTIMATOR_MEANING: LazyLock<String> = LazyLock::new(|| {
    let names: Vec<&str> = ESTIMATORS.iter().map(|e| e.name).collect();
    format!("advantage estimator: {}", either(&names))
});

impl Default for Config {
    fn default() -> Self {
        Config::from_parts(Common::default(), section::defaults(&sections()))
    }
}

impl Serialize for Config {
    fn serialize<S: Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        self.to_tree().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Config {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        let tree = Value::deserialize(deserializer)?;
        from_tree(tree).map_err(serde::de::Error::custom)
    }
}

/// The config of a resolved tree: the shared keys typed (a bad value names
/// its dotted key), `estimator` a registered name, each section's tree
/// kept for its checks ([`Config::validate`]).
fn from_tree(tree: Value) -> Result<Config> {
    let Value::Object(mut map) = tree else {
        return Err(Error::BadValue {
            key: String::new(),
            reason: format!("expected a table of settings, found {tree}"),
        });
    };
    let mut sections = section::defaults(&self::sections());
    for (name, table) in sections.as_object_mut().expect("tables by name") {
        if let Some(given) = map.remove(name) {
            *table = given;
        }
    }
    let common: Common =
        serde_path_to_error::deserialize(Value::Object(map)).map_err(|e| Error::BadValue {
            key: e.path().to_string(),
            reason: e.inner().to_string(),
        })?;
    if estimator(&common.estimator).is_none() {
        let names: Vec<String> = ESTIMATORS.iter().map(|e| format!("`{}`", e.name)).collect();
        return Err(Error::BadValue {
            key: "estimator".into(),
            reason: format!(
                "unknown variant `{}`, expected one of {}",
                common.estimator,
                names.join(", ")
            ),
        });
    }
    Ok(Config::from_parts(common, sections))
}

impl StageConfig for Config {
    fn key_docs() -> Vec<(String, &'static str)> {
        let mut keys = keys_of::<Common>();
        for (key, meaning) in &mut keys {
            if key == "estimator" {
                *meaning = ESTIMATOR_MEANING.as_str();
            }
        }
        for section in sections() {
            section.key_docs(&mut keys);
        }
        keys
    }

    fn output(&self) -> &OutputConfig {
        &self.output
    }

    fn from_tree(tree: Value) -> Result<Self> {
        from_tree(tree)
    }

    /// The chosen estimator's reads under this config ([`Estimator::reads`]).
    fn reads(&self) -> Vec<TableName> {
        (chosen(self).reads)(self)
    }

    /// `batch_rows` at least 1; each section's ranges (its
    /// [`crate::config::SectionConfig::check`]); a section switched on
    /// (`stepopsd.enabled`) only for an estimator that declares it; the
    /// chosen estimator's relations between keys
    /// ([`Estimator::check`]: grpo_step's residual_contrast gate needs
    /// `step.kind = forward_proxy`).
    fn validate(&self) -> Result<()> {
        at_least("batch_rows", self.batch_rows, 1)?;
        let chosen = chosen(self);
        let sections = sections();
        section::check(&sections, &self.sections, self)?;
        for section in &sections {
            if let Some((key, what)) = section.switch
                && self.sections[section.name].get(key) == Some(&Value::Bool(true))
                && !chosen.sections.iter().any(|s| s.name == section.name)
            {
                let declaring: Vec<&str> = ESTIMATORS
                    .iter()
                    .filter(|e| e.sections.iter().any(|s| s.name == section.name))
                    .map(|e| e.name)
                    .collect();
                return Err(Error::BadValue {
                    key: format!("{}.{key}", section.name),
                    reason: format!(
                        "expected false with estimator = {} ({what} {}), found true",
                        chosen.name,
                        either(&declaring)
                    ),
                });
            }
        }
        (chosen.check)(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_core::config::{ConfigReport, refused_key};
    use embodyflow_core::spec;

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

    #[test]
    fn refusals_name_what_the_declarations_allow() {
        let message = |sets: &[&str]| {
            let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
            embodyflow_core::config::load_config::<Config>(None, &sets)
                .err()
                .unwrap()
                .to_string()
        };
        assert_eq!(
            message(&["estimator=gae", "stepopsd.enabled=true"]),
            "config key `stepopsd.enabled`: expected false with estimator = gae (StepOPSD reweights grpo, dr_grpo or grpo_step), found true"
        );
        assert!(
            message(&["estimator=ppo"]).starts_with(
                "config key `estimator`: unknown variant `ppo`, expected one of `grpo`, `dr_grpo`, `gae`, `grpo_step`, `gigpo`"
            ),
            "{}",
            message(&["estimator=ppo"])
        );
        assert_eq!(
            message(&["gae.level=episode"]),
            "config key `gae.level`: unknown variant `episode`, expected `token` or `decision`"
        );
    }

    #[test]
    fn every_config_key_has_a_one_line_meaning() {
        embodyflow_core::config::check_key_docs::<Config>().unwrap();
    }

    /// What `--print-config` reports an estimator's config reads, under
    /// every setting that switches a read on: each table one of the
    /// stage's conditional reads in its spec, and the settings' own.
    #[test]
    fn an_estimators_reads_follow_its_settings_and_are_conditional_reads_of_the_spec() {
        let reads = |sets: &[&str]| -> Option<Vec<String>> {
            let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
            let report = ConfigReport::resolve::<Config>("", "", None, &sets);
            report.problem.is_none().then_some(report.reads)
        };
        let switches: [&[&str]; 4] = [
            &[],
            &["stepopsd.enabled=true"],
            &["step.kind=forward_proxy"],
            &["step.gate=prompt", "step.kind=forward_proxy"],
        ];
        for estimator in ESTIMATORS {
            for switch in switches {
                let chosen = format!("estimator={}", estimator.name);
                let sets: Vec<&str> = std::iter::once(chosen.as_str())
                    .chain(switch.iter().copied())
                    .collect();
                // A section the estimator does not declare is refused.
                let Some(reads) = reads(&sets) else { continue };
                for table in reads {
                    let read = spec::COMPUTE_ADVANTAGES
                        .reads
                        .iter()
                        .find(|r| r.table.as_str() == table);
                    assert!(
                        read.is_some_and(|r| r.need != spec::Need::Always),
                        "{}: {table}",
                        estimator.name
                    );
                }
            }
        }
        let teacher = || vec!["teacher_logp".to_string()];
        assert_eq!(reads(&["estimator=grpo"]), Some(vec![]));
        assert_eq!(reads(&["estimator=gae"]), Some(vec![]));
        assert_eq!(
            reads(&["estimator=grpo", "stepopsd.enabled=true"]),
            Some(teacher())
        );
        assert_eq!(
            reads(&["estimator=dr_grpo", "stepopsd.enabled=true"]),
            Some(teacher())
        );
        assert_eq!(
            reads(&["estimator=grpo_step", "step.kind=rule"]),
            Some(vec![])
        );
        assert_eq!(
            reads(&["estimator=grpo_step", "step.kind=forward_proxy"]),
            Some(teacher())
        );
        assert_eq!(
            reads(&[
                "estimator=grpo_step",
                "step.kind=rule",
                "step.gate=prompt",
                "stepopsd.enabled=true"
            ]),
            Some(vec!["teacher_logp".to_string(), "step_gates".to_string()])
        );
    }

    #[test]
    fn the_config_round_trips_through_its_tree() {
        let resolved = embodyflow_core::config::load_config::<Config>(
            None,
            &["estimator=gigpo".into(), "gigpo.gamma=0.9".into()],
        )
        .unwrap();
        let config: Config = serde_json::from_value(resolved.json.clone()).unwrap();
        assert_eq!(config, resolved.config);
        assert_eq!(serde_json::to_value(&config).unwrap(), resolved.json);
        let gigpo: gigpo::GigpoConfig = config.section("gigpo");
        assert_eq!(gigpo.gamma, 0.9);
    }

    /// The estimators a shipped binary lists, in order (the test-only toy
    /// left out).
    fn shipped() -> Vec<&'static str> {
        ESTIMATORS
            .iter()
            .filter(|e| !std::ptr::eq(**e, &crate::toy::TOY))
            .map(|e| e.name)
            .collect()
    }

    /// The spans in backticks of `text` that are estimator names (lower
    /// case and `_`), in order.
    fn names_in(text: &str) -> Vec<&str> {
        text.split('`')
            .skip(1)
            .step_by(2)
            .filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .collect()
    }

    /// Cell `cell` of the first table row of `page` (under docs/src) that
    /// starts with `start`.
    fn cell(page: &str, start: &str, cell: usize) -> String {
        let path = format!("{}/../../docs/src/{page}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let row = text
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("{page}: no row `{start}`"));
        row.split('|').nth(cell).unwrap().to_string()
    }

    #[test]
    fn the_hand_kept_lists_of_estimators_are_the_registry() {
        let command_line = cell("command-line.md", "| `algorithm.adv_estimator`", 3);
        let ours = command_line.split_once("`estimator` (").unwrap().1;
        assert_eq!(names_in(ours), shipped(), "docs/src/command-line.md");
        let stage = cell("stages/compute-advantages.md", "| `estimator` |", 3);
        assert_eq!(
            names_in(&stage),
            shipped(),
            "docs/src/stages/compute-advantages.md"
        );
        let description = env!("CARGO_PKG_DESCRIPTION");
        let listed: Vec<&str> = description
            .split_once("estimators: ")
            .unwrap()
            .1
            .trim_end_matches('.')
            .split(", ")
            .collect();
        assert_eq!(listed, shipped(), "the crate's description");
        let path = format!(
            "{}/../../docs/src/algorithms/outcome.md",
            env!("CARGO_MANIFEST_DIR")
        );
        let outcome = std::fs::read_to_string(path).unwrap();
        let rows: Vec<&str> = outcome
            .lines()
            .filter(|l| l.starts_with("| `") && !l.starts_with("| `estimator`"))
            .map(|l| names_in(l)[0])
            .collect();
        assert!(rows.len() >= 6, "{rows:?}");
        for name in rows {
            assert!(
                estimator(name).is_some(),
                "docs/src/algorithms/outcome.md: {name}"
            );
        }
    }

    #[test]
    fn help_lists_every_estimator_with_what_it_computes() {
        let listing = listing();
        for estimator in ESTIMATORS {
            assert!(
                listing
                    .lines()
                    .any(|l| l.trim_start().starts_with(estimator.name)
                        && l.ends_with(estimator.about)),
                "{listing}"
            );
        }
    }
}
