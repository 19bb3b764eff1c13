"""Atari policy evaluation: a trained FastPPO or FastDQN Atari policy against uniformly random actions.

``rl-speed bench atari-policy --checkpoint DIR [--repeats 32]`` (a checkpoint folder printed by ``rl-speed train``)
plays one whole episode on each of ``repeats`` fresh emulators (ale-py's vector env, seeds from 1000 on, the game and
preprocessing read from the checkpoint's ``env_config``, except that rewards are not clipped: the returns are game
scores) with:

* the trained module's greedy action (``forward_inference``: argmax of a PPO policy's logits, or DQN's argmax Q);
* for a policy-gradient module, actions sampled from its distribution, as it acted in training;
* uniformly random actions.

It reports the mean, min and max episode return of each: the evaluation behind the Pong rows of
docs/studies/pong-and-atari.md, independent of RLlib's per-iteration ``episode_return_mean``. Each policy plays under
two protocols: the training one (sticky actions as trained, usually 0.0) and the standard one of Machado et al.
(2018), ALE v5's default: sticky actions 0.25; both play the full game (no episode end at a life loss).
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from benchmarks.common import Policy, load_policy_module, machine, random_policy



def play(policy: Policy, num_envs: int, env_config: dict, seed: int = 1000, threads: int = 8) -> np.ndarray:
    """One whole episode on each of ``num_envs`` emulators (stepped on up to ``threads`` threads); their returns."""
    from rl_speed_envs.atari import AtariVectorEnv

    env = AtariVectorEnv(num_envs, **{**env_config, "reward_clipping": False,
                                      "num_threads": max(1, min(threads, num_envs))})
    try:
        obs, _ = env.reset(seed=seed)
        returns, done = np.zeros(num_envs), np.zeros(num_envs, dtype=bool)
        while not done.all():
            obs, rewards, terminated, truncated, _ = env.step(policy(obs))
            returns += np.where(done, 0.0, rewards)  # a finished emulator restarts; that episode is not counted
            done |= terminated | truncated
        return returns
    finally:
        env.close()


def module_policy(module: Any, mode: str, seed: int = 0) -> Policy:
    """``mode`` "greedy": the module's own inference action, else the argmax of its distribution inputs; "sample":
    a sample from its categorical distribution."""
    import torch

    from ray.rllib.core.columns import Columns

    device = next(module.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    module.eval()

    def act(obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            out = module.forward_inference({Columns.OBS: torch.from_numpy(obs).to(device)})
            if mode == "greedy" and Columns.ACTIONS in out:
                return out[Columns.ACTIONS].cpu().numpy()
            logits = out[Columns.ACTION_DIST_INPUTS]
            if mode == "greedy":
                return logits.argmax(-1).cpu().numpy()
            return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(-1).cpu().numpy()

    return act


#: ``repeat_action_probability`` of the standard protocol (Machado et al. 2018; ALE v5's default)
STANDARD_STICKY = 0.25


def protocols(env_config: dict) -> dict[float, dict]:
    """The evaluation env configs by sticky-action probability: as trained, and the standard 0.25; full games."""
    trained = float(env_config.get("repeat_action_probability", 0.0))
    full_game = {**env_config, "episodic_life": False, "life_episodes": False}
    return {p: {**full_game, "repeat_action_probability": p} for p in sorted({trained, STANDARD_STICKY})}


def evaluate(module: Any, env_config: dict, episodes: int, sticky: float | None = None) -> dict[str, np.ndarray]:
    """Returns per policy: ``greedy``, ``sampled`` (modules with distribution inputs only), ``random``; with
    ``sticky``, under that sticky-action probability (full games), else under ``env_config`` as it is."""
    if sticky is not None:
        env_config = protocols({**env_config, "repeat_action_probability": sticky})[sticky]
    return evaluate_protocols(module, {None: env_config}, episodes)[None]


def evaluate_protocols(module: Any, configs: dict, episodes: int) -> dict:
    """:func:`evaluate`'s policies under each of ``configs`` (a key per env config, e.g. :func:`protocols`), every
    play at once on threads of its own: ale-py and torch release the GIL, so the evaluation takes about its longest
    play instead of their sum (one after the other, a Pong evaluation of 16 games took 49 s on a 16-core box). Each
    play has its own policy state (sampling generator, random actions' generator) and its own emulators, so the
    returns are those of playing them one by one."""
    policies = {"greedy": lambda: module_policy(module, "greedy")}
    if not hasattr(module, "compute_q_values"):  # a policy-gradient module: also as it acted in training
        policies["sampled"] = lambda: module_policy(module, "sample")
    policies["random"] = lambda: random_policy(module.action_space.n)
    plays = [(key, name) for key in configs for name in policies]
    threads = max(1, (os.cpu_count() or 1) // len(plays))  # the plays' emulator threads share the machine's cores
    with ThreadPoolExecutor(len(plays)) as pool:
        futures = {(key, name): pool.submit(play, policies[name](), episodes, configs[key], threads=threads)
                   for key, name in plays}
        return {key: {name: futures[key, name].result() for name in policies} for key in configs}


def run(repeats: int = 32, device: str = "cpu", checkpoint: str | None = None) -> str:
    """``repeats`` is the number of episodes (emulators) per policy."""
    if checkpoint is None:
        raise ValueError("atari-policy needs --checkpoint DIR (a checkpoint folder printed by `rl-speed train`).")
    module, env_config = load_policy_module(checkpoint)
    if device == "cuda":
        module.to("cuda")
    rows = [f"| {name} | {sticky:g} | {r.mean():.2f} | {r.min():.0f} | {r.max():.0f} |"
            for sticky, results in evaluate_protocols(module, protocols(env_config), repeats).items()
            for name, r in results.items()]
    return "\n".join([
        "### Atari policy vs random",
        "",
        f"Command: `rl-speed bench atari-policy --checkpoint {checkpoint} --repeats {repeats} --device {device}` · "
        f"machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · env_config {env_config} · one episode on each "
        f"of {repeats} fresh emulators per policy (seeds from 1000), full games, under the sticky-action "
        f"probability trained with and under {STANDARD_STICKY} (the standard protocol).",
        "",
        "| policy | sticky actions | mean return | min | max |",
        "|---|---:|---:|---:|---:|",
        *rows,
    ])
