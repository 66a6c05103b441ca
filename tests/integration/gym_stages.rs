//! Bridge tasks through the stages: `generate-tasks --set
//! env=gym` (BabyAI, instructions read from a reset) → `init-policy
//! --input` (a VLA shaped by the adapter: 7 × 7 symbolic frames, a 4-long
//! direction one-hot, Discrete(7) as 8 bins) → `update-policy` SFT on the
//! BabyAI bot's demonstrations → `collect-rollouts` (anchor keys in
//! `steps`) → `evaluate`. And the faults at the exact point: a worker of
//! the `faulty` adapter that crashes, hangs or lies at step 2 ends exactly
//! its own episodes, as failures with the reason in `failure_reason`, the
//! other worker's episodes run to their end, the run exits 0 and the
//! summary counts the fault; so do an environment that raises in its reset
//! and a worker that dies building its environment (before any decision),
//! and a hung worker's environments' own processes die with it.

use std::path::Path;

use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{EvalRow, StepRow, TableName, TaskRow, TrajectoryRow};
use embodyflow_gym::{GymTaskSpec, task_row};
use embodyflow_tests::{run, write_table};

pub(crate) fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

pub(crate) fn ok(name: &str, args: &[&str]) -> String {
    let result = run(name, args);
    assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
    result.stdout
}

/// The stdout of `program` with `args`, which must exit 0.
pub(crate) fn stdout_of(program: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program:?} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub(crate) fn rows<R: embodyflow_core::schemas::Row>(dir: &Path, table: TableName) -> Vec<R> {
    TableReader::open(&dir.join(table.as_str()), table)
        .unwrap()
        .read_rows()
        .unwrap()
}

/// `collect-rollouts` of `policy` on `tasks` in groups of 2, with more
/// `--set` values; its summary.
fn collect(policy: &Path, tasks: &Path, out: &Path, sets: &[&str]) -> String {
    let mut args = vec!["--policy", s(policy), "--input", s(tasks), "--out", s(out)];
    for set in ["group_size=2"].iter().chain(sets) {
        args.extend(["--set", set]);
    }
    ok("collect-rollouts", &args)
}

/// `evaluate`'s rows for `policy` on `tasks`, `runs` per task, with more
/// `--set` values.
fn evaluate(policy: &Path, tasks: &Path, out: &Path, runs: usize, sets: &[&str]) -> Vec<EvalRow> {
    let runs = format!("runs={runs}");
    let mut args = vec!["--policy", s(policy), "--input", s(tasks), "--out", s(out)];
    for set in [runs.as_str()].iter().chain(sets) {
        args.extend(["--set", set]);
    }
    ok("evaluate", &args);
    rows(out, TableName::Eval)
}

/// `update-policy` SFT of `policy` on the experts' demonstrations of
/// `tasks` (2 epochs), with more `--set` values; its summary.
fn sft_of(policy: &Path, tasks: &Path, out: &Path, sets: &[&str]) -> String {
    let mut args = vec!["--policy", s(policy), "--input", s(tasks), "--out", s(out)];
    for set in ["objective=sft", "epochs=2"].iter().chain(sets) {
        args.extend(["--set", set]);
    }
    ok("update-policy", &args)
}

pub(crate) const TINY_VLA: &[&str] = &[
    "--set",
    "kind=vla",
    "--set",
    "vla.patch_size=1",
    "--set",
    "vla.chunk_len=1",
    "--set",
    "vla.n_layer=1",
    "--set",
    "vla.n_embd=32",
    "--set",
    "vla.n_head=2",
    "--set",
    "tokenizer.vocab_size=280",
];

