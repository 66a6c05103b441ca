//! A VLA decision as a training example, the pieces every VLA example
//! source and loss shares: the observation shape a checkpoint takes, a
//! micro-batch's observations decoded into contiguous buffers and viewed as
//! the policy's rows, the action tokens padded to whole chunks, and a
//! demonstration's decision made an example (the scripted expert's,
//! [`super::sft_examples`], and a demonstrations table's,
//! [`super::demonstrations`]).
//!
//! ```text
//! decode_observations(batch, shape) -> (B × pixel_len bytes, B × proprio floats)
//! observation_rows(batch, pixels, proprio, shape)[r] = Observation { image, proprio, instruction: batch[r].prompt }
//! padded_chunks(batch, K × D)[r * K × D + t] = batch[r].response[t], 0 past a short last decision
//! ```

use embodyflow_core::Error;
use embodyflow_core::observation::{self, ObservationShape};
use embodyflow_models::vla::{Observation, VlaConfig};

use crate::Example;

/// The observation shape a VLA checkpoint takes: `image_size² × channels`
/// and its proprio length.
pub fn observation_shape(config: &VlaConfig) -> ObservationShape {
    ObservationShape {
        height: config.image_size as usize,
        width: config.image_size as usize,
        channels: config.channels as usize,
        proprio: config.proprio_dim as usize,
    }
}

/// The observations of a micro-batch decoded into contiguous buffers
/// (`B × pixel_len` bytes, `B × proprio` floats), rows in order: the one
/// place training reads examples' observations ([`Example::observation`]).
pub fn decode_observations(
    batch: &[&Example],
    shape: &ObservationShape,
) -> Result<(Vec<u8>, Vec<f32>), Error> {
    let (pixel_len, proprio_len) = (shape.pixel_len(), shape.proprio);
    let mut pixels = vec![0u8; batch.len() * pixel_len];
    let mut proprio = vec![0f32; batch.len() * proprio_len];
    for (r, example) in batch.iter().enumerate() {
        let bytes = example.observation().ok_or_else(|| {
            Error::BadInput(format!(
                "{}: no observation (a VLA decision needs the steps.observation bytes)",
                example.source
            ))
        })?;
        observation::decode_into(
            bytes,
            shape,
            &mut pixels[r * pixel_len..(r + 1) * pixel_len],
            &mut proprio[r * proprio_len..(r + 1) * proprio_len],
        )
        .map_err(|e| {
            Error::BadInput(format!(
                "{}: {e} (the checkpoint takes {shape})",
                example.source
            ))
        })?;
    }
    Ok((pixels, proprio))
}

/// The policy's view of a micro-batch: row `r` the decoded observation of
/// `batch[r]` (its slices of `pixels` and `proprio`, as
/// [`decode_observations`] laid them out) and its instruction.
pub fn observation_rows<'a>(
    batch: &[&'a Example],
    pixels: &'a [u8],
    proprio: &'a [f32],
    shape: &ObservationShape,
) -> Vec<Observation<'a>> {
    let (pixel_len, proprio_len) = (shape.pixel_len(), shape.proprio);
    batch
        .iter()
        .enumerate()
        .map(|(r, example)| Observation {
            image: &pixels[r * pixel_len..(r + 1) * pixel_len],
            height: shape.height,
            width: shape.width,
            proprio: &proprio[r * proprio_len..(r + 1) * proprio_len],
            instruction: &example.prompt,
        })
        .collect()
}

/// Every row's action tokens as a whole chunk of `per` (`K × D`), row after
/// row: a demonstration's last decision may stop early, and its tokens
/// past the end are bin 0 (the losses mask them out).
pub fn padded_chunks(batch: &[&Example], per: usize) -> Vec<u32> {
    let mut tokens = vec![0u32; batch.len() * per];
    for (r, example) in batch.iter().enumerate() {
        for (t, &token) in example.response.iter().enumerate() {
            tokens[r * per + t] = token as u32;
        }
    }
    tokens
}

/// A behaviour-cloning example: one decision of a demonstration, its
/// instruction ids, action tokens and encoded observation.
pub(crate) fn demonstration_example(
    source: String,
    prompt: &[i32],
    tokens: &[u32],
    observation: Vec<u8>,
) -> Example {
    Example {
        source,
        prompt: prompt.to_vec(),
        response: tokens.iter().map(|&t| t as i32).collect(),
        old_logprobs: Vec::new(),
        advantages: Vec::new(),
        temperature: 1.0,
        observation: Some(observation.into()),
        thought: None,
        response_mask: None,
    }
}

/// A demonstration left out because it failed: what it was (`task `t``
/// or `trajectory `t``) and, when infrastructure ended it (a gym bridge
/// worker that crashed or hung), why.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Dropped {
    /// `task `t`` or `trajectory `t``.
    pub(crate) what: String,
    /// The fault that ended it, if one did.
    pub(crate) fault: Option<String>,
}

/// The summary line of the demonstrations left out because they failed,
/// with the first infrastructure fault among them.
pub(crate) fn dropped_note(dropped: &[Dropped]) -> (String, String) {
    let value = match dropped.first() {
        None => "0".to_string(),
        Some(first) => {
            let mut value = format!(
                "{} failed and were left out (first: {})",
                dropped.len(),
                first.what
            );
            if let Some((count, first)) = first_fault(dropped) {
                value.push_str(&format!(
                    "; {count} of them ended by an infrastructure fault (first: {})",
                    fault_text(first)
                ));
            }
            value
        }
    };
    ("dropped demonstrations".to_string(), value)
}

fn first_fault(dropped: &[Dropped]) -> Option<(usize, &Dropped)> {
    let first = dropped.iter().find(|d| d.fault.is_some())?;
    Some((dropped.iter().filter(|d| d.fault.is_some()).count(), first))
}

fn fault_text(dropped: &Dropped) -> String {
    format!(
        "{}: {}",
        dropped.what,
        dropped.fault.as_deref().unwrap_or_default()
    )
}

/// The error when every demonstration failed, so none is left to train
/// on: how many, and why (the infrastructure faults that ended them, or
/// the expert's own failures), `of` naming where they came from.
pub(crate) fn all_dropped(dropped: &[Dropped], of: &str) -> Error {
    let n = dropped.len();
    let why = match first_fault(dropped) {
        Some((count, first)) if count == n => format!(
            "all {n} ended by an infrastructure fault, not by the expert (first: {})",
            fault_text(first)
        ),
        Some((count, first)) => format!(
            "{count} ended by an infrastructure fault (first: {}), the other {} did not complete their task (first: {})",
            fault_text(first),
            n - count,
            dropped
                .iter()
                .find(|d| d.fault.is_none())
                .map_or(String::new(), |d| d.what.clone())
        ),
        None => format!(
            "none completed its task, and no infrastructure fault ended them (first: {})",
            dropped[0].what
        ),
    };
    Error::BadInput(format!(
        "no training examples: every one of the {n} demonstrations {of} failed and was left out: {why}"
    ))
}
