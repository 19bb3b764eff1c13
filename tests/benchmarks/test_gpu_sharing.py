"""`rl-speed bench atari-gpu-sharing`: a runner's forward latency and the learner's update beside each other, for the
runners' own contexts, one inference process and shared inference (a serving thread in the learner's process)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch

from benchmarks.scaling import gpu_sharing

pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")


def test_every_row_times_what_its_placement_runs(ray_session):
    folders = set(Path(tempfile.gettempdir()).glob("rl_speed_inference_*"))
    out = gpu_sharing.measure("cpu", repeats=1, seconds=0.5, runners=1, batch=32, epochs=1)
    rounds = out["rounds"]
    assert out["batch"] == 32 and out["runners"] == 1
    for row in gpu_sharing.ROWS:
        assert rounds[row].update_s, f"{row}: the learner updated beside it"
    alone, own, process, shared = (rounds[row] for row in gpu_sharing.ROWS)
    assert not alone.latency_s and not alone.emulation_s  # the runners idle
    for acting in (own, process, shared):  # a forward (their own, or a server's round trip) before each step
        assert acting.emulation_s and len(acting.latency_s) == len(acting.emulation_s)
    assert min(process.latency_s + shared.latency_s) > 0.0
    # both servers (this process's and the inference process's) removed their pipes' folders
    assert set(Path(tempfile.gettempdir()).glob("rl_speed_inference_*")) == folders


def test_a_rows_rates_follow_from_its_medians():
    rounds = gpu_sharing.Rounds(update_s=[0.2, 0.3, 0.4], latency_s=[0.001, 0.002, 0.003],
                                emulation_s=[0.010, 0.010, 0.012])
    s = gpu_sharing.summary(rounds, runners=15, batch=7680)
    assert s["update_s"] == pytest.approx(0.3) and s["learner_rate"] == pytest.approx(7680 / 0.3)
    assert s["latency_ms"] == pytest.approx(2.0) and s["emulation_ms"] == pytest.approx(10.0)
    assert s["runners_rate"] == pytest.approx(15 * 16 / 0.012)
    empty = gpu_sharing.summary(gpu_sharing.Rounds(update_s=[0.2]), runners=15, batch=7680)
    assert empty["latency_ms"] is None and empty["runners_rate"] is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the refusal is for CPU-only ones")
def test_device_cuda_without_a_gpu_is_refused_before_anything_is_built():
    with pytest.raises(ValueError, match="atari-gpu-sharing --device cuda: this machine has no CUDA GPU"):
        gpu_sharing.run(repeats=1, device="cuda")


def test_the_transport_probe_round_trips_through_another_process_and_cleans_up():
    folders = set(Path(tempfile.gettempdir()).glob("rl_speed_transport_*"))  # its named pipes' folders
    trips = gpu_sharing.transport_round_trips(seconds=0.3, lanes=2)
    assert len(trips) > 10 and min(trips) > 0.0
    assert set(Path(tempfile.gettempdir()).glob("rl_speed_transport_*")) == folders
