use std::path::PathBuf;

use embodyflow_envs::context::ContextTemplates;
use embodyflow_models::policy::score_responses;

use super::*;
use crate::config::{OptimConfig, ScheduleKind, SftContext};
use crate::examples::sft_examples;
use crate::loss::{self, PpoConfig};
use crate::run::schedule_note;

/// The shared tiny policy with a context of 32 tokens.
fn tiny_policy() -> Checkpoint {
    embodyflow_models::testing::tiny_policy(32)
}

fn response_logprob(policy: &Checkpoint, example: &Example) -> f64 {
    tch::no_grad(|| {
        score_responses(
            policy,
            &[&example.prompt],
            &[&example.response],
            1.0,
            Entropy::Skip,
        )
        .logprobs
        .sum(Kind::Double)
        .double_value(&[])
    })
}

/// PPO moves a response's probability in the direction of its advantage.
#[test]
fn the_update_follows_the_sign_of_the_advantage() {
    for sign in [1.0f32, -1.0] {
        let mut policy = tiny_policy();
        let prompt = vec![5, 6, 7, policy.special.plan];
        let response = vec![9, 12, 15, policy.special.eos];
        let old = tch::no_grad(|| {
            score_responses(&policy, &[&prompt], &[&response], 1.0, Entropy::Skip).logprobs
        });
        let example = Example {
            source: "test".into(),
            old_logprobs: Vec::<f32>::try_from(old.view([-1])).unwrap(),
            advantages: vec![sign; response.len()],
            prompt,
            response,
            temperature: 1.0,
            observation: None,
            thought: None,
            response_mask: None,
        };
        let before = response_logprob(&policy, &example);
        let config = Config {
            epochs: 4,
            mini_batch: 1,
            micro_batch: 1,
            optim: OptimConfig {
                lr: 1e-2,
                ..Default::default()
            },
            ..Default::default()
        };
        let report = train(
            &mut policy,
            None,
            std::slice::from_ref(&example),
            &config,
            0,
            OptimizerState::fresh("ppo"),
        )
        .unwrap();
        assert_eq!(report.metrics.len(), 4);
        assert!(
            report.metrics[0]
                .approx_kl
                .is_some_and(|kl| kl.abs() < 1e-6),
            "starts at the behaviour policy"
        );
        let after = response_logprob(&policy, &example);
        assert!(
            (after - before) * sign as f64 > 0.0,
            "advantage {sign}: log-prob {before} -> {after}"
        );
    }
}

