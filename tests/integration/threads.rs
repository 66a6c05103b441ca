//! A stage process's threads, OpenMP wait policy and CPUs, set before any
//! work (`embodyflow_core::threads`): a torch stage re-executes itself with
//! `OMP_NUM_THREADS`, `MKL_NUM_THREADS` and `OMP_WAIT_POLICY` from its
//! `threads` and `omp_wait_policy` keys (and only when they differ from its
//! environment), pins itself to `EMBODYFLOW_CPUS`, and says what it ran with
//! in its summary and log; bad settings are refused naming them; and the
//! runner hands the concurrent shards of a step disjoint CPU sets, and
//! every process of a step the thread count the step declares.

use std::collections::BTreeSet;
use std::path::Path;

use embodyflow_core::threads::CpuList;
use embodyflow_tests::{Run, TINY_POLICY, run, run_with_env};

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn ok(result: Run, what: &str) -> Run {
    assert_eq!(result.code, 0, "{what}\n{result}");
    result
}

/// The value of summary line `| key | value |`.
fn summary_value(dir: &Path, stage: &str, key: &str) -> String {
    let path = dir.join(format!("_summary.{stage}.md"));
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("| {key} | ")))
        .and_then(|rest| rest.strip_suffix(" |"))
        .unwrap_or_else(|| panic!("no `{key}` line in {}:\n{text}", path.display()))
        .to_string()
}

/// The CPU list in a `threads` summary value `N (CPUs LIST)`.
fn cpus_of(threads: &str) -> CpuList {
    threads
        .split_once("(CPUs ")
        .and_then(|(_, rest)| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no CPU list in `{threads}`"))
        .parse()
        .unwrap()
}

/// The log line in which the stage reported its threads.
fn threads_log(dir: &Path, stage: &str) -> String {
    let path = dir.join(format!("_log.{stage}.txt"));
    let text = std::fs::read_to_string(&path).unwrap();
    text.lines()
        .find(|l| l.contains("threads set up"))
        .unwrap_or_else(|| panic!("no threads line in {}:\n{text}", path.display()))
        .to_string()
}

/// Train tasks and a tiny policy under `root`.
fn prepare(root: &Path) {
    ok(
        run(
            "generate-tasks",
            &[
                "--out",
                s(&root.join("train")),
                "--seed",
                "1",
                "--set",
                "count=4",
            ],
        ),
        "generate-tasks",
    );
    let init_dir = root.join("init");
    let mut init = vec!["--out", s(&init_dir)];
    init.extend(TINY_POLICY);
    ok(run("init-policy", &init), "init-policy");
}

#[test]
fn torch_stages_set_threads_and_wait_policy_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    prepare(root);
    // init-policy is a torch stage too: it ran with the defaults.
    assert_eq!(
        summary_value(&root.join("init"), "init-policy", "omp_wait_policy"),
        "passive"
    );
    let mine = CpuList::of_this_thread().unwrap();
    let (init, train) = (root.join("init"), root.join("train"));
    let collect = |out: &str, sets: &[&str], env: &[(&str, &str)]| {
        let out = root.join(out);
        let mut args = vec![
            "--policy",
            s(&init),
            "--input",
            s(&train),
            "--out",
            s(&out),
            "--set",
            "group_size=2",
            "--set",
            "tasks_per_iteration=2",
            "--set",
            "max_new_tokens=8",
        ];
        for set in sets {
            args.extend(["--set", set]);
        }
        // The environment the tests run in must not decide the outcome.
        let mut all = vec![("OMP_NUM_THREADS", ""), ("OMP_WAIT_POLICY", "")];
        all.extend(env);
        ok(
            run_with_env("collect-rollouts", &args, &all),
            out.to_str().unwrap(),
        );
        out
    };

    // Defaults: as many threads as CPUs, passive; set by re-executing.
    let out = collect("defaults", &[], &[]);
    let threads = summary_value(&out, "collect-rollouts", "threads");
    assert_eq!(threads, format!("{} (CPUs {mine})", mine.len()));
    assert_eq!(
        summary_value(&out, "collect-rollouts", "omp_wait_policy"),
        "passive"
    );
    let log = threads_log(&out, "collect-rollouts");
    for part in [
        "reexecuted=true",
        &format!("omp_num_threads=Some(\"{}\")", mine.len()),
        "omp_wait_policy_env=Some(\"PASSIVE\")",
    ] {
        assert!(log.contains(part), "{part}: {log}");
    }

    // The keys decide.
    let out = collect("one", &["threads=1", "omp_wait_policy=active"], &[]);
    assert_eq!(
        summary_value(&out, "collect-rollouts", "threads"),
        format!("1 (CPUs {mine})")
    );
    let log = threads_log(&out, "collect-rollouts");
    for part in [
        "reexecuted=true",
        "source=\"threads\"",
        "omp_num_threads=Some(\"1\")",
        "omp_wait_policy_env=Some(\"ACTIVE\")",
    ] {
        assert!(log.contains(part), "{part}: {log}");
    }

    // Started with the environment it wants, it does not re-execute.
    let out = collect(
        "as_wanted",
        &["threads=1"],
        &[
            ("OMP_NUM_THREADS", "1"),
            ("MKL_NUM_THREADS", "1"),
            ("OMP_WAIT_POLICY", "PASSIVE"),
        ],
    );
    assert!(threads_log(&out, "collect-rollouts").contains("reexecuted=false"));

    // threads = 0 takes OMP_NUM_THREADS from the environment when it is set;
    // inherit leaves OMP_WAIT_POLICY as it is.
    let out = collect(
        "inherit",
        &["omp_wait_policy=inherit"],
        &[("OMP_NUM_THREADS", "3"), ("OMP_WAIT_POLICY", "ACTIVE")],
    );
    assert_eq!(
        summary_value(&out, "collect-rollouts", "threads"),
        format!("3 (CPUs {mine})")
    );
    assert_eq!(
        summary_value(&out, "collect-rollouts", "omp_wait_policy"),
        "inherit (OMP_WAIT_POLICY=ACTIVE)"
    );

    // EMBODYFLOW_CPUS pins the process; threads follow its CPUs.
    let first = mine.cpus()[0].to_string();
    let out = collect("pinned", &[], &[("EMBODYFLOW_CPUS", &first)]);
    assert_eq!(
        summary_value(&out, "collect-rollouts", "threads"),
        format!("1 (CPUs {first})")
    );
    assert!(threads_log(&out, "collect-rollouts").contains("pinned=true"));
}

