use std::path::Path;
use std::sync::OnceLock;

use tch::{Device, Tensor};

use super::network::PASSES;
use super::*;
use crate::checkpoint::{Checkpoint, PolicyNet};
use crate::optimizer::{AdamW, AdamWConfig, OptimizerState};
use crate::policy::Entropy;
use crate::testing::{seed, tiny_vlm};
use crate::vla::{LatentConfig, Observation, Vla, VlaConfig};

/// One tiny Qwen2.5-VL for every test of this binary (transformers takes
/// seconds to start).
fn vlm() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        tiny_vlm(dir.path(), "qwen2_5_vl");
        dir
    })
    .path()
}

/// The world's side of the tests' VLA: 32 × 32 RGB frames, proprio of 3,
/// chunks of 3 actions of 2 dimensions, 256 bins.
fn shape(latent: Option<LatentConfig>) -> VlaConfig {
    VlaConfig {
        max_instruction: 12,
        image_size: 32,
        proprio_dim: 3,
        chunk_len: 3,
        action_dim: 2,
        latent,
        ..VlaConfig::small(0)
    }
}

fn vla_on_vlm(tokens: ActionTokens, freeze: bool, latent: Option<LatentConfig>) -> Checkpoint<Vla> {
    let _generator = seed(11);
    init_on_vlm(vlm(), &shape(latent), tokens, freeze, Device::Cpu).unwrap()
}

/// Owned rows: distinct frames, proprio and instructions of 1 to 3 tokens
/// (pads in the batch).
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
                    (0..32 * 32 * 3)
                        .map(|i| ((i * 31 + row * 97) % 256) as u8)
                        .collect()
                })
                .collect(),
            proprio: (0..n)
                .map(|row| vec![row as f32 * 0.2, -0.4, 0.6])
                .collect(),
            instructions: (0..n)
                .map(|row| {
                    (0..(row % 3) + 1)
                        .map(|t| (5 + 13 * row + 7 * t) as i32)
                        .collect()
                })
                .collect(),
        }
    }

    fn batch(&self) -> Vec<Observation<'_>> {
        (0..self.images.len())
            .map(|row| Observation {
                image: &self.images[row],
                height: 32,
                width: 32,
                proprio: &self.proprio[row],
                instruction: &self.instructions[row],
            })
            .collect()
    }
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a - b).abs().max().double_value(&[])
}

fn passes() -> usize {
    PASSES.with(|p| p.get())
}

#[test]
fn action_bins_are_the_last_ids_of_the_vocabulary_and_map_back() {
    let (n_bins, vocab) = (256, 640);
    let ids: Vec<i64> = (0..n_bins as u32)
        .map(|b| vocab_id(b, n_bins, vocab))
        .collect();
    assert_eq!(ids, (vocab - n_bins..vocab).collect::<Vec<_>>());
    for (bin, &id) in ids.iter().enumerate() {
        assert_eq!(bin_of(id, n_bins, vocab), Some(bin as u32));
    }
    assert_eq!(bin_of(vocab - n_bins - 1, n_bins, vocab), None);
    assert_eq!(bin_of(vocab, n_bins, vocab), None);
    // The VLA's logit of bin b is the language model's logit of id V - 256 + b.
    let policy = vla_on_vlm(ActionTokens::Vocab, false, None);
    let model = &policy.model;
    assert!(
        policy
            .vars
            .variables()
            .keys()
            .all(|n| !n.starts_with("action_head")),
        "no separate head"
    );
    let rows = Rows::new(2);
    let batch = rows.batch();
    let logits = tch::no_grad(|| model.logits(&batch)).unwrap();
    let (hidden, _) = tch::no_grad(|| model.hidden(&batch, None, true)).unwrap();
    let k = model.config().n_action_tokens();
    let time = hidden.size()[1];
    let net = model.trunk.vl_net().unwrap();
    let lm = net.language().head(&hidden.narrow(1, time - k, k));
    assert_eq!(lm.size()[2], vocab);
    let at_ids = lm.index_select(2, &Tensor::from_slice(&ids));
    assert_eq!(max_diff(&logits, &at_ids), 0.0);
    assert!(logits.std(false).double_value(&[]) > 0.1, "logits differ");
}

