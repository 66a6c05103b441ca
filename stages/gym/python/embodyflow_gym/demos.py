"""LIBERO's demonstration files (HDF5, read with h5py) for `table import
--format libero-hdf5` and `table replay`, served by the bridge's worker
(requests `demo_files`, `demo_read`, `demo_replay`; worker.py).

A file holds one task's demonstrations, `data/demo_<n>` each with
`actions` (N x 7: delta position, delta axis-angle, gripper -1 open / +1
close), `obs/agentview_rgb` and `obs/eye_in_hand_rgb` (N x H x W x 3
uint8), `obs/ee_states` (N x 6: end-effector position and axis-angle),
`obs/gripper_states` (N x 2: finger positions) and `states` (N x the
flattened MuJoCo state), among others (`joint_states`, `ee_pos`, `ee_ori`,
`robot_states`, `rewards`, `dones`). Two producers, two layouts:

- `libero`: LIBERO's own files (`scripts/create_dataset.py`, 128 px).
  `data` carries attributes: `problem_info` (JSON with the
  `language_instruction`), `bddl_file_name`, `env_args`,
  `macros_image_convention`. Each observation is recorded AFTER its action
  (the script steps, then records), so the observation a policy saw before
  action t is obs[t - 1]: decision observations are obs[t - 1] for actions
  t >= 1, and action 0, whose preceding observation the file lacks, is left
  out.
- `openvla`: OpenVLA's regenerations (`experiments/robot/libero/
  regenerate_libero_dataset.py`, the "modified_libero" / `*_no_noops`
  files, 256 px): no attributes on `data`; replayed from states[0] after 10
  settling steps of the dummy action, no-op actions dropped, failed demos
  dropped, each observation recorded BEFORE its action (obs[t] with
  actions[t], as the bridge's rollouts pair them).

The layout is `libero` when `data` has `problem_info`, else `openvla`.
Images are stored as robosuite renders them (`macros_image_convention`
`opengl`, the default, upside down; `opencv` flipped vertically already) and
turned here to the adapter's view (`image[::-1, ::-1]` of the OpenGL
image, OpenVLA's rotation). Proprio = ee_states + gripper_states, the
adapter's 8 values in its order. The task is found in LIBERO's benchmark:
by `bddl_file_name` (its folder is the suite) when the file has it, else by
the file's name (`<task name>_demo.hdf5`, the datasets' naming), in the
suite its folder names (`libero_spatial`, `libero_spatial_no_noops`) or in
every suite when the folder names none; instruction = the task's language,
as the adapter gives it.

Every file is checked before any demo is read (`inspect`): a missing
file, a file h5py cannot open, no `data` group, a group in it that is not
`demo_<n>`, a demo without `actions` or an expected observation key, shapes
or lengths that disagree, non-finite actions or proprio, images that are
not square uint8 RGB, files of different resolutions, a task LIBERO does not
have: refused (bad input) naming the file and the group or key. Images are
never read there; `demo_read` reads one demo's decision frames at a time.

Every size the file declares is bounded before anything of that size is
read or allocated (an HDF5 dataset may declare any shape and store
nothing, the fill value standing in): at most `MAX_DEMOS` groups in
`data`, `MAX_ACTIONS` actions per demo, images of at most `MAX_RESOLUTION`
px, `MAX_STATE_DIM` MuJoCo state values, text attributes of a single
string of at most `MAX_TEXT_BYTES`, numeric actions, proprio, states and
dones; and one demo's decisions (or a replay's steps) at most
`MAX_REPLY_BYTES` of observations, what one reply carries (with `k`, the
import's chunk length, `demo_files` checks every demo's decisions against
it before any is read). A size beyond its limit is refused (bad input)
naming the file, the dataset and the value. An error of h5py or of the
HDF5 library while reading (a truncated or corrupted file) is bad input
too, naming the file and what was being read, never the worker's failure.

The replay check (`demo_replay`, LIBERO's own validation of demos):
builds the task's environment through the adapter at the file's
resolution, `env.reset()`, `env.set_init_state(states[0])` (plus the 10
settling steps for the `openvla` layout), steps the demo's actions through
the adapter (clipped, gripper convention `libero`), and compares each
replayed observation with the file's (mean absolute pixel difference per
camera, largest proprio difference) and each MuJoCo state with the file's
next state (the L2 norm create_dataset.py warns about above 0.01).
"""