#[test]
fn bad_thread_settings_are_refused_naming_them() {
    let print = |stage: &str, set: &str| {
        run_with_env(
            stage,
            &["--print-config", "--set", set],
            &[("OMP_NUM_THREADS", "")],
        )
    };
    for (stage, set, key, why) in [
        (
            "collect-rollouts",
            "threads=-1",
            "threads",
            "expected usize",
        ),
        (
            "update-policy",
            "threads=100000",
            "threads",
            "expected a thread count from 0",
        ),
        (
            "evaluate",
            "omp_wait_policy=spin",
            "omp_wait_policy",
            "unknown variant `spin`",
        ),
        ("teacher-logp", "threads=two", "threads", "expected usize"),
    ] {
        let result = print(stage, set);
        assert_eq!(result.code, 2, "{stage} {set}\n{result}");
        let report: serde_json::Value = serde_json::from_str(result.stdout.trim()).unwrap();
        assert_eq!(report["problem"]["key"], key, "{stage} {set}");
        let message = report["problem"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("config key `{key}`: ")) && message.contains(why),
            "{stage} {set}: {message}"
        );
    }
    // Rayon stages take `threads` alone; single-threaded stages no key.
    for (stage, set, key) in [
        ("score-rewards", "omp_wait_policy=active", "omp_wait_policy"),
        ("judge-steps", "threads=2", "threads"),
    ] {
        let result = print(stage, set);
        assert_eq!(result.code, 2, "{stage} {set}\n{result}");
        assert!(
            result
                .stdout
                .contains(&format!("unknown config key `{key}`")),
            "{stage} {set}\n{result}"
        );
    }
    let result = ok(print("score-rewards", "threads=2"), "score-rewards");
    assert!(result.stdout.contains("\"threads\":2"), "{result}");
    let result = ok(print("update-policy", "threads=0"), "update-policy");
    for part in ["\"threads\":0", "\"omp_wait_policy\":\"passive\""] {
        assert!(result.stdout.contains(part), "{part}: {result}");
    }
    let help = ok(run("collect-rollouts", &["--help"]), "--help").stdout;
    for part in [
        "threads = 0",
        "omp_wait_policy = \"passive\"",
        "EMBODYFLOW_CPUS",
    ] {
        assert!(help.contains(part), "{part}:\n{help}");
    }

    // A CPU list that is not one, or names no CPU this process may use:
    // bad usage naming the variable, nothing written.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    for list in ["x", "3-1", "1023"] {
        let result = run_with_env(
            "generate-tasks",
            &["--out", s(&out), "--set", "count=2"],
            &[("EMBODYFLOW_CPUS", list)],
        );
        assert_eq!(result.code, 2, "{list}\n{result}");
        assert!(
            result.stderr.contains(&format!("EMBODYFLOW_CPUS=`{list}`")),
            "{list}\n{result}"
        );
        assert!(!out.join("tasks").exists(), "{list}");
    }
}

