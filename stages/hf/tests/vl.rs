//! Our vision-language models and image processor against transformers on
//! the same tiny random checkpoints: `scripts/hf_vl_golden.py make` creates
//! them once per run (Qwen2.5-VL with window and full attention blocks,
//! Qwen3-VL with DeepStack, each untied and tied), the processor's pixel
//! tensors for three images (two resized up to multiples of patch × merge,
//! one scaled down under max_pixels), and transformers' logits and greedy
//! tokens on batches with no image, one image, and rows of 2, 1 and 0
//! images, left-padded. The logits are compared given the processor's pixel
//! tensor; our processor's pixel tensor is compared with the processor's
//! separately. Needs the project venv with transformers (`scripts/setup`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use embodyflow_core::{Classify, ErrorKind};
use embodyflow_hf::image::{ImageProcessor, RgbImage};
use embodyflow_hf::testing::{max_diff_at_tokens, tensor_from_json, vl_golden_script};
use embodyflow_hf::{HfError, Images, VlModel};
use serde_json::Value;
use tch::{Device, Kind, Tensor};

const MODELS: [&str; 4] = ["qwen2_5_vl", "qwen2_5_vl-tied", "qwen3_vl", "qwen3_vl-tied"];

fn fixture() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hf-vl-golden");
        let _ = std::fs::remove_dir_all(&dir);
        vl_golden_script(&["make", dir.to_str().unwrap()]);
        dir
    })
}

