"""``rl-speed train`` (Tune, its result files, the progress line) vs the same experiment built and trained directly
(``build_algo()`` + ``train()``): env steps/s per iteration, the Tune path's share of the cost.

Direct: in this process, the iterations after one warm-up iteration. CLI: the marginal rate of two ``rl-speed
train`` runs of the same file with ``training_iteration`` stops ``k1 < k2``: (env steps of run 2 - run 1) / (wall
time of run 2 - run 1), so Ray's start-up, Tune's set-up and the final checkpoint cancel out. Both use the tuned
example's config unchanged except the stop criteria.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rl_speed.bench.common import machine

ROOT = Path(__file__).resolve().parents[2]
#: tuned example -> (k1, k2) iterations for the two CLI runs
FILES = {"cartpole_fastppo.yaml": (10, 110), "cartpole_fastdqn.yaml": (10, 60)}


def _direct_rate(path: Path, iterations: int) -> float:
    from rl_speed.cli.experiment_file import load_experiments

    (experiment,) = load_experiments(path)
    algo = experiment.config.build_algo()
    try:
        result = algo.train()
        steps0, start = result["env_runners"]["num_env_steps_sampled_lifetime"], time.perf_counter()
        for _ in range(iterations):
            result = algo.train()
        return (result["env_runners"]["num_env_steps_sampled_lifetime"] - steps0) / (time.perf_counter() - start)
    finally:
        algo.stop()


def _cli_run(path: Path, iterations: int) -> tuple[float, float]:
    """(wall seconds, env steps) of one ``rl-speed train`` run stopped after ``iterations``."""
    stop = {"training_iteration": iterations, "time_total_s": 1e9, "env_runners/episode_return_mean": 1e9}
    with tempfile.TemporaryDirectory() as storage:
        start = time.perf_counter()
        proc = subprocess.run([str(Path(sys.executable).parent / "rl-speed"), "train", str(path), "--stop",
                               json.dumps(stop), "--storage-path", storage, "--num-cpus", "2"],
                              capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - start
        if proc.returncode:
            raise RuntimeError(f"rl-speed train {path.name} failed:\n{proc.stderr[-2000:]}")
        line = next(line for line in proc.stdout.splitlines() if "env steps in" in line)
        return wall, float(line.split("env steps in")[0].replace(",", "").strip())


def run(repeats: int = 2) -> str:
    import ray

    import rl_speed

    rl_speed.register()
    direct: dict[str, list[float]] = {name: [] for name in FILES}
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for _ in range(repeats):
            for name, (k1, k2) in FILES.items():
                direct[name].append(_direct_rate(ROOT / "tuned_examples" / name, k2 - k1))
    finally:
        ray.shutdown()
    rows = []
    for name, (k1, k2) in FILES.items():
        rates = []
        for _ in range(repeats):
            (wall1, steps1), (wall2, steps2) = _cli_run(ROOT / "tuned_examples" / name, k1), \
                _cli_run(ROOT / "tuned_examples" / name, k2)
            rates.append((steps2 - steps1) / (wall2 - wall1))
        d, c = statistics.median(direct[name]), statistics.median(rates)
        rows.append(f"| `{name}` | {d:,.0f} | {c:,.0f} | {c / d:.2f}x |")
    return "\n".join([
        "### `rl-speed train` vs direct `build_algo()` + `train()` (env steps/s)",
        "",
        f"Command: `rl-speed bench cli` · machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · direct: the "
        "tuned example's config in this process; CLI: marginal rate between runs stopped at k1 and k2 iterations "
        f"({', '.join(f'{n}: {k1}/{k2}' for n, (k1, k2) in FILES.items())}); median of {repeats}.",
        "",
        "| tuned example | direct | rl-speed train | CLI / direct |",
        "|---|---:|---:|---:|",
        *rows,
    ])
