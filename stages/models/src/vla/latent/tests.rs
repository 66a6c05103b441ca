use tch::nn::OptimizerConfig;

use super::*;
use crate::checkpoint::Checkpoint;
use crate::testing::{seed, tiny_tokenizer};
use crate::vla::VlaConfig;

/// A tiny thinking VLA: 16 × 16 images in 4 × 4 patches, proprio 3,
/// instructions of up to 6 tokens, chunks of 3 actions of 2 dimensions, 32
/// bins, width 16, 2 layers; 4 latents in groups of 2 (stops at 2 and 4).
fn tiny(seed_value: i64) -> Checkpoint<Vla> {
    let tokenizer = tiny_tokenizer();
    let config = VlaConfig {
        vocab_size: tokenizer.get_vocab_size(true) as i64,
        max_instruction: 6,
        image_size: 16,
        patch_size: 4,
        channels: 3,
        stem_channels: 0,
        proprio_dim: 3,
        chunk_len: 3,
        action_dim: 2,
        n_bins: 32,
        action_low: -1.0,
        action_high: 1.0,
        history: 0,
        n_embd: 16,
        n_head: 2,
        n_layer: 2,
        latent: Some(LatentConfig {
            length: 4,
            group: 2,
        }),
        trunk: None,
    };
    let _generator = seed(seed_value);
    Checkpoint::<Vla>::init_kind(&config, tokenizer, Device::Cpu).unwrap()
}

struct Rows {
    images: Vec<Vec<u8>>,
    proprio: Vec<Vec<f32>>,
    instructions: Vec<Vec<i32>>,
}

impl Rows {
    fn new(n: usize) -> Rows {
        Rows {
            images: (0..n)
                .map(|row| {
                    (0..16 * 16 * 3)
                        .map(|i| ((i * 31 + row * 97) % 256) as u8)
                        .collect()
                })
                .collect(),
            proprio: (0..n)
                .map(|row| vec![row as f32 * 0.2, 0.1, -0.4])
                .collect(),
            instructions: (0..n)
                .map(|row| {
                    (0..(row % 3) + 1)
                        .map(|t| 4 + (row * 5 + t) as i32)
                        .collect()
                })
                .collect(),
        }
    }

    fn batch(&self) -> Vec<Observation<'_>> {
        (0..self.images.len())
            .map(|row| Observation {
                image: &self.images[row],
                height: 16,
                width: 16,
                proprio: &self.proprio[row],
                instruction: &self.instructions[row],
            })
            .collect()
    }
}

fn floats(t: &Tensor) -> Vec<f32> {
    Vec::<f32>::try_from(t.to(Device::Cpu).contiguous().view([-1])).unwrap()
}

fn scores_of(policy: &Vla, batch: &[Observation], out: &[LatentDecision], t: f64) -> LatentScores {
    let latents: Vec<&[f32]> = out.iter().map(|d| d.latents.as_slice()).collect();
    let stops: Vec<usize> = out.iter().map(|d| d.stop).collect();
    let tokens: Vec<&[u32]> = out.iter().map(|d| d.decision.tokens.as_slice()).collect();
    tch::no_grad(|| policy.latent_scores(batch, &latents, &stops, &tokens, t, Entropy::Skip))
        .unwrap()
}

#[test]
fn the_layout_has_a_start_slots_and_an_end_after_each_group() {
    let shape = LatentConfig::last_r1();
    assert_eq!(shape.candidates(), 4);
    assert_eq!(shape.candidate_lengths(), vec![2, 4, 6, 8]);
    assert_eq!(shape.positions(), 13);
    // S z1 z2 E z3 z4 E z5 z6 E z7 z8 E
    let slots: Vec<i64> = (0..8).map(|i| shape.slot(i)).collect();
    assert_eq!(slots, vec![1, 2, 4, 5, 7, 8, 10, 11]);
    let ends: Vec<i64> = (0..4).map(|m| shape.end(m)).collect();
    assert_eq!(ends, vec![3, 6, 9, 12]);
    assert!(
        LatentConfig {
            length: 6,
            group: 4
        }
        .check()
        .unwrap_err()
        .contains("divide")
    );
    assert!(
        LatentConfig {
            length: 0,
            group: 2
        }
        .check()
        .is_err()
    );
}

