//! The bridge's cost per environment step: BabyAI-GoToLocal-v0 with random
//! actions through `GymEpisodes` (16 episodes on one worker, chunks of
//! K = 1 and K = 8) against a plain Python loop over the same environment
//! measured in the same run (`env.step` with random actions, reset when an
//! episode ends or reaches the same 64 steps), then the throughput of 32
//! episodes (K = 8) on 1 and 2 workers. Resets are inside both timings.
//! Each figure is the best of `ROUNDS` rounds, the plain loop and the
//! bridge interleaved, so that other processes on the machine disturb
//! both alike (the least disturbed round of each is compared).
//!
//! `cargo bench --workspace --bench bridge` (needs scripts/setup's packages).

use std::process::Command;
use std::time::{Duration, Instant};

use embodyflow_gym::{BridgeConfig, GymEpisodes, GymTask, GymTaskSpec, Pool};
use embodyflow_world::ClosedLoopWorld;

const ENV: &str = "BabyAI-GoToLocal-v0";
const MAX_STEPS: u32 = 64;
const STEPS: u64 = 6_000;
const ROUNDS: usize = 3;

/// Seconds per step of the plain Python loop.
fn plain_loop(python: &std::path::Path) -> f64 {
    let script = format!(
        r#"
import time, warnings
warnings.simplefilter("ignore")
import gymnasium, minigrid, numpy as np
env = gymnasium.make("{ENV}")
rng = np.random.default_rng(0)
seed, steps = 0, 0
env.reset(seed=seed)
start = time.perf_counter()
for i in range({STEPS}):
    _, _, terminated, truncated, _ = env.step(int(rng.integers(7)))
    steps += 1
    if terminated or truncated or steps == {MAX_STEPS}:
        seed, steps = seed + 1, 0
        env.reset(seed=seed)
print((time.perf_counter() - start) / {STEPS})
"#
    );
    let out = Command::new(python)
        .args(["-c", &script])
        .output()
        .expect("the plain loop runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The last line: minigrid prints its rejected samplings before it.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    last.trim().parse().expect("seconds per step")
}

/// Env steps and wall seconds of batches of `tasks` x `group` episodes
/// with random chunks of `k`, until `STEPS` steps.
fn bridge(pool: Pool, episodes: usize, k: usize) -> (Pool, u64, f64) {
    let tasks: Vec<GymTask> = (0..episodes as u64)
        .map(|seed| GymTask {
            task_id: format!("goto/{seed}"),
            spec: GymTaskSpec::new("babyai", ENV, seed, MAX_STEPS),
        })
        .collect();
    let bins = embodyflow_gym::ActionSpace::Discrete { n: 7 }.bins();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut random = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut pool, mut steps) = (pool, 0u64);
    let start = Instant::now();
    while steps < STEPS {
        let mut world = GymEpisodes::with_pool(pool, &tasks, 1, &bins).unwrap();
        let mut actions = vec![0.0f32; episodes * k];
        while (0..world.len()).any(|i| world.running(i)) {
            // The centre of a random bin 0..7, as the driver would decode it.
            for a in actions.iter_mut() {
                let bin = (random() % 7) as u32;
                *a = bins.decode(&[bin]).unwrap()[0];
            }
            let reports = world.step_chunks(&actions, k).unwrap();
            steps += reports.iter().map(|r| u64::from(r.env_steps)).sum::<u64>();
        }
        assert_eq!(world.faults().total(), 0);
        pool = world.into_pool();
    }
    (pool, steps, start.elapsed().as_secs_f64())
}

fn main() {
    let config = BridgeConfig {
        workers: 1,
        timeout: Duration::from_secs(60),
        ..BridgeConfig::default()
    };
    println!(
        "{ENV}, random actions, episodes of at most {MAX_STEPS} steps, resets included; best of {ROUNDS} interleaved rounds"
    );
    let mut pool = Pool::new(&config).unwrap();
    // Warm-up: imports and the first environments.
    pool = bridge(pool, 16, 8).0;
    let (mut plain, mut k1, mut k8) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
    for _ in 0..ROUNDS {
        plain = plain.min(plain_loop(&config.python));
        for (k, best) in [(1, &mut k1), (8, &mut k8)] {
            let (back, steps, seconds) = bridge(pool, 16, k);
            pool = back;
            *best = best.min(seconds / steps as f64);
        }
    }
    drop(pool);
    println!("plain Python loop: {:.1} us/step", plain * 1e6);
    for (k, per) in [(1, k1), (8, k8)] {
        println!(
            "bridge, 1 worker, 16 episodes, K = {k}: {:.1} us/step ({:.2}x the plain loop)",
            per * 1e6,
            per / plain
        );
    }
    for workers in [1, 2] {
        let config = BridgeConfig {
            workers,
            ..config.clone()
        };
        let mut pool = bridge(Pool::new(&config).unwrap(), 32, 8).0;
        let mut best = 0.0f64;
        for _ in 0..ROUNDS {
            let (back, steps, seconds) = bridge(pool, 32, 8);
            pool = back;
            best = best.max(steps as f64 / seconds);
        }
        println!("bridge, {workers} worker(s), 32 episodes, K = 8: {best:.0} env steps/s");
    }
}
