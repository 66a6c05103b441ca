#!/usr/bin/env python3
"""Write the veRL golden fixtures that the Rust tests compare against.

Runs veRL 0.9.1's own `compute_grpo_outcome_advantage` and
`compute_gae_advantage_return` (verl/trainer/ppo/core_algos.py; the latter
whitens with `verl.utils.torch_functional.masked_whiten`) on small, seeded
inputs and writes inputs and outputs as JSON into tests/fixtures/verl/.
Only the fixtures are committed, not veRL.

It needs a Python where `from verl.trainer.ppo import core_algos` works.
veRL is never installed into the project: install it without its heavy
dependencies into a directory of its own, with the light pure-Python
packages its import chain needs (the list is in the header of
scripts/bench), and run the project's .venv Python (it has torch) with
that directory, VERL_PYTHONPATH, on PYTHONPATH:

    .venv/bin/pip install --no-deps --target /tmp/verl-pkg verl==0.9.1 ...
    export VERL_PYTHONPATH=/tmp/verl-pkg
    PYTHONPATH=$VERL_PYTHONPATH .venv/bin/python scripts/verl_golden.py
    PYTHONPATH=$VERL_PYTHONPATH .venv/bin/python scripts/verl_golden.py --holes
    PYTHONPATH=$VERL_PYTHONPATH .venv/bin/python scripts/verl_golden.py --outcome

Inputs are padded batches whose response mask is a run of ones followed by
padding, the layout veRL sees; the fixtures store the valid part of each row
(the ragged layout our tables use).

`--holes` writes tests/fixtures/verl/holes.json instead: the same two veRL
functions on masks with holes inside the response (tool / observation
tokens of a multi-turn agent: runs of holes, holes on the first and the
last valid token, a row that is all holes) and non-zero token rewards on
every token, holes included. veRL's GAE skips a hole (its reward and value
unused, `nextvalues` and `lastgaelam` carried across it, the carried
advantage left at the hole and whitened with the rest), takes the
whitening statistics over the mask only; GRPO's score is the sum of every
token reward, holes included, and its advantage is multiplied by the mask.

`--outcome` writes tests/fixtures/verl/outcome.json: veRL's other outcome
estimators, each through its registry (`get_adv_estimator_fn`) with the
arguments the trainer passes (token_level_rewards, response_mask, index,
an AlgoConfig): rloo, opo, gpg, reinforce_plus_plus_baseline, grpo_passk
(with and without the std) and reinforce_plus_plus (gamma 1 and 0.9), each
on a batch whose masks are padding only and on one with holes; every batch
has a group of one and a group whose scores are all equal, except
grpo_passk's, which veRL refuses with a group of one (one more case records
that refusal).
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
    adv, ret = core_algos.compute_gae_advantage_return(
        token_level_rewards=rewards, values=values, response_mask=mask, gamma=torch.tensor(gamma), lam=torch.tensor(lam)
    )
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
    adv, _ = core_algos.compute_grpo_outcome_advantage(
        token_level_rewards=rewards,
        response_mask=mask,
        index=np.array(index, dtype=object),
        epsilon=1e-6,
        norm_adv_by_std_in_grpo=norm,
    )
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
        "verl_version": verl.__version__,
        "gae": [holes_gae_case(rng, 12, 20, 0.99, 0.95), holes_gae_case(rng, 7, 9, 1.0, 1.0)],
        "grpo": [holes_grpo_case(rng, [4, 4, 1, 3], 12, True), holes_grpo_case(rng, [4, 4, 1, 3], 12, False)],
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "holes.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT / 'holes.json'}")


# veRL's outcome estimators beside GRPO, by their registered names, with the
# AlgoConfig keys each reads (the trainer passes token_level_rewards,
# response_mask, index and config, as ray_trainer.compute_advantage does).
OUTCOME = [
    ("rloo", {}),
    ("opo", {}),
    ("gpg", {}),
    ("reinforce_plus_plus_baseline", {}),
    ("grpo_passk", {"norm_adv_by_std_in_grpo": True}),
    ("grpo_passk", {"norm_adv_by_std_in_grpo": False}),
    ("reinforce_plus_plus", {"gamma": 1.0}),
    ("reinforce_plus_plus", {"gamma": 0.9}),
]


def outcome_rewards(rng, index, lengths, width, holes):
    """Token rewards of one batch: without holes, a binary outcome (groups
    g0, g3, ...) or a normal one (the others) on the last valid token and,
    for one row in three of the latter, small rewards on earlier tokens;
    with holes, rewards on every valid token, holes included. Group g1's
    scores are all equal (1)."""
    rewards = torch.zeros(len(lengths), width, dtype=torch.float32)
    for i, n in enumerate(lengths):
        group = int(index[i][1:])
        if holes:
            rewards[i, :n] = torch.tensor(rng.normal(0.0, 0.3, n), dtype=torch.float32)
        elif group % 3 == 0:
            rewards[i, n - 1] = float(rng.integers(0, 2))
        else:
            if i % 3 == 0:
                rewards[i, :n] = torch.tensor(rng.normal(0.0, 0.1, n), dtype=torch.float32)
            rewards[i, n - 1] += float(rng.normal())
        if group == 1:
            rewards[i, :] = 0.0
            rewards[i, n - 1] = 1.0
    return rewards


def outcome_case(rng, name, keys, group_sizes, width, holes):
    lengths = [int(rng.integers(2, width + 1)) for _ in range(sum(group_sizes))]
    index = np.array([f"g{g}" for g, size in enumerate(group_sizes) for _ in range(size)], dtype=object)
    mask = holed_mask(rng, lengths, width) if holes else padded(lengths, width)
    rewards = outcome_rewards(rng, index, lengths, width, holes)
    case = {
        "estimator": name,
        "config": keys,
        "group": [str(g) for g in index],
        "response_mask": [[bool(x) for x in mask[i, :n].tolist()] for i, n in enumerate(lengths)],
        "token_rewards": ragged(rewards, lengths),
    }
    config = AlgoConfig(**keys)
    try:
        adv, ret = core_algos.get_adv_estimator_fn(name)(
            token_level_rewards=rewards, response_mask=mask, index=index, config=config
        )
    except ValueError as error:
        case["raises"] = str(error)
        return case
    case["advantages"] = ragged(adv, lengths)
    case["returns"] = ragged(ret, lengths)
    return case


def outcome():
    """tests/fixtures/verl/outcome.json: every estimator of OUTCOME on two
    batches, one whose masks are padding only and one with holes (and token
    rewards on every token); each batch has a group of one and a group whose
    scores are all equal. grpo_passk, which refuses a group of one, runs on
    the batches without it, and once with it to record veRL's refusal."""
    global AlgoConfig
    from verl.trainer.config import AlgoConfig

    rng = np.random.default_rng(20270115)
    sizes = [4, 4, 1, 3, 5, 2, 4]
    without_one = [4, 4, 3, 5, 2, 4]
    cases = []
    for name, keys in OUTCOME:
        batch = without_one if name == "grpo_passk" else sizes
        for holes in (False, True):
            cases.append(outcome_case(rng, name, keys, batch, 12, holes))
    cases.append(outcome_case(rng, "grpo_passk", {"norm_adv_by_std_in_grpo": True}, sizes, 12, False))
    OUT.mkdir(parents=True, exist_ok=True)
    data = {"verl_version": verl.__version__, "cases": cases}
    (OUT / "outcome.json").write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {OUT / 'outcome.json'}")


def main():
    global core_algos, verl
    import verl
    from verl.trainer.ppo import core_algos

    if "--holes" in sys.argv[1:]:
        holes()
        return
    if "--outcome" in sys.argv[1:]:
        outcome()
        return
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