/// One trunk pass gives every token of the chunk, and a slot's
/// distribution does not depend on the tokens drawn at the others
/// (parallel decoding, not token after token).
#[test]
fn the_chunk_slots_are_decoded_in_one_forward_pass() {
    for tokens in [ActionTokens::Head, ActionTokens::Vocab] {
        let policy = vla_on_vlm(tokens, false, None);
        let rows = Rows::new(3);
        let batch = rows.batch();
        let before = passes();
        let decisions = policy.model.sample(&batch, &[1, 2, 3], 1.0).unwrap();
        assert_eq!(passes() - before, 1, "{tokens:?}");
        let k = policy.model.config().n_action_tokens() as usize;
        assert!(decisions.iter().all(|d| d.tokens.len() == k));
        let mut changed: Vec<Vec<u32>> = decisions.iter().map(|d| d.tokens.clone()).collect();
        for row in &mut changed {
            row[0] = (row[0] + 17) % 256;
        }
        let sampled: Vec<&[u32]> = decisions.iter().map(|d| d.tokens.as_slice()).collect();
        let other: Vec<&[u32]> = changed.iter().map(Vec::as_slice).collect();
        let a = tch::no_grad(|| policy.model.token_logprobs(&batch, &sampled, 1.0)).unwrap();
        let b = tch::no_grad(|| policy.model.token_logprobs(&batch, &other, 1.0)).unwrap();
        let rest = |t: &Tensor| t.narrow(1, 1, k as i64 - 1);
        assert_eq!(max_diff(&rest(&a), &rest(&b)), 0.0, "{tokens:?}");
        assert!(max_diff(&a.narrow(1, 0, 1), &b.narrow(1, 0, 1)) > 0.0);
    }
}

/// The log-probs `policy` records when sampling `batch` at T = 1.3 are
/// those a teacher-forced pass over the stored tokens gives, and the last
/// row alone has the logits it has in the batch (its instruction padded
/// there), which differ between bins.
fn assert_samples_are_rescored(policy: &Checkpoint<Vla>, batch: &[Observation]) {
    let seeds: Vec<u64> = (4..4 + batch.len() as u64).collect();
    let decisions = policy.model.sample(batch, &seeds, 1.3).unwrap();
    let stored: Vec<&[u32]> = decisions.iter().map(|d| d.tokens.as_slice()).collect();
    let scored = tch::no_grad(|| policy.model.token_logprobs(batch, &stored, 1.3)).unwrap();
    for (row, d) in decisions.iter().enumerate() {
        let again = Vec::<f32>::try_from(scored.get(row as i64)).unwrap();
        for (a, b) in d.token_logprobs.iter().zip(&again) {
            assert!((a - b).abs() < 1e-5, "row {row}: {a} vs {b}");
        }
    }
    let last = batch.len() - 1;
    let alone = tch::no_grad(|| policy.model.logits(&batch[last..])).unwrap();
    let all = tch::no_grad(|| policy.model.logits(batch)).unwrap();
    assert!(max_diff(&alone, &all.narrow(0, last as i64, 1)) < 1e-5);
    assert!(all.std(false).double_value(&[]) > 0.1, "logits differ");
}

/// What a rollout records is what the update recomputes: the sampled
/// tokens' log-probs (and a thinking policy's stop, value and latents'
/// predictions) equal a teacher-forced pass over the stored decision.
#[test]
fn sampled_log_probs_equal_the_rescored_ones() {
    let rows = Rows::new(3);
    let batch = rows.batch();
    for tokens in [ActionTokens::Head, ActionTokens::Vocab] {
        assert_samples_are_rescored(&vla_on_vlm(tokens, false, None), &batch);
    }
    let latent = LatentConfig {
        length: 4,
        group: 2,
    };
    let policy = vla_on_vlm(ActionTokens::Vocab, false, Some(latent));
    let out = policy
        .model
        .sample_with_latents(&batch, &[7, 8, 9], 1.3, 0.1)
        .unwrap();
    let latents: Vec<&[f32]> = out.iter().map(|o| o.latents.as_slice()).collect();
    let stops: Vec<usize> = out.iter().map(|o| o.stop).collect();
    let tokens: Vec<&[u32]> = out.iter().map(|o| o.decision.tokens.as_slice()).collect();
    let scores = tch::no_grad(|| {
        policy
            .model
            .latent_scores(&batch, &latents, &stops, &tokens, 1.3, Entropy::Skip)
    })
    .unwrap();
    for (row, o) in out.iter().enumerate() {
        let r = row as i64;
        let stop = scores.stop_logprobs.double_value(&[r]) as f32;
        let value = scores.values.double_value(&[r]) as f32;
        assert!((stop - o.stop_logprob).abs() < 1e-5, "row {row}");
        assert!((value - o.value).abs() < 1e-5, "row {row}");
        let again = Vec::<f32>::try_from(scores.token_logprobs.get(r)).unwrap();
        for (a, b) in o.decision.token_logprobs.iter().zip(&again) {
            assert!((a - b).abs() < 1e-5, "row {row}: {a} vs {b}");
        }
    }
}

