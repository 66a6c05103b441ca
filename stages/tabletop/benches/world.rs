//! World and renderer throughput on one core. Replays recorded expert
//! episodes (noise 0.3, so with grasps, pushes, releases and retries) of
//! 64 tasks over the four suites, and the push strategy's episodes (low, in
//! contact), and renders their states at 32 and 48 pixels. Each figure is the best of 5 timed rounds of about 0.4 s after a
//! warm-up round; printed as `name value` lines with the ratio to the
//! world's targets (100 k steps/s, 20 k frames/s).
use std::hint::black_box;
use std::time::Instant;

use embodyflow_tabletop::{
    Expert, ExpertConfig, Split, Strategy, Suite, World, frame_len, generate,
};

/// Best rate (units per second) of 5 rounds of `round`, which returns the
/// units it did; one warm-up round first.
fn best_rate(mut round: impl FnMut() -> usize) -> f64 {
    round();
    let mut best = 0.0f64;
    for _ in 0..5 {
        let start = Instant::now();
        let mut units = 0usize;
        while start.elapsed().as_secs_f64() < 0.4 {
            units += round();
        }
        best = best.max(units as f64 / start.elapsed().as_secs_f64());
    }
    best
}

/// Recorded episodes: (initial state, actions, final state).
type Recorded = Vec<(World, Vec<[f32; 4]>, World)>;

/// Episodes of `strategy` on up to 64 tasks over the four suites (tasks the
/// strategy cannot do are skipped), and every 4th state visited.
fn record(strategy: Strategy, noise: f32) -> (Recorded, Vec<World>) {
    let mut episodes = Vec::new();
    let mut states = Vec::new();
    for (i, suite) in Suite::ALL.iter().cycle().take(64).enumerate() {
        let task = generate(*suite, Split::Train, 1, i as u64);
        let start = World::new(&task).expect("generated tasks build");
        let mut world = start.clone();
        let config = ExpertConfig {
            noise,
            seed: i as u64,
        };
        let Ok(mut expert) = Expert::new(&world, strategy, config) else {
            continue;
        };
        let mut actions = Vec::new();
        while world.status() == embodyflow_tabletop::Status::Running {
            let a = expert.act(&world);
            world.step(&a).expect("expert actions are in range");
            actions.push(a);
            if actions.len() % 4 == 0 {
                states.push(world.clone());
            }
        }
        episodes.push((start, actions, world));
    }
    (episodes, states)
}

/// Replays every episode once; returns the steps taken.
fn replay(episodes: &Recorded) -> usize {
    let mut steps = 0;
    for (start, actions, end) in episodes {
        let mut world = start.clone();
        for a in actions {
            black_box(world.step(black_box(a)).expect("replay"));
        }
        assert!(world == *end, "a replay reproduces its episode");
        steps += actions.len();
    }
    steps
}

fn main() {
    let (episodes, states) = record(Strategy::Grasp, 0.3);
    let steps: usize = episodes.iter().map(|(_, a, _)| a.len()).sum();
    let steps_per_s = best_rate(|| replay(&episodes));
    println!("tabletop_env_steps_per_s {steps_per_s:.0}");
    println!(
        "tabletop_env_steps_vs_target {:.1}",
        steps_per_s / 100_000.0
    );
    // Pushing episodes spend most steps low, in contact (sub-stepped).
    let (pushes, _) = record(Strategy::Push, 0.0);
    let push_steps_per_s = best_rate(|| replay(&pushes));
    println!("tabletop_env_steps_per_s_pushing {push_steps_per_s:.0}");
    for size in [32usize, 48] {
        let mut frame = vec![0u8; frame_len(size)];
        let frames_per_s = best_rate(|| {
            for world in &states {
                world.render(size, black_box(&mut frame)).expect("render");
                black_box(&frame);
            }
            states.len()
        });
        println!("tabletop_frames_per_s_{size}px {frames_per_s:.0}");
        println!(
            "tabletop_frames_{size}px_vs_target {:.1}",
            frames_per_s / 20_000.0
        );
    }
    let mut frame = vec![0u8; frame_len(32)];
    let observed_steps_per_s = best_rate(|| {
        for (start, actions, _) in &episodes {
            let mut world = start.clone();
            for a in actions {
                black_box(world.step(black_box(a)).expect("replay"));
                world.render(32, &mut frame).expect("render");
                black_box(world.proprio());
            }
        }
        steps
    });
    println!("tabletop_steps_with_32px_frame_per_s {observed_steps_per_s:.0}");
    eprintln!(
        "({} grasp episodes with noise 0.3, {steps} steps per replay; {} push episodes; {} rendered states; one thread)",
        episodes.len(),
        pushes.len(),
        states.len()
    );
}