fn golden(name: &str) -> Value {
    let text = std::fs::read_to_string(fixture().join(name).join("golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn load(name: &str) -> VlModel {
    VlModel::load(&fixture().join(name), Device::Cpu).unwrap()
}

fn grid(value: &Value) -> [i64; 3] {
    let v: Vec<i64> = value
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect();
    [v[0], v[1], v[2]]
}

/// The processor's pixel tensor of the images a batch uses, in order.
fn their_images(g: &Value, batch: &Value) -> Option<Images> {
    let used: Vec<usize> = batch["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as usize)
        .collect();
    if used.is_empty() {
        return None;
    }
    let processed = &g["pixel_values"];
    let pixels: Vec<Tensor> = used
        .iter()
        .map(|&i| tensor_from_json(&processed[i]["pixel_values"], Kind::Float))
        .collect();
    Some(Images {
        pixel_values: Tensor::cat(&pixels, 0),
        grid_thw: used
            .iter()
            .map(|&i| grid(&processed[i]["image_grid_thw"][0]))
            .collect(),
    })
}

fn raw_image(value: &Value) -> RgbImage {
    let rows = value.as_array().unwrap();
    let (h, w) = (rows.len(), rows[0].as_array().unwrap().len());
    let data: Vec<u8> = rows
        .iter()
        .flat_map(|r| r.as_array().unwrap().iter())
        .flat_map(|px| {
            px.as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_u64().unwrap() as u8)
        })
        .collect();
    RgbImage::new(h, w, data).unwrap()
}

fn ids_and_mask(batch: &Value) -> (Tensor, Tensor) {
    (
        tensor_from_json(&batch["input_ids"], Kind::Int64),
        tensor_from_json(&batch["attention_mask"], Kind::Int64),
    )
}

/// One golden batch with what the model needs to run it.
struct Batch<'a> {
    name: String,
    golden: &'a Value,
    ids: Tensor,
    mask: Tensor,
    images: Option<Images>,
}

/// Runs `check(model, batch)` on every model and batch.
fn for_each_batch(check: impl Fn(&VlModel, &Batch)) {
    for name in MODELS {
        let g = golden(name);
        let model = load(name);
        for golden in g["batches"].as_array().unwrap() {
            let (ids, mask) = ids_and_mask(golden);
            let batch = Batch {
                name: format!("{name} {}", golden["name"]),
                golden,
                ids,
                mask,
                images: their_images(&g, golden),
            };
            check(&model, &batch);
        }
    }
}

#[test]
fn logits_match_transformers_with_0_1_and_2_images_and_padding() {
    for_each_batch(|model, b| {
        let logits = tch::no_grad(|| model.forward(&b.ids, &b.mask, b.images.as_ref())).unwrap();
        let theirs = tensor_from_json(&b.golden["logits"], Kind::Double);
        assert_eq!(logits.size(), theirs.size(), "{}", b.name);
        let diff = max_diff_at_tokens(&logits, &theirs, &b.mask);
        let spread = theirs.std(false).double_value(&[]);
        println!("{}: max |diff| {diff:.2e} (logit std {spread:.2})", b.name);
        assert!(
            spread > 0.5,
            "{}: logits too flat to test ({spread})",
            b.name
        );
        assert!(diff <= 1e-4, "{}: max |diff| {diff}", b.name);
    });
}

#[test]
fn greedy_tokens_equal_generate() {
    for_each_batch(|model, b| {
        let theirs = tensor_from_json(&b.golden["greedy"], Kind::Int64);
        let ours = model
            .greedy(
                &b.ids,
                &b.mask,
                b.images.as_ref(),
                b.golden["max_new_tokens"].as_i64().unwrap(),
                b.golden["eos"].as_i64(),
                b.golden["pad"].as_i64().unwrap(),
            )
            .unwrap();
        assert!(ours.equal(&theirs), "{}: {ours} vs {theirs}", b.name);
    });
}

/// Our pixel tensor equals the processor's exactly (Pillow's bicubic
/// resampling reproduced in fixed point), for images resized up and down.
#[test]
fn the_image_processor_matches_transformers_exactly() {
    for name in ["qwen2_5_vl", "qwen3_vl"] {
        let g = golden(name);
        let dir = fixture().join(name);
        let model = load(name);
        let processor = ImageProcessor::for_model(&dir, model.config()).unwrap();
        for (i, image) in g["images"].as_array().unwrap().iter().enumerate() {
            let ours = processor.process(&[raw_image(image)]).unwrap();
            let theirs = &g["pixel_values"][i];
            assert_eq!(
                ours.grid_thw,
                [grid(&theirs["image_grid_thw"][0])],
                "image {i}"
            );
            let expected = tensor_from_json(&theirs["pixel_values"], Kind::Float);
            let diff = (&ours.pixel_values - &expected)
                .abs()
                .max()
                .double_value(&[]);
            println!("{name} image {i}: max |diff| {diff:e}");
            assert_eq!(diff, 0.0, "{name} image {i}");
        }
    }
}

/// One placeholder per image in the prompt expands to the processor's
/// count, and the whole pipeline (our processor, our expansion) gives the
/// reference logits.
#[test]
fn prompts_expand_as_the_processor_expands_them() {
    let name = "qwen2_5_vl";
    let g = golden(name);
    let model = load(name);
    let processor = ImageProcessor::for_model(&fixture().join(name), model.config()).unwrap();
    let raw: Vec<RgbImage> = g["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(raw_image)
        .collect();
    let batch = &g["batches"][2];
    assert_eq!(batch["name"], "mixed");
    let used: Vec<usize> = batch["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as usize)
        .collect();
    let images = processor
        .process(&used.iter().map(|&i| raw[i].clone()).collect::<Vec<_>>())
        .unwrap();
    let (ids, mask) = ids_and_mask(batch);
    let mut taken = 0;
    for (row, prompt) in batch["prompts"].as_array().unwrap().iter().enumerate() {
        let prompt: Vec<i64> = prompt
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_i64().unwrap())
            .collect();
        let n = prompt
            .iter()
            .filter(|&&t| t == model.config().image_token_id)
            .count();
        let expanded = model
            .net()
            .expand_image_tokens(&prompt, &images.grid_thw[taken..taken + n])
            .unwrap();
        taken += n;
        let row_ids: Vec<i64> = Vec::try_from(&ids.get(row as i64)).unwrap();
        assert_eq!(
            row_ids[row_ids.len() - expanded.len()..],
            expanded[..],
            "row {row}"
        );
    }
    let logits = tch::no_grad(|| model.forward(&ids, &mask, Some(&images))).unwrap();
    let diff = max_diff_at_tokens(
        &logits,
        &tensor_from_json(&batch["logits"], Kind::Double),
        &mask,
    );
    assert!(diff <= 1e-4, "max |diff| {diff}");
}

/// One SGD step, saved here, loaded by transformers: the same logits.
#[test]
fn a_trained_model_saved_here_loads_in_transformers_with_the_same_logits() {
    use tch::nn::OptimizerConfig;
    for name in ["qwen2_5_vl", "qwen3_vl-tied"] {
        let g = golden(name);
        let model = load(name);
        let batch = &g["batches"][2];
        let (ids, mask) = ids_and_mask(batch);
        let images = their_images(&g, batch).unwrap();
        let mut opt = tch::nn::Sgd::default()
            .build(model.var_store(), 0.1)
            .unwrap();
        let logits = model.forward(&ids, &mask, Some(&images)).unwrap();
        let (b, t) = ids.size2().unwrap();
        let vocab = model.config().text.vocab_size;
        let targets = ids
            .narrow(1, 1, t - 1)
            .masked_fill(&mask.narrow(1, 1, t - 1).eq(0), -100);
        let loss = logits
            .narrow(1, 0, t - 1)
            .reshape([b * (t - 1), vocab])
            .cross_entropy_loss::<Tensor>(
                &targets.reshape([-1]),
                None,
                tch::Reduction::Mean,
                -100,
                0.0,
            );
        opt.backward_step(&loss);
        let after = tch::no_grad(|| model.forward(&ids, &mask, Some(&images))).unwrap();
        let moved = max_diff_at_tokens(&after, &logits.detach().to_kind(Kind::Double), &mask);
        assert!(moved > 1e-2, "{name}: the step changed nothing ({moved})");
        let dir = tempfile::tempdir().unwrap();
        let saved = dir.path().join("trained");
        model.save(&saved).unwrap();
        let input = dir.path().join("input.json");
        let as_list = |t: &Tensor| -> Value {
            let rows: Vec<Vec<f64>> = Vec::try_from(&t.to_kind(Kind::Double)).unwrap();
            serde_json::json!(rows)
        };
        std::fs::write(
            &input,
            serde_json::json!({
                "input_ids": as_list(&ids), "attention_mask": as_list(&mask),
                "pixel_values": as_list(&images.pixel_values), "image_grid_thw": images.grid_thw,
            })
            .to_string(),
        )
        .unwrap();
        let output = dir.path().join("logits.json");
        vl_golden_script(&[
            "logits",
            saved.to_str().unwrap(),
            input.to_str().unwrap(),
            output.to_str().unwrap(),
        ]);
        let theirs: Value =
            serde_json::from_str(&std::fs::read_to_string(&output).unwrap()).unwrap();
        let diff = max_diff_at_tokens(
            &after,
            &tensor_from_json(&theirs["logits"], Kind::Double),
            &mask,
        );
        println!("{name} trained, through transformers: max |diff| {diff:.2e}");
        assert!(diff <= 1e-4, "{name}: max |diff| {diff}");
    }
}

// ---- bad input: typed errors naming the file and key ----

fn copy_model(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture().join(name)).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "golden.json" {
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
    }
    dir
}

fn edit_json(file: &Path, edit: impl FnOnce(&mut Value)) {
    let mut value: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(file, value.to_string()).unwrap();
}

fn load_err(dir: &Path) -> String {
    let err = VlModel::load(dir, Device::Cpu).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadInput, "{err}");
    err.to_string()
}

