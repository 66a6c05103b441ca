//! The episode join, in one place: trajectories ↔ rewards (one finite score
//! per trajectory, the same group on both sides), groups chosen by dynamic
//! sampling and `--shard`, and steps ↔ trajectories (every steps row names a
//! known trajectory, each trajectory has exactly `num_steps` of them).
//!
//! Every estimator sees the same [`Episodes`] and [`Groups`]: group
//! statistics and GAE whitening run over every kept group, while a process
//! writes the steps of the groups it owns (stable hash of `group_id`), so the
//! shards' outputs together equal the unsharded output.
//!
//! A trajectory ended by infrastructure (`trajectories.infra_fault`) is no
//! outcome of the policy: it is joined and its steps checked like any
//! other, but [`Groups::keeps`] and [`Groups::owns`] are false for it, so
//! no estimator counts it in its group's statistics (GRPO's mean and std,
//! GiGPO's step groups, GAE's whitening, dynamic sampling) or writes a row
//! for it: update-policy trains only steps with an advantages row. Its
//! group is computed over the trajectories that ran, exactly as if it had
//! not been there; a group-relative estimator drops a group that faults
//! leave with fewer than 2 ([`Groups::select`]).
//!
//! ```text
//! trajectories (id, group, num_steps) ─┐
//!                                      ├─► Episodes (id, dense group, score, num_steps)
//! rewards      (id, group, score)     ─┘        │
//!                                               ├─► Groups { kept, owned }
//! steps        (id, step_index, ...)  ─► StepCounts::locate ─► checked against num_steps
//! ```
//!
//! E.g. trajectories `a` (group g, 1 step) and `b` (group g, 1 step) with
//! rewards `a: 1`, `b: 0` give one group of two episodes; with
//! `filter.dynamic_sampling` it is kept (scores differ), and a steps row
//! naming `c` is bad input.
//!
//! GRPO's setting `grpo.eps` is here too ([`GrpoConfig`], the section
//! [`GRPO`] that grpo, dr_grpo, grpo_step and grpo_passk declare).

use std::collections::HashMap;

use arrow::array::{Array, BooleanArray, Float32Array, Int32Array, ListArray, StringArray};
use embodyflow_algos::grpo::{GroupNorm, is_mixed};
use embodyflow_core::cli::ShardSpec;
use embodyflow_core::config::{ConfigKeys, positive};
use embodyflow_core::dataset::{TableReader, column};
use embodyflow_core::schemas::{TOKEN_SUM_TOLERANCE, token_sum};
use embodyflow_core::{Error, Result};
use serde::{Deserialize, Serialize};

use crate::config::{Config, Section};
use embodyflow_core::section::SectionConfig;

/// `grpo.*` settings: the group statistics of the group-relative outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ConfigKeys)]
#[serde(default, deny_unknown_fields)]
pub struct GrpoConfig {
    /// Added to the group's standard deviation (grpo, grpo_step, grpo_passk).
    pub eps: f64,
}

impl Default for GrpoConfig {
    fn default() -> Self {
        GrpoConfig { eps: 1e-6 }
    }
}

impl SectionConfig<Config> for GrpoConfig {
    /// `grpo.eps` above 0.
    fn check(&self, _: &Config) -> Result<()> {
        positive("grpo.eps", self.eps)
    }
}

impl GrpoConfig {
    /// The group normalisation: divided by the group's standard deviation
    /// plus eps (GRPO) or centred only (Dr. GRPO).
    pub fn norm(&self, by_std: bool) -> GroupNorm {
        GroupNorm {
            norm_by_std: by_std,
            eps: self.eps,
        }
    }
}

/// The `grpo` section.
pub(crate) const GRPO: Section = Section::of::<GrpoConfig>("grpo");

