//! Rollouts from other trainers: a veRL-layout dump (the JSON lines
//! `RayPPOTrainer._dump_generations` writes) imported with `table import
//! --format verl`, rescored by score-rewards under two reward functions,
//! turned into advantages by compute-advantages under two estimators, and
//! exported with `table export --format verl` for a pandas join; TRL-style
//! lines, conversational ones rendered as TRL renders them (checked against
//! transformers' `apply_chat_template`); Parquet files mapped with
//! `--column`, veRL's per-token tensors included (token_level_rewards,
//! response_mask with holes, values: GRPO and token-level GAE on them
//! checked against veRL's numerics by hand); and the bad inputs that must
//! exit 2 with nothing written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use embodyflow_algos::spans::test_tokenizer;
use embodyflow_core::dataset::TableReader;
use embodyflow_core::schemas::{
    AdvantageRow, PlanAction, RewardRow, StepRow, TableName, TaskRow, TrajectoryRow,
};
use embodyflow_tests::{Run, TINY_POLICY, read_advantages, run};

const GT: [(i64, &str); 3] = [
    (0, "find a Mug"),
    (1, "pick up the Mug"),
    (2, "find a Sink"),
];

fn plan_json(steps: &[(i64, &str)]) -> String {
    let items: Vec<String> = steps
        .iter()
        .map(|(id, n)| format!("{{\"action_id\": {id}, \"action_name\": \"{n}\"}}"))
        .collect();
    format!(
        "{{\"language_plan\": [\"find a Mug\"], \"executable_plan\": [{}]}}",
        items.join(", ")
    )
}

/// The four responses of every group, in sample order: perfect, a prefix of
/// two, shifted (first step wrong), cut off (no JSON).
fn responses() -> [String; 4] {
    [
        plan_json(&GT),
        plan_json(&GT[..2]),
        plan_json(&[GT[2], GT[0], GT[1]]),
        "{\"executable_plan\": [{\"action_id\": 0, \"action_na".into(),
    ]
}

/// veRL's scores of the three groups (rows in sample order).
const SCORES: [[f64; 4]; 3] = [
    [1.0, 0.0, 0.5, 0.0],
    [1.0, 1.0, 0.25, 0.0],
    [0.0, 0.0, 0.0, 2.0],
];

/// One dump line as veRL writes it: input, output, gts, score, step, then
/// the reward extra infos (here `acc` and the `uid` a reward function returned).
fn verl_line(group: usize, sample: usize, uid: bool) -> serde_json::Value {
    let gts = match group {
        // A list of actions, the plan as a JSON string, and a math answer.
        0 => serde_json::json!(
            GT.iter()
                .map(|(id, n)| serde_json::json!({"action_id": id, "action_name": n}))
                .collect::<Vec<_>>()
        ),
        1 => serde_json::json!(plan_json(&GT)),
        _ => serde_json::json!("42"),
    };
    let mut line = serde_json::json!({
        "input": format!("system\nYou plan.\nuser\nTask {group}: put a Mug in the Sink.\nassistant\n"),
        "output": responses()[sample],
        "gts": gts,
        "score": SCORES[group][sample],
        "step": 3,
        "acc": SCORES[group][sample] > 0.0,
    });
    if uid {
        line["uid"] = format!("uid-{group}").into();
    }
    line
}

fn write_lines(path: &Path, lines: &[serde_json::Value]) {
    let text: String = lines.iter().map(|l| l.to_string() + "\n").collect();
    std::fs::write(path, text).unwrap();
}

fn verl_dump(dir: &Path) -> PathBuf {
    let path = dir.join("3.jsonl");
    let lines: Vec<_> = (0..3)
        .flat_map(|g| (0..4).map(move |s| verl_line(g, s, true)))
        .collect();
    write_lines(&path, &lines);
    path
}

fn tokenizer(dir: &Path) -> PathBuf {
    let path = dir.join("tokenizer.json");
    test_tokenizer().save(&path, false).unwrap();
    path
}

