//! Fuzzing of plan extraction, step matching, the rewards built on them,
//! token-span alignment and an OpenVLA checkpoint's dataset statistics: generated responses (answers built from plan
//! pieces, then mutated; soups of JSON punctuation, escapes, special tokens
//! and prose; large repetitive texts up to 6 MB) go through every function,
//! whose results are checked against invariants; panics are caught and
//! counted, and the worst time per byte is kept.
//!
//! `fuzz_quick` runs in CI (a few seconds); `fuzz_ten_million` is the long
//! run whose figures README reports:
//! `cargo test --release --workspace --test fuzz_parsers -- --ignored --nocapture`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::{Duration, Instant};

use embodyflow_algos::action_stats::{DatasetStatistics, Normalization};
use embodyflow_algos::plan::{GtStep, MatchMode, Plan, extract, extract_strict, step_match};
use embodyflow_algos::rewards::{ActionList, embodied_r1, verify};
use embodyflow_algos::spans::{Aligner, test_tokenizer, token_offsets};

/// SplitMix64: a small, seeded generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const ATOMS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    "\"",
    ",",
    ":",
    " ",
    "\n",
    "\t",
    "\\",
    "\\\"",
    "\\\\",
    "\\u00e9",
    "\\ud800",
    "\\udc00",
    "\\u",
    "0",
    "1",
    "-",
    "-0",
    "01",
    "3.0",
    "1e5",
    "NaN",
    "-Infinity",
    "123456789012345678901234567890",
    "true",
    "null",
    "x",
    "é",
    "😀",
    "｜",
    "▁",
    "Plan: ",
    "\"executable_plan\"",
    "\"action_id\"",
    "\"action_name\"",
    "\"language_plan\"",
    "\"reasoning_and_reflection\"",
    "\"visual_state_description\"",
    "\"find a Mug\"",
    "\"pick up the Mug\"",
    "\"FIND A MUG\"",
    "<|im_end|>",
    "<|endoftext|>",
    "<｜end▁of▁sentence｜>",
    "<|",
    "|>",
    "</s>",
    "```json\n",
    "```",
    "\n```",
    "\u{a0}",
    "\u{3000}",
    "\u{1c}",
];

const NAMES: &[&str] = &[
    "\"find a Mug\"",
    "\"pick up the Mug\"",
    "\"find a Sink\"",
    "\" find a Mug\"",
    "\"\"",
    "\"Äpfel\"",
    "null",
    "5",
    "\"a\\ud800\"",
    "\"a\\\"b\"",
];

const IDS: &[&str] = &[
    "0",
    "1",
    "2",
    "-1",
    "7",
    "true",
    "3.0",
    "\"1\"",
    "null",
    "NaN",
    "123456789012345678901234567890",
    "-0",
];

/// An answer in pieces: the four keys, a plan of random items, a wrapper.
fn answer(rng: &mut Rng) -> Vec<String> {
    let mut pieces: Vec<String> = vec!["{".into()];
    for key in [
        "reasoning_and_reflection",
        "visual_state_description",
        "language_plan",
    ] {
        if !rng.chance(6) {
            pieces.extend([
                format!("\"{key}\""),
                ": ".into(),
                "\"\"".into(),
                ", ".into(),
            ]);
        }
    }
    pieces.extend(["\"executable_plan\"".into(), ": ".into(), "[".into()]);
    for k in 0..rng.below(8) {
        if k > 0 {
            pieces.push(", ".into());
        }
        if rng.chance(20) {
            pieces.push(rng.pick(&["5", "\"x\"", "[]", "null"]).into());
            continue;
        }
        pieces.push("{".into());
        if !rng.chance(10) {
            pieces.extend([
                "\"action_id\"".into(),
                ": ".into(),
                rng.pick(IDS).into(),
                ", ".into(),
            ]);
        }
        pieces.extend([
            "\"action_name\"".into(),
            ": ".into(),
            rng.pick(NAMES).into(),
            "}".into(),
        ]);
    }
    pieces.extend(["]".into(), "}".into()]);
    match rng.below(6) {
        0 => pieces.push("<|im_end|>".into()),
        1 => {
            pieces.insert(0, "Sure:\n```json\n".into());
            pieces.push("\n```".into());
        }
        2 => pieces.insert(0, "Plan: ".into()),
        _ => {}
    }
    pieces
}

