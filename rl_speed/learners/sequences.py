"""EpisodeSequences: ``[T, N]`` columns in RLlib's sequence layout, for RLlib's own stateful modules
(``model_config: use_lstm``).

RLlib's recurrent modules cannot reset their state inside a sequence, so RLlib's learner cuts every episode into
sequences of at most ``max_seq_len`` steps, zero-pads them to that length and starts each from the state the episode
had there (zeros at the episode's start). The same layout from columns: a lane's steps are cut wherever a chunk of
``L`` steps starts (the runner recorded the state there) and wherever an episode starts (state zeros), giving ``S``
sequences of at most ``L`` steps, padded to ``[S, L]``. Built with tensor ops on the learner's device: a cumulative sum
numbers the sequences, one gather lays every column out, one scatter brings per-step results back to ``[T, N]``.

(rl_speed's :class:`rl_speed.modules.recurrent.RecurrentActorCritic` resets its state at ``is_first`` itself, so it
trains on the fixed ``[T / L * N, L]`` chunks instead, with no padding.)
"""

from __future__ import annotations

from typing import Any

import torch
import tree


class EpisodeSequences:
    """The sequence layout of one column batch (see the module docstring)."""

    def __init__(self, is_first: torch.Tensor, horizon: int) -> None:
        t_len, n = is_first.shape
        device = is_first.device
        steps = torch.arange(t_len, device=device)[:, None]
        starts = ((steps % horizon) == 0) | is_first  # [T, N]: a sequence starts here
        flat_starts = starts.T.reshape(-1)  # lane-major: lane n's steps are [n * T, (n + 1) * T)
        sequence = torch.cumsum(flat_starts.long(), 0) - 1  # [N * T]: which sequence each step is in
        self.start = torch.nonzero(flat_starts).squeeze(1)  # [S] flat index of each sequence's first step
        position = torch.arange(t_len * n, device=device) - self.start[sequence]
        index = torch.full((len(self.start), horizon), -1, dtype=torch.long, device=device)
        index[sequence, position] = torch.arange(t_len * n, device=device)
        self.pad = index < 0  # [S, L]
        self.index = index.clamp(min=0)
        self.t_len, self.n, self.horizon = t_len, n, horizon
        self.starts_episode = is_first.T.reshape(-1)[self.start]  # [S]

    def __len__(self) -> int:
        return len(self.start)

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        """``[T, N, ...] -> [S, L, ...]``, zeros (False) in the padding."""
        flat = x.transpose(0, 1).reshape(self.t_len * self.n, *x.shape[2:])
        out = flat[self.index]
        out[self.pad] = 0
        return out

    def scatter(self, y: torch.Tensor) -> torch.Tensor:
        """``[S, L] -> [T, N]`` (the padding is dropped)."""
        flat = y.new_zeros(self.t_len * self.n)
        flat[self.index[~self.pad]] = y[~self.pad]
        return flat.reshape(self.n, self.t_len).T

    def state_in(self, recorded: Any) -> Any:
        """Each sequence's initial state: the runner's recorded state ``[T / L, N, ...]`` where the sequence starts a
        chunk, zeros where it starts an episode."""
        chunk = (self.start % self.t_len) // self.horizon
        lane = self.start // self.t_len
        keep = (~self.starts_episode).float()

        def initial(s: torch.Tensor) -> torch.Tensor:
            picked = s[chunk, lane]
            return picked * keep.reshape(-1, *([1] * (picked.dim() - 1)))

        return tree.map_structure(initial, recorded)
