"""The libero adapter against LIBERO driven as the seeds' evaluation code
drives it (OpenVLA's experiments/robot/libero/run_libero_eval.py and
libero_utils.py, OpenVLA-OFT's, SimpleVLA-RL's verl/workers/rollout/
rob_rollout.py env_worker): a reference loop written here, in plain
LIBERO calls, and the adapter, compared value for value. Run by
stages/gym/tests/libero.rs, one check per call:

    python libero_reference.py frames
        libero_spatial/0 from initial state 0 at 64 px: the reference
        (OffScreenRenderEnv, seed 0, env.reset, set_init_state, 10 dummy
        steps, then 30 fixed actions, reading obs["agentview_image"][::-1,
        ::-1], obs["robot0_eye_in_hand_image"][::-1, ::-1], eef position,
        quat2axisangle(eef quaternion), gripper qpos after each step) and
        the adapter (chunks of 1, 3, 8, 8 and 10 actions, observing after
        the reset and each chunk): every frame and proprio value equal.

    python libero_reference.py seeding
        libero_spatial/0 at 16 px, the scene after the reset and the 10
        dummy steps (every body's position and orientation, the MuJoCo
        state): `seeding = "openvla"` resetting initial states 2, 0, 1
        against OpenVLA's loop (one environment seeded 0 once, states 0, 1,
        2 in turn, a few actions each); the default `seeding = "fresh"`
        resetting 2, 1, 2 against a freshly built environment per episode
        (SimpleVLA-RL's env_worker). State 1's scenes differ between the
        two (the fixtures moved).

    python libero_reference.py image
        `embodyflow_gym.openvla_images` (OpenVLA's resize_image and
        center_crop_image without TensorFlow) on a synthetic 256 px image
        against digests of TensorFlow 2.15's outputs; the adapter with
        `image_path = "openvla"`, `cameras = "agentview"`, `center_crop`
        and `max_steps = 5` against LIBERO's 256 px observable so treated,
        frame for frame over 5 actions, the episode ending at the fifth.

Exits 1 naming the first difference; prints one line per check passed.
"""

import os
import sys
import warnings

warnings.simplefilter("ignore")

import numpy as np

from embodyflow_gym.adapters import libero

RESOLUTION = 64
DUMMY = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0]


def fail(message):
    print(message, file=sys.stderr)
    sys.exit(1)


def reference_env(task, resolution):
    """The environment as the references build it (get_libero_env): the
    task's BDDL file, both camera sides `resolution`, seeded 0 once."""
    from libero.libero import get_libero_path
    from libero.libero.envs import OffScreenRenderEnv

    bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
    env = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=resolution, camera_widths=resolution)
    env.seed(0)
    return env


def reference_view(obs):
    """What the references read from one observation dict: both cameras
    turned by 180 degrees, and OFT's state (eef position, axis-angle,
    gripper qpos) through robosuite's own quat2axisangle."""
    from robosuite.utils.transform_utils import quat2axisangle

    state = np.concatenate(
        [obs["robot0_eef_pos"], quat2axisangle(np.array(obs["robot0_eef_quat"])), obs["robot0_gripper_qpos"]]
    )
    return obs["agentview_image"][::-1, ::-1], obs["robot0_eye_in_hand_image"][::-1, ::-1], state