/// Piece-level mutations (the text stays UTF-8).
fn mutate(rng: &mut Rng, pieces: &mut Vec<String>) {
    for _ in 0..rng.below(5) {
        let at = rng.below(pieces.len() + 1);
        match rng.below(5) {
            0 => pieces.insert(at, rng.pick(ATOMS).into()),
            1 if at < pieces.len() => {
                let end = (at + 1 + rng.below(4)).min(pieces.len());
                pieces.drain(at..end);
            }
            2 if at < pieces.len() => {
                let end = (at + 1 + rng.below(6)).min(pieces.len());
                let copy: Vec<String> = pieces[at..end].to_vec();
                pieces.splice(at..at, copy);
            }
            3 if at < pieces.len() => pieces[at] = rng.pick(ATOMS).into(),
            _ => pieces.truncate(at),
        }
    }
}

/// A response: an answer (mutated or not), a soup, or a medium or large
/// repetition of a random unit.
fn response(rng: &mut Rng, big_one_in: usize) -> (String, &'static str) {
    if rng.chance(big_one_in) {
        let unit: String = (0..1 + rng.below(12)).map(|_| rng.pick(ATOMS)).collect();
        let size = 64 * 1024 + rng.below(6_000_000 - 64 * 1024);
        let mut text = String::with_capacity(size + 64);
        if rng.chance(2) {
            text.push_str(&answer(rng).concat());
        }
        while text.len() + unit.len() <= size {
            text.push_str(&unit);
        }
        if rng.chance(2) {
            text.push_str(&answer(rng).concat());
        }
        return (text, "large repetition");
    }
    match rng.below(10) {
        0..=4 => {
            let mut pieces = answer(rng);
            mutate(rng, &mut pieces);
            (pieces.concat(), "mutated answer")
        }
        5..=8 => (
            (0..rng.below(64)).map(|_| rng.pick(ATOMS)).collect(),
            "soup",
        ),
        _ => {
            let unit: String = (0..1 + rng.below(8)).map(|_| rng.pick(ATOMS)).collect();
            (
                unit.repeat(1 + rng.below(4096 / unit.len().max(1))),
                "medium repetition",
            )
        }
    }
}

fn check_plan(text: &str, plan: &Plan) {
    let inside = |r: &std::ops::Range<usize>| r.start <= r.end && text.get(r.clone()).is_some();
    assert!(inside(&plan.plan_span), "plan span {:?}", plan.plan_span);
    for step in &plan.steps {
        if let Some(r) = &step.name_span {
            assert!(inside(r) && r.end - r.start >= 2, "name span {r:?}");
            assert!(plan.plan_span.start <= r.start && r.end <= plan.plan_span.end);
        }
        if let Some(r) = &step.id_span {
            assert!(inside(r) && r.end > r.start, "id span {r:?}");
        }
        assert_eq!(
            step.id_span.is_some(),
            step.id_kind.is_python_int() && step.id_kind != embodyflow_algos::plan::IdKind::Bool
        );
    }
}

/// Seconds taken by `f`.
fn timed<T>(f: impl FnOnce() -> T) -> f64 {
    let start = Instant::now();
    std::hint::black_box(f());
    start.elapsed().as_secs_f64()
}

/// The calls timed as "extraction, matching and rewards", unchecked.
fn parse_work(text: &str, gt: &[GtStep], actions: &ActionList) {
    let plan = extract(text);
    std::hint::black_box(extract_strict(text));
    if let Some(plan) = &plan {
        for mode in [MatchMode::Exact, MatchMode::Prefix, MatchMode::Lcs] {
            std::hint::black_box(step_match(&plan.steps, gt, mode));
        }
    }
    for tolerant in [false, true] {
        std::hint::black_box(embodied_r1(text, gt, Some(actions), tolerant));
    }
}

