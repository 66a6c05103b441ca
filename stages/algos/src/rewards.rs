//! Trajectory rewards: the scalar R_i that GRPO normalises, with its parts.
//!
//! - **outcome** (SimpleVLA-RL, LaST-R1): `score = reward_coef * complete`.
//! - **embodied_r1** (Embodied-R1, arXiv 2505.22050; reference
//!   `reward_func_embench_alfred_nonlinear.py` of
//!   mail-taii/Reinforced-Reasoning-for-Embodied-Planning):
//!   `R = R_format + R_accuracy`, as the reference computes it.
//!   `R_accuracy`: the predicted names are the lower-cased `action_name` of
//!   the items that are objects (`""` when missing; not trimmed); with n =
//!   their leading run equal to the lower-cased ground-truth names and k =
//!   the ground-truth length, `R_accuracy = (n(n+1)/2) / (k(k+1)/2)`, minus
//!   0.25 when k = 1 and the plan has more than one item (of any kind); 0
//!   when k = 0. `R_format = 0.125` (the answer object has all four keys of
//!   the format, [`crate::plan::ANSWER_KEYS`], whatever their values) `+ 0.125 * valid / items + 0.25 * agreeing / items` (0 for an
//!   empty plan), where an item is valid when it is an object with an int
//!   `action_id` for Python (an integer of any size, or a bool) and a string
//!   `action_name`, and agrees when its id is an integer naming an action of
//!   the environment's list whose lower-cased name equals its own; the
//!   total reaches 1.5. Strict parsing, the default, reads the response as
//!   the reference does ([`crate::plan::extract_strict`]) and scores 0 where
//!   the reference raises into its `except`: no JSON object, an
//!   `executable_plan` it cannot iterate, an item that is not an object, an
//!   `action_name` that is present and not a string. `tolerant = true`
//!   extracts tolerantly ([`crate::plan::extract`]) and never raises: such
//!   items are invalid, and such names equal nothing.
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
//! let response = r#"{"reasoning_and_reflection": "", "visual_state_description": "", "language_plan": [], "executable_plan": [{"action_id": 0, "action_name": "find a Mug"}, {"action_id": 1, "action_name": "pick up the Mug"}]}<|im_end|>"#;
//! let r = embodied_r1(response, &gt, Some(&actions), false);
//! assert_eq!((r.format, r.accuracy, r.score), (0.5, 1.0, 1.5));
//! ```

use crate::plan::{GtStep, IdKind, NameKind, Plan, PlanStep, extract, extract_strict};

/// An environment's enumerated action list: id -> name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActionList {
    /// Lower-cased names; index = action id.
    lower: Vec<String>,
}

impl ActionList {
    /// The list; index = action id.
    pub fn new(names: Vec<String>) -> ActionList {
        ActionList {
            lower: names.iter().map(|n| n.to_lowercase()).collect(),
        }
    }

