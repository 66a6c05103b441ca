"""Gymnasium environments of this package, registered when the module is
imported, so that any Gymnasium process reaches them by the
"module:EnvId" form of `gymnasium.make`:

    gymnasium.make("embodyflow_gym.envs:TextKeyRoom-v0", n_rooms=5)

TextKeyRoom-v0 is the bridge's example of an environment whose observation
is text (a `gymnasium.spaces.Text`), played through the `generic` adapter
like any third-party id (a task spec `{"adapter": "generic", "env_id":
"embodyflow_gym.envs:TextKeyRoom-v0", ...}`). Rooms 0..n_rooms-1 on a
corridor; a reset seed places the agent and the key in two different rooms.
The observation says where both are, e.g. "you are in room 1; the key is in
room 3", so only a policy that reads it knows which way to go and when to
pick up. Actions Discrete(3): 0 west, 1 east, 2 pick up. Picking up in the
key's room ends the episode with reward 1 (a success under the generic
adapter's `terminal_reward` rule); picking up anywhere else ends it with
reward 0 (a failure).
"""

import string

import gymnasium
import numpy as np
from gymnasium import spaces

CHARSET = string.ascii_lowercase + string.digits + " ;"


class TextKeyRoom(gymnasium.Env):
    metadata = {"render_modes": []}

    def __init__(self, n_rooms=5):
        if int(n_rooms) < 2:
            raise ValueError(f"n_rooms = {n_rooms}: needs at least 2 rooms")
        self.n_rooms = int(n_rooms)
        longest = len(self._text(self.n_rooms - 1, self.n_rooms - 1))
        self.observation_space = spaces.Text(max_length=longest, min_length=1, charset=CHARSET)
        self.action_space = spaces.Discrete(3)
        self.room = 0
        self.key = 1

    @staticmethod
    def _text(room, key):
        return f"you are in room {room}; the key is in room {key}"

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.room, self.key = (int(v) for v in self.np_random.choice(self.n_rooms, size=2, replace=False))
        return self._text(self.room, self.key), {}

    def step(self, action):
        action = int(action)
        if action == 2:
            found = self.room == self.key
            return self._text(self.room, self.key), float(found), True, False, {"success": found}
        self.room = int(np.clip(self.room + (1 if action == 1 else -1), 0, self.n_rooms - 1))
        return self._text(self.room, self.key), 0.0, False, False, {"success": False}


gymnasium.register(id="TextKeyRoom-v0", entry_point=TextKeyRoom)
