"""FastPPO with rl_speed's RecurrentActorCritic vs with RLlib's own LSTM (``model_config: use_lstm``), same sizes:
env steps/s end to end on the cue corridor (a memory task), sampling + values/GAE + updates.

Both have one LSTM layer of the same width behind the same MLP, 64 lanes, chunks / sequences of 16 steps. rl_speed's
module acts on single steps and trains on fixed ``[T / L * N, L]`` chunks (its state resets at ``is_first`` inside
a chunk); RLlib's module acts on ``[N, 1]`` steps and trains on RLlib's padded sequences, cut at every episode start.
Median of ``repeats`` interleaved runs of ``iterations`` iterations after one warm-up iteration.
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.common import machine, train_rate

SIZES = {"cell 32, hidden 32": 32, "cell 128, hidden 128": 128}


def _config(kind: str, width: int):
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rl_speed.algorithms.fast_ppo import FastPPOConfig
    from rl_speed.modules.recurrent import RecurrentActorCritic

    config = (FastPPOConfig().environment("rl_speed/CueCorridor-v0", env_config={"length": 5})
              .env_runners(num_env_runners=0, num_envs_per_env_runner=64, rollout_fragment_length=64)
              .training(train_batch_size_per_learner=4096, minibatch_size=1024, num_epochs=2, lr=1e-3))
    if kind == "rl_speed":
        return config.training(bptt_horizon=16).rl_module(
            rl_module_spec=RLModuleSpec(module_class=RecurrentActorCritic),
            model_config={"fcnet_hiddens": [width], "lstm_cell_size": width})
    return config.rl_module(model_config={"use_lstm": True, "max_seq_len": 16, "lstm_cell_size": width,
                                          "fcnet_hiddens": [width], "vf_share_layers": True})


def run(repeats: int = 3, iterations: int = 5) -> str:
    import ray

    import rl_speed

    rl_speed.register()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = []
    try:
        for name, width in SIZES.items():
            runs: dict[str, list[float]] = {"rl_speed": [], "rllib": []}
            for _ in range(repeats):  # interleaved, so drift on this shared machine hits both alike
                for kind in runs:
                    runs[kind].append(train_rate(_config(kind, width), iterations)[0])
            med = {k: statistics.median(v) for k, v in runs.items()}
            rows.append(f"| {name} | {med['rllib']:,.0f} | {med['rl_speed']:,.0f} | "
                        f"{med['rl_speed'] / med['rllib']:.2f}x |")
    finally:
        ray.shutdown()
    return "\n".join([
        "### FastPPO recurrent modules: rl_speed's RecurrentActorCritic vs RLlib's use_lstm (env steps/s)",
        "",
        f"Command: `rl-speed bench lstm` · machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · torch threads "
        f"{torch.get_num_threads()}, local sampling, cue corridor (length 5), 64 lanes, 16-step chunks / sequences, "
        f"batch 4,096, minibatch 1,024, 2 epochs, median of {repeats} interleaved runs of {iterations} iterations.",
        "",
        "| size | RLlib LSTM (use_lstm) | RecurrentActorCritic | ratio |",
        "|---|---:|---:|---:|",
        *rows,
    ])
