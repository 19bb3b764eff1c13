"""Where a machine's cores go during a timed run: CPU seconds of every process, read from Linux's ``/proc`` before
and after, grouped into the run's env runners, its driver (with a local learner), remote learners, Ray's own
processes and everything else, as cores busy on average (CPU seconds / wall seconds).

A run on a box whose cores are all busy is bound by the CPU time it spends per env step, wherever it is spent;
this tells which processes spend it. The runners' processes include their emulator threads (ale-py's thread pool).
Off Linux (no ``/proc``) the figures are empty.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from benchmarks.common import remote_values

#: Ray's own daemons by process name (``/proc/PID/comm``) or a fragment of their command line.
RAY_DAEMONS = ("raylet", "gcs_server")
RAY_COMMAND_FRAGMENTS = ("ray/dashboard", "log_monitor", "ray/_private", "ray::")
GROUPS = ("runners", "driver", "learners", "Ray", "other")


def cpu_seconds() -> dict[int, float]:
    """Every process's user + system CPU seconds so far, by PID (the processes readable now)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    out = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile, or not ours to read
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state is fields[0]
        out[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return out


def _is_ray_process(pid: int) -> bool:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return comm in RAY_DAEMONS or any(fragment in command for fragment in RAY_COMMAND_FRAGMENTS)


def actor_pids(algo: Any) -> dict[str, set[int]]:
    """The PIDs of ``algo``'s remote env runners and remote learners (empty sets where they are local)."""
    pids: dict[str, set[int]] = {"runners": set(), "learners": set()}
    group = algo.env_runner_group
    if group is not None and group.num_remote_env_runners():
        pids["runners"] = set(group.foreach_env_runner(lambda _: os.getpid(), local_env_runner=False))
    learners = algo.learner_group
    if learners is not None and not learners.is_local:
        pids["learners"] = set(remote_values(learners.foreach_learner(lambda _: os.getpid())))
    return pids


class CoresByProcess:
    """``start()`` then ``stop(algo)``: cores busy on average per group (:data:`GROUPS`) in between, and in all."""

    def start(self) -> None:
        self._before, self._clock = cpu_seconds(), time.perf_counter()

    def stop(self, algo: Any) -> dict[str, float]:
        after, wall = cpu_seconds(), time.perf_counter() - self._clock
        if not after:
            return {}
        actors = actor_pids(algo)
        busy = dict.fromkeys(GROUPS, 0.0)
        for pid, seconds in after.items():
            used = seconds - self._before.get(pid, 0.0)  # a process started meanwhile counts from zero
            if used <= 0:
                continue
            group = ("driver" if pid == os.getpid() else "runners" if pid in actors["runners"]
                     else "learners" if pid in actors["learners"] else "Ray" if _is_ray_process(pid) else "other")
            busy[group] += used
        cores = {group: seconds / wall for group, seconds in busy.items()}
        cores["all"] = sum(cores.values())
        return cores
