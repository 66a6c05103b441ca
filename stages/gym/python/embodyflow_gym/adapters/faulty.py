"""A tiny pure-Python environment that fails on purpose, for the bridge's
fault tests (no package needed).

A counter on a line: the agent starts at 0, action 1 moves +1, 2 moves -1,
0 stays; reaching `goal` (kwargs, default 3) is a success. Observation: a
2x2x3 frame filled with the position, proprio = [position]. Discrete(3).
Expert: always +1.

kwargs `fault` = "crash" (os._exit(3)), "hang" (sleeps forever),
"malformed" (writes a frame with bad JSON to the protocol pipe), "raise"
(the env raises RuntimeError: only its episode fails) or "duplicate" (the
worker's reply to this request is written twice, a well-formed frame too
many), at env step `at_step` (default 1) of the episode, only in the
first episode to get there when `fault_once` names a file (one episode of
a group then fails, its siblings run); `text` (true)
adds a text observation, "at N" (the expert's demonstrations then carry
it); `delay` (seconds) sleeps at every step (a slow env, for timeout
tests). At reset: `reset_delay` (seconds) sleeps in every reset (a slow
build, as Meta-World's on a loaded machine); `reset_fault` = "crash",
"hang" or "raise" fails the reset, only the first time when `reset_once`
names a file (made then: the restarted worker finds it). At start-up:
`start_fault` = "crash" kills the worker while it builds the env
(os._exit(5)), only the first time when `start_once` names a file;
`start_delay` (seconds) sleeps while the env is built (a slow build, as
LIBERO's on a loaded machine, for the start-up deadline's tests).
Processes: `child` (a file) starts a `sleep 1000` child when the env is
built (a simulator's server) and appends its pid to the file; `closed` (a
file) gets a line each time an env is closed, `built` (a file) one each
time an env is built (the warm-environment tests count them).
"""

import os
import struct
import subprocess
import time

import numpy as np

from . import BadEnv

PACKAGES = []
FAULTS = ("crash", "hang", "malformed", "raise", "duplicate", None)
RESET_FAULTS = ("crash", "hang", "raise", None)
START_FAULTS = ("crash", None)


def make(env_id, kwargs, seed):
    if env_id != "Counter-v0":
        raise BadEnv(f"the faulty adapter has one env, Counter-v0, not `{env_id}`")
    if kwargs.get("fault") not in FAULTS:
        raise BadEnv(f"fault {kwargs.get('fault')!r}: expected one of crash, hang, malformed, raise, duplicate")
    if kwargs.get("reset_fault") not in RESET_FAULTS:
        raise BadEnv(f"reset_fault {kwargs.get('reset_fault')!r}: expected crash, hang or raise")
    if kwargs.get("start_fault") not in START_FAULTS:
        raise BadEnv(f"start_fault {kwargs.get('start_fault')!r}: expected crash")
    if kwargs.get("start_fault") and once(kwargs.get("start_once")):
        os._exit(5)
    time.sleep(float(kwargs.get("start_delay", 0.0)))
    return Episode(kwargs)


def once(marker):
    """Whether a fault marked by the file `marker` (None: every time) is due;
    the file is made then, so it is due only once."""
    if marker is None:
        return True
    try:
        # Made atomically: of workers racing to it, one finds it due.
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def hang():
    while True:
        time.sleep(3600)


def duplicate_next_frame():
    """Makes the worker write its next frame twice."""
    from .. import protocol

    write = protocol.write_frame
    if getattr(write, "duplicating", False):
        return

    def twice(stream, header, body=b""):
        protocol.write_frame = write
        write(stream, header, body)
        write(stream, header, body)

    twice.duplicating = True
    protocol.write_frame = twice


class Episode:
    def __init__(self, kwargs):
        self.fault = kwargs.get("fault")
        self.at_step = int(kwargs.get("at_step", 1))
        self.goal = int(kwargs.get("goal", 3))
        self.delay = float(kwargs.get("delay", 0.0))
        self.reset_delay = float(kwargs.get("reset_delay", 0.0))
        self.reset_fault = kwargs.get("reset_fault")
        self.reset_once = kwargs.get("reset_once")
        self.fault_once = kwargs.get("fault_once")
        self.text = bool(kwargs.get("text", False))
        self.closed = kwargs.get("closed")
        if kwargs.get("built"):
            with open(kwargs["built"], "a") as f:
                f.write("built\n")
        self.child = None
        if kwargs.get("child"):
            self.child = subprocess.Popen(["sleep", "1000"])
            with open(kwargs["child"], "a") as f:
                f.write(f"{self.child.pid}\n")
        self.position = 0
        self.steps = 0

    def space(self):
        return {
            "height": 2,
            "width": 2,
            "channels": 3,
            "proprio": 1,
            "action": {"kind": "discrete", "n": 3},
            "instruction": True,
            "expert": True,
            "text": 16 if self.text else 0,
        }

    def reset(self, seed):
        if self.reset_delay:
            time.sleep(self.reset_delay)
        if self.reset_fault and once(self.reset_once):
            if self.reset_fault == "crash":
                os._exit(4)
            if self.reset_fault == "raise":
                raise RuntimeError("counter cannot be reset")
            hang()
        self.position = 0
        self.steps = 0
        return f"count to {self.goal}"

    def step(self, action):
        self.steps += 1
        if self.delay:
            time.sleep(self.delay)
        if self.steps == self.at_step and self.fault and once(self.fault_once):
            if self.fault == "crash":
                os._exit(3)
            if self.fault == "hang":
                hang()
            if self.fault == "raise":
                raise RuntimeError(f"counter broke at step {self.steps}")
            if self.fault == "duplicate":
                duplicate_next_frame()
            if self.fault == "malformed":
                from .. import protocol

                bad = b"{not json"
                protocol.OUT.write(struct.pack("<II", 4 + len(bad), len(bad)) + bad)
                protocol.OUT.flush()
        self.position += {0: 0, 1: 1, 2: -1}[int(action)]
        success = self.position == self.goal
        return success, success

    def observation(self):
        value = max(0, min(255, self.position * 40))
        return np.full((2, 2, 3), value, dtype=np.uint8), np.array([self.position], dtype=np.float32)

    def observation_text(self):
        return f"at {self.position}"

    def state_key(self):
        return struct.pack("<q", self.position)

    def expert_action(self):
        return 1

    def close(self):
        if self.child is not None:
            self.child.kill()
            self.child.wait()
        if self.closed:
            with open(self.closed, "a") as f:
                f.write("closed\n")
