"""Mario DQN learner: optimizer steps/s of the Nature CNN Q-module (BatchNorm, dueling, double Q) under each
learner setting, on random uint8 ``(84, 84, 4)`` frames (no emulator needed).

Each row is FastDQN's learner as a run builds it (``FastDQNConfig`` + ``QNetModule`` with ``encoder: nature``), fed
the way FastDQN feeds it: ``learner.update(batch=..., minibatch_size=B)``. On CUDA the frames, next frames and actions
are uint8/int tensors already on the GPU, as the GPU preset's replay storage (``storage_device: cuda``) hands them
over; on CPU they are numpy arrays. Rows: fp32 eager, bf16 autocast, bf16 + torch.compile of
``forward_train``, and bf16 + compile + 4-step accumulation (4 micro-batches of B per optimizer step, i.e. an
effective batch of 4B); on CUDA also fp16 with the grad scaler, and compile with CUDA graphs (dynamo mode
"reduce-overhead"), and the whole step replayed as one CUDA graph (``cuda_graph: true``) alone, with bf16,
with bf16 + compile, and with bf16 + compile + accumulation 4. As in FastDQN, one ``update`` call runs ``STEPS``
optimizer steps (its minibatches are views of one batch). Each figure is the median of ``repeats`` timed calls,
after warm-up calls (compilation happens there).
"""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import torch

from benchmarks.common import machine, median_seconds

FRAMES = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
ACTIONS = gym.spaces.Discrete(7)
STEPS = 10
WARMUP = 3


def _rows(device: str) -> list[tuple[str, dict, int]]:
    """(label, training keys + compile flag, accumulation) per row."""
    rows = [("fp32 eager", {"mixed_precision": "off"}, 1),
            ("bf16", {"mixed_precision": "bf16"}, 1),
            ("bf16 + compile", {"mixed_precision": "bf16", "compile": "default"}, 1),
            ("bf16 + compile + accumulation 4", {"mixed_precision": "bf16", "compile": "default"}, 4)]
    if device == "cuda":
        rows.insert(1, ("fp32 eager, TF32 off (strict fp32 convolutions)", {"mixed_precision": "off", "tf32": False}, 1))
        rows.insert(3, ("fp16 + grad scaler", {"mixed_precision": "fp16"}, 1))
        rows.append(("bf16 + compile (CUDA graphs)", {"mixed_precision": "bf16", "compile": "reduce-overhead"}, 1))
        # the whole step (forward, backward, clip, Adam) replayed as one CUDA graph (`cuda_graph: true`)
        rows += [("fp32 + whole-step CUDA graph", {"mixed_precision": "off", "graph": True}, 1),
                 ("bf16 + whole-step CUDA graph", {"mixed_precision": "bf16", "graph": True}, 1),
                 ("bf16 + compile + whole-step CUDA graph",
                  {"mixed_precision": "bf16", "compile": "default", "graph": True}, 1),
                 ("bf16 + compile + whole-step CUDA graph + accumulation 4",
                  {"mixed_precision": "bf16", "compile": "default", "graph": True}, 4)]
    return rows


def _learner(device: str, batch: int, mixed_precision: str, accumulation: int, compile: str | None,
             graph: bool = False) -> object:
    from rl_speed.algorithms.fast_dqn import FastDQNConfig

    config = (FastDQNConfig()
              .environment(observation_space=FRAMES, action_space=ACTIONS)
              .training(train_batch_size=batch * accumulation, mixed_precision=mixed_precision,
                        grad_accumulation_steps=accumulation, dueling=True, double_q=True, lr=1e-4,
                        cuda_graph=graph)
              .rl_module(model_config={"encoder": "nature"})
              .learners(num_gpus_per_learner=1 if device == "cuda" else 0)
              .debugging(seed=0))
    if compile:
        config.framework(torch_compile_learner=True, torch_compile_learner_what_to_compile="forward_train",
                         torch_compile_learner_dynamo_mode=None if compile == "default" else compile)
    return config.build_learner()


def _batch(n: int, rng: np.random.Generator, device: str) -> object:
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    frames = rng.integers(0, 256, (n, *FRAMES.shape), dtype=np.uint8)
    actions = rng.integers(0, 7, n)
    on_device = (lambda x: torch.as_tensor(x, device=device)) if device == "cuda" else (lambda x: x)
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch({
        "obs": on_device(frames), "new_obs": on_device(np.roll(frames, 1, axis=0)), "actions": on_device(actions),
        "rewards": rng.normal(size=n).astype(np.float32), "terminateds": rng.random(n) < 0.01,
        "n_step": np.ones(n, np.float32), "weights": np.ones(n, np.float32)})}, n)


def learner_rows(repeats: int, device: str, batch: int) -> list[str]:
    rng = np.random.default_rng(0)
    sync = torch.cuda.synchronize if device == "cuda" else None
    out, base = [], None
    for label, keys, accumulation in _rows(device):
        tf32 = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = keys.get("tf32", tf32)  # torch's default lets cuDNN use TF32 for fp32
        try:
            learner = _learner(device, batch, keys["mixed_precision"], accumulation, keys.get("compile"),
                               keys.get("graph", False))
            data = _batch(batch * accumulation * STEPS, rng, device)
            update = lambda: learner.update(batch=data, minibatch_size=batch * accumulation,  # noqa: E731
                                            timesteps={"num_env_steps_sampled_lifetime": 0})
            for _ in range(WARMUP):
                update()
            seconds = median_seconds(update, repeats, sync=sync) / STEPS
        except Exception as e:  # e.g. a compile mode this torch/GPU cannot do: say so in the table
            out.append(f"| {label} | {batch:,} x {accumulation} | failed: {type(e).__name__}: "
                       f"{str(e).splitlines()[0][:120]} | | |")
            continue
        finally:
            torch.backends.cudnn.allow_tf32 = tf32
        samples = batch * accumulation / seconds
        base = base or samples
        out.append(f"| {label} | {batch:,} x {accumulation} | {1 / seconds:,.1f} | {samples:,.0f} | "
                   f"{samples / base:.2f}x |")
        del learner
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def run(repeats: int = 5, device: str = "cpu", batch: int | None = None) -> str:
    batch = batch or (512 if device == "cuda" else 64)
    card = torch.cuda.get_device_name() if device == "cuda" else "CPU"
    rows = learner_rows(repeats, device, batch)
    return "\n".join([
        "### Mario DQN learner (Nature CNN with BatchNorm, dueling, double Q; uint8 84 x 84 x 4 frames)",
        "",
        f"Command: `rl-speed bench mario-learner{' --device cuda' if device == 'cuda' else ''} --repeats {repeats}` · "
        f"machine: {machine()} · learner: {card} · date: {time.strftime('%Y-%m-%d')} · torch {torch.__version__} · "
        f"medians of {repeats} calls of {STEPS} optimizer steps.",
        "",
        "| learner setting | micro-batch x steps | optimizer steps/s | samples/s | samples/s vs fp32 |",
        "|---|---:|---:|---:|---:|",
        *rows,
    ])
