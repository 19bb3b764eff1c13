"""Super Mario Bros env steps/s on one core: the emulator alone at frame skip 4, a naive wrapper chain, and
rl_speed's ``SuperMarioBrosEnv`` (needs the ``[mario]`` extra).

* emulator alone: four ``step`` calls of the raw NES env per env step, nothing else (the ceiling);
* naive chain: what a typical wrapper stack does per step: a list of the skip's frames, ``np.max`` over a stacked
  copy of the last two, float32 gray, PIL resize, ``np.concatenate`` of the frame stack (new arrays at every stage);
* rl_speed: :class:`rl_speed_envs.mario.SuperMarioBrosEnv` (pre-allocated uint8 buffers, area resize as two
  matrices).

All hold "right + B" (Mario runs and dies or the level restarts), median of ``repeats`` runs of 2 s each.
"""

from __future__ import annotations

import time

import numpy as np

from benchmarks.common import machine, median_rate
from rl_speed_envs.mario import episode_over

RIGHT_B = 0b10000010
SECONDS = 2.0


def _emulator_step(nes) -> int:
    for _ in range(4):
        _, _, terminated, truncated, info = nes.step(RIGHT_B)
        if episode_over(terminated, info) or truncated:
            nes.reset()
            break
    return 1


class _NaiveChain:
    """The straightforward wrappers, stage by stage, each allocating its output."""

    def __init__(self, nes) -> None:
        from PIL import Image

        self.nes, self.image = nes, Image
        self.stack = [np.zeros((84, 84), np.float32)] * 4

    def step(self) -> int:
        frames = []
        for _ in range(4):
            frame, _, terminated, truncated, info = self.nes.step(RIGHT_B)
            frames.append(frame.copy())
            if episode_over(terminated, info) or truncated:
                self.nes.reset()
                break
        maxed = np.max(np.stack(frames[-2:]), axis=0)
        gray = maxed.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
        small = np.asarray(self.image.fromarray(gray.astype(np.uint8)).resize((84, 84), self.image.BILINEAR),
                           np.float32) / 255.0
        self.stack = self.stack[1:] + [small]
        np.stack(self.stack, axis=-1)
        return 1


def run(repeats: int = 5) -> str:
    from rl_speed_envs.mario import SuperMarioBrosEnv, _emulator_class

    nes = _emulator_class()()
    nes.reset()
    emulator = median_rate(lambda: _emulator_step(nes), repeats, SECONDS)
    naive_chain = _NaiveChain(nes)
    naive = median_rate(naive_chain.step, repeats, SECONDS)
    nes.close()
    env = SuperMarioBrosEnv()
    env.reset()

    def ours_step() -> int:
        _, _, terminated, truncated, _ = env.step(3)
        if terminated or truncated:
            env.reset()
        return 1

    ours = median_rate(ours_step, repeats, SECONDS)
    env.close()
    return "\n".join([
        "### Super Mario Bros: env steps/s on one core (frame skip 4)",
        "",
        f"Command: `rl-speed bench mario-env --repeats {repeats}` · machine: {machine()} · "
        f"date: {time.strftime('%Y-%m-%d')} · median of {repeats} runs of {SECONDS:.0f} s.",
        "",
        "| env | env steps/s | share of the emulator's rate | wrapper cost per step |",
        "|---|---:|---:|---:|",
        f"| emulator alone (4 raw frames per step) | {emulator:,.0f} | 100% | |",
        f"| naive wrapper chain | {naive:,.0f} | {naive / emulator:.0%} | "
        f"{(1 / naive - 1 / emulator) * 1e3:.2f} ms |",
        f"| rl_speed `SuperMarioBrosEnv` (uint8, pre-allocated) | {ours:,.0f} | {ours / emulator:.0%} | "
        f"{(1 / ours - 1 / emulator) * 1e3:.2f} ms |",
    ])