/// Tokens at the holes of a response mask (first, middle and last):
/// changing their old log-probs (to NaN) and advantages changes neither
/// the loss nor the gradient under every aggregation, with the entropy
/// bonus and the KL penalty on, and they are not counted; without the
/// mask the same example gives another loss.
#[test]
fn hole_tokens_change_neither_the_loss_nor_the_gradient() {
    let policy = tiny_policy();
    let reference = tiny_policy();
    let prompt = vec![5, 6, 7, policy.special.plan];
    let response = vec![9, 12, 15, 18, policy.special.eos];
    let old: Vec<f32> = Vec::<f32>::try_from(
        tch::no_grad(|| {
            score_responses(&policy, &[&prompt], &[&response], 1.0, Entropy::Skip).logprobs
        })
        .view([-1]),
    )
    .unwrap();
    let mask = vec![false, true, false, true, false];
    let example = |hole_old: f32, hole_adv: f32, masked: bool| Example {
        source: "test".into(),
        old_logprobs: old
            .iter()
            .zip(&mask)
            .map(|(&o, &m)| if m { o - 0.1 } else { hole_old })
            .collect(),
        advantages: mask
            .iter()
            .enumerate()
            .map(|(t, &m)| if m { t as f32 - 1.5 } else { hole_adv })
            .collect(),
        prompt: prompt.clone(),
        response: response.clone(),
        temperature: 1.0,
        observation: None,
        thought: None,
        response_mask: masked.then(|| mask.clone()),
    };
    for loss_agg in [
        loss::LossAgg::TokenMean,
        loss::LossAgg::SeqMeanTokenSum,
        loss::LossAgg::SeqMeanTokenMean,
    ] {
        let config = Config {
            ppo: PpoConfig {
                loss_agg,
                entropy_coef: 0.01,
                kl_coef: 0.5,
                ..Default::default()
            },
            ..Default::default()
        };
        let run = |example: Example| {
            for mut var in policy.vars.trainable_variables() {
                var.zero_grad();
            }
            let denominators = Denominators {
                tokens: example.loss_tokens() as f64,
                sequences: 1.0,
            };
            let examples = [example];
            let sums = accumulate(
                &policy,
                Some(&reference),
                &examples,
                &[vec![0]],
                denominators,
                &config,
            )
            .unwrap();
            let grads: Vec<tch::Tensor> = policy
                .vars
                .trainable_variables()
                .iter()
                .map(|v| v.grad().copy())
                .collect();
            (sums.loss, sums.tokens, grads)
        };
        let (loss, tokens, grads) = run(example(-0.5, 0.0, true));
        let (changed, _, changed_grads) = run(example(f32::NAN, 100.0, true));
        assert!(loss.is_finite(), "{loss_agg:?}: {loss}");
        assert_eq!(loss, changed, "{loss_agg:?}");
        assert_eq!(tokens, 2, "{loss_agg:?}");
        assert!(
            grads.iter().zip(&changed_grads).all(|(a, b)| a.equal(b)),
            "{loss_agg:?}: the gradient moved"
        );
        assert!(
            grads
                .iter()
                .any(|g| g.abs().sum(Kind::Double).double_value(&[]) > 0.0)
        );
        let (unmasked, ..) = run(example(-0.5, 0.0, false));
        assert_ne!(loss, unmasked, "{loss_agg:?}: the mask changed nothing");
    }
}

/// The KL penalty to a reference that starts equal to the policy: 0 at
/// the first step, positive once the policy has moved, and in the loss.
#[test]
fn the_kl_penalty_grows_as_the_policy_leaves_the_reference() {
    let mut policy = tiny_policy();
    let reference = tiny_policy();
    let prompt = vec![5, 6, 7, policy.special.plan];
    let response = vec![9, 12, 15, policy.special.eos];
    let old = tch::no_grad(|| {
        score_responses(&policy, &[&prompt], &[&response], 1.0, Entropy::Skip).logprobs
    });
    let example = Example {
        source: "test".into(),
        old_logprobs: Vec::<f32>::try_from(old.view([-1])).unwrap(),
        advantages: vec![1.0; response.len()],
        prompt,
        response,
        temperature: 1.0,
        observation: None,
        thought: None,
        response_mask: None,
    };
    assert_kl_penalty_grows(&mut policy, &reference, example);
}

/// Three PPO steps (lr 1e-2) on `example` with a KL penalty (coefficient
/// 0.5) to `reference`, which starts equal to `policy`: the penalty is 0
/// at the first step, positive at the third, and part of the loss.
/// Shared by the plan policy's test and the VLA's (`vla::tests`).
pub(crate) fn assert_kl_penalty_grows<M: Trainable>(
    policy: &mut Checkpoint<M>,
    reference: &Checkpoint<M>,
    example: Example,
) {
    let config = Config {
        epochs: 3,
        mini_batch: 1,
        micro_batch: 1,
        optim: OptimConfig {
            lr: 1e-2,
            ..Default::default()
        },
        ppo: PpoConfig {
            kl_coef: 0.5,
            ..Default::default()
        },
        kl_reference: Some(PathBuf::from("unused: the reference is passed in")),
        ..Default::default()
    };
    let report = train(
        policy,
        Some(reference),
        &[example],
        &config,
        0,
        OptimizerState::fresh("ppo"),
    )
    .unwrap();
    let kl: Vec<f32> = report.metrics.iter().map(|m| m.kl_loss.unwrap()).collect();
    assert!(kl[0].abs() < 1e-6 && kl[2] > 1e-6, "{kl:?}");
    let last = &report.metrics[2];
    assert!(
        (last.loss - (last.pg_loss + 0.5 * last.kl_loss.unwrap())).abs() < 1e-5,
        "{last:?}"
    );
}

