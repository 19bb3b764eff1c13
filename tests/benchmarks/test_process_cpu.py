"""Cores busy per process group during a timed run, from Linux's /proc."""

from __future__ import annotations

import os
import sys
import time
from types import SimpleNamespace

import pytest

from benchmarks.process_cpu import GROUPS, CoresByProcess, cpu_seconds

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc")


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_cpu_seconds_counts_this_process_working():
    before = cpu_seconds()[os.getpid()]
    _spin(0.3)
    assert cpu_seconds()[os.getpid()] - before >= 0.2


def test_a_busy_driver_is_one_core_and_every_group_is_reported():
    no_actors = SimpleNamespace(env_runner_group=None, learner_group=None)  # an algorithm with local parts only
    cores = CoresByProcess()
    cores.start()
    _spin(0.5)
    busy = cores.stop(no_actors)
    assert set(busy) == {*GROUPS, "all"}
    assert 0.7 <= busy["driver"] <= 1.3, busy  # one thread spinning the whole time
    assert busy["runners"] == busy["learners"] == 0.0
    assert busy["all"] == pytest.approx(sum(busy[g] for g in GROUPS))
