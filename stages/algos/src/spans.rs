//! Token-span alignment: which response tokens carry each plan step's
//! `action_id` and `action_name`.
//!
//! 1. Decode the response ids (special tokens kept) and map every token to its
//!    byte range in that text. With a byte-level (GPT-2 style) decoder the text
//!    is the concatenation of the tokens' bytes, so the ranges are prefix sums,
//!    exact by construction ([`Aligner`]). With another decoder, when the
//!    tokens' texts decoded one by one concatenate to the response decoded
//!    whole (one decode checks it), the ranges are their prefix sums (e.g.
//!    a word-level vocabulary with a Metaspace decoder); otherwise the tokenizer's own offsets when
//!    re-encoding the text reproduces the ids exactly (an encode per
//!    response, several times the cost), otherwise incremental decoding (each
//!    token's range is the text it adds; tokens that complete no character
//!    share the range of the text they produce together). Offsets of some tokenizers are known to be wrong
//!    (huggingface/tokenizers#1517, #1553, #1688), so offsets that are not
//!    monotonic or fall off the text also send us to the fallback, which is
//!    counted.
//! 2. Extract the plan with byte spans ([`crate::plan::extract`]).
//! 3. A token belongs to an element (a step's id value, or its name without
//!    the quotes) when it overlaps that element and no other: tokens that
//!    straddle two elements, and all scaffolding, belong to none.
//! 4. Every element's tokens are verified by decoding them (byte-level and
//!    token-text offsets: concatenating their bytes or texts): the decoded
//!    text must contain the element's text, else the element gets no tokens
//!    and the failure is counted.
//!
//! ```no_run
//! # use embodyflow_algos::spans::{align, Alignment};
//! # fn demo(tokenizer: &tokenizers::Tokenizer, ids: &[u32]) {
//! let alignment: Alignment = align(tokenizer, ids);
//! for step in alignment.steps.iter().flatten() {
//!     println!("name tokens {:?}, id tokens {:?}", step.name_tokens, step.id_tokens);
//! }
//! # }
//! ```

use std::ops::Range;
use std::sync::OnceLock;

use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use crate::plan::{Plan, extract};

/// How token offsets were obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetMethod {
    /// Each token's bytes in a byte-level vocabulary (GPT-2 style decoder):
    /// the decoded text is the concatenation of the tokens' bytes, so the
    /// offsets are exact by construction.
    ByteLevel,
    /// Each token's text decoded alone (other decoders), when those texts
    /// concatenated are the response decoded whole (checked by one decode):
    /// the offsets are their prefix sums.
    TokenText,
    /// The tokenizer's offset mapping after an exact re-encode.
    Reencode,
    /// Incremental decoding, token by token.
    IncrementalDecode,
}

/// The decoded response and each token's byte range in it.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenOffsets {
    /// The decoded response.
    pub text: String,
    /// Byte range of each token in `text`.
    pub offsets: Vec<Range<usize>>,
    /// How they were obtained.
    pub method: OffsetMethod,
}

/// Token offsets of `ids`, or `None` when the ids do not decode.
pub fn token_offsets(tokenizer: &Tokenizer, ids: &[u32]) -> Option<TokenOffsets> {
    let text = tokenizer.decode(ids, false).ok()?;
    if let Ok(encoding) = tokenizer.encode(text.as_str(), false)
        && encoding.get_ids() == ids
    {
        let offsets: Vec<Range<usize>> =
            encoding.get_offsets().iter().map(|&(s, e)| s..e).collect();
        if offsets_are_sane(&offsets, &text) {
            return Some(TokenOffsets {
                text,
                offsets,
                method: OffsetMethod::Reencode,
            });
        }
    }
    let mut stream = tokenizer.decode_stream(false);
    let mut built = String::with_capacity(text.len());
    let mut offsets = Vec::with_capacity(ids.len());
    let mut pending = 0; // tokens that completed no character yet
    for &id in ids {
        let start = built.len();
        pending += 1;
        if let Some(chunk) = stream.step(id).ok()? {
            built.push_str(&chunk);
            // The tokens since the last chunk produced this text together.
            offsets.extend(std::iter::repeat_n(start..built.len(), pending));
            pending = 0;
        }
    }
    offsets.extend(std::iter::repeat_n(built.len()..built.len(), pending));
    Some(TokenOffsets {
        text: built,
        offsets,
        method: OffsetMethod::IncrementalDecode,
    })
}

