//! The bridge with real Python workers: BabyAI episodes through the
//! closed-loop driver, the scripted experts' demonstrations (BabyAI,
//! Meta-World reach) and their replay, each worker fault (crash, hang,
//! malformed frame, a reply sent twice) ending exactly the affected
//! episodes with their reason while the others finish, resets kept alive
//! by progress frames, workers that die starting or resetting restarted a
//! bounded number of times and then failing only their own episodes, an
//! environment that raises in its reset failing only its episode, the
//! timeout honoured by resets and expert episodes, workers' process groups
//! killed and their environments closed, and bad input named before
//! anything runs. Needs the packages of `scripts/setup` in `.venv`.

use std::time::Duration;

use embodyflow_algos::action_tokens::ActionBins;
use embodyflow_core::observation::{self, ObservationShape};
use embodyflow_core::{Classify, Error, ErrorKind};
use embodyflow_gym::{
    ActionSpace, BridgeConfig, BridgeError, GymEpisodes, GymTask, GymTaskSpec, SuccessRule,
    expert_demonstrations, probe,
};
use embodyflow_rollout::closed_loop::{
    ChunkDecision, ChunkPolicy, ClosedLoopConfig, ClosedLoopRun, DecisionBatch, run_closed_loop,
};
use embodyflow_world::ClosedLoopWorld;
use serde_json::json;

const BABYAI: &str = "BabyAI-GoToLocal-v0";

fn config(workers: usize) -> BridgeConfig {
    BridgeConfig {
        workers,
        timeout: Duration::from_secs(20),
        ..BridgeConfig::default()
    }
}

/// A spec of `adapter`'s `env_id` for probing (seed 0, 1 step).
fn spec(adapter: &str, env_id: &str) -> GymTaskSpec {
    GymTaskSpec::new(adapter, env_id, 0, 1)
}

fn task(task_id: &str, spec: GymTaskSpec) -> GymTask {
    GymTask {
        task_id: task_id.into(),
        spec,
    }
}

/// A policy that plays given tokens: a function of (episode, decision,
/// row seed) -> the chunk's tokens.
struct Scripted<F> {
    k: usize,
    d: usize,
    shape: ObservationShape,
    tokens: F,
}

impl<F: FnMut(usize, usize, u64) -> Vec<u32>> ChunkPolicy for Scripted<F> {
    type Error = Error;

    fn chunk_len(&self) -> usize {
        self.k
    }

    fn action_dim(&self) -> usize {
        self.d
    }

    fn observation_shape(&self) -> ObservationShape {
        self.shape
    }

    fn instruction_ids(&self, instruction: &str) -> Result<Vec<i32>, Error> {
        Ok(instruction.bytes().map(i32::from).collect())
    }

    fn decide(&mut self, batch: &DecisionBatch<'_>) -> Result<Vec<ChunkDecision>, Error> {
        Ok(batch
            .episodes
            .iter()
            .zip(batch.seeds)
            .map(|(&e, &seed)| {
                let tokens = (self.tokens)(e, batch.decision, seed);
                ChunkDecision {
                    token_logprobs: vec![-1.0; tokens.len()],
                    tokens,
                    thought: None,
                }
            })
            .collect())
    }
}

fn run<F: FnMut(usize, usize, u64) -> Vec<u32>>(
    world: &mut GymEpisodes,
    k: usize,
    max_decisions: usize,
    tokens: F,
) -> ClosedLoopRun {
    let mut policy = Scripted {
        k,
        d: world.action_dim(),
        shape: world.observation_shape(),
        tokens,
    };
    let seeds: Vec<u64> = (0..world.len() as u64).collect();
    let bins = world.info().action.bins();
    let config = ClosedLoopConfig {
        max_decisions,
        label: "test",
    };
    run_closed_loop(world, &mut policy, &bins, &seeds, &config).unwrap()
}

#[test]
fn babyai_random_episodes_run_in_lockstep_on_two_workers() {
    let max_steps = 24;
    let tasks = vec![
        task("goto/3", GymTaskSpec::new("babyai", BABYAI, 3, max_steps)),
        task("goto/4", GymTaskSpec::new("babyai", BABYAI, 4, max_steps)),
    ];
    let bins = ActionSpace::Discrete { n: 7 }.bins();
    let mut world = GymEpisodes::new(&config(2), &tasks, 3, &bins).unwrap();
    assert_eq!(
        world.observation_shape(),
        ObservationShape {
            height: 7,
            width: 7,
            channels: 3,
            proprio: 4
        }
    );
    let k = 4;
    // Random bins 0..8 (bin 7 is action 6, as bin 6), from the row seed.
    let out = run(&mut world, k, 6, |_, _, seed| {
        let hash = blake3::hash(&seed.to_le_bytes());
        hash.as_bytes()[..k]
            .iter()
            .map(|b| u32::from(b % 8))
            .collect()
    });
    assert_eq!(world.faults().total(), 0);
    for (i, episode) in out.episodes.iter().enumerate() {
        assert!(
            episode.failure.is_none(),
            "episode {i}: {:?}",
            episode.failure
        );
        // 24 steps in chunks of 4 end within 6 decisions: never cut.
        assert!(!episode.truncated, "episode {i}");
        let steps: u32 = episode.decisions.iter().map(|d| d.env_steps).sum();
        assert_eq!(steps, episode.env_steps);
        assert!(episode.env_steps <= max_steps);
        assert!(
            episode.success || episode.env_steps == max_steps,
            "episode {i}"
        );
        assert!(
            world.instruction(i).starts_with("go to the "),
            "{}",
            world.instruction(i)
        );
        let first = observation::decode(&episode.decisions[0].observation).unwrap();
        assert_eq!(first.proprio.iter().sum::<f32>(), 1.0, "direction one-hot");
    }
    // The G = 3 copies of a task share the initial observation and anchor;
    // the two tasks (seeds 3 and 4) do not.
    let first = |i: usize| &out.episodes[i].decisions[0];
    for g in 1..3 {
        assert_eq!(first(g).observation, first(0).observation);
        assert_eq!(first(g).anchor_key, first(0).anchor_key);
        assert_eq!(first(3 + g).anchor_key, first(3).anchor_key);
    }
    assert_ne!(first(0).anchor_key, first(3).anchor_key);
    assert_eq!(first(0).anchor_key.as_ref().unwrap().len(), 32);
    // Different random chunks take the copies to different states.
    let last_keys: std::collections::BTreeSet<_> = out
        .episodes
        .iter()
        .filter_map(|e| e.decisions.get(1).and_then(|d| d.anchor_key.clone()))
        .collect();
    assert!(last_keys.len() > 2, "{last_keys:?}");
}

