"""Sampling with the env's lane groups overlapped: one group's emulators step while the runner computes the next
group's actions.

Why: a runner's step is the emulators' time plus the forward's, one after the other on one thread (on the Pong GPU
preset's runner, 11.4 + 5.0 ms per step of 16 lanes with the forward on the CPU). A vector env whose lanes come in
groups that step apart (``send_group(g, actions)`` returns at once, ``recv_group(g)`` waits; rl_speed's Atari env
with ``env_config: {lane_groups: 2}``) lets the two overlap: while group 0's emulators run on their thread, the
runner computes group 1's actions, and the other way round. A step then costs about the larger of the two instead of
their sum (``benchmarks/throughput/atari_runner.py`` measures it), at the price of two forwards of half the lanes.

The schedule, for groups 0 .. k-1 at step t: compute group g's actions from its observation at t, send them, then
receive the group that is due next (group g + 1's step t - 1, or for the last group, group 0's step t). At the end of
a rollout the groups still running are received, so no step is in flight between ``sample_columns()`` calls (weights
change there). Every lane's data is what the plain loop records: its observation at t, the action computed from it
with the current weights, the reward, ends and next observation of that step; a lane group's steps only run at other
moments.

Used by :class:`rl_speed.env_runners.batched.BatchedEnvRunner` when its env has ``lane_groups`` > 1, for
feed-forward modules without env-to-module pieces or episode callbacks (their per-step work sees all lanes at
once), on the grouped env itself (a wrapper around it would step all lanes at once, or miss the groups' steps); the
runner refuses the other cases when it is built. An evaluation runner samples through RLlib's ``sample()``, which
steps every group together and honours all of these; it refuses them only if its ``sample_columns()`` is called.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import tree
from gymnasium.wrappers.vector import DictInfoToList

from rl_speed import columns as C
from rl_speed.columns import Columns
from rl_speed.env_runners import stepping
from rl_speed.env_runners.stepping import clip_rewards, write_step


def stepped_env(env: Any) -> Any:
    """The vector env a runner steps: RLlib's ``DictInfoToList`` wrapper taken off (columns carry no infos)."""
    return env.env if isinstance(env, DictInfoToList) else env


def lane_groups(env: Any) -> int:
    """How many lane groups the runner's vector env steps apart (1: it steps all lanes at once)."""
    env = stepped_env(env)
    return int(getattr(getattr(env, "unwrapped", env), "lane_groups", 1) or 1)


def check_overlap_supported(runner: Any) -> None:
    """Refuses, naming what is configured, what the overlapped loop cannot honour (see the module docstring)."""
    problems = []
    env = stepped_env(runner.env)
    if env is not env.unwrapped:
        problems.append(f"a wrapper around the env ({type(env).__name__}), which would not see the groups' steps")
    if runner.module.is_stateful():
        problems.append("a recurrent module (its state is carried over all lanes step by step)")
    if runner._connectors:
        problems.append("env-to-module connector pieces (they transform all lanes' observations at once)")
    if runner._callback_names:
        problems.append(f"episode callbacks {sorted(runner._callback_names)} (they see all lanes' steps at once)")
    if problems:
        raise ValueError(f"BatchedEnvRunner: the env's `lane_groups`={lane_groups(runner.env)} overlaps one lane "
                         "group's emulation with another's actions, which cannot be used with " + "; ".join(problems)
                         + ". Set `lane_groups: 1` in env_config, or remove them.")


def _write_lanes(target: Any, t: int | None, lanes: slice, value: Any) -> None:
    """``target[t, lanes] = value`` (``target[lanes]`` for t None) leaf by leaf."""
    for dst, src in zip(tree.flatten(target), tree.flatten(value)):
        dst[(lanes,) if t is None else (t, lanes)] = src


def sample_overlapped(runner: Any, steps: int, explore: bool, random_actions: bool) -> Columns:
    """``steps`` steps of every lane as :meth:`BatchedEnvRunner._sample_steps` records them, the lane groups
    overlapped (see the module docstring)."""
    vec = stepped_env(runner.env)  # the grouped env itself (check_overlap_supported: no wrapper in between)
    n, groups, size = runner.num_envs, vec.lane_groups, vec.group_size
    lanes = [slice(g * size, (g + 1) * size) for g in range(groups)]
    columns = runner._new_columns(steps)
    runner._obs = tree.map_structure(np.array, runner._obs)  # ours to write lane by lane
    clip = runner.config.clip_rewards
    clock = time.perf_counter
    waited = inference_seconds = 0.0
    group_info = getattr(vec, "group_info", None)  # an env that reports whole games per group (rl_speed's Atari)

    def receive(g: int, t: int) -> None:
        """Group g's step t is done: its transition into the columns, its next observation into the runner."""
        nonlocal waited
        start = clock()
        obs, rewards, terminateds, truncateds = vec.recv_group(g)
        waited += clock() - start
        lane = lanes[g]
        valid = ~runner._resetting[lane]
        columns[C.REWARDS][t, lane] = clip_rewards(rewards, clip)
        columns[C.TERMINATEDS][t, lane] = terminateds
        columns[C.TRUNCATEDS][t, lane] = truncateds
        columns[C.VALID][t, lane] = valid
        runner._track_episodes(rewards, terminateds | truncateds, valid, lane)
        if group_info is not None:
            runner._track_games(group_info(g), lane)
        runner._is_first[lane] = ~valid
        runner._resetting[lane] = terminateds | truncateds
        _write_lanes(runner._obs, None, lane, obs)

    runners = runner.config.num_env_runners or 1
    for t in range(steps):
        drawn = runner.env.action_space.sample() if random_actions else None  # every lane's, once per step
        for g, lane in enumerate(lanes):
            obs = tree.map_structure(lambda o: o[lane], runner._obs)
            _write_lanes(columns[C.OBS], t, lane, obs)
            if random_actions:
                actions, extra = drawn[lane], {}
            else:
                start = clock()
                actions, extra = runner._compute_actions(
                    obs, explore, runner.num_env_steps_sampled_lifetime + t * n * runners)
                inference_seconds += clock() - start
            for key, value in extra.items():
                if key not in columns:
                    columns[key] = np.empty((steps, n, *value.shape[1:]), value.dtype)
                columns[key][t, lane] = value
            _write_lanes(columns[C.ACTIONS], t, lane, actions)
            vec.send_group(g, runner._env_actions(actions))
            if g + 1 < groups:
                if t > 0:
                    receive(g + 1, t - 1)  # the next group's previous step, emulated meanwhile
            else:
                receive(0, t)
    for g in range(1, groups):  # the steps still running: nothing is in flight between calls
        receive(g, steps - 1)
    write_step(columns[C.OBS], steps, runner._obs)
    stepping.log_step_timers(runner.metrics, steps, waited, None if random_actions else inference_seconds)
    return columns

