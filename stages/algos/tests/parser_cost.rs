//! Cost of plan extraction, step matching and span alignment on
//! pathological 6 MB responses. Ignored by default (it prints timings, it
//! asserts only a generous linear bound); run it with
//! `cargo test --release --workspace --test parser_cost -- --ignored --nocapture`.

use std::time::Instant;

use embodyflow_algos::plan::{GtStep, MatchMode, extract, extract_strict, step_match};
use embodyflow_algos::rewards::{ActionList, embodied_r1};
use embodyflow_algos::spans::{Aligner, test_tokenizer};

const SIZE: usize = 6_000_000;

fn repeat_to(unit: &str, prefix: &str, suffix: &str) -> String {
    let mut text = String::with_capacity(SIZE + unit.len() + suffix.len());
    text.push_str(prefix);
    while text.len() + unit.len() + suffix.len() <= SIZE {
        text.push_str(unit);
    }
    text.push_str(suffix);
    text
}

fn inputs() -> Vec<(&'static str, String)> {
    vec![
        ("'[1,' repeated", repeat_to("[1,", "", "")),
        (
            "valid plan, 6 MB of steps",
            repeat_to(
                "{\"action_id\": 3, \"action_name\": \"find a Mug\"}, ",
                "{\"reasoning_and_reflection\": \"\", \"visual_state_description\": \"\", \"language_plan\": [], \"executable_plan\": [",
                "{\"action_id\": 3, \"action_name\": \"find a Mug\"}]}",
            ),
        ),
        (
            "nested objects with long arrays, unclosed",
            repeat_to(&format!("{{\"k\": [{}", "1, ".repeat(1000)), "", ""),
        ),
        (
            "prose of '{\"a\": \"' (strings hiding braces)",
            repeat_to("{\"a\": \"", "", ""),
        ),
        (
            "steps of 16 bytes, each matching",
            repeat_to(
                "{\"action_id\":3},",
                "{\"executable_plan\":[",
                "{\"action_id\":3}]}",
            ),
        ),
        (
            "bare step lists, each broken at the end",
            repeat_to("[{\"action_id\": 1, \"action_name\": \"x\"}, ", "", ""),
        ),
    ]
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let start = Instant::now();
    let value = f();
    (value, start.elapsed().as_secs_f64())
}

#[test]
#[ignore = "prints timings on 6 MB inputs; run by hand"]
fn pathological_inputs_cost() {
    let gt: Vec<GtStep> = (0..50)
        .map(|i| GtStep {
            action_id: i % 7,
            action_name: if i % 7 == 3 {
                "find a Mug".into()
            } else {
                format!("step {i}")
            },
        })
        .collect();
    let actions = ActionList::new((0..10).map(|i| format!("step {i}")).collect());
    let tokenizer = test_tokenizer();
    let aligner = Aligner::new(&tokenizer);
    let mut slow = Vec::new();
    println!(
        "| input | bytes | extract | extract_strict | embodied_r1 strict | embodied_r1 tolerant | step_match lcs | align |"
    );
    for (name, text) in inputs() {
        let (plan, t_extract) = timed(|| extract(&text));
        let (_, t_strict) = timed(|| extract_strict(&text));
        let (_, t_r1) = timed(|| embodied_r1(&text, &gt, Some(&actions), false));
        let (_, t_r1_tolerant) = timed(|| embodied_r1(&text, &gt, Some(&actions), true));
        let (_, t_lcs) = timed(|| plan.map(|p| step_match(&p.steps, &gt, MatchMode::Lcs)));
        let ids = tokenizer
            .encode(text.as_str(), false)
            .unwrap()
            .get_ids()
            .to_vec();
        let (_, t_align) = timed(|| aligner.align(&ids));
        println!(
            "| {name} | {} | {t_extract:.3} s | {t_strict:.3} s | {t_r1:.3} s | {t_r1_tolerant:.3} s | {t_lcs:.3} s | {t_align:.3} s |",
            text.len()
        );
        let total = t_extract + t_strict + t_r1 + t_r1_tolerant + t_lcs + t_align;
        // 1 µs per byte and call is far above linear cost and far below the quadratic one.
        if total > 6.0 * 1e-6 * text.len() as f64 {
            slow.push(format!("{name}: {total:.1} s"));
        }
    }
    assert!(
        slow.is_empty(),
        "slower than 1 µs per byte and call: {slow:?}"
    );
}

#[test]
#[ignore = "prints timings on 6 MB inputs; run by hand"]
fn lcs_against_a_long_ground_truth() {
    let text = repeat_to(
        "{\"action_id\":3},",
        "{\"executable_plan\":[",
        "{\"action_id\":3}]}",
    );
    let plan = extract(&text).unwrap();
    for m in [50, 1000] {
        let gt: Vec<GtStep> = (0..m)
            .map(|i| GtStep {
                action_id: i % 7,
                action_name: format!("step {i}"),
            })
            .collect();
        let (used, seconds) = timed(|| step_match(&plan.steps, &gt, MatchMode::Lcs));
        let hits = used.iter().filter(|&&u| u == 1).count();
        println!(
            "lcs of {} steps against {m}: {seconds:.3} s, {hits} used",
            plan.steps.len()
        );
        assert_eq!(hits, gt.iter().filter(|g| g.action_id == 3).count());
    }
}
