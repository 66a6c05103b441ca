//! Evaluation in a closed-loop world: a policy acting step by
//! step on the tasks of a closed-loop world (the tabletop world, a
//! Gymnasium environment through the bridge: [`embodyflow_worlds`]), as
//! pure functions over any
//! [`ChunkPolicy`] (the stage passes its VLA, tests the scripted expert).
//!
//! Task `t` in run (layout) `r` is [`Layout`]: run 0 is the task of the
//! tasks row itself, run `r > 0` the same objects, goals and words in the
//! layout its world draws for `r` ([`WorldTask::reseed`]; the tabletop
//! world's `embodyflow_tabletop::reseed`). The episodes of a
//! list of layouts are played `batch_rows` at a time, every live episode of
//! a batch stepped in lockstep with one batched policy call per decision
//! ([`run_closed_loop`]); an episode ends at success or at its task's
//! `max_steps` (a failure), so a batch allows `ceil(max_steps / K)`
//! decisions for its longest task. [`evaluate_layouts`] plays one greedy
//! episode per layout and makes its `eval` row (`num_steps` = decisions,
//! `env_steps`, `success`, `ever_grasped`); [`sample_layouts`] plays `n`
//! episodes per layout for pass@k, episode `k` of task `t` in run `r`
//! drawing from `sampling_seed(--seed, "<t>/r<r>/s<k>")`.
//!
//! A thinking policy (LaST-R1's latent chain of thought) leaves
//! its [`Thinking`] in [`Played::thinking`]: how many decisions chose each
//! latent length (latents before the chosen `<latent_end>`), and the value
//! head's estimate at each episode's first decision with the episode's
//! outcome. The summary shows the lengths as whole percentages that sum to
//! 100 (largest remainders, [`percentages`]) and the mean first value of
//! successful and of failed episodes, a quick look at the critic's
//! calibration ([`latent_length_line`], [`first_value_line`]):
//!
//! ```text
//! | latent lengths (greedy decisions) | 2: 41 %, 4: 30 %, 6: 20 %, 8: 9 % (n = 812) |
//! | value at the first decision | successful 0.412 (n = 12), failed 0.103 (n = 40) |
//! ```
//!
//! ```no_run
//! # use embodyflow_evaluate::closed_loop::{Layout, evaluate_layouts};
//! # use embodyflow_tabletop::ExpertPolicy;
//! # use embodyflow_algos::action_tokens::ActionBins;
//! # let (rows, layouts): (Vec<embodyflow_core::schemas::TaskRow>, Vec<Layout<'_>>) = todo!();
//! # let specs: Vec<embodyflow_tabletop::TaskSpec> = todo!();
//! let options = embodyflow_worlds::WorldOptions {
//!     image_size: 32,
//!     bins: ActionBins::openvla(),
//!     workers: Default::default(),
//! };
//! let mut expert =
//!     ExpertPolicy::new(&specs, 1, 32, 8, embodyflow_tabletop::Strategy::Grasp, 0.0).unwrap();
//! let (eval_rows, played) =
//!     evaluate_layouts(&mut expert, &options, &layouts, "expert", 256).unwrap();
//! println!("{:.1} decisions/s", played.totals.decisions as f64 / played.totals.seconds);
//! ```

use std::collections::BTreeMap;
use std::time::Instant;

use embodyflow_core::Error;
use embodyflow_core::schemas::{EvalRow, TaskRow};
use embodyflow_rollout::closed_loop::{
    ChunkPolicy, ClosedLoopConfig, ClosedLoopEpisode, GraspPoint, RunTotals, run_closed_loop,
};
use embodyflow_rollout::sampling_seed;
use embodyflow_worlds::{WorldOptions, WorldTask, Worlds, max_decisions, task_of};

use embodyflow_rollout::PolicyRunError as EvalError;

/// A task in one layout.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout<'a> {
    /// The task's row (id, split, suite, task type).
    pub task: &'a TaskRow,
    /// The run: 0 is the task as stored, `r` its layout `r`.
    pub run: u32,
    /// The task in this run (for the tabletop world, the scene the episode
    /// starts from).
    pub spec: WorldTask,
}