#[test]
fn babyai_expert_demonstrations_succeed_and_replay_through_the_driver() {
    let k = 3;
    let tasks: Vec<GymTask> = (10..13)
        .map(|seed| {
            task(
                &format!("goto/{seed}"),
                GymTaskSpec::new("babyai", BABYAI, seed, 64),
            )
        })
        .collect();
    let demos = expert_demonstrations(&config(2), &tasks, k).unwrap();
    assert_eq!(demos.len(), 3);
    for (demo, t) in demos.iter().zip(&tasks) {
        assert_eq!(demo.task_id, t.task_id);
        assert!(demo.success && demo.failure.is_none(), "{}", demo.task_id);
        let (last, full) = demo.decisions.split_last().unwrap();
        assert!(
            full.iter()
                .all(|d| d.env_steps == k as u32 && d.actions.len() == k)
        );
        assert!((1..=k as u32).contains(&last.env_steps));
    }
    // Playing the demonstrations' actions as tokens (Discrete(7): the bin
    // is the action) through GymEpisodes repeats them exactly: the same
    // observations at every decision, and success.
    let bins = ActionSpace::Discrete { n: 7 }.bins();
    let mut world = GymEpisodes::new(&config(1), &tasks, 1, &bins).unwrap();
    let out = run(&mut world, k, 64, |e, d, _| {
        let mut tokens: Vec<u32> = demos[e].decisions[d]
            .actions
            .iter()
            .map(|&a| a as u32)
            .collect();
        tokens.resize(k, 0); // the last chunk: the episode ends before these
        tokens
    });
    for (episode, demo) in out.episodes.iter().zip(&demos) {
        assert!(episode.success, "{}", demo.task_id);
        assert_eq!(episode.decisions.len(), demo.decisions.len());
        for (played, shown) in episode.decisions.iter().zip(&demo.decisions) {
            assert_eq!(played.observation, shown.observation);
            assert_eq!(played.env_steps, shown.env_steps);
        }
    }
}

#[test]
fn metaworld_reach_expert_reaches_success() {
    let tasks = vec![task(
        "reach/1",
        GymTaskSpec::new("metaworld", "reach-v3", 1, 200),
    )];
    let demos = expert_demonstrations(&config(1), &tasks, 8).unwrap();
    let demo = &demos[0];
    assert!(demo.success, "{demo:?}");
    assert_eq!(demo.instruction, "reach the goal");
    let steps: u32 = demo.decisions.iter().map(|d| d.env_steps).sum();
    assert!(steps < 200, "{steps} steps");
    let first = observation::decode(&demo.decisions[0].observation).unwrap();
    assert_eq!(
        first.shape,
        ObservationShape {
            height: 0,
            width: 0,
            channels: 3,
            proprio: 39
        }
    );
    assert!(
        demo.decisions[0]
            .actions
            .iter()
            .all(|a| (-1.0..=1.0).contains(a))
    );
    assert_eq!(demo.decisions[0].actions.len(), 8 * 4);
    // The copies of a Meta-World task share the initial state too.
    let bins = ActionBins::openvla();
    let world = GymEpisodes::new(&config(1), &tasks, 2, &bins).unwrap();
    assert_eq!(world.anchor_key(0), world.anchor_key(1));
    assert_eq!(world.proprio()[..39], world.proprio()[39..]);
    assert_eq!(world.proprio()[..39], first.proprio[..]);
}

/// Tasks of the faulty counter: task 0 faults at its episodes' step
/// `at_step`, task 1 does not; 2 copies each, on 2 workers (worker 0 hosts
/// task 0's copies, worker 1 task 1's). The policy always moves +1 (bin
/// 1), K = 1: an unfaulty episode succeeds at step 3.
fn faulty_run(fault: &str, at_step: u32, timeout: Duration) -> (GymEpisodes, ClosedLoopRun) {
    let mut faulty = GymTaskSpec::new("faulty", "Counter-v0", 0, 10);
    faulty.kwargs = json!({"fault": fault, "at_step": at_step});
    let tasks = vec![
        task("faulty", faulty),
        task("fine", GymTaskSpec::new("faulty", "Counter-v0", 0, 10)),
    ];
    let config = BridgeConfig {
        timeout,
        ..config(2)
    };
    let bins = ActionSpace::Discrete { n: 3 }.bins();
    let mut world = GymEpisodes::new(&config, &tasks, 2, &bins).unwrap();
    let out = run(&mut world, 1, 10, |_, _, _| vec![1]);
    (world, out)
}

/// Checks [`faulty_run`]: worker 0's episodes end at decision 1 with the
/// fault `what`, after one env step; worker 1's succeed; the restarted
/// worker serves the next batch.
fn check_fault(fault: &str, at_step: u32, timeout: Duration, what: &str) {
    let (world, out) = faulty_run(fault, at_step, timeout);
    for (i, episode) in out.episodes.iter().enumerate().take(2) {
        let reason = episode
            .failure
            .as_deref()
            .unwrap_or_else(|| panic!("episode {i} has no failure"));
        assert!(
            reason.starts_with("worker 0 (pid ")
                && reason.contains(what)
                && reason.contains("at decision 1"),
            "episode {i}: {reason}"
        );
        assert!(!episode.success);
        assert_eq!(episode.decisions.len(), 2);
        assert_eq!(episode.env_steps, 1);
    }
    for episode in &out.episodes[2..] {
        assert!(episode.success && episode.failure.is_none(), "{episode:?}");
        assert_eq!(episode.env_steps, 3);
    }
    let faults = world.faults();
    assert_eq!(faults.total(), 1, "{faults}");
    assert_eq!(faults.restarts, 1, "{faults}");
    // The restarted worker serves the next batch.
    let world = next_batch_succeeds(world);
    assert_eq!(world.faults(), faults);
}

