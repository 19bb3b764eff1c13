"""OptimizerStepMixin: what one optimizer step of an rl_speed learner does, configured by keys every rl_speed
algorithm has.

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

The step has one fused norm/clip pass and one finiteness check (on the device on CUDA; see below). torch.compile is RLlib's own switch (``torch_compile_learner: true``,
``torch_compile_learner_what_to_compile: forward_train``), which compiles the module's ``forward_train``; it
composes with both keys.

* ``cuda_graph: true`` (CUDA learners): the whole step above is captured once as a CUDA graph and replayed
  (:mod:`rl_speed.learners.cuda_graph`), which removes the per-step Python and launch cost that bounds small
  models on a fast GPU. Composes with bf16, accumulation and compile of ``forward_train``. On several learners
  their modules are not wrapped in DDP: the step averages the gradients itself, with one all-reduce a graph can hold
  (:mod:`rl_speed.learners.gradient_all_reduce`).

The fused update:

RLlib's ``TorchLearner`` clips by global norm with a Python loop over parameters, then checks
``torch.isfinite(grad).all()`` in a Python ``if`` for every parameter, twice (one device sync per parameter tensor on
a GPU). Here the per-parameter norms come from one ``torch._foreach_norm`` call, clipping is one ``_foreach_mul_``,
and a non-finite update is skipped (no optimizer step) and counted in ``num_non_finite_updates_skipped_lifetime``.
The skip never leaves the device: Adam runs fused (CPU and CUDA) and takes the "found inf" flag as a tensor (the
mechanism ``GradScaler`` uses), and the skip count is read once per ``update()`` call, so the CPU queues the next
minibatch's kernels while the GPU still runs this one. Gradients are
zeroed with ``set_to_none=True`` by RLlib's ``compute_gradients`` already.

Mix in after :class:`rl_speed.learners.update_loop.UpdateLoopMixin` (whose loop calls the step once per minibatch
and sets ``is_last_minibatch``) and before the Torch learner: ``class L(UpdateLoopMixin, OptimizerStepMixin,
DQNTorchLearner)``. Learners configured with RLlib's own grad scaler or torch LR schedulers fall back to RLlib's
``apply_gradients``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import tree

from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.framework import get_device

from rl_speed.learners.cuda_graph import StepGraphs
from rl_speed.learners.gradient_all_reduce import average_gradients, broadcast_from_first, check_no_running_statistics

PRECISIONS = {"off": None, "bf16": torch.bfloat16, "fp16": torch.float16}
LOSS_SCALE_KEY = "fp16_loss_scale"
#: learner-state key of the fp16 grad scaler (saved with the optimizer component: a restored run keeps its scale)
GRAD_SCALER_STATE_KEY = "fp16_grad_scaler"
NON_FINITE_SKIPPED = "num_non_finite_updates_skipped_lifetime"


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


class OptimizerStepMixin:
    """Precision, accumulation, fused clip, finite-skip, scaler state and graph dispatch (see the module docstring)."""

    is_last_minibatch: bool = True  # set by the update loop

    @override(TorchLearner)
    def build(self) -> None:
        if self.config.num_gpus_per_learner > 0 and torch.cuda.is_available():
            # The learner's GPU as the process's current one before RLlib builds the module and its DDP wrapper: a
            # learner actor that sees every GPU of its host (benchmarks.scaling.learner_scaling's "all") would otherwise
            # set up NCCL's communicator and barriers on GPU 0, beside the others'. Where it sees only its own GPU,
            # this is GPU 0 anyway.
            torch.cuda.set_device(get_device(self.config, self.config.num_gpus_per_learner))
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

    def _averages_gradients_in_step(self) -> bool:
        """Several learners with a captured step: the step all-reduces the gradients, not DDP."""
        return bool(getattr(self.config, "cuda_graph", False)) and self.config.num_learners > 1

    @override(TorchLearner)
    def _make_modules_ddp_if_necessary(self) -> None:
        if not self._averages_gradients_in_step():
            return super()._make_modules_ddp_if_necessary()  # type: ignore[misc]
        for module_id in self._module.keys():
            check_no_running_statistics(self._module[module_id], type(self).__name__)
            broadcast_from_first(self._module[module_id])  # the same start on every learner, as DDP's constructor

    @override(TorchLearner)
    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        params = self.get_parameters(self._module[module_id])
        # fused on CPU and CUDA: one kernel per step (on CPU ~40% of foreach Adam's time for a 256-256 MLP) and a
        # skip flag that stays a tensor; capturable keeps the step count on the device, which a CUDA graph needs
        capturable = self._device.type == "cuda" and bool(getattr(self.config, "cuda_graph", False))
        if capturable:
            # The captured Adam kernel reads its lr from this device tensor at every replay: RLlib's lr schedule
            # (applied through _set_optimizer_lr after each update) then reaches a replayed step too.
            device_lr = torch.tensor(float(config.lr if isinstance(config.lr, (int, float)) else config.lr[0][1]),
                                     device=self._device)
            optimizer = torch.optim.Adam(params, lr=device_lr, fused=True, capturable=True)
            optimizer.device_lr = device_lr
        else:
            optimizer = torch.optim.Adam(params, fused=True)
        self.register_optimizer(module_id=module_id, optimizer=optimizer,
                                params=params, lr_or_lr_schedule=config.lr)

    @staticmethod
    @override(TorchLearner)
    def _set_optimizer_lr(optimizer: torch.optim.Optimizer, lr: Any) -> None:
        """RLlib's lr update (its schedules call it after every update); a capturable optimizer's lr is written into
        its device tensor in place, so a captured step replays with the new value."""
        device_lr = getattr(optimizer, "device_lr", None)
        if device_lr is not None:
            device_lr.fill_(float(lr))
        for group in optimizer.param_groups:
            group["lr"] = device_lr if device_lr is not None else lr

    def _restore_device_lrs(self) -> None:
        """A restored optimizer state brings plain-number lrs: put each capturable optimizer's device tensor back
        (holding that value) before a step is captured or replayed."""
        for optimizer in self._optimizer_parameters:
            device_lr = getattr(optimizer, "device_lr", None)
            if device_lr is not None and any(g["lr"] is not device_lr for g in optimizer.param_groups):
                self._set_optimizer_lr(optimizer, optimizer.param_groups[0]["lr"])

    def _autocast(self) -> Any:
        if self._autocast_dtype is None:
            return contextlib.nullcontext()
        # A captured CUDA graph must not use autocast's cache of cast weights (torch's CUDA graphs + AMP rule): the
        # cached casts would outlive the capture.
        return torch.autocast(device_type=self._device.type, dtype=self._autocast_dtype,
                              cache_enabled=self._step_graphs is None)

    @override(TorchLearner)
    def _uncompiled_update(self, batch: dict, **kwargs: Any) -> tuple[Any, dict, dict]:
        if self._step_graphs is None and self._autocast_dtype is None and self._accumulation == 1:
            return super()._uncompiled_update(batch, **kwargs)  # type: ignore[misc]
        self._compute_off_policyness(batch)  # reads the host's weights version: never inside a captured graph
        if self._step_graphs is not None:
            self._restore_device_lrs()
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
        if self._averages_gradients_in_step():
            average_gradients([p.grad for p in self._params.values() if p.grad is not None])
        if self._scaler is not None:
            for optim in self._optimizer_parameters:
                self._scaler.unscale_(optim)  # before the clip; records inf/nan for scaler.update()
        gradients = {pid: p.grad for pid, p in self._params.items() if p.grad is not None}
        self.apply_gradients(self.postprocess_gradients(gradients))
        return fwd_out, loss_per_module, {}

    @override(TorchLearner)
    def get_state(self, components: Any = None, *, not_components: Any = None, **kwargs: Any) -> dict:
        state = super().get_state(components, not_components=not_components, **kwargs)  # type: ignore[misc]
        if self._scaler is not None and self._check_component("optimizer", components, not_components):
            state[GRAD_SCALER_STATE_KEY] = self._scaler.state_dict()
        return state

    @override(TorchLearner)
    def set_state(self, state: dict) -> None:
        super().set_state(state)  # type: ignore[misc]
        # A checkpoint brings its optimizer's param groups, `capturable` among them; a captured step needs it on
        # (torch refuses to capture a non-capturable Adam), an eager one runs faster without. A capturable Adam
        # keeps its step counts on the parameters' device (a foreach checkpoint's are on the CPU).
        capturable = self._step_graphs is not None
        for optimizer in self._optimizer_parameters:
            for group in optimizer.param_groups:
                group["capturable"] = capturable
            for param, param_state in optimizer.state.items() if capturable else ():
                if isinstance(param_state.get("step"), torch.Tensor):
                    param_state["step"] = param_state["step"].to(param.device)
        if self._scaler is not None and GRAD_SCALER_STATE_KEY in state:
            self._scaler.load_state_dict(state[GRAD_SCALER_STATE_KEY])

    @override(TorchLearner)
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

    @override(TorchLearner)
    def apply_gradients(self, gradients_dict: dict) -> None:
        self._step_optimizers(gradients_dict)
        if self._scaler is not None:
            self._scaler.update()  # halves the scale after an overflow, doubles it after 2,000 clean steps
            if self.is_last_minibatch:
                self.metrics.log_value(LOSS_SCALE_KEY, self._scaler.get_scale(), window=1)

    def _step_optimizers(self, gradients_dict: dict) -> None:
        """Steps every optimizer, or skips a non-finite update (counted)."""
        finite_flags = getattr(self, "_update_finite", [])
        if self._grad_scalers is not None or self._lr_scheduler_classes is not None:
            finite_flags.clear()
            super().apply_gradients(gradients_dict)  # type: ignore[misc]
            return
        optimizers = [self.get_optimizer(module_id, name)
                      for module_id, names in self._module_optimizers.items() for name in names]
        # The param groups say how each optimizer steps: a state restored from a checkpoint made with foreach Adam
        # (rl_speed before fused Adam on CPU) brings its own flags, and only fused steps take `found_inf`.
        if finite_flags and all(group.get("fused") for o in optimizers for group in o.param_groups):
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

    @override(TorchLearner)
    def after_gradient_based_update(self, *, timesteps: dict) -> None:
        super().after_gradient_based_update(timesteps=timesteps)  # type: ignore[misc]
        skipped = getattr(self, "_skipped_on_device", None)
        if skipped is not None:  # read once per update() call: one device sync
            count = int(skipped.item())
            if count:
                skipped.zero_()
                self.metrics.log_value(NON_FINITE_SKIPPED, count, reduce="lifetime_sum")

