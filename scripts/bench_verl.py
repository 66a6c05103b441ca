#!/usr/bin/env python3
"""veRL 0.9.1's GRPO and GAE advantage functions on the benchmark's shape
(BENCH_RESPONSES x BENCH_TOKENS, every row full length, groups of 8), in
memory, one torch thread, each at its best: one warm-up call, then the best
of five. Prints `name tokens_per_s` lines like the Rust benchmark.

With BENCH_DATA naming the directory the Rust benchmark left its random
input in (`rollouts/` and `rewards/`, see tests/benches/pipeline.rs), it
times instead veRL's side of the whole offline process on those very files:
pyarrow reads the steps and rewards shards (one thread), the rows become
veRL's padded tensors (token-level rewards at each response's last token,
the values, the response mask, the group index), then core_algos runs:
`read_gae` and `read_grpo`, tokens per second as above.
Run with a Python where `import verl` works (see scripts/bench for a
light install without a second torch)."""
import os
import time

import numpy as np
import torch
from verl.trainer.ppo import core_algos

torch.set_num_threads(1)
torch.set_num_interop_threads(1)
responses = int(os.environ.get("BENCH_RESPONSES", 4096))
tokens = int(os.environ.get("BENCH_TOKENS", 1024))
rng = np.random.default_rng(0)
scores = (rng.random(responses) > 0.5).astype(np.float32)
rewards = torch.zeros(responses, tokens)
rewards[:, -1] = torch.from_numpy(scores)
values = torch.from_numpy(rng.random((responses, tokens), dtype=np.float32) - 0.5)
mask = torch.ones(responses, tokens)
index = np.array([f"g{i // 8}" for i in range(responses)], dtype=object)


def best_of(repeats, f):
    f()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - start)
    return best


data = os.environ.get("BENCH_DATA")
if not data:
    grpo = best_of(5, lambda: core_algos.compute_grpo_outcome_advantage(rewards, mask, index))
    gae = best_of(5, lambda: core_algos.compute_gae_advantage_return(rewards, values, mask, torch.tensor(0.99), torch.tensor(0.95)))
    print(f"grpo_kernel {responses * tokens / grpo:.0f}")
    print(f"gae_kernel {responses * tokens / gae:.0f}")


def padded(column, rows, width, dtype):
    """A list column as a [rows, width] array, each row's items left-aligned
    (zeros after them), built from the Arrow offsets without a Python loop."""
    column = column.combine_chunks()
    offsets = column.offsets.to_numpy()
    values = column.values.to_numpy(zero_copy_only=False)
    lengths = np.diff(offsets)
    out = np.zeros((rows, width), dtype=dtype)
    keep = np.arange(width)[None, :] < lengths[:, None]
    out[keep] = values[offsets[0]:offsets[-1]]
    return out


def read_input(data, with_values):
    """veRL's batch from the benchmark's shards: rewards at the last token,
    values (GAE), the response mask and each row's group id."""
    import glob
    import pyarrow as pa
    import pyarrow.parquet as pq
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    shards = lambda table: sorted(glob.glob(f"{data}/*/{table}/part-*.parquet"))
    columns = ["trajectory_id", "response_ids"] + (["old_values"] if with_values else [])
    steps = pa.concat_tables(pq.read_table(f, columns=columns, use_threads=False) for f in shards("steps"))
    rewards = pa.concat_tables(
        pq.read_table(f, columns=["trajectory_id", "group_id", "score"], use_threads=False)
        for f in shards("rewards")
    )
    order = {t: k for k, t in enumerate(rewards.column("trajectory_id").to_pylist())}
    rows = [order[t] for t in steps.column("trajectory_id").to_pylist()]
    ids = steps.column("response_ids").combine_chunks()
    lengths = np.diff(ids.offsets.to_numpy())
    width = int(lengths.max())
    mask = (np.arange(width)[None, :] < lengths[:, None]).astype(np.float32)
    scores = rewards.column("score").to_numpy()[rows]
    token_rewards = np.zeros((len(rows), width), dtype=np.float32)
    token_rewards[np.arange(len(rows)), lengths - 1] = scores
    values = padded(steps.column("old_values"), len(rows), width, np.float32) if with_values else None
    index = np.array(rewards.column("group_id").to_pylist(), dtype=object)[rows]
    return torch.from_numpy(token_rewards), values, torch.from_numpy(mask), index


if data:
    def read_gae():
        r, v, m, _ = read_input(data, True)
        core_algos.compute_gae_advantage_return(r, torch.from_numpy(v), m, torch.tensor(0.99), torch.tensor(0.95))

    def read_grpo():
        r, _, m, index = read_input(data, False)
        core_algos.compute_grpo_outcome_advantage(r, m, index)

    r, _, m, _ = read_input(data, False)
    tokens_read = int(m.sum())
    print(f"read_gae {tokens_read / best_of(5, read_gae):.0f}")
    print(f"read_grpo {tokens_read / best_of(5, read_grpo):.0f}")
