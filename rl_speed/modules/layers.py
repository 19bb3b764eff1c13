"""The network pieces rl_speed's modules (and the bare-torch benchmark loops) build from: one MLP builder and the
two CNN encoders. Each returns ``(nn.Sequential, output width)``; the layer order (and so every state-dict key) is
the same as the per-module builders these replaced, so checkpoints keep loading.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

ACTIVATIONS = {"relu": lambda: nn.ReLU(inplace=True), "tanh": nn.Tanh}


def mlp(in_dim: int, hiddens: list[int], activation: str = "tanh",
        out_dim: int | None = None) -> tuple[nn.Sequential, int]:
    """``Linear -> activation`` per hidden width, then a linear output layer if ``out_dim`` is given."""
    layers: list[nn.Module] = []
    for width in hiddens:
        layers += [nn.Linear(in_dim, width), ACTIVATIONS[activation]()]
        in_dim = width
    if out_dim is not None:
        layers.append(nn.Linear(in_dim, out_dim))
        in_dim = out_dim
    return nn.Sequential(*layers), in_dim


def cnn(in_shape: tuple[int, ...], channels: list[int], hiddens: list[int],
         activation: str) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    c = in_shape[0]
    for out in channels:
        layers += [nn.Conv2d(c, out, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
        c = out
    layers.append(nn.Flatten())
    head, out_dim = mlp(c * in_shape[1] * in_shape[2], hiddens, activation)
    return nn.Sequential(*layers, *head), out_dim


def nature_cnn(in_shape: tuple[int, ...], hiddens: list[int], batch_norm: bool) -> tuple[nn.Sequential, int]:
    """Mnih et al. (2015)'s encoder; with BatchNorm the conv bias is redundant (BN's shift replaces it)."""
    layers: list[nn.Module] = []
    c, h, w = in_shape
    for out, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
        layers.append(nn.Conv2d(c, out, kernel_size=kernel, stride=stride, bias=not batch_norm))
        if batch_norm:
            layers.append(nn.BatchNorm2d(out))
        layers.append(nn.ReLU(inplace=True))
        c, h, w = out, (h - kernel) // stride + 1, (w - kernel) // stride + 1
    if h < 1 or w < 1:
        raise ValueError(f"encoder 'nature' needs images of at least 36 x 36, got {in_shape[1:]}; "
                         "use encoder 'cnn' for small grids.")
    layers.append(nn.Flatten())
    head, out_dim = mlp(c * h * w, hiddens, "relu")
    encoder = nn.Sequential(*layers, *head)
    for m in encoder.modules():  # He init: keeps activation variance through ReLU layers
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, mode="fan_out" if isinstance(m, nn.Conv2d) else "fan_in",
                                    nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return encoder, out_dim


class RunningNorm(nn.Module):
    """Per-element standardization by running statistics: ``clamp((x - mean) / sqrt(var + 1e-5), -5, 5)``, as
    rl_games' ``normalize_input``. On Atari frames the static background goes to 0 and whatever moves (ball,
    paddles) stands out at up to 5. The statistics are buffers (saved with the module's state and synced to the env
    runners with its weights) and change only in :meth:`update`, which the learner calls once per train batch; a
    forward never changes them, so a captured learner step reads them as they are. They start at mean 0, variance 1
    and a count of 1 (the identity up to the clamp), so the first batch sets them almost alone."""

    #: Rows per step of :meth:`fold` (the float copy of one chunk, not of a whole batch).
    chunk = 1024

    def __init__(self, shape: tuple[int, ...], epsilon: float = 1e-5, clip: float = 5.0) -> None:
        super().__init__()
        self.epsilon, self.clip = epsilon, clip
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.ones((), dtype=torch.float64))

    def gain_and_shift(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``1 / sqrt(var + epsilon)`` and ``-mean`` times it, in ``dtype``: the standardization is ``x * gain +
        shift`` (per element, the size of one row; computed in double precision, then cast)."""
        inverse_std = torch.rsqrt(self.var + self.epsilon)
        return inverse_std.to(dtype), (-self.mean * inverse_std).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x * gain + shift in one pass over the frames (addcmul), then the clamp in place: two full-size passes
        # instead of three (subtract, multiply, clamp)
        gain, shift = self.gain_and_shift(x.dtype)
        if x.requires_grad and torch.is_grad_enabled():  # out= below has no autograd; frames never need a gradient
            return (x * gain).add_(shift).clamp_(-self.clip, self.clip)
        # Written into a tensor laid out like x: addcmul's own output would follow `shift`'s contiguous layout, and
        # Atari frames arrive channels-last ([B, H, W, C] permuted), so the pass would transpose them and the conv
        # would get NCHW input
        out = torch.addcmul(shift, x, gain, out=torch.empty_like(x))
        return out.clamp_(-self.clip, self.clip)

    def denormalize(self, y: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`forward` within the clamp: ``clamp(y) * sqrt(var + 1e-5) + mean`` (rl_games'
        ``unnorm``), e.g. a value head's output in the units of the returns it was trained on."""
        std = torch.sqrt(self.var + self.epsilon).to(y.dtype)
        return torch.addcmul(self.mean.to(y.dtype), y.clamp(-self.clip, self.clip), std)

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Folds the rows of ``x`` ``[B, *shape]`` into the statistics (Chan et al.'s parallel update), in place."""
        if not len(x):
            return
        batch_mean = x.mean(0).double()
        batch_var = x.var(0, unbiased=False).double()
        n = float(len(x))
        total = self.count + n
        delta = batch_mean - self.mean
        self.var.copy_((self.var * self.count + batch_var * n + delta.square() * self.count * n / total) / total)
        self.mean.add_(delta * n / total)
        self.count.copy_(total)

    @torch.no_grad()
    def fold(self, obs: Any, preprocess: nn.Module) -> None:
        """Folds raw observations into the statistics as ``preprocess`` turns them into this norm's input, a chunk
        of rows at a time (a structure of tensors, e.g. a Dict observation, in one pass)."""
        for part in obs.split(self.chunk) if isinstance(obs, torch.Tensor) else [obs]:
            self.update(preprocess(part))


#: The model_config keys whose running statistics (:class:`RunningNorm`) a learner updates, each with the learner
#: class attribute that says it does and the learners that set it.
RUNNING_STATISTICS = {"normalize_obs": ("updates_input_statistics", ("FastPPO", "FastDQN")),
                      "normalize_value": ("updates_value_statistics", ("FastPPO",))}


def running_statistics_problem(given: dict, config: Any) -> str | None:
    """Why a module's ``normalize_obs`` / ``normalize_value: true`` cannot be honoured by ``config``, or None:
    :class:`RunningNorm`'s statistics need a learner that updates them (one whose class sets the attribute in
    :data:`RUNNING_STATISTICS`) and only one learner (each would fold in its own share of the data, and the runners
    would get only the first one's). Value statistics also need one module: FastPPO's multi-module advantages do
    not convert values."""
    for key, (attribute, algorithms) in RUNNING_STATISTICS.items():
        if not given.get(key):
            continue
        learner = config.learner_class
        if not getattr(learner, attribute, False):
            learners = " or ".join(f"{name}'s" for name in algorithms)
            return (f"`{key}: true` needs a learner that updates the running statistics ({learners}); "
                    f"{learner.__name__} would leave them at their start (mean 0, variance 1). Use "
                    f"{' or '.join(algorithms)}, or remove the key.")
        if (config.num_learners or 0) > 1:
            return (f"`{key}: true` on {config.num_learners} learners: each would update its own statistics "
                    "from its share of the data; use `num_learners` 0 or 1, or remove the key.")
        if key == "normalize_value" and len(config.policies or {}) > 1:
            return (f"`normalize_value: true` with {len(config.policies)} modules: FastPPO keeps value statistics "
                    "for one module (a shared policy); remove the key or train one module.")
    return None
