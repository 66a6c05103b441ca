//! Trajectory rewards: the scalar R_i that GRPO normalises, with its parts.
//!
//! - **outcome** (SimpleVLA-RL, LaST-R1): `score = reward_coef * complete`.
//! - **embodied_r1** (Embodied-R1, arXiv 2505.22050; reference
//!   `reward_func_embench_alfred_nonlinear.py`): `R = R_format + R_accuracy`.
//!   With n = the leading run of predicted steps whose lower-cased
//!   `action_name` equals the ground truth's and k = the ground-truth length,
//!   `R_accuracy = n(n+1) / (k(k+1))`, minus 0.25 when k = 1 and more than one
//!   step was predicted. `R_format = 0.125` (an object with an
//!   `executable_plan` list) `+ 0.125 * (fraction of well-formed items) + 0.25 *
//!   (fraction whose id and name agree in the environment's action list)`, so
//!   the total reaches 1.5. Parsing is strict by default — the whole response
//!   must be the JSON object, and a non-object item or a missing or null id or
//!   name scores 0, as the reference's `except: return 0` does —
//!   `tolerant = true` uses the tolerant extraction of [`crate::plan`] and
//!   scores malformed items as invalid instead.
//! - **verify** (EasyR1 embody): `overall = 0.8 * accuracy + 0.2 * format`,
//!   format = 1 when tolerant extraction finds a plan. Accuracy in [-1, 1]
//!   comes from a verifier: the environment's plan executor (+1 goal reached,
//!   -1 not) where the environment has one, otherwise from the step match
//!   against the ground truth, `2 * matched / max(len(pred), len(gt)) - 1`.
//!
//! ```
//! use embodyflow_algos::plan::GtStep;
//! use embodyflow_algos::rewards::{embodied_r1, ActionList};
//! let actions = ActionList::new(vec!["find a Mug".into(), "pick up the Mug".into()]);
//! let gt = [GtStep { action_id: 0, action_name: "find a Mug".into() }, GtStep { action_id: 1, action_name: "pick up the Mug".into() }];
//! let response = r#"{"executable_plan": [{"action_id": 0, "action_name": "find a Mug"}, {"action_id": 1, "action_name": "pick up the Mug"}]}"#;
//! let r = embodied_r1(response, &gt, Some(&actions), false);
//! assert_eq!((r.format, r.accuracy, r.score), (0.5, 1.0, 1.5));
//! ```

use crate::plan::{GtStep, Plan, PlanStep, extract, extract_strict, normalise_name};

/// An environment's enumerated action list: id -> name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionList {
    names: Vec<String>,
}

impl ActionList {
    /// The list; index = action id.
    pub fn new(names: Vec<String>) -> ActionList {
        ActionList { names }
    }

    /// Whether `id` names an action called `name` (compared normalised).
    pub fn agrees(&self, id: i64, name: &str) -> bool {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.names.get(i))
            .is_some_and(|n| normalise_name(n) == normalise_name(name))
    }
}

/// A scored response.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// The scalar used by the episode advantage.
    pub score: f32,
    /// Format part.
    pub format: f32,
    /// Accuracy part.
    pub accuracy: f32,
    /// The plan when one was extracted.
    pub plan: Option<Plan>,
}

/// Leading run of predicted steps whose names equal the ground truth's.
fn leading_name_matches(pred: &[PlanStep], gt: &[GtStep]) -> usize {
    pred.iter()
        .zip(gt)
        .take_while(|(p, g)| {
            p.action_name
                .as_deref()
                .is_some_and(|n| normalise_name(n) == normalise_name(&g.action_name))
        })
        .count()
}