def actions(count):
    """A fixed sequence: moves in every direction, the gripper open then
    closing."""
    rng = np.random.default_rng(3)
    out = np.clip(rng.normal(0.0, 0.5, size=(count, 7)), -1.0, 1.0)
    out[:, 6] = np.where(np.arange(count) < count // 2, -1.0, 1.0)
    return out


def check_frames():
    chunks = [1, 3, 8, 8, 10]
    plan = actions(sum(chunks))
    episode = libero.make("libero_spatial/0", {"resolution": RESOLUTION}, 0)
    env = reference_env(episode.task, RESOLUTION)
    env.reset()
    obs = env.set_init_state(episode.init_states[0])
    for _ in range(10):
        obs, _, _, _ = env.step(DUMMY)
    seen = [reference_view(obs)]
    for action in plan:
        obs, _, _, _ = env.step(action.tolist())
        seen.append(reference_view(obs))
    env.close()

    episode.reset(0)
    t, points = 0, [0]
    observed = [episode.observation()]
    for k in chunks:
        for action in plan[t : t + k]:
            episode.step(action.tolist())
        t += k
        points.append(t)
        observed.append(episode.observation())
    for t, (pixels, proprio) in zip(points, observed):
        agent, wrist, state = seen[t]
        for name, got, want in (("agentview", pixels[..., :3], agent), ("wrist", pixels[..., 3:], wrist)):
            differ = int((got != want).sum())
            if differ:
                fail(f"after {t} actions: {differ} {name} pixel values differ from LIBERO's observation")
        if not np.array_equal(np.asarray(proprio), state):
            fail(f"after {t} actions: proprio {list(proprio)} differs from LIBERO's {list(state)}")
    episode.close()
    print(f"frames: {len(points)} observations equal ({RESOLUTION} px, after {points} actions)")


def scene(env):
    """Every body's position and orientation and the MuJoCo state."""
    data = env.sim.data
    return np.array(data.xpos), np.array(data.xquat), np.array(env.get_sim_state())


def settle(env, state):
    """The references' reset: env.reset, set_init_state, 10 dummy steps."""
    env.reset()
    env.set_init_state(state)
    for _ in range(10):
        env.step(DUMMY)


def same_scene(got, want):
    return all(np.array_equal(a, b) for a, b in zip(got, want))


def check_seeding():
    plan = actions(3)
    task = libero.make("libero_spatial/0", {"resolution": 16}, 0)
    init_states = task.init_states
    # OpenVLA's loop: one environment per task, seeded once, states in turn.
    env = reference_env(task.task, 16)
    openvla = []
    for state in range(3):
        settle(env, init_states[state])
        openvla.append(scene(env))
        for action in plan:
            env.step(action.tolist())
    env.close()
    # SimpleVLA-RL's: a fresh environment per episode.
    fresh = {}
    for state in (1, 2):
        env = reference_env(task.task, 16)
        settle(env, init_states[state])
        fresh[state] = scene(env)
        env.close()
    if same_scene(fresh[1], openvla[1]):
        fail("initial state 1: a fresh environment and OpenVLA's loop show the same scene; the check shows nothing")
    moved = np.abs(fresh[1][0] - openvla[1][0]).max()

    for seeding, order, want in (("openvla", (2, 0, 1), openvla), ("fresh", (2, 1, 2), fresh)):
        kwargs = {"resolution": 16, "seeding": seeding}
        episode = task if seeding == "fresh" else libero.make("libero_spatial/0", kwargs, 0)
        for state in order:
            episode.reset(state)
            if not same_scene(scene(episode.env), want[state]):
                fail(f"seeding {seeding}: initial state {state} (after {order}) differs from the reference's scene")
            for action in plan:
                episode.step(action.tolist())
        episode.close()
    print(f"seeding: openvla and fresh scenes equal the references' (fixtures {moved * 100:.2f} cm apart)")


def synthetic_image(side=256):
    """A 256 px RGB test image of integer arithmetic only (the same bytes on
    every machine): gradients, wrapped edges, a solid block and hashed
    noise."""
    y, x = np.mgrid[0:side, 0:side].astype(np.int64)
    noise = ((x * 73856093) ^ (y * 19349663)) % 31 - 15
    image = np.stack([(x + 2 * y) % 256, (3 * x - y) % 256, (x * y // 64) % 256], axis=-1) + noise[..., None]
    image[side // 4 : side // 2, side // 3 : 2 * side // 3] = [200, 40, 30]
    return np.clip(image, 0, 255).astype(np.uint8)


# SHA-256 of TensorFlow 2.15.0's (tensorflow-cpu) outputs on synthetic_image(),
# by OpenVLA's code: resize_image(image, (224, 224)), then center_crop_image.
TF_RESIZE_224 = "5262f1f020d4726fd18df317049f57abceffc31367955c221022047ae0a4cfdb"
TF_CENTER_CROP_224 = "9c8d820321f8ee08e8e6cc021d104aad751c0781ea54f28ce6332e5d14577daa"


def digest(image):
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest()


def check_image():
    from embodyflow_gym import openvla_images

    resized = openvla_images.resize(synthetic_image(), 224)
    cropped = openvla_images.center_crop(resized)
    if digest(resized) != TF_RESIZE_224:
        fail(f"OpenVLA's resize of the test image: digest {digest(resized)}, TensorFlow's {TF_RESIZE_224}")
    if digest(cropped) != TF_CENTER_CROP_224:
        fail(f"OpenVLA's centre crop of the test image: digest {digest(cropped)}, TensorFlow's {TF_CENTER_CROP_224}")

    # The adapter's frames on that path: the agent view rendered at 256,
    # resized to 224 and centre-cropped, against LIBERO's observable so
    # treated; a budget of 5 steps.
    kwargs = {"image_path": "openvla", "cameras": "agentview", "center_crop": True, "max_steps": 5}
    episode = libero.make("libero_spatial/0", kwargs, 0)
    space = episode.space()
    if (space["height"], space["width"], space["channels"], space["images"]) != (224, 224, 3, ["agentview"]):
        fail(f"image_path openvla, cameras agentview: space {space}")
    env = reference_env(episode.task, openvla_images.CAMERA_SIDE)
    env.reset()
    obs = env.set_init_state(episode.init_states[0])
    for _ in range(10):
        obs, _, _, _ = env.step(DUMMY)
    plan = actions(5)
    seen = []
    for action in [None, *plan]:
        if action is not None:
            obs, _, _, _ = env.step(action.tolist())
        agent, _, state = reference_view(obs)
        seen.append((openvla_images.center_crop(openvla_images.resize(agent, 224)), state))
    env.close()
    episode.reset(0)
    for t, action in enumerate([None, *plan]):
        if action is not None:
            done, _ = episode.step(action.tolist())
            if done != (t == 5):
                fail(f"max_steps 5: step {t} done = {done}")
        pixels, proprio = episode.observation()
        if not np.array_equal(pixels, seen[t][0]) or not np.array_equal(np.asarray(proprio), seen[t][1]):
            fail(f"image_path openvla: after {t} actions the frame or proprio differs from LIBERO's so treated")
    episode.close()
    print("image: OpenVLA's resize and centre crop equal TensorFlow's; the adapter's 224 px agent view equals LIBERO's")


CHECKS = {"frames": check_frames, "seeding": check_seeding, "image": check_image}

if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in CHECKS:
        fail(f"usage: libero_reference.py {'|'.join(CHECKS)}")
    CHECKS[sys.argv[1]]()
