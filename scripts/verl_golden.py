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

`--holes` writes tests/fixtures/verl/holes.json instead, without veRL (torch
alone): masks with holes inside the response (tool / observation tokens of a
multi-turn agent) and non-zero token rewards on several tokens, holes
included, through a transcription of the numerics of veRL 0.9.1's
`compute_gae_advantage_return` (a hole carries `nextvalues` and `lastgaelam`
across, its reward and value unused), `masked_whiten` (statistics over the
mask) and `compute_grpo_outcome_advantage` (score = sum of every token
reward, advantage times the mask), written from their definitions:

    .venv/bin/python scripts/verl_golden.py --holes
"""
import json
import pathlib
import sys

import numpy as np
import torch

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


def transcribed_gae(rewards, values, mask, gamma, lam):
    """veRL's masked GAE, position by position from the end of the rows: a
    valid position updates the running advantage and the next value, a hole
    leaves both as they were (and shows the running advantage)."""
    rows, width = rewards.shape
    running = torch.zeros(rows)
    next_value = torch.zeros(rows)
    advantages = torch.zeros(rows, width)
    for t in range(width - 1, -1, -1):
        valid = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        updated = delta + gamma * lam * running
        next_value = torch.where(valid > 0, values[:, t], next_value)
        running = torch.where(valid > 0, updated, running)
        advantages[:, t] = running
    returns = advantages + values
    return transcribed_whiten(advantages, mask), returns


def transcribed_whiten(values, mask):
    """veRL's masked_whiten: masked mean over (n + 1e-8), unbiased masked
    variance, (x - mean) * rsqrt(var + 1e-8)."""
    n = mask.sum()
    mean = (values * mask).sum() / (n + 1e-8)
    var = (((values - mean) ** 2) * mask).sum() / (n + 1e-8) * (n / (n - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def transcribed_grpo(rewards, mask, index, epsilon, norm):
    """veRL's GRPO outcome advantage: each row's score is the sum of all its
    token rewards; a group of one has mean 0 and std 1, else mean and
    unbiased std of its scores; the advantage is broadcast times the mask."""
    scores = rewards.sum(dim=-1)
    out = scores.clone()
    for g in set(index):
        rows = [i for i in range(len(index)) if index[i] == g]
        group = scores[rows]
        mean, std = (torch.tensor(0.0), torch.tensor(1.0)) if len(rows) == 1 else (group.mean(), group.std())
        for i in rows:
            out[i] = (scores[i] - mean) / (std + epsilon) if norm else scores[i] - mean
    return out.unsqueeze(-1) * mask


def holed_mask(rng, lengths, width):
    """Padding after each row's length, and holes inside it: runs of tool
    tokens, a hole on the first and on the last valid token of some rows,
    and one row whose valid tokens are all holes."""
    mask = padded(lengths, width)
    for i, n in enumerate(lengths):
        if i == 1:
            mask[i, :n] = 0.0  # every token a hole
            continue
        start = int(rng.integers(0, n))
        mask[i, start : min(n, start + int(rng.integers(1, 4)))] = 0.0
        if i % 3 == 0:
            mask[i, 0] = 0.0
        if i % 4 == 2:
            mask[i, n - 1] = 0.0
    return mask


def holes_gae_case(rng, rows, width, gamma, lam):
    lengths = [int(rng.integers(3, width + 1)) for _ in range(rows)]
    mask = holed_mask(rng, lengths, width)
    valid = padded(lengths, width)
    values = torch.tensor(rng.normal(0.0, 1.0, (rows, width)), dtype=torch.float32) * valid
    rewards = torch.tensor(rng.normal(0.0, 0.5, (rows, width)), dtype=torch.float32) * valid
    for i, n in enumerate(lengths):
        rewards[i, n - 1] += float(rng.integers(0, 2))
    adv, ret = transcribed_gae(rewards, values, mask, gamma, lam)
    return {
        "gamma": gamma,
        "lam": lam,
        "response_mask": [[bool(x) for x in mask[i, :n].tolist()] for i, n in enumerate(lengths)],
        "token_rewards": ragged(rewards, lengths),
        "values": ragged(values, lengths),
        "advantages": ragged(adv, lengths),
        "returns": ragged(ret, lengths),
    }


def holes_grpo_case(rng, group_sizes, width, norm):
    lengths = [int(rng.integers(2, width + 1)) for _ in range(sum(group_sizes))]
    index = [f"g{g}" for g, size in enumerate(group_sizes) for _ in range(size)]
    mask = holed_mask(rng, lengths, width)
    valid = padded(lengths, width)
    rewards = torch.tensor(rng.normal(0.0, 0.3, (len(lengths), width)), dtype=torch.float32) * valid
    adv = transcribed_grpo(rewards, mask, index, 1e-6, norm)
    return {
        "norm_adv_by_std": norm,
        "epsilon": 1e-6,
        "group": index,
        "response_mask": [[bool(x) for x in mask[i, :n].tolist()] for i, n in enumerate(lengths)],
        "token_rewards": ragged(rewards, lengths),
        "advantages": ragged(adv, lengths),
    }


def holes():
    rng = np.random.default_rng(20261202)
    data = {
        "verl_version": "0.9.1",
        "numerics": "transcription of veRL 0.9.1 core_algos.compute_gae_advantage_return, "
        "compute_grpo_outcome_advantage and torch_functional.masked_whiten (scripts/verl_golden.py --holes)",
        "gae": [holes_gae_case(rng, 12, 20, 0.99, 0.95), holes_gae_case(rng, 7, 9, 1.0, 1.0)],
        "grpo": [holes_grpo_case(rng, [4, 4, 1, 3], 12, True), holes_grpo_case(rng, [4, 4, 1, 3], 12, False)],
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "holes.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT / 'holes.json'}")


def main():
    if "--holes" in sys.argv[1:]:
        holes()
        return
    global core_algos
    import verl
    from verl.trainer.ppo import core_algos
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
