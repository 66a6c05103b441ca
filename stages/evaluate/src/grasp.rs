//! The grasp slope: whether a closed-loop policy grasps where the object
//! is, or replays one mean trajectory per task.
//!
//! Each episode of a world that says where its goals are leaves a
//! [`GraspPoint`]: the target's (x, y) at the start (the object a goal
//! moves, a drawer's handle) and the gripper's (x, y) when the fingers
//! first closed. Across the initial states of one task (LIBERO's protocol:
//! the objects moved within their regions) the slope of the closing point
//! on the target, pooled within tasks over both axes,
//!
//! ```text
//! β = Σ_task Σ_i Σ_axis (c_i − c̄_task)(t_i − t̄_task) / Σ_task Σ_i Σ_axis (t_i − t̄_task)²
//! ```
//!
//! is 1 for a policy that closes on the object wherever it stands and 0 for
//! one that closes at the same place whatever it sees (ordinary least
//! squares of the closing point on the target with one intercept per task
//! and axis). Only episodes whose fingers closed count; a task with fewer
//! than two of them adds nothing. With no spread in the targets there is no
//! slope to tell (`None`).
//!
//! ```
//! use embodyflow_evaluate::grasp::grasp_slope;
//! use embodyflow_rollout::closed_loop::GraspPoint;
//! let at = |t: [f32; 2], c: [f32; 2]| GraspPoint { target: t, closed_at: Some(c) };
//! // Closes on the object: slope 1. Closes at (0.5, 0.5) whatever: slope 0.
//! let seeing = [("a", at([0.4, 0.4], [0.4, 0.4])), ("a", at([0.5, 0.45], [0.5, 0.45]))];
//! let blind = [("a", at([0.4, 0.4], [0.5, 0.5])), ("a", at([0.5, 0.45], [0.5, 0.5]))];
//! assert!((grasp_slope(&seeing).unwrap().slope - 1.0).abs() < 1e-9);
//! assert_eq!(grasp_slope(&blind).unwrap().slope, 0.0);
//! ```

use std::collections::BTreeMap;

use embodyflow_rollout::closed_loop::GraspPoint;

/// The pooled within-task slope of the closing point on the target.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GraspSlope {
    /// β (see the module doc).
    pub slope: f64,
    /// Episodes whose fingers closed (those the slope is fitted on).
    pub closed: usize,
    /// Episodes with a grasp point.
    pub episodes: usize,
}

/// β over `points`, each keyed by its task (see the module doc); `None`
/// when no two closing episodes of a task have different targets.
pub fn grasp_slope<K: Ord>(points: &[(K, GraspPoint)]) -> Option<GraspSlope> {
    let mut by_task: BTreeMap<&K, Vec<([f64; 2], [f64; 2])>> = BTreeMap::new();
    for (task, point) in points {
        if let Some(closed) = point.closed_at {
            let f = |p: [f32; 2]| [f64::from(p[0]), f64::from(p[1])];
            by_task
                .entry(task)
                .or_default()
                .push((f(point.target), f(closed)));
        }
    }
    let (mut cross, mut spread) = (0.0, 0.0);
    for pairs in by_task.values() {
        let n = pairs.len() as f64;
        for axis in 0..2 {
            let t_mean = pairs.iter().map(|(t, _)| t[axis]).sum::<f64>() / n;
            let c_mean = pairs.iter().map(|(_, c)| c[axis]).sum::<f64>() / n;
            for (t, c) in pairs {
                cross += (t[axis] - t_mean) * (c[axis] - c_mean);
                spread += (t[axis] - t_mean).powi(2);
            }
        }
    }
    (spread > 1e-12).then(|| GraspSlope {
        slope: cross / spread,
        closed: by_task.values().map(Vec::len).sum(),
        episodes: points.len(),
    })
}

/// The summary line: `0.93 (fitted on 61 of 70 episodes whose fingers
/// closed)`, or why there is none.
pub fn grasp_slope_line(slope: Option<GraspSlope>, episodes: usize) -> String {
    match slope {
        Some(s) => format!(
            "{:.3} (fitted on the {} of {} episodes whose fingers closed)",
            s.slope, s.closed, s.episodes
        ),
        None => format!(
            "- (of {episodes} episodes, no two of one task closed the fingers on different targets)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn point(t: [f32; 2], c: Option<[f32; 2]>) -> GraspPoint {
        GraspPoint {
            target: t,
            closed_at: c,
        }
    }

    #[test]
    fn intercepts_are_per_task_and_episodes_that_never_closed_are_left_out() {
        // Two tasks far apart, each closing exactly 0.5 of the way to its
        // target's deviation: the pooled slope is 0.5, not inflated by the
        // tasks' different places.
        let points = [
            ("a", point([0.2, 0.2], Some([0.2, 0.2]))),
            ("a", point([0.3, 0.2], Some([0.25, 0.2]))),
            ("a", point([0.9, 0.9], None)),
            ("b", point([0.8, 0.7], Some([0.8, 0.7]))),
            ("b", point([0.8, 0.9], Some([0.8, 0.8]))),
        ];
        let s = grasp_slope(&points).unwrap();
        assert!((s.slope - 0.5).abs() < 1e-6, "{s:?}");
        assert_eq!((s.closed, s.episodes), (4, 5));
    }

    #[test]
    fn no_spread_in_the_targets_gives_no_slope() {
        let same = [
            ("a", point([0.2, 0.2], Some([0.1, 0.2]))),
            ("a", point([0.2, 0.2], Some([0.3, 0.2]))),
            ("b", point([0.5, 0.5], None)),
        ];
        assert_eq!(grasp_slope(&same), None);
        assert!(grasp_slope_line(None, 3).starts_with("- (of 3 episodes"));
    }

    proptest! {
        /// Closing at `offset + β·target` per task recovers β, whatever the
        /// tasks' offsets (values on a binary grid, so the closing points
        /// are exact in f32).
        #[test]
        fn a_linear_policy_gives_its_own_slope(
            eighths in -16i32..16,
            targets in proptest::collection::vec((0u8..64, 0u8..64, 0usize..3), 2..40),
        ) {
            let beta = f64::from(eighths) / 8.0;
            let offsets = [[0.125f64, -0.25], [0.5, 0.0], [-0.375, 0.25]];
            let points: Vec<(usize, GraspPoint)> = targets
                .iter()
                .map(|&(x, y, task)| {
                    let t = [f64::from(x) / 64.0, f64::from(y) / 64.0];
                    let c = [offsets[task][0] + beta * t[0], offsets[task][1] + beta * t[1]];
                    (task, point([t[0] as f32, t[1] as f32], Some([c[0] as f32, c[1] as f32])))
                })
                .collect();
            if let Some(s) = grasp_slope(&points) {
                prop_assert!((s.slope - beta).abs() < 1e-9, "{} vs {}", s.slope, beta);
            }
        }
    }
}
