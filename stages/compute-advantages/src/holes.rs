//! Response masks with holes (`steps.response_mask`, veRL's response_mask):
//! the tokens a tool or the environment inserted into a multi-turn response
//! (mask false) are no action of the policy. Every estimator gives them
//! advantage 0 (veRL multiplies its advantages by the mask), token-level GAE
//! skips them and whitens over the valid tokens alone
//! (`embodyflow_algos::gae::gae_tokens_masked_into`).
//!
//! [`Holes::read`] streams `(trajectory_id, step_index, response_mask)` once
//! before the estimator runs (a null column, as collect-rollouts writes and
//! older tables read, is found so by reading that column alone) and keeps,
//! per step with a mask, its length and, when it has a hole, the mask
//! itself: memory grows with the masked steps alone. [`AdvantagesOut`](crate::output)
//! zeroes the advantages (and returns) of every written step at its holes
//! and refuses a mask whose length is not the step's response length.
//!
//! E.g. a step of response `[tool_call, obs, obs, answer]` with mask
//! `[true, false, false, true]` and GRPO advantage 0.5 is written
//! `[0.5, 0, 0, 0.5]`.

use std::collections::HashMap;

use arrow::array::{Array, BooleanArray, Int32Array, ListArray, StringArray};
use embodyflow_core::dataset::{TableReader, column};
use embodyflow_core::{Error, Result, progress};

/// A step's mask as kept: its length, and the mask when it has a hole.
#[derive(Debug, Clone, PartialEq)]
enum Mask {
    /// Every token the policy's.
    Full(usize),
    /// At least one hole.
    Holes(Vec<bool>),
}

/// The masks of the steps table, by `(trajectory_id, step_index)`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Holes {
    masks: HashMap<(String, i32), Mask>,
}

impl Holes {
    /// Reads every non-null `response_mask` of `steps`: a first pass over
    /// the mask column alone stops at the first mask, and only a table with
    /// one is read again with its keys.
    pub fn read(steps: &TableReader, batch_rows: usize) -> Result<Holes> {
        let mut holes = Holes::default();
        let mut any = false;
        for batch in steps.batches(Some(&["response_mask"]), batch_rows)? {
            let batch = batch?;
            if column::<ListArray>(&batch, "response_mask").null_count() < batch.num_rows() {
                any = true;
                break;
            }
        }
        if !any {
            return Ok(holes);
        }
        let bar = progress::bar(steps.num_rows(), "response masks");
        for batch in steps.batches(
            Some(&["trajectory_id", "step_index", "response_mask"]),
            batch_rows,
        )? {
            let batch = batch?;
            bar.inc(batch.num_rows() as u64);
            let masks = column::<ListArray>(&batch, "response_mask");
            if masks.null_count() == batch.num_rows() {
                continue;
            }
            let ids = column::<StringArray>(&batch, "trajectory_id");
            let index = column::<Int32Array>(&batch, "step_index");
            for i in (0..batch.num_rows()).filter(|&i| masks.is_valid(i)) {
                let list = masks.value(i);
                let bits = list
                    .as_any()
                    .downcast_ref::<BooleanArray>()
                    .expect("list<bool>");
                let mask: Vec<bool> = (0..bits.len())
                    .map(|t| bits.is_valid(t) && bits.value(t))
                    .collect();
                holes.insert(ids.value(i), index.value(i), mask);
            }
        }
        bar.finish_and_clear();
        Ok(holes)
    }

    /// Keeps the mask of one step.
    pub fn insert(&mut self, trajectory_id: &str, step_index: i32, mask: Vec<bool>) {
        let kept = if mask.iter().all(|&m| m) {
            Mask::Full(mask.len())
        } else {
            Mask::Holes(mask)
        };
        self.masks
            .insert((trajectory_id.to_string(), step_index), kept);
    }

    /// No step has a mask.
    pub fn is_empty(&self) -> bool {
        self.masks.is_empty()
    }

    /// The mask of a step of `tokens` response tokens when it has a hole;
    /// a mask of another length is bad input naming the step.
    pub fn of_step(
        &self,
        trajectory_id: &str,
        step_index: i32,
        tokens: usize,
    ) -> Result<Option<&[bool]>> {
        if self.masks.is_empty() {
            return Ok(None);
        }
        let Some(mask) = self.masks.get(&(trajectory_id.to_string(), step_index)) else {
            return Ok(None);
        };
        let (len, holes) = match mask {
            Mask::Full(len) => (*len, None),
            Mask::Holes(mask) => (mask.len(), Some(mask.as_slice())),
        };
        if len != tokens {
            return Err(Error::BadInput(format!(
                "steps table, trajectory `{trajectory_id}` step {step_index}: response_mask has {len} entries, expected {tokens} (one per response token)"
            )));
        }
        Ok(holes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_without_holes_keep_their_length_only_and_lengths_are_checked() {
        let mut holes = Holes::default();
        assert_eq!(holes.of_step("a", 0, 3).unwrap(), None);
        holes.insert("a", 0, vec![true, false, true]);
        holes.insert("a", 1, vec![true, true]);
        assert_eq!(
            holes.of_step("a", 0, 3).unwrap(),
            Some(&[true, false, true][..])
        );
        assert_eq!(holes.of_step("a", 1, 2).unwrap(), None);
        assert_eq!(holes.of_step("b", 0, 5).unwrap(), None);
        for (step, tokens, found) in [(0, 4, 3), (1, 1, 2)] {
            let error = holes.of_step("a", step, tokens).unwrap_err().to_string();
            assert!(
                error.contains(&format!(
                    "trajectory `a` step {step}: response_mask has {found} entries, expected {tokens}"
                )),
                "{error}"
            );
        }
    }
}
