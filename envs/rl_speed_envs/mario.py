"""Super Mario Bros on the real NES emulator (``nes-py`` + ``gym-super-mario-bros``, the optional ``[mario]`` extra),
with the usual Atari-style wrappers done cheaply in one class.

Each step repeats the chosen button combination for ``frame_skip`` emulator frames, sums the game's reward, and
turns the last two frames into one uint8 ``[size, size]`` gray frame (:class:`rl_speed_envs.frames.FrameProcessor`:
pixelwise max, gray, area resize), pushed onto a ``[size, size, stack]`` uint8 stack. No float conversion anywhere:
frames stay uint8 until the module casts them on its device.

* Actions (``Discrete(7)``): ``SIMPLE_MOVEMENT`` = noop, right, right+A, right+B, right+A+B, A, left.
* An episode terminates when Mario dies (as soon as the dying animation starts, so no frames are spent on it) or
  reaches the flag, and is truncated after ``max_steps`` agent steps.
* ``info`` carries the game's ``x_pos``, ``flag_get`` and ``score``.

Why this package pair: ``gym-super-mario-bros`` 9.1.0 / ``nes-py`` 9.0.1 declare Python >= 3.13 but build and run on
3.11 when installed with ``--ignore-requires-python`` (numpy and gymnasium pinned to what is installed, so pip does
not try to build numpy 2.5 from source); here the emulator runs about 1,000 raw frames/s per core. The cynes-based
``gymnasium-mariobros`` installs normally but runs about 3x slower.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rl_speed_envs.checks import check_int
from rl_speed_envs.frames import FrameProcessor

#: button combinations -> NES controller byte (right, left, down, up, start, select, B, A from the high bit down)
_BUTTONS = {"right": 0b10000000, "left": 0b01000000, "B": 0b00000010, "A": 0b00000001}
SIMPLE_MOVEMENT = ((), ("right",), ("right", "A"), ("right", "B"), ("right", "A", "B"), ("A",), ("left",))
_ACTION_BYTES = tuple(sum(_BUTTONS[b] for b in combo) for combo in SIMPLE_MOVEMENT)


def episode_over(terminated: bool, info: dict) -> bool:
    """The emulator's own end, the flag, or Mario dying (from the first frame of the dying animation)."""
    return bool(terminated or info.get("flag_get") or info.get("is_dying") or info.get("is_dead"))


def install_hint() -> str:
    """The one command that installs the emulator into this Python (see the module docstring for why it differs)."""
    import sys

    if sys.version_info >= (3, 13):
        return "Super Mario Bros needs the NES emulator (the [mario] extra): python -m pip install 'rl_speed[mario]'"
    return ("Super Mario Bros needs the NES emulator (the [mario] extra, which pip skips below Python 3.13): "
            "python -m pip install --ignore-requires-python nes-py==9.0.1 gym-super-mario-bros==9.1.0 "
            f"numpy=={np.__version__} gymnasium=={gym.__version__}")


def check_installed() -> None:
    """Raises ``ImportError`` with :func:`install_hint` if the emulator is missing (used at configuration time)."""
    _emulator_class()


def _emulator_class() -> type:
    try:
        from gym_super_mario_bros import SuperMarioBrosEnv as Emulator
    except ImportError:
        raise ImportError(install_hint()) from None
    return Emulator


class SuperMarioBrosEnv(gym.Env):
    """See the module docstring. ``world`` / ``stage`` pick the level (1-1 by default)."""

    metadata = {"render_modes": []}
    config_keys = ("world", "stage", "frame_skip", "size", "stack", "max_steps")
    check_installed = staticmethod(check_installed)

    def __init__(self, world: int = 1, stage: int = 1, frame_skip: int = 4, size: int = 84, stack: int = 4,
                 max_steps: int = 4500) -> None:
        for name, value, low, high in (("world", world, 1, 8), ("stage", stage, 1, 4), ("frame_skip", frame_skip, 1, 16),
                                       ("size", size, 8, 240), ("stack", stack, 1, 16),
                                       ("max_steps", max_steps, 1, 10**7)):
            check_int("SuperMarioBros", name, value, low, high)
        self._nes = _emulator_class()(target=(world, stage))
        self.frame_skip, self.max_steps = int(frame_skip), int(max_steps)
        height, width, _ = self._nes.observation_space.shape
        self._frames = FrameProcessor(height, width, size=size, stack=stack)
        self._previous = np.empty((height, width, 3), np.uint8)  # the emulator overwrites its screen in place
        self.observation_space = spaces.Box(0, 255, (size, size, stack), np.uint8)
        self.action_space = spaces.Discrete(len(SIMPLE_MOVEMENT))
        self._steps = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        frame, info = self._nes.reset(seed=seed)
        self._steps = 0
        return self._frames.reset(frame).copy(), self._info(info)

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        if not self.action_space.contains(action):
            raise ValueError(f"SuperMarioBros: action must be an integer in [0, {self.action_space.n}), got "
                             f"{action!r}.")
        byte = _ACTION_BYTES[int(action)]
        total, previous, terminated, truncated = 0.0, None, False, False
        for repeat in range(self.frame_skip):
            frame, reward, terminated, truncated, info = self._nes.step(byte)
            total += float(reward)
            terminated = episode_over(terminated, info)
            if terminated or truncated:
                break
            if repeat == self.frame_skip - 2:
                np.copyto(self._previous, frame)
                previous = self._previous
        self._steps += 1
        truncated = bool(truncated) or (not terminated and self._steps >= self.max_steps)
        obs = self._frames.observe(previous, frame).copy()
        return obs, total, terminated, truncated, self._info(info)

    @staticmethod
    def _info(info: dict) -> dict:
        return {"x_pos": int(info.get("x_pos", 0)), "flag_get": bool(info.get("flag_get", False)),
                "score": int(info.get("score", 0))}

    def close(self) -> None:
        self._nes.close()
