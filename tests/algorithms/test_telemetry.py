"""telemetry.lock_metrics_for_parallel_evaluation: with evaluation parallel to training, the algorithm's metrics
logger gets a real lock, so the training thread's compile and the evaluation's logging cannot interleave."""

from __future__ import annotations

import threading

import pytest

from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rl_speed.algorithms.telemetry import lock_metrics_for_parallel_evaluation

RLOCK = type(threading.RLock())


class _Algo:
    def __init__(self, parallel: bool) -> None:
        self.config = type("Config", (), {"evaluation_parallel_to_training": parallel})()
        self.metrics = MetricsLogger(root=True)


@pytest.mark.parametrize("parallel", [True, False])
def test_the_lock_is_real_only_with_parallel_evaluation(parallel):
    algo = _Algo(parallel)
    lock_metrics_for_parallel_evaluation(algo)
    assert isinstance(algo.metrics._threading_lock, RLOCK) == parallel


def test_with_the_lock_new_keys_logged_during_compiles_never_break_them():
    algo = _Algo(parallel=True)
    lock_metrics_for_parallel_evaluation(algo)

    def evaluation_thread() -> None:  # as RLlib's evaluation logs into the same logger, new keys included
        for i in range(2000):  # bounded: a compile walks every key, so an endless writer made this test quadratic
            algo.metrics.log_value(("evaluation", f"key_{i}"), float(i), window=1)

    writer = threading.Thread(target=evaluation_thread)
    writer.start()
    compiles = 0
    try:
        while writer.is_alive() or compiles < 20:  # without the lock the first compile beside the writer fails
            algo.metrics.compile()
            compiles += 1
    finally:
        writer.join()
    assert len(algo.metrics.compile()["evaluation"]) > 0
