"""CUDA's multi-process service (MPS) for one run: ``rl-speed train --cuda-mps``.

Why: a GPU preset's env runners each hold a CUDA context of their own (``num_gpus_per_env_runner``), and without MPS
the GPU serves one context at a time, so 15 runners and the learner take turns on it. With an MPS daemon their
kernels run side by side: on Pong's GPU preset (one H100 box) 1.08x env steps/s, a runner's wait for its forward
1.2 ms against 2.4 ms, the learner's call 0.29 s against 0.37 s
(results/preset-variants/2026-12-07-pong-h100-mps.md).

How: :func:`cuda_mps` starts NVIDIA's control daemon (``nvidia-cuda-mps-control -d``, shipped with the driver) with
its pipes and log in a directory of its own, and sets ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY`` in this
process's environment before Ray starts, so the local Ray's workers inherit them and their contexts join it; CUDA
programs started without those variables do not. At the end it quits the daemon and restores the environment. Where
the variables already name a running daemon (one the user started), it is used and left running.

The daemon quits only once its clients are gone. Where this process is one of them (a learner in the driver, as in the
Atari race), waiting would only time out: the quit is then left to a detached helper, which removes the daemon's folder
once the daemon has gone, after this process ends.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from rl_speed.ray_start import environment

logger = logging.getLogger(__name__)

CONTROL = "nvidia-cuda-mps-control"
#: The daemon's wait to make its control pipe, and to quit.
START_TIMEOUT_S = 20.0


class CudaMpsError(RuntimeError):
    """MPS could not be started for the run (said before Ray starts)."""


def running_daemon() -> Path | None:
    """The pipe directory of the daemon this process's environment names, where its control pipe exists."""
    pipes = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    return Path(pipes) if pipes and (Path(pipes) / "control").exists() else None


@contextlib.contextmanager
def cuda_mps() -> Iterator[Path]:
    """Runs the body with an MPS daemon serving this process and the processes it starts; yields its pipe
    directory (see the module docstring)."""
    existing = running_daemon()
    if existing is not None:
        yield existing
        return
    control = shutil.which(CONTROL)
    if control is None:
        raise CudaMpsError(f"--cuda-mps: `{CONTROL}` is not on PATH; it ships with NVIDIA's driver (a machine with an "
                           "NVIDIA GPU and its driver has it). Fix: run on such a machine, add the driver's bin "
                           "folder to PATH, or drop --cuda-mps.")
    root = Path(tempfile.mkdtemp(prefix="rl_speed_mps_"))
    pipes, logs = root / "pipe", root / "log"
    pipes.mkdir()
    logs.mkdir()
    keep = False
    try:
        with environment({"CUDA_MPS_PIPE_DIRECTORY": str(pipes), "CUDA_MPS_LOG_DIRECTORY": str(logs)}):
            _start(control, pipes, logs)
            try:
                yield pipes
            finally:
                if _serves_this_process():
                    _quit_after_this_process(control, root)
                    keep = True  # the helper removes the folder once the daemon has quit
                else:
                    keep = not _quit(control, pipes)  # a daemon that did not quit keeps its pipes, to be told again
    finally:
        if not keep:
            shutil.rmtree(root, ignore_errors=True)


def _start(control: str, pipes: Path, logs: Path) -> None:
    # stdout and stderr to files, not pipes: a daemon that kept a pipe open would hold run() until its timeout
    with open(logs / "start.err", "wb") as err:
        try:
            done = subprocess.run([control, "-d"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                  timeout=START_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise CudaMpsError(f"--cuda-mps: `{CONTROL} -d` did not return in {START_TIMEOUT_S:.0f} s. Fix: check "
                               "the driver's MPS setup (nvidia-smi), or drop --cuda-mps.") from None
    deadline = time.monotonic() + START_TIMEOUT_S
    while done.returncode == 0 and not (pipes / "control").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    if done.returncode != 0 or not (pipes / "control").exists():
        if done.returncode == 0:  # a daemon that came up without its pipe in time: not left behind
            _quit(control, pipes)
        log = logs / "control.log"
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        raise CudaMpsError(f"--cuda-mps: `{CONTROL} -d` did not start a daemon (exit status {done.returncode}; "
                           f"{(logs / 'start.err').read_text(errors='replace').strip() or 'nothing on stderr'}; "
                           f"its log: {tail}). "
                           "Fix: check that the GPU's compute mode allows MPS (nvidia-smi -q | grep 'Compute Mode'), "
                           "or drop --cuda-mps.")


def _serves_this_process() -> bool:
    """Whether this process has used CUDA (torch imported, CUDA initialized): then, with the daemon up, one of its
    clients. A context made before the daemon started is none, and the helper's quit then returns at once."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def _quit_after_this_process(control: str, root: Path) -> None:
    """Tells the daemon to quit from a helper in a session of its own: the daemon stops taking clients and quits
    once this process (its last client) has ended; the helper then removes ``root``."""
    subprocess.Popen(["sh", "-c", 'echo quit | "$0"; rm -rf "$1"', control, str(root)], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    logger.info("--cuda-mps: this process uses the GPU under the run's MPS daemon; the daemon quits when it ends.")


def _quit(control: str, pipes: Path) -> bool:
    """Asks the daemon of ``pipes`` to quit; False where it did not answer in time."""
    try:
        subprocess.run([control], input=b"quit\n", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       timeout=START_TIMEOUT_S, check=False)
        return True
    except subprocess.TimeoutExpired:
        logger.warning("--cuda-mps: the MPS daemon did not quit in %.0f s (a client still attached?); quit it with "
                       "`echo quit | CUDA_MPS_PIPE_DIRECTORY=%s %s`.", START_TIMEOUT_S, pipes, CONTROL)
        return False
