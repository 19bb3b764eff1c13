"""The env-runner start stress bench: it counts the remote runners that came up in each build, and starts Ray as
``rl-speed train`` does (the experiment's modules preloaded in Ray's workers)."""

from __future__ import annotations

import contextlib

from benchmarks.scaling import runner_starts


def test_each_build_counts_its_healthy_runners(ray_session):
    table = runner_starts.run(repeats=2, preset="cartpole_fastppo.yaml")
    assert "| 2 | 2 | 0 |" in table  # 2 builds x 1 runner (2 CPUs here: one runner), none failed
    assert "the caller's Ray, nothing preloaded" in table


def test_its_own_ray_preloads_what_rl_speed_train_preloads(monkeypatch):
    asked = {}

    @contextlib.contextmanager
    def fake_ray(num_cpus, num_gpus=None, preload=()):
        asked["preload"] = preload
        yield True

    class Refused(Exception):
        pass

    def build_algo(self):  # stop before anything starts: only Ray's start is under test
        raise Refused

    monkeypatch.setattr(runner_starts, "local_ray", fake_ray)
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    monkeypatch.setattr(FastPPOConfig, "build_algo", build_algo)
    try:
        runner_starts.run(repeats=1, preset="cartpole_fastppo.yaml")
    except Refused:
        pass
    assert asked["preload"] == ("rl_speed.algorithms.fast_ppo", "rl_speed.env_runners.batched")
