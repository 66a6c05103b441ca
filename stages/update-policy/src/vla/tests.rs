use super::*;
use crate::train::tests::{assert_bf16_tracks_fp32, recorded_in_bf16};
use crate::{Config, Objective, OptimConfig, train};
use embodyflow_core::observation::{self, ObservationShape};
use embodyflow_models::optimizer::OptimizerState;
use embodyflow_models::testing::tiny_vla;
use embodyflow_models::vla::{LatentConfig, Observation, VlaConfig};
use embodyflow_tabletop::{
    self as tabletop, ExpertConfig, Split, Strategy, Suite, World, frame_len, generate, task_row,
};

const K: i64 = 4;

fn sft_config() -> SftConfig {
    SftConfig {
        expert_noise: 0.05,
        ..SftConfig::default()
    }
}

/// Examples from two tabletop tasks decode back to the expert's
/// demonstration: one per decision, the frame and proprio it saw, the
/// instruction as collect-rollouts tokenizes it, and tokens within half a
/// bin of the actions taken before the episode ended. A task whose
/// demonstration fails (max_steps too short) is dropped and counted.
#[test]
fn sft_examples_are_the_experts_decisions() {
    let policy = tiny_vla(K);
    let tasks = [
        generate(Suite::Goal, Split::Train, 3, 0),
        generate(Suite::Spatial, Split::Train, 3, 1),
    ];
    let mut short = generate(Suite::Object, Split::Train, 3, 2);
    short.max_steps = 6;
    let rows: Vec<TaskRow> = tasks.iter().chain([&short]).map(task_row).collect();
    let set = sft_examples(&policy, &rows, &sft_config(), 7).unwrap();
    let sampler = VlaPolicy::new(&policy, 0.0).unwrap();
    let bins = sampler.bins();
    let half_bin = 1.0 / 255.0 + 1e-6;
    let mut at = 0;
    for task in &tasks {
        let expert = ExpertConfig {
            noise: 0.05,
            seed: sampling_seed(7, &task.task_id()),
        };
        let demo = tabletop::demonstration(
            task,
            Strategy::Grasp,
            expert,
            tabletop::Labels::Executed,
            K as usize,
            32,
        )
        .unwrap();
        assert!(demo.episode.success);
        let steps = demo.episode.steps as usize;
        let instruction = sampler.instruction_ids(&task.instruction).unwrap();
        for (i, decision) in demo.decisions.iter().enumerate() {
            let example = &set.examples[at];
            at += 1;
            assert_eq!(
                example.source,
                format!("task `{}` decision {i}", task.task_id())
            );
            assert_eq!(example.prompt, instruction);
            let seen = observation::decode(example.observation().unwrap()).unwrap();
            assert_eq!(seen.pixels, decision.frame.as_slice());
            assert_eq!(seen.proprio, decision.proprio);
            let valid = (steps - i * K as usize).min(K as usize);
            assert_eq!(example.response.len(), valid * 4, "{}", example.source);
            let tokens: Vec<u32> = example.response.iter().map(|&t| t as u32).collect();
            let actions = bins.decode(&tokens).unwrap();
            for (got, want) in actions.iter().zip(decision.actions.concat()) {
                assert!(
                    (got - want).abs() <= half_bin,
                    "{}: {got} vs {want}",
                    example.source
                );
            }
        }
        // Not every decision is whole: the episode ends inside the last one
        // or on its boundary.
        assert_eq!(demo.decisions.len(), steps.div_ceil(K as usize));
    }
    assert_eq!(at, set.examples.len(), "nothing from the failed task");
    let notes: Vec<String> = set.notes.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    assert!(
        notes[0].starts_with("demonstrations: 2 successful"),
        "{notes:?}"
    );
    assert_eq!(
        notes[1],
        format!(
            "dropped demonstrations: 1 failed and were left out (first: task `{}`)",
            short.task_id()
        )
    );
    // The first N of each task type: with one type, the first task alone.
    let mut same_type = rows[..2].to_vec();
    for row in &mut same_type {
        row.task_type = Some("one type".into());
    }
    let one = SftConfig {
        demos_per_task_type: Some(1),
        ..sft_config()
    };
    let kept = sft_examples(&policy, &same_type, &one, 7).unwrap();
    let first = sft_examples(&policy, &rows[..1], &sft_config(), 7).unwrap();
    assert_eq!(kept.examples, first.examples);
    // Tasks of another world are refused, named.
    let mut household = rows[0].clone();
    household.env = "household".into();
    let error = sft_examples(&policy, &[household], &sft_config(), 7)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains(&tasks[0].task_id()), "{error}");
}

