"""Writes a small LIBERO demonstration file (HDF5, h5py) in exactly the
layout of LIBERO's own files (`--layout libero`: scripts/create_dataset.py,
attributes on `data`) or of OpenVLA's regenerations (`--layout openvla`:
regenerate_libero_dataset.py, no attributes), for the task `--task`
(`libero_spatial/0`): `<dir>/<suite>/<task name>_demo.hdf5`, as the datasets
name them. The demos hold random images and actions, and states[0] of each is
one of the task's fixed initial states (a real MuJoCo state, so a replay
starts from it); the other states repeat it.

usage: libero_demo_file.py DIR --task libero_spatial/0 --layout libero|openvla
       [--demos 2] [--steps 12] [--resolution 32] [--skip 3]
Prints the file's path. `--skip N` leaves demo_N out (OpenVLA's
regenerations drop the demos whose replay failed).
"""

import argparse
import json
import os

import h5py
import numpy as np
from libero.libero import benchmark


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dir")
    parser.add_argument("--task", default="libero_spatial/0")
    parser.add_argument("--layout", choices=["libero", "openvla"], default="libero")
    parser.add_argument("--demos", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--skip", type=int, default=None)
    args = parser.parse_args()

    suite_name, index = args.task.split("/")
    suite = benchmark.get_benchmark_dict()[suite_name]()
    task = suite.get_task(int(index))
    init_states = suite.get_task_init_states(int(index))
    folder = os.path.join(args.dir, suite_name if args.layout == "libero" else f"{suite_name}_no_noops")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{task.name}_demo.hdf5")
    rng = np.random.default_rng(0)
    n, r = args.steps, args.resolution
    with h5py.File(path, "w") as f:
        grp = f.create_group("data")
        if args.layout == "libero":
            bddl = f"chiliocosm/bddl_files/{task.problem_folder}/{task.bddl_file}"
            problem = {"domain_name": "robosuite", "problem_name": "libero_tabletop_manipulation",
                       "language_instruction": task.language}
            grp.attrs["env_name"] = "Libero_Tabletop_Manipulation"
            grp.attrs["problem_info"] = json.dumps(problem)
            grp.attrs["macros_image_convention"] = "opengl"
            grp.attrs["bddl_file_name"] = bddl
            grp.attrs["bddl_file_content"] = "(define (problem LIBERO_Tabletop_Manipulation))"
            grp.attrs["env_args"] = json.dumps({"type": 1, "env_name": "Libero_Tabletop_Manipulation",
                                                "problem_name": problem["problem_name"], "bddl_file": bddl})
        kept = [i for i in range(args.demos + (args.skip is not None)) if i != args.skip]
        for number in kept:
            ep = grp.create_group(f"demo_{number}")
            obs = ep.create_group("obs")
            ee = rng.uniform(-0.5, 0.5, size=(n, 6))
            obs.create_dataset("gripper_states", data=rng.uniform(-0.04, 0.04, size=(n, 2)))
            obs.create_dataset("joint_states", data=rng.uniform(-1, 1, size=(n, 7)))
            obs.create_dataset("ee_states", data=ee)
            obs.create_dataset("ee_pos", data=ee[:, :3])
            obs.create_dataset("ee_ori", data=ee[:, 3:])
            obs.create_dataset("agentview_rgb", data=rng.integers(0, 256, size=(n, r, r, 3), dtype=np.uint8))
            obs.create_dataset("eye_in_hand_rgb", data=rng.integers(0, 256, size=(n, r, r, 3), dtype=np.uint8))
            actions = rng.uniform(-0.3, 0.3, size=(n, 7))
            actions[:, 6] = np.where(np.arange(n) < n // 2, -1.0, 1.0)
            ep.create_dataset("actions", data=actions)
            states = np.repeat(init_states[number % len(init_states)][None], n, axis=0)
            ep.create_dataset("states", data=states)
            ep.create_dataset("robot_states", data=rng.uniform(-1, 1, size=(n, 9)))
            dones = np.zeros(n, dtype=np.uint8)
            dones[-1] = 1
            ep.create_dataset("rewards", data=dones)
            ep.create_dataset("dones", data=dones)
            if args.layout == "libero":
                ep.attrs["num_samples"] = n
                ep.attrs["model_file"] = "<mujoco/>"
                ep.attrs["init_state"] = states[0]
        if args.layout == "libero":
            grp.attrs["num_demos"] = len(kept)
            grp.attrs["total"] = n * len(kept)
    print(path)


if __name__ == "__main__":
    main()