const PIPELINE: &str = r#"
[[step]]
name = "train"
stage = "generate-tasks"
seed = 1
set = { split = "train", count = 6 }

[[step]]
name = "init"
stage = "init-policy"
set = { model = { n_embd = 32, n_layer = 1, n_head = 2, n_ctx = 1024 }, tokenizer = { vocab_size = 400, corpus_tasks = 60 } }

[[step]]
name = "collect"
stage = "collect-rollouts"
policy = "${init}"
inputs = ["${train}"]
seed = 3
set = { group_size = 2, max_new_tokens = 8, tasks_per_iteration = 4 }
shards = SHARDS
"#;

/// The content hash of table `table` in `dir`.
fn content_hash(dir: &Path, table: &str) -> String {
    embodyflow_core::manifest::Manifest::read(&dir.join(table))
        .unwrap()
        .content_hash
}

/// The numerics a step's record keys it on.
fn numerics(step: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(step.join("_step.json")).unwrap();
    let record: serde_json::Value = serde_json::from_str(&text).unwrap();
    record["key_parts"]["numerics"].clone()
}

/// The thread count of every process is the step's `cpus` (one when it
/// says none), whatever the machine has and however many shards share it:
/// sharded and unsharded runs compute alike, and the key holds the count.
#[test]
fn the_runner_gives_concurrent_shards_disjoint_cpus_and_the_steps_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let mine = CpuList::of_this_thread().unwrap();
    let shards = mine.len().clamp(2, 4);
    // The environment the tests run in must not decide the outcome.
    let env = [
        ("OMP_NUM_THREADS", "8"),
        ("RAYON_NUM_THREADS", "8"),
        ("EMBODYFLOW_CPUS", ""),
    ];
    let run_pipeline = |name: &str, text: String| {
        let file = dir.path().join(format!("{name}.toml"));
        std::fs::write(&file, text).unwrap();
        let out = dir.path().join(name);
        ok(
            run_with_env("pipeline", &["run", s(&file), "--out", s(&out)], &env),
            name,
        );
        out
    };
    let sharded = run_pipeline("sharded", PIPELINE.replace("SHARDS", &shards.to_string()));
    let mut seen = Vec::new();
    for i in 0..shards {
        let shard = sharded.join("collect/_shards").join(i.to_string());
        let threads = summary_value(&shard, "collect-rollouts", "threads");
        let cpus = cpus_of(&threads);
        assert_eq!(
            threads,
            format!("1 (CPUs {cpus})"),
            "shard {i}: the step's one CPU's thread, on its share"
        );
        assert!(
            cpus.cpus().iter().all(|c| mine.cpus().contains(c)),
            "shard {i}: {cpus} not among {mine}"
        );
        seen.extend(cpus.cpus().iter().copied());
    }
    let distinct: BTreeSet<usize> = seen.iter().copied().collect();
    if mine.len() >= shards {
        assert_eq!(distinct.len(), seen.len(), "shares overlap: {seen:?}");
        assert_eq!(
            distinct.len(),
            mine.len(),
            "shares leave CPUs out: {seen:?}"
        );
    } else {
        assert_eq!(distinct.len(), mine.len(), "{seen:?}");
    }
    // Unsharded, on every CPU of the machine: still the step's one thread,
    // and the very tables of the sharded run.
    let whole = run_pipeline("whole", PIPELINE.replace("SHARDS", "1"));
    let collect = whole.join("collect");
    assert_eq!(
        summary_value(&collect, "collect-rollouts", "threads"),
        format!("1 (CPUs {mine})")
    );
    for table in ["trajectories", "steps"] {
        assert_eq!(
            content_hash(&collect, table),
            content_hash(&sharded.join("collect"), table),
            "{table}"
        );
    }
    let expected = serde_json::json!(1);
    assert_eq!(numerics(&collect)["threads"], expected);
    assert_eq!(numerics(&sharded.join("collect"))["threads"], expected);
    assert!(numerics(&collect)["cpu_capability"].is_string());
    assert!(numerics(&whole.join("train"))["threads"].is_null());
    // `cpus = 2`: two threads, and another key.
    let two = run_pipeline("two", PIPELINE.replace("shards = SHARDS", "cpus = 2"));
    assert_eq!(
        summary_value(&two.join("collect"), "collect-rollouts", "threads"),
        format!("2 (CPUs {mine})")
    );
    assert_eq!(
        numerics(&two.join("collect"))["threads"],
        serde_json::json!(2)
    );
}
