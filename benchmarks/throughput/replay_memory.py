"""Replay memory for Mario-sized transitions ((84, 84, 4) frame stacks): resident memory measured after filling each
buffer with ``TRANSITIONS`` transitions, each buffer in a fresh process.

* rl_speed ``BatchedReplayBuffer``, pre-allocated ``[C, L]`` ring of uint8 frames: next observations shared with the
  successor slots (FastDQN's storage), and stored separately (the buffer's other form).
* RLlib ``EpisodeReplayBuffer`` (what stock DQN uses) holding numpy'd ``SingleAgentEpisode`` s of 400 steps with
  float32 frames, as RLlib's Atari path produces them (its frame wrappers scale to float32 inside the env).
* The same RLlib buffer with uint8 frames, to separate the dtype from the layout.

The figure per 1M transitions is the measured resident-set growth divided by ``TRANSITIONS`` and multiplied by 1M
(a 1M-transition float32 buffer, about 113 GB, does not fit a laptop).
"""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import time

import numpy as np

from benchmarks.common import machine

TRANSITIONS = 10_000
EPISODE = 400
SHAPE = (84, 84, 4)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _frames(n: int, dtype: type, rng: np.random.Generator) -> np.ndarray:
    frames = rng.integers(0, 256, (n, *SHAPE), dtype=np.uint8)
    return frames if dtype is np.uint8 else frames.astype(np.float32) / 255.0


def _fill_ours(shared: bool) -> int:
    from rl_speed.buffers import BatchedReplayBuffer

    rng = np.random.default_rng(0)
    lanes, steps = 4, 100
    buffer = BatchedReplayBuffer(capacity=TRANSITIONS, num_lanes=lanes)
    start = _rss()
    last = _frames(lanes, np.uint8, rng)
    for _ in range(TRANSITIONS // (lanes * steps)):
        obs = np.concatenate([last[None], _frames(steps * lanes, np.uint8, rng).reshape(steps, lanes, *SHAPE)])
        last = obs[-1].copy()  # the next batch continues from here, as an env runner's does
        frames = {"obs": obs} if shared else {"obs": obs[:-1], "next_obs": obs[1:]}
        buffer.add_batch({**frames, "actions": rng.integers(0, 7, (steps, lanes)),
                          "rewards": np.zeros((steps, lanes), np.float32),
                          "terminateds": np.zeros((steps, lanes), bool), "truncateds": np.zeros((steps, lanes), bool)})
        del obs
    gc.collect()
    assert len(buffer) == TRANSITIONS
    return _rss() - start


def _fill_rllib(dtype: type) -> int:
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer

    rng = np.random.default_rng(0)
    buffer = EpisodeReplayBuffer(capacity=TRANSITIONS * 2)
    start = _rss()
    for _ in range(TRANSITIONS // EPISODE):
        obs = _frames(EPISODE + 1, dtype, rng)
        episode = SingleAgentEpisode(observations=list(obs), actions=list(rng.integers(0, 7, EPISODE)),
                                     rewards=list(np.zeros(EPISODE, np.float32)), len_lookback_buffer=0)
        episode.to_numpy()  # what RLlib's env runners hand to the buffer
        buffer.add([episode])
        del obs, episode
    gc.collect()
    assert buffer.get_num_timesteps() == TRANSITIONS
    return _rss() - start


def _measure(fn: object, arg: object) -> int:
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, (arg,))


def run(repeats: int = 1) -> str:
    rows = [("rl_speed `BatchedReplayBuffer`, uint8, next obs shared with the successor slot (FastDQN)", _fill_ours,
             True),
            ("rl_speed `BatchedReplayBuffer`, uint8, obs and next obs stored separately", _fill_ours, False),
            ("RLlib `EpisodeReplayBuffer`, float32 frames (RLlib's Atari path)", _fill_rllib, np.float32),
            ("RLlib `EpisodeReplayBuffer`, uint8 frames", _fill_rllib, np.uint8)]
    measured = {label: min(_measure(fn, arg) for _ in range(repeats)) for label, fn, arg in rows}
    ours = next(iter(measured.values()))
    lines = [f"| {label} | {b / TRANSITIONS / 1024:,.1f} KiB | {b / TRANSITIONS * 1e6 / 2**30:,.1f} GiB | "
             f"{b / ours:.2f}x |" for label, b in measured.items()]
    return "\n".join([
        "### Replay memory for (84, 84, 4) frame stacks",
        "",
        f"Command: `rl-speed bench replay-memory` · machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · "
        f"resident-set growth after {TRANSITIONS:,} transitions, each buffer in a fresh process, scaled to 1M.",
        "",
        "| buffer | per transition | per 1M transitions | vs rl_speed |",
        "|---|---:|---:|---:|",
        *lines,
    ])