fn import(format: &str, dump: &Path, tokenizer: &Path, out: &Path, extra: &[&str]) -> Run {
    let mut args = vec![
        "import",
        "--format",
        format,
        "--from",
        dump.to_str().unwrap(),
        "--tokenizer",
        tokenizer.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    run("table", &args)
}

fn rows<R: embodyflow_core::schemas::Row>(dir: &Path, table: TableName) -> Vec<R> {
    TableReader::open(dir, table).unwrap().read_rows().unwrap()
}

fn by_id(mut rows: Vec<RewardRow>) -> Vec<RewardRow> {
    rows.sort_by(|a, b| a.trajectory_id.cmp(&b.trajectory_id));
    rows
}

/// veRL's GRPO of one group by hand: (R - mean) / (unbiased std + 1e-6),
/// or R - mean without the std (Dr. GRPO).
fn grpo_by_hand(scores: &[f64], norm_by_std: bool) -> Vec<f64> {
    let n = scores.len() as f64;
    let mean = scores.iter().sum::<f64>() / n;
    let var = scores.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / (n - 1.0);
    scores
        .iter()
        .map(|s| {
            if norm_by_std {
                (s - mean) / (var.sqrt() + 1e-6)
            } else {
                s - mean
            }
        })
        .collect()
}

/// compute-advantages on the imported tables and `rewards` with `sets`
/// (`key=value`), its rows.
fn advantages(imported: &Path, rewards: &Path, out: &Path, sets: &[&str]) -> Vec<AdvantageRow> {
    let (trajectories, steps) = (imported.join("trajectories"), imported.join("steps"));
    let mut args = vec![
        "--input",
        trajectories.to_str().unwrap(),
        "--input",
        steps.to_str().unwrap(),
        "--input",
        rewards.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    let result = run("compute-advantages", &args);
    assert_eq!(result.code, 0, "{result}");
    read_advantages(&out.join("advantages"))
}

fn assert_close(found: f32, expected: f64, what: &str) {
    assert!(
        (f64::from(found) - expected).abs() < 1e-5,
        "{what}: {found} != {expected}"
    );
}

#[test]
fn verl_dump_is_imported_rescored_and_its_advantages_exported() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let (dump, tok) = (verl_dump(root), tokenizer(root));
    let (imported, steps) = the_import_maps_the_dump(root, &dump, &tok);
    the_dump_scores_give_grpo_and_dr_grpo_by_hand(root, &imported, &steps);
    let (r1, r1_adv) = rescored_by_outcome_and_embodied_r1(root, &imported);
    a_ppo_update_on_a_dump_is_refused(root, &imported);
    step_rewards_credit_the_aligned_action_names(root, &imported, &tok, &steps);
    the_export_joins_the_dump_in_pandas(root, &dump, &imported, &r1, &r1_adv);
}

/// The verl dump imported: its counts, unmapped keys and plan-less rows
/// reported, and the mapping at exact points (tasks, trajectories, steps,
/// rewards); returns the imported tables' directory and its steps.
fn the_import_maps_the_dump(root: &Path, dump: &Path, tok: &Path) -> (PathBuf, Vec<StepRow>) {
    let imported = root.join("imported");
    let result = import("verl", dump, tok, &imported, &[]);
    assert_eq!(result.code, 0, "{result}");
    assert!(
        result
            .stdout
            .contains("12 rows, 3 groups, 3 tasks (2 with a gold plan)"),
        "{result}"
    );
    assert!(
        result.stdout.contains("unmapped key `acc`: 12 rows"),
        "{result}"
    );
    assert!(
        result.stdout.contains("gts: 4 rows hold no plan"),
        "{result}"
    );

    // The mapping, at exact points.
    let tasks: Vec<TaskRow> = rows(&imported.join("tasks"), TableName::Tasks);
    let gold: Vec<PlanAction> = GT
        .iter()
        .map(|(id, n)| PlanAction {
            action_id: *id,
            action_name: n.to_string(),
        })
        .collect();
    let task = |id: &str| tasks.iter().find(|t| t.task_id == id).unwrap();
    assert_eq!(task("uid-0").gt_actions.as_ref(), Some(&gold));
    assert_eq!(task("uid-1").gt_actions.as_ref(), Some(&gold));
    assert_eq!(task("uid-2").gt_actions, None);
    assert_eq!(task("uid-1").instruction, verl_line(1, 0, true)["input"]);
    let trajectories: Vec<TrajectoryRow> =
        rows(&imported.join("trajectories"), TableName::Trajectories);
    let t = trajectories
        .iter()
        .find(|t| t.trajectory_id == "it3/uid-1/d0/s2")
        .unwrap();
    assert_eq!(
        (
            t.group_id.as_str(),
            t.task_id.as_str(),
            t.sample_index,
            t.iteration
        ),
        ("it3/uid-1/d0", "uid-1", 2, 3)
    );
    assert_eq!(t.response_text.as_deref(), Some(responses()[2].as_str()));
    assert!(t.complete, "score 0.25 > 0");
    let steps: Vec<StepRow> = rows(&imported.join("steps"), TableName::Steps);
    let step = steps
        .iter()
        .find(|s| s.trajectory_id == "it3/uid-1/d0/s2")
        .unwrap();
    let ids = |text: &str| -> Vec<i32> {
        test_tokenizer()
            .encode(text, false)
            .unwrap()
            .get_ids()
            .iter()
            .map(|&i| i as i32)
            .collect()
    };
    assert_eq!(step.response_ids, ids(&responses()[2]));
    assert_eq!(
        step.prompt_ids,
        ids(verl_line(1, 2, true)["input"].as_str().unwrap())
    );
    let imported_rewards = by_id(rows(&imported.join("rewards"), TableName::Rewards));
    let scores: Vec<f32> = imported_rewards.iter().map(|r| r.score).collect();
    let expected: Vec<f32> = SCORES.iter().flatten().map(|&s| s as f32).collect();
    assert_eq!(scores, expected);
    (imported, steps)
}

/// The dump's own scores: GRPO and Dr. GRPO of every group, by hand.
fn the_dump_scores_give_grpo_and_dr_grpo_by_hand(root: &Path, imported: &Path, steps: &[StepRow]) {
    for (estimator, norm) in [("grpo", true), ("dr_grpo", false)] {
        let adv = advantages(
            imported,
            &imported.join("rewards"),
            &root.join(format!("adv-{estimator}")),
            &[&format!("estimator={estimator}")],
        );
        for (g, scores) in SCORES.iter().enumerate() {
            for (s, expected) in grpo_by_hand(scores, norm).into_iter().enumerate() {
                let row = &adv[g * 4 + s];
                assert_eq!(row.trajectory_id, format!("it3/uid-{g}/d0/s{s}"));
                assert_close(row.episode_adv, expected, &row.trajectory_id);
                assert_eq!(row.advantages.len(), steps_len(steps, &row.trajectory_id));
                assert!(row.advantages.iter().all(|&a| a == row.episode_adv));
            }
        }
    }
}

/// Rescored: outcome (coef 2 on score > 0) and Embodied-R1 on the gold
/// plans, and GRPO of the Embodied-R1 scores; returns those rewards and
/// advantages.
fn rescored_by_outcome_and_embodied_r1(
    root: &Path,
    imported: &Path,
) -> (Vec<RewardRow>, Vec<AdvantageRow>) {
    let score = |name: &str, sets: &[&str]| -> Vec<RewardRow> {
        let out = root.join(name);
        let mut args = vec![
            "--input",
            imported.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        for set in sets {
            args.extend(["--set", set]);
        }
        let result = run("score-rewards", &args);
        assert_eq!(result.code, 0, "{result}");
        by_id(rows(&out.join("rewards"), TableName::Rewards))
    };
    let outcome = score("outcome", &["reward.fn=outcome", "reward.reward_coef=2"]);
    let outcome_scores: Vec<f32> = outcome.iter().map(|r| r.score).collect();
    let expected: Vec<f32> = SCORES
        .iter()
        .flatten()
        .map(|&s| if s > 0.0 { 2.0 } else { 0.0 })
        .collect();
    assert_eq!(outcome_scores, expected);
    let r1 = score("r1", &["reward.fn=embodied_r1"]);
    // Accuracy n(n+1)/(k(k+1)) of the leading matches: 3 of 3, 2 of 3, 0, unparsed.
    for g in 0..2 {
        let accuracy: Vec<f32> = r1[g * 4..g * 4 + 4].iter().map(|r| r.accuracy).collect();
        assert_eq!(accuracy, [1.0, 0.5, 0.0, 0.0], "group uid-{g}");
        assert_eq!(r1[g * 4 + 3].score, 0.0, "a parse failure scores 0");
    }
    let r1_adv = advantages(
        imported,
        &root.join("r1/rewards"),
        &root.join("adv-r1"),
        &["estimator=grpo"],
    );
    let r1_group: Vec<f64> = r1[..4].iter().map(|r| f64::from(r.score)).collect();
    for (s, expected) in grpo_by_hand(&r1_group, true).into_iter().enumerate() {
        assert_close(r1_adv[s].episode_adv, expected, &r1_adv[s].trajectory_id);
    }
    (r1, r1_adv)
}

/// A dump holds no behaviour log-probs: a PPO update on it is refused.
fn a_ppo_update_on_a_dump_is_refused(root: &Path, imported: &Path) {
    let policy = root.join("policy");
    let mut init_args = vec!["--out", policy.to_str().unwrap(), "--seed", "0"];
    init_args.extend(TINY_POLICY);
    let init = run("init-policy", &init_args);
    assert_eq!(init.code, 0, "{init}");
    let update_out = root.join("update");
    let update = run(
        "update-policy",
        &[
            "--policy",
            policy.to_str().unwrap(),
            "--input",
            imported.join("trajectories").to_str().unwrap(),
            "--input",
            imported.join("steps").to_str().unwrap(),
            "--input",
            root.join("adv-r1/advantages").to_str().unwrap(),
            "--out",
            update_out.to_str().unwrap(),
        ],
    );
    assert_eq!(update.code, 2, "{update}");
    assert!(
        update
            .stderr
            .contains("was imported (policy `imported:verl:")
            && update.stderr.contains("no behaviour log-probs"),
        "{update}"
    );
    assert!(!update_out.join("policy").exists());
}

/// Step rewards on the imported token ids: the rule's A^S sits on the
/// action-name tokens the import's tokenizer aligns (given as
/// step.tokenizer).
fn step_rewards_credit_the_aligned_action_names(
    root: &Path,
    imported: &Path,
    tok: &Path,
    steps: &[StepRow],
) {
    let set_tok = format!("step.tokenizer={}", tok.display());
    let step_adv = advantages(
        imported,
        &root.join("r1/rewards"),
        &root.join("adv-step"),
        &["estimator=grpo_step", "step.kind=rule", &set_tok],
    );
    let credited = |s: usize, sign: f32| -> String {
        let row = &step_adv[s];
        let ids: Vec<u32> = steps
            .iter()
            .find(|x| x.trajectory_id == row.trajectory_id)
            .unwrap()
            .response_ids
            .iter()
            .zip(row.step_adv.as_ref().unwrap())
            .filter(|&(_, &a)| a == sign)
            .map(|(&id, _)| id as u32)
            .collect();
        test_tokenizer().decode(&ids, false).unwrap()
    };
    // Sample 0 matches every gold step, sample 2 none, sample 3 does not parse.
    assert_eq!(credited(0, 1.0), "find a Mugpick up the Mugfind a Sink");
    assert_eq!(credited(0, -1.0), "");
    assert_eq!(credited(2, -1.0), "find a Sinkfind a Mugpick up the Mug");
    assert!(
        step_adv[3]
            .step_adv
            .as_ref()
            .unwrap()
            .iter()
            .all(|&a| a == 0.0)
    );
}

/// Exported for veRL, joined with the dump in pandas (the module doc's
/// example): each line the dump's score, the rescore and the advantage.
fn the_export_joins_the_dump_in_pandas(
    root: &Path,
    dump: &Path,
    imported: &Path,
    r1: &[RewardRow],
    r1_adv: &[AdvantageRow],
) {
    let exported = root.join("adv.jsonl");
    let result = run(
        "table",
        &[
            "export",
            root.join("adv-r1/advantages").to_str().unwrap(),
            "--format",
            "verl",
            "--trajectories",
            imported.join("trajectories").to_str().unwrap(),
            "--rewards",
            root.join("r1/rewards").to_str().unwrap(),
            "--tasks",
            imported.join("tasks").to_str().unwrap(),
            "--out",
            exported.to_str().unwrap(),
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    let joined = pandas_join(&[dump], &exported);
    // print() ends the CSV (which ends its last line) with one more line break.
    let lines: Vec<&str> = joined.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines[0], JOINED_HEADER);
    assert_eq!(lines.len(), 13, "{joined}");
    for line in &lines[1..] {
        let cells: Vec<&str> = line.split(',').collect();
        let (g, s): (usize, usize) = (cells[1][4..].parse().unwrap(), cells[2].parse().unwrap());
        assert_eq!(cells[0], (g * 4 + s).to_string(), "the dump's row: {line}");
        assert_eq!(cells[3].parse::<f64>().unwrap(), SCORES[g][s], "{line}");
        let row = r1_adv
            .iter()
            .find(|r| r.trajectory_id == format!("it3/uid-{g}/d0/s{s}"))
            .unwrap();
        assert_eq!(
            cells[4].parse::<f32>().unwrap(),
            r1[g * 4 + s].score,
            "{line}"
        );
        assert_eq!(cells[5].parse::<f32>().unwrap(), row.episode_adv, "{line}");
    }
}

fn steps_len(steps: &[StepRow], trajectory_id: &str) -> usize {
    steps
        .iter()
        .find(|s| s.trajectory_id == trajectory_id)
        .unwrap()
        .response_ids
        .len()
}

/// The columns the documented pandas join prints.
const JOINED_HEADER: &str = "dump_row,uid,sample_index,score,rescored,advantage";

/// The book's pandas join (docs/src/interoperability.md, the `python`
/// block of the export; the table module's doc holds the same lines), run
/// with the project's Python on the dump `files` (JSON lines, or Parquet
/// read with `pd.read_parquet`) and the exported `adv.jsonl`; it fails when
/// a row joins another prompt's advantages. Returns what it prints.
fn pandas_join(files: &[&Path], exported: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let book = std::fs::read_to_string(root.join("docs/src/interoperability.md")).unwrap();
    let export = &book[book
        .find("## Exporting advantages back to the dump")
        .unwrap()..];
    let block = export.split("```python\n").nth(1).unwrap();
    let block = &block[..block.find("```").unwrap()];
    let module = std::fs::read_to_string(root.join("stages/table/src/foreign.rs")).unwrap();
    let module_doc: String = module
        .lines()
        .filter_map(|l| l.strip_prefix("//! "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        module_doc.contains(block),
        "the table module's doc and the book show different joins"
    );
    let listed: Vec<String> = files
        .iter()
        .map(|f| format!("{:?}", f.display().to_string()))
        .collect();
    let parquet = files
        .iter()
        .all(|f| f.extension().is_some_and(|e| e == "parquet"));
    let script = block
        .replace(
            r#"files = ["rollouts/3.jsonl"]"#,
            &format!("files = [{}]", listed.join(", ")),
        )
        .replace(
            r#""adv.jsonl""#,
            &format!("{:?}", exported.display().to_string()),
        );
    let script = if parquet {
        script.replace("pd.read_json(f, lines=True)", "pd.read_parquet(f)")
    } else {
        script
    };
    assert!(
        script.contains(&listed[0]) && !script.contains("\"adv.jsonl\""),
        "{script}"
    );
    let python = root.join(".venv/bin/python");
    let output = Command::new(&python)
        .args(["-c", &script])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/setup installs it)", python.display()));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// `table export --format verl` of the advantages at `advantages`, with the
/// imported trajectories and tasks and `rewards`, into `out`.
fn export_for_verl(advantages: &Path, imported: &Path, rewards: &Path, out: &Path) {
    let result = run(
        "table",
        &[
            "export",
            advantages.to_str().unwrap(),
            "--format",
            "verl",
            "--trajectories",
            imported.join("trajectories").to_str().unwrap(),
            "--rewards",
            rewards.to_str().unwrap(),
            "--tasks",
            imported.join("tasks").to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(result.code, 0, "{result}");
}

#[test]
fn verl_dump_without_uid_groups_consecutive_rows_or_by_prompt() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tokenizer(tmp.path());
    let dump = tmp.path().join("5.jsonl");
    let lines: Vec<_> = (0..2)
        .flat_map(|g| (0..2).map(move |s| verl_line(g, s, false)))
        .collect();
    write_lines(&dump, &lines);
    let out = tmp.path().join("imported");
    let result = import("verl", &dump, &tok, &out, &["--group-size", "2"]);
    assert_eq!(result.code, 0, "{result}");
    let ids = |out: &Path| -> Vec<String> {
        let mut ids: Vec<String> =
            rows::<TrajectoryRow>(&out.join("trajectories"), TableName::Trajectories)
                .into_iter()
                .map(|t| t.trajectory_id)
                .collect();
        ids.sort();
        ids
    };
    assert_eq!(
        ids(&out),
        [
            "it3/r0/d0/s0",
            "it3/r0/d0/s1",
            "it3/r2/d0/s0",
            "it3/r2/d0/s1"
        ]
    );

    refused(
        "verl",
        &dump,
        &tok,
        &tmp.path().join("by-3"),
        &["--group-size", "3"],
        &["5.jsonl: 4 rows are not groups of --group-size 3 (the last group would have 1)"],
    );

    // A training dump after balance_batch: the rows of a group are apart.
    let shuffled = [&lines[0], &lines[2], &lines[3], &lines[1]].map(Clone::clone);
    write_lines(&dump, &shuffled);
    refused(
        "verl",
        &dump,
        &tok,
        &tmp.path().join("by-size"),
        &["--group-size", "2"],
        &["5.jsonl: group `r0` mixes values of `input`: line 1 and line 2 differ"],
    );
    let out = tmp.path().join("by-prompt");
    let result = import("verl", &dump, &tok, &out, &["--group-by-prompt"]);
    assert_eq!(result.code, 0, "{result}");
    assert_eq!(
        ids(&out),
        [
            "it3/p0/d0/s0",
            "it3/p0/d0/s1",
            "it3/p1/d0/s0",
            "it3/p1/d0/s1"
        ]
    );
    let rewards = by_id(rows(&out.join("rewards"), TableName::Rewards));
    let scores: Vec<f32> = rewards.iter().map(|r| r.score).collect();
    assert_eq!(
        scores,
        [1.0, 0.0, 1.0, 1.0],
        "p0 = rows 0 and 3, p1 = rows 1 and 2"
    );

    // The documented join pairs every row with its own prompt's advantages
    // under --group-by-prompt (uid p<0-based row of the prompt's first row>).
    advantages(&out, &out.join("rewards"), &tmp.path().join("adv"), &[]);
    let exported = tmp.path().join("adv.jsonl");
    export_for_verl(
        &tmp.path().join("adv/advantages"),
        &out,
        &out.join("rewards"),
        &exported,
    );
    let joined = pandas_join(&[&dump], &exported);
    let lines: Vec<&str> = joined.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 1 + 4, "{joined}");
    for line in &lines[1..] {
        let cells: Vec<&str> = line.split(',').collect();
        let score = |cell: &str| cell.parse::<f64>().unwrap();
        assert_eq!(score(cells[3]), score(cells[4]), "its own score: {line}");
    }
}

/// Eight dump rows of four prompts, two rows each, in an order where the
/// first row of a prompt counted from 1 names another prompt's first row
/// counted from 0 (B's first row is 1 from 0, A's is 1 from 1; C's is 2,
/// B's is 2): a numbering off by one joins four of the eight rows with
/// another prompt's advantages. Each row scores `row / 8`.
const INTERLEAVED: [char; 8] = ['A', 'B', 'C', 'C', 'D', 'D', 'A', 'B'];

/// Eight rows in groups of two consecutive rows; prompt A has two groups.
const CONSECUTIVE: [char; 8] = ['A', 'A', 'B', 'B', 'A', 'A', 'C', 'C'];

/// The dump row of prompt `prompt` at `row`, with the veRL keys (`input`,
/// `output`, `score`, `step`).
fn lettered_row(prompt: char, row: usize) -> serde_json::Value {
    serde_json::json!({
        "input": format!("user\nTask {prompt}: put a Mug in the Sink.\nassistant\n"),
        "output": responses()[row % 4],
        "score": row as f64 / 8.0,
        "step": 3,
    })
}

/// Imports `files` (veRL JSON lines, or Parquet with the veRL keys as
/// columns) with `grouping`, GRPO on the dump's scores, exports for veRL,
/// and checks every exported row against the dump line `dump_row` names:
/// its uid (`p`/`r` + the 0-based first row of its group), the task's
/// prompt, its score, its GRPO advantage within its group; then the book's
/// pandas join pairs every line with its own prompt and score.
fn dump_rows_pair_with_their_lines(
    dir: &Path,
    files: &[&Path],
    prompts: &[char],
    grouping: &[&str],
    uid_of: impl Fn(usize) -> usize,
) {
    let tok = tokenizer(dir);
    let out = dir.join("imported");
    let mut args = vec!["import", "--format"];
    if files[0].extension().is_some_and(|e| e == "parquet") {
        args.extend([
            "parquet",
            "--column",
            "prompt=input",
            "--column",
            "response=output",
            "--column",
            "reward=score",
            "--column",
            "step=step",
        ]);
    } else {
        args.push("verl");
    }
    args.push("--from");
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    args.extend([
        "--tokenizer",
        tok.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    args.extend_from_slice(grouping);
    let result = run("table", &args);
    assert_eq!(result.code, 0, "{result}");
    let trajectories: Vec<TrajectoryRow> = rows(&out.join("trajectories"), TableName::Trajectories);
    let mut source_rows: Vec<i64> = trajectories.iter().map(|t| t.source_row.unwrap()).collect();
    source_rows.sort();
    assert_eq!(source_rows, (0..prompts.len() as i64).collect::<Vec<_>>());

    advantages(
        &out,
        &out.join("rewards"),
        &dir.join("adv"),
        &["estimator=grpo"],
    );
    let exported = dir.join("adv.jsonl");
    export_for_verl(
        &dir.join("adv/advantages"),
        &out,
        &out.join("rewards"),
        &exported,
    );
    let instructions: BTreeMap<String, String> =
        rows::<TaskRow>(&out.join("tasks"), TableName::Tasks)
            .into_iter()
            .map(|t| (t.task_id, t.instruction))
            .collect();
    let text = std::fs::read_to_string(&exported).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), prompts.len());
    let score = |row: usize| row as f64 / 8.0;
    for line in &lines {
        let row = line["dump_row"].as_u64().unwrap() as usize;
        let dumped = lettered_row(prompts[row], row);
        let uid = line["uid"].as_str().unwrap();
        assert_eq!(uid[1..].parse::<usize>().unwrap(), uid_of(row), "{line}");
        assert_eq!(instructions[uid], dumped["input"], "its own prompt: {line}");
        assert_eq!(line["rescored"].as_f64().unwrap(), score(row), "{line}");
        let group: Vec<usize> = (0..prompts.len())
            .filter(|&r| uid_of(r) == uid_of(row))
            .collect();
        let scores: Vec<f64> = group.iter().map(|&r| score(r)).collect();
        let expected = grpo_by_hand(&scores, true)[group.iter().position(|&r| r == row).unwrap()];
        assert_close(line["advantage"].as_f64().unwrap() as f32, expected, uid);
    }

    let joined = pandas_join(files, &exported);
    let lines: Vec<&str> = joined.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines[0], JOINED_HEADER);
    assert_eq!(lines.len(), 1 + prompts.len(), "{joined}");
    for line in &lines[1..] {
        let cells: Vec<&str> = line.split(',').collect();
        let row: usize = cells[0].parse().unwrap();
        assert_eq!(
            cells[1][1..].parse::<usize>().unwrap(),
            uid_of(row),
            "{line}"
        );
        assert_eq!(
            cells[3].parse::<f64>().unwrap(),
            score(row),
            "the dump's score: {line}"
        );
        assert_eq!(
            cells[4].parse::<f64>().unwrap(),
            score(row),
            "its own score: {line}"
        );
    }
}

/// The 0-based first row of each row's prompt, and the same counted from 1.
fn first_rows(prompts: &[char]) -> (Vec<usize>, Vec<usize>) {
    let first = |row: usize| prompts.iter().position(|&p| p == prompts[row]).unwrap();
    let from_0: Vec<usize> = (0..prompts.len()).map(first).collect();
    let from_1 = from_0.iter().map(|r| r + 1).collect();
    (from_0, from_1)
}

#[test]
fn the_dump_row_pairs_every_advantage_with_its_own_line() {
    let (from_0, from_1) = first_rows(&INTERLEAVED);
    let misjoined = (0..8)
        .filter(|&r| {
            from_0.iter().any(|&f| f == from_1[r]) && INTERLEAVED[from_1[r]] != INTERLEAVED[r]
        })
        .count();
    assert_eq!(misjoined, 4, "the layout catches a numbering off by one");
    let lines: Vec<_> = INTERLEAVED
        .iter()
        .enumerate()
        .map(|(r, &p)| lettered_row(p, r))
        .collect();

    // veRL JSON lines, one file: line r + 1 is row r.
    let tmp = tempfile::tempdir().unwrap();
    let dump = tmp.path().join("3.jsonl");
    write_lines(&dump, &lines);
    dump_rows_pair_with_their_lines(
        tmp.path(),
        &[&dump],
        &INTERLEAVED,
        &["--group-by-prompt"],
        |r| from_0[r],
    );

    // Two Parquet files (5 + 3 rows): rows counted on over the second.
    let tmp = tempfile::tempdir().unwrap();
    let files = [tmp.path().join("a.parquet"), tmp.path().join("b.parquet")];
    parquet_file(&files[0], &lines[..5]);
    parquet_file(&files[1], &lines[5..]);
    let files = [files[0].as_path(), files[1].as_path()];
    dump_rows_pair_with_their_lines(
        tmp.path(),
        &files,
        &INTERLEAVED,
        &["--group-by-prompt"],
        |r| from_0[r],
    );

    // Groups of two consecutive rows, one across the files (3 + 5 rows);
    // prompt A in two groups.
    let tmp = tempfile::tempdir().unwrap();
    let lines: Vec<_> = CONSECUTIVE
        .iter()
        .enumerate()
        .map(|(r, &p)| lettered_row(p, r))
        .collect();
    let files = [tmp.path().join("a.parquet"), tmp.path().join("b.parquet")];
    parquet_file(&files[0], &lines[..3]);
    parquet_file(&files[1], &lines[3..]);
    let files = [files[0].as_path(), files[1].as_path()];
    dump_rows_pair_with_their_lines(
        tmp.path(),
        &files,
        &CONSECUTIVE,
        &["--group-size", "2"],
        |r| r / 2 * 2,
    );
}

#[test]
fn trl_lines_group_by_prompt_or_column() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tokenizer(tmp.path());
    let dump = tmp.path().join("trl.jsonl");
    let lines: Vec<_> = (0..4)
        .map(|i| {
            serde_json::json!({
                "prompt": format!("Task {}: put a Mug in the Sink.", i % 2),
                "completion": [{"role": "assistant", "content": responses()[i]}],
                "reward": i as f64 * 0.5,
                "run": format!("g{}", i % 2),
            })
        })
        .collect();
    write_lines(&dump, &lines);
    let out = tmp.path().join("by-prompt");
    let result = import("trl", &dump, &tok, &out, &[]);
    assert_eq!(result.code, 0, "{result}");
    assert!(
        result.stdout.contains("4 rows, 2 groups, 2 tasks"),
        "{result}"
    );
    assert!(
        result.stdout.contains("unmapped key `run`: 4 rows"),
        "{result}"
    );
    let rewards = by_id(rows(&out.join("rewards"), TableName::Rewards));
    let got: Vec<(&str, f32)> = rewards
        .iter()
        .map(|r| (r.trajectory_id.as_str(), r.score))
        .collect();
    assert_eq!(
        got,
        [
            ("it0/p0/d0/s0", 0.0),
            ("it0/p0/d0/s1", 1.0),
            ("it0/p1/d0/s0", 0.5),
            ("it0/p1/d0/s1", 1.5)
        ]
    );
    let trajectories: Vec<TrajectoryRow> = rows(&out.join("trajectories"), TableName::Trajectories);
    let t = trajectories
        .iter()
        .find(|t| t.trajectory_id == "it0/p1/d0/s1")
        .unwrap();
    assert_eq!(t.response_text.as_deref(), Some(responses()[3].as_str()));

    let out = tmp.path().join("by-column");
    let result = import("trl", &dump, &tok, &out, &["--group-column", "run"]);
    assert_eq!(result.code, 0, "{result}");
    assert!(!result.stdout.contains("unmapped"), "{result}");
    let tasks: Vec<TaskRow> = rows(&out.join("tasks"), TableName::Tasks);
    let mut ids: Vec<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
    ids.sort();
    assert_eq!(ids, ["g0", "g1"]);
}

/// Runs an import that must fail: exit 2, the message names `needles`, and
/// nothing exists at the output.
fn refused(format: &str, dump: &Path, tok: &Path, out: &Path, extra: &[&str], needles: &[&str]) {
    let result = import(format, dump, tok, out, extra);
    assert_eq!(result.code, 2, "{result}");
    for needle in needles {
        assert!(result.stderr.contains(needle), "{needle}\n{result}");
    }
    assert!(!out.exists(), "{} was written\n{result}", out.display());
}

#[test]
fn bad_dumps_and_tokenizers_exit_2_naming_file_line_and_key() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tokenizer(tmp.path());
    let out = tmp.path().join("out");
    let dump = tmp.path().join("dump.jsonl");
    let good: Vec<_> = (0..4).map(|s| verl_line(0, s, true)).collect();

    // One field of one line of a good dump spoiled: (line, key, value or
    // removed, what the message says).
    let spoiled: [(usize, &str, Option<serde_json::Value>, &str); 4] = [
        (2, "output", None, "dump.jsonl:3: key `output` is missing"),
        (
            1,
            "score",
            Some("high".into()),
            "dump.jsonl:2: key `score` is \"high\"",
        ),
        (
            2,
            "gts",
            Some("[]".into()),
            "dump.jsonl: group `uid-0` mixes values of `gts`: line 1 and line 3 differ",
        ),
        (
            3,
            "input",
            Some("another prompt".into()),
            "dump.jsonl: group `uid-0` mixes values of `input`: line 1 and line 4 differ",
        ),
    ];
    for (line, key, value, says) in spoiled {
        let mut lines = good.clone();
        let row = lines[line].as_object_mut().unwrap();
        match value {
            Some(value) => row.insert(key.into(), value),
            None => row.remove(key),
        };
        write_lines(&dump, &lines);
        refused("verl", &dump, &tok, &out, &[], &[says]);
    }

    let lines: Vec<_> = (0..2).map(|s| verl_line(0, s, false)).collect();
    write_lines(&dump, &lines);
    refused(
        "verl",
        &dump,
        &tok,
        &out,
        &[],
        &["dump.jsonl:1: key `uid` is missing", "--group-size"],
    );

    let bad_tok = tmp.path().join("bad-tokenizer.json");
    std::fs::write(&bad_tok, "{\"model\": 1}").unwrap();
    write_lines(&dump, &good);
    refused(
        "verl",
        &dump,
        &bad_tok,
        &out,
        &[],
        &["--tokenizer", "bad-tokenizer.json: does not load"],
    );
    let empty = tmp.path().join("no-tokenizer");
    std::fs::create_dir(&empty).unwrap();
    refused(
        "verl",
        &dump,
        &empty,
        &out,
        &[],
        &["--tokenizer", "no-tokenizer/tokenizer.json: does not load"],
    );

    std::fs::write(&dump, "\n").unwrap();
    refused("verl", &dump, &tok, &out, &[], &["dump.jsonl: no rows"]);
    std::fs::write(&dump, format!("{}\n[1, 2]\n", good[0])).unwrap();
    refused(
        "verl",
        &dump,
        &tok,
        &out,
        &[],
        &["dump.jsonl:2: not a JSON object"],
    );

    let chat = serde_json::json!({
        "prompt": [{"role": "user", "content": "put a Mug in the Sink"}],
        "completion": [{"role": "assistant", "content": "{}"}],
        "reward": 1.0,
    });
    write_lines(&dump, &[chat]);
    refused(
        "trl",
        &dump,
        &tok,
        &out,
        &[],
        &[
            "dump.jsonl:1: key `prompt` is a list of chat messages and cannot be rendered",
            "no chat_template.jinja",
            "--chat-template",
        ],
    );
}

#[test]
fn the_shipped_rescore_pipeline_sweeps_two_rewards_by_two_estimators() {
    let tmp = tempfile::tempdir().unwrap();
    let (dump, tok) = (verl_dump(tmp.path()), tokenizer(tmp.path()));
    let imported = tmp.path().join("imported");
    let result = import("verl", &dump, &tok, &imported, &[]);
    assert_eq!(result.code, 0, "{result}");
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pipelines/verl-rescore.toml");
    let out = tmp.path().join("run");
    let set = format!("imported={}", imported.display());
    let result = run(
        "pipeline",
        &[
            "run",
            file.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--set",
            &set,
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    let ablation = std::fs::read_to_string(out.join("report/ablation.md")).unwrap();
    assert_eq!(ablation.lines().count(), 2 + 4, "{ablation}");
    // Every cell at one exact point: group uid-0 under its reward and estimator.
    for reward in ["outcome", "embodied_r1"] {
        let rewards = by_id(rows(
            &out.join(format!("score@reward={reward}/rewards")),
            TableName::Rewards,
        ));
        // The ablation's share of groups GRPO learns from: scores that differ.
        let mut groups: BTreeMap<&str, Vec<f32>> = BTreeMap::new();
        for r in &rewards {
            groups.entry(&r.group_id).or_default().push(r.score);
        }
        let differ = groups
            .values()
            .filter(|s| s.iter().any(|&x| x != s[0]))
            .count();
        let share = format!(" {:.3} ", differ as f64 / groups.len() as f64);
        for line in ablation
            .lines()
            .filter(|l| l.contains(&format!("reward={reward} ")))
        {
            let cells: Vec<&str> = line.split('|').collect();
            assert_eq!(cells[5], share, "groups with signal: {line}");
        }
        let group: Vec<f64> = rewards[..4].iter().map(|r| f64::from(r.score)).collect();
        if reward == "outcome" {
            assert_eq!(group, [1.0, 0.0, 1.0, 0.0]);
        }
        for (estimator, norm) in [("grpo", true), ("dr_grpo", false)] {
            let adv = read_advantages(&out.join(format!(
                "adv@estimator={estimator},reward={reward}/advantages"
            )));
            assert_eq!(adv.len(), 12);
            for (s, expected) in grpo_by_hand(&group, norm).into_iter().enumerate() {
                assert_eq!(adv[s].estimator, estimator);
                assert_close(adv[s].episode_adv, expected, &adv[s].trajectory_id);
            }
        }
    }
}

/// The project venv's Python running tests/python/trl_chat.py.
fn trl_chat_py(args: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join("../.venv/bin/python");
    let output = Command::new(&python)
        .arg(root.join("python/trl_chat.py"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/setup installs it)", python.display()));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A ChatML template like Qwen's: content trimmed, and Qwen3's empty
/// thinking block after the generation prompt when `enable_thinking` is false.
const CHATML: &str = "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] | trim + '<|im_end|>\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{%- if enable_thinking is defined and enable_thinking is false %}{{ '<think>\n\n</think>\n\n' }}{%- endif %}{%- endif %}";

/// A model directory: the test tokenizer with ChatML's special tokens,
/// saved by transformers with [`CHATML`] (tokenizer_config.json,
/// chat_template.jinja); and TRL's rendering of `examples` there, with
/// token ids, from transformers.
fn chat_model(dir: &Path, examples: &[serde_json::Value]) -> Vec<serde_json::Value> {
    std::fs::create_dir_all(dir).unwrap();
    let mut tok = test_tokenizer();
    tok.add_special_tokens(&[
        tokenizers::AddedToken::from("<|im_start|>", true),
        tokenizers::AddedToken::from("<|im_end|>", true),
    ]);
    tok.save(dir.join("tokenizer.json"), false).unwrap();
    let spec =
        serde_json::json!({"template": CHATML, "eos_token": "<|im_end|>", "examples": examples});
    let (spec_file, out_file) = (dir.join("spec.json"), dir.join("reference.json"));
    std::fs::write(&spec_file, spec.to_string()).unwrap();
    trl_chat_py(&[
        "chat",
        dir.to_str().unwrap(),
        spec_file.to_str().unwrap(),
        out_file.to_str().unwrap(),
    ]);
    assert!(dir.join("chat_template.jinja").is_file());
    serde_json::from_str(&std::fs::read_to_string(out_file).unwrap()).unwrap()
}

/// Rows as a Parquet file written by pyarrow (`Table.from_pylist`).
fn parquet_file(path: &Path, rows: &[serde_json::Value]) {
    let rows_file = path.with_extension("rows.json");
    std::fs::write(
        &rows_file,
        serde_json::Value::from(rows.to_vec()).to_string(),
    )
    .unwrap();
    trl_chat_py(&[
        "parquet",
        path.to_str().unwrap(),
        rows_file.to_str().unwrap(),
    ]);
}

fn ids_of(value: &serde_json::Value) -> Vec<i32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_i64().unwrap() as i32)
        .collect()
}

fn by_trajectory<R>(mut rows: Vec<R>, id: impl Fn(&R) -> &str) -> Vec<R> {
    rows.sort_by(|a, b| id(a).cmp(id(b)));
    rows
}

/// The four chat examples: a system + user prompt twice (one group), a
/// prompt ending with the assistant's message (continued), and one with
/// `chat_template_kwargs` whose generation prompt the completion's
/// rendering lacks (TRL keeps the common prefix).
fn chat_examples() -> Vec<serde_json::Value> {
    let user = |task: usize| format!("Task {task}: put a Mug in the Sink.");
    let assistant = |text: &str| serde_json::json!([{"role": "assistant", "content": text}]);
    let task0 = serde_json::json!([
        {"role": "system", "content": "You plan."},
        {"role": "user", "content": user(0)},
    ]);
    vec![
        serde_json::json!({"prompt": task0, "completion": assistant(&responses()[0])}),
        serde_json::json!({"prompt": task0, "completion": assistant(&responses()[1])}),
        serde_json::json!({
            "prompt": [{"role": "user", "content": user(1)}, {"role": "assistant", "content": "{\"executable_plan\": "}],
            "completion": assistant("[{\"action_id\": 0, \"action_name\": \"find a Mug\"}]}"),
        }),
        serde_json::json!({
            "prompt": [{"role": "user", "content": user(2)}],
            "completion": assistant(&responses()[2]),
            "chat_template_kwargs": {"enable_thinking": false},
        }),
    ]
}

#[test]
fn trl_conversational_rows_render_as_trl_with_transformers() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    let examples = chat_examples();
    let reference = chat_model(&model, &examples);
    // Exact points of the reference itself: the completion is the message
    // and its end of turn; the continued prompt stops at its trimmed text;
    // the thinking block is not part of the prompt (not in the whole rendering).
    assert_eq!(
        reference[0]["completion"],
        format!("{}<|im_end|>\n", responses()[0])
    );
    assert!(
        reference[2]["prompt"]
            .as_str()
            .unwrap()
            .ends_with("<|im_start|>assistant\n{\"executable_plan\":"),
        "{}",
        reference[2]["prompt"]
    );
    assert!(
        reference[3]["prompt"]
            .as_str()
            .unwrap()
            .ends_with("<|im_start|>assistant\n"),
        "{}",
        reference[3]["prompt"]
    );

    let dump = tmp.path().join("trl.jsonl");
    let mut lines: Vec<serde_json::Value> = examples
        .iter()
        .zip([1.0, 0.0, 0.5, 0.25])
        .map(|(e, reward)| {
            let mut line = e.clone();
            line["reward"] = reward.into();
            line
        })
        .collect();
    // A string prompt next to them: its kwargs are not used, so reported.
    lines.push(serde_json::json!({
        "prompt": "Task 3: put a Mug in the Sink.", "completion": responses()[3],
        "reward": 0.0, "chat_template_kwargs": {"enable_thinking": false},
    }));
    write_lines(&dump, &lines);
    let out = tmp.path().join("imported");
    let result = import("trl", &dump, &model, &out, &[]);
    assert_eq!(result.code, 0, "{result}");
    for needle in [
        "5 rows, 4 groups, 4 tasks",
        "chat messages: 4 rows rendered with the chat template",
        "unmapped key `chat_template_kwargs`: 1 rows",
    ] {
        assert!(result.stdout.contains(needle), "{needle}\n{result}");
    }
    let tasks: Vec<TaskRow> = rows(&out.join("tasks"), TableName::Tasks);
    let trajectories: Vec<TrajectoryRow> = rows(&out.join("trajectories"), TableName::Trajectories);
    let steps: Vec<StepRow> = rows(&out.join("steps"), TableName::Steps);
    // Rows 0 and 1 share their prompt (group p0, by its first row); rows 2
    // and 3 start their own.
    let ids = [
        "it0/p0/d0/s0",
        "it0/p0/d0/s1",
        "it0/p2/d0/s0",
        "it0/p3/d0/s0",
    ];
    for (i, id) in ids.iter().enumerate() {
        let t = trajectories
            .iter()
            .find(|t| t.trajectory_id == *id)
            .unwrap();
        let task = tasks.iter().find(|k| k.task_id == t.task_id).unwrap();
        let step = steps.iter().find(|s| s.trajectory_id == *id).unwrap();
        assert_eq!(
            task.instruction,
            reference[i]["prompt"].as_str().unwrap(),
            "{id}"
        );
        assert_eq!(
            t.response_text.as_deref(),
            reference[i]["completion"].as_str(),
            "{id}"
        );
        assert_eq!(step.prompt_ids, ids_of(&reference[i]["prompt_ids"]), "{id}");
        assert_eq!(
            step.response_ids,
            ids_of(&reference[i]["completion_ids"]),
            "{id}"
        );
    }
    let plain = trajectories
        .iter()
        .find(|t| t.trajectory_id == "it0/p4/d0/s0")
        .unwrap();
    assert_eq!(
        plain.response_text.as_deref(),
        Some(responses()[3].as_str())
    );

    // The same chat rows in Parquet (prompt and completion as
    // list<struct<content, role>>): the same steps.
    let parquet = tmp.path().join("chat.parquet");
    let chat_rows: Vec<serde_json::Value> = lines[..3].to_vec();
    parquet_file(&parquet, &chat_rows);
    let from_parquet = tmp.path().join("from-parquet");
    let result = import(
        "parquet",
        &parquet,
        &model,
        &from_parquet,
        &[
            "--column",
            "prompt=prompt",
            "--column",
            "response=completion",
            "--column",
            "reward=reward",
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    let parquet_steps: Vec<StepRow> = rows(&from_parquet.join("steps"), TableName::Steps);
    let mut got: Vec<(Vec<i32>, Vec<i32>)> = parquet_steps
        .into_iter()
        .map(|s| (s.prompt_ids, s.response_ids))
        .collect();
    got.sort();
    let mut expected: Vec<(Vec<i32>, Vec<i32>)> = reference[..3]
        .iter()
        .map(|r| (ids_of(&r["prompt_ids"]), ids_of(&r["completion_ids"])))
        .collect();
    expected.sort();
    assert_eq!(got, expected);

    // Without a template: refused, naming the row; --chat-template gives it.
    let bare = tmp.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    std::fs::copy(model.join("tokenizer.json"), bare.join("tokenizer.json")).unwrap();
    refused(
        "trl",
        &dump,
        &bare,
        &tmp.path().join("no-template"),
        &[],
        &[
            "trl.jsonl:1: key `prompt` is a list of chat messages and cannot be rendered",
            "bare: no chat_template.jinja",
        ],
    );
    let with_template = tmp.path().join("with-template");
    let model_arg = model.to_str().unwrap().to_string();
    let result = import(
        "trl",
        &dump,
        &bare,
        &with_template,
        &["--chat-template", &model_arg],
    );
    assert_eq!(result.code, 0, "{result}");
    let sorted = |dir: &Path| {
        by_trajectory(rows::<StepRow>(&dir.join("steps"), TableName::Steps), |s| {
            &s.trajectory_id
        })
    };
    assert_eq!(sorted(&with_template), sorted(&out));

    // Chat rows TRL cannot render either: a string completion after chat
    // messages, a prompt ending with a system message.
    let mut bad = lines[0].clone();
    bad["completion"] = "{}".into();
    write_lines(&dump, &[bad]);
    refused(
        "trl",
        &dump,
        &model,
        &tmp.path().join("bad"),
        &[],
        &["trl.jsonl:1: key `completion` is \"{}\", expected a list of chat messages"],
    );
    let mut bad = lines[0].clone();
    bad["prompt"] = serde_json::json!([{"role": "system", "content": "You plan."}]);
    write_lines(&dump, &[lines[1].clone(), bad]);
    refused(
        "trl",
        &dump,
        &model,
        &tmp.path().join("bad"),
        &[],
        &[
            "trl.jsonl:2: key `prompt` is a list of chat messages and cannot be rendered",
            "invalid role in the last message of the prompt: system",
        ],
    );
}

/// Four rollouts in two groups as Parquet rows (`question`, `answer`,
/// `score`, `run_step`, `run`, an `extra` column), and as TRL lines.
fn plain_rows() -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let parquet = (0..4)
        .map(|i| {
            serde_json::json!({
                "question": format!("Task {}: put a Mug in the Sink.", i % 2),
                "answer": responses()[i],
                "score": i as f64 * 0.5,
                "run_step": 7,
                "run": format!("g{}", i % 2),
                "extra": "x",
            })
        })
        .collect::<Vec<_>>();
    let trl = parquet
        .iter()
        .map(|r| {
            serde_json::json!({
                "prompt": r["question"], "completion": r["answer"], "reward": r["score"],
                "step": r["run_step"], "run": r["run"],
            })
        })
        .collect();
    (parquet, trl)
}

const PLAIN_COLUMNS: [&str; 10] = [
    "--column",
    "prompt=question",
    "--column",
    "response=answer",
    "--column",
    "reward=score",
    "--column",
    "step=run_step",
    "--column",
    "group=run",
];

#[test]
fn parquet_columns_map_as_the_json_lines_do() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tokenizer(tmp.path());
    let (parquet_rows, trl_rows) = plain_rows();
    let file = tmp.path().join("rollouts.parquet");
    parquet_file(&file, &parquet_rows);
    let out = tmp.path().join("parquet");
    let result = import("parquet", &file, &tok, &out, &PLAIN_COLUMNS);
    assert_eq!(result.code, 0, "{result}");
    assert!(
        result.stdout.contains("4 rows, 2 groups, 2 tasks"),
        "{result}"
    );
    assert!(
        result
            .stdout
            .contains("unmapped column `extra`: 4 rows (not imported)"),
        "{result}"
    );
    let dump = tmp.path().join("rollouts.jsonl");
    write_lines(&dump, &trl_rows);
    let jsonl = tmp.path().join("jsonl");
    let result = import("trl", &dump, &tok, &jsonl, &["--group-column", "run"]);
    assert_eq!(result.code, 0, "{result}");
    // Row for row the same, but for the format's name.
    let steps = |dir: &Path| {
        by_trajectory(rows::<StepRow>(&dir.join("steps"), TableName::Steps), |s| {
            &s.trajectory_id
        })
    };
    assert_eq!(steps(&out), steps(&jsonl));
    assert_eq!(steps(&out)[0].trajectory_id, "it7/g0/d0/s0");
    let rewards = |dir: &Path| -> Vec<(String, f32)> {
        by_id(rows(&dir.join("rewards"), TableName::Rewards))
            .into_iter()
            .map(|r| (r.trajectory_id, r.score))
            .collect()
    };
    assert_eq!(rewards(&out), rewards(&jsonl));
    assert_eq!(rewards(&out)[1], ("it7/g0/d0/s1".to_string(), 1.0));
    let tasks = |dir: &Path| -> Vec<(String, String)> {
        let mut tasks: Vec<(String, String)> =
            rows::<TaskRow>(&dir.join("tasks"), TableName::Tasks)
                .into_iter()
                .map(|t| (t.task_id, t.instruction))
                .collect();
        tasks.sort();
        tasks
    };
    assert_eq!(tasks(&out), tasks(&jsonl));
    let policies: Vec<String> =
        rows::<TrajectoryRow>(&out.join("trajectories"), TableName::Trajectories)
            .into_iter()
            .map(|t| t.policy)
            .collect();
    assert!(
        policies
            .iter()
            .all(|p| p == "imported:parquet:rollouts.parquet"),
        "{policies:?}"
    );

    // Two files read in order: the same import.
    let (a, b) = (tmp.path().join("a.parquet"), tmp.path().join("b.parquet"));
    parquet_file(&a, &parquet_rows[..1]);
    parquet_file(&b, &parquet_rows[1..]);
    let two = tmp.path().join("two");
    let mut args = PLAIN_COLUMNS.to_vec();
    args.extend(["--from", b.to_str().unwrap()]);
    let result = import("parquet", &a, &tok, &two, &args);
    assert_eq!(result.code, 0, "{result}");
    assert_eq!(steps(&two), steps(&out));

    // Token ids given: no tokenizer needed; the prompt text stays the instruction.
    let tokenised: Vec<serde_json::Value> = (0..2)
        .map(|i| {
            serde_json::json!({
                "question": "Task 0: put a Mug in the Sink.",
                "prompt_ids": [5, 6, 7],
                "response_ids": [8 + i, 9],
                "score": 1.0 - i as f64,
            })
        })
        .collect();
    let ids_file = tmp.path().join("ids.parquet");
    parquet_file(&ids_file, &tokenised);
    let ids_out = tmp.path().join("ids");
    let columns = [
        "--column",
        "prompt=question",
        "--column",
        "prompt_ids=prompt_ids",
        "--column",
        "response_ids=response_ids",
        "--column",
        "reward=score",
    ];
    let mut args = vec![
        "import",
        "--format",
        "parquet",
        "--from",
        ids_file.to_str().unwrap(),
        "--out",
        ids_out.to_str().unwrap(),
    ];
    args.extend(columns);
    let result = run("table", &args);
    assert_eq!(result.code, 0, "{result}");
    let got: Vec<(String, Vec<i32>, Vec<i32>)> = steps(&ids_out)
        .into_iter()
        .map(|s| (s.trajectory_id, s.prompt_ids, s.response_ids))
        .collect();
    assert_eq!(
        got,
        [
            ("it0/p0/d0/s0".to_string(), vec![5, 6, 7], vec![8, 9]),
            ("it0/p0/d0/s1".to_string(), vec![5, 6, 7], vec![9, 9]),
        ]
    );
    let trajectories: Vec<TrajectoryRow> =
        rows(&ids_out.join("trajectories"), TableName::Trajectories);
    assert!(trajectories.iter().all(|t| t.response_text.is_none()));
    assert_eq!(
        tasks(&ids_out),
        [(
            "p0".to_string(),
            "Task 0: put a Mug in the Sink.".to_string()
        )]
    );
}

#[test]
fn bad_parquet_exits_2_naming_file_column_and_row() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tokenizer(tmp.path());
    let (good, _) = plain_rows();
    let file = tmp.path().join("bad.parquet");
    let out = tmp.path().join("out");
    parquet_file(&file, &good);
    let mut nope = PLAIN_COLUMNS.to_vec();
    nope[1] = "prompt=nope";
    refused(
        "parquet",
        &file,
        &tok,
        &out,
        &nope,
        &[
            "bad.parquet: column `nope` (--column prompt=nope) does not exist; its columns are: answer, extra, question, run, run_step, score",
        ],
    );

    // A column spoiled, in every row (pyarrow infers one type per column)
    // or in one row (None: a null): (column, value, row, what the message says).
    let spoiled: [(&str, serde_json::Value, Option<usize>, &str); 5] = [
        (
            "score",
            "high".into(),
            None,
            "bad.parquet: row 0: column `score` is \"high\", expected a finite number (f32)",
        ),
        (
            "score",
            serde_json::Value::Null,
            Some(3),
            "bad.parquet: row 3: column `score` is null, expected a finite number",
        ),
        (
            "question",
            serde_json::Value::Null,
            Some(2),
            "bad.parquet: row 2: column `question` is null, expected a string or a list of chat messages",
        ),
        (
            "run_step",
            2.5.into(),
            None,
            "bad.parquet: row 0: column `run_step` is 2.5, expected an integer (i32)",
        ),
        (
            "answer",
            serde_json::json!([1, 2]),
            None,
            "bad.parquet: row 0: column `answer` is [1,2], expected a string",
        ),
    ];
    for (column, value, row, says) in spoiled {
        let mut rows = good.clone();
        for (i, r) in rows.iter_mut().enumerate() {
            if row.is_none_or(|row| row == i) {
                r[column] = value.clone();
            }
        }
        parquet_file(&file, &rows);
        refused("parquet", &file, &tok, &out, &PLAIN_COLUMNS, &[says]);
    }

    // Token ids that are not integers; text without a tokenizer.
    let ids = |value: serde_json::Value| {
        vec![serde_json::json!({"question": "q", "prompt_ids": value, "answer": "a", "score": 1.0})]
    };
    parquet_file(&file, &ids(serde_json::json!([1.5, 2.0])));
    let ids_columns = [
        "--column",
        "prompt=question",
        "--column",
        "prompt_ids=prompt_ids",
        "--column",
        "response=answer",
        "--column",
        "reward=score",
    ];
    refused(
        "parquet",
        &file,
        &tok,
        &out,
        &ids_columns,
        &[
            "bad.parquet: row 0: column `prompt_ids` is [1.5,2.0], expected a list of non-negative integer token ids (i32)",
        ],
    );
    // A negative id is no token: refused, not stored for a model to index.
    parquet_file(&file, &ids(serde_json::json!([3, -1])));
    refused(
        "parquet",
        &file,
        &tok,
        &out,
        &ids_columns,
        &[
            "bad.parquet: row 0: column `prompt_ids` is [3,-1], expected a list of non-negative integer token ids (i32)",
        ],
    );
    parquet_file(&file, &ids(serde_json::json!([1, 2])));
    let mut args = vec![
        "import",
        "--format",
        "parquet",
        "--from",
        file.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ];
    args.extend(ids_columns);
    let result = run("table", &args);
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result.stderr.contains(
            "bad.parquet: row 0: column `answer` is text; tokenising it needs --tokenizer"
        ),
        "{result}"
    );
    assert!(!out.exists());

    // A group whose rows, in two files, have different prompts.
    let (a, b) = (tmp.path().join("a.parquet"), tmp.path().join("b.parquet"));
    parquet_file(&a, &good[..2]);
    let mut other = good[2..].to_vec();
    other[1]["run"] = "g0".into();
    parquet_file(&b, &other);
    let mut args = PLAIN_COLUMNS.to_vec();
    args.extend(["--from", b.to_str().unwrap()]);
    refused(
        "parquet",
        &a,
        &tok,
        &out,
        &args,
        &[
            "a.parquet: group `g0` mixes values of `question`: row 0 and ",
            "b.parquet row 1 differ",
        ],
    );

    // Not Parquet; a mapping without a reward; --column on JSON lines.
    std::fs::write(&file, "question,answer\n").unwrap();
    refused(
        "parquet",
        &file,
        &tok,
        &out,
        &PLAIN_COLUMNS,
        &["--from ", "bad.parquet: cannot read it"],
    );
    parquet_file(&file, &good);
    refused(
        "parquet",
        &file,
        &tok,
        &out,
        &PLAIN_COLUMNS[..4],
        &["--format parquet needs --column reward=COLUMN"],
    );
    refused(
        "trl",
        &file,
        &tok,
        &out,
        &PLAIN_COLUMNS[..2],
        &["--column goes with --format parquet"],
    );
}

