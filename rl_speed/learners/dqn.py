"""The torch learner FastDQN uses by default: RLlib's DQN loss with rl_speed's fused update.

One more saving: RLlib's DQN loss logs five statistics (loss, Q mean/min/max, mean TD error) with ``window=1`` for
every minibatch, so only the last minibatch of an ``update()`` call survives the reduce. This learner computes and
logs them for that last minibatch only; every minibatch still logs its per-sample TD errors (the replay priorities).
The loss itself is RLlib's formula (a test compares both); distributional DQN (``num_atoms > 1``) uses RLlib's code.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ray.rllib.algorithms.dqn.dqn_learner import (
    QF_LOSS_KEY,
    QF_MAX_KEY,
    QF_MEAN_KEY,
    QF_MIN_KEY,
    QF_NEXT_PREDS,
    QF_PREDS,
    QF_TARGET_NEXT_PREDS,
    TD_ERROR_MEAN_KEY,
)
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.core.columns import Columns
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import TD_ERROR_KEY

from rl_speed.learners.optimizer_step import OptimizerStepMixin
from rl_speed.learners.update_loop import LossRows, UpdateLoopMixin, keeps_input_statistics


class FastDQNTorchLearner(UpdateLoopMixin, OptimizerStepMixin, DQNTorchLearner):
    """RLlib's DQNTorchLearner (loss, target updates) with one fused clip + finiteness check per update."""

    #: It updates a module's input statistics (rl_speed.learners.update_loop.keeps_input_statistics) with each update
    #: call's replayed observations, before their minibatches (QNetModule's ``normalize_obs``; checked at config time).
    updates_input_statistics = True

    @override(UpdateLoopMixin)
    def _prepared_rows(self, training_data: Any, minibatch_size: int) -> list[LossRows]:
        rows = super()._prepared_rows(training_data, minibatch_size)
        for module_rows in rows:
            module = self.module[module_rows.module_id].unwrapped()
            if keeps_input_statistics(module):
                module.update_input_statistics(module_rows.batch[Columns.OBS])
        return rows

    @override(DQNTorchLearner)
    def compute_loss_for_module(self, *, module_id: str, config: Any, batch: dict, fwd_out: dict) -> torch.Tensor:
        if config.num_atoms > 1 or Columns.LOSS_MASK in batch:
            return super().compute_loss_for_module(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
        actions = batch[Columns.ACTIONS].long().unsqueeze(-1)  # [B] -> [B, 1]
        q_selected = torch.nan_to_num(fwd_out[QF_PREDS].gather(-1, actions), neginf=0.0).squeeze(-1)
        q_target_next = fwd_out[QF_TARGET_NEXT_PREDS]
        next_q = fwd_out[QF_NEXT_PREDS] if config.double_q else q_target_next  # argmax by the online net if double
        best = next_q.argmax(dim=-1, keepdim=True)
        q_next_best = torch.nan_to_num(q_target_next.gather(-1, best), neginf=0.0).squeeze(-1)
        not_terminated = 1.0 - batch[Columns.TERMINATEDS].float()
        target = (batch[Columns.REWARDS] + config.gamma ** batch["n_step"] * not_terminated * q_next_best).detach()
        loss_fn = nn.HuberLoss if config.td_error_loss_fn == "huber" else nn.MSELoss
        total_loss = torch.mean(batch["weights"] * loss_fn(reduction="none")(q_selected, target))
        # Logged statistics are detached: the logger holds them until the update() call ends, and a tensor with a
        # grad_fn would keep every minibatch's autograd graph (and activations) alive until then.
        q_selected = q_selected.detach()
        td_error = torch.abs(q_selected - target)
        self.metrics.log_value(key=(module_id, TD_ERROR_KEY), value=td_error, reduce="item_series")
        if self.is_last_minibatch:
            self.metrics.log_dict(
                {QF_LOSS_KEY: total_loss.detach(), QF_MEAN_KEY: q_selected.mean(), QF_MAX_KEY: q_selected.max(),
                 QF_MIN_KEY: q_selected.min(), TD_ERROR_MEAN_KEY: td_error.mean()},
                key=module_id, window=1)
        return total_loss
