"""Any Gymnasium env id whose observation is an image, a vector, a discrete
index, text, or a Dict of those, with a Discrete(n) or a 1-d Box action
space. No expert; the instruction is the task spec's (the worker falls back
to it when an adapter gives none).

Observation parts, by space:
- Box uint8 of shape HxWxC, C = 3, 4 or 1: the frame (at most one per
  observation), always given as RGB the way transformers' `convert_to_rgb`
  makes an array RGB before a vision-language model sees it (`to_rgb`): RGBA
  composited over white, each channel alpha/255 * c + (1 - alpha/255) * 255
  in float64 rounded half to even; a gray channel repeated three times;
- Box of one dimension: proprio values; Discrete(n): a one-hot of n;
- Text (or any space whose values are strings, as MiniGrid's mission): the
  observation's text, appended to the instruction in every decision's
  prompt by the closed-loop driver. A Dict joins its entries in its key
  order: the vectors into one proprio vector, several texts as
  "key: text" lines.
A frameless observation is a 0x0x3 frame; any other space is refused naming
it. A space of strings that is not a `Text` has no length bound: its texts
are announced as at most `text_max_length` characters (kwargs, default
256), and a longer one ends its episode as a failure naming the lengths.

`kwargs` go to gymnasium.make, except `text_max_length`. An env id
"module:EnvId" imports the module first (Gymnasium's form for environments
registered by a package, as `embodyflow_gym.envs:TextKeyRoom-v0`); an id
Gymnasium does not know is refused suggesting that form. State key = the
observation's exact bytes, every part in key order (a text's UTF-8).

Success is the task's rule (`success`, `gym.success` of generate-tasks),
one of RULES:
- "info": info["success"] or info["is_success"] true at the step; the
  default where the env gives one of those keys (looked for in the info of
  a reset and one step with a seeded random action when the env is built);
- "terminal_reward": terminated with a positive reward (MiniGrid's goal
  convention; never the default: a CartPole pole falls with reward 1);
- "survive": the episode reaches its end (truncation or the task's
  max_steps) without terminating;
- "return_at_least:X": the episode's summed reward is at least X when it
  ends (termination, truncation or max_steps).
An env with neither key and no rule is refused naming the rules. The rule
in force is announced in space()["success"].
"""

import numpy as np

from . import BadEnv

PACKAGES = ["gymnasium==1.4.0"]

RULES = ("info", "terminal_reward", "survive", "return_at_least:X")
DEFAULT_TEXT_MAX = 256


class Rule:
    """A success rule, parsed from its text (RULES)."""

    def __init__(self, text):
        self.text = text
        self.kind, _, threshold = text.partition(":")
        self.threshold = None
        if self.kind == "return_at_least":
            try:
                self.threshold = float(threshold)
            except ValueError:
                self.kind = None
        elif threshold:
            self.kind = None
        if self.kind not in ("info", "terminal_reward", "survive", "return_at_least"):
            raise BadEnv(f"success rule {text!r}: expected one of {', '.join(RULES)} (X a number)")

    def success(self, reward_sum, reward, terminated, ended, info):
        """Whether the step that gave `reward` (the episode's return now
        `reward_sum`; `ended`: the episode ends at it) is a success."""
        if self.kind == "info":
            return info_success(info) is True
        if self.kind == "terminal_reward":
            return bool(terminated and reward > 0)
        if self.kind == "survive":
            return bool(ended and not terminated)
        return bool(ended and reward_sum >= self.threshold)


def info_success(info):
    """info["success"] or info["is_success"] as a bool; None when neither key is there."""
    for key in ("success", "is_success"):
        if key in info:
            return bool(info[key])
    return None


