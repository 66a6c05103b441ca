//! A vision-language model as the plan policy: a tiny random Qwen2.5-VL
//! that transformers saved (`scripts/hf_vl_golden.py plan-policy`, our
//! household tokenizer plus Qwen's chat and vision tokens, Qwen2-VL's chat
//! template) plans household tasks that carry a scene image through the
//! stages — collect-rollouts, score-rewards, compute-advantages (grpo and
//! grpo_step), one GRPO update with a KL reference, evaluate, and
//! teacher-logp with a vision-language teacher, of its own rollouts and of
//! a tiny text decoder's with the same tokenizer. The image rides with the
//! prompt: each step records the task's scene image (`steps.observation`)
//! beside prompt ids holding its expanded placeholders, and update-policy,
//! rescoring from that row, starts at ratio 1 (approx_kl 0); with
//! `freeze_vision` the same update leaves the vision encoder's weights as
//! they were (they move without it), and a text policy refuses the key. An
//! image the processor cannot take and a prompt whose placeholders miss
//! their image exit 2 naming the file, key or row, writing nothing.

use std::path::{Path, PathBuf};
use std::process::Command;

use embodyflow_core::dataset::TableReader;
use embodyflow_core::observation::decode;
use embodyflow_core::schemas::{
    EvalRow, MetricRow, StepRow, TableName, TaskRow, TeacherLogpRow, TrajectoryRow,
};
use embodyflow_tests::{Run, TINY_POLICY, run, tensor_bytes, write_table};

const PYTHON: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python");
const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/hf_vl_golden.py");
/// The side of the tasks' scene images: 32 × 32 pixels are an 8 × 8 patch
/// grid at patch 4, 16 tokens after the 2 × 2 merge.
const IMAGE_SIZE: usize = 32;
const IMAGE_TOKENS: usize = 16;