#[test]
fn stored_latents_and_stop_reproduce_the_rollouts_log_probs_and_values() {
    let policy = tiny(3);
    let rows = Rows::new(4);
    let batch = rows.batch();
    for (temperature, noise) in [(1.6, 0.0), (1.0, 0.3)] {
        let out = policy
            .model
            .sample_with_latents(&batch, &[1, 2, 3, 4], temperature, noise)
            .unwrap();
        let scores = scores_of(&policy.model, &batch, &out, temperature);
        let tokens = floats(&scores.token_logprobs);
        let stop_logp = floats(&scores.stop_logprobs);
        let values = floats(&scores.values);
        let predicted = floats(&scores.latents);
        let per_row = 4 * 16;
        for (row, d) in out.iter().enumerate() {
            // The same pass, the same batch: the ratios start at exactly 1.
            assert_eq!(
                &tokens[row * 6..(row + 1) * 6],
                d.decision.token_logprobs.as_slice(),
                "row {row} actions"
            );
            assert_eq!(stop_logp[row], d.stop_logprob, "row {row} stop");
            assert_eq!(values[row], d.value, "row {row} value");
            assert_eq!(d.latent_len, (d.stop + 1) * 2);
            // Teacher-forced predictions are the chain's means: equal to the
            // stored latents without noise, off by the noise with it.
            let gap: f64 = predicted[row * per_row..(row + 1) * per_row]
                .iter()
                .zip(&d.latents)
                .map(|(p, z)| f64::from(p - z).powi(2))
                .sum::<f64>()
                .sqrt();
            if noise == 0.0 {
                assert!(gap < 1e-4, "row {row}: {gap}");
            } else {
                // |noise| ≈ 0.3 √(4 × 16) = 2.4
                assert!((1.2..4.0).contains(&gap), "row {row}: {gap}");
            }
        }
    }
}

#[test]
fn sampling_is_seeded_and_explores_the_stops() {
    let policy = tiny(5);
    let rows = Rows::new(3);
    let batch = rows.batch();
    let a = policy
        .model
        .sample_with_latents(&batch, &[9, 9, 9], 1.0, 0.2)
        .unwrap();
    let b = policy
        .model
        .sample_with_latents(&batch, &[9, 9, 9], 1.0, 0.2)
        .unwrap();
    assert_eq!(a, b);
    let seeds: Vec<u64> = (0..40).collect();
    let many_rows = Rows::new(1);
    let one = many_rows.batch();
    let batch40: Vec<Observation> = (0..40).map(|_| one[0]).collect();
    let out = policy
        .model
        .sample_with_latents(&batch40, &seeds, 1.6, 0.0)
        .unwrap();
    let stops: std::collections::BTreeSet<usize> = out.iter().map(|d| d.stop).collect();
    assert_eq!(
        stops.len(),
        2,
        "an untrained policy samples both stops: {stops:?}"
    );
    // Without noise, the latent chain does not depend on the seed. Compared
    // row by row against the same batch under other seeds: the same batch
    // position in the same process is bit-identical, while rows of one batch
    // may be computed by different kernel paths (vector tails, matmul
    // blocking) depending on the CPU's instruction set.
    let other_seeds: Vec<u64> = (1000..1040).collect();
    let again = policy
        .model
        .sample_with_latents(&batch40, &other_seeds, 1.6, 0.0)
        .unwrap();
    for (row, (d, e)) in out.iter().zip(&again).enumerate() {
        assert_eq!(d.latents, e.latents, "row {row}");
    }
}