/// One trajectory with its reward, as the estimators see it.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    /// Trajectory id.
    pub trajectory_id: String,
    /// Dense index of its group.
    pub group: u32,
    /// Its score R_i.
    pub score: f32,
    /// Decision steps it has.
    pub num_steps: i32,
    /// Its per-token rewards (`rewards.token_rewards`, veRL's
    /// token_level_rewards), one per response token over its steps in step
    /// order; `score` is then their sum.
    pub token_rewards: Option<Vec<f32>>,
    /// Whether infrastructure ended it (`trajectories.infra_fault`): no
    /// estimator counts or writes it.
    pub faulted: bool,
}

impl Episode {
    /// Checks that its token rewards (when it has them) cover its
    /// `tokens` response tokens.
    pub fn check_token_rewards(&self, tokens: usize) -> Result<()> {
        match &self.token_rewards {
            Some(rewards) if rewards.len() != tokens => Err(Error::BadInput(format!(
                "trajectory `{}`: rewards.token_rewards has {} entries, its steps have {tokens} response tokens (one reward per response token, steps in order)",
                self.trajectory_id,
                rewards.len()
            ))),
            _ => Ok(()),
        }
    }

    /// Per-step rewards from its token rewards: each step's sum over its
    /// response tokens (`tokens` per step, in step order), the reward of
    /// the decision; without token rewards, the score on the last step.
    /// The token counts must cover the token rewards
    /// ([`Episode::check_token_rewards`]).
    pub fn step_rewards(&self, tokens: &[usize]) -> Result<Vec<f32>> {
        let mut rewards = vec![0f32; tokens.len()];
        match &self.token_rewards {
            None => {
                if let Some(last) = rewards.last_mut() {
                    *last = self.score;
                }
            }
            Some(token_rewards) => {
                self.check_token_rewards(tokens.iter().sum())?;
                let mut at = 0;
                for (reward, &n) in rewards.iter_mut().zip(tokens) {
                    *reward = sum_f64(&token_rewards[at..at + n]);
                    at += n;
                }
            }
        }
        Ok(rewards)
    }
}

/// The sum of `values` accumulated in f64.
fn sum_f64(values: &[f32]) -> f32 {
    values.iter().map(|&v| f64::from(v)).sum::<f64>() as f32
}

/// The batch's trajectories joined with their rewards, grouped.
#[derive(Debug, Clone, Default)]
pub struct Episodes {
    /// Trajectories in input order.
    pub list: Vec<Episode>,
    /// Group ids by dense index.
    pub group_ids: Vec<String>,
    index: HashMap<String, usize>,
}

impl Episodes {
    /// Reads `(trajectory_id, group_id, num_steps)` of the trajectories and
    /// `(trajectory_id, group_id, score)` of the rewards and joins them
    /// ([`Episodes::join`]).
    pub fn read(trajectories: &TableReader, rewards: &TableReader) -> Result<Episodes> {
        let mut faulted = Vec::new();
        // Manifest row counts are untrusted: the vectors grow as rows are
        // read, never sized by them.
        let mut traj = Vec::new();
        for batch in trajectories.batches(
            Some(&["trajectory_id", "group_id", "num_steps", "infra_fault"]),
            65_536,
        )? {
            let batch = batch?;
            let ids = column::<StringArray>(&batch, "trajectory_id");
            let groups = column::<StringArray>(&batch, "group_id");
            let steps = column::<Int32Array>(&batch, "num_steps");
            let fault = column::<BooleanArray>(&batch, "infra_fault");
            for i in 0..batch.num_rows() {
                traj.push((
                    ids.value(i).to_string(),
                    groups.value(i).to_string(),
                    steps.value(i),
                ));
                if fault.is_valid(i) && fault.value(i) {
                    faulted.push(ids.value(i).to_string());
                }
            }
        }
        let mut scores = Vec::new();
        let mut token_rewards = Vec::new();
        for batch in rewards.batches(
            Some(&["trajectory_id", "group_id", "score", "token_rewards"]),
            65_536,
        )? {
            let batch = batch?;
            let ids = column::<StringArray>(&batch, "trajectory_id");
            let groups = column::<StringArray>(&batch, "group_id");
            let score = column::<Float32Array>(&batch, "score");
            let per_token = column::<ListArray>(&batch, "token_rewards");
            for i in 0..batch.num_rows() {
                scores.push((
                    ids.value(i).to_string(),
                    groups.value(i).to_string(),
                    score.value(i),
                ));
                if per_token.is_valid(i) {
                    let list = per_token.value(i);
                    let values = list
                        .as_any()
                        .downcast_ref::<Float32Array>()
                        .expect("list<f32>")
                        .values()
                        .to_vec();
                    token_rewards.push((ids.value(i).to_string(), values));
                }
            }
        }
        let mut episodes = Episodes::join(traj, scores)?;
        for (trajectory_id, rewards) in token_rewards {
            episodes.set_token_rewards(&trajectory_id, rewards)?;
        }
        for trajectory_id in faulted {
            episodes.set_faulted(&trajectory_id);
        }
        Ok(episodes)
    }