/// `sft.windows = steps`: one example per step of the expert's episode,
/// its frame and proprio with the tokens of the next K actions (fewer at
/// the end); the windows at every K-th step are the chunk examples exactly.
/// A thinking VLA and a demonstrations table refuse it, naming the key.
#[test]
fn step_windows_start_at_every_step_and_contain_the_chunks() {
    let policy = tiny_vla(K);
    let task = generate(Suite::Goal, Split::Train, 3, 0);
    let rows = [task_row(&task)];
    let chunks = sft_examples(&policy, &rows, &sft_config(), 7).unwrap();
    let steps = SftConfig {
        windows: SftWindows::Steps,
        ..sft_config()
    };
    let windows = sft_examples(&policy, &rows, &steps, 7).unwrap();
    let expert = ExpertConfig {
        noise: 0.05,
        seed: sampling_seed(7, &task.task_id()),
    };
    let demo = tabletop::demonstration(
        &task,
        Strategy::Grasp,
        expert,
        tabletop::Labels::Executed,
        1,
        32,
    )
    .unwrap();
    let n = demo.episode.steps as usize;
    assert_eq!(windows.examples.len(), n);
    for (t, example) in windows.examples.iter().enumerate() {
        let seen = observation::decode(example.observation().unwrap()).unwrap();
        assert_eq!(seen.pixels, demo.decisions[t].frame.as_slice(), "step {t}");
        assert_eq!(
            example.response.len(),
            (n - t).min(K as usize) * 4,
            "step {t}"
        );
    }
    for (i, chunk) in chunks.examples.iter().enumerate() {
        let window = &windows.examples[i * K as usize];
        assert_eq!(
            (&window.prompt, &window.response, window.observation()),
            (&chunk.prompt, &chunk.response, chunk.observation()),
            "decision {i}"
        );
    }
    let thinking = embodyflow_models::testing::tiny_thinking_vla(K);
    let error = sft_examples(&thinking, &rows, &steps, 7)
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("sft.windows"), "{error}");
    let table = SftConfig {
        demonstrations: Some("runs/demos".into()),
        ..steps
    };
    let error = sft_examples(&policy, &rows, &table, 7)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("sft.windows") && error.contains("runs/demos"),
        "{error}"
    );
}

/// A VLA for the bridge's counter (`faulty` adapter, 2 x 2 frames, proprio
/// 1, Discrete(3) as 4 bins, one action per decision) whose prompts recall
/// the last `history` decisions.
fn counter_vla(history: i64) -> Checkpoint<Vla> {
    let tokenizer = embodyflow_models::testing::tiny_tokenizer();
    let config = VlaConfig {
        max_instruction: 160,
        image_size: 2,
        patch_size: 1,
        proprio_dim: 1,
        chunk_len: 1,
        action_dim: 1,
        n_bins: 4,
        n_embd: 32,
        n_layer: 1,
        history,
        ..VlaConfig::small(tokenizer.get_vocab_size(true) as i64)
    };
    let _generator = embodyflow_models::testing::seed(embodyflow_models::testing::SEED);
    Checkpoint::<Vla>::init_kind(&config, tokenizer, tch::Device::Cpu).unwrap()
}

/// Replays the SFT examples' actions, one decision each, with the
/// checkpoint's prompts (its tokenizer and history).
struct Replay<'a> {
    sampler: VlaPolicy<'a>,
    tokens: Vec<u32>,
}

impl ChunkPolicy for Replay<'_> {
    type Error = ModelError;
    fn chunk_len(&self) -> usize {
        self.sampler.chunk_len()
    }
    fn action_dim(&self) -> usize {
        self.sampler.action_dim()
    }
    fn observation_shape(&self) -> ObservationShape {
        self.sampler.observation_shape()
    }
    fn instruction_ids(&self, instruction: &str) -> Result<Vec<i32>, ModelError> {
        self.sampler.instruction_ids(instruction)
    }
    fn history(&self) -> usize {
        self.sampler.history()
    }
    fn decide(
        &mut self,
        batch: &embodyflow_rollout::closed_loop::DecisionBatch<'_>,
    ) -> Result<Vec<embodyflow_rollout::closed_loop::ChunkDecision>, ModelError> {
        Ok(vec![embodyflow_rollout::closed_loop::ChunkDecision {
            tokens: vec![self.tokens[batch.decision]],
            token_logprobs: vec![0.0],
            thought: None,
        }])
    }
}

