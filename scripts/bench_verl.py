#!/usr/bin/env python3
"""veRL 0.9.1's GRPO and GAE advantage functions on the benchmark's shape
(BENCH_RESPONSES x BENCH_TOKENS, every row full length, groups of 8), in
memory, one torch thread, each at its best: one warm-up call, then the best
of five. Prints `name tokens_per_s` lines like the Rust benchmark.
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


grpo = best_of(5, lambda: core_algos.compute_grpo_outcome_advantage(rewards, mask, index))
gae = best_of(5, lambda: core_algos.compute_gae_advantage_return(rewards, values, mask, torch.tensor(0.99), torch.tensor(0.95)))
print(f"grpo_kernel {responses * tokens / grpo:.0f}")
print(f"gae_kernel {responses * tokens / gae:.0f}")