import json
import os
import re

import numpy as np

from . import protocol
from .adapters import libero as adapter

CAMERAS = (("agentview", "agentview_rgb"), ("wrist", "eye_in_hand_rgb"))
PROPRIO = (("ee_states", 6), ("gripper_states", 2))
ACTION_DIM = 7
DEMO = re.compile(r"demo_(\d{1,9})$")

# Limits on what a file may declare (the module doc); the Rust side
# (stages/table/src/libero_hdf5.rs) holds the same values. LIBERO's files
# hold 50 demos of a few hundred actions at 128 px (OpenVLA's 256 px), a
# MuJoCo state of about a hundred values.
MAX_DEMOS = 10_000
MAX_ACTIONS = 10_000
MAX_RESOLUTION = 1024
MAX_STATE_DIM = 4096
MAX_TEXT_BYTES = 1 << 20
MAX_REPLY_BYTES = 512 << 20
# Dataset element kinds read as numbers: float, signed, unsigned, bool.
NUMERIC = "fiub"
# What h5py and the HDF5 library raise on a file they cannot read.
READ_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, IndexError, OverflowError)
# The files checked in this worker, by (path, mtime, size).
INSPECTED = {}


class BadDemo(Exception):
    """A file that is not a LIBERO demonstration file (bad input)."""


class reading:
    """A context in which an error of h5py reading `what` of the file
    `path` is BadDemo naming both (a truncated or corrupted file is bad
    input, not the worker's failure)."""

    def __init__(self, path, what):
        self.path, self.what = path, what

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        if kind is not None and issubclass(kind, READ_ERRORS) and not issubclass(kind, BadDemo):
            raise BadDemo(f"{self.path}: {self.what} cannot be read ({kind.__name__}: {error})") from error
        return False


def name_of(item):
    return item.name.lstrip("/")


def over(path, what, value, limit, name):
    """BadDemo naming a size of the file beyond its limit."""
    return BadDemo(f"{path}: {what} {value}, more than {limit} ({name})")


def numeric(path, item):
    """Refuses a dataset whose elements are not numbers (strings, compounds)."""
    if item.dtype.kind not in NUMERIC:
        raise BadDemo(f"{path}: {name_of(item)} holds {item.dtype}, expected numbers")


def read_all(path, item):
    """Every value of a dataset whose size is bounded already."""
    with reading(path, name_of(item)):
        return item[()]


def h5py_module():
    try:
        import h5py
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError(
            "reading LIBERO's HDF5 demonstrations needs the Python package h5py", name="h5py"
        ) from e
    return h5py


def open_file(path):
    h5py = h5py_module()
    if not os.path.exists(path):
        raise BadDemo(f"{path}: no such file")
    try:
        return h5py.File(path, "r")
    except READ_ERRORS as e:
        raise BadDemo(f"{path}: not an HDF5 file h5py can open ({e})") from e


def text_attr(path, group, key):
    """The text attribute `key` of `group` (None when absent): one string
    of at most MAX_TEXT_BYTES, its shape and size checked before it is
    read."""
    where = f"{name_of(group) or '/'}'s attribute {key}"
    with reading(path, where):
        if key not in group.attrs:
            return None
        attr = group.attrs.get_id(key)
        if attr.shape not in ((), (1,)):
            raise BadDemo(f"{path}: {where} has shape {attr.shape}, expected one string")
        size = attr.get_storage_size()
        if size > MAX_TEXT_BYTES:
            raise over(path, f"{where} holds", f"{size} bytes", MAX_TEXT_BYTES, "MAX_TEXT_BYTES")
        value = group.attrs[key]
        if hasattr(value, "shape") and value.shape == (1,):
            value = value[0]
        text = value.decode("utf-8") if isinstance(value, bytes) else str(value)
    if len(text) > MAX_TEXT_BYTES:
        raise over(path, f"{where} holds", f"{len(text)} characters", MAX_TEXT_BYTES, "MAX_TEXT_BYTES")
    return text


def dataset(path, group, key):
    """`group[key]`, a dataset, or BadDemo naming it."""
    with reading(path, f"{name_of(group)}/{key}"):
        item = group.get(key)
        if item is None or not hasattr(item, "shape"):
            missing = "is missing" if item is None else "is not a dataset"
            raise BadDemo(f"{path}: {name_of(group)}/{key} {missing}")
        item.shape, item.dtype  # read here: a header h5py cannot read is named
    return item


