use super::*;
use crate::train::tests::{assert_bf16_tracks_fp32, in_bf16};
use crate::{OptimConfig, SftConfig, Training, ppo_examples, redraw_warmup_lengths, train};
use embodyflow_core::schemas::{AdvantageRow, StepRow, TaskRow, TrajectoryRow};
use embodyflow_models::net::ClosedLoop;
use embodyflow_models::optimizer::OptimizerState;
use embodyflow_models::testing::{tiny_thinking_vla, tiny_vla};
use embodyflow_rollout::closed_loop::vla::VlaPolicy;
use embodyflow_rollout::closed_loop::{ClosedLoopConfig, run_closed_loop};
use embodyflow_tabletop::{Split, Suite, TabletopEpisodes, generate, task_row};

const K: i64 = 4;

fn frames(n: usize) -> Vec<Vec<u8>> {
    (0..n).map(|i| vec![i as u8; 3]).collect()
}

#[test]
fn future_frames_are_the_frames_after_the_chunks_actions() {
    let steps = frames(20);
    let ids = |f: Vec<Vec<u8>>| f.iter().map(|x| x[0]).collect::<Vec<u8>>();
    // K = L = 8: one frame per action, after it.
    assert_eq!(
        ids(future_frames(&steps, 1, 8, 8)),
        vec![9, 10, 11, 12, 13, 14, 15, 16]
    );
    // K = 4, L = 8: ceil((l + 1) 4 / 8) = 1, 1, 2, 2, 3, 3, 4, 4.
    assert_eq!(
        ids(future_frames(&steps, 0, 4, 8)),
        vec![1, 1, 2, 2, 3, 3, 4, 4]
    );
    // K = 8, L = 4: every second action.
    assert_eq!(ids(future_frames(&steps, 0, 8, 4)), vec![2, 4, 6, 8]);
    // Past the episode's last frame: clipped.
    assert_eq!(ids(future_frames(&steps, 2, 8, 4)), vec![18, 19, 19, 19]);
}

fn tasks() -> Vec<TaskRow> {
    [
        generate(Suite::Goal, Split::Train, 3, 0),
        generate(Suite::Spatial, Split::Train, 3, 1),
    ]
    .iter()
    .map(task_row)
    .collect()
}

