"""Adapters: THE way to bring an environment family into the bridge.

An adapter is a `make` function (with `PACKAGES` beside it in its module),
registered as an entry point of the group `embodyflow_gym.adapters` by the
package that holds it (`registry`): the built-ins `babyai`, `metaworld`
and `generic` live here and register in this package's pyproject.toml,
one line each (`babyai = "embodyflow_gym.adapters.babyai:make"`); a
user's package registers its own the same way, and a task may name a
one-off as "module:function". A task names its adapter and env id
(`GymTaskSpec` on the Rust side, the spec JSON in the tasks table), so
adding an environment is an adapter plus task specs, no stage change.
`faulty` is the fault tests' fixture (group `embodyflow_gym.fixtures`).
An adapter's module defines:

    PACKAGES = ["minigrid==3.2.0", ...]   # pip requirements, named when missing

    def make(env_id, kwargs, seed, max_steps=None, success=None) -> Episode
        # import the family's packages HERE (a missing one becomes the
        # typed "run scripts/setup / pip install ..." error); raise
        # BadEnv(message) for an env id or kwargs the family lacks.
        # `max_steps` (the task's step budget) and `success` (the task's
        # success rule, a text: `generic`'s RULES) are passed only to a
        # make that declares them; a task with a rule for a make without
        # `success` is refused (the adapter decides success itself).

and the Episode it returns has:

    space() -> {"height", "width", "channels", "proprio",
                "action": {"kind": "discrete", "n": N}
                        | {"kind": "box", "dim": D, "low": [...], "high": [...]},
                "instruction": bool, "expert": bool,
                "success": rule,          # optional: the success rule in force
                "images": [name, ...],    # optional: several cameras joined along
                                          # the channels (each C/N), named in order
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
