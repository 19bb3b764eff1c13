"""Stock RLlib PPO vs FastPPO vs a bare-torch loop: env steps/s end to end (sampling + GAE + updates).

All three run in this process, back to back, on the same env (native vector env; ``vector_entry_point`` for RLlib),
the same network (RLlib's default PPO module shape: separate 64-64 tanh MLPs for policy and value, linear heads),
the same batch, minibatch and epoch count (1), Adam, and sampling local (``num_env_runners=0``). Each figure is
env steps per second over ``iterations`` training iterations after one warm-up iteration, median of ``repeats``
interleaved runs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch

from benchmarks.common import machine, tanh_mlp, train_rate


@dataclass(frozen=True)
class Size:
    num_envs: int
    batch_size: int
    minibatch_size: int


SIZES = {
    "64 envs": Size(num_envs=64, batch_size=16_384, minibatch_size=4_096),
    "1,024 envs": Size(num_envs=1_024, batch_size=32_768, minibatch_size=8_192),
}
# The grid arena's lanes are agents (24 per map), so its two sizes are 4 maps (96 lanes) and 32 maps (768 lanes).
GRID_SIZES = {
    "4 maps x 24 agents": Size(num_envs=96, batch_size=12_288, minibatch_size=3_072),
    "32 maps x 24 agents": Size(num_envs=768, batch_size=24_576, minibatch_size=6_144),
}
GRID = "rl_speed/GridArena-v0"
ENVS: dict[str, dict] = {
    "CartPole-v1": {},
    "rl_speed/Snake-v0": {"observation": "flat", "height": 8, "width": 8},
    GRID: {},
}
HIDDEN = [64, 64]


#: What a user gets by changing only `run:` (issue 16): RLlib's default model (256-256 tanh, separate value net) and
#: `rollout_fragment_length: auto`, at the issue's size; the bare loop uses the same 256-256 networks.
DEFAULTS = Size(num_envs=1_024, batch_size=32_768, minibatch_size=8_192)
DEFAULT_HIDDEN = [256, 256]


def _rllib_rate(algo: str, env: str, env_config: dict, size: Size, iterations: int, defaults: bool = False) -> float:
    import rl_speed

    rl_speed.register()
    if algo == "stock":
        from ray.rllib.algorithms.ppo import PPOConfig as Config
    else:
        from rl_speed.algorithms.fast_ppo import FastPPOConfig as Config
    stock_multi_agent = algo == "stock" and env == GRID
    agents_per_step = 1
    num_envs = size.num_envs
    if stock_multi_agent:
        # Stock RLlib runs the grid arena through its MultiAgentEnv form: one env per map (sync vectorization),
        # every agent mapped to one shared policy; its env steps are map steps, so count agent steps.
        agents_per_step = 24
        num_envs = size.num_envs // agents_per_step
    config = (
        Config()
        .environment(env, env_config=env_config)
        .env_runners(num_env_runners=0, num_envs_per_env_runner=num_envs,
                     gym_env_vectorize_mode="sync" if stock_multi_agent else "vector_entry_point")
        .training(train_batch_size_per_learner=size.batch_size, minibatch_size=size.minibatch_size, num_epochs=1,
                  lr=3e-4)
    )
    if not defaults:
        config = config.rl_module(model_config={"fcnet_hiddens": HIDDEN, "fcnet_activation": "tanh",
                                                "head_fcnet_hiddens": []})
    if stock_multi_agent:
        config = config.multi_agent(policies={"shared"}, policy_mapping_fn=lambda agent_id, episode, **kw: "shared")
    return train_rate(config, iterations, warmup=1, agents_per_step=agents_per_step)[0]


def _bare_rate(env_id: str, env_config: dict, size: Size, iterations: int, hidden: list[int] = HIDDEN) -> float:
    """The no-framework ceiling: numpy vector env, the same networks, GAE and clipped PPO loss, one process."""
    import rl_speed_envs

    rl_speed_envs.register_gymnasium()
    n = size.num_envs
    t_len = size.batch_size // n
    if env_id == GRID:
        from rl_speed_envs.grid_arena import GridArenaVectorEnv

        env = GridArenaVectorEnv(num_envs=n, **env_config)
    else:
        env = gym.make_vec(env_id, num_envs=n, vectorization_mode="vector_entry_point", **env_config)
    obs_dim, num_actions = env.single_observation_space.shape[0], env.single_action_space.n
    pi, vf = tanh_mlp(obs_dim, num_actions, hidden), tanh_mlp(obs_dim, 1, hidden)
    opt = torch.optim.Adam([*pi.parameters(), *vf.parameters()], lr=3e-4)
    obs, _ = env.reset(seed=0)
    resetting = np.zeros(n, dtype=bool)
    gamma, lam, clip = 0.99, 0.95, 0.2

    def one_iteration() -> int:
        nonlocal obs, resetting
        o = np.empty((t_len + 1, n, obs_dim), np.float32)
        a = np.empty((t_len, n), np.int64)
        logp = np.empty((t_len, n), np.float32)
        r = np.empty((t_len, n), np.float32)
        term = np.empty((t_len, n), bool)
        trunc = np.empty((t_len, n), bool)
        valid = np.empty((t_len, n), bool)
        for t in range(t_len):
            o[t] = obs
            with torch.inference_mode():
                dist = torch.distributions.Categorical(logits=pi(torch.from_numpy(o[t])))
                act = dist.sample()
                logp[t] = dist.log_prob(act).numpy()
            a[t] = act.numpy()
            obs, r[t], term[t], trunc[t], _ = env.step(a[t])
            valid[t] = ~resetting
            resetting = term[t] | trunc[t]
        o[t_len] = obs
        with torch.no_grad():
            values = vf(torch.from_numpy(o).reshape(-1, obs_dim)).reshape(t_len + 1, n)
            not_term = torch.from_numpy(~term).float()
            carry = not_term * torch.from_numpy(~trunc).float() * gamma * lam
            deltas = (torch.from_numpy(r) + gamma * not_term * values[1:] - values[:-1]) * torch.from_numpy(valid)
            adv = torch.zeros(t_len + 1, n)
            for t in range(t_len - 1, -1, -1):
                adv[t] = deltas[t] + carry[t] * adv[t + 1]
            adv = adv[:-1]
            targets = adv + values[:-1]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        flat_o = torch.from_numpy(o[:-1]).reshape(-1, obs_dim)
        flat = (flat_o, torch.from_numpy(a).reshape(-1), torch.from_numpy(logp).reshape(-1), adv.reshape(-1),
                targets.reshape(-1), torch.from_numpy(valid).reshape(-1).float())
        order = torch.randperm(t_len * n)
        for start in range(0, t_len * n, size.minibatch_size):
            idx = order[start:start + size.minibatch_size]
            mo, ma, mlogp, madv, mtarget, mvalid = (x[idx] for x in flat)
            dist = torch.distributions.Categorical(logits=pi(mo))
            ratio = torch.exp(dist.log_prob(ma) - mlogp)
            surrogate = torch.min(madv * ratio, madv * ratio.clamp(1 - clip, 1 + clip))
            vf_loss = (vf(mo).squeeze(-1) - mtarget).pow(2).clamp(max=10.0)
            loss = ((-surrogate + vf_loss - 0.0 * dist.entropy()) * mvalid).sum() / mvalid.sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return int(valid.sum())

    one_iteration()  # warm-up
    done, start = 0, time.perf_counter()
    for _ in range(iterations):
        done += one_iteration()
    return done / (time.perf_counter() - start)


def run(repeats: int = 3, iterations: int = 5, envs: tuple[str, ...] = tuple(ENVS)) -> str:
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for env in envs:
            sizes = GRID_SIZES if env == GRID else SIZES
            for name, size in sizes.items():
                runs: dict[str, list[float]] = {"stock": [], "fast": [], "bare": []}
                for _ in range(repeats):  # interleaved, so drift on this shared machine hits all three alike
                    runs["stock"].append(_rllib_rate("stock", env, ENVS[env], size, iterations))
                    runs["fast"].append(_rllib_rate("fast", env, ENVS[env], size, iterations))
                    runs["bare"].append(_bare_rate(env, ENVS[env], size, iterations))
                med = {k: statistics.median(v) for k, v in runs.items()}
                rows.append(
                    f"| {env} | {name}, batch {size.batch_size:,}, minibatch {size.minibatch_size:,} | "
                    f"{med['stock']:,.0f} | {med['fast']:,.0f} | {med['bare']:,.0f} | "
                    f"{med['fast'] / med['stock']:.1f}x | {med['fast'] / med['bare']:.2f}x |")
    finally:
        ray.shutdown()
    return "\n".join([
        "### PPO: stock RLlib vs FastPPO vs bare torch loop (env steps/s, sampling + GAE + 1 epoch of updates)",
        "",
        "Grid arena: agent steps/s; stock PPO runs its RLlib `MultiAgentEnv` form (one env per map, one shared "
        "policy), FastPPO and the bare loop its batched form (agents as lanes).",
        "",
        f"Command: `rl-speed bench ppo` · machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · "
        f"torch threads {torch.get_num_threads()}, local sampling, 64-64 tanh MLPs, median of {repeats} interleaved "
        f"runs of {iterations} iterations after one warm-up iteration.",
        "",
        "| env | size | stock PPO | FastPPO | bare loop | FastPPO / stock | FastPPO / bare |",
        "|---|---|---:|---:|---:|---:|---:|",
        *rows,
    ])


def run_defaults(repeats: int = 3, iterations: int = 3) -> str:
    """Stock PPO vs FastPPO vs the bare loop at RLlib's default model and fragment (:data:`DEFAULTS`), CartPole."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    runs: dict[str, list[float]] = {"stock": [], "fast": [], "bare": []}
    try:
        for _ in range(repeats):  # interleaved, so drift on this shared machine hits all three alike
            runs["stock"].append(_rllib_rate("stock", "CartPole-v1", {}, DEFAULTS, iterations, defaults=True))
            runs["fast"].append(_rllib_rate("fast", "CartPole-v1", {}, DEFAULTS, iterations, defaults=True))
            runs["bare"].append(_bare_rate("CartPole-v1", {}, DEFAULTS, iterations, DEFAULT_HIDDEN))
    finally:
        ray.shutdown()
    med = {k: statistics.median(v) for k, v in runs.items()}
    return "\n".join([
        "### PPO at RLlib's default model and fragment: stock vs FastPPO vs bare torch loop (env steps/s)",
        "",
        f"Command: `rl-speed bench ppo-defaults` · machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · torch "
        f"threads {torch.get_num_threads()}, local sampling, CartPole-v1, 1,024 envs, batch 32,768, minibatch 8,192, "
        "1 epoch, RLlib's default model (256-256 tanh, separate value net) and `rollout_fragment_length: auto` on "
        f"both sides; bare loop: the same 256-256 networks; median of {repeats} interleaved runs of {iterations} "
        "iterations after one warm-up iteration.",
        "",
        "| stock PPO | FastPPO | bare loop | FastPPO / stock | FastPPO / bare |",
        "|---:|---:|---:|---:|---:|",
        f"| {med['stock']:,.0f} | {med['fast']:,.0f} | {med['bare']:,.0f} | {med['fast'] / med['stock']:.1f}x | "
        f"{med['fast'] / med['bare']:.2f}x |",
    ])
