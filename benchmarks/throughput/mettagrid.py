"""MettaGrid on a GPU box: the GPU preset (``tuned_examples/mettagrid_ppo_gpu.yaml``) end to end on one GPU, and stock
PPO through mettagrid's PettingZoo form on the same box, with the same module (learners on several GPUs:
:mod:`benchmarks.scaling.learner_scaling`).

* FastPPO: the preset as written (15 runners x 24 simulations x 24 agents, async sampling, batch 259,200, minibatch
  32,400, 1 epoch, TokenActorCritic on one GPU learner); agent steps/s over ``seconds`` after two warm-up iterations,
  the iteration profile, and the mean return per agent-episode against random play in the same arena.
* FastPPO, BPTT preset (``bptt=True``): ``tuned_examples/mettagrid_ppo_gpu_bptt.yaml``, the same runners with the
  LSTM token module and truncated BPTT over 32-step chunks, measured the same way.
* Stock PPO: RLlib's PPO with the PettingZoo form (``rl_speed.multi_agent.MettaGridMultiAgentEnv``, one simulation
  per env, per-agent dicts), one shared policy of the same TokenActorCritic, batches counted in agent steps
  (``count_steps_by: agent_steps``) so they are the preset's 259,200 agent steps, 15 runners.

Run on the device with ``rl-speed bench mettagrid --device cuda`` (the [mettagrid] extra installed).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.common import (interleaved, learner_seconds, machine, median_run, rate_range, timed_run,
                                   usable_cpus)
from benchmarks import TUNED_EXAMPLES

PRESET = TUNED_EXAMPLES / "mettagrid_ppo_gpu.yaml"
#: the same preset with the LSTM token module and BPTT over 32-step chunks
BPTT_PRESET = PRESET.with_name("mettagrid_ppo_gpu_bptt.yaml")


def _preset(path: Path = PRESET) -> Any:
    from rl_speed.experiments import load_experiments

    (experiment,) = load_experiments(path)
    return experiment.config


def _sized(preset: Any, runners: int | None, device: str) -> Any:
    """A preset on ``runners`` runners (the same per-runner size; smaller machines) and on ``device``."""
    if runners is not None:
        batch = runners * preset.num_envs_per_env_runner * preset.rollout_fragment_length
        preset = preset.env_runners(num_env_runners=runners).training(
            train_batch_size_per_learner=batch, minibatch_size=min(preset.minibatch_size, batch))
    if device != "cuda":
        preset = preset.learners(num_gpus_per_learner=0)
    return preset


def random_return(env_config: dict, episodes: int = 200) -> float:
    """Mean return per agent-episode of uniformly random actions in the preset's arena."""
    from rl_speed_envs.mettagrid import MettaGridVectorEnv

    env = MettaGridVectorEnv(num_envs=env_config.get("num_agents", 24) * 8, **env_config)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    returns, running, resetting = [], np.zeros(env.num_envs), np.zeros(env.num_envs, bool)
    while len(returns) < episodes:
        _, rewards, terminated, truncated, _ = env.step(rng.integers(0, env.single_action_space.n, env.num_envs))
        running += np.where(resetting, 0.0, rewards)
        done = terminated | truncated
        returns.extend(running[done])
        running[done] = 0.0
        resetting = done
    return float(np.mean(returns))


def _phases(run: dict) -> dict:
    """The last iteration's phase seconds (``rl_speed_profile``), rounded."""
    return {k[:-2]: round(float(v), 3) for k, v in run["profiles"][-1].items() if k.endswith("_s")}


