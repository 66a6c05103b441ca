#!/usr/bin/env python3
"""Reference outputs from transformers for the vision-language tests of
embodyflow-hf (stages/hf/tests/vl.rs).

  hf_vl_golden.py make OUT
      Creates tiny random Qwen2.5-VL and Qwen3-VL models with transformers
      (seeded) and saves each with save_pretrained under OUT/<name>/, beside
      the image processor's preprocessor_config.json and a golden.json:

        qwen2_5_vl        2 vision blocks (block 0 windowed, block 1 full),
                          SiLU MLP, RMSNorm, M-RoPE sections [2, 2, 2], GQA
                          4 heads / 2 kv heads, untied, f32
        qwen2_5_vl-tied   the same with tied embeddings
        qwen3_vl          2 vision blocks (LayerNorm, tanh-GELU MLP, learned
                          position grid 4 x 4 resampled bilinearly), both
                          feeding DeepStack, interleaved M-RoPE [4, 2, 2],
                          q/k norms, head_dim 16, untied, f32
        qwen3_vl-tied     the same with tied embeddings

      golden.json holds:
        images        the raw test images, uint8 [H][W][3] lists, of sizes
                      50x37, 70x30 (resized up to multiples of patch x merge)
                      and 100x90 (over max_pixels: scaled down)
        pixel_values  the processor's (Qwen2VLImageProcessorPil) output on
                      each image alone: {"pixel_values", "image_grid_thw"}
        batches       each {"name", "prompts", "input_ids", "attention_mask",
                      "images", "logits", "greedy", "eos", "pad",
                      "max_new_tokens"}: prompts (lists of ids, one
                      <|image_pad|> per image between <|vision_start|> and
                      <|vision_end|>) expanded as the processor expands them
                      (grid_t * grid_h * grid_w / merge^2 placeholders) and
                      left-padded; the indices of the images the batch uses,
                      in order; transformers' logits (float64) with the
                      processor's pixel tensor; generate(do_sample=False)'s
                      new tokens.
        The batches: "text" (no image, 3 rows, padded), "one" (one image),
        "mixed" (rows with 2, 1 and 0 images, left-padded).

  hf_vl_golden.py logits MODEL_DIR INPUT_JSON OUT_JSON
      Loads MODEL_DIR with AutoModelForImageTextToText and writes its logits
      on INPUT_JSON's input_ids / attention_mask / pixel_values /
      image_grid_thw (a model saved by us).

  hf_vl_golden.py bench MODEL_DIR BATCH NEW THREADS
      transformers' speed on golden.json's batch named BATCH of MODEL_DIR
      (made by `make`): generate(do_sample=False) of NEW tokens with the
      processor's pixel tensor (the vision encoder in the prefill), on
      THREADS torch threads, one warm-up, best of 3. Prints JSON
      {"greedy_tokens_per_s"}.

  hf_vl_golden.py process CONFIG_DIR INPUT_JSON OUT_JSON
      Runs CONFIG_DIR's image processor on INPUT_JSON's "images" (uint8
      [H][W][3] lists), each alone, and writes {"pixel_values",
      "image_grid_thw"} per image.

  hf_vl_golden.py plan-policy OUT TOKENIZER_JSON
      A tiny random Qwen2.5-VL plan policy saved with save_pretrained in OUT
      (the qwen2_5_vl text and vision sizes above, 1024 positions, the
      embedding padded to a multiple of 64): TOKENIZER_JSON (our household
      BPE) plus Qwen's chat and vision tokens, Qwen2-VL's chat template
      (image parts as <|vision_start|><|image_pad|><|vision_end|>), the
      processor above and a generation config ending at <|im_end|>. Prints
      JSON {"image_token_id", "prompt_ids"}: the template's ids of a user
      turn with one image and a text, placeholders unexpanded.
"""
import json
import os
import sys

import numpy as np
import torch
import transformers

PAD = 0
NEW_TOKENS = 6
VOCAB = 200
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = 190, 191, 192, 193
PATCH, MERGE, TEMPORAL = 4, 2, 2
MIN_PIXELS, MAX_PIXELS = 16 * 16, 64 * 64
IMAGE_SIZES = [(50, 37), (70, 30), (100, 90)]


