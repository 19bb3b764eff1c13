"""CUDA's multi-process service for one run (``--cuda-mps``): refused with its fix where NVIDIA's control program is
missing, a daemon the environment already names used and left running, and (where the driver has it) a daemon of the
run's own started before the body and quit after it, or, where this process used the GPU under it, once this
process has ended."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl_speed import cuda_mps as mps


def test_without_the_control_program_it_is_refused_and_nothing_changes(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a folder without nvidia-cuda-mps-control
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.delenv("CUDA_MPS_LOG_DIRECTORY", raising=False)
    with pytest.raises(mps.CudaMpsError, match=r"`nvidia-cuda-mps-control` is not on PATH.*or drop --cuda-mps"):
        with mps.cuda_mps():
            pytest.fail("the body ran without a daemon")
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ and "CUDA_MPS_LOG_DIRECTORY" not in os.environ


def test_a_daemon_the_environment_names_is_used_and_left_running(tmp_path, monkeypatch):
    os.mkfifo(tmp_path / "control")  # what a running daemon keeps in its pipe directory
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "no-driver"))  # nothing is started: no control program needed
    with mps.cuda_mps() as pipes:
        assert pipes == tmp_path
    assert (tmp_path / "control").exists() and os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path)


def test_a_named_directory_without_a_daemon_is_not_taken_for_one(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(tmp_path))
    assert mps.running_daemon() is None


@pytest.mark.skipif(shutil.which(mps.CONTROL) is None, reason="needs NVIDIA's driver (nvidia-cuda-mps-control)")
def test_the_runs_own_daemon_serves_the_processes_started_in_the_body_and_quits_after(monkeypatch):
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    with mps.cuda_mps() as pipes:
        assert (pipes / "control").exists() and os.environ["CUDA_MPS_PIPE_DIRECTORY"] == str(pipes)
        child = subprocess.run([sys.executable, "-c", "import os, torch; torch.ones(1, device='cuda').sum().item(); "
                                "print(os.environ['CUDA_MPS_PIPE_DIRECTORY'])"], capture_output=True, text=True,
                               timeout=120)
        assert child.returncode == 0, child.stderr
        assert child.stdout.strip() == str(pipes)
        # the daemon counts the child among its clients: its server started for it
        assert "Starting new server" in (pipes.parent / "log" / "control.log").read_text()
    assert not pipes.exists() and "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


@pytest.mark.skipif(shutil.which(mps.CONTROL) is None, reason="needs NVIDIA's driver (nvidia-cuda-mps-control)")
def test_a_process_that_used_the_gpu_itself_leaves_at_once_and_the_daemon_quits_after_it():
    # the Atari race's driver holds its learner's CUDA context: the daemon cannot quit before that process ends
    child = subprocess.run([sys.executable, "-c", "import time, torch; from rl_speed import cuda_mps as mps\n"
                            "with mps.cuda_mps() as pipes:\n    torch.ones(1, device='cuda').sum().item()\n"
                            "    began = time.monotonic()\n"
                            "print(pipes.parent, time.monotonic() - began)"], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    root, exit_s = child.stdout.split()
    assert float(exit_s) < 5  # not the control program's 20 s wait for a client that is this very process
    deadline = time.monotonic() + 30
    while Path(root).exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(root).exists()  # the daemon quit once the process had ended, then its folder went
