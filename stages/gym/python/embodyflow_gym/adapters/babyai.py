"""BabyAI levels (minigrid): `env_id` e.g. "BabyAI-GoToLocal-v0".

Observation: the 7x7x3 symbolic egocentric view as the frame, uint8,
channels scaled to spread over 0..255 (object index x 23, 0..230; colour
index x 51, 0..255; state index x 127, 0..254: exact and invertible by
integer division); or, with `view = "rgb"` in kwargs, the same view
rendered as an RGB image, 7 x tile_size pixels a side (MiniGrid's
`RGBImgPartialObsWrapper` frame: `get_frame(agent_pov=True)`; `tile_size`
is MiniGrid's own keyword, default 32: 224 x 224), the frame a camera-like
vision encoder reads. Proprio = the agent's direction one-hot (4). Instruction
= the mission. Actions Discrete(7) (left, right, forward, pickup, drop,
toggle, done). Success = the episode terminated with a positive reward.
Expert = minigrid.utils.baby_ai_bot.BabyAIBot. State key = the full grid
encoding + agent position + direction + what it carries. Encoding the grid
costs ~75 us (a Python loop over its cells, a third of a step), so it is
encoded at reset and then patched: only pickup, drop and toggle (3, 4, 5)
change the grid, and only in the cell in front of the agent, which is
re-encoded after them; turning and moving forward change only the agent's
position and direction, which enter the key directly. (BabyAI levels have
no moving objects; an adapter for MiniGrid's dynamic-obstacle envs would
re-encode every step.)
"""

import numpy as np

from . import BadEnv

PACKAGES = ["gymnasium==1.4.0", "minigrid==3.2.0"]
# Object index <= 10, colour <= 5, state <= 2: the products fit in a byte.
SCALE = np.array([23, 51, 127], dtype=np.uint8)
# Actions that can change the grid: pickup, drop, toggle.
GRID_ACTIONS = (3, 4, 5)
# What the frame shows (kwargs "view").
VIEWS = ("symbolic", "rgb")


def make(env_id, kwargs, seed):
    import gymnasium
    import minigrid  # noqa: F401  (registers the BabyAI ids)

    if not env_id.startswith("BabyAI-"):
        raise BadEnv(f"`{env_id}` is not a BabyAI level (ids start with BabyAI-)")
    kwargs = dict(kwargs)
    view = kwargs.pop("view", "symbolic")
    if view not in VIEWS:
        raise BadEnv(f"view {view!r}: expected one of {', '.join(VIEWS)}")
    try:
        env = gymnasium.make(env_id, **kwargs)
    except gymnasium.error.Error as e:
        raise BadEnv(f"environment `{env_id}` does not exist: {e}") from e
    return Episode(env, view == "rgb")


class Episode:
    def __init__(self, env, rgb):
        self.env = env
        self.rgb = rgb
        self.obs = None
        self.bot = None
        self.grid = None

    def space(self):
        side = int(self.env.unwrapped.agent_view_size)
        if self.rgb:
            side *= int(self.env.unwrapped.tile_size)
        return {
            "height": side,
            "width": side,
            "channels": 3,
            "proprio": 4,
            "action": {"kind": "discrete", "n": int(self.env.action_space.n)},
            "instruction": True,
            "expert": True,
        }

    def reset(self, seed):
        self.obs, _ = self.env.reset(seed=seed)
        self.bot = None
        self.grid = None
        return self.obs["mission"]

    def step(self, action):
        front = None
        if int(action) in GRID_ACTIONS and self.grid is not None:
            front = tuple(int(v) for v in self.env.unwrapped.front_pos)
        self.obs, reward, terminated, truncated, _ = self.env.step(int(action))
        if front is not None:
            self._patch(front)
        return terminated or truncated, bool(terminated and reward > 0)

    def observation(self):
        if self.rgb:
            u = self.env.unwrapped
            image = u.get_frame(tile_size=u.tile_size, agent_pov=True)
        else:
            image = self.obs["image"] * SCALE
        proprio = np.zeros(4, dtype=np.float32)
        proprio[int(self.obs["direction"])] = 1.0
        return image, proprio

    def close(self):
        self.env.close()

    def state_key(self):
        u = self.env.unwrapped
        carrying = u.carrying.encode() if u.carrying is not None else (0, 0, 0)
        pos = tuple(int(v) for v in u.agent_pos)
        tail = np.array([*pos, int(u.agent_dir), *carrying], dtype=np.int64)
        if self.grid is None:
            self.grid = u.grid.encode()
        return self.grid.tobytes() + tail.tobytes()

    def _patch(self, cell):
        """Re-encodes one cell of the cached grid encoding (as Grid.encode)."""
        from minigrid.core.constants import OBJECT_TO_IDX

        grid = self.env.unwrapped.grid
        i, j = cell
        if 0 <= i < grid.width and 0 <= j < grid.height:
            obj = grid.get(i, j)
            self.grid[i, j] = obj.encode() if obj is not None else (OBJECT_TO_IDX["empty"], 0, 0)

    def expert_action(self):
        if self.bot is None:
            from minigrid.utils.baby_ai_bot import BabyAIBot

            self.bot = BabyAIBot(self.env)
        return int(self.bot.replan())