    /// Marks a joined trajectory as ended by infrastructure.
    pub fn set_faulted(&mut self, trajectory_id: &str) {
        let i = self.index[trajectory_id];
        self.list[i].faulted = true;
    }

    /// Trajectories ended by infrastructure.
    pub fn faulted(&self) -> usize {
        self.list.iter().filter(|e| e.faulted).count()
    }

    /// Gives a joined trajectory its token rewards: their sum becomes its
    /// score (veRL's GRPO sums token_level_rewards), which must equal the
    /// rewards row's `score` within [`TOKEN_SUM_TOLERANCE`] relative
    /// (absolute below 1); every token reward must be finite.
    pub fn set_token_rewards(&mut self, trajectory_id: &str, rewards: Vec<f32>) -> Result<()> {
        let i = self.index[trajectory_id];
        let episode = &mut self.list[i];
        if let Some(t) = rewards.iter().position(|r| !r.is_finite()) {
            return Err(Error::BadInput(format!(
                "trajectory `{trajectory_id}`: rewards.token_rewards[{t}] is {}, expected a finite number",
                rewards[t]
            )));
        }
        let (sum, agrees) = token_sum(episode.score, &rewards);
        if !agrees {
            let score = f64::from(episode.score);
            return Err(Error::BadInput(format!(
                "trajectory `{trajectory_id}`: rewards.score is {score}, the sum of its token_rewards is {sum}; they must agree within {TOKEN_SUM_TOLERANCE} relative"
            )));
        }
        episode.score = sum as f32;
        episode.token_rewards = Some(rewards);
        Ok(())
    }

    /// Whether any trajectory has token rewards.
    pub fn has_token_rewards(&self) -> bool {
        self.list.iter().any(|e| e.token_rewards.is_some())
    }

