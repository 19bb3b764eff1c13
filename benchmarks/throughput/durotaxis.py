"""Durotaxis: env steps/s (per-graph env vs batched env), learner updates/s of the graph actor-critic, and FastPPO
against stock PPO end to end, each from the tuned examples as shipped.

1. Env: random actions (delete ratio in [0, 0.2], so episodes run their course), one ``DurotaxisEnv`` stepped in a
   Python loop against ``DurotaxisVectorEnv`` at several widths.
2. Learner: FastPPO's learner (``tuned_examples/durotaxis_ppo.yaml``: GraphActorCritic, its minibatch) on one
   sampled 8,192-step batch: values + GAE, then one epoch of minibatch updates (PPO loss, backward, Adam), on
   ``device``.
3. End to end: ``durotaxis_ppo.yaml`` (FastPPO, batched env, 128 graphs) against ``durotaxis_stock_ppo.yaml`` (stock
   PPO with the same module and settings, RLlib's runner over 128 per-graph envs), env steps/s over ``iterations``
   iterations after one warm-up, interleaved, median of ``repeats``; with ``device="cuda"`` also FastPPO with its
   learner on the GPU.
"""

from __future__ import annotations

import itertools
import statistics
import time

import numpy as np
import torch

from benchmarks.common import machine, median_rate, median_seconds, train_rate
from benchmarks import TUNED_EXAMPLES

EXAMPLES = TUNED_EXAMPLES
ENV_WIDTHS = (1, 128, 1024)


def _random_actions(space, n: int, rng: np.random.Generator) -> dict:
    actions = space.sample()
    actions["delete_ratio"] = rng.uniform(0.0, 0.2, (n, 1)).astype(np.float32)
    return actions


def env_rates(repeats: int) -> list[str]:
    from rl_speed_envs.durotaxis import DurotaxisEnv, DurotaxisVectorEnv

    rng = np.random.default_rng(0)
    single = DurotaxisEnv()
    single.reset(seed=0)
    single.action_space.seed(0)
    pool = [_random_actions(single.action_space, 1, rng) for _ in range(64)]
    pool = [{**a, "delete_ratio": a["delete_ratio"][0]} for a in pool]
    counter = itertools.count()

    def scalar_step() -> int:
        _, _, terminated, truncated, _ = single.step(pool[next(counter) % 64])
        if terminated or truncated:
            single.reset()
        return 1

    scalar = median_rate(scalar_step, repeats)
    rows = [f"| `DurotaxisEnv` (one graph, Python loop) | 1 | {scalar:,.0f} | 1.0x |"]
    for width in ENV_WIDTHS:
        env = DurotaxisVectorEnv(num_envs=width)
        env.reset(seed=0)
        env.action_space.seed(0)
        actions = [_random_actions(env.action_space, width, rng) for _ in range(8)]
        rate = median_rate(lambda: (env.step(actions[next(counter) % 8]), width)[1], repeats)
        rows.append(f"| `DurotaxisVectorEnv` | {width:,} | {rate:,.0f} | {rate / scalar:.1f}x |")
    return rows


def learner_rates(repeats: int, device: str) -> list[str]:
    from rl_speed.experiments import load_experiments

    (experiment,) = load_experiments(EXAMPLES / "durotaxis_ppo.yaml")
    config = experiment.config.copy(copy_frozen=False)
    if device == "cuda":
        config.learners(num_gpus_per_learner=1)
    algo = config.build_algo()
    try:
        columns = algo.env_runner.sample_columns()
        learner = algo.learner_group._learner
        module_id = next(iter(learner.module.keys()))
        steps = columns["rewards"].size
        minibatch = config.minibatch_size
        sync = torch.cuda.synchronize if device == "cuda" else None
        advantages = median_seconds(lambda: learner.compute_advantages(module_id, columns), repeats, warmup=True,
                                    sync=sync)
        update = median_seconds(
            lambda: learner.update_from_columns(columns, timesteps={}, num_epochs=1, minibatch_size=minibatch,
                                                shuffle=True), repeats, warmup=True, sync=sync)
    finally:
        algo.stop()
    updates = -(-steps // minibatch)
    learn = update - advantages  # update_from_columns computes the advantages first
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    return [f"| {name} | {steps:,} | {minibatch:,} | {advantages * 1e3:,.0f} ms | {updates / learn:,.1f} | "
            f"{steps / learn:,.0f} |"]


def end_to_end(repeats: int, iterations: int, device: str) -> list[str]:
    from rl_speed.experiments import load_experiments

    configs = {
        "stock PPO (`durotaxis_stock_ppo.yaml`: RLlib's runner over 128 per-graph envs)":
            load_experiments(EXAMPLES / "durotaxis_stock_ppo.yaml")[0].config,
        "FastPPO (`durotaxis_ppo.yaml`: batched env, 128 graphs)":
            load_experiments(EXAMPLES / "durotaxis_ppo.yaml")[0].config,
    }
    if device == "cuda":
        configs["FastPPO, learner on the GPU"] = configs[list(configs)[1]].copy(copy_frozen=False).learners(
            num_gpus_per_learner=1)
    runs: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(repeats):  # interleaved, so drift on a shared machine hits all alike
        for name, config in configs.items():
            runs[name].append(train_rate(config.copy(copy_frozen=False), iterations)[0])
    rates = {name: statistics.median(r) for name, r in runs.items()}
    stock = next(iter(rates.values()))
    return [f"| {name} | {rate:,.0f} | {rate / stock:.1f}x |" for name, rate in rates.items()]


def run(repeats: int = 3, iterations: int = 3, device: str = "cpu") -> str:
    import ray

    import rl_speed

    rl_speed.register()
    env_rows = env_rates(repeats)
    ray.init(address="local", num_cpus=2 if device == "cpu" else None, num_gpus=1 if device == "cuda" else 0,
             include_dashboard=False, log_to_driver=False)
    try:
        learner_rows = learner_rates(repeats, device)
        e2e_rows = end_to_end(repeats, iterations, device)
    finally:
        ray.shutdown()
    return "\n".join([
        "### Durotaxis (graph env, hybrid actions, graph actor-critic)",
        "",
        f"Command: `rl-speed bench durotaxis{' --device cuda' if device == 'cuda' else ''} --repeats {repeats}` · "
        f"machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · torch threads {torch.get_num_threads()} · "
        f"medians of {repeats}.",
        "",
        "Env steps/s, random actions (delete ratio in [0, 0.2]):",
        "",
        "| env | graphs per step call | env steps/s | vs per-graph env |",
        "|---|---:|---:|---:|",
        *env_rows,
        "",
        "FastPPO's learner, one sampled batch: values + GAE, then one epoch of minibatch updates (PPO loss, "
        "backward, Adam):",
        "",
        "| learner device | batch | minibatch | values + GAE | minibatch updates/s | samples trained/s |",
        "|---|---:|---:|---:|---:|---:|",
        *learner_rows,
        "",
        f"End to end (sampling + GAE + updates as the tuned examples configure them), env steps/s over {iterations} "
        "iterations after one warm-up:",
        "",
        "| run | env steps/s | vs stock |",
        "|---|---:|---:|",
        *e2e_rows,
    ])