/// In a world that observes text (the bridge's counter with `text`: "at
/// N", its expert moving +1 to the goal 4), with `vla.history = 2` each SFT
/// example's prompt recalls the expert's last two decisions, and it is the
/// prompt the rollout driver builds and records when the same actions are
/// taken: training and acting read the same text, decision by decision.
/// Without a history the prompts are the instruction and the text alone.
#[test]
fn sft_prompts_with_a_history_are_the_drivers_for_the_same_expert_episode() {
    use embodyflow_gym::GymTaskSpec;
    use embodyflow_rollout::closed_loop::{ClosedLoopConfig, run_closed_loop};
    use embodyflow_worlds::{WorldOptions, Worlds, task_of};
    let mut spec = GymTaskSpec::new("faulty", "Counter-v0", 0, 10);
    spec.kwargs = serde_json::json!({"text": true, "goal": 4});
    let rows = [embodyflow_gym::task_row("counter/0", "train", &spec).unwrap()];
    let policy = counter_vla(2);
    let set = sft_examples(&policy, &rows, &sft_config(), 7).unwrap();
    assert_eq!(set.examples.len(), 4, "{:?}", set.notes);
    let decode = |ids: &[i32]| {
        let ids: Vec<u32> = ids.iter().map(|&id| id as u32).collect();
        policy.tokenizer.decode(&ids, false).unwrap()
    };
    assert_eq!(
        decode(&set.examples[3].prompt),
        "count to 4\n[Observation 2: 'at 1', Action 2: '1']\n\
         [Observation 3: 'at 2', Action 3: '1']\nat 3"
    );
    let sampler = VlaPolicy::new(&policy, 0.0).unwrap();
    let bins = sampler.bins();
    let tokens = set.examples.iter().map(|e| e.response[0] as u32).collect();
    let mut replay = Replay { sampler, tokens };
    let options = WorldOptions {
        image_size: 2,
        bins: bins.clone(),
        workers: Default::default(),
    };
    let mut worlds = Worlds::new(options);
    let mut world = worlds.episodes(&[task_of(&rows[0]).unwrap()], 1).unwrap();
    let config = ClosedLoopConfig {
        max_decisions: 8,
        label: "replay (test)",
    };
    let run = run_closed_loop(&mut world, &mut replay, &bins, &[0], &config).unwrap();
    worlds.done(world);
    assert!(run.episodes[0].success);
    let driven: Vec<Vec<i32>> = run.episodes[0]
        .step_rows("t")
        .into_iter()
        .map(|r| r.prompt_ids)
        .collect();
    let trained: Vec<Vec<i32>> = set.examples.iter().map(|e| e.prompt.clone()).collect();
    assert_eq!(driven, trained);
    // Memoryless: the instruction and the text.
    let memoryless = sft_examples(&counter_vla(0), &rows, &sft_config(), 7).unwrap();
    assert_eq!(decode(&memoryless.examples[3].prompt), "count to 4\nat 3");
}

/// A checkpoint with a history refuses a demonstrations table (its prompts
/// are the imported instructions) and `sft.windows = steps` over chunks of
/// more than one action (the driver recalls decisions, not steps), naming
/// the key and the history.
#[test]
fn a_history_refuses_sft_sources_whose_prompts_cannot_recall_it() {
    let tokenizer = embodyflow_models::testing::tiny_tokenizer();
    let config = VlaConfig {
        chunk_len: K,
        max_instruction: 160,
        history: 2,
        ..VlaConfig::small(tokenizer.get_vocab_size(true) as i64)
    };
    let policy = Checkpoint::<Vla>::init_kind(&config, tokenizer, tch::Device::Cpu).unwrap();
    let rows = [task_row(&generate(Suite::Goal, Split::Train, 3, 0))];
    let table = SftConfig {
        demonstrations: Some("runs/demos".into()),
        ..sft_config()
    };
    let steps = SftConfig {
        windows: SftWindows::Steps,
        ..sft_config()
    };
    for (sft, key) in [(table, "sft.demonstrations"), (steps, "sft.windows")] {
        let error = sft_examples(&policy, &rows, &sft, 7)
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains(key) && error.contains("recall its last 2 decisions"),
            "{error}"
        );
    }
}

/// `sft.expert_labels = planned` asks the world for DART's labels: the
/// same noisy episodes (the same observations), the expert's planned
/// actions as the tokens, and the summary says so.
#[test]
fn planned_labels_reach_the_world_and_keep_its_observations() {
    let policy = tiny_vla(K);
    let rows = [task_row(&generate(Suite::Goal, Split::Train, 3, 0))];
    let noisy = SftConfig {
        expert_noise: 0.3,
        ..sft_config()
    };
    let executed = sft_examples(&policy, &rows, &noisy, 7).unwrap();
    let planned = SftConfig {
        expert_labels: crate::config::ExpertLabels::Planned,
        ..noisy
    };
    let planned = sft_examples(&policy, &rows, &planned, 7).unwrap();
    assert_eq!(executed.examples.len(), planned.examples.len());
    let same_states = executed
        .examples
        .iter()
        .zip(&planned.examples)
        .all(|(a, b)| a.observation() == b.observation());
    assert!(same_states);
    assert_ne!(
        executed
            .examples
            .iter()
            .map(|e| &e.response)
            .collect::<Vec<_>>(),
        planned
            .examples
            .iter()
            .map(|e| &e.response)
            .collect::<Vec<_>>()
    );
    assert!(
        planned.notes[0].1.contains("planned labels"),
        "{:?}",
        planned.notes
    );
}

