//! Golden tests against veRL 0.9.1 (`verl/trainer/ppo/core_algos.py`): the
//! fixtures in `tests/fixtures/verl/` hold veRL's own outputs on seeded inputs,
//! written by `scripts/verl_golden.py`. Maximum absolute difference: 1e-6.

use std::collections::HashMap;

use embodyflow_algos::gae::{GaeParams, gae_tokens, whiten};
use embodyflow_algos::grpo::{GroupNorm, episode_advantages};
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
    let path = format!(
        "{}/../../tests/fixtures/verl/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let fixture: Fixture<C> = serde_json::from_str(&text).unwrap();
    assert_eq!(fixture.verl_version, "0.9.1");
    fixture
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