def run(repeats: int = 1, device: str = "cpu", seconds: float = 90.0, stock_seconds: float = 60.0,
        runners: int | None = None, bptt: bool = True) -> str:
    """FastPPO's MettaGrid GPU preset (and its BPTT preset) against stock PPO through the PettingZoo form; each
    contender ``repeats`` times in interleaved rounds, the median run reported."""
    if repeats < 1:
        raise ValueError(f"bench mettagrid: `repeats` must be >= 1, got {repeats}.")
    import ray

    import rl_speed
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rl_speed.modules.tokens import TokenActorCritic

    rl_speed.register()
    gpus = 1 if device == "cuda" else 0
    ray.init(address="local", num_cpus=usable_cpus(), num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    preset = _sized(_preset(), runners, device)
    env_config = dict(preset.env_config)
    batch = preset.train_batch_size_per_learner
    agents = env_config.get("num_agents", 24)
    try:
        baseline = random_return(env_config)
        module = RLModuleSpec(module_class=TokenActorCritic, model_config=dict(preset.model_config))
        stock = (PPOConfig().environment("rl_speed/MettaGrid-v0", env_config=env_config)
                 .env_runners(num_env_runners=preset.num_env_runners, num_envs_per_env_runner=1)
                 .multi_agent(policies={"shared"}, policy_mapping_fn=lambda aid, episode, **kw: "shared",
                              count_steps_by="agent_steps")
                 .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs={"shared": module}))
                 .training(train_batch_size_per_learner=batch, minibatch_size=preset.minibatch_size,
                           num_epochs=preset.num_epochs, lr=preset.lr, gamma=preset.gamma,
                           lambda_=preset.lambda_, entropy_coeff=preset.entropy_coeff)
                 .learners(num_gpus_per_learner=1 if device == "cuda" else 0))
        # name -> (config, seconds, batch for the learner rate or None)
        contenders = {"FastPPO, 1 GPU learner": (preset, seconds, batch)}
        if bptt:
            recurrent = _sized(_preset(BPTT_PRESET), runners, device)
            contenders[f"FastPPO, BPTT preset ({BPTT_PRESET.name})"] = (
                recurrent, seconds, recurrent.train_batch_size_per_learner)
        contenders["stock PPO, PettingZoo form"] = (stock, stock_seconds, None)
        runs: dict[str, list[dict]] = {name: [] for name in contenders}
        for name in interleaved(list(contenders), repeats):  # each contender once per round
            config, secs, _ = contenders[name]
            runs[name].append(timed_run(config.copy(copy_frozen=False), secs))
    finally:
        ray.shutdown()
    rows, notes = [], []
    for name, (_, _, learner_batch) in contenders.items():
        median = median_run(runs[name])
        rows.append((name, median["rate"], rate_range(runs[name]),
                     learner_batch / learner_seconds(median) if learner_batch else float("nan")))
        if learner_batch:
            notes.append(f"{name} (median run): mean return per agent-episode over the run "
                         f"{[round(r, 1) for r in median['returns']]} (random play {baseline:.2f}); last iteration's "
                         f"phases {_phases(median)}")
    fast = rows[0][1]
    table = [f"| {name} | {rate:,.0f}{spread} | {learner:,.0f} | {fast / rate:.1f}x |"
             for name, rate, spread, learner in rows]
    return "\n".join([
        "### MettaGrid GPU preset: FastPPO (vector form) vs stock PPO (PettingZoo form), agent steps/s",
        "",
        f"Command: `rl-speed bench mettagrid --device {device}` · machine: {machine()} · date: "
        f"{time.strftime('%Y-%m-%d')} · CPUs usable: {usable_cpus()} · preset `{PRESET.name}` ({preset.num_env_runners} "
        f"runners x {preset.num_envs_per_env_runner} lanes, batch {batch:,}, minibatch {preset.minibatch_size:,}), "
        f"{agents} agents per simulation; FastPPO measured over {seconds:.0f} s, "
        f"stock over {stock_seconds:.0f} s, each after two warm-up iterations; {repeats} run(s) each in interleaved "
        "rounds, the median run shown (range in brackets). Learner rate: batch / (learn + "
        "advantages seconds) per iteration, median.",
        "",
        "| run | agent steps/s end to end | learner steps/s | FastPPO 1-GPU / this |",
        "|---|---:|---:|---:|",
        *table,
        "",
        *[f"- {note}" for note in notes],
    ])
