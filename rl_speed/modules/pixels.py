"""NatureActorCritic: an actor-critic RLModule for stacked 84 x 84 frames (Atari), uint8 up to the module.

The Nature-DQN CNN (Mnih et al. 2015: 8x8/4, 4x4/2, 3x3/1 convs with 32/64/64 channels, then 512 ReLU units), shared
by a policy head and a value head, as in CleanRL's and RLlib's Atari PPO setups. Frames arrive as ``[84, 84, C]``
uint8 (RLlib's image layout) and are cast and scaled by 1/255 on the module's device (the same preprocessing as
FastDQN's :class:`rl_speed.modules.q_net.QNetModule`), so env runners, columns and the learner's batch move bytes,
not floats. The policy head starts near uniform (weights scaled by 0.01).

model_config: ``fcnet_hiddens`` (the units after the convs, default [512]); ``normalize_obs`` (default false): each
pixel standardized by running statistics after the 1/255 scaling (:class:`rl_speed.modules.layers.RunningNorm`, as
rl_games' ``normalize_input``), which FastPPO's learner updates once per train batch
(:meth:`NatureActorCritic.update_input_statistics`); ``normalize_value`` (default false): the value head predicts
returns standardized by running statistics of the value targets (rl_games' ``normalize_value``); FastPPO's learner
turns its values into returns' units for GAE, folds each batch's value targets into the statistics and trains the
head on the targets standardized by them (:attr:`NatureActorCritic.value_norm`). Both are refused at config time
where nothing would update them.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch

from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.annotations import override

from rl_speed.modules.actor_critic import CategoricalActorCritic
from rl_speed.modules.layers import RunningNorm, nature_cnn, running_statistics_problem
from rl_speed.modules.q_net import ObsPreprocessor


class NatureActorCritic(CategoricalActorCritic):
    """See the module docstring."""

    #: What it reads from model_config (checked at config time: rl_speed.algorithms.config.check_model_config_keys);
    #: its policy and value heads share the encoder.
    model_config_keys = {"fcnet_hiddens": None, "vf_share_layers": (True,), "normalize_obs": (False, True),
                         "normalize_value": (False, True)}

    @staticmethod
    def check_model_config(given: dict, config: Any) -> str | None:
        return running_statistics_problem(given, config)

    @override(TorchRLModule)
    def setup(self) -> None:
        obs = self.observation_space
        if not (isinstance(obs, gym.spaces.Box) and len(obs.shape) == 3 and obs.dtype == np.uint8):
            raise ValueError(f"NatureActorCritic: observations must be uint8 frames [H, W, C], got {obs}; for "
                             "vectors use RLlib's default PPO module.")
        self.preprocess = ObsPreprocessor(obs)
        model_config = self.model_config or {}
        hiddens = list(model_config.get("fcnet_hiddens") or [512])
        self.obs_norm = RunningNorm(self.preprocess.out_shape) if model_config.get("normalize_obs") else None
        # normalize_value: statistics of the value targets (one number each); compute_values stays in the head's
        # standardized units, which the loss trains against standardized targets
        self.value_norm = RunningNorm(()) if model_config.get("normalize_value") else None
        self.encoder, width = nature_cnn(self.preprocess.out_shape, hiddens, batch_norm=False)
        self.make_heads(width)

    @override(CategoricalActorCritic)
    def _embed(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.preprocess(obs)
        return self.encoder(x if self.obs_norm is None else self.obs_norm(x))

    @property
    def keeps_input_statistics(self) -> bool:
        """``normalize_obs``: FastPPO's learner then calls :meth:`update_input_statistics` once per batch."""
        return self.obs_norm is not None

    @property
    def keeps_value_statistics(self) -> bool:
        """``normalize_value``: FastPPO's learner then converts this module's values with :attr:`value_norm` and
        folds each batch's value targets into it (rl_speed.learners.ppo.value_statistics)."""
        return self.value_norm is not None

    def update_input_statistics(self, obs: torch.Tensor) -> None:
        """Folds a train batch's observations ``[B, H, W, C]`` into ``normalize_obs``'s statistics, before the
        learner computes the batch's values."""
        self.obs_norm.fold(obs, self.preprocess)