/// Six rollouts of two groups with veRL's per-token tensors as Parquet
/// columns: `uid`, `prompt`, `resp` (token ids), `tr` (token_level_rewards,
/// dyadic so their sums are exact), `mask` (response_mask with holes at the
/// start, middle and end; rewards on some holes), `vals` (critic values) and
/// `score` (the sums; row 2's off by 1e-5, within the tolerance).
fn per_token_rows() -> Vec<serde_json::Value> {
    let rows: [(&str, Vec<f64>, Vec<bool>); 6] = [
        (
            "a",
            vec![0.0, -0.125, 0.0, 0.375, 1.0],
            vec![true, true, false, false, true],
        ),
        ("a", vec![0.0, 0.0, 0.5, 0.0], vec![true, false, true, true]),
        ("a", vec![-0.0625, 0.0, 0.0, 0.0, 0.0, 0.25], vec![true; 6]),
        (
            "b",
            vec![0.0, 0.0, 0.75, 0.125],
            vec![true, true, true, false],
        ),
        ("b", vec![0.0, 0.0, 0.0], vec![false, true, true]),
        (
            "b",
            vec![0.125, 0.0, 0.0, 0.0, -0.25],
            vec![true, false, true, false, true],
        ),
    ];
    rows.into_iter()
        .enumerate()
        .map(|(i, (uid, tr, mask))| {
            let n = tr.len();
            let score = tr.iter().sum::<f64>() + if i == 2 { 1e-5 } else { 0.0 };
            serde_json::json!({
                "uid": uid,
                "prompt": if uid == "a" { vec![5, 6, 7] } else { vec![8, 9] },
                "resp": (0..n).map(|t| 10 + t as i32).collect::<Vec<_>>(),
                "tr": tr,
                "mask": mask,
                "vals": (0..n).map(|t| 0.1 * (t + 1) as f64 + 0.05 * i as f64).collect::<Vec<_>>(),
                "score": score,
            })
        })
        .collect()
}

