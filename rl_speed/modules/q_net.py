"""QNetModule: a Q-network RLModule for DQN / FastDQN that takes compact observations as they come.

* Observations are cast on the module's device, never in the env or the buffer: small-integer grids (a ``Box`` of
  integers with ``high < 32``, e.g. Snake's codes) are one-hot encoded into planes, uint8 images with ``high=255``
  are scaled to [0, 1], float vectors pass through. ``Dict`` / ``Tuple`` observations are taken leaf by leaf
  (each ``Box`` as above, ``Discrete`` / ``MultiDiscrete`` one-hot) and concatenated into one vector for the MLP, so
  uint8 leaves stay uint8 up to the module.
* Encoder: an MLP (``encoder: mlp``, default for vectors), a small CNN (``encoder: cnn``, default for 2-D/3-D
  grids and images), or the Nature-DQN CNN for 84 x 84 frame stacks (``encoder: nature``: 8x8/4, 4x4/2, 3x3/1 convs
  with 32/64/64 channels, then 512 units) with BatchNorm after each conv (``batch_norm``, default true for it), no
  conv bias under BatchNorm, He (Kaiming) init for every ReLU layer; in-place ReLUs; optional dueling head.
* BatchNorm: env runners act in eval mode (the running statistics the learner last synced; acting never changes
  them), the learner trains in train mode (batch statistics, running statistics updated). The target network runs
  in train mode inside ``forward_train`` too, so online and target Q-values are normalized the same way; the target
  sync copies parameters only, and the target's own running statistics are never used.
* Epsilon-greedy is one vectorized ``torch.where`` over the batch, under the schedule DQN configures
  (``config.epsilon``); action selection never records autograd (the runner calls it under ``inference_mode``).
* Implements ``QNetAPI``, ``TargetNetworkAPI`` and ``InferenceOnlyAPI`` with the outputs RLlib's DQN loss reads
  (``qf_preds``, ``qf_next_preds`` for double Q, ``qf_target_next_preds``), so RLlib's DQN learner trains it.

model_config keys: RLlib's ``fcnet_hiddens`` (default [256, 256]; [512] for ``nature``), ``fcnet_activation``
("relu" | "tanh", default RLlib's "tanh" for ``mlp``, "relu" for ``cnn``; ``nature`` always uses ReLU) and ``head_fcnet_hiddens`` (extra layers before the Q
head, default []), so a stock DQN config builds the same network; plus ``encoder`` ("mlp" | "cnn" | "nature"),
``conv_channels`` (default [32, 64]; cnn only), ``batch_norm`` (nature only, default true) and ``normalize_obs``
(default false: the encoder's input standardized per element by running statistics, which FastDQN's learner updates
from each replayed batch; :class:`rl_speed.modules.layers.RunningNorm`); ``dueling`` / ``double_q`` / ``epsilon``
come from DQN's config.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
import tree
from torch import nn

from ray.rllib.algorithms.dqn.dqn_learner import QF_NEXT_PREDS, QF_PREDS, QF_TARGET_NEXT_PREDS
from ray.rllib.core.columns import Columns
from ray.rllib.core.learner.utils import make_target_network
from ray.rllib.core.rl_module.apis import InferenceOnlyAPI, QNetAPI, TargetNetworkAPI
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.core.rl_module.torch.torch_rl_module import TorchRLModule
from ray.rllib.utils.annotations import override
from ray.rllib.utils.schedules.scheduler import Scheduler
from ray.rllib.utils.spaces.space_utils import get_base_struct_from_space

from rl_speed.modules.layers import ACTIVATIONS, RunningNorm, cnn, mlp, nature_cnn, running_statistics_problem

#: model_config ``encoder`` values.
ENCODERS = ("mlp", "cnn", "nature")


class ObsPreprocessor(nn.Module):
    """Casts one observation ``Box`` to float on the module's device: one-hot for small-integer codes, /255 for
    uint8 images, nothing for floats. Output ``[B, C, H, W]`` for grids/images, ``[B, D]`` for vectors."""

    def __init__(self, space: gym.spaces.Box) -> None:
        super().__init__()
        integer = np.issubdtype(space.dtype, np.integer)
        self.num_codes = int(space.high.max()) + 1 if integer and space.high.max() < 32 else 0
        self.scale = 1.0 / 255.0 if integer and not self.num_codes else 1.0
        self.shape = space.shape
        if self.num_codes:
            self.out_shape = (self.num_codes, *space.shape) if len(space.shape) == 2 else (space.shape[0] * self.num_codes,)
        elif len(space.shape) == 3:  # images arrive channels-last [H, W, C]
            self.out_shape = (space.shape[2], space.shape[0], space.shape[1])
        else:
            self.out_shape = (int(np.prod(space.shape)),)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.num_codes:
            planes = nn.functional.one_hot(obs.long(), self.num_codes).float()  # [B, ..., K]
            if len(self.shape) == 2:
                return planes.permute(0, 3, 1, 2)  # [B, H, W, K] -> [B, K, H, W]
            return planes.flatten(1)  # [B, D, K] -> [B, D*K]
        # an integer tensor times a Python float is float32 in one pass (cast and scale fused)
        x = obs * self.scale if self.scale != 1.0 else obs.float()
        if len(self.shape) == 3:
            return x.permute(0, 3, 1, 2)  # [B, H, W, C] -> [B, C, H, W]
        return x.flatten(1)


class StructPreprocessor(nn.Module):
    """A ``Dict`` / ``Tuple`` observation -> one float vector ``[B, D]``: each leaf through :class:`ObsPreprocessor`
    (``Box``) or one-hot (``Discrete``, ``MultiDiscrete``), flattened, concatenated in the space's leaf order."""

    def __init__(self, space: gym.Space) -> None:
        super().__init__()
        self.leaf_spaces = tree.flatten(get_base_struct_from_space(space))
        self.boxes = nn.ModuleList(ObsPreprocessor(s) if isinstance(s, gym.spaces.Box) else nn.Identity()
                                   for s in self.leaf_spaces)
        widths = []
        for leaf, pre in zip(self.leaf_spaces, self.boxes):
            if isinstance(leaf, gym.spaces.Box):
                widths.append(int(np.prod(pre.out_shape)))
            elif isinstance(leaf, gym.spaces.Discrete):
                widths.append(int(leaf.n))
            elif isinstance(leaf, gym.spaces.MultiDiscrete):
                widths.append(int(leaf.nvec.sum()))
            else:
                raise ValueError(f"QNetModule: observation leaf {leaf} is not supported; use Box, Discrete or "
                                 "MultiDiscrete leaves.")
        self.shape = (sum(widths),)
        self.out_shape = self.shape

    def forward(self, obs: Any) -> torch.Tensor:
        parts = []
        for x, leaf, pre in zip(tree.flatten(obs), self.leaf_spaces, self.boxes):
            if isinstance(leaf, gym.spaces.Box):
                parts.append(pre(x).flatten(1))
            elif isinstance(leaf, gym.spaces.Discrete):
                parts.append(nn.functional.one_hot(x.long().reshape(-1) - int(leaf.start), int(leaf.n)).float())
            else:
                parts.append(torch.cat([nn.functional.one_hot(x[:, i].long(), int(n)).float()
                                        for i, n in enumerate(leaf.nvec)], dim=1))
        return torch.cat(parts, dim=1)


