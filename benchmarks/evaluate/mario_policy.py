"""Mario policy evaluation: how far a trained FastDQN policy gets on 1-1 against a uniformly random policy, on the
real emulator, with the same episodes budget and the same exploration rule.

``rl-speed bench mario-policy --checkpoint DIR`` (a checkpoint of a ``rl-speed train`` run, e.g. the
``checkpoint_000000`` folder it prints) plays ``episodes`` episodes with each policy: the trained Q-network acting
epsilon-greedily (``epsilon`` = 0.05, the tuned examples' final exploration rate, so a deterministic policy does not
replay one identical episode; BatchNorm in eval mode, as the env runners act), and uniformly random actions. It
reports the mean return and the mean final x-position (the game's ``x_pos``: how far right Mario got). The
environment settings (level, frame skip, step limit) are read from the checkpoint's algorithm config, so both
policies play the game the policy was trained on.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time

import numpy as np
import torch

from benchmarks.common import Policy, load_policy_module, machine, random_policy
from rl_speed.ray_start import environment


def play(policy: Policy, episodes: int, env_config: dict, num_envs: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    """Plays ``episodes`` whole episodes on ``num_envs`` emulators at once; returns each episode's return and final
    x-position (in the order they finished)."""
    from rl_speed_envs.mario import SuperMarioBrosEnv

    envs = [SuperMarioBrosEnv(**env_config) for _ in range(num_envs)]
    try:
        obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])
        running = np.zeros(num_envs)
        returns: list[float] = []
        x_positions: list[int] = []
        started = num_envs
        active = np.ones(num_envs, dtype=bool)  # emulators still owed an episode
        while active.any():
            actions = policy(obs)
            for i, env in enumerate(envs):
                if not active[i]:
                    continue
                obs[i], reward, terminated, truncated, info = env.step(int(actions[i]))
                running[i] += reward
                if terminated or truncated:
                    returns.append(float(running[i]))
                    x_positions.append(int(info["x_pos"]))
                    running[i] = 0.0
                    if started < episodes:
                        obs[i] = env.reset(seed=seed + started)[0]
                        started += 1
                    else:
                        active[i] = False
        return {"returns": np.array(returns), "x_pos": np.array(x_positions)}
    finally:
        for env in envs:
            env.close()


def epsilon_greedy(module: torch.nn.Module, epsilon: float, seed: int = 0) -> Policy:
    """The module's greedy action (``forward_inference``, eval mode), replaced by a random one with prob. epsilon."""
    from ray.rllib.core.columns import Columns

    rng = np.random.default_rng(seed)
    module.eval()
    num_actions = module.action_space.n

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            greedy = module.forward_inference({Columns.OBS: torch.from_numpy(obs)})[Columns.ACTIONS].numpy()
        explore = rng.random(len(obs)) < epsilon
        return np.where(explore, rng.integers(0, num_actions, len(obs)), greedy)

    return act


SINGLE_THREADED = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _play_share(checkpoint: str, policy_name: str, episodes: int, epsilon: float, seed: int) -> dict[str, np.ndarray]:
    """One worker process's share: loads the checkpoint itself (a module is not sent between processes)."""
    torch.set_num_threads(1)
    module, env_config = load_policy_module(checkpoint)
    policy = (random_policy(module.action_space.n, seed) if policy_name == "random"
              else epsilon_greedy(module, epsilon, seed))
    return play(policy, episodes, env_config, num_envs=min(4, episodes), seed=seed)


def compare(checkpoint: str, episodes: int, epsilon: float = 0.05, workers: int = 1) -> dict[str, dict[str, np.ndarray]]:
    """Both policies' ``episodes`` episodes, split over ``workers`` processes (the emulator is single-threaded, so
    one process plays about 100 steps/s). Worker k's episodes start from seeds that no other worker uses, so the
    split changes which seeds are played only through the epsilon draws."""
    shares = [episodes // workers + (k < episodes % workers) for k in range(workers)]
    seeds = np.cumsum([0, *shares[:-1]]).tolist()
    results = {}
    # One thread per worker. Without these, 24 workers on a 64-core host ran at load 312 and had not finished after
    # 5 minutes; with them (set before the workers start, as their libraries read them once) they took 150 s.
    with environment(SINGLE_THREADED), concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for name in ("random", "trained"):
            parts = list(pool.map(_play_share, *zip(*[(checkpoint, name, n, epsilon, seed)
                                                       for n, seed in zip(shares, seeds) if n > 0])))
            results[name] = {key: np.concatenate([part[key] for part in parts]) for key in ("returns", "x_pos")}
    return results


def run(repeats: int = 16, device: str = "cpu", checkpoint: str | None = None, epsilon: float = 0.05) -> str:
    """``repeats`` is the number of episodes per policy, played on one process per core (at most one per 4
    episodes)."""
    if checkpoint is None:
        raise ValueError("mario-policy needs --checkpoint DIR (a checkpoint folder printed by `rl-speed train`).")
    if device != "cpu":  # the emulator bounds it; each worker acts with its own CPU copy of the module
        raise ValueError(f"mario-policy plays on CPU worker processes; --device {device} is not supported here, "
                         "leave it out.")
    _, env_config = load_policy_module(checkpoint)  # fails here, in this process, on a folder that is no checkpoint
    workers = max(1, min(len(os.sched_getaffinity(0)), repeats // 4))
    results = compare(str(checkpoint), repeats, epsilon, workers)
    rows = [f"| {name} | {r['returns'].mean():,.0f} | {np.median(r['returns']):,.0f} | {r['x_pos'].mean():,.0f} | "
            f"{np.median(r['x_pos']):,.0f} | {r['x_pos'].max():,} |" for name, r in results.items()]
    return "\n".join([
        "### Mario policy vs random on the real emulator",
        "",
        f"Command: `rl-speed bench mario-policy --checkpoint {checkpoint} --repeats {repeats}` · machine: "
        f"{machine()} · date: {time.strftime('%Y-%m-%d')} · env_config {env_config} · {repeats} episodes per "
        f"policy on {workers} processes · trained policy epsilon-greedy with epsilon {epsilon}.",
        "",
        "| policy | mean return | median return | mean final x | median final x | best final x |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
    ])
