"""BatchedReplayBuffer vs RLlib's EpisodeReplayBuffer and PrioritizedEpisodeReplayBuffer, one process, one thread.

Capacity 1,000,000 for all; each is first filled with the same ``FILL`` column batches of 256 steps x 64 envs
(CartPole-sized float32 observations, episodes ending every ~50 steps). RLlib's buffers receive the same data as
64 ``SingleAgentEpisode`` chunks per batch (building those is the env runner's cost and is not timed). Timed:
add of one 256 x 64 batch, sample of 256 with n_step=3, and (prioritized) a priority update of 256.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import numpy as np

from benchmarks.common import machine, median_seconds

T, N, OBS_DIM, CAPACITY, FILL, B = 256, 64, 4, 1_000_000, 16, 256


def _columns(rng: np.random.Generator) -> dict:
    obs = rng.normal(size=(T + 1, N, OBS_DIM)).astype(np.float32)
    terminated = rng.random((T, N)) < 0.02
    return {"obs": obs[:-1], "next_obs": obs[1:], "actions": rng.integers(0, 2, (T, N)),
            "rewards": np.ones((T, N), np.float32), "terminateds": terminated,
            "truncateds": np.zeros((T, N), bool), "valid": np.ones((T, N), bool)}


def _episodes(cols: dict) -> list:
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    episodes = []
    for lane in range(N):
        obs = np.concatenate([cols["obs"][:, lane], cols["next_obs"][-1:, lane]])
        ends = np.flatnonzero(cols["terminateds"][:, lane])
        start = 0
        for end in [*ends, T - 1]:
            if end < start:
                continue
            episodes.append(SingleAgentEpisode(
                observations=list(obs[start:end + 2]), actions=list(cols["actions"][start:end + 1, lane]),
                rewards=list(cols["rewards"][start:end + 1, lane]),
                terminated=bool(cols["terminateds"][end, lane]), len_lookback_buffer=0))
            start = end + 1
    return episodes


def _median_ms(fn: Callable[[], object], repeats: int) -> float:
    return 1000 * median_seconds(fn, repeats)


def run(repeats: int = 5) -> str:
    from ray.rllib.utils.replay_buffers import EpisodeReplayBuffer, PrioritizedEpisodeReplayBuffer

    from rl_speed.buffers import BatchedReplayBuffer

    rng = np.random.default_rng(0)
    batches = [_columns(rng) for _ in range(FILL + 1)]
    rows = []
    for prioritized in (False, True):
        ours = BatchedReplayBuffer(CAPACITY, N, prioritized=prioritized, seed=0)
        rllib = (PrioritizedEpisodeReplayBuffer if prioritized else EpisodeReplayBuffer)(capacity=CAPACITY)
        for cols in batches[:FILL]:
            ours.add_batch(cols)
            rllib.add(_episodes(cols))
        extra = batches[FILL]
        n = max(repeats, 20)
        ours_add = _median_ms(lambda: ours.add_batch(extra), n)
        fresh = [_episodes(extra) for _ in range(max(3, repeats))]  # new episode objects (ids) for every add
        rllib_add = _median_ms(lambda: rllib.add(fresh.pop()), max(3, repeats))
        ours_sample = _median_ms(lambda: ours.sample(B, n_step=3, gamma=0.99, beta=0.4), n * 10)
        rllib_sample = _median_ms(lambda: rllib.sample(num_items=B, n_step=3, gamma=0.99, beta=0.4), n)
        row = [("prioritized" if prioritized else "uniform"), ours_add, rllib_add, ours_sample, rllib_sample]
        if prioritized:
            sample = ours.sample(B, n_step=3)
            td = np.abs(rng.normal(size=B))
            ours_update = _median_ms(lambda: ours.update_priorities(sample["indices"], td), n * 10)

            def rllib_update() -> None:
                rllib.sample(num_items=B, n_step=3, gamma=0.99, beta=0.4)
                start = time.perf_counter()
                rllib.update_priorities(td)
                rllib_update.elapsed.append(time.perf_counter() - start)

            rllib_update.elapsed = []
            for _ in range(n):
                rllib_update()
            rllib_upd = 1000 * statistics.median(rllib_update.elapsed)
            row += [ours_update, rllib_upd]
        else:
            row += [float("nan"), float("nan")]
        rows.append(row)
    lines = [
        "### Replay buffer: BatchedReplayBuffer vs RLlib's episode buffers (milliseconds per call)",
        "",
        f"Command: `rl-speed bench buffer` · machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · capacity "
        f"1,000,000, filled with {FILL * T * N:,} transitions, obs float32 ({OBS_DIM},), median of repeated calls.",
        "",
        "| sampling | add 256x64: ours | RLlib | sample 256, n_step 3: ours | RLlib | ratio | "
        "update 256: ours | RLlib | sample + update: ours |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, oa, ra, os_, rs, ou, ru in rows:
        both = os_ + ou if ou == ou else float("nan")
        lines.append(f"| {kind} | {oa:.2f} | {ra:.1f} | {os_:.3f} | {rs:.1f} | {rs / os_:,.0f}x | "
                     f"{ou:.3f} | {ru:.2f} | {both:.3f} |")
    return "\n".join(lines)
