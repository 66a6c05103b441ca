#!/usr/bin/env python3
"""A tiny random Qwen2.5-VL for the tests of a VLA on a vision-language
trunk (embodyflow-models' vla::trunk, tests/integration/vla_trunk.rs).

  vla_trunk_fixture.py OUT VOCAB IMAGE_PAD VISION_START VISION_END

      Creates hf_vl_golden.py's untied Qwen2.5-VL (2 vision blocks, one
      windowed and one full; 2 decoder layers of width 48, GQA 4 / 2 heads;
      M-RoPE sections [2, 2, 2]) with an embedding of VOCAB rows and the
      given placeholder ids, randomised from seed 41, and saves it with
      save_pretrained in OUT beside the image processor's
      preprocessor_config.json (patch 4, merge 2, 16^2 to 64^2 pixels). The
      tokenizer is the caller's to write (its ids must fit in VOCAB).
"""
import os
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_vl_golden import processor, qwen2_5_config, randomize  # noqa: E402

SEED = 41


def make(out, vocab, image_pad, vision_start, vision_end):
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    config = qwen2_5_config(False)
    config.text_config.vocab_size = vocab
    config.image_token_id = image_pad
    config.vision_start_token_id = vision_start
    config.vision_end_token_id = vision_end
    # No video in these tests: the last id, never a text token.
    config.video_token_id = vocab - 1
    config.text_config.bos_token_id = None
    config.text_config.eos_token_id = None
    model = transformers.AutoModelForImageTextToText.from_config(config, attn_implementation="sdpa")
    randomize(model, SEED)
    model.save_pretrained(out)
    processor().save_pretrained(out)


if __name__ == "__main__":
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    make(sys.argv[1], *(int(x) for x in sys.argv[2:]))
