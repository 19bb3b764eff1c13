"""The grid arena's GPU preset (``tuned_examples/grid_ppo_gpu.yaml``) against stock PPO on the same machine.

Runs on a machine with a GPU and many cores (e.g. an NVIDIA H100 host with 16 cores). Three rows, agent steps/s
over ``iterations`` training iterations after ``warmup`` ones (torch.compile and Ray start-up excluded):

1. FastPPO with the preset as shipped (LSTM, BPTT 32, torch.compile, async sampling, 393,216-step batches, 1 epoch);
2. FastPPO with the same batches and a feed-forward 256-256 MLP (the network stock PPO gets), with and without
   async sampling;
3. stock RLlib PPO through the arena's ``MultiAgentEnv`` form (one env per map, one shared policy), same runner
   count, maps per runner, batch, minibatch and MLP.
"""

from __future__ import annotations

import copy
import os
import time

import torch

from benchmarks.common import gpu_keys_off, machine, train_rate
from benchmarks import TUNED_EXAMPLES

PRESET = TUNED_EXAMPLES / "grid_ppo_gpu.yaml"


def run(repeats: int = 1, iterations: int = 5, warmup: int = 2, device: str = "cpu") -> str:
    import ray

    import rl_speed
    from rl_speed.experiments import load_experiments

    rl_speed.register()
    cpus = os.cpu_count() or 2
    runners = max(1, min(16, cpus - 1))
    (experiment,) = load_experiments(PRESET)
    preset = experiment.config.copy(copy_frozen=False)
    scale = runners / preset.num_env_runners  # fewer cores: fewer runners, batch shrunk with them
    batch = int(preset.train_batch_size_per_learner * scale)
    # Fewer cores: fewer runners and a batch shrunk with them; the minibatch never exceeds the batch.
    preset.env_runners(num_env_runners=runners).training(train_batch_size_per_learner=batch,
                                                         minibatch_size=min(preset.minibatch_size, batch))
    if device != "cuda":
        gpu_keys_off(preset)
    ray.init(address="local", num_cpus=cpus, num_gpus=1 if device == "cuda" else 0, include_dashboard=False,
             log_to_driver=False)
    rows = []
    try:
        from ray.rllib.algorithms.ppo import PPOConfig

        mlp = {"fcnet_hiddens": [256, 256], "head_fcnet_hiddens": []}
        # RLlib's default encoders take float vectors: the MLP rows get the same values as float32 (`flat`), not
        # the preset's uint8 planes.
        flat = dict(preset.env_config, observation="flat")
        feed_forward = copy.deepcopy(preset).environment(env_config=flat)
        feed_forward._rl_module_spec = None  # back to RLlib's default PPO module
        # The MLP rows run eagerly, as stock PPO does: RLlib's default module is not checked under capture on a GPU.
        feed_forward.rl_module(model_config=mlp).framework(torch_compile_learner=False).training(cuda_graph=False)
        feed_forward_sync = copy.deepcopy(feed_forward).training(async_sampling=False)
        maps = preset.num_envs_per_env_runner // 24
        stock = (PPOConfig()
                 .environment("rl_speed/GridArena-v0", env_config=flat)
                 .env_runners(num_env_runners=runners, num_envs_per_env_runner=maps, gym_env_vectorize_mode="sync")
                 .training(train_batch_size_per_learner=batch, minibatch_size=preset.minibatch_size, num_epochs=1,
                           lr=preset.lr)
                 .learners(num_gpus_per_learner=1 if device == "cuda" else 0)
                 .rl_module(model_config=mlp)
                 # Batches count agent steps, as FastPPO's lanes do.
                 .multi_agent(policies={"shared"}, policy_mapping_fn=lambda agent_id, episode, **kw: "shared",
                              count_steps_by="agent_steps"))
        for label, config, agents in (("FastPPO, preset (LSTM, BPTT 32, torch.compile, async sampling)", preset, 1),
                                      ("FastPPO, 256-256 MLP, async sampling", feed_forward, 1),
                                      ("FastPPO, 256-256 MLP, synchronous", feed_forward_sync, 1),
                                      ("stock PPO (MultiAgentEnv), 256-256 MLP", stock, 24)):
            try:
                rates = [train_rate(config, iterations, warmup, agents) for _ in range(repeats)]
                rate = sorted(r for r, _ in rates)[len(rates) // 2]
                profile = rates[-1][1].get("rl_speed_profile", {})
                shares = (", ".join(f"{k[:-6]} {v:.0%}" for k, v in profile.items() if k.endswith("_share"))
                          or "n/a")
                rows.append(f"| {label} | {rate:,.0f} | {shares} |")
            except Exception as e:  # report, do not hide, a configuration that fails on this machine
                rows.append(f"| {label} | failed: {type(e).__name__}: {str(e)[:200]} | |")
    finally:
        ray.shutdown()
    gpu = torch.cuda.get_device_name() if device == "cuda" and torch.cuda.is_available() else "no GPU"
    return "\n".join([
        "### Grid arena, GPU preset: FastPPO vs stock PPO (agent steps/s)",
        "",
        f"Command: `rl-speed bench grid-preset` · machine: {machine()}, {gpu} · date: {time.strftime('%Y-%m-%d')} · "
        f"{runners} env runners x {preset.num_envs_per_env_runner} agent lanes, batch {batch:,}, minibatch "
        f"{preset.minibatch_size:,}, 1 epoch, median of {repeats} run(s) of {iterations} iterations after {warmup} "
        "warm-up iterations.",
        "",
        "| configuration | agent steps/s | FastPPO time shares (last iteration) |",
        "|---|---:|---|",
        *rows,
    ])
