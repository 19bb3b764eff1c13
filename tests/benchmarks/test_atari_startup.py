"""`rl-speed bench atari-startup`: the Pong preset's start split into the driver's and its env runners' moments."""

from __future__ import annotations

import pytest
import torch

from benchmarks.scaling import atari_startup

pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")


# The preset's runner with 4 emulators and one small update: the moments' order, not their times (7 s against 15 s a
# start on 2 cores)
SHRUNK = {"num_envs_per_env_runner": 4, "rollout_fragment_length": 32, "train_batch_size_per_learner": 128,
          "minibatch_size": 128, "num_epochs": 1}


@pytest.mark.parametrize("variant", [atari_startup.Variant(changes=SHRUNK),
                                     atari_startup.Variant(changes=SHRUNK, ray_beside_imports=True)])
def test_a_start_reports_every_runners_moments_in_the_order_they_happen(ray_session, variant):
    start = atari_startup.one_start(variant, "cpu")  # in this process, on the test session's Ray
    assert start["runners"] and all(list(r) == list(atari_startup.RUNNER_MOMENTS) for r in start["runners"])
    for runner in start["runners"]:
        moments = [runner[m] for m in ("init", "env", "module", "ready")]
        assert moments == sorted(moments) and runner["process"] <= runner["init"]
    assert set(start["driver"]) == {"imported", "ray_up", "built", "first_iteration"}
    row = atari_startup.phases(start)
    # the build waits for every runner; the first iteration comes after the build
    assert row["runner_ready_median"] <= row["runner_ready_last"] <= row["built"] < row["first_iteration"]


def test_phases_take_the_median_runner_and_the_last_one():
    runners = [{m: float(i) + k for k, m in enumerate(atari_startup.RUNNER_MOMENTS)} for i in (1, 2, 9)]
    row = atari_startup.phases({"driver": {"imported": 0.5, "ray_up": 1.0, "built": 20.0, "first_iteration": 25.0},
                                "runners": runners})
    assert row["runner_ready_median"] == 2.0 + 4 and row["runner_ready_last"] == 9.0 + 4
    assert set(atari_startup.COLUMNS) <= set(row)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the refusal is for CPU-only ones")
def test_device_cuda_without_a_gpu_is_refused_before_anything_starts():
    with pytest.raises(ValueError, match="atari-startup --device cuda: this machine has no CUDA GPU"):
        atari_startup.run(repeats=1, device="cuda")


def test_the_table_gives_the_medians_and_every_start(monkeypatch):
    def start(ready: float) -> dict:
        runner = {m: ready - 4 + k for k, m in enumerate(atari_startup.RUNNER_MOMENTS)}
        return {"driver": {"imported": 1.0, "ray_up": 2.0, "built": ready + 1, "first_iteration": ready + 2},
                "runners": [runner]}

    monkeypatch.setattr(atari_startup, "measure", lambda variants, repeats, device: {
        "preset": [start(10.0), start(30.0), start(12.0)]})
    table = atari_startup.run(repeats=3)
    preset_rows = [line for line in table.splitlines() if line.startswith("| preset |")]
    assert preset_rows[0].endswith("| 12.0 | 12.0 | 13.0 | 14.0 |")  # medians: ready, last ready, built, first
    assert [row.split(" | ")[1] for row in preset_rows[1:]] == ["1", "2", "3"]
    assert preset_rows[2].endswith("| 30.0 | 30.0 | 31.0 | 32.0 |")
