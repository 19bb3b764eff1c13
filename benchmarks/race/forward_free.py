"""The env runner of ``preset_variants --forward-free``: the preset's runner acting without a forward, so a run's
rate is what its runners and learner reach when a runner's action step costs nothing (the ceiling of any placement of
the runners' forward: on their CPUs, on their GPU share, or one inference step shared by all of them).

It draws uniform random actions for every lane from its own seeded generator and hands the learner the log-probability
of the uniform policy and zero logits, the columns the forward would have written; everything else (the env, the
columns, metrics, Ray, the learner's update) is the preset's. What it trains is of no use: only its rates are."""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np

from ray.rllib.utils.annotations import override

from rl_speed import columns as C
from rl_speed.env_runners.batched import BatchedEnvRunner


class ForwardFreeEnvRunner(BatchedEnvRunner):
    """A :class:`~rl_speed.env_runners.batched.BatchedEnvRunner` whose action step is a uniform draw (discrete
    actions only)."""

    @override(BatchedEnvRunner)
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        space = self.env.single_action_space if self.env is not None else None
        if space is not None and not isinstance(space, gym.spaces.Discrete):
            raise ValueError(f"ForwardFreeEnvRunner: draws discrete actions only; this env's are {space}.")
        self._draw = np.random.default_rng(None if self.config.seed is None else self.config.seed + self.worker_index)

    @override(BatchedEnvRunner)
    def _compute_actions(self, obs: Any, explore: bool, t: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        n, k = self.num_envs, int(self.env.single_action_space.n)
        actions = self._draw.integers(0, k, n)
        return actions, {C.ACTION_LOGP: np.full(n, -math.log(k), np.float32),
                         C.ACTION_DIST_INPUTS: np.zeros((n, k), np.float32)}
