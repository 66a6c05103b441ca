#!/usr/bin/env python3
"""A tiny random Qwen2.5-VL for the tests of a VLA on a vision-language
trunk (embodyflow-models' vla::trunk, tests/integration/vla_trunk.rs).

  vla_trunk_fixture.py OUT TOKENIZER_JSON [FAMILY]

      Saves in OUT, with save_pretrained, hf_vl_golden.py's untied
      Qwen2.5-VL (2 vision blocks, one windowed and one full; 2 decoder
      layers of width 48, GQA 4 / 2 heads; M-RoPE sections [2, 2, 2]), or
      with FAMILY qwen3_vl its tied Qwen3-VL (DeepStack from both vision
      blocks, interleaved M-RoPE [4, 2, 2], q/k norms), with
      an embedding of 640 rows, randomised from seed 41, beside the image
      processor's preprocessor_config.json (patch 4, merge 2, 16^2 to 64^2
      pixels) and tokenizer.json: TOKENIZER_JSON (a BPE of ours) with
      <|vision_start|>, <|vision_end|> and <|image_pad|> added as special
      tokens, whose ids the config names. The tokenizer must leave the last
      256 rows free (the action bins as vocabulary ids).
"""
import os
import sys

import torch
import transformers
from tokenizers import AddedToken, Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_vl_golden import processor, qwen2_5_config, qwen3_config, randomize  # noqa: E402

SEED = 41
VOCAB = 640
SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>"]


def make(out, tokenizer_json, family="qwen2_5_vl"):
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    tokenizer = Tokenizer.from_file(tokenizer_json)
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in SPECIALS])
    if tokenizer.get_vocab_size() + 256 > VOCAB:
        sys.exit(f"{tokenizer_json}: {tokenizer.get_vocab_size()} tokens leave no 256 free rows of {VOCAB}")
    start, end, image = (tokenizer.token_to_id(t) for t in SPECIALS)
    config = qwen3_config(True) if family == "qwen3_vl" else qwen2_5_config(False)
    config.text_config.vocab_size = VOCAB
    config.text_config.bos_token_id = None
    config.text_config.eos_token_id = None
    config.image_token_id = image
    config.vision_start_token_id = start
    config.vision_end_token_id = end
    # No video in these tests: the last id, never a text token.
    config.video_token_id = VOCAB - 1
    model = transformers.AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa")
    randomize(model, SEED)
    model.save_pretrained(out)
    processor().save_pretrained(out)
    tokenizer.save(os.path.join(out, "tokenizer.json"))


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    make(*sys.argv[1:])