/// SFT raises the log-probability of the expert answer.
#[test]
fn sft_learns_the_answer() {
    let mut policy = tiny_policy();
    let example = Example {
        source: "test".into(),
        prompt: vec![5, 6, policy.special.plan],
        response: vec![20, 21, 22, policy.special.eos],
        old_logprobs: Vec::new(),
        advantages: Vec::new(),
        temperature: 1.0,
        observation: None,
        thought: None,
        response_mask: None,
    };
    let before = response_logprob(&policy, &example);
    let config = Config {
        objective: Objective::Sft,
        epochs: 20,
        mini_batch: 1,
        micro_batch: 1,
        optim: OptimConfig {
            lr: 1e-2,
            ..Default::default()
        },
        ..Default::default()
    };
    train(
        &mut policy,
        None,
        std::slice::from_ref(&example),
        &config,
        0,
        OptimizerState::fresh("sft"),
    )
    .unwrap();
    let after = response_logprob(&policy, &example);
    assert!(after > before + 1.0 && after > -1.0, "{before} -> {after}");
}

/// `sft.context = both`: each task twice, once after the policy's prompt
/// and once after the teacher template with its reference plan.
#[test]
fn sft_contexts_follow_the_teacher_template() {
    use embodyflow_household::{Split, generate_tasks, task_row};
    let policy = tiny_policy();
    let rows: Vec<TaskRow> = generate_tasks(Split::Train, 5, 3)
        .iter()
        .map(task_row)
        .collect();
    let sft = |context| SftConfig {
        context,
        ..SftConfig::default()
    };
    let plain = sft_examples(&policy, &rows, &sft(SftContext::Prompt)).unwrap();
    let both = sft_examples(&policy, &rows, &sft(SftContext::Both)).unwrap();
    assert_eq!((plain.len(), both.len()), (3, 6));
    let text = |ids: &[i32]| embodyflow_models::tokenizer::decode(&policy.tokenizer, ids).unwrap();
    assert_eq!(both[0].prompt, plain[0].prompt);
    assert_eq!(both[1].response, plain[0].response);
    let teacher = text(&both[1].prompt);
    let first = &rows[0].gt_actions.as_ref().unwrap()[0];
    assert!(
        teacher.contains(&format!(
            "=== Reference Plan Begin ===\n{}: {}\n",
            first.action_id, first.action_name
        )),
        "{teacher}"
    );
    let broken = SftConfig {
        template: ContextTemplates {
            teacher: "{prompt}".into(),
            ..ContextTemplates::default()
        },
        ..sft(SftContext::Reference)
    };
    let error = sft_examples(&policy, &rows, &broken)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("reference_plan"), "{error}");
}

/// SFT examples whose answers have `lengths` tokens (different lengths,
/// so a step's token count is not a multiple of its sequences).
fn sft_set(policy: &Checkpoint, lengths: &[usize]) -> Vec<Example> {
    lengths
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let mut response: Vec<i32> = (0..n as i32 - 1).map(|t| 20 + 3 * t + i as i32).collect();
            response.push(policy.special.eos);
            Example {
                source: format!("example {i}"),
                prompt: vec![5 + i as i32, 6, policy.special.plan],
                response,
                old_logprobs: Vec::new(),
                advantages: Vec::new(),
                temperature: 1.0,
                observation: None,
                thought: None,
                response_mask: None,
            }
        })
        .collect()
}

pub(crate) fn max_weight_difference<M: PolicyNet>(a: &Checkpoint<M>, b: &Checkpoint<M>) -> f64 {
    let b_vars = b.vars.variables();
    a.vars
        .variables()
        .iter()
        .map(|(name, t)| (t - &b_vars[name]).abs().max().double_value(&[]))
        .fold(0.0, f64::max)
}

fn lrs(report: &TrainReport) -> Vec<f32> {
    report.metrics.iter().map(|m| m.lr).collect()
}