/// The Embodied-R1 reward (see the module doc). Without an action list the
/// id/name agreement part is 0.
pub fn embodied_r1(
    response: &str,
    gt: &[GtStep],
    actions: Option<&ActionList>,
    tolerant: bool,
) -> Scored {
    let zero = |plan| Scored {
        score: 0.0,
        format: 0.0,
        accuracy: 0.0,
        plan,
    };
    let plan = if tolerant {
        extract(response)
    } else {
        extract_strict(response)
    };
    let Some(plan) = plan else { return zero(None) };
    let steps = &plan.steps;
    let well_formed = steps.iter().filter(|s| s.well_formed).count();
    if !tolerant && well_formed != steps.len() {
        return zero(Some(plan));
    }
    let fraction = |n: usize| {
        if steps.is_empty() {
            0.0
        } else {
            n as f64 / steps.len() as f64
        }
    };
    let agreeing = actions.map_or(0, |list| {
        steps
            .iter()
            .filter(|s| matches!((s.action_id, s.action_name.as_deref()), (Some(id), Some(name)) if list.agrees(id, name)))
            .count()
    });
    let format = 0.125 + 0.125 * fraction(well_formed) + 0.25 * fraction(agreeing);
    let k = gt.len();
    let accuracy = if k == 0 {
        0.0
    } else {
        let n = leading_name_matches(steps, gt);
        let mut accuracy = (n * (n + 1)) as f64 / (k * (k + 1)) as f64;
        if k == 1 && steps.len() > 1 {
            accuracy -= 0.25;
        }
        accuracy
    };
    Scored {
        score: (format + accuracy) as f32,
        format: format as f32,
        accuracy: accuracy as f32,
        plan: Some(plan),
    }
}

/// The verify reward with the executor's verdict, or the step match when
/// `executor_success` is `None` (`matched` = steps matched under the
/// configured mode).
pub fn verify(
    plan: Option<Plan>,
    executor_success: Option<bool>,
    matched: usize,
    gt_len: usize,
) -> Scored {
    let format = if plan.is_some() { 1.0 } else { 0.0 };
    let accuracy = match (executor_success, &plan) {
        (Some(success), _) => {
            if success {
                1.0
            } else {
                -1.0
            }
        }
        (None, None) => -1.0,
        (None, Some(plan)) => {
            let denominator = plan.steps.len().max(gt_len);
            if denominator == 0 {
                -1.0
            } else {
                2.0 * matched as f64 / denominator as f64 - 1.0
            }
        }
    };
    Scored {
        score: (0.8 * accuracy + 0.2 * format) as f32,
        format: format as f32,
        accuracy: accuracy as f32,
        plan,
    }
}

