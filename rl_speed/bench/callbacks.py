"""What RLlib callbacks cost on the columnar path: FastPPO on CartPole with 1,024 envs (the PPO bench's size: batch
32,768, minibatch 8,192, one epoch, 64-64 tanh networks, sampling local), env steps/s without callbacks, with an
``on_episode_end`` callback that logs one custom metric, with rl_speed's ``on_sample_columns`` hook logging the same
metric from the ended episodes' arrays, and with an ``on_episode_step`` callback (one Python call per lane per step);
stock PPO with the same ``on_episode_end`` callback for reference.

Each figure is env steps per second over ``iterations`` training iterations after one warm-up iteration; the variants
run interleaved, ``repeats`` times each, and the table gives medians and the ratio to no callbacks.
"""

from __future__ import annotations

import statistics
from typing import Any

from rl_speed.bench.common import machine, train_rate
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


def run(repeats: int = 3, iterations: int = 3) -> str:
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rates: dict[str, list[float]] = {name: [] for name in VARIANTS}
    logged: dict[str, Any] = {}
    try:
        for _ in range(repeats):
            for name, (algo, callbacks) in VARIANTS.items():
                rate, result = train_rate(_config(algo, callbacks), iterations if algo == "fast" else 1)
                rates[name].append(rate)
                runners = result["env_runners"]
                logged[name] = runners.get("custom_return", runners.get("custom_step_reward"))
    finally:
        if started:
            ray.shutdown()
    base = statistics.median(rates["FastPPO, no callbacks"])
    lines = [f"FastPPO on CartPole-v1, {NUM_ENVS:,} envs, batch {BATCH:,}, minibatch {MINIBATCH:,}, 1 epoch, "
             f"sampling local; medians of {repeats} interleaved runs ({iterations} iterations each after one "
             f"warm-up; stock: 1). {machine()}.", "",
             "| variant | env steps/s (median) | runs | vs no callbacks | custom metric reported |",
             "|---|---:|---|---:|---:|"]
    for name, values in rates.items():
        median = statistics.median(values)
        metric = logged[name]
        lines.append(f"| {name} | {median:,.0f} | {', '.join(f'{v:,.0f}' for v in values)} | {median / base:.2f}x | "
                     f"{'-' if metric is None else f'{float(metric):.2f}'} |")
    return "\n".join(lines)
