"""Stock RLlib DQN vs FastDQN vs a bare-torch loop: env steps/s and learner updates/s in three regimes.

All three run in this process, back to back, on the same env (native vector env, ``vector_entry_point`` for RLlib),
the same Q-network (MLP 64-64 tanh, no dueling, double Q, Huber loss, Adam 5e-4, target sync every 500 env steps),
the same batch size and the same replay ratio, with RLlib's sampling local (``num_env_runners=0``). Stock DQN uses
RLlib's ``PrioritizedEpisodeReplayBuffer``; FastDQN its prioritized ``BatchedReplayBuffer``; the bare loop a uniform
numpy ring buffer (the bare loop is the "no framework" ceiling, not a like-for-like buffer).

Each figure is measured after learning has started, over ``seconds`` of training, and is the median of ``repeats``.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from benchmarks.common import machine, tanh_mlp


@dataclass(frozen=True)
class Regime:
    num_envs: int
    batch_size: int
    env_steps_per_update: int
    defaults: bool = False  # RLlib's default model, fragment (auto), buffer and DQN settings; only the above set


REGIMES = {
    "learner-bound": Regime(num_envs=1, batch_size=32, env_steps_per_update=1),
    "balanced": Regime(num_envs=64, batch_size=128, env_steps_per_update=16),
    "env-bound": Regime(num_envs=256, batch_size=128, env_steps_per_update=256),
}
ENVS = {"CartPole-v1": {}, "rl_speed/Snake-v0": {"observation": "flat", "height": 8, "width": 8}}
HIDDEN = [64, 64]
#: What a user gets by changing only `run:` (issue 16): 256 envs, training_intensity 0.5, DQN's default batch (32),
#: model (256-256), fragment ("auto") and replay buffer, on both sides; the bare loop uses 256-256 networks.
DEFAULTS = Regime(num_envs=256, batch_size=32, env_steps_per_update=64, defaults=True)
DEFAULT_HIDDEN = [256, 256]
WARMUP_STEPS = 1000


def _rllib_config(algo: str, env: str, env_config: dict, regime: Regime, device: str = "cpu") -> Any:
    import rl_speed

    rl_speed.register()
    if algo == "stock":
        from ray.rllib.algorithms.dqn import DQNConfig as Config
        fragment = 1  # stock's sample call is per vector step; its ratio logic interleaves updates between them
    else:
        from rl_speed.algorithms.fast_dqn import FastDQNConfig as Config
        # Columns amortize per-call costs: sample >= 32 env steps and >= 16 updates' worth per training step
        # (the replay ratio is the same; updates are interleaved with sampling at a coarser grain).
        fragment = max(32 // regime.num_envs, 16 * regime.env_steps_per_update // regime.num_envs, 1)
    if regime.defaults:
        return (Config().environment(env, env_config=env_config)
                .env_runners(num_env_runners=0, num_envs_per_env_runner=regime.num_envs,
                             gym_env_vectorize_mode="vector_entry_point")
                .training(training_intensity=regime.batch_size / regime.env_steps_per_update)
                .reporting(min_sample_timesteps_per_iteration=1000, min_time_s_per_iteration=0)
                .learners(num_gpus_per_learner=1 if device == "cuda" else 0))
    return (
        Config()
        .environment(env, env_config=env_config)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=regime.num_envs, rollout_fragment_length=fragment,
                     gym_env_vectorize_mode="vector_entry_point")
        .rl_module(model_config={"fcnet_hiddens": HIDDEN, "head_fcnet_hiddens": []})
        .training(train_batch_size_per_learner=regime.batch_size, dueling=False, double_q=True, n_step=1,
                  training_intensity=regime.batch_size / regime.env_steps_per_update,
                  num_steps_sampled_before_learning_starts=WARMUP_STEPS,
                  replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 100_000})
        .reporting(min_sample_timesteps_per_iteration=1000, min_time_s_per_iteration=0)
        .learners(num_gpus_per_learner=1 if device == "cuda" else 0)
    )


def _rllib_rates(algo: str, env: str, env_config: dict, regime: Regime, seconds: float, device: str = "cpu",
                 customize: Callable[[Any], Any] | None = None) -> tuple[float, float]:
    """(env steps/s, updates/s) of stock DQN or FastDQN, measured after learning started."""
    config = _rllib_config(algo, env, env_config, regime, device)
    algo_obj = (customize(config) if customize else config).build_algo()
    try:
        def counters(result: dict) -> tuple[float, float]:
            steps = result["env_runners"]["num_env_steps_sampled_lifetime"]
            # Module steps trained count each replayed sample once, for stock and FastDQN alike.
            trained = result.get("learners", {}).get("default_policy", {}).get("num_module_steps_trained_lifetime", 0)
            return steps, trained / regime.batch_size

        result = algo_obj.train()
        while counters(result)[1] < 5:  # learning has started (and been warm for a few updates)
            result = algo_obj.train()
        steps0, updates0 = counters(result)
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            result = algo_obj.train()
        elapsed = time.perf_counter() - start
        steps1, updates1 = counters(result)
        return (steps1 - steps0) / elapsed, (updates1 - updates0) / elapsed
    finally:
        algo_obj.stop()


class DuelingQ(nn.Module):
    """The bare loop's Q-net at DQN's defaults, the network stock DQN and FastDQN build: a tanh MLP encoder, then
    dueling linear heads (value + advantage - mean advantage)."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: list[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for size in hidden:
            layers += [nn.Linear(obs_dim, size), nn.Tanh()]
            obs_dim = size
        self.encoder = nn.Sequential(*layers)
        self.advantage, self.value = nn.Linear(obs_dim, num_actions), nn.Linear(obs_dim, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features = self.encoder(obs)
        adv = self.advantage(features)
        return self.value(features) + adv - adv.mean(dim=1, keepdim=True)


def _bare_rates(env_id: str, env_config: dict, regime: Regime, seconds: float,
                device: str = "cpu") -> tuple[float, float]:
    """The no-framework ceiling: numpy vector env, numpy ring buffer, the same Q-net and loss, one process."""
    import rl_speed_envs

    rl_speed_envs.register_gymnasium()
    n, batch = regime.num_envs, regime.batch_size
    env = gym.make_vec(env_id, num_envs=n, vectorization_mode="vector_entry_point", **env_config)
    obs_dim, num_actions = env.single_observation_space.shape[0], env.single_action_space.n
    dev = torch.device(device)
    q = (DuelingQ(obs_dim, num_actions, DEFAULT_HIDDEN) if regime.defaults
         else tanh_mlp(obs_dim, num_actions, HIDDEN)).to(dev)
    target = copy.deepcopy(q)
    opt = torch.optim.Adam(q.parameters(), lr=5e-4, fused=True)
    cap = 100_000
    obs_buf = np.zeros((cap, obs_dim), np.float32)
    next_buf = np.zeros((cap, obs_dim), np.float32)
    act_buf = np.zeros(cap, np.int64)
    rew_buf = np.zeros(cap, np.float32)
    term_buf = np.zeros(cap, np.float32)
    size, ptr, steps, updates, owed, last_sync = 0, 0, 0, 0, 0.0, 0
    rng = np.random.default_rng(0)
    obs, _ = env.reset(seed=0)
    resetting = np.zeros(n, dtype=bool)
    t_start, steps_at_start, updates_at_start = None, 0, 0
    while True:
        eps = max(0.05, 1.0 - steps / 10_000 * 0.95)
        with torch.inference_mode():
            greedy = q(torch.from_numpy(np.asarray(obs, np.float32)).to(dev)).argmax(1).cpu().numpy()
        actions = np.where(rng.random(n) < eps, rng.integers(0, num_actions, n), greedy)
        nxt, rew, term, trunc, _ = env.step(actions)
        keep = ~resetting  # NEXT_STEP autoreset steps are not transitions
        k = int(keep.sum())
        idx = (ptr + np.arange(k)) % cap
        obs_buf[idx], next_buf[idx], act_buf[idx] = obs[keep], nxt[keep], actions[keep]
        rew_buf[idx], term_buf[idx] = rew[keep], term[keep]
        ptr, size, steps = (ptr + k) % cap, min(cap, size + k), steps + k
        resetting, obs = term | trunc, nxt
        if steps < WARMUP_STEPS:
            continue
        owed += k / regime.env_steps_per_update
        while owed >= 1:
            owed -= 1
            b = rng.integers(0, size, batch)
            o, o2 = torch.from_numpy(obs_buf[b]).to(dev), torch.from_numpy(next_buf[b]).to(dev)
            r, d = torch.from_numpy(rew_buf[b]).to(dev), torch.from_numpy(term_buf[b]).to(dev)
            with torch.no_grad():
                best = q(o2).argmax(1, keepdim=True)
                target_q = r + 0.99 * (1 - d) * target(o2).gather(1, best).squeeze(1)
            pred = q(o).gather(1, torch.from_numpy(act_buf[b]).to(dev)[:, None]).squeeze(1)
            loss = nn.functional.huber_loss(pred, target_q)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if regime.defaults:  # DQN's default grad_clip: 40 by global norm
                nn.utils.clip_grad_norm_(q.parameters(), 40.0, foreach=True)
            opt.step()
            updates += 1
        if steps - last_sync >= 500:
            target.load_state_dict(q.state_dict())
            last_sync = steps
        if t_start is None and updates >= 5:
            t_start, steps_at_start, updates_at_start = time.perf_counter(), steps, updates
        if t_start is not None and (elapsed := time.perf_counter() - t_start) >= seconds:
            return (steps - steps_at_start) / elapsed, (updates - updates_at_start) / elapsed


def run(repeats: int = 3, seconds: float = 10.0, envs: tuple[str, ...] = tuple(ENVS),
        regimes: tuple[str, ...] = tuple(REGIMES), device: str = "cpu") -> str:
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=1 if device == "cuda" else 0, include_dashboard=False,
             log_to_driver=False)
    torch.set_num_threads(1)
    rows = []
    try:
        for env in envs:
            for name in regimes:
                regime = REGIMES[name]
                runs: dict[str, list[tuple[float, float]]] = {"stock": [], "fast": [], "bare": []}
                for _ in range(repeats):  # interleaved, so drift on this shared machine hits all three alike
                    runs["stock"].append(_rllib_rates("stock", env, ENVS[env], regime, seconds, device))
                    runs["fast"].append(_rllib_rates("fast", env, ENVS[env], regime, seconds, device))
                    runs["bare"].append(_bare_rates(env, ENVS[env], regime, seconds, device))
                med = {k: (statistics.median(s for s, _ in v), statistics.median(u for _, u in v))
                       for k, v in runs.items()}
                rows.append(
                    f"| {env} | {name} ({regime.num_envs} envs, B={regime.batch_size}, 1 update / "
                    f"{regime.env_steps_per_update} steps) | {med['stock'][0]:,.0f} / {med['stock'][1]:,.0f} | "
                    f"{med['fast'][0]:,.0f} / {med['fast'][1]:,.0f} | {med['bare'][0]:,.0f} / {med['bare'][1]:,.0f} | "
                    f"{med['fast'][0] / med['stock'][0]:.1f}x | {med['fast'][0] / med['bare'][0]:.2f}x |")
    finally:
        ray.shutdown()
    return "\n".join([
        "### DQN: stock RLlib vs FastDQN vs bare torch loop (env steps/s / learner updates/s)",
        "",
        f"Command: `rl-speed bench dqn` · machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · "
        f"learner on {device}{' (' + torch.cuda.get_device_name() + ')' if device == 'cuda' else ''}, "
        f"torch threads 1, local sampling, median of {repeats} interleaved runs of {seconds:.0f} s after warm-up.",
        "",
        "| env | regime | stock DQN | FastDQN | bare loop | FastDQN / stock | FastDQN / bare |",
        "|---|---|---:|---:|---:|---:|---:|",
        *rows,
    ])


