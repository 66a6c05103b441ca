//! Our decoders against transformers on the same tiny random checkpoints:
//! `scripts/hf_golden.py make` creates them once per run (Qwen2 with q/k/v
//! biases in f32 and bf16, a sharded Qwen3 with q/k norms and head_dim !=
//! hidden/heads, a Llama with llama3 rope scaling and untied embeddings, a
//! tied Llama with linear scaling) with transformers' logits on a
//! left-padded batch and its greedy tokens. Needs the project venv with
//! transformers (`scripts/setup`); without it every test fails saying so.
//! The Qwen2 directory also holds Qwen2.5-Instruct's chat template and
//! conversations rendered by `apply_chat_template`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use embodyflow_core::{Classify, ErrorKind};
use embodyflow_hf::testing::{golden_script, max_diff_at_tokens, tensor_from_json as tensor};
use embodyflow_hf::{HfDecoder, HfError, KvCache};
use serde_json::Value;
use tch::{Device, Kind, Tensor};

const F32_MODELS: [&str; 4] = ["qwen2", "qwen3", "llama3", "llama-tied"];

/// The models and references, made once per test run.
fn fixture() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hf-golden");
        let _ = std::fs::remove_dir_all(&dir);
        golden_script(&["make", dir.to_str().unwrap()]);
        dir
    })
}

struct Golden {
    ids: Tensor,
    mask: Tensor,
    logits: Tensor,
    greedy: Tensor,
    eos: i64,
    pad: i64,
    max_new_tokens: i64,
}

fn golden(name: &str) -> Golden {
    let text = std::fs::read_to_string(fixture().join(name).join("golden.json")).unwrap();
    let g: Value = serde_json::from_str(&text).unwrap();
    Golden {
        ids: tensor(&g["input_ids"], Kind::Int64),
        mask: tensor(&g["attention_mask"], Kind::Int64),
        logits: tensor(&g["logits"], Kind::Double),
        greedy: tensor(&g["greedy"], Kind::Int64),
        eos: g["eos"].as_i64().unwrap(),
        pad: g["pad"].as_i64().unwrap(),
        max_new_tokens: g["max_new_tokens"].as_i64().unwrap(),
    }
}

fn load(name: &str) -> HfDecoder {
    HfDecoder::load(&fixture().join(name), Device::Cpu).unwrap()
}

#[test]
fn f32_logits_match_transformers_on_a_left_padded_batch() {
    for name in F32_MODELS {
        let g = golden(name);
        let model = load(name);
        assert_eq!(model.kind(), Kind::Float, "{name}");
        let logits = tch::no_grad(|| model.forward(&g.ids, &g.mask)).unwrap();
        assert_eq!(logits.size(), g.logits.size(), "{name}");
        let diff = max_diff_at_tokens(&logits, &g.logits, &g.mask);
        // The logits spread over whole units, so 1e-4 is a strict bound.
        let spread = g.logits.std(false).double_value(&[]);
        println!("{name}: max |diff| {diff:.2e} (logit std {spread:.2})");
        assert!(spread > 0.5, "{name}: logits too flat to test ({spread})");
        assert!(diff <= 1e-4, "{name}: max |diff| {diff}");
    }
}

#[test]
fn bf16_logits_match_transformers_within_bf16_rounding() {
    let g = golden("qwen2-bf16");
    let model = load("qwen2-bf16");
    assert_eq!(model.kind(), Kind::BFloat16);
    let logits = tch::no_grad(|| model.forward(&g.ids, &g.mask)).unwrap();
    assert_eq!(logits.kind(), Kind::BFloat16);
    let diff = max_diff_at_tokens(&logits, &g.logits, &g.mask);
    // Both sides run the same libtorch ops on the same bf16 weights (measured
    // difference 0 here), but reductions inside a kernel may split
    // differently with another thread count (the script runs on one thread),
    // and one bf16 rounding (8 significant bits) going the other way shows
    // in the logits as one ulp of their magnitude: the bound is one ulp of
    // the largest logit, 2^(floor(log2 max) - 7).
    let max = g.logits.abs().max().double_value(&[]);
    let bound = 2f64.powi(max.log2().floor() as i32 - 7);
    println!("qwen2-bf16: max |diff| {diff:.3e}, bound {bound:.3e} (max |logit| {max:.2})");
    assert!(diff <= bound, "bf16 max |diff| {diff} > {bound}");
}

