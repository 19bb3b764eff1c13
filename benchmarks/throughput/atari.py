"""Atari on a GPU box: env steps/s of FastPPO's and FastDQN's GPU presets (``tuned_examples/atari_ppo_gpu.yaml``,
``atari_dqn_gpu.yaml``, their first experiment: Pong) against stock RLlib PPO and DQN on the same box with the same
modules (NatureActorCritic, the Nature-CNN QNetModule), env runners, envs per runner, rollout length and training
settings, sampling the scalar form of the same env (one ale-py emulator per sub-env, RLlib's episodes, connector
pipelines and, for DQN, its episode replay buffer).

Each run trains for ``seconds`` after its warm-up: two iterations, and for DQN the iterations until learning starts,
so the rate is that of learning. Env steps are frame-skipped steps (4 frames each). Run with
``rl-speed bench atari --device cuda`` (the [atari] extra installed); ``--device cpu`` shrinks the runners to the
machine's cores and the replay buffer to host memory. Learning curves come from ``rl-speed train`` runs of the same
presets (docs/studies/pong-and-atari.md), not from this benchmark.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

from benchmarks.common import machine, timed_run, usable_cpus
from benchmarks import TUNED_EXAMPLES

TUNED = TUNED_EXAMPLES
PRESETS = {"PPO": TUNED / "atari_ppo_gpu.yaml", "DQN": TUNED / "atari_dqn_gpu.yaml"}


def preset(algo: str, device: str = "cuda", cpus: int | None = None, game: str = "pong") -> tuple[str, Any]:
    """The experiment of ``PRESETS[algo]`` for ``game`` (its ``env_config``'s; the one without sticky actions): its
    name and a mutable config; off the GPU, shrunk to ``cpus``."""
    from rl_speed.experiments import load_experiments

    experiments = [e for e in load_experiments(PRESETS[algo])
                   if not e.config.env_config.get("repeat_action_probability")]
    games = [e.config.env_config.get("game") for e in experiments]
    if game not in games:
        raise ValueError(f"atari.preset: {PRESETS[algo].name} has no experiment for game {game!r}; it has {games}.")
    experiment = experiments[games.index(game)]
    config = experiment.config.copy(copy_frozen=False)
    if device != "cuda":  # fewer cores: fewer runners, the same per-runner size; replay in host memory
        runners = max(1, min(config.num_env_runners, (cpus or usable_cpus()) - 1))
        config.env_runners(num_env_runners=runners, num_gpus_per_env_runner=0).learners(num_gpus_per_learner=0)
        config.training(cuda_graph=False, cuda_graph_env_runners=False)  # (captured steps need CUDA learners, runners)
        if algo == "PPO":
            batch = runners * config.num_envs_per_env_runner * config.rollout_fragment_length
            config.training(train_batch_size_per_learner=batch, minibatch_size=min(config.minibatch_size, batch))
        else:
            config.training(replay_buffer_config={**config.replay_buffer_config, "capacity": 100_000,
                                                  "storage_device": "cpu"})
    return experiment.name, config


def stock_config(algo: str, fast: Any) -> Any:
    """Stock RLlib's PPO / DQN with ``fast``'s env, runners (the runners' GPU share too), module and training
    settings. rl_speed's own keys (``cuda_graph``, ``cuda_graph_env_runners``, ``async_sampling``,
    ``mixed_precision``, the GPU replay's ``storage_device``, the module's ``normalize_obs``, whose statistics only
    rl_speed's learners update) have no stock counterpart: stock runs without them, which is the comparison."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    if algo == "PPO":
        from ray.rllib.algorithms.ppo import PPOConfig

        from rl_speed.modules.pixels import NatureActorCritic

        config = PPOConfig().training(
            train_batch_size_per_learner=fast.train_batch_size_per_learner, minibatch_size=fast.minibatch_size,
            num_epochs=fast.num_epochs, lambda_=fast.lambda_, clip_param=fast.clip_param,
            entropy_coeff=fast.entropy_coeff, vf_loss_coeff=fast.vf_loss_coeff, use_kl_loss=fast.use_kl_loss)
        config.rl_module(model_config=_stock_model_config(fast))
        module = RLModuleSpec(module_class=NatureActorCritic)
    else:
        from ray.rllib.algorithms.dqn import DQNConfig

        from rl_speed.modules.q_net import QNetModule

        buffer = dict(fast.replay_buffer_config)
        buffer.pop("storage_device", None)  # rl_speed's buffer setting; RLlib's episode buffer lives in host memory
        config = DQNConfig().training(
            train_batch_size_per_learner=fast.train_batch_size_per_learner,
            training_intensity=fast.training_intensity, n_step=fast.n_step, double_q=fast.double_q,
            dueling=fast.dueling, target_network_update_freq=fast.target_network_update_freq,
            num_steps_sampled_before_learning_starts=fast.num_steps_sampled_before_learning_starts,
            epsilon=fast.epsilon, replay_buffer_config=buffer).reporting(
            min_sample_timesteps_per_iteration=fast.min_sample_timesteps_per_iteration)
        config.rl_module(model_config=_stock_model_config(fast))
        module = RLModuleSpec(module_class=QNetModule)
    env_config = dict(fast.env_config)
    if fast.clip_rewards is True:  # RLlib's new stack ignores `clip_rewards`; the env clips to the same sign instead
        env_config["reward_clipping"] = True
    return (config.environment(fast.env, env_config=env_config)
            .env_runners(num_env_runners=fast.num_env_runners, num_envs_per_env_runner=fast.num_envs_per_env_runner,
                         rollout_fragment_length=fast.rollout_fragment_length,
                         num_gpus_per_env_runner=fast.num_gpus_per_env_runner)  # RLlib's runner honours it too
            .training(lr=fast.lr, gamma=fast.gamma, grad_clip=fast.grad_clip)
            .rl_module(rl_module_spec=module)
            .learners(num_gpus_per_learner=fast.num_gpus_per_learner))


def _stock_model_config(fast: Any) -> dict:
    """The user's ``model_config`` keys of ``fast`` (PPO and DQN add their own defaults themselves), less
    ``normalize_obs``, whose statistics only rl_speed's learners update."""
    return {key: value for key, value in dict(fast._model_config).items() if key != "normalize_obs"}


def warmup_iterations(algo: str, config: Any) -> int:
    """Two, plus for DQN the iterations that only fill the buffer before learning starts."""
    if algo == "PPO":
        return 2
    return 2 + math.ceil(config.num_steps_sampled_before_learning_starts
                         / max(1, config.min_sample_timesteps_per_iteration))


def run(repeats: int = 1, device: str = "cpu", seconds: float = 90.0) -> str:
    import ray

    import rl_speed
    from rl_speed.registry import check_env_installed

    rl_speed.register()
    cpus = usable_cpus()
    rows, names = [], []
    ray.init(address="local", num_cpus=cpus, num_gpus=1 if device == "cuda" else 0, include_dashboard=False,
             log_to_driver=False)
    try:
        for algo in PRESETS:
            name, fast = preset(algo, device, cpus)
            check_env_installed(fast.env)
            warmup = warmup_iterations(algo, fast)
            fast_rates, stock_rates = [], []
            for _ in range(repeats):  # interleaved, so drift on the box hits both sides alike
                fast_rates.append(timed_run(fast, seconds, warmup)["rate"])
                stock_rates.append(timed_run(stock_config(algo, fast), seconds, warmup)["rate"])
            fast_rate, stock_rate = statistics.median(fast_rates), statistics.median(stock_rates)
            names.append(f"`{name}` ({fast.num_env_runners} runners x {fast.num_envs_per_env_runner} envs)")
            rows.append(f"| {algo} | {fast_rate:,.0f} | {stock_rate:,.0f} | {fast_rate / stock_rate:.1f}x |")
    finally:
        ray.shutdown()
    return "\n".join([
        "### Atari: FastPPO and FastDQN GPU presets vs stock PPO and DQN (env steps/s)",
        "",
        f"Command: `rl-speed bench atari --device {device} --repeats {repeats}` · machine: {machine()} · "
        f"CPUs usable: {cpus} · date: "
        f"{time.strftime('%Y-%m-%d')} · experiments {', '.join(names)} · each run {seconds:.0f} s after its warm-up "
        f"(two iterations, for DQN also until learning starts); median of {repeats} interleaved runs per side.",
        "",
        "| algorithm | rl_speed (vector form) env steps/s | stock RLlib (scalar form) env steps/s | rl_speed / stock |",
        "|---|---:|---:|---:|",
        *rows,
    ])