/// Runs a next batch on the pool of `world`: 4 episodes of a counter task
/// without faults, chunks of 2, must all succeed at step 3; its world.
fn next_batch_succeeds(world: GymEpisodes) -> GymEpisodes {
    let pool = world.into_pool();
    let tasks = vec![task(
        "again",
        GymTaskSpec::new("faulty", "Counter-v0", 0, 10),
    )];
    let bins = ActionSpace::Discrete { n: 3 }.bins();
    let mut world = GymEpisodes::with_pool(pool, &tasks, 4, &bins).unwrap();
    let out = run(&mut world, 2, 10, |_, _, _| vec![1, 1]);
    assert!(
        out.episodes.iter().all(|e| e.success && e.env_steps == 3),
        "{out:?}"
    );
    world
}

#[test]
fn a_crashed_worker_ends_its_episodes_with_the_reason_and_is_restarted() {
    check_fault(
        "crash",
        2,
        Duration::from_secs(20),
        "crashed (exit status: 3)",
    );
}

#[test]
fn a_hung_worker_is_killed_after_the_timeout() {
    let started = std::time::Instant::now();
    check_fault(
        "hang",
        2,
        Duration::from_millis(1500),
        "hung (no reply within 1.5 s)",
    );
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[test]
fn a_malformed_frame_ends_the_workers_episodes() {
    check_fault(
        "malformed",
        2,
        Duration::from_secs(20),
        "sent a malformed frame (header is not a JSON object",
    );
}

#[test]
fn a_reply_sent_twice_is_malformed_by_its_request_id() {
    // The reply to decision 0 (request 3 of worker 0, after two hellos and
    // a reset) comes twice: the copy is not the answer to decision 1
    // (which would shift every later reply by one).
    check_fault(
        "duplicate",
        1,
        Duration::from_secs(20),
        "sent a malformed frame (a frame for request 3, awaiting request 4)",
    );
}

#[test]
fn two_hung_workers_both_name_the_whole_timeout() {
    let tasks = vec![task("a", faulty("hang")), task("b", faulty("hang"))];
    let config = BridgeConfig {
        timeout: Duration::from_secs(1),
        ..config(2)
    };
    let bins = ActionSpace::Discrete { n: 3 }.bins();
    let mut world = GymEpisodes::new(&config, &tasks, 1, &bins).unwrap();
    let out = run(&mut world, 1, 10, |_, _, _| vec![1]);
    for episode in &out.episodes {
        let reason = episode.failure.as_deref().unwrap_or_default();
        assert!(
            reason.contains("hung (no reply within 1.0 s) at decision 1"),
            "{reason}"
        );
    }
    assert_eq!(world.faults().hung, 2);
}

#[test]
fn bad_input_is_named_before_anything_runs() {
    let config = config(1);
    let error = probe(&config, &spec("nope", "X-v0")).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::BadInput);
    let text = error.to_string();
    assert!(
        text.contains("unknown adapter `nope`; available: babyai, generic, ")
            && text.contains(
                "metaworld (an adapter registers in the entry-point group `embodyflow_gym.adapters`"
            )
            && !text.contains("faulty"),
        "{text}"
    );
    let error = probe(&config, &spec("babyai", "BabyAI-Nope-v0")).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::BadInput);
    assert!(
        error
            .to_string()
            .contains("environment `BabyAI-Nope-v0` does not exist"),
        "{error}"
    );
    // An id no imported package registered: the module:EnvId form named.
    let error = probe(&config, &spec("generic", "MyRoom-v0")).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::BadInput);
    assert!(
        error
            .to_string()
            .contains("environment `MyRoom-v0` does not exist")
            && error
                .to_string()
                .contains("named `module:EnvId` (e.g. `mypackage.envs:MyRoom-v0`"),
        "{error}"
    );
    let error = probe(&config, &spec("metaworld", "fly-v3")).unwrap_err();
    assert!(
        error
            .to_string()
            .contains("`fly-v3` is not a Meta-World v3 task"),
        "{error}"
    );
    let info = probe(&config, &spec("babyai", BABYAI)).unwrap();
    assert_eq!(info.action, ActionSpace::Discrete { n: 7 });
    assert!(info.expert && info.instruction);
    // The policy's bins must give each of the 7 actions its own bin.
    let tasks = vec![task("goto", GymTaskSpec::new("babyai", BABYAI, 0, 8))];
    let Err(error) = GymEpisodes::new(&config, &tasks, 1, &ActionBins::openvla()) else {
        panic!("256 bins for Discrete(7) accepted");
    };
    assert_eq!(error.kind(), ErrorKind::BadInput);
    assert!(error.to_string().contains("n_bins = 8"), "{error}");
    // A Python that does not exist, and one without the packages.
    let missing = BridgeConfig {
        python: "/nonexistent/python".into(),
        ..config.clone()
    };
    let error = probe(&missing, &spec("babyai", BABYAI)).unwrap_err();
    assert!(matches!(error, BridgeError::Python { .. }));
    assert!(error.to_string().contains("run scripts/setup"), "{error}");
    let bare = BridgeConfig {
        python: "/usr/bin/python3".into(),
        ..config
    };
    if bare.python.exists() {
        let error = probe(&bare, &spec("babyai", BABYAI)).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::BadInput);
        let text = error.to_string();
        assert!(
            text.contains("needs the Python package")
                && text.contains("run scripts/setup (or pip install"),
            "{text}"
        );
    }
}