#[test]
fn the_greedy_stop_is_the_first_candidate_whose_own_end_probability_reaches_0_99() {
    let mut rng = ChaCha8Rng::seed_from_u64(0);
    // The logit of a position's own probability p of <latent_end>.
    let logit = |p: f64| (p / (1.0 - p)).ln() as f32;
    // Early exit fires at the first position with p >= 0.99, even when a
    // later one is more confident (and more probable over the candidates).
    assert_eq!(
        choose_stop(&[logit(0.5), logit(0.991), logit(0.9999)], 0.0, &mut rng),
        1
    );
    assert_eq!(choose_stop(&[logit(0.99), logit(0.3)], 0.0, &mut rng), 0);
    // A softmax over the candidates would not fire here (0.995 against
    // 0.996: each about one half), a position's own probability does.
    assert_eq!(
        choose_stop(&[logit(0.2), logit(0.995), logit(0.996)], 0.0, &mut rng),
        1
    );
    // Just below the threshold everywhere: the largest logit.
    assert_eq!(
        choose_stop(&[logit(0.3), logit(0.98), logit(0.2)], 0.0, &mut rng),
        1
    );
    assert_eq!(
        choose_stop(&[logit(0.6), logit(0.1), logit(0.3)], 0.0, &mut rng),
        0
    );
    // Sampling follows softmax(l / T) over the candidates.
    let (a, b) = (0.0f32, 3.0f32.ln());
    for (temperature, expected) in [(1.0, 0.75), (2.0, 3f64.sqrt() / (1.0 + 3f64.sqrt()))] {
        let ones = (0..4000)
            .filter(|_| choose_stop(&[a, b], temperature, &mut rng) == 1)
            .count();
        let share = ones as f64 / 4000.0;
        assert!(
            (share - expected).abs() < 0.03,
            "T {temperature}: {share} vs {expected}"
        );
    }
}

#[test]
fn actions_and_value_never_see_the_latents_after_the_chosen_stop() {
    let policy = tiny(7);
    let rows = Rows::new(2);
    let batch = rows.batch();
    let mut out = policy
        .model
        .sample_with_latents(&batch, &[1, 2], 1.0, 0.0)
        .unwrap();
    for d in &mut out {
        d.stop = 0;
    }
    let before = scores_of(&policy.model, &batch, &out, 1.0);
    // Change the second group's latents (slots 2 and 3).
    for d in &mut out {
        for v in &mut d.latents[2 * 16..] {
            *v += 5.0;
        }
    }
    let after = scores_of(&policy.model, &batch, &out, 1.0);
    assert_eq!(
        floats(&before.token_logprobs),
        floats(&after.token_logprobs)
    );
    assert_eq!(floats(&before.values), floats(&after.values));
    // The first group's predictions cannot see it either (causal), but the
    // stop's softmax includes the second candidate's logit, which does.
    assert_eq!(
        floats(&before.latents.narrow(1, 0, 3)),
        floats(&after.latents.narrow(1, 0, 3))
    );
    assert_ne!(floats(&before.stop_logprobs), floats(&after.stop_logprobs));
}

#[test]
fn a_row_does_not_depend_on_its_batch() {
    let policy = tiny(11);
    let rows = Rows::new(3);
    let batch = rows.batch();
    let out = policy
        .model
        .sample_with_latents(&batch, &[4, 5, 6], 1.0, 0.1)
        .unwrap();
    let together = scores_of(&policy.model, &batch, &out, 1.0);
    for row in 0..3 {
        let alone = scores_of(&policy.model, &batch[row..=row], &out[row..=row], 1.0);
        let pairs = [
            (
                &alone.token_logprobs,
                together.token_logprobs.get(row as i64),
            ),
            (&alone.stop_logprobs, together.stop_logprobs.get(row as i64)),
            (&alone.values, together.values.get(row as i64)),
        ];
        for (a, b) in pairs {
            let diff = (a.view([-1]) - b.view([-1])).abs().max().double_value(&[]);
            assert!(diff < 1e-5, "row {row}: {diff}");
        }
    }
}

