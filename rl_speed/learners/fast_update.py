"""FastUpdateMixin: one fused gradient-norm pass per update for clipping and the finiteness check.

RLlib's ``TorchLearner`` clips by global norm with a Python loop over parameters, then checks
``torch.isfinite(grad).all()`` in a Python ``if`` for every parameter, twice (one device sync per parameter tensor on
a GPU). Here the per-parameter norms come from one ``torch._foreach_norm`` call, clipping is one ``_foreach_mul_``,
and the whole update is checked with a single ``.item()``: a non-finite update is skipped (no optimizer step) and
counted in ``num_non_finite_updates_skipped_lifetime``. Gradients are zeroed with ``set_to_none=True`` by RLlib's
``compute_gradients`` already.

It also slices minibatches of a ``batch=`` update as tensor views of the once-converted batch (RLlib's iterator
re-slices and concatenates ``SampleBatch`` objects per minibatch), and uses Adam's multi-tensor (``foreach``) kernels.

Mix in before the Torch learner: ``class MyLearner(FastUpdateMixin, DQNTorchLearner)``. Learners configured with a
grad scaler or torch LR schedulers fall back to RLlib's own ``apply_gradients``.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

NON_FINITE_SKIPPED = "num_non_finite_updates_skipped_lifetime"


class FastUpdateMixin:
    """See the module docstring. Works with any ``TorchLearner`` subclass."""

    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        params = self.get_parameters(self._module[module_id])
        self.register_optimizer(module_id=module_id, optimizer=torch.optim.Adam(params, foreach=True),
                                params=params, lr_or_lr_schedule=config.lr)

    def _create_iterator_if_necessary(self, *, training_data: Any, num_total_minibatches: int = 0,
                                      num_epochs: int = 1, minibatch_size: int | None = None,
                                      shuffle_batch_per_epoch: bool = False, **kwargs: Any) -> Any:
        simple = (training_data.batch is not None and training_data.episodes is None and minibatch_size
                  and num_epochs == 1 and not num_total_minibatches)
        if not simple:
            return super()._create_iterator_if_necessary(  # type: ignore[misc]
                training_data=training_data, num_total_minibatches=num_total_minibatches, num_epochs=num_epochs,
                minibatch_size=minibatch_size, shuffle_batch_per_epoch=shuffle_batch_per_epoch, **kwargs)
        batch = self._make_batch_if_necessary(training_data=training_data)  # tensors on the learner's device
        return self._tensor_minibatches(batch, minibatch_size)

    #: False while an update() call has more minibatches to go: losses may skip window-1 statistics then.
    is_last_minibatch: bool = True

    def _tensor_minibatches(self, batch: MultiAgentBatch, size: int) -> Iterator[MultiAgentBatch]:
        """Consecutive minibatches of ``size`` rows as views of ``batch``'s tensors (``[k*B, ...] -> k x [B, ...]``);
        a last partial minibatch is dropped (RLlib's iterator would wrap around to fill it)."""
        count = min(len(b) for b in batch.policy_batches.values())
        starts = range(0, count - size + 1, size)
        try:
            for start in starts:
                self.is_last_minibatch = start == starts[-1]
                yield MultiAgentBatch(
                    {mid: SampleBatch({k: v[start:start + size] for k, v in b.items()})
                     for mid, b in batch.policy_batches.items()},
                    env_steps=batch.env_steps(),
                )
        finally:
            self.is_last_minibatch = True

    def postprocess_gradients_for_module(self, *, module_id: str, config: Any = None,
                                         module_gradients_dict: dict) -> dict:
        grads = [g for g in module_gradients_dict.values() if g is not None]
        if not grads:
            return module_gradients_dict
        norms = torch._foreach_norm(grads)  # one fused pass over all gradient tensors
        global_norm = torch.linalg.vector_norm(torch.stack(norms))
        if not hasattr(self, "_update_finite"):
            self._update_finite: list[torch.Tensor] = []
        self._update_finite.append(torch.isfinite(global_norm))  # checked once, in apply_gradients
        clip = getattr(config, "grad_clip", None)
        if clip is not None and getattr(config, "grad_clip_by", "global_norm") == "global_norm":
            # Same rule as RLlib's clip_gradients: scale by clip / max(norm + 1e-6, clip), without a sync.
            torch._foreach_mul_(grads, clip / torch.clamp(global_norm + 1e-6, min=clip))
        elif clip is not None:
            return super().postprocess_gradients_for_module(  # type: ignore[misc]
                module_id=module_id, config=config, module_gradients_dict=module_gradients_dict)
        return module_gradients_dict

    def apply_gradients(self, gradients_dict: dict) -> None:
        finite_flags = getattr(self, "_update_finite", [])
        if self._grad_scalers is not None or self._lr_scheduler_classes is not None:
            finite_flags.clear()
            return super().apply_gradients(gradients_dict)  # type: ignore[misc]
        finite = bool(torch.stack(finite_flags).all().item()) if finite_flags else True  # the one device sync
        finite_flags.clear()
        if not finite:
            self.metrics.log_value(NON_FINITE_SKIPPED, 1, reduce="lifetime_sum")
            return
        for module_id, optimizer_names in self._module_optimizers.items():
            for optimizer_name in optimizer_names:
                self.get_optimizer(module_id, optimizer_name).step()

