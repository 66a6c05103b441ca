#!/usr/bin/env python3
"""Writes a small synthetic rollout set as JSON lines for the demo (until
collect-rollouts exists): tasks with ground-truth plans, groups of 8 one-shot
JSON plans of varied quality (right, a step missing, steps swapped, a wrong
id, fenced in prose, broken JSON), their steps with per-token values, and a
task list of action names. Deterministic.

usage: demo_rollouts.py OUT_DIR
"""
import json
import pathlib
import random
import sys

ACTIONS = ["find a Mug", "pick up the Mug", "find a SinkBasin", "put down the object in hand",
           "turn on the Faucet", "turn off the Faucet", "find a Fridge", "open the Fridge",
           "close the Fridge", "find a Apple", "pick up the Apple", "find a DiningTable"]
PLANS = [[0, 1, 2, 3, 4, 5], [9, 10, 6, 7, 3, 8], [0, 1, 11, 3], [9, 10, 11, 3]]


def plan_text(ids, fenced=False):
    body = json.dumps({"language_plan": [ACTIONS[i] for i in ids],
                       "executable_plan": [{"action_id": i, "action_name": ACTIONS[i]} for i in ids]})
    return f"Here is the plan:\n```json\n{body}\n```" if fenced else body


def main(out):
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(7)
    tasks, trajectories, steps = [], [], []
    for t in range(16):
        gt = PLANS[t % len(PLANS)]
        task_id = f"household/train/{t}/{t:06d}"
        tasks.append({"task_id": task_id, "suite": "household", "env": "household", "split": "train",
                      "task_type": "pick_and_place", "seed": t, "instruction": f"Task {t}: {ACTIONS[gt[-1]]}.",
                      "observation": None, "gt_actions": [{"action_id": i, "action_name": ACTIONS[i]} for i in gt]})
        group = f"it0/{task_id}/d0"
        for s in range(8):
            kind = rng.choice(["right", "right", "missing", "swapped", "wrong_id", "fenced", "broken"])
            ids = list(gt)
            if kind == "missing":
                del ids[rng.randrange(len(ids))]
            elif kind == "swapped":
                i = rng.randrange(len(ids) - 1)
                ids[i], ids[i + 1] = ids[i + 1], ids[i]
            elif kind == "wrong_id":
                ids[rng.randrange(len(ids))] = rng.randrange(len(ACTIONS))
            text = plan_text(ids, fenced=kind == "fenced")
            if kind == "broken":
                text = text[: len(text) // 2]
            complete = ids == gt and kind != "broken"
            n_tokens = 8 + 4 * len(ids)
            trajectory_id = f"{group}/s{s}"
            trajectories.append({"trajectory_id": trajectory_id, "group_id": group, "task_id": task_id,
                                 "sample_index": s, "iteration": 0, "policy": "synthetic", "temperature": 1.6,
                                 "num_steps": 1, "env_steps": len(ids), "complete": complete,
                                 "response_text": text, "seed": 1000 * t + s})
            steps.append({"trajectory_id": trajectory_id, "step_index": 0, "prompt_ids": [1, 2, 3],
                          "response_ids": [rng.randrange(1, 500) for _ in range(n_tokens)],
                          "old_logprobs": [round(-rng.random(), 4) for _ in range(n_tokens)],
                          "observation": None, "old_value": round(rng.random(), 4),
                          "old_values": [round(rng.random(), 4) for _ in range(n_tokens)],
                          "latents": None, "latent_dim": None, "chosen_latent_len": None,
                          "old_latent_end_logprob": None})
    for name, rows in [("tasks", tasks), ("trajectories", trajectories), ("steps", steps)]:
        (out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "actions.json").write_text(json.dumps(ACTIONS) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
