"""What every rl_speed env runner does at each step, in one place: one module forward over all lanes
(:func:`module_actions`), the actions the env receives (:func:`to_env_actions`), the rewards trained on
(:func:`clip_rewards`), a step's values written into columns (:func:`write_step`), RLlib's step timers
(:func:`log_step_timers`) and the runner's torch threads (:func:`set_runner_threads`). Used by
:class:`~rl_speed.env_runners.batched.BatchedEnvRunner`, its overlapped loop (:mod:`rl_speed.env_runners.overlapped`)
and :class:`~rl_speed.env_runners.multi_agent.MultiAgentBatchedEnvRunner`."""

from __future__ import annotations

import os
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import tree

from ray.rllib.core.columns import Columns as RLlibColumns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical
from ray.rllib.utils.metrics import ENV_STEP_TIMER, RLMODULE_INFERENCE_TIMER
from ray.rllib.utils.spaces.space_utils import unsquash_action

from rl_speed import columns as C


def set_runner_threads(config: Any, worker_index: int) -> None:
    """Remote runners get as many torch/OMP threads as CPUs Ray gave them (default 1), so N runners on N cores
    do not oversubscribe; the local runner shares the driver's threads."""
    if worker_index and worker_index > 0:
        threads = max(1, int(config.num_cpus_per_env_runner or 1))
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


def log_step_timers(metrics: Any, steps: int, env_seconds: float, inference_seconds: float | None) -> None:
    """RLlib's ``env_step_timer`` and ``rlmodule_inference_timer`` (seconds per step of all lanes) for one
    ``sample_columns()`` call of ``steps`` steps; ``inference_seconds`` None: no forward ran (random actions).

    RLlib's runner pushes one value per step into an EMA of coefficient 0.01; one push per call of the per-step mean,
    with coefficient 1 - 0.99**steps, weighs the history the same way at a cost per call."""
    ema = 1.0 - 0.99**steps
    metrics.log_value(ENV_STEP_TIMER, env_seconds / steps, ema_coeff=ema)
    if inference_seconds is not None:
        metrics.log_value(RLMODULE_INFERENCE_TIMER, inference_seconds / steps, ema_coeff=ema)


def clip_rewards(rewards: np.ndarray, setting: bool | float | None) -> np.ndarray:
    """RLlib's ``clip_rewards`` for the training columns: True -> the sign of each reward, a number c -> clipped to
    [-c, c], None / False -> unchanged. Episode returns in the metrics stay unclipped, as on RLlib's old stack."""
    if setting is True:
        return np.sign(rewards)
    if setting:  # a number
        return np.clip(rewards, -abs(float(setting)), abs(float(setting)))
    return rewards


def write_step(target: Any, t: int, value: Any) -> None:
    """``target[t] = value`` leaf by leaf (Dict / Tuple observations and actions are structures of arrays)."""
    if isinstance(target, np.ndarray):
        target[t] = value
        return
    for dst, src in zip(tree.flatten(target), tree.flatten(value)):
        dst[t] = src