def demo_names(path, data):
    """The `demo_<n>` groups of `data`, by n (at most MAX_DEMOS)."""
    with reading(path, "data"):
        count = len(data)
    if count > MAX_DEMOS:
        raise over(path, "data holds", f"{count} groups", MAX_DEMOS, "MAX_DEMOS")
    names = []
    with reading(path, "data"):
        keys = list(data.keys())
    for name in keys:
        if not isinstance(name, str):
            # h5py gives a name that is not UTF-8 as bytes.
            raise BadDemo(f"{path}: data holds a group named {name!r}, not a UTF-8 name demo_<n>")
        match = DEMO.match(name)
        with reading(path, f"data/{name}"):
            is_group = match is not None and hasattr(data[name], "keys")
        if not is_group:
            raise BadDemo(f"{path}: data/{name}: expected only groups demo_<n> in data")
        names.append((int(match.group(1)), name))
    if not names:
        raise BadDemo(f"{path}: data holds no demo_<n> group")
    return [name for _, name in sorted(names)]


def find_task(path, data):
    """(suite name, task index, task) of the file, from LIBERO's benchmark."""
    from libero.libero import benchmark

    suites = benchmark.get_benchmark_dict()
    bddl = text_attr(path, data, "bddl_file_name")
    if bddl:
        folder, name = os.path.basename(os.path.dirname(bddl)), os.path.basename(bddl)
        wanted = [folder] if folder in adapter.MAX_STEPS else []
        match = lambda task: task.bddl_file == name
        what = f"data's bddl_file_name {bddl}"
    else:
        stem = os.path.basename(path)
        stem = stem[: -len("_demo.hdf5")] if stem.endswith("_demo.hdf5") else os.path.splitext(stem)[0]
        folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
        wanted = [s for s in adapter.MAX_STEPS if folder == s or folder.startswith(s + "_")]
        match = lambda task: task.name == stem
        what = f"the file name (task `{stem}`; LIBERO names each file <task name>_demo.hdf5)"
    found = []
    for suite_name in wanted or list(adapter.MAX_STEPS):
        suite = suites[suite_name]()
        for index in range(suite.n_tasks):
            task = suite.get_task(index)
            if match(task):
                found.append((suite_name, index, task))
    if not found:
        raise BadDemo(f"{path}: no LIBERO task matches {what} in {', '.join(wanted or adapter.MAX_STEPS)}")
    if len({(s, i) for s, i, _ in found}) > 1:
        both = ", ".join(f"{s}/{i}" for s, i, _ in found)
        raise BadDemo(f"{path}: {what} names tasks of several suites ({both}); put the file in a folder named after its suite")
    return found[0]


def finite_rows(path, item):
    """Refuses a numeric dataset (of bounded size) with a value that is
    not finite, naming its first such row."""
    numeric(path, item)
    values = read_all(path, item)
    bad = np.flatnonzero(~np.isfinite(values).reshape(len(values), -1).all(axis=1))
    if bad.size:
        raise BadDemo(f"{path}: {name_of(item)} row {int(bad[0])} is not finite")


def observation_bytes(resolution):
    """The bytes of one decision's observation (EFOB) in a reply."""
    names_len = sum(1 + len(name.encode("utf-8")) for name, _ in CAMERAS)
    return 16 + names_len + resolution * resolution * 3 * len(CAMERAS) + 4 * sum(w for _, w in PROPRIO)


def check_reply(path, what, count, resolution):
    """Refuses `count` observations at `resolution` beyond MAX_REPLY_BYTES."""
    size = count * observation_bytes(resolution)
    if size > MAX_REPLY_BYTES:
        raise over(path, f"{what}: {count} observations of {resolution} px are", f"{size} bytes", MAX_REPLY_BYTES, "MAX_REPLY_BYTES")