#[derive(Default)]
struct Tally {
    inputs: u64,
    executions: u64,
    alignments: u64,
    bytes: u64,
    panics: Vec<String>,
    /// Worst seconds per byte of extraction, matching and rewards over
    /// inputs of at least 4 KiB, with the input's kind and size.
    worst: (f64, &'static str, usize),
    /// The same for alignment (`Aligner::align` of the encoded input).
    worst_align: (f64, &'static str, usize),
    largest: usize,
}

fn run(seed: u64, inputs: u64, big_one_in: usize) -> Tally {
    let tokenizer = test_tokenizer();
    let aligner = Aligner::new(&tokenizer);
    let actions = ActionList::new(
        ["find a Mug", "pick up the Mug", "find a Sink"]
            .map(String::from)
            .to_vec(),
    );
    let mut rng = Rng(seed);
    let mut tally = Tally::default();
    for _ in 0..inputs {
        let (text, kind) = response(&mut rng, big_one_in);
        let gt: Vec<GtStep> = (0..rng.below(6))
            .map(|i| GtStep {
                action_id: rng.below(4) as i64,
                action_name: ["find a Mug", "pick up the Mug", "find a Sink"][i % 3].into(),
            })
            .collect();
        let align = text.len() <= 1 << 20 && (text.len() >= 4096 || rng.chance(4));
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let mut executions = 0;
            let parsing = Instant::now();
            let tolerant = extract(&text);
            let strict = extract_strict(&text);
            executions += 2;
            for plan in tolerant.iter().chain(&strict) {
                check_plan(&text, plan);
            }
            if let Some(plan) = &tolerant {
                let n = plan.steps.len();
                let used: Vec<Vec<i8>> = [MatchMode::Exact, MatchMode::Prefix, MatchMode::Lcs]
                    .map(|mode| step_match(&plan.steps, &gt, mode))
                    .to_vec();
                executions += 3;
                let hits = |u: &Vec<i8>| u.iter().filter(|&&x| x == 1).count();
                assert!(
                    used.iter()
                        .all(|u| u.len() == n && u.iter().all(|&x| x == 0 || x == 1))
                );
                assert!(hits(&used[1]) <= hits(&used[2]) && hits(&used[2]) <= n.min(gt.len()));
                let r = verify(Some(plan.clone()), None, hits(&used[2]), gt.len());
                assert!((-1.0..=1.0).contains(&r.score));
                executions += 1;
            }
            for tolerant in [false, true] {
                let r = embodied_r1(&text, &gt, Some(&actions), tolerant);
                assert!((0.0..=0.5).contains(&r.format), "format {}", r.format);
                assert!(
                    (-0.25..=1.0).contains(&r.accuracy),
                    "accuracy {}",
                    r.accuracy
                );
                assert!(
                    (r.score - (r.format + r.accuracy)).abs() <= 1e-6,
                    "score {}",
                    r.score
                );
                executions += 1;
            }
            let parsed = parsing.elapsed().as_secs_f64();
            let mut alignments = 0;
            let mut align_seconds = 0.0;
            if align {
                let ids = tokenizer
                    .encode(text.as_str(), false)
                    .expect("the test tokenizer encodes any text")
                    .get_ids()
                    .to_vec();
                let aligned = Instant::now();
                let alignment = aligner.align(&ids);
                align_seconds += aligned.elapsed().as_secs_f64();
                alignments += 1;
                if let (Some(steps), Some(offsets)) = (&alignment.steps, aligner.offsets(&ids)) {
                    let plan = alignment.plan.as_ref().expect("steps come with a plan");
                    for (step, spans) in steps.iter().zip(&plan.steps) {
                        let name = spans.name_span.clone().map(|r| r.start + 1..r.end - 1);
                        for &t in &step.name_tokens {
                            let r = &offsets.offsets[t];
                            let n = name.clone().expect("name tokens come with a name");
                            assert!(
                                r.start < n.end && r.end > n.start,
                                "token {r:?} outside {n:?}"
                            );
                        }
                        for &t in &step.id_tokens {
                            let r = &offsets.offsets[t];
                            let n = spans.id_span.clone().expect("id tokens come with an id");
                            assert!(
                                r.start < n.end && r.end > n.start,
                                "token {r:?} outside {n:?}"
                            );
                        }
                    }
                }
                if text.len() <= 4096 {
                    // The other path: the tokenizer's offsets or incremental decoding.
                    if let Some(offsets) = token_offsets(&tokenizer, &ids) {
                        assert_eq!(offsets.offsets.len(), ids.len());
                    }
                    alignments += 1;
                }
            }
            (executions, alignments, align_seconds, parsed)
        }));
        tally.inputs += 1;
        tally.bytes += text.len() as u64;
        tally.largest = tally.largest.max(text.len());
        match outcome {
            Ok((executions, alignments, align_seconds, parse_seconds)) => {
                tally.executions += executions + alignments;
                tally.alignments += alignments;
                // A candidate for the worst is timed three more times and
                // its fastest time kept, so that a pause of the machine is
                // not taken for the cost of the input.
                if text.len() >= 4096 {
                    let per_byte = |s: f64| s / text.len() as f64;
                    if per_byte(parse_seconds) > tally.worst.0 {
                        let fastest = (0..3)
                            .map(|_| timed(|| parse_work(&text, &gt, &actions)))
                            .fold(parse_seconds, f64::min);
                        if per_byte(fastest) > tally.worst.0 {
                            tally.worst = (per_byte(fastest), kind, text.len());
                        }
                    }
                    if align && per_byte(align_seconds) > tally.worst_align.0 {
                        let ids = tokenizer
                            .encode(text.as_str(), false)
                            .map(|e| e.get_ids().to_vec())
                            .unwrap_or_default();
                        let fastest = (0..3)
                            .map(|_| timed(|| aligner.align(&ids)))
                            .fold(align_seconds, f64::min);
                        if per_byte(fastest) > tally.worst_align.0 {
                            tally.worst_align = (per_byte(fastest), kind, text.len());
                        }
                    }
                }
            }
            Err(_) => tally.panics.push(text.chars().take(400).collect()),
        }
    }
    tally
}