fn config(objective: Objective, epochs: usize, lr: f64) -> Config {
    Config {
        objective,
        epochs,
        mini_batch: 8,
        micro_batch: 4,
        optim: OptimConfig {
            lr,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The warm-up's examples carry `L × n_embd` targets and a candidate
/// length; training lowers the latent and action terms (the stop's targets
/// are uniform draws), and the metrics hold the latent and stop terms (no
/// value).
#[test]
fn the_warm_up_gives_targets_and_learns_them() {
    let mut policy = tiny_thinking_vla(K);
    let set = ClosedLoop::sft_examples(&policy, &tasks(), &SftConfig::default(), 3).unwrap();
    assert!(set.examples.len() > 10);
    let mut lengths = std::collections::BTreeSet::new();
    for example in &set.examples {
        let thought = example.thought.as_ref().unwrap();
        assert_eq!(thought.latents.len(), 4 * 32);
        assert!(thought.latents.iter().all(|v| v.is_finite()));
        lengths.insert(thought.latent_len);
    }
    assert_eq!(lengths, [2, 4].into_iter().collect());
    let note = &set.notes.last().unwrap().1;
    assert!(
        note.contains("PCA") && note.contains("32 components"),
        "{note}"
    );
    ClosedLoop::check_examples(&policy, &set.examples).unwrap();
    let report = train(
        &mut policy,
        None,
        &set.examples,
        &config(Objective::Sft, 6, 3e-3),
        0,
        OptimizerState::fresh("sft"),
    )
    .unwrap();
    let (first, last) = (&report.metrics[0], report.metrics.last().unwrap());
    assert!(first.value_loss.is_none() && first.clipfrac.is_none());
    let latent = |m: &embodyflow_core::schemas::MetricRow| m.latent_loss.unwrap();
    let end = |m: &embodyflow_core::schemas::MetricRow| m.end_loss.unwrap();
    assert!(latent(last) < latent(first), "{first:?} -> {last:?}");
    // The stop targets are drawn uniformly: the best is ln 2 for two candidates.
    assert!((end(last) - 2f32.ln()).abs() < 0.15, "{last:?}");
    assert!(last.pg_loss < first.pg_loss, "{first:?} -> {last:?}");
    // The step's terms add up: loss = latent + 0.1 end + action.
    let sum = latent(first) + 0.1 * end(first) + first.pg_loss;
    assert!((first.loss - sum).abs() < 1e-4, "{first:?}");
}

/// Each warm-up epoch draws every example's chain length anew (LaST-R1
/// draws a length per sample each time it is used): epoch 0's draws are
/// the ones attached with the examples, later epochs give most examples
/// other lengths, always candidates; rollout examples (LAPO: the rollout
/// chose its stop) are left as they are.
#[test]
fn warm_up_lengths_are_drawn_anew_every_epoch() {
    let policy = tiny_thinking_vla(K);
    let seed = 3;
    let set = ClosedLoop::sft_examples(&policy, &tasks(), &SftConfig::default(), seed).unwrap();
    let lengths = |examples: &[Example]| -> Vec<usize> {
        examples
            .iter()
            .map(|e| e.thought.as_ref().unwrap().latent_len)
            .collect()
    };
    let attached = lengths(&set.examples);
    let epoch_seed = |epoch: u64| seed ^ epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let epochs: Vec<Vec<usize>> = (0..4)
        .map(|epoch| lengths(&redraw_warmup_lengths(&set.examples, epoch_seed(epoch)).unwrap()))
        .collect();
    assert_eq!(
        epochs[0], attached,
        "epoch 0 draws as the examples were attached"
    );
    let changed = (0..attached.len())
        .filter(|&i| epochs.iter().any(|e| e[i] != attached[i]))
        .count();
    // Two candidates, three more draws each: all three equal with p = 1/8.
    assert!(
        changed * 2 > attached.len(),
        "{changed} of {}",
        attached.len()
    );
    assert!(epochs.iter().flatten().all(|l| [2, 4].contains(l)));
    let (trajectories, steps, advantages) = lapo_inputs(&policy, 1.0);
    let rollouts = ppo_examples(&trajectories, steps, advantages, true).unwrap();
    assert!(redraw_warmup_lengths(&rollouts, epoch_seed(1)).is_none());
}

/// LAPO's value head steps at `lapo.value_lr_scale` times the policy's
/// rate with `critic_optim = own` (LaST-R1's second optimiser) and at the
/// policy's rate with `shared`: Adam's first step moves every parameter by
/// about its rate (`m / sqrt(v) = g / |g|`).
#[test]
fn lapo_steps_the_value_head_at_its_own_rate() {
    let lr = 1e-4;
    let moved = |critic_optim: crate::lapo::CriticOptim| -> (f64, f64) {
        let mut policy = tiny_thinking_vla(K);
        let (trajectories, steps, advantages) = lapo_inputs(&policy, 1.0);
        let examples = ppo_examples(&trajectories, steps, advantages, true).unwrap();
        let before: Vec<(String, Tensor)> = policy
            .vars
            .variables()
            .into_iter()
            .map(|(name, t)| (name, t.copy()))
            .collect();
        let mut config = config(Objective::Lapo, 1, lr);
        config.lapo.critic_optim = critic_optim;
        let report = train(
            &mut policy,
            None,
            &examples,
            &config,
            0,
            OptimizerState::fresh("lapo"),
        )
        .unwrap();
        assert_eq!(report.metrics.len(), 1, "one optimizer step");
        let after = policy.vars.variables();
        let largest = |head: bool| {
            before
                .iter()
                .filter(|(name, _)| name.starts_with("value_head.") == head)
                .map(|(name, t)| (&after[name] - t).abs().max().double_value(&[]))
                .fold(0.0, f64::max)
        };
        (largest(true), largest(false))
    };
    let (own_head, own_trunk) = moved(crate::lapo::CriticOptim::Own);
    let (shared_head, shared_trunk) = moved(crate::lapo::CriticOptim::Shared);
    assert!(
        (own_head - 10.0 * lr).abs() < 1e-6,
        "own: head moved {own_head}"
    );
    assert!(
        (shared_head - lr).abs() < 1e-6,
        "shared: head moved {shared_head}"
    );
    assert!((own_trunk - lr).abs() < 1e-6 && (shared_trunk - lr).abs() < 1e-6);
}

/// Rollouts of a thinking VLA in closed loop, as steps, advantages
/// (`advantage` on every decision, returns 1) and trajectories rows.
fn lapo_inputs(
    policy: &Checkpoint<Vla>,
    advantage: f32,
) -> (Vec<TrajectoryRow>, Vec<StepRow>, Vec<AdvantageRow>) {
    let tasks = [generate(Suite::Goal, Split::Train, 3, 0)];
    let mut world = TabletopEpisodes::new(&tasks, 4, 32).unwrap();
    let mut sampler = VlaPolicy::new(policy, 1.0).unwrap().with_latent_noise(0.05);
    let bins = sampler.bins();
    let run_config = ClosedLoopConfig {
        max_decisions: 2,
        label: "test",
    };
    let run = run_closed_loop(&mut world, &mut sampler, &bins, &[1, 2, 3, 4], &run_config).unwrap();
    let mut trajectories = Vec::new();
    let mut steps = Vec::new();
    let mut advantages = Vec::new();
    for (i, episode) in run.episodes.iter().enumerate() {
        let id = format!("t{i}");
        trajectories.push(TrajectoryRow {
            source_row: None,
            infra_fault: None,
            failure_reason: None,
            trajectory_id: id.clone(),
            group_id: "g0".into(),
            task_id: episode.task_id.clone(),
            sample_index: i as i32,
            iteration: 0,
            policy: "test".into(),
            temperature: 1.0,
            num_steps: episode.decisions.len() as i32,
            env_steps: episode.env_steps as i32,
            complete: episode.success,
            response_text: None,
            seed: i as i64,
            ever_grasped: None,
        });
        for row in episode.step_rows(&id) {
            advantages.push(AdvantageRow {
                trajectory_id: id.clone(),
                step_index: row.step_index,
                advantages: vec![advantage; row.response_ids.len()],
                returns: Some(vec![1.0; row.response_ids.len()]),
                episode_adv: advantage,
                step_adv: None,
                estimator: "gae".into(),
            });
            steps.push(row);
        }
    }
    (trajectories, steps, advantages)
}

/// The steps of a trajectory ended by infrastructure are not trained on,
/// even when an advantages row names them.
#[test]
fn steps_of_a_trajectory_ended_by_a_fault_are_skipped() {
    let policy = tiny_thinking_vla(K);
    let (mut trajectories, steps, advantages) = lapo_inputs(&policy, 1.0);
    let all = ppo_examples(&trajectories, steps.clone(), advantages.clone(), true).unwrap();
    trajectories[1].infra_fault = Some(true);
    let trained = ppo_examples(&trajectories, steps, advantages, true).unwrap();
    let of_t1 = |e: &&Example| e.source.starts_with("trajectory `t1`");
    let faulted = all.iter().filter(of_t1).count();
    assert!(faulted > 0);
    assert_eq!(trained.iter().filter(of_t1).count(), 0);
    assert_eq!(trained.len(), all.len() - faulted);
}

/// LAPO starts at ratio 1 (the stored latents, stop and log-probs are the
/// policy's), fills every metric, pulls the value toward the returns, and
/// moves the chosen stop's log-prob with the advantage's sign.
#[test]
fn lapo_starts_at_ratio_one_and_follows_the_advantage() {
    for sign in [1.0f32, -1.0] {
        let mut policy = tiny_thinking_vla(K);
        let (trajectories, steps, advantages) = lapo_inputs(&policy, sign);
        let examples = ppo_examples(&trajectories, steps, advantages, true).unwrap();
        assert_eq!(examples.len(), 8);
        ClosedLoop::check_examples(&policy, &examples).unwrap();
        let before = stored_logprobs(&policy, &examples).stop;
        let report = train(
            &mut policy,
            None,
            &examples,
            &config(Objective::Lapo, 4, 1e-3),
            0,
            OptimizerState::fresh("lapo"),
        )
        .unwrap();
        let first = &report.metrics[0];
        assert!(first.approx_kl.unwrap().abs() < 1e-5, "{first:?}");
        assert_eq!(first.clipfrac, Some(0.0), "{first:?}");
        for m in &report.metrics {
            for v in [
                m.loss,
                m.pg_loss,
                m.entropy,
                m.latent_loss.unwrap(),
                m.end_loss.unwrap(),
                m.value_loss.unwrap(),
            ] {
                assert!(v.is_finite(), "{m:?}");
            }
        }
        let value = |m: &embodyflow_core::schemas::MetricRow| m.value_loss.unwrap();
        assert!(
            value(report.metrics.last().unwrap()) < value(first),
            "{:?}",
            report.metrics
        );
        let after = stored_logprobs(&policy, &examples).stop;
        assert!(
            (after - before) * f64::from(sign) > 0.0,
            "advantage {sign}: {before} -> {after}"
        );
    }
}

/// The summed log-probs of the examples' stored stops and action tokens,
/// behind their stored latents, at T = 1.
struct StoredLogprobs {
    stop: f64,
    actions: f64,
}

fn stored_logprobs(policy: &Checkpoint<Vla>, examples: &[Example]) -> StoredLogprobs {
    tch::no_grad(|| {
        let scores = stored_scores(policy, examples);
        let sum = |t: &Tensor| t.sum(Kind::Double).double_value(&[]);
        StoredLogprobs {
            stop: sum(&scores.stop_logprobs),
            actions: sum(&scores.token_logprobs),
        }
    })
}

/// The policy's scores of the examples' stored decisions behind their
/// stored latents, at T = 1.
fn stored_scores(policy: &Checkpoint<Vla>, examples: &[Example]) -> LatentScores {
    let refs: Vec<&Example> = examples.iter().collect();
    let shape = observation_shape(policy.model.config());
    let (pixels, proprio) = decode_observations(&refs, &shape).unwrap();
    let rows = observation_rows(&refs, &pixels, &proprio, &shape);
    let latents: Vec<&[f32]> = refs
        .iter()
        .map(|e| e.thought.as_ref().unwrap().latents.as_slice())
        .collect();
    let stops: Vec<usize> = refs
        .iter()
        .map(|e| e.thought.as_ref().unwrap().latent_len / 2 - 1)
        .collect();
    let tokens: Vec<Vec<u32>> = refs
        .iter()
        .map(|e| e.response.iter().map(|&t| t as u32).collect())
        .collect();
    let tokens: Vec<&[u32]> = tokens.iter().map(Vec::as_slice).collect();
    policy
        .model
        .latent_scores(&rows, &latents, &stops, &tokens, 1.0, Entropy::Skip)
        .unwrap()
}

/// The rollout examples' action and stop log-probs rewritten as a bf16
/// copy of `make()`'s network scores them behind the stored latents
/// ([`in_bf16`]), one example at a time.
fn thoughts_recorded_in_bf16(make: impl Fn() -> Checkpoint<Vla>, examples: &mut [Example]) {
    let recorded: Vec<(Vec<f32>, f32)> = in_bf16(make, |policy| {
        examples
            .iter()
            .map(|e| {
                let scores = stored_scores(policy, std::slice::from_ref(e));
                let actions = Vec::<f32>::try_from(scores.token_logprobs.view([-1])).unwrap();
                (actions, scores.stop_logprobs.double_value(&[0]) as f32)
            })
            .collect()
    });
    for (example, (actions, stop)) in examples.iter_mut().zip(recorded) {
        example.old_logprobs = actions;
        example.thought.as_mut().unwrap().old_stop_logprob = stop;
    }
}

/// `train.precision = "bf16"` on `make()`'s thinking VLA at rate 1e-4 (a
/// decision's ratio multiplies its tokens': at 1e-3 three steps move it
/// far past the clip range) tracks the fp32 run ([`assert_bf16_tracks_fp32`]: the first bf16 step
/// at ratio 1 on the log-probs a bf16 copy recorded, the fp32 run on the
/// rollouts' own; losses and weights within 2e-2, the weights saved as
/// F32) under LAPO, whose value
/// loss is finite and within 2e-2 of fp32's, under GRPO on the sampled
/// tokens and stops, and in the warm-up; the stored latents enter cast to
/// bf16, the value and stop logits and predicted latents come out in f32.
fn bf16_thinks_like_fp32(make: impl Fn() -> Checkpoint<Vla>, updates: usize) {
    // One decision per micro-batch, as they were recorded.
    let config = |objective, epochs| Config {
        micro_batch: 1,
        ..config(objective, epochs, 1e-4)
    };
    let (trajectories, steps, advantages) = lapo_inputs(&make(), 1.0);
    let lapo = ppo_examples(&trajectories, steps.clone(), advantages.clone(), true).unwrap();
    let mut recorded = lapo.clone();
    thoughts_recorded_in_bf16(&make, &mut recorded);
    let lapo_config = config(Objective::Lapo, updates);
    let (bf16, fp32) = assert_bf16_tracks_fp32(&make, None, &recorded, &lapo, &lapo_config);
    for (a, b) in bf16.metrics.iter().zip(&fp32.metrics) {
        let (a, b) = (a.value_loss.unwrap(), b.value_loss.unwrap());
        assert!(
            a.is_finite() && (a - b).abs() < 2e-2,
            "value loss {a} vs {b}"
        );
    }
    let grpo_advantages: Vec<AdvantageRow> = advantages
        .into_iter()
        .map(|row| AdvantageRow {
            returns: None,
            estimator: "grpo".into(),
            ..row
        })
        .collect();
    let grpo = ppo_examples(&trajectories, steps, grpo_advantages, false).unwrap();
    let mut recorded = grpo.clone();
    thoughts_recorded_in_bf16(&make, &mut recorded);
    assert_bf16_tracks_fp32(
        &make,
        None,
        &recorded,
        &grpo,
        &config(Objective::Ppo, updates),
    );
    let warmup = ClosedLoop::sft_examples(&make(), &tasks(), &SftConfig::default(), 3)
        .unwrap()
        .examples;
    assert_bf16_tracks_fp32(&make, None, &warmup, &warmup, &config(Objective::Sft, 2));
}

/// bf16 trains a thinking VLA of the small trunk as fp32 does.
#[test]
fn bf16_trains_a_thinking_vla_as_fp32_does() {
    bf16_thinks_like_fp32(|| tiny_thinking_vla(K), 3);
}

/// bf16 trains a thinking VLA on a vision-language trunk as fp32 does, over
/// two LAPO and GRPO steps: by a third, each run having started from its
/// own recorded log-probs, their clipped fractions part (0.875 against 1.0)
/// and their losses differ by more than 2e-2.
#[test]
fn bf16_trains_a_thinking_vla_on_a_vision_language_trunk_as_fp32_does() {
    let latent = LatentConfig {
        length: 4,
        group: 2,
    };
    bf16_thinks_like_fp32(|| crate::vla::tests::qwen_vla(Some(latent.clone())), 2);
}

/// GRPO on a thinking VLA (`objective = ppo` on advantages without returns):
/// the examples carry the rollout's latents and stop, the surrogate starts
/// at ratio 1 over the action tokens and the stop, moves both stored
/// log-probs with the advantage's sign, and leaves the value head alone (no
/// critic); a KL penalty or entropy bonus is refused.
#[test]
fn ppo_on_a_thinking_vla_trains_its_sampled_tokens_behind_the_stored_latents() {
    for sign in [1.0f32, -1.0] {
        let mut policy = tiny_thinking_vla(K);
        let (trajectories, steps, mut advantages) = lapo_inputs(&policy, sign);
        for row in &mut advantages {
            row.returns = None;
            row.estimator = "grpo".into();
        }
        let examples = ppo_examples(&trajectories, steps, advantages, false).unwrap();
        assert_eq!(examples.len(), 8);
        assert!(examples.iter().all(|e| e.thought.is_some()));
        ClosedLoop::check_examples(&policy, &examples).unwrap();
        let head_before: Vec<(String, Tensor)> = policy
            .vars
            .variables()
            .into_iter()
            .filter(|(name, _)| name.starts_with("value_head."))
            .map(|(name, t)| (name, t.copy()))
            .collect();
        assert!(!head_before.is_empty());
        let before = stored_logprobs(&policy, &examples);
        let report = train(
            &mut policy,
            None,
            &examples,
            &config(Objective::Ppo, 4, 1e-3),
            0,
            OptimizerState::fresh("ppo"),
        )
        .unwrap();
        let first = &report.metrics[0];
        assert!(first.approx_kl.unwrap().abs() < 1e-5, "{first:?}");
        assert_eq!(first.clipfrac, Some(0.0), "{first:?}");
        for m in &report.metrics {
            assert!(m.loss.is_finite() && m.pg_loss.is_finite(), "{m:?}");
            assert_eq!(m.value_loss, None, "{m:?}");
        }
        let after = stored_logprobs(&policy, &examples);
        for (what, b, a) in [
            ("stop", before.stop, after.stop),
            ("actions", before.actions, after.actions),
        ] {
            assert!(
                (a - b) * f64::from(sign) > 0.0,
                "advantage {sign}, {what}: {b} -> {a}"
            );
        }
        let after_vars = policy.vars.variables();
        for (name, t) in &head_before {
            assert!(after_vars[name].equal(t), "{name} moved");
        }
    }
    let policy = tiny_thinking_vla(K);
    let (trajectories, steps, advantages) = lapo_inputs(&policy, 1.0);
    let examples = ppo_examples(&trajectories, steps, advantages, false).unwrap();
    let mut config = config(Objective::Ppo, 1, 1e-3);
    config.ppo.entropy_coef = 0.01;
    let mut policy = policy;
    let e = train(
        &mut policy,
        None,
        &examples,
        &config,
        0,
        OptimizerState::fresh("ppo"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("ppo.entropy_coef = 0"), "{e}");
}

/// Bad LAPO input is named by table and field: a null column, a latent of
/// the wrong width, a stop beyond the candidates; a plain VLA refuses
/// latents and a thinking one refuses to train without them.
#[test]
fn bad_lapo_input_names_the_table_and_field() {
    let policy = tiny_thinking_vla(K);
    let (trajectories, steps, advantages) = lapo_inputs(&policy, 1.0);
    let fails = |steps: Vec<StepRow>, advantages: Vec<AdvantageRow>| {
        ppo_examples(&trajectories, steps, advantages, true)
            .unwrap_err()
            .to_string()
    };
    let mut no_value = steps.clone();
    no_value[1].old_value = None;
    let e = fails(no_value, advantages.clone());
    assert!(
        e.contains("table `steps` field `old_value` is null at trajectory `t0` step 1"),
        "{e}"
    );
    let mut no_latents = steps.clone();
    no_latents[0].latents = None;
    let e = fails(no_latents, advantages.clone());
    assert!(e.contains("table `steps` field `latents` is null"), "{e}");
    let mut no_returns = advantages.clone();
    no_returns[0].returns = None;
    let e = fails(steps.clone(), no_returns);
    assert!(
        e.contains("table `advantages` field `returns` is null") && e.contains("estimator=gae"),
        "{e}"
    );
    let checked = |steps: Vec<StepRow>| {
        let examples = ppo_examples(&trajectories, steps, advantages.clone(), true).unwrap();
        ClosedLoop::check_examples(&policy, &examples)
            .err()
            .map(|e| e.to_string())
    };
    assert_eq!(checked(steps.clone()), None);
    let mut narrow = steps.clone();
    narrow[2].latent_dim = Some(16);
    narrow[2].latents = Some(vec![0.0; 8 * 16]);
    let e = checked(narrow).unwrap();
    assert!(
        e.contains("table `steps` field `latent_dim`") && e.contains("n_embd = 32"),
        "{e}"
    );
    let mut short = steps.clone();
    short[2].latents = Some(vec![0.0; 3 * 32]);
    let e = checked(short).unwrap();
    assert!(
        e.contains("table `steps` field `latents`") && e.contains("96 values") && e.contains("128"),
        "{e}"
    );
    let mut beyond = steps.clone();
    beyond[3].chosen_latent_len = Some(6);
    let e = checked(beyond).unwrap();
    assert!(
        e.contains("table `steps` field `chosen_latent_len`")
            && e.contains("6 is not one of")
            && e.contains("[2, 4]"),
        "{e}"
    );
    let examples = ppo_examples(&trajectories, steps.clone(), advantages.clone(), true).unwrap();
    let plain = tiny_vla(K);
    let e = ClosedLoop::check_examples(&plain, &examples)
        .unwrap_err()
        .to_string();
    assert!(e.contains("the checkpoint has none"), "{e}");
    let mut no_chains = steps;
    for step in &mut no_chains {
        step.latents = None;
    }
    let without = ppo_examples(&trajectories, no_chains, advantages, false).unwrap();
    let e = ClosedLoop::check_examples(&policy, &without)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("objective = sft") && e.contains("lapo or ppo"),
        "{e}"
    );
}

/// The first warm-up fits the frame encoder and the checkpoint keeps it;
/// a later warm-up from that checkpoint uses it (the same targets for the
/// same frames) instead of fitting another.
#[test]
fn the_frame_encoder_is_fitted_once_and_carried_by_the_checkpoint() {
    let mut policy = tiny_thinking_vla(K);
    let first = ClosedLoop::sft_examples(&policy, &tasks(), &SftConfig::default(), 3).unwrap();
    let encoder = first
        .frame_encoder
        .clone()
        .expect("fitted by the first warm-up");
    policy.frame_encoder = Some(encoder);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy");
    policy.save(&path, "test", false).unwrap();
    assert!(path.join("frame_encoder.safetensors").is_file());
    let loaded = Checkpoint::<Vla>::load_kind(&path, tch::Device::Cpu).unwrap();
    // Another task set: its own frames would give another PCA.
    let other: Vec<TaskRow> = [generate(Suite::Object, Split::Train, 5, 0)]
        .iter()
        .map(task_row)
        .collect();
    let again = ClosedLoop::sft_examples(&loaded, &other, &SftConfig::default(), 3).unwrap();
    assert!(again.frame_encoder.is_none());
    let note = &again.notes.last().unwrap().1;
    assert!(note.starts_with("the checkpoint's PCA"), "{note}");
    let refit =
        ClosedLoop::sft_examples(&tiny_thinking_vla(K), &other, &SftConfig::default(), 3).unwrap();
    assert_ne!(
        again.examples[0].thought, refit.examples[0].thought,
        "the carried encoder, not a new fit"
    );
    let same = ClosedLoop::sft_examples(&loaded, &tasks(), &SftConfig::default(), 3).unwrap();
    assert_eq!(
        same.examples, first.examples,
        "the same frames, the same targets"
    );
}

/// The thinking VLA's own losses (the warm-up with its one-step latent
/// predictions, LAPO with its value head) train with
/// `train.gradient_checkpointing` as without: the same first-step loss
/// and gradient norm.
#[test]
fn checkpointed_warm_up_and_lapo_steps_are_the_plain_ones() {
    let set = ClosedLoop::sft_examples(&tiny_thinking_vla(K), &tasks(), &SftConfig::default(), 3)
        .unwrap()
        .examples;
    let (trajectories, steps, advantages) = lapo_inputs(&tiny_thinking_vla(K), 1.0);
    let lapo = ppo_examples(&trajectories, steps, advantages, true).unwrap();
    for (objective, examples) in [(Objective::Sft, &set), (Objective::Lapo, &lapo)] {
        let first_step = |on: bool| {
            let mut policy = tiny_thinking_vla(K);
            let mut config = config(objective, 1, 1e-3);
            config.train.gradient_checkpointing = on;
            let report = train(
                &mut policy,
                None,
                examples,
                &config,
                0,
                OptimizerState::fresh(objective.name()),
            )
            .unwrap();
            report.metrics[0].clone()
        };
        let (plain, checkpointed) = (first_step(false), first_step(true));
        assert!(
            (plain.loss - checkpointed.loss).abs() < 1e-5,
            "{plain:?}\n{checkpointed:?}"
        );
        assert!(
            (plain.grad_norm - checkpointed.grad_norm).abs() <= 1e-4 * plain.grad_norm,
            "{plain:?}\n{checkpointed:?}"
        );
    }
}