#[test]
fn the_generic_adapter_runs_a_vector_env_with_the_specs_instruction() {
    let mut spec = GymTaskSpec::new("generic", "CartPole-v1", 5, 30);
    spec.instruction = Some("balance the pole".into());
    // CartPole's termination is the pole falling: it survives or fails.
    spec.success = Some(SuccessRule::Survive);
    let tasks = vec![task("cartpole/5", spec)];
    let info = probe(&config(1), &tasks[0].spec).unwrap();
    assert_eq!(info.success, Some(SuccessRule::Survive));
    assert_eq!(info.action, ActionSpace::Discrete { n: 2 });
    assert!(!info.expert);
    let mut world = GymEpisodes::new(&config(1), &tasks, 2, &info.action.bins()).unwrap();
    assert_eq!(
        world.observation_shape(),
        ObservationShape {
            height: 0,
            width: 0,
            channels: 3,
            proprio: 4
        }
    );
    assert_eq!(world.instruction(0), "balance the pole");
    // Always push right: the pole falls within 30 steps (a failure, not an error).
    let out = run(&mut world, 5, 6, |_, _, _| vec![1; 5]);
    for episode in &out.episodes {
        assert!(!episode.success && episode.failure.is_none() && !episode.truncated);
        assert!(episode.env_steps < 30, "{}", episode.env_steps);
    }
    assert_eq!(out.episodes[0].env_steps, out.episodes[1].env_steps);
    let Err(error) = expert_demonstrations(&config(1), &tasks, 4) else {
        panic!("a generic env has no expert");
    };
    assert!(
        error.to_string().contains("has no scripted expert"),
        "{error}"
    );
}

/// CartPole episodes of seeds 0..8 under `rule`, always pushing right (the
/// pole falls within about 10 steps, as an untrained policy lets it).
fn cartpole(rule: SuccessRule, max_steps: u32) -> ClosedLoopRun {
    let tasks: Vec<GymTask> = (0..8)
        .map(|seed| {
            let mut spec = GymTaskSpec::new("generic", "CartPole-v1", seed, max_steps);
            spec.success = Some(rule.clone());
            task(&format!("cartpole/{seed}"), spec)
        })
        .collect();
    let info = probe(&config(1), &tasks[0].spec).unwrap();
    assert_eq!(info.success, Some(rule));
    let mut world = GymEpisodes::new(&config(1), &tasks, 1, &info.action.bins()).unwrap();
    run(&mut world, 1, max_steps as usize, |_, _, _| vec![1])
}

#[test]
fn success_is_the_tasks_explicit_rule_and_a_fall_is_no_success() {
    // No success signal in CartPole's info and no rule: refused, naming the rules.
    let error = probe(&config(1), &spec("generic", "CartPole-v1")).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::BadInput);
    let text = error.to_string();
    assert!(
        text.contains("gives no success signal")
            && ["info", "terminal_reward", "survive", "return_at_least:X"]
                .iter()
                .all(|rule| text.contains(rule)),
        "{text}"
    );
    // Under `survive` every fall is a failure (the old default counted
    // each fall, terminated with reward 1, as a success).
    let fell = cartpole(SuccessRule::Survive, 200);
    for episode in &fell.episodes {
        assert!(episode.env_steps < 20 && !episode.success, "{episode:?}");
    }
    // `terminal_reward` means what it says, when a user asks for it.
    let rewarded = cartpole(SuccessRule::TerminalReward, 200);
    assert!(rewarded.episodes.iter().all(|e| e.success));
    // Reaching max_steps without a fall is surviving.
    let survived = cartpole(SuccessRule::Survive, 5);
    for episode in &survived.episodes {
        assert!(episode.env_steps == 5 && episode.success, "{episode:?}");
    }
    // A return of at least 9 (one reward per step): the episodes that
    // lasted 9 steps.
    let returns = cartpole(SuccessRule::ReturnAtLeast(9.0), 200);
    assert!(returns.episodes.iter().any(|e| e.success));
    assert!(returns.episodes.iter().any(|e| !e.success));
    for (episode, fall) in returns.episodes.iter().zip(&fell.episodes) {
        assert_eq!(episode.env_steps, fall.env_steps);
        assert_eq!(episode.success, episode.env_steps >= 9, "{episode:?}");
    }
    // An adapter that decides success itself takes no rule.
    let mut ruled = spec("babyai", BABYAI);
    ruled.success = Some(SuccessRule::Info);
    let error = probe(&config(1), &ruled).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::BadInput);
    assert!(
        error.to_string().contains("decides success itself"),
        "{error}"
    );
}

/// Lines of a file some fixture appends to (0 when it does not exist).
fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

#[test]
fn workers_build_an_environment_once_per_env_and_reuse_it() {
    let dir = tempfile::tempdir().unwrap();
    let built = dir.path().join("built");
    let counter = |seed: u64| {
        let mut spec = GymTaskSpec::new("faulty", "Counter-v0", seed, 8);
        spec.kwargs = json!({"built": built});
        spec
    };
    // Expert episodes one after another on one worker: hello's environment
    // plays all five.
    let tasks: Vec<GymTask> = (0..5)
        .map(|seed| task(&format!("count/{seed}"), counter(seed)))
        .collect();
    let demos = expert_demonstrations(&config(1), &tasks, 2).unwrap();
    assert!(demos.iter().all(|d| d.success), "{demos:?}");
    assert_eq!(lines(&built), 1, "one environment for five expert episodes");
    // Batches on one pool: 2 tasks x G = 2 are 4 live episodes, so 4
    // environments (hello's among them); the next batches reuse them.
    std::fs::remove_file(&built).unwrap();
    let bins = ActionSpace::Discrete { n: 3 }.bins();
    let mut world = GymEpisodes::new(&config(1), &tasks[..2], 2, &bins).unwrap();
    for batch in 0..3 {
        let out = run(&mut world, 2, 4, |_, _, _| vec![1, 1]);
        assert!(out.episodes.iter().all(|e| e.success), "{out:?}");
        assert_eq!(lines(&built), 4, "batch {batch}");
        world = GymEpisodes::with_pool(world.into_pool(), &tasks[2..4], 2, &bins).unwrap();
    }
}

