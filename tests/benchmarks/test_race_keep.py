"""benchmarks/box/race_keep.sh: one race run that packs its trained module for the trip back from a GPU box, with the
race's exit status; a run that saved no module leaves no archive."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from benchmarks import ROOT


def _race_keep(tmp_path: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"  # the script calls python3, as on the box: this interpreter (a wrapper, not a link:
    bin_dir.mkdir(exist_ok=True)  # a virtual environment's python finds its packages from its own folder)
    python3 = bin_dir / "python3"
    python3.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python3.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "BOX_RUNS": str(tmp_path / "runs"),
           "BOX_POLICIES": str(tmp_path / "policies"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "envs"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(["bash", str(ROOT / "benchmarks/box/race_keep.sh"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_a_race_that_fails_keeps_its_status_and_leaves_no_archive(tmp_path):
    done = _race_keep(tmp_path, "t", "0", "FastPPO (ours)", "--game", "tennis", timeout=120)
    assert done.returncode == 2, done.stderr  # argparse's refusal of the game, passed on
    assert "invalid choice: 'tennis'" in done.stderr
    assert "race_keep.sh: no module kept" in done.stderr
    assert not (tmp_path / "policies" / "t-0.tar").exists()


@pytest.mark.slow
def test_a_short_race_packs_the_module_its_checkpoint_saved(tmp_path):
    pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")
    done = _race_keep(tmp_path, "t", "0", "FastPPO (ours)", "--seconds", "30", timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    with tarfile.open(tmp_path / "policies" / "t-0.tar") as kept:
        names = kept.getnames()
    # the folder benchmarks.common.checkpoint_module_dir names, with its parent's files (the RLModule's spec)
    assert "checkpoint/learner_group/learner/rl_module/default_policy/module_state.pkl" in names, names