def run_defaults(repeats: int = 3, seconds: float = 10.0, device: str = "cpu") -> str:
    """Stock DQN vs FastDQN vs the bare loop at RLlib's defaults (:data:`DEFAULTS`), CartPole."""
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=1 if device == "cuda" else 0, include_dashboard=False,
             log_to_driver=False)
    torch.set_num_threads(1)
    runs: dict[str, list[tuple[float, float]]] = {"stock": [], "fast": [], "bare": []}
    try:
        for _ in range(repeats):  # interleaved, so drift on this shared machine hits all three alike
            runs["stock"].append(_rllib_rates("stock", "CartPole-v1", {}, DEFAULTS, seconds, device))
            runs["fast"].append(_rllib_rates("fast", "CartPole-v1", {}, DEFAULTS, seconds, device))
            runs["bare"].append(_bare_rates("CartPole-v1", {}, DEFAULTS, seconds, device))
    finally:
        ray.shutdown()
    med = {k: (statistics.median(s for s, _ in v), statistics.median(u for _, u in v)) for k, v in runs.items()}
    return "\n".join([
        "### DQN at RLlib's defaults: stock vs FastDQN vs bare torch loop (env steps/s / learner updates/s)",
        "",
        f"Command: `rl-speed bench dqn-defaults` · machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · "
        f"learner on {device}, torch threads 1, local sampling, CartPole-v1, 256 envs, training_intensity 0.5, "
        "everything else RLlib's DQN defaults on both sides (batch 32, default model and replay buffer, "
        "`rollout_fragment_length: auto`); bare loop: the same network (256-256 tanh, dueling heads), double Q, Huber, "
        "grad clip 40, fused Adam 5e-4, uniform replay, one update of 32 per 64 env steps; "
        f"median of {repeats} interleaved runs of {seconds:.0f} s after learning starts.",
        "",
        "| stock DQN | FastDQN | bare loop | FastDQN / stock | FastDQN / bare |",
        "|---:|---:|---:|---:|---:|",
        f"| {med['stock'][0]:,.0f} / {med['stock'][1]:,.0f} | {med['fast'][0]:,.0f} / {med['fast'][1]:,.0f} | "
        f"{med['bare'][0]:,.0f} / {med['bare'][1]:,.0f} | {med['fast'][0] / med['stock'][0]:.1f}x | "
        f"{med['fast'][0] / med['bare'][0]:.2f}x |",
    ])


