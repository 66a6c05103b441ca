//! Plans in model responses: extraction (strict or tolerant, with the byte
//! span of every step's `action_id` and `action_name` value) and rule
//! matching against a ground-truth plan.
//!
//! A response is a JSON object with `executable_plan`, a list of
//! `{"action_id": int, "action_name": str}` (and usually `language_plan`).
//!
//! **Strict** extraction ([`extract_strict`]) reads a response as the
//! Embodied-R1 reference reward does: the end-of-text tokens [`END_TOKENS`]
//! removed wherever they are, white space stripped as Python's `str.strip`
//! strips it, and the rest must be one JSON object (`json.loads`, which
//! [`crate::json_spans`] follows). Spans point into the response as given.
//! **Tolerant** extraction ([`extract`])
//! also accepts, in this order: trailing special tokens (`<|im_end|>`,
//! `<|endoftext|>`, `</s>`, …) stripped; the first fenced block (```` ```json
//! ```` or ```` ``` ````) that parses; the whole text; the first balanced `{…}`
//! holding an `executable_plan` array; a bare list of steps. Items that are
//! not objects, ids that are not integers and names that are not strings are
//! kept as steps with the missing part `None` ([`IdKind`] and [`NameKind`]
//! say what they were).
//!
//! **Matching** ([`step_match`]) compares predicted with ground-truth steps by
//! `action_id` when it is an integer (of any size: one beyond i64 equals no
//! ground-truth id), falling back to the lower-cased, trimmed `action_name`
//! (a string) when the predicted id is missing or not an integer: `exact`
//! (pred[i] == gt[i]), `prefix` (1 up to the first mismatch, then 0), `lcs`
//! (1 for predicted positions used by a longest common subsequence; ties
//! prefer the earliest predicted positions).
//!
//! Both run in time linear in the response: the search inside prose walks
//! each `{` and `[` once ([`Walker`]), and `lcs` is bit-parallel,
//! O(n·⌈m/64⌉) for n predicted and m ground-truth steps.
//!
//! ```
//! use embodyflow_algos::plan::{extract, step_match, GtStep, MatchMode};
//! let text = "Sure!\n```json\n{\"executable_plan\": [{\"action_id\": 3, \"action_name\": \"find a Mug\"}]}\n```<|im_end|>";
//! let plan = extract(text).unwrap();
//! assert_eq!(plan.steps[0].action_id, Some(3));
//! assert_eq!(&text[plan.steps[0].name_span.clone().unwrap()], "\"find a Mug\"");
//! let gt = [GtStep { action_id: 3, action_name: "find a Mug".into() }];
//! assert_eq!(step_match(&plan.steps, &gt, MatchMode::Exact), vec![1]);
//! ```

use std::collections::HashMap;
use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::json_spans::{Json, MAX_DEPTH, Spanned, Walker, parse, parse_prefix};

/// One predicted plan step with where its values sit in the response text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanStep {
    /// The id when the item's `action_id` is an integer that fits in i64.
    pub action_id: Option<i64>,
    /// What the item's `action_id` is.
    pub id_kind: IdKind,
    /// The name when the item's `action_name` is a string (U+FFFD in place
    /// of unpaired surrogate escapes).
    pub action_name: Option<String>,
    /// What the item's `action_name` is.
    pub name_kind: NameKind,
    /// Byte span of the `action_id` value when it is an integer (of any size).
    pub id_span: Option<Range<usize>>,
    /// Byte span of the `action_name` value (with its quotes) when it is a string.
    pub name_span: Option<Range<usize>>,
    /// Whether the item is an object.
    pub is_object: bool,
    /// The reference's test of a valid item: an object whose `action_id` is
    /// an int for Python (an integer of any size, or a bool) and whose
    /// `action_name` is a string.
    pub well_formed: bool,
}

/// What a step's `action_id` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// No `action_id` (or the item is not an object).
    Missing,
    /// An integer that fits in i64, in [`PlanStep::action_id`].
    Integer,
    /// An integer beyond i64. Python's ints are unbounded, so it is still an
    /// id: it matches no ground-truth id and names no action, and it is
    /// never replaced by the name.
    BigInteger,
    /// `true` or `false`: an int for Python's `isinstance`, so a valid item
    /// for the reference, whose action map has no key `"True"`.
    Bool,
    /// Anything else: null, a float (`3.0`, `1e2`, `NaN`), a string, an
    /// array, an object.
    Other,
}

impl IdKind {
    fn of(value: Option<&Spanned>) -> IdKind {
        match value.map(|v| &v.json) {
            None => IdKind::Missing,
            Some(Json::Bool(_)) => IdKind::Bool,
            Some(json @ Json::Number(n)) if json.is_integer() => match n.parse::<i64>() {
                Ok(_) => IdKind::Integer,
                Err(_) => IdKind::BigInteger,
            },
            Some(_) => IdKind::Other,
        }
    }

    /// Whether Python's `isinstance(action_id, int)` holds.
    pub fn is_python_int(self) -> bool {
        matches!(self, IdKind::Integer | IdKind::BigInteger | IdKind::Bool)
    }
}

