"""What RLlib callbacks cost on the columnar path: FastPPO on CartPole with 1,024 envs (the PPO bench's size: batch
32,768, minibatch 8,192, one epoch, 64-64 tanh networks, sampling local), env steps/s without callbacks, with an
``on_episode_end`` callback that logs one custom metric, with rl_speed's ``on_sample_columns`` hook logging the same
metric from the ended episodes' arrays, and with an ``on_episode_step`` callback (one Python call per lane per step);
stock PPO with the same ``on_episode_end`` callback for reference.

Each run builds the algorithm, trains one warm-up iteration, then ``iterations`` timed ones. The variants run in
rounds (every variant once per round, ``repeats`` rounds). Two figures per variant: env steps per second of wall time
(median over rounds), and the cost ratio in CPU time of this process (which samples and learns: ``num_env_runners``
0), per round against the round's run without callbacks, median over rounds. CPU time is the steadier of the two on
a shared machine, where another tenant's load moves the wall-clock rate by a third between runs.
"""

from __future__ import annotations

import statistics
from typing import Any

import time

from benchmarks.common import build_with_every_runner, local_ray, machine
from rl_speed.callbacks import ColumnarCallback

NUM_ENVS, BATCH, MINIBATCH = 1_024, 32_768, 8_192


def _log_return(*, episode: Any, metrics_logger: Any, **kwargs: Any) -> None:
    metrics_logger.log_value("custom_return", episode.get_return(), reduce="mean")


def _log_step(*, episode: Any, metrics_logger: Any, **kwargs: Any) -> None:
    metrics_logger.log_value("custom_step_reward", episode.get_rewards(-1), reduce="mean")


class _HookReturn(ColumnarCallback):
    def on_sample_columns(self, *, metrics_logger: Any, ended: dict, **kwargs: Any) -> None:
        if len(ended["return"]):
            metrics_logger.log_value("custom_return", float(ended["return"].mean()), reduce="mean")


VARIANTS = {
    "FastPPO, no callbacks": ("fast", {}),
    "FastPPO, on_episode_end logs one metric": ("fast", {"on_episode_end": _log_return}),
    "FastPPO, on_sample_columns logs the same metric": ("fast", {"callbacks_class": _HookReturn}),
    "FastPPO, on_episode_step logs one metric": ("fast", {"on_episode_step": _log_step}),
    "stock PPO, on_episode_end logs one metric": ("stock", {"on_episode_end": _log_return}),
}


def _config(algo: str, callbacks: dict) -> Any:
    if algo == "stock":
        from ray.rllib.algorithms.ppo import PPOConfig as Config
    else:
        from rl_speed.algorithms.fast_ppo import FastPPOConfig as Config
    config = (Config().environment("CartPole-v1")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=NUM_ENVS,
                           gym_env_vectorize_mode="vector_entry_point")
              .training(train_batch_size_per_learner=BATCH, minibatch_size=MINIBATCH, num_epochs=1, lr=3e-4)
              .rl_module(model_config={"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh",
                                       "head_fcnet_hiddens": []}))
    return config.callbacks(**callbacks) if callbacks else config


def _measure(config: Any, iterations: int) -> tuple[float, float, dict]:
    """(env steps/s of wall time, CPU seconds per env step, the last result) over ``iterations`` after a warm-up."""
    algo = build_with_every_runner(config)
    try:
        result = algo.train()
        before = result["env_runners"]["num_env_steps_sampled_lifetime"]
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(iterations):
            result = algo.train()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        steps = result["env_runners"]["num_env_steps_sampled_lifetime"] - before
        return steps / wall, cpu / steps, result
    finally:
        algo.stop()


def run(repeats: int = 5, iterations: int = 3) -> str:
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    cost: dict[str, list[float]] = {name: [] for name in VARIANTS}
    logged: dict[str, Any] = {}
    with local_ray(num_cpus=2):
        for _ in range(repeats):
            cpu_per_step = {}
            for name, (algo, callbacks) in VARIANTS.items():
                rate, cpu_per_step[name], result = _measure(_config(algo, callbacks),
                                                            iterations if algo == "fast" else 1)
                rates[name].append(rate)
                runners = result["env_runners"]
                logged[name] = runners.get("custom_return", runners.get("custom_step_reward"))
            for name in VARIANTS:
                cost[name].append(cpu_per_step["FastPPO, no callbacks"] / cpu_per_step[name])
    base = statistics.median(rates["FastPPO, no callbacks"])
    lines = [f"FastPPO on CartPole-v1, {NUM_ENVS:,} envs, batch {BATCH:,}, minibatch {MINIBATCH:,}, 1 epoch, "
             f"sampling local; {repeats} rounds ({iterations} timed iterations per run after one warm-up; stock: "
             f"1). {machine()}.", "",
             "| variant | env steps/s (median) | runs | wall: vs no callbacks | CPU time: vs no callbacks (median "
             "of per-round ratios) | custom metric reported |",
             "|---|---:|---|---:|---:|---:|"]
    for name, values in rates.items():
        median = statistics.median(values)
        metric = logged[name]
        lines.append(f"| {name} | {median:,.0f} | {', '.join(f'{v:,.0f}' for v in values)} | {median / base:.2f}x | "
                     f"{statistics.median(cost[name]):.2f}x ({min(cost[name]):.2f}-{max(cost[name]):.2f}) | "
                     f"{'-' if metric is None else f'{float(metric):.2f}'} |")
    return "\n".join(lines)
