"""FastUpdateMixin: one fused gradient-norm pass per update for clipping and the finiteness check.

RLlib's ``TorchLearner`` clips by global norm with a Python loop over parameters, then checks
``torch.isfinite(grad).all()`` in a Python ``if`` for every parameter, twice (one device sync per parameter tensor on
a GPU). Here the per-parameter norms come from one ``torch._foreach_norm`` call, clipping is one ``_foreach_mul_``,
and a non-finite update is skipped (no optimizer step) and counted in ``num_non_finite_updates_skipped_lifetime``.
On CUDA the skip never leaves the device: Adam runs fused and takes the "found inf" flag as a tensor (the mechanism
``GradScaler`` uses), and the skip count is read once per ``update()`` call, so the CPU queues the next minibatch's
kernels while the GPU still runs this one. On CPU the flag is read with one ``.item()`` per step. Gradients are
zeroed with ``set_to_none=True`` by RLlib's ``compute_gradients`` already.

It also runs ``update(batch=..., minibatch_size=B, num_epochs=1)`` (FastDQN's call) as a lean loop: the batch is
converted to tensors once, minibatches are tensor views, and RLlib's per-minibatch bookkeeping (SampleBatch wrappers,
steps-trained counters, Prometheus counters, timers) is done once per call with the same totals. Other update
calls (episodes, several epochs, shuffling, data iterators) take RLlib's own path. Adam uses its multi-tensor
(``foreach``) kernels.

Mix in before the Torch learner: ``class MyLearner(FastUpdateMixin, DQNTorchLearner)``. Learners configured with a
grad scaler or torch LR schedulers fall back to RLlib's own ``apply_gradients``.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.core import ALL_MODULES
from ray.rllib.utils.metrics import (
    NUM_ENV_STEPS_TRAINED,
    NUM_ENV_STEPS_TRAINED_LIFETIME,
    NUM_MODULE_STEPS_TRAINED,
    NUM_MODULE_STEPS_TRAINED_LIFETIME,
    WEIGHTS_SEQ_NO,
)

NON_FINITE_SKIPPED = "num_non_finite_updates_skipped_lifetime"


class FastUpdateMixin:
    """See the module docstring. Works with any ``TorchLearner`` subclass."""

    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        params = self.get_parameters(self._module[module_id])
        # fused (CUDA): one kernel per step and an on-device skip; foreach (CPU): multi-tensor kernels
        # (capturable: its step count stays on the device, which a replayed CUDA graph needs)
        kind = ({"fused": True, "capturable": bool(getattr(self.config, "cuda_graph", False))}
                if self._device.type == "cuda" else {"foreach": True})
        self.register_optimizer(module_id=module_id, optimizer=torch.optim.Adam(params, **kind),
                                params=params, lr_or_lr_schedule=config.lr)

    #: False while an update() call has more minibatches to go: losses may skip window-1 statistics then.
    is_last_minibatch: bool = True

    def update(self, *args: Any, training_data: Any = None, timesteps: dict | None = None, num_epochs: int = 1,
               minibatch_size: int | None = None, shuffle_batch_per_epoch: bool = False,
               num_total_minibatches: int = 0, **kwargs: Any) -> Any:
        lean = (not args and training_data is not None and training_data.batch is not None
                and training_data.episodes is None and not training_data.data_iterators and minibatch_size
                and num_epochs == 1 and not num_total_minibatches and not kwargs.get("_no_metrics_reduce")
                and len(self.module) == 1)
        if not lean:
            return super().update(  # type: ignore[misc]
                *args, training_data=training_data, timesteps=timesteps, num_epochs=num_epochs,
                minibatch_size=minibatch_size, shuffle_batch_per_epoch=shuffle_batch_per_epoch,
                num_total_minibatches=num_total_minibatches, **kwargs)
        self._check_is_built()
        self.before_gradient_based_update(timesteps=timesteps or {})
        training_data.validate()
        training_data.solve_refs()
        self._weights_seq_no += 1
        batch = self._make_batch_if_necessary(training_data=training_data)  # tensors on the learner's device
        (module_id, module_batch), = batch.policy_batches.items()
        starts = range(0, len(module_batch) - minibatch_size + 1, minibatch_size)
        try:
            for start in starts:  # [k*B, ...] -> k x [B, ...] views, no copies
                self.is_last_minibatch = start == starts[-1]
                minibatch = {k: v[start:start + minibatch_size] for k, v in module_batch.items()}
                _, loss_per_module, _ = self._update({module_id: minibatch})
        finally:
            self.is_last_minibatch = True
        self._log_lean_update(module_id, len(starts) * minibatch_size, len(starts) * batch.env_steps(),
                              loss_per_module)
        self.after_gradient_based_update(timesteps=timesteps or {})
        return self.metrics.reduce()

    def _log_lean_update(self, module_id: str, module_steps: int, env_steps: int, loss_per_module: dict) -> None:
        """What RLlib's update() logs per minibatch, logged once with the call's totals."""
        self.metrics.log_value((module_id, WEIGHTS_SEQ_NO), self._weights_seq_no, window=1)
        self.metrics.log_value((module_id, NUM_MODULE_STEPS_TRAINED), module_steps, reduce="sum")
        self.metrics.log_value((module_id, NUM_MODULE_STEPS_TRAINED_LIFETIME), module_steps, reduce="lifetime_sum",
                               with_throughput=True)
        self.metrics.log_value((ALL_MODULES, NUM_MODULE_STEPS_TRAINED), module_steps, reduce="sum",
                               with_throughput=True)
        self.metrics.log_value((ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME), module_steps,
                               reduce="lifetime_sum", with_throughput=True)
        self.metrics.log_value((ALL_MODULES, NUM_ENV_STEPS_TRAINED), env_steps, reduce="sum", with_throughput=True)
        self.metrics.log_value((ALL_MODULES, NUM_ENV_STEPS_TRAINED_LIFETIME), env_steps, reduce="lifetime_sum",
                               with_throughput=True)
        for mid, loss in loss_per_module.items():
            self.metrics.log_value(key=(mid, self.TOTAL_LOSS_KEY), value=loss, window=1)

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
        optimizers = [self.get_optimizer(module_id, name)
                      for module_id, names in self._module_optimizers.items() for name in names]
        if finite_flags and all(o.defaults.get("fused") for o in optimizers):
            found_inf = (~torch.stack(finite_flags).all()).float()  # stays on the device: no sync
            finite_flags.clear()
            for optimizer in optimizers:
                optimizer.found_inf = found_inf  # the fused kernel skips the update (and the step count) if 1
                optimizer.step()
                optimizer.found_inf = None
            if getattr(self, "_skipped_on_device", None) is None:
                self._skipped_on_device = torch.zeros((), device=found_inf.device)
            self._skipped_on_device.add_(found_inf)  # in place: a replayed CUDA graph of this step counts too
            return
        finite = bool(torch.stack(finite_flags).all().item()) if finite_flags else True  # the one device sync
        finite_flags.clear()
        if not finite:
            self.metrics.log_value(NON_FINITE_SKIPPED, 1, reduce="lifetime_sum")
            return
        for optimizer in optimizers:
            optimizer.step()

    def after_gradient_based_update(self, *, timesteps: dict) -> None:
        super().after_gradient_based_update(timesteps=timesteps)  # type: ignore[misc]
        skipped = getattr(self, "_skipped_on_device", None)
        if skipped is not None:  # read once per update() call: one device sync
            count = int(skipped.item())
            if count:
                skipped.zero_()
                self.metrics.log_value(NON_FINITE_SKIPPED, count, reduce="lifetime_sum")