    /// Joins trajectories `(trajectory_id, group_id, num_steps)` with rewards
    /// `(trajectory_id, group_id, score)`, checking that every trajectory has
    /// exactly one finite score and the same group on both sides.
    pub fn join(
        trajectories: impl IntoIterator<Item = (String, String, i32)>,
        rewards: impl IntoIterator<Item = (String, String, f32)>,
    ) -> Result<Episodes> {
        let mut episodes = Episodes::default();
        let mut group_index: HashMap<String, u32> = HashMap::new();
        let mut groups_of: Vec<String> = Vec::new();
        for (trajectory_id, group_id, num_steps) in trajectories {
            let next = group_index.len() as u32;
            let group = *group_index.entry(group_id.clone()).or_insert_with(|| {
                episodes.group_ids.push(group_id.clone());
                next
            });
            if episodes
                .index
                .insert(trajectory_id.clone(), episodes.list.len())
                .is_some()
            {
                return Err(Error::BadInput(format!(
                    "trajectory `{trajectory_id}` appears twice in trajectories"
                )));
            }
            groups_of.push(group_id);
            episodes.list.push(Episode {
                trajectory_id,
                group,
                score: f32::NAN,
                num_steps,
                token_rewards: None,
                faulted: false,
            });
        }
        let mut scored = vec![false; episodes.list.len()];
        for (trajectory_id, group_id, score) in rewards {
            let Some(&i) = episodes.index.get(&trajectory_id) else {
                let reason = if group_index.contains_key(&group_id) {
                    "trajectory"
                } else {
                    "trajectory and group"
                };
                return Err(Error::BadInput(format!(
                    "rewards row for trajectory `{trajectory_id}` (group `{group_id}`): unknown {reason}; is it from another rollout set?"
                )));
            };
            if groups_of[i] != group_id {
                return Err(Error::BadInput(format!(
                    "trajectory `{trajectory_id}`: rewards give group `{group_id}`, trajectories give group `{}`",
                    groups_of[i]
                )));
            }
            if scored[i] {
                return Err(Error::BadInput(format!(
                    "trajectory `{trajectory_id}` has two rewards rows"
                )));
            }
            if !score.is_finite() {
                return Err(Error::BadInput(format!(
                    "trajectory `{trajectory_id}`: score is {score}, expected a finite number"
                )));
            }
            scored[i] = true;
            episodes.list[i].score = score;
        }
        if let Some(i) = scored.iter().position(|s| !s) {
            return Err(Error::BadInput(format!(
                "trajectory `{}` has no rewards row ({} of {} trajectories are unscored); run score-rewards on this rollout set",
                episodes.list[i].trajectory_id,
                scored.iter().filter(|s| !**s).count(),
                scored.len()
            )));
        }
        Ok(episodes)
    }

    /// Index of a trajectory.
    pub fn get(&self, trajectory_id: &str) -> Option<usize> {
        self.index.get(trajectory_id).copied()
    }

    /// Index of the trajectory a steps row names; an unknown one is bad input.
    pub fn of_step(&self, trajectory_id: &str) -> Result<usize> {
        self.get(trajectory_id).ok_or_else(|| {
            Error::BadInput(format!(
                "steps row for trajectory `{trajectory_id}`, which is not in trajectories"
            ))
        })
    }

    /// Every episode's score, in episode order.
    pub fn scores(&self) -> Vec<f32> {
        self.list.iter().map(|e| e.score).collect()
    }

    /// Every episode's dense group index, in episode order.
    pub fn groups(&self) -> Vec<u32> {
        self.list.iter().map(|e| e.group).collect()
    }

    /// Per group: whether dynamic sampling keeps it (the scores of the
    /// trajectories that ran not all equal).
    pub fn mixed_groups(&self) -> Vec<bool> {
        let mut scores: Vec<Vec<f32>> = vec![Vec::new(); self.group_ids.len()];
        for e in self.list.iter().filter(|e| !e.faulted) {
            scores[e.group as usize].push(e.score);
        }
        scores.into_iter().map(is_mixed).collect()
    }

    /// Per group: whether faults left it with fewer than 2 trajectories
    /// that ran (a group without faults never is).
    pub fn too_few_valid(&self) -> Vec<bool> {
        let (mut ran, mut faulted) = (
            vec![0usize; self.group_ids.len()],
            vec![false; self.group_ids.len()],
        );
        for e in &self.list {
            if e.faulted {
                faulted[e.group as usize] = true;
            } else {
                ran[e.group as usize] += 1;
            }
        }
        ran.iter().zip(faulted).map(|(&n, f)| f && n < 2).collect()
    }
}

/// Which groups a run computes over and which it writes, by dense group index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Groups {
    /// Kept by dynamic sampling (every group when it is off) and, for a
    /// group-relative estimator, not left with fewer than 2 trajectories
    /// that ran: GAE whitens over these.
    pub kept: Vec<bool>,
    /// Kept and owned by this process's `--shard`: their steps are written.
    pub owned: Vec<bool>,
}