#[test]
fn unsupported_model_type_or_vision_config_names_file_and_key() {
    let dir = copy_model("qwen2_5_vl");
    let file = dir.path().join("config.json");
    edit_json(&file, |c| c["model_type"] = "qwen2_vl".into());
    let err = load_err(dir.path());
    assert!(
        err.contains(file.to_str().unwrap())
            && err.contains("qwen2_vl")
            && err.contains("qwen3_vl"),
        "{err}"
    );
    for (key, value, expect) in [
        (
            "hidden_act",
            Value::from("relu"),
            "vision_config.hidden_act",
        ),
        (
            "out_hidden_size",
            Value::from(64),
            "vision_config.out_hidden_size",
        ),
        (
            "fullatt_block_indexes",
            serde_json::json!([5]),
            "vision_config.fullatt_block_indexes",
        ),
        ("window_size", Value::from(4), "vision_config.window_size"),
    ] {
        let dir = copy_model("qwen2_5_vl");
        let file = dir.path().join("config.json");
        edit_json(&file, |c| c["vision_config"][key] = value);
        let err = load_err(dir.path());
        assert!(
            err.contains(file.to_str().unwrap()) && err.contains(expect),
            "{key}: {err}"
        );
    }
    let dir = copy_model("qwen3_vl");
    let file = dir.path().join("config.json");
    edit_json(&file, |c| {
        c["text_config"]["rope_parameters"]["mrope_section"] = serde_json::json!([4, 4, 4]);
    });
    let err = load_err(dir.path());
    assert!(
        err.contains("mrope_section") && err.contains("sums to 12"),
        "{err}"
    );
}