fn ok(name: &str, args: &[&str]) -> String {
    let result = run(name, args);
    assert_eq!(result.code, 0, "{name} {args:?}\n{result}");
    result.stdout
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

fn rows<R: embodyflow_core::schemas::Row>(dir: &Path, table: TableName) -> Vec<R> {
    TableReader::open(dir, table).unwrap().read_rows().unwrap()
}

/// Household tasks with scene images under `root/data/{train,val}` and the
/// tiny Qwen2.5-VL in `root/qwen-vl`; returns the model directory and the
/// template's ids of a user turn with one image (unexpanded).
fn tasks_and_qwen_vl(root: &Path) -> (PathBuf, serde_json::Value) {
    for (split, seed, count) in [("train", "1", "6"), ("val", "2", "2")] {
        ok(
            "generate-tasks",
            &[
                "--out",
                s(&root.join("data").join(split)),
                "--seed",
                seed,
                "--set",
                &format!("split={split}"),
                "--set",
                &format!("count={count}"),
                "--set",
                &format!("image_size={IMAGE_SIZE}"),
            ],
        );
    }
    let init = root.join("init");
    let mut args = vec!["--out", s(&init), "--seed", "0"];
    args.extend(TINY_POLICY);
    ok("init-policy", &args);
    let model = root.join("qwen-vl");
    let out = Command::new(PYTHON)
        .arg(SCRIPT)
        .args(["plan-policy", s(&model), s(&init.join("tokenizer.json"))])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {PYTHON} ({e}): run scripts/setup"));
    assert!(
        out.status.success(),
        "{SCRIPT} plan-policy:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let made = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    (model, made)
}

fn collect(root: &Path, policy: &Path, out: &Path) -> Run {
    run(
        "collect-rollouts",
        &[
            "--policy",
            s(policy),
            "--input",
            s(&root.join("data/train")),
            "--out",
            s(out),
            "--seed",
            "5",
            "--set",
            "group_size=2",
            "--set",
            "tasks_per_iteration=3",
            "--set",
            "max_new_tokens=12",
            "--set",
            "batch_rows=4",
        ],
    )
}

/// The verify rewards of `rollouts` (once) and their advantages under
/// `estimator`, beside them in `adv-<estimator>`.
fn advantages(root: &Path, policy: &Path, rollouts: &Path, estimator: &str) -> PathBuf {
    let at = rollouts.parent().unwrap();
    let (rewards, out) = (at.join("rewards"), at.join(format!("adv-{estimator}")));
    let tasks = root.join("data/train");
    if !rewards.exists() {
        let args = [
            "--input",
            s(rollouts),
            "--input",
            s(&tasks),
            "--out",
            s(&rewards),
        ];
        ok(
            "score-rewards",
            &[&args[..], &["--set", "reward.fn=verify"]].concat(),
        );
    }
    ok(
        "compute-advantages",
        &[
            "--policy",
            s(policy),
            "--input",
            s(rollouts),
            "--input",
            s(&rewards),
            "--input",
            s(&tasks),
            "--out",
            s(&out),
            "--set",
            &format!("estimator={estimator}"),
        ],
    );
    out
}

/// The teacher log-probs of `rollouts` (of tasks `root/data/train`) by
/// teacher-logp with `policy` and `teacher`, written beside them in `teacher`.
fn teacher_logp(
    root: &Path,
    policy: &Path,
    teacher: &Path,
    rollouts: &Path,
) -> Vec<TeacherLogpRow> {
    let out = rollouts.parent().unwrap().join("teacher");
    ok(
        "teacher-logp",
        &[
            "--policy",
            s(policy),
            "--teacher",
            s(teacher),
            "--input",
            s(rollouts),
            "--input",
            s(&root.join("data/train")),
            "--out",
            s(&out),
        ],
    );
    rows(&out.join("teacher_logp"), TableName::TeacherLogp)
}

#[test]
fn a_tiny_qwen_vl_plans_from_scene_images_through_the_stages() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (qwen, made) = tasks_and_qwen_vl(root);
    let rollouts = root.join("it0/rollouts");
    let result = collect(root, &qwen, &rollouts);
    assert_eq!(result.code, 0, "{result}");

    // Each step holds its task's scene image and the prompt the model read:
    // the template's ids with the one placeholder expanded to 16.
    let tasks: Vec<TaskRow> = rows(&root.join("data/train/tasks"), TableName::Tasks);
    let trajectories: Vec<TrajectoryRow> =
        rows(&rollouts.join("trajectories"), TableName::Trajectories);
    let steps: Vec<StepRow> = rows(&rollouts.join("steps"), TableName::Steps);
    assert_eq!(steps.len(), 6);
    let image_token = made["image_token_id"].as_i64().unwrap() as i32;
    let template: Vec<i32> = made["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap() as i32)
        .collect();
    let head = &template[..=template.iter().position(|&t| t == image_token).unwrap()];
    for step in &steps {
        let trajectory = trajectories
            .iter()
            .find(|t| t.trajectory_id == step.trajectory_id)
            .unwrap();
        let task = tasks
            .iter()
            .find(|t| t.task_id == trajectory.task_id)
            .unwrap();
        let (size, rgb) = embodyflow_household::task_image(task).unwrap().unwrap();
        let observation = decode(step.observation.as_deref().expect("the image")).unwrap();
        assert_eq!(
            (observation.shape.height, observation.shape.width),
            (size, size)
        );
        assert_eq!(observation.pixels, rgb.as_slice(), "{}", task.task_id);
        assert_eq!(&step.prompt_ids[..head.len()], head);
        let placeholders = step
            .prompt_ids
            .iter()
            .filter(|&&t| t == image_token)
            .count();
        assert_eq!(placeholders, IMAGE_TOKENS);
        assert_eq!(step.response_ids.len(), step.old_logprobs.len());
    }

    for estimator in ["grpo", "grpo_step"] {
        advantages(root, &qwen, &rollouts, estimator);
    }
    // One GRPO step over all six answers, against the model itself as the
    // KL reference: rescored from the steps rows (image included), the
    // log-probs are the sampler's, so the ratio and the KL start at 0. Its
    // entropy bonus moves every parameter the answers' logits depend on,
    // whatever their advantages.
    let adv = root.join("it0/adv-grpo_step");
    let grpo = |out: &str, policy: &Path, more: &[&str]| {
        let kl_reference = format!("kl_reference={}", s(&qwen));
        let mut args = vec![
            "--policy",
            s(policy),
            "--input",
            s(&rollouts),
            "--input",
            s(&adv),
            "--out",
            out,
        ];
        let sets = [
            "epochs=1",
            "mini_batch=6",
            "micro_batch=3",
            "ppo.kl_coef=0.01",
            "ppo.entropy_coef=0.01",
        ];
        for set in sets.iter().chain(&[kl_reference.as_str()]).chain(more) {
            args.extend(["--set", set]);
        }
        run("update-policy", &args)
    };
    let update = grpo(s(&root.join("it1")), &qwen, &[]);
    assert_eq!(update.code, 0, "{update}");
    assert!(update.stdout.contains("| objective | ppo |"), "{update}");
    let metrics: Vec<MetricRow> = rows(&root.join("it1/metrics"), TableName::Metrics);
    assert_eq!(metrics.len(), 1);
    let (approx_kl, kl) = (metrics[0].approx_kl.unwrap(), metrics[0].kl_loss.unwrap());
    assert!(
        approx_kl.abs() < 1e-5 && kl.abs() < 1e-5,
        "{approx_kl} {kl}"
    );
    let policy = root.join("it1/policy");
    assert!(policy.join("preprocessor_config.json").is_file());

    // The same step with `freeze_vision`: the vision encoder's weights stay
    // the model's, the language model's move as they did without it (the
    // step moved the vision encoder then). A text policy has none to freeze.
    let frozen = root.join("it1-frozen");
    let update = grpo(s(&frozen), &qwen, &["freeze_vision=true"]);
    assert_eq!(update.code, 0, "{update}");
    assert!(
        update.stdout.contains("| vision encoder | frozen"),
        "{update}"
    );
    let weight = |dir: &Path, name: &str| tensor_bytes(&dir.join("model.safetensors"), name);
    for (name, moves_when_frozen) in [
        ("visual.blocks.0.mlp.up_proj.weight", false),
        ("visual.merger.mlp.0.weight", false),
        ("model.layers.1.mlp.up_proj.weight", true),
    ] {
        let before = weight(&qwen, name);
        let moved = weight(&policy, name) != before;
        assert!(moved, "{name} moves without freeze_vision");
        let moved = weight(&frozen.join("policy"), name) != before;
        assert_eq!(moved, moves_when_frozen, "{name} with freeze_vision");
    }
    let text = root.join("text-frozen");
    let text_only = ["freeze_vision=true", "ppo.kl_coef=0"];
    let refused = grpo(s(&text), &root.join("init"), &text_only);
    assert_eq!(refused.code, 2, "{refused}");
    assert!(
        refused.stderr.contains("freeze_vision") && refused.stderr.contains("no vision encoder"),
        "{refused}"
    );
    assert!(!text.exists(), "nothing written");

    ok(
        "evaluate",
        &[
            "--policy",
            s(&policy),
            "--input",
            s(&root.join("data/val")),
            "--out",
            s(&root.join("it1/eval")),
            "--set",
            "max_new_tokens=12",
            "--set",
            "runs=1",
        ],
    );
    let eval: Vec<EvalRow> = rows(&root.join("it1/eval/eval"), TableName::Eval);
    assert_eq!(eval.len(), 2);

    // The trained model as the teacher of the rollouts of the first.
    let teacher = teacher_logp(root, &qwen, &policy, &rollouts);
    assert_eq!(teacher.len(), steps.len());
}

/// A copy of the model directory `from` in `to`.
fn copy_model(from: &Path, to: &Path) -> PathBuf {
    std::fs::create_dir(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
    to.to_path_buf()
}

/// A model directory whose processor cuts patches of another size than
/// its vision config (`merge_size`, `temporal_patch_size`), or whose
/// tokenizer lacks `<|image_pad|>`, is refused when the policy loads:
/// collect-rollouts exits 2 naming the file and key, writing nothing.
#[test]
fn a_processor_or_tokenizer_of_another_model_exits_2_writing_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (qwen, _) = tasks_and_qwen_vl(root);
    let edits: [(&str, &str, &str, &str, &[&str]); 3] = [
        (
            "preprocessor_config.json",
            "\"merge_size\": 2",
            "\"merge_size\": 1",
            "merge",
            &["`merge_size` is 1", "`vision_config.spatial_merge_size` 2"],
        ),
        (
            "preprocessor_config.json",
            "\"temporal_patch_size\": 2",
            "\"temporal_patch_size\": 1",
            "temporal",
            &[
                "`temporal_patch_size` is 1",
                "`vision_config.temporal_patch_size` 2",
            ],
        ),
        (
            "tokenizer.json",
            "<|image_pad|>",
            "<|image_pod|>",
            "tokenizer",
            &["lacks `<|image_pad|>`", "`image_token_id`"],
        ),
    ];
    for (file, from, to, name, needles) in edits {
        let model = copy_model(&qwen, &root.join(format!("qwen-vl-{name}")));
        let text = std::fs::read_to_string(model.join(file)).unwrap();
        assert!(text.contains(from), "{file} lacks {from}: {text}");
        std::fs::write(model.join(file), text.replace(from, to)).unwrap();
        let out = root.join(format!("refused-{name}"));
        let result = collect(root, &model, &out);
        assert_eq!(result.code, 2, "{name}: {result}");
        for needle in std::iter::once(&file).chain(needles) {
            assert!(
                result.stderr.contains(needle),
                "{name}: lacks {needle}: {result}"
            );
        }
        assert!(!out.exists(), "{name}: nothing written");
    }
}

#[test]
fn images_the_processor_cannot_take_and_placeholders_without_their_image_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (qwen, _) = tasks_and_qwen_vl(root);

    // A processor whose pixel budget no resize of a 32 × 32 image meets.
    let small = copy_model(&qwen, &root.join("qwen-vl-small"));
    let processor = small.join("preprocessor_config.json");
    let text = std::fs::read_to_string(&processor).unwrap();
    let budget = ["\"longest_edge\": 4096", "\"shortest_edge\": 256"];
    assert!(budget.iter().all(|b| text.contains(b)), "{text}");
    let text = text
        .replace(budget[0], "\"longest_edge\": 32")
        .replace(budget[1], "\"shortest_edge\": 16");
    std::fs::write(&processor, text).unwrap();
    let out = root.join("refused");
    let result = collect(root, &small, &out);
    assert_eq!(result.code, 2, "{result}");
    for needle in [
        "task `household/train/",
        "preprocessor_config.json",
        "`max_pixels`",
    ] {
        assert!(result.stderr.contains(needle), "lacks {needle}: {result}");
    }
    assert!(!out.exists(), "nothing written");

    // A step whose image is gone while its prompt keeps the placeholders.
    let rollouts = root.join("rollouts");
    let result = collect(root, &qwen, &rollouts);
    assert_eq!(result.code, 0, "{result}");
    let mut steps: Vec<StepRow> = rows(&rollouts.join("steps"), TableName::Steps);
    let first = format!("trajectory `{}` step 0", steps[0].trajectory_id);
    steps[0].observation = None;
    write_table(&rollouts, &steps);
    let adv = advantages(root, &qwen, &rollouts, "grpo");
    for (stage, args) in [
        (
            "update-policy",
            vec!["--input", s(&adv), "--set", "mini_batch=6"],
        ),
        (
            "teacher-logp",
            vec!["--teacher", "self", "--input", s(&root.join("data/train"))],
        ),
    ] {
        let out = root.join(format!("{stage}-out"));
        let mut all = vec![
            "--policy",
            s(&qwen),
            "--input",
            s(&rollouts),
            "--out",
            s(&out),
        ];
        all.extend(args);
        let result = run(stage, &all);
        assert_eq!(result.code, 2, "{stage}: {result}");
        for needle in [
            first.as_str(),
            "1 image placeholder run(s)",
            "0 image(s) given",
        ] {
            assert!(
                result.stderr.contains(needle),
                "{stage} lacks {needle}: {result}"
            );
        }
        assert!(!out.exists(), "{stage}: nothing written");
    }
}

/// A tiny random Qwen2 text decoder in `out` with the tokenizer (and chat
/// template) of the vision-language model in `vl`: a text policy whose
/// rollouts the vision-language model can score.
fn text_policy_sharing_the_tokenizer(vl: &Path, out: &Path) {
    const MAKE: &str = r#"
import sys, torch, transformers
from transformers import AutoTokenizer, GenerationConfig
vl, out = sys.argv[1:]
torch.manual_seed(43)
tok = AutoTokenizer.from_pretrained(vl)
im_end, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
config = transformers.Qwen2Config(
    vocab_size=(len(tok) + 63) // 64 * 64, hidden_size=32, intermediate_size=64,
    num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
    max_position_embeddings=1024, tie_word_embeddings=True, eos_token_id=im_end,
    pad_token_id=pad, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)
transformers.Qwen2ForCausalLM(config).save_pretrained(out)
tok.save_pretrained(out)
GenerationConfig(eos_token_id=[im_end], pad_token_id=pad).save_pretrained(out)
"#;
    let made = Command::new(PYTHON)
        .args(["-c", MAKE, s(vl), s(out)])
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
}

/// The teacher log-probs of `response` after `text` in a user turn with
/// `image` (`size` × `size` RGB bytes), scored by transformers' Qwen2.5-VL
/// in `vl` with its own processor.
fn transformers_logprobs(
    vl: &Path,
    text: &str,
    size: usize,
    image: &[u8],
    response: &[i32],
) -> Vec<f64> {
    const SCORE: &str = r#"
import json, sys, numpy, torch, transformers
from PIL import Image
vl = sys.argv[1]
given = json.load(sys.stdin)
torch.set_num_threads(1)
tok = transformers.AutoTokenizer.from_pretrained(vl)
pixels = transformers.AutoImageProcessor.from_pretrained(vl)
model = transformers.AutoModelForImageTextToText.from_pretrained(vl, attn_implementation="sdpa").eval()
size = given["size"]
image = Image.fromarray(numpy.array(given["image"], dtype=numpy.uint8).reshape(size, size, 3))
messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": given["text"]}]}]
rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
processed = pixels(images=[image], return_tensors="pt")
pad = model.config.image_token_id
ids = []
for t in tok(rendered)["input_ids"]:
    ids += [t] * (int(processed["image_grid_thw"].prod()) // 4 if t == pad else 1)
context = len(ids)
ids = torch.tensor([ids + given["response"]], dtype=torch.long)
with torch.no_grad():
    logp = model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=processed["pixel_values"],
                 image_grid_thw=processed["image_grid_thw"]).logits[0].double().log_softmax(-1)
print(json.dumps([logp[context - 1 + k, t].item() for k, t in enumerate(given["response"])]))
"#;
    let input =
        serde_json::json!({"text": text, "size": size, "image": image, "response": response});
    let mut child = Command::new(PYTHON)
        .args(["-c", SCORE, s(vl)])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(
        &mut child.stdin.take().unwrap(),
        input.to_string().as_bytes(),
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A text policy's rollouts (no image recorded) scored by a vision-language
/// teacher: the teacher reads the task's scene image drawn again from the
/// task row, so its log-probs equal transformers' on that image and the
/// teacher context, and differ from those on a blank image. A response
/// holding the teacher's image placeholder is skipped.
#[test]
fn a_vision_language_teacher_scores_a_text_policys_rollouts_on_the_scene_image() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (qwen, made) = tasks_and_qwen_vl(root);
    let image_token = made["image_token_id"].as_i64().unwrap() as i32;
    let text = root.join("qwen-text");
    text_policy_sharing_the_tokenizer(&qwen, &text);
    let rollouts = root.join("it0/rollouts");
    let result = collect(root, &text, &rollouts);
    assert_eq!(result.code, 0, "{result}");
    let steps: Vec<StepRow> = rows(&rollouts.join("steps"), TableName::Steps);
    assert!(
        steps.iter().all(|step| step.observation.is_none()),
        "a text policy records no image"
    );
    let scored = teacher_logp(root, &text, &qwen, &rollouts);
    // A response holding the image placeholder (the random text policy
    // samples it) has no image to stand for: skipped, the others scored.
    let (placeholder, plain): (Vec<&StepRow>, Vec<&StepRow>) = steps
        .iter()
        .partition(|step| step.response_ids.contains(&image_token));
    assert!(!placeholder.is_empty() && !plain.is_empty());
    let key = |trajectory: &str, index: i32| (trajectory.to_string(), index);
    let mut expected: Vec<_> = plain
        .iter()
        .map(|step| key(&step.trajectory_id, step.step_index))
        .collect();
    let mut got: Vec<_> = scored
        .iter()
        .map(|row| key(&row.trajectory_id, row.step_index))
        .collect();
    expected.sort();
    got.sort();
    assert_eq!(got, expected);
    let tasks: Vec<TaskRow> = rows(&root.join("data/train/tasks"), TableName::Tasks);
    let trajectories: Vec<TrajectoryRow> =
        rows(&rollouts.join("trajectories"), TableName::Trajectories);
    let row = &scored[0];
    let step = steps
        .iter()
        .find(|s| s.trajectory_id == row.trajectory_id && s.step_index == row.step_index)
        .unwrap();
    let task_id = &trajectories
        .iter()
        .find(|t| t.trajectory_id == step.trajectory_id)
        .unwrap()
        .task_id;
    let task = tasks.iter().find(|t| &t.task_id == task_id).unwrap();
    let prompt = embodyflow_household::prompt(&embodyflow_household::task_from_row(task).unwrap());
    let plan: String = task
        .gt_actions
        .as_ref()
        .unwrap()
        .iter()
        .map(|a| format!("{}: {}\n", a.action_id, a.action_name))
        .collect();
    let context = format!(
        "{prompt}\nHere is a reference successful plan:\n=== Reference Plan Begin ===\n{plan}=== Reference Plan End ===\nNow answer the task above.\n"
    );
    let (size, image) = embodyflow_household::task_image(task).unwrap().unwrap();
    let reference = transformers_logprobs(&qwen, &context, size, &image, &step.response_ids);
    assert_eq!(row.teacher_logp.len(), reference.len());
    for (ours, theirs) in row.teacher_logp.iter().zip(&reference) {
        assert!(
            (f64::from(*ours) - theirs).abs() < 1e-4,
            "{:?} vs {reference:?}",
            row.teacher_logp
        );
    }
    let blank = transformers_logprobs(
        &qwen,
        &context,
        size,
        &vec![0; image.len()],
        &step.response_ids,
    );
    assert!(
        row.teacher_logp
            .iter()
            .zip(&blank)
            .any(|(ours, theirs)| (f64::from(*ours) - theirs).abs() > 1e-3),
        "the image reaches the teacher: {:?} vs blank {blank:?}",
        row.teacher_logp
    );
}

/// A `config.json` whose vision sizes were forged (10^9 blocks, a width of
/// 2^40) is refused when the policy loads, at once and before anything is
/// allocated: collect-rollouts exits 2 naming the file, the key and the
/// bound, writing nothing.
#[test]
fn forged_vision_sizes_exit_2_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let tasks = root.join("tasks");
    ok(
        "generate-tasks",
        &[
            "--out",
            s(&tasks),
            "--seed",
            "1",
            "--set",
            "count=2",
            "--set",
            &format!("image_size={IMAGE_SIZE}"),
        ],
    );
    for (key, value, bound) in [
        ("depth", "1000000000", "1024"),
        ("hidden_size", "1099511627776", "1048576"),
    ] {
        let model = root.join(format!("qwen-vl-{key}"));
        std::fs::create_dir(&model).unwrap();
        std::fs::write(
            model.join("config.json"),
            format!(
                r#"{{"model_type": "qwen2_5_vl", "vocab_size": 200, "hidden_size": 48,
                "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
                "rope_scaling": {{"type": "mrope", "mrope_section": [2, 2, 2]}},
                "vision_config": {{"depth": 2, "hidden_size": 32, "num_heads": 2,
                  "patch_size": 4, "out_hidden_size": 48, "{key}": {value}}},
                "image_token_id": 192, "video_token_id": 193,
                "vision_start_token_id": 190, "vision_end_token_id": 191}}"#
            ),
        )
        .unwrap();
        let out = root.join(format!("out-{key}"));
        let started = std::time::Instant::now();
        let result = run(
            "collect-rollouts",
            &[
                "--policy",
                s(&model),
                "--input",
                s(&tasks),
                "--out",
                s(&out),
            ],
        );
        assert_eq!(result.code, 2, "{key}: {result}");
        for needle in [
            "config.json".to_string(),
            format!("`vision_config.{key}` is {value}"),
            format!("<= {bound}"),
        ] {
            assert!(result.stderr.contains(&needle), "{key}: {needle}: {result}");
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(30),
            "{key}: took {:?}",
            started.elapsed()
        );
        assert!(!out.exists(), "{key}: nothing written");
    }
}