#[test]
fn greedy_tokens_equal_generate() {
    for name in F32_MODELS.iter().chain(&["qwen2-bf16"]) {
        let g = golden(name);
        let model = load(name);
        let tokens = model
            .greedy(&g.ids, &g.mask, g.max_new_tokens, Some(g.eos), g.pad)
            .unwrap();
        assert_eq!(tokens.size(), g.greedy.size(), "{name}");
        assert!(tokens.equal(&g.greedy), "{name}: {tokens} vs {}", g.greedy);
        // Row 0 meets eos at its third token, then pads.
        assert_eq!(tokens.int64_value(&[0, 2]), g.eos, "{name}");
    }
}

#[test]
fn kv_cache_decoding_equals_the_full_forward() {
    let g = golden("qwen3");
    let model = load("qwen3");
    let (b, t) = g.ids.size2().unwrap();
    let next = Tensor::from_slice(&[5i64, 6, 7]).view([b, 1]);
    let ids = Tensor::cat(&[&g.ids, &next], 1);
    let mask = Tensor::cat(
        &[&g.mask, &Tensor::ones([b, 1], (Kind::Int64, Device::Cpu))],
        1,
    );
    let _guard = tch::no_grad_guard();
    let full = model.forward(&ids, &mask).unwrap();
    let mut cache = KvCache::default();
    let prompt = model.forward_cached(&g.ids, &g.mask, &mut cache).unwrap();
    assert_eq!(cache.len(), t);
    let step = model.forward_cached(&next, &mask, &mut cache).unwrap();
    assert_eq!(cache.len(), t + 1);
    let d1 = max_diff_at_tokens(
        &prompt,
        &full.narrow(1, 0, t).to_kind(Kind::Double),
        &g.mask,
    );
    let d2 = (step - full.narrow(1, t, 1)).abs().max().double_value(&[]);
    assert!(d1 <= 1e-5 && d2 <= 1e-5, "cache vs full: {d1} {d2}");
    // A mask that does not cover the cache is refused, naming the shapes.
    let err = model
        .forward_cached(&next, &g.mask, &mut cache)
        .unwrap_err();
    assert!(err.to_string().contains("8 cached + 1 new"), "{err}");
}

#[test]
fn a_left_padded_row_has_its_unpadded_logits() {
    // Row 2 holds 3 tokens after 4 pads; alone it has positions 0..3 too.
    let g = golden("llama3");
    let model = load("llama3");
    let _guard = tch::no_grad_guard();
    let padded = model
        .forward(&g.ids, &g.mask)
        .unwrap()
        .get(2)
        .narrow(0, 4, 3);
    let row = g.ids.get(2).narrow(0, 4, 3).unsqueeze(0);
    let alone = model.forward(&row, &row.ones_like()).unwrap().get(0);
    let diff = (padded - alone).abs().max().double_value(&[]);
    assert!(diff <= 1e-5, "padded vs alone: {diff}");
}

/// One SGD step of next-token cross-entropy on the golden batch's tokens.
fn train_step(model: &HfDecoder, g: &Golden) {
    use tch::nn::OptimizerConfig;
    let mut opt = tch::nn::Sgd::default()
        .build(model.var_store(), 0.5)
        .unwrap();
    let logits = model.forward(&g.ids, &g.mask).unwrap();
    let (b, t) = g.ids.size2().unwrap();
    let v = model.config().vocab_size;
    let targets = g.ids.narrow(1, 1, t - 1);
    let keep = g.mask.narrow(1, 1, t - 1).ne(0);
    let targets = targets.masked_fill(&keep.logical_not(), -100);
    let loss = logits
        .narrow(1, 0, t - 1)
        .reshape([b * (t - 1), v])
        .cross_entropy_loss::<Tensor>(
            &targets.reshape([-1]),
            None,
            tch::Reduction::Mean,
            -100,
            0.0,
        );
    opt.backward_step(&loss);
}