#[test]
fn a_processor_config_the_model_does_not_match_names_file_and_key() {
    let dir = copy_model("qwen3_vl");
    let file = dir.path().join("preprocessor_config.json");
    edit_json(&file, |c| c["patch_size"] = 14.into());
    let model = load("qwen3_vl");
    let err = ImageProcessor::for_model(dir.path(), model.config()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadInput);
    let text = err.to_string();
    assert!(
        text.contains(file.to_str().unwrap()) && text.contains("`patch_size` is 14"),
        "{text}"
    );
    edit_json(&file, |c| c["resample"] = 2.into());
    let err = ImageProcessor::from_file(&file).unwrap_err().to_string();
    assert!(err.contains("`resample` is 2"), "{err}");
}

#[test]
fn an_image_outside_min_max_pixels_is_refused_naming_the_processor() {
    let model = load("qwen2_5_vl");
    let dir = fixture().join("qwen2_5_vl");
    let processor = ImageProcessor::for_model(&dir, model.config()).unwrap();
    // 8 × 1200 pixels: the floor rule leaves one 8-pixel column and still
    // more than max_pixels (4096).
    let image = RgbImage::new(1200, 8, vec![0; 1200 * 8 * 3]).unwrap();
    let err = processor.process(&[image]).unwrap_err();
    assert!(matches!(err, HfError::BadImage { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("preprocessor_config.json")
            && text.contains("image 0")
            && text.contains("`max_pixels`"),
        "{text}"
    );
}

#[test]
fn placeholders_that_do_not_match_the_images_are_refused() {
    let name = "qwen3_vl";
    let g = golden(name);
    let model = load(name);
    // The text batch with an image: no placeholder takes it.
    let text = &g["batches"][0];
    let (ids, mask) = ids_and_mask(text);
    let one = their_images(&g, &g["batches"][1]).unwrap();
    let err = model.forward(&ids, &mask, Some(&one)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BadInput);
    assert!(
        err.to_string().contains("take 0 images, 1 were given"),
        "{err}"
    );
    // The one-image batch without its image, and with a placeholder cut.
    let batch = &g["batches"][1];
    let (ids, mask) = ids_and_mask(batch);
    let err = model.forward(&ids, &mask, None).unwrap_err().to_string();
    assert!(err.contains("beyond the 0 images given"), "{err}");
    let t = ids.size()[1];
    let first = Vec::<i64>::try_from(&ids.get(0))
        .unwrap()
        .iter()
        .position(|&x| x == 192)
        .unwrap() as i64;
    let cut = Tensor::cat(
        &[
            ids.narrow(1, 0, first + 1),
            ids.narrow(1, first + 2, t - first - 2),
        ],
        1,
    );
    let err = model
        .forward(&cut, &cut.ones_like(), Some(&one))
        .unwrap_err()
        .to_string();
    assert!(err.contains("needs 30"), "{err}");
}
