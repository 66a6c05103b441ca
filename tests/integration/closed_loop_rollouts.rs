//! Closed-loop collection from the command line: tabletop tasks
//! from `generate-tasks --set env=tabletop`, a VLA from `init-policy --set
//! kind=vla`, `collect-rollouts` with G = 2 → `trajectories` (one row per
//! episode: decisions, env steps, success, no response text) and `steps`
//! (one row per decision, the observation bytes decoding to the checkpoint's
//! shape) that validate, the same content on a rerun and as two merged
//! shards; bad VLA keys and a policy of the wrong kind are refused (exit 2,
//! nothing written).

use std::collections::HashMap;
use std::path::Path;

use embodyflow_core::dataset::TableReader;
use embodyflow_core::manifest::Manifest;
use embodyflow_core::observation::decode;
use embodyflow_core::schemas::{StepRow, TableName, TrajectoryRow};
use embodyflow_tests::{TINY_POLICY, run, tabletop_tasks_and_tiny_vla, tiny_vla_init};

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn ok(name: &str, args: &[&str]) -> String {
    let result = run(name, args);
    assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
    result.stdout
}

/// Six tabletop train tasks and a tiny VLA under `root`.
fn prepare(root: &Path) {
    tabletop_tasks_and_tiny_vla(root, 6);
}

/// `collect-rollouts` of the VLA on the tasks into `out` (G = 2, batches
/// of 4 episodes) with `seed`, and `extra` arguments.
fn collect(root: &Path, out: &Path, seed: &str, extra: &[&str]) -> String {
    let (vla, tasks) = (root.join("vla"), root.join("tasks"));
    let mut args = vec![
        "--policy",
        s(&vla),
        "--input",
        s(&tasks),
        "--out",
        s(out),
        "--seed",
        seed,
        "--set",
        "group_size=2",
        "--set",
        "batch_rows=4",
    ];
    args.extend(extra);
    ok("collect-rollouts", &args)
}

fn content_hash(dir: &Path, table: &str) -> String {
    Manifest::read(&dir.join(table)).unwrap().content_hash
}