#[test]
fn a_trained_model_saved_here_loads_in_transformers_with_the_same_logits() {
    let g = golden("qwen3");
    let model = load("qwen3");
    let before = tch::no_grad(|| model.forward(&g.ids, &g.mask)).unwrap();
    train_step(&model, &g);
    let after = tch::no_grad(|| model.forward(&g.ids, &g.mask)).unwrap();
    let moved = max_diff_at_tokens(&after, &before.to_kind(Kind::Double), &g.mask);
    assert!(moved > 1e-2, "the step changed nothing ({moved})");
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("qwen3-trained");
    model.save(&saved).unwrap();
    // Ours again: identical.
    let reloaded = HfDecoder::load(&saved, Device::Cpu).unwrap();
    let again = tch::no_grad(|| reloaded.forward(&g.ids, &g.mask)).unwrap();
    assert!(again.equal(&after));
    // transformers: the same logits.
    let input = dir.path().join("input.json");
    let ids: Vec<Vec<i64>> = Vec::try_from(&g.ids).unwrap();
    let mask: Vec<Vec<i64>> = Vec::try_from(&g.mask).unwrap();
    std::fs::write(
        &input,
        serde_json::json!({"input_ids": ids, "attention_mask": mask}).to_string(),
    )
    .unwrap();
    let output = dir.path().join("logits.json");
    golden_script(&[
        "logits",
        saved.to_str().unwrap(),
        input.to_str().unwrap(),
        output.to_str().unwrap(),
    ]);
    let theirs: Value = serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap();
    assert_eq!(theirs["dtype"], "torch.float32");
    let diff = max_diff_at_tokens(&after, &tensor(&theirs["logits"], Kind::Double), &g.mask);
    println!("trained qwen3 through transformers: max |diff| {diff:.2e}");
    assert!(diff <= 1e-4, "max |diff| {diff}");
}

#[test]
fn a_tied_model_saves_without_lm_head_and_reloads() {
    let g = golden("llama-tied");
    let model = load("llama-tied");
    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let header = safetensors_header(&dir.path().join("model.safetensors"));
    assert!(header.get("lm_head.weight").is_none());
    assert_eq!(header["__metadata__"]["format"], "pt");
    let reloaded = HfDecoder::load(dir.path(), Device::Cpu).unwrap();
    let _guard = tch::no_grad_guard();
    assert!(
        reloaded
            .forward(&g.ids, &g.mask)
            .unwrap()
            .equal(&model.forward(&g.ids, &g.mask).unwrap())
    );
}

// ---- bad input: typed errors naming the file and key ----

fn copy_model(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture().join(name)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    dir
}

fn safetensors_header(file: &Path) -> serde_json::Map<String, Value> {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    serde_json::from_slice(&bytes[8..8 + n]).unwrap()
}

/// Rewrites a safetensors file through `edit(header, data)`.
fn rewrite(file: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>, &mut Vec<u8>)) {
    let bytes = std::fs::read(file).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Map<String, Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut data = bytes[8 + n..].to_vec();
    edit(&mut header, &mut data);
    let head = serde_json::to_vec(&header).unwrap();
    let mut out = (head.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&head);
    out.extend_from_slice(&data);
    std::fs::write(file, out).unwrap();
}

fn load_err(dir: &Path) -> HfError {
    let err = HfDecoder::load(dir, Device::Cpu).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadInput, "{err}");
    err
}

