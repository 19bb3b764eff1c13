"""StepGraphs: a learner's whole optimizer step (forward, loss, backward, clip, Adam) captured once as a CUDA graph
and replayed for every later minibatch of the same shapes.

Why: on an H100 the Mario learner's step at batch 512 is host-bound. A profile shows the GPU busy for 2.9 ms of a
7.7 ms step; the rest is Python (RLlib's learner path, the loss, autograd) and about 200 kernel launches, the same
for every precision. So bf16 and torch.compile of ``forward_train`` cannot buy much, and ``torch.compile``'s own CUDA
graphs ("reduce-overhead") cover only the forward. Replaying one graph of the whole step launches all of its kernels
in one call and runs no Python per step.

How (torch's "whole network capture" recipe):

* The first ``warmup`` steps of each input signature (the shapes and dtypes of the batch's tensors) run eagerly on
  a side stream: Adam creates its state, cuDNN picks its algorithms, torch.compile compiles.
* The next step is captured: the batch is copied into static input tensors, gradients are set to ``None``, and the
  step runs once under ``torch.cuda.graph`` (which records kernels without running them); then it is replayed.
* Every later step copies the minibatch into the static inputs (device-to-device) and replays the graph.
* Metrics: the step's ``self.metrics.log_value`` / ``log_dict`` calls (loss, TD errors for the replay priorities,
  Q statistics) happen in Python, which a replay skips. During capture they are recorded; after each replay they
  are issued again with copies of the graph's output tensors, which now hold this step's values. Calls with
  ``window=1`` (only the last value survives) are issued for the last minibatch of an ``update()`` only.

FastDQN and FastPPO. RLlib's PPO loss blocks capture (its masked means index by a boolean mask, a device-to-host
sync, and it builds a constant with ``torch.tensor``, a blocking copy); FastPPO's loss,
:mod:`rl_speed.learners.ppo_loss`, does neither. PPO's KL coefficient is a device tensor that RLlib updates in place
after each ``update()``, so a replay reads its current value; the same holds for the learning rate (Adam's lr is a
device tensor, written in place by RLlib's lr schedule, :mod:`rl_speed.learners.optimizer_step`) and PPO's entropy
coefficient (a device tensor the learner sets from RLlib's schedule after each update). What a replay cannot see, and the config therefore
refuses (``rl_speed.algorithms.config.check_cuda_graph_keys``): a CPU learner, fp16's grad scaler (its scale and skip
bookkeeping live in Python), several learners where their minibatch shapes may differ (FastDQN; FastPPO's learners step in lockstep
and average their gradients in the step, :mod:`rl_speed.learners.gradient_all_reduce`), several modules (one
captured step holds every module's optimizer), RLlib's LSTM (a new padded shape every batch), and torch.compile
modes that capture graphs themselves.
Host-side state the step reads is frozen at capture; the step here reads none (the weights version used for the
off-policyness metric is logged outside the graph). BatchNorm statistics, Adam's step count, the skipped-update
counter and the target network (synced in place by ``load_state_dict``) are device tensors updated
in place, so they stay correct.

One trap (torch's, shown by a failed capture, not by wrong numbers): a tensor that keeps an autograd graph of the
parameters alive from outside the step, e.g. ``p.clone()`` without ``.detach()``, holds their gradient-accumulator
nodes on the stream that created them, and the captured backward then fails ("operation would make the legacy
stream depend on a capturing blocking stream"). Logged statistics are detached for the same reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import tree


class _RecordingMetrics:
    """Stands in for the learner's MetricsLogger during capture: records ``log_value`` / ``log_dict`` calls."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.calls: list[tuple[str, tuple, dict]] = []

    def log_value(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("log_value", args, kwargs))

    def log_dict(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append(("log_dict", args, kwargs))

    def __getattr__(self, name: str) -> Any:  # reads (peek, ...) go to the real logger
        return getattr(self._real, name)


@dataclass
class _Entry:
    warm: int = 0
    graph: torch.cuda.CUDAGraph | None = None
    inputs: Any = None
    outputs: Any = None
    calls: list = field(default_factory=list)


def _signature(batch: Any) -> tuple:
    return tuple((path, tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else (path, repr(x))
                 for path, x in tree.flatten_with_path(batch))


def _clone(structure: Any) -> Any:
    return tree.map_structure(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, structure)


class StepGraphs:
    """Runs ``step(batch)`` for ``learner`` as a replayed CUDA graph per input signature (see the module docstring).

    ``step`` may zero gradients with ``set_to_none=True`` (RLlib's ``compute_gradients`` does): capture starts
    with them ``None``, so its first backward allocates them from the graph's memory pool. Shapes beyond
    ``max_graphs`` signatures run eagerly.
    """

    def __init__(self, learner: Any, step: Callable[[Any], Any], warmup: int = 3, max_graphs: int = 4) -> None:
        self._learner, self._step, self._warmup, self._max_graphs = learner, step, warmup, max_graphs
        self._entries: dict[tuple, _Entry] = {}
        self._side_stream: torch.cuda.Stream | None = None
        self.replays = 0

    def __call__(self, batch: Any) -> Any:
        key = _signature(batch)
        entry = self._entries.get(key)
        if entry is None:
            if len(self._entries) >= self._max_graphs:  # shapes keep changing: graphs would not pay; run eagerly
                return self._step(batch)
            entry = self._entries[key] = _Entry()
        if entry.warm < self._warmup:
            entry.warm += 1
            return self._eager_on_side_stream(batch)
        if entry.graph is None:
            self._capture(entry, batch)
        tree.map_structure(lambda dst, src: dst.copy_(src) if isinstance(dst, torch.Tensor) else None,
                           entry.inputs, batch)
        entry.graph.replay()
        self.replays += 1
        outputs = _clone(entry.outputs)  # the next replay overwrites the graph's outputs
        self._reissue(entry.calls)
        return outputs

    def _eager_on_side_stream(self, batch: Any) -> Any:
        side = self._side_stream = self._side_stream or torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = self._step(batch)
        torch.cuda.current_stream().wait_stream(side)
        return out

    def _capture(self, entry: _Entry, batch: Any) -> None:
        learner = self._learner
        entry.inputs = _clone(batch)
        for optimizer in learner._optimizer_parameters:
            optimizer.zero_grad(set_to_none=True)  # backward then allocates the gradients from the graph's pool
        real_metrics, last = learner.metrics, learner.is_last_minibatch
        recorder = _RecordingMetrics(real_metrics)
        learner.metrics, learner.is_last_minibatch = recorder, True  # capture every statistic the step can log
        graph = torch.cuda.CUDAGraph()
        # With shared inference a serving thread of this process answers the runners on the GPU meanwhile (its own
        # stream and graphs, captured before training): CUDA's default "global" mode would refuse its calls during
        # this capture; "thread_local" checks this thread's calls only.
        mode = "thread_local" if getattr(learner.config, "shared_inference", False) else "global"
        try:
            with torch.cuda.graph(graph, capture_error_mode=mode):
                entry.outputs = self._step(entry.inputs)
        finally:
            learner.metrics, learner.is_last_minibatch = real_metrics, last
        entry.graph, entry.calls = graph, recorder.calls

    def _reissue(self, calls: list) -> None:
        metrics, last = self._learner.metrics, self._learner.is_last_minibatch
        for method, args, kwargs in calls:
            if kwargs.get("window") == 1 and not last:
                continue  # overwritten by the last minibatch's value anyway
            getattr(metrics, method)(*_clone(args), **_clone(kwargs))
