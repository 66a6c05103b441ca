//! Golden test against OpenVLA-OFT's action and proprio normalisation:
//! `tests/fixtures/openvla/normalization.json` holds the outputs of the
//! reference's own `_unnormalize_actions` (with `_check_unnorm_key`) and
//! `normalize_proprio` (`scripts/openvla_golden.py`, moojink/openvla-oft
//! 213c5ff8) on seeded statistics, under both of its normalisation types:
//! with and without the gripper's mask, one dataset or two, `unnorm_key`
//! given, left out (refused with two) or unknown (refused), values past the
//! bounds. Both sides compute in f64 in the same order; the tolerance
//! (1e-12 relative) only covers the JSON's decimal round trip.

use embodyflow_algos::action_stats::{DatasetStatistics, Normalization, StatisticsError};
use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize)]
struct Fixture {
    reference: String,
    actions: Vec<ActionCase>,
    proprio: Vec<ProprioCase>,
}

#[derive(Deserialize)]
struct ActionCase {
    normalization: String,
    statistics: Value,
    unnorm_key: Option<String>,
    normalized: Vec<Vec<f64>>,
    #[serde(default)]
    expected: Option<Vec<Vec<f64>>>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct ProprioCase {
    normalization: String,
    statistics: Value,
    raw: Vec<Vec<f64>>,
    expected: Vec<Vec<f64>>,
}

fn fixture() -> Fixture {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/openvla/normalization.json"
    );
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn normalization(name: &str) -> Normalization {
    match name {
        "bounds" => Normalization::Bounds,
        "bounds_q99" => Normalization::BoundsQ99,
        other => panic!("fixture normalization {other}"),
    }
}

fn assert_close(ours: &[f64], expected: &[Vec<f64>], what: &str) {
    let expected: Vec<f64> = expected.iter().flatten().copied().collect();
    assert_eq!(ours.len(), expected.len(), "{what}");
    for (i, (a, b)) in ours.iter().zip(&expected).enumerate() {
        assert!(
            (a - b).abs() <= 1e-12 * b.abs().max(1.0),
            "{what}: value {i}: ours {a}, reference {b}"
        );
    }
}

#[test]
fn unnormalized_actions_equal_openvla_oft() {
    let fixture = fixture();
    assert!(
        fixture
            .reference
            .starts_with("moojink/openvla-oft 213c5ff8")
    );
    assert_eq!(fixture.actions.len(), 30);
    let (mut checked, mut refused) = (0, 0);
    for (n, case) in fixture.actions.iter().enumerate() {
        let what = format!(
            "case {n} ({}, unnorm_key {:?})",
            case.normalization, case.unnorm_key
        );
        let stats = DatasetStatistics::from_json(&case.statistics.to_string()).unwrap();
        let chosen = stats.dataset(case.unnorm_key.as_deref());
        match (&case.error, chosen) {
            (Some(kind), Err(error)) => {
                match (kind.as_str(), &error) {
                    ("ambiguous", StatisticsError::Ambiguous { keys }) => {
                        assert_eq!(keys, "dataset_0, dataset_1", "{what}")
                    }
                    ("unknown", StatisticsError::UnknownKey { key, .. }) => {
                        assert_eq!(key, "missing", "{what}")
                    }
                    _ => panic!("{what}: the reference refused ({kind}), we said {error}"),
                }
                refused += 1;
            }
            (None, Ok(dataset)) => {
                let bounds = dataset
                    .action_bounds(normalization(&case.normalization))
                    .unwrap();
                let flat: Vec<f64> = case.normalized.iter().flatten().copied().collect();
                let ours = bounds.unnormalize(&flat).unwrap();
                assert_close(&ours, case.expected.as_ref().unwrap(), &what);
                checked += 1;
            }
            (expected, ours) => panic!("{what}: reference {expected:?}, ours {ours:?}"),
        }
    }
    assert_eq!((checked, refused), (18, 12));
}

#[test]
fn normalized_proprio_equals_openvla_oft() {
    let fixture = fixture();
    assert_eq!(fixture.proprio.len(), 18);
    for (n, case) in fixture.proprio.iter().enumerate() {
        let what = format!("proprio case {n} ({})", case.normalization);
        let stats = DatasetStatistics::from_json(&case.statistics.to_string()).unwrap();
        let bounds = stats
            .dataset(None)
            .unwrap()
            .proprio_bounds(normalization(&case.normalization))
            .unwrap();
        let flat: Vec<f64> = case.raw.iter().flatten().copied().collect();
        assert_close(&bounds.normalize(&flat).unwrap(), &case.expected, &what);
    }
}
