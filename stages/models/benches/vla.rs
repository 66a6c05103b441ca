//! Throughput of the VLA at its default shape (`VlaConfig::small`: 32 × 32
//! images in 16 patches, proprio 5, 12-token instructions, chunks of 8
//! actions × 4 dimensions = 32 action tokens of 256 bins, width 128, 4
//! layers, 4 heads) on a lockstep batch of 64 observations, the call a
//! closed-loop collect-rollouts makes per decision:
//! - `sample`: one forward pass and a draw per token at T = 1.6;
//! - `forward`: the logits alone (no gradients);
//! - `bc_step`: behaviour-cloning loss forward + backward + an AdamW step
//!   (the update).
//!
//! Each is timed on one libtorch thread and on all (`--threads N` or
//! the CPUs this process may run on), best of `REPEATS` after a warm-up;
//! prints `vla_<what>_decisions_per_s_<threads>t N`, the all-threads /
//! one-thread ratio and the sampling overhead (`sample / forward` time).

use std::time::Instant;

use embodyflow_models::vla::{Observation, Vla, VlaConfig};
use tch::nn::{self, OptimizerConfig};

const BATCH: usize = 64;
const REPEATS: usize = 15;

/// Best seconds of `REPEATS` runs of `f` after one warm-up run.
fn best(mut f: impl FnMut()) -> f64 {
    f();
    (0..REPEATS)
        .map(|_| {
            let started = Instant::now();
            f();
            started.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let threads = std::env::args()
        .skip_while(|a| a != "--threads")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    tch::manual_seed(0);
    let config = VlaConfig::small(768);
    let vs = nn::VarStore::new(tch::Device::Cpu);
    let model = Vla::new(&vs.root(), &config);
    let size = config.image_size as usize;
    let images: Vec<Vec<u8>> = (0..BATCH)
        .map(|row| {
            (0..size * size * 3)
                .map(|i| ((i * 31 + row * 17) % 256) as u8)
                .collect()
        })
        .collect();
    let proprio: Vec<[f32; 5]> = (0..BATCH)
        .map(|row| [0.5, 0.1 * (row % 7) as f32, 0.25, 0.0, 1.0])
        .collect();
    let instructions: Vec<Vec<i32>> = (0..BATCH)
        .map(|row| {
            (0..12)
                .map(|t| 3 + ((row * 13 + t * 7) % 700) as i32)
                .collect()
        })
        .collect();
    let batch: Vec<Observation> = (0..BATCH)
        .map(|row| Observation {
            image: &images[row],
            height: size,
            width: size,
            proprio: &proprio[row],
            instruction: &instructions[row],
        })
        .collect();
    let seeds: Vec<u64> = (0..BATCH as u64).collect();
    let targets: Vec<Vec<u32>> = (0..BATCH)
        .map(|row| {
            (0..config.n_action_tokens() as usize)
                .map(|t| ((row * 5 + t * 11) % 256) as u32)
                .collect()
        })
        .collect();
    let target_refs: Vec<&[u32]> = targets.iter().map(Vec::as_slice).collect();
    println!(
        "# VLA {} parameters, batch {BATCH}, {} action tokens per decision, best of {REPEATS}",
        vs.trainable_variables()
            .iter()
            .map(|t| t.numel())
            .sum::<usize>(),
        config.n_action_tokens()
    );
    let mut opt = nn::AdamW::default().build(&vs, 1e-4).unwrap();
    let mut per_thread = Vec::new();
    for n in [1, threads] {
        tch::set_num_threads(n as i32);
        let sample = best(|| {
            model.sample(&batch, &seeds, 1.6).unwrap();
        });
        let forward = best(|| {
            let _logits = tch::no_grad(|| model.logits(&batch).unwrap());
        });
        let bc_step = best(|| {
            opt.backward_step(&model.bc_loss(&batch, &target_refs, None).unwrap());
        });
        for (what, seconds) in [
            ("sample", sample),
            ("forward", forward),
            ("bc_step", bc_step),
        ] {
            println!(
                "vla_{what}_decisions_per_s_{n}t {:.0}",
                BATCH as f64 / seconds
            );
        }
        println!("vla_sample_over_forward_time_{n}t {:.2}", sample / forward);
        per_thread.push(sample);
    }
    println!(
        "vla_sample_speedup_{threads}t_over_1t {:.2}",
        per_thread[0] / per_thread[1]
    );
}
