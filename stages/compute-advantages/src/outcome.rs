//! Outcome estimators: the advantage of a trajectory is one number computed
//! from the scores of its group (veRL's outcome estimators), broadcast to
//! every response token of every one of its steps. Such an estimator is its
//! kernel ([`Kernel`]: a pure function of `embodyflow_algos` over the
//! scores, the dense group indices and, when it asks, the valid tokens of
//! the trajectories) and a declaration of a few lines whose `build` is
//! [`build`]; everything else is written here, once:
//!
//! - **which trajectories the kernel sees**: those that count
//!   ([`crate::episodes::Groups::keeps`]: a kept group, no infrastructure
//!   fault), over the whole input whatever `--shard`, so a faulted
//!   trajectory is as if it were absent and the shards' rows together are
//!   the unsharded rows;
//! - **valid tokens** ([`Kernel::Tokens`]): each trajectory's response tokens
//!   that are not holes of `steps.response_mask`, counted in one pass over
//!   the steps before the kernel runs;
//! - **the write**: the steps table streamed once in record batches of
//!   `batch_rows`; every response token of an owned step gets its
//!   trajectory's advantage, in one advantages batch per input batch that
//!   reuses the input's id and offset arrays (memory bounded by the batch);
//!   holes are zeroed by [`AdvantagesOut`]; every trajectory must have
//!   exactly `num_steps` steps rows and, with `rewards.token_rewards`, one
//!   token reward per response token;
//! - **refusals**: a kernel's error ([`AlgoError`]) is bad input naming the
//!   estimator (and the group, for a group too small), before any row.
//!
//! Declared here, each veRL 0.9.1's function of the same name
//! (`embodyflow_algos::outcome` has the formulas; golden tests below run
//! them through the stage on veRL's own fixtures, faulted members added):
//!
//! ```text
//! rloo                          A_i = n / (n - 1) (R_i - mean_g R)
//! opo                           A_i = R_i - sum_g(L R) / sum_g L           (L: valid tokens)
//! gpg                           A_i = N / #{R != 0} (R_i - mean_g R)       (N: the batch)
//! grpo_passk                    A_best = (R_max - R_2nd) / (std_g R + eps), 0 for the others
//! reinforce_plus_plus_baseline  A_i = R_i - mean_g R, whitened over the batch's valid tokens
//! ```
//!
//! GRPO and Dr. GRPO ([`crate::grpo`]) are outcome estimators too, declared
//! beside StepOPSD, which reweights them. E.g. RLOO over a group scored
//! `[1, 0, 0, 1]`: `A = [2/3, -2/3, -2/3, 2/3]`, on every valid token of
//! each trajectory's steps, 0 on its holes.

use arrow::array::{BooleanArray, Int32Array, ListArray, RecordBatch, StringArray};
use arrow::buffer::OffsetBuffer;
use arrow::compute::filter_record_batch;
use embodyflow_algos::AlgoError;
use embodyflow_algos::grpo::GroupNorm;
use embodyflow_algos::outcome::{gpg, grpo_passk, opo, reinforce_plus_plus_baseline, rloo};
use embodyflow_core::config::ConfigKeys;
use embodyflow_core::dataset::column;
use embodyflow_core::section::SectionConfig;
use embodyflow_core::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::config::{Config, Section};
use crate::episodes::{self, Episodes, Groups, GrpoConfig, StepCounts};
use crate::estimator::{Build, Estimate, Estimator, Reported, StepsInput};
use crate::output::{AdvantagesOut, advantages_batch};

/// `estimator = "rloo"`.
pub(crate) static RLOO: Estimator = Estimator {
    name: "rloo",
    about: "RLOO: R_i less the mean of the other scores of its group",
    sections: &[],
    group_relative: true,
    reads: |_| Vec::new(),
    check: |_| Ok(()),
    build: |b| build(b, Kernel::scores(|s, g| Ok(rloo(s, g)))),
};

/// `estimator = "opo"`.
pub(crate) static OPO: Estimator = Estimator {
    name: "opo",
    about: "OPO: R_i less its group's mean score weighted by valid tokens",
    sections: &[],
    group_relative: true,
    reads: |_| Vec::new(),
    check: |_| Ok(()),
    build: |b| build(b, Kernel::tokens(|s, g, l| Ok(opo(s, g, l)))),
};

/// `estimator = "gpg"`.
pub(crate) static GPG: Estimator = Estimator {
    name: "gpg",
    about: "GPG: R_i less its group's mean, times the batch over its non-zero scores",
    sections: &[],
    group_relative: true,
    reads: |_| Vec::new(),
    check: |_| Ok(()),
    build: |b| build(b, Kernel::scores(|s, g| Ok(gpg(s, g)))),
};

