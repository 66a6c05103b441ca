//! An OpenVLA checkpoint's action and proprio statistics
//! (`dataset_statistics.json`, [`DatasetStatistics`]) and the
//! (un)normalisation they define, as OpenVLA-OFT computes it: a policy
//! emits normalised actions in `[-1, 1]` (the bin centres of its action
//! tokens), which become the robot's units through the statistics of the
//! dataset it was trained on, and the robot's proprio enters normalised the
//! same way.
//!
//! The file maps each training dataset (`unnorm_key`) to its statistics:
//!
//! ```text
//! { "libero_spatial_no_noops": {
//!     "action":  { "mean": [..D], "std": [..], "min": [..], "max": [..], "q01": [..], "q99": [..], "mask": [..D bools] },
//!     "proprio": { the same keys, over the proprio dimensions },
//!     "num_transitions": N, "num_trajectories": M } }
//! ```
//!
//! The numbers are OpenVLA-OFT's, case by case
//! (`prismatic/extern/hf/modeling_prismatic.py`: `_check_unnorm_key`,
//! `_unnormalize_actions`; `experiments/robot/openvla_utils.py`:
//! `normalize_proprio`), in f64 as numpy computes them:
//!
//! ```text
//! key       = unnorm_key, or the only dataset when there is one (several and none chosen: an error)
//! (lo, hi)  = (q01, q99) under bounds_q99 (LIBERO, Bridge), (min, max) under bounds (ALOHA)
//! mask      = the statistics' mask, all true when absent
//! action    = mask ? 0.5 (a + 1) (hi - lo + 1e-8) + lo : a
//! proprio   = clip(mask ? 2 (p - lo) / (hi - lo + 1e-8) - 1 : p, -1, 1)
//! ```
//!
//! Statistics whose lists differ in length, hold a value that is not
//! finite, or lack the bounds the normalisation reads are errors naming the
//! dataset, the table and the key (the checkpoint loader bounds the file's
//! size before it parses it). A golden test runs OpenVLA-OFT's own functions on the
//! same statistics (`scripts/openvla_golden.py`).
//!
//! ```
//! use embodyflow_algos::action_stats::{DatasetStatistics, Normalization};
//! let stats = DatasetStatistics::from_json(r#"{"demo": {"action": {
//!     "q01": [-0.5, 0.0], "q99": [0.5, 1.0], "mask": [true, false]}}}"#).unwrap();
//! let dataset = stats.dataset(None).unwrap();
//! assert_eq!(dataset.key, "demo");
//! let bounds = dataset.action_bounds(Normalization::BoundsQ99).unwrap();
//! let actions = bounds.unnormalize(&[1.0, 0.25, -1.0, -1.0]).unwrap();
//! assert!((actions[0] - 0.5).abs() < 1e-7 && actions[1] == 0.25); // the mask leaves the gripper as it is
//! assert!((actions[2] + 0.5).abs() < 1e-7 && actions[3] == -1.0);
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

/// Why statistics could not be parsed or used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StatisticsError {
    /// The text is not the statistics' JSON.
    #[error("not a dataset_statistics.json: {0}")]
    Json(String),
    /// Several datasets and no `unnorm_key` chosen (OpenVLA-OFT asserts the same).
    #[error(
        "the checkpoint was trained on more than one dataset: choose the statistics to (un)normalise with, an `unnorm_key` of {keys}"
    )]
    Ambiguous {
        /// The datasets, comma-separated.
        keys: String,
    },
    /// An `unnorm_key` the file does not hold.
    #[error("`unnorm_key` `{key}` is not in the dataset statistics; choose one of {keys}")]
    UnknownKey {
        /// The key asked for.
        key: String,
        /// The datasets, comma-separated.
        keys: String,
    },
    /// Statistics that cannot define the normalisation.
    #[error("dataset `{dataset}`: {table}.{field} {reason}")]
    Bad {
        /// The dataset (`unnorm_key`).
        dataset: String,
        /// `action` or `proprio`.
        table: String,
        /// The key at fault.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Values that do not come in rows of the statistics' width.
    #[error("{found} values are not rows of the statistics' {width} dimensions")]
    Width {
        /// The dimensions of one row.
        width: usize,
        /// The values given.
        found: usize,
    },
}

