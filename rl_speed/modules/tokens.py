"""TokenActorCritic: an actor-critic RLModule for MettaGrid's token observations (``[N, 3]`` uint8 rows of
``(location, feature, value)``; location 255 marks an empty slot, 254 a global token).

The encoder is a linear layer over the one-hot (feature, location) grid the tokens describe, computed sparsely: each
present token adds ``presence[f, loc] + value / 255 * magnitude[f, loc]`` (two ``256 * 256 x token_dim`` tables,
summed with ``embedding_bag``, so no ``[B, N, token_dim]`` tensor is ever built), the sum is divided by the number of
present tokens, and an MLP (``fcnet_hiddens``, default [256], ReLU) feeds a policy head and a value head. The uint8
tokens are cast on the module's device, never in the env or the columns. Slots past the last present token of the
batch are cut first (exact: they are empty). An env runner's forward pass costs a few milliseconds for 576 agents
on one CPU core, less than the simulations it steps.

The tables' gradients are accumulated with ``index_add_`` (:class:`_TokenBagSum`), not by ``embedding_bag``'s
own backward: every batch repeats the same few thousand (feature, location) rows millions of times, and
``embedding_bag``'s sorted segment sums serialize on them on CUDA (81% of an H100 learner step, measured with
torch.profiler on the MettaGrid GPU preset, 2026-11-27).

model_config: ``token_dim`` (default 32), ``fcnet_hiddens`` (default [256]).

:class:`RecurrentTokenActorCritic` puts the same encoder under an LSTM (``rl_module: recurrent_tokens``, FastPPO's
truncated BPTT over ``bptt_horizon`` steps).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.annotations import override

from rl_speed.modules.actor_critic import CategoricalActorCritic
from rl_speed.modules.layers import mlp
from rl_speed.modules.recurrent import RecurrentActorCritic

EMPTY = 255


class _TokenBagSum(torch.autograd.Function):
    """``embedding_bag(index, weight, mode="sum", per_sample_weights=scale)`` over bags of ``n`` consecutive tokens,
    whose weight gradient is one ``index_add_`` of each token's scaled output gradient (see the module docstring).
    ``index`` and ``scale`` are inputs, not parameters: they get no gradient."""

    @staticmethod
    def forward(ctx: Any, weight: torch.Tensor, index: torch.Tensor, scale: torch.Tensor, n: int) -> torch.Tensor:
        ctx.save_for_backward(index, scale)
        ctx.n, ctx.table_shape, ctx.table_dtype = n, weight.shape, weight.dtype
        offsets = torch.arange(0, index.numel(), n, device=index.device, dtype=index.dtype)
        return nn.functional.embedding_bag(index, weight, offsets, mode="sum", per_sample_weights=scale)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple:
        index, scale = ctx.saved_tensors
        per_token = (grad.unsqueeze(1) * scale.view(-1, ctx.n, 1)).reshape(-1, grad.shape[-1])
        grad_weight = torch.zeros(ctx.table_shape, dtype=ctx.table_dtype, device=grad.device)
        return grad_weight.index_add_(0, index, per_token.to(ctx.table_dtype)), None, None, None


def check_token_space(space: gym.Space, name: str) -> None:
    if not (isinstance(space, gym.spaces.Box) and len(space.shape) == 2 and space.shape[1] == 3
            and space.dtype == "uint8"):
        raise ValueError(f"{name}: observations must be uint8 tokens of shape [N, 3], got {space}.")


def token_tables(dim: int) -> tuple[nn.Embedding, nn.Embedding]:
    """The presence and magnitude tables, rows ``feature * 256 + location``."""
    tables = nn.Embedding(256 * 256, dim), nn.Embedding(256 * 256, dim)
    with torch.no_grad():
        for table in tables:
            table.weight.normal_(0.0, 1.0 / dim ** 0.5)
    return tables


def token_features(presence: nn.Embedding, magnitude: nn.Embedding, obs: torch.Tensor) -> torch.Tensor:
    """``[B, N, 3]`` uint8 tokens -> ``[B, dim]``: the tables' rows of the present tokens, summed and divided by the
    number of present tokens (see the module docstring)."""
    # Cut before widening the dtype: most of the N slots are empty, and the casts are the encoder's largest cost on
    # a runner's CPU. int32 indices: the tables have 65,536 rows, and int64 would double every cast's bytes.
    # Not while a CUDA graph is captured (`cuda_graph: true`): finding the last present slot reads a value back from
    # the GPU, which a captured graph cannot do, and every replay must have the capture's shapes. Empty slots add
    # exact zeros, so all N give the same features.
    n = obs.shape[1] if _capturing(obs) else _last_present_slot(obs) + 1
    location, feature, value = obs[:, :n].unbind(-1)
    present = (location != EMPTY).float()
    index = (feature.int() * 256 + location.int()).reshape(-1)
    grid = (_TokenBagSum.apply(presence.weight, index, present.reshape(-1), n)
            + _TokenBagSum.apply(magnitude.weight, index, (value.float() * (present / 255.0)).reshape(-1), n))
    return grid / present.sum(1, keepdim=True).clamp(min=1.0)


def _capturing(obs: torch.Tensor) -> bool:
    return obs.is_cuda and torch.cuda.is_current_stream_capturing()


def _last_present_slot(obs: torch.Tensor) -> int:
    """The last slot that holds a token in any row of the batch (0 if none). On the CPU through numpy, whose
    strided uint8 reductions took a third of torch's time on one thread (an env runner's forward)."""
    if obs.device.type == "cpu":
        slots = np.flatnonzero((obs.numpy()[:, :, 0] != EMPTY).any(0))
    else:
        slots = (obs[:, :, 0] != EMPTY).any(0).nonzero()
    return int(slots[-1]) if len(slots) else 0


class TokenActorCritic(CategoricalActorCritic):
    """See the module docstring. (It holds its tables and trunk itself rather than a :class:`TokenEncoder`, so the
    parameter names of its existing checkpoints stay valid.)"""

    #: What it reads from model_config (checked at config time); its heads share the trunk.
    model_config_keys = {"token_dim": None, "fcnet_hiddens": None, "vf_share_layers": (True,)}

    @override(TorchRLModule)
    def setup(self) -> None:
        check_token_space(self.observation_space, "TokenActorCritic")
        cfg = self.model_config or {}
        dim = int(cfg.get("token_dim", 32))
        self.presence, self.magnitude = token_tables(dim)
        self.trunk, width = mlp(dim, list(cfg.get("fcnet_hiddens") or [256]), "relu")
        self.make_heads(width)

    @override(CategoricalActorCritic)
    def _embed(self, obs: torch.Tensor) -> torch.Tensor:
        return self.trunk(token_features(self.presence, self.magnitude, obs))


class TokenEncoder(nn.Module):
    """The token tables and the MLP over their features (``TokenActorCritic``'s encoder, as one module)."""

    def __init__(self, dim: int, hiddens: list[int]) -> None:
        super().__init__()
        self.presence, self.magnitude = token_tables(dim)
        self.trunk, self.width = mlp(dim, hiddens, "relu")

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.trunk(token_features(self.presence, self.magnitude, obs))


class RecurrentTokenActorCritic(RecurrentActorCritic):
    """The token encoder under RecurrentActorCritic's LSTM, for FastPPO's truncated BPTT (``bptt_horizon``):
    ``rl_module: recurrent_tokens``. model_config: ``token_dim`` (default 32), ``fcnet_hiddens`` (default [256]),
    ``lstm_cell_size`` (default 64)."""

    #: What it reads from model_config (checked at config time); ``max_seq_len``: FastPPO's chunk length when
    #: ``bptt_horizon`` is not set.
    model_config_keys = {"token_dim": None, "fcnet_hiddens": None, "lstm_cell_size": None, "max_seq_len": None,
                         "vf_share_layers": (True,)}

    @override(RecurrentActorCritic)
    def build_encoder(self, cfg: dict) -> tuple[nn.Module, int]:
        check_token_space(self.observation_space, "RecurrentTokenActorCritic")
        encoder = TokenEncoder(int(cfg.get("token_dim", 32)), list(cfg.get("fcnet_hiddens") or [256]))
        return encoder, encoder.width

    @override(RecurrentActorCritic)
    def encode(self, obs: torch.Tensor) -> torch.Tensor:
        return self.encoder(obs)