fn report(tallies: Vec<Tally>, elapsed: Duration) -> Tally {
    let mut total = Tally::default();
    for t in tallies {
        total.inputs += t.inputs;
        total.executions += t.executions;
        total.alignments += t.alignments;
        total.bytes += t.bytes;
        total.panics.extend(t.panics);
        total.largest = total.largest.max(t.largest);
        if t.worst.0 > total.worst.0 {
            total.worst = t.worst;
        }
        if t.worst_align.0 > total.worst_align.0 {
            total.worst_align = t.worst_align;
        }
    }
    println!(
        "{} inputs ({:.1} MB, largest {} bytes), {} executions ({} alignments), {} panics, {:.1} s; worst per byte: extraction, matching and rewards {:.1} ns ({}, {} bytes), alignment {:.1} ns ({}, {} bytes)",
        total.inputs,
        total.bytes as f64 / 1e6,
        total.largest,
        total.executions,
        total.alignments,
        total.panics.len(),
        elapsed.as_secs_f64(),
        total.worst.0 * 1e9,
        total.worst.1,
        total.worst.2,
        total.worst_align.0 * 1e9,
        total.worst_align.1,
        total.worst_align.2,
    );
    for text in total.panics.iter().take(5) {
        println!("panic on: {text:?}");
    }
    total
}

/// Runs `threads` seeds side by side.
fn fuzz(threads: u64, inputs_each: u64, big_one_in: usize) -> Tally {
    // Quiet the default hook while panics are caught and counted.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let start = Instant::now();
    let tallies = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|seed| scope.spawn(move || run(0xE3B0_C442 + seed, inputs_each, big_one_in)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("caught panics"))
            .collect()
    });
    std::panic::set_hook(hook);
    report(tallies, start.elapsed())
}

#[test]
fn fuzz_quick() {
    let total = fuzz(2, 10_000, 20_000);
    assert!(total.panics.is_empty());
    assert!(total.executions >= 100_000);
}