/// When every demonstration fails there is nothing to train on: the error
/// says so and why, the tasks the expert failed or the infrastructure
/// fault that ended them, not only that no examples were made.
#[test]
fn when_every_demonstration_fails_the_error_says_why() {
    let policy = tiny_vla(K);
    let rows: Vec<TaskRow> = (2..4)
        .map(|i| {
            let mut task = generate(Suite::Object, Split::Train, 3, i);
            task.max_steps = 6;
            task_row(&task)
        })
        .collect();
    let error = sft_examples(&policy, &rows, &sft_config(), 7)
        .err()
        .expect("nothing to train on")
        .to_string();
    assert!(
        error.contains("no training examples: every one of the 2 demonstrations of the expert")
            && error.contains(&format!(
                "none completed its task, and no infrastructure fault ended them (first: task `{}`)",
                rows[0].task_id
            )),
        "{error}"
    );

    // Faults (a gym bridge's hung workers) are named with their cause.
    let dropped = |fault: Option<&str>, task: &str| decisions::Dropped {
        what: format!("task `{task}`"),
        fault: fault.map(String::from),
    };
    let hung = "worker 0 hung: no frame within 60 s (bridge.timeout_s)";
    let all = [dropped(Some(hung), "a"), dropped(Some(hung), "b")];
    let error = decisions::all_dropped(&all, "of the expert (gym:babyai)").to_string();
    assert_eq!(
        error,
        format!(
            "no training examples: every one of the 2 demonstrations of the expert (gym:babyai) failed and was left out: all 2 ended by an infrastructure fault, not by the expert (first: task `a`: {hung})"
        )
    );
    let some = [
        dropped(None, "a"),
        dropped(Some(hung), "b"),
        dropped(None, "c"),
    ];
    let error = decisions::all_dropped(&some, "of the expert (gym:babyai)").to_string();
    assert!(
        error.contains(&format!(
            "1 ended by an infrastructure fault (first: task `b`: {hung}), the other 2 did not complete their task (first: task `a`)"
        )),
        "{error}"
    );
    assert_eq!(
        decisions::dropped_note(&some).1,
        format!(
            "3 failed and were left out (first: task `a`); 1 of them ended by an infrastructure fault (first: task `b`: {hung})"
        )
    );
}

/// A rendered observation of a task's first frame, `size` pixels.
fn first_observation(size: usize) -> Vec<u8> {
    let task = generate(Suite::Goal, Split::Train, 3, 0);
    let world = World::new(&task).unwrap();
    let mut frame = vec![0u8; frame_len(size)];
    world.render(size, &mut frame).unwrap();
    let shape = ObservationShape {
        height: size,
        width: size,
        channels: 3,
        proprio: tabletop::PROPRIO_DIM,
    };
    observation::encode(&shape, &frame, &world.proprio()).unwrap()
}

/// A rollout decision sampled by `policy` at temperature 1 from the first
/// frame, with `advantage` on every token.
fn rollout(policy: &Checkpoint<Vla>, advantage: f32) -> Example {
    sampled_rollout(policy, advantage, 11)
}

/// [`rollout`] drawn with sampling seed `seed`.
fn sampled_rollout(policy: &Checkpoint<Vla>, advantage: f32, seed: u64) -> Example {
    let bytes = first_observation(32);
    let seen = observation::decode(&bytes).unwrap();
    let instruction = VlaPolicy::new(policy, 1.0)
        .unwrap()
        .instruction_ids("put the red block in the blue bowl")
        .unwrap();
    let row = Observation {
        image: seen.pixels,
        height: 32,
        width: 32,
        proprio: &seen.proprio,
        instruction: &instruction,
    };
    let decision = policy.model.sample(&[row], &[seed], 1.0).unwrap().remove(0);
    Example {
        source: "trajectory `t0` step 2".into(),
        prompt: instruction,
        response: decision.tokens.iter().map(|&t| t as i32).collect(),
        old_logprobs: decision.token_logprobs,
        advantages: vec![advantage; (K * 4) as usize],
        temperature: 1.0,
        observation: Some(bytes.into()),
        thought: None,
        response_mask: None,
    }
}

fn decision_logprob(policy: &Checkpoint<Vla>, example: &Example) -> f64 {
    tch::no_grad(|| {
        ClosedLoop::score(policy, &[example], 1.0, Entropy::Skip)
            .unwrap()
            .logprobs
            .sum(tch::Kind::Double)
            .double_value(&[])
    })
}

