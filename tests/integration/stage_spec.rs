//! Stages say what they are ([`embodyflow_core::spec`]): each binary's
//! `--help` shows its declaration's purpose, reads, writes and sharding, and
//! a stage that cannot shard refuses `--shard` (exit 2, nothing written)
//! instead of doing the whole work.

use embodyflow_core::spec::{self, Sharding};
use embodyflow_tests::run;

#[test]
fn every_stage_help_shows_its_declaration() {
    for stage in spec::STAGES {
        let result = run(stage.name, &["--help"]);
        assert_eq!(result.code, 0, "{} --help\n{result}", stage.name);
        assert!(
            result.stdout.contains(stage.purpose) && result.stdout.contains(&stage.help()),
            "{} --help lacks its declaration:\n{}\n--- expected\n{}",
            stage.name,
            result.stdout,
            stage.help()
        );
    }
}

#[test]
fn a_stage_that_cannot_shard_refuses_shard() {
    let dir = tempfile::tempdir().unwrap();
    let refused: Vec<_> = spec::STAGES
        .iter()
        .filter(|s| matches!(s.sharding, Sharding::Refused(_)))
        .collect();
    assert!(refused.iter().any(|s| s.name == "update-policy"));
    for stage in refused {
        let out = dir.path().join(stage.name);
        let out_arg = out.to_str().unwrap();
        let mut args = vec!["--out", out_arg, "--shard", "1/2"];
        if stage.checkpoint(spec::CheckpointFlag::Policy).is_some() {
            args.extend(["--policy", "no-such-checkpoint"]);
        }
        let result = run(stage.name, &args);
        assert_eq!(result.code, 2, "{} --shard 1/2\n{result}", stage.name);
        assert!(
            result.stderr.contains(&format!(
                "{} --shard 1/2: this stage cannot shard",
                stage.name
            )),
            "{result}"
        );
        assert!(!out.exists(), "{} wrote {}", stage.name, out.display());
        // The whole work, 0/1, is not refused: it fails later, on the
        // missing checkpoint or not at all.
        let whole: Vec<&str> = args
            .iter()
            .map(|a| if *a == "1/2" { "0/1" } else { a })
            .collect();
        let result = run(stage.name, &whole);
        assert!(!result.stderr.contains("cannot shard"), "{result}");
    }
}
