"""vectorized_gae vs RLlib's compute_value_targets at 4k, 32k, 256k and 1M steps.

RLlib's routine gets what its GAE connector gives it: all episode chunks concatenated into one flat array, each
elongated by one artificial step. Ours gets the same data as ``[T = 256, N]`` columns. Results are checked equal
(max abs difference) before timing. Medians of several calls; CUDA timings synchronize before reading the clock.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from ray.rllib.utils.postprocessing.value_predictions import compute_value_targets

from benchmarks.common import machine, median_seconds
from rl_speed.gae import vectorized_gae

SIZES = (4_096, 32_768, 262_144, 1_048_576)
T = 256


def run(repeats: int = 5) -> str:
    rng = np.random.default_rng(0)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = []
    for size in SIZES:
        n = size // T
        values = rng.normal(size=(T + 1, n)).astype(np.float32)
        rewards = rng.normal(size=(T, n)).astype(np.float32)
        terminated = rng.random((T, n)) < 0.01
        truncated = rng.random((T, n)) < 0.01
        # RLlib's layout: lane after lane, each lane + one extra step carrying V(obs_T); the lane's last real step is
        # marked truncated (a rollout cut) unless it terminated, as AddOneTsToEpisodesAndTruncate marks it.
        # (Episode ends inside a lane are consecutive entries here: same recursion, fewer chunks to build.)
        cut = truncated.copy()
        cut[-1] |= ~terminated[-1]
        flat_values = np.ascontiguousarray(values.T).reshape(-1)  # [N, T + 1] -> [N * (T + 1)]
        flat_rewards = np.concatenate([rewards.T, np.zeros((n, 1), np.float32)], axis=1).reshape(-1)
        flat_term = np.concatenate([terminated.T, np.zeros((n, 1), bool)], axis=1).reshape(-1).astype(np.float32)
        flat_trunc = np.concatenate([cut.T, np.zeros((n, 1), bool)], axis=1).reshape(-1).astype(np.float32)

        def rllib() -> np.ndarray:
            return compute_value_targets(flat_values, flat_rewards, flat_term, flat_trunc, gamma=0.99, lambda_=0.95)

        reference = (rllib().reshape(n, T + 1)[:, :-1].T - values[:-1])  # [T, N] advantages
        row = [size, n, 1000 * median_seconds(rllib, max(1, repeats // 2 if size >= 262_144 else repeats), warmup=True)]
        for device in devices:
            tensors = [torch.as_tensor(x, device=device) for x in (values, rewards, terminated, truncated)]
            sync = torch.cuda.synchronize if device == "cuda" else None

            def ours() -> tuple[torch.Tensor, torch.Tensor]:
                return vectorized_gae(*tensors, gamma=0.99, lambda_=0.95)

            diff = float(np.abs(ours()[0].cpu().numpy() - reference).max())
            row += [1000 * median_seconds(ours, repeats, warmup=True, sync=sync), diff]
        rows.append(row)
    cuda_name = f" and {torch.cuda.get_device_name()}" if "cuda" in devices else ""
    header = "| steps | N (T=256) | RLlib compute_value_targets ms | vectorized_gae CPU ms | speed-up | max abs diff |"
    sep = "|---:|---:|---:|---:|---:|---:|"
    if "cuda" in devices:
        header += " vectorized_gae CUDA ms | speed-up | max abs diff |"
        sep += "---:|---:|---:|"
    lines = ["### GAE: vectorized_gae vs RLlib's compute_value_targets", "",
             f"Command: `rl-speed bench gae` · machine: {machine()}{cuda_name} · torch {torch.__version__} · "
             f"threads {torch.get_num_threads()} · date: {time.strftime('%Y-%m-%d')} · median of {repeats} calls.",
             "", header, sep]
    for size, n, rllib_ms, *per_device in rows:
        cells = [f"{size:,}", f"{n:,}", f"{rllib_ms:,.1f}"]
        for i in range(0, len(per_device), 2):
            ms, diff = per_device[i], per_device[i + 1]
            cells += [f"{ms:,.2f}", f"{rllib_ms / ms:,.0f}x", f"{diff:.1e}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run_connector(num_steps: int = 16_384, repeats: int = 5) -> str:
    """Stock PPO's whole learner connector pipeline on real CartPole episodes: RLlib's GeneralAdvantageEstimation
    vs VectorizedGAE (``VectorizedGAEPPOTorchLearner``), same episodes, same module weights."""
    import copy

    import gymnasium as gym
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from rl_speed.learners.ppo import VectorizedGAEPPOTorchLearner

    config = PPOConfig().environment("CartPole-v1").env_runners(num_envs_per_env_runner=16).debugging(seed=0)
    episodes = SingleAgentEnvRunner(config=config).sample(num_timesteps=num_steps, random_actions=True)
    stock = config.build_learner(env=gym.make("CartPole-v1"))
    ours = config.copy(copy_frozen=False).learners(learner_class=VectorizedGAEPPOTorchLearner) \
        .build_learner(env=gym.make("CartPole-v1"))
    ours.module.set_state(stock.module.get_state())
    times = {}
    for name, learner in (("stock", stock), ("ours", ours)):
        samples = []
        for _ in range(repeats + 1):
            eps = copy.deepcopy(episodes)  # the pipeline elongates episodes in place
            start = time.perf_counter()
            learner._learner_connector(rl_module=learner.module, batch={}, episodes=eps, shared_data={},
                                       metrics=None)
            samples.append(time.perf_counter() - start)
        times[name] = 1000 * statistics.median(samples[1:])
    return "\n".join([
        "### PPO learner connector pipeline: GeneralAdvantageEstimation vs VectorizedGAE",
        "", f"Command: `python -c \"from benchmarks.throughput import gae; print(gae.run_connector())\"` · machine: "
        f"{machine()} · torch threads {torch.get_num_threads()} · date: {time.strftime('%Y-%m-%d')} · "
        f"{num_steps:,} CartPole steps in {len(episodes)} episode chunks, median of {repeats}.", "",
        "| pipeline | ms per call |", "|---|---:|",
        f"| stock PPO (GeneralAdvantageEstimation) | {times['stock']:.1f} |",
        f"| stock PPO with VectorizedGAE | {times['ours']:.1f} |",
        f"| ratio | {times['stock'] / times['ours']:.2f}x |"])