const PER_TOKEN_COLUMNS: [&str; 14] = [
    "--column",
    "prompt_ids=prompt",
    "--column",
    "response_ids=resp",
    "--column",
    "reward=score",
    "--column",
    "token_rewards=tr",
    "--column",
    "response_mask=mask",
    "--column",
    "values=vals",
    "--column",
    "group=uid",
];

fn f32s(value: &serde_json::Value) -> Vec<f32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

fn bools(value: &serde_json::Value) -> Vec<bool> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_bool().unwrap())
        .collect()
}

/// veRL's `compute_gae_advantage_return` with a response mask, by hand:
/// the raw advantages and returns of one response (hole tokens keep the
/// carried lastgaelam, as veRL leaves them).
fn verl_masked_gae(r: &[f32], v: &[f32], m: &[bool], gamma: f64, lam: f64) -> (Vec<f64>, Vec<f64>) {
    let (mut next_value, mut last) = (0.0, 0.0);
    let mut adv = vec![0.0; r.len()];
    for t in (0..r.len()).rev() {
        let delta = f64::from(r[t]) + gamma * next_value - f64::from(v[t]);
        let candidate = delta + gamma * lam * last;
        if m[t] {
            (next_value, last) = (f64::from(v[t]), candidate);
        }
        adv[t] = last;
    }
    let ret = adv.iter().zip(v).map(|(a, &v)| a + f64::from(v)).collect();
    (adv, ret)
}

