#!/usr/bin/env python3
"""Mean ± std over training seeds of closed-loop pipeline runs, and curves.

Each ARM is `name=RUN_DIR[@CELL][,RUN_DIR[@CELL]...]`: one run directory
per training seed, each optionally with its sweep cell (`estimator=gigpo`:
steps named `itK/collect@estimator=gigpo`). Per iteration it reads, from the
stage summaries,

- the sampled success of all drawn episodes (collect-rollouts),
- the greedy evaluation success (evaluate, every few iterations; `eval_*`
  before RL as iteration -1),
- the update's mean action entropy,
- a thinking VLA's chosen latent lengths and the value head's explained
  variance (update-policy under LAPO),

prints a markdown table (mean ± std over the seeds at the first and last
iteration, and the best greedy evaluation) and, with --png, draws the
sampled and greedy success (mean line, shaded ± std) of every arm, and for
LAPO arms the explained variance and the mean chosen latent length.

    .venv/bin/python scripts/seed_curves.py --png out.png \\
        grpo=runs/a-s0@estimator=grpo,runs/a-s1@estimator=grpo \\
        gigpo=runs/a-s0@estimator=gigpo,runs/a-s1@estimator=gigpo
"""

import argparse
import glob
import os
import re
import statistics


def summary_line(path, key):
    """The value cell of the summary row `| key | value |`, or None."""
    if not os.path.exists(path):
        return None
    for line in open(path, encoding="utf-8"):
        if line.startswith(f"| {key} |"):
            return line.split("|")[2].strip()
    return None


def first_float(text):
    m = re.match(r"\s*(-?[0-9.]+)", text or "")
    return float(m.group(1)) if m else None


def step_dir(run, it, step, cell):
    """The step's directory for the cell. Iteration 0's collect and score
    run on the initial policy, once for the cells that differ only in what
    comes later (an estimator sweep): named by the largest subset of the
    cell's `key=value` pairs, once the cell has a step of its own there.
    Later steps depend on the cell's own updates: its own directory only
    (absent while the cell has not run them)."""
    exact = os.path.join(run, f"it{it}", f"{step}@{cell}" if cell else step)
    if not cell or it > 0 or os.path.isdir(exact):
        return exact
    pairs = set(cell.split(","))
    if not glob.glob(os.path.join(run, "it0", f"*@{cell}")):
        return exact  # the cell has not run a step of its own yet
    best, best_n = exact, -1
    for d in glob.glob(os.path.join(run, f"it{it}", step + "*")):
        name = os.path.basename(d)
        if name == step:
            own = set()
        elif name.startswith(step + "@"):
            own = set(name[len(step) + 1:].split(","))
        else:
            continue
        if own <= pairs and len(own) > best_n:
            best, best_n = d, len(own)
    return best


def split_runs(runs):
    """`RUN[@CELL],RUN[@CELL]...` into (run, cell) pairs; a cell may hold
    several `key=value` pairs joined by commas (`@temperature=1.0,train_seed=1`)."""
    items = []
    for part in runs.split(","):
        if items and "@" not in part and re.fullmatch(r"[A-Za-z_][\w.]*=[^/]*", part):
            run, cell = items[-1]
            items[-1] = (run, f"{cell},{part}")
        else:
            run, _, cell = part.partition("@")
            items.append((run, cell))
    return items


def iterations(run):
    return sorted(
        int(m.group(1))
        for p in glob.glob(os.path.join(run, "it*"))
        if (m := re.fullmatch(r"it(\d+)", os.path.basename(p)))
    )