#[test]
fn babyai_tasks_run_through_every_closed_loop_stage() {
    let dir = tempfile::tempdir().unwrap();
    let (tasks, vla, sft) = (
        dir.path().join("tasks"),
        dir.path().join("vla"),
        dir.path().join("sft"),
    );
    ok(
        "generate-tasks",
        &[
            "--out",
            s(&tasks),
            "--seed",
            "5",
            "--set",
            "env=gym",
            "--set",
            "gym.adapter=babyai",
            "--set",
            "gym.env_ids=[\"BabyAI-GoToLocal-v0\"]",
            "--set",
            "gym.max_steps=24",
            "--set",
            "count=2",
        ],
    );
    let task_rows: Vec<TaskRow> = rows(&tasks, TableName::Tasks);
    assert_eq!(task_rows.len(), 2);
    for row in &task_rows {
        assert_eq!(row.env, "gym:babyai");
        assert!(row.instruction.starts_with("go to"), "{row:?}");
        assert_eq!(row.task_type.as_deref(), Some("BabyAI-GoToLocal-v0"));
    }

    let mut init = vec!["--out", s(&vla), "--input", s(&tasks), "--seed", "0"];
    init.extend_from_slice(TINY_VLA);
    ok("init-policy", &init);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(vla.join("config.json")).unwrap()).unwrap();
    assert_eq!(
        (
            &config["image_size"],
            &config["proprio_dim"],
            &config["action_dim"],
            &config["n_bins"]
        ),
        (
            &serde_json::json!(7),
            &serde_json::json!(4),
            &serde_json::json!(1),
            &serde_json::json!(8)
        )
    );

    let summary = sft_of(&vla, &tasks, &sft, &[]);
    assert!(
        summary.contains("| demonstrations | 2 successful expert demonstrations (gym:babyai)"),
        "{summary}"
    );

    let rollouts = dir.path().join("rollouts");
    let summary = collect(
        &sft.join("policy"),
        &tasks,
        &rollouts,
        &["bridge.workers=2"],
    );
    assert!(
        summary.contains("| gym bridge faults | worker faults: 0 crashed"),
        "{summary}"
    );
    let trajectories: Vec<TrajectoryRow> = rows(&rollouts, TableName::Trajectories);
    assert_eq!(trajectories.len(), 4);
    assert!(trajectories.iter().all(|t| t.failure_reason.is_none()));
    let steps: Vec<StepRow> = rows(&rollouts, TableName::Steps);
    assert!(
        steps
            .iter()
            .all(|s| s.anchor_key.as_ref().is_some_and(|k| k.len() == 32))
    );
    // The two copies of a task start from the same state.
    let first_keys: Vec<&str> = steps
        .iter()
        .filter(|s| s.step_index == 0)
        .map(|s| s.anchor_key.as_deref().unwrap())
        .collect();
    assert_eq!(first_keys.len(), 4);
    assert_eq!(first_keys[0], first_keys[1]);
    assert_eq!(first_keys[2], first_keys[3]);
    assert_ne!(first_keys[0], first_keys[2]);

    let eval_rows = evaluate(
        &sft.join("policy"),
        &tasks,
        &dir.path().join("eval"),
        2,
        &[],
    );
    assert_eq!(eval_rows.len(), 4);
    assert!(
        eval_rows
            .iter()
            .all(|r| r.failure_reason.is_none() && r.num_steps >= 1)
    );
}

/// Two counter tasks of the `faulty` adapter, the first failing with
/// `fault` at its second step; each on its own worker.
fn faulty_tasks(dir: &Path, fault: &str) {
    let mut broken = GymTaskSpec::new("faulty", "Counter-v0", 1, 6);
    broken.kwargs = serde_json::json!({"fault": fault, "at_step": 2});
    let clean = GymTaskSpec::new("faulty", "Counter-v0", 2, 6);
    let task_rows = vec![
        task_row("counter/0", "train", &broken).unwrap(),
        task_row("counter/1", "train", &clean).unwrap(),
    ];
    write_table(dir, &task_rows);
}