fn ppo_config(epochs: usize) -> Config {
    Config {
        epochs,
        mini_batch: 1,
        micro_batch: 1,
        optim: OptimConfig {
            lr: 1e-2,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// PPO on a VLA decision moves its log-prob with the sign of the advantage;
/// the first step starts at the behaviour policy (the log-probs recomputed
/// from the stored observation are the sampler's), and the metrics are
/// finite with an entropy.
#[test]
fn ppo_on_a_vla_follows_the_sign_of_the_advantage() {
    for sign in [1.0f32, -1.0] {
        let mut policy = tiny_vla(K);
        let example = rollout(&policy, sign);
        let before = decision_logprob(&policy, &example);
        let report = train(
            &mut policy,
            None,
            std::slice::from_ref(&example),
            &ppo_config(4),
            0,
            OptimizerState::fresh("ppo"),
        )
        .unwrap();
        let first = &report.metrics[0];
        assert!(
            first.approx_kl.is_some_and(|kl| kl.abs() < 1e-5),
            "{first:?}"
        );
        assert!(report.metrics.iter().all(|m| m.loss.is_finite()
            && m.entropy > 0.0
            && m.clipfrac.is_some_and(f32::is_finite)));
        assert_eq!((report.sequences, report.tokens), (4, 4 * 16));
        let after = decision_logprob(&policy, &example);
        assert!(
            (after - before) * f64::from(sign) > 0.0,
            "advantage {sign}: log-prob {before} -> {after}"
        );
    }
}

/// The KL penalty to a VLA reference that starts equal to the policy: 0 at
/// the first step, positive once the policy has moved, and in the loss.
#[test]
fn the_kl_penalty_to_a_vla_reference_grows_as_the_policy_moves() {
    let mut policy = tiny_vla(K);
    let reference = tiny_vla(K);
    let example = rollout(&policy, 1.0);
    crate::train::tests::assert_kl_penalty_grows(&mut policy, &reference, example);
}

/// An observation missing or of another shape, a token outside the bins or
/// a decision of the wrong length: bad input naming the row, before any
/// step.
#[test]
fn bad_vla_rows_are_named() {
    let mut policy = tiny_vla(K);
    let good = rollout(&policy, 1.0);
    let cases: [(Example, &str); 5] = [
        (
            Example {
                observation: Some(first_observation(16).into()),
                ..good.clone()
            },
            "trajectory `t0` step 2: observation is 16x16x3 image + 5 proprio, expected 32x32x3 image + 5 proprio",
        ),
        (
            Example {
                observation: None,
                ..good.clone()
            },
            "trajectory `t0` step 2: no observation",
        ),
        (
            Example {
                observation: Some(vec![1, 2, 3].into()),
                ..good.clone()
            },
            "trajectory `t0` step 2: observation truncated",
        ),
        (
            Example {
                response: [vec![256], good.response[1..].to_vec()].concat(),
                ..good.clone()
            },
            "trajectory `t0` step 2: action token 256 at position 0 is outside 0..256",
        ),
        (
            Example {
                response: good.response[..12].to_vec(),
                old_logprobs: good.old_logprobs[..12].to_vec(),
                advantages: good.advantages[..12].to_vec(),
                ..good.clone()
            },
            "trajectory `t0` step 2: 12 action tokens; a decision has chunk_len x action_dim = 16",
        ),
    ];
    for (bad, expected) in cases {
        let examples = [good.clone(), bad];
        let error = train(
            &mut policy,
            None,
            &examples,
            &ppo_config(1),
            0,
            OptimizerState::fresh("ppo"),
        )
        .err()
        .unwrap();
        assert_eq!(
            embodyflow_core::Classify::kind(&error),
            embodyflow_core::ErrorKind::BadInput
        );
        let text = error.to_string();
        assert!(text.contains(expected), "{text}\nexpected: {expected}");
    }
    assert!(ClosedLoop::check_examples(&policy, &[good]).is_ok());
}

/// Behaviour cloning on two demonstrations lowers the loss, and the VLA
/// with its AdamW state goes through a checkpoint on disk: it reloads as a
/// VLA and the state resumes at the steps taken.
#[test]
fn behaviour_cloning_learns_and_its_state_resumes() {
    let mut policy = tiny_vla(K);
    let rows: Vec<TaskRow> = [
        generate(Suite::Goal, Split::Train, 3, 0),
        generate(Suite::Object, Split::Train, 3, 1),
    ]
    .iter()
    .map(task_row)
    .collect();
    let examples = sft_examples(&policy, &rows, &sft_config(), 0)
        .unwrap()
        .examples;
    let config = Config {
        objective: Objective::Sft,
        epochs: 6,
        mini_batch: 16,
        micro_batch: 8,
        optim: OptimConfig {
            lr: 3e-3,
            ..Default::default()
        },
        ..Default::default()
    };
    let report = train(
        &mut policy,
        None,
        &examples,
        &config,
        0,
        OptimizerState::fresh("sft"),
    )
    .unwrap();
    let losses: Vec<f32> = report.metrics.iter().map(|m| m.loss).collect();
    let steps = losses.len();
    assert_eq!(steps, 6 * examples.len().div_ceil(16));
    assert!(
        losses[steps - 1] < 0.8 * losses[0],
        "the loss falls: {losses:?}"
    );
    assert!(report.metrics[0].clipfrac.is_none());
    let dir = tempfile::tempdir().unwrap();
    policy
        .save(&dir.path().join("policy"), "update-policy", false)
        .unwrap();
    let path = dir.path().join("policy");
    assert_eq!(
        embodyflow_models::registry::policy_kind(&path).unwrap(),
        embodyflow_models::checkpoint::PolicyKind::Vla
    );
    let reloaded = Checkpoint::<Vla>::load_kind(&path, tch::Device::Cpu).unwrap();
    let state = OptimizerState::load(&path, &reloaded.vars)
        .unwrap()
        .unwrap();
    assert_eq!(
        (state.meta.steps, state.meta.objective.as_str()),
        (steps as u64, "sft")
    );
    let example = &examples[0];
    let (a, b) = (
        decision_logprob(&policy, example),
        decision_logprob(&reloaded, example),
    );
    assert!((a - b).abs() < 1e-4, "{a} vs {b}");
}

/// The learning check, a measurement (run by hand, minutes at the default
/// size): behaviour cloning of the default `VlaConfig::small` on the first
/// `BC_TASKS` train tasks of suite `BC_SUITE` (default goal, 8 tasks) for
/// `BC_EPOCHS` epochs (default 60), then the greedy VLA in closed loop on
/// those tasks; prints the training throughput and the success rate every
/// `BC_EVERY` epochs, and fails if no episode succeeds at the end.
/// `cargo test --release --workspace -- --ignored --nocapture behaviour_cloning_solves`
#[test]
#[ignore = "a measurement: minutes of CPU"]
fn behaviour_cloning_solves_training_tasks() {
    use embodyflow_models::testing::{SEED, seed, tiny_tokenizer};
    use embodyflow_rollout::closed_loop::{ClosedLoopConfig, run_closed_loop};
    use embodyflow_tabletop::TabletopEpisodes;
    let var = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (n_tasks, epochs, every) = (
        var("BC_TASKS", 8),
        var("BC_EPOCHS", 60),
        var("BC_EVERY", 20),
    );
    let suite = match std::env::var("BC_SUITE").as_deref() {
        Ok("spatial") => Suite::Spatial,
        Ok("object") => Suite::Object,
        Ok("long") => Suite::Long,
        _ => Suite::Goal,
    };
    let tokenizer = tiny_tokenizer();
    let config = VlaConfig {
        max_instruction: 160,
        ..VlaConfig::small(tokenizer.get_vocab_size(true) as i64)
    };
    let mut policy = {
        let _generator = seed(SEED);
        Checkpoint::<Vla>::init_kind(&config, tokenizer, tch::Device::Cpu).unwrap()
    };
    let tasks: Vec<_> = (0..n_tasks as u64)
        .map(|i| generate(suite, Split::Train, 0, i))
        .collect();
    let rows: Vec<TaskRow> = tasks.iter().map(task_row).collect();
    let set = sft_examples(&policy, &rows, &sft_config(), 0).unwrap();
    println!("{:?}, {} decisions", set.notes, set.examples.len());
    let train_config = Config {
        objective: Objective::Sft,
        epochs: every,
        mini_batch: 64,
        micro_batch: 64,
        optim: OptimConfig {
            lr: 1e-3,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut state = OptimizerState::fresh("sft");
    let mut success = 0;
    for round in 0..epochs.div_ceil(every) {
        let report = train(
            &mut policy,
            None,
            &set.examples,
            &train_config,
            round as u64,
            state,
        )
        .unwrap();
        state = policy.optimizer.take().unwrap();
        let mut sampler = VlaPolicy::new(&policy, 0.0).unwrap();
        let bins = sampler.bins();
        let mut world = TabletopEpisodes::new(&tasks, 1, 32).unwrap();
        let max_steps = tasks.iter().map(|t| t.max_steps as usize).max().unwrap();
        let loop_config = ClosedLoopConfig {
            max_decisions: max_steps.div_ceil(8),
            label: "greedy",
        };
        let seeds = vec![0; tasks.len()];
        let run = run_closed_loop(&mut world, &mut sampler, &bins, &seeds, &loop_config).unwrap();
        success = run.episodes.iter().filter(|e| e.success).count();
        println!(
            "epoch {}: loss {:.3}, {:.1} decisions/s, greedy success {success}/{} on the train tasks",
            (round + 1) * every,
            report.metrics.last().unwrap().loss,
            report.sequences as f64 / report.seconds,
            tasks.len()
        );
    }
    assert!(success > 0, "no training task solved");
}

/// `observations = "mmap"` and `"memory"` train the very same checkpoint
/// (same initial weights, seed and examples), by SFT on demonstrations and
/// by PPO on rollout decisions: the store serves every example the bytes
/// it held, in any order the epochs shuffle them into.
#[test]
fn mmap_and_memory_observations_train_the_same_checkpoint() {
    use crate::{ObservationBytes, store_observations};
    let init = tiny_vla(K);
    let rows: Vec<TaskRow> = [
        generate(Suite::Goal, Split::Train, 3, 0),
        generate(Suite::Long, Split::Train, 3, 1),
    ]
    .iter()
    .map(task_row)
    .collect();
    let sft = sft_examples(&init, &rows, &sft_config(), 0)
        .unwrap()
        .examples;
    let ppo = vec![
        rollout(&init, 1.0),
        rollout(&init, -0.5),
        rollout(&init, 2.0),
    ];
    let sft_config = Config {
        objective: Objective::Sft,
        epochs: 3,
        mini_batch: 8,
        micro_batch: 4,
        ..ppo_config(3)
    };
    for (examples, config) in [(sft, sft_config), (ppo, ppo_config(3))] {
        let stored = store_observations(examples.clone()).unwrap();
        assert!(
            stored
                .iter()
                .all(|e| matches!(e.observation, Some(ObservationBytes::Stored { .. })))
        );
        assert_eq!(stored, examples, "the same bytes, example by example");
        let trained = |examples: &[Example]| {
            let mut policy = tiny_vla(K);
            let fresh = OptimizerState::fresh(config.objective.name());
            let report = train(&mut policy, None, examples, &config, 5, fresh).unwrap();
            (policy, report.metrics)
        };
        let (memory, memory_metrics) = trained(&examples);
        let (mmap, mmap_metrics) = trained(&stored);
        assert_eq!(memory_metrics, mmap_metrics, "{:?}", config.objective);
        let (a, b) = (memory.vars.variables(), mmap.vars.variables());
        assert_eq!(a.len(), b.len());
        for (name, value) in &a {
            assert!(
                value.equal(&b[name]),
                "{:?}: {name} differs",
                config.objective
            );
        }
        // Training moved the weights: the comparison can fail.
        let start = init.vars.variables();
        assert!(a.iter().any(|(name, value)| !value.equal(&start[name])));
    }
}

/// With the trunk's blocks checkpointed, a PPO micro-batch with a KL
/// reference gives every parameter the plain backward's gradient (the
/// blocks recomputed one at a time from the top); the small trunk has no
/// dropout.
#[test]
fn checkpointed_trunk_blocks_give_the_plain_gradients() {
    use embodyflow_models::checkpointing;
    let policy = tiny_vla(K);
    let reference = tiny_vla(K);
    let examples = vec![rollout(&policy, 1.0), rollout(&policy, -0.5)];
    let config = Config {
        ppo: crate::loss::PpoConfig {
            kl_coef: 0.3,
            ..Default::default()
        },
        kl_reference: Some("unused: the reference is passed in".into()),
        ..ppo_config(1)
    };
    tch::no_grad(|| {
        for (_, mut var) in reference.vars.variables() {
            let moved = &var + var.randn_like() * 0.01;
            var.copy_(&moved);
        }
    });
    let denominators = crate::loss::Denominators {
        tokens: 32.0,
        sequences: 2.0,
    };
    let grads = |on: bool| {
        for mut var in policy.vars.trainable_variables() {
            var.zero_grad();
        }
        let _switch = checkpointing::enable(on);
        let sums = crate::train::accumulate(
            &policy,
            Some(&reference),
            &examples,
            &[vec![0, 1]],
            denominators,
            &config,
        )
        .unwrap();
        assert!(sums.kl_loss > 0.0, "{sums:?}");
        let _scores = ClosedLoop::score(&policy, &[&examples[0]], 1.0, Entropy::Skip).unwrap();
        assert_eq!(
            checkpointing::pending() > 0,
            on,
            "the trunk's blocks recorded"
        );
        let mut grads: Vec<(String, tch::Tensor)> = policy
            .vars
            .variables()
            .into_iter()
            .map(|(name, var)| (name, var.grad().copy()))
            .collect();
        grads.sort_by(|a, b| a.0.cmp(&b.0));
        (sums, grads)
    };
    let ((plain_sums, plain), (checkpointed_sums, checkpointed)) = (grads(false), grads(true));
    assert!((plain_sums.loss - checkpointed_sums.loss).abs() < 1e-6);
    let mut diff = 0f64;
    for ((name, a), (_, b)) in plain.iter().zip(&checkpointed) {
        assert!(a.defined() && b.defined(), "{name}");
        diff = diff.max((a - b).abs().max().double_value(&[]));
    }
    assert!(diff <= 1e-5, "max gradient difference {diff}");
    assert!(plain.iter().any(|(name, g)| name.starts_with("h.")
        && g.abs().sum(tch::Kind::Double).double_value(&[]) > 0.0));
}

/// A tiny random Qwen2.5-VL saved once for the tests of this binary
/// (transformers takes seconds to start).
fn tiny_qwen_vl() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<tempfile::TempDir> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        embodyflow_models::testing::tiny_vlm(dir.path(), "qwen2_5_vl");
        dir
    })
    .path()
}

/// A VLA of the tabletop's shape (chunks of `K`) on the tiny Qwen2.5-VL
/// ([`tiny_qwen_vl`]), its action bins the vocabulary's last ids, its
/// vision encoder trained, `latent` its chain of thought; heads drawn
/// from a fixed seed.
pub(crate) fn qwen_vla(latent: Option<LatentConfig>) -> Checkpoint<Vla> {
    use embodyflow_models::vla::trunk::{ActionTokens, init_on_vlm};
    let shape = VlaConfig {
        chunk_len: K,
        max_instruction: 160,
        latent,
        ..VlaConfig::small(0)
    };
    let _generator = embodyflow_models::testing::seed(embodyflow_models::testing::SEED);
    init_on_vlm(
        tiny_qwen_vl(),
        &shape,
        ActionTokens::Vocab,
        false,
        tch::Device::Cpu,
    )
    .unwrap()
}

/// `train.precision = "bf16"` on `make()`'s VLA at rate `lr`: GRPO on
/// four rollout decisions against an fp32 KL reference, then behaviour
/// cloning, each three steps from the same start, track the fp32 run
/// ([`assert_bf16_tracks_fp32`]: the first bf16 step at ratio 1 on the
/// log-probs a bf16 copy recorded, the fp32 run on the rollouts' own;
/// losses and weights within 2e-2, the weights saved as F32), the KL
/// penalty too; the reference stays fp32.
fn bf16_trains_like_fp32(make: impl Fn() -> Checkpoint<Vla>, lr: f64) {
    let reference = make();
    let rollouts: Vec<Example> = [(1.0, 11), (-1.0, 12), (0.5, 13), (-0.5, 14)]
        .into_iter()
        .map(|(advantage, seed)| sampled_rollout(&reference, advantage, seed))
        .collect();
    let mut examples = rollouts.clone();
    recorded_in_bf16(&make, &mut examples);
    let grpo = Config {
        epochs: 3,
        mini_batch: 4,
        micro_batch: 1,
        optim: OptimConfig {
            lr,
            ..Default::default()
        },
        ppo: crate::loss::PpoConfig {
            kl_coef: 0.1,
            ..Default::default()
        },
        ..Default::default()
    };
    let (bf16, fp32) =
        assert_bf16_tracks_fp32(&make, Some(&reference), &examples, &rollouts, &grpo);
    for (a, b) in bf16.metrics.iter().zip(&fp32.metrics) {
        let (a, b) = (a.kl_loss.unwrap(), b.kl_loss.unwrap());
        assert!(a.is_finite() && (a - b).abs() < 2e-2, "kl {a} vs {b}");
    }
    for (name, var) in reference.vars.variables() {
        assert_eq!(var.kind(), tch::Kind::Float, "{name}");
    }
    let sft = Config {
        objective: Objective::Sft,
        ..grpo
    };
    assert_bf16_tracks_fp32(&make, None, &rollouts, &rollouts, &sft);
}

/// bf16 trains a VLA of the small trunk (its patches and proprio cast to
/// bf16 where they enter, its action head's logits upcast).
#[test]
fn bf16_trains_a_vla_as_fp32_does() {
    bf16_trains_like_fp32(|| tiny_vla(K), 1e-3);
}

/// bf16 trains a VLA on a vision-language trunk (vision encoder, language
/// model, action bins read from the vocabulary); at a tenth of the small
/// trunk's rate, which moves this trunk's policy far in three steps.
#[test]
fn bf16_trains_a_vla_on_a_vision_language_trunk_as_fp32_does() {
    bf16_trains_like_fp32(|| qwen_vla(None), 1e-4);
}
