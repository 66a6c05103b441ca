//! Golden tests against veRL 0.9.1 (`verl/trainer/ppo/core_algos.py`): the
//! fixtures in `tests/fixtures/verl/` hold veRL's own outputs on seeded inputs,
//! written by `scripts/verl_golden.py`. Maximum absolute difference: 1e-6.
//! `holes.json` (`scripts/verl_golden.py --holes`) holds veRL's own masked
//! GAE (whitened by its `masked_whiten`) and GRPO on response masks with
//! holes and rewards on several tokens, holes included; there veRL's GAE
//! leaves values at holes that its losses mask out, so GAE is compared on
//! the valid tokens and ours are 0 at the holes. `outcome.json`
//! (`scripts/verl_golden.py --outcome`) holds veRL's other outcome
//! estimators (RLOO, OPO, GPG, REINFORCE++-baseline, GRPO pass@k and the
//! token-level REINFORCE++) on batches with a group of one, an all-equal
//! group, and masks with and without holes, and veRL's refusal of pass@k on
//! a group of one.

use std::collections::HashMap;

use embodyflow_algos::AlgoError;
use embodyflow_algos::gae::{
    GaeParams, WhitenStats, gae_tokens, gae_tokens_masked_into, whiten, zero_holes,
};
use embodyflow_algos::grpo::{GroupNorm, episode_advantages};
use embodyflow_algos::outcome;
use serde::Deserialize;

const TOLERANCE: f64 = 1e-6;

#[derive(Deserialize)]
struct Fixture<C> {
    verl_version: String,
    cases: Vec<C>,
}

