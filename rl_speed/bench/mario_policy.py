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

import time

import numpy as np
import torch

from rl_speed.bench.common import Policy, load_policy_module, machine, random_policy


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


def compare(module: torch.nn.Module, env_config: dict, episodes: int, epsilon: float = 0.05,
            seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    return {"random": play(random_policy(module.action_space.n, seed), episodes, env_config, seed=seed),
            "trained": play(epsilon_greedy(module, epsilon, seed), episodes, env_config, seed=seed)}


def run(repeats: int = 16, device: str = "cpu", checkpoint: str | None = None, epsilon: float = 0.05) -> str:
    """``repeats`` is the number of episodes per policy."""
    if checkpoint is None:
        raise ValueError("mario-policy needs --checkpoint DIR (a checkpoint folder printed by `rl-speed train`).")
    module, env_config = load_policy_module(checkpoint)
    results = compare(module, env_config, repeats, epsilon)
    rows = [f"| {name} | {r['returns'].mean():,.0f} | {np.median(r['returns']):,.0f} | {r['x_pos'].mean():,.0f} | "
            f"{np.median(r['x_pos']):,.0f} | {r['x_pos'].max():,} |" for name, r in results.items()]
    return "\n".join([
        "### Mario policy vs random on the real emulator",
        "",
        f"Command: `rl-speed bench mario-policy --checkpoint {checkpoint} --repeats {repeats}` · machine: "
        f"{machine()} · date: {time.strftime('%Y-%m-%d')} · env_config {env_config} · {repeats} episodes per "
        f"policy · trained policy epsilon-greedy with epsilon {epsilon}.",
        "",
        "| policy | mean return | median return | mean final x | median final x | best final x |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
    ])
