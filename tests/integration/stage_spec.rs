//! Stages say what they are ([`embodyflow_core::spec`]): each binary's
//! `--help` shows its declaration's purpose, reads, writes and sharding, and
//! a stage that cannot shard refuses `--shard` (exit 2, nothing written)
//! instead of doing the whole work. `--help` lists every config key with
//! its default and meaning, free of rustdoc markup, and `--print-config`
//! needs no other flag.

use embodyflow_core::spec::{self, Sharding};
use embodyflow_tests::run;

/// `STAGE --print-config` with `sets` and no other flag: the resolved
/// config, after checking the exit code, in a fresh working directory that
/// must stay empty.
fn print_config(stage: &str, sets: &[&str]) -> serde_json::Value {
    print_report(stage, sets)["config"].clone()
}

/// [`print_config`]'s whole report.
fn print_report(stage: &str, sets: &[&str]) -> serde_json::Value {
    let cwd = tempfile::tempdir().unwrap();
    let mut args = vec!["--print-config"];
    for set in sets {
        args.extend(["--set", set]);
    }
    let output = std::process::Command::new(embodyflow_tests::bin(stage))
        .args(&args)
        .current_dir(cwd.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{stage} {args:?}\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let written: Vec<_> = std::fs::read_dir(cwd.path()).unwrap().collect();
    assert!(
        written.is_empty(),
        "{stage} --print-config wrote {written:?}"
    );
    let report: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(report["stage"], stage, "{stdout}");
    report
}

/// Every dotted leaf of a config tree with its value.
fn leaves(value: &serde_json::Value, prefix: &str, out: &mut Vec<(String, serde_json::Value)>) {
    match value.as_object() {
        Some(map) if !map.is_empty() => {
            for (key, child) in map {
                let dotted = if prefix.is_empty() {
                    key.clone()
                } else {
                    format!("{prefix}.{key}")
                };
                leaves(child, &dotted, out);
            }
        }
        _ => out.push((prefix.to_string(), value.clone())),
    }
}

#[test]
fn print_config_needs_no_other_flag() {
    for stage in spec::STAGES {
        let config = print_config(stage.name, &["output.zstd_level=7"]);
        assert_eq!(
            config["output"]["zstd_level"], 7,
            "{}: {config}",
            stage.name
        );
    }
    // f32 values print as their shortest decimal, not the widened f64.
    let config = print_config("compute-advantages", &[]);
    assert_eq!(config["gae"]["gamma"].to_string(), "0.99");
    assert_eq!(config["stepopsd"]["alpha_clip"].to_string(), "0.2");
    // Without --print-config, --out is still required (exit 2).
    let result = run("generate-tasks", &["--set", "count=3"]);
    assert_eq!(result.code, 2, "{result}");
    assert!(result.stderr.contains("--out"), "{result}");
}

/// `reads`: the tables a resolved config makes its stage read beyond its
/// every-run reads, each one of the stage's conditional reads.
#[test]
fn print_config_reports_the_tables_the_config_reads() {
    let cases: [(&str, &[&str], &[&str]); 8] = [
        ("update-policy", &["objective=sft"], &["tasks"]),
        (
            "update-policy",
            &["objective=ppo"],
            &["trajectories", "steps", "advantages"],
        ),
        (
            "update-policy",
            &["objective=lapo"],
            &["trajectories", "steps", "advantages"],
        ),
        ("score-rewards", &["reward.fn=outcome"], &[]),
        ("score-rewards", &["reward.fn=verify"], &["tasks"]),
        ("compute-advantages", &["estimator=gae"], &[]),
        (
            "compute-advantages",
            &["estimator=grpo", "stepopsd.enabled=true"],
            &["teacher_logp"],
        ),
        ("generate-tasks", &[], &[]),
    ];
    for (stage, sets, expected) in cases {
        let report = print_report(stage, sets);
        let reads: Vec<&str> = report["reads"]
            .as_array()
            .unwrap_or_else(|| panic!("{stage}: no reads in {report}"))
            .iter()
            .map(|t| t.as_str().unwrap())
            .collect();
        assert_eq!(reads, expected, "{stage} {sets:?}");
        let declared = spec::stage(stage).unwrap();
        for table in reads {
            assert!(
                declared
                    .reads
                    .iter()
                    .any(|r| r.table.as_str() == table && r.need != spec::Need::Always),
                "{stage}: {table}"
            );
        }
    }
}

#[test]
fn every_stage_help_lists_its_config_keys_with_defaults() {
    for stage in spec::STAGES {
        let help = run(stage.name, &["--help"]);
        assert_eq!(help.code, 0, "{} --help\n{help}", stage.name);
        let text = &help.stdout;
        assert!(
            !text.contains("[`"),
            "{} --help shows rustdoc markup:\n{text}",
            stage.name
        );
        let mut keys = Vec::new();
        leaves(&print_config(stage.name, &[]), "", &mut keys);
        assert!(keys.len() >= 3, "{}: {keys:?}", stage.name);
        let section = text
            .split_once("Config keys")
            .unwrap_or_else(|| panic!("{} --help has no config keys:\n{text}", stage.name))
            .1;
        for (key, default) in keys {
            let shown = match &default {
                serde_json::Value::Null => "unset".to_string(),
                other => other.to_string(),
            };
            let line = section
                .lines()
                .position(|l| l.trim_start().starts_with(&format!("{key} = {shown}")))
                .unwrap_or_else(|| {
                    panic!("{} --help lacks `{key} = {shown}`:\n{section}", stage.name)
                });
            // The meaning follows on the line or, after a long default, on the next.
            let lines: Vec<&str> = section.lines().collect();
            let rest = lines[line].trim_start()[format!("{key} = {shown}").len()..].trim();
            let meaning = if rest.is_empty() {
                lines[line + 1].trim()
            } else {
                rest
            };
            assert!(
                !meaning.is_empty() && !meaning.contains("undocumented"),
                "{} --help: `{key}` has no meaning",
                stage.name
            );
        }
    }
}

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
