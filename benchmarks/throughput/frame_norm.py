"""``normalize_obs``'s cost in the Nature CNN's training step, by how the frames are standardized.

Why: after RunningNorm's forward became one ``addcmul`` (two full-size passes instead of three), the Pong learner
benches on the GPU read slower with ``normalize_obs``, not faster (FastDQN's learner 0.721 s an iteration against
0.605 s before the change; its row without ``normalize_obs`` unchanged). ``addcmul``'s output follows the layout of
its first operand, the statistics' contiguous ``[C, H, W]``, while the frames arrive channels-last (``[B, H, W, C]``
permuted): the pass became a transpose and the first conv got NCHW input instead of NHWC. This bench times the step
under each way, side by side.

Per row, one training step of the Nature CNN encoder (the frames' cast and 1/255 scale, the standardization, the
convolutions and dense layer forward, a scalar loss, the backward) on a batch of uint8 frames of Pong's shape:

- ``no normalize_obs``: the frames straight into the encoder;
- ``in the frames' layout``: :class:`rl_speed.modules.layers.RunningNorm` as it is (``addcmul`` into a tensor laid
  out like the frames, then the clamp in place);
- ``addcmul's contiguous output``: the same arithmetic with ``addcmul``'s own output (its layout from the statistics);
- ``subtract, multiply, clamp``: three passes, as before the ``addcmul``.

On a GPU each step is captured as one CUDA graph and replayed (as FastPPO's and FastDQN's captured learner steps run):
the figure is the GPU's time, milliseconds per step, the median of ``repeats`` rounds of 50 replays, rows alternating.
On a CPU the steps run eagerly on a smaller batch.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

ROWS = ("no normalize_obs", "in the frames' layout", "addcmul's contiguous output", "subtract, multiply, clamp")
FRAME = (84, 84, 4)  # Pong's frames as the runners send them: [H, W, C] uint8
REPLAYS = 50


def standardize(row: str, norm: Any) -> Callable | None:
    """The standardization ``row`` names, over ``norm``'s statistics (``None``: none)."""
    import torch

    def contiguous_output(x: Any) -> Any:
        gain, shift = norm.gain_and_shift(x.dtype)
        return torch.addcmul(shift, x, gain).clamp_(-norm.clip, norm.clip)

    def three_passes(x: Any) -> Any:
        gain, _ = norm.gain_and_shift(x.dtype)
        return ((x - norm.mean.to(x.dtype)) * gain).clamp_(-norm.clip, norm.clip)

    if row == "no normalize_obs":
        return None
    if row == "in the frames' layout":
        return norm
    if row == "addcmul's contiguous output":
        return contiguous_output
    if row == "subtract, multiply, clamp":
        return three_passes
    raise ValueError(f"frame_norm: unknown row {row!r}; choose from {list(ROWS)}.")


def training_step(device: str, batch: int, row: str) -> Callable[[], None]:
    """One row's step as a callable: eager on a CPU, one captured CUDA graph's replay on a GPU."""
    import gymnasium as gym
    import numpy as np
    import torch

    from rl_speed.modules.layers import RunningNorm, nature_cnn
    from rl_speed.modules.q_net import ObsPreprocessor

    generator = torch.Generator().manual_seed(0)
    preprocess = ObsPreprocessor(gym.spaces.Box(0, 255, FRAME, np.uint8))
    encoder, _ = nature_cnn(preprocess.out_shape, [512], batch_norm=False)
    encoder.to(device)
    norm = RunningNorm(preprocess.out_shape).to(device)
    frames = torch.randint(0, 256, (batch, *FRAME), dtype=torch.uint8, generator=generator).to(device)
    norm.update(preprocess(frames))
    standardized = standardize(row, norm)

    def step() -> None:
        x = preprocess(frames)
        encoder(x if standardized is None else standardized(x)).square().mean().backward()

    if device != "cuda":
        return step
    side = torch.cuda.Stream()  # warm-up on a side stream before the capture, as torch.cuda.graph asks
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    encoder.zero_grad(set_to_none=True)  # the captured backward allocates its gradients in the graph's own pool
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def measure(device: str = "cpu", repeats: int = 5, batch: int = 256, rows: tuple[str, ...] = ROWS) -> dict[str, float]:
    """Milliseconds per step per row: the median over ``repeats`` rounds (rows alternating) of each round's mean."""
    import torch

    steps = {row: training_step(device, batch, row) for row in rows}
    replays = REPLAYS if device == "cuda" else 3
    timings: dict[str, list[float]] = {row: [] for row in rows}
    for _ in range(repeats + 1):  # the first round warms up
        for row in rows:
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(replays):
                steps[row]()
            if device == "cuda":
                torch.cuda.synchronize()
            timings[row].append((time.perf_counter() - start) / replays * 1e3)
    return {row: statistics.median(values[1:]) for row, values in timings.items()}


def run(repeats: int = 5, device: str = "cpu") -> str:
    from benchmarks.common import machine

    batch = 256 if device == "cuda" else 32
    ms = measure(device, repeats, batch)
    first = ms[ROWS[0]]
    lines = [f"| {row} | {value:.3f} | {value / first:.2f}x |" for row, value in ms.items()]
    return "\n".join([
        "### normalize_obs in the Nature CNN's training step, by how the frames are standardized",
        "",
        f"Command: `rl-speed bench frame-norm --repeats {repeats}{' --device cuda' if device == 'cuda' else ''}` · "
        f"machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · one step = cast and scale, standardization, "
        f"the encoder's forward and backward on {batch} uint8 frames of {FRAME}; "
        + ("each step one captured CUDA graph, " if device == "cuda" else "eager, ")
        + f"median of {repeats} rounds, rows alternating.",
        "",
        "| row | ms per step | vs no normalize_obs |",
        "|---|---:|---:|",
        *lines,
    ])
