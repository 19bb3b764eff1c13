"""Cue corridor: a memory task a feed-forward policy cannot solve.

At the first step the observation shows a cue (left or right). For the next ``length`` steps the agent walks a
corridor whose observations carry no cue (only a progress signal); at the end it must choose left (action 0) or
right (action 1): reward +1 if the choice matches the cue, -1 otherwise, and the episode terminates. Actions before
the end are ignored. A memoryless policy sees identical observations at the decision for both cues, so its best
expected return is 0; a recurrent policy that remembers the cue reaches 1.

Observation (float32, 4 values): ``[cue is left, cue is right, progress in [0, 1], at the decision]``; the cue
entries are 0 after the first step. :class:`CueCorridorEnv` is the scalar form, :class:`CueCorridorVectorEnv` the
native vector form (NEXT_STEP autoreset); ``reset(seed=s)`` of the vector env seeds lane ``i`` like the scalar env's
``reset(seed=s + i)``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rl_speed_envs import counter_rng
from rl_speed_envs.checks import check_int


def _check_length(length: Any) -> int:
    return check_int("CueCorridor", "length", length, 1, 10_000)


_SPACE = spaces.Box(0.0, 1.0, (4,), np.float32)


def _observe(cue: np.ndarray, position: np.ndarray, length: int) -> np.ndarray:
    obs = np.zeros((len(cue), 4), np.float32)
    first = position == 0
    obs[first, cue[first]] = 1.0
    obs[:, 2] = position / length
    obs[:, 3] = position == length
    return obs


class CueCorridorEnv(gym.Env):
    """Scalar form (see the module docstring)."""

    observation_space = _SPACE
    action_space = spaces.Discrete(2)

    def __init__(self, length: int = 8) -> None:
        self.length = _check_length(length)
        self._key = counter_rng.key_from_seed(np.array([0]))
        self._draws = np.zeros(1, np.uint64)
        self._cue = np.zeros(1, np.int64)
        self._position = np.zeros(1, np.int64)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self._key, self._draws = counter_rng.key_from_seed(np.array([seed])), np.zeros(1, np.uint64)
        self._cue[:] = counter_rng.uniform(self._key, self._draws) < 0.5
        self._draws += np.uint64(1)
        self._position[:] = 0
        return _observe(self._cue, self._position, self.length)[0], {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if not self.action_space.contains(action):
            raise ValueError(f"CueCorridor: action must be 0 (left) or 1 (right), got {action!r}.")
        if self._position[0] == self.length:
            reward = 1.0 if int(action) == self._cue[0] else -1.0
            return _observe(self._cue, self._position, self.length)[0], reward, True, False, {}
        self._position += 1
        return _observe(self._cue, self._position, self.length)[0], 0.0, False, False, {}


class CueCorridorVectorEnv(VectorEnv):
    """``num_envs`` corridors stepped with array operations; dynamics identical to :class:`CueCorridorEnv`."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int = 1, length: int = 8) -> None:
        if not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"CueCorridor: `num_envs`={num_envs!r} is invalid; use an integer >= 1.")
        self.length = _check_length(length)
        self.num_envs = n = int(num_envs)
        self.single_observation_space, self.single_action_space = _SPACE, spaces.Discrete(2)
        self.observation_space = batch_space(_SPACE, n)
        self.action_space = batch_space(self.single_action_space, n)
        self._keys: np.ndarray | None = None
        self._draws = np.zeros(n, np.uint64)
        self._cue = np.zeros(n, np.int64)
        self._position = np.zeros(n, np.int64)
        self._needs_reset = np.zeros(n, bool)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._keys, reseeded = counter_rng.lane_keys(seed, self.num_envs, self.np_random, self._keys)
        if reseeded:
            self._draws[:] = 0
        self._start(np.ones(self.num_envs, bool))
        return _observe(self._cue, self._position, self.length), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        if self._keys is None:
            raise RuntimeError("CueCorridor: call reset() before step().")
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,) or not np.isin(actions, (0, 1)).all():
            raise ValueError(f"CueCorridor: step() needs {self.num_envs} actions in {{0, 1}}, got {actions!r}.")
        resetting = self._needs_reset
        self._start(resetting)
        moving = ~resetting
        decide = moving & (self._position == self.length)
        rewards = np.where(decide, np.where(actions == self._cue, 1.0, -1.0), 0.0).astype(np.float32)
        self._position += moving & ~decide
        self._needs_reset = decide
        return (_observe(self._cue, self._position, self.length), rewards, decide,
                np.zeros(self.num_envs, bool), {})

    def _start(self, mask: np.ndarray) -> None:
        if mask.any():
            self._cue[mask] = counter_rng.uniform(self._keys[mask], self._draws[mask]) < 0.5
            self._draws[mask] += np.uint64(1)
            self._position[mask] = 0
