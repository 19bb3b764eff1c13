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
HIGHER = ("rl_speed.algorithms", "rl_speed.cli", "rl_speed.bench", "rl_speed.multi_agent")


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