/// `grad_accumulation = 2` over mini-batches of 2 is one step on their
/// union of 4: same losses, rates and weights, under both kinds of
/// normalisation. Both runs use micro-batches of 2, because Adam turns
/// float noise in gradients that are 0 in exact arithmetic (a key bias)
/// into steps of about `lr`; that a step's micro-batches sum to its loss
/// in one piece is `loss::tests::micro_batches_sum_to_the_whole`.
#[test]
fn accumulated_mini_batches_step_like_their_union() {
    for loss_agg in [loss::LossAgg::TokenMean, loss::LossAgg::SeqMeanTokenMean] {
        let config = |mini_batch, micro_batch, grad_accumulation| Config {
            objective: Objective::Sft,
            epochs: 2,
            mini_batch,
            micro_batch,
            grad_accumulation,
            optim: OptimConfig {
                lr: 1e-2,
                schedule: ScheduleKind::LinearWarmup,
                warmup_steps: 2,
                ..Default::default()
            },
            ppo: PpoConfig {
                loss_agg,
                ..Default::default()
            },
            ..Default::default()
        };
        let initial = tiny_policy();
        let examples = sft_set(&initial, &[2, 7, 3, 5, 4, 6]);
        let mut accumulated = tiny_policy();
        let a = train(
            &mut accumulated,
            None,
            &examples,
            &config(2, 2, 2),
            11,
            OptimizerState::fresh("sft"),
        )
        .unwrap();
        let mut union = tiny_policy();
        let b = train(
            &mut union,
            None,
            &examples,
            &config(4, 2, 1),
            11,
            OptimizerState::fresh("sft"),
        )
        .unwrap();
        // 6 examples in steps of 4: a full step and the epoch's rest, twice.
        assert_eq!((a.metrics.len(), b.metrics.len()), (4, 4));
        assert_eq!(lrs(&a), [0.0, 5e-3, 1e-2, 1e-2]);
        assert_eq!(lrs(&a), lrs(&b));
        for (x, y) in a.metrics.iter().zip(&b.metrics) {
            assert!(
                (x.loss - y.loss).abs() < 1e-5,
                "{loss_agg:?}: {} vs {}",
                x.loss,
                y.loss
            );
        }
        let moved = max_weight_difference(&accumulated, &initial);
        let difference = max_weight_difference(&accumulated, &union);
        assert!(moved > 1e-3, "the steps move the weights ({moved})");
        assert!(
            difference < 1e-6,
            "{loss_agg:?}: accumulated vs union weights differ by {difference}"
        );
        // The same mini-batches as separate steps are another run.
        let mut separate = tiny_policy();
        train(
            &mut separate,
            None,
            &examples,
            &config(2, 2, 1),
            11,
            OptimizerState::fresh("sft"),
        )
        .unwrap();
        assert!(max_weight_difference(&separate, &union) > 1e-3);
    }
}

/// PPO examples in 3 groups of 3 samples sharing a prompt (prompts of
/// two lengths, responses of many), old log-probs near the policy's.
fn ppo_groups(policy: &Checkpoint) -> Vec<Example> {
    let plan = policy.special.plan;
    let prompts = [
        vec![5, 6, 7, plan],
        vec![8, 9, plan],
        vec![10, 11, 12, plan],
    ];
    let mut examples = Vec::new();
    for (g, prompt) in prompts.iter().enumerate() {
        for sample in 0..3usize {
            let n = 2 + (g * 3 + sample * 5) % 7;
            let mut response: Vec<i32> = (0..n as i32 - 1)
                .map(|t| 20 + 5 * t + sample as i32)
                .collect();
            response.push(policy.special.eos);
            let old = tch::no_grad(|| {
                score_responses(policy, &[prompt], &[&response], 1.0, Entropy::Skip).logprobs
            });
            let old: Vec<f32> = Vec::<f32>::try_from(old.view([-1]))
                .unwrap()
                .iter()
                .enumerate()
                .map(|(t, lp)| lp + 0.05 * ((t + sample) % 3) as f32 - 0.05)
                .collect();
            examples.push(Example {
                source: format!("group {g} sample {sample}"),
                prompt: prompt.clone(),
                response,
                old_logprobs: old,
                advantages: (0..n)
                    .map(|t| sample as f32 - 1.0 + 0.1 * t as f32)
                    .collect(),
                temperature: 1.0,
                observation: None,
                thought: None,
                response_mask: None,
            });
        }
    }
    examples
}

