"""Write rollouts we collected as a veRL rollout dump (`trainer.rollout_data_dir`).

The layout is the one veRL's `RayPPOTrainer._dump_generations` writes
(volcengine/verl, verl/trainer/ppo/ray_trainer.py, commit b178a3cd): one
`json.dumps(entry, ensure_ascii=False)` per line with the keys `input`,
`output`, `gts`, `score`, `step`, then every reward extra (here `acc`, which
veRL's default reward manager reports), and no `uid`. A training dump comes
after `_balance_batch`, which reorders the batch, so the rows are shuffled
(seeded): import it with `table import --format verl --group-by-prompt`.

It exists so that the README's rescoring experiment runs on rollouts a real
policy wrote rather than on hand-made lines:

    .venv/bin/python scripts/verl_dump.py --tasks runs/demo/data/pool/tasks \
        --trajectories runs/demo/rollouts/trajectories \
        --rewards runs/demo/offline/rewards-outcome/rewards --step 3 --out runs/verl/3.jsonl

Each argument is one table's directory (its `part-*.parquet` shards).
"""

import argparse
import glob
import json
import os
import random

import pyarrow.parquet as pq


def table(directory, columns):
    """The rows of one of our tables (its Parquet shards, in order)."""
    shards = sorted(glob.glob(os.path.join(directory, "part-*.parquet")))
    if not shards:
        raise SystemExit(f"{directory}: no Parquet shards (is it a table directory?)")
    rows = []
    for shard in shards:
        rows.extend(pq.read_table(shard, columns=columns).to_pylist())
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", required=True)
    parser.add_argument("--trajectories", required=True)
    parser.add_argument("--rewards", required=True)
    parser.add_argument("--step", type=int, default=1, help="veRL's global step")
    parser.add_argument("--seed", type=int, default=0, help="the batch reordering")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    tasks = {t["task_id"]: t for t in table(args.tasks, ["task_id", "instruction", "gt_actions"])}
    rewards = {r["trajectory_id"]: r for r in table(args.rewards, ["trajectory_id", "score", "accuracy"])}
    trajectories = table(args.trajectories, ["trajectory_id", "task_id", "response_text"])
    entries = []
    for trajectory in trajectories:
        task = tasks.get(trajectory["task_id"])
        reward = rewards.get(trajectory["trajectory_id"])
        if task is None or reward is None:
            raise SystemExit(f"{trajectory['trajectory_id']}: no task or no reward row")
        entries.append(
            {
                "input": task["instruction"],
                "output": trajectory["response_text"],
                "gts": task["gt_actions"],
                "score": reward["score"],
                "step": args.step,
                "acc": reward["accuracy"],
            }
        )
    random.Random(args.seed).shuffle(entries)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write("\n".join(json.dumps(e, ensure_ascii=False) for e in entries) + "\n")
    print(f"{args.out}: {len(entries)} rows from {len(tasks)} tasks")


if __name__ == "__main__":
    main()
