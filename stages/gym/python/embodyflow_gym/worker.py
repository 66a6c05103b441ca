"""The bridge's worker: `python -u -m embodyflow_gym.worker`, one process
hosting many episodes (slots), driven by the Rust side (stages/gym) over
stdin/stdout frames (`protocol`). stderr passes through (tracebacks).

Requests (header "op", and "id", a number each request has its own of) and
replies (each with the "id" of its request):
  hello {adapter, env_id, kwargs, seed, max_steps, success}
      -> {height, width, channels, proprio, text, action, instruction, expert, images?,
          success?}  (success: the rule the adapter applies, when it takes one)
  reset {episodes: [{slot, spec, seed}]}
      -> {episodes: [{slot, instruction, key, obs_len, text?, error?}]}
         + observations (none for an episode with `error`: its environment
         raised while it was built or reset)
  step_chunk {episodes: [{slot, actions: [a, ...]}]}
      -> {episodes: [{slot, steps, done, success, key, obs_len, text?, error?}]}
         + observations (after the chunk)
  expert_episode {spec, seed, k}
      -> {instruction, success, decisions: [{actions, obs_len, text?}], error?}
         + the observation of each decision (none, with `error`, when the
         expert or the env raised)
  demo_files {paths} / demo_read {path, demo, k} / demo_replay {path, demo, steps}
      -> LIBERO's HDF5 demonstrations (`demos`: the files checked, one
         demo's decisions, the replay check)
  status -> {python, pid, group, builds}  (sys.executable; whether it leads
      its process group; environments built since it started)
  close -> {} and exit (after closing every environment); a served worker
      keeps its environments and waits for its next client instead
While a reset or an expert episode works, the worker sends progress frames
{progress: true, id} (one after each environment it builds, else at most
one per PROGRESS_EVERY seconds, between environments or decisions): the
Rust side counts a worker as hung only after a whole timeout without any
frame, however many environments a reset builds. Before it builds an
environment (in hello, a reset or an expert episode) it sends
{progress: true, building: true, id}: until its next frame the Rust side
waits the longer start-up patience (a LIBERO scene compiles for seconds,
a minute on a loaded machine), as it waits for a starting worker's first
frame. A reply or progress frame
whose id is not the request's is malformed (one frame too many would
otherwise shift every later reply).
Every reply has "ok"; a failed request answers {ok: false, kind:
"bad_input" | "failure", error}. A spec is {adapter, env_id, seed,
max_steps, kwargs, instruction, success?}: an episode ends at max_steps env
steps (a failure unless it succeeded at that step). Adapters are found by
`registry` (entry points, or "module:function"); an adapter's make gets
`max_steps` and the spec's success rule when it takes them. `text` in hello is the longest
text observation in characters (0: the env observes no text; an adapter
that leaves it out observes none); when it is not 0 every observation
carries its text (`text`), and a text longer than announced ends its
episode as a failure.

The worker runs in its own process group (the Rust side kills the group, so
an environment's own processes go with it), closes the descriptors it
inherited beyond stdin, stdout and stderr (a lock its parent holds must not
outlive the parent in a worker stuck in native code), closes every
environment it ends, and exits when stdin ends or its parent changes (the
Rust side died), then killing its group.

Served (`python -m embodyflow_gym.worker --serve SOCKET`, a pipeline
runner's kept workers): the same requests and replies over a Unix socket,
one client connection at a time; the socket appears (renamed into place)
only once it listens. A client that closes its connection, or sends
`close`, or sends bytes that are not a frame, returns the worker to waiting
for the next: the environments of its slots become spare, every built
environment is kept for the next client. It exits when its parent (the
runner) changes, then killing its group. The socket is made 0600 (bound
under umask 077) and a connection from another uid is refused; a served
worker builds only registered adapters and the `module:function` names its
command line lists (`--serve SOCKET --adapter NAME ...`), never one a client
names, and `kwargs` must be a JSON object.
"""