/// `estimator = "grpo_passk"`.
pub(crate) static GRPO_PASSK: Estimator = Estimator {
    name: "grpo_passk",
    about: "GRPO pass@k: the best of each group gets its margin over the second, normalised",
    sections: &[episodes::GRPO, PASSK],
    group_relative: true,
    reads: |_| Vec::new(),
    check: |_| Ok(()),
    build: |b| {
        let norm = GroupNorm {
            norm_by_std: b.config.section::<PasskConfig>("grpo_passk").norm_by_std,
            eps: b.config.section::<GrpoConfig>("grpo").eps,
        };
        build(b, Kernel::scores(move |s, g| grpo_passk(s, g, norm)))
    },
};

/// `estimator = "reinforce_plus_plus_baseline"`.
pub(crate) static REINFORCE_PLUS_PLUS_BASELINE: Estimator = Estimator {
    name: "reinforce_plus_plus_baseline",
    about: "REINFORCE++-baseline: R_i less its group's mean, whitened over the batch",
    sections: &[],
    group_relative: true,
    reads: |_| Vec::new(),
    check: |_| Ok(()),
    build: |b| build(b, Kernel::tokens(reinforce_plus_plus_baseline)),
};

/// `grpo_passk.*` settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct PasskConfig {
    /// grpo_passk: divide the best's margin by the group's standard
    /// deviation plus grpo.eps (veRL's norm_adv_by_std_in_grpo).
    pub norm_by_std: bool,
}

impl Default for PasskConfig {
    fn default() -> Self {
        PasskConfig { norm_by_std: true }
    }
}

impl SectionConfig<Config> for PasskConfig {}

/// The `grpo_passk` section.
pub(crate) const PASSK: Section = Section::of::<PasskConfig>("grpo_passk");

/// What a kernel returns: one advantage per trajectory it was given, in
/// their order.
pub(crate) type Computed = std::result::Result<Vec<f32>, AlgoError>;

/// A kernel of the scores and the groups.
pub(crate) type ScoresKernel = dyn Fn(&[f32], &[u32]) -> Computed;

/// A kernel of the scores, the groups and the valid tokens.
pub(crate) type TokensKernel = dyn Fn(&[f32], &[u32], &[usize]) -> Computed;

/// An outcome estimator's maths, by what it reads of the trajectories that
/// count: `scores[i]` (R_i, the sum of its token rewards when it has them),
/// `groups[i]` (its group's dense index) and, for [`Kernel::Tokens`],
/// `valid_tokens[i]`.
pub(crate) enum Kernel {
    /// From the scores and groups alone.
    Scores(Box<ScoresKernel>),
    /// Also from each trajectory's valid response tokens (its response
    /// tokens less the holes of its masks).
    Tokens(Box<TokensKernel>),
}

impl Kernel {
    /// A kernel of the scores and groups.
    pub(crate) fn scores(kernel: impl Fn(&[f32], &[u32]) -> Computed + 'static) -> Kernel {
        Kernel::Scores(Box::new(kernel))
    }

    /// A kernel of the scores, groups and valid tokens.
    pub(crate) fn tokens(
        kernel: impl Fn(&[f32], &[u32], &[usize]) -> Computed + 'static,
    ) -> Kernel {
        Kernel::Tokens(Box::new(kernel))
    }
}

/// The `build` of an outcome estimator: `kernel` under the chosen
/// estimator's name.
pub(crate) fn build(build: &Build<'_>, kernel: Kernel) -> Result<Box<dyn Estimate>> {
    Ok(Box::new(Outcome::new(build.estimator.name, kernel)))
}

/// An outcome estimator: its name (every row's `estimator`) and kernel.
pub(crate) struct Outcome {
    name: &'static str,
    kernel: Kernel,
}

impl Outcome {
    /// The estimator `name` computing `kernel`.
    pub(crate) fn new(name: &'static str, kernel: Kernel) -> Outcome {
        Outcome { name, kernel }
    }

    /// The advantage of every episode, in episode order: the kernel's over
    /// the trajectories that count, 0 for the others (never written).
    pub(crate) fn advantages(&self, input: &StepsInput<'_>) -> Result<Vec<f32>> {
        let list = &input.episodes.list;
        let counted: Vec<usize> = (0..list.len())
            .filter(|&e| input.groups.keeps(&list[e]))
            .collect();
        let scores: Vec<f32> = counted.iter().map(|&e| list[e].score).collect();
        let groups: Vec<u32> = counted.iter().map(|&e| list[e].group).collect();
        let computed = match &self.kernel {
            Kernel::Scores(kernel) => kernel(&scores, &groups),
            Kernel::Tokens(kernel) => {
                let valid = valid_tokens(input)?;
                let valid: Vec<usize> = counted.iter().map(|&e| valid[e]).collect();
                kernel(&scores, &groups, &valid)
            }
        }
        .map_err(|err| self.refusal(err, input.episodes))?;
        let mut advantages = vec![0.0; list.len()];
        for (&e, a) in counted.iter().zip(computed) {
            advantages[e] = a;
        }
        Ok(advantages)
    }

