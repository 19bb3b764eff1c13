#!/usr/bin/env python3
"""Set up and run rl_speed on a fresh machine with nothing but Python 3.10+.

    python3 tasks.py demo    # venv + install, then a short real Snake training run with a throughput readout
    python3 tasks.py test    # venv + install, then the test suite (learning runs marked `slow` are skipped)
    python3 tasks.py slow    # the slow learning runs
    python3 tasks.py mario-setup   # add the NES emulator (the [mario] extra; needs g++), for this Python version
    python3 tasks.py mario   # mario-setup, then train tuned_examples/mario_dqn.yaml (extra args go to rl-speed train)

The venv lives in .venv/. torch 2.13.0 (CPU) is installed before the package, so pip never pulls a CUDA build.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
PY = VENV / "bin" / "python"
STAMP = VENV / ".rl_speed-installed"
TORCH = "torch==2.13.0"


def sh(*args: object) -> None:
    print("+", " ".join(map(str, args)), flush=True)
    subprocess.run([str(a) for a in args], cwd=ROOT, check=True)


def setup() -> None:
    """Creates .venv and installs torch (CPU) then rl_speed[test]; repeats only when pyproject.toml changed."""
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + TORCH.encode()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == wanted:
        return
    if not PY.exists():
        venv.create(VENV, with_pip=True)
    sh(PY, "-m", "pip", "install", "-q", "--upgrade", "pip")
    sh(PY, "-m", "pip", "install", "-q", TORCH)
    sh(PY, "-m", "pip", "install", "-q", "-e", ".[test]")
    STAMP.write_text(wanted)


def setup_mario() -> None:
    """The [mario] extra: plain pip on Python >= 3.13; below, pip skips it by metadata (the packages declare 3.13),
    so the two packages are installed with --ignore-requires-python, numpy and gymnasium pinned to what is installed
    (otherwise pip tries to build a newer numpy from source)."""
    if subprocess.run([str(PY), "-c", "import gym_super_mario_bros"], cwd=ROOT, capture_output=True).returncode == 0:
        return
    if sys.version_info >= (3, 13):
        sh(PY, "-m", "pip", "install", "-q", "-e", ".[test,mario]")
        return
    pins = subprocess.run([str(PY), "-c", "import numpy, gymnasium; print(numpy.__version__, gymnasium.__version__)"],
                          cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    sh(PY, "-m", "pip", "install", "-q", "--ignore-requires-python", "nes-py==9.0.1", "gym-super-mario-bros==9.1.0",
       f"numpy=={pins[0]}", f"gymnasium=={pins[1]}")


def main() -> int:
    task = sys.argv[1] if len(sys.argv) > 1 else "help"
    extra = sys.argv[2:]
    if task not in ("demo", "test", "slow", "setup", "mario-setup", "mario"):
        print(__doc__)
        return 2
    setup()
    try:
        if task in ("mario-setup", "mario"):
            setup_mario()
        if task == "mario":
            sh(VENV / "bin" / "rl-speed", "train", "tuned_examples/mario_dqn.yaml", "--storage-path", "runs", *extra)
        if task == "demo":
            sh(VENV / "bin" / "rl-speed", "train", "tuned_examples/snake_fastppo.yaml", "--stop", '{"time_total_s": 60}',
               "--storage-path", "runs", *extra)
        elif task == "test":
            sh(PY, "-m", "pytest", *extra)
        elif task == "slow":
            sh(PY, "-m", "pytest", "-m", "slow", *extra)
    except subprocess.CalledProcessError as e:
        return e.returncode
    return 0


if __name__ == "__main__":
    sys.exit(main())
