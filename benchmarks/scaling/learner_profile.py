"""Where a learner's update time goes: ``torch.profiler`` on every learner actor over one training iteration.

Why: on a 4x H100 host the grid arena's minibatch call costs 29 ms with one learner and 82 ms with four, for the same
32,768 rows per call (docs/studies/learner-scaling.md, 2026-11-28). Whether the GPUs then compute longer, wait for each other, or wait
for their host threads cannot be told from wall times. Per learner, over one iteration:

* ``device_busy_s``: the time the GPU ran anything (the union of its kernels' and copies' intervals, so overlapping
  streams count once);
* ``nccl_s``: the time in NCCL kernels. An all-reduce kernel runs until every rank has arrived, so this includes the
  wait for the slowest learner, not only the transfer;
* ``kernels`` and ``launches``: device events, and the host's kernel-launch calls (``cudaLaunchKernel`` and kin);
* ``host_sync_s``: host time in calls that block until the device catches up (``cuda*Synchronize``);
* ``ops``: ``aten::`` operators dispatched (the host's work per step; on a CPU learner the only figure besides time).

Set against the loop's wall time per minibatch call (the timed rows), a call whose device-busy time is a small part of
its wall time is bound by its host thread (Python, dispatch, launches), and a call whose NCCL time grows with the
learner count waits for the other learners. The profiler adds host overhead of its own, so the window's wall time
is not a timing figure; device times are (CUPTI reads them on the GPU).

Used by :func:`benchmarks.scaling.learner_scaling.run` (``profile=True``): :func:`profile_one_iteration` starts a profiler
in each learner actor's process, runs one ``algo.train()``, stops them and returns each learner's summary.
"""

from __future__ import annotations

import time
from typing import Any, Iterable

from benchmarks.common import remote_values

#: One profiler per learner in this process (each learner actor is its own process; a local learner shares the
#: driver's), keyed by ``id(learner)``: started and stopped by two remote calls.
_RUNNING: dict[int, tuple[Any, float]] = {}

LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaGraphLaunch",
                "cudaLaunchCooperativeKernel")


def start(learner: Any) -> None:
    """Starts a profiler of CPU ops (and CUDA kernels on a GPU learner) in ``learner``'s process."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    if id(learner) in _RUNNING:
        raise RuntimeError("learner_profile.start: this learner is already being profiled; call stop() first.")
    on_gpu = getattr(learner, "_device", torch.device("cpu")).type == "cuda"
    profiler = profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else []))
    profiler.start()
    _RUNNING[id(learner)] = (profiler, time.perf_counter())


def stop(learner: Any) -> dict:
    """Stops ``learner``'s profiler (after its device has finished) and returns :func:`summarize` of its events."""
    import torch

    profiler, started = _RUNNING.pop(id(learner))
    device = getattr(learner, "_device", torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    profiler.stop()
    return summarize(profiler.events(), time.perf_counter() - started)


def summarize(events: Iterable[Any], window_s: float) -> dict:
    """The figures of the module docstring from ``torch.profiler`` events (``name``, ``device_type``, ``time_range``
    in microseconds, ``is_user_annotation``)."""
    from torch.autograd import DeviceType

    device, host = [], []
    for event in events:
        if event.device_type == DeviceType.CPU:
            host.append(event)
        elif not getattr(event, "is_user_annotation", False):
            # A device-side user annotation (``record_function`` ranges such as DDP's ``nccl:all_reduce``) spans the
            # kernels it names, idle gaps included: counting it would add each NCCL kernel twice and call gaps busy.
            # torch's own device-time totals skip them too.
            device.append(event)
    intervals = sorted((e.time_range.start, e.time_range.end) for e in device)
    busy_us, end = 0.0, float("-inf")
    for lo, hi in intervals:  # the union: overlapping streams (compute and NCCL) count once
        if hi > end:
            busy_us += hi - max(lo, end)
            end = hi
    return {
        "window_s": window_s,
        "device_busy_s": busy_us / 1e6,
        "nccl_s": sum(e.time_range.end - e.time_range.start for e in device if "nccl" in e.name.lower()) / 1e6,
        "kernels": len(device),
        "launches": sum(1 for e in host if e.name in LAUNCH_CALLS),
        "host_sync_s": sum(e.time_range.end - e.time_range.start for e in host
                           if e.name.startswith("cuda") and "Synchronize" in e.name) / 1e6,
        "ops": sum(1 for e in host if e.name.startswith("aten::")),
    }


def profile_one_iteration(algo: Any) -> list[dict]:
    """One ``algo.train()`` with every learner profiled; each learner's :func:`summarize`, in learner order."""
    group = algo.learner_group
    remote_values(group.foreach_learner(start))
    try:
        algo.train()
    finally:
        summaries = remote_values(group.foreach_learner(stop))
    return summaries
