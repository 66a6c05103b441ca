use tch::nn::OptimizerConfig;

use embodyflow_core::{Classify, ErrorKind};

use super::*;
use crate::checkpoint::Checkpoint;
use crate::registry::policy_kind;
use crate::testing::{load_refused, seed, tiny_tokenizer};

/// A tiny VLA: 16 × 16 images in 16 patches of 4 × 4, proprio of 3,
/// instructions of up to 6 tokens, chunks of 3 actions of 2 dimensions,
/// 32 bins, width 32, 2 layers.
fn tiny_config(vocab_size: i64) -> VlaConfig {
    VlaConfig {
        vocab_size,
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
        n_embd: 32,
        n_head: 4,
        n_layer: 2,
        latent: None,
        trunk: None,
    }
}

fn tiny(seed_value: i64) -> Checkpoint<Vla> {
    let tokenizer = tiny_tokenizer();
    let config = tiny_config(tokenizer.get_vocab_size(true) as i64);
    let _generator = seed(seed_value);
    Checkpoint::<Vla>::init_kind(&config, tokenizer, Device::Cpu).unwrap()
}

/// Owned observations of a few rows with distinct images, proprio and
/// instructions (of several lengths: pads in the batch).
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
                        .map(|i| ((i * 37 + row * 101) % 256) as u8)
                        .collect()
                })
                .collect(),
            proprio: (0..n)
                .map(|row| vec![row as f32 * 0.1, -0.3, 0.7])
                .collect(),
            instructions: (0..n)
                .map(|row| {
                    (0..(row % 4) + 1)
                        .map(|t| 3 + (row * 7 + t) as i32)
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

fn slices(rows: &[Vec<u32>]) -> Vec<&[u32]> {
    rows.iter().map(Vec::as_slice).collect()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

#[test]
fn logits_have_one_distribution_per_action_token() {
    let policy = tiny(0);
    let rows = Rows::new(5);
    let logits = policy.model.logits(&rows.batch()).unwrap();
    assert_eq!(logits.size(), [5, 6, 32]);
    let config = VlaConfig::small(300);
    assert_eq!((config.n_patches(), config.n_action_tokens()), (16, 32));
    assert_eq!(config.check(), Ok(()));
}

#[test]
fn a_row_does_not_depend_on_its_batch() {
    let policy = tiny(0);
    let rows = Rows::new(5);
    let batch = rows.batch();
    let together = tch::no_grad(|| policy.model.logits(&batch).unwrap());
    for row in 0..batch.len() {
        let alone = tch::no_grad(|| policy.model.logits(&batch[row..=row]).unwrap());
        let diff = max_diff(&alone.get(0), &together.get(row as i64));
        assert!(diff < 1e-5, "row {row}: {diff}");
    }
}

#[test]
fn placeholders_attend_to_each_other_and_the_prefix_never_to_them() {
    let policy = tiny(0);
    let rows = Rows::new(3);
    let batch = rows.batch();
    let Sequence {
        proprio,
        tail,
        allowed,
    } = policy.model.sequence(&batch, None, true).unwrap();
    let actions = policy.model.config().n_action_tokens();
    let run = |tail: Tensor| {
        let model = &policy.model;
        tch::no_grad(|| {
            model.trunk.hidden(
                model.config(),
                &batch,
                proprio.shallow_clone(),
                tail,
                &allowed,
            )
        })
        .unwrap()
    };
    let (base, prefix) = run(tail.shallow_clone());
    // Change the input of the first placeholder only.
    let bump = Tensor::zeros_like(&tail);
    let mut first = bump.narrow(1, 0, 1);
    // A pattern across the width (a constant would vanish in the layer norms).
    let pattern = Tensor::arange(tail.size()[2], (Kind::Float, Device::Cpu)).sin();
    first.copy_(&pattern.view([1, 1, -1]));
    let (changed, _) = run(&tail + bump);
    let prefix_diff = max_diff(&base.narrow(1, 0, prefix), &changed.narrow(1, 0, prefix));
    assert!(
        prefix_diff < 1e-6,
        "the prefix saw a placeholder: {prefix_diff}"
    );
    let logits = |h: &Tensor| policy.model.action_logits(h);
    let (a, b) = (logits(&base), logits(&changed));
    for t in 1..actions {
        let diff = max_diff(&a.select(1, t), &b.select(1, t));
        assert!(
            diff > 1e-4,
            "placeholder {t} did not see placeholder 0 ({diff})"
        );
    }
}

#[test]
fn sampling_is_in_range_seeded_and_greedy_is_the_arg_max() {
    let policy = tiny(0);
    let rows = Rows::new(4);
    let batch = rows.batch();
    let seeds = [11, 12, 13, 14];
    let first = policy.model.sample(&batch, &seeds, 1.6).unwrap();
    let again = policy.model.sample(&batch, &seeds, 1.6).unwrap();
    assert_eq!(first, again, "same seeds, same decisions");
    // A row's draw depends on its seed only, not on its batch.
    let alone = policy.model.sample(&batch[2..3], &[13], 1.6).unwrap();
    assert_eq!(alone[0].tokens, first[2].tokens);
    let other = policy.model.sample(&batch, &[21, 22, 23, 24], 1.6).unwrap();
    assert_ne!(
        first.iter().map(|d| &d.tokens).collect::<Vec<_>>(),
        other.iter().map(|d| &d.tokens).collect::<Vec<_>>()
    );
    for decision in &first {
        assert_eq!(decision.tokens.len(), 6);
        assert!(decision.tokens.iter().all(|&t| t < 32));
        let sum: f32 = decision.token_logprobs.iter().sum();
        assert!((sum - decision.logprob).abs() < 1e-4);
    }
    let greedy = policy.model.sample(&batch, &seeds, 0.0).unwrap();
    let logits = tch::no_grad(|| policy.model.logits(&batch).unwrap());
    let arg_max = Vec::<i64>::try_from(logits.argmax(2, false).view([-1])).unwrap();
    let tokens: Vec<i64> = greedy
        .iter()
        .flat_map(|d| d.tokens.iter().map(|&t| i64::from(t)))
        .collect();
    assert_eq!(tokens, arg_max);
}

#[test]
fn a_decision_log_prob_is_the_sum_of_its_tokens_and_the_samplers() {
    let policy = tiny(1);
    let rows = Rows::new(4);
    let batch = rows.batch();
    let temperature = 1.6;
    let decisions = policy
        .model
        .sample(&batch, &[1, 2, 3, 4], temperature)
        .unwrap();
    let tokens: Vec<&[u32]> = decisions.iter().map(|d| d.tokens.as_slice()).collect();
    let per_token = policy
        .model
        .token_logprobs(&batch, &tokens, temperature)
        .unwrap();
    assert!(per_token.requires_grad());
    let decision = policy
        .model
        .decision_logprobs(&batch, &tokens, temperature)
        .unwrap();
    assert_eq!(per_token.size(), [4, 6]);
    assert_eq!(decision.size(), [4]);
    // A direct computation: softmax of logits / T, product over the tokens.
    let logits = Vec::<f32>::try_from(policy.model.logits(&batch).unwrap().view([-1])).unwrap();
    for (row, sampled) in decisions.iter().enumerate() {
        let mut direct = 0.0f64;
        for (t, &token) in sampled.tokens.iter().enumerate() {
            let start = (row * 6 + t) * 32;
            let scaled: Vec<f64> = logits[start..start + 32]
                .iter()
                .map(|&l| f64::from(l) / temperature)
                .collect();
            let norm: f64 = scaled.iter().map(|s| s.exp()).sum();
            let token_logp = scaled[token as usize] - norm.ln();
            let ours = per_token.double_value(&[row as i64, t as i64]);
            assert!((ours - token_logp).abs() < 1e-5, "row {row} token {t}");
            assert!((f64::from(sampled.token_logprobs[t]) - token_logp).abs() < 1e-5);
            direct += token_logp;
        }
        let ours = decision.double_value(&[row as i64]);
        assert!(
            (ours - direct).abs() < 1e-4,
            "row {row}: {ours} vs {direct}"
        );
        assert!((f64::from(sampled.logprob) - direct).abs() < 1e-4);
    }
}

/// The synthetic task: a red 4 × 4 square at (x, y) on a grey 16 × 16
/// image; the instruction says whether to move towards it or away. The
/// target chunk is a fixed function of the square's position and the
/// instruction: action 0 = s (x, y), action 1 = s (y, -x), action 2 =
/// s (x / 2, 0), with s = +1 ("towards") or -1 ("away") and x, y in [-1, 1].
struct Square {
    images: Vec<Vec<u8>>,
    proprio: Vec<Vec<f32>>,
    instructions: Vec<Vec<i32>>,
    targets: Vec<Vec<u32>>,
    values: Vec<Vec<f32>>,
}

fn bin(value: f32) -> u32 {
    // 32 uniform bins over [-1, 1] (the tokenizer's layout: edges = linspace).
    let step = 2.0 / 31.0;
    (((value + 1.0) / step).floor() as u32).min(31)
}

fn centre(token: u32) -> f32 {
    let step = 2.0f32 / 31.0;
    -1.0 + (token.min(30) as f32 + 0.5) * step
}

fn square_task() -> Square {
    let mut task = Square {
        images: Vec::new(),
        proprio: Vec::new(),
        instructions: Vec::new(),
        targets: Vec::new(),
        values: Vec::new(),
    };
    for sign in [1.0f32, -1.0] {
        for py in (0..13).step_by(2) {
            for px in (0..13).step_by(2) {
                let mut image = vec![96u8; 16 * 16 * 3];
                for y in py..py + 4 {
                    for x in px..px + 4 {
                        image[(y * 16 + x) * 3..(y * 16 + x) * 3 + 3]
                            .copy_from_slice(&[220, 30, 30]);
                    }
                }
                let (x, y) = (px as f32 / 6.0 - 1.0, py as f32 / 6.0 - 1.0);
                let values: Vec<f32> = [x, y, y, -x, x / 2.0, 0.0]
                    .iter()
                    .map(|v| sign * v)
                    .collect();
                task.targets.push(values.iter().map(|&v| bin(v)).collect());
                task.values.push(values);
                task.images.push(image);
                task.proprio.push(vec![0.5, 0.1, 0.0]);
                task.instructions.push(if sign > 0.0 {
                    vec![10, 11]
                } else {
                    vec![12, 13, 14]
                });
            }
        }
    }
    task
}

#[test]
fn behaviour_cloning_learns_a_function_of_the_image_and_instruction() {
    let policy = tiny(2);
    let task = square_task();
    let batch: Vec<Observation> = (0..task.images.len())
        .map(|row| Observation {
            image: &task.images[row],
            height: 16,
            width: 16,
            proprio: &task.proprio[row],
            instruction: &task.instructions[row],
        })
        .collect();
    let targets: Vec<&[u32]> = task.targets.iter().map(Vec::as_slice).collect();
    let mut opt = nn::AdamW::default().build(&policy.vars, 3e-3).unwrap();
    let first = policy
        .model
        .bc_loss(&batch, &targets, None)
        .unwrap()
        .double_value(&[]);
    // The greedy chunks' mean distance to the targets (bin centres vs values).
    let greedy_error = || {
        let greedy = policy
            .model
            .sample(&batch, &vec![0; batch.len()], 0.0)
            .unwrap();
        let mut error = 0.0f32;
        for (decision, values) in greedy.iter().zip(&task.values) {
            for (&token, &value) in decision.tokens.iter().zip(values) {
                error += (centre(token) - value).abs();
            }
        }
        error / (greedy.len() * 6) as f32
    };
    let mut last = first;
    let mut error = greedy_error();
    // At most 400 steps, stopping as soon as greedy is within 0.1 on average.
    for step in 1..=400 {
        let loss = policy.model.bc_loss(&batch, &targets, None).unwrap();
        last = loss.double_value(&[]);
        opt.backward_step(&loss);
        if step % 25 == 0 {
            error = greedy_error();
            if error < 0.1 {
                break;
            }
        }
    }
    assert!(last < 0.25 * first, "loss {first} -> {last}");
    assert!(
        error < 0.1,
        "greedy actions {error} from the targets on average"
    );
}

#[test]
fn the_loss_leaves_out_chunk_steps_after_the_episode() {
    let policy = tiny(0);
    let rows = Rows::new(3);
    let batch = rows.batch();
    let a: Vec<Vec<u32>> = (0..3)
        .map(|row| (0..6).map(|t| (row * 5 + t) as u32).collect())
        .collect();
    let mut b = a.clone();
    // Steps 1 and 2 of row 0 and step 2 of row 1 lie after the episode's end.
    b[0][2..].fill(31);
    b[1][4..].fill(0);
    let valid = [1, 2, 3];
    let loss_a = policy
        .model
        .bc_loss(&batch, &slices(&a), Some(&valid))
        .unwrap();
    let loss_b = policy
        .model
        .bc_loss(&batch, &slices(&b), Some(&valid))
        .unwrap();
    assert!(max_diff(&loss_a, &loss_b) < 1e-6);
    // The masked mean by hand: the valid tokens' mean negative log-prob.
    let logp = policy
        .model
        .token_logprobs(&batch, &slices(&a), 1.0)
        .unwrap();
    let mut sum = 0.0;
    let mut count = 0;
    for (row, &steps) in valid.iter().enumerate() {
        for t in 0..steps * 2 {
            sum -= logp.double_value(&[row as i64, t as i64]);
            count += 1;
        }
    }
    assert!((loss_a.double_value(&[]) - sum / count as f64).abs() < 1e-5);
    let full = policy.model.bc_loss(&batch, &slices(&a), None).unwrap();
    assert!(max_diff(&full, &loss_a) > 1e-6);
}

#[test]
fn checkpoints_round_trip_and_name_their_kind() {
    let dir = tempfile::tempdir().unwrap();
    let policy = tiny(0);
    let path = dir.path().join("vla");
    policy.save(&path, "test", false).unwrap();
    assert_eq!(policy_kind(&path).unwrap(), PolicyKind::Vla);
    let loaded = Checkpoint::<Vla>::load_kind(&path, Device::Cpu).unwrap();
    assert_eq!(loaded.model.config(), policy.model.config());
    let rows = Rows::new(3);
    let (a, b) = tch::no_grad(|| {
        (
            policy.model.logits(&rows.batch()).unwrap(),
            loaded.model.logits(&rows.batch()).unwrap(),
        )
    });
    assert!(a.equal(&b), "identical logits after the round trip");
    let error = Checkpoint::load(&path, Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("holds a vla policy, expected a plan"),
        "{error}"
    );
    // A config the network cannot have is named with its file.
    let text = std::fs::read_to_string(path.join("config.json")).unwrap();
    assert!(text.contains("\"patch_size\": 4"), "{text}");
    std::fs::write(
        path.join("config.json"),
        text.replace("\"patch_size\": 4", "\"patch_size\": 5"),
    )
    .unwrap();
    let error = Checkpoint::<Vla>::load_kind(&path, Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("config.json") && error.contains("patch_size 5 must divide image_size 16"),
        "{error}"
    );
    std::fs::write(
        path.join("config.json"),
        text.replace("\"n_bins\": 32", "\"n_bins\": 32, \"bins\": 3"),
    )
    .unwrap();
    let error = Checkpoint::<Vla>::load_kind(&path, Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        error.contains("config.json") && error.contains("bins"),
        "{error}"
    );
}

/// The tensor list a checkpoint's weights are checked against before
/// allocation is the network `Vla::new` builds, with and without latents,
/// proprio and frames.
#[test]
fn the_config_lists_exactly_the_networks_parameters() {
    let thinking = VlaConfig {
        latent: Some(LatentConfig::last_r1()),
        ..tiny_config(50)
    };
    let blind = VlaConfig {
        image_size: 0,
        proprio_dim: 0,
        ..tiny_config(50)
    };
    for config in [tiny_config(50), thinking, blind] {
        let vs = nn::VarStore::new(Device::Cpu);
        let _model = Vla::new(&vs.root(), &config);
        embodyflow_hf::testing::assert_tensors_are_the_variables(&vs, config.tensors());
    }
}

/// Sizes no weights hold in a saved VLA's config.json (10^9 layers, 2^40
/// bins or chunk steps, 2^31-pixel images) are refused on the weights'
/// header, naming the tensor, the file and the keys, before any parameter
/// is allocated (allocating them aborted the process); sizes whose
/// sequence cannot even be counted are refused by the config check.
#[test]
fn absurd_sizes_in_config_json_are_refused_before_allocating() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vla");
    tiny(0).save(&path, "test", false).unwrap();
    let text = std::fs::read_to_string(path.join("config.json")).unwrap();
    let cases: [(&str, i64, &str); 6] = [
        ("n_layer", 1_000_000_000, "`h.2.ln_1.weight` is missing"),
        ("n_bins", 1 << 40, "`action_head.weight` has shape"),
        ("chunk_len", 1 << 40, "`wpe.weight` has shape"),
        ("image_size", 1 << 31, "`wpe.weight` has shape"),
        ("n_embd", 1 << 31, "`wte.weight` has shape"),
        ("image_size", 1 << 40, "too long to count"),
    ];
    for (key, value, needle) in cases {
        let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
        config[key] = serde_json::Value::from(value);
        std::fs::write(path.join("config.json"), config.to_string()).unwrap();
        let error = Checkpoint::<Vla>::load_kind(&path, Device::Cpu)
            .err()
            .unwrap();
        assert_eq!(error.kind(), ErrorKind::BadInput, "{key}: {error}");
        let error = error.to_string();
        assert!(
            error.contains(needle) && error.contains(key),
            "{key}: {error}"
        );
    }
}

/// A change to a good config and the words of the error it must raise.
type ConfigCase = (fn(&mut VlaConfig), &'static str);

#[test]
fn configs_are_checked() {
    let good = tiny_config(300);
    let cases: [ConfigCase; 6] = [
        (
            |c| c.patch_size = 5,
            "patch_size 5 must divide image_size 16",
        ),
        (|c| c.chunk_len = 0, "chunk_len must be at least 1"),
        (|c| c.action_dim = 0, "action_dim must be at least 1"),
        (|c| c.n_bins = 1, "n_bins must be at least 2"),
        (|c| c.action_high = -1.0, "action_low < action_high"),
        (|c| c.n_head = 5, "n_head 5 must divide n_embd 32"),
    ];
    for (change, expected) in cases {
        let mut config = good.clone();
        change(&mut config);
        let error = config.check().unwrap_err();
        assert!(error.contains(expected), "{error}");
    }
}

#[test]
fn bad_inputs_are_named_by_row() {
    let policy = tiny(0);
    let model = &policy.model;
    let rows = Rows::new(3);
    let mut batch = rows.batch();
    let big = vec![0u8; 32 * 32 * 3];
    batch[1].image = &big;
    batch[1].height = 32;
    batch[1].width = 32;
    assert_eq!(
        model.logits(&batch).err().unwrap(),
        VlaError::ImageShape {
            row: 1,
            height: 32,
            width: 32,
            bytes: 3072,
            size: 16,
            channels: 3,
        }
    );
    let mut batch = rows.batch();
    batch[2].height = 15; // bytes right, shape wrong
    assert!(matches!(
        model.logits(&batch),
        Err(VlaError::ImageShape { row: 2, .. })
    ));
    let mut batch = rows.batch();
    let short = [0.0f32; 2];
    batch[0].proprio = &short;
    let error = model.logits(&batch).err().unwrap().to_string();
    assert!(error.contains("row 0: proprio has 2 values"), "{error}");
    let mut batch = rows.batch();
    let nan = [0.0f32, f32::NAN, 0.0];
    batch[2].proprio = &nan;
    let error = model.logits(&batch).err().unwrap().to_string();
    assert!(
        error.contains("row 2: proprio value NaN at index 1"),
        "{error}"
    );
    let mut batch = rows.batch();
    let unknown = [5, 100_000];
    batch[1].instruction = &unknown;
    let error = model.logits(&batch).err().unwrap().to_string();
    assert!(
        error.contains("row 1: instruction token 100000 at position 1"),
        "{error}"
    );
    let long = [5; 7];
    batch[1].instruction = &long;
    let error = model.logits(&batch).err().unwrap().to_string();
    assert!(error.contains("row 1: instruction of 7 tokens exceeds max_instruction 6"));

    let batch = rows.batch();
    let ok = [0u32; 6];
    let outside = [0, 0, 0, 32, 0, 0];
    assert_eq!(
        model
            .token_logprobs(&batch, &[&ok, &outside, &ok], 1.0)
            .err()
            .unwrap(),
        VlaError::BadActionToken {
            row: 1,
            position: 3,
            token: 32,
            n_bins: 32
        }
    );
    assert_eq!(
        model
            .bc_loss(&batch, &[&ok, &ok, &ok[..5]], None)
            .err()
            .unwrap(),
        VlaError::ChunkShape {
            row: 2,
            found: 5,
            expected: 6
        }
    );
    assert_eq!(
        model
            .bc_loss(&batch, &[&ok, &ok, &ok], Some(&[1, 4, 1]))
            .err()
            .unwrap(),
        VlaError::ValidSteps {
            row: 1,
            found: 4,
            chunk_len: 3
        }
    );
    assert!(matches!(
        model.sample(&batch, &[1, 2], 1.0),
        Err(VlaError::RowCount {
            what: "seeds",
            found: 2,
            batch: 3
        })
    ));
    assert!(matches!(
        model.sample(&batch, &[1, 2, 3], -1.0),
        Err(VlaError::Temperature(_))
    ));
    assert_eq!(model.logits(&[]).err().unwrap(), VlaError::EmptyBatch);
    let error: crate::ModelError = VlaError::EmptyBatch.into();
    assert_eq!(error.kind(), ErrorKind::BadInput);
}

#[test]
fn a_vla_without_frames_learns_a_function_of_its_proprio() {
    // A state-only world (Meta-World through the bridge): image_size 0, no
    // patches; the target bin of every token is set by the proprio's sign.
    let tokenizer = tiny_tokenizer();
    let config = VlaConfig {
        image_size: 0,
        ..tiny_config(tokenizer.get_vocab_size(true) as i64)
    };
    assert_eq!(config.n_patches(), 0);
    let _generator = seed(5);
    let policy = Checkpoint::<Vla>::init_kind(&config, tokenizer, Device::Cpu).unwrap();
    let proprio: Vec<Vec<f32>> = (0..8)
        .map(|row| vec![if row % 2 == 0 { 0.9 } else { -0.9 }, 0.1 * row as f32, 0.0])
        .collect();
    let instruction = [4i32, 5];
    let batch: Vec<Observation> = proprio
        .iter()
        .map(|p| Observation {
            image: &[],
            height: 0,
            width: 0,
            proprio: p,
            instruction: &instruction,
        })
        .collect();
    let targets: Vec<Vec<u32>> = (0..8)
        .map(|row| vec![if row % 2 == 0 { 30 } else { 1 }; 6])
        .collect();
    let target_slices = slices(&targets);
    let mut opt = nn::AdamW::default().build(&policy.vars, 3e-3).unwrap();
    for _ in 0..150 {
        let loss = policy.model.bc_loss(&batch, &target_slices, None).unwrap();
        opt.backward_step(&loss);
    }
    let greedy = policy.model.sample(&batch, &[0; 8], 0.0).unwrap();
    for (decision, target) in greedy.iter().zip(&targets) {
        assert_eq!(&decision.tokens, target);
    }
    // A frame where none is taken is refused, naming the row.
    let pixel = [0u8; 3];
    let mut wrong = batch.clone();
    wrong[2] = Observation {
        image: &pixel,
        height: 1,
        width: 1,
        ..batch[2]
    };
    let error = policy
        .model
        .sample(&wrong, &[0; 8], 0.0)
        .unwrap_err()
        .to_string();
    assert!(error.contains("row 2"), "{error}");
}

#[test]
fn two_cameras_joined_along_the_channels_are_one_six_channel_frame() {
    // LIBERO's agent-view and wrist cameras: a 16 x 16 x 6 frame, each
    // patch embedding both views' pixels at its place.
    let tokenizer = tiny_tokenizer();
    let config = VlaConfig {
        channels: 6,
        ..tiny_config(tokenizer.get_vocab_size(true) as i64)
    };
    let json = serde_json::to_value(&config).unwrap();
    assert_eq!(json["channels"], 6);
    assert!(
        serde_json::to_value(tiny_config(50))
            .unwrap()
            .get("channels")
            .is_none(),
        "an RGB config names no channels (checkpoints written before read the same)"
    );
    let mut rgb = serde_json::to_value(tiny_config(50)).unwrap();
    rgb.as_object_mut().unwrap().remove("channels");
    assert_eq!(
        serde_json::from_value::<VlaConfig>(rgb).unwrap().channels,
        3
    );
    let patch = config
        .tensors()
        .find(|t| t.name == "patch_embed.weight")
        .unwrap();
    assert_eq!(patch.shape, [32, 4 * 4 * 6]);
    let _generator = seed(3);
    let policy = Checkpoint::<Vla>::init_kind(&config, tokenizer, Device::Cpu).unwrap();
    let rows = Rows::new(2);
    let frames: Vec<Vec<u8>> = rows
        .images
        .iter()
        .map(|image| image.iter().flat_map(|&v| [v, 255 - v]).collect())
        .collect();
    let batch: Vec<Observation<'_>> = rows
        .batch()
        .into_iter()
        .zip(&frames)
        .map(|(row, frame)| Observation {
            image: frame,
            ..row
        })
        .collect();
    let logits = policy.model.logits(&batch).unwrap();
    assert_eq!(logits.size(), [2, 6, 32]);
    // The wrist view alone changes the decision's logits.
    let mut other = frames[0].clone();
    for pixel in other.chunks_mut(6) {
        pixel[3..].fill(0);
    }
    let changed = [Observation {
        image: &other,
        ..batch[0]
    }];
    let first = policy.model.logits(&batch[..1]).unwrap();
    let moved = policy.model.logits(&changed).unwrap();
    assert!(max_diff(&first, &moved) > 1e-6);
    // A 3-channel frame is named with the channels the policy takes.
    let error = policy.model.logits(&rows.batch()).unwrap_err().to_string();
    assert!(error.ends_with("the policy takes 16x16x6"), "{error}");
}

/// A convolutional stem (`stem_channels`): its two 3 × 3 convolutions
/// are parameters the config lists, the patches are cut from its features
/// (`patch_embed` takes p·p·stem_channels), one pixel changes the logits,
/// and the checkpoint round-trips; a config without a stem names none, so
/// checkpoints written before read the same.
#[test]
fn a_convolutional_stem_feeds_the_patches_and_round_trips() {
    let tokenizer = tiny_tokenizer();
    let config = VlaConfig {
        stem_channels: 8,
        ..tiny_config(tokenizer.get_vocab_size(true) as i64)
    };
    config.check().unwrap();
    let shapes: Vec<(String, Vec<i64>)> = config
        .tensors()
        .filter(|t| t.name.starts_with("stem") || t.name.starts_with("patch_embed"))
        .map(|t| (t.name, t.shape))
        .collect();
    let shape = |name: &str, s: &[i64]| (name.to_string(), s.to_vec());
    assert_eq!(
        shapes,
        [
            shape("stem.conv1.weight", &[8, 3, 3, 3]),
            shape("stem.conv1.bias", &[8]),
            shape("stem.conv2.weight", &[8, 8, 3, 3]),
            shape("stem.conv2.bias", &[8]),
            shape("patch_embed.weight", &[32, 4 * 4 * 8]),
            shape("patch_embed.bias", &[32]),
        ]
    );
    assert!(
        serde_json::to_value(tiny_config(50))
            .unwrap()
            .get("stem_channels")
            .is_none()
    );
    assert_eq!(serde_json::to_value(&config).unwrap()["stem_channels"], 8);
    let _generator = seed(5);
    let policy = Checkpoint::<Vla>::init_kind(&config, tokenizer, Device::Cpu).unwrap();
    let rows = Rows::new(2);
    let logits = tch::no_grad(|| policy.model.logits(&rows.batch()).unwrap());
    assert_eq!(logits.size(), [2, 6, 32]);
    let mut image = rows.images[0].clone();
    image[3 * (5 * 16 + 7)] ^= 0x80;
    let moved = tch::no_grad(|| {
        policy
            .model
            .logits(&[Observation {
                image: &image,
                ..rows.batch()[0]
            }])
            .unwrap()
    });
    assert!(max_diff(&logits.narrow(0, 0, 1), &moved) > 1e-6);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vla");
    policy.save(&path, "test", false).unwrap();
    let loaded = Checkpoint::<Vla>::load_kind(&path, Device::Cpu).unwrap();
    assert_eq!(loaded.model.config(), policy.model.config());
    let again = tch::no_grad(|| loaded.model.logits(&rows.batch()).unwrap());
    assert!(again.equal(&logits));
    let negative = VlaConfig {
        stem_channels: -1,
        ..config
    };
    assert!(negative.check().unwrap_err().contains("stem_channels"));
}

/// `history` (the decisions a prompt recalls) is the policy's: a
/// checkpoint saves and loads it, a config of 0 names none (so checkpoints
/// written before it read the same, memoryless), and a negative one is
/// refused by `check` and when its `config.json` is loaded, naming the key.
#[test]
fn the_history_length_round_trips_and_a_negative_one_is_refused() {
    let tokenizer = tiny_tokenizer();
    let config = VlaConfig {
        history: 2,
        ..tiny_config(tokenizer.get_vocab_size(true) as i64)
    };
    config.check().unwrap();
    let memoryless = serde_json::to_value(tiny_config(50)).unwrap();
    assert!(memoryless.get("history").is_none(), "{memoryless}");
    let read: VlaConfig = serde_json::from_value(memoryless).unwrap();
    assert_eq!(read, tiny_config(50));
    assert_eq!(serde_json::to_value(&config).unwrap()["history"], 2);
    let _generator = seed(5);
    let policy = Checkpoint::<Vla>::init_kind(&config, tokenizer, Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("vla");
    policy.save(&path, "test", false).unwrap();
    let loaded = Checkpoint::<Vla>::load_kind(&path, Device::Cpu).unwrap();
    assert_eq!(loaded.model.config(), &config);
    let negative = VlaConfig {
        history: -1,
        ..config
    };
    assert_eq!(
        negative.check().unwrap_err(),
        "history must be at least 0 (0: prompts recall no earlier decision), found -1"
    );
    let text = std::fs::read_to_string(path.join("config.json")).unwrap();
    assert!(text.contains("\"history\": 2"), "{text}");
    std::fs::write(
        path.join("config.json"),
        text.replace("\"history\": 2", "\"history\": -1"),
    )
    .unwrap();
    let error = load_refused::<Vla>(&path);
    assert!(
        error.contains("config.json") && error.contains("history must be at least 0"),
        "{error}"
    );
}

/// Over bf16 copies of its weights (`crate::precision`) a VLA runs in
/// bf16, its pixels and proprio cast where they enter, and its action
/// logits come out in f32, near the fp32 ones (bf16 keeps 8 bits of
/// mantissa); back from the master weights it gives exactly the fp32
/// logits again.
#[test]
fn over_bf16_copies_the_logits_are_f32_near_the_fp32_ones() {
    let mut policy = tiny(3);
    let rows = Rows::new(3);
    let logits = |policy: &Checkpoint<Vla>| tch::no_grad(|| policy.model.logits(&rows.batch()));
    let fp32 = logits(&policy).unwrap();
    let master = crate::precision::MasterWeights::new(&mut policy.vars);
    let bf16 = logits(&policy).unwrap();
    assert_eq!(bf16.kind(), Kind::Float);
    let apart = max_diff(&bf16, &fp32);
    let largest = fp32.abs().max().double_value(&[]);
    assert!(
        apart > 0.0 && apart < 2e-2 * largest.max(1.0),
        "bf16 vs fp32 logits: {apart} (largest {largest})"
    );
    master.finish(&mut policy.vars);
    assert!(logits(&policy).unwrap().equal(&fp32));
}