#[test]
fn a_vla_collects_closed_loop_episodes_that_validate_and_reproduce() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    prepare(root);
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("vla").join("config.json")).unwrap())
            .unwrap();
    assert_eq!(config["kind"], "vla", "{config}");
    let (k, d) = (config["chunk_len"].as_u64().unwrap() as usize, 4usize);
    assert_eq!(config["action_dim"].as_u64(), Some(d as u64));

    let out = root.join("rollouts");
    let summary = collect(root, &out, "3", &[]);
    for line in ["decisions/s", "env steps/s", "| wall time | world"] {
        assert!(summary.contains(line), "`{line}` in\n{summary}");
    }
    for table in ["trajectories", "steps"] {
        let printed = ok("table", &["validate", s(&out.join(table))]);
        assert!(printed.starts_with(&format!("ok {table}")), "{printed}");
    }
    let trajectories: Vec<TrajectoryRow> =
        TableReader::open(&out.join("trajectories"), TableName::Trajectories)
            .unwrap()
            .read_rows()
            .unwrap();
    let steps: Vec<StepRow> = TableReader::open(&out.join("steps"), TableName::Steps)
        .unwrap()
        .read_rows()
        .unwrap();
    assert_eq!(trajectories.len(), 6 * 2, "every task once, G = 2");
    let mut per_episode: HashMap<&str, Vec<&StepRow>> = HashMap::new();
    for step in &steps {
        per_episode
            .entry(&step.trajectory_id)
            .or_default()
            .push(step);
    }
    for row in &trajectories {
        assert!(row.task_id.starts_with("tabletop-"), "{}", row.task_id);
        assert_eq!(
            row.trajectory_id,
            format!("{}/s{}", row.group_id, row.sample_index)
        );
        assert!(row.response_text.is_none());
        assert!(
            row.ever_grasped.is_some(),
            "an episode records its grasp fact"
        );
        let decisions = &per_episode[row.trajectory_id.as_str()];
        assert_eq!(
            decisions.len(),
            row.num_steps as usize,
            "{}",
            row.trajectory_id
        );
        assert!(row.num_steps >= 1);
        // Every chunk but the last runs K env steps.
        assert!(row.env_steps as usize > (decisions.len() - 1) * k);
        assert!(row.env_steps as usize <= decisions.len() * k);
        for (index, step) in decisions.iter().enumerate() {
            assert_eq!(step.step_index as usize, index);
            assert_eq!(step.response_ids.len(), k * d);
            assert_eq!(step.old_logprobs.len(), k * d);
            assert!(step.old_logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
            assert!(step.response_ids.iter().all(|&t| (0..256).contains(&t)));
            assert!(!step.prompt_ids.is_empty(), "the instruction's ids");
            let observation = decode(step.observation.as_deref().unwrap()).unwrap();
            let shape = observation.shape;
            assert_eq!((shape.height, shape.width, shape.channels), (32, 32, 3));
            assert_eq!(shape.proprio, 5);
        }
    }
    // Copies of a task start alike: their first observations are equal.
    let first = |id: &str| per_episode[id][0].observation.clone().unwrap();
    for row in trajectories.iter().filter(|r| r.sample_index == 1) {
        let sibling = format!("{}/s0", row.group_id);
        assert_eq!(first(&row.trajectory_id), first(&sibling), "{sibling}");
    }

    // The same seed writes the same content.
    let again = root.join("again");
    collect(root, &again, "3", &[]);
    for table in ["trajectories", "steps"] {
        assert_eq!(
            content_hash(&out, table),
            content_hash(&again, table),
            "{table}"
        );
    }
    // Another seed draws other actions.
    let other = root.join("other");
    collect(root, &other, "4", &[]);
    assert_ne!(content_hash(&out, "steps"), content_hash(&other, "steps"));

    // Two shards merged equal the unsharded run.
    let parts: Vec<_> = (0..2)
        .map(|i| root.join("_shards").join(i.to_string()))
        .collect();
    for (i, part) in parts.iter().enumerate() {
        collect(root, part, "3", &["--shard", &format!("{i}/2")]);
    }
    let merged = root.join("merged");
    ok("table", &["merge", s(&merged), s(&parts[0]), s(&parts[1])]);
    for table in ["trajectories", "steps"] {
        assert_eq!(
            content_hash(&out, table),
            content_hash(&merged, table),
            "{table}"
        );
        let rows: u64 = parts
            .iter()
            .map(|p| Manifest::read(&p.join(table)).unwrap().num_rows)
            .sum();
        assert_eq!(rows, Manifest::read(&out.join(table)).unwrap().num_rows);
    }
}

#[test]
fn bad_vla_keys_and_a_policy_of_the_wrong_kind_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    prepare(root);
    for (set, key) in [
        ("vla.patch_size=5", "vla.patch_size"),
        ("vla.n_embd=31", "vla.n_embd"),
        ("vla.max_instruction=3", "vla.max_instruction"),
    ] {
        let out = root.join("refused");
        let mut args = tiny_vla_init(s(&out));
        args.extend(["--set", set]);
        let result = run("init-policy", &args);
        assert_eq!(result.code, 2, "{set}\n{result}");
        assert!(result.stderr.contains(key), "{set}\n{result}");
        assert!(!out.exists(), "{set}: nothing written");
    }

    // A plan policy on tabletop tasks, a VLA on household tasks.
    let plan = root.join("plan");
    let mut init = vec!["--out", s(&plan)];
    init.extend(TINY_POLICY);
    ok("init-policy", &init);
    let household = root.join("household");
    ok(
        "generate-tasks",
        &["--out", s(&household), "--set", "count=4"],
    );
    for (policy, tasks, named) in [
        (&plan, root.join("tasks"), "is a plan policy"),
        (&root.join("vla"), household.clone(), "is a VLA"),
    ] {
        let out = root.join("wrong");
        let result = run(
            "collect-rollouts",
            &[
                "--policy",
                s(policy),
                "--input",
                s(&tasks),
                "--out",
                s(&out),
            ],
        );
        assert_eq!(result.code, 2, "{result}");
        assert!(result.stderr.contains(named), "{result}");
        assert!(result.stderr.contains("task `"), "{result}");
        assert!(!out.exists(), "nothing written");
    }
}
