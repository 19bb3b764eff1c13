"""Multi-agent throughput: FastPPO's multi-agent columns vs its batched (agents-as-lanes) form vs stock PPO.

Agent steps/s end to end (sampling + GAE + updates), all in this process with local sampling, the same network
(64-64 tanh, separate value net), batch, minibatch and one epoch on every side; median of ``repeats`` interleaved
runs, each over ``iterations`` iterations after one warm-up iteration. Agent steps are read from RLlib's own result
keys (``num_agent_steps_sampled_lifetime`` per agent), so both sides are counted the same way.

* Grid arena, 32 maps x 24 agents, one shared policy: the batched form (``GridArenaVectorEnv``, lanes = agents, no
  ``multi_agent()``), and the ``MultiAgentEnv`` form (``GridArenaMultiAgentEnv``, one copy per map) under FastPPO
  (MultiAgentBatchedEnvRunner) and stock PPO (MultiAgentEnvRunner).
* RLlib's ``MultiAgentCartPole``, 64 env copies, 2 and 8 agents, one policy per agent.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from benchmarks.common import agent_steps, machine

GRID = "rl_speed/GridArena-v0"
GRID_MAPS, GRID_AGENTS = 32, 24
HIDDEN = [64, 64]


def _config(algo: str, env: Any, env_config: dict, num_envs: int, batch: int, minibatch: int,
            policies: dict | None) -> Any:
    if algo == "stock":
        from ray.rllib.algorithms.ppo import PPOConfig as Config
    else:
        from rl_speed.algorithms.fast_ppo import FastPPOConfig as Config
    config = (Config().environment(env, env_config=env_config)
              .env_runners(num_env_runners=0, num_envs_per_env_runner=num_envs)
              .training(train_batch_size_per_learner=batch, minibatch_size=minibatch, num_epochs=1, lr=3e-4)
              .rl_module(model_config={"fcnet_hiddens": HIDDEN, "fcnet_activation": "tanh",
                                       "head_fcnet_hiddens": []}))
    if policies is not None:
        config = config.multi_agent(**policies)
    return config


def agent_rate(config: Any, iterations: int, agents_per_lane_step: int = 1) -> float:
    """Agent steps/s over ``iterations`` training iterations after one warm-up iteration."""
    algo = config.build_algo()
    try:
        before = agent_steps(algo.train(), agents_per_lane_step)
        start = time.perf_counter()
        for _ in range(iterations):
            result = algo.train()
        return (agent_steps(result, agents_per_lane_step) - before) / (time.perf_counter() - start)
    finally:
        algo.stop()


def _cases() -> dict[str, tuple]:
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    shared = {"policies": {"shared"}, "policy_mapping_fn": lambda aid, episode, **kw: "shared"}
    lanes = GRID_MAPS * GRID_AGENTS
    # RLlib counts a multi-agent batch in env steps (one step of a map moves its 24 agents), the batched form in
    # lanes (= agents): 1,024 map steps and 24,576 lane steps are the same 24,576 agent steps. RLlib checks the
    # minibatch against the batch in env steps, so the minibatch is 1,024 rows on every side.
    cases: dict[str, tuple] = {
        # name: (env, env_config, {side: (num_envs, policies, batch)}, minibatch)
        f"grid arena, {GRID_MAPS} maps x {GRID_AGENTS} agents, shared policy": (
            GRID, {}, {"batched": (lanes, None, 24_576), "fast": (GRID_MAPS, shared, 1_024),
                       "stock": (GRID_MAPS, shared, 1_024)}, 1_024),
    }
    for agents in (2, 8):
        per_agent = {"policies": {f"p{i}" for i in range(agents)},
                     "policy_mapping_fn": lambda aid, episode, **kw: f"p{aid}"}
        cases[f"MultiAgentCartPole, 64 envs x {agents} agents, a policy per agent"] = (
            MultiAgentCartPole, {"num_agents": agents},
            {"fast": (64, per_agent, 8_192), "stock": (64, per_agent, 8_192)}, 2_048)
    return cases


def run(repeats: int = 3, iterations: int = 3) -> str:
    import ray
    import torch

    import rl_speed

    rl_speed.register()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    torch.set_num_threads(1)
    rows = []
    try:
        for name, (env, env_config, sides, minibatch) in _cases().items():
            rates: dict[str, list[float]] = {side: [] for side in sides}
            for _ in range(repeats):  # interleaved, so drift on this shared machine hits every side alike
                for side, (num_envs, policies, batch) in sides.items():
                    algo = "stock" if side == "stock" else "fast"
                    config = _config(algo, env, env_config, num_envs, batch, minibatch, policies)
                    rates[side].append(agent_rate(config, iterations))
            med = {side: statistics.median(v) for side, v in rates.items()}
            batched = f"{med['batched']:,.0f}" if "batched" in med else "-"
            vs_batched = f"{med['fast'] / med['batched']:.2f}x" if "batched" in med else "-"
            rows.append(f"| {name} | {batched} | {med['fast']:,.0f} | {med['stock']:,.0f} | {vs_batched} | "
                        f"{med['fast'] / med['stock']:.1f}x |")
    finally:
        ray.shutdown()
    return "\n".join([
        "### Multi-agent: FastPPO's multi-agent columns vs its batched form vs stock PPO (agent steps/s)",
        "",
        f"Command: `rl-speed bench multi-agent` · machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · local "
        "sampling, torch threads 1, 64-64 tanh policy and value nets, one epoch; grid arena batch 24,576 agent steps "
        "(1,024 map steps for the MultiAgentEnv form) / minibatch 1,024, MultiAgentCartPole batch 8,192 env steps / "
        "minibatch 2,048; agent steps from RLlib's "
        f"per-agent result keys; median of {repeats} interleaved runs of {iterations} iterations after a warm-up.",
        "",
        "| env | FastPPO, batched form | FastPPO, MultiAgentEnv | stock PPO, MultiAgentEnv | MA / batched | "
        "FastPPO / stock |",
        "|---|---:|---:|---:|---:|---:|",
        *rows,
    ])