def make(env_id, kwargs, seed, max_steps=None, success=None):
    import gymnasium

    kwargs = dict(kwargs)
    if "success" in kwargs:
        raise BadEnv(
            "`success` is not a keyword argument of the env: the success rule is the task's "
            f"(generate-tasks --set gym.success=RULE, one of {', '.join(RULES)})"
        )
    text_max = int(kwargs.pop("text_max_length", DEFAULT_TEXT_MAX))
    try:
        env = gymnasium.make(env_id, **kwargs)
    except gymnasium.error.Error as e:
        hint = ""
        if ":" not in env_id:
            hint = (
                "; an id that a package registers when imported is named `module:EnvId` "
                f"(e.g. `mypackage.envs:{env_id}`: the worker imports `mypackage.envs` first)"
            )
        raise BadEnv(f"environment `{env_id}` does not exist: {e}{hint}") from e
    layout = Layout(env.observation_space, env_id, text_max)
    act = env.action_space
    if not isinstance(act, gymnasium.spaces.Discrete) and not (
        isinstance(act, gymnasium.spaces.Box) and len(act.shape) == 1
    ):
        raise BadEnv(f"`{env_id}` acts in {act}: the generic adapter takes Discrete(n) or a 1-d Box")
    rule = Rule(success) if success is not None else default_rule(env, env_id, seed)
    return Episode(env, layout, rule, max_steps)


def default_rule(env, env_id, seed):
    """"info" when the env reports success in its info (of a reset, or of
    one step with a random action seeded by `seed`), else bad input naming
    the rules."""
    _, info = env.reset(seed=seed)
    if info_success(info) is None:
        env.action_space.seed(seed)
        info = env.step(env.action_space.sample())[4]
    if info_success(info) is None:
        raise BadEnv(
            f"`{env_id}` gives no success signal (no `success` or `is_success` in its info): set the "
            f"task's success rule, gym.success = info | terminal_reward (terminated with a positive "
            f"reward) | survive (reaching the end without terminating) | return_at_least:X (a return "
            f"of at least X at the end)"
        )
    return Rule("info")


IMAGE_CHANNELS = (3, 4, 1)


def is_image(space):
    from gymnasium import spaces

    return (
        isinstance(space, spaces.Box)
        and space.dtype == np.uint8
        and len(space.shape) == 3
        and space.shape[2] in IMAGE_CHANNELS
    )


def to_rgb(frame):
    """An HxWxC uint8 frame (C in IMAGE_CHANNELS) as HxWx3 RGB, by the rule
    of transformers' `image_transforms.convert_to_rgb` for a uint8 array:
    RGBA over a white background (alpha / 255 * c + (1 - alpha / 255) *
    255 in float64, `np.round`), gray repeated; RGB as it is."""
    channels = frame.shape[2]
    if channels == 3:
        return frame
    if channels == 1:
        return np.repeat(frame, 3, axis=2)
    alpha = frame[..., 3:4] / 255
    return np.round(alpha * frame[..., :3] + (1 - alpha) * 255).astype(np.uint8)


def is_text(space):
    from gymnasium import spaces

    if isinstance(space, spaces.Text):
        return True
    if isinstance(space, (spaces.Box, spaces.Discrete, spaces.Dict, spaces.Tuple, spaces.MultiDiscrete, spaces.MultiBinary)):
        return False
    try:
        return isinstance(space.sample(), str)
    except Exception:
        return False