#[test]
fn a_reused_environment_plays_the_episodes_a_fresh_one_does() {
    // Meta-World reach's expert on three seeds (the first again last), on
    // one worker that keeps its environment, then each on a fresh worker:
    // the same actions and observations, bit for bit.
    let tasks: Vec<GymTask> = [3, 11, 3]
        .iter()
        .enumerate()
        .map(|(i, &seed)| {
            task(
                &format!("reach/{i}"),
                GymTaskSpec::new("metaworld", "reach-v3", seed, 60),
            )
        })
        .collect();
    let warm = expert_demonstrations(&config(1), &tasks, 4).unwrap();
    for (task, warm) in tasks.iter().zip(&warm) {
        let fresh = expert_demonstrations(&config(1), std::slice::from_ref(task), 4).unwrap();
        assert!(!warm.decisions.is_empty());
        assert_eq!(&fresh[0], warm, "{}", task.task_id);
    }
    assert_eq!(warm[0].decisions, warm[2].decisions);
}

/// The standard output of `python/checks/SCRIPT` run by the bridge's
/// Python with the package on its path, once it exits 0.
fn python_check(script: &str) -> String {
    let path = format!("{}/python/checks/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(BridgeConfig::default().python)
        .arg(path)
        .env("PYTHONPATH", embodyflow_gym::worker::PYTHON_DIR)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn babyais_patched_state_key_equals_the_full_grid_encoding() {
    let stdout = python_check("babyai_state_key.py");
    // The check saw grid-changing actions (pickup, drop, toggle).
    let grid_actions: u32 = stdout.lines().last().unwrap().trim().parse().unwrap();
    assert!(grid_actions > 100, "{stdout}");
}

#[test]
fn rgba_and_gray_frames_become_the_rgb_transformers_makes_of_them() {
    assert_eq!(
        python_check("rgb_frames.py").trim(),
        "65536 pairs, 24 frames"
    );
}

fn faulty(fault: &str) -> GymTaskSpec {
    let mut spec = GymTaskSpec::new("faulty", "Counter-v0", 0, 10);
    spec.kwargs = json!({"fault": fault, "at_step": 2});
    spec
}

#[test]
fn an_env_that_raises_fails_only_its_own_episode() {
    let tasks = vec![
        task("raises", faulty("raise")),
        task("fine", GymTaskSpec::new("faulty", "Counter-v0", 0, 10)),
    ];
    let bins = ActionSpace::Discrete { n: 3 }.bins();
    // One worker hosts all four episodes.
    let mut world = GymEpisodes::new(&config(1), &tasks, 2, &bins).unwrap();
    let out = run(&mut world, 2, 10, |_, _, _| vec![1, 1]);
    for episode in &out.episodes[..2] {
        let reason = episode.failure.as_deref().unwrap();
        assert!(
            reason.starts_with("worker 0 (pid ")
                && reason.ends_with(
                    "decision 0: the environment raised RuntimeError: counter broke at step 2"
                ),
            "{reason}"
        );
        assert_eq!(episode.env_steps, 1);
    }
    assert!(
        out.episodes[2..]
            .iter()
            .all(|e| e.success && e.env_steps == 3)
    );
    assert_eq!(world.faults().total(), 0);
}

#[test]
fn expert_demonstrations_fail_per_task_on_faults() {
    let tasks = vec![
        task("raises", faulty("raise")),
        task("fine", GymTaskSpec::new("faulty", "Counter-v0", 0, 10)),
        task("crashes", faulty("crash")),
        task("after", GymTaskSpec::new("faulty", "Counter-v0", 0, 10)),
    ];
    let demos = expert_demonstrations(&config(1), &tasks, 2).unwrap();
    let failure = |i: usize| demos[i].failure.clone().unwrap_or_default();
    assert!(
        failure(0).contains("the expert episode raised RuntimeError"),
        "{}",
        failure(0)
    );
    assert!(
        failure(2).contains("crashed (exit status: 3) in the expert episode"),
        "{}",
        failure(2)
    );
    for i in [1, 3] {
        // The counter's expert: +1 three times, chunks of 2 then 1.
        assert!(demos[i].success && demos[i].failure.is_none());
        let steps: Vec<u32> = demos[i].decisions.iter().map(|d| d.env_steps).collect();
        assert_eq!(steps, [2, 1]);
        assert_eq!(demos[i].decisions[0].actions, [1.0, 1.0]);
        assert!(demos[i].decisions.iter().all(|d| d.text.is_none()));
    }
}

#[test]
fn expert_decisions_carry_the_text_they_observed() {
    let mut spec = GymTaskSpec::new("faulty", "Counter-v0", 0, 10);
    spec.kwargs = json!({"text": true});
    let demos = expert_demonstrations(&config(1), &[task("text", spec)], 2).unwrap();
    assert!(demos[0].success, "{:?}", demos[0].failure);
    let texts: Vec<Option<&str>> = demos[0]
        .decisions
        .iter()
        .map(|d| d.text.as_deref())
        .collect();
    // Chunks of 2 then 1 from 0: the text before each chunk.
    assert_eq!(texts, [Some("at 0"), Some("at 2")]);
}

/// Counter tasks whose resets take `reset` kwargs, `group` copies each, on
/// one worker whose replies may keep silent for `patience` (its start-up,
/// the `hello` before the resets, gets the default patience: a Python
/// importing Gymnasium on a loaded machine takes more than a second).
fn reset_world(
    kwargs: serde_json::Value,
    group: usize,
    patience: Duration,
) -> Result<GymEpisodes, BridgeError> {
    let mut spec = GymTaskSpec::new("faulty", "Counter-v0", 0, 10);
    spec.kwargs = kwargs;
    let config = BridgeConfig {
        timeout: patience,
        startup_timeout: patience.max(embodyflow_gym::STARTUP_TIMEOUT),
        ..config(1)
    };
    let bins = ActionSpace::Discrete { n: 3 }.bins();
    GymEpisodes::new(&config, &[task("counter", spec)], group, &bins)
}

#[test]
fn a_reset_slower_than_the_timeout_in_all_is_kept_alive_by_progress_frames() {
    // Six resets of 0.4 s on one worker: 2.4 s in all, past a 1 s patience,
    // but never 1 s without a frame (Meta-World building 40 environments
    // on a loaded machine).
    let started = std::time::Instant::now();
    let mut world = reset_world(json!({"reset_delay": 0.4}), 6, Duration::from_secs(1)).unwrap();
    assert!(started.elapsed() > Duration::from_millis(2400));
    assert_eq!(world.faults().total(), 0, "{}", world.faults());
    let out = run(&mut world, 2, 10, |_, _, _| vec![1, 1]);
    assert!(out.episodes.iter().all(|e| e.success), "{out:?}");
}

#[test]
fn a_worker_that_fails_a_reset_once_is_restarted_and_asked_again() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("crashed-once");
    let kwargs = json!({"reset_fault": "crash", "reset_once": marker.to_str().unwrap()});
    let mut world = reset_world(kwargs, 3, Duration::from_secs(20)).unwrap();
    assert!(marker.exists());
    let faults = world.faults();
    assert_eq!((faults.crashed, faults.restarts), (1, 1), "{faults}");
    let out = run(&mut world, 2, 10, |_, _, _| vec![1, 1]);
    assert!(
        out.episodes
            .iter()
            .all(|e| e.success && e.failure.is_none()),
        "{out:?}"
    );
}

/// Counter tasks with kwargs `broken` and without, `group` copies each, on
/// 2 workers (each hosts one task's copies) that time out after 1 s (3 s
/// to start); `bridge` changes the config further.
fn broken_and_fine(
    broken: serde_json::Value,
    group: usize,
) -> Result<(GymEpisodes, ClosedLoopRun), BridgeError> {
    let mut spec = GymTaskSpec::new("faulty", "Counter-v0", 0, 10);
    spec.kwargs = broken;
    let tasks = vec![
        task("broken", spec),
        task("fine", GymTaskSpec::new("faulty", "Counter-v0", 0, 10)),
    ];
    let config = BridgeConfig {
        timeout: Duration::from_secs(1),
        startup_timeout: Duration::from_secs(3),
        ..config(2)
    };
    let bins = ActionSpace::Discrete { n: 3 }.bins();
    let mut world = GymEpisodes::new(&config, &tasks, group, &bins)?;
    let out = run(&mut world, 1, 10, |_, _, _| vec![1]);
    Ok((world, out))
}

/// Checks a [`broken_and_fine`] run: the broken task's episodes ended
/// before their first decision with a reason containing `what`, the fine
/// task's succeeded.
fn check_unstarted(out: &ClosedLoopRun, group: usize, what: &str) {
    for episode in &out.episodes[..group] {
        let reason = episode.failure.as_deref().unwrap_or_default();
        assert!(reason.contains(what), "{reason}");
        assert!(!episode.success && !episode.truncated);
        assert!(episode.decisions.is_empty() && episode.env_steps == 0);
    }
    for episode in &out.episodes[group..] {
        assert!(episode.success && episode.failure.is_none(), "{episode:?}");
    }
}

#[test]
fn an_env_that_raises_in_its_reset_fails_only_its_own_episodes() {
    let (world, out) = broken_and_fine(json!({"reset_fault": "raise"}), 2).unwrap();
    check_unstarted(
        &out,
        2,
        "the environment raised RuntimeError in reset: counter cannot be reset",
    );
    assert!(
        out.episodes[0]
            .failure
            .as_deref()
            .unwrap()
            .starts_with("worker 0 (pid ")
    );
    assert_eq!(world.faults().total(), 0, "{}", world.faults());
    // The environment that raised is built again for the next batch.
    next_batch_succeeds(world);
}

#[test]
fn a_worker_that_keeps_failing_its_reset_fails_its_episodes_within_the_timeout() {
    let started = std::time::Instant::now();
    let (world, out) = broken_and_fine(json!({"reset_fault": "hang"}), 2).unwrap();
    check_unstarted(
        &out,
        2,
        "hung (no reply within 1.0 s) in reset, the last of 3 attempts",
    );
    let faults = world.faults();
    assert_eq!((faults.hung, faults.restarts), (3, 3), "{faults}");
    // Three waits of 1 s, not of the 3 s start-up patience.
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn a_worker_that_dies_starting_is_restarted_then_fails_only_its_tasks_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("crashed-once");
    let once = json!({"start_fault": "crash", "start_once": marker.to_str().unwrap()});
    let (world, out) = broken_and_fine(once, 2).unwrap();
    assert!(marker.exists());
    assert!(out.episodes.iter().all(|e| e.success), "{out:?}");
    let faults = world.faults();
    assert_eq!((faults.crashed, faults.restarts), (1, 1), "{faults}");

    let (world, out) = broken_and_fine(json!({"start_fault": "crash"}), 2).unwrap();
    check_unstarted(
        &out,
        2,
        "crashed (exit status: 5) during hello (faulty Counter-v0), the last of 3 attempts",
    );
    assert_eq!(world.faults().crashed, 3, "{}", world.faults());
    // With no task that can start there is nothing to run: a failure, not
    // bad input.
    let mut spec = GymTaskSpec::new("faulty", "Counter-v0", 0, 10);
    spec.kwargs = json!({"start_fault": "crash"});
    let bins = ActionSpace::Discrete { n: 3 }.bins();
    let Err(error) = GymEpisodes::new(&config(1), &[task("dies", spec)], 1, &bins) else {
        panic!("a world whose every worker dies starting");
    };
    assert_eq!(error.kind(), ErrorKind::Failure, "{error}");
    assert!(matches!(error, BridgeError::Startup { .. }), "{error}");
}

#[test]
fn expert_episodes_honour_the_timeout() {
    let tasks: Vec<GymTask> = (0..4)
        .map(|t| {
            let mut spec = faulty("hang");
            spec.kwargs["at_step"] = json!(1);
            task(&format!("hangs/{t}"), spec)
        })
        .collect();
    let config = BridgeConfig {
        timeout: Duration::from_secs(1),
        startup_timeout: Duration::from_secs(3),
        ..config(1)
    };
    let started = std::time::Instant::now();
    let demos = expert_demonstrations(&config, &tasks, 2).unwrap();
    for demo in &demos {
        let failure = demo.failure.as_deref().unwrap_or_default();
        assert!(
            failure.contains("hung (no reply within 1.0 s) in the expert episode"),
            "{failure}"
        );
    }
    // Four waits of 1 s (and four starts), not of the 3 s start-up patience.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// The processes whose process group is `group` (zombies aside).
fn group_members(group: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...: comm may hold spaces.
        let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
        if fields[0] != "Z" && fields[2].parse::<u32>() == Ok(group) {
            out.push(pid);
        }
    }
    out
}

/// The pids a `child` file lists.
fn pids(path: &std::path::Path) -> Vec<u32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect()
}