fn gradients(policy: &Checkpoint) -> Vec<(String, tch::Tensor)> {
    let mut grads: Vec<(String, tch::Tensor)> = policy
        .vars
        .variables()
        .into_iter()
        .map(|(name, var)| (name, var.grad().copy()))
        .collect();
    grads.sort_by(|a, b| a.0.cmp(&b.0));
    grads
}

/// Micro-batches ordered by prompt and length (each group's prompt
/// encoded once) give the step the loss, metrics and gradient of the
/// shuffled order cut as it comes, up to float rounding, under every
/// aggregation, with and without an entropy bonus; and the same seed
/// trains to the same weights.
#[test]
fn length_and_prompt_ordered_micro_batches_step_like_plain_ones() {
    let policy = tiny_policy();
    let examples = ppo_groups(&policy);
    let mut step: Vec<usize> = (0..examples.len()).collect();
    step.shuffle(&mut ChaCha8Rng::seed_from_u64(5));
    let ordered = micro_batches(&examples, &step, 4);
    assert_eq!(ordered.concat().len(), step.len());
    let first: Vec<&[i32]> = ordered[0]
        .iter()
        .map(|&i| examples[i].prompt.as_slice())
        .collect();
    assert!(
        first.windows(2).filter(|w| w[0] == w[1]).count() >= 2,
        "a group sits together"
    );
    let plain: Vec<Vec<usize>> = step.chunks(4).map(<[usize]>::to_vec).collect();
    assert_ne!(ordered, plain);
    let denominators = Denominators {
        tokens: examples.iter().map(|e| e.response.len()).sum::<usize>() as f64,
        sequences: examples.len() as f64,
    };
    for (loss_agg, entropy_coef) in [
        (loss::LossAgg::TokenMean, 0.0),
        (loss::LossAgg::TokenMean, 0.3),
        (loss::LossAgg::SeqMeanTokenSum, 0.0),
        (loss::LossAgg::SeqMeanTokenMean, 0.0),
    ] {
        let config = Config {
            ppo: PpoConfig {
                loss_agg,
                entropy_coef,
                ..Default::default()
            },
            ..Default::default()
        };
        let run = |micros: &[Vec<usize>]| {
            for (_, var) in policy.vars.variables() {
                let mut grad = var.grad();
                if grad.defined() {
                    let _ = grad.zero_();
                }
            }
            let sums = accumulate(&policy, None, &examples, micros, denominators, &config).unwrap();
            (sums, gradients(&policy))
        };
        let (a, grads_a) = run(&ordered);
        let (b, grads_b) = run(&plain);
        let context = format!("{loss_agg:?}, entropy_coef {entropy_coef}");
        assert_eq!(a.tokens, b.tokens);
        assert_eq!(
            (a.clipped, a.clipped_lower),
            (b.clipped, b.clipped_lower),
            "{context}"
        );
        for (x, y) in [
            (a.loss, b.loss),
            (a.pg_loss, b.pg_loss),
            (a.entropy, b.entropy),
            (a.approx_kl, b.approx_kl),
        ] {
            assert!(
                (x - y).abs() < 1e-5 * y.abs().max(1.0),
                "{context}: {a:?} vs {b:?}"
            );
        }
        // The entropy is the metric either way, and in the loss only with a bonus.
        assert!(a.entropy > 0.0);
        let bonus = a.pg_loss - entropy_coef * a.entropy;
        assert!((a.loss - bonus).abs() < 1e-5, "{context}: {a:?}");
        for ((name, x), (_, y)) in grads_a.iter().zip(&grads_b) {
            let scale = y.abs().max().double_value(&[]).max(1e-3);
            let diff = (x - y).abs().max().double_value(&[]);
            assert!(
                diff < 1e-4 * scale,
                "{context}: {name} differs by {diff} ({scale})"
            );
        }
    }
    let config = Config {
        epochs: 2,
        mini_batch: 6,
        micro_batch: 4,
        optim: OptimConfig {
            lr: 1e-2,
            ..Default::default()
        },
        ..Default::default()
    };
    let trained = || {
        let mut policy = tiny_policy();
        train(
            &mut policy,
            None,
            &examples,
            &config,
            7,
            OptimizerState::fresh("ppo"),
        )
        .unwrap();
        policy
    };
    let (x, y) = (trained(), trained());
    assert!(max_weight_difference(&x, &tiny_policy()) > 1e-4);
    assert_eq!(
        max_weight_difference(&x, &y),
        0.0,
        "same seed, same weights"
    );
}