def inspect_demo(path, data, name, layout):
    """What one demo holds (sizes bounded and lengths checked before any
    value is read, images not read)."""
    with reading(path, f"data/{name}"):
        demo = data[name]
    actions = dataset(path, demo, "actions")
    n = actions.shape[0] if len(actions.shape) == 2 else -1
    if n < 0 or actions.shape[1] != ACTION_DIM:
        raise BadDemo(f"{path}: data/{name}/actions has shape {actions.shape}, expected (N, {ACTION_DIM})")
    if n > MAX_ACTIONS:
        raise over(path, f"data/{name}/actions has", f"{n} rows", MAX_ACTIONS, "MAX_ACTIONS")
    with reading(path, f"data/{name}/obs"):
        obs = demo.get("obs")
        if obs is None or not hasattr(obs, "keys"):
            raise BadDemo(f"{path}: data/{name}/obs is missing")
    shape = None
    for _, key in CAMERAS:
        images = dataset(path, obs, key)
        if len(images.shape) != 4 or images.shape[3] != 3 or images.dtype != np.uint8:
            raise BadDemo(
                f"{path}: data/{name}/obs/{key} has shape {images.shape} of {images.dtype}, expected (N, H, W, 3) uint8"
            )
        if images.shape[0] != n:
            raise BadDemo(f"{path}: data/{name}/obs/{key} has {images.shape[0]} rows, data/{name}/actions has {n}")
        if max(images.shape[1:3]) > MAX_RESOLUTION:
            side = f"{images.shape[1]} x {images.shape[2]} px"
            raise over(path, f"data/{name}/obs/{key} has images of", side, f"{MAX_RESOLUTION} px", "MAX_RESOLUTION")
        if shape is not None and images.shape[1:] != shape:
            raise BadDemo(
                f"{path}: data/{name}/obs/{key} has images of {images.shape[1:]}, obs/{CAMERAS[0][1]} of {shape}"
            )
        shape = images.shape[1:]
    if shape[0] != shape[1] or shape[0] == 0:
        raise BadDemo(f"{path}: data/{name}/obs/{CAMERAS[0][1]} has {shape[0]} x {shape[1]} images; LIBERO's cameras are square")
    for key, width in PROPRIO:
        values = dataset(path, obs, key)
        if values.shape != (n, width):
            raise BadDemo(f"{path}: data/{name}/obs/{key} has shape {values.shape}, expected ({n}, {width}) (N = {n} actions)")
        finite_rows(path, values)
    finite_rows(path, actions)
    with reading(path, f"data/{name}/states"):
        has_states = "states" in demo
    if has_states:
        states = dataset(path, demo, "states")
        if len(states.shape) != 2 or states.shape[0] != n:
            raise BadDemo(f"{path}: data/{name}/states has shape {states.shape}, data/{name}/actions has {n} rows")
        if states.shape[1] > MAX_STATE_DIM:
            raise over(path, f"data/{name}/states has", f"{states.shape[1]} values per row", MAX_STATE_DIM, "MAX_STATE_DIM")
        numeric(path, states)
    first = 1 if layout == "libero" else 0
    if n <= first:
        raise BadDemo(f"{path}: data/{name}/actions has {n} rows: no action with an observation before it")
    with reading(path, f"data/{name}/dones"):
        has_dones = "dones" in demo
    complete = True
    if has_dones:
        dones = dataset(path, demo, "dones")
        if len(dones.shape) != 1 or dones.shape[0] not in (0, n):
            raise BadDemo(f"{path}: data/{name}/dones has shape {dones.shape}, expected ({n},)")
        numeric(path, dones)
        if dones.shape[0]:
            with reading(path, f"data/{name}/dones"):
                complete = bool(dones[-1])
    return {"name": name, "actions": n, "first": first, "resolution": int(shape[0]), "complete": complete}


def inspect(path):
    """The file's task, layout, image convention and demos; BadDemo naming
    the file and the group or key when it is not a LIBERO demonstration
    file."""
    with open_file(path) as f:
        with reading(path, "data"):
            data = f.get("data")
            if data is None or not hasattr(data, "keys"):
                raise BadDemo(f"{path}: no group `data` (a LIBERO demonstration file holds data/demo_<n>)")
            # The layout probe: LIBERO's own files carry `problem_info`.
            layout = "libero" if "problem_info" in data.attrs else "openvla"
        convention = text_attr(path, data, "macros_image_convention") or "opengl"
        if convention not in ("opengl", "opencv"):
            raise BadDemo(f"{path}: data's macros_image_convention `{convention[:100]}`: expected opengl or opencv")
        if layout == "libero":
            try:
                json.loads(text_attr(path, data, "problem_info"))
            except (ValueError, RecursionError) as e:
                raise BadDemo(f"{path}: data's problem_info is not JSON ({e})") from e
        demos = [inspect_demo(path, data, name, layout) for name in demo_names(path, data)]
        resolutions = {d["resolution"] for d in demos}
        if len(resolutions) > 1:
            raise BadDemo(f"{path}: demos of several resolutions {sorted(resolutions)}")
        suite, index, task = find_task(path, data)
    return {
        "path": path,
        "layout": layout,
        "convention": convention,
        "env_id": f"{suite}/{index}",
        "instruction": task.language,
        "max_steps": adapter.MAX_STEPS[suite],
        "resolution": demos[0]["resolution"],
        "demos": demos,
    }