/// Waits up to 5 s for `check` to hold.
fn eventually(check: impl Fn() -> bool) -> bool {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < until {
        if check() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    check()
}

#[test]
fn a_workers_process_group_dies_with_it_and_its_environments_are_closed() {
    use std::os::fd::AsFd;
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    // A lock that a parent holds and lets its children inherit, as the
    // pipeline runner does with its run directory's.
    let lock_path = dir.path().join("lock");
    let lock = std::fs::File::create(&lock_path).unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive).unwrap();
    rustix::io::fcntl_setfd(lock.as_fd(), rustix::io::FdFlags::empty()).unwrap();
    let broken = json!({"child": file("hung-children"), "fault": "hang", "at_step": 2});
    let mut spec = GymTaskSpec::new("faulty", "Counter-v0", 0, 10);
    spec.kwargs = broken;
    let mut fine = GymTaskSpec::new("faulty", "Counter-v0", 0, 10);
    fine.kwargs = json!({"child": file("children"), "closed": file("closed")});
    let tasks = vec![task("broken", spec), task("fine", fine)];
    let config = BridgeConfig {
        timeout: Duration::from_secs(1),
        ..config(2)
    };
    let bins = ActionSpace::Discrete { n: 3 }.bins();
    let mut world = GymEpisodes::new(&config, &tasks, 2, &bins).unwrap();
    // Each environment started a child of its worker (worker 0 built one
    // of each task's for its hello); neither the workers nor the children
    // hold the inherited lock.
    let hung = pids(&dir.path().join("hung-children"));
    let children = pids(&dir.path().join("children"));
    assert_eq!((hung.len(), children.len()), (2, 3));
    let parent = |pid: u32| -> u32 {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        stat[stat.rfind(')').unwrap() + 2..]
            .split(' ')
            .nth(1)
            .unwrap()
            .parse()
            .unwrap()
    };
    let holds_lock = |pid: u32| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).ok().as_deref() == Some(lock_path.as_path()))
    };
    let w0 = parent(hung[0]);
    let w1 = children
        .iter()
        .map(|&c| parent(c))
        .find(|&p| p != w0)
        .unwrap();
    assert_eq!(group_members(w0).len(), 4, "worker 0 and its 3 children");
    for pid in [w0, w1].iter().chain(&hung).chain(&children) {
        assert!(!holds_lock(*pid), "process {pid} holds the lock");
    }
    assert!(holds_lock(std::process::id()));
    drop(lock);
    // Worker 0 hangs at decision 1 and is killed with its group: the
    // environments' children too, though nothing closed them.
    let out = run(&mut world, 1, 10, |_, _, _| vec![1]);
    assert!(out.episodes[0].failure.as_deref().unwrap().contains("hung"));
    assert!(
        eventually(|| group_members(w0).is_empty()),
        "{:?}",
        group_members(w0)
    );
    assert!(out.episodes[2..].iter().all(|e| e.success), "{out:?}");
    // Dropping the pool closes the other worker's environments and ends
    // its group.
    assert_eq!(group_members(w1).len(), 3, "worker 1 and its 2 children");
    drop(world);
    assert!(
        eventually(|| group_members(w1).is_empty()),
        "{:?}",
        group_members(w1)
    );
    let closed = std::fs::read_to_string(dir.path().join("closed")).unwrap();
    assert_eq!(closed.lines().count(), 2, "{closed}");
}