#[test]
fn the_warm_up_loss_weights_its_terms_and_learns_targets() {
    let mut policy = tiny(13);
    let rows = Rows::new(4);
    let batch = rows.batch();
    let targets: Vec<Vec<f32>> = (0..4)
        .map(|row| {
            (0..4 * 16)
                .map(|i| ((i * 7 + row * 3) % 11) as f32 - 5.0)
                .collect()
        })
        .collect();
    let targets: Vec<&[f32]> = targets.iter().map(Vec::as_slice).collect();
    let stops = [0, 1, 1, 0];
    let tokens: Vec<Vec<u32>> = (0..4)
        .map(|row| (0..6).map(|t| (row * 5 + t) as u32).collect())
        .collect();
    let tokens: Vec<&[u32]> = tokens.iter().map(Vec::as_slice).collect();
    let loss = |policy: &Checkpoint<Vla>, weights| {
        policy
            .model
            .warmup_loss(
                &batch,
                &targets,
                &stops,
                &tokens,
                Some(&[3, 2, 3, 1]),
                weights,
            )
            .unwrap()
    };
    let first = loss(&policy, WarmupConfig::default());
    let total = first.total.double_value(&[]);
    let expected = first.latent + 0.1 * first.end + first.action;
    assert!((total - expected).abs() < 1e-5, "{total} vs {expected}");
    assert!((0.0..=2.0).contains(&first.latent));
    // Two candidates: an untrained stop head is near ln 2.
    assert!((first.end - 2f64.ln()).abs() < 0.3, "{}", first.end);
    let mut opt = tch::nn::Adam::default().build(&policy.vars, 3e-3).unwrap();
    for _ in 0..60 {
        opt.backward_step(&loss(&policy, WarmupConfig::default()).total);
    }
    let last = loss(&policy, WarmupConfig::default());
    assert!(
        last.latent < 0.5 * first.latent,
        "{} -> {}",
        first.latent,
        last.latent
    );
    assert!(last.end < first.end && last.action < first.action);
    policy.vars.freeze();
}

#[test]
fn bad_latent_inputs_are_named_by_row() {
    let policy = tiny(17);
    let rows = Rows::new(2);
    let batch = rows.batch();
    let good = vec![0.0f32; 4 * 16];
    let short = vec![0.0f32; 4 * 16 - 1];
    let mut nan = good.clone();
    nan[5] = f32::NAN;
    let tokens = [[0u32; 6].as_slice(), [0u32; 6].as_slice()];
    let run = |latents: [&[f32]; 2], stops: [usize; 2]| {
        policy
            .model
            .latent_scores(&batch, &latents, &stops, &tokens, 1.0, Entropy::Skip)
            .err()
            .map(|e| e.to_string())
    };
    assert_eq!(run([&good, &good], [0, 1]), None);
    let e = run([&good, &short], [0, 1]).unwrap();
    assert!(
        e.contains("row 1") && e.contains("63 values") && e.contains("64"),
        "{e}"
    );
    let e = run([&nan, &good], [0, 1]).unwrap();
    assert!(e.contains("row 0") && e.contains("index 5"), "{e}");
    let e = run([&good, &good], [0, 2]).unwrap();
    assert!(
        e.contains("row 1") && e.contains("stop 2") && e.contains("2 <latent_end> candidates"),
        "{e}"
    );
    // A thinking policy refuses the plain calls, and a plain one the latent calls.
    let e = policy.model.logits(&batch).unwrap_err().to_string();
    assert!(e.contains("latent"), "{e}");
    let plain = crate::testing::tiny_vla(2);
    let image = vec![0u8; 32 * 32 * 3];
    let row = Observation {
        image: &image,
        height: 32,
        width: 32,
        proprio: &[0.0; 5],
        instruction: &[],
    };
    let e = plain
        .model
        .sample_with_latents(&[row], &[0], 1.0, 0.0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("no latent chain"), "{e}");
}

