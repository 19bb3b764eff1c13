"""benchmarks/box: the GPU box's job queue runs its jobs in order from a copy of the checkout, logs each one with
its exit status, packs the runs, and runs nothing when a wheel folder is missing or a jobs line is malformed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from benchmarks import ROOT

BOX = ROOT / "benchmarks" / "box"
pytestmark = pytest.mark.skipif(shutil.which("flock") is None, reason="the queue needs flock (util-linux)")


@pytest.fixture(autouse=True)
def _tree():
    """The queue's copy of the checkout (queue.sh's /tmp/tree_NAME), removed after each test, passed or not."""
    tree = Path(f"/tmp/tree_t{os.getpid()}")
    yield tree
    shutil.rmtree(tree, ignore_errors=True)


def _checkout(tmp_path: Path) -> Path:
    """A stand-in checkout: the box scripts, a file the jobs read, and an empty wheel folder."""
    checkout = tmp_path / "checkout"
    shutil.copytree(BOX, checkout / "benchmarks" / "box")
    (checkout / "marker.txt").write_text("from the checkout\n")
    (checkout / ".whl").mkdir()
    return checkout


def _queue(checkout: Path, tmp_path: Path, jobs: str, wheels: str = "") -> subprocess.CompletedProcess:
    (checkout / "jobs.tsv").write_text(jobs)
    env = {**os.environ, "BOX_RUNS": str(tmp_path / "runs"), "BOX_SITE": str(tmp_path / "site"),
           "BOX_PYCACHE": str(tmp_path / "pycache"), "BOX_BIN": str(tmp_path / "bin"), "BOX_WHEELS": wheels,
           "BOX_PYTHON": sys.executable}
    return subprocess.run(["bash", "benchmarks/box/queue.sh", f"t{os.getpid()}", "jobs.tsv"], cwd=checkout, env=env,
                          capture_output=True, text=True, timeout=60)


def test_jobs_run_in_order_from_a_copy_and_each_keeps_its_log_and_status(tmp_path, _tree):
    checkout = _checkout(tmp_path)
    done = _queue(checkout, tmp_path, "first\tcat marker.txt; pwd; echo $PYTHONPYCACHEPREFIX\n\n"
                                      "second\techo '{\"a\": 1}'; exit 3\n")
    assert done.returncode == 0, done.stderr
    runs = tmp_path / "runs"
    first = (runs / "first.log").read_text().splitlines()
    assert first[0].startswith("start ") and first[-1].startswith("end ")
    assert first[1:4] == ["from the checkout", str(_tree), str(tmp_path / "pycache")]
    assert (runs / "first.rc").read_text().strip() == "0"
    assert '{"a": 1}' in (runs / "second.log").read_text() and (runs / "second.rc").read_text().strip() == "3"
    assert float(first[-1].split()[1]) <= float((runs / "second.log").read_text().split()[1])  # one after the other
    polled = subprocess.run(["bash", str(BOX / "poll.sh"), str(tmp_path / "runs.tgz")],
                            env={**os.environ, "BOX_RUNS": str(runs)}, capture_output=True, text=True, timeout=60)
    assert "=== first rc=0" in polled.stdout and "=== second rc=3" in polled.stdout
    with tarfile.open(tmp_path / "runs.tgz") as packed:
        assert "runs/second.log" in packed.getnames()


def test_nothing_runs_without_the_wheels_or_with_a_malformed_line(tmp_path):
    checkout = _checkout(tmp_path)
    missing = _queue(checkout, tmp_path, "job\ttouch ran\n", wheels=".whl")  # the folder exists but holds no wheels
    assert missing.returncode == 1 and "no wheels in '.whl'" in missing.stderr
    malformed = _queue(checkout, tmp_path, "job touch ran\n")  # a space, not a tab
    assert malformed.returncode == 2 and "not JOB<TAB>COMMAND: job touch ran" in malformed.stderr
    assert not (tmp_path / "runs").exists() and not list(checkout.glob("ran"))


def test_the_wheels_are_installed_once_from_the_checkout_and_importable_by_the_jobs(tmp_path, _tree):
    checkout = _checkout(tmp_path)
    with zipfile.ZipFile(checkout / ".whl" / "boxprobe-1.0-py3-none-any.whl", "w") as wheel:  # a minimal wheel
        wheel.writestr("boxprobe/__init__.py", "WHERE = 'installed'\n")
        wheel.writestr("boxprobe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: boxprobe\nVersion: 1.0\n")
        wheel.writestr("boxprobe-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                       "Tag: py3-none-any\n")
        wheel.writestr("boxprobe-1.0.dist-info/RECORD", "")
    done = _queue(checkout, tmp_path, "probe\t$BOX_PYTHON -c 'import boxprobe; print(boxprobe.WHERE)'\n", wheels=".whl")
    assert done.returncode == 0, done.stderr
    assert "installed" in (tmp_path / "runs" / "probe.log").read_text()
    assert (tmp_path / "site" / ".installed").exists()
    assert not (_tree / ".whl").exists()  # the wheels stay out of the copy
