"""CapturedForward: an env runner's action step (the module's forward and the action sampling) captured once as a
CUDA graph and replayed on every later step (``cuda_graph_env_runners: true``).

Why: on a GPU box a runner with its module on the GPU (``num_gpus_per_env_runner`` > 0) spends about 3 ms of its
16 ms step of 16 Atari lanes waiting for a forward the GPU does in a fraction of that (the runner profile in
docs/studies/pong-and-atari.md). Each of 15 runners is its own CUDA context beside the learner's, and the GPU serves
one context at a time. The eager step meets the GPU twice: the observations' copy from pageable memory waits for the
GPU before any kernel is launched, then the forward's kernels go out one Python call at a time and the outputs come
back. Replayed, a step is one copy from pinned memory, one graph launch and one copy back, waited for once.

What is captured, per input signature (the observations' shape and dtype, and whether the step explores): the
module's ``_forward_exploration`` (or ``_forward_inference``) on static device inputs, then, for a categorical
policy, the action drawn from ``softmax(logits)`` by the exponential race (``argmax(p / q)`` with ``q ~ Exp(1)``, the
draw torch's ``multinomial`` makes for one sample, minus its host-side check that a graph cannot hold), its
log-probability and the logits (the greedy action where the step does not explore). Weights change in place
(RLlib's weight sync is ``load_state_dict``, which copies into the existing parameters), so a replay always acts with
the runner's current weights; normalization statistics kept as buffers likewise.

Refused where a replay could act differently from the eager step (``check_capturable``, when the runner is built):
a module on the CPU, a stateful module, observations that are not one array, an action distribution other than
RLlib's ``TorchCategorical``, and a module that picks its own actions (e.g. epsilon-greedy, which reads the
timestep from Python). Only the columnar path uses it; RLlib's own ``sample()`` (evaluation) acts through RLlib's
connector pipeline as always.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from ray.rllib.core.columns import Columns as RLlibColumns
from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical

from rl_speed import columns as C

#: Eager runs of a new signature (on a side stream) before it is captured: cuDNN picks its algorithms, lazy buffers
#: are made.
WARMUP_STEPS = 3


def categorical_step_problem(module: Any, observation_space: gym.Space, device: Any, done_as: str) -> str | None:
    """Why ``module``'s action step (on ``device``) cannot be ``done_as`` (captured, served) as one categorical draw
    from its logits on one observation array, or None."""
    if module.is_stateful():
        return "the module is stateful (its state would have to be kept along with each step); leave it off for " \
               "recurrent modules"
    if not isinstance(observation_space, gym.spaces.Box):
        return f"observations must be one array (a Box), got {observation_space}"
    for explore, dist in ((True, module.get_exploration_action_dist_cls()),
                          (False, module.get_inference_action_dist_cls())):
        if dist is not TorchCategorical:
            return (f"the module's {'exploration' if explore else 'inference'} action distribution is "
                    f"{getattr(dist, '__name__', dist)}; only RLlib's TorchCategorical (discrete actions) is {done_as}")
    blank = torch.from_numpy(np.zeros((1, *observation_space.shape), observation_space.dtype)).to(device)
    with torch.inference_mode():  # one eager step of each kind on a blank observation (act refuses own actions)
        try:
            for explore in (True, False):
                act(module, blank, explore)
        except OwnActionsError as error:
            return str(error)
    return None


def check_capturable(module: Any, device: Any, observation_space: gym.Space) -> str | None:
    """Why this runner's action step cannot be captured, or None. ``observation_space``: one lane's."""
    problem = categorical_step_problem(module, observation_space, device, "captured")
    if problem:
        return problem
    if torch.device(device).type != "cuda":
        return (f"the runner's module is on {device}, not a GPU; set `num_gpus_per_env_runner` > 0 (a remote "
                "runner's module then lives on its share of a GPU)")
    return None


class OwnActionsError(ValueError):
    """The module returns its own actions (e.g. epsilon-greedy from Python's timestep), which a replay would freeze."""


def act(module: Any, obs: torch.Tensor, explore: bool,
        noise: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``(actions, logp or None, logits)`` for a batch of observations already on the module's device: the body
    that is captured. Exploring, the action is drawn from ``noise`` (``q ~ Exp(1)`` per lane and action) where given,
    else from a draw of its own. Raises if the module returns its own actions."""
    batch = {RLlibColumns.OBS: obs}
    out = module._forward_exploration(batch, t=0) if explore else module._forward_inference(batch)
    if RLlibColumns.ACTIONS in out:
        raise OwnActionsError(f"{type(module).__name__} picks its own actions in its forward, which a captured or "
                              "served step would freeze; leave `cuda_graph_env_runners` and `shared_inference` off "
                              "for it")
    logits = out[RLlibColumns.ACTION_DIST_INPUTS].float()
    if not explore:
        return torch.argmax(logits, -1), None, logits
    logp_all = torch.log_softmax(logits, -1)
    # argmax(p / q), q ~ Exp(1), is a draw from p: the exponential race, as torch.multinomial draws one sample
    race = noise if noise is not None else torch.empty_like(logp_all).exponential_()
    actions = torch.argmax(logp_all - race.log(), -1)
    return actions, logp_all.gather(-1, actions[:, None]).squeeze(-1), logits


@dataclass
class _Graph:
    """One captured signature: pinned and device inputs, the graph, its device outputs and their pinned copies."""

    host_in: torch.Tensor
    device_in: torch.Tensor
    graph: torch.cuda.CUDAGraph
    device_out: list[torch.Tensor]
    host_out: list[torch.Tensor]


class CapturedForward:
    """The action step of one runner's ``module`` on ``device``, captured per signature; call it like
    :func:`rl_speed.env_runners.stepping.module_actions` (stateless modules): ``(actions, extra)``."""

    def __init__(self, module: Any, device: Any) -> None:
        self.module = module
        self.device = torch.device(device)
        self._graphs: dict[tuple, _Graph] = {}
        self._done = torch.cuda.Event(blocking=True)  # waited for by sleeping, not spinning (see stepping.to_numpy)

    def __call__(self, obs: np.ndarray, explore: bool) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        key = (obs.shape, obs.dtype.str, bool(explore))
        entry = self._graphs.get(key)
        if entry is None:
            entry = self._graphs[key] = self._capture(obs, explore)
        with torch.inference_mode():
            entry.host_in.numpy()[...] = obs
            entry.device_in.copy_(entry.host_in, non_blocking=True)
            entry.graph.replay()
            for device, host in zip(entry.device_out, entry.host_out):
                host.copy_(device, non_blocking=True)
            self._done.record(torch.cuda.current_stream(self.device))
            self._done.synchronize()
        # copies: the pinned buffers are overwritten by the next step, the arrays may live on in the caller
        actions, *rest = (h.numpy().copy() for h in entry.host_out)
        extra = dict(zip((C.ACTION_LOGP, C.ACTION_DIST_INPUTS), rest)) if explore else {}
        return actions, extra

    def _capture(self, obs: np.ndarray, explore: bool) -> _Graph:
        with torch.inference_mode():
            host_in = torch.from_numpy(np.ascontiguousarray(obs)).pin_memory()
            device_in = host_in.to(self.device)
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_STEPS):
                    act(self.module, device_in, explore)
            torch.cuda.current_stream(self.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                actions, logp, logits = act(self.module, device_in, explore)
            device_out = [actions] + ([logp, logits] if explore else [])
            host_out = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in device_out]
        return _Graph(host_in, device_in, graph, device_out, host_out)
