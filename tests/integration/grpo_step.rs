//! grpo_step (rule and forward_proxy) and StepOPSD through the binaries:
//! score-rewards writes the rule matches, compute-advantages aligns tokens
//! with the test tokenizer and writes A and A^S.

use std::path::PathBuf;

use embodyflow_algos::spans::test_tokenizer;
use embodyflow_core::schemas::{AdvantageRow, PlanAction, TaskRow, TeacherLogpRow, TrajectoryRow};
use embodyflow_tests::{Run, one_shot_step, read_advantages, run, write_table};

const GT: [(i32, &str); 2] = [(12, "find a Mug"), (4, "pick up the Mug")];

fn plan_json(steps: &[(i32, &str)]) -> String {
    let items: Vec<String> = steps
        .iter()
        .map(|(id, n)| format!("{{\"action_id\": {id}, \"action_name\": \"{n}\"}}"))
        .collect();
    format!(
        "{{\"language_plan\": [\"find a Mug\"], \"executable_plan\": [{}]}}<|im_end|>",
        items.join(", ")
    )
}

fn responses() -> Vec<String> {
    vec![
        plan_json(&GT),
        plan_json(&[(12, "find a Mug"), (7, "find a Sink")]),
        plan_json(&[(4, "pick up the Mug"), (12, "find a Mug")]),
        "{\"executable_plan\": [{\"action_id\": 12, \"action_n".to_string(),
    ]
}

struct Fixture {
    dir: tempfile::TempDir,
    tokenizer: PathBuf,
}

impl Fixture {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Two groups of the four responses; trajectory ids sort in sample order.
fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = test_tokenizer();
    let tokenizer_path = dir.path().join("tokenizer.json");
    tokenizer.save(&tokenizer_path, false).unwrap();
    let (mut tasks, mut trajectories, mut steps) = (Vec::new(), Vec::new(), Vec::new());
    for g in 0..2 {
        let task_id = format!("household/train/0/{g:06}");
        tasks.push(TaskRow {
            task_id: task_id.clone(),
            suite: "household".into(),
            env: "household".into(),
            split: "train".into(),
            task_type: None,
            seed: 0,
            instruction: "Pick up the mug.".into(),
            observation: None,
            gt_actions: Some(
                GT.iter()
                    .map(|&(id, n)| PlanAction {
                        action_id: i64::from(id),
                        action_name: n.into(),
                    })
                    .collect(),
            ),
        });
        for (s, text) in responses().into_iter().enumerate() {
            let trajectory_id = format!("it0/{task_id}/d0/s{s}");
            let ids: Vec<i32> = tokenizer
                .encode(text.as_str(), false)
                .unwrap()
                .get_ids()
                .iter()
                .map(|&i| i as i32)
                .collect();
            steps.push(one_shot_step(&trajectory_id, ids));
            trajectories.push(TrajectoryRow {
                source_row: None,
                infra_fault: None,
                failure_reason: None,
                trajectory_id,
                group_id: format!("it0/{task_id}/d0"),
                task_id: task_id.clone(),
                sample_index: s as i32,
                iteration: 0,
                policy: "test".into(),
                temperature: 1.6,
                num_steps: 1,
                env_steps: 2,
                complete: s == 0,
                response_text: Some(text),
                seed: 0,
                ever_grasped: None,
            });
        }
    }
    write_table(&dir.path().join("data"), &tasks);
    write_table(&dir.path().join("rollouts"), &trajectories);
    write_table(&dir.path().join("rollouts"), &steps);
    let fixture = Fixture {
        dir,
        tokenizer: tokenizer_path,
    };
    let (rollouts, data, rewards) = (
        fixture.path("rollouts"),
        fixture.path("data"),
        fixture.path("rewards"),
    );
    let result = run(
        "score-rewards",
        &[
            "--input",
            rollouts.to_str().unwrap(),
            "--input",
            data.to_str().unwrap(),
            "--out",
            rewards.to_str().unwrap(),
            "--set",
            "reward.fn=verify",
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    fixture
}

fn compute(f: &Fixture, out: &str, extra: &[&str]) -> (Run, PathBuf) {
    let (rollouts, rewards, teacher, out) = (
        f.path("rollouts"),
        f.path("rewards"),
        f.path("teacher"),
        f.path(out),
    );
    let set_tokenizer = format!("step.tokenizer={}", f.tokenizer.display());
    let mut args = vec![
        "--input",
        rollouts.to_str().unwrap(),
        "--input",
        rewards.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--set",
        &set_tokenizer,
    ];
    if teacher.exists() {
        args.extend(["--input", teacher.to_str().unwrap()]);
    }
    args.extend_from_slice(extra);
    (run("compute-advantages", &args), out)
}

fn name_tokens(row: &AdvantageRow) -> Vec<usize> {
    row.step_adv
        .as_ref()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, a)| **a != 0.0)
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn omega_zero_is_plain_grpo_bit_for_bit() {
    let f = fixture();
    let (result, grpo) = compute(&f, "grpo", &[]);
    assert_eq!(result.code, 0, "{result}");
    let (result, step) = compute(
        &f,
        "step0",
        &["--set", "estimator=grpo_step", "--set", "step.omega=0"],
    );
    assert_eq!(result.code, 0, "{result}");
    let (a, b) = (
        read_advantages(&grpo.join("advantages")),
        read_advantages(&step.join("advantages")),
    );
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.advantages, y.advantages);
        assert_eq!(x.episode_adv, y.episode_adv);
    }
}