/// A Parquet file holding veRL's token_level_rewards, a response mask with
/// holes and critic values: imported, then GRPO sums the token rewards
/// (holes' too) into the score and writes 0 at the holes; token-level GAE
/// runs veRL's masked recurrence (a hole's reward never reaches it) and
/// whitens over the valid tokens alone (veRL's masked_whiten).
#[test]
fn parquet_token_rewards_and_masks_with_holes_reach_grpo_and_gae() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tokenizer(tmp.path());
    let source = per_token_rows();
    let file = tmp.path().join("verl-batch.parquet");
    parquet_file(&file, &source);
    let out = tmp.path().join("imported");
    let result = import("parquet", &file, &tok, &out, &PER_TOKEN_COLUMNS);
    assert_eq!(result.code, 0, "{result}");
    for says in [
        "6 rows, 2 groups, 2 tasks",
        "token rewards: 6 rows (rewards.token_rewards; the score is their sum)",
        "response masks: 6 rows, 7 hole tokens (steps.response_mask)",
        "critic values: 6 rows (steps.old_values)",
    ] {
        assert!(result.stdout.contains(says), "{says}\n{result}");
    }
    let ids: Vec<String> = (0..6)
        .map(|i| format!("it0/{}/d0/s{}", if i < 3 { "a" } else { "b" }, i % 3))
        .collect();
    let steps = by_trajectory(rows::<StepRow>(&out.join("steps"), TableName::Steps), |s| {
        &s.trajectory_id
    });
    let rewards = by_id(rows(&out.join("rewards"), TableName::Rewards));
    for (i, row) in source.iter().enumerate() {
        assert_eq!(steps[i].trajectory_id, ids[i]);
        assert_eq!(steps[i].response_mask, Some(bools(&row["mask"])));
        assert_eq!(steps[i].old_values, Some(f32s(&row["vals"])));
        assert_eq!(rewards[i].token_rewards, Some(f32s(&row["tr"])));
        assert_eq!(rewards[i].score, row["score"].as_f64().unwrap() as f32);
    }

    // GRPO: the score is the token rewards' sum, a hole's reward included
    // (b/s0: 0.75 + 0.125 on its last token, a hole).
    let sums: Vec<f64> = source
        .iter()
        .map(|r| f32s(&r["tr"]).iter().map(|&x| f64::from(x)).sum())
        .collect();
    assert_eq!(sums[3], 0.875);
    let expected: Vec<f64> = [&sums[..3], &sums[3..]]
        .iter()
        .flat_map(|g| grpo_by_hand(g, true))
        .collect();
    let grpo = advantages(&out, &out.join("rewards"), &tmp.path().join("grpo"), &[]);
    assert_eq!(grpo.len(), 6);
    for (i, row) in grpo.iter().enumerate() {
        assert_eq!(row.trajectory_id, ids[i]);
        assert_close(row.episode_adv, expected[i], &ids[i]);
        for (t, (&a, &m)) in row
            .advantages
            .iter()
            .zip(&bools(&source[i]["mask"]))
            .enumerate()
        {
            if m {
                assert_close(a, expected[i], &format!("{} token {t}", ids[i]));
            } else {
                assert_eq!(a, 0.0, "{} token {t} is a hole", ids[i]);
            }
        }
    }

    // Token-level GAE as veRL computes it, whitened over the valid tokens.
    let (gamma, lam) = (0.99, 0.95);
    let gae = advantages(
        &out,
        &out.join("rewards"),
        &tmp.path().join("gae"),
        &[
            "estimator=gae",
            "gae.level=token",
            "gae.gamma=0.99",
            "gae.lam=0.95",
        ],
    );
    let (mut raw, mut returns, mut valid) = (Vec::new(), Vec::new(), Vec::new());
    for row in &source {
        let mask = bools(&row["mask"]);
        let (a, r) = verl_masked_gae(&f32s(&row["tr"]), &f32s(&row["vals"]), &mask, gamma, lam);
        raw.push(a);
        returns.push(r);
        valid.push(mask);
    }
    let kept: Vec<f64> = raw
        .iter()
        .flatten()
        .zip(valid.iter().flatten())
        .filter_map(|(&a, &m)| m.then_some(a))
        .collect();
    let n = kept.len() as f64;
    assert_eq!(n, 20.0);
    let mean = kept.iter().sum::<f64>() / (n + 1e-8);
    let var = kept.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / (n + 1e-8) * n / (n - 1.0);
    assert_eq!(gae.len(), 6);
    for (i, row) in gae.iter().enumerate() {
        assert_eq!(row.trajectory_id, ids[i]);
        let got_returns = row.returns.as_ref().unwrap();
        for t in 0..valid[i].len() {
            let at = format!("{} token {t}", ids[i]);
            if valid[i][t] {
                let whitened = (raw[i][t] - mean) / (var + 1e-8).sqrt();
                assert_close(row.advantages[t], whitened, &at);
                assert_close(got_returns[t], returns[i][t], &at);
            } else {
                assert_eq!(
                    (row.advantages[t], got_returns[t]),
                    (0.0, 0.0),
                    "{at} is a hole"
                );
            }
        }
    }
    // b/s0's last token is a hole holding 0.125: GAE skips it, so its last
    // valid token returns its own reward alone.
    assert_close(gae[3].returns.as_ref().unwrap()[2], 0.75, "b/s0 token 2");

    // No reward column: the score is the sum. A 0/1 integer mask reads as booleans.
    let ints: Vec<serde_json::Value> = source
        .iter()
        .map(|r| {
            let mut r = r.clone();
            r["mask"] = bools(&r["mask"]).iter().map(|&m| i64::from(m)).collect();
            r
        })
        .collect();
    let ints_file = tmp.path().join("int-mask.parquet");
    parquet_file(&ints_file, &ints);
    let sum_out = tmp.path().join("sums");
    let mut columns = PER_TOKEN_COLUMNS.to_vec();
    columns.drain(4..6);
    let result = import("parquet", &ints_file, &tok, &sum_out, &columns);
    assert_eq!(result.code, 0, "{result}");
    let scored = by_id(rows(&sum_out.join("rewards"), TableName::Rewards));
    let got: Vec<f32> = scored.iter().map(|r| r.score).collect();
    let want: Vec<f32> = sums.iter().map(|&s| s as f32).collect();
    assert_eq!(got, want);
    let masks = |dir: &Path| -> Vec<Option<Vec<bool>>> {
        by_trajectory(rows::<StepRow>(&dir.join("steps"), TableName::Steps), |s| {
            &s.trajectory_id
        })
        .into_iter()
        .map(|s| s.response_mask)
        .collect()
    };
    assert_eq!(masks(&sum_out), masks(&out));
}

