//! `generate-tasks --set env=tabletop`: a tabletop tasks table a researcher
//! writes from the command line, with the scene spec in each row, the same
//! on a rerun; a `suite` with the household world is refused.

use std::path::Path;

use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{TableName, TaskRow};
use embodyflow_tests::run;

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn generate(out: &Path, sets: &[&str]) -> Vec<TaskRow> {
    let mut args = vec!["--out", s(out), "--seed", "7"];
    for set in sets {
        args.extend(["--set", set]);
    }
    let result = run("generate-tasks", &args);
    assert_eq!(result.code, 0, "{result}");
    TableReader::open(&out.join("tasks"), TableName::Tasks)
        .unwrap()
        .read_rows::<TaskRow>()
        .unwrap()
}

#[test]
fn tabletop_tasks_carry_their_scene_and_reproduce() {
    let dir = tempfile::tempdir().unwrap();
    let rows = generate(
        &dir.path().join("a"),
        &["env=tabletop", "split=val", "count=8"],
    );
    assert_eq!(rows.len(), 8);
    let suites: Vec<&str> = rows.iter().map(|r| r.suite.as_str()).collect();
    for suite in [
        "tabletop-spatial",
        "tabletop-object",
        "tabletop-goal",
        "tabletop-long",
    ] {
        assert_eq!(
            suites.iter().filter(|s| **s == suite).count(),
            2,
            "{suites:?}"
        );
    }
    for row in &rows {
        assert_eq!((row.env.as_str(), row.split.as_str()), ("tabletop", "val"));
        let suite = row.suite.strip_prefix("tabletop-").unwrap();
        assert!(
            row.task_id.starts_with(&format!("tabletop-{suite}/val/7/")),
            "{}",
            row.task_id
        );
        let spec: serde_json::Value =
            serde_json::from_slice(row.observation.as_deref().unwrap()).unwrap();
        assert_eq!(spec["instruction"], row.instruction.as_str());
        assert!(spec["objects"].as_array().unwrap().len() >= 2);
        assert!(!spec["goals"].as_array().unwrap().is_empty());
        assert!(row.gt_actions.is_none() && row.task_type.is_some());
    }
    let again = generate(
        &dir.path().join("b"),
        &["env=tabletop", "split=val", "count=8"],
    );
    assert_eq!(rows, again, "a rerun writes the same tasks");
    let long = generate(
        &dir.path().join("c"),
        &["env=tabletop", "suite=long", "count=3"],
    );
    assert!(
        long.iter()
            .all(|r| r.suite == "tabletop-long" && r.split == "train")
    );
}

#[test]
fn a_suite_for_the_household_world_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let result = run("generate-tasks", &["--out", s(&out), "--set", "suite=goal"]);
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result.stderr.contains("suite") && result.stderr.contains("household"),
        "{result}"
    );
    assert!(!out.exists());
}
