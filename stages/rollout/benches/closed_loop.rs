//! Closed-loop collection throughput with the policy in the loop: an
//! untrained `VlaConfig::small` VLA (32 × 32 images, K = 8,
//! width 128, 4 layers; a BPE trained on tabletop instructions) drives 16
//! tabletop tasks × G = 8 = 128 episodes for 8 decisions at T = 1.6 through
//! `run_closed_loop`; the same loop with a policy that costs nothing
//! (tokens from each row's seed) measures the world and the driver alone.
//! Each figure is the best of 3 rounds after a warm-up round, printed as
//! `name value` lines: decisions/s and env steps/s with the VLA, the share
//! of the wall time spent in the world (render + step), and the world-alone
//! loop's decisions/s as a ratio to the VLA loop's (how far the world is
//! from being the bottleneck).
use std::time::Instant;

use embodyflow_algos::action_tokens::ActionBins;
use embodyflow_core::observation::ObservationShape;
use embodyflow_models::checkpoint::Checkpoint;
use embodyflow_models::tokenizer::train_bpe;
use embodyflow_models::vla::{Vla, VlaConfig};
use embodyflow_rollout::closed_loop::vla::VlaPolicy;
use embodyflow_rollout::closed_loop::{
    ChunkDecision, ChunkPolicy, ClosedLoopConfig, ClosedLoopRun, DecisionBatch, run_closed_loop,
};
use embodyflow_tabletop::{
    ACTION_DIM, PROPRIO_DIM, Split, Suite, TabletopEpisodes, TaskSpec, generate,
};

const GROUP: usize = 8;
const SIZE: usize = 32;
const K: usize = 8;
const DECISIONS: usize = 8;

/// Tokens from each row's seed (BLAKE3's output stream): no model.
struct Free;

impl ChunkPolicy for Free {
    type Error = embodyflow_core::Error;

    fn chunk_len(&self) -> usize {
        K
    }

    fn action_dim(&self) -> usize {
        ACTION_DIM
    }

    fn observation_shape(&self) -> ObservationShape {
        ObservationShape {
            height: SIZE,
            width: SIZE,
            channels: 3,
            proprio: PROPRIO_DIM,
        }
    }

    fn instruction_ids(&self, instruction: &str) -> Result<Vec<i32>, Self::Error> {
        Ok(instruction.bytes().map(i32::from).collect())
    }

    fn decide(&mut self, batch: &DecisionBatch<'_>) -> Result<Vec<ChunkDecision>, Self::Error> {
        Ok(batch
            .seeds
            .iter()
            .map(|seed| {
                let mut bytes = [0u8; K * ACTION_DIM];
                blake3::Hasher::new()
                    .update(&seed.to_le_bytes())
                    .finalize_xof()
                    .fill(&mut bytes);
                ChunkDecision {
                    tokens: bytes.iter().map(|&b| u32::from(b)).collect(),
                    thought: None,
                    token_logprobs: vec![-(256f32.ln()); K * ACTION_DIM],
                }
            })
            .collect())
    }
}

/// The best (highest decisions/s) of 3 timed rounds after a warm-up, with
/// its wall seconds.
fn best(
    tasks: &[TaskSpec],
    policy: &mut impl ChunkPolicy,
    bins: &ActionBins,
) -> (ClosedLoopRun, f64) {
    let seeds: Vec<u64> = (0..(tasks.len() * GROUP) as u64).collect();
    let config = ClosedLoopConfig {
        max_decisions: DECISIONS,
        label: "bench",
    };
    let mut best: Option<(ClosedLoopRun, f64)> = None;
    for round in 0..4 {
        let mut world = TabletopEpisodes::new(tasks, GROUP, SIZE).expect("generated tasks build");
        let start = Instant::now();
        let run = run_closed_loop(&mut world, policy, bins, &seeds, &config).expect("the run");
        let wall = start.elapsed().as_secs_f64();
        let better = best
            .as_ref()
            .is_none_or(|(b, w)| run.decisions as f64 / wall > b.decisions as f64 / w);
        if round > 0 && better {
            best = Some((run, wall));
        }
    }
    best.expect("three rounds")
}

fn main() {
    let tasks: Vec<TaskSpec> = (0..16)
        .map(|i| generate(Suite::ALL[i % 4], Split::Train, 9, i as u64))
        .collect();
    let corpus: Vec<String> = (0..400)
        .map(|i| generate(Suite::ALL[i % 4], Split::Train, 1, i as u64).instruction)
        .collect();
    let tokenizer = train_bpe(&corpus, 400).expect("a BPE of the instructions");
    let config = VlaConfig::small(tokenizer.get_vocab_size(true) as i64);
    tch::manual_seed(0);
    let checkpoint = Checkpoint::<Vla>::init_kind(&config, tokenizer, tch::Device::Cpu)
        .expect("the small config is valid");
    let mut vla = VlaPolicy::new(&checkpoint, 1.6).expect("the checkpoint's bins");
    let bins = vla.bins();
    let (run, wall) = best(&tasks, &mut vla, &bins);
    let (free, free_wall) = best(&tasks, &mut Free, &bins);
    let vla_rate = run.decisions as f64 / wall;
    let free_rate = free.decisions as f64 / free_wall;
    println!("closed_loop_torch_threads {}", tch::get_num_threads());
    println!("closed_loop_episodes {}", tasks.len() * GROUP);
    println!("closed_loop_vla_decisions_per_s {vla_rate:.1}");
    println!(
        "closed_loop_vla_env_steps_per_s {:.1}",
        run.env_steps as f64 / wall
    );
    println!(
        "closed_loop_vla_world_share {:.4}",
        run.world_seconds / wall
    );
    println!(
        "closed_loop_vla_policy_share {:.4}",
        run.policy_seconds / wall
    );
    println!("closed_loop_world_alone_decisions_per_s {free_rate:.1}");
    println!(
        "closed_loop_world_alone_vs_vla {:.1}x",
        free_rate / vla_rate
    );
}