#[test]
fn bad_token_rewards_and_masks_exit_2_naming_file_column_row_and_lengths() {
    let tmp = tempfile::tempdir().unwrap();
    let tok = tokenizer(tmp.path());
    let good = per_token_rows();
    let file = tmp.path().join("bad.parquet");
    let out = tmp.path().join("out");
    // (row, column, value, what the message says)
    let spoiled: [(usize, &str, serde_json::Value, &str); 4] = [
        (
            1,
            "tr",
            serde_json::json!([0.0, 0.5, 0.0]),
            "bad.parquet: row 1: column `tr` has 3 entries, the response has 4 tokens (column `resp`); it needs one per response token",
        ),
        (
            4,
            "mask",
            serde_json::json!([true, true]),
            "bad.parquet: row 4: column `mask` has 2 entries, the response has 3 tokens (column `resp`)",
        ),
        (
            0,
            "score",
            1.5.into(),
            "bad.parquet: row 0: column `score` is 1.5, the sum of column `tr` is 1.25; they must agree within 0.0001 relative",
        ),
        (
            5,
            "vals",
            serde_json::json!([0.1]),
            "bad.parquet: row 5: column `vals` has 1 entries, the response has 5 tokens",
        ),
    ];
    for (row, column, value, says) in spoiled {
        let mut rows = good.clone();
        rows[row][column] = value;
        parquet_file(&file, &rows);
        refused("parquet", &file, &tok, &out, &PER_TOKEN_COLUMNS, &[says]);
    }
    // A mask entry that is neither a boolean nor 0/1 (integer masks).
    let mut rows: Vec<serde_json::Value> = good.clone();
    for r in &mut rows {
        r["mask"] = bools(&r["mask"]).iter().map(|&m| i64::from(m)).collect();
    }
    rows[2]["mask"][3] = 2.into();
    parquet_file(&file, &rows);
    refused(
        "parquet",
        &file,
        &tok,
        &out,
        &PER_TOKEN_COLUMNS,
        &[
            "bad.parquet: row 2: column `mask` is [1,1,1,2,1,1], expected a list of booleans or 0/1 integers",
        ],
    );

    // A tokenised response: the mask is measured against its tokens.
    let text = "put a Mug in the Sink";
    let tokens = test_tokenizer()
        .encode(text, false)
        .unwrap()
        .get_ids()
        .len();
    let rows = vec![serde_json::json!({
        "prompt": [5, 6], "answer": text, "mask": vec![true; tokens + 1], "score": 1.0,
    })];
    parquet_file(&file, &rows);
    let columns = [
        "--column",
        "prompt_ids=prompt",
        "--column",
        "response=answer",
        "--column",
        "response_mask=mask",
        "--column",
        "reward=score",
    ];
    let says = format!(
        "bad.parquet: row 0: column `mask` has {} entries, the response has {tokens} tokens (column `answer` tokenised)",
        tokens + 1
    );
    refused("parquet", &file, &tok, &out, &columns, &[&says]);

    // Neither a reward nor token rewards mapped.
    parquet_file(&file, &good);
    refused(
        "parquet",
        &file,
        &tok,
        &out,
        &PER_TOKEN_COLUMNS[..4],
        &["--format parquet needs --column reward=COLUMN or --column token_rewards=COLUMN"],
    );
}

