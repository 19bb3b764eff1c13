"""The race's statistics: summaries over seeds and the exact permutation test."""

from __future__ import annotations

import itertools
import math
import statistics

import numpy as np


def _summary(values: list[float], fmt: str) -> str:
    """Median (lowest-highest); "to" between the two where one is negative ("-19.05 to -15.60", not "-19.05--15.60")."""
    low, high = format(min(values), fmt), format(max(values), fmt)
    joint = " to " if min(values) < 0 else "-"
    return f"{format(statistics.median(values), fmt)} ({low}{joint}{high})"


def _all_seeds_median(times: list[float], seeds: int) -> str:
    """Where some seeds missed the target: the median over every seed, a missed one counting as later than any hit
    (the summary before it covers the hits only, which flatters a contender that often misses)."""
    if len(times) == seeds:
        return ""
    median = statistics.median(sorted(times) + [math.inf] * (seeds - len(times)))
    return f"; all {seeds} seeds: " + (f"median {median:.1f} s" if median < math.inf else "median not reached")


def permutation_p(a: list[float], b: list[float]) -> float:
    """Two-sided exact permutation test on the difference of means (all splits of the pooled values)."""
    pooled = np.array(a + b)
    observed = abs(np.mean(a) - np.mean(b))
    count = total = 0
    for idx in itertools.combinations(range(len(pooled)), len(a)):
        mask = np.zeros(len(pooled), bool)
        mask[list(idx)] = True
        count += abs(pooled[mask].mean() - pooled[~mask].mean()) >= observed - 1e-12
        total += 1
    return count / total
