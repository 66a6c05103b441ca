"""Meta-World tasks through `gymnasium.make("Meta-World/MT1", env_name=env_id,
seed=seed)`: `env_id` e.g. "reach-v3".

Observation: no image (a 0x0x3 frame: EFOB allows zero-size images), the
39-d state vector as proprio. Instruction = a fixed sentence per task.
Actions Box(4) in [-1, 1]. Success = info["success"] (the episode ends
there; else at the task's 500-step limit or the spec's max_steps). Expert =
metaworld.policies' scripted policy for the task (ENV_POLICY_MAP, e.g.
SawyerReachV3Policy). State key = the observation vector's bytes: MuJoCo's
state is continuous, so two episodes share an anchor only when their
observations are bit-identical (e.g. the G copies' first decision).

Seeds: `gymnasium.make("Meta-World/MT1")` costs ~1.4 s, 1.2 s of it
sampling the benchmark's 50 tasks (MT1(env_id, seed)), so a worker samples
them once per env id and benchmark seed `kwargs["benchmark_seed"]`
(default 0) and builds each further env from them as MT1 does
(metaworld's own `_init_each_env`, the same wrappers; measured: ~0.2 s,
bit-identical observations over 50 random steps). A reset with seed s
sets task s mod 50 of that benchmark (task sampling on reset off) then
resets with seed s: the same seed gives the same initial state, in ~20 ms.
"""

import numpy as np

from . import BadEnv

PACKAGES = ["gymnasium==1.4.0", "metaworld==3.1.1", "mujoco==3.3.0", "packaging"]

INSTRUCTIONS = {
    "reach-v3": "reach the goal",
    "push-v3": "push the puck to the goal",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "door-open-v3": "open the door",
    "drawer-open-v3": "open the drawer",
    "drawer-close-v3": "close the drawer",
    "button-press-topdown-v3": "press the button from the top",
    "window-open-v3": "open the window",
    "window-close-v3": "close the window",
    "peg-insert-side-v3": "insert the peg into the side hole",
}


def instruction(env_id):
    return INSTRUCTIONS.get(env_id, "solve the task: " + env_id.rsplit("-v", 1)[0].replace("-", " "))


# The MT1 benchmarks this process sampled, by (env id, benchmark seed).
BENCHMARKS = {}


def make(env_id, kwargs, seed):
    import metaworld

    if env_id not in metaworld.ALL_V3_ENVIRONMENTS:
        raise BadEnv(f"`{env_id}` is not a Meta-World v3 task (e.g. reach-v3)")
    return Episode(env_id, kwargs, metaworld)


class Episode:
    def __init__(self, env_id, kwargs, metaworld):
        self.env_id = env_id
        kwargs = dict(kwargs)
        benchmark_seed = int(kwargs.pop("benchmark_seed", 0))
        key = (env_id, benchmark_seed)
        if key not in BENCHMARKS:
            BENCHMARKS[key] = metaworld.MT1(env_id, seed=benchmark_seed)
        benchmark = BENCHMARKS[key]
        self.env = metaworld._init_each_env(
            env_cls=benchmark.train_classes[env_id],
            tasks=list(benchmark.train_tasks),
            seed=benchmark_seed,
            num_tasks=1,
            **kwargs,
        )
        self.tasks = self.env.get_wrapper_attr("tasks")
        self.env.get_wrapper_attr("toggle_sample_tasks_on_reset")(False)
        self.obs = None
        self.policy = None

    def space(self):
        space = self.env.action_space
        return {
            "height": 0,
            "width": 0,
            "channels": 3,
            "proprio": int(np.prod(self.env.observation_space.shape)),
            "action": {
                "kind": "box",
                "dim": int(space.shape[0]),
                "low": [float(v) for v in space.low],
                "high": [float(v) for v in space.high],
            },
            "instruction": True,
            "expert": True,
        }

    def reset(self, seed):
        self.env.unwrapped.set_task(self.tasks[seed % len(self.tasks)])
        self.obs, _ = self.env.reset(seed=seed)
        return instruction(self.env_id)

    def step(self, action):
        space = self.env.action_space
        action = np.clip(np.asarray(action, dtype=np.float32), space.low, space.high)
        self.obs, _, terminated, truncated, info = self.env.step(action)
        success = bool(info.get("success", 0.0) > 0.0)
        return success or terminated or truncated, success

    def observation(self):
        return np.zeros((0, 0, 3), dtype=np.uint8), self.obs

    def close(self):
        self.env.close()

    def state_key(self):
        return np.asarray(self.obs, dtype="<f8").tobytes()

    def expert_action(self):
        if self.policy is None:
            from metaworld.policies import ENV_POLICY_MAP

            if self.env_id not in ENV_POLICY_MAP:
                raise BadEnv(f"Meta-World has no scripted policy for `{self.env_id}`")
            self.policy = ENV_POLICY_MAP[self.env_id]()
        # Clipped to the box: the recorded action is the one the env applies
        # (the scripted policies' gains overshoot [-1, 1]).
        space = self.env.action_space
        action = np.clip(self.policy.get_action(self.obs), space.low, space.high)
        return [float(v) for v in action]
