"""Generalized advantage estimation over ``[T, N]`` columns, vectorized over N, on any torch device.

RLlib's ``compute_value_targets`` walks every timestep of every episode in a Python loop (about 0.6 us per step on
a CPU). Here one backward pass over T updates all N lanes at once with tensor operations, so the cost is T small
kernels whatever N is, and the data never leaves the learner's device.

Conventions follow :mod:`rl_speed.columns` (and match RLlib's): for a valid step t,
``delta_t = r_t + gamma * (1 - terminated_t) * V(obs_{t+1}) - V(obs_t)``, and the recursion
``A_t = delta_t + gamma * lambda * (1 - terminated_t) * (1 - truncated_t) * A_{t+1}`` stops at episode ends. A
truncated step still bootstraps from ``V(obs_{t+1})`` (its true final observation), a terminated one does not, and
the last step of the rollout bootstraps from ``V(obs_T)``. Invalid steps (NEXT_STEP resets) get advantage 0.
"""

from __future__ import annotations

import numpy as np
import torch


def vectorized_gae(values: torch.Tensor, rewards: torch.Tensor, terminateds: torch.Tensor,
                   truncateds: torch.Tensor, valid: torch.Tensor | None = None, *, gamma: float, lambda_: float,
                   next_row: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and value targets, both ``[T, N]`` float32.

    Args:
        values: ``[T + 1, N]`` value estimates of ``obs[0..T]`` (row T is the bootstrap observation's).
        rewards, terminateds, truncateds, valid: ``[T, N]``.
        next_row: ``[T, N]`` (turn-based multi-agent columns, :data:`rl_speed.columns.NEXT_ROW`): the row of each
            step's next observation. The steps between are the agent's wait (not valid); the recursion passes through
            them undiscounted, so each valid step's advantage continues from the agent's next valid step.
    """
    t_len = rewards.shape[0]
    if values.shape[0] != t_len + 1 or values.shape[1:] != rewards.shape[1:]:
        raise ValueError(f"vectorized_gae: values must be [T + 1, N] = {[t_len + 1, *rewards.shape[1:]]}, "
                         f"got {list(values.shape)}.")
    values = values.float()
    not_terminal = 1.0 - terminateds.float()
    propagate = not_terminal * (1.0 - truncateds.float()) * (gamma * lambda_)
    next_values = values[1:] if next_row is None else values.gather(0, next_row.long())
    if next_row is not None and valid is not None:
        propagate = torch.where(valid, propagate, torch.ones_like(propagate))
    deltas = rewards.float() + gamma * not_terminal * next_values - values[:-1]  # [T, N]
    if valid is not None:
        deltas = deltas * valid.float()
    advantages = torch.zeros_like(values)  # [T + 1, N]; row T stays 0 (nothing to propagate past the rollout)
    _backward_recursion(deltas, propagate, advantages)
    advantages = advantages[:-1]
    return advantages, advantages + values[:-1]


def _backward_recursion(deltas: torch.Tensor, propagate: torch.Tensor, out: torch.Tensor) -> None:
    """``out[t] = deltas[t] + propagate[t] * out[t + 1]`` for t = T-1..0, in place; ``out`` has T + 1 rows and its
    last row is the value carried in. One pass over T, each step one [N]-wide multiply-add."""
    if out.device.type == "cpu":
        # On a CPU the loop's cost is per-call overhead, several times smaller in numpy than in torch's dispatcher:
        # run the same recursion on the same memory through numpy views (no copies).
        o, d, p = (x.detach().numpy() for x in (out, deltas.contiguous(), propagate.contiguous()))
        for t in range(len(d) - 1, -1, -1):
            np.multiply(p[t], o[t + 1], out=o[t])
            o[t] += d[t]
    else:
        for t in range(len(deltas) - 1, -1, -1):
            torch.addcmul(deltas[t], propagate[t], out[t + 1], out=out[t])


def standardize(advantages: torch.Tensor, valid: torch.Tensor | None = None, eps: float = 1e-8,
                min_std: float | None = None) -> torch.Tensor:
    """Zero mean, unit std over the valid entries (one fused reduction, no host sync); invalid entries become 0.

    The std is divided as ``std + eps``, or, with ``min_std``, as ``max(std, min_std)`` (RLlib's
    GeneralAdvantageEstimation rule: population std floored at 1e-4)."""
    if valid is None:
        return (advantages - advantages.mean()) / (advantages.std() + eps)
    mask = valid.float()
    count = mask.sum().clamp(min=1.0)
    mean = (advantages * mask).sum() / count
    std = ((((advantages - mean) * mask) ** 2).sum() / count).sqrt()
    std = std.clamp(min=min_std) if min_std is not None else std + eps
    return (advantages - mean) / std * mask


def flat_value_targets(values: torch.Tensor, rewards: torch.Tensor, terminateds: torch.Tensor,
                       truncateds: torch.Tensor, *, gamma: float, lambda_: float) -> torch.Tensor:
    """RLlib's ``compute_value_targets`` on its flat layout (episodes concatenated, each elongated by one step),
    computed with the recursion vectorized across independent segments.

    RLlib's backward recursion over the flat array only restarts where ``propagate = (1 - term) * (1 - trunc)`` is
    0, so the array splits into segments ending at those positions. The segments are laid side by side, aligned at
    their ends, in a ``[S, K]`` tensor (S = longest segment), and one pass over S updates all K segments at once.
    Same result as RLlib's loop (including its values at the artificial steps, which its loss masks out).
    """
    values = values.float()
    n = values.shape[0]
    non_terminal = 1.0 - terminateds.float()
    propagate = non_terminal * (1.0 - truncateds.float())
    next_values = torch.cat([values[1:], values.new_zeros(1)])
    deltas = rewards.float() + gamma * non_terminal * next_values - values
    ends = torch.nonzero(propagate[:-1] == 0).flatten()
    ends = torch.cat([ends, ends.new_tensor([n - 1])])  # [K] last flat index of each segment
    starts = torch.cat([ends.new_zeros(1), ends[:-1] + 1])
    longest = int((ends - starts).max()) + 1
    rows = torch.arange(longest, device=values.device)[:, None]
    pos = ends[None, :] - (longest - 1 - rows)  # [S, K] flat index of each cell, segments aligned at their ends
    mask = pos >= starts[None, :]
    safe = pos.clamp(min=0)
    d = torch.where(mask, deltas[safe], 0.0)
    p = torch.where(mask, propagate[safe], 0.0) * (gamma * lambda_)
    adv = torch.zeros(longest + 1, pos.shape[1], device=values.device)
    _backward_recursion(d, p, adv)
    flat = torch.empty_like(values)
    flat[pos[mask]] = adv[:-1][mask]
    return flat + values