#[test]
fn checkpoints_keep_the_latent_config_and_old_configs_still_load() {
    let policy = tiny(19);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy");
    policy.save(&path, "test", false).unwrap();
    let config = std::fs::read_to_string(path.join("config.json")).unwrap();
    assert!(config.contains("\"latent\""), "{config}");
    let again = Checkpoint::<Vla>::load_kind(&path, Device::Cpu).unwrap();
    assert_eq!(again.model.config(), policy.model.config());
    let plain = crate::testing::tiny_vla(2);
    let plain_dir = tempfile::tempdir().unwrap();
    let plain_path = plain_dir.path().join("policy");
    plain.save(&plain_path, "test", false).unwrap();
    let plain_config = std::fs::read_to_string(plain_path.join("config.json")).unwrap();
    assert!(
        !plain_config.contains("latent"),
        "a plain VLA's config is unchanged: {plain_config}"
    );
}

/// Over bf16 copies of its weights (`crate::precision`) a thinking VLA
/// samples and scores in bf16 — its frames, proprio and latent slots cast
/// where they enter — and every log-prob, value and predicted latent it
/// returns, and its warm-up loss, is f32, near the fp32 ones (bf16 keeps 8
/// bits of mantissa); back from the master weights it scores exactly as
/// before.
#[test]
fn over_bf16_copies_it_thinks_in_bf16_and_scores_in_f32() {
    let mut policy = tiny(3);
    let rows = Rows::new(4);
    let batch = rows.batch();
    let out = policy
        .model
        .sample_with_latents(&batch, &[1, 2, 3, 4], 1.0, 0.3)
        .unwrap();
    let targets: Vec<&[f32]> = out.iter().map(|d| d.latents.as_slice()).collect();
    let stops: Vec<usize> = out.iter().map(|d| d.stop).collect();
    let tokens: Vec<&[u32]> = out.iter().map(|d| d.decision.tokens.as_slice()).collect();
    let warmup = |policy: &Checkpoint<Vla>| {
        tch::no_grad(|| {
            let warmup = WarmupConfig::default();
            let loss = policy
                .model
                .warmup_loss(&batch, &targets, &stops, &tokens, None, warmup);
            loss.unwrap().total
        })
    };
    let fp32 = scores_of(&policy.model, &batch, &out, 1.6);
    let fp32_warmup = warmup(&policy);
    let master = crate::precision::MasterWeights::new(&mut policy.vars);
    let sampled = policy
        .model
        .sample_with_latents(&batch, &[1, 2, 3, 4], 1.0, 0.3)
        .unwrap();
    assert!(sampled.iter().all(|d| d.value.is_finite()));
    let bf16 = scores_of(&policy.model, &batch, &out, 1.6);
    let bf16_warmup = warmup(&policy);
    for (what, a, b) in [
        ("actions", &bf16.token_logprobs, &fp32.token_logprobs),
        ("stops", &bf16.stop_logprobs, &fp32.stop_logprobs),
        ("values", &bf16.values, &fp32.values),
        ("latents", &bf16.latents, &fp32.latents),
        ("warm-up loss", &bf16_warmup, &fp32_warmup),
    ] {
        assert_eq!(a.kind(), Kind::Float, "{what}");
        let apart = (a - b).abs().max().double_value(&[]);
        let largest = b.abs().max().double_value(&[]);
        assert!(
            apart > 0.0 && apart < 2e-2 * largest.max(1.0),
            "{what}: bf16 vs fp32 {apart} (largest {largest})"
        );
    }
    master.finish(&mut policy.vars);
    let again = scores_of(&policy.model, &batch, &out, 1.6);
    assert!(again.token_logprobs.equal(&fp32.token_logprobs));
    assert!(again.values.equal(&fp32.values));
}