def run_cnn_storage(seconds: float = 8.0, device: str = "cuda") -> str:
    """FastDQN with the CNN Q-net on Snake's uint8 grid (10 x 10, one-hot planes built on the learner's device),
    replay storage on the host (numpy) vs on ``device`` (torch), learner on ``device``."""
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=1 if device == "cuda" else 0, include_dashboard=False,
             log_to_driver=False)
    torch.set_num_threads(1)
    rows = []
    try:
        for name in ("balanced", "env-bound"):
            regime = REGIMES[name]
            for storage in (None, device):
                def cnn(config: Any, storage: str | None = storage) -> Any:
                    return config.rl_module(model_config={"encoder": "cnn", "conv_channels": [32, 64],
                                                          "fcnet_hiddens": [256], "head_fcnet_hiddens": []}) \
                        .training(replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer",
                                                        "capacity": 100_000, "storage_device": storage})

                steps, updates = _rllib_rates("fast", "rl_speed/Snake-v0", {"observation": "grid"}, regime, seconds,
                                              device, customize=cnn)
                rows.append(f"| {name} ({regime.num_envs} envs, B={regime.batch_size}) | {storage or 'host (numpy)'} "
                            f"| {steps:,.0f} | {updates:,.0f} |")
    finally:
        ray.shutdown()
    return "\n".join([
        "### FastDQN, CNN Q-net on Snake's uint8 grid: replay storage on the host vs on the GPU",
        "", f"machine: {machine()} · learner on {device} · date: {time.strftime('%Y-%m-%d')} · one run of "
        f"{seconds:.0f} s per figure.", "",
        "| regime | replay storage | env steps/s | updates/s |", "|---|---|---:|---:|", *rows])

