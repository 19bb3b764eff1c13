"""TokenActorCritic: an actor-critic RLModule for MettaGrid's token observations (``[N, 3]`` uint8 rows of
``(location, feature, value)``; location 255 marks an empty slot, 254 a global token).

Each token becomes ``relu(feature_emb[f] + position_emb[loc] + value / 255 * value_emb[f])`` (``token_dim`` wide;
the uint8 tokens are cast on the module's device, never in the env or the columns), the present tokens are pooled by
mean and max, and an MLP (``fcnet_hiddens``, default [256]) feeds a policy head and a value head. Slots past the
last present token of the batch are cut before the embedding (exact: they are empty), which makes the module's cost
follow the tokens an arena actually emits (about 40 of mettagrid's 200-500 slots), not the slot count.

model_config: ``token_dim`` (default 64), ``fcnet_hiddens`` (default [256]).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import torch
from torch import nn

from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.models.torch.torch_distributions import TorchCategorical
from ray.rllib.utils.annotations import override

from rl_speed.modules.layers import mlp

EMPTY = 255


class TokenActorCritic(TorchRLModule, ValueFunctionAPI):
    """See the module docstring."""

    @override(TorchRLModule)
    def setup(self) -> None:
        obs, action = self.observation_space, self.action_space
        if not (isinstance(obs, gym.spaces.Box) and len(obs.shape) == 2 and obs.shape[1] == 3
                and obs.dtype == "uint8"):
            raise ValueError(f"TokenActorCritic: observations must be uint8 tokens of shape [N, 3], got {obs}.")
        if not isinstance(action, gym.spaces.Discrete):
            raise ValueError(f"TokenActorCritic needs a Discrete action space, got {action}.")
        cfg = self.model_config or {}
        dim = int(cfg.get("token_dim", 64))
        self.feature = nn.Embedding(256, dim)
        self.position = nn.Embedding(256, dim)
        self.value_scale = nn.Embedding(256, dim)
        with torch.no_grad():
            self.value_scale.weight.mul_(0.5)
        self.trunk, width = mlp(2 * dim, list(cfg.get("fcnet_hiddens") or [256]), "relu")
        self.pi = nn.Linear(width, int(action.n))
        self.vf = nn.Linear(width, 1)
        with torch.no_grad():
            self.pi.weight.mul_(0.01)  # near-uniform first policy
            self.pi.bias.zero_()

    def _embed(self, obs: torch.Tensor) -> torch.Tensor:
        tokens = obs.long()
        present = tokens[..., 0] != EMPTY  # [B, N]
        positions = torch.arange(1, present.shape[1] + 1, device=present.device)
        n = int((present * positions).amax()) if present.numel() else 0  # last present slot of the batch
        tokens, mask = tokens[:, :max(n, 1)], present[:, :max(n, 1), None].float()
        location, feature, value = tokens.unbind(-1)
        h = torch.relu(self.feature(feature) + self.position(location)
                       + (value.float() / 255.0)[..., None] * self.value_scale(feature)) * mask
        mean = h.sum(1) / mask.sum(1).clamp(min=1.0)
        peak = h.amax(1)  # h >= 0 after the ReLU, and masked slots are 0
        return self.trunk(torch.cat([mean, peak], dim=-1))

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