class QTorso(nn.Module):
    """Preprocess -> encoder -> Q head (optionally dueling). One instance is the online net, a copy the target."""

    def __init__(self, space: gym.Space, num_actions: int, cfg: dict) -> None:
        super().__init__()
        structured = isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple))
        self.pre = StructPreprocessor(space) if structured else ObsPreprocessor(space)
        kind = cfg.get("encoder") or ("cnn" if len(self.pre.out_shape) == 3 else "mlp")
        default_hiddens = [512] if kind == "nature" else [256, 256]
        hiddens = list(cfg.get("fcnet_hiddens", default_hiddens)) + list(cfg.get("head_fcnet_hiddens") or [])
        # RLlib's default for MLP encoders (DefaultModelConfig: tanh), so `run: DQN` -> `run: FastDQN` keeps the network
        activation = cfg.get("fcnet_activation", DefaultModelConfig.fcnet_activation if kind == "mlp" else "relu")
        if activation not in ACTIVATIONS:
            raise ValueError(f"QNetModule: model_config `fcnet_activation`={activation!r} is invalid; "
                             f"use one of {', '.join(ACTIVATIONS)}.")
        if kind == "nature" and len(self.pre.out_shape) != 3:
            raise ValueError(f"QNetModule: encoder 'nature' needs image observations [H, W, C], got "
                             f"{self.pre.shape}; use 'mlp'.")
        if kind == "nature":
            self.encoder, dim = nature_cnn(self.pre.out_shape, hiddens, bool(cfg.get("batch_norm", True)))
        elif kind == "cnn" and len(self.pre.out_shape) == 3:
            self.encoder, dim = cnn(self.pre.out_shape, list(cfg.get("conv_channels", [32, 64])), hiddens,
                                     activation)
        elif "conv_channels" in cfg:  # a CNN asked for, but the observations are not 2-D/3-D grids
            raise ValueError(f"QNetModule: model_config `conv_channels` sizes a CNN, but observations of shape "
                             f"{self.pre.shape} go to an MLP; remove `conv_channels`.")
        elif kind in ("mlp", "cnn"):
            self.encoder, dim = mlp(int(np.prod(self.pre.out_shape)), hiddens, activation)
        else:
            raise ValueError(f"QNetModule: model_config `encoder`={kind!r} is invalid; use one of {ENCODERS}.")
        self.flatten_input = kind == "mlp"
        # normalize_obs: the encoder's input standardized per element (the target net's copy of the statistics
        # follows the online net's with every target update: RLlib syncs the whole state dict)
        self.obs_norm = RunningNorm(self.pre.out_shape) if cfg.get("normalize_obs") else None
        self.advantage = nn.Linear(dim, num_actions)
        self.value = nn.Linear(dim, 1) if cfg.get("dueling") else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.pre(obs)
        if self.obs_norm is not None:
            x = self.obs_norm(x)
        features = self.encoder(x.flatten(1) if self.flatten_input else x)
        adv = self.advantage(features)
        if self.value is None:
            return adv
        return self.value(features) + adv - adv.mean(dim=1, keepdim=True)


