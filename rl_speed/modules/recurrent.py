"""RecurrentActorCritic: an LSTM actor-critic RLModule for FastPPO, trained with truncated BPTT on column chunks.

Network: observation (flattened, cast to float on the module's device) -> MLP (``fcnet_hiddens``, tanh) -> LSTM cell
(``lstm_cell_size``) -> linear policy head and linear value head, both on the LSTM output (shared trunk). Subclasses
swap the encoder under the LSTM (:meth:`RecurrentActorCritic.build_encoder`, :meth:`RecurrentActorCritic.encode`;
e.g. MettaGrid's tokens, :class:`rl_speed.modules.tokens.RecurrentTokenActorCritic`).

Two input layouts, one forward:

* acting (the env runner): ``obs [B, ...]`` and ``state_in {"h", "c": [B, H]}``, one step; returns ``state_out``.
* training (FastPPO's learner): ``obs [B, L, ...]`` = B chunks of ``L = bptt_horizon`` consecutive steps of one lane,
  ``state_in [B, H]`` = the state the runner had at each chunk's start, and ``is_first [B, L]`` = the observation
  starts an episode, where the state is reset to zeros inside the chunk. Gradients flow through the L steps of a
  chunk and stop at its start (truncated BPTT).

The state is carried across rollouts by the runner (:class:`rl_speed.env_runners.BatchedEnvRunner`) and reset at
episode starts in both places by the same rule, so acting and training see the same recurrence.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis import ValueFunctionAPI
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.annotations import override

from rl_speed.columns import IS_FIRST  # (the column schema owns the name)
from rl_speed.modules.layers import mlp


class RecurrentActorCritic(TorchRLModule, ValueFunctionAPI):
    """See the module docstring. model_config: ``fcnet_hiddens`` (default [64]), ``lstm_cell_size`` (default 64)."""

    #: What it reads from model_config (checked at config time); ``max_seq_len``: FastPPO's chunk length when
    #: ``bptt_horizon`` is not set; its heads share the LSTM.
    model_config_keys = {"fcnet_hiddens": None, "lstm_cell_size": None, "max_seq_len": None,
                         "vf_share_layers": (True,)}

    #: Takes single steps ``[B, ...]`` when acting and resets its state at ``is_first`` inside training chunks, so
    #: FastPPO trains it on fixed ``[T / L * N, L]`` chunks (RLlib's stateful modules get padded sequences instead).
    resets_state_at_is_first = True

    @override(TorchRLModule)
    def setup(self) -> None:
        cfg = self.model_config or {}
        self._obs_dims = len(getattr(self.observation_space, "shape", None) or ())
        self.encoder, width = self.build_encoder(cfg)
        self.cell_size = int(cfg.get("lstm_cell_size", 64))
        self.lstm = nn.LSTMCell(width, self.cell_size)
        action = self.action_space
        if isinstance(action, gym.spaces.Discrete):
            outputs = int(action.n)
        elif isinstance(action, gym.spaces.Box) and len(action.shape) == 1:
            outputs = 2 * action.shape[0]  # mean and log-std, as RLlib's TorchDiagGaussian reads them
        else:
            raise ValueError(f"RecurrentActorCritic: actions must be Discrete or a 1-D Box, got {action}.")
        self.pi = nn.Linear(self.cell_size, outputs)
        self.vf = nn.Linear(self.cell_size, 1)

    def build_encoder(self, cfg: dict) -> tuple[nn.Module, int]:
        """The per-step encoder under the LSTM and its output width: an MLP over the flattened observation.
        Subclasses with other observations override it and :meth:`encode`."""
        space = self.observation_space
        if not isinstance(space, gym.spaces.Box):
            raise ValueError(f"RecurrentActorCritic: observations must be a Box, got {space}.")
        return mlp(int(np.prod(space.shape)), list(cfg.get("fcnet_hiddens", [64])), "tanh")

    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        """``[R, *observation shape]`` -> ``[R, width]`` (one row per step)."""
        return self.encoder(obs.reshape(obs.shape[0], -1).float())

    @override(TorchRLModule)
    def get_initial_state(self) -> dict:
        return {"h": torch.zeros(self.cell_size), "c": torch.zeros(self.cell_size)}

    @override(TorchRLModule)
    def _forward(self, batch: dict, **kwargs: Any) -> dict:
        obs = batch[Columns.OBS]
        state = batch[Columns.STATE_IN]
        h, c = state["h"], state["c"]
        sequences = obs.dim() == self._obs_dims + 2
        if not sequences:  # one step per row
            x = self.encode(obs)
            h, c = self.lstm(x, (h, c))
            return {Columns.ACTION_DIST_INPUTS: self.pi(h), Columns.EMBEDDINGS: h,
                    Columns.STATE_OUT: {"h": h, "c": c}}
        b, length = obs.shape[:2]
        x = self.encode(obs.reshape(b * length, *obs.shape[2:])).reshape(b, length, -1)
        keep = (~batch[IS_FIRST]).float() if IS_FIRST in batch else torch.ones(b, length, device=obs.device)
        outputs = []
        for t in range(length):  # L small steps; the encoder and heads run once over all B * L rows
            mask = keep[:, t:t + 1]
            h, c = self.lstm(x[:, t], (h * mask, c * mask))
            outputs.append(h)
        hs = torch.stack(outputs, dim=1)  # [B, L, H]
        return {Columns.ACTION_DIST_INPUTS: self.pi(hs), Columns.EMBEDDINGS: hs,
                Columns.STATE_OUT: {"h": h, "c": c}}

    @override(ValueFunctionAPI)
    def compute_values(self, batch: dict, embeddings: Any = None) -> torch.Tensor:
        if embeddings is None:
            embeddings = self._forward(batch)[Columns.EMBEDDINGS]
        return self.vf(embeddings).squeeze(-1)