def turn(images, convention):
    """Images as the adapter sees them: the OpenGL render turned by 180
    degrees (an `opencv` image is the OpenGL one flipped vertically)."""
    return images[..., :, ::-1, :] if convention == "opencv" else images[..., ::-1, ::-1, :]


def frames(obs, rows, convention):
    """(frames (len(rows), H, W, 6) uint8, proprio (len(rows), 8)) of the
    given rows (increasing), read from the file row by row set."""
    rows = list(rows)
    views = [turn(obs[key][rows], convention) for _, key in CAMERAS]
    proprio = np.concatenate([obs[key][rows] for key, _ in PROPRIO], axis=1)
    return np.concatenate(views, axis=3), proprio


def shape_of(resolution):
    return (resolution, resolution, 3 * len(CAMERAS))


def names():
    return tuple(name for name, _ in CAMERAS)


class Demos:
    """The requests of the worker (worker.py) on demonstration files:
    `worker` sends progress frames and keeps built environments (a replay
    takes the task's and gives it back), `refusal(kind, message)` is the
    worker's RequestError (passed in: the worker runs as `__main__`)."""

    def __init__(self, worker, refusal):
        self.worker = worker
        self.refusal = refusal

    def inspect(self, path):
        """`inspect(path)`, once per version of the file in this worker
        (every demo read and replay asks for it)."""
        try:
            stat = os.stat(path)
            key = (path, stat.st_mtime_ns, stat.st_size)
        except OSError:
            key = None
        if key is not None and key in INSPECTED:
            return INSPECTED[key]
        try:
            info = inspect(path)
            if key is not None:
                INSPECTED[key] = info
            return info
        except BadDemo as e:
            raise self.refusal("bad_input", str(e)) from e
        except ModuleNotFoundError as e:
            raise self.refusal(
                "bad_input", f"{e}; run scripts/setup (or pip install {' '.join(adapter.PACKAGES + ['h5py'])})"
            ) from e
        except READ_ERRORS as e:
            # What h5py raises on a damaged file outside the reads that name
            # their dataset: still the file's fault.
            raise self.refusal(
                "bad_input", f"{path}: cannot be read as a demonstration file ({type(e).__name__}: {e})"
            ) from e

    def files(self, header, body):
        """{paths, k?} -> {files: [inspect(path), ...]}: every file checked;
        one resolution for all; with `k` (the import's actions per
        decision) each demo's decisions within one reply
        (MAX_REPLY_BYTES)."""
        files = []
        k = header.get("k")
        for path in header["paths"]:
            info = self.inspect(path)
            if k is not None:
                for demo in info["demos"]:
                    decisions = -(-(demo["actions"] - demo["first"]) // max(int(k), 1))
                    try:
                        check_reply(path, f"data/{demo['name']} at --chunk-len {k}", decisions, info["resolution"])
                    except BadDemo as e:
                        raise self.refusal("bad_input", str(e)) from e
            files.append(info)
            self.worker.progress()
        first = files[0]
        for info in files[1:]:
            if info["resolution"] != first["resolution"]:
                raise self.refusal(
                    "bad_input",
                    f"{info['path']}: images of {info['resolution']} px, {first['path']} has {first['resolution']} px "
                    f"(one table holds one observation shape)",
                )
        return {"files": files}, []

    def read(self, header, body):
        """{path, demo, k} -> one demo's decisions: every k-th observation
        before its action (EFOB, in the body) and the chunk of k actions
        after it."""
        path, name, k = header["path"], header["demo"], int(header["k"])
        info = self.inspect(path)
        demo = next(d for d in info["demos"] if d["name"] == name)
        shape = shape_of(info["resolution"])
        head = protocol.efob_header(shape, sum(w for _, w in PROPRIO), names())
        first, n = demo["first"], demo["actions"]
        starts = list(range(first, n, k))
        try:
            check_reply(path, f"data/{name} at --chunk-len {k}", len(starts), info["resolution"])
            with open_file(path) as f, reading(path, f"data/{name}"):
                group = f["data"][name]
                actions = group["actions"][()]
                # The observation before action t: obs[t - first].
                pixels, proprio = frames(group["obs"], [t - first for t in starts], info["convention"])
        except BadDemo as e:
            raise self.refusal("bad_input", str(e)) from e
        decisions, obs = [], []
        for d, t in enumerate(starts):
            o = protocol.efob(pixels[d], shape, proprio[d], head)
            obs.append(o)
            decisions.append({"obs_len": len(o), "actions": actions[t : t + k].tolist()})
        return {"decisions": decisions, "complete": demo["complete"]}, obs

    def replay(self, header, body):
        """{path, demo, steps} -> the replay check of one demo (module doc),
        its first `steps` actions; each replayed observation (EFOB) in the
        body."""
        path, name, limit = header["path"], header["demo"], int(header["steps"])
        info = self.inspect(path)
        if not any(d["name"] == name for d in info["demos"]):
            raise self.refusal("bad_input", f"{path}: data/{name} is missing")
        demo = next(d for d in info["demos"] if d["name"] == name)
        steps = min(limit, demo["actions"])
        try:
            check_reply(path, f"data/{name}: a replay of {steps} steps", steps, info["resolution"])
            with open_file(path) as f, reading(path, f"data/{name}"):
                group = f["data"][name]
                if "states" not in group:
                    raise BadDemo(f"{path}: data/{name}/states is missing (the replay starts from states[0])")
                actions, states = group["actions"][()], group["states"][()]
                want_pixels, want_proprio = frames(group["obs"], range(steps), info["convention"])
        except BadDemo as e:
            raise self.refusal("bad_input", str(e)) from e
        spec = {"adapter": "libero", "env_id": info["env_id"], "kwargs": {"resolution": info["resolution"]}}
        episode = self.worker.take(spec, 0)
        try:
            reply = self.play(episode, info, actions, states, steps, want_pixels, want_proprio)
        except Exception:
            episode.close()
            raise
        self.worker.give_back(spec, episode)
        return reply

    def play(self, episode, info, actions, states, steps, want_pixels, want_proprio):
        # OpenVLA's regenerations settle the scene as its evaluation does.
        episode.reset_to(states[0], adapter.WAIT_STEPS if info["layout"] == "openvla" else 0)
        shape = shape_of(info["resolution"])
        head = protocol.efob_header(shape, sum(w for _, w in PROPRIO), names())
        pixel_error = np.zeros(len(CAMERAS))
        proprio_error, state_error, success, replayed, obs = 0.0, None, False, 0, []

        def compare(t):
            nonlocal proprio_error
            pixels, proprio = episode.observation()
            diff = np.abs(pixels.astype(np.int16) - want_pixels[t].astype(np.int16))
            for c in range(len(CAMERAS)):
                pixel_error[c] += diff[..., 3 * c : 3 * c + 3].mean()
            proprio_error = max(proprio_error, float(np.abs(np.asarray(proprio) - want_proprio[t]).max()))
            obs.append(protocol.efob(pixels, shape, proprio, head))

        for t in range(steps):
            if info["layout"] == "openvla":
                compare(t)
            _, won = episode.step(actions[t].tolist())
            if t + 1 < len(states):
                error = float(np.linalg.norm(states[t + 1] - episode.env.get_sim_state()))
                state_error = error if state_error is None else max(state_error, error)
            if info["layout"] == "libero":
                compare(t)
            replayed += 1
            self.worker.progress()
            if won:
                success = True
                break
        reply = {
            "steps": replayed,
            "success": success,
            "shape": list(shape) + [sum(w for _, w in PROPRIO)],
            "pixel_error": {name: float(e / max(replayed, 1)) for (name, _), e in zip(CAMERAS, pixel_error)},
            "proprio_error": proprio_error,
            "state_error": state_error,
            "obs_len": [len(o) for o in obs],
        }
        return reply, obs
