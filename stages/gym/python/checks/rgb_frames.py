"""The generic adapter gives an RGBA or gray frame as the RGB array
transformers' `convert_to_rgb` makes of it before a vision-language model's
processor reads it: every (alpha, channel) pair of uint8 values, then the
frames of an env observing HxWx4 and HxWx1 Boxes played through the adapter.
Exits 1 naming the first difference; prints the pairs and frames compared.
Run by stages/gym/tests/bridge.rs."""

import sys
import warnings

warnings.simplefilter("ignore")

import gymnasium
import numpy as np
from gymnasium import spaces
from transformers.image_transforms import convert_to_rgb

from embodyflow_gym.adapters import generic


def reference(frame):
    return convert_to_rgb(frame, return_numpy=True, input_data_format="channels_last")


def fail(what, got, want):
    where = np.argwhere(got != want)[0]
    print(f"{what}: differs at {tuple(where)}: {got[tuple(where)]} against transformers' {want[tuple(where)]}", file=sys.stderr)
    sys.exit(1)


# Every alpha with every channel value (and the other two channels 0 and 255).
alpha, value = np.meshgrid(np.arange(256), np.arange(256), indexing="ij")
every = np.stack([value, np.zeros_like(value), np.full_like(value, 255), alpha], axis=-1).astype(np.uint8)
got, want = generic.to_rgb(every), reference(every)
if got.shape != want.shape or (got != want).any():
    fail("every (alpha, value) pair", got, want)


class Frames(gymnasium.Env):
    """Random uint8 frames of `channels` channels; success after 3 steps."""

    def __init__(self, channels):
        self.observation_space = spaces.Box(0, 255, (5, 7, channels), np.uint8)
        self.action_space = spaces.Discrete(2)
        self.steps = 0

    def frame(self):
        return self.np_random.integers(0, 256, self.observation_space.shape, dtype=np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self.frame(), {"success": False}

    def step(self, action):
        self.steps += 1
        return self.frame(), 0.0, False, False, {"success": self.steps >= 3}


frames = 0
for channels in (4, 1):
    env_id = f"Frames{channels}-v0"
    gymnasium.register(id=env_id, entry_point=Frames, kwargs={"channels": channels})
    episode = generic.make(env_id, {}, 0)
    if episode.space()["channels"] != 3:
        print(f"{env_id}: announced {episode.space()['channels']} channels, expected 3", file=sys.stderr)
        sys.exit(1)
    for seed in range(3):
        episode.reset(seed)
        done = False
        while True:
            pixels, _ = episode.observation()
            want = reference(np.asarray(episode.obs))
            if pixels.shape != (5, 7, 3) or (pixels != want).any():
                fail(f"{env_id} seed {seed}", pixels, want)
            frames += 1
            if done:
                break
            done, _ = episode.step(0)
print(f"{every.shape[0] * every.shape[1]} pairs, {frames} frames")
