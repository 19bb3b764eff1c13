"""The FastPPO and FastDQN rows of ``rl-speed bench ppo`` and ``rl-speed bench dqn`` for two checkouts of rl_speed,
side by side on this machine: did a change (a refactor, an upgrade) make any row slower?

    git worktree add /tmp/rl_old <commit>
    .venv/bin/python -m benchmarks.versions /tmp/rl_old . --repeats 3

Each measurement runs in a fresh interpreter whose ``PYTHONPATH`` puts that checkout first (the two versions share
the package name, so they cannot share a process); old and new alternate within each repeat, so drift on a shared
machine hits both alike. Each figure is the median over repeats; rows use the benchmarks' own settings and code
(``_rllib_rate`` / ``_rllib_rates`` of the checkout under test).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

CHILD = """
import json, sys, ray, torch
try:
    from benchmarks.throughput import dqn, ppo
except ImportError:  # a checkout from before the benchmarks left the package
    from rl_speed.bench import dqn, ppo
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
rows = {}
try:
    for env in ppo.ENVS:
        for name, size in (ppo.GRID_SIZES if env == ppo.GRID else ppo.SIZES).items():
            rows[f"ppo · {env} · {name}"] = ppo._rllib_rate("fast", env, ppo.ENVS[env], size, ITERATIONS)
    torch.set_num_threads(1)
    for env in dqn.ENVS:
        for name, regime in dqn.REGIMES.items():
            steps, updates = dqn._rllib_rates("fast", env, dqn.ENVS[env], regime, SECONDS)
            rows[f"dqn · {env} · {name} (env steps/s)"] = steps
            rows[f"dqn · {env} · {name} (updates/s)"] = updates
finally:
    ray.shutdown()
print("ROWS=" + json.dumps(rows))
"""


def measure(checkout: Path, iterations: int, seconds: float) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{checkout}{os.pathsep}{checkout / 'envs'}"}
    code = CHILD.replace("ITERATIONS", str(iterations)).replace("SECONDS", str(seconds))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=checkout)
    if proc.returncode:
        raise RuntimeError(f"measuring {checkout} failed:\n{proc.stderr[-3000:]}")
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("ROWS="))[5:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("old", type=Path)
    parser.add_argument("new", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=5, help="PPO: timed iterations per figure")
    parser.add_argument("--seconds", type=float, default=10.0, help="DQN: timed seconds per figure")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
    for _ in range(args.repeats):
        for version in ("old", "new"):
            runs[version].append(measure(getattr(args, version).resolve(), args.iterations, args.seconds))
    print(f"| row | old ({args.old}): median (min-max) | new ({args.new}): median (min-max) | new / old |")
    print("|---|---:|---:|---:|")
    for row in runs["old"][0]:
        cells, medians = [], []
        for version in ("old", "new"):
            values = [r[row] for r in runs[version]]
            medians.append(statistics.median(values))
            cells.append(f"{medians[-1]:,.0f} ({min(values):,.0f}-{max(values):,.0f})")
        print(f"| {row} | {cells[0]} | {cells[1]} | {medians[1] / medians[0]:.2f} |")


if __name__ == "__main__":
    main()
