#!/usr/bin/env python3
"""Reference outputs from transformers for the embodyflow-hf tests (stages/hf/tests).

Two modes:

  hf_golden.py make OUT
      Creates tiny random decoders with transformers (seeded) and saves them in
      the Hugging Face layout under OUT/<name>/, each with OUT/<name>/golden.json:
      a left-padded prompt batch (input_ids, attention_mask), transformers'
      logits on it (float64 lists; position ids as generate computes them)
      and its greedy tokens (generate, do_sample=False) with the eos and pad
      ids used.

        qwen2        q/k/v biases, GQA 4 heads / 2 kv heads, untied, f32
        qwen2-bf16   the same weights saved and run in bf16
        qwen3        q/k norms, head_dim 16 != hidden/heads 12, sharded
                     (model.safetensors.index.json), f32
        llama3       rope_type llama3 (low, medium and high frequencies all
                     present), untied, attention and MLP biases, f32
        llama-tied   rope_type linear, tied embeddings, f32

      OUT/qwen2/ also gets a tokenizer with Qwen2.5-Instruct's chat template
      (saved by transformers) and OUT/qwen2/chat.json: conversations (plain,
      multi-turn, tool calls and responses with tool schemas) and their
      apply_chat_template(tokenize=False, add_generation_prompt=True) text.

  hf_golden.py logits MODEL_DIR INPUT_JSON OUT_JSON
      Loads MODEL_DIR with AutoModelForCausalLM.from_pretrained and writes its
      logits on INPUT_JSON's input_ids / attention_mask (a model saved by us).

  hf_golden.py plan-policy OUT TOKENIZER_JSON [sharp]
      A tiny random Qwen3 plan policy (width 32, 1 layer, 2 heads, 1 kv head,
      context 1024, tied) whose tokenizer is TOKENIZER_JSON (our household
      BPE) plus Qwen's <|endoftext|>, <|im_start|> and <|im_end|>, with
      Qwen2.5-Instruct's chat template and a generation_config.json whose eos
      is <|im_end|>; the embedding has the tokenizer's size rounded up to a
      multiple of 64 rows, as Qwen pads it. Saved by transformers to OUT.
      Prints JSON {"prompt_text", "prompt_ids"}: a user message's
      apply_chat_template(add_generation_prompt=True) text and ids. With
      `sharp`, the weights are those of `make` (randomize: logits whole units
      apart, so no two tokens are near a tie for the arg max).

  hf_golden.py greedy MODEL_DIR INPUT_JSON OUT_JSON
      Loads MODEL_DIR as `logprobs` does and writes, for each {"prompt_ids"}
      of INPUT_JSON's "rows", generate(do_sample=False, max_new_tokens =
      INPUT_JSON's "max_new_tokens") with the directory's generation config,
      each row run alone: {"responses": [[new token ids], ...]}.

  hf_golden.py logprobs MODEL_DIR INPUT_JSON OUT_JSON
      Loads MODEL_DIR (AutoModelForCausalLM and AutoTokenizer, as a user
      would) and writes, for each {"prompt_ids", "response_ids"} of
      INPUT_JSON's "rows", the log-prob of each response token under
      log_softmax(logits / INPUT_JSON's "temperature"), each row run alone.

  hf_golden.py bench-model OUT
      Saves the benchmark's tiny random Qwen3 (width 256, 4 layers, 8 heads,
      4 kv heads, head_dim 32, MLP 768, vocabulary 1024) to OUT.

  hf_golden.py bench MODEL_DIR BATCH PROMPT NEW THREADS
      transformers' speed on the batch stages/hf/benches/hf.rs builds (same
      formula): greedy generate of NEW tokens after PROMPT-token prompts, and
      a training step (forward + backward of the next-token loss) over
      PROMPT + NEW tokens, on THREADS torch threads, one warm-up, best of 3.
      Prints JSON {"greedy_tokens_per_s", "train_tokens_per_s"}.
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

PAD = 0
NEW_TOKENS = 6


def randomize(model, seed):
    """Weights large enough that logits differ by whole units between tokens
    (transformers' 0.02 init leaves them all near zero), norms near 1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * noise)
            else:
                p.copy_(0.25 * noise)


def batch(vocab, seed):
    """Three rows of lengths 7, 5 and 3, left-padded with PAD."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [7, 5, 3]
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(1, vocab, (n,), generator=gen)
        mask[row, width - n :] = 1
    return ids, mask


def logits_of(model, ids, mask):
    """Logits with the position ids generate uses for left padding
    (cumsum(mask) - 1, 0 at padding; a plain forward would count padding)."""
    positions = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.double()


def greedy(model, ids, mask, eos):
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=NEW_TOKENS,
        do_sample=False,
        pad_token_id=PAD,
        eos_token_id=eos,
    )
    return out[:, ids.shape[1] :]


def make_one(out, name, config, seed, dtype=torch.float32, shard=None):
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    randomize(model, seed)
    model = model.to(dtype)
    path = os.path.join(out, name)
    kwargs = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(path, **kwargs)
    # The references come from the saved checkpoint as from_pretrained loads
    # it: `.to(bfloat16)` above also casts the rotary inv_freq buffer to
    # bf16, which loading a bf16 checkpoint does not.
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    ids, mask = batch(config.vocab_size, seed + 1)
    # An eos that greedy decoding meets: the third token row 0 generates
    # without one, so generate's stop-and-pad path is exercised.
    free = greedy(model, ids, mask, None)
    eos = int(free[0, 2])
    tokens = greedy(model, ids, mask, eos)
    golden = {
        "input_ids": ids.tolist(),
        "attention_mask": mask.tolist(),
        "logits": logits_of(model, ids, mask).tolist(),
        "greedy": tokens.tolist(),
        "eos": eos,
        "pad": PAD,
        "max_new_tokens": NEW_TOKENS,
    }
    with open(os.path.join(path, "golden.json"), "w") as f:
        json.dump(golden, f)


# Qwen2.5-Instruct's chat template, as its tokenizer_config.json ships it.
QWEN25_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

# Keys in sorted order: our side keeps serde_json's (sorted) key order.
WEATHER_TOOL = {
    "function": {
        "description": "Weather of a city",
        "name": "get_weather",
        "parameters": {"properties": {"city": {"type": "string"}}, "required": ["city"], "type": "object"},
    },
    "type": "function",
}
CHATS = [
    {"messages": [{"role": "user", "content": "Put the cup in the sink."}], "tools": None},
    {
        "messages": [
            {"role": "system", "content": "You control a household robot."},
            {"role": "user", "content": "Where is the café mug? ☕"},
            {"role": "assistant", "content": "  On the table.\n"},
            {"role": "user", "content": "Bring it."},
        ],
        "tools": None,
    },
    {
        "messages": [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"function": {"arguments": {"city": "Paris", "days": 3}, "name": "get_weather"}, "type": "function"},
                    {"function": {"arguments": {"city": "Rome", "days": 1}, "name": "get_weather"}, "type": "function"},
                ],
            },
            {"role": "tool", "content": "sunny"},
            {"role": "tool", "content": "rain"},
        ],
        "tools": [WEATHER_TOOL],
    },
]


def save_chat(path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2, "[UNK]": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", unk_token="[UNK]"
    )
    fast.chat_template = QWEN25_TEMPLATE
    fast.save_pretrained(path)
    fast = transformers.AutoTokenizer.from_pretrained(path)
    chats = [
        {**chat, "text": fast.apply_chat_template(
            chat["messages"], tools=chat["tools"], tokenize=False, add_generation_prompt=True
        )}
        for chat in CHATS
    ]
    with open(os.path.join(path, "chat.json"), "w") as f:
        json.dump(chats, f, ensure_ascii=False)


def make(out):
    torch.set_num_threads(1)
    common = dict(
        vocab_size=160,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,
    )
    qwen2 = transformers.Qwen2Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    make_one(out, "qwen2", qwen2, 11)
    save_chat(os.path.join(out, "qwen2"))
    make_one(out, "qwen2-bf16", qwen2, 11, dtype=torch.bfloat16)
    qwen3 = transformers.Qwen3Config(
        **common, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}
    )
    make_one(out, "qwen3", qwen3, 12, shard="40KB")
    llama3 = transformers.LlamaConfig(
        **{**common, "hidden_size": 32},
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=False,
        # head_dim 8, theta 100: wavelengths 6.3, 19.9, 62.8, 199 against
        # 32 / 4 = 8 and 32 / 1 = 32: one kept, one smoothed, two divided.
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 100.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    )
    make_one(out, "llama3", llama3, 13)
    tied = transformers.LlamaConfig(
        **{**common, "hidden_size": 32},
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0},
    )
    make_one(out, "llama-tied", tied, 14)


def logits(model_dir, input_json, out_json):
    torch.set_num_threads(1)
    with open(input_json) as f:
        inputs = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa").eval()
    ids = torch.tensor(inputs["input_ids"], dtype=torch.long)
    mask = torch.tensor(inputs["attention_mask"], dtype=torch.long)
    with open(out_json, "w") as f:
        json.dump({"logits": logits_of(model, ids, mask).tolist(), "dtype": str(model.dtype)}, f)


def bench_model(out):
    config = transformers.Qwen3Config(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
        max_position_embeddings=1024,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    randomize(model, 0)
    model.save_pretrained(out)


def bench_batch(vocab, batch, length):
    """Row b: tokens 1 + (131 b + 17 t) mod (vocab - 1), its first b mod 4
    positions padding (the same formula as the Rust benchmark)."""
    ids = torch.tensor([[1 + (131 * b + 17 * t) % (vocab - 1) for t in range(length)] for b in range(batch)])
    mask = torch.tensor([[0 if t < b % 4 else 1 for t in range(length)] for b in range(batch)])
    return ids.masked_fill(mask == 0, PAD), mask


def best_of_3(run):
    import time

    run()
    times = []
    for _ in range(3):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def bench(model_dir, batch, prompt, new, threads):
    batch, prompt, new, threads = int(batch), int(prompt), int(new), int(threads)
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="sdpa")
    vocab = model.config.vocab_size
    ids, mask = bench_batch(vocab, batch, prompt)

    def sample():
        with torch.no_grad():
            model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                do_sample=False, pad_token_id=PAD, eos_token_id=None,
            )

    model.eval()
    greedy_s = best_of_3(sample)
    tids, tmask = bench_batch(vocab, batch, prompt + new)
    positions = (tmask.cumsum(-1) - 1).masked_fill(tmask == 0, 0)
    targets = tids[:, 1:].masked_fill(tmask[:, 1:] == 0, -100)

    def train():
        model.zero_grad(set_to_none=False)
        logits = model(input_ids=tids, attention_mask=tmask, position_ids=positions).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, vocab), targets.reshape(-1))
        loss.backward()

    model.train()
    train_s = best_of_3(train)
    print(json.dumps({
        "greedy_tokens_per_s": batch * new / greedy_s,
        "train_tokens_per_s": batch * (prompt + new) / train_s,
    }))


def plan_policy(out, tokenizer_json, sharp=None):
    from tokenizers import Tokenizer
    from transformers import GenerationConfig, PreTrainedTokenizerFast

    torch.manual_seed(21)
    tok = Tokenizer.from_file(tokenizer_json)
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = QWEN25_TEMPLATE
    im_end = fast.convert_tokens_to_ids("<|im_end|>")
    pad = fast.convert_tokens_to_ids("<|endoftext|>")
    vocab = (len(fast) + 63) // 64 * 64
    config = transformers.Qwen3Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=im_end,
        pad_token_id=pad,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    model = transformers.Qwen3ForCausalLM(config)
    if sharp == "sharp":
        randomize(model, 21)
    elif sharp is not None:
        sys.exit(f"plan-policy: unknown option {sharp!r}")
    model.save_pretrained(out)
    fast.save_pretrained(out)
    GenerationConfig(eos_token_id=[im_end], pad_token_id=pad).save_pretrained(out)
    messages = [{"role": "user", "content": "Task: put the Mug in the Sink."}]
    print(json.dumps({
        "prompt_text": "Task: put the Mug in the Sink.",
        "prompt_ids": fast.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False),
    }))


def load_with_rows(model_dir, input_json):
    """MODEL_DIR loaded as a user would (AutoTokenizer, AutoModelForCausalLM)
    on one torch thread, and INPUT_JSON."""
    from transformers import AutoTokenizer

    torch.set_num_threads(1)
    AutoTokenizer.from_pretrained(model_dir)
    with open(input_json) as f:
        inputs = json.load(f)
    return AutoModelForCausalLM.from_pretrained(model_dir).eval(), inputs


def logprobs(model_dir, input_json, out_json):
    model, inputs = load_with_rows(model_dir, input_json)
    rows = []
    with torch.no_grad():
        for row in inputs["rows"]:
            ids = torch.tensor([row["prompt_ids"] + row["response_ids"]], dtype=torch.long)
            logits = model(input_ids=ids).logits[0].double() / inputs["temperature"]
            logp = logits.log_softmax(-1)
            start = len(row["prompt_ids"]) - 1
            rows.append([
                logp[start + k, token].item() for k, token in enumerate(row["response_ids"])
            ])
    with open(out_json, "w") as f:
        json.dump({"logprobs": rows}, f)


def greedy_responses(model_dir, input_json, out_json):
    model, inputs = load_with_rows(model_dir, input_json)
    responses = []
    with torch.no_grad():
        for row in inputs["rows"]:
            ids = torch.tensor([row["prompt_ids"]], dtype=torch.long)
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=inputs["max_new_tokens"],
            )
            responses.append(out[0, ids.shape[1]:].tolist())
    with open(out_json, "w") as f:
        json.dump({"responses": responses}, f)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "logits":
        logits(*sys.argv[2:])
    elif len(sys.argv) in (4, 5) and sys.argv[1] == "plan-policy":
        plan_policy(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "greedy":
        greedy_responses(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "logprobs":
        logprobs(*sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "bench-model":
        bench_model(sys.argv[2])
    elif len(sys.argv) == 7 and sys.argv[1] == "bench":
        bench(*sys.argv[2:])
    else:
        sys.exit(__doc__)