/// Offsets must lie on the text's character boundaries and never move back.
fn offsets_are_sane(offsets: &[Range<usize>], text: &str) -> bool {
    let mut previous_start = 0;
    offsets.iter().all(|r| {
        let ok = r.start <= r.end
            && r.end <= text.len()
            && r.start >= previous_start
            && text.is_char_boundary(r.start)
            && text.is_char_boundary(r.end);
        previous_start = r.start;
        ok
    })
}

/// The tokens of one plan step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StepTokens {
    /// Token indices of the step's `action_id` value.
    pub id_tokens: Vec<usize>,
    /// Token indices of the step's `action_name` value (inside the quotes).
    pub name_tokens: Vec<usize>,
}

/// Which tokens of a step carry its credit (or its score).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepPart {
    /// The `action_name` value.
    ActionName,
    /// The `action_id` value.
    ActionId,
    /// Both.
    Semantic,
}

impl StepTokens {
    /// The token indices of `part`, in order.
    pub fn tokens(&self, part: StepPart) -> Vec<usize> {
        match part {
            StepPart::ActionName => self.name_tokens.clone(),
            StepPart::ActionId => self.id_tokens.clone(),
            StepPart::Semantic => {
                let mut all: Vec<usize> = self
                    .id_tokens
                    .iter()
                    .chain(&self.name_tokens)
                    .copied()
                    .collect();
                all.sort_unstable();
                all.dedup();
                all
            }
        }
    }
}

/// A response aligned to its plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Alignment {
    /// The plan, when one was extracted from the decoded response.
    pub plan: Option<Plan>,
    /// Per plan step, its tokens; `None` when the response could not be
    /// decoded or holds no plan.
    pub steps: Option<Vec<StepTokens>>,
    /// How offsets were obtained (`None` when decoding failed).
    pub method: Option<OffsetMethod>,
    /// Elements whose tokens failed the decode check.
    pub verify_failures: usize,
}

/// Aligns a response's tokens with its plan steps (see the module doc); for
/// many responses build one [`Aligner`] instead.
pub fn align(tokenizer: &Tokenizer, ids: &[u32]) -> Alignment {
    Aligner::new(tokenizer).align(ids)
}

/// The GPT-2 byte-to-character table of byte-level vocabularies, inverted:
/// printable bytes stand for themselves, the others for 256, 257, ... in order.
fn byte_level_chars() -> std::collections::HashMap<char, u8> {
    let mut bytes: Vec<u8> = (b'!'..=b'~')
        .chain(0xA1..=0xAC)
        .chain(0xAE..=0xFF)
        .collect();
    let mut chars: Vec<u32> = bytes.iter().map(|&b| u32::from(b)).collect();
    let mut next = 256;
    for b in 0..=255u8 {
        if !bytes.contains(&b) {
            bytes.push(b);
            chars.push(next);
            next += 1;
        }
    }
    chars
        .into_iter()
        .zip(bytes)
        .map(|(c, b)| (char::from_u32(c).expect("valid char"), b))
        .collect()
}

/// Aligns many responses with one tokenizer. For a byte-level decoder it
/// keeps each token's bytes, so offsets are prefix sums and the decode check
/// needs no tokenizer call; other tokenizers take the re-encode and
/// incremental-decode path of [`token_offsets`].
pub struct Aligner<'a> {
    tokenizer: &'a Tokenizer,
    token_bytes: Option<Vec<Option<Box<[u8]>>>>,
    /// Other decoders: each token's text decoded alone, filled in as the
    /// tokens are met (`None` inside when the id does not decode).
    token_text: Vec<OnceLock<Option<Box<str>>>>,
}

