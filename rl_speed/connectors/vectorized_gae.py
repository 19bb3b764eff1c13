"""VectorizedGAE: a drop-in for RLlib's ``GeneralAdvantageEstimation`` learner connector piece (PPO pipeline).

Same inputs, outputs and conventions (value forward pass over the batch, advantages standardized over the module's
batch, results as tensors on the module's device), but the GAE recursion runs as :func:`flat_value_targets`: vectorized
across episode segments on the learner's device instead of RLlib's Python loop over every timestep. Stateful
(recurrent) modules, whose batches are zero-padded sequences, fall back to RLlib's own implementation.

Use it in stock PPO through :class:`rl_speed.learners.ppo.VectorizedGAEPPOTorchLearner`.
"""

from __future__ import annotations

from typing import Any

import torch

from ray.rllib.connectors.learner.general_advantage_estimation import GeneralAdvantageEstimation
from ray.rllib.core.columns import Columns
from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
from ray.rllib.evaluation.postprocessing import Postprocessing
from ray.rllib.utils.annotations import override
from ray.rllib.utils.numpy import convert_to_numpy

from rl_speed.gae import flat_value_targets


class VectorizedGAE(GeneralAdvantageEstimation):
    """``GeneralAdvantageEstimation`` with the recursion vectorized on the learner's device."""

    @override(GeneralAdvantageEstimation)
    def __call__(self, *, rl_module: Any, episodes: list, batch: dict, **kwargs: Any) -> dict:
        if any(rl_module[mid].is_stateful() for mid in batch if mid in rl_module):
            return super().__call__(rl_module=rl_module, episodes=episodes, batch=batch, **kwargs)
        for module_id, module_batch in batch.items():
            module = rl_module[module_id] if module_id in rl_module else None
            if not isinstance(module, ValueFunctionAPI):
                continue
            values = module.compute_values(module_batch).detach()  # [sum of episode lengths + 1 each]
            device = values.device

            def column(key: str) -> torch.Tensor:
                return torch.as_tensor(convert_to_numpy(module_batch[key]), device=device)

            targets = flat_value_targets(values, column(Columns.REWARDS), column(Columns.TERMINATEDS),
                                         column(Columns.TRUNCATEDS), gamma=self.gamma, lambda_=self.lambda_)
            advantages = targets - values
            # As RLlib: standardized over the module's whole batch (population std, floored at 1e-4).
            advantages = (advantages - advantages.mean()) / advantages.std(correction=0).clamp(min=1e-4)
            module_batch[Postprocessing.ADVANTAGES] = advantages
            module_batch[Postprocessing.VALUE_TARGETS] = targets
        return batch