#[test]
fn unsupported_model_type_names_the_config_and_value() {
    let dir = copy_model("qwen2");
    let file = dir.path().join("config.json");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, text.replace("\"qwen2\"", "\"mistral\"")).unwrap();
    let err = load_err(dir.path());
    assert!(
        matches!(err, HfError::UnsupportedArchitecture { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(file.to_str().unwrap()) && text.contains("mistral") && text.contains("qwen3"),
        "{text}"
    );
}

#[test]
fn a_missing_shard_is_named_with_its_index() {
    let dir = copy_model("qwen3");
    std::fs::remove_file(dir.path().join("model-00003-of-00007.safetensors")).unwrap();
    let err = load_err(dir.path());
    assert!(matches!(err, HfError::MissingShard { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("model-00003-of-00007.safetensors")
            && text.contains("model.safetensors.index.json"),
        "{text}"
    );
}

#[test]
fn a_tensor_of_the_wrong_shape_or_missing_is_named() {
    // The config says a narrower MLP than the weights hold.
    let dir = copy_model("qwen2");
    let file = dir.path().join("config.json");
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("\"intermediate_size\": 96", "\"intermediate_size\": 80"),
    )
    .unwrap();
    let err = load_err(dir.path());
    assert!(matches!(err, HfError::WrongShape { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("model.layers.0.mlp.down_proj.weight")
            && text.contains("[48, 96]")
            && text.contains("[48, 80]"),
        "{text}"
    );
    // The untied head dropped from the file.
    let dir = copy_model("qwen2");
    rewrite(&dir.path().join("model.safetensors"), |header, _| {
        header.remove("lm_head.weight");
    });
    let err = load_err(dir.path()).to_string();
    assert!(
        err.contains("`lm_head.weight` is missing") && err.contains("model.safetensors"),
        "{err}"
    );
}

/// Sizes no weights hold (a vocabulary of 2^40 rows, a width of 2^31, 10^9
/// layers) are refused on the weights' headers, naming the tensor, the file
/// and the config keys, before any parameter is allocated (allocating them
/// aborted the process).
#[test]
fn absurd_sizes_in_config_json_are_refused_before_allocating() {
    for (key, value, tensor) in [
        (
            "vocab_size",
            1i64 << 40,
            "`model.embed_tokens.weight` has shape",
        ),
        (
            "hidden_size",
            1 << 31,
            "`model.embed_tokens.weight` has shape",
        ),
        (
            "intermediate_size",
            1 << 40,
            "`model.layers.0.mlp.down_proj.weight` has shape",
        ),
        (
            "num_hidden_layers",
            1_000_000_000,
            "`model.layers.2.input_layernorm.weight` is missing",
        ),
    ] {
        let dir = copy_model("qwen2");
        let file = dir.path().join("config.json");
        let mut config: Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        config[key] = Value::from(value);
        std::fs::write(&file, config.to_string()).unwrap();
        let err = load_err(dir.path()).to_string();
        assert!(
            err.contains(tensor) && err.contains("model.safetensors") && err.contains(key),
            "{key}: {err}"
        );
    }
}

#[test]
fn an_unsupported_dtype_is_named_with_its_tensor() {
    let dir = copy_model("qwen2");
    let name = "model.layers.1.mlp.up_proj.weight";
    rewrite(&dir.path().join("model.safetensors"), |header, data| {
        // One byte per element, appended at the end of the data.
        let shape = header[name]["shape"].clone();
        let numel: u64 = shape
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_u64().unwrap())
            .product();
        let begin = data.len();
        data.resize(begin + numel as usize, 0);
        header.insert(
            name.into(),
            serde_json::json!({"dtype": "F8_E4M3", "shape": shape, "data_offsets": [begin, data.len()]}),
        );
    });
    let err = load_err(dir.path());
    assert!(matches!(err, HfError::UnsupportedDtype { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(name) && text.contains("F8_E4M3") && text.contains("model.safetensors"),
        "{text}"
    );
}

#[test]
fn a_batch_the_model_cannot_run_is_refused() {
    let g = golden("qwen2");
    let model = load("qwen2");
    let too_big = g.ids.full_like(160);
    let err = model.forward(&too_big, &g.mask).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadInput);
    assert!(err.to_string().contains("[0, 160)"), "{err}");
    let err = model.forward(&g.ids, &(&g.mask * 2)).unwrap_err();
    assert!(err.to_string().contains("other than 0 and 1"), "{err}");
}

#[test]
fn chat_template_renders_as_apply_chat_template() {
    let dir = fixture().join("qwen2");
    let template = embodyflow_hf::chat::ChatTemplate::from_dir(&dir).unwrap();
    let chats: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("chat.json")).unwrap()).unwrap();
    let chats = chats.as_array().unwrap();
    assert_eq!(chats.len(), 3);
    for chat in chats {
        let tools = chat["tools"].as_array().map(|_| &chat["tools"]);
        let text = template.render(&chat["messages"], tools, true).unwrap();
        assert_eq!(text, chat["text"].as_str().unwrap());
    }
}