impl Groups {
    /// The groups of `episodes` kept by dynamic sampling (when on) and owned
    /// by `shard`; with `group_relative` (every estimator but GAE, whose
    /// advantages need no siblings), a group that faults left with fewer
    /// than 2 trajectories that ran has no signal and is not kept either.
    pub fn select(
        episodes: &Episodes,
        dynamic_sampling: bool,
        group_relative: bool,
        shard: ShardSpec,
    ) -> Groups {
        let mut kept = if dynamic_sampling {
            episodes.mixed_groups()
        } else {
            vec![true; episodes.group_ids.len()]
        };
        if group_relative {
            for (k, few) in kept.iter_mut().zip(episodes.too_few_valid()) {
                *k &= !few;
            }
        }
        let owned = episodes
            .group_ids
            .iter()
            .zip(&kept)
            .map(|(g, &k)| k && shard.owns(g))
            .collect();
        Groups { kept, owned }
    }

    /// Whether `episode` counts: its group is kept and it ran (no
    /// infrastructure fault ended it).
    pub fn keeps(&self, episode: &Episode) -> bool {
        self.kept[episode.group as usize] && !episode.faulted
    }

    /// Whether `episode`'s steps are written by this process: it counts
    /// ([`Groups::keeps`]) and its group is owned.
    pub fn owns(&self, episode: &Episode) -> bool {
        self.owned[episode.group as usize] && !episode.faulted
    }
}

/// Steps rows seen per episode, for the estimators that stream every steps
/// row once (GRPO and the step path; GAE checks step indices instead).
pub(crate) struct StepCounts<'a> {
    episodes: &'a Episodes,
    counts: Vec<i32>,
    /// Response tokens seen per episode (when counted: [`StepCounts::count_tokens`]).
    tokens: Option<Vec<usize>>,
}

