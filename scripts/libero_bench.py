"""Where a LIBERO bridge worker's time goes, on this machine: build, reset
(env.reset + initial state + the 10 wait steps), a step's physics and
controller, rendering both cameras for one observation, and its EFOB
encoding (the worker's side of the pipe); from those, env steps per second
when the policy observes every step and every chunk of K steps.

    .venv/bin/python scripts/libero_bench.py --resolution 128 --steps 40
    .venv/bin/python scripts/libero_bench.py --workers 2 ...   # N processes at once

Prints one JSON line per worker process. Task libero_spatial/0, initial
state 0, a fixed random action sequence (seed 0).
"""

import argparse
import json
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "stages", "gym", "python"))


def measure(resolution, steps, worker, chunk):
    import numpy as np

    from embodyflow_gym import protocol
    from embodyflow_gym.adapters import libero

    out = {"worker": worker, "resolution": resolution, "steps": steps}
    t = time.perf_counter()
    episode = libero.make("libero_spatial/0", {"resolution": resolution}, 0)
    out["build_s"] = time.perf_counter() - t
    t = time.perf_counter()
    episode.reset(0)
    out["reset_s"] = time.perf_counter() - t
    actions = np.random.default_rng(0).uniform(-1, 1, size=(steps, 7))
    space = episode.space()
    shape = (space["height"], space["width"], space["channels"])
    step_time = render_time = encode_time = 0.0
    for action in actions:
        t = time.perf_counter()
        episode.step(action)
        step_time += time.perf_counter() - t
        t = time.perf_counter()
        pixels, proprio = episode.observation()
        render_time += time.perf_counter() - t
        t = time.perf_counter()
        protocol.efob(pixels, shape, proprio)
        encode_time += time.perf_counter() - t
    episode.close()
    step, render, encode = step_time / steps, render_time / steps, encode_time / steps
    out["physics_ms_per_step"] = 1000 * step
    out["render_ms_per_observation"] = 1000 * render
    out["encode_ms_per_observation"] = 1000 * encode
    # Env steps per second when the policy observes every step, and every
    # `chunk` steps (the VLA's K: one observation per chunk).
    out["steps_per_s_observing_each_step"] = 1 / (step + render + encode)
    out[f"steps_per_s_chunks_of_{chunk}"] = chunk / (chunk * step + render + encode)
    return out


def run(args):
    return measure(*args)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=8)
    a = parser.parse_args()
    jobs = [(a.resolution, a.steps, w, a.chunk) for w in range(a.workers)]
    with multiprocessing.get_context("spawn").Pool(a.workers) as pool:
        for result in pool.map(run, jobs):
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in result.items()}), flush=True)


if __name__ == "__main__":
    main()