/// The layouts `(run, task row)`, in order: run 0 is the row's own scene
/// spec ([`tabletop::task_from_row`]), run `r` [`tabletop::reseed`] of it. A
/// row the world cannot build is bad input naming it.
pub fn layouts<'a>(owned: &[(u32, &'a TaskRow)]) -> Result<Vec<Layout<'a>>, Error> {
    owned
        .iter()
        .map(|&(run, task)| {
            let spec = task_of(task)?.reseed(run)?;
            Ok(Layout { task, run, spec })
        })
        .collect()
}

/// What one episode did.
#[derive(Clone, Debug, PartialEq)]
pub struct EpisodeOutcome {
    /// Whether the goal was reached.
    pub success: bool,
    /// Decisions taken.
    pub decisions: u32,
    /// Environment steps executed.
    pub env_steps: u32,
    /// Whether it was cut at the decision limit (a failure).
    pub truncated: bool,
    /// Whether an object a goal moves was ever grasped.
    pub ever_grasped: Option<bool>,
    /// Where it was asked to grasp and where the fingers first closed
    /// (`None`: the world does not say).
    pub grasp: Option<GraspPoint>,
    /// Why it ended outside the task (a bridge worker's fault).
    pub failure: Option<String>,
}

/// The episodes played, in order, and what they cost.
#[derive(Clone, Debug, PartialEq)]
pub struct Played {
    /// One outcome per episode.
    pub outcomes: Vec<EpisodeOutcome>,
    /// Decisions, env steps, world / policy / wall seconds.
    pub totals: RunTotals,
    /// What a thinking policy's decisions showed; `None` when no decision
    /// carried a thought (a policy without latents).
    pub thinking: Option<Thinking>,
    /// The gym bridge's worker faults in words; `None` when no bridge task ran.
    pub faults: Option<String>,
}

/// What a thinking policy's (LaST-R1) decisions showed over the episodes
/// played.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Thinking {
    /// Decisions by their chosen latent length (latents before the chosen
    /// `<latent_end>`).
    pub lengths: BTreeMap<u32, u64>,
    /// For each episode whose first decision carried a thought, in order:
    /// whether it succeeded and the value head's estimate at that decision.
    pub first_values: Vec<(bool, f32)>,
}

impl Thinking {
    /// Adds the thoughts of `episodes`' decisions.
    pub fn add(&mut self, episodes: &[ClosedLoopEpisode]) {
        for episode in episodes {
            let thoughts = episode.decisions.iter().filter_map(|d| d.thought.as_ref());
            for thought in thoughts {
                *self.lengths.entry(thought.latent_len).or_default() += 1;
            }
            if let Some(first) = episode.decisions.first().and_then(|d| d.thought.as_ref()) {
                self.first_values.push((episode.success, first.value));
            }
        }
    }

    /// Whether no decision carried a thought.
    pub fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }
}

/// Whole percentages of `counts` that sum to 100 (largest remainders: each
/// gets `floor(100 c / n)`, and the points left go one each to the largest
/// remainders `100 c mod n`, the earlier entry first on a tie); empty or
/// all-zero counts give zeros. E.g. `[1, 2, 4]`: 14.3, 28.6, 57.1 → 14,
/// 29, 57.
pub fn percentages(counts: &[u64]) -> Vec<u64> {
    let n: u64 = counts.iter().sum();
    if n == 0 {
        return vec![0; counts.len()];
    }
    let mut shares: Vec<u64> = counts.iter().map(|&c| 100 * c / n).collect();
    let left = 100 - shares.iter().sum::<u64>();
    let mut by_remainder: Vec<usize> = (0..counts.len()).collect();
    // A stable sort keeps the earlier entry first among equal remainders.
    by_remainder.sort_by_key(|&i| std::cmp::Reverse(100 * counts[i] % n));
    for &i in by_remainder.iter().take(left as usize) {
        shares[i] += 1;
    }
    shares
}

/// `2: 41 %, 4: 30 %, 6: 20 %, 8: 9 % (n = 812)`: the share of decisions
/// per chosen latent length ([`percentages`]) and the number of decisions.
pub fn latent_length_line(lengths: &BTreeMap<u32, u64>) -> String {
    let counts: Vec<u64> = lengths.values().copied().collect();
    let shares: Vec<String> = lengths
        .keys()
        .zip(percentages(&counts))
        .map(|(length, share)| format!("{length}: {share} %"))
        .collect();
    format!("{} (n = {})", shares.join(", "), counts.iter().sum::<u64>())
}