#[test]
fn a_worker_that_crashes_hangs_or_lies_fails_its_own_episodes_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let clean_tasks = dir.path().join("clean");
    faulty_tasks(&clean_tasks, "crash");
    let vla = dir.path().join("vla");
    let mut init = vec!["--out", s(&vla), "--input", s(&clean_tasks), "--seed", "0"];
    init.extend_from_slice(TINY_VLA);
    ok("init-policy", &init);
    for (fault, reason) in [
        ("crash", "crashed"),
        ("hang", "hung"),
        ("malformed", "malformed"),
    ] {
        let tasks = dir.path().join(format!("tasks-{fault}"));
        faulty_tasks(&tasks, fault);
        let out = dir.path().join(format!("rollouts-{fault}"));
        let summary = collect(
            &vla,
            &tasks,
            &out,
            &["bridge.workers=2", "bridge.timeout_s=2"],
        );
        assert!(
            summary.contains(&format!("1 {reason}")) && summary.contains("1 restarts"),
            "{fault}: {summary}"
        );
        assert!(
            summary.contains("(2 episodes failed by a worker fault)"),
            "{fault}: {summary}"
        );
        let trajectories: Vec<TrajectoryRow> = rows(&out, TableName::Trajectories);
        assert_eq!(trajectories.len(), 4, "{fault}: never dropped");
        for t in &trajectories {
            if t.task_id == "counter/0" {
                let why = t.failure_reason.as_deref().unwrap_or_default();
                assert!(why.contains(reason), "{fault}: {why}");
                assert!(!t.complete, "{fault}");
            } else {
                assert_eq!(
                    t.failure_reason, None,
                    "{fault}: the other worker's episode"
                );
                assert!(t.num_steps >= 2, "{fault}: ran past the fault");
            }
        }
    }
}

/// Whether process `pid` is gone (or a zombie).
fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat[stat.rfind(')').unwrap() + 2..].starts_with('Z'))
        .unwrap_or(true)
}

#[test]
fn an_env_that_raises_in_reset_or_dies_starting_fails_only_its_tasks_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let children = dir.path().join("children");
    let counter = |seed: u64, kwargs: serde_json::Value| {
        let mut spec = GymTaskSpec::new("faulty", "Counter-v0", seed, 6);
        spec.kwargs = kwargs;
        spec
    };
    let specs = [
        counter(0, serde_json::json!({"reset_fault": "raise"})),
        counter(1, serde_json::json!({"start_fault": "crash"})),
        // Starts a child process (a simulator's server), then hangs.
        counter(
            2,
            serde_json::json!({"child": s(&children), "fault": "hang", "at_step": 2}),
        ),
        counter(3, serde_json::json!({})),
    ];
    let task_rows: Vec<TaskRow> = specs
        .iter()
        .enumerate()
        .map(|(t, spec)| task_row(&format!("counter/{t}"), "train", spec).unwrap())
        .collect();
    let tasks = dir.path().join("tasks");
    write_table(&tasks, &task_rows);
    let clean = dir.path().join("clean");
    faulty_tasks(&clean, "crash");
    let vla = dir.path().join("vla");
    let mut init = vec!["--out", s(&vla), "--input", s(&clean), "--seed", "0"];
    init.extend_from_slice(TINY_VLA);
    ok("init-policy", &init);
    // One worker per task: each fault stays with its own task's episodes.
    let bridge = ["bridge.workers=4", "bridge.timeout_s=1"];
    let why = |reason: &Option<String>, t: usize| -> Result<(), String> {
        let reason = reason.as_deref().unwrap_or_default();
        let expected = [
            "the environment raised RuntimeError in reset: counter cannot be reset",
            "crashed (exit status: 5) during hello (faulty Counter-v0), the last of 3 attempts",
            "hung (no reply within 1.0 s) at decision 1",
        ];
        match expected.get(t) {
            Some(what) if reason.contains(what) => Ok(()),
            None if reason.is_empty() => Ok(()),
            _ => Err(format!("task {t}: {reason:?}")),
        }
    };
    let task_of = |id: &str| -> usize { id["counter/".len()..].parse().unwrap() };
    let out = dir.path().join("rollouts");
    collect(&vla, &tasks, &out, &bridge);
    let trajectories: Vec<TrajectoryRow> = rows(&out, TableName::Trajectories);
    assert_eq!(trajectories.len(), 8, "never dropped");
    for t in &trajectories {
        let task = task_of(&t.task_id);
        why(&t.failure_reason, task).unwrap();
        let decisions = if task < 2 { 0..=0 } else { 1..=6 };
        assert!(decisions.contains(&t.num_steps), "{t:?}");
    }
    let eval = evaluate(&vla, &tasks, &dir.path().join("eval"), 1, &bridge);
    assert_eq!(eval.len(), 4);
    for row in &eval {
        why(&row.failure_reason, task_of(&row.task_id)).unwrap();
    }
    // The hung worker's environments' children died with its process
    // group: none outlives the stages.
    let pids: Vec<u32> = std::fs::read_to_string(&children)
        .unwrap()
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    assert!(pids.len() >= 4, "{pids:?}");
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !pids.iter().all(|&p| gone(p)) && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let alive: Vec<&u32> = pids.iter().filter(|&&p| !gone(p)).collect();
    assert!(
        alive.is_empty(),
        "children alive after the stages: {alive:?}"
    );
}