class QNetModule(TorchRLModule, QNetAPI, TargetNetworkAPI, InferenceOnlyAPI):
    """A DQN Q-network for Box, Dict or Tuple observations and Discrete actions (see the module docstring)."""

    #: What it reads from model_config (checked at config time: rl_speed.algorithms.config.check_model_config_keys).
    model_config_keys = {**{key: None for key in ("encoder", "fcnet_hiddens", "fcnet_activation", "head_fcnet_hiddens",
                                                  "conv_channels", "batch_norm", "dueling", "double_q", "epsilon")},
                         "normalize_obs": (False, True)}

    @staticmethod
    def check_model_config(given: dict, config: Any) -> str | None:
        """The keys that only one encoder reads, given with another one named."""
        encoder = given.get("encoder")
        if encoder is not None and encoder not in ENCODERS:
            return f"`encoder`={encoder!r} is invalid; use one of {', '.join(map(repr, ENCODERS))}."
        if encoder == "nature" and given.get("fcnet_activation", "relu") != "relu":
            return (f"`fcnet_activation`={given['fcnet_activation']!r}: the 'nature' encoder uses ReLU throughout; "
                    "remove the key or use encoder 'cnn' / 'mlp'.")
        if "conv_channels" in given and encoder in ("mlp", "nature"):
            return f"`conv_channels` sizes the 'cnn' encoder, not {encoder!r}; remove it or set `encoder: cnn`."
        if "batch_norm" in given and encoder != "nature":
            return "`batch_norm` applies to the 'nature' encoder only; remove it or set `encoder: nature`."
        return running_statistics_problem(given, config)

    @override(RLModule)
    def setup(self) -> None:
        if not isinstance(self.action_space, gym.spaces.Discrete):
            raise ValueError(f"QNetModule needs a Discrete action space, got {self.action_space}.")
        if not isinstance(self.observation_space, (gym.spaces.Box, gym.spaces.Dict, gym.spaces.Tuple)):
            raise ValueError(f"QNetModule needs a Box, Dict or Tuple observation space, got "
                             f"{self.observation_space}.")
        cfg = self.model_config or {}
        self.uses_double_q = bool(cfg.get("double_q", True))
        self.uses_dueling = bool(cfg.get("dueling", False))
        self.num_actions = int(self.action_space.n)
        self.epsilon_schedule = Scheduler(fixed_value_or_schedule=cfg.get("epsilon", 0.05), framework="torch")
        self.q = QTorso(self.observation_space, self.num_actions, cfg)

    @property
    def keeps_input_statistics(self) -> bool:
        """``normalize_obs``: FastDQN's learner then calls :meth:`update_input_statistics` once per update call."""
        return self.q.obs_norm is not None

    def update_input_statistics(self, obs: Any) -> None:
        """Folds a learner's replayed observations into ``normalize_obs``'s statistics, before its minibatches."""
        self.q.obs_norm.fold(obs, self.q.pre)

    @override(QNetAPI)
    def compute_q_values(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {QF_PREDS: self.q(batch[Columns.OBS])}

    @override(RLModule)
    def _forward_inference(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return {Columns.ACTIONS: self.q(batch[Columns.OBS]).argmax(dim=1)}

    @override(RLModule)
    def _forward_exploration(self, batch: dict[str, Any], t: int = 0, **kwargs: Any) -> dict[str, Any]:
        q = self.q(batch[Columns.OBS])
        self.epsilon_schedule.update(t)
        epsilon = self.epsilon_schedule.get_current_value()
        random = torch.randint(0, self.num_actions, (q.shape[0],), device=q.device)
        explore = torch.rand(q.shape[0], device=q.device) < epsilon
        return {Columns.ACTIONS: torch.where(explore, random, q.argmax(dim=1))}

    @override(TorchRLModule)
    def forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        if not self.training:  # RLlib walks every submodule with .train() on each call; once is enough
            self.train()
        return self._forward_train(batch, **kwargs)

    @override(RLModule)
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        if self.inference_only:
            raise RuntimeError("QNetModule: this is an inference-only copy (EnvRunner side); it cannot train.")
        obs, next_obs = batch[Columns.OBS], batch[Columns.NEXT_OBS]
        out: dict[str, Any] = {}
        if self.uses_double_q:
            # one pass over [2B, ...] (leaf by leaf for Dict / Tuple observations)
            both = self.q(torch.cat([obs, next_obs], dim=0) if isinstance(obs, torch.Tensor)
                          else tree.map_structure(lambda o, n: torch.cat([o, n], dim=0), obs, next_obs))
            out[QF_PREDS], out[QF_NEXT_PREDS] = torch.chunk(both, 2, dim=0)
        else:
            out[QF_PREDS] = self.q(obs)
        out[QF_TARGET_NEXT_PREDS] = self._target_q(next_obs)
        return out

    @override(TargetNetworkAPI)
    def make_target_networks(self) -> None:
        self._target_q = make_target_network(self.q)

    @override(TargetNetworkAPI)
    def get_target_network_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.q, self._target_q)]

    @override(TargetNetworkAPI)
    def forward_target(self, batch: dict[str, Any]) -> dict[str, Any]:
        return {QF_PREDS: self._target_q(batch[Columns.OBS])}

    @override(InferenceOnlyAPI)
    def get_non_inference_attributes(self) -> list[str]:
        return ["_target_q"]