def module_actions(module: Any, obs: Any, explore: bool, t: int, *, state: Any = None, time_axis: bool = False,
                   device: Any = None) -> tuple[Any, dict[str, np.ndarray], Any]:
    """One forward pass of ``module`` (in eval mode) over a batch of observations: ``(actions, extra, state_out)``.

    Modules that pick actions themselves (DQN's epsilon-greedy) return ``actions``; others return distribution
    inputs, which are sampled here (PPO), and ``extra`` holds the log-probs and distribution inputs PPO's loss reads.
    ``time_axis``: RLlib's own stateful modules act on ``[B, 1, ...]``, as RLlib's AddTimeDimToBatchAndZeroPad
    makes it. ``device``: where the module lives (RLlib puts a runner's module on a GPU when
    ``num_gpus_per_env_runner`` > 0); the observations go there and the outputs come back as numpy arrays."""
    with torch.inference_mode():
        obs_t = (torch.from_numpy(obs) if isinstance(obs, np.ndarray)  # the common case, without tree's cost
                 else tree.map_structure(lambda o: torch.from_numpy(np.asarray(o)), obs))  # Dict / Tuple
        if device is not None and torch.device(device).type != "cpu":
            obs_t = tree.map_structure(lambda o: o.to(device, non_blocking=True), obs_t)
        if time_axis:
            obs_t = tree.map_structure(lambda o: o[:, None], obs_t)
        batch = {RLlibColumns.OBS: obs_t}
        if state is not None:
            batch[RLlibColumns.STATE_IN] = state
        # The private forwards: the public ones walk every submodule with .eval()/.train() on each call, and the
        # runners' modules never leave eval mode (set when the runner is built).
        if explore:
            out = module._forward_exploration(batch, t=t)
        else:
            out = module._forward_inference(batch)
        if time_axis:
            stepped = (RLlibColumns.ACTIONS, RLlibColumns.ACTION_DIST_INPUTS, RLlibColumns.ACTION_LOGP)
            out = {k: (tree.map_structure(lambda x: x[:, 0], v) if k in stepped else v) for k, v in out.items()}
        extra: dict[str, np.ndarray] = {}
        if RLlibColumns.ACTIONS in out:
            actions = out[RLlibColumns.ACTIONS]
            # A module that samples its own actions (e.g. autoregressive ones) gives PPO's log-probs and
            # distribution inputs with them, as RLlib's GetActions connector then passes them on.
            if explore and RLlibColumns.ACTION_LOGP in out:
                extra[C.ACTION_LOGP] = out[RLlibColumns.ACTION_LOGP].float()
                if RLlibColumns.ACTION_DIST_INPUTS in out:
                    extra[C.ACTION_DIST_INPUTS] = out[RLlibColumns.ACTION_DIST_INPUTS].float()
        else:
            dist_cls = (module.get_exploration_action_dist_cls() if explore
                        else module.get_inference_action_dist_cls())
            logits = out[RLlibColumns.ACTION_DIST_INPUTS]
            if explore and dist_cls is TorchCategorical:
                actions, logp = sample_categorical(logits)
            else:
                dist = dist_cls.from_logits(logits)
                if not explore:
                    dist = dist.to_deterministic()
                actions = dist.sample()
                logp = dist.logp(actions) if explore else None
            if explore:
                extra[C.ACTION_LOGP] = logp.float()
                # PPO's KL term compares the learner's distribution with the one that acted.
                extra[C.ACTION_DIST_INPUTS] = logits.float()
    flat_actions = [actions] if isinstance(actions, (torch.Tensor, np.ndarray)) else tree.flatten(actions)
    host = to_numpy([*flat_actions, *extra.values()])
    n = len(flat_actions)
    actions = host[0] if flat_actions[0] is actions else tree.unflatten_as(actions, host[:n])  # (tree: ~10 us)
    return actions, dict(zip(extra, host[n:])), out.get(RLlibColumns.STATE_OUT)


def to_numpy(values: list) -> list[np.ndarray]:
    """Tensors (and numpy arrays or numbers, e.g. a heuristic module's actions) as numpy arrays. From a GPU, every
    copy is queued first and then waited for once, on an event that sleeps: a ``.cpu()`` per tensor would wait for
    the GPU once each (PPO's actions, log-probs and logits: three waits a step), and a default CUDA wait spins, holding
    a core the emulators of a box's other runners could use while a busy shared GPU answers."""
    on_gpu = [v for v in values if isinstance(v, torch.Tensor) and v.device.type == "cuda"]
    if on_gpu:
        copies = {id(v): v.to("cpu", non_blocking=True) for v in on_gpu}
        done = torch.cuda.Event(blocking=True)
        done.record(torch.cuda.current_stream(on_gpu[0].device))  # the stream the forward and the copies ran on
        done.synchronize()
        values = [copies.get(id(v), v) for v in values]
    return [v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v) for v in values]


def sample_categorical(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Actions and their log-probs from ``TorchCategorical`` logits, as its ``sample()`` and ``logp()`` give them (the
    same multinomial draw over the same probabilities), with one log-softmax for both: RLlib's pair normalizes twice
    and builds a torch ``Categorical`` per call, about 40% of the sampling time of a 576-lane forward on one core."""
    logp_all = torch.log_softmax(logits, -1)
    actions = torch.multinomial(logp_all.exp(), 1, True)
    return actions.squeeze(-1), logp_all.gather(-1, actions).squeeze(-1)


def to_env_actions(actions: Any, action_struct: Any, config: Any) -> Any:
    """What the env receives, as RLlib's ``NormalizeAndClipActions`` connector does it: for each bounded ``Box``
    (also inside a ``Dict`` action space), the module's actions (roughly in [-1, 1]) are unsquashed to the bounds if
    ``normalize_actions``, or clipped to them if ``clip_actions``. The columns keep the module's own actions, which
    the log-probs refer to."""

    def to_env(action: np.ndarray, space: gym.Space) -> np.ndarray:
        if not isinstance(space, gym.spaces.Box) or not space.is_bounded("both"):
            return action
        if config.normalize_actions:
            action = unsquash_action(action, space)
        elif not config.clip_actions:
            return action
        return np.clip(action, space.low, space.high).astype(space.dtype, copy=False)

    return tree.map_structure(to_env, actions, action_struct)