impl<'a> StepCounts<'a> {
    /// No steps seen yet.
    pub(crate) fn new(episodes: &'a Episodes) -> StepCounts<'a> {
        StepCounts {
            episodes,
            counts: vec![0; episodes.list.len()],
            tokens: None,
        }
    }

    /// Adds the response tokens of the steps rows `located` (from
    /// [`StepCounts::locate`] on the same batch), so that
    /// [`StepCounts::check`] also checks every trajectory's token rewards
    /// against its response tokens.
    pub(crate) fn count_tokens(&mut self, located: &[usize], responses: &ListArray) {
        let tokens = self
            .tokens
            .get_or_insert_with(|| vec![0; self.counts.len()]);
        for (i, &e) in located.iter().enumerate() {
            tokens[e] += responses.value_length(i) as usize;
        }
    }

    /// The episode of each steps row, counting them; a row of an unknown
    /// trajectory is bad input.
    pub(crate) fn locate(&mut self, ids: &StringArray) -> Result<Vec<usize>> {
        (0..ids.len())
            .map(|i| {
                let e = self.episodes.of_step(ids.value(i))?;
                self.counts[e] += 1;
                Ok(e)
            })
            .collect()
    }

    /// Checks that every trajectory had exactly `num_steps` steps rows and,
    /// when tokens were counted, that its token rewards (if any) have one
    /// entry per response token.
    pub(crate) fn check(&self) -> Result<()> {
        let list = &self.episodes.list;
        if let Some((e, &count)) = self
            .counts
            .iter()
            .enumerate()
            .find(|&(e, &c)| c != list[e].num_steps)
        {
            return Err(Error::BadInput(format!(
                "trajectory `{}`: steps table has {count} steps, expected {} (num_steps)",
                list[e].trajectory_id, list[e].num_steps
            )));
        }
        for (episode, &n) in list.iter().zip(self.tokens.iter().flatten()) {
            episode.check_token_rewards(n)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(id: &str, group: &str, n: i32) -> (String, String, i32) {
        (id.into(), group.into(), n)
    }

    fn score(id: &str, group: &str, s: f32) -> (String, String, f32) {
        (id.into(), group.into(), s)
    }

    #[test]
    fn join_groups_in_first_appearance_order() {
        let episodes = Episodes::join(
            [pair("a", "g1", 1), pair("b", "g0", 2), pair("c", "g1", 1)],
            [
                score("c", "g1", 0.5),
                score("a", "g1", 1.0),
                score("b", "g0", 0.0),
            ],
        )
        .unwrap();
        assert_eq!(episodes.group_ids, ["g1", "g0"]);
        assert_eq!(episodes.groups(), [0, 1, 0]);
        assert_eq!(episodes.scores(), [1.0, 0.0, 0.5]);
        assert_eq!(episodes.get("b"), Some(1));
        assert_eq!(episodes.list[1].num_steps, 2);
    }

    #[test]
    fn join_names_every_mismatch() {
        let err = |t: Vec<(String, String, i32)>, r: Vec<(String, String, f32)>| {
            Episodes::join(t, r).unwrap_err().to_string()
        };
        let one = || vec![pair("a", "g", 1)];
        assert!(err(one(), vec![]).contains("`a` has no rewards row (1 of 1"));
        assert!(err(one(), vec![score("x", "g", 1.0)]).contains("unknown trajectory;"));
        assert!(err(one(), vec![score("x", "h", 1.0)]).contains("unknown trajectory and group"));
        assert!(err(one(), vec![score("a", "h", 1.0)]).contains("rewards give group `h`"));
        assert!(
            err(one(), vec![score("a", "g", 1.0), score("a", "g", 1.0)])
                .contains("two rewards rows")
        );
        assert!(err(one(), vec![score("a", "g", f32::NAN)]).contains("score is NaN"));
        assert!(err(vec![pair("a", "g", 1), pair("a", "g", 1)], vec![]).contains("twice"));
    }

    #[test]
    fn groups_keep_mixed_scores_and_own_by_shard() {
        let episodes = Episodes::join(
            [
                pair("a", "mixed", 1),
                pair("b", "mixed", 1),
                pair("c", "equal", 1),
                pair("d", "equal", 1),
            ],
            [
                score("a", "mixed", 1.0),
                score("b", "mixed", 0.0),
                score("c", "equal", 1.0),
                score("d", "equal", 1.0),
            ],
        )
        .unwrap();
        let all = Groups::select(&episodes, false, true, ShardSpec::ALL);
        assert_eq!(all.kept, [true, true]);
        assert_eq!(all.owned, [true, true]);
        let mixed = Groups::select(&episodes, true, true, ShardSpec::ALL);
        assert_eq!(mixed.kept, [true, false]);
        assert_eq!(mixed.owned, [true, false]);
        // Two shards own each kept group exactly once.
        let halves: Vec<Groups> = (0..2)
            .map(|index| Groups::select(&episodes, false, true, ShardSpec { index, count: 2 }))
            .collect();
        for g in 0..2 {
            assert_eq!(halves.iter().filter(|h| h.owned[g]).count(), 1);
        }
    }

    #[test]
    fn step_counts_find_unknown_missing_and_extra_steps() {
        let episodes = Episodes::join(
            [pair("a", "g", 2), pair("b", "g", 1)],
            [score("a", "g", 1.0), score("b", "g", 0.0)],
        )
        .unwrap();
        let mut counts = StepCounts::new(&episodes);
        let located = counts.locate(&StringArray::from(vec!["b", "a"])).unwrap();
        assert_eq!(located, [1, 0]);
        let missing = counts.check().unwrap_err().to_string();
        assert!(
            missing.contains("`a`: steps table has 1 steps, expected 2"),
            "{missing}"
        );
        counts.locate(&StringArray::from(vec!["a", "b"])).unwrap();
        let extra = counts.check().unwrap_err().to_string();
        assert!(
            extra.contains("`b`: steps table has 2 steps, expected 1"),
            "{extra}"
        );
        let unknown = counts.locate(&StringArray::from(vec!["z"])).unwrap_err();
        assert!(
            unknown
                .to_string()
                .contains("`z`, which is not in trajectories")
        );
    }
}
