"""PPO's loss as RLlib's ``PPOTorchLearner.compute_loss_for_module`` computes it, without device-to-host syncs.

Why: RLlib averages each term over the loss mask by boolean indexing, ``torch.sum(x[mask]) / num_valid``. On a GPU a
boolean index is a ``nonzero`` whose result size the host must read, so each of the loss's six masked means stops
the learner's Python thread until the GPU has caught up, and the GPU then idles while the thread launches the next
kernels. That happens six times per minibatch, and FastPPO's columns always carry a mask (reset steps stay in the
batch, masked). Under DDP each of these waits also waits for the other learners' all-reduce of the previous step.
Here the masked mean is ``torch.where(mask, x, 0).sum() / num_valid``: the same value (summed in another order),
shapes known without a sync, and masked rows' non-finite values are still kept out, as indexing keeps them out.
No tensor is built from host data either (RLlib's builds constants with ``torch.tensor``: on a GPU a blocking copy,
and one that a captured CUDA graph cannot hold), so FastPPO's whole step can be captured (``cuda_graph: true``).

Everything else is RLlib's loss, term for term and key for key: the clipped surrogate, the KL term with the
learner's current coefficient, the entropy bonus with its schedule, the clipped value loss and the logged
statistics. The statistics are computed and logged for the last minibatch of an ``update()`` call only
(``learner.is_last_minibatch``, set by :class:`rl_speed.learners.update_loop.UpdateLoopMixin`'s loop; True
elsewhere): RLlib logs them with ``window=1``, so only the last minibatch's values survive the reduce anyway (the
KL coefficient's update reads that one too). Every other minibatch would spend a metrics call and more ops on values
that are thrown away: the grid arena LSTM's loss runs 94 ops with its statistics, 61 without.
``tests/learners/test_ppo_loss.py`` checks the loss, its gradients and every logged value against RLlib's own method
on the same batch, so a Ray upgrade that changes RLlib's loss fails there.

``learner_config_dict: {"ppo_loss": "rllib"}`` makes FastPPO's learner call RLlib's own method instead (default
``"sync_free"``, this module): the A/B of the two on a GPU (``benchmarks.scaling.learner_scaling``'s ``overrides``), and
a way back should a Ray version change RLlib's loss before this module follows.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ray.rllib.algorithms.ppo.ppo import (
    LEARNER_RESULTS_KL_KEY,
    LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY,
    LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY,
)
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.learner import ENTROPY_KEY, POLICY_LOSS_KEY, VF_LOSS_KEY
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.numpy import SMALL_NUMBER


#: ``learner_config_dict["ppo_loss"]`` values: this module's loss (the default) or RLlib's own method.
PPO_LOSSES = ("sync_free", "rllib")
PPO_LOSS_KEY = "ppo_loss"


def masked_mean_fn(batch: dict) -> Callable[[torch.Tensor], torch.Tensor]:
    """The mean over the batch's ``loss_mask`` rows (all rows without one), with no device-to-host sync."""
    if Columns.LOSS_MASK not in batch:
        return torch.mean
    mask = batch[Columns.LOSS_MASK]
    num_valid = torch.sum(mask)

    def masked_mean(x: torch.Tensor) -> torch.Tensor:
        rows = mask.reshape(mask.shape + (1,) * (x.dim() - mask.dim()))  # as x[mask]: the mask selects leading axes
        return torch.sum(torch.where(rows, x, torch.zeros((), dtype=x.dtype, device=x.device))) / num_valid

    return masked_mean


def explained_variance(y: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """RLlib's ``explained_variance`` (``max(-1, 1 - var(y - pred) / var(y))``) without its host tensor: RLlib builds
    the -1 bound with ``torch.tensor([-1.0]).to(device)``, a blocking host-to-device copy on a GPU, which a captured
    CUDA graph cannot hold (:mod:`rl_speed.learners.cuda_graph`)."""
    y = y.squeeze()
    y_var = torch.var(y, dim=0)
    diff_var = torch.var(y - pred.squeeze(), dim=0)
    return torch.clamp(1 - diff_var / (y_var + SMALL_NUMBER), min=-1.0)


def ppo_loss(learner: Any, module_id: str, config: Any, batch: dict, fwd_out: dict) -> torch.Tensor:
    """RLlib's PPO loss of ``module_id`` on ``batch`` (see the module docstring); logs what RLlib's logs, for the last
    minibatch of an ``update()`` call only (see the module docstring)."""
    module = learner.module[module_id].unwrapped()
    mean = masked_mean_fn(batch)
    curr_dist = module.get_train_action_dist_cls().from_logits(fwd_out[Columns.ACTION_DIST_INPUTS])
    prev_dist = module.get_exploration_action_dist_cls().from_logits(batch[Columns.ACTION_DIST_INPUTS])
    logp_ratio = torch.exp(curr_dist.logp(batch[Columns.ACTIONS]) - batch[Columns.ACTION_LOGP])

    if config.use_kl_loss:
        mean_kl_loss = mean(prev_dist.kl(curr_dist))
    else:
        mean_kl_loss = torch.zeros((), device=logp_ratio.device)  # a fill kernel: no host data (see above)
    curr_entropy = curr_dist.entropy()

    advantages = batch[Postprocessing.ADVANTAGES]
    surrogate_loss = torch.min(advantages * logp_ratio,
                               advantages * torch.clamp(logp_ratio, 1 - config.clip_param, 1 + config.clip_param))
    if config.use_critic:
        value_fn_out = module.compute_values(batch, embeddings=fwd_out.get(Columns.EMBEDDINGS))
        vf_loss = torch.pow(value_fn_out - batch[Postprocessing.VALUE_TARGETS], 2.0)
        vf_loss_clipped = torch.clamp(vf_loss, 0, config.vf_clip_param)
    else:
        value_fn_out = vf_loss = vf_loss_clipped = torch.zeros((), device=surrogate_loss.device)

    entropy_coeff = (learner.entropy_coeff(module_id) if hasattr(learner, "entropy_coeff")
                     else learner.entropy_coeff_schedulers_per_module[module_id].get_current_value())
    total_loss = mean(-surrogate_loss + config.vf_loss_coeff * vf_loss_clipped - entropy_coeff * curr_entropy)
    if config.use_kl_loss:
        total_loss += learner.curr_kl_coeffs_per_module[module_id] * mean_kl_loss

    if getattr(learner, "is_last_minibatch", True):
        critic = config.use_critic
        learner.metrics.log_dict(
            {
                POLICY_LOSS_KEY: -mean(surrogate_loss),
                VF_LOSS_KEY: mean(vf_loss_clipped) if critic else vf_loss_clipped,
                LEARNER_RESULTS_VF_LOSS_UNCLIPPED_KEY: mean(vf_loss) if critic else vf_loss,
                LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY: explained_variance(batch[Postprocessing.VALUE_TARGETS],
                                                                         value_fn_out),
                ENTROPY_KEY: mean(curr_entropy),
                LEARNER_RESULTS_KL_KEY: mean_kl_loss,
            },
            key=module_id,
            window=1,  # as RLlib's: single values, not reduced over time
        )
    return total_loss
