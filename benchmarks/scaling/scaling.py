"""Scaling: env steps/s of FastPPO and FastDQN against ``num_env_runners`` (weak scaling: fixed work per runner).

Each runner steps ``64`` envs of the vector Snake (8 x 8, flat) for 256 steps per iteration, so an iteration's batch
grows with the runner count; the learner sits on the GPU when there is one (``--device cuda``). FastPPO: one epoch,
minibatches of up to 16,384. FastDQN: one update of 512 per 2,048 sampled steps. Parallel efficiency
at k runners = rate(k) / (k * rate(1)). Meant for a machine with 16 cores (e.g. the CPU side of an H100 host).
"""

from __future__ import annotations

import os
import time
from typing import Any

from benchmarks.common import machine, train_rate

RUNNERS = (1, 2, 4, 8, 12)
ENVS_PER_RUNNER = 64
FRAGMENT = 256
ENV = "rl_speed/Snake-v0"
ENV_CONFIG = {"height": 8, "width": 8, "observation": "flat"}


def _config(algo: str, runners: int, device: str, async_sampling: bool = False) -> Any:
    batch = runners * ENVS_PER_RUNNER * FRAGMENT
    if algo == "FastPPO":
        from rl_speed.algorithms.fast_ppo import FastPPOConfig

        config = FastPPOConfig().training(train_batch_size_per_learner=batch, minibatch_size=min(batch, 16384),
                                          num_epochs=1)
    else:
        from rl_speed.algorithms.fast_dqn import FastDQNConfig

        config = FastDQNConfig().training(
            train_batch_size_per_learner=512, train_every_env_steps=2048, num_steps_sampled_before_learning_starts=0,
            replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 500_000})
    return (config.environment(ENV, env_config=ENV_CONFIG)
            .env_runners(num_env_runners=runners, num_envs_per_env_runner=ENVS_PER_RUNNER,
                         rollout_fragment_length=FRAGMENT, num_cpus_per_env_runner=1)
            .training(async_sampling=async_sampling)
            .rl_module(model_config={"fcnet_hiddens": [64, 64]})
            .learners(num_gpus_per_learner=1 if device == "cuda" else 0))


def run(repeats: int = 1, iterations: int = 5, device: str = "cpu", runners: tuple[int, ...] = RUNNERS) -> str:
    import ray

    import rl_speed

    rl_speed.register()
    cpus = os.cpu_count() or 2
    runners = tuple(k for k in runners if k < cpus) or (1,)
    ray.init(address="local", num_cpus=cpus, num_gpus=1 if device == "cuda" else 0, include_dashboard=False,
             log_to_driver=False)
    rows = []
    try:
        for algo in ("FastPPO", "FastDQN"):
            for async_sampling in (False, True):
                base = None
                for k in runners:
                    config = _config(algo, k, device, async_sampling)
                    rates = sorted(train_rate(config, iterations, warmup=2)[0] for _ in range(repeats))
                    rate = rates[len(rates) // 2]
                    base = base or rate
                    mode = "async_sampling" if async_sampling else "synchronous"
                    rows.append(f"| {algo} | {mode} | {k} | {rate:,.0f} | {rate / (k * base):.0%} |")
    finally:
        ray.shutdown()
    return "\n".join([
        "### Scaling: env steps/s against num_env_runners (weak scaling, Snake 8 x 8)",
        "",
        f"Command: `rl-speed bench scaling` · machine: {machine()} · learner on {device} · date: "
        f"{time.strftime('%Y-%m-%d')} · {ENVS_PER_RUNNER} envs x {FRAGMENT} steps per runner per iteration, "
        f"median of {repeats} run(s) of {iterations} iterations after 2 warm-up iterations.",
        "",
        "| algorithm | sampling | env runners | env steps/s | parallel efficiency |",
        "|---|---|---:|---:|---:|",
        *rows,
    ])
