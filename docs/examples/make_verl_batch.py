"""Writes verl-batch.parquet: a small batch of rollouts laid out as veRL keeps
them (a DataProto saved as a dataframe), for the README's offline example.

Four prompts (groups, `uid`) of four sampled responses each, with token ids
from a toy word-level vocabulary, per-token rewards (the outcome on the last
policy token), per-token critic values and a response mask whose zeros mark
tokens a tool inserted into a multi-turn response. Deterministic:

    .venv/bin/python docs/examples/make_verl_batch.py
"""

import pathlib
import random

import pyarrow as pa
import pyarrow.parquet as pq

PROMPTS = [
    "put a clean mug in the coffee machine",
    "put a chilled apple on the dining table",
    "slice the bread and put a slice in the fridge",
    "turn on the desk lamp while holding the book",
]
PLANS = [
    ["find a mug", "pick up the mug", "find a sink", "put down the object in hand", "find a coffee machine"],
    ["find an apple", "pick up the apple", "find a fridge", "open the fridge", "find a dining table"],
    ["find a knife", "pick up the knife", "find a bread", "slice the bread", "find a fridge"],
    ["find a book", "pick up the book", "find a desk lamp", "turn on the desk lamp"],
]
# Outcome of each sample: group 1 all fail (no GRPO signal), the others mixed.
OUTCOMES = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 0, 1], [0, 1, 0, 0]]
TOOL = "observation : the fridge is closed"


def main():
    rng = random.Random(7)
    vocab = {}

    def ids(text):
        return [vocab.setdefault(word, len(vocab)) for word in text.split()]

    rows = []
    for g, (prompt, plan) in enumerate(zip(PROMPTS, PLANS)):
        for k, outcome in enumerate(OUTCOMES[g]):
            steps = plan[: len(plan) - (0 if outcome else 1 + k % 2)]
            response = " ; ".join(steps)
            mask = [1] * len(response.split())
            if g == 3 and k == 1:  # a multi-turn response with a tool turn in it
                response = f"{steps[0]} ; {TOOL} ; " + " ; ".join(steps[1:])
                mask = [1] * len(ids(steps[0] + " ;"))
                mask += [0] * len(ids(TOOL + " ;"))
                mask += [1] * (len(response.split()) - len(mask))
            response_ids = ids(response)
            rewards = [0.0] * len(response_ids)
            last = max(i for i, m in enumerate(mask) if m)
            rewards[last] = float(outcome)
            values = [round(0.1 + 0.4 * i / len(response_ids) + rng.uniform(-0.05, 0.05), 4)
                      for i in range(len(response_ids))]
            rows.append({
                "uid": f"prompt-{g}",
                "step": 3,
                "prompt": prompt,
                "response": response,
                "prompts": ids(prompt),
                "responses": response_ids,
                "token_level_rewards": rewards,
                "response_mask": mask,
                "values": values,
            })
    schema = pa.schema([
        ("uid", pa.string()), ("step", pa.int64()), ("prompt", pa.string()),
        ("response", pa.string()), ("prompts", pa.list_(pa.int64())),
        ("responses", pa.list_(pa.int64())), ("token_level_rewards", pa.list_(pa.float32())),
        ("response_mask", pa.list_(pa.int8())), ("values", pa.list_(pa.float32())),
    ])
    out = pathlib.Path(__file__).with_name("verl-batch.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), out, compression="zstd")
    print(f"{out}: {len(rows)} rows, {len(vocab)} words")


if __name__ == "__main__":
    main()
