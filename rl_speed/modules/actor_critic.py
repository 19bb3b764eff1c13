"""CategoricalActorCritic: the shared shape of rl_speed's feed-forward actor-critics for Discrete actions.

A subclass builds its encoder in ``setup()``, calls :meth:`make_heads` with the encoder's width, and implements
``_embed(obs) -> [B, width]``. The policy head starts near uniform (weights scaled by 0.01, bias 0); values come from
the same embeddings (``Columns.EMBEDDINGS``), so PPO's loss reuses the forward pass.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import nn

from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical
from ray.rllib.utils.annotations import override


class CategoricalActorCritic(TorchRLModule, ValueFunctionAPI):
    """See the module docstring."""

    def make_heads(self, width: int) -> None:
        """``self.pi`` (logits) and ``self.vf`` (value) over ``width`` embedding units."""
        if not isinstance(self.action_space, gym.spaces.Discrete):
            raise ValueError(f"{type(self).__name__} needs a Discrete action space, got {self.action_space}.")
        self.pi = nn.Linear(width, int(self.action_space.n))
        self.vf = nn.Linear(width, 1)
        with torch.no_grad():
            self.pi.weight.mul_(0.01)  # near-uniform first policy
            self.pi.bias.zero_()

    def _embed(self, obs: Any) -> torch.Tensor:
        raise NotImplementedError

    @override(TorchRLModule)
    def _forward(self, batch: dict, **kwargs: Any) -> dict:
        features = self._embed(batch[Columns.OBS])
        return {Columns.ACTION_DIST_INPUTS: self.pi(features), Columns.EMBEDDINGS: features}

    @override(ValueFunctionAPI)
    def compute_values(self, batch: dict, embeddings: Any = None) -> torch.Tensor:
        if embeddings is None:
            embeddings = self._embed(batch[Columns.OBS])
        return self.vf(embeddings).squeeze(-1)

    @override(TorchRLModule)
    def get_train_action_dist_cls(self) -> type:
        return TorchCategorical

    @override(TorchRLModule)
    def get_exploration_action_dist_cls(self) -> type:
        return TorchCategorical

    @override(TorchRLModule)
    def get_inference_action_dist_cls(self) -> type:
        return TorchCategorical