/// `successful 0.412 (n = 12), failed 0.103 (n = 40)`: the mean value
/// estimate at the first decision of successful and of failed episodes
/// (`-` for a group without episodes).
pub fn first_value_line(first_values: &[(bool, f32)]) -> String {
    let mean = |success: bool| {
        let values: Vec<f64> = first_values
            .iter()
            .filter(|&&(s, _)| s == success)
            .map(|&(_, v)| f64::from(v))
            .collect();
        let shown = if values.is_empty() {
            "-".to_string()
        } else {
            format!("{:.3}", values.iter().sum::<f64>() / values.len() as f64)
        };
        format!("{shown} (n = {})", values.len())
    };
    format!("successful {}, failed {}", mean(true), mean(false))
}

/// Plays one episode per `(scene, seed)`, `batch_rows` episodes at a time
/// (see the module doc).
pub fn play<P: ChunkPolicy>(
    policy: &mut P,
    options: &WorldOptions,
    episodes: &[(&WorldTask, u64)],
    batch_rows: usize,
    label: &str,
) -> Result<Played, EvalError> {
    let mut worlds = Worlds::new(options.clone());
    let chunk_len = policy.chunk_len().max(1);
    let mut played = Played {
        outcomes: Vec::with_capacity(episodes.len()),
        totals: RunTotals::default(),
        thinking: None,
        faults: None,
    };
    let mut thinking = Thinking::default();
    for batch in episodes.chunks(batch_rows.max(1)) {
        let started = Instant::now();
        let specs: Vec<WorldTask> = batch.iter().map(|(spec, _)| (*spec).clone()).collect();
        let seeds: Vec<u64> = batch.iter().map(|&(_, seed)| seed).collect();
        let mut world = worlds.episodes(&specs, 1)?;
        let run = run_closed_loop(
            &mut world,
            policy,
            &options.bins,
            &seeds,
            &ClosedLoopConfig {
                max_decisions: max_decisions(&specs, chunk_len),
                label,
            },
        )?;
        worlds.done(world);
        played.totals.add(&run);
        thinking.add(&run.episodes);
        played
            .outcomes
            .extend(run.episodes.iter().map(|e| EpisodeOutcome {
                success: e.success,
                decisions: e.decisions.len() as u32,
                env_steps: e.env_steps,
                truncated: e.truncated,
                ever_grasped: e.target_ever_grasped,
                grasp: e.grasp,
                failure: e.failure.clone(),
            }));
        played.totals.seconds += started.elapsed().as_secs_f64();
    }
    played.thinking = (!thinking.is_empty()).then_some(thinking);
    played.faults = worlds.faults();
    Ok(played)
}

