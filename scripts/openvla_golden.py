#!/usr/bin/env python3
"""Write the OpenVLA-OFT golden fixtures that the Rust tests compare against,
by running OpenVLA-OFT's own functions (never a transcription of them):

- `OpenVLAForActionPrediction._unnormalize_actions`, with its
  `_check_unnorm_key` and `get_action_stats`
  (`prismatic/extern/hf/modeling_prismatic.py`), on seeded statistics in the
  layout of a checkpoint's `dataset_statistics.json` (with and without the
  gripper's mask, one dataset or several, `unnorm_key` given, left out or
  unknown) and normalised action chunks (bin centres, and values past the
  bounds);
- `normalize_proprio` (`experiments/robot/openvla_utils.py`), on seeded raw
  proprio inside and outside the bounds;

each under both normalisation types the reference has for actions and
proprio: `bounds_q99` (its LIBERO and Bridge constants) and `bounds` (its
ALOHA constants), set as the platform detection in `prismatic/vla/constants.py`
sets the module's `ACTION_PROPRIO_NORMALIZATION_TYPE`.

The reference is imported from a checkout of moojink/openvla-oft (the
commit is recorded in the fixture) without its package `__init__`s, which
import its training stack; `modeling_prismatic` needs `timm` (and so
`torchvision`), which are never installed into the project:

    pip install --no-deps --target /tmp/oft-pkg timm 'torchvision==0.28.*'
    git clone https://github.com/moojink/openvla-oft /tmp/openvla-oft
    OPENVLA_OFT=/tmp/openvla-oft PYTHONPATH=/tmp/oft-pkg .venv/bin/python scripts/openvla_golden.py

writes tests/fixtures/openvla/normalization.json. `normalize_proprio` lives
in a module that imports TensorFlow; its function is taken from the file's
syntax tree and run on its own, with the names it reads.
"""
import ast
import json
import os
import pathlib
import subprocess
import sys
import types

import numpy as np

ROOT = pathlib.Path(os.environ.get("OPENVLA_OFT", "/tmp/openvla-oft"))


def reference():
    """OpenVLA-OFT's modeling module and its `normalize_proprio`."""
    for name in ["prismatic", "prismatic.training", "prismatic.vla", "prismatic.extern", "prismatic.extern.hf"]:
        module = types.ModuleType(name)
        module.__path__ = [str(ROOT / name.replace(".", "/"))]
        sys.modules[name] = module
    import prismatic.extern.hf.modeling_prismatic as modeling

    utils = ROOT / "experiments/robot/openvla_utils.py"
    tree = ast.parse(utils.read_text())
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "normalize_proprio")
    namespace = {"np": np, "Dict": dict, "Any": object, "NormalizationType": modeling.NormalizationType}
    exec(compile(ast.Module(body=[function], type_ignores=[]), str(utils), "exec"), namespace)
    return modeling, namespace


def statistics(rng, width, mask):
    """One table's statistics, as OpenVLA's dataset statistics hold them."""
    low = rng.uniform(-2.0, 0.5, width)
    high = low + rng.uniform(0.1, 3.0, width)
    table = {
        "mean": ((low + high) / 2).tolist(),
        "std": rng.uniform(0.1, 1.0, width).tolist(),
        "min": (low - rng.uniform(0.0, 0.5, width)).tolist(),
        "max": (high + rng.uniform(0.0, 0.5, width)).tolist(),
        "q01": low.tolist(),
        "q99": high.tolist(),
    }
    if mask:
        table["mask"] = [True] * (width - 1) + [False]
    return table


def holder(modeling, norm_stats):
    """An object with what `_unnormalize_actions` reads of its model."""
    cls = modeling.OpenVLAForActionPrediction
    model = types.SimpleNamespace(norm_stats=norm_stats, _check_unnorm_key=cls._check_unnorm_key)
    model.get_action_stats = types.MethodType(cls.get_action_stats, model)
    return model


def main():
    modeling, namespace = reference()
    types_by_name = {"bounds_q99": modeling.NormalizationType.BOUNDS_Q99, "bounds": modeling.NormalizationType.BOUNDS}
    # The reference's discrete head decodes to these centres (n_action_bins = 256).
    bins = np.linspace(-1, 1, 256)
    centers = (bins[:-1] + bins[1:]) / 2.0
    rng = np.random.default_rng(0)
    actions, proprio = [], []
    for kind, normalization in types_by_name.items():
        modeling.ACTION_PROPRIO_NORMALIZATION_TYPE = normalization
        namespace["ACTION_PROPRIO_NORMALIZATION_TYPE"] = normalization
        for case in range(6):
            width = [7, 7, 14, 3, 7, 7][case]
            datasets = 1 if case < 3 else 2
            norm_stats = {}
            for d in range(datasets):
                norm_stats[f"dataset_{d}"] = {
                    "action": statistics(rng, width, mask=case % 2 == 0),
                    "proprio": statistics(rng, width + 1, mask=case == 4),
                    "num_transitions": int(rng.integers(100, 10000)),
                    "num_trajectories": int(rng.integers(1, 100)),
                }
            chunk = centers[rng.integers(0, 255, (8, width))]
            chunk[0, : min(3, width)] = [-1.2, 1.3, 1.0][: min(3, width)]
            for key in [None, "dataset_1", "missing"] if datasets == 2 else [None, "dataset_0"]:
                entry = {"normalization": kind, "statistics": norm_stats, "unnorm_key": key, "normalized": chunk.tolist()}
                try:
                    out = modeling.OpenVLAForActionPrediction._unnormalize_actions(holder(modeling, norm_stats), chunk, key)
                    entry["expected"] = np.asarray(out, dtype=np.float64).tolist()
                except AssertionError as error:
                    entry["error"] = "ambiguous" if key is None else "unknown"
                    entry["reference_message"] = str(error)
                actions.append(entry)
            for d, stats in norm_stats.items():
                table = stats["proprio"]
                low, high = np.array(table["q01"]), np.array(table["q99"])
                raw = rng.uniform(low - 0.5, high + 0.5, (4, width + 1))
                out = namespace["normalize_proprio"](raw, table)
                proprio.append({
                    "normalization": kind,
                    "statistics": {d: stats},
                    "raw": raw.tolist(),
                    "expected": np.asarray(out, dtype=np.float64).tolist(),
                })
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    out = pathlib.Path(__file__).resolve().parent.parent / "tests/fixtures/openvla/normalization.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    fixture = {"reference": f"moojink/openvla-oft {commit or 'checkout'}", "actions": actions, "proprio": proprio}
    out.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {out}: {len(actions)} action cases, {len(proprio)} proprio cases")


if __name__ == "__main__":
    main()
