"""A learner's batch join alone: runner batches read from Ray's object store and copied to the learner's GPU, the way
FastPPO's learner does it (:func:`rl_speed.learners.ppo.to_device`: a pageable copy straight from the object store's
shared memory), against two ways through pinned host memory.

Why: on the 4x H200 host the grid GPU preset's fetch + advantages took 0.518 s of one learner's 0.869 s per iteration,
for about 0.94 GB of batches from 56 runners, and at 4 learners the slowest learner's took twice the fastest's
(docs/studies/learner-scaling.md, "FastPPO's captured step on four learners"). A pageable copy moves a fraction of what PCIe can. This
bench says how fast each way moves a batch of that size on the host it runs on, before the learner is changed.

Ways, each timed in a Ray actor holding one GPU that reads objects the driver put (so, as a learner, it maps their
pages fresh), from ``ray.get`` until the bytes are on the device:

- ``pageable``: each object copied to the device from the object store's memory by the learner's own
  :func:`~rl_speed.learners.ppo.to_device`;
- ``staged``: each object copied into one pinned host buffer, and from there to the device asynchronously (the next
  object's host copy overlaps the previous one's transfer);
- ``registered``: each object's pages registered with CUDA (``cudaHostRegister``), copied, unregistered.

Per row: seconds per batch (median over ``repeats`` fresh batches) and GB/s. The bytes on the device are checked
against the source's. Run on the device with ``rl-speed bench batch-copy --device cuda``.
"""

from __future__ import annotations

import statistics
import time
import warnings
from typing import Any

import numpy as np

METHODS = ("pageable", "staged", "registered")
#: (megabytes, objects): one learner's batch of the grid GPU preset at 56 runners, and its share at 4 learners.
SIZES = ((940, 56), (235, 14))


def copy_to_device(arrays: list[np.ndarray], method: str, dest: Any, staging: Any = None) -> None:
    """Copies ``arrays`` one after another into the flat uint8 tensor ``dest`` (on any device) by ``method``;
    ``staging`` is the host buffer ``staged`` goes through (pinned where ``dest`` is on a GPU). Returns once the
    bytes are in ``dest``."""
    import torch

    if method not in METHODS:
        raise ValueError(f"batch_copy: unknown method {method!r}; choose from {list(METHODS)}.")
    if method == "registered" and dest.device.type != "cuda":
        raise ValueError("batch_copy: `registered` registers host pages with CUDA and needs a GPU.")
    from rl_speed.learners.ppo import to_device

    offset = 0
    for x in arrays:
        flat = np.ascontiguousarray(x).reshape(-1).view(np.uint8)
        size = flat.size
        target = dest[offset:offset + size]
        if method == "pageable":  # the learner's own copy, then into place on the device (a device-side copy)
            target.copy_(to_device(flat, target.device))
        elif method == "staged":
            staging[offset:offset + size].numpy()[:] = flat
            target.copy_(staging[offset:offset + size], non_blocking=True)
        else:
            _copy_registered(flat, target)
        offset += size
    if dest.device.type == "cuda":
        torch.cuda.synchronize(dest.device)


def _copy_registered(flat: np.ndarray, target: Any) -> None:
    import torch

    cudart = torch.cuda.cudart()
    pointer = flat.ctypes.data
    for flags in (0, 8):  # 8: cudaHostRegisterReadOnly, where the mapping refuses the default
        if int(cudart.cudaHostRegister(pointer, flat.nbytes, flags)) == 0:
            break
    else:
        raise RuntimeError("batch_copy: cudaHostRegister refused the object store's pages (flags 0 and 8).")
    try:
        with warnings.catch_warnings():  # arrays from Ray's object store are read-only; nothing writes to them
            warnings.simplefilter("ignore", UserWarning)
            target.copy_(torch.from_numpy(flat), non_blocking=True)
        torch.cuda.synchronize(target.device)  # the pages stay registered until the transfer is done
    finally:
        cudart.cudaHostUnregister(pointer)


def _copier_class() -> Any:
    import ray

    @ray.remote(num_gpus=1, num_cpus=1)
    class BatchCopier:
        """Holds the device buffer and the pinned staging buffer; times one batch per call."""

        def __init__(self, nbytes: int) -> None:
            import torch

            self.dest = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            self.staging = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

        def copy(self, refs: list, method: str, expected_sum: int) -> float:
            import torch

            self.dest.zero_()  # so the check below sees this call's bytes, not the last call's
            torch.cuda.synchronize()
            start = time.perf_counter()
            arrays = ray.get(refs)  # zero-copy views of the object store's memory, as the learner reads them
            copy_to_device(arrays, method, self.dest, self.staging)
            seconds = time.perf_counter() - start
            got = int(self.dest.sum(dtype=torch.int64))
            if got != expected_sum:
                raise RuntimeError(f"batch_copy: {method} delivered bytes summing to {got}, expected {expected_sum}")
            return seconds

    return BatchCopier


def run(repeats: int = 5, device: str = "cpu", sizes: tuple[tuple[int, int], ...] = SIZES,
        methods: tuple[str, ...] = METHODS) -> str:
    """The table: per size and method, seconds per batch (median of ``repeats``) and GB/s, interleaved by method."""
    if device != "cuda":
        raise ValueError("batch_copy measures copies to a GPU; run it on a GPU machine with --device cuda.")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"batch_copy: unknown methods {unknown}; choose from {list(METHODS)}.")
    import ray

    from benchmarks.common import machine

    ray.init(address="local", num_cpus=2, num_gpus=1, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for megabytes, objects in sizes:
            piece = megabytes * 2**20 // objects
            source = np.random.default_rng(0).integers(0, 256, piece, dtype=np.uint8)
            expected = int(source.sum(dtype=np.int64)) * objects
            copier = _copier_class().remote(piece * objects)
            seconds: dict[str, list[float]] = {m: [] for m in methods}
            for _ in range(repeats + 1):  # the first round warms up the actor and the device
                for method in methods:
                    refs = [ray.put(source) for _ in range(objects)]  # fresh objects: pages the actor has not read
                    seconds[method].append(ray.get(copier.copy.remote(refs, method, expected)))
                    del refs
            ray.kill(copier)
            for method in methods:
                median = statistics.median(seconds[method][1:])
                rows.append(f"| {megabytes:,} MB in {objects} objects | {method} | {median:.3f} s | "
                            f"{piece * objects / median / 1e9:.1f} GB/s |")
    finally:
        ray.shutdown()
    return "\n".join([
        "### A learner's batch join alone: object store to GPU",
        "",
        f"Command: `rl-speed bench batch-copy --device cuda --repeats {repeats}` · machine: {machine()} · date: "
        f"{time.strftime('%Y-%m-%d')} · from `ray.get` until the bytes are on the GPU, median of {repeats} fresh "
        "batches after one warm-up round, methods interleaved",
        "",
        "| batch | way | seconds | GB/s |",
        "|---|---|---:|---:|",
        *rows,
    ])
