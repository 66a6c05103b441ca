//! The main job, `scripts/demo`, run end to end as a user runs it, at its
//! tiny scale (`DEMO_SCALE=tiny`): every section runs, the results table
//! and the curves exist, and the saved household rollouts that the README's
//! reprocessing examples read are non-empty. The full-size run's figures
//! are on docs/src/results/demo.md; this test keeps the script itself from
//! breaking when a stage key or a pipeline variable it passes changes.

use std::process::Command;

use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{TableName, TrajectoryRow};
use embodyflow_tests::Run;

use crate::examples::repo;

/// Runs scripts/demo with `env`.
fn demo(env: &[(&str, &str)]) -> Run {
    Command::new(repo().join("scripts/demo"))
        .envs(env.iter().copied())
        .output()
        .expect("spawn scripts/demo")
        .into()
}

#[test]
fn the_demo_runs_every_section_at_tiny_scale() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("demo");
    let out_s = out.to_str().unwrap();
    // cargo built the binaries this test runs: the demo uses them as they are.
    let Run {
        code,
        stdout,
        stderr,
    } = demo(&[("DEMO_SCALE", "tiny"), ("DEMO_BUILD", "no"), ("OUT", out_s)]);
    assert_eq!(code, 0, "stdout:\n{stdout}\nstderr:\n{stderr}");
    for section in [
        "== setup and build",
        "== 1. RL that learns",
        "== 2. saved rollouts reprocessed offline",
        "== 3. results",
        "section times: ",
        "demo finished in ",
    ] {
        assert!(stdout.contains(section), "no `{section}` in:\n{stdout}");
    }
    // Each section's time is printed as it ends.
    let timed = stdout
        .lines()
        .filter(|l| l.starts_with("-- ") && l.ends_with(" s"))
        .count();
    assert_eq!(timed, 4, "setup and build, the three sections:\n{stdout}");

    // The table: before and after RL for the key-room, the offline rows.
    let results = std::fs::read_to_string(out.join("results.md")).unwrap();
    assert!(stdout.contains(&results), "the table is printed:\n{stdout}");
    let row = |start: &str| {
        results
            .lines()
            .find(|l| l.starts_with(start))
            .unwrap_or_else(|| panic!("no row `{start}` in:\n{results}"))
            .to_string()
    };
    for start in ["| fresh VLA (before RL) | ", "| after 2 GRPO iterations | "] {
        let cell = row(start);
        // mean ± std of greedy success, its binomial spread, mean ± std of
        // the sampled success and of the groups with mixed outcomes.
        assert_eq!(cell.matches('±').count(), 4, "{cell}");
    }
    for reward in [
        "| outcome | GRPO |",
        "| verify | GRPO |",
        "| embodied_r1 | GRPO |",
    ] {
        assert!(
            row(reward).contains("groups whose rewards differ: "),
            "{results}"
        );
    }
    assert!(row("| embodied_r1 | grpo_step (rule) |").contains(" of "));

    // The curves, with the policy before RL drawn.
    for png in ["curve-evaluate-success.png", "success-cells.png"] {
        let path = out.join("keyroom/report").join(png);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(bytes.starts_with(b"\x89PNG"), "{}", path.display());
    }

    // The saved rollouts the README's make, just and ablation examples read.
    let rows: Vec<TrajectoryRow> =
        TableReader::open(&out.join("rollouts/trajectories"), TableName::Trajectories)
            .unwrap()
            .read_rows()
            .unwrap();
    assert_eq!(
        rows.len(),
        4 * 8,
        "4 task draws x 8 samples, every group kept"
    );

    // A directory the demo did not make is refused, its files kept; so is
    // an unknown scale.
    let other = dir.path().join("mine");
    std::fs::create_dir(&other).unwrap();
    std::fs::write(other.join("notes.txt"), "keep me").unwrap();
    let Run { code, stderr, .. } = demo(&[
        ("DEMO_SCALE", "tiny"),
        ("DEMO_BUILD", "no"),
        ("OUT", other.to_str().unwrap()),
    ]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("was not made by scripts/demo"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(other.join("notes.txt")).unwrap(),
        "keep me"
    );
    for (knob, bad) in [("DEMO_SCALE", "huge"), ("DEMO_BUILD", "always")] {
        let Run { code, stderr, .. } = demo(&[(knob, bad), ("OUT", out_s)]);
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains(&format!("{knob}={bad}")), "{stderr}");
    }
}
