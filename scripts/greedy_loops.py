#!/usr/bin/env python3
"""Why closed-loop episodes loop: revisited states, confidence and advantages.

Reads a closed-loop run directory of the pipeline (steps with `anchor_key`,
the environment state's hash) and prints, per rollout directory given:

- revisit share: decisions taken in a state the same episode was already in
  (an agent turning on the spot or walking back and forth revisits states);
- looping episodes: episodes with at least one revisit, and the share of
  them that succeed;
- the chosen action's probability at T = 1 (exp of the stored log-prob of a
  greedy rollout: how confident the policy is where it loops);

and, for training iterations (`itK/collect` with `itK/adv`), the advantage
of revisiting decisions: mean advantage, the share with a positive
advantage, split by successful / failed episodes; for GiGPO also the
step-level part (`step_adv`). A revisit with a positive advantage is a loop
the update reinforces.

    .venv/bin/python scripts/greedy_loops.py [--cell=estimator=gigpo] RUN [ROLLOUT_DIR ...]

RUN holds it*/collect and it*/adv; each ROLLOUT_DIR is a collect-rollouts
output (e.g. greedy rollouts: collect-rollouts --set temperature=0 --set
group_size=1 on the val tasks); --cell reads a sweep cell's steps
(`itK/collect@estimator=gigpo`).
"""

import glob
import json
import math
import os
import sys

import pyarrow.parquet as pq


def table(path):
    files = sorted(glob.glob(os.path.join(path, "part-*.parquet")))
    rows = []
    for f in files:
        rows.extend(pq.read_table(f).to_pylist())
    return rows


def episodes(collect):
    steps = table(os.path.join(collect, "steps"))
    trajs = {t["trajectory_id"]: t for t in table(os.path.join(collect, "trajectories"))}
    by = {}
    for s in steps:
        by.setdefault(s["trajectory_id"], []).append(s)
    for v in by.values():
        v.sort(key=lambda s: s["step_index"])
    return by, trajs


def revisits(steps):
    """Per decision: was its state seen earlier in the episode."""
    seen, out = set(), []
    for s in steps:
        key = s["anchor_key"]
        out.append(key in seen)
        seen.add(key)
    return out


def rollout_stats(collect):
    by, trajs = episodes(collect)
    decisions = repeated = looping = looping_success = success = 0
    probs, probs_rep = [], []
    lengths = []
    for tid, steps in by.items():
        rep = revisits(steps)
        decisions += len(rep)
        repeated += sum(rep)
        ok = bool(trajs[tid]["complete"])
        success += ok
        lengths.append(len(steps))
        if any(rep):
            looping += 1
            looping_success += ok
        for s, r in zip(steps, rep):
            p = math.exp(sum(s["old_logprobs"]))
            probs.append(p)
            if r:
                probs_rep.append(p)
    n = len(by)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")
    return {
        "episodes": n,
        "success": success / n,
        "mean decisions": mean(lengths),
        "revisit share": repeated / decisions,
        "looping episodes": looping / n,
        "success among looping": looping_success / looping if looping else float("nan"),
        "p(chosen) all": mean(probs),
        "p(chosen) at revisits": mean(probs_rep),
    }


def cell_dir(run, it, step, cell):
    """A step's directory, in a sweep cell (`step@cell`) when given;
    iteration 0's collect runs once for all cells."""
    d = os.path.join(run, f"it{it}", f"{step}@{cell}" if cell else step)
    return d if os.path.isdir(d) else os.path.join(run, f"it{it}", step)


def advantage_stats(run, it, cell):
    collect, adv = cell_dir(run, it, "collect", cell), cell_dir(run, it, "adv", cell)
    if not os.path.isdir(os.path.join(adv, "advantages")):
        return None
    by, trajs = episodes(collect)
    advs = {(a["trajectory_id"], a["step_index"]): a for a in table(os.path.join(adv, "advantages"))}
    groups = {"success": [], "failed": []}
    step_parts = []
    for tid, steps in by.items():
        ok = bool(trajs[tid]["complete"])
        for s, r in zip(steps, revisits(steps)):
            a = advs.get((tid, s["step_index"]))
            if not r or a is None:
                continue
            groups["success" if ok else "failed"].append(a["advantages"][0])
            if a.get("step_adv") is not None:
                step_parts.append(a["step_adv"][0])
    out = {}
    for k, xs in groups.items():
        out[k] = {
            "revisits": len(xs),
            "mean A": sum(xs) / len(xs) if xs else float("nan"),
            "share A > 0": sum(x > 0 for x in xs) / len(xs) if xs else float("nan"),
        }
    if step_parts:
        out["step_adv at revisits"] = {
            "mean": sum(step_parts) / len(step_parts),
            "share > 0": sum(x > 0 for x in step_parts) / len(step_parts),
        }
    return out


def main():
    args = sys.argv[1:]
    cell = None
    if args and args[0].startswith("--cell="):
        cell = args.pop(0).split("=", 1)[1]
    run = args[0]
    for d in args[1:]:
        print(json.dumps({"rollouts": d, **rollout_stats(d)}))
    its = sorted(
        int(p.split("it")[-1]) for p in glob.glob(os.path.join(run, "it*")) if p.split("it")[-1].isdigit()
    )
    for it in its:
        stats = advantage_stats(run, it, cell)
        if stats:
            sampled = rollout_stats(cell_dir(run, it, "collect", cell))
            print(json.dumps({"iteration": it, "sampled": sampled, "advantages at revisits": stats}))


if __name__ == "__main__":
    main()