#[test]
fn a_saved_vla_on_a_vlm_reloads_with_identical_logits() {
    let policy = vla_on_vlm(ActionTokens::Head, true, None);
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("policy");
    policy.save(&dir, "init-policy", false).unwrap();
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(written["kind"], "vla");
    assert_eq!(written["trunk"]["model"]["model_type"], "qwen2_5_vl");
    assert_eq!(written["trunk"]["freeze_vision"], true);
    let loaded = Checkpoint::<Vla>::load_kind(&dir, Device::Cpu).unwrap();
    assert_eq!(loaded.model.config(), policy.model.config());
    let rows = Rows::new(3);
    let batch = rows.batch();
    let a = tch::no_grad(|| policy.model.logits(&batch)).unwrap();
    let b = tch::no_grad(|| loaded.model.logits(&batch)).unwrap();
    assert_eq!(max_diff(&a, &b), 0.0);
    // The trunk's weights are the model directory's.
    let theirs = embodyflow_hf::VlModel::load(vlm(), Device::Cpu).unwrap();
    let name = "layers.1.mlp.up_proj.weight";
    let ours = &loaded.vars.variables()[&format!("{}.{name}", Layout::CURRENT.language)];
    let language = theirs.net().layout().language;
    let stored = &theirs.var_store().variables()[&format!("{language}.{name}")];
    assert_eq!(max_diff(ours, stored), 0.0);
    // The frozen tower stays frozen after a reload.
    let frozen = &loaded.vars.variables()["model.visual.blocks.0.mlp.up_proj.weight"];
    assert!(!frozen.requires_grad());
}

/// With `freeze_vision` an update step leaves every vision parameter as it
/// was and moves the language model; without it the vision tower moves.
#[test]
fn a_frozen_vision_tower_does_not_change_in_an_update() {
    let rows = Rows::new(3);
    let batch = rows.batch();
    for freeze in [true, false] {
        let policy = vla_on_vlm(ActionTokens::Vocab, freeze, None);
        let before: Vec<(String, Tensor)> = policy
            .vars
            .variables()
            .into_iter()
            .map(|(n, t)| (n, t.detach().copy()))
            .collect();
        let k = policy.model.config().n_action_tokens() as usize;
        let targets: Vec<Vec<u32>> = (0..3).map(|r| vec![(40 * r) as u32; k]).collect();
        let targets: Vec<&[u32]> = targets.iter().map(Vec::as_slice).collect();
        let mut optimizer = AdamW::new(AdamWConfig::default(), OptimizerState::fresh("sft"));
        optimizer.zero_grad(&policy.vars);
        policy
            .model
            .bc_loss(&batch, &targets, None)
            .unwrap()
            .backward();
        optimizer.step(&policy.vars);
        let after = policy.vars.variables();
        let moved = |prefix: &str| {
            before
                .iter()
                .filter(|(n, _)| n.starts_with(prefix))
                .any(|(n, t)| max_diff(t, &after[n]) > 0.0)
        };
        assert_eq!(moved("model.visual."), !freeze, "freeze_vision = {freeze}");
        assert!(moved("model.language_model."), "freeze_vision = {freeze}");
        assert!(moved("proprio_embed."), "freeze_vision = {freeze}");
    }
}

/// A trunk config that disagrees with the VLA's fields or with itself is
/// refused, naming the keys.
#[test]
fn trunk_configs_are_checked() {
    let policy = vla_on_vlm(ActionTokens::Head, false, None);
    let good = policy.model.config().clone();
    let refused = |edit: &dyn Fn(&mut VlaConfig), needle: &str| {
        let mut config = good.clone();
        edit(&mut config);
        let error = <Vla as PolicyNet>::check(&config).unwrap_err();
        assert!(error.contains(needle), "{needle}: {error}");
    };
    refused(
        &|c| c.n_embd = 64,
        "n_embd 64 differs from the trunk's (trunk.model) hidden_size 48",
    );
    refused(&|c| c.vocab_size = 300, "vocab_size 300");
    refused(&|c| c.channels = 4, "channels 4");
    refused(
        &|c| {
            let trunk = c.trunk.as_mut().unwrap();
            trunk.processor.insert("patch_size".into(), 8.into());
        },
        "trunk.processor",
    );
    refused(
        &|c| {
            let trunk = c.trunk.as_mut().unwrap();
            trunk.model.insert("model_type".into(), "qwen9_vl".into());
        },
        "qwen9_vl",
    );
    <Vla as PolicyNet>::check(&good).unwrap();
}

/// A tied Qwen3-VL (DeepStack features added after the first layers) as
/// the trunk: the action bins are rows of its token embedding, the sampled
/// log-probs are the rescored ones and a row does not depend on its batch.
#[test]
fn a_tied_qwen3_vl_trunk_samples_what_it_rescores() {
    let dir = tempfile::tempdir().unwrap();
    tiny_vlm(dir.path(), "qwen3_vl");
    let policy = {
        let _generator = seed(11);
        init_on_vlm(
            dir.path(),
            &shape(None),
            ActionTokens::Vocab,
            true,
            Device::Cpu,
        )
        .unwrap()
    };
    let variables = policy.vars.variables();
    assert!(
        variables
            .keys()
            .any(|n| n.contains("deepstack_merger_list"))
    );
    assert!(!variables.contains_key("lm_head.weight"), "tied");
    let rows = Rows::new(3);
    assert_samples_are_rescored(&policy, &rows.batch());
}
