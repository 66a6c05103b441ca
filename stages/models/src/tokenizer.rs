//! The policy's tokenizer: a byte-level BPE (the scheme of GPT-2 and Qwen)
//! trained on an environment's own language — its prompts and JSON plans — and
//! saved as a Hugging Face `tokenizer.json`, so span alignment meets the same
//! token boundaries it meets on a real VLM's output.
//!
//! Three special tokens come first, in this order: `<|pad|>` (0, fills
//! batches), `<|plan|>` (1, ends every prompt: the response follows) and
//! `<|eos|>` (2, ends every response). Byte-level BPE round-trips any text,
//! so a response decodes back to exactly the characters the model wrote.
//!
//! ```no_run
//! use embodyflow_models::tokenizer::{train_bpe, PLAN};
//! let corpus = vec!["{\"executable_plan\": [{\"action_id\": 3, \"action_name\": \"find a Apple\"}]}".to_string()];
//! let tokenizer = train_bpe(&corpus, 300).unwrap();
//! assert_eq!(tokenizer.token_to_id(PLAN), Some(1));
//! ```

use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use crate::ModelError;

/// Pads batches; never attended to and never trained on.
pub const PAD: &str = "<|pad|>";
/// Ends every prompt: the policy's response starts after it.
pub const PLAN: &str = "<|plan|>";
/// Ends every response: sampling stops when the policy writes it.
pub const EOS: &str = "<|eos|>";

/// The ids of the special tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecialIds {
    /// `<|pad|>`.
    pub pad: i32,
    /// `<|plan|>`.
    pub plan: i32,
    /// `<|eos|>`.
    pub eos: i32,
}

impl SpecialIds {
    /// Looks the special tokens up in `tokenizer`.
    pub fn of(tokenizer: &Tokenizer) -> Option<SpecialIds> {
        let id = |token| tokenizer.token_to_id(token).map(|id| id as i32);
        Some(SpecialIds {
            pad: id(PAD)?,
            plan: id(PLAN)?,
            eos: id(EOS)?,
        })
    }
}

/// Trains a byte-level BPE of `vocab_size` tokens (specials included) on `corpus`.
pub fn train_bpe(corpus: &[String], vocab_size: usize) -> Result<Tokenizer, ModelError> {
    let specials = [PAD, PLAN, EOS]
        .into_iter()
        .map(|token| AddedToken::from(token, true))
        .collect();
    let mut trainer: TrainerWrapper = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    tokenizer
        .train(&mut trainer, corpus.iter())
        .map_err(|e| ModelError::Tokenizer(format!("training the BPE failed: {e}")))?;
    Ok(tokenizer)
}

/// A `tokenizer.json`, or an error naming the file.
pub fn load(path: &std::path::Path) -> Result<Tokenizer, ModelError> {
    Tokenizer::from_file(path).map_err(|e| ModelError::BadCheckpoint {
        file: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// Token ids of `text` (no special tokens added).
pub fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<i32>, ModelError> {
    let encoding = tokenizer
        .encode(text, false)
        .map_err(|e| ModelError::Tokenizer(format!("encoding failed: {e}")))?;
    Ok(encoding.get_ids().iter().map(|&id| id as i32).collect())
}

/// The text of `ids`, special tokens left out.
pub fn decode(tokenizer: &Tokenizer, ids: &[i32]) -> Result<String, ModelError> {
    let ids: Vec<u32> = ids.iter().map(|&id| id as u32).collect();
    tokenizer
        .decode(&ids, true)
        .map_err(|e| ModelError::Tokenizer(format!("decoding failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus() -> Vec<String> {
        (0..50)
            .map(|i| {
                format!(
                    "{{\"language_plan\": [\"find a Apple\"], \"executable_plan\": [{{\"action_id\": {i}, \"action_name\": \"find a Apple\"}}]}}"
                )
            })
            .collect()
    }

    #[test]
    fn specials_come_first_and_text_round_trips() {
        let tokenizer = train_bpe(&corpus(), 300).unwrap();
        assert_eq!(
            SpecialIds::of(&tokenizer),
            Some(SpecialIds {
                pad: 0,
                plan: 1,
                eos: 2
            })
        );
        let text =
            "{\"executable_plan\": [{\"action_id\": 7, \"action_name\": \"slice the Äpfel\"}]}";
        let mut ids = encode(&tokenizer, text).unwrap();
        ids.push(2);
        assert_eq!(decode(&tokenizer, &ids).unwrap(), text);
        assert!(tokenizer.get_vocab_size(true) <= 300);
    }

    #[test]
    fn training_is_deterministic() {
        let a = train_bpe(&corpus(), 200).unwrap().to_string(false).unwrap();
        let b = train_bpe(&corpus(), 200).unwrap().to_string(false).unwrap();
        assert_eq!(a, b);
    }
}