const TEXT_ENV: &str = "embodyflow_gym.envs:TextKeyRoom-v0";

/// A policy that reads its prompt (the driver's `observed_prompt`: the
/// instruction, then the observed text) and walks to the key's room: it
/// succeeds only if each decision's text reaches it. It refuses prompts
/// longer than `max_prompt` bytes.
struct TextReader {
    max_prompt: usize,
}

impl ChunkPolicy for TextReader {
    type Error = Error;

    fn chunk_len(&self) -> usize {
        1
    }

    fn action_dim(&self) -> usize {
        1
    }

    fn observation_shape(&self) -> ObservationShape {
        ObservationShape {
            height: 0,
            width: 0,
            channels: 3,
            proprio: 0,
        }
    }

    fn instruction_ids(&self, instruction: &str) -> Result<Vec<i32>, Error> {
        if instruction.len() > self.max_prompt {
            return Err(Error::BadInput(format!(
                "a prompt of {} bytes, at most {}",
                instruction.len(),
                self.max_prompt
            )));
        }
        Ok(instruction.bytes().map(i32::from).collect())
    }

    fn decide(&mut self, batch: &DecisionBatch<'_>) -> Result<Vec<ChunkDecision>, Error> {
        let rooms = |prompt: &[i32]| -> (u32, u32) {
            let text: String = prompt.iter().map(|&b| b as u8 as char).collect();
            let line = text.lines().last().unwrap().to_string();
            let numbers: Vec<u32> = line
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse().ok())
                .collect();
            assert_eq!(numbers.len(), 2, "{text}");
            (numbers[0], numbers[1])
        };
        Ok(batch
            .instructions
            .iter()
            .map(|prompt| {
                let (room, key) = rooms(prompt);
                // 0 west, 1 east, 2 pick up.
                let action = match room.cmp(&key) {
                    std::cmp::Ordering::Less => 1,
                    std::cmp::Ordering::Greater => 0,
                    std::cmp::Ordering::Equal => 2,
                };
                ChunkDecision {
                    tokens: vec![action],
                    token_logprobs: vec![-0.5],
                    thought: None,
                }
            })
            .collect())
    }
}