/// Which bounds map to `[-1, 1]` (OpenVLA-OFT's `NormalizationType`; its
/// `normal` the reference refuses for actions and proprio, and so does
/// this).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Normalization {
    /// `min` and `max` (OpenVLA-OFT's ALOHA constants).
    Bounds,
    /// The 1st and 99th percentiles, `q01` and `q99` (LIBERO, Bridge).
    BoundsQ99,
}

/// The statistics of one table (`action` or `proprio`) of one dataset, as
/// the file holds them.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct Statistics {
    /// Per-dimension mean.
    #[serde(default)]
    pub mean: Option<Vec<f64>>,
    /// Per-dimension standard deviation.
    #[serde(default)]
    pub std: Option<Vec<f64>>,
    /// Per-dimension minimum.
    #[serde(default)]
    pub min: Option<Vec<f64>>,
    /// Per-dimension maximum.
    #[serde(default)]
    pub max: Option<Vec<f64>>,
    /// Per-dimension 1st percentile.
    #[serde(default)]
    pub q01: Option<Vec<f64>>,
    /// Per-dimension 99th percentile.
    #[serde(default)]
    pub q99: Option<Vec<f64>>,
    /// Which dimensions are (un)normalised (the gripper's is not); all when
    /// absent.
    #[serde(default)]
    pub mask: Option<Vec<bool>>,
}

/// One dataset's statistics.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct DatasetEntry {
    /// Of its actions.
    pub action: Statistics,
    /// Of its proprio, when it recorded one.
    #[serde(default)]
    pub proprio: Option<Statistics>,
    /// Its transitions.
    #[serde(default)]
    pub num_transitions: Option<u64>,
    /// Its trajectories.
    #[serde(default)]
    pub num_trajectories: Option<u64>,
}

/// A checkpoint's `dataset_statistics.json`: the statistics of each dataset
/// it was trained on, by `unnorm_key`.
#[derive(Debug, Clone, PartialEq)]
pub struct DatasetStatistics {
    datasets: BTreeMap<String, DatasetEntry>,
}

impl DatasetStatistics {
    /// The statistics in `text`, each table's lists checked (equal lengths,
    /// finite values).
    pub fn from_json(text: &str) -> Result<DatasetStatistics, StatisticsError> {
        let datasets: BTreeMap<String, DatasetEntry> =
            serde_json::from_str(text).map_err(|e| StatisticsError::Json(e.to_string()))?;
        if datasets.is_empty() {
            return Err(StatisticsError::Json("it names no dataset".into()));
        }
        for (key, entry) in &datasets {
            entry.action.check(key, "action")?;
            if let Some(proprio) = &entry.proprio {
                proprio.check(key, "proprio")?;
            }
        }
        Ok(DatasetStatistics { datasets })
    }

    /// The datasets' keys, in order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.datasets.keys().map(String::as_str)
    }

    /// The dataset `unnorm_key` names, or the only one when it is `None`
    /// (OpenVLA-OFT's `_check_unnorm_key`).
    pub fn dataset(&self, unnorm_key: Option<&str>) -> Result<Dataset<'_>, StatisticsError> {
        let keys = || self.keys().collect::<Vec<_>>().join(", ");
        let key = match unnorm_key {
            Some(key) => key,
            None if self.datasets.len() == 1 => self.keys().next().expect("one dataset"),
            None => return Err(StatisticsError::Ambiguous { keys: keys() }),
        };
        self.datasets
            .get_key_value(key)
            .map(|(key, entry)| Dataset { key, entry })
            .ok_or_else(|| StatisticsError::UnknownKey {
                key: key.to_string(),
                keys: keys(),
            })
    }
}

/// One dataset of a [`DatasetStatistics`], with its key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dataset<'a> {
    /// Its `unnorm_key`.
    pub key: &'a str,
    /// Its statistics.
    pub entry: &'a DatasetEntry,
}

impl Dataset<'_> {
    /// The bounds of its actions under `kind`.
    pub fn action_bounds(&self, kind: Normalization) -> Result<Bounds, StatisticsError> {
        self.entry.action.bounds(kind, self.key, "action")
    }

    /// The bounds of its proprio under `kind`; an error when it recorded
    /// none.
    pub fn proprio_bounds(&self, kind: Normalization) -> Result<Bounds, StatisticsError> {
        match &self.entry.proprio {
            Some(proprio) => proprio.bounds(kind, self.key, "proprio"),
            None => Err(StatisticsError::Bad {
                dataset: self.key.to_string(),
                table: "proprio".into(),
                field: "*".into(),
                reason: "is missing: the dataset recorded no proprio".into(),
            }),
        }
    }
}