/// The outcome reward.
pub fn outcome(complete: bool, reward_coef: f32) -> f32 {
    if complete { reward_coef } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gt(names: &[&str]) -> Vec<GtStep> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| GtStep {
                action_id: i as i64,
                action_name: n.to_string(),
            })
            .collect()
    }

    fn response(steps: &[(i64, &str)]) -> String {
        let items: Vec<String> = steps
            .iter()
            .map(|(id, n)| format!("{{\"action_id\": {id}, \"action_name\": \"{n}\"}}"))
            .collect();
        format!(
            "{{\"language_plan\": [], \"executable_plan\": [{}]}}",
            items.join(", ")
        )
    }

    fn actions() -> ActionList {
        ActionList::new(vec![
            "find a Mug".into(),
            "pick up the Mug".into(),
            "find a Sink".into(),
        ])
    }

    #[test]
    fn prefix_accuracy_curve_by_hand() {
        let g = gt(&["find a Mug", "pick up the Mug", "find a Sink"]);
        // n = 2 of k = 3: 2*3 / (3*4) = 0.5; every item valid and agreeing: format 0.5.
        let r = embodied_r1(
            &response(&[(0, "Find a mug"), (1, "pick up the Mug"), (0, "find a Mug")]),
            &g,
            Some(&actions()),
            false,
        );
        assert_eq!(r.accuracy, 0.5);
        assert_eq!(r.format, 0.5);
        assert_eq!(r.score, 1.0);
        // n = 0 because the first step is wrong, whatever follows.
        let r = embodied_r1(
            &response(&[(2, "find a Sink"), (1, "pick up the Mug")]),
            &g,
            Some(&actions()),
            false,
        );
        assert_eq!(r.accuracy, 0.0);
    }

    #[test]
    fn single_step_gold_penalises_extra_steps() {
        let g = gt(&["find a Mug"]);
        let r = embodied_r1(&response(&[(0, "find a Mug")]), &g, Some(&actions()), false);
        assert_eq!(r.accuracy, 1.0);
        let r = embodied_r1(
            &response(&[(0, "find a Mug"), (1, "pick up the Mug")]),
            &g,
            Some(&actions()),
            false,
        );
        assert_eq!(r.accuracy, 0.75);
    }

    #[test]
    fn format_parts() {
        let g = gt(&["find a Mug"]);
        // id 2 is "find a Sink": valid item, id and name disagree -> 0.125 + 0.125 + 0.25 * 1/2.
        let r = embodied_r1(
            &response(&[(0, "find a Mug"), (2, "find a Mug")]),
            &g,
            Some(&actions()),
            false,
        );
        assert_eq!(r.format, 0.375);
        // No action list: the agreement part is 0.
        let r = embodied_r1(&response(&[(0, "find a Mug")]), &g, None, false);
        assert_eq!(r.format, 0.25);
        // Strict: a null name, a non-dict item, prose or a fence score 0 in total.
        for bad in [
            "{\"executable_plan\": [{\"action_id\": 0, \"action_name\": null}]}".to_string(),
            "{\"executable_plan\": [5]}".to_string(),
            format!("Here: {}", response(&[(0, "find a Mug")])),
            format!("```json\n{}\n```", response(&[(0, "find a Mug")])),
            "not json".to_string(),
        ] {
            let r = embodied_r1(&bad, &g, Some(&actions()), false);
            assert_eq!((r.score, r.format, r.accuracy), (0.0, 0.0, 0.0), "{bad}");
        }
        // Tolerant: the fenced answer scores; the malformed item only lowers the format.
        let r = embodied_r1(
            &format!("```json\n{}\n```", response(&[(0, "find a Mug")])),
            &g,
            Some(&actions()),
            true,
        );
        assert_eq!(r.score, 1.5);
        let r = embodied_r1(
            "{\"executable_plan\": [{\"action_id\": 0, \"action_name\": \"find a Mug\"}, 5]}",
            &g,
            Some(&actions()),
            true,
        );
        assert_eq!(r.format, 0.125 + 0.0625 + 0.125);
        assert_eq!(r.accuracy, 0.75);
    }

    #[test]
    fn strict_mode_strips_end_of_text_tokens() {
        // The reference strips "<|im_end|>" (and the DeepSeek and GPT end
        // tokens) before json.loads: a perfect answer keeps its 1.5.
        let g = gt(&["find a Mug", "pick up the Mug"]);
        let answer = response(&[(0, "find a Mug"), (1, "pick up the Mug")]);
        let perfect = embodied_r1(&answer, &g, Some(&actions()), false).score;
        assert_eq!(perfect, 1.5);
        for end in [
            "<|im_end|>",
            "<|endoftext|>",
            "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
            "<|im_end|>\n<|endoftext|>",
        ] {
            let r = embodied_r1(&format!("{answer}{end}"), &g, Some(&actions()), false);
            assert_eq!(r.score, perfect, "{end}");
        }
    }

    #[test]
    fn duplicated_plan_keys_keep_the_last() {
        // json.loads keeps the last "executable_plan": pred_names = ["find a mug"],
        // gold = ["find a mug"]: 1 leading match of k = 1, accuracy 1*2 / (1*2) = 1.
        let text = r#"{"executable_plan": [{"action_id": 1, "action_name": "pick up the Mug"}], "executable_plan": [{"action_id": 0, "action_name": "find a Mug"}]}"#;
        for tolerant in [false, true] {
            let r = embodied_r1(text, &gt(&["find a Mug"]), Some(&actions()), tolerant);
            assert_eq!(r.accuracy, 1.0, "tolerant {tolerant}");
            assert_eq!(r.plan.unwrap().steps[0].action_id, Some(0));
        }
    }

    #[test]
    fn verify_by_hand() {
        let plan = extract(&response(&[(0, "find a Mug"), (1, "x")]));
        let r = verify(plan.clone(), None, 1, 2);
        assert_eq!(r.accuracy, 0.0);
        assert!((r.score - 0.2).abs() < 1e-7);
        assert_eq!(verify(plan.clone(), Some(true), 0, 2).score, 1.0);
        assert!((verify(None, None, 0, 2).score - -0.8).abs() < 1e-7);
        assert_eq!(outcome(true, 5.0), 5.0);
        assert_eq!(outcome(false, 5.0), 0.0);
    }
}