#[test]
fn generate_tasks_refuses_a_task_whose_environment_cannot_be_reset() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tasks");
    let args = [
        "--out",
        s(&out),
        "--set",
        "env=gym",
        "--set",
        "gym.adapter=faulty",
        "--set",
        "gym.env_ids=[\"Counter-v0\"]",
        "--set",
        "gym.kwargs={reset_fault = \"raise\"}",
        "--set",
        "count=1",
    ];
    let result = run("generate-tasks", &args);
    assert_eq!(result.code, 2, "{result}");
    let text = result.to_string();
    assert!(
        text.contains("its environment could not be reset")
            && text.contains("the environment raised RuntimeError in reset"),
        "{text}"
    );
    assert!(!out.exists(), "nothing written");
}

/// Tasks of the example text environment (`embodyflow_gym.envs`, through
/// the generic adapter): the observation is a sentence naming the agent's
/// room and the key's.
const TEXT_ENV: &str = "embodyflow_gym.envs:TextKeyRoom-v0";

/// Three key-room tasks (4 rooms, 8 steps, "find the key") in `tasks`.
fn keyroom_tasks(tasks: &Path) {
    let env_ids = format!("gym.env_ids=[\"{TEXT_ENV}\"]");
    ok(
        "generate-tasks",
        &[
            "--out",
            s(tasks),
            "--seed",
            "2",
            "--set",
            "env=gym",
            "--set",
            "gym.adapter=generic",
            "--set",
            &env_ids,
            "--set",
            "gym.max_steps=8",
            "--set",
            "gym.kwargs={n_rooms = 4}",
            "--set",
            "gym.instruction=find the key",
            "--set",
            "count=3",
        ],
    );
}

/// PPO on `rollouts` of `vla` (one update, the whole batch): its first
/// metrics row's approx KL, ~0 when the prompts it rebuilds from the steps
/// rows are the collected ones.
fn ppo_kl(root: &Path, vla: &Path, tasks: &Path, rollouts: &Path) -> f32 {
    let steps: Vec<StepRow> = rows(rollouts, TableName::Steps);
    let (rewards, adv, ppo) = (root.join("rewards"), root.join("adv"), root.join("ppo"));
    ok(
        "score-rewards",
        &[
            "--input",
            s(rollouts),
            "--input",
            s(tasks),
            "--out",
            s(&rewards),
        ],
    );
    ok(
        "compute-advantages",
        &[
            "--input",
            s(rollouts),
            "--input",
            s(&rewards),
            "--out",
            s(&adv),
        ],
    );
    ok(
        "update-policy",
        &[
            "--policy",
            s(vla),
            "--input",
            s(rollouts),
            "--input",
            s(&adv),
            "--out",
            s(&ppo),
            "--set",
            "objective=ppo",
            "--set",
            &format!("mini_batch={}", steps.len()),
        ],
    );
    let metrics: Vec<embodyflow_core::schemas::MetricRow> = rows(&ppo, TableName::Metrics);
    metrics[0].approx_kl.unwrap()
}

