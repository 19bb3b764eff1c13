"""`rl-speed bench atari-runner`: one Atari runner timed in-process, its time split into emulators, forward and the
rest, beside ale-py's own vector env; the forward on the CPU, or on the GPU with ``--device cuda``."""

from __future__ import annotations

import pytest
import torch

from benchmarks.throughput import atari_runner

pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")


def test_one_round_splits_the_runners_time_and_times_ale_py_alone():
    out = atari_runner.measure(lanes=4, repeats=1, groups=(1, 2))
    for groups, m in out.items():
        assert m["env_ms"] > 0 and m["inference_ms"] > 0 and m["rate"] > 0, (groups, m)
        # the parts are timed inside the runner's step, so they cannot exceed it
        assert m["env_ms"] + m["inference_ms"] <= m["total_ms"] * 1.01, (groups, m)
        assert m["ale_ms"] > 0
    assert "vector_env.py" in out[1]["profile"]  # the cProfile of the plain runner's last round
    assert out[1]["game"] == "pong"  # the default


def test_game_picks_the_presets_runner_for_that_game():
    out = atari_runner.measure(lanes=4, repeats=1, groups=(1,), game="breakout")
    assert out[1]["game"] == "breakout" and out[1]["rate"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the refusal is for CPU-only ones")
def test_device_cuda_without_a_gpu_is_refused_before_anything_is_built():
    with pytest.raises(ValueError, match="atari-runner --device cuda: this machine has no CUDA GPU"):
        atari_runner.run(repeats=1, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_device_cuda_puts_the_runners_forward_on_the_gpu(ray_session):  # RLlib's GPU lookup needs a Ray
    runner = atari_runner._runner(4, device="cuda")
    try:
        assert runner._device.type == "cuda"
        assert next(runner.module.parameters()).device.type == "cuda"
        assert len(runner.sample_columns()["rewards"]) == runner.config.rollout_fragment_length
    finally:
        runner.stop()