impl Statistics {
    /// Every list of the same length, every value finite.
    fn check(&self, dataset: &str, table: &str) -> Result<(), StatisticsError> {
        let bad = |field: &str, reason: String| StatisticsError::Bad {
            dataset: dataset.to_string(),
            table: table.to_string(),
            field: field.to_string(),
            reason,
        };
        let lists = [
            ("mean", &self.mean),
            ("std", &self.std),
            ("min", &self.min),
            ("max", &self.max),
            ("q01", &self.q01),
            ("q99", &self.q99),
        ];
        let mut width: Option<(&str, usize)> = None;
        let lengths = lists
            .iter()
            .filter_map(|(field, list)| list.as_ref().map(|l| (*field, l.len())))
            .chain(self.mask.as_ref().map(|m| ("mask", m.len())));
        for (field, len) in lengths {
            match width {
                None => width = Some((field, len)),
                Some((first, n)) if n != len => {
                    return Err(bad(
                        field,
                        format!("has {len} dimensions where {first} has {n}"),
                    ));
                }
                Some(_) => {}
            }
        }
        for (field, list) in lists {
            if let Some((i, v)) = list
                .iter()
                .flatten()
                .enumerate()
                .find(|(_, v)| !v.is_finite())
            {
                return Err(bad(field, format!("holds {v} at dimension {i}")));
            }
        }
        Ok(())
    }

    /// The bounds `kind` maps to `[-1, 1]`, with the mask; an error naming
    /// the missing key when the table lacks them.
    fn bounds(
        &self,
        kind: Normalization,
        dataset: &str,
        table: &str,
    ) -> Result<Bounds, StatisticsError> {
        let (low_key, high_key, low, high) = match kind {
            Normalization::Bounds => ("min", "max", &self.min, &self.max),
            Normalization::BoundsQ99 => ("q01", "q99", &self.q01, &self.q99),
        };
        let missing = |field: &str| StatisticsError::Bad {
            dataset: dataset.to_string(),
            table: table.to_string(),
            field: field.to_string(),
            reason: "is missing, and the normalisation reads it".into(),
        };
        let low = low.clone().ok_or_else(|| missing(low_key))?;
        let high = high.clone().ok_or_else(|| missing(high_key))?;
        let mask = self.mask.clone().unwrap_or_else(|| vec![true; low.len()]);
        Ok(Bounds { low, high, mask })
    }
}

/// Per-dimension bounds mapped to `[-1, 1]`, and which dimensions are.
#[derive(Debug, Clone, PartialEq)]
pub struct Bounds {
    low: Vec<f64>,
    high: Vec<f64>,
    mask: Vec<bool>,
}

impl Bounds {
    /// Dimensions of one row.
    pub fn width(&self) -> usize {
        self.low.len()
    }

    /// Normalised actions (rows of [`Bounds::width`], e.g. an action chunk
    /// `K × D` flattened) in the dataset's units:
    /// `0.5 (a + 1) (hi - lo + 1e-8) + lo` on masked dimensions, `a` on
    /// the others.
    pub fn unnormalize(&self, normalized: &[f64]) -> Result<Vec<f64>, StatisticsError> {
        self.each(normalized, |a, lo, hi| {
            0.5 * (a + 1.0) * (hi - lo + 1e-8) + lo
        })
    }

    /// Raw values (rows of [`Bounds::width`], e.g. proprio) normalised:
    /// `2 (p - lo) / (hi - lo + 1e-8) - 1` on masked dimensions, `p` on
    /// the others, then every value clipped to `[-1, 1]`.
    pub fn normalize(&self, raw: &[f64]) -> Result<Vec<f64>, StatisticsError> {
        let mut out = self.each(raw, |p, lo, hi| 2.0 * (p - lo) / (hi - lo + 1e-8) - 1.0)?;
        for value in &mut out {
            *value = value.clamp(-1.0, 1.0);
        }
        Ok(out)
    }