#[test]
fn an_env_that_observes_text_runs_through_every_stage_with_the_text_in_each_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (tasks, vla) = (root.join("tasks"), root.join("vla"));
    keyroom_tasks(&tasks);
    let task_rows: Vec<TaskRow> = rows(&tasks, TableName::Tasks);
    assert!(task_rows.iter().all(|r| r.instruction == "find the key"));

    // The observed text needs room in the prompt, counted in tokens of the
    // tokenizer the probe episodes' prompts trained: 8 are too few.
    let mut init = vec!["--out", s(&vla), "--input", s(&tasks), "--seed", "0"];
    init.extend_from_slice(TINY_VLA);
    let mut short = init.clone();
    short.extend(["--set", "vla.max_instruction=8"]);
    let refused = run("init-policy", &short);
    assert_eq!(refused.code, 2, "{refused}");
    let text = refused.to_string();
    assert!(
        text.contains("vla.max_instruction")
            && text.contains("(the probe prompt `find the key\nyou are in room"),
        "{text}"
    );
    assert!(!vla.exists());
    init.extend(["--set", "vla.max_instruction=64"]);
    let summary = ok("init-policy", &init);
    assert!(summary.contains("probe prompts:"), "{summary}");

    let rollouts = root.join("rollouts");
    collect(&vla, &tasks, &rollouts, &[]);
    let tokenizer = tokenizers::Tokenizer::from_file(vla.join("tokenizer.json")).unwrap();
    let steps: Vec<StepRow> = rows(&rollouts, TableName::Steps);
    let prompts: Vec<String> = steps
        .iter()
        .map(|step| {
            let ids: Vec<u32> = step.prompt_ids.iter().map(|&id| id as u32).collect();
            tokenizer.decode(&ids, false).unwrap()
        })
        .collect();
    for (prompt, step) in prompts.iter().zip(&steps) {
        assert!(
            prompt.starts_with("find the key\nyou are in room ")
                && prompt.contains("the key is in room"),
            "{prompt:?}"
        );
        // The tokenizer learned the observations' words.
        assert!(step.prompt_ids.len() * 2 < prompt.len(), "{prompt:?}");
    }
    // The text follows the agent: a trajectory that moved sees another room.
    let moved = steps
        .windows(2)
        .zip(prompts.windows(2))
        .any(|(s, p)| s[0].trajectory_id == s[1].trajectory_id && p[0] != p[1]);
    assert!(moved, "{prompts:?}");

    // PPO rebuilds each decision's prompt from its steps row: at the
    // first update the policy is the behaviour policy (KL ~ 0).
    let kl = ppo_kl(root, &vla, &tasks, &rollouts);
    assert!(
        kl.abs() < 1e-4,
        "the rebuilt prompts are the collected ones: KL {kl}"
    );

    let eval_rows = evaluate(&root.join("ppo/policy"), &tasks, &root.join("eval"), 1, &[]);
    assert_eq!(eval_rows.len(), 3);
    assert!(eval_rows.iter().all(|r| r.failure_reason.is_none()));
}