/// One greedy episode per layout under `policy` (which should decide
/// greedily: the VLA at temperature 0) and its `eval` row, in layout order.
pub fn evaluate_layouts<P: ChunkPolicy>(
    policy: &mut P,
    options: &WorldOptions,
    layouts: &[Layout<'_>],
    policy_id: &str,
    batch_rows: usize,
) -> Result<(Vec<EvalRow>, Played), EvalError> {
    let episodes: Vec<(&WorldTask, u64)> = layouts.iter().map(|l| (&l.spec, 0)).collect();
    let played = play(policy, options, &episodes, batch_rows, "evaluating")?;
    let rows = layouts
        .iter()
        .zip(&played.outcomes)
        .map(|(layout, outcome)| EvalRow {
            task_id: layout.task.task_id.clone(),
            run: layout.run as i32,
            split: layout.task.split.clone(),
            task_type: layout.task.task_type.clone(),
            policy: policy_id.to_string(),
            success: outcome.success,
            num_steps: outcome.decisions as i32,
            env_steps: outcome.env_steps as i32,
            ever_grasped: outcome.ever_grasped,
            failure_reason: outcome.failure.clone(),
        })
        .collect();
    Ok((rows, played))
}

/// `n` sampled episodes per layout under `policy` (sampling at the pass@k
/// temperature), layout after layout; returns each layout's successes.
pub fn sample_layouts<P: ChunkPolicy>(
    policy: &mut P,
    options: &WorldOptions,
    layouts: &[Layout<'_>],
    n: usize,
    seed: u64,
    batch_rows: usize,
) -> Result<(Vec<usize>, Played), EvalError> {
    let episodes: Vec<(&WorldTask, u64)> = layouts
        .iter()
        .flat_map(|l| {
            (0..n).map(move |k| {
                let id = format!("{}/r{}/s{k}", l.task.task_id, l.run);
                (&l.spec, sampling_seed(seed, &id))
            })
        })
        .collect();
    let played = play(
        policy,
        options,
        &episodes,
        batch_rows,
        "sampling for pass@k",
    )?;
    let successes = played
        .outcomes
        .chunks(n.max(1))
        .map(|episodes| episodes.iter().filter(|e| e.success).count())
        .collect();
    Ok((successes, played))
}

/// "x of y": successful episodes that never grasped an object a goal
/// moves (SimpleVLA-RL's pushcut), of all successful episodes.
pub fn ungrasped_successes(rows: &[EvalRow]) -> (usize, usize) {
    let successes = rows.iter().filter(|r| r.success).count();
    let ungrasped = rows
        .iter()
        .filter(|r| r.success && r.ever_grasped == Some(false))
        .count();
    (ungrasped, successes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use embodyflow_algos::action_tokens::ActionBins;
    use embodyflow_core::stage::Summary;
    use embodyflow_core::{Classify, ErrorKind};
    use embodyflow_tabletop as tabletop;
    use tabletop::{
        Expert, ExpertConfig, ExpertPolicy, Split, Status, Strategy, Suite, World, generate,
        task_row,
    };

    const SIZE: usize = 32;
    const K: usize = 8;

    /// Tabletop task rows of every suite, in the val and unseen splits.
    fn rows(per_suite: u64) -> Vec<TaskRow> {
        [Split::Val, Split::Unseen]
            .into_iter()
            .flat_map(|split| {
                Suite::ALL.into_iter().flat_map(move |suite| {
                    (0..per_suite).map(move |i| task_row(&generate(suite, split, 4, i)))
                })
            })
            .collect()
    }

    fn all_layouts(rows: &[TaskRow], runs: u32) -> Vec<Layout<'_>> {
        let owned: Vec<(u32, &TaskRow)> = (0..runs)
            .flat_map(|run| rows.iter().map(move |t| (run, t)))
            .collect();
        layouts(&owned).unwrap()
    }

    /// The expert's episode in `spec` played directly, with the bin centres
    /// of its actions (what the world receives through tokens): success,
    /// env steps, grasp fact.
    fn direct(spec: &tabletop::TaskSpec, strategy: Strategy) -> (bool, u32, bool) {
        let bins = ActionBins::openvla();
        let mut world = World::new(spec).unwrap();
        let mut expert = Expert::new(&world, strategy, ExpertConfig::default()).unwrap();
        while world.status() == Status::Running {
            let tokens = bins.encode(&expert.act(&world)).unwrap();
            world.step(&bins.decode(&tokens).unwrap()).unwrap();
        }
        (
            world.status() == Status::Success,
            world.steps(),
            world.target_ever_grasped(),
        )
    }

    /// The tabletop scene of a layout (these tests' tasks are tabletop's).
    fn scene<'a>(layout: &'a Layout<'_>) -> &'a tabletop::TaskSpec {
        match layout.spec.spec::<tabletop::TaskSpec>() {
            Some(spec) => spec,
            None => panic!("a tabletop layout, found {:?}", layout.spec),
        }
    }

    /// The tabletop world at the expert's frame size, OpenVLA's bins.
    fn options() -> WorldOptions {
        WorldOptions {
            image_size: SIZE,
            bins: ActionBins::openvla(),
            workers: Default::default(),
        }
    }

    fn expert_rows(
        layouts: &[Layout<'_>],
        strategy: Strategy,
        batch_rows: usize,
    ) -> (Vec<EvalRow>, Played) {
        let specs: Vec<tabletop::TaskSpec> = layouts.iter().map(|l| scene(l).clone()).collect();
        let mut expert = ExpertPolicy::new(&specs, 1, SIZE, K, strategy, 0.0).unwrap();
        evaluate_layouts(&mut expert, &options(), layouts, "expert", batch_rows).unwrap()
    }

    #[test]
    fn run_zero_is_the_stored_task_and_later_runs_move_its_objects() {
        let rows = rows(1);
        let layouts = all_layouts(&rows, 2);
        assert_eq!(layouts.len(), 2 * rows.len());
        for (i, row) in rows.iter().enumerate() {
            let (first, second) = (&layouts[i], &layouts[rows.len() + i]);
            assert_eq!((first.run, second.run), (0, 1));
            assert_eq!(*scene(&first), tabletop::task_from_row(row).unwrap());
            assert_eq!(scene(&second).task_id(), row.task_id);
            assert_eq!(scene(&second).instruction, row.instruction);
            assert_eq!(scene(&second).goals, scene(&first).goals);
            assert_ne!(
                scene(&second).objects,
                scene(&first).objects,
                "{}",
                row.task_id
            );
        }
        let mut bad = rows[0].clone();
        bad.observation = None;
        let error = layouts_of_one(&bad);
        assert_eq!(error.kind(), ErrorKind::BadInput);
        assert!(error.to_string().contains(&bad.task_id), "{error}");
    }

    fn layouts_of_one(row: &TaskRow) -> Error {
        layouts(&[(1, row)]).unwrap_err()
    }

    #[test]
    fn the_expert_evaluates_at_its_own_success_with_its_grasp_facts() {
        let rows = rows(3);
        let layouts = all_layouts(&rows, 2);
        // The expert holds one world copy per episode of the batch it was
        // built for: all layouts in one batch.
        let (eval, played) = expert_rows(&layouts, Strategy::Grasp, layouts.len());
        assert_eq!(eval.len(), layouts.len());
        assert_eq!(played.outcomes.len(), layouts.len());
        let mut wins = 0;
        for ((row, layout), outcome) in eval.iter().zip(&layouts).zip(&played.outcomes) {
            assert_eq!(row.task_id, layout.task.task_id);
            assert_eq!(row.run, layout.run as i32);
            assert_eq!(row.split, layout.task.split);
            assert_eq!(row.task_type, layout.task.task_type);
            assert_eq!(row.policy, "expert");
            let (success, env_steps, grasped) = direct(scene(layout), Strategy::Grasp);
            assert_eq!(
                (row.success, row.env_steps as u32, row.ever_grasped),
                (success, env_steps, Some(grasped)),
                "{} run {}",
                row.task_id,
                row.run
            );
            assert_eq!(row.num_steps as usize, (env_steps as usize).div_ceil(K));
            assert!(!outcome.truncated, "the world's max_steps ends an episode");
            wins += usize::from(success);
        }
        assert!(
            wins * 10 >= eval.len() * 8,
            "the expert solves {wins} of {}",
            eval.len()
        );
        assert!(
            eval.iter()
                .any(|r| r.success && r.ever_grasped == Some(true))
        );
        assert_eq!(
            played.totals.decisions,
            eval.iter().map(|r| r.num_steps as u64).sum::<u64>()
        );
        assert_eq!(
            played.totals.env_steps,
            eval.iter().map(|r| r.env_steps as u64).sum::<u64>()
        );
        let (ungrasped, successes) = ungrasped_successes(&eval);
        assert_eq!(successes, wins);
        let mut summary = Summary::new("evaluate");
        crate::add_closed_loop_lines(&mut summary, &eval, &played, K as i64, "greedy");
        let text = summary.to_markdown();
        assert!(
            text.contains(&format!("{ungrasped} of {successes}")),
            "{text}"
        );
        assert!(
            text.contains("decisions/s") && text.contains("world "),
            "{text}"
        );
    }

    /// An episode whose decisions thought `(latent_len, value)` (or
    /// nothing: `None`).
    fn thought_episode(success: bool, thoughts: &[Option<(u32, f32)>]) -> ClosedLoopEpisode {
        use embodyflow_rollout::closed_loop::{RecordedDecision, Thought};
        ClosedLoopEpisode {
            failure: None,
            task_id: "t".into(),
            prompt_ids: vec![1],
            decisions: thoughts
                .iter()
                .map(|thought| RecordedDecision {
                    anchor_key: None,
                    prompt_ids: None,
                    observation: Vec::new(),
                    tokens: vec![0],
                    token_logprobs: vec![0.0],
                    thought: thought.map(|(latent_len, value)| Thought {
                        latents: vec![0.0; 8],
                        latent_dim: 2,
                        latent_len,
                        stop_logprob: -0.5,
                        value,
                    }),
                    env_steps: 1,
                    executed_tokens: 1,
                })
                .collect(),
            success,
            env_steps: thoughts.len() as u32,
            truncated: !success,
            target_ever_grasped: None,
            grasp: None,
        }
    }

    #[test]
    fn thinking_counts_every_decisions_length_and_each_first_value() {
        let mut thinking = Thinking::default();
        thinking.add(&[
            thought_episode(true, &[Some((2, 0.5)), Some((4, 0.9))]),
            thought_episode(false, &[Some((2, 0.25)), Some((2, 0.0)), Some((4, 0.0))]),
        ]);
        thinking.add(&[thought_episode(false, &[Some((4, -0.5))])]);
        assert_eq!(thinking.lengths, BTreeMap::from([(2, 3), (4, 3)]));
        assert_eq!(
            thinking.first_values,
            [(true, 0.5), (false, 0.25), (false, -0.5)]
        );
        assert_eq!(
            latent_length_line(&thinking.lengths),
            "2: 50 %, 4: 50 % (n = 6)"
        );
        // failed: (0.25 - 0.5) / 2.
        assert_eq!(
            first_value_line(&thinking.first_values),
            "successful 0.500 (n = 1), failed -0.125 (n = 2)"
        );
        assert_eq!(
            first_value_line(&thinking.first_values[1..]),
            "successful - (n = 0), failed -0.125 (n = 2)"
        );
        let mut none = Thinking::default();
        none.add(&[thought_episode(true, &[None, None])]);
        assert!(none.is_empty() && none.first_values.is_empty());
    }

    #[test]
    fn latent_length_shares_are_whole_percents_summing_to_100() {
        assert_eq!(percentages(&[41, 30, 20, 9]), [41, 30, 20, 9]);
        // 14.29, 28.57, 57.14: the remainders 2, 4, 1 (of 7) give 28.57
        // the point left.
        assert_eq!(percentages(&[1, 2, 4]), [14, 29, 57]);
        // Equal remainders: the earlier lengths first.
        assert_eq!(percentages(&[1, 1, 1]), [34, 33, 33]);
        assert_eq!(percentages(&[1, 0, 999]), [0, 0, 100]);
        assert_eq!(percentages(&[0, 0]), [0, 0]);
        let lengths = BTreeMap::from([(8, 73), (2, 333), (4, 244), (6, 162)]);
        assert_eq!(
            latent_length_line(&lengths),
            "2: 41 %, 4: 30 %, 6: 20 %, 8: 9 % (n = 812)"
        );
    }

    #[test]
    fn a_policy_without_latents_leaves_no_thinking_and_no_lines() {
        let rows = rows(1);
        let layouts = all_layouts(&rows, 1);
        let (eval, played) = expert_rows(&layouts, Strategy::Grasp, layouts.len());
        assert_eq!(played.thinking, None);
        let mut summary = Summary::new("evaluate");
        crate::add_closed_loop_lines(&mut summary, &eval, &played, K as i64, "greedy");
        let text = summary.to_markdown();
        assert!(
            !text.contains("latent") && !text.contains("value at"),
            "{text}"
        );
    }

    #[test]
    fn successes_of_the_push_expert_never_grasp() {
        let rows = rows(3);
        let pushable: Vec<Layout<'_>> = all_layouts(&rows, 1)
            .into_iter()
            .filter(|l| {
                let world = World::new(scene(l)).unwrap();
                Expert::new(&world, Strategy::Push, ExpertConfig::default()).is_ok()
            })
            .collect();
        assert!(!pushable.is_empty());
        let (eval, _) = expert_rows(&pushable, Strategy::Push, pushable.len());
        let (ungrasped, successes) = ungrasped_successes(&eval);
        assert!(successes > 0, "pushing solves some tasks");
        assert_eq!(ungrasped, successes, "{eval:?}");
        for (row, layout) in eval.iter().zip(&pushable) {
            let (success, _, grasped) = direct(scene(layout), Strategy::Push);
            assert_eq!((row.success, row.ever_grasped), (success, Some(grasped)));
        }
    }

    #[test]
    fn pass_at_k_plays_n_episodes_per_layout() {
        let rows = rows(1);
        let layouts = all_layouts(&rows, 1);
        let n = 3;
        let specs: Vec<tabletop::TaskSpec> = layouts.iter().map(|l| scene(l).clone()).collect();
        // Noisy expert copies: copy k of a layout is its sample k.
        let mut expert = ExpertPolicy::new(&specs, n, SIZE, K, Strategy::Grasp, 0.2).unwrap();
        let (successes, played) =
            sample_layouts(&mut expert, &options(), &layouts, n, 9, layouts.len() * n).unwrap();
        assert_eq!(successes.len(), layouts.len());
        assert_eq!(played.outcomes.len(), layouts.len() * n);
        for (layout, chunk) in successes.iter().zip(played.outcomes.chunks(n)) {
            assert_eq!(*layout, chunk.iter().filter(|o| o.success).count());
        }
        assert!(successes.iter().sum::<usize>() > 0);
    }

    /// Closes the fingers at the start position on the first step, whatever
    /// it sees: a policy that replays one trajectory.
    struct Blind;

    impl ChunkPolicy for Blind {
        type Error = Error;
        fn chunk_len(&self) -> usize {
            K
        }
        fn action_dim(&self) -> usize {
            tabletop::ACTION_DIM
        }
        fn observation_shape(&self) -> embodyflow_core::observation::ObservationShape {
            tabletop::observation_shape(SIZE)
        }
        fn instruction_ids(&self, _: &str) -> Result<Vec<i32>, Error> {
            Ok(vec![1])
        }
        fn decide(
            &mut self,
            batch: &embodyflow_rollout::closed_loop::DecisionBatch<'_>,
        ) -> Result<Vec<embodyflow_rollout::closed_loop::ChunkDecision>, Error> {
            // Still in x and y, down, fingers closed.
            let action = ActionBins::openvla()
                .encode(&[0.0, 0.0, -1.0, 1.0])
                .unwrap();
            Ok((0..batch.len())
                .map(|_| embodyflow_rollout::closed_loop::ChunkDecision {
                    tokens: action.iter().copied().cycle().take(K * 4).collect(),
                    token_logprobs: vec![0.0; K * 4],
                    thought: None,
                })
                .collect())
        }
    }

    #[test]
    fn the_expert_grasps_where_the_object_is_and_a_blind_policy_does_not() {
        let rows: Vec<TaskRow> = (0..7)
            .flat_map(|task| {
                (0..6).map(move |state| {
                    task_row(
                        &tabletop::initial_state(Suite::Goal, 1, task, Split::Test, state).unwrap(),
                    )
                })
            })
            .collect();
        let layouts = all_layouts(&rows, 1);
        let (eval, played) = expert_rows(&layouts, Strategy::Grasp, layouts.len());
        assert!(played.outcomes.iter().all(|o| o.grasp.is_some()));
        let mut summary = Summary::new("evaluate");
        let slope = crate::add_closed_loop_lines(&mut summary, &eval, &played, K as i64, "greedy")
            .expect("the expert closes its fingers in every episode");
        assert!((0.9..=1.1).contains(&slope.slope), "{slope:?}");
        assert_eq!(slope.closed, layouts.len());
        assert!(
            summary.to_markdown().contains("| grasp slope"),
            "{}",
            summary.to_markdown()
        );

        let (eval, played) =
            evaluate_layouts(&mut Blind, &options(), &layouts, "blind", 64).unwrap();
        let slope = crate::add_closed_loop_lines(
            &mut Summary::new("e"),
            &eval,
            &played,
            K as i64,
            "greedy",
        )
        .unwrap();
        assert_eq!((slope.slope, slope.closed), (0.0, layouts.len()));
    }
}