#[test]
#[ignore = "10 M executions over many minutes; run by hand"]
fn fuzz_ten_million() {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get() as u64);
    let total = fuzz(threads, 2_000_000 / threads, 10_000);
    assert!(total.panics.is_empty());
    assert!(total.executions >= 10_000_000, "{}", total.executions);
}

/// A `dataset_statistics.json` cut into pieces at its tokens: one or two
/// datasets, action and proprio tables of random widths with some of their
/// keys, numbers that are finite, huge, negative zero or not numbers.
fn statistics_pieces(rng: &mut Rng) -> Vec<String> {
    const NUMBERS: &[&str] = &["0.5", "-1.25", "1e308", "-0", "3", "1e-320", "-7.5e3"];
    const ODD: &[&str] = &["NaN", "null", "true", "\"1\"", "1e999", "[]"];
    const KEYS: &[&str] = &["mean", "std", "min", "max", "q01", "q99"];
    let mut pieces = vec!["{".to_string()];
    for d in 0..1 + rng.below(2) {
        if d > 0 {
            pieces.push(",".into());
        }
        pieces.extend([format!("\"dataset_{d}\""), ":".into(), "{".into()]);
        for (t, table) in ["action", "proprio"].iter().enumerate() {
            if t > 0 {
                pieces.push(",".into());
            }
            pieces.extend([format!("\"{table}\""), ":".into(), "{".into()]);
            let width = 1 + rng.below(8);
            for (k, key) in KEYS.iter().chain(["mask"].iter()).enumerate() {
                if k > 0 {
                    pieces.push(",".into());
                }
                pieces.extend([format!("\"{key}\""), ":".into(), "[".into()]);
                for i in 0..width {
                    if i > 0 {
                        pieces.push(",".into());
                    }
                    pieces.push(if *key == "mask" {
                        ["true", "false"][rng.below(2)].to_string()
                    } else if rng.chance(200) {
                        rng.pick(ODD).to_string()
                    } else {
                        rng.pick(NUMBERS).to_string()
                    });
                }
                pieces.push("]".into());
            }
            pieces.push("}".into());
        }
        pieces.extend([
            ",".into(),
            "\"num_transitions\"".into(),
            ":".into(),
            "7".into(),
            "}".into(),
        ]);
    }
    pieces.push("}".into());
    pieces
}

#[test]
fn fuzz_dataset_statistics() {
    let mut rng = Rng(0x5EED);
    let (mut parsed, mut normalized) = (0, 0);
    for _ in 0..20_000 {
        let mut pieces = statistics_pieces(&mut rng);
        if rng.chance(2) {
            mutate(&mut rng, &mut pieces);
        }
        let text = pieces.concat();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let Ok(stats) = DatasetStatistics::from_json(&text) else {
                return (0, 0);
            };
            let mut used = 0;
            let keys: Vec<String> = stats.keys().map(str::to_string).collect();
            for key in keys
                .iter()
                .map(|k| Some(k.as_str()))
                .chain([None, Some("none")])
            {
                let Ok(dataset) = stats.dataset(key) else {
                    continue;
                };
                for kind in [Normalization::Bounds, Normalization::BoundsQ99] {
                    for bounds in [dataset.action_bounds(kind), dataset.proprio_bounds(kind)] {
                        if let Ok(bounds) = bounds {
                            let row = vec![0.25; bounds.width() * 2];
                            let normalized = bounds
                                .normalize(&bounds.unnormalize(&row).unwrap())
                                .unwrap();
                            assert!(
                                normalized
                                    .iter()
                                    .all(|v| (-1.0..=1.0).contains(v) || v.is_nan())
                            );
                            used += 1;
                        }
                    }
                }
            }
            (1, used)
        }));
        let (p, n) = outcome.unwrap_or_else(|_| panic!("dataset statistics panicked on {text}"));
        parsed += p;
        normalized += n;
    }
    // Half the inputs are unmutated, and most of those hold only numbers.
    assert!(
        parsed > 2_000 && normalized > 2_000,
        "{parsed} parsed, {normalized} normalised"
    );
}
