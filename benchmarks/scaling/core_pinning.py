"""Cores of their own for the learners: each learner actor pinned to one physical core (its hyperthread siblings
included), every env runner to the host's other cores.

Why: on a 4x H200 host (docs/studies/learner-scaling.md, 2026-11-28) the grid arena's learner time per iteration at 4 learners was
0.51 s with the runners idle during the update (sync sampling) and 1.24 s with 56 runners sampling beside it (the
preset's async sampling), on 64 logical CPUs. A learner's thread launches about a thousand small kernels per
minibatch, so it runs at the pace of the CPU it gets; unpinned, the OS puts it beside a runner on a shared core (or
its hyperthread sibling). Ray reserves CPUs only as scheduling counts; it does not place processes on cores.

:func:`pin_cores` sets the affinity of every thread of each learner and runner process (threads started later
inherit it). The driver and Ray's own processes stay unpinned. One host only: the core map is the driver's. Used by
:func:`benchmarks.scaling.learner_scaling.run` (``pin_cores=True``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from benchmarks.common import remote_values


def physical_cores() -> list[list[int]]:
    """This process's CPUs grouped by physical core (hyperthread siblings together), in core order."""
    groups: dict[str, list[int]] = {}
    for cpu in sorted(os.sched_getaffinity(0)):
        try:
            siblings = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
        except OSError:
            siblings = str(cpu)
        groups.setdefault(siblings, []).append(cpu)
    return sorted(groups.values())


def pin_this_process(cpus: list[int]) -> list[int]:
    """Sets the affinity of every thread of this process to ``cpus``; returns the process's affinity after it."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            pass
    return sorted(os.sched_getaffinity(0))


def split_cores(learners: int) -> tuple[list[list[int]], list[int]]:
    """Physical cores ``0 .. learners - 1`` (one per learner) and the CPUs of all the others (the runners'). Refuses a
    host with no core left for the runners."""
    cores = physical_cores()
    if len(cores) <= learners:
        raise ValueError(f"core_pinning: `pin_cores` needs a physical core per learner ({learners}) and one more for "
                         f"the runners; this process may use {len(cores)}.")
    return cores[:learners], sorted(cpu for core in cores[learners:] for cpu in core)


def _learner_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def pin_cores(algo: Any) -> dict:
    """Learner ``rank`` gets physical core ``rank``; the env runners share the remaining cores. Returns the CPUs each
    got (``{"learners": [[...], ...], "runners": [...]}``). Refuses, before pinning anything, a host with no core left
    for the runners or an algorithm whose learners run in the driver's process."""
    group = algo.learner_group
    if group.is_local:
        raise ValueError("pin_cores: the learner runs in the driver's process (num_learners=0); pinning it would pin "
                         "the driver. Use num_learners >= 1.")
    own, rest = split_cores(len(group))

    def pin_learner(_learner: Any) -> tuple[int, list[int]]:
        rank = _learner_rank()
        return rank, pin_this_process(own[rank])

    pinned = remote_values(group.foreach_learner(pin_learner))
    algo.env_runner_group.foreach_env_runner(lambda _runner: pin_this_process(rest), local_env_runner=False)
    return {"learners": [cpus for _, cpus in sorted(pinned)], "runners": rest}