/// Two calls through a checkpoint on disk (3 steps, then 5) follow the
/// schedule of one call of 8 steps: same rates, same weights.
#[test]
fn a_resumed_run_continues_the_schedule() {
    let config = |epochs| Config {
        objective: Objective::Sft,
        epochs,
        mini_batch: 1,
        micro_batch: 1,
        optim: OptimConfig {
            lr: 1e-2,
            schedule: ScheduleKind::Cosine,
            warmup_steps: 2,
            total_steps: Some(6),
            min_lr_ratio: 0.1,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut straight = tiny_policy();
    let examples = sft_set(&straight, &[5]);
    let whole = train(
        &mut straight,
        None,
        &examples,
        &config(8),
        0,
        OptimizerState::fresh("sft"),
    )
    .unwrap();
    let dir = std::env::temp_dir().join(format!(
        "embodyflow-update-policy-resume-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    let mut first = tiny_policy();
    let a = train(
        &mut first,
        None,
        &examples,
        &config(3),
        0,
        OptimizerState::fresh("sft"),
    )
    .unwrap();
    first
        .save(&dir.join("policy"), "update-policy", false)
        .unwrap();
    let mut second = Checkpoint::load(&dir.join("policy"), tch::Device::Cpu).unwrap();
    let state = OptimizerState::load(&dir.join("policy"), &second.vars)
        .unwrap()
        .unwrap();
    assert_eq!(state.meta.steps, 3);
    let b = train(&mut second, None, &examples, &config(5), 0, state).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!([lrs(&a), lrs(&b)].concat(), lrs(&whole));
    // transformers' / veRL's lambda at steps 0..8 (the floor from step 6 on).
    let expected: Vec<f32> = (0..8u32)
        .map(|s| {
            let factor = if s < 2 {
                f64::from(s) / 2.0
            } else {
                let progress = (f64::from(s - 2) / 4.0).min(1.0);
                0.1 + 0.9 * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            };
            (1e-2 * factor) as f32
        })
        .collect();
    assert_eq!(lrs(&whole), expected);
    assert_eq!(max_weight_difference(&straight, &second), 0.0);
    let note = schedule_note(&config(5).optim, 3, &b.metrics);
    assert!(
        note.starts_with("cosine, steps 4 to 8 of the run")
            && note.ends_with("(past optim.total_steps = 6: held at the floor)"),
        "{note}"
    );
}

/// `f` of a bf16 copy of `make()`'s network, as `train.precision =
/// "bf16"` holds it (over fp32 master weights), without gradients: what a
/// policy training in bf16 records of itself.
pub(crate) fn in_bf16<M: PolicyNet, R>(
    make: impl Fn() -> Checkpoint<M>,
    f: impl FnOnce(&Checkpoint<M>) -> R,
) -> R {
    let mut policy = make();
    let _master = MasterWeights::new(&mut policy.vars);
    tch::no_grad(|| f(&policy))
}

/// The examples' old log-probs rewritten as a bf16 copy of `make()`'s
/// network scores them ([`in_bf16`]), one example at a time.
pub(crate) fn recorded_in_bf16<M: Trainable>(
    make: impl Fn() -> Checkpoint<M>,
    examples: &mut [Example],
) {
    let recorded: Vec<Vec<f32>> = in_bf16(make, |policy| {
        examples
            .iter()
            .map(|e| {
                let scores = M::Role::score(policy, &[e], f64::from(e.temperature), Entropy::Skip);
                Vec::<f32>::try_from(scores.unwrap().logprobs.view([-1])).unwrap()
            })
            .collect()
    });
    for (example, logprobs) in examples.iter_mut().zip(recorded) {
        example.old_logprobs = logprobs;
    }
}

/// What `train.precision = "bf16"` promises, on `make()`'s network trained
/// under `config` (against `reference` when given) in bf16 on
/// `bf16_examples`, whose old log-probs a bf16 copy of the network recorded
/// ([`recorded_in_bf16`]), and in fp32 on `fp32_examples` (the same
/// decisions as the fp32 network recorded them, or the same examples): a
/// policy-gradient objective's first bf16 step has ratio exactly 1
/// (approx_kl and clipfrac 0); every step's loss stays within 2e-2 of the
/// fp32 run's (relative beyond 1: bf16 keeps 8 bits of mantissa, so a
/// cross-entropy of 5 rounds by more), and so do the weights, which moved
/// by more than the rate; the weights are f32 again afterwards
/// and saved as F32, the optimizer state kept. Returns the bf16 and the
/// fp32 run's reports.
pub(crate) fn assert_bf16_tracks_fp32<M: Trainable>(
    make: impl Fn() -> Checkpoint<M>,
    reference: Option<&Checkpoint<M>>,
    bf16_examples: &[Example],
    fp32_examples: &[Example],
    config: &Config,
) -> (TrainReport, TrainReport) {
    let run = |precision, examples| {
        let mut policy = make();
        let config = Config {
            train: crate::config::TrainConfig {
                precision,
                ..config.train
            },
            ..config.clone()
        };
        let state = OptimizerState::fresh(config.objective.name());
        let report = train(&mut policy, reference, examples, &config, 0, state).unwrap();
        (policy, report)
    };
    let (bf16, bf16_report) = run(Precision::Bf16, bf16_examples);
    let (fp32, fp32_report) = run(Precision::Fp32, fp32_examples);
    let first = &bf16_report.metrics[0];
    if config.objective != Objective::Sft {
        assert_eq!(first.approx_kl, Some(0.0), "{first:?}");
        assert_eq!(first.clipfrac, Some(0.0), "{first:?}");
    }
    for (name, var) in bf16.vars.variables() {
        assert_eq!(var.kind(), Kind::Float, "{name}");
    }
    assert!(bf16.optimizer.is_some(), "the optimizer state is kept");
    assert_eq!(bf16_report.metrics.len(), fp32_report.metrics.len());
    for (a, b) in bf16_report.metrics.iter().zip(&fp32_report.metrics) {
        let tolerance = 2e-2 * b.loss.abs().max(1.0);
        assert!((a.loss - b.loss).abs() < tolerance, "{a:?}\n{b:?}");
    }
    let moved = max_weight_difference(&fp32, &make());
    let apart = max_weight_difference(&bf16, &fp32);
    assert!(
        moved > config.optim.lr && apart < 2e-2,
        "moved {moved}, bf16 vs fp32 {apart}"
    );
    let dir = tempfile::tempdir().unwrap();
    bf16.save(&dir.path().join("policy"), "update-policy", false)
        .unwrap();
    let dtypes =
        embodyflow_models::testing::stored_dtypes(&dir.path().join("policy/model.safetensors"));
    assert!(!dtypes.is_empty());
    for (name, dtype) in dtypes {
        assert_eq!(dtype, "F32", "{name}");
    }
    (bf16_report, fp32_report)
}

/// `train.precision = "bf16"` on the plan policy: PPO over fp32 master
/// weights starts at ratio 1 and tracks the fp32 run
/// ([`assert_bf16_tracks_fp32`]).
#[test]
fn bf16_steps_fp32_master_weights_and_starts_at_ratio_one() {
    let mut examples = in_bf16(tiny_policy, ppo_groups);
    recorded_in_bf16(tiny_policy, &mut examples);
    let config = Config {
        epochs: 3,
        mini_batch: 9,
        micro_batch: 9,
        optim: OptimConfig {
            lr: 1e-3,
            ..Default::default()
        },
        ..Default::default()
    };
    assert_bf16_tracks_fp32(tiny_policy, None, &examples, &examples, &config);
}
