"""TrainStepMixin: how one optimizer step is computed, configured by keys every rl_speed algorithm has.

* ``mixed_precision: off | bf16 | fp16``: the forward pass and the loss run under ``torch.autocast`` with that
  dtype (the backward follows autocast's casts; parameters, gradients and optimizer state stay fp32). fp16 adds a
  ``torch.amp.GradScaler``: the loss is scaled before ``backward``, the gradients are unscaled before the fused
  clip (so ``grad_clip`` means what it says), and a step whose gradients overflowed is skipped, counted in
  ``num_non_finite_updates_skipped_lifetime`` and lowers the scale. fp16 needs a CUDA learner; bf16 runs on CPU and
  GPU without a scaler (its exponent range is fp32's).
* ``grad_accumulation_steps: k``: each minibatch is split into k micro-batches along the batch axis; each one's loss
  is weighted by its share of the rows (1/k for equal parts) and backpropagated, and one optimizer step follows.
  For a loss that is a mean over rows this is exactly the big-batch gradient, with 1/k of the activation memory.
  (BatchNorm is the exception: its statistics are per micro-batch.)

The step keeps :class:`FastUpdateMixin`'s one fused norm/clip pass and its finiteness check (on the device on
CUDA). torch.compile is RLlib's own switch (``torch_compile_learner: true``,
``torch_compile_learner_what_to_compile: forward_train``), which compiles the module's ``forward_train``; it
composes with both keys.

* ``cuda_graph: true`` (CUDA learners): the whole step above is captured once as a CUDA graph and replayed
  (:mod:`rl_speed.learners.cuda_graph`), which removes the per-step Python and launch cost that bounds small
  models on a fast GPU. Composes with bf16, accumulation and compile of ``forward_train``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import tree

from rl_speed.learners.cuda_graph import StepGraphs
from rl_speed.learners.fast_update import FastUpdateMixin

PRECISIONS = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}
LOSS_SCALE_KEY = "fp16_loss_scale"
#: learner-state key of the fp16 grad scaler (saved with the optimizer component: a restored run keeps its scale)
GRAD_SCALER_STATE_KEY = "fp16_grad_scaler"


def check_train_step_keys(config: Any, name: str) -> None:
    """Config-time errors for the two keys (called from every rl_speed config's ``validate``)."""
    mode = config.mixed_precision
    if mode not in PRECISIONS:
        config._value_error(f"{name}: `mixed_precision`={mode!r} is not one of {', '.join(PRECISIONS)}; use 'bf16' "
                            "(CPU or GPU), 'fp16' (CUDA learners, with a grad scaler) or 'off'.")
    if mode == "fp16" and not config.num_gpus_per_learner:
        config._value_error(f"{name}: `mixed_precision`='fp16' needs a CUDA learner (fp16 autocast and its grad "
                            "scaler are GPU features), but `num_gpus_per_learner` is 0; set "
                            "`num_gpus_per_learner: 1`, or use 'bf16' on CPU.")
    k = config.grad_accumulation_steps
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        config._value_error(f"{name}: `grad_accumulation_steps`={k!r} must be an integer >= 1 (1 = no accumulation).")


def micro_batches(batch: dict, k: int) -> list[tuple[float, dict]]:
    """``(share of rows, micro-batch)`` for k near-equal parts of ``batch`` along dim 0 (views, no copies).

    Tensors whose first dim is the batch size are split; anything else (scalars, per-batch constants) is shared.
    """
    sizes = [x.shape[0] for x in tree.flatten(batch) if isinstance(x, torch.Tensor) and x.dim() > 0]
    if not sizes:
        return [(1.0, batch)]
    rows = max(set(sizes), key=sizes.count)  # the batch axis: the first dim most columns share
    k = min(k, rows)
    bounds = [rows * i // k for i in range(k + 1)]

    def part(lo: int, hi: int) -> dict:
        return tree.map_structure(
            lambda x: x[lo:hi] if isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == rows else x, batch)

    return [((hi - lo) / rows, part(lo, hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]


class TrainStepMixin(FastUpdateMixin):
    """Mixed precision and gradient accumulation around RLlib's update step (see the module docstring)."""

    def build(self) -> None:
        super().build()  # type: ignore[misc]
        mode = getattr(self.config, "mixed_precision", "off")
        if mode not in PRECISIONS:
            raise ValueError(f"{type(self).__name__}: `mixed_precision`={mode!r}; use one of {', '.join(PRECISIONS)}.")
        if mode == "fp16" and self._device.type != "cuda":
            raise ValueError(f"{type(self).__name__}: `mixed_precision`='fp16' needs a CUDA learner; this learner "
                             f"runs on {self._device}. Use 'bf16' on CPU.")
        self._autocast_dtype = PRECISIONS[mode]
        self._scaler = torch.amp.GradScaler("cuda") if mode == "fp16" else None
        self._accumulation = int(getattr(self.config, "grad_accumulation_steps", 1))
        self._step_graphs = None
        if getattr(self.config, "cuda_graph", False):
            if self._device.type != "cuda" or self._scaler is not None:
                raise ValueError(f"{type(self).__name__}: `cuda_graph` needs a CUDA learner without fp16's grad "
                                 f"scaler; this learner runs on {self._device} with mixed_precision={mode!r}.")
            self._step_graphs = StepGraphs(self, self._train_step)

    def _autocast(self) -> Any:
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        # A captured CUDA graph must not use autocast's cache of cast weights (torch's CUDA graphs + AMP rule): the
        # cached casts would outlive the capture.
        return torch.autocast(device_type=self._device.type, dtype=self._autocast_dtype,
                              cache_enabled=self._step_graphs is None)

    def _uncompiled_update(self, batch: dict, **kwargs: Any) -> tuple[Any, dict, dict]:
        if self._step_graphs is None and self._autocast_dtype is None and self._accumulation == 1:
            return super()._uncompiled_update(batch, **kwargs)  # type: ignore[misc]
        self._compute_off_policyness(batch)  # reads the host's weights version: never inside a captured graph
        if self._step_graphs is not None:
            return self._step_graphs(batch)
        return self._train_step(batch)

    def _train_step(self, batch: dict) -> tuple[Any, dict, dict]:
        """Forward, loss, backward (per micro-batch, under autocast), unscale, clip and optimizer step."""
        for optim in self._optimizer_parameters:
            optim.zero_grad(set_to_none=True)
        loss_per_module: dict = {}
        fwd_out: Any = None
        for share, part in micro_batches(batch, self._accumulation):
            with self._autocast():
                fwd_out = self.module.forward_train(part)
                losses = self.compute_losses(fwd_out=fwd_out, batch=part)
            total = sum(losses.values()) * share  # a mean over rows: shares add up to the big-batch mean
            if isinstance(total, torch.Tensor) and total.grad_fn is not None:
                (self._scaler.scale(total) if self._scaler is not None else total).backward()
            for module_id, loss in losses.items():
                loss_per_module[module_id] = loss_per_module.get(module_id, 0.0) + loss.detach().float() * share
        if self._scaler is not None:
            for optim in self._optimizer_parameters:
                self._scaler.unscale_(optim)  # before the clip; records inf/nan for scaler.update()
        gradients = {pid: p.grad for pid, p in self._params.items() if p.grad is not None}
        self.apply_gradients(self.postprocess_gradients(gradients))
        return fwd_out, loss_per_module, {}

    def get_state(self, components: Any = None, *, not_components: Any = None, **kwargs: Any) -> dict:
        state = super().get_state(components, not_components=not_components, **kwargs)  # type: ignore[misc]
        if self._scaler is not None and self._check_component("optimizer", components, not_components):
            state[GRAD_SCALER_STATE_KEY] = self._scaler.state_dict()
        return state

    def set_state(self, state: dict) -> None:
        super().set_state(state)  # type: ignore[misc]
        if self._scaler is not None and GRAD_SCALER_STATE_KEY in state:
            self._scaler.load_state_dict(state[GRAD_SCALER_STATE_KEY])

    def apply_gradients(self, gradients_dict: dict) -> None:
        super().apply_gradients(gradients_dict)  # steps, or skips and counts an overflowed update
        if self._scaler is not None:
            self._scaler.update()  # halves the scale after an overflow, doubles it after 2,000 clean steps
            if self.is_last_minibatch:
                self.metrics.log_value(LOSS_SCALE_KEY, self._scaler.get_scale(), window=1)