class Layout:
    """Where each part of an observation goes: the frame, the proprio
    vector (with its length) and the text (with its announced bound)."""

    def __init__(self, space, env_id, text_max):
        from gymnasium import spaces

        self.image = None  # None, or the Dict key (or "" for the whole observation)
        self.vectors = []  # [(key, size, n for Discrete one-hot or None)]
        self.texts = []  # [(key, its bound in characters)]
        self.dict = isinstance(space, spaces.Dict)
        entries = list(space.spaces.items()) if self.dict else [("", space)]
        accepted = (
            "a Box image (HxWx3, HxWx4 or HxWx1 uint8), a 1-d Box, a Discrete, a Text, or a Dict of those"
        )
        for key, part in entries:
            where = f"`{env_id}` observes {space}" + (f" (entry `{key}`: {part})" if self.dict else "")
            if is_image(part):
                if self.image is not None:
                    raise BadEnv(f"{where}: the generic adapter takes one image per observation")
                self.image = key
                self.shape = part.shape
            elif isinstance(part, spaces.Box) and len(part.shape) == 1:
                self.vectors.append((key, int(part.shape[0]), None))
            elif isinstance(part, spaces.Discrete):
                self.vectors.append((key, int(part.n), int(part.start)))
            elif is_text(part):
                bound = part.max_length if isinstance(part, spaces.Text) else text_max
                self.texts.append((key, bound))
            else:
                raise BadEnv(f"{where}: the generic adapter takes {accepted}")
        if self.image is None and not self.vectors and not self.texts:
            raise BadEnv(f"`{env_id}` observes {space}: nothing the generic adapter takes ({accepted})")

    def text_max(self):
        """The longest text `text` can return (0: no text): one text as it
        is, several as "key: text" lines."""
        if len(self.texts) == 1:
            return self.texts[0][1]
        return sum(len(key) + 2 + bound for key, bound in self.texts) + max(0, len(self.texts) - 1)

    def proprio_len(self):
        return sum(size for _, size, _ in self.vectors)

    def part(self, obs, key):
        return obs[key] if self.dict else obs

    def pixels(self, obs):
        if self.image is None:
            return np.zeros((0, 0, 3), dtype=np.uint8)
        return to_rgb(np.asarray(self.part(obs, self.image)))

    def proprio(self, obs):
        values = []
        for key, size, start in self.vectors:
            value = self.part(obs, key)
            if start is None:
                values.append(np.asarray(value, dtype=np.float32).reshape(size))
            else:
                one_hot = np.zeros(size, dtype=np.float32)
                one_hot[int(value) - start] = 1.0
                values.append(one_hot)
        return np.concatenate(values) if values else np.zeros(0, dtype=np.float32)

    def state_key(self, obs):
        """Every part's exact bytes in key order (a text's UTF-8)."""
        keys = [k for k, _, _ in self.vectors] + [k for k, _ in self.texts] + ([self.image] if self.image is not None else [])
        parts = []
        for key in sorted(keys):
            value = self.part(obs, key)
            parts.append(value.encode("utf-8") if isinstance(value, str) else np.ascontiguousarray(value).tobytes())
        return b"".join(parts)

    def text(self, obs):
        if len(self.texts) == 1:
            return str(self.part(obs, self.texts[0][0]))
        return "\n".join(f"{key}: {self.part(obs, key)}" for key, _ in self.texts)


class Episode:
    def __init__(self, env, layout, rule, max_steps):
        self.env = env
        self.layout = layout
        self.rule = rule
        self.max_steps = max_steps
        self.obs = None
        self.steps = 0
        self.reward_sum = 0.0

    def space(self):
        from gymnasium import spaces

        act = self.env.action_space
        if isinstance(act, spaces.Discrete):
            action = {"kind": "discrete", "n": int(act.n)}
        else:
            action = {
                "kind": "box",
                "dim": int(act.shape[0]),
                "low": [float(v) for v in act.low],
                "high": [float(v) for v in act.high],
            }
        height, width = (self.layout.shape[0], self.layout.shape[1]) if self.layout.image is not None else (0, 0)
        return {
            "height": int(height),
            "width": int(width),
            "channels": 3,
            "proprio": self.layout.proprio_len(),
            "text": self.layout.text_max(),
            "action": action,
            "instruction": False,
            "expert": False,
            "success": self.rule.text,
        }

    def reset(self, seed):
        self.obs, _ = self.env.reset(seed=seed)
        self.steps, self.reward_sum = 0, 0.0
        return ""

    def step(self, action):
        from gymnasium import spaces

        act = self.env.action_space
        if isinstance(act, spaces.Discrete):
            action = int(action) + int(act.start)
        else:
            action = np.clip(np.asarray(action, dtype=act.dtype), act.low, act.high)
        self.obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        self.reward_sum += float(reward)
        ended = bool(terminated or truncated or (self.max_steps is not None and self.steps >= self.max_steps))
        success = self.rule.success(self.reward_sum, float(reward), terminated, ended, info)
        return success or ended, success

    def observation(self):
        return self.layout.pixels(self.obs), self.layout.proprio(self.obs)

    def observation_text(self):
        return self.layout.text(self.obs)

    def close(self):
        self.env.close()

    def state_key(self):
        return self.layout.state_key(self.obs)
