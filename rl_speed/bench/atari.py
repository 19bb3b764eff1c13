"""Atari on a GPU box: FastPPO's GPU preset (``tuned_examples/atari_ppo_gpu.yaml``, its first experiment: Pong) end to
end, with its return curve, against stock RLlib PPO on the same box with the same module (NatureActorCritic), env
runners, envs per runner, batch, minibatch and epochs, sampling the scalar form of the same env (one ale-py emulator
per sub-env, RLlib's episodes and connector pipelines).

Env steps/s are agent steps of frame-skipped steps (4 frames each). Run with ``rl-speed bench atari --device cuda``
(the [atari] extra installed); ``--device cpu`` shrinks the runners to the machine's cores.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from rl_speed.bench.common import machine, timed_run, usable_cpus

PRESET = Path(__file__).resolve().parents[2] / "tuned_examples" / "atari_ppo_gpu.yaml"


def _preset() -> tuple[str, Any]:
    from rl_speed.cli.experiment_file import load_experiments

    experiment = load_experiments(PRESET)[0]
    return experiment.name, experiment.config.copy(copy_frozen=False)


def run(repeats: int = 1, device: str = "cpu", seconds: float = 420.0, stock_seconds: float = 60.0) -> str:
    import ray

    import rl_speed
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rl_speed.modules.pixels import NatureActorCritic
    from rl_speed.registry import check_env_installed

    rl_speed.register()
    name, preset = _preset()
    check_env_installed(preset.env)
    cpus = usable_cpus()
    if device != "cuda":  # fewer cores: fewer runners, the same per-runner size
        runners = max(1, min(preset.num_env_runners, cpus - 1))
        batch = runners * preset.num_envs_per_env_runner * preset.rollout_fragment_length
        preset.env_runners(num_env_runners=runners).learners(num_gpus_per_learner=0).training(
            train_batch_size_per_learner=batch, minibatch_size=min(preset.minibatch_size, batch))
    ray.init(address="local", num_cpus=cpus, num_gpus=1 if device == "cuda" else 0, include_dashboard=False,
             log_to_driver=False)
    try:
        fast = timed_run(preset, seconds)
        stock = (PPOConfig().environment(preset.env, env_config=dict(preset.env_config))
                 .env_runners(num_env_runners=preset.num_env_runners,
                              num_envs_per_env_runner=preset.num_envs_per_env_runner,
                              rollout_fragment_length=preset.rollout_fragment_length)
                 .training(train_batch_size_per_learner=preset.train_batch_size_per_learner,
                           minibatch_size=preset.minibatch_size, num_epochs=preset.num_epochs, lr=preset.lr,
                           gamma=preset.gamma, lambda_=preset.lambda_, clip_param=preset.clip_param,
                           entropy_coeff=preset.entropy_coeff, vf_loss_coeff=preset.vf_loss_coeff,
                           grad_clip=preset.grad_clip, use_kl_loss=preset.use_kl_loss)
                 .rl_module(rl_module_spec=RLModuleSpec(module_class=NatureActorCritic))
                 .learners(num_gpus_per_learner=preset.num_gpus_per_learner))
        base = timed_run(stock, stock_seconds)
    finally:
        ray.shutdown()
    curve = _curve(fast)
    return "\n".join([
        "### Atari: FastPPO GPU preset vs stock PPO (env steps/s), and FastPPO's return curve",
        "",
        f"Command: `rl-speed bench atari --device {device}` · machine: {machine()} · CPUs usable: {cpus} · date: "
        f"{time.strftime('%Y-%m-%d')} · experiment `{name}` of `{PRESET.name}` ({preset.env_config}): "
        f"{preset.num_env_runners} runners x {preset.num_envs_per_env_runner} envs, batch "
        f"{preset.train_batch_size_per_learner:,}, minibatch {preset.minibatch_size:,}, {preset.num_epochs} epochs; "
        f"FastPPO over {seconds:.0f} s, stock PPO over {stock_seconds:.0f} s, each after two warm-up iterations.",
        "",
        "| run | env steps/s | FastPPO / this |",
        "|---|---:|---:|",
        f"| FastPPO (columnar runner, rl_speed/Atari-v0 vector form) | {fast['rate']:,.0f} | 1.0x |",
        f"| stock PPO (RLlib's runner, the scalar form) | {base['rate']:,.0f} | {fast['rate'] / base['rate']:.1f}x |",
        "",
        f"FastPPO's mean episode return (RLlib's window), at seconds after the warm-up: {curve}",
    ])


def _curve(run: dict, points: int = 12) -> str:
    """Up to ``points`` (seconds, return) pairs spread over the run."""
    returns, seconds = run["returns"], np.cumsum(run["iteration_s"])
    if not returns:
        return "no episode ended"
    # returns has one entry per iteration that reported one; pair them with the iterations' end times
    pairs = list(zip(seconds[-len(returns):], returns))
    step = max(1, len(pairs) // points)
    return ", ".join(f"{t:.0f} s: {r:.1f}" for t, r in pairs[::step] + ([pairs[-1]] if len(pairs) % step else []))