    /// A kernel's error as bad input naming the estimator.
    fn refusal(&self, err: AlgoError, episodes: &Episodes) -> Error {
        let name = self.name;
        Error::BadInput(match err {
            AlgoError::GroupTooSmall {
                group,
                size,
                needed,
            } => format!(
                "{name} needs at least {needed} trajectories per group, group `{}` has {size}",
                episodes.group_ids[group as usize]
            ),
            AlgoError::TooFewToWhiten(_) => format!("{name}: {err} (the batch is too small)"),
            AlgoError::LengthMismatch { .. } => format!("{name}: {err}"),
        })
    }
}

impl Estimate for Outcome {
    fn write(&self, input: &StepsInput<'_>, out: &mut AdvantagesOut) -> Result<Reported> {
        let advantages = self.advantages(input)?;
        let mut counts = StepCounts::new(input.episodes);
        let token_rewards = input.episodes.has_token_rewards();
        input.for_each_batch("advantages", |batch| {
            let located = counts.locate(column::<StringArray>(batch, "trajectory_id"))?;
            if token_rewards {
                counts.count_tokens(&located, column::<ListArray>(batch, "response_ids"));
            }
            out.write_batch(&broadcast(
                batch,
                &located,
                (input.episodes, input.groups),
                &advantages,
                self.name,
            ))
        })?;
        counts.check()?;
        Ok(None)
    }
}

/// Each counted trajectory's response tokens that are not holes, by
/// episode, from one pass over the steps (a mask of another length than
/// its step's response is bad input).
fn valid_tokens(input: &StepsInput<'_>) -> Result<Vec<usize>> {
    let (episodes, groups) = (input.episodes, input.groups);
    let mut valid = vec![0usize; episodes.list.len()];
    input.for_each_batch("valid tokens", |batch| {
        let ids = column::<StringArray>(batch, "trajectory_id");
        let index = column::<Int32Array>(batch, "step_index");
        let responses = column::<ListArray>(batch, "response_ids");
        for i in 0..batch.num_rows() {
            let e = episodes.of_step(ids.value(i))?;
            if !groups.keeps(&episodes.list[e]) {
                continue;
            }
            let tokens = responses.value_length(i) as usize;
            valid[e] += match input.holes.of_step(ids.value(i), index.value(i), tokens)? {
                Some(mask) => mask.iter().filter(|&&m| m).count(),
                None => tokens,
            };
        }
        Ok(())
    })?;
    Ok(valid)
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
    use crate::testdata::{Fixture, matches_verl, step, with_and_without_fault};
    use embodyflow_core::schemas::AdvantageRow;

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

    fn advantages(rows: &[AdvantageRow]) -> Vec<(&str, i32, Vec<f32>)> {
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
            "refusing: whitening needs at least two valid positions, found 1 (the batch is too small)"
        );
    }

    #[test]
    fn golden_rloo_equals_verl() {
        matches_verl(&RLOO, |_| Vec::new());
    }

    #[test]
    fn golden_opo_equals_verl() {
        matches_verl(&OPO, |_| Vec::new());
    }

    #[test]
    fn golden_gpg_equals_verl() {
        matches_verl(&GPG, |_| Vec::new());
    }

    #[test]
    fn golden_reinforce_plus_plus_baseline_equals_verl() {
        matches_verl(&REINFORCE_PLUS_PLUS_BASELINE, |_| Vec::new());
    }

    #[test]
    fn golden_grpo_passk_equals_verl_and_refuses_a_group_of_one() {
        matches_verl(&GRPO_PASSK, |case| {
            let by_std = &case.config["norm_adv_by_std_in_grpo"];
            vec![format!("grpo_passk.norm_by_std={by_std}")]
        });
    }

    /// The declaration the extending page and the interface's doc show is
    /// this module's, word for word.
    #[test]
    fn the_extending_page_shows_a_declaration_that_compiles() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/src/extending.md");
        let page = std::fs::read_to_string(path).unwrap();
        let snippet: Vec<&str> = page
            .lines()
            .skip_while(|l| l.trim() != "```rust")
            .skip(1)
            .take_while(|l| l.trim() != "```")
            .map(|l| l.strip_prefix("   ").unwrap_or(l))
            .collect();
        assert!(snippet.len() > 5, "{snippet:?}");
        let snippet = snippet.join("\n");
        assert!(include_str!("outcome.rs").contains(&snippet), "{snippet}");
        let interface: Vec<&str> = include_str!("estimator.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! ").or(l.strip_prefix("//!")))
            .collect();
        assert!(interface.join("\n").contains(&snippet), "estimator.rs");
    }
}