impl<'a> Aligner<'a> {
    /// Prepares an aligner (reads the vocabulary once).
    pub fn new(tokenizer: &'a Tokenizer) -> Aligner<'a> {
        let byte_level = matches!(
            tokenizer.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        );
        let token_bytes = byte_level.then(|| {
            let table = byte_level_chars();
            let size = tokenizer
                .get_vocab(true)
                .values()
                .map(|&id| id as usize + 1)
                .max()
                .unwrap_or(0);
            (0..size as u32)
                .map(|id| {
                    tokenizer.id_to_token(id).map(|token| {
                        // As the ByteLevel decoder: mapped bytes, or the raw text when a char is not in the table.
                        let mapped: Option<Vec<u8>> =
                            token.chars().map(|c| table.get(&c).copied()).collect();
                        mapped
                            .unwrap_or_else(|| token.as_bytes().to_vec())
                            .into_boxed_slice()
                    })
                })
                .collect()
        });
        let token_text = match token_bytes {
            Some(_) => Vec::new(),
            None => (0..tokenizer.get_vocab_size(true))
                .map(|_| OnceLock::new())
                .collect(),
        };
        Aligner {
            tokenizer,
            token_bytes,
            token_text,
        }
    }

    /// The text of token `id` decoded alone (other decoders than byte-level).
    fn token_text(&self, id: u32) -> Option<&str> {
        self.token_text
            .get(id as usize)?
            .get_or_init(|| self.tokenizer.decode(&[id], false).ok().map(Into::into))
            .as_deref()
    }

    /// Offsets as prefix sums of the tokens' texts decoded alone, when they
    /// concatenate to the response decoded whole.
    fn token_text_offsets(&self, ids: &[u32]) -> Option<TokenOffsets> {
        let mut text = String::new();
        let mut offsets = Vec::with_capacity(ids.len());
        for &id in ids {
            let piece = self.token_text(id)?;
            let start = text.len();
            text.push_str(piece);
            offsets.push(start..text.len());
        }
        (self.tokenizer.decode(ids, false).ok()? == text).then_some(TokenOffsets {
            text,
            offsets,
            method: OffsetMethod::TokenText,
        })
    }

    /// Token offsets: exact by construction for byte-level vocabularies when
    /// the bytes form valid UTF-8, else [`token_offsets`].
    pub fn offsets(&self, ids: &[u32]) -> Option<TokenOffsets> {
        if let Some(table) = &self.token_bytes {
            let mut bytes = Vec::with_capacity(ids.len() * 4);
            let mut offsets = Vec::with_capacity(ids.len());
            let complete = ids.iter().all(|&id| match table.get(id as usize) {
                Some(Some(token)) => {
                    let start = bytes.len();
                    bytes.extend_from_slice(token);
                    offsets.push(start..bytes.len());
                    true
                }
                _ => false,
            });
            if complete && let Ok(text) = String::from_utf8(bytes) {
                // Tokens that end inside a character share the range of
                // the characters they complete together (as in incremental decoding).
                let mut group = 0;
                for t in 0..offsets.len() {
                    if text.is_char_boundary(offsets[t].end) {
                        let range = offsets[group].start..offsets[t].end;
                        offsets[group..=t].fill(range);
                        group = t + 1;
                    }
                }
                if offsets_are_sane(&offsets, &text) {
                    return Some(TokenOffsets {
                        text,
                        offsets,
                        method: OffsetMethod::ByteLevel,
                    });
                }
            }
        } else if let Some(found) = self.token_text_offsets(ids) {
            return Some(found);
        }
        token_offsets(self.tokenizer, ids)
    }

    /// The text of `ids` decoded together: their texts concatenated when
    /// the offsets came from them ([`OffsetMethod::TokenText`]), else decoded.
    fn decode(&self, ids: &[u32], method: OffsetMethod) -> String {
        if method == OffsetMethod::TokenText {
            return ids.iter().filter_map(|&id| self.token_text(id)).collect();
        }
        match &self.token_bytes {
            Some(table) => {
                let bytes: Vec<u8> = ids
                    .iter()
                    .filter_map(|&id| table.get(id as usize).cloned().flatten())
                    .flat_map(|b| b.into_vec())
                    .collect();
                String::from_utf8_lossy(&bytes).into_owned()
            }
            None => self.tokenizer.decode(ids, false).unwrap_or_default(),
        }
    }

    /// Aligns one response's tokens with its plan steps.
    pub fn align(&self, ids: &[u32]) -> Alignment {
        let failed = Alignment {
            plan: None,
            steps: None,
            method: None,
            verify_failures: 0,
        };
        let Some(offsets) = self.offsets(ids) else {
            return failed;
        };
        let Some(plan) = extract(&offsets.text) else {
            return Alignment {
                method: Some(offsets.method),
                ..failed
            };
        };
        // Elements: (byte range, step, is_name), by start.
        let mut elements: Vec<(Range<usize>, usize, bool)> = Vec::new();
        for (k, step) in plan.steps.iter().enumerate() {
            if let Some(span) = &step.id_span {
                elements.push((span.clone(), k, false));
            }
            if let Some(span) = &step.name_span {
                elements.push(((span.start + 1)..(span.end - 1), k, true));
            }
        }
        elements.sort_by_key(|(r, _, _)| r.start);
        let mut steps = vec![StepTokens::default(); plan.steps.len()];
        let overlaps = |t: &Range<usize>, e: &Range<usize>| {
            t.start < t.end && t.start < e.end && t.end > e.start
        };
        let mut first = 0; // first element that can still overlap (elements do not overlap each other)
        for (index, token) in offsets.offsets.iter().enumerate() {
            while first < elements.len() && elements[first].0.end <= token.start {
                first += 1;
            }
            let hits: Vec<&(Range<usize>, usize, bool)> = elements[first..]
                .iter()
                .take_while(|(e, _, _)| e.start < token.end)
                .filter(|(e, _, _)| overlaps(token, e))
                .collect();
            if let [(_, step, is_name)] = hits.as_slice() {
                let target = &mut steps[*step];
                if *is_name {
                    target.name_tokens.push(index)
                } else {
                    target.id_tokens.push(index)
                }
            }
        }
        // Verify each element's tokens by decoding them.
        let mut verify_failures = 0;
        for (range, step, is_name) in &elements {
            let tokens = if *is_name {
                &mut steps[*step].name_tokens
            } else {
                &mut steps[*step].id_tokens
            };
            let expected = &offsets.text[range.clone()];
            let selected: Vec<u32> = tokens.iter().map(|&t| ids[t]).collect();
            let decoded = self.decode(&selected, offsets.method);
            if expected.is_empty() || tokens.is_empty() || !decoded.contains(expected.trim()) {
                if !expected.trim().is_empty() {
                    verify_failures += 1;
                }
                tokens.clear();
            }
        }
        Alignment {
            plan: Some(plan),
            steps: Some(steps),
            method: Some(offsets.method),
            verify_failures,
        }
    }
}

/// A small byte-level BPE tokenizer (GPT-2 style) with merges for the words
/// of plan JSON, for tests and examples; `<|im_end|>` is a special token.
pub fn test_tokenizer() -> Tokenizer {
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;

    let mut alphabet: Vec<char> = ByteLevel::alphabet().into_iter().collect();
    alphabet.sort_unstable();
    let mut vocab: Vec<String> = alphabet.iter().map(|c| c.to_string()).collect();
    let mut merges: Vec<String> = Vec::new();
    // Merge every word below left to right, so whole words become tokens.
    let words = [
        "executable",
        "_plan",
        "language",
        "action",
        "_id",
        "_name",
        "find",
        "Ġfind",
        "Ġa",
        "ĠMug",
        "Ġthe",
        "pick",
        "Ġup",
        "Ġ\"",
        "\":",
        "Ġ[{\"",
        "\"},",
        "\"}]}",
        "Ġ12",
        "Ġ4",
        "ĠSink",
        "Ġ[\"",
        "\"],",
        "{\"",
    ];
    for word in words {
        let chars: Vec<String> = word.chars().map(|c| c.to_string()).collect();
        let mut current = chars[0].clone();
        for next in &chars[1..] {
            let merged = format!("{current}{next}");
            if !vocab.contains(&merged) {
                merges.push(format!("{current} {next}"));
                vocab.push(merged.clone());
            }
            current = merged;
        }
    }
    let vocab: serde_json::Map<String, serde_json::Value> = vocab
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, serde_json::Value::from(i)))
        .collect();
    let special_id = vocab.len();
    let json = serde_json::json!({
        "version": "1.0",
        "added_tokens": [{"id": special_id, "content": "<|im_end|>", "single_word": false, "lstrip": false,
                          "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": merges}
    });
    json.to_string().parse().expect("a valid tokenizer.json")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
        tokenizer.encode(text, false).unwrap().get_ids().to_vec()
    }

    fn decode(tokenizer: &Tokenizer, ids: &[u32], tokens: &[usize]) -> String {
        tokenizer
            .decode(&tokens.iter().map(|&t| ids[t]).collect::<Vec<_>>(), false)
            .unwrap()
    }

    #[test]
    fn names_and_ids_land_on_their_own_tokens_only() {
        let tok = test_tokenizer();
        let text = r#"{"language_plan": ["find a Mug"], "executable_plan": [{"action_id": 12, "action_name": "find a Mug"}, {"action_name": "find a Mug", "action_id": 4}]}<|im_end|>"#;
        let ids = ids(&tok, text);
        let alignment = align(&tok, &ids);
        assert_eq!(alignment.method, Some(OffsetMethod::ByteLevel));
        // The byte-level path and the tokenizer's own offsets agree.
        let fast = Aligner::new(&tok).offsets(&ids).unwrap();
        let slow = token_offsets(&tok, &ids).unwrap();
        assert_eq!(slow.method, OffsetMethod::Reencode);
        assert_eq!(
            (fast.text.as_str(), &fast.offsets),
            (slow.text.as_str(), &slow.offsets)
        );
        assert_eq!(fast.text, tok.decode(&ids, false).unwrap());
        assert_eq!(alignment.verify_failures, 0);
        let steps = alignment.steps.unwrap();
        assert_eq!(steps.len(), 2);
        for (step, id) in steps.iter().zip(["12", "4"]) {
            assert_eq!(decode(&tok, &ids, &step.name_tokens).trim(), "find a Mug");
            assert_eq!(decode(&tok, &ids, &step.id_tokens).trim(), id);
        }
        // The copies in language_plan and each other's tokens are not used.
        let language = text.find("language_plan").unwrap();
        let offsets = token_offsets(&tok, &ids).unwrap().offsets;
        assert!(
            steps[0]
                .name_tokens
                .iter()
                .all(|&t| offsets[t].start > language + 30)
        );
        assert!(
            steps[0]
                .name_tokens
                .iter()
                .all(|t| !steps[1].name_tokens.contains(t))
        );
        assert_eq!(
            steps[0].tokens(StepPart::Semantic).len(),
            steps[0].id_tokens.len() + steps[0].name_tokens.len()
        );
    }

    /// A word-level vocabulary of `text`'s space-separated pieces with a
    /// Metaspace pre-tokenizer and decoder (`prepend_scheme`: `never` keeps
    /// every token's space; `always` strips the first token's).
    fn metaspace(text: &str, prepend_scheme: &str) -> Tokenizer {
        let mut vocab = serde_json::Map::new();
        vocab.insert("<unk>".into(), 0.into());
        for (k, piece) in text.split(' ').enumerate() {
            let piece = match k {
                0 if prepend_scheme == "never" => piece.to_string(),
                _ => format!("\u{2581}{piece}"),
            };
            let id = vocab.len();
            vocab.entry(piece).or_insert(id.into());
        }
        let metaspace = serde_json::json!({
            "type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": prepend_scheme, "split": true
        });
        serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": metaspace, "post_processor": null,
            "decoder": metaspace,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
        })
        .to_string()
        .parse()
        .unwrap()
    }

    #[test]
    fn word_level_offsets_come_from_token_texts_as_re_encoding_gives_them() {
        let text = r#"{"executable_plan": [{"action_id": 3, "action_name": "pick up the Mug"}, {"action_id": 1, "action_name": "find a Sink"}]}"#;
        let tok = metaspace(text, "never");
        let ids = ids(&tok, text);
        let aligner = Aligner::new(&tok);
        let fast = aligner.offsets(&ids).unwrap();
        assert_eq!(fast.method, OffsetMethod::TokenText);
        let slow = token_offsets(&tok, &ids).unwrap();
        assert_eq!(slow.method, OffsetMethod::Reencode);
        assert_eq!((&fast.text, &fast.offsets), (&slow.text, &slow.offsets));
        let alignment = aligner.align(&ids);
        let steps = alignment.steps.unwrap();
        assert!(decode(&tok, &ids, &steps[0].name_tokens).contains("pick up the Mug"));
        assert!(decode(&tok, &ids, &steps[1].id_tokens).contains('1'));
        assert_eq!(alignment.verify_failures, 0);
        // A decoder that drops the first token's space: the texts decoded
        // alone do not concatenate to the response, so re-encoding decides.
        let tok = metaspace(text, "always");
        let ids: Vec<u32> = tok.encode(text, false).unwrap().get_ids().to_vec();
        assert_eq!(tok.decode(&ids, false).unwrap(), text);
        let alignment = Aligner::new(&tok).align(&ids);
        assert_eq!(alignment.method, Some(OffsetMethod::Reencode));
        assert!(alignment.steps.unwrap()[0].name_tokens.len() == 4);
    }

    #[test]
    fn non_canonical_ids_fall_back_to_incremental_decoding() {
        let tok = test_tokenizer();
        let text =
            r#"{"executable_plan": [{"action_id": 12, "action_name": "pick up the Äpfel"}]}"#;
        // Spell "pick" byte by byte: decoding gives the same text, re-encoding does not give these ids.
        let mut spelled = Vec::new();
        for piece in [
            "{\"",
            "executable",
            "_plan",
            "\":",
            " [{\"",
            "action",
            "_id",
            "\":",
            " 12",
            ",",
            " \"",
            "action",
            "_name",
            "\":",
            " \"",
        ] {
            spelled.extend(ids(&tok, piece));
        }
        for ch in ["p", "i", "c", "k"] {
            spelled.extend(ids(&tok, ch));
        }
        spelled.extend(ids(&tok, " up the Äpfel\"}]}"));
        assert_eq!(tok.decode(&spelled, false).unwrap(), text);
        assert_eq!(
            token_offsets(&tok, &spelled).unwrap().method,
            OffsetMethod::IncrementalDecode
        );
        let alignment = align(&tok, &spelled);
        assert_eq!(alignment.method, Some(OffsetMethod::ByteLevel));
        let steps = alignment.steps.unwrap();
        assert_eq!(
            decode(&tok, &spelled, &steps[0].name_tokens),
            "pick up the Äpfel"
        );
        assert_eq!(decode(&tok, &spelled, &steps[0].id_tokens).trim(), "12");
        assert_eq!(alignment.verify_failures, 0);
    }

    #[test]
    fn adversarial_texts_get_the_right_spans_or_none() {
        let tok = test_tokenizer();
        let cases = [
            // Fenced block with prose and trailing special tokens.
            (
                "Plan:\n```json\n{\"executable_plan\": [{\"action_id\": 4, \"action_name\": \"find a Sink\"}]}\n```<|im_end|>",
                Some(vec!["find a Sink"]),
            ),
            // Prose around a bare object.
            (
                "ok {\"executable_plan\": [{\"action_name\": \"pick up the Mug\", \"action_id\": 12}]} done",
                Some(vec!["pick up the Mug"]),
            ),
            // A bare list with a malformed item.
            (
                "[{\"action_id\": 4, \"action_name\": \"find a Mug\"}, 7]",
                Some(vec!["find a Mug", ""]),
            ),
            // Escaped quotes and non-ASCII inside a name.
            (
                "{\"executable_plan\": [{\"action_id\": 4, \"action_name\": \"find a \\\"Mug\\\" für Äpfel\"}]}",
                Some(vec!["find a \\\"Mug\\\" für Äpfel"]),
            ),
            // Broken JSON.
            (
                "{\"executable_plan\": [{\"action_id\": 4, \"action_name\": \"find",
                None,
            ),
        ];
        for (text, expected) in cases {
            let ids = ids(&tok, text);
            let alignment = align(&tok, &ids);
            match expected {
                None => assert!(alignment.steps.is_none(), "{text}"),
                Some(names) => {
                    let steps = alignment.steps.expect(text);
                    let got: Vec<String> = steps
                        .iter()
                        .map(|s| decode(&tok, &ids, &s.name_tokens).trim().to_string())
                        .collect();
                    assert_eq!(got, names, "{text}");
                }
            }
        }
    }

    proptest::proptest! {
        /// Whatever the plan, credited tokens lie inside a step's id or name
        /// value: no scaffolding token (keys, quotes, braces, language_plan)
        /// is ever selected.
        #[test]
        fn credited_tokens_never_touch_scaffolding(
            steps in proptest::collection::vec((0i64..30, proptest::sample::select(vec!["find a Mug", "pick up the Mug", "find a Sink", "Äpfel", "a"])), 0..6),
            fenced in proptest::bool::ANY,
        ) {
            let tok = test_tokenizer();
            let items: Vec<String> = steps.iter().map(|(id, n)| format!("{{\"action_id\": {id}, \"action_name\": \"{n}\"}}")).collect();
            let names: Vec<String> = steps.iter().map(|(_, n)| format!("\"{n}\"")).collect();
            let body = format!("{{\"language_plan\": [{}], \"executable_plan\": [{}]}}", names.join(", "), items.join(", "));
            let text = if fenced { format!("Plan:\n```json\n{body}\n```<|im_end|>") } else { body };
            let ids = ids(&tok, &text);
            let aligner = Aligner::new(&tok);
            let alignment = aligner.align(&ids);
            let offsets = aligner.offsets(&ids).unwrap();
            let plan = alignment.plan.clone().unwrap();
            let inner: Vec<std::ops::Range<usize>> = plan
                .steps
                .iter()
                .flat_map(|s| [s.id_span.clone(), s.name_span.clone().map(|r| r.start + 1..r.end - 1)])
                .flatten()
                .collect();
            for step in alignment.steps.unwrap() {
                for t in step.tokens(StepPart::Semantic) {
                    let r = &offsets.offsets[t];
                    // The token's non-space bytes lie inside one value.
                    let trimmed_start = r.start + (offsets.text[r.clone()].len() - offsets.text[r.clone()].trim_start().len());
                    proptest::prop_assert!(
                        inner.iter().any(|e| trimmed_start >= e.start && r.end <= e.end.max(trimmed_start)),
                        "token {:?} = {:?} outside every value in {}", r, &offsets.text[r.clone()], text
                    );
                }
            }
        }

        #[test]
        fn alignment_never_panics_on_any_ids(ids in proptest::collection::vec(0u32..400, 0..80)) {
            let _ = align(&test_tokenizer(), &ids);
        }

        #[test]
        fn alignment_never_panics_on_any_text(text in "(\\PC|[{}\\[\\]\":,])*") {
            let tok = test_tokenizer();
            let _ = align(&tok, &ids(&tok, &text));
        }
    }

    #[test]
    fn broken_or_planless_responses_align_to_nothing() {
        let tok = test_tokenizer();
        for text in [
            "{\"executable_plan\": [{\"action_id\": 12, \"action_na",
            "no plan here",
            "",
        ] {
            let alignment = align(&tok, &ids(&tok, text));
            assert!(alignment.steps.is_none(), "{text}");
        }
        // Ids outside the vocabulary do not decode.
        assert!(align(&tok, &[u32::MAX]).steps.is_none());
    }
}
