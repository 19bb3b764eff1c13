"""bench.common's helpers for repeated runs: interleaved rounds and the median run."""

from __future__ import annotations

import pytest

from rl_speed.bench.common import interleaved, median_run, rate_range


def test_rounds_interleave_the_plan():
    assert interleaved([(1, "own"), (2, "own")], 3) == [(1, "own"), (2, "own")] * 3
    assert interleaved(["a"], 0) == []


def test_the_median_run_is_the_lower_middle_one_by_rate():
    runs = [{"rate": r, "id": i} for i, r in enumerate((5.0, 1.0, 3.0, 4.0))]
    assert median_run(runs)["id"] == 2  # rates 1, 3, 4, 5: the lower middle one
    assert median_run(runs[:3])["id"] == 2  # 1, 3, 5
    assert rate_range(runs) == " (1-5, 4 runs)" and rate_range(runs[:1]) == ""


def test_the_mettagrid_bench_refuses_repeats_below_one_before_ray_starts():
    from rl_speed.bench.mettagrid import run

    with pytest.raises(ValueError, match="`repeats` must be >= 1, got 0"):
        run(0)