/// `vla.history = 2` on the key-room: init-policy's probe prompts recall
/// the last two decisions and bound `vla.max_instruction` (one token short
/// of the longest is refused, naming both keys); every collected decision's
/// prompt is the history prompt of its trajectory's earlier steps (their
/// sentences and actions, rebuilt here from the steps rows); PPO rebuilds
/// those prompts from the steps rows (KL ~ 0 at the first update); evaluate
/// runs the policy with them.
#[test]
fn a_vla_with_a_history_recalls_its_last_decisions_in_every_stage() {
    use embodyflow_world::{PastDecision, history_prompt};
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (tasks, vla) = (root.join("tasks"), root.join("vla"));
    keyroom_tasks(&tasks);
    let mut init = vec!["--input", s(&tasks), "--seed", "0"];
    init.extend_from_slice(TINY_VLA);
    init.extend(["--set", "vla.history=2"]);
    let mut roomy = init.clone();
    roomy.extend(["--set", "vla.max_instruction=256", "--out", s(&vla)]);
    let summary = ok("init-policy", &roomy);
    let line = summary
        .lines()
        .find(|l| l.contains("probe prompts with vla.history = 2"))
        .unwrap_or_else(|| panic!("{summary}"));
    let longest: i64 = line
        .split(" at most")
        .next()
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    let short_set = format!("vla.max_instruction={}", longest - 1);
    let short_out = root.join("short");
    let mut short = init.clone();
    short.extend(["--set", &short_set, "--out", s(&short_out)]);
    let refused = run("init-policy", &short);
    assert_eq!(refused.code, 2, "{refused}");
    let text = refused.to_string();
    assert!(
        text.contains("config key `vla.max_instruction`")
            && text.contains("vla.history = 2")
            && text.contains("[Observation 1: 'you are in room "),
        "{text}"
    );
    assert!(!short_out.exists());

    let rollouts = root.join("rollouts");
    collect(&vla, &tasks, &rollouts, &[]);
    let tokenizer = tokenizers::Tokenizer::from_file(vla.join("tokenizer.json")).unwrap();
    let mut steps: Vec<StepRow> = rows(&rollouts, TableName::Steps);
    steps.sort_by_key(|r| (r.trajectory_id.clone(), r.step_index));
    let decode = |step: &StepRow| {
        let ids: Vec<u32> = step.prompt_ids.iter().map(|&id| id as u32).collect();
        tokenizer.decode(&ids, false).unwrap()
    };
    let (mut recalled, mut past) = (0, Vec::new());
    for (at, step) in steps.iter().enumerate() {
        if step.step_index == 0 {
            past.clear();
        }
        let prompt = decode(step);
        let now = prompt.lines().last().unwrap().to_string();
        assert!(now.starts_with("you are in room "), "{prompt:?}");
        assert_eq!(
            prompt,
            history_prompt("find the key", 2, &past, Some(&now)),
            "{} step {}",
            step.trajectory_id,
            step.step_index
        );
        recalled += usize::from(prompt.contains("[Observation 1: "));
        // Discrete(3) through 4 bins: the top bin executes action 2.
        let action = step.response_ids[0].min(2).to_string();
        past.push(PastDecision {
            text: Some(now),
            action,
        });
        if let Some(next) = steps.get(at + 1) {
            assert!(
                next.trajectory_id != step.trajectory_id || next.step_index == step.step_index + 1
            );
        }
    }
    assert!(recalled > 0, "no decision recalled another");

    let kl = ppo_kl(root, &vla, &tasks, &rollouts);
    assert!(
        kl.abs() < 1e-4,
        "the rebuilt prompts are the collected ones: KL {kl}"
    );
    let eval_rows = evaluate(&root.join("ppo/policy"), &tasks, &root.join("eval"), 1, &[]);
    assert_eq!(eval_rows.len(), 3);
    assert!(eval_rows.iter().all(|r| r.failure_reason.is_none()));
}

/// A user's adapter package, outside this tree: a corridor walked right to
/// its end, with a scripted expert; its instruction names the `max_steps`
/// the bridge tells `make`.
const PLUGIN_PYPROJECT: &str = r#"[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "mylab-adapters"
version = "0.1.0"

[project.entry-points."embodyflow_gym.adapters"]
corridor = "mylab.adapters:corridor"
"#;

const PLUGIN_ADAPTER: &str = r#"import numpy as np

PACKAGES = []


def corridor(env_id, kwargs, seed, max_steps=None):
    from embodyflow_gym.adapters import BadEnv

    if env_id != "Corridor-v0":
        raise BadEnv(f"one env, Corridor-v0, not {env_id}")
    return Corridor(int(kwargs.get("length", 3)), max_steps)


class Corridor:
    def __init__(self, length, max_steps):
        self.length, self.max_steps, self.position = length, max_steps, 0

    def space(self):
        return {"height": 0, "width": 0, "channels": 3, "proprio": 1,
                "action": {"kind": "discrete", "n": 2}, "instruction": True, "expert": True}

    def reset(self, seed):
        self.position = 0
        return f"walk {self.length} cells right within {self.max_steps} steps"

    def step(self, action):
        self.position = max(0, self.position + (1 if int(action) == 1 else -1))
        done = self.position >= self.length
        return done, done

    def observation(self):
        return np.zeros((0, 0, 3), dtype=np.uint8), np.array([self.position], dtype=np.float32)

    def state_key(self):
        return bytes([self.position])

    def expert_action(self):
        return 1

    def close(self):
        pass
"#;