#[derive(Deserialize)]
struct GrpoCase {
    norm_adv_by_std: bool,
    epsilon: f64,
    group: Vec<String>,
    scores: Vec<f32>,
    advantages: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
struct GaeCase {
    gamma: f32,
    lam: f32,
    token_rewards: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    advantages: Vec<Vec<f32>>,
    returns: Vec<Vec<f32>>,
}

fn load<C: for<'de> Deserialize<'de>>(name: &str) -> Fixture<C> {
    let fixture: Fixture<C> = serde_json::from_str(&read(name)).unwrap();
    assert_eq!(fixture.verl_version, "0.9.1");
    fixture
}

fn read(name: &str) -> String {
    let path = format!(
        "{}/../../tests/fixtures/verl/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[derive(Deserialize)]
struct Holes {
    verl_version: String,
    gae: Vec<HolesGae>,
    grpo: Vec<HolesGrpo>,
}

#[derive(Deserialize)]
struct HolesGae {
    gamma: f32,
    lam: f32,
    response_mask: Vec<Vec<bool>>,
    token_rewards: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    advantages: Vec<Vec<f32>>,
    returns: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
struct HolesGrpo {
    norm_adv_by_std: bool,
    epsilon: f64,
    group: Vec<String>,
    response_mask: Vec<Vec<bool>>,
    token_rewards: Vec<Vec<f32>>,
    advantages: Vec<Vec<f32>>,
}

/// Dense group indices in first-appearance order.
fn dense(groups: &[String]) -> Vec<u32> {
    let mut index: HashMap<&str, u32> = HashMap::new();
    groups
        .iter()
        .map(|g| {
            let next = index.len() as u32;
            *index.entry(g.as_str()).or_insert(next)
        })
        .collect()
}

fn max_abs_diff(a: impl IntoIterator<Item = f32>, b: impl IntoIterator<Item = f32>) -> f64 {
    a.into_iter()
        .zip(b)
        .map(|(x, y)| (f64::from(x) - f64::from(y)).abs())
        .fold(0.0, f64::max)
}

#[test]
fn grpo_outcome_advantage_matches_verl() {
    let fixture: Fixture<GrpoCase> = load("grpo.json");
    for case in fixture.cases {
        let mut dense: HashMap<&str, u32> = HashMap::new();
        let groups: Vec<u32> = case
            .group
            .iter()
            .map(|g| {
                let next = dense.len() as u32;
                *dense.entry(g.as_str()).or_insert(next)
            })
            .collect();
        let norm = GroupNorm {
            norm_by_std: case.norm_adv_by_std,
            eps: case.epsilon,
        };
        let ours = episode_advantages(&case.scores, &groups, norm);
        let ours_tokens = case
            .advantages
            .iter()
            .zip(&ours)
            .flat_map(|(row, &a)| vec![a; row.len()]);
        let diff = max_abs_diff(ours_tokens, case.advantages.iter().flatten().copied());
        eprintln!(
            "grpo norm_by_std={}: {} tokens, max abs diff {diff:e}",
            case.norm_adv_by_std,
            case.advantages.iter().map(Vec::len).sum::<usize>()
        );
        assert!(
            diff <= TOLERANCE,
            "norm_by_std={}: max abs diff {diff:e}",
            case.norm_adv_by_std
        );
    }
}

#[test]
fn gae_advantage_return_matches_verl() {
    let fixture: Fixture<GaeCase> = load("gae.json");
    for case in fixture.cases {
        let mut offsets = vec![0];
        for row in &case.values {
            offsets.push(offsets.last().unwrap() + row.len());
        }
        let rewards: Vec<f32> = case.token_rewards.concat();
        let values: Vec<f32> = case.values.concat();
        let (mut advantages, returns) = gae_tokens(
            &rewards,
            &values,
            &offsets,
            GaeParams {
                gamma: case.gamma,
                lam: case.lam,
            },
        );
        whiten(&mut advantages).unwrap();
        let diff_adv = max_abs_diff(advantages, case.advantages.concat());
        let diff_ret = max_abs_diff(returns, case.returns.concat());
        eprintln!(
            "gae gamma {} lam {}: {} tokens, max abs diff {diff_adv:e} (advantages) {diff_ret:e} (returns)",
            case.gamma,
            case.lam,
            offsets.last().unwrap()
        );
        assert!(
            diff_adv <= TOLERANCE,
            "gamma {} lam {}: advantages differ by {diff_adv:e}",
            case.gamma,
            case.lam
        );
        assert!(
            diff_ret <= TOLERANCE,
            "gamma {} lam {}: returns differ by {diff_ret:e}",
            case.gamma,
            case.lam
        );
    }
}

#[test]
fn masked_gae_with_token_rewards_matches_verl() {
    let fixture: Holes = serde_json::from_str(&read("holes.json")).unwrap();
    assert_eq!(fixture.verl_version, "0.9.1");
    for case in fixture.gae {
        let mut offsets = vec![0];
        for row in &case.values {
            offsets.push(offsets.last().unwrap() + row.len());
        }
        let mask: Vec<bool> = case.response_mask.concat();
        let holes = mask.iter().filter(|&&m| !m).count();
        assert!(
            holes > 0
                && case
                    .token_rewards
                    .concat()
                    .iter()
                    .filter(|&&r| r != 0.0)
                    .count()
                    > case.values.len()
        );
        let (mut advantages, mut returns) = (Vec::new(), Vec::new());
        gae_tokens_masked_into(
            &case.token_rewards.concat(),
            &case.values.concat(),
            &mask,
            &offsets,
            GaeParams {
                gamma: case.gamma,
                lam: case.lam,
            },
            &mut advantages,
            &mut returns,
        );
        let mut stats = WhitenStats::default();
        stats.add_masked(&advantages, &mask);
        stats.whitening().unwrap().apply(&mut advantages);
        zero_holes(&mut advantages, &mask);
        let valid = |v: Vec<f32>| -> Vec<f32> {
            v.into_iter()
                .zip(&mask)
                .filter(|&(_, &m)| m)
                .map(|(x, _)| x)
                .collect()
        };
        let diff_adv = max_abs_diff(valid(advantages.clone()), valid(case.advantages.concat()));
        let diff_ret = max_abs_diff(valid(returns.clone()), valid(case.returns.concat()));
        eprintln!(
            "masked gae gamma {} lam {}: {} tokens ({holes} holes), max abs diff {diff_adv:e} (advantages) {diff_ret:e} (returns)",
            case.gamma,
            case.lam,
            mask.len()
        );
        assert!(diff_adv <= TOLERANCE, "advantages differ by {diff_adv:e}");
        assert!(diff_ret <= TOLERANCE, "returns differ by {diff_ret:e}");
        assert!(
            advantages
                .iter()
                .zip(&returns)
                .zip(&mask)
                .all(|((&a, &r), &m)| m || (a == 0.0 && r == 0.0)),
            "holes get 0"
        );
    }
}

#[test]
fn grpo_on_token_rewards_with_holes_matches_verl() {
    let fixture: Holes = serde_json::from_str(&read("holes.json")).unwrap();
    for case in fixture.grpo {
        // veRL's score: the sum of every token reward, holes included.
        let scores: Vec<f32> = case
            .token_rewards
            .iter()
            .map(|r| r.iter().map(|&x| f64::from(x)).sum::<f64>() as f32)
            .collect();
        let norm = GroupNorm {
            norm_by_std: case.norm_adv_by_std,
            eps: case.epsilon,
        };
        let ours = episode_advantages(&scores, &dense(&case.group), norm);
        let ours_tokens = case
            .response_mask
            .iter()
            .zip(&ours)
            .flat_map(|(mask, &a)| mask.iter().map(move |&m| if m { a } else { 0.0 }));
        let diff = max_abs_diff(ours_tokens, case.advantages.iter().flatten().copied());
        let holes = case.response_mask.iter().flatten().filter(|&&m| !m).count();
        eprintln!(
            "grpo with holes norm_by_std={}: {} tokens ({holes} holes), max abs diff {diff:e}",
            case.norm_adv_by_std,
            case.advantages.iter().map(Vec::len).sum::<usize>()
        );
        assert!(holes > 0);
        assert!(diff <= TOLERANCE, "max abs diff {diff:e}");
    }
}

#[derive(Deserialize)]
struct OutcomeCase {
    estimator: String,
    config: HashMap<String, serde_json::Value>,
    group: Vec<String>,
    response_mask: Vec<Vec<bool>>,
    token_rewards: Vec<Vec<f32>>,
    #[serde(default)]
    raises: Option<String>,
    #[serde(default)]
    advantages: Vec<Vec<f32>>,
    #[serde(default)]
    returns: Vec<Vec<f32>>,
}

impl OutcomeCase {
    fn number(&self, key: &str) -> f32 {
        self.config[key].as_f64().unwrap() as f32
    }

    /// Our advantages and returns per token, every row concatenated.
    fn ours(&self) -> Result<(Vec<f32>, Vec<f32>), AlgoError> {
        let mask: Vec<bool> = self.response_mask.concat();
        if self.estimator == "reinforce_plus_plus" {
            return Ok(reinforce_plus_plus(self, self.number("gamma"), &mask));
        }
        let scores: Vec<f32> = self
            .token_rewards
            .iter()
            .map(|r| r.iter().map(|&x| f64::from(x)).sum::<f64>() as f32)
            .collect();
        let groups = dense(&self.group);
        let valid: Vec<usize> = self
            .response_mask
            .iter()
            .map(|m| m.iter().filter(|&&v| v).count())
            .collect();
        let per_trajectory = match self.estimator.as_str() {
            "rloo" => outcome::rloo(&scores, &groups),
            "opo" => outcome::opo(&scores, &groups, &valid),
            "gpg" => outcome::gpg(&scores, &groups),
            "reinforce_plus_plus_baseline" => {
                outcome::reinforce_plus_plus_baseline(&scores, &groups, &valid)?
            }
            "grpo_passk" => {
                let norm = GroupNorm {
                    norm_by_std: self.config["norm_adv_by_std_in_grpo"].as_bool().unwrap(),
                    eps: 1e-6,
                };
                outcome::grpo_passk(&scores, &groups, norm)?
            }
            other => panic!("no estimator {other}"),
        };
        let tokens: Vec<f32> = self
            .response_mask
            .iter()
            .zip(&per_trajectory)
            .flat_map(|(mask, &a)| mask.iter().map(move |&m| if m { a } else { 0.0 }))
            .collect();
        Ok((tokens.clone(), tokens))
    }
}

/// REINFORCE++: GAE with V = 0 and lambda = 1 over the valid tokens,
/// whitened over them; holes get 0.
fn reinforce_plus_plus(case: &OutcomeCase, gamma: f32, mask: &[bool]) -> (Vec<f32>, Vec<f32>) {
    let mut offsets = vec![0];
    for row in &case.token_rewards {
        offsets.push(offsets.last().unwrap() + row.len());
    }
    let rewards = case.token_rewards.concat();
    let (mut advantages, mut returns) = (Vec::new(), Vec::new());
    gae_tokens_masked_into(
        &rewards,
        &vec![0.0; rewards.len()],
        mask,
        &offsets,
        GaeParams { gamma, lam: 1.0 },
        &mut advantages,
        &mut returns,
    );
    let mut stats = WhitenStats::default();
    stats.add_masked(&advantages, mask);
    stats.whitening().unwrap().apply(&mut advantages);
    zero_holes(&mut advantages, mask);
    (advantages, returns)
}

#[test]
fn outcome_estimators_match_verl() {
    let fixture: Fixture<OutcomeCase> = load("outcome.json");
    let mut seen = std::collections::BTreeSet::new();
    for case in &fixture.cases {
        let holes = case.response_mask.iter().flatten().filter(|&&m| !m).count();
        let label = format!("{} {:?} ({holes} holes)", case.estimator, case.config);
        if let Some(raises) = &case.raises {
            assert!(raises.contains("at least 2 samples per group"), "{raises}");
            assert!(
                matches!(case.ours(), Err(AlgoError::GroupTooSmall { size: 1, .. })),
                "{label}: veRL raises"
            );
            continue;
        }
        let (advantages, returns) = case.ours().unwrap();
        let diff_adv = max_abs_diff(advantages, case.advantages.concat());
        let diff_ret = max_abs_diff(returns, case.returns.concat());
        eprintln!(
            "{label}: {} tokens, max abs diff {diff_adv:e} (advantages) {diff_ret:e} (returns)",
            case.response_mask.iter().map(Vec::len).sum::<usize>()
        );
        assert!(
            diff_adv <= TOLERANCE,
            "{label}: advantages differ by {diff_adv:e}"
        );
        assert!(
            diff_ret <= TOLERANCE,
            "{label}: returns differ by {diff_ret:e}"
        );
        seen.insert((case.estimator.as_str(), holes > 0));
    }
    assert_eq!(
        seen.len(),
        12,
        "six estimators, with and without holes: {seen:?}"
    );
}
