//! A writer SIGKILLed mid-write leaves nothing a reader accepts, and a rerun
//! produces a valid table.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use embodyflow_core::schemas::StepRow;
use embodyflow_tests::{bin, one_shot_step, run};

/// A steps table large enough that importing it takes a while.
fn write_large_jsonl(path: &std::path::Path, rows: usize) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for i in 0..rows {
        let response_ids = (0..256).map(|t| (t * 13 + i as i32) % 500).collect();
        let row = StepRow {
            prompt_ids: (0..128).map(|t| (t * 7 + i as i32) % 500).collect(),
            old_logprobs: (0..256).map(|t| -((t % 17) as f32) / 7.0).collect(),
            ..one_shot_step(&format!("it0/household/train/1/{i:06}/d0/s0"), response_ids)
        };
        serde_json::to_writer(&mut out, &row).unwrap();
        out.write_all(b"\n").unwrap();
    }
}

fn shards_in_progress(out: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(out) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".steps.tmp-"))
        .map(|e| std::fs::read_dir(e.path()).map(|d| d.count()).unwrap_or(0))
        .sum()
}

#[test]
fn sigkill_mid_write_leaves_no_table_and_a_rerun_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let jsonl = dir.path().join("steps.jsonl");
    write_large_jsonl(&jsonl, 30_000);
    let out = dir.path().join("out");
    let import_args = [
        "import",
        "--table",
        "steps",
        "--from",
        jsonl.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--rows-per-shard",
        "2000",
        "--overwrite",
    ];
    // Kill at different depths: after the first shard file appears, and later.
    for shards_before_kill in [1, 4] {
        let mut child = Command::new(bin("table"))
            .args(import_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while shards_in_progress(&out) < shards_before_kill {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the import finished before it could be killed; make the input larger"
            );
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no shard appeared"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let table = out.join("steps");
        if table.exists() {
            // Only a table from an earlier, complete run may be there.
            let result = run("table", &["validate", table.to_str().unwrap()]);
            assert_eq!(
                result.code, 0,
                "a killed writer left a table that is not whole:\n{result}"
            );
        } else {
            let result = run("table", &["validate", table.to_str().unwrap()]);
            assert_eq!(result.code, 2, "{result}");
        }
        // What the killed writer left is hidden from readers of the dataset.
        let listed = run("table", &["validate", out.to_str().unwrap()]);
        assert_ne!(
            listed.code, 0,
            "the dataset directory itself is not a table:\n{listed}"
        );

        let rerun = run("table", &import_args);
        assert_eq!(rerun.code, 0, "{rerun}");
        let result = run("table", &["validate", "--deep", table.to_str().unwrap()]);
        assert_eq!(result.code, 0, "{result}");
        assert!(result.stdout.contains("30000 rows"), "{result}");
        let leftovers: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            leftovers,
            vec!["steps".to_string()],
            "the rerun cleans up after the killed writer"
        );
    }
}