import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
import traceback

from . import protocol, registry
from .adapters import BadEnv


PROGRESS_EVERY = 0.2  # seconds between two progress frames of a long request


class RequestError(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind


# A served worker's adapters: the names its own command line fixes
# (`--adapter NAME`) besides the registered ones; None for a spawned worker,
# whose requests come from the stage that started it.
SERVED_ADAPTERS = None


def check_spec(spec):
    """Refuses a spec whose kwargs are not an object, and, in a served
    worker, one naming an adapter it was not started with (a client names
    no code to import: `module:function` only when the command line lists it)."""
    adapter, kwargs = spec.get("adapter"), spec.get("kwargs")
    if not isinstance(adapter, str):
        raise RequestError("bad_input", f"`adapter` must be a string, not {adapter!r}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise RequestError("bad_input", f"`kwargs` must be a JSON object, not {type(kwargs).__name__} {kwargs!r}")
    if SERVED_ADAPTERS is not None and ":" in adapter and adapter not in SERVED_ADAPTERS:
        raise RequestError(
            "bad_input",
            f"this served worker does not serve adapter `{adapter}`: it serves the registered "
            f"adapters and {sorted(SERVED_ADAPTERS) or 'no other'} (its command line's --adapter; "
            f"a pipeline's kept workers serve the module:function adapters its steps name in gym.adapter)",
        )


def make_episode(spec, seed):
    """A new environment of `spec` (a task spec, or hello's header)."""
    check_spec(spec)
    adapter, env_id, kwargs = spec["adapter"], spec["env_id"], spec.get("kwargs") or {}
    resolved = None
    try:
        resolved = registry.resolve(adapter)
        return resolved.make(env_id, kwargs, seed, spec.get("max_steps"), spec.get("success"))
    except registry.UnknownAdapter as e:
        raise RequestError("bad_input", str(e)) from e
    except ModuleNotFoundError as e:
        packages = " ".join((resolved.packages if resolved else None) or [e.name])
        raise RequestError(
            "bad_input",
            f"adapter `{adapter}` needs the Python package `{e.name}`, missing from "
            f"{sys.executable}: run scripts/setup (or pip install {packages})",
        ) from e
    except BadEnv as e:
        raise RequestError("bad_input", f"adapter `{adapter}`: {e}") from e
    except TypeError as e:
        raise RequestError("bad_input", f"adapter `{adapter}`, env `{env_id}`, kwargs {kwargs}: {e}") from e


def state_hash(episode):
    return hashlib.blake2b(episode.state_key(), digest_size=16).hexdigest()


def space_of(episode):
    """The adapter's space() with `text` (0 when it leaves it out)."""
    space = dict(episode.space())
    space["text"] = int(space.get("text") or 0)
    return space


def observation_text(episode, text_max):
    """The episode's text observation, checked against its bound."""
    text = str(episode.observation_text())
    if len(text) > text_max:
        raise ValueError(
            f"a text observation of {len(text)} characters, beyond the {text_max} the adapter "
            f"announced (a space of strings without a bound: raise kwargs text_max_length)"
        )
    return text


class Slot:
    def __init__(self, spec, episode, space):
        self.spec = spec
        self.key = spec_key(spec)
        self.episode = episode
        self.shape = shape_of(space)
        self.text_max = space["text"]
        self.images = space.get("images") or ()
        self.steps = 0
        self.done = False
        self.header = None

    def observe(self, reply):
        """The observation's EFOB bytes; its text goes into `reply`."""
        pixels, proprio = self.episode.observation()
        if self.header is None:
            self.header = protocol.efob_header(self.shape, len(proprio), self.images)
        if self.text_max:
            reply["text"] = observation_text(self.episode, self.text_max)
        return protocol.efob(pixels, self.shape, proprio, self.header)


def spec_key(spec):
    """What an environment is built from: adapter, env id, kwargs, success
    rule and max_steps (the seed only resets it)."""
    return json.dumps(
        [spec["adapter"], spec["env_id"], spec.get("kwargs") or {}, spec.get("success"), spec.get("max_steps")],
        sort_keys=True,
    )


def shape_of(space):
    return (space["height"], space["width"], space["channels"])


class Worker:
    """Keeps environments warm: an environment is built for a spec key
    (adapter, env id, kwargs, rule, max_steps) only when none of that key is
    free, and every episode resets its environment with its own seed (the
    same seed gives the same state, whichever episode ran on it before).
    Free environments wait in `spare`: hello's, a slot's when the slot moves
    to another spec, an expert episode's when it ends. An environment that
    raised is closed, never reused."""

    def __init__(self):
        self.slots = {}
        # Built environments no slot holds, by spec key (building one may
        # cost a second: Meta-World's MT1).
        self.spare = {}
        self.last_progress = time.monotonic()
        # The id of the request being served.
        self.request = None
        # Environments built since the worker started (`status`).
        self.builds = 0

    def send(self, header, body=b""):
        header["id"] = self.request
        protocol.write_frame(protocol.OUT, header, body)

    def progress(self, now=False):
        """A progress frame, at most one per PROGRESS_EVERY unless `now`."""
        at = time.monotonic()
        if now or at - self.last_progress >= PROGRESS_EVERY:
            self.send({"progress": True})
            self.last_progress = at

    def build(self, spec, seed):
        """A new environment of `spec`, between a progress frame that says
        it is being built and one that follows it."""
        episode = self.make(spec, seed)
        self.progress(now=True)
        return episode

    def make(self, spec, seed):
        """A new environment of `spec`, after a progress frame that says
        it is being built (the Rust side then waits its start-up
        patience)."""
        self.send({"progress": True, "building": True})
        episode = make_episode(spec, seed)
        self.builds += 1
        return episode

    def take(self, spec, seed):
        """A free environment of `spec`'s key, else a new one."""
        spare = self.spare.get(spec_key(spec))
        return spare.pop() if spare else self.build(spec, seed)

    def give_back(self, spec, episode):
        """`episode` is free for the next episode of `spec`'s key."""
        self.spare.setdefault(spec_key(spec), []).append(episode)

    def hello(self, header, body):
        spare = self.spare.setdefault(spec_key(header), [])
        if not spare:
            spare.append(self.make(header, header.get("seed", 0)))
        return space_of(spare[-1]), []

    def status(self, header, body):
        return {
            "python": sys.executable,
            "pid": os.getpid(),
            "group": os.getpgid(0) == os.getpid(),
            "builds": self.builds,
        }, []

    def release(self):
        """The client is gone: every slot's environment becomes spare."""
        for slot in self.slots.values():
            self.give_back(slot.spec, slot.episode)
        self.slots = {}
        self.request = None

    def slot(self, item):
        """The slot of a reset item, holding an environment of its spec."""
        spec = item["spec"]
        slot = self.slots.get(item["slot"])
        if slot is not None and slot.key == spec_key(spec):
            return slot
        if slot is not None:
            del self.slots[item["slot"]]
            self.give_back(slot.spec, slot.episode)
        episode = self.take(spec, int(item["seed"]))
        slot = Slot(spec, episode, space_of(episode))
        self.slots[item["slot"]] = slot
        return slot

    def reset(self, header, body):
        out, obs = [], []
        for item in header["episodes"]:
            reply = {"slot": item["slot"]}
            try:
                slot = self.slot(item)
                slot.spec = item["spec"]
                spec = slot.spec
                reply["instruction"] = slot.episode.reset(int(item["seed"])) or spec.get("instruction") or ""
                slot.steps, slot.done = 0, False
                reply["key"] = state_hash(slot.episode)
                o = slot.observe(reply)
            except RequestError:
                raise
            except Exception as e:  # the env raised: this episode fails, the others go on
                traceback.print_exc()
                self.discard(item["slot"])
                o = b""
                reply = {"slot": item["slot"], "instruction": "", "key": "",
                         "error": f"the environment raised {type(e).__name__} in reset: {e}"}
            obs.append(o)
            reply["obs_len"] = len(o)
            out.append(reply)
            self.progress()
        return {"episodes": out}, obs

    def discard(self, slot):
        """Closes and forgets the environment of `slot` (one that raised)."""
        held = self.slots.pop(slot, None)
        if held is not None:
            close(held.episode)

    def step_chunk(self, header, body):
        out, obs = [], []
        for item in header["episodes"]:
            slot = self.slots.get(item["slot"])
            if slot is None:
                raise RequestError("failure", f"slot {item['slot']} was never reset")
            steps, success = 0, False
            reply = {"slot": item["slot"]}
            try:
                for action in item["actions"]:
                    if slot.done:
                        break
                    done, success = slot.episode.step(action)
                    steps += 1
                    slot.steps += 1
                    if done or slot.steps >= int(slot.spec["max_steps"]):
                        slot.done = True
                o = slot.observe(reply)
                reply["key"] = state_hash(slot.episode)
            except Exception as e:  # the env raised: this episode fails, the others go on
                traceback.print_exc()
                slot.done, success, o = True, False, b""
                reply = {"slot": item["slot"], "key": "", "error": f"the environment raised {type(e).__name__}: {e}"}
            obs.append(o)
            reply.update({"steps": steps, "done": slot.done, "success": bool(success), "obs_len": len(o)})
            out.append(reply)
        return {"episodes": out}, obs

    def expert_episode(self, header, body):
        spec, seed, k = header["spec"], int(header["seed"]), int(header["k"])
        episode = self.take(spec, seed)
        reply = None
        try:
            reply, obs = self.play_expert(episode, spec, seed, k)
            return reply, obs
        finally:
            if reply is None or "error" in reply:
                close(episode)
            else:
                self.give_back(spec, episode)

    def play_expert(self, episode, spec, seed, k):
        space = space_of(episode)
        if not space["expert"]:
            raise RequestError("bad_input", f"adapter `{spec['adapter']}` has no scripted expert")
        shape = shape_of(space)
        instruction = ""
        decisions, obs = [], []
        steps, done, success = 0, False, False
        try:
            instruction = episode.reset(seed) or spec.get("instruction") or ""
            while not done:
                pixels, proprio = episode.observation()
                o = protocol.efob(pixels, shape, proprio, names=space.get("images") or ())
                decision = {"obs_len": len(o)}
                if space["text"]:
                    decision["text"] = observation_text(episode, space["text"])
                actions = []
                for _ in range(k):
                    action = episode.expert_action()
                    actions.append(action)
                    done, success = episode.step(action)
                    steps += 1
                    if steps >= int(spec["max_steps"]):
                        done = True
                    if done:
                        break
                obs.append(o)
                decision["actions"] = actions
                decisions.append(decision)
                self.progress()
        except Exception as e:  # the expert or the env raised: this task's demonstration fails
            traceback.print_exc()
            error = f"the expert episode raised {type(e).__name__}: {e}"
            return {"instruction": instruction, "success": False, "decisions": [], "error": error}, []
        return {"instruction": instruction, "success": bool(success), "decisions": decisions}, obs

    def close_all(self):
        """Closes every environment (the worker is exiting)."""
        for slot in self.slots.values():
            close(slot.episode)
        for spare in self.spare.values():
            for episode in spare:
                close(episode)
        self.slots, self.spare = {}, {}


def demo_handlers(worker):
    """The requests on demonstration files (`demos.Demos`), imported when
    one first comes (numpy, h5py: a worker's start stays as fast)."""

    def handler(method):
        def handle(header, body):
            from . import demos

            return getattr(demos.Demos(worker, RequestError), method)(header, body)

        return handle

    return {op: handler(method) for op, method in (("demo_files", "files"), ("demo_read", "read"), ("demo_replay", "replay"))}


def close(episode):
    """`episode.close()`; an environment that raises there is reported, not
    fatal (the worker is ending it anyway)."""
    try:
        episode.close()
    except Exception:
        traceback.print_exc()


def close_inherited():
    """Closes the descriptors this process inherited beyond stdin, stdout and
    stderr: the ones not marked close-on-exec in the parent (Python opens
    its own non-inheritable), such as the run directory's lock of a
    pipeline runner, which a worker stuck in native code would otherwise
    keep after every stage process is gone."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        try:
            if fd > 2 and os.get_inheritable(fd):
                os.close(fd)
        except OSError:  # the listing's own descriptor, closed since
            pass


def watch_parent():
    parent = os.getppid()
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            # The Rust side died without killing the group: end it here,
            # the environments' own processes with it.
            if os.getpgid(0) == os.getpid():
                os.killpg(0, signal.SIGKILL)
            os._exit(0)


def main(argv):
    close_inherited()
    # Frames go to the original stdout (or a client's socket) only; fd 1
    # then points at stderr so that prints of any library cannot corrupt
    # the protocol.
    protocol.OUT = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    threading.Thread(target=watch_parent, daemon=True).start()
    worker = Worker()
    handlers = {
        "hello": worker.hello,
        "reset": worker.reset,
        "step_chunk": worker.step_chunk,
        "expert_episode": worker.expert_episode,
        "status": worker.status,
    }
    handlers.update(demo_handlers(worker))
    try:
        if argv[:1] == ["--serve"] and len(argv) % 2 == 0 and all(a == "--adapter" for a in argv[2::2]):
            global SERVED_ADAPTERS
            SERVED_ADAPTERS = set(argv[3::2])
            serve_socket(worker, handlers, argv[1])
        elif argv:
            sys.exit(f"usage: python -m embodyflow_gym.worker [--serve SOCKET [--adapter NAME]...], not {argv}")
        else:
            serve(worker, handlers, sys.stdin.buffer)
    finally:
        worker.close_all()


def serve_socket(worker, handlers, path):
    """Serves the clients of the socket `path`, one at a time, forever."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = f"{path}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(staging)
    # The socket is this user's only, from its creation on.
    old = os.umask(0o077)
    try:
        listener.bind(staging)
    finally:
        os.umask(old)
    os.chmod(staging, 0o600)
    listener.listen(16)
    os.rename(staging, path)
    me = os.geteuid()
    while True:
        conn, _ = listener.accept()
        pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        if uid != me:
            print(f"refused a connection from pid {pid} of uid {uid} (this worker's uid is {me})", file=sys.stderr)
            conn.close()
            continue
        with conn, conn.makefile("rb") as reader:
            protocol.OUT = conn.makefile("wb")
            try:
                serve(worker, handlers, reader, served=True)
            except (OSError, protocol.Malformed, ValueError):
                traceback.print_exc()
            finally:
                worker.release()
                with contextlib.suppress(OSError):
                    protocol.OUT.close()


def serve(worker, handlers, stdin, served=False):
    """Answers the requests of `stdin` until it ends or a `close`."""
    while True:
        frame = protocol.read_frame(stdin)
        if frame is None:
            return
        header, body = frame
        worker.request = header.get("id")
        op = header.get("op")
        if op == "close":
            if not served:
                worker.close_all()
            worker.send({"ok": True})
            return
        handler = handlers.get(op)
        try:
            if handler is None:
                raise RequestError("failure", f"unknown request `{op}`")
            reply, obs = handler(header, body)
            reply["ok"] = True
        except RequestError as e:
            reply, obs = {"ok": False, "kind": e.kind, "error": str(e)}, []
        except Exception as e:
            traceback.print_exc()
            reply, obs = {"ok": False, "kind": "failure", "error": f"{type(e).__name__}: {e}"}, []
        worker.send(reply, b"".join(obs))


if __name__ == "__main__":
    main(sys.argv[1:])
