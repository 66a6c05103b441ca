//! Outcome estimators: the advantage of a trajectory is one number computed
//! from the scores of its group (veRL's outcome estimators, GRPO's
//! `A^E_i = (R_i - mean_g R) / (std_g R + eps)` the first), broadcast to
//! every response token of every one of its steps. Such an estimator is its
//! kernel ([`Kernel`]: a pure function of `embodyflow_algos` over the
//! scores and the dense group indices of the trajectories) and its declaration; everything else is written here,
//! once:
//!
//! - **which trajectories the kernel sees**: those that count
//!   ([`crate::episodes::Groups::keeps`]: a kept group, no infrastructure
//!   fault), over the whole input whatever `--shard`, so a faulted
//!   trajectory is as if it were absent and the shards' rows together are
//!   the unsharded rows;
//! - **the write**: the steps table streamed once in record batches of
//!   `batch_rows`; every response token of an owned step gets its
//!   trajectory's advantage, in one advantages batch per input batch that
//!   reuses the input's id and offset arrays (memory bounded by the batch);
//!   holes are zeroed by [`AdvantagesOut`]; every trajectory must have
//!   exactly `num_steps` steps rows and, with `rewards.token_rewards`, one
//!   token reward per response token;
//! - **refusals**: a kernel's error ([`AlgoError`]) is bad input naming the
//!   estimator, before any row is written.
//!
//! E.g. a kernel giving `2 R_i`, over a trajectory scored 0.5 whose two
//! steps have 3 and 2 response tokens, the second step's mask `[true,
//! false]`: rows `[1, 1, 1]` and `[1, 0]`, each with `episode_adv` 1.
//!
//! ```text
//! pub static TOY: Estimator = Estimator {
//!     ...
//!     build: |build| Ok(Box::new(Outcome::new(build.estimator.name, Kernel::scores(|scores, _| {
//!         Ok(scores.iter().map(|r| 2.0 * r).collect())
//!     })))),
//! };
//! ```

use arrow::array::{BooleanArray, ListArray, RecordBatch, StringArray};
use arrow::buffer::OffsetBuffer;
use arrow::compute::filter_record_batch;
use embodyflow_algos::AlgoError;
use embodyflow_core::dataset::column;
use embodyflow_core::{Error, Result, progress};

use crate::episodes::{Episodes, Groups, StepCounts};
use crate::estimator::{Estimate, Reported, StepsInput};
use crate::output::{AdvantagesOut, advantages_batch};

/// What a kernel returns: one advantage per trajectory it was given, in
/// their order.
pub type Computed = std::result::Result<Vec<f32>, AlgoError>;

/// A kernel of the scores and the groups.
pub type ScoresKernel = dyn Fn(&[f32], &[u32]) -> Computed;

/// An outcome estimator's maths, by what it reads of the trajectories that
/// count: `scores[i]` (R_i, the sum of its token rewards when it has them)
/// and `groups[i]` (its group's dense index).
pub enum Kernel {
    /// From the scores and groups alone.
    Scores(Box<ScoresKernel>),
}

impl Kernel {
    /// A kernel of the scores and groups.
    pub fn scores(kernel: impl Fn(&[f32], &[u32]) -> Computed + 'static) -> Kernel {
        Kernel::Scores(Box::new(kernel))
    }
}

/// An outcome estimator: its name (every row's `estimator`) and kernel.
pub struct Outcome {
    name: &'static str,
    kernel: Kernel,
}

impl Outcome {
    /// The estimator `name` computing `kernel`.
    pub fn new(name: &'static str, kernel: Kernel) -> Outcome {
        Outcome { name, kernel }
    }

    /// The advantage of every episode, in episode order: the kernel's over
    /// the trajectories that count, 0 for the others (never written).
    pub fn advantages(&self, input: &StepsInput<'_>) -> Result<Vec<f32>> {
        let list = &input.episodes.list;
        let counted: Vec<usize> = (0..list.len())
            .filter(|&e| input.groups.keeps(&list[e]))
            .collect();
        let scores: Vec<f32> = counted.iter().map(|&e| list[e].score).collect();
        let groups: Vec<u32> = counted.iter().map(|&e| list[e].group).collect();
        let computed = match &self.kernel {
            Kernel::Scores(kernel) => kernel(&scores, &groups),
        }
        .map_err(|err| Error::BadInput(format!("{}: {err}", self.name)))?;
        let mut advantages = vec![0.0; list.len()];
        for (&e, a) in counted.iter().zip(computed) {
            advantages[e] = a;
        }
        Ok(advantages)
    }
}

impl Estimate for Outcome {
    fn write(&self, input: &StepsInput<'_>, out: &mut AdvantagesOut) -> Result<Reported> {
        let advantages = self.advantages(input)?;
        let bar = progress::bar(input.steps.num_rows(), "advantages");
        let mut counts = StepCounts::new(input.episodes);
        let token_rewards = input.episodes.has_token_rewards();
        for batch in input.steps.batches(
            Some(&["trajectory_id", "step_index", "response_ids"]),
            input.batch_rows,
        )? {
            let batch = batch?;
            bar.inc(batch.num_rows() as u64);
            let located = counts.locate(column::<StringArray>(&batch, "trajectory_id"))?;
            if token_rewards {
                counts.count_tokens(&located, column::<ListArray>(&batch, "response_ids"));
            }
            out.write_batch(&broadcast(
                &batch,
                &located,
                (input.episodes, input.groups),
                &advantages,
                self.name,
            ))?;
        }
        bar.finish_and_clear();
        counts.check()?;
        Ok(None)
    }
}