#[test]
fn rule_credit_lands_on_action_names_only() {
    let f = fixture();
    let (result, out) = compute(
        &f,
        "rule",
        &["--set", "estimator=grpo_step", "--set", "step.omega=0.5"],
    );
    assert_eq!(result.code, 0, "{result}");
    let rows = read_advantages(&out.join("advantages"));
    let tokenizer = test_tokenizer();
    let decode = |ids: &[usize], all: &[u32]| {
        tokenizer
            .decode(&ids.iter().map(|&i| all[i]).collect::<Vec<_>>(), false)
            .unwrap()
    };
    for (row, text) in rows.iter().zip(responses().iter().cycle()) {
        let ids = tokenizer
            .encode(text.as_str(), false)
            .unwrap()
            .get_ids()
            .to_vec();
        let step_adv = row.step_adv.as_ref().unwrap();
        assert_eq!(step_adv.len(), ids.len());
        for (a, s) in row.advantages.iter().zip(step_adv) {
            assert_eq!(*a, row.episode_adv + 0.5 * s);
        }
        let credited = name_tokens(row);
        let decoded = decode(&credited, &ids);
        match row.trajectory_id.rsplit('/').next().unwrap() {
            // Both steps right: +1 on both names, nothing else.
            "s0" => {
                assert!(step_adv.iter().all(|&s| s == 0.0 || s == 1.0));
                assert_eq!(decoded.replace(' ', ""), "findaMugpickuptheMug");
            }
            // Second step wrong: -1 on "find a Sink" only.
            "s1" => {
                let negative: Vec<usize> = step_adv
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| **s == -1.0)
                    .map(|(i, _)| i)
                    .collect();
                assert_eq!(decode(&negative, &ids).trim(), "find a Sink");
            }
            // Both wrong under exact matching.
            "s2" => assert!(step_adv.iter().all(|&s| s <= 0.0) && !credited.is_empty()),
            // Broken JSON: A^S = 0 everywhere.
            "s3" => assert!(credited.is_empty()),
            other => panic!("{other}"),
        }
    }
    let diagnostics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("diagnostics.json")).unwrap())
            .unwrap();
    assert_eq!(diagnostics["step"]["responses"], 8);
    assert_eq!(diagnostics["step"]["responses_with_step_adv"], 6);
    assert_eq!(diagnostics["step"]["parse_failures"], 2);
    assert!(
        diagnostics["step"]["sign_flips"]["tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    // Where A^E != 0, a flip is a token whose A^S (omega 0.5) outweighs A^E
    // with the other sign; A^S = 0 tokens keep A = A^E.
    let sign = |x: f32| (x > 0.0) as i8 - (x < 0.0) as i8;
    let flipped_where_episode_adv_nonzero: u64 = rows
        .iter()
        .filter(|row| row.episode_adv != 0.0)
        .map(|row| {
            row.advantages
                .iter()
                .filter(|&&a| sign(a) != sign(row.episode_adv))
                .count() as u64
        })
        .sum();
    assert_eq!(
        diagnostics["step"]["sign_flips_episode_adv_nonzero"]["flipped"],
        flipped_where_episode_adv_nonzero
    );
    let summary = std::fs::read_to_string(out.join("_summary.compute-advantages.md")).unwrap();
    assert!(summary.contains("sign-flip ratio: all"));
    assert!(summary.contains("sign-flip ratio: where A^E != 0"));
}

fn write_teacher(f: &Fixture, skip: Option<usize>, wrong_length: Option<usize>) {
    let tokenizer = test_tokenizer();
    let mut rows = Vec::new();
    for g in 0..2 {
        for (s, text) in responses().iter().enumerate() {
            let n = tokenizer
                .encode(text.as_str(), false)
                .unwrap()
                .get_ids()
                .len();
            let index = g * 4 + s;
            if skip == Some(index) {
                continue;
            }
            let n = if wrong_length == Some(index) {
                n + 1
            } else {
                n
            };
            // The teacher prefers the correct first sample, disfavours the others.
            let gap = if s == 0 { 1.0 } else { -1.0 };
            rows.push(TeacherLogpRow {
                trajectory_id: format!("it0/household/train/0/{g:06}/d0/s{s}"),
                step_index: 0,
                teacher_logp: vec![-1.0 + gap * 0.5; n],
                student_logp: vec![-1.0; n],
                teacher: "generalist".into(),
                template: "reference_plan".into(),
            });
        }
    }
    let dir = f.path("teacher");
    let _ = std::fs::remove_dir_all(&dir);
    write_table(&dir, &rows);
}

#[test]
fn forward_proxy_scores_steps_from_the_contrast() {
    let f = fixture();
    write_teacher(&f, None, None);
    let (result, out) = compute(
        &f,
        "proxy",
        &[
            "--set",
            "estimator=grpo_step",
            "--set",
            "step.kind=forward_proxy",
            "--set",
            "step.score_tau=0.5",
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    let rows = read_advantages(&out.join("advantages"));
    let expected = [1f32.tanh(), -(1f32.tanh()), -(1f32.tanh())];
    for (row, want) in rows.iter().zip(expected.iter().chain([0.0].iter()).cycle()) {
        let values: Vec<f32> = row
            .step_adv
            .as_ref()
            .unwrap()
            .iter()
            .copied()
            .filter(|&s| s != 0.0)
            .collect();
        assert!(
            values.iter().all(|&v| (v - want).abs() < 1e-6),
            "{}: {values:?}",
            row.trajectory_id
        );
    }
}

#[test]
fn stepopsd_keeps_every_sign() {
    let f = fixture();
    write_teacher(&f, None, None);
    let (result, out) = compute(
        &f,
        "opsd",
        &[
            "--set",
            "stepopsd.enabled=true",
            "--set",
            "stepopsd.lambda_mix=1.0",
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    for row in read_advantages(&out.join("advantages")) {
        for &a in &row.advantages {
            assert_eq!(
                a.signum(),
                row.episode_adv.signum(),
                "{}",
                row.trajectory_id
            );
            assert!(
                a.abs() <= row.episode_adv.abs() * 1.2 + 1e-6
                    && a.abs() >= row.episode_adv.abs() * 0.8 - 1e-6
            );
        }
        assert!(row.step_adv.is_none());
    }
}

#[test]
fn missing_or_misfit_teacher_rows_are_bad_input() {
    let f = fixture();
    // teacher-logp skipped one step (no ground-truth plan): that step gets no
    // step advantage, the others theirs.
    write_teacher(&f, Some(5), None);
    let args = [
        "--set",
        "estimator=grpo_step",
        "--set",
        "step.kind=forward_proxy",
    ];
    let (result, out) = compute(&f, "missing", &args);
    assert_eq!(result.code, 0, "{result}");
    assert!(
        result
            .stdout
            .contains("| steps without a teacher_logp row (A^S = 0) | 1 |"),
        "{result}"
    );
    let credited: Vec<(String, bool)> = read_advantages(&out.join("advantages"))
        .into_iter()
        .map(|row| {
            (
                row.trajectory_id,
                row.step_adv.unwrap().iter().any(|&a| a != 0.0),
            )
        })
        .collect();
    assert!(credited.contains(&("it0/household/train/0/000001/d0/s1".into(), false)));
    assert!(credited.contains(&("it0/household/train/0/000000/d0/s1".into(), true)));
    // A teacher table of another rollout set matches no step at all.
    let dir = f.path("teacher");
    std::fs::remove_dir_all(&dir).unwrap();
    write_table(
        &dir,
        &[TeacherLogpRow {
            trajectory_id: "another/rollout".into(),
            step_index: 0,
            teacher_logp: vec![-1.0],
            student_logp: vec![-1.0],
            teacher: "generalist".into(),
            template: "reference_plan".into(),
        }],
    );
    let (result, out) = compute(&f, "foreign", &args);
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result
            .stderr
            .contains("none of the 8 steps has a teacher_logp row"),
        "{result}"
    );
    assert!(!out.join("advantages").exists());

    write_teacher(&f, None, Some(2));
    let (result, _) = compute(
        &f,
        "length",
        &[
            "--set",
            "estimator=grpo_step",
            "--set",
            "step.kind=forward_proxy",
        ],
    );
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result
            .stderr
            .contains("`it0/household/train/0/000000/d0/s2`")
            && result.stderr.contains("expected"),
        "{result}"
    );

    // No tokenizer at all.
    let (rollouts, rewards, out) = (f.path("rollouts"), f.path("rewards"), f.path("none"));
    let result = run(
        "compute-advantages",
        &[
            "--input",
            rollouts.to_str().unwrap(),
            "--input",
            rewards.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--set",
            "estimator=grpo_step",
        ],
    );
    assert_eq!(result.code, 2, "{result}");
    assert!(result.stderr.contains("--policy"), "{result}");
}

#[test]
fn forward_proxy_reports_the_step_score_distribution_and_auc() {
    let f = fixture();
    write_teacher(&f, None, None);
    let (result, out) = compute(
        &f,
        "proxy-diag",
        &[
            "--set",
            "estimator=grpo_step",
            "--set",
            "step.kind=forward_proxy",
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    let diagnostics: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("diagnostics.json")).unwrap())
            .unwrap();
    let step = &diagnostics["step"];
    // Per group: s0 has 2 right steps, s1 1 right and 1 wrong, s2 2 wrong; two groups.
    assert_eq!(step["step_adv_rule_correct"]["count"], 6);
    assert_eq!(step["step_adv_rule_wrong"]["count"], 6);
    let auc = step["step_adv_auc"].as_f64().unwrap();
    // The teacher favours all of s0 and disfavours all of s1 and s2: 4 of the 6 right steps score above every wrong one.
    assert!(
        (auc - (4.0 * 6.0 + 2.0 * 6.0 * 0.5) / 36.0).abs() < 1e-9,
        "auc {auc}"
    );
    assert!(result.stdout.contains("AUC of A^S"), "{result}");
}

#[test]
fn residual_contrast_removes_a_response_wide_offset_and_needs_forward_proxy() {
    let f = fixture();
    write_teacher(&f, None, None);
    let (result, out) = compute(
        &f,
        "residual",
        &[
            "--set",
            "estimator=grpo_step",
            "--set",
            "step.kind=forward_proxy",
            "--set",
            "step.gate=residual_contrast",
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    // The fixture's teacher gap is the same on every token of a response: the residual is 0.
    for row in read_advantages(&out.join("advantages")) {
        assert!(row.step_adv.unwrap().iter().all(|&s| s == 0.0));
    }
    let (result, out) = compute(
        &f,
        "residual-rule",
        &[
            "--set",
            "estimator=grpo_step",
            "--set",
            "step.gate=residual_contrast",
        ],
    );
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result.stderr.contains("`step.gate`") && result.stderr.contains("forward_proxy"),
        "{result}"
    );
    assert!(!out.join("advantages").exists());
}

#[test]
fn prompt_gates_scale_each_step() {
    use embodyflow_core::schemas::StepGateRow;
    let f = fixture();
    let mut gates = Vec::new();
    for g in 0..2 {
        for s in 0..3 {
            for k in 0..2 {
                gates.push(StepGateRow {
                    trajectory_id: format!("it0/household/train/0/{g:06}/d0/s{s}"),
                    plan_step: k,
                    decision_gate: 1.0,
                    redundancy_gate: if k == 1 { 1.0 } else { 0.0 }, // the second step is redundant
                    causal_gate: 0.0,
                    prompt_kl_score: None,
                    reason: Some("test".into()),
                });
            }
        }
    }
    write_table(&f.path("teacher"), &gates);
    let (result, out) = compute(
        &f,
        "prompt",
        &["--set", "estimator=grpo_step", "--set", "step.gate=prompt"],
    );
    assert_eq!(result.code, 0, "{result}");
    for row in read_advantages(&out.join("advantages"))
        .iter()
        .filter(|r| r.trajectory_id.ends_with("s0"))
    {
        // First step: +1 * 1 * 1 * 0.5; second: gated to 0.
        let values: Vec<f32> = row
            .step_adv
            .as_ref()
            .unwrap()
            .iter()
            .copied()
            .filter(|&s| s != 0.0)
            .collect();
        assert!(
            !values.is_empty() && values.iter().all(|&v| v == 0.5),
            "{values:?}"
        );
    }
    // A missing gate row is bad input.
    gates.retain(|g| !(g.trajectory_id.ends_with("000001/d0/s2") && g.plan_step == 1));
    std::fs::remove_dir_all(f.path("teacher")).unwrap();
    write_table(&f.path("teacher"), &gates);
    let (result, _) = compute(
        &f,
        "prompt-missing",
        &["--set", "estimator=grpo_step", "--set", "step.gate=prompt"],
    );
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result
            .stderr
            .contains("`it0/household/train/0/000001/d0/s2` plan step 1"),
        "{result}"
    );
}

#[test]
fn heatmaps_are_drawn_for_responses_with_step_advantages() {
    let f = fixture();
    let (result, out) = compute(
        &f,
        "heat",
        &[
            "--set",
            "estimator=grpo_step",
            "--set",
            "step.omega=0.5",
            "--heatmaps",
            "3",
        ],
    );
    assert_eq!(result.code, 0, "{result}");
    let index = std::fs::read_to_string(out.join("heatmaps/index.md")).unwrap();
    for i in 0..3 {
        let path = out.join(format!("heatmaps/{i:03}.png"));
        let png = std::fs::read(&path).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // The height with the strip of token text the policy's tokenizer
        // decoded: title 56, tokens 84, panels 92, line plot 240, margin 10.
        let height = u32::from_be_bytes(png[20..24].try_into().unwrap());
        assert_eq!(height, 56 + 84 + 92 + 240 + 10);
        assert!(index.contains(&format!("{i:03}.png")));
        if let Some(dir) = std::env::var_os("EMBODYFLOW_PLOT_DIR") {
            std::fs::copy(
                &path,
                std::path::Path::new(&dir).join(format!("stage-heatmap-{i}.png")),
            )
            .unwrap();
        }
    }
    // Responses with a non-zero A^S come first: not the broken s3.
    assert!(
        !index.lines().skip(5).take(3).any(|l| l.contains("/s3 ")),
        "{index}"
    );
}
