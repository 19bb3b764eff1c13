"""What a box's CPUs can emulate: ale-py's Pong and Breakout emulators alone, random actions, on one thread and on
every usable CPU at once, 16 emulators per thread as the GPU presets' runners have them.

Why: two GPU boxes of the same kind ran the same preset, code and seeds at 16.1-18.0k and 14.5-15.0k env steps/s,
a runner's emulation taking 10 ms a step on one and 14 ms on the other (docs/studies/pong-and-atari.md, 2026-12-05),
and the preset's runners are bound by their emulators. This bench is the box's own ceiling, taken before its runs,
so that a figure can be read against the box it came from: env steps/s on one thread, on all of them, the scaling
between the two, and a thread's milliseconds per step of 16 emulators alone and with every other thread busy (the
preset's runners emulate at the latter). Breakout beside Pong: the Breakout preset's runs sample at 12.6k-15.1k env
steps/s on a box where Pong's reach 21-23k (2026-12-07), runner-bound; its row says what the game's emulation costs.

Each round steps one ale-py vector env of ``16 x threads`` emulators of one game (``num_threads`` = threads; one
thread per 16, as one runner's) for ``seconds``; the rounds of every (game, threads) alternate, ``repeats`` each;
medians. Frame-skipped steps count (4 frames each), as the race's env steps do. Random actions lose Breakout's lives
fast, so its games restart more often than a trained agent's do. Run: ``rl-speed bench atari-emulators`` (the
[atari] extra; CPU only: it needs no ``--device``).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from benchmarks.common import interleaved, machine, usable_cpus

LANES_PER_THREAD = 16  #: as a runner of the GPU presets
GAMES = ("pong", "breakout")


def emulators(threads: int, lanes_per_thread: int = LANES_PER_THREAD, seed: int = 0, game: str = "pong"):
    """A reset ale-py vector env of ``threads x lanes_per_thread`` emulators of ``game`` on ``threads`` threads, with
    the settings of rl_speed's Atari env (:mod:`rl_speed_envs.atari`)."""
    from rl_speed_envs.atari import AtariVectorEnv

    env = AtariVectorEnv(threads * lanes_per_thread, game=game, num_threads=threads)
    env.reset(seed=seed)
    return env


def env_steps_per_second(env, seconds: float, seed: int = 0) -> float:
    """Random actions for ``seconds``: env steps per second over all the env's emulators."""
    rng = np.random.default_rng(seed)
    n, actions_n = env.num_envs, int(env.single_action_space.n)
    steps = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        env.step(rng.integers(0, actions_n, n))
        steps += n
    return steps / elapsed


def measure(repeats: int = 3, seconds: float = 5.0, threads: int | None = None,
            lanes_per_thread: int = LANES_PER_THREAD) -> dict[tuple[str, int], float]:
    """Median env steps/s per (game of :data:`GAMES`, thread count): on 1 thread and on ``threads`` (default: every
    usable CPU), ``lanes_per_thread`` emulators per thread, rounds alternating."""
    threads = threads or usable_cpus()
    counts = (1, threads) if threads > 1 else (1,)
    envs = {}
    try:
        for game in GAMES:
            for k in counts:
                envs[game, k] = emulators(k, lanes_per_thread, game=game)
        rates: dict[tuple[str, int], list[float]] = {key: [] for key in envs}
        for key in interleaved(list(envs), repeats):
            rates[key].append(env_steps_per_second(envs[key], seconds))
        return {key: statistics.median(v) for key, v in rates.items()}
    finally:
        for env in envs.values():
            env.close()


def run(repeats: int = 3) -> str:
    rates = measure(repeats)
    rows = []
    for (game, threads), rate in rates.items():
        ms = 1e3 * LANES_PER_THREAD * threads / rate  # one thread's step of its 16 emulators
        rows.append(f"| {game} | {threads} | {threads * LANES_PER_THREAD} | {rate:,.0f} | "
                    f"{rate / rates[game, 1]:.2f}x | {ms:.2f} | {rate / rates[GAMES[0], threads]:.2f}x |")
    return "\n".join([
        "### What this box's CPUs can emulate: ale-py's Pong and Breakout emulators alone, random actions", "",
        f"Command: `rl-speed bench atari-emulators --repeats {repeats}` · machine: {machine()} · date: "
        f"{time.strftime('%Y-%m-%d')} · {LANES_PER_THREAD} emulators per thread (as a runner of the GPU presets), "
        f"rl_speed's Atari settings, rounds of 5 s alternating over every row, medians of {repeats}.", "",
        "| game | threads | emulators | env steps/s | vs one thread | ms per step of a thread's 16 emulators "
        f"| vs {GAMES[0]} on as many threads |",
        "|---|---:|---:|---:|---:|---:|---:|", *rows,
    ])
