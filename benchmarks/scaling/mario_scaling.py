"""Mario end to end: env steps/s of FastDQN (``tuned_examples/mario_dqn_gpu.yaml``) with 1, 4, 8, 14 env runners,
against the emulator's own limit (its single-core rate at frame skip 4 times the runners), with the replay ratio
the learner actually delivered.

Runner counts above the machine's CPUs minus two (the driver/learner and Ray) are skipped. Departures from the
preset, so that each count takes seconds, not minutes: learning starts after 2,000 steps (not 20,000), an iteration
is at least 400 env steps per runner, the replay holds 100,000 transitions (not 500,000: a build's GPU storage is
freed only when the algorithm is), and torch.compile is off (compiling at every build would dominate the timing;
``rl-speed bench mario-learner`` measures it). Each count builds the algorithm, trains until learning has started
and ``WARMUP`` more iterations, then times ``iterations`` iterations; median of ``repeats`` builds. On CPU
(``--device cpu``) the learner and the replay storage stay on the CPU.
"""

from __future__ import annotations

import gc
import os
import statistics
import time

import torch

from benchmarks.common import gpu_keys_off, machine, median_rate
from benchmarks import TUNED_EXAMPLES

EXAMPLES = TUNED_EXAMPLES
RUNNERS = (1, 4, 8, 14)
WARMUP = 2


def emulator_rate(repeats: int) -> float:
    """Emulator alone at frame skip 4 (raw NES steps), one core: the ceiling per runner."""
    from benchmarks.throughput.mario_env import SECONDS, _emulator_step
    from rl_speed_envs.mario import _emulator_class

    nes = _emulator_class()()
    nes.reset()
    try:
        return median_rate(lambda: _emulator_step(nes), repeats, SECONDS)
    finally:
        nes.close()


def run(repeats: int = 3, device: str = "cpu", iterations: int = 4) -> str:
    import ray

    import rl_speed
    from rl_speed.experiments import load_experiments

    rl_speed.register()
    single = emulator_rate(3)
    cpus = os.cpu_count() or 2
    counts = [n for n in RUNNERS if n <= max(1, cpus - 2)]
    (experiment,) = load_experiments(EXAMPLES / "mario_dqn_gpu.yaml")
    rows = []
    ray.init(address="local", num_cpus=cpus, num_gpus=1 if device == "cuda" else 0, include_dashboard=False,
             log_to_driver=False)
    try:
        for n in counts:
            config = (experiment.config.copy(copy_frozen=False).env_runners(num_env_runners=n)
                      .framework(torch_compile_learner=False)
                      .training(num_steps_sampled_before_learning_starts=2000,
                                replay_buffer_config={**experiment.config.replay_buffer_config, "capacity": 100_000})
                      .reporting(min_sample_timesteps_per_iteration=400 * n))
            if device != "cuda":
                gpu_keys_off(config)
                config.training(replay_buffer_config={**config.replay_buffer_config, "storage_device": None})
            rates, ratios, updates = [], [], []
            for _ in range(repeats):
                algo = config.build_algo()
                try:
                    result = algo.train()
                    for _ in range(20):  # until learning has started, then WARMUP more
                        if result.get("num_learner_updates_lifetime", 0):
                            break
                        result = algo.train()
                    for _ in range(WARMUP):
                        result = algo.train()
                    before = result["env_runners"]["num_env_steps_sampled_lifetime"]
                    updates_before = result.get("num_learner_updates_lifetime", 0)
                    start = time.perf_counter()
                    for _ in range(iterations):
                        result = algo.train()
                    elapsed = time.perf_counter() - start
                    sampled = result["env_runners"]["num_env_steps_sampled_lifetime"] - before
                    rates.append(sampled / elapsed)
                    trained = (result.get("num_learner_updates_lifetime", 0) - updates_before) \
                        * config.total_train_batch_size
                    ratios.append(trained / max(1, sampled))
                    updates.append((result.get("num_learner_updates_lifetime", 0) - updates_before) / elapsed)
                finally:
                    algo.stop()
                    algo = None  # release the replay storage before the next build
                    gc.collect()
                    if device == "cuda":
                        torch.cuda.empty_cache()
            rate = statistics.median(rates)
            rows.append(f"| {n} | {rate:,.0f} | {single * n:,.0f} | {rate / (single * n):.0%} | "
                        f"{statistics.median(ratios):.2f} | {statistics.median(updates):,.1f} |")
            print(rows[-1], flush=True)  # partial results survive a time limit
    finally:
        ray.shutdown()
    card = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    return "\n".join([
        "### Mario end to end: env runners vs the emulator's limit",
        "",
        f"Command: `rl-speed bench mario-scaling{' --device cuda' if device == 'cuda' else ''} --repeats {repeats}` · "
        f"machine: {machine()} · learner: {card} · date: {time.strftime('%Y-%m-%d')} · "
        f"`mario_dqn_gpu.yaml` (4 emulators per runner, async sampling, training_intensity "
        f"{experiment.config.training_intensity}) · {iterations} timed iterations after {WARMUP}, median of "
        f"{repeats}. Emulator alone at frame skip 4: {single:,.0f} steps/s on one core.",
        "",
        "| env runners | env steps/s | emulator limit (single core x runners) | share of the limit | replay ratio "
        "(samples trained per env step) | optimizer steps/s |",
        "|---:|---:|---:|---:|---:|---:|",
        *rows,
    ])