/// `source_row` numbers the dump's rows, each once: an imported table
/// passes `table validate --deep`; the same table with a row repeated or
/// beyond the dump is refused there, by `table export --format verl` and by
/// `table import --table trajectories`, exit 2 naming the table, the row
/// and the value.
#[test]
fn a_repeated_or_out_of_range_source_row_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let (dump, tok) = (verl_dump(root), tokenizer(root));
    let imported = root.join("imported");
    let result = import("verl", &dump, &tok, &imported, &[]);
    assert_eq!(result.code, 0, "{result}");
    let table = imported.join("trajectories");
    let validate = |dir: &Path| run("table", &["validate", "--deep", dir.to_str().unwrap()]);
    let result = validate(&table);
    assert_eq!(result.code, 0, "{result}");
    let rows: Vec<TrajectoryRow> = rows(&table, TableName::Trajectories);
    assert_eq!(rows.len(), 12);
    let advantages = root.join("adv");
    embodyflow_tests::write_table::<AdvantageRow>(&advantages, &[]);

    for (name, at, value, needles) in [
        (
            "repeated",
            5,
            rows[2].source_row.unwrap(),
            vec![
                format!("row 5 (trajectory `{}`)", rows[5].trajectory_id),
                format!("has source_row {}", rows[2].source_row.unwrap()),
                format!("as row 2 (trajectory `{}`) has", rows[2].trajectory_id),
            ],
        ),
        (
            "beyond",
            7,
            12,
            vec![
                format!("row 7 (trajectory `{}`)", rows[7].trajectory_id),
                "has source_row 12, outside 0..12".into(),
            ],
        ),
    ] {
        let mut forged = rows.clone();
        forged[at].source_row = Some(value);
        let dir = root.join(name);
        embodyflow_tests::write_table(&dir, &forged);
        let table = dir.join("trajectories");
        let result = validate(&table);
        assert_eq!(result.code, 2, "{name}: {result}");
        assert!(
            result
                .stderr
                .contains(&format!("table `trajectories` at {}", table.display())),
            "{name}: {result}"
        );
        for needle in &needles {
            assert!(
                result.stderr.contains(needle.as_str()),
                "{name}: {needle}: {result}"
            );
        }
        let out = root.join(format!("{name}.jsonl"));
        let result = run(
            "table",
            &[
                "export",
                advantages.join("advantages").to_str().unwrap(),
                "--format",
                "verl",
                "--trajectories",
                table.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
        );
        assert_eq!(result.code, 2, "{name}: {result}");
        assert!(result.stderr.contains("source_row"), "{name}: {result}");
        assert_eq!(
            std::fs::read_to_string(&out).unwrap_or_default(),
            "",
            "{name}: nothing exported"
        );

        // The same rows as JSON lines: refused on import, by line.
        let lines = root.join(format!("{name}-rows.jsonl"));
        let text: String = forged
            .iter()
            .map(|r| serde_json::to_string(r).unwrap() + "\n")
            .collect();
        std::fs::write(&lines, text).unwrap();
        let out = root.join(format!("{name}-imported"));
        let result = run(
            "table",
            &[
                "import",
                "--table",
                "trajectories",
                "--from",
                lines.to_str().unwrap(),
                "--out",
                out.to_str().unwrap(),
            ],
        );
        assert_eq!(result.code, 2, "{name}: {result}");
        let line = needles[0].replacen(&format!("row {at}"), &format!("line {}", at + 1), 1);
        assert!(result.stderr.contains(&line), "{name}: {line}: {result}");
        assert!(
            result.stderr.contains(needles[1].as_str()),
            "{name}: {result}"
        );
        assert!(
            !out.join("trajectories").exists(),
            "{name}: nothing written"
        );
    }
}
