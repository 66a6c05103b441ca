#!/usr/bin/env python3
"""References for tests/integration/foreign_rollouts.rs (`table import`).

  trl_chat.py chat DIR SPEC.json OUT.json
      DIR holds a tokenizer.json; SPEC is {"template": ..., "eos_token": ...,
      "examples": [{"prompt": [...], "completion": [...],
      "chat_template_kwargs": {...}?}, ...]}. Saves the tokenizer with the
      template as transformers does (tokenizer_config.json,
      chat_template.jinja), reloads it with AutoTokenizer and writes, per
      example, TRL's rendering (prompt, completion) and their token ids
      (tokenizer(text, add_special_tokens=False)).

  trl_chat.py parquet OUT.parquet ROWS.json
      Writes the rows (a JSON list of objects) with pyarrow's
      Table.from_pylist (types inferred: str -> string, int -> int64,
      float -> double, list of dicts -> list<struct>, None -> null).
"""
import json
import sys
from itertools import takewhile


def trl_apply_chat_template(example, tokenizer):
    """TRL's `apply_chat_template` (trl/data_utils.py at huggingface/trl
    commit f2cd5771), its prompt-completion case, transcribed: TRL is not
    installed in the project venv."""
    kwargs = example.get("chat_template_kwargs", {})
    last_role = example["prompt"][-1]["role"]
    if last_role in ["user", "tool"]:
        add_generation_prompt, continue_final_message = True, False
    elif last_role == "assistant":
        add_generation_prompt, continue_final_message = False, True
    else:
        raise ValueError(f"Invalid role in the last message: {last_role}")
    prompt = tokenizer.apply_chat_template(
        example["prompt"],
        tools=None,
        continue_final_message=continue_final_message,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
        **kwargs,
    )
    prompt_completion = tokenizer.apply_chat_template(
        example["prompt"] + example["completion"], tools=None, tokenize=False, **kwargs
    )
    prompt = "".join(x for x, _ in takewhile(lambda x: x[0] == x[1], zip(prompt, prompt_completion, strict=False)))
    return prompt, prompt_completion[len(prompt):]


def chat(directory, spec_file, out_file):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    with open(spec_file) as f:
        spec = json.load(f)
    fast = PreTrainedTokenizerFast(tokenizer_file=f"{directory}/tokenizer.json", eos_token=spec["eos_token"])
    fast.chat_template = spec["template"]
    fast.save_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    out = []
    for example in spec["examples"]:
        prompt, completion = trl_apply_chat_template(example, tokenizer)
        ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]
        out.append({"prompt": prompt, "completion": completion, "prompt_ids": ids(prompt), "completion_ids": ids(completion)})
    with open(out_file, "w") as f:
        json.dump(out, f, ensure_ascii=False)


def parquet(out_file, rows_file):
    import pyarrow as pa
    import pyarrow.parquet as pq

    with open(rows_file) as f:
        rows = json.load(f)
    pq.write_table(pa.Table.from_pylist(rows), out_file)


if __name__ == "__main__":
    {"chat": chat, "parquet": parquet}[sys.argv[1]](*sys.argv[2:])
