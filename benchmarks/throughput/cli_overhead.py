"""``rl-speed train`` (Tune, its result files, the progress line) vs the same experiment built and trained directly
(``build_algo()`` + ``train()``): env steps/s per iteration, the Tune path's share of the cost.

Direct: in this process, the iterations after one warm-up iteration, with torch's CPU threads set to the CPUs the
config reserves for its main process, which is what Ray gives Tune's trainable actor (it sets ``OMP_NUM_THREADS`` to
the actor's CPUs: by default 1, ``num_cpus_for_main_process``). Unpinned, a direct run takes every core, which made
the first version of this bench read a 1-thread vs 2-thread learner as Tune's cost. CLI: the marginal rate of two ``rl-speed
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
from typing import Any

import torch

from benchmarks.common import machine
from benchmarks import ROOT

#: experiment file -> (k1, k2) iterations for the two CLI runs; "bench-size" is written on the fly: the PPO bench's
#: CartPole row at 1,024 envs (sub-second iterations, where Tune's per-iteration cost weighs most)
FILES = {"cartpole_fastppo.yaml": (10, 110), "cartpole_fastdqn.yaml": (10, 60), "bench-size": (5, 85),
         "bench-size-2cpu": (5, 85)}
BENCH_SIZE = """
cartpole-fastppo-1024:
  run: FastPPO
  env: CartPole-v1
  config:
    num_env_runners: 0
    num_envs_per_env_runner: 1024
    train_batch_size_per_learner: 32768
    minibatch_size: 8192
    num_epochs: 1
    lr: 0.0003
    model_config: {fcnet_hiddens: [64, 64], fcnet_activation: tanh, head_fcnet_hiddens: []}
"""


#: the same experiment with both cores reserved for the main process (the local learner's torch threads)
TWO_CPUS = "    num_cpus_for_main_process: 2\n"


def _path(name: str, folder: Path) -> Path:
    if not name.startswith("bench-size"):
        return ROOT / "tuned_examples" / name
    path = folder / f"{name}.yaml"
    path.write_text(BENCH_SIZE + (TWO_CPUS if name.endswith("2cpu") else ""))
    return path


def main_process_cpus(config: Any) -> int:
    """CPUs Ray reserves for the algorithm's main process (which holds the learner when ``num_learners`` is 0)."""
    per_learner = config.num_cpus_per_learner
    if config.num_learners == 0:
        learner = (1 if config.num_gpus_per_learner == 0 else 0) if per_learner == "auto" else per_learner
        return max(1, int(max(learner, config.num_cpus_for_main_process)))
    return max(1, int(config.num_cpus_for_main_process))


def _direct_rate(path: Path, iterations: int) -> float:
    from rl_speed.experiments import load_experiments

    (experiment,) = load_experiments(path)
    threads = torch.get_num_threads()
    torch.set_num_threads(main_process_cpus(experiment.config))  # what Tune's trainable actor gets
    algo = experiment.config.build_algo()
    try:
        result = algo.train()
        steps0, start = result["env_runners"]["num_env_steps_sampled_lifetime"], time.perf_counter()
        for _ in range(iterations):
            result = algo.train()
        return (result["env_runners"]["num_env_steps_sampled_lifetime"] - steps0) / (time.perf_counter() - start)
    finally:
        algo.stop()
        torch.set_num_threads(threads)


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


def run(repeats: int = 2, files: tuple[str, ...] = tuple(FILES)) -> str:
    import ray

    import rl_speed

    rl_speed.register()
    folder = Path(tempfile.mkdtemp())
    direct: dict[str, list[float]] = {name: [] for name in files}
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for _ in range(repeats):
            for name in files:
                k1, k2 = FILES[name]
                direct[name].append(_direct_rate(_path(name, folder), k2 - k1))
    finally:
        ray.shutdown()
    rows = []
    for name in files:
        k1, k2 = FILES[name]
        rates = []
        for _ in range(repeats):
            (wall1, steps1), (wall2, steps2) = _cli_run(_path(name, folder), k1), _cli_run(_path(name, folder), k2)
            rates.append((steps2 - steps1) / (wall2 - wall1))
        d, c = statistics.median(direct[name]), statistics.median(rates)
        rows.append(f"| `{name}` | {d:,.0f} | {c:,.0f} | {c / d:.2f}x |")
    return "\n".join([
        "### `rl-speed train` vs direct `build_algo()` + `train()` (env steps/s)",
        "",
        f"Command: `rl-speed bench cli` · machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · direct: the "
        "tuned example's config in this process, torch threads = the CPUs the config reserves for the main process "
        "(as Ray gives Tune's trainable; `-2cpu`: `num_cpus_for_main_process: 2`); CLI: marginal rate between runs stopped at k1 and k2 iterations "
        f"({', '.join(f'{n}: {k1}/{k2}' for n, (k1, k2) in FILES.items())}); median of {repeats}.",
        "",
        "| experiment | direct | rl-speed train | CLI / direct |",
        "|---|---:|---:|---:|",
        *rows,
    ])