/// What a step's `action_name` is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    /// No `action_name` (or the item is not an object).
    Missing,
    /// A string.
    String,
    /// A string with an unpaired surrogate escape: it equals no name.
    StringWithSurrogates,
    /// Anything else: null, a number, a bool, an array, an object.
    Other,
}

/// How the plan was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanSource {
    /// The whole response is the JSON object.
    Whole,
    /// Inside a fenced code block.
    Fenced,
    /// A balanced object found inside prose.
    Embedded,
    /// A bare list of steps.
    BareList,
}

/// A plan extracted from a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The steps in order.
    pub steps: Vec<PlanStep>,
    /// Byte span of the `executable_plan` array (or the bare list).
    pub plan_span: Range<usize>,
    /// How it was found.
    pub source: PlanSource,
    /// Whether the object holding `executable_plan` has the four keys of the
    /// Embodied-R1 answer format: `reasoning_and_reflection`,
    /// `visual_state_description`, `language_plan`, `executable_plan` (false
    /// for a bare list).
    pub answer_keys: bool,
}

/// A ground-truth step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GtStep {
    /// Action id.
    pub action_id: i64,
    /// Action name.
    pub action_name: String,
}

/// Rule matching mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchMode {
    /// pred[i] == gt[i].
    Exact,
    /// 1 up to the first mismatch, then 0.
    Prefix,
    /// Positions used by a longest common subsequence.
    Lcs,
}

/// The end-of-text tokens the Embodied-R1 reference removes from a response
/// before parsing it (Qwen's, DeepSeek's end of sentence, GPT's), in its order.
pub const END_TOKENS: [&str; 3] = [
    "<|im_end|>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
    "<|endoftext|>",
];

/// Extracts the plan as the Embodied-R1 reference reads a response (see the
/// module doc): `None` unless the rest is one JSON object with an
/// `executable_plan` array.
pub fn extract_strict(text: &str) -> Option<Plan> {
    let (clean, removed) = remove_end_tokens(text);
    let body = clean.trim_start_matches(python_space);
    let lead = clean.len() - body.len();
    let value = parse(body.trim_end_matches(python_space)).ok()?;
    let mut plan = strict_plan(&value)?;
    plan.plan_span = removed.span(&plan.plan_span, lead);
    for step in &mut plan.steps {
        step.id_span = step.id_span.as_ref().map(|r| removed.span(r, lead));
        step.name_span = step.name_span.as_ref().map(|r| removed.span(r, lead));
    }
    Some(plan)
}

/// The plan of the reference's `data.get("executable_plan", [])`: an array,
/// or an empty string or object, which Python iterates as no step. On a
/// non-empty string or object the reference raises (`step.get` of a
/// character or a key), on anything else it cannot iterate.
fn strict_plan(value: &Spanned) -> Option<Plan> {
    let plan = value.get("executable_plan")?;
    match &plan.json {
        Json::Array(_) => plan_from_object(value, PlanSource::Whole),
        Json::String(s) if s.is_empty() => Some(Plan {
            steps: Vec::new(),
            plan_span: plan.span.clone(),
            source: PlanSource::Whole,
            answer_keys: has_answer_keys(value),
        }),
        Json::Object(members) if members.is_empty() => Some(Plan {
            steps: Vec::new(),
            plan_span: plan.span.clone(),
            source: PlanSource::Whole,
            answer_keys: has_answer_keys(value),
        }),
        _ => None,
    }
}

