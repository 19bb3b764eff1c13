"""Shared pieces of the benchmarks: timing by medians and a machine description."""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable


def median_rate(step: Callable[[], int], repeats: int = 5, min_seconds: float = 0.5) -> float:
    """Median over ``repeats`` runs of items per second; each run calls ``step`` (returning items done) for at
    least ``min_seconds``. Medians, because this machine is shared and noisy."""
    rates = []
    for _ in range(repeats):
        items, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < min_seconds:
            items += step()
        rates.append(items / elapsed)
    return statistics.median(rates)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"