/// The advantages rows of one steps batch whose rows belong to episodes
/// `located`: every response token of an owned step gets its trajectory's
/// advantage. The ids and list offsets are reused from the input.
fn broadcast(
    batch: &RecordBatch,
    located: &[usize],
    (episodes, groups): (&Episodes, &Groups),
    advantages: &[f32],
    estimator: &str,
) -> RecordBatch {
    let keep: Vec<bool> = located
        .iter()
        .map(|&e| groups.owns(&episodes.list[e]))
        .collect();
    let (batch, per_step): (RecordBatch, Vec<f32>) = if keep.iter().all(|&k| k) {
        (
            batch.clone(),
            located.iter().map(|&e| advantages[e]).collect(),
        )
    } else {
        let per_step = located
            .iter()
            .zip(&keep)
            .filter(|&(_, &k)| k)
            .map(|(&e, _)| advantages[e])
            .collect();
        let mask = BooleanArray::from(keep);
        let batch = filter_record_batch(batch, &mask).expect("mask has the batch's length");
        (batch, per_step)
    };
    let responses = column::<ListArray>(&batch, "response_ids");
    let offsets = responses.offsets();
    let base = offsets[0] as usize;
    let mut tokens = Vec::with_capacity(offsets[offsets.len() - 1] as usize - base);
    for (i, &a) in per_step.iter().enumerate() {
        tokens.resize(tokens.len() + responses.value_length(i) as usize, a);
    }
    let rebased = OffsetBuffer::new(offsets.iter().map(|&o| o - base as i32).collect());
    advantages_batch(
        batch.column_by_name("trajectory_id").expect("read").clone(),
        batch.column_by_name("step_index").expect("read").clone(),
        rebased,
        tokens,
        None,
        per_step,
        estimator,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{Fixture, step, with_and_without_fault};

    /// Groups g (a, b, c; b with two steps) and h (d, e).
    fn fixture() -> Fixture {
        Fixture::new(
            &[
                ("a", "g", 1.0, 1),
                ("b", "g", 0.0, 2),
                ("c", "g", 0.0, 1),
                ("d", "h", 2.0, 1),
                ("e", "h", 2.0, 1),
            ],
            &[
                step("b", 1, 2),
                step("a", 0, 3),
                step("e", 0, 1),
                step("b", 0, 1),
                step("c", 0, 2),
                step("d", 0, 4),
            ],
        )
    }

    /// Every trajectory's advantage: the number of trajectories the kernel
    /// saw, plus its score.
    fn batch_size() -> Outcome {
        Outcome::new(
            "batch_size",
            Kernel::scores(|scores, _| {
                Ok(scores.iter().map(|s| scores.len() as f32 + s).collect())
            }),
        )
    }

    fn advantages(rows: &[embodyflow_core::schemas::AdvantageRow]) -> Vec<(&str, i32, Vec<f32>)> {
        rows.iter()
            .map(|r| (r.trajectory_id.as_str(), r.step_index, r.advantages.clone()))
            .collect()
    }

    #[test]
    fn the_kernel_sees_every_kept_trajectory_that_ran_and_owned_steps_are_written() {
        let f = fixture();
        let (rows, stats, _) = f.run(&batch_size(), &f.all_groups(), 2).unwrap();
        assert_eq!(
            advantages(&rows),
            [
                ("a", 0, vec![6.0; 3]),
                ("b", 0, vec![5.0]),
                ("b", 1, vec![5.0; 2]),
                ("c", 0, vec![5.0; 2]),
                ("d", 0, vec![7.0; 4]),
                ("e", 0, vec![7.0]),
            ]
        );
        assert!(rows.iter().all(|r| r.episode_adv == r.advantages[0]));
        assert_eq!((stats.steps, stats.tokens), (6, 13));
        // A dropped group leaves the batch; a group another shard owns
        // stays in it but is not written.
        let dropped = Groups {
            kept: vec![true, false],
            owned: vec![true, false],
        };
        let (rows, ..) = f.run(&batch_size(), &dropped, 2).unwrap();
        assert_eq!(rows[0].advantages, [4.0; 3]);
        let elsewhere = Groups {
            kept: vec![true, true],
            owned: vec![false, true],
        };
        let (rows, ..) = f.run(&batch_size(), &elsewhere, 2).unwrap();
        assert_eq!(
            advantages(&rows),
            [("d", 0, vec![7.0; 4]), ("e", 0, vec![7.0])]
        );
    }

    #[test]
    fn a_faulted_trajectory_is_as_if_it_were_absent() {
        let trajectories = [
            ("a", "g", 1.0, 1),
            ("b", "g", 0.0, 2),
            ("c", "g", 0.0, 1),
            ("d", "h", 2.0, 1),
        ];
        let steps = [
            step("a", 0, 1),
            step("b", 0, 2),
            step("b", 1, 1),
            step("c", 0, 3),
            step("d", 0, 1),
        ];
        let (with, without) =
            with_and_without_fault(&trajectories, &steps, "b", &batch_size(), true);
        assert_eq!(with.len(), 3, "b has no row: {with:?}");
        assert_eq!(with, without);
        assert_eq!(with[0].advantages, [4.0]);
    }

    #[test]
    fn a_kernel_error_is_bad_input_naming_the_estimator() {
        let f = fixture();
        let refusing = Outcome::new(
            "refusing",
            Kernel::scores(|_, _| Err(AlgoError::TooFewToWhiten(1))),
        );
        let error = f.run(&refusing, &f.all_groups(), 2).unwrap_err();
        assert!(matches!(error, Error::BadInput(_)), "{error}");
        assert_eq!(
            error.to_string(),
            "refusing: whitening needs at least two valid positions, found 1"
        );
    }
}
