#!/usr/bin/env python3
"""Write the veRL golden fixtures that the Rust tests compare against.

Runs veRL 0.9.1's own `compute_grpo_outcome_advantage` and
`compute_gae_advantage_return` (verl/trainer/ppo/core_algos.py) on small,
seeded inputs and writes inputs and outputs as JSON into
tests/fixtures/verl/. Only the fixtures are committed, not veRL.

It needs a Python where `import verl` works, e.g.:

    python3 -m venv /tmp/verlenv
    /tmp/verlenv/bin/pip install torch==2.13.0 verl==0.9.1
    /tmp/verlenv/bin/python scripts/verl_golden.py

Inputs are padded batches whose response mask is a run of ones followed by
padding, the layout veRL sees; the fixtures store the valid part of each row
(the ragged layout our tables use).
"""
import json
import pathlib

import numpy as np
import torch
import verl
from verl.trainer.ppo import core_algos

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "verl"


def padded(lengths, width):
    mask = torch.zeros(len(lengths), width, dtype=torch.float32)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1.0
    return mask


def ragged(tensor, lengths):
    return [[float(x) for x in tensor[i, :n].tolist()] for i, n in enumerate(lengths)]


def grpo_case(rng, group_sizes, width, norm):
    lengths = [int(rng.integers(1, width + 1)) for _ in range(sum(group_sizes))]
    index = np.array([f"g{g}" for g, size in enumerate(group_sizes) for _ in range(size)], dtype=object)
    mask = padded(lengths, width)
    rewards = torch.zeros(len(lengths), width, dtype=torch.float32)
    for i, n in enumerate(lengths):
        group = int(index[i][1:])
        if group % 3 == 0:
            rewards[i, n - 1] = float(rng.integers(0, 2))  # binary outcome
        else:
            rewards[i, :n] = torch.tensor(rng.normal(0.0, 1.0, n), dtype=torch.float32) * 0.1
            rewards[i, n - 1] += float(rng.normal())
    # One group where every score is equal.
    first = [i for i in range(len(lengths)) if index[i] == "g1"]
    for i in first:
        rewards[i, :] = 0.0
        rewards[i, lengths[i] - 1] = 1.0
    adv, ret = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=rewards, response_mask=mask, index=index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm
    )
    return {
        "norm_adv_by_std": norm,
        "epsilon": 1e-6,
        "group": [str(g) for g in index],
        "token_rewards": ragged(rewards, lengths),
        "scores": [float(x) for x in (rewards * mask).sum(-1).tolist()],
        "advantages": ragged(adv, lengths),
    }


def gae_case(rng, rows, width, gamma, lam):
    lengths = [int(rng.integers(2, width + 1)) for _ in range(rows)]
    mask = padded(lengths, width)
    values = torch.tensor(rng.normal(0.0, 1.0, (rows, width)), dtype=torch.float32) * mask
    rewards = torch.zeros(rows, width, dtype=torch.float32)
    for i, n in enumerate(lengths):
        if i % 2 == 0:
            rewards[i, n - 1] = float(rng.integers(0, 2)) * 5.0  # LaST-R1 outcome
        else:
            rewards[i, :n] = torch.tensor(rng.normal(0.0, 0.2, n), dtype=torch.float32)
    adv, ret = core_algos.compute_gae_advantage_return(
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=torch.tensor(gamma), lam=torch.tensor(lam)
    )
    return {
        "gamma": gamma,
        "lam": lam,
        "token_rewards": ragged(rewards, lengths),
        "values": ragged(values, lengths),
        "advantages": ragged(adv, lengths),
        "returns": ragged(ret, lengths),
    }


def main():
    rng = np.random.default_rng(20261129)
    OUT.mkdir(parents=True, exist_ok=True)
    sizes = [8, 8, 1, 5, 8, 8, 2, 8]
    fixtures = {
        "grpo.json": {
            "verl_version": verl.__version__,
            "cases": [grpo_case(rng, sizes, 24, True), grpo_case(rng, sizes, 24, False)],
        },
        "gae.json": {
            "verl_version": verl.__version__,
            "cases": [gae_case(rng, 16, 32, 0.99, 0.95), gae_case(rng, 9, 12, 1.0, 1.0), gae_case(rng, 5, 7, 0.9, 0.5)],
        },
    }
    for name, data in fixtures.items():
        (OUT / name).write_text(json.dumps(data, indent=1) + "\n")
        print(f"wrote {OUT / name}")


if __name__ == "__main__":
    main()