/// A virtual environment in `dir` seeing the workspace's `.venv` packages
/// (a `.pth` file naming its site-packages), with the package `mylab`
/// installed editable from `dir/mylab`; its Python.
fn plugin_venv(dir: &Path) -> std::path::PathBuf {
    let package = dir.join("mylab");
    std::fs::create_dir_all(package.join("mylab")).unwrap();
    std::fs::write(package.join("pyproject.toml"), PLUGIN_PYPROJECT).unwrap();
    std::fs::write(package.join("mylab/__init__.py"), "").unwrap();
    std::fs::write(package.join("mylab/adapters.py"), PLUGIN_ADAPTER).unwrap();
    let workspace = embodyflow_gym::BridgeConfig::python(None);
    let venv = dir.join("venv");
    let sh = stdout_of;
    sh(&workspace, &["-m", "venv", "--without-pip", s(&venv)]);
    let sites = sh(
        &workspace,
        &["-c", "import site; print(site.getsitepackages()[0])"],
    );
    let python = venv.join("bin/python");
    let own = sh(
        &python,
        &["-c", "import site; print(site.getsitepackages()[0])"],
    );
    std::fs::write(Path::new(own.trim()).join("workspace.pth"), sites.trim()).unwrap();
    sh(
        &python,
        &[
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-e",
            s(&package),
        ],
    );
    python
}

#[test]
fn an_adapter_installed_as_a_plugin_runs_through_every_stage() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let python = plugin_venv(root);
    let bridge_python = format!("bridge.python={}", s(&python));
    let (tasks, vla, sft) = (root.join("tasks"), root.join("vla"), root.join("sft"));
    let generate = |out: &Path, adapter: &str| {
        let gym_python = format!("gym.python={}", s(&python));
        let adapter = format!("gym.adapter={adapter}");
        ok(
            "generate-tasks",
            &[
                "--out",
                s(out),
                "--seed",
                "3",
                "--set",
                "env=gym",
                "--set",
                &adapter,
                "--set",
                "gym.env_ids=[\"Corridor-v0\"]",
                "--set",
                "gym.max_steps=6",
                "--set",
                "count=2",
                "--set",
                &gym_python,
            ],
        )
    };
    // Registered by the package's entry point; `make` is told max_steps.
    generate(&tasks, "corridor");
    let task_rows: Vec<TaskRow> = rows(&tasks, TableName::Tasks);
    assert!(
        task_rows.iter().all(
            |r| r.env == "gym:corridor" && r.instruction == "walk 3 cells right within 6 steps"
        ),
        "{task_rows:?}"
    );
    // The same function named as a one-off, module:function.
    let one_off = root.join("one-off");
    generate(&one_off, "mylab.adapters:corridor");
    let one_off_rows: Vec<TaskRow> = rows(&one_off, TableName::Tasks);
    assert_eq!(one_off_rows[0].env, "gym:mylab.adapters:corridor");
    // The workspace's own Python does not have the package: named.
    let refused = run(
        "generate-tasks",
        &[
            "--out",
            s(&root.join("refused")),
            "--set",
            "env=gym",
            "--set",
            "gym.adapter=corridor",
            "--set",
            "gym.env_ids=[\"Corridor-v0\"]",
        ],
    );
    assert_eq!(refused.code, 2, "{refused}");
    assert!(
        refused
            .to_string()
            .contains("unknown adapter `corridor`; available: babyai, generic"),
        "{refused}"
    );

    let mut init = vec!["--out", s(&vla), "--input", s(&tasks), "--seed", "0"];
    init.extend_from_slice(TINY_VLA);
    init.extend(["--set", &bridge_python]);
    ok("init-policy", &init);
    let sft_python = format!("sft.bridge.python={}", s(&python));
    let summary = sft_of(&vla, &tasks, &sft, &[&sft_python]);
    assert!(
        summary.contains("| demonstrations | 2 successful expert demonstrations (gym:corridor)"),
        "{summary}"
    );
    let rollouts = root.join("rollouts");
    collect(&sft.join("policy"), &tasks, &rollouts, &[&bridge_python]);
    let trajectories: Vec<TrajectoryRow> = rows(&rollouts, TableName::Trajectories);
    assert_eq!(trajectories.len(), 4);
    assert!(trajectories.iter().all(|t| t.failure_reason.is_none()));
    let eval_rows = evaluate(
        &sft.join("policy"),
        &tasks,
        &root.join("eval"),
        1,
        &[&bridge_python],
    );
    assert_eq!(eval_rows.len(), 2);
    assert!(eval_rows.iter().all(|r| r.failure_reason.is_none()));
}