def read_run(run, cell):
    out = {"sampled": {}, "greedy": {}, "ev": {}, "latent_len": {}, "entropy": {}}
    for name in ("gate_one_demo", "eval_sft", "eval_init"):
        v = first_float(summary_line(os.path.join(run, name, "_summary.evaluate.md"), "success, split val"))
        if v is not None:
            out["greedy"][-1] = v
    for it in iterations(run):
        collect = step_dir(run, it, "collect", cell)
        v = first_float(summary_line(os.path.join(collect, "_summary.collect-rollouts.md"), "success rate (all drawn episodes)"))
        if v is not None:
            out["sampled"][it] = v
        ev = os.path.join(step_dir(run, it, "eval", cell), "_summary.evaluate.md")
        v = first_float(summary_line(ev, "success, split val"))
        if v is not None:
            out["greedy"][it] = v
        update = os.path.join(step_dir(run, it, "update", cell), "_summary.update-policy.md")
        v = first_float(summary_line(update, "mean entropy"))
        if v is not None:
            out["entropy"][it] = v
        v = first_float(summary_line(update, "value explained variance (rollout values vs returns)"))
        if v is not None:
            out["ev"][it] = v
        lengths = summary_line(update, "chosen latent lengths")
        if lengths:
            shares = [(int(a), float(b)) for a, b in re.findall(r"(\d+): ([0-9.]+) %", lengths)]
            out["latent_len"][it] = sum(a * b for a, b in shares) / 100.0
    return out


def mean_std(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def fmt(xs):
    m, s = mean_std(xs)
    return "–" if m is None else f"{m:.3f} ± {s:.3f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("arms", nargs="+")
    ap.add_argument("--png")
    args = ap.parse_args()
    arms = []
    for arm in args.arms:
        name, runs = arm.split("=", 1)
        items = split_runs(runs)
        arms.append((name, [read_run(r, cell or None) for r, cell in items], items))
    print("| arm | seeds | greedy val before RL | greedy val, last | greedy val, best | sampled success, first it. | sampled success, last it. | entropy first → last | value EV first → last | mean latent length first → last |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, data, runs in arms:
        def at(series, pick):
            vals = []
            for d in data:
                s = {k: v for k, v in d[series].items() if k >= 0}
                vals.append(s[pick(sorted(s))] if s else None)
            return vals
        first, last = (lambda ks: ks[0]), (lambda ks: ks[-1])
        best = [max((v for k, v in d["greedy"].items() if k >= 0), default=None) for d in data]
        before = [d["greedy"].get(-1) for d in data]
        ev = f"{fmt(at('ev', first))} → {fmt(at('ev', last))}" if any(d["ev"] for d in data) else "–"
        ll = f"{fmt(at('latent_len', first))} → {fmt(at('latent_len', last))}" if any(d["latent_len"] for d in data) else "–"
        ent = f"{fmt(at('entropy', first))} → {fmt(at('entropy', last))}"
        print(f"| {name} | {len(data)} | {fmt(before)} | {fmt(at('greedy', last))} | {fmt(best)} | {fmt(at('sampled', first))} | {fmt(at('sampled', last))} | {ent} | {ev} | {ll} |")
    if not args.png:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        ("sampled", "sampled train success"),
        ("greedy", "greedy val success"),
        ("entropy", "action entropy (update)"),
    ]
    if any(d["ev"] for _, data, _ in arms for d in data):
        panels += [("ev", "value explained variance"), ("latent_len", "mean chosen latent length")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    for ax, (series, title) in zip(axes, panels):
        for name, data, _ in arms:
            keys = sorted(set().union(*(d[series].keys() for d in data)))
            if not keys:
                continue
            stats = [mean_std([d[series].get(k) for d in data]) for k in keys]
            m = [s[0] for s in stats]
            sd = [s[1] for s in stats]
            ax.plot(keys, m, marker="o", ms=3, label=f"{name} (n={len(data)})")
            ax.fill_between(keys, [a - b for a, b in zip(m, sd)], [a + b for a, b in zip(m, sd)], alpha=0.2)
        ax.set_title(title)
        ax.set_xlabel("iteration (-1: before RL)" if series == "greedy" else "iteration")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)


if __name__ == "__main__":
    main()
