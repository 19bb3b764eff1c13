"""The layers of rl_speed stay in order: columns and the math at the bottom; runners, buffers, modules, connectors and
learners above them; algorithms compose those; the CLI and benchmarks sit on top. A lower layer never imports a
higher one (RLlib's learners never import algorithms either), checked in a fresh interpreter so nothing another test
imported can hide a violation."""

from __future__ import annotations

import subprocess
import sys

LOWER = [
    "rl_speed.columns", "rl_speed.gae", "rl_speed.buffers", "rl_speed.env_runners", "rl_speed.modules.q_net",
    "rl_speed.modules.recurrent", "rl_speed.modules.graph", "rl_speed.connectors", "rl_speed.learners",
    "rl_speed.learners.ppo", "rl_speed.learners.dqn", "rl_speed.learners.cuda_graph",
    "rl_speed.learners.optimizer_step", "rl_speed.learners.update_loop", "rl_speed.learners.sequences",
    "rl_speed.connectors.env_to_module", "rl_speed.callbacks", "rl_speed.env_runners.episode_callbacks",
]
HIGHER = ("rl_speed.algorithms", "rl_speed.cli", "rl_speed.multi_agent", "benchmarks")


def test_lower_layers_never_import_algorithms_cli_or_benchmarks():
    # One interpreter imports every lower module: if none of them pulls in a higher one, each of them doesn't.
    code = (f"import sys, {', '.join(LOWER)}; "
            f"print(sorted(m for m in sys.modules if m.startswith({HIGHER!r})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", f"a lower layer imports {out.strip()}"


def test_algorithm_configs_import_no_algorithm():
    code = ("import sys, rl_speed.algorithms.config, rl_speed.algorithms.sampling, rl_speed.algorithms.telemetry; "
            "print(sorted(m for m in sys.modules if m.startswith(('rl_speed.algorithms.fast', 'rl_speed.cli'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_the_library_and_its_cli_load_no_benchmark():
    """The benchmarks are not part of the product: importing rl_speed, its algorithms, its experiment loader or its
    CLI loads no module of the checkout's ``benchmarks`` package (run from the checkout's root, where it is
    importable)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = ("import sys, rl_speed, rl_speed.algorithms.fast_ppo, rl_speed.algorithms.fast_dqn, rl_speed.experiments, "
            "rl_speed.cli.main, rl_speed.cli.train; "
            "print(sorted(m for m in sys.modules if m == 'benchmarks' or m.startswith('benchmarks.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout
    assert out.strip() == "[]", out


def test_the_wheel_holds_the_library_and_no_benchmark(tmp_path):
    """``pip wheel .`` (no dependencies, no build isolation: the venv's setuptools) packs rl_speed and
    rl_speed_envs, and nothing of benchmarks/ or tests/."""
    import zipfile
    from pathlib import Path

    import shutil

    root = Path(__file__).resolve().parents[1]
    source = tmp_path / "checkout"  # (setuptools builds in the source tree: a copy keeps the checkout clean)
    shutil.copytree(root, source, ignore=shutil.ignore_patterns(".venv", ".git", "build", "*.egg-info", "results",
                                                                "__pycache__", ".ray_kit*"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path), str(source)], check=True, capture_output=True, text=True)
    (wheel,) = tmp_path.glob("rl_speed-*.whl")
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert {"rl_speed", "rl_speed_envs"} <= tops
    assert not {"benchmarks", "tests"} & tops, tops