/// SFT on the expert's demonstrations when every worker hangs: there is
/// nothing to train on, and update-policy says why (every demonstration
/// ended by the fault, named), exit 2, writing nothing.
#[test]
fn sft_when_every_demonstration_hangs_names_the_fault() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = dir.path().join("tasks");
    let task_rows: Vec<TaskRow> = (0..2)
        .map(|t| {
            let mut spec = GymTaskSpec::new("faulty", "Counter-v0", t, 6);
            spec.kwargs = serde_json::json!({"fault": "hang", "at_step": 1});
            task_row(&format!("counter/{t}"), "train", &spec).unwrap()
        })
        .collect();
    write_table(&tasks, &task_rows);
    let vla = dir.path().join("vla");
    let mut init = vec!["--out", s(&vla), "--input", s(&tasks), "--seed", "0"];
    init.extend_from_slice(TINY_VLA);
    ok("init-policy", &init);
    let out = dir.path().join("sft");
    let mut args = vec!["--policy", s(&vla), "--input", s(&tasks), "--out", s(&out)];
    for set in [
        "objective=sft",
        "sft.bridge.workers=2",
        "sft.bridge.timeout_s=1",
    ] {
        args.extend(["--set", set]);
    }
    let result = run("update-policy", &args);
    assert_eq!(result.code, 2, "{result}");
    for needle in [
        "no training examples: every one of the 2 demonstrations of the expert",
        "all 2 ended by an infrastructure fault, not by the expert (first: task `counter/0`: ",
        "hung",
    ] {
        assert!(result.stderr.contains(needle), "{needle}: {result}");
    }
    assert!(!out.join("policy").exists(), "{result}");
}

/// The shipped text-world pipelines at their defaults (`history = 2`,
/// verl-agent's) at a few seconds' size: init-policy's probe prompts
/// recall two decisions and fit the pipeline's `max_instruction`, and the
/// collected decisions' prompts recall their episodes (the key-room's
/// sentences and actions; BabyAI's actions alone, after SFT on the bot's
/// demonstrations with the same prompts).
#[test]
fn the_text_world_pipelines_recall_two_decisions_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let pipelines = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pipelines");
    for (file, sets, recalled) in [
        (
            "textkeyroom-grpo.toml",
            &["train_tasks=6", "val_tasks=3", "draws=2", "group=2"][..],
            "[Observation 1: 'you are in room ",
        ),
        (
            "babyai-gigpo.toml",
            &[
                "train_tasks=6",
                "val_tasks=3",
                "draws=2",
                "group=2",
                "sft_demos=1",
                "sft_epochs=1",
            ][..],
            "[Action 1: '",
        ),
    ] {
        let out = dir.path().join(file);
        let mut args = vec![
            "run".to_string(),
            s(&pipelines.join(file)).to_string(),
            "--out".into(),
            s(&out).to_string(),
            "--set".into(),
            "iterations=1".into(),
        ];
        for set in sets {
            args.extend(["--set".to_string(), set.to_string()]);
        }
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        ok("pipeline", &refs);
        let init = std::fs::read_to_string(out.join("init/_summary.init-policy.md")).unwrap();
        assert!(
            init.contains("probe prompts with vla.history = 2"),
            "{file}: {init}"
        );
        let tokenizer = tokenizers::Tokenizer::from_file(out.join("init/tokenizer.json")).unwrap();
        let steps: Vec<StepRow> = rows(&out.join("it0/collect"), TableName::Steps);
        let recalling = steps.iter().any(|step| {
            let ids: Vec<u32> = step.prompt_ids.iter().map(|&id| id as u32).collect();
            tokenizer.decode(&ids, false).unwrap().contains(recalled)
        });
        assert!(recalling, "{file}: no collected prompt recalls a decision");
    }
}