def randomize(model, seed):
    """Weights large enough that logits differ by whole units between tokens,
    norms near 1 (as hf_golden.py)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name or "ln_q" in name:
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.25 * noise)


def processor():
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil(
        patch_size=PATCH, merge_size=MERGE, temporal_patch_size=TEMPORAL,
        min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS,
    )


def qwen2_5_config(tied):
    return transformers.Qwen2_5_VLConfig(
        text_config=dict(
            vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-6, tie_word_embeddings=tied,
            rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "mrope_section": [2, 2, 2]},
        ),
        vision_config=dict(
            depth=2, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=PATCH,
            spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL, window_size=16,
            out_hidden_size=48, fullatt_block_indexes=[1], hidden_act="silu",
        ),
        image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD,
        vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
        tie_word_embeddings=tied,
    )


def qwen3_config(tied):
    return transformers.Qwen3VLConfig(
        text_config=dict(
            vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
            rms_norm_eps=1e-6, tie_word_embeddings=tied,
            rope_parameters={
                "rope_type": "default", "rope_theta": 5000.0,
                "mrope_section": [4, 2, 2], "mrope_interleaved": True,
            },
        ),
        vision_config=dict(
            depth=2, hidden_size=32, intermediate_size=48, num_heads=2, patch_size=PATCH,
            spatial_merge_size=MERGE, temporal_patch_size=TEMPORAL, out_hidden_size=48,
            num_position_embeddings=16, deepstack_visual_indexes=[0, 1],
        ),
        image_token_id=IMAGE_PAD, video_token_id=VIDEO_PAD,
        vision_start_token_id=VISION_START, vision_end_token_id=VISION_END,
        tie_word_embeddings=tied,
    )


def images(seed):
    gen = np.random.default_rng(seed)
    return [gen.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for h, w in IMAGE_SIZES]


def process(proc, image):
    out = proc(images=[image], return_tensors="pt")
    return out["pixel_values"], out["image_grid_thw"]


def prompts(seed, layout):
    """Random text ids with one <|vision_start|><|image_pad|><|vision_end|>
    per image; layout: images per row."""
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for n_images in layout:
        row = torch.randint(1, VISION_START, (3,), generator=gen).tolist()
        for _ in range(n_images):
            row += [VISION_START, IMAGE_PAD, VISION_END]
            row += torch.randint(1, VISION_START, (2,), generator=gen).tolist()
        rows.append(row)
    return rows


def expand(row, grids):
    """The processor's placeholder expansion: each <|image_pad|> becomes
    t * h * w / merge^2 of them."""
    out, grids = [], iter(grids)
    for token in row:
        if token == IMAGE_PAD:
            t, h, w = next(grids)
            out += [IMAGE_PAD] * (t * h * w // MERGE**2)
        else:
            out.append(token)
    return out


def left_pad(rows):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return ids, mask


def model_inputs(ids, mask, pixels, grids):
    inputs = {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": (ids == IMAGE_PAD).int()}
    if pixels is not None:
        inputs["pixel_values"] = pixels
        inputs["image_grid_thw"] = grids
    return inputs


def logits_of(model, inputs):
    model.model.rope_deltas = None
    with torch.no_grad():
        if "pixel_values" not in inputs:
            # No image: the model would count padding in its positions
            # unless given them; get_rope_index gives generate's.
            positions, _ = model.model.get_rope_index(
                inputs["input_ids"], inputs["mm_token_type_ids"], attention_mask=inputs["attention_mask"]
            )
            inputs = {**inputs, "position_ids": positions}
        return model(**inputs).logits.double()


def greedy(model, inputs, eos):
    model.model.rope_deltas = None
    out = model.generate(
        **inputs, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=PAD, eos_token_id=eos,
    )
    return out[:, inputs["input_ids"].shape[1]:]


BATCHES = [("text", [0, 0, 0], []), ("one", [1], [0]), ("mixed", [2, 1, 0], [0, 2, 1])]


def make_one(out, name, config, seed, proc, raw):
    torch.manual_seed(seed)
    model = transformers.AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa")
    randomize(model, seed)
    path = os.path.join(out, name)
    model.save_pretrained(path)
    proc.save_pretrained(path)
    model = transformers.AutoModelForImageTextToText.from_pretrained(path, attn_implementation="sdpa").eval()
    processed = [process(proc, image) for image in raw]
    batches = []
    for i, (batch_name, layout, used) in enumerate(BATCHES):
        rows = prompts(seed + 10 + i, layout)
        grids = [processed[j][1][0].tolist() for j in used]
        # Each row consumes its images in order.
        expanded, k = [], 0
        for row, n in zip(rows, layout):
            expanded.append(expand(row, grids[k:k + n]))
            k += n
        ids, mask = left_pad(expanded)
        pixels = torch.cat([processed[j][0] for j in used]) if used else None
        grid = torch.cat([processed[j][1] for j in used]) if used else None
        inputs = model_inputs(ids, mask, pixels, grid)
        free = greedy(model, inputs, None)
        eos = int(free[0, 2])
        batches.append({
            "name": batch_name,
            "prompts": rows,
            "input_ids": ids.tolist(),
            "attention_mask": mask.tolist(),
            "images": used,
            "logits": logits_of(model, inputs).tolist(),
            "greedy": greedy(model, inputs, eos).tolist(),
            "eos": eos,
            "pad": PAD,
            "max_new_tokens": NEW_TOKENS,
        })
    golden = {
        "images": [image.tolist() for image in raw],
        "pixel_values": [
            {"pixel_values": p.tolist(), "image_grid_thw": g.tolist()} for p, g in processed
        ],
        "batches": batches,
    }
    with open(os.path.join(path, "golden.json"), "w") as f:
        json.dump(golden, f)


# Qwen2-VL-7B-Instruct's chat template (the Hub's tokenizer_config.json).
QWEN2_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}"
    "Picture {{ image_count.value }}: {% endif %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}"
    "Video {{ video_count.value }}: {% endif %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def plan_policy(out, tokenizer_json):
    from tokenizers import Tokenizer
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    torch.manual_seed(41)
    tok = Tokenizer.from_file(tokenizer_json)
    tok.add_special_tokens([
        "<|endoftext|>", "<|im_start|>", "<|im_end|>",
        "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
    ])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = QWEN2_VL_TEMPLATE
    ids = fast.convert_tokens_to_ids
    im_end, pad = ids("<|im_end|>"), ids("<|endoftext|>")
    config = qwen2_5_config(False)
    config.text_config.vocab_size = (len(fast) + 63) // 64 * 64
    config.text_config.max_position_embeddings = 1024
    config.text_config.eos_token_id = im_end
    config.text_config.pad_token_id = pad
    config.text_config.bos_token_id = None
    config.image_token_id = ids("<|image_pad|>")
    config.video_token_id = ids("<|video_pad|>")
    config.vision_start_token_id = ids("<|vision_start|>")
    config.vision_end_token_id = ids("<|vision_end|>")
    model = transformers.AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa")
    model.save_pretrained(out)
    fast.save_pretrained(out)
    processor().save_pretrained(out)
    GenerationConfig(eos_token_id=[im_end], pad_token_id=pad).save_pretrained(out)
    messages = [{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "Task: put the Mug in the Sink."},
    ]}]
    print(json.dumps({
        "image_token_id": config.image_token_id,
        "prompt_ids": fast.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        ),
    }))


def make(out):
    torch.set_num_threads(1)
    proc = processor()
    raw = images(5)
    make_one(out, "qwen2_5_vl", qwen2_5_config(False), 31, proc, raw)
    make_one(out, "qwen2_5_vl-tied", qwen2_5_config(True), 32, proc, raw)
    make_one(out, "qwen3_vl", qwen3_config(False), 33, proc, raw)
    make_one(out, "qwen3_vl-tied", qwen3_config(True), 34, proc, raw)


def logits(model_dir, input_json, out_json):
    torch.set_num_threads(1)
    with open(input_json) as f:
        given = json.load(f)
    model = transformers.AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    ids = torch.tensor(given["input_ids"], dtype=torch.long)
    mask = torch.tensor(given["attention_mask"], dtype=torch.long)
    pixels = grids = None
    if given.get("pixel_values"):
        pixels = torch.tensor(given["pixel_values"], dtype=torch.float32)
        grids = torch.tensor(given["image_grid_thw"], dtype=torch.long)
    inputs = model_inputs(ids, mask, pixels, grids)
    with open(out_json, "w") as f:
        json.dump({"logits": logits_of(model, inputs).tolist(), "dtype": str(model.dtype)}, f)


def process_images(config_dir, input_json, out_json):
    with open(input_json) as f:
        given = json.load(f)
    proc = transformers.AutoImageProcessor.from_pretrained(config_dir)
    out = []
    for image in given["images"]:
        p, g = process(proc, np.array(image, dtype=np.uint8))
        out.append({"pixel_values": p.tolist(), "image_grid_thw": g.tolist()})
    with open(out_json, "w") as f:
        json.dump(out, f)


def bench(model_dir, batch_name, new, threads):
    import time

    new, threads = int(new), int(threads)
    torch.set_num_threads(threads)
    with open(os.path.join(model_dir, "golden.json")) as f:
        golden = json.load(f)
    batch = next(b for b in golden["batches"] if b["name"] == batch_name)
    pixels = [golden["pixel_values"][i] for i in batch["images"]]
    inputs = model_inputs(
        torch.tensor(batch["input_ids"]), torch.tensor(batch["attention_mask"]),
        torch.tensor([r for p in pixels for r in p["pixel_values"]]) if pixels else None,
        torch.tensor([g for p in pixels for g in p["image_grid_thw"]]) if pixels else None,
    )
    model = transformers.AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="sdpa").eval()

    def run():
        model.model.rope_deltas = None
        with torch.no_grad():
            model.generate(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False,
                           pad_token_id=PAD, eos_token_id=None)

    run()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    rows = inputs["input_ids"].shape[0]
    print(json.dumps({"greedy_tokens_per_s": rows * new / min(times)}))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "logits":
        logits(*sys.argv[2:])
    elif len(sys.argv) == 6 and sys.argv[1] == "bench":
        bench(*sys.argv[2:])
    elif len(sys.argv) == 4 and sys.argv[1] == "plan-policy":
        plan_policy(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "process":
        process_images(*sys.argv[2:])
    else:
        sys.exit(__doc__)