    /// Whether `id` names an action called `name`, compared lower-cased as
    /// the reference compares them (`name.lower() == ACTION_MAP[id].lower()`).
    pub fn agrees(&self, id: i64, name: &str) -> bool {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.lower.get(i))
            .is_some_and(|n| *n == name.to_lowercase())
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

/// The name the reference reads from an object item
/// (`step.get("action_name", "")`); `None` when that name equals nothing (a
/// string with unpaired surrogates, or a value that is not a string, on
/// which the reference raises).
fn reference_name(step: &PlanStep) -> Option<&str> {
    match step.name_kind {
        NameKind::Missing => Some(""),
        NameKind::String => step.action_name.as_deref(),
        NameKind::StringWithSurrogates | NameKind::Other => None,
    }
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
    // `step.get` of a non-dict item and `.lower()` of a non-str name raise.
    if !tolerant
        && steps
            .iter()
            .any(|s| !s.is_object || s.name_kind == NameKind::Other)
    {
        return zero(Some(plan));
    }
    let structure = if plan.answer_keys { 0.125 } else { 0.0 };
    let (items, agreement) = if steps.is_empty() {
        (0.0, 0.0)
    } else {
        let len = steps.len() as f64;
        let valid = steps.iter().filter(|s| s.well_formed).count();
        let agreeing = actions.map_or(0, |list| {
            steps
                .iter()
                .filter(|s| {
                    s.id_kind == IdKind::Integer
                        && matches!((s.action_id, reference_name(s)), (Some(id), Some(name)) if list.agrees(id, name))
                })
                .count()
        });
        (0.125 * valid as f64 / len, 0.25 * agreeing as f64 / len)
    };
    let format = structure + items + agreement;
    let k = gt.len();
    let accuracy = if k == 0 {
        0.0
    } else {
        let predicted = steps
            .iter()
            .filter(|s| s.is_object)
            .map(|s| reference_name(s).map(str::to_lowercase));
        let n = predicted
            .zip(gt)
            .take_while(|(p, g)| p.as_deref() == Some(g.action_name.to_lowercase().as_str()))
            .count();
        let mut accuracy = (n * (n + 1)) as f64 / 2.0 / ((k * (k + 1)) as f64 / 2.0);
        if k == 1 && steps.len() > 1 {
            accuracy -= 0.25;
        }
        accuracy
    };
    Scored {
        score: (accuracy + format) as f32,
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
        answer(&format!("[{}]", items.join(", ")))
    }

    /// An answer with the four keys of the reference's format.
    fn answer(plan: &str) -> String {
        format!(
            "{{\"reasoning_and_reflection\": \"r\", \"visual_state_description\": \"v\", \"language_plan\": [], \"executable_plan\": {plan}}}"
        )
    }

    /// (score, format, accuracy) of a strict and a tolerant reading.
    fn both(text: &str, gt: &[GtStep]) -> [(f32, f32, f32); 2] {
        [false, true].map(|tolerant| {
            let r = embodied_r1(text, gt, Some(&actions()), tolerant);
            (r.score, r.format, r.accuracy)
        })
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
            &answer(r#"[{"action_id": 0, "action_name": "find a Mug"}, 5]"#),
            &g,
            Some(&actions()),
            true,
        );
        assert_eq!(r.format, 0.125 + 0.0625 + 0.125);
        assert_eq!(r.accuracy, 0.75);
    }

    #[test]
    fn invalid_ids_lower_the_format_only() {
        // The reference's check_executable_items counts an item only when
        // isinstance(action_id, int); check_action_id_match needs the same;
        // accuracy reads names only. Gold = the two names; item 0 is valid
        // and agrees, item 1 has a bad id: format = 0.125 + 0.125 * 1/2 +
        // 0.25 * 1/2 = 0.3125, n = k = 2: accuracy 1.
        let g = gt(&["find a Mug", "pick up the Mug"]);
        for bad_id in [
            "",
            "\"action_id\": null, ",
            "\"action_id\": 1.0, ",
            "\"action_id\": 1e0, ",
            "\"action_id\": \"1\", ",
            "\"action_id\": NaN, ",
            "\"action_id\": [1], ",
        ] {
            let text = answer(&format!(
                "[{{\"action_id\": 0, \"action_name\": \"find a Mug\"}}, {{{bad_id}\"action_name\": \"pick up the Mug\"}}]"
            ));
            assert_eq!(both(&text, &g), [(1.3125, 0.3125, 1.0); 2], "{bad_id}");
        }
        // true is an int for isinstance, so the item is valid; str(True) is
        // "True", no key of the action map (although True == 1 and action 1
        // is "pick up the Mug"): format = 0.125 + 0.125 + 0.25 * 1/2 = 0.375.
        let text = answer(
            r#"[{"action_id": 0, "action_name": "find a Mug"}, {"action_id": true, "action_name": "pick up the Mug"}]"#,
        );
        assert_eq!(both(&text, &g), [(1.375, 0.375, 1.0); 2]);
        // An id beyond i64 is an int for Python, so the item is valid, and
        // str(10**30) is no key of the map: as true above. Accuracy reads
        // names: n = k = 2.
        let text = answer(
            r#"[{"action_id": 0, "action_name": "find a Mug"}, {"action_id": 1000000000000000000000000000000, "action_name": "pick up the Mug"}]"#,
        );
        assert_eq!(both(&text, &g), [(1.375, 0.375, 1.0); 2]);
        // A negative id is valid and names no action: str(-1) is no key.
        let text = answer(
            r#"[{"action_id": 0, "action_name": "find a Mug"}, {"action_id": -1, "action_name": "pick up the Mug"}]"#,
        );
        assert_eq!(both(&text, &g), [(1.375, 0.375, 1.0); 2]);
    }

    #[test]
    fn names_compare_lower_cased_and_untrimmed() {
        let g = gt(&["find a Mug", "pick up the Mug"]);
        // "FIND A MUG".lower() == "find a mug": n = 2, and the id agrees.
        let text = response(&[(0, "FIND A MUG"), (1, "Pick Up The mug")]);
        assert_eq!(both(&text, &g), [(1.5, 0.5, 1.0); 2]);
        // " find a Mug" keeps its space: n = 0 (accuracy 0), item 0
        // disagrees with action 0: format = 0.125 + 0.125 + 0.25 * 1/2.
        let text = response(&[(0, " find a Mug"), (1, "pick up the Mug")]);
        assert_eq!(both(&text, &g), [(0.375, 0.375, 0.0); 2]);
        // Unicode lower-casing ("ÄPFEL".lower() == "äpfel").
        let g = gt(&["find the Äpfel"]);
        let text = response(&[(7, "FIND THE äPFEL")]);
        assert_eq!(both(&text, &g)[0].2, 1.0);
    }

    #[test]
    fn items_the_reference_skips_or_raises_on() {
        let g = gt(&["find a Mug"]);
        // A non-dict item: step.get raises in check_action_id_match, so strict
        // scores 0. Tolerant: the item is invalid and skipped when reading
        // names (as the reference's `if isinstance(step, dict)`) but counted
        // in len(plan): names = ["find a mug"], n = k = 1, minus 0.25 for two
        // items: accuracy 0.75; format = 0.125 + 0.125 * 1/2 + 0.25 * 1/2.
        let text = answer(r#"[5, {"action_id": 0, "action_name": "find a Mug"}]"#);
        assert_eq!(both(&text, &g), [(0.0, 0.0, 0.0), (1.0625, 0.3125, 0.75)]);
        // A name that is present and not a string: .lower() raises in
        // accuracy_reward, even after the leading run. Tolerant: it equals
        // nothing; format = 0.125 + 0.125 * 1/2 + 0.25 * 1/2, n = 1 of k = 1,
        // minus 0.25.
        let text = answer(
            r#"[{"action_id": 0, "action_name": "find a Mug"}, {"action_id": 1, "action_name": null}]"#,
        );
        assert_eq!(both(&text, &g), [(0.0, 0.0, 0.0), (1.0625, 0.3125, 0.75)]);
        // A missing name reads as "" (no exception) and makes the item
        // invalid; id 1 names "pick up the Mug", not "": no agreement.
        // First: names = ["find a mug", ""], n = k = 1, minus 0.25 for two
        // items. Then in the other order: "" != "find a mug", n = 0: -0.25.
        // format = 0.125 + 0.125 * 1/2 + 0.25 * 1/2 both times.
        let text = answer(r#"[{"action_id": 0, "action_name": "find a Mug"}, {"action_id": 1}]"#);
        assert_eq!(both(&text, &g), [(1.0625, 0.3125, 0.75); 2]);
        let text = answer(r#"[{"action_id": 1}, {"action_id": 0, "action_name": "find a Mug"}]"#);
        assert_eq!(both(&text, &g), [(0.0625, 0.3125, -0.25); 2]);
        // A name with an unpaired surrogate is a string (valid item) equal to nothing.
        let text = answer(r#"[{"action_id": 0, "action_name": "find a Mug\ud800"}]"#);
        assert_eq!(both(&text, &g), [(0.25, 0.25, 0.0); 2]);
    }

    #[test]
    fn empty_plans_and_empty_gold() {
        let g = gt(&["find a Mug"]);
        // [] scores the structure only: items and agreement return 0 for an
        // empty plan, n = 0, and no penalty (len(plan) = 0). "" and {}
        // iterate as no step in Python; a non-empty string or object raises.
        for plan in ["[]", "\"\"", "{}"] {
            assert_eq!(both(&answer(plan), &g)[0], (0.125, 0.125, 0.0), "{plan}");
        }
        for plan in ["\"x\"", "{\"a\": 1}", "5", "null"] {
            assert_eq!(both(&answer(plan), &g)[0], (0.0, 0.0, 0.0), "{plan}");
        }
        // No ground truth: accuracy 0, the format as usual.
        let text = response(&[(0, "find a Mug"), (1, "pick up the Mug")]);
        assert_eq!(both(&text, &[]), [(0.5, 0.5, 0.0); 2]);
        // Not an object: data.get raises.
        assert_eq!(both("[{\"executable_plan\": []}]", &g)[0], (0.0, 0.0, 0.0));
    }

    #[test]
    fn structure_needs_the_four_keys() {
        // check_structure: {"reasoning_and_reflection", "visual_state_description",
        // "language_plan", "executable_plan"} <= data.keys(), values unchecked.
        let g = gt(&["find a Mug"]);
        let plan = r#"[{"action_id": 0, "action_name": "find a Mug"}]"#;
        let full = answer(plan);
        assert_eq!(both(&full, &g), [(1.5, 0.5, 1.0); 2]);
        for key in [
            "reasoning_and_reflection",
            "visual_state_description",
            "language_plan",
        ] {
            let text = full.replacen(&format!("\"{key}\""), "\"other\"", 1);
            assert_eq!(both(&text, &g), [(1.375, 0.375, 1.0); 2], "{key}");
        }
        let text = format!("{{\"executable_plan\": {plan}}}");
        assert_eq!(both(&text, &g), [(1.375, 0.375, 1.0); 2]);
        // Any values, null included.
        let text = format!(
            "{{\"reasoning_and_reflection\": null, \"visual_state_description\": 5, \"language_plan\": {{}}, \"executable_plan\": {plan}}}"
        );
        assert_eq!(both(&text, &g), [(1.5, 0.5, 1.0); 2]);
        // A bare list (tolerant only) has no object, hence no structure part.
        let r = embodied_r1(plan, &g, Some(&actions()), true);
        assert_eq!((r.score, r.format), (1.375, 0.375));
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
