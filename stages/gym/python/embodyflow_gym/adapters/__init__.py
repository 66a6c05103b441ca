"""Adapters: THE way to bring an environment family into the bridge.

One module per family (`babyai`, `metaworld`, `generic`, `faulty`); a task
names its adapter and env id (`GymTaskSpec` on the Rust side, the spec JSON
in the tasks table), so adding an environment is a module here plus task
specs, no stage change. A module defines:

    PACKAGES = ["minigrid==3.2.0", ...]   # pip requirements, named when missing

    def make(env_id, kwargs, seed) -> Episode
        # import the family's packages HERE (a missing one becomes the
        # typed "run scripts/setup / pip install ..." error); raise
        # BadEnv(message) for an env id or kwargs the family lacks.

and the Episode it returns has:

    space() -> {"height", "width", "channels", "proprio",
                "action": {"kind": "discrete", "n": N}
                        | {"kind": "box", "dim": D, "low": [...], "high": [...]},
                "instruction": bool, "expert": bool,
                "text": N}                # optional: the longest text observation
                                          # in characters (0 or absent: no text)
    reset(seed) -> instruction text (the same seed gives the same state)
    step(action) -> (done, success)      # action: int (discrete) or list of floats
    observation() -> (pixels (H, W, C) uint8, proprio float vector)
    observation_text() -> str            # only when space()["text"]: appended to
                                          # the instruction in each decision's prompt
    state_key() -> bytes                 # hashed into the anchor key (GiGPO)
    expert_action() -> action            # only when space()["expert"]
    close()                              # ends the environment (its simulator,
                                          # windows, processes); called once

The worker enforces the task's max_steps, encodes observations (EFOB) and
hashes state keys (BLAKE2b-128, hex).
"""


class BadEnv(Exception):
    """An env id or kwargs the adapter's family does not have (bad input)."""
