"""HybridGraphDistribution: per-node spawn decisions with continuous parameters, plus one global delete ratio.

The action (see :mod:`rl_speed_envs.durotaxis`) is a dict: ``spawn [.., M]`` in {0, 1}, ``spawn_params [.., M, 2]``
and ``delete_ratio [.., 1]``. Its distribution, for the nodes present (``mask`` = 1):

    spawn_i ~ Bernoulli(sigmoid(logit_i));   spawn_params_i ~ Normal(mu_i, sigma_i) only if spawn_i = 1
    delete_ratio ~ Normal(mu_d, sigma_d)

Spawn parameters of a node that does not spawn are not part of the action (the env ignores them), so they add
nothing to the log-prob; padded nodes (``mask`` = 0) add nothing at all. Everything is closed form:

    log p   = sum_i m_i [log Bern(s_i) + s_i log N(x_i)] + log N(d)
    H       = sum_i m_i [H(Bern_i) + p_i H(N_i)] + H(N_d)
    KL(P|Q) = sum_i m_i [KL(Bern^P_i | Bern^Q_i) + p^P_i KL(N^P_i | N^Q_i)] + KL(N^P_d | N^Q_d)

(the Bernoulli probability ``p_i`` weights the Gaussian terms because those parameters exist only when the node
spawns). A test checks entropy and KL against Monte Carlo estimates.

Inputs (``action_dist_inputs``, what the module outputs and the runner stores): ``[.., M * 6 + 2]``, per node
``(logit, mu_dir, mu_dist, log_std_dir, log_std_dist, mask)`` then ``(mu_d, log_std_d)``. The mask travels inside
the inputs so that the stored inputs of the acting policy describe its distribution completely (PPO's KL term
rebuilds it from them).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from ray.rllib.core.distribution.distribution import Distribution
from ray.rllib.utils.annotations import override

PER_NODE = 6
GLOBAL = 2
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def pack_inputs(logits: torch.Tensor, mu: torch.Tensor, log_std: torch.Tensor, mask: torch.Tensor,
                mu_delete: torch.Tensor, log_std_delete: torch.Tensor) -> torch.Tensor:
    """``[.., M]``, ``[.., M, 2]``, ``[.., M, 2]``, ``[.., M]``, ``[.., 1]``, ``[.., 1]`` -> ``[.., M * 6 + 2]``."""
    nodes = torch.cat([logits[..., None], mu, log_std, mask[..., None].to(mu.dtype)], dim=-1)
    return torch.cat([nodes.flatten(-2), mu_delete, log_std_delete], dim=-1)


def _normal_logp(x: torch.Tensor, mu: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    return -0.5 * ((x - mu) * torch.exp(-log_std)) ** 2 - log_std - _LOG_SQRT_2PI


def _normal_entropy(log_std: torch.Tensor) -> torch.Tensor:
    return log_std + 0.5 + _LOG_SQRT_2PI


def _normal_kl(mu_p: torch.Tensor, ls_p: torch.Tensor, mu_q: torch.Tensor, ls_q: torch.Tensor) -> torch.Tensor:
    return ls_q - ls_p + (torch.exp(2 * ls_p) + (mu_p - mu_q) ** 2) / (2 * torch.exp(2 * ls_q)) - 0.5


class HybridGraphDistribution(Distribution):
    """See the module docstring. ``deterministic=True`` (from :meth:`to_deterministic`) samples the mode."""

    def __init__(self, inputs: torch.Tensor, deterministic: bool = False) -> None:
        super().__init__()
        width = inputs.shape[-1] - GLOBAL
        if width <= 0 or width % PER_NODE:
            raise ValueError(f"HybridGraphDistribution: inputs of width {inputs.shape[-1]} are not "
                             f"M * {PER_NODE} + {GLOBAL}.")
        self.inputs = inputs
        nodes = inputs[..., :width].reshape(*inputs.shape[:-1], width // PER_NODE, PER_NODE)
        self.logits = nodes[..., 0]
        self.mu, self.log_std = nodes[..., 1:3], nodes[..., 3:5]
        self.mask = nodes[..., 5]
        self.mu_delete, self.log_std_delete = inputs[..., -2:-1], inputs[..., -1:]
        self.deterministic = deterministic

    @classmethod
    @override(Distribution)
    def from_logits(cls, logits: torch.Tensor, **kwargs: Any) -> "HybridGraphDistribution":
        return cls(logits)

    @staticmethod
    @override(Distribution)
    def required_input_dim(space: Any, **kwargs: Any) -> int:
        return int(space["spawn"].n) * PER_NODE + GLOBAL

    @override(Distribution)
    def to_deterministic(self) -> "HybridGraphDistribution":
        return type(self)(self.inputs, deterministic=True)

    @override(Distribution)
    def sample(self, *, sample_shape: tuple = (), **kwargs: Any) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return self.rsample(sample_shape=sample_shape)

    @override(Distribution)
    def rsample(self, *, sample_shape: tuple = (), **kwargs: Any) -> dict[str, torch.Tensor]:
        """The Gaussian parts are reparameterized; the spawn flags are discrete (no gradient)."""
        if sample_shape:
            raise NotImplementedError("HybridGraphDistribution samples one action per input row.")
        if self.deterministic:
            spawn = self.logits > 0
            params, ratio = self.mu, self.mu_delete
        else:
            spawn = torch.bernoulli(torch.sigmoid(self.logits.detach())).bool()
            params = self.mu + torch.exp(self.log_std) * torch.randn_like(self.mu)
            ratio = self.mu_delete + torch.exp(self.log_std_delete) * torch.randn_like(self.mu_delete)
        spawn &= self.mask > 0  # no spawn request from an empty slot
        return {"spawn": spawn.to(torch.int8), "spawn_params": params, "delete_ratio": ratio}

    @override(Distribution)
    def logp(self, value: dict[str, torch.Tensor], **kwargs: Any) -> torch.Tensor:
        spawn = value["spawn"].to(self.logits.dtype)
        bernoulli = -F.binary_cross_entropy_with_logits(self.logits, spawn, reduction="none")
        params = _normal_logp(value["spawn_params"].to(self.mu.dtype), self.mu, self.log_std).sum(-1)
        per_node = self.mask * (bernoulli + spawn * params)
        delete = _normal_logp(value["delete_ratio"].to(self.mu.dtype), self.mu_delete, self.log_std_delete)
        return per_node.sum(-1) + delete.sum(-1)

    @override(Distribution)
    def entropy(self) -> torch.Tensor:
        p = torch.sigmoid(self.logits)
        bernoulli = F.binary_cross_entropy_with_logits(self.logits, p, reduction="none")
        per_node = self.mask * (bernoulli + p * _normal_entropy(self.log_std).sum(-1))
        return per_node.sum(-1) + _normal_entropy(self.log_std_delete).sum(-1)

    @override(Distribution)
    def kl(self, other: "HybridGraphDistribution", **kwargs: Any) -> torch.Tensor:
        """KL(self | other); ``self``'s mask says which nodes exist (both describe the same observation)."""
        p = torch.sigmoid(self.logits)
        log_p, log_1mp = F.logsigmoid(self.logits), F.logsigmoid(-self.logits)
        log_q, log_1mq = F.logsigmoid(other.logits), F.logsigmoid(-other.logits)
        bernoulli = p * (log_p - log_q) + (1 - p) * (log_1mp - log_1mq)
        gaussian = _normal_kl(self.mu, self.log_std, other.mu, other.log_std).sum(-1)
        per_node = self.mask * (bernoulli + p * gaussian)
        delete = _normal_kl(self.mu_delete, self.log_std_delete, other.mu_delete, other.log_std_delete).sum(-1)
        return per_node.sum(-1) + delete
