//! Our vision-language model against transformers on the same CPU, batch
//! and thread count: the tiny random Qwen2.5-VL and Qwen3-VL of
//! `scripts/hf_vl_golden.py make` (2 vision and 2 language layers), greedy
//! decoding of 32 new tokens on the golden batch "mixed" (rows with 2, 1 and
//! 0 images, left-padded; the vision encoder runs in the prefill), new
//! tokens / s. Ours and transformers' alternate twice (each one warm-up,
//! best of 3) so that a change of load shows in both. `--threads N` libtorch
//! threads (default 1). Prints `vl_<model>_greedy_tokens_per_s_<n>t ours N
//! transformers N ratio R` per round. Needs the project venv.

use std::path::Path;
use std::time::Instant;

use embodyflow_hf::testing::{tensor_from_json, vl_golden_script};
use embodyflow_hf::{Images, VlModel};
use tch::{Device, Kind, Tensor};

const NEW: i64 = 32;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: i32 = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
        .map_or(1, |n| n.parse().expect("--threads N"));
    tch::set_num_threads(threads);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hf-vl-bench");
    let _ = std::fs::remove_dir_all(&dir);
    vl_golden_script(&["make", dir.to_str().unwrap()]);
    for name in ["qwen2_5_vl", "qwen3_vl"] {
        let model_dir = dir.join(name);
        let golden: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(model_dir.join("golden.json")).unwrap())
                .unwrap();
        let batch = &golden["batches"][2];
        assert_eq!(batch["name"], "mixed");
        let ids = tensor_from_json(&batch["input_ids"], Kind::Int64);
        let mask = tensor_from_json(&batch["attention_mask"], Kind::Int64);
        let used: Vec<usize> = batch["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as usize)
            .collect();
        let pixels: Vec<Tensor> = used
            .iter()
            .map(|&i| tensor_from_json(&golden["pixel_values"][i]["pixel_values"], Kind::Float))
            .collect();
        let images = Images {
            pixel_values: Tensor::cat(&pixels, 0),
            grid_thw: used
                .iter()
                .map(|&i| {
                    let g = &golden["pixel_values"][i]["image_grid_thw"][0];
                    [0, 1, 2].map(|k| g[k].as_i64().unwrap())
                })
                .collect(),
        };
        let model = VlModel::load(&model_dir, Device::Cpu).unwrap();
        let rows = ids.size()[0];
        let ours = || {
            let run = || {
                let tokens = model
                    .greedy(&ids, &mask, Some(&images), NEW, None, 0)
                    .unwrap();
                assert_eq!(tokens.size(), [rows, NEW]);
            };
            run();
            let best = (0..3)
                .map(|_| {
                    let started = Instant::now();
                    run();
                    started.elapsed().as_secs_f64()
                })
                .fold(f64::INFINITY, f64::min);
            (rows * NEW) as f64 / best
        };
        let theirs = || {
            let out = vl_golden_script(&[
                "bench",
                model_dir.to_str().unwrap(),
                "mixed",
                &NEW.to_string(),
                &threads.to_string(),
            ]);
            let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
            v["greedy_tokens_per_s"].as_f64().unwrap()
        };
        println!(
            "# tiny {name}, batch \"mixed\" ({rows} rows, 3 images), {NEW} new tokens, {threads} thread(s)"
        );
        for _ in 0..2 {
            let (a, b) = (ours(), theirs());
            println!(
                "vl_{name}_greedy_tokens_per_s_{threads}t ours {a:.0} transformers {b:.0} ratio {:.2}",
                a / b
            );
        }
    }
}