#[test]
fn a_text_observation_reaches_each_decisions_prompt() {
    let info = probe(&config(1), &spec("generic", TEXT_ENV)).unwrap();
    // "you are in room 4; the key is in room 4": the Text space's max_length.
    assert_eq!(info.text, 39);
    assert_eq!(info.shape.pixel_len() + info.shape.proprio, 0);
    let tasks: Vec<GymTask> = (0..3)
        .map(|seed| {
            let mut spec = GymTaskSpec::new("generic", TEXT_ENV, seed, 12);
            spec.instruction = Some("find the key".into());
            task(&format!("keyroom/{seed}"), spec)
        })
        .collect();
    let bins = info.action.bins();
    let mut world = GymEpisodes::new(&config(2), &tasks, 2, &bins).unwrap();
    let first = world.observation_text(0).unwrap().to_string();
    assert!(first.starts_with("you are in room "), "{first}");
    let run_config = ClosedLoopConfig {
        max_decisions: 12,
        label: "test",
    };
    let seeds: Vec<u64> = (0..world.len() as u64).collect();
    let mut reader = TextReader { max_prompt: 64 };
    let out = run_closed_loop(&mut world, &mut reader, &bins, &seeds, &run_config).unwrap();
    for episode in &out.episodes {
        assert!(episode.success, "{:?}", episode.failure);
        assert_eq!(
            episode.prompt_ids,
            b"find the key"
                .iter()
                .map(|&b| i32::from(b))
                .collect::<Vec<_>>()
        );
        // Each steps row holds the prompt of its own decision.
        let rows = episode.step_rows("t");
        let prompts: Vec<String> = rows
            .iter()
            .map(|row| row.prompt_ids.iter().map(|&b| b as u8 as char).collect())
            .collect();
        assert!(
            prompts
                .iter()
                .all(|p| p.starts_with("find the key\nyou are in room "))
        );
        assert_eq!(
            prompts.last().map(String::as_str).map(|p| {
                let numbers: Vec<&str> = p
                    .split(|c: char| !c.is_ascii_digit())
                    .filter(|n| !n.is_empty())
                    .collect();
                numbers[0] == numbers[1]
            }),
            Some(true),
            "the last decision picks up in the key's room: {prompts:?}"
        );
        if rows.len() > 1 {
            assert_ne!(
                prompts[0], prompts[1],
                "the text changes as the agent walks"
            );
        }
    }
    assert_eq!(
        out.episodes[0].step_rows("t")[0].prompt_ids,
        format!("find the key\n{first}")
            .bytes()
            .map(i32::from)
            .collect::<Vec<_>>()
    );
    // A policy that cannot take the instruction with the text: bad input
    // naming the episode, its task and the decision, before any step.
    let mut world = GymEpisodes::new(&config(1), &tasks[..1], 1, &bins).unwrap();
    let mut short = TextReader { max_prompt: 20 };
    let error = run_closed_loop(&mut world, &mut short, &bins, &[0], &run_config).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::BadInput);
    assert!(
        error.to_string().starts_with(
            "episode 0 (task `keyroom/0`), decision 0, its prompt with the observed text: a prompt of"
        ),
        "{error}"
    );
}

#[test]
fn the_generic_adapter_takes_a_dict_of_image_direction_and_mission() {
    // MiniGrid's own observation: {direction: Discrete(4), image: 7x7x3,
    // mission: a space of strings}; "minigrid:" imports the package that
    // registers the id.
    let env_id = "minigrid:MiniGrid-Empty-5x5-v0";
    let mut empty = GymTaskSpec::new("generic", env_id, 1, 8);
    // MiniGrid reports no success in its info: its goal gives a reward.
    empty.success = Some(SuccessRule::TerminalReward);
    let info = probe(&config(1), &empty).unwrap();
    assert_eq!(
        info.shape,
        ObservationShape {
            height: 7,
            width: 7,
            channels: 3,
            proprio: 4
        }
    );
    assert_eq!(
        info.text, 256,
        "a mission space has no bound: text_max_length"
    );
    let tasks = vec![task("empty/1", empty.clone())];
    let world = GymEpisodes::new(&config(1), &tasks, 1, &info.action.bins()).unwrap();
    assert_eq!(
        world.observation_text(0),
        Some("get to the green goal square")
    );
    // A text longer than the bound the kwargs announce fails its episode
    // at the reset, named.
    let mut short = empty;
    short.kwargs = json!({"text_max_length": 5});
    // The probe builds the task's spec: its kwargs' bound is the one announced.
    assert_eq!(probe(&config(1), &short).unwrap().text, 5);
    let world = GymEpisodes::new(
        &config(1),
        &[task("empty/1", short)],
        1,
        &info.action.bins(),
    )
    .unwrap();
    assert!(!world.running(0));
    let failure = world.start_failure(0).unwrap_or_default();
    assert!(
        failure.contains(
            "raised ValueError in reset: a text observation of 28 characters, beyond the 5"
        ),
        "{failure}"
    );
    // A space the adapter does not take is bad input naming it.
    let error = probe(&config(1), &spec("generic", "Blackjack-v1")).unwrap_err();
    assert_eq!(error.kind(), ErrorKind::BadInput);
    assert!(error.to_string().contains("Tuple("), "{error}");
}
