"""Raw env steps/s of the native vector Snake against gymnasium's SyncVectorEnv of the scalar Snake.

Both run in this one process and thread, with pre-generated random actions, so the figure is the simulator's cost
alone (board steps per second, autoresets included).
"""

from __future__ import annotations

import sys
import time

import gymnasium as gym
import numpy as np

from benchmarks.common import machine, median_rate
from rl_speed_envs.snake import SnakeEnv, SnakeVectorEnv

BOARDS = (1, 64, 256, 4096)


def _rate(env: gym.vector.VectorEnv, repeats: int) -> float:
    n = env.num_envs
    actions = np.random.default_rng(0).integers(0, 4, (64, n))
    env.reset(seed=0)
    t = [0]

    def step() -> int:
        env.step(actions[t[0] % 64])
        t[0] += 1
        return n

    return median_rate(step, repeats=repeats)


def run(repeats: int = 5, boards: tuple[int, ...] = BOARDS) -> str:
    rows = []
    for flood_fill in (False, True):
        kwargs = dict(flood_fill=flood_fill)
        for n in boards:
            native = _rate(SnakeVectorEnv(num_envs=n, **kwargs), repeats)
            sync = _rate(gym.vector.SyncVectorEnv([lambda: SnakeEnv(**kwargs)] * n,
                                                  autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP), repeats)
            rows.append(f"| {'on' if flood_fill else 'off'} | {n:,} | {native:,.0f} | {sync:,.0f} | {native / sync:,.1f}x |")
    return "\n".join([
        "### Snake: raw env steps/s, native vector env vs gymnasium SyncVectorEnv",
        "",
        f"Command: `rl-speed bench snake-env` · machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · "
        f"one process, one thread, 10 x 10 board, random actions, median of {repeats} runs of >= 0.5 s.",
        "",
        "| flood fill | boards | SnakeVectorEnv steps/s | SyncVectorEnv(SnakeEnv) steps/s | speed-up |",
        "|---|---:|---:|---:|---:|",
        *rows,
    ])


if __name__ == "__main__":
    print(run(int(sys.argv[1]) if len(sys.argv) > 1 else 5))