/// Python's `str.isspace`: Unicode white space and the four information
/// separators U+001C..U+001F.
fn python_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Where [`remove_end_tokens`] removed text: per pass, each removal as (its
/// offset in the pass's output, bytes removed by the pass up to there).
struct Removals(Vec<Vec<(usize, usize)>>);

impl Removals {
    /// The offset in the original text of offset `at` of the cleaned text;
    /// `after` counts a removal at `at` as lying before it.
    fn map(&self, mut at: usize, after: bool) -> usize {
        for pass in self.0.iter().rev() {
            let before = pass.partition_point(|&(p, _)| p < at || (after && p == at));
            at += before.checked_sub(1).map_or(0, |i| pass[i].1);
        }
        at
    }

    /// The span in the original text of `span` of the cleaned text shifted
    /// by `lead`; text removed right before or after it stays out.
    fn span(&self, span: &Range<usize>, lead: usize) -> Range<usize> {
        self.map(span.start + lead, true)..self.map(span.end + lead, false)
    }
}

/// `text` with every [`END_TOKENS`] occurrence removed, one token after the
/// other as Python's `str.replace` removes them (left to right, not
/// overlapping; a pass can join a later token's pieces).
fn remove_end_tokens(text: &str) -> (String, Removals) {
    let mut current = text.to_string();
    let mut passes = Vec::new();
    for token in END_TOKENS {
        if !current.contains(token) {
            continue;
        }
        let mut out = String::with_capacity(current.len());
        let mut marks = Vec::new();
        let mut last = 0;
        for (at, _) in current.match_indices(token) {
            out.push_str(&current[last..at]);
            last = at + token.len();
            marks.push((out.len(), last - out.len()));
        }
        out.push_str(&current[last..]);
        current = out;
        passes.push(marks);
    }
    (current, Removals(passes))
}

/// Extracts the plan tolerantly (see the module doc); `None` when no plan is found.
pub fn extract(text: &str) -> Option<Plan> {
    let body = strip_trailing_special_tokens(text);
    for (start, end) in fenced_blocks(body) {
        if let Some((value, _)) = parse_inner(text, start, end)
            && let Some(plan) = plan_from_value(&value, PlanSource::Fenced)
        {
            return Some(plan);
        }
    }
    if let Ok(value) = parse(body)
        && let Some(plan) = plan_from_value(&value, PlanSource::Whole)
    {
        return Some(plan);
    }
    embedded(body)
}

/// The first object with a plan inside prose, else the first bare list.
fn embedded(body: &str) -> Option<Plan> {
    let (object, list) = first_candidates(body);
    if let Some(start) = object
        && let Ok((value, _)) = parse_prefix(body, start)
        && let Some(plan) = plan_from_object(&value, PlanSource::Embedded)
    {
        return Some(plan);
    }
    let (value, _) = parse_prefix(body, list?).ok()?;
    plan_from_list(&value, PlanSource::BareList)
}

/// Keys the candidate search watches, in bit order.
const WATCHED: [&str; 3] = ["executable_plan", "action_id", "action_name"];

/// The start of the first `{` that parses and holds an `executable_plan`
/// array (its last), and of the first `[` that parses and holds an object
/// with an `action_id` or an `action_name`, as [`parse_prefix`] tried at
/// every `{` and `[` would find them, in linear time ([`Walker`]). The list
/// is searched only when no object is found.
fn first_candidates(body: &str) -> (Option<usize>, Option<usize>) {
    let mut walker = Walker::new(body, &WATCHED);
    let (mut object, mut list) = (None::<usize>, None::<usize>);
    for (start, _) in body.match_indices(['{', '[']) {
        if object.is_some_and(|o| o < start) {
            break; // every earlier start is settled
        }
        if walker.is_settled(start) {
            continue;
        }
        walker.walk(start, &mut |c| {
            let at = c.span.start;
            if c.depth > MAX_DEPTH {
                return;
            }
            if c.is_object && c.array_keys & 1 != 0 {
                object = Some(object.map_or(at, |o| o.min(at)));
            } else if !c.is_object && c.len > 0 && c.item_keys & 0b110 != 0 {
                list = Some(list.map_or(at, |l| l.min(at)));
            }
        });
    }
    (object, list)
}

/// Parses the JSON value that fills `text[start..end]` (surrounding white
/// space allowed), with spans in `text`.
fn parse_inner(text: &str, start: usize, end: usize) -> Option<(Spanned, usize)> {
    let (value, after) = parse_prefix(&text[..end], start).ok()?;
    text[after..end].trim().is_empty().then_some((value, after))
}

fn strip_trailing_special_tokens(text: &str) -> &str {
    let mut body = text.trim_end();
    loop {
        let before = body.len();
        if body.ends_with("|>")
            && let Some(open) = body.rfind("<|")
        {
            body = body[..open].trim_end();
        }
        for token in ["</s>", "<eos>", "<end_of_turn>", "[EOS]"] {
            if let Some(stripped) = body.strip_suffix(token) {
                body = stripped.trim_end();
            }
        }
        if body.len() == before {
            return body;
        }
    }
}

/// Byte ranges of the contents of ``` fenced blocks.
fn fenced_blocks(text: &str) -> Vec<(usize, usize)> {
    let mut blocks = Vec::new();
    let mut search = 0;
    while let Some(open) = text[search..].find("```").map(|i| search + i) {
        let after_fence = open + 3;
        let content_start = text[after_fence..]
            .find('\n')
            .map_or(text.len(), |i| after_fence + i + 1);
        let Some(close) = text[content_start.min(text.len())..]
            .find("```")
            .map(|i| content_start + i)
        else {
            break;
        };
        blocks.push((content_start, close));
        search = close + 3;
    }
    blocks
}

fn plan_from_value(value: &Spanned, source: PlanSource) -> Option<Plan> {
    plan_from_object(value, source).or_else(|| plan_from_list(value, PlanSource::BareList))
}

/// The keys of the Embodied-R1 answer format.
pub const ANSWER_KEYS: [&str; 4] = [
    "reasoning_and_reflection",
    "visual_state_description",
    "language_plan",
    "executable_plan",
];

fn has_answer_keys(object: &Spanned) -> bool {
    ANSWER_KEYS.iter().all(|key| object.get(key).is_some())
}

fn plan_from_object(value: &Spanned, source: PlanSource) -> Option<Plan> {
    let plan = value.get("executable_plan")?;
    let Json::Array(items) = &plan.json else {
        return None;
    };
    Some(Plan {
        steps: items.iter().map(step_of).collect(),
        plan_span: plan.span.clone(),
        source,
        answer_keys: has_answer_keys(value),
    })
}

fn plan_from_list(value: &Spanned, source: PlanSource) -> Option<Plan> {
    let Json::Array(items) = &value.json else {
        return None;
    };
    // A bare list counts only when it looks like steps.
    if items.is_empty()
        || !items
            .iter()
            .any(|i| i.get("action_id").is_some() || i.get("action_name").is_some())
    {
        return None;
    }
    Some(Plan {
        steps: items.iter().map(step_of).collect(),
        plan_span: value.span.clone(),
        source,
        answer_keys: false,
    })
}

fn step_of(item: &Spanned) -> PlanStep {
    let id = item.get("action_id");
    let name = item.get("action_name");
    let id_kind = IdKind::of(id);
    let (name_kind, action_name) = match name.map(|v| &v.json) {
        None => (NameKind::Missing, None),
        Some(Json::String(s)) => (NameKind::String, Some(s.clone())),
        Some(Json::StringWithSurrogates(s)) => (NameKind::StringWithSurrogates, Some(s.clone())),
        Some(_) => (NameKind::Other, None),
    };
    let is_object = matches!(item.json, Json::Object(_));
    PlanStep {
        action_id: id
            .filter(|_| id_kind == IdKind::Integer)
            .and_then(|v| match &v.json {
                Json::Number(n) => n.parse().ok(),
                _ => None,
            }),
        id_kind,
        well_formed: is_object && id_kind.is_python_int() && action_name.is_some(),
        action_name,
        name_kind,
        id_span: id
            .filter(|_| matches!(id_kind, IdKind::Integer | IdKind::BigInteger))
            .map(|v| v.span.clone()),
        name_span: name
            .filter(|_| matches!(name_kind, NameKind::String | NameKind::StringWithSurrogates))
            .map(|v| v.span.clone()),
        is_object,
    }
}

/// Normalises an action name for comparison: trimmed, lower-cased.
pub fn normalise_name(name: &str) -> String {
    name.trim().to_lowercase()
}

fn same_step(pred: &PlanStep, gt: &GtStep) -> bool {
    match pred.id_kind {
        IdKind::Integer => pred.action_id == Some(gt.action_id),
        // Still an id, and beyond every ground-truth id: never a name instead.
        IdKind::BigInteger => false,
        IdKind::Missing | IdKind::Bool | IdKind::Other => {
            pred.name_kind == NameKind::String
                && pred
                    .action_name
                    .as_deref()
                    .is_some_and(|n| normalise_name(n) == normalise_name(&gt.action_name))
        }
    }
}

/// Per predicted step: 1 when it matches the ground truth under `mode`, else 0.
pub fn step_match(pred: &[PlanStep], gt: &[GtStep], mode: MatchMode) -> Vec<i8> {
    match mode {
        MatchMode::Exact => pred
            .iter()
            .enumerate()
            .map(|(i, p)| i8::from(gt.get(i).is_some_and(|g| same_step(p, g))))
            .collect(),
        MatchMode::Prefix => {
            let mut matching = true;
            pred.iter()
                .enumerate()
                .map(|(i, p)| {
                    matching &= gt.get(i).is_some_and(|g| same_step(p, g));
                    i8::from(matching)
                })
                .collect()
        }
        MatchMode::Lcs => lcs_used(pred, gt),
    }
}

/// The predicted positions used by a longest common subsequence of `pred`
/// and `gt`, traced as the textbook table `L[i][j]` (the LCS of `pred[i..]`
/// and `gt[j..]`) is traced from (0, 0): take a match, else skip `gt[j]`
/// when `L[i][j+1] >= L[i+1][j]`, else skip `pred[i]`.
///
/// The rows `L[i][·]` are computed bit-parallel (Hyyrö, "Bit-parallel
/// LCS-length computation revisited", 2004) over the ground truth reversed,
/// so that the suffixes `gt[j..]` are bit prefixes: with `V` the row after
/// `pred[n-1], …, pred[i]`, `L[i][j]` is the number of zero bits of `V`
/// below `m - j`, and each predicted step updates `V` with `U = V & M`,
/// `V = (V + U) | (V & !U)`, `M` the bits of the ground-truth steps it
/// matches. The trace needs the rows in the other order: every
/// `⌈√n⌉`-th row is kept and the rows of one block are recomputed from the
/// next kept row. Time O(n·⌈m/64⌉), memory O(√n·⌈m/64⌉) words.
fn lcs_used(pred: &[PlanStep], gt: &[GtStep]) -> Vec<i8> {
    let (n, m) = (pred.len(), gt.len());
    let mut used = vec![0i8; n];
    if n == 0 || m == 0 {
        return used;
    }
    let words = m.div_ceil(64);
    // Bit k stands for gt[m - 1 - k]; one mask per distinct id and name.
    let mut masks: Vec<u64> = Vec::new();
    let mut by_id: HashMap<i64, usize> = HashMap::new();
    let mut by_name: HashMap<String, usize> = HashMap::new();
    let new_mask = |masks: &mut Vec<u64>| {
        masks.resize(masks.len() + words, 0);
        masks.len() / words - 1
    };
    for (j, step) in gt.iter().enumerate() {
        let bit = m - 1 - j;
        let id = *by_id
            .entry(step.action_id)
            .or_insert_with(|| new_mask(&mut masks));
        let name = *by_name
            .entry(normalise_name(&step.action_name))
            .or_insert_with(|| new_mask(&mut masks));
        for mask in [id, name] {
            masks[mask * words + bit / 64] |= 1 << (bit % 64);
        }
    }
    // Which mask each predicted step uses, as same_step decides.
    let pred_mask: Vec<Option<usize>> = pred
        .iter()
        .map(|p| match p.id_kind {
            IdKind::Integer => p.action_id.and_then(|id| by_id.get(&id).copied()),
            IdKind::BigInteger => None,
            IdKind::Missing | IdKind::Bool | IdKind::Other => p
                .action_name
                .as_deref()
                .filter(|_| p.name_kind == NameKind::String)
                .and_then(|name| by_name.get(&normalise_name(name)).copied()),
        })
        .collect();
    let mask = |i: usize| pred_mask[i].map(|k| &masks[k * words..(k + 1) * words]);
    let ones: Vec<u64> = (0..words)
        .map(|w| match (m - 64 * w).min(64) {
            64 => u64::MAX,
            bits => (1 << bits) - 1,
        })
        .collect();
    let advance = |row: &mut [u64], mask: Option<&[u64]>| {
        let Some(mask) = mask else { return };
        let mut carry = false;
        for (v, &bits) in row.iter_mut().zip(mask) {
            let u = *v & bits;
            let (sum, c1) = v.overflowing_add(u);
            let (sum, c2) = sum.overflowing_add(u64::from(carry));
            carry = c1 || c2;
            *v = sum | (*v & !u);
        }
    };
    // L[i][j]: zero bits of row i below m - j.
    let lcs = |row: &[u64], j: usize| {
        let len = m - j;
        let full = len / 64;
        let ones_below: u32 = row[..full].iter().map(|w| w.count_ones()).sum::<u32>()
            + if len.is_multiple_of(64) {
                0
            } else {
                (row[full] & ((1 << (len % 64)) - 1)).count_ones()
            };
        len - ones_below as usize
    };
    let block = n.isqrt().max(1);
    // Kept rows: kept[c] = row c * block, for 0 < c * block < n.
    let mut kept = vec![0u64; (n - 1) / block * words];
    let mut row = ones.clone();
    for i in (1..n).rev() {
        advance(&mut row, mask(i));
        if i % block == 0 {
            kept[(i / block - 1) * words..][..words].copy_from_slice(&row);
        }
    }
    let mut rows = vec![0u64; (block + 1) * words];
    let mut loaded = usize::MAX;
    let (mut i, mut j) = (0, 0);
    while i < n && j < m {
        let start = i - i % block;
        if start != loaded {
            // Rows start..=end of this block, from the kept row `end`.
            let end = (start + block).min(n);
            let mut row = if end == n {
                ones.clone()
            } else {
                kept[(end / block - 1) * words..][..words].to_vec()
            };
            rows[(end - start) * words..][..words].copy_from_slice(&row);
            for t in (start..end).rev() {
                advance(&mut row, mask(t));
                rows[(t - start) * words..][..words].copy_from_slice(&row);
            }
            loaded = start;
        }
        let row_of = |t: usize| &rows[(t - start) * words..][..words];
        let bit = m - 1 - j;
        if mask(i).is_some_and(|mask| mask[bit / 64] & (1 << (bit % 64)) != 0) {
            used[i] = 1;
            i += 1;
            j += 1;
        } else if lcs(row_of(i), j + 1) >= lcs(row_of(i + 1), j) {
            j += 1;
        } else {
            i += 1;
        }
    }
    used
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::Strategy;

    fn gt(ids: &[i64]) -> Vec<GtStep> {
        ids.iter()
            .map(|&id| GtStep {
                action_id: id,
                action_name: format!("action {id}"),
            })
            .collect()
    }

    /// The step of one JSON item.
    fn step(item: &str) -> PlanStep {
        step_of(&parse(item).unwrap())
    }

    fn pred(ids: &[i64]) -> Vec<PlanStep> {
        ids.iter()
            .map(|&id| {
                step(&format!(
                    "{{\"action_id\": {id}, \"action_name\": \"action {id}\"}}"
                ))
            })
            .collect()
    }

    #[test]
    fn match_modes_by_hand() {
        let g = gt(&[1, 2, 3, 4]);
        let p = pred(&[1, 9, 3, 4, 5]);
        assert_eq!(step_match(&p, &g, MatchMode::Exact), vec![1, 0, 1, 1, 0]);
        assert_eq!(step_match(&p, &g, MatchMode::Prefix), vec![1, 0, 0, 0, 0]);
        // Shifted by one: exact sees nothing, lcs sees the common order.
        let p = pred(&[7, 1, 2, 3]);
        assert_eq!(step_match(&p, &g, MatchMode::Exact), vec![0, 0, 0, 0]);
        assert_eq!(step_match(&p, &g, MatchMode::Lcs), vec![0, 1, 1, 1]);
        // Duplicates: only one of two identical predictions is used.
        let p = pred(&[1, 1, 2]);
        assert_eq!(step_match(&p, &g, MatchMode::Lcs), vec![1, 0, 1]);
        assert_eq!(step_match(&[], &g, MatchMode::Lcs), Vec::<i8>::new());
    }

    #[test]
    fn names_stand_in_for_missing_ids() {
        let g = gt(&[5]);
        let p = vec![step(r#"{"action_name": "  ACTION 5 "}"#)];
        assert_eq!(step_match(&p, &g, MatchMode::Exact), vec![1]);
        let p = vec![step(r#"{"action_id": 6, "action_name": "action 5"}"#)];
        assert_eq!(
            step_match(&p, &g, MatchMode::Exact),
            vec![0],
            "an id, when present, decides"
        );
        // Ids that are not integers give way to the name; an unpaired
        // surrogate makes a name equal to nothing.
        for id in ["null", "5.0", "\"5\"", "true"] {
            let p = vec![step(&format!(
                "{{\"action_id\": {id}, \"action_name\": \"action 5\"}}"
            ))];
            assert_eq!(step_match(&p, &g, MatchMode::Exact), vec![1], "{id}");
        }
        let p = vec![step(r#"{"action_name": "action 5\ud800"}"#)];
        assert_eq!(step_match(&p, &g, MatchMode::Exact), vec![0]);
    }

    #[test]
    fn ids_beyond_i64_are_still_ids() {
        // 2^63 and 10^30 are ints for Python, equal to no ground-truth id: the
        // step does not match, although its name is the ground truth's.
        let g = gt(&[5, 6]);
        for id in [
            "9223372036854775808",
            "-9223372036854775809",
            "1000000000000000000000000000000",
        ] {
            let p = vec![
                step(&format!(
                    "{{\"action_id\": {id}, \"action_name\": \"action 5\"}}"
                )),
                step(r#"{"action_id": 6, "action_name": "action 6"}"#),
            ];
            assert_eq!(p[0].id_kind, IdKind::BigInteger);
            for mode in [MatchMode::Exact, MatchMode::Lcs] {
                assert_eq!(step_match(&p, &g, mode), vec![0, 1], "{id} {mode:?}");
            }
            assert_eq!(step_match(&p, &g, MatchMode::Prefix), vec![0, 0], "{id}");
        }
    }

    #[test]
    fn step_kinds_as_python_sees_them() {
        // isinstance(v, int) holds for 3, -0, 10**30 and True, not for 3.0,
        // 1e2, NaN, "3" or None; isinstance(v, str) for any string.
        for (id, kind, value) in [
            ("3", IdKind::Integer, Some(3)),
            ("-0", IdKind::Integer, Some(0)),
            ("-9223372036854775808", IdKind::Integer, Some(i64::MIN)),
            ("9223372036854775808", IdKind::BigInteger, None),
            ("123456789012345678901234567890", IdKind::BigInteger, None),
            ("true", IdKind::Bool, None),
            ("3.0", IdKind::Other, None),
            ("1e2", IdKind::Other, None),
            ("NaN", IdKind::Other, None),
            ("\"3\"", IdKind::Other, None),
            ("null", IdKind::Other, None),
        ] {
            let s = step(&format!("{{\"action_id\": {id}, \"action_name\": \"a\"}}"));
            assert_eq!((s.id_kind, s.action_id), (kind, value), "{id}");
            assert_eq!(s.well_formed, kind.is_python_int(), "{id}");
            assert_eq!(
                s.id_span.is_some(),
                matches!(kind, IdKind::Integer | IdKind::BigInteger)
            );
        }
        for (name, kind, valid) in [
            ("\"a\"", NameKind::String, true),
            ("\"\"", NameKind::String, true),
            ("\"\\ud800\"", NameKind::StringWithSurrogates, true),
            ("null", NameKind::Other, false),
            ("5", NameKind::Other, false),
            ("[\"a\"]", NameKind::Other, false),
        ] {
            let s = step(&format!("{{\"action_id\": 1, \"action_name\": {name}}}"));
            assert_eq!((s.name_kind, s.well_formed), (kind, valid), "{name}");
        }
        let s = step(r#"{"action_name": "a"}"#);
        assert_eq!(
            (s.id_kind, s.well_formed, s.is_object),
            (IdKind::Missing, false, true)
        );
        let s = step(r#"{"action_id": 1}"#);
        assert_eq!((s.name_kind, s.well_formed), (NameKind::Missing, false));
        let s = step("5");
        assert_eq!(
            (s.id_kind, s.name_kind, s.is_object, s.well_formed),
            (IdKind::Missing, NameKind::Missing, false, false)
        );
    }

    #[test]
    fn strict_plan_values_as_python_iterates_them() {
        // data.get("executable_plan", []): a list; "" or {} iterate as no step;
        // "x" and {"a": 1} raise in the reference (step.get); 5, null, true
        // cannot be iterated; a missing key or a non-dict answer score 0.
        for (plan, steps) in [
            ("[]", Some(0)),
            ("[1, {}]", Some(2)),
            ("\"\"", Some(0)),
            ("{}", Some(0)),
            ("\"x\"", None),
            ("{\"a\": 1}", None),
            ("5", None),
            ("null", None),
            ("true", None),
        ] {
            let text = format!("{{\"executable_plan\": {plan}}}");
            assert_eq!(
                extract_strict(&text).map(|p| p.steps.len()),
                steps,
                "{plan}"
            );
        }
        assert!(extract_strict("{\"language_plan\": []}").is_none());
        assert!(extract_strict("[{\"executable_plan\": []}]").is_none());
    }

    fn names(plan: &Plan, text: &str) -> Vec<String> {
        plan.steps
            .iter()
            .map(|s| {
                s.name_span
                    .clone()
                    .map_or("-".into(), |r| text[r].to_string())
            })
            .collect()
    }

    #[test]
    fn adversarial_texts() {
        // Names repeated in language_plan and across steps; keys in either order; escaped quotes.
        let text = r#"{"language_plan": ["find a Mug", "find a Mug"], "executable_plan": [{"action_id": 4, "action_name": "find a Mug"}, {"action_name": "find a \"Mug\"", "action_id": 4}]}"#;
        let plan = extract(text).unwrap();
        assert_eq!(
            names(&plan, text),
            [r#""find a Mug""#, r#""find a \"Mug\"""#]
        );
        assert!(
            plan.steps[0].name_span.as_ref().unwrap().start > text.find("executable_plan").unwrap()
        );
        assert_eq!(plan.steps[1].action_name.as_deref(), Some("find a \"Mug\""));
        assert_eq!(plan.source, PlanSource::Whole);
        assert!(extract_strict(text).is_some());

        // Prose around, a fenced block and trailing special tokens.
        let text = "Plan below.\n```json\n{\"executable_plan\": [{\"action_id\": 1, \"action_name\": \"pick up the Äpfel\"}]}\n```\nDone.<|im_end|><|endoftext|>";
        let plan = extract(text).unwrap();
        assert_eq!(plan.source, PlanSource::Fenced);
        assert_eq!(names(&plan, text), ["\"pick up the Äpfel\""]);
        assert!(extract_strict(text).is_none());

        // Prose without fences.
        let text = "I will do this: {\"executable_plan\": [{\"action_id\": 2, \"action_name\": \"open the Fridge\"}]} ok?";
        assert_eq!(extract(text).unwrap().source, PlanSource::Embedded);

        // A bare list.
        let text =
            "[{\"action_id\": 2, \"action_name\": \"open the Fridge\"}, {\"action_id\": \"x\"}, 5]";
        let plan = extract(text).unwrap();
        assert_eq!(plan.source, PlanSource::BareList);
        assert_eq!(plan.steps.len(), 3);
        assert_eq!(plan.steps[1].action_id, None);
        assert!(
            !plan.steps[1].well_formed && !plan.steps[2].well_formed && plan.steps[0].well_formed
        );

        // Broken JSON and empty text.
        assert!(
            extract("{\"executable_plan\": [{\"action_id\": 1, \"action_name\": \"fi").is_none()
        );
        assert!(extract("").is_none());
        assert!(extract("```json\n```").is_none());
        // A null name is kept as a step without a name.
        let plan =
            extract("{\"executable_plan\": [{\"action_id\": 1, \"action_name\": null}]}").unwrap();
        assert_eq!(plan.steps[0].action_name, None);
        assert_eq!(plan.steps[0].name_span, None);
    }

    #[test]
    fn strict_reading_strips_end_tokens_as_the_reference() {
        // The reference: resp.replace(t, "") for "<|im_end|>", the DeepSeek
        // token and "<|endoftext|>" in turn, .strip(), then json.loads.
        let object = r#"{"executable_plan": [{"action_id": 1, "action_name": "find a Mug"}]}"#;
        for text in [
            format!("{object}<|im_end|>"),
            format!("{object}<|endoftext|>"),
            format!("{object}\n<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>"),
            format!("<|im_end|> \n{object} <|im_end|><|endoftext|>\n"),
            // Python's strip: ideographic space, NBSP, NEL and the separators U+001C..U+001F.
            format!("\u{3000}\u{a0}\u{85}\u{1c}{object}\u{1f}"),
        ] {
            let plan = extract_strict(&text).unwrap_or_else(|| panic!("{text:?}"));
            assert_eq!(names(&plan, &text), ["\"find a Mug\""], "{text:?}");
            assert_eq!(&text[plan.steps[0].id_span.clone().unwrap()], "1");
            assert_eq!(plan.source, PlanSource::Whole);
        }
        // Removed inside strings too: the name reads "find a Mug", its span
        // covers the value as written.
        let text =
            r#"{"executable_plan": [{"action_id": 1, "action_name": "find<|im_end|> a Mug"}]}"#;
        let plan = extract_strict(text).unwrap();
        assert_eq!(plan.steps[0].action_name.as_deref(), Some("find a Mug"));
        assert_eq!(names(&plan, text), [r#""find<|im_end|> a Mug""#]);
        assert_eq!(
            &text[plan.plan_span.clone()],
            &text[text.find('[').unwrap()..text.len() - 1]
        );
        for (text, why) in [
            // One replace per token, in order: removing "<|endoftext|>" joins an
            // "<|im_end|>" that stays, and "<|im_end<|im_end|>|>" keeps one.
            (format!("{object}<|im_<|endoftext|>end|>"), "joined"),
            (format!("{object}<|im_end<|im_end|>|>"), "nested"),
            // Not white space for Python: zero-width space, byte order mark.
            (format!("{object}\u{200b}"), "ZWSP"),
            (format!("\u{feff}{object}"), "BOM"),
            // Other special tokens stay.
            (format!("{object}</s>"), "</s>"),
            (format!("{object}<|im_start|>"), "im_start"),
        ] {
            assert!(extract_strict(&text).is_none(), "{why}");
        }
    }

    /// Embedded search as it was: `parse_prefix` tried at every `{`, then at every `[`.
    fn embedded_by_every_start(body: &str) -> Option<Plan> {
        for (i, byte) in body.bytes().enumerate() {
            if byte == b'{'
                && let Ok((value, _)) = parse_prefix(body, i)
                && let Some(plan) = plan_from_object(&value, PlanSource::Embedded)
            {
                return Some(plan);
            }
        }
        for (i, byte) in body.bytes().enumerate() {
            if byte == b'['
                && let Ok((value, _)) = parse_prefix(body, i)
                && let Some(plan) = plan_from_list(&value, PlanSource::BareList)
            {
                return Some(plan);
            }
        }
        None
    }

    /// Texts of plan-like pieces, prose and stray JSON punctuation.
    fn jsonish() -> impl proptest::strategy::Strategy<Value = String> {
        let piece = proptest::sample::select(vec![
            "{",
            "}",
            "[",
            "]",
            "\"",
            ",",
            ":",
            " ",
            "1",
            "-",
            "\\",
            "x",
            "Plan: ",
            "\"executable_plan\": ",
            "\"action_id\": ",
            "\"action_name\": ",
            "\"find a Mug\"",
            "{\"executable_plan\": [",
            "{\"action_id\": 1, \"action_name\": \"a\"}",
            "]}",
            "\"a\\\"b\"",
            "null",
            "true",
            "\"reasoning_and_reflection\": \"\", ",
            "\u{e9}",
        ]);
        proptest::collection::vec(piece, 0..48).prop_map(|pieces| pieces.concat())
    }

    #[test]
    fn embedded_search_past_the_depth_limit() {
        // Depth 991 parses nowhere from its start; the object inside it does.
        let inner = r#"{"executable_plan": [{"action_id": 1, "action_name": "a"}]}"#;
        let text = format!("{}{inner}{}", "[".repeat(990), "]".repeat(990));
        let plan = extract(&text).unwrap();
        assert_eq!(plan.source, PlanSource::Embedded);
        assert_eq!(plan.steps[0].action_id, Some(1));
        assert_eq!(embedded(&text), embedded_by_every_start(&text));
        // A plan object nested 991 deep is no candidate; a list inside it is.
        let deep = format!(
            "{{\"executable_plan\": {}[{{\"action_id\": 2}}]{}}}",
            "[".repeat(989),
            "]".repeat(989)
        );
        let plan = extract(&format!("x {deep}")).unwrap();
        assert_eq!(plan.source, PlanSource::BareList);
        assert_eq!(embedded(&deep), embedded_by_every_start(&deep));
    }

    proptest::proptest! {
        /// The linear search finds what trying every start finds.
        #[test]
        fn embedded_search_equals_trying_every_start(text in jsonish()) {
            proptest::prop_assert_eq!(embedded(&text), embedded_by_every_start(&text));
        }

        #[test]
        fn extraction_never_panics(text in "(\\PC|[{}\\[\\]\"`:,])*") {
            let _ = extract(&text);
            let _ = extract_strict(&text);
        }

        #[test]
        fn lcs_marks_no_more_than_the_shorter_plan(p in proptest::collection::vec(0i64..4, 0..8), g in proptest::collection::vec(0i64..4, 0..8)) {
            let used = step_match(&pred(&p), &gt(&g), MatchMode::Lcs);
            let hits = used.iter().filter(|&&u| u == 1).count();
            proptest::prop_assert!(hits <= p.len().min(g.len()));
            proptest::prop_assert!(hits >= step_match(&pred(&p), &gt(&g), MatchMode::Prefix).iter().filter(|&&u| u == 1).count());
        }

        /// The bit-parallel trace uses the positions the table's trace uses,
        /// over several words and blocks, with names standing in for ids.
        #[test]
        fn lcs_equals_the_table(p in proptest::collection::vec(0usize..7, 0..300), g in proptest::collection::vec(0i64..5, 0..150)) {
            let items: Vec<PlanStep> = p.iter().map(|&k| match k {
                5 => step(r#"{"action_name": " Action 2"}"#),
                6 => step(r#"{"action_id": 99999999999999999999, "action_name": "action 1"}"#),
                id => step(&format!("{{\"action_id\": {id}}}")),
            }).collect();
            let g = gt(&g);
            proptest::prop_assert_eq!(lcs_used(&items, &g), lcs_by_table(&items, &g));
        }
    }

    /// The textbook table and its trace.
    fn lcs_by_table(pred: &[PlanStep], gt: &[GtStep]) -> Vec<i8> {
        let (n, m) = (pred.len(), gt.len());
        let mut table = vec![vec![0u32; m + 1]; n + 1];
        for i in (0..n).rev() {
            for j in (0..m).rev() {
                table[i][j] = if same_step(&pred[i], &gt[j]) {
                    table[i + 1][j + 1] + 1
                } else {
                    table[i + 1][j].max(table[i][j + 1])
                };
            }
        }
        let mut used = vec![0i8; n];
        let (mut i, mut j) = (0, 0);
        while i < n && j < m {
            if same_step(&pred[i], &gt[j]) && table[i][j] == table[i + 1][j + 1] + 1 {
                used[i] = 1;
                i += 1;
                j += 1;
            } else if table[i][j + 1] >= table[i + 1][j] {
                j += 1;
            } else {
                i += 1;
            }
        }
        used
    }
}
