"""`rl-speed bench cli-start`: `rl-speed train`'s launch to its first progress line, with and without --no-preload."""

from __future__ import annotations

import pytest
import torch

from benchmarks.scaling import cli_start

pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")


@pytest.mark.slow  # a real rl-speed train start: about 21 s, in CI's slow selection
@pytest.mark.ci
def test_one_start_times_a_real_rl_speed_train_to_its_first_iteration():
    seconds = cli_start.one_start("cpu", ["--no-preload"], {"num_envs_per_env_runner": 2,
                                                           "rollout_fragment_length": 16, "minibatch_size": 32})
    assert 1.0 < seconds < 300.0


def test_a_start_that_fails_says_what_it_ran_and_shows_its_output():
    with pytest.raises(RuntimeError, match=r"(?s)cli-start: `train .*--no-preload.*` failed \(rc 2\).*Error in"):
        cli_start.one_start("cpu", ["--no-preload"], {"no_such_key": 1})


@pytest.mark.slow  # a real start without Tune: about 20 s
def test_the_start_without_tune_trains_one_iteration_of_the_same_experiment():
    seconds = cli_start.one_start("cpu", None, {"num_envs_per_env_runner": 2, "rollout_fragment_length": 16,
                                                "minibatch_size": 32})
    assert 1.0 < seconds < 300.0


def test_a_start_without_tune_that_fails_shows_its_output():
    with pytest.raises(RuntimeError, match=r"(?s)cli-start: `.*direct_start.*` failed \(rc 1\).*no_such_key"):
        cli_start.one_start("cpu", None, {"no_such_key": 1})


def test_the_table_gives_every_variant_and_its_ratio(monkeypatch):
    times = iter([10.0, 12.0, 15.0, 7.0, 11.0, 14.0, 16.0, 8.0, 9.0, 13.0, 17.0, 6.0])
    seen = []

    def fake(device, flags, overrides, env_vars):
        seen.append((flags, env_vars))
        return next(times)

    monkeypatch.setattr(cli_start, "one_start", fake)
    table = cli_start.run(repeats=3)
    assert "| variant | median (s) | speed-up vs Tune's runtime env kept | each start (s) |" in table
    assert "| modules preloaded (default) | 10.0 | 1.60x | 10.0, 11.0, 9.0 |" in table
    assert "| --no-preload | 13.0 | 1.23x | 12.0, 14.0, 13.0 |" in table
    assert "| Tune's runtime env kept (PL_DISABLE_FORK=0) | 16.0 | 1.00x | 15.0, 16.0, 17.0 |" in table
    assert "| without Tune (the race's path) | 7.0 | 2.29x | 7.0, 8.0, 6.0 |" in table
    # the variants alternate
    assert seen[:4] == [([], {}), (["--no-preload"], {}), ([], {"PL_DISABLE_FORK": "0"}), (None, {})]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the refusal is for CPU-only ones")
def test_device_cuda_without_a_gpu_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="cli-start --device cuda: this machine has no CUDA GPU"):
        cli_start.run(repeats=1, device="cuda")