    /// `f(value, lo, hi)` on each masked dimension of each row.
    fn each(
        &self,
        values: &[f64],
        f: impl Fn(f64, f64, f64) -> f64,
    ) -> Result<Vec<f64>, StatisticsError> {
        let width = self.width();
        if width == 0 || values.len() % width != 0 {
            return Err(StatisticsError::Width {
                width,
                found: values.len(),
            });
        }
        Ok(values
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let d = i % width;
                if self.mask[d] {
                    f(v, self.low[d], self.high[d])
                } else {
                    v
                }
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_datasets() -> DatasetStatistics {
        DatasetStatistics::from_json(
            r#"{"b": {"action": {"min": [0.0], "max": [2.0]}},
                "a": {"action": {"min": [-1.0], "max": [1.0]}, "num_transitions": 5}}"#,
        )
        .unwrap()
    }

    #[test]
    fn the_key_is_the_only_dataset_or_the_one_named() {
        let stats = two_datasets();
        assert_eq!(
            stats.dataset(None).unwrap_err(),
            StatisticsError::Ambiguous {
                keys: "a, b".into()
            }
        );
        assert_eq!(stats.dataset(Some("b")).unwrap().key, "b");
        let unknown = stats.dataset(Some("c")).unwrap_err().to_string();
        assert!(
            unknown.contains("`c`") && unknown.contains("a, b"),
            "{unknown}"
        );
    }

    #[test]
    fn bad_statistics_name_the_dataset_table_and_key() {
        let width =
            DatasetStatistics::from_json(r#"{"d": {"action": {"q01": [0.0, 1.0], "q99": [1.0]}}}"#)
                .unwrap_err()
                .to_string();
        assert_eq!(
            width,
            "dataset `d`: action.q99 has 1 dimensions where q01 has 2"
        );
        let mask = DatasetStatistics::from_json(
            r#"{"d": {"action": {"q01": [0.0], "q99": [1.0]}, "proprio": {"min": [0.0], "mask": [true, false]}}}"#,
        )
        .unwrap_err()
        .to_string();
        assert_eq!(
            mask,
            "dataset `d`: proprio.mask has 2 dimensions where min has 1"
        );
        let missing =
            DatasetStatistics::from_json(r#"{"d": {"action": {"min": [0.0], "max": [1.0]}}}"#)
                .unwrap()
                .dataset(None)
                .unwrap()
                .action_bounds(Normalization::BoundsQ99)
                .unwrap_err()
                .to_string();
        assert_eq!(
            missing,
            "dataset `d`: action.q01 is missing, and the normalisation reads it"
        );
        for text in [
            "{}",
            "[]",
            r#"{"d": {}}"#,
            r#"{"d": {"action": {"min": ["x"]}}}"#,
        ] {
            assert!(DatasetStatistics::from_json(text).is_err(), "{text}");
        }
    }

    #[test]
    fn rows_must_have_the_statistics_width() {
        let bounds = two_datasets()
            .dataset(Some("a"))
            .unwrap()
            .action_bounds(Normalization::Bounds)
            .unwrap();
        assert_eq!(bounds.unnormalize(&[0.0, 0.5]).unwrap().len(), 2);
        let two = DatasetStatistics::from_json(
            r#"{"d": {"action": {"min": [0.0, 0.0], "max": [1.0, 1.0]}}}"#,
        )
        .unwrap();
        let bounds = two
            .dataset(None)
            .unwrap()
            .action_bounds(Normalization::Bounds)
            .unwrap();
        assert_eq!(
            bounds.unnormalize(&[0.0, 0.5, 1.0]).unwrap_err(),
            StatisticsError::Width { width: 2, found: 3 }
        );
    }

    #[test]
    fn normalising_inverts_unnormalising_inside_the_bounds_and_clips_outside() {
        let stats = DatasetStatistics::from_json(
            r#"{"d": {"action": {"q01": [-0.3, 2.0, 0.0], "q99": [0.7, 5.0, 1.0], "mask": [true, true, false]}}}"#,
        )
        .unwrap();
        let bounds = stats
            .dataset(None)
            .unwrap()
            .action_bounds(Normalization::BoundsQ99)
            .unwrap();
        let normalized = [-1.0, 0.25, 0.5, 0.9, -0.6, -0.2];
        let back = bounds
            .normalize(&bounds.unnormalize(&normalized).unwrap())
            .unwrap();
        for (a, b) in normalized.iter().zip(&back) {
            assert!((a - b).abs() < 1e-7, "{normalized:?} -> {back:?}");
        }
        // Outside the bounds, and on the unmasked dimension, clipped.
        assert_eq!(
            bounds.normalize(&[10.0, -10.0, 3.0]).unwrap(),
            [1.0, -1.0, 1.0]
        );
    }
}
