"""Replay buffer fed by column batches ``[T, N, ...]`` from vectorized envs, sampled with n-step returns.

Storage is a 2-D ring ``[C, L]``: L env lanes, C time slots per lane. A runner's ``[T, N]`` batch lands in lanes
``[lane_start, lane_start + N)`` as a couple of slice writes per column, and the successor of slot ``(c, l)`` is
``((c + 1) % C, l)``, so n-step windows are plain index arithmetic. A per-slot step counter tells whether a
successor is still (or already) the step that followed. Everything runs as whole-array numpy operations: nothing
loops over transitions, only over the (few) n-step offsets and the sum tree's levels.

Next observations can be stored or shared. Given ``obs`` with ``T + 1`` rows and no ``next_obs`` (the env runner's
column layout), a step's next observation is the successor slot's obs, and the newest step of each lane takes it
from a per-lane pending row (``obs[T]``). Frames are then stored once, not twice, which halves the memory of
image observations. Consecutive batches of a lane must continue each other (``obs[0]`` equals the previous
``obs[T]``). Where they do not (a restarted env runner), the lane's previous newest transition is dropped, because
its successor is not its next observation.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Mapping

import numpy as np

from rl_speed.buffers.sum_tree import SumTree

#: Columns whose per-step shape and dtype the first batch sets (stored as given: uint8 images stay uint8).
_FREE_COLUMNS = ("obs", "next_obs", "actions")
#: Columns with a fixed ``[T, N]`` layout, and the dtype each is stored in.
_FIXED_COLUMNS = {"rewards": np.float32, "terminateds": np.bool_, "truncateds": np.bool_}
_OPTIONAL_COLUMNS = ("valid",)
_KNOWN = _FREE_COLUMNS + tuple(_FIXED_COLUMNS) + _OPTIONAL_COLUMNS
#: How prioritized samples' importance weights are normalized (see ``BatchedReplayBuffer.sample``).
IMPORTANCE_WEIGHTS = ("batch", "buffer")


class BatchedReplayBuffer:
    """Uniform or proportionally prioritized (Schaul et al. 2016) replay over ``[C, L]`` lanes of env steps.

    ``capacity`` is rounded up to ``C * L`` slots with ``C = ceil(capacity / num_lanes)``. Both modes sample
    through a sum tree (uniform mode keeps leaves at 1 for valid slots, 0 otherwise), which draws exactly among
    valid stored transitions however many invalid or unwritten slots there are.
    """

    def __init__(self, capacity: int, num_lanes: int, *, prioritized: bool = False, alpha: float = 0.6,
                 beta: float = 0.4, eps: float = 1e-6, importance_weights: str = "batch", seed: int | None = None,
                 device: str | None = None) -> None:
        if not capacity >= 1:
            raise ValueError(f"BatchedReplayBuffer: `capacity` must be >= 1, got {capacity}.")
        if not num_lanes >= 1:
            raise ValueError(f"BatchedReplayBuffer: `num_lanes` must be >= 1, got {num_lanes}.")
        if not alpha >= 0:
            raise ValueError(f"BatchedReplayBuffer: `alpha` must be >= 0, got {alpha}.")
        _check_beta(beta)
        if importance_weights not in IMPORTANCE_WEIGHTS:
            raise ValueError(f"BatchedReplayBuffer: `importance_weights`={importance_weights!r} must be one of "
                             f"{', '.join(map(repr, IMPORTANCE_WEIGHTS))}.")
        self.importance_weights = importance_weights
        if not (eps >= 0 and math.isfinite(eps)):
            raise ValueError(f"BatchedReplayBuffer: `eps` must be finite and >= 0, got {eps}.")
        # `device` (e.g. "cuda"): obs / next_obs / actions live there as torch tensors, in their own dtype, and
        # samples of them come back as tensors on that device; the index math (tree, n-step) stays in numpy.
        self.device = device
        self._spec: dict[str, tuple[tuple[int, ...], np.dtype]] = {}  # free column -> (per-step shape, dtype)
        self.num_lanes = int(num_lanes)
        self.slots_per_lane = math.ceil(int(capacity) / self.num_lanes)  # C
        self.capacity = self.slots_per_lane * self.num_lanes  # C * L >= the requested capacity
        self.prioritized = bool(prioritized)
        self.alpha, self.beta, self.eps = float(alpha), float(beta), float(eps)
        self._rng = np.random.default_rng(seed)
        shape = (self.slots_per_lane, self.num_lanes)
        # [C, L] per slot; obs / next_obs / actions join on the first add_batch, when their shapes are known.
        self._data: dict[str, np.ndarray] = {k: np.zeros(shape, dtype) for k, dtype in _FIXED_COLUMNS.items()}
        # The lane's running step count at the slot's step; -1 where the slot holds no valid transition (never
        # written, or an invalid step), so one comparison tells that a successor is valid, current and written.
        self._step_id = np.full(shape, -1, np.int64)
        self._continues = np.ones(shape, np.bool_)  # ~(terminated | truncated): a window may go past the slot
        self._lane_steps = np.zeros(self.num_lanes, np.int64)  # steps written per lane, ever
        self._flat: dict[str, np.ndarray] = {}  # [C * L, ...] views of the above; flat index = c * L + l
        self._reflatten()
        self._tree = SumTree(self.capacity)
        self._max_priority = 1.0  # largest |td| + eps seen; new transitions get it (before ** alpha)
        self._added = self._evicted = self._sampled = 0
        self._shared_next_obs: bool | None = None  # set by the first add_batch: next obs shared with successors?
        self._pending: Any = None  # [L, ...] shared mode: each lane's newest next observation (obs[T])

    def __len__(self) -> int:
        """Number of valid stored transitions."""
        return self._added - self._evicted

    def get_metrics(self) -> dict[str, int]:
        """``size`` (valid stored), and lifetime counts of valid transitions ``added``, ``evicted``, ``sampled``."""
        return {"size": len(self), "added": self._added, "evicted": self._evicted, "sampled": self._sampled}

    def add_batch(self, columns: Mapping[str, Any], lane_start: int = 0) -> None:
        """Writes a ``[T, N]`` batch into lanes ``[lane_start, lane_start + N)`` at their shared write cursor.

        Keys: ``obs``, ``next_obs``, ``actions``, ``rewards``, ``terminateds``, ``truncateds`` and optionally
        ``valid`` (default all True; invalid steps are stored to keep lanes aligned, but never sampled). Or ``obs``
        with ``T + 1`` rows and no ``next_obs``: next observations are shared with the successor steps (see the
        module docstring); a buffer keeps the form of its first batch. If
        ``T > C`` only the last C steps are kept. Raises ``ValueError`` (changing nothing) for missing or unknown
        keys, mismatched shapes or dtypes, a lane range outside ``[0, num_lanes)`` or lanes at different cursors.
        """
        lane_start = operator.index(lane_start)
        batch = self._checked(columns, lane_start)
        t, n = batch["rewards"].shape
        if t == 0 or n == 0:
            return
        shared = self._shared_next_obs = "next_obs" not in batch
        if "obs" not in self._data:
            self._allocate(batch)
        if shared:
            self._continue_lanes(batch["obs"][0], lane_start, n)
        valid = batch.pop("valid", None)
        valid = np.ones((t, n), np.bool_) if valid is None else valid
        lanes = slice(lane_start, lane_start + n)
        first_step = int(self._lane_steps[lane_start])
        self._lane_steps[lanes] += t
        self._added += int(np.count_nonzero(valid))
        c = self.slots_per_lane
        if t > c:  # only the last C steps fit; the earlier valid ones count as added and evicted at once
            self._evicted += int(np.count_nonzero(valid[:t - c]))
            batch = {k: v[t - c:] for k, v in batch.items()}
            valid, first_step, t = valid[t - c:], first_step + t - c, c
        start = first_step % c
        rows = (start + np.arange(t)) % c  # [T] slot row of each step
        self._evicted += int(np.count_nonzero(self._step_id[rows, lanes] >= 0))

        for key, value in batch.items():
            if self.device is not None and key in _FREE_COLUMNS:
                value = _to_device(value, self.device, copy=False)  # one host-to-device copy per column per call
            if shared and key == "obs":
                self._pending[lanes] = value[-1]  # obs[T]: the newest step's next observation
                value = value[:-1]
            _ring_write(self._data[key], value, start, lanes)
        _ring_write(self._step_id, np.where(valid, first_step + np.arange(t)[:, None], -1), start, lanes)
        _ring_write(self._continues, ~(batch["terminateds"] | batch["truncateds"]), start, lanes)

        new_priority = self._max_priority ** self.alpha if self.prioritized else 1.0
        order = np.argsort(rows)  # steps in slot order, so the flat indices increase: the tree's cheap case
        slots = rows[order, None] * self.num_lanes + np.arange(lane_start, lane_start + n)  # [T, N] flat indices
        self._tree.update(slots.reshape(-1), np.where(valid[order], new_priority, 0.0).reshape(-1))

    def sample(self, batch_size: int, n_step: int = 1, gamma: float = 0.99, beta: float | None = None
               ) -> dict[str, np.ndarray]:
        """``batch_size`` transitions drawn with replacement among valid stored ones, with n-step returns.

        Returns ``obs``, ``actions``, ``rewards`` (discounted sum over the ``n_step`` [B] steps actually used),
        ``next_obs`` and ``terminateds`` of the window's last step, ``n_step`` (bootstrap with ``gamma ** n_step``),
        ``weights`` (importance weights, ones when uniform) and ``indices`` (for ``update_priorities``).
        A window stops early after a terminated or truncated step, or before a step that is invalid, overwritten
        or not yet written.
        """
        if len(self) == 0:
            raise ValueError("BatchedReplayBuffer.sample: the buffer holds no valid transitions yet; "
                             "add_batch some first.")
        if not batch_size >= 1:
            raise ValueError(f"BatchedReplayBuffer.sample: `batch_size` must be >= 1, got {batch_size}.")
        if not n_step >= 1:
            raise ValueError(f"BatchedReplayBuffer.sample: `n_step` must be >= 1, got {n_step}.")
        beta = self.beta if beta is None else _check_beta(beta)
        total = self._tree.total()
        if not total > 0.0:
            raise ValueError("BatchedReplayBuffer.sample: every stored transition has priority 0 (zero priorities "
                             "with eps=0); nothing can be drawn.")
        indices = self._tree.find_prefix(self._rng.random(batch_size) * total)  # [B]
        out = self._nstep_for_indices(indices, n_step, gamma)
        last = out.pop("last_indices")
        out["obs"] = self._gather("obs", indices)
        out["actions"] = self._gather("actions", indices)
        out["next_obs"] = self._next_obs(last)
        if self.prioritized:
            # (N * P(i)) ** -beta / the largest such weight, with P(i) = p_i / total: N and total cancel. "batch":
            # the largest in this batch (the batch's smallest priority); "buffer": the largest any stored transition
            # would get (the buffer's smallest priority), as RLlib's PrioritizedEpisodeReplayBuffer and OpenAI
            # baselines normalize. One tiny |TD error| anywhere in the buffer then scales every update down.
            priorities = self._tree.get(indices)
            smallest = priorities.min() if self.importance_weights == "batch" else self._tree.min_positive()
            out["weights"] = ((smallest / priorities) ** beta).astype(np.float32)
        else:
            out["weights"] = np.ones(batch_size, np.float32)
        out["indices"] = indices
        self._sampled += batch_size
        return out

    def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Sets the priorities of sampled slots to ``(priorities + eps) ** alpha`` (pass ``|td_error|``).

        A no-op for a uniform buffer (after the same checks), so one learner loop serves both kinds. Slots that have
        since been overwritten by an invalid step keep priority 0. Raises ``ValueError`` for indices out of range
        or priorities that are negative, NaN or infinite.
        """
        indices = np.asarray(indices)
        priorities = np.asarray(priorities, dtype=np.float64)
        if indices.ndim != 1 or indices.shape != priorities.shape:
            raise ValueError(f"BatchedReplayBuffer.update_priorities: `indices` {indices.shape} and `priorities` "
                             f"{priorities.shape} must be 1-D of equal length.")
        if indices.size == 0:
            return
        if indices.dtype.kind not in "iu":
            raise ValueError(f"BatchedReplayBuffer.update_priorities: `indices` must be integers, got {indices.dtype}.")
        indices = indices.astype(np.int64, copy=False)
        if indices.min() < 0 or indices.max() >= self.capacity:
            raise ValueError(f"BatchedReplayBuffer.update_priorities: `indices` must lie in [0, {self.capacity}), "
                             f"got [{indices.min()}, {indices.max()}].")
        smallest, largest = float(priorities.min()), float(priorities.max())
        if not (smallest >= 0.0 and math.isfinite(largest)):  # the min is NaN if any priority is: fails too
            raise ValueError("BatchedReplayBuffer.update_priorities: `priorities` must be finite and >= 0, got "
                             f"min {smallest}, max {largest}.")
        if not self.prioritized:
            return
        priorities = priorities + self.eps
        self._max_priority = max(self._max_priority, largest + self.eps)
        # Checked above, so straight to the tree's unchecked write; slots overwritten since by invalid steps stay 0.
        self._tree._assign(indices, np.where(self._flat["step_id"][indices] >= 0, priorities ** self.alpha, 0.0))

    def _nstep_for_indices(self, indices: np.ndarray, n_step: int, gamma: float) -> dict[str, np.ndarray]:
        """n-step ``rewards``, ``terminateds``, ``n_step`` and ``last_indices`` (slot of the window's last step) for
        valid stored slots ``indices`` [B]; vectorized over B, one iteration per extra step."""
        f = self._flat
        ret = f["rewards"][indices].astype(np.float64)  # [B]
        last = indices
        used = np.ones(len(indices), np.int64)
        going = np.ones(len(indices), np.bool_)  # the window may still grow
        step_id = f["step_id"][indices]
        for k in range(1, n_step):
            succ = (indices + k * self.num_lanes) % self.capacity  # slot ((c + k) % C, l)
            going &= f["continues"][last]  # the window's last step did not end the episode,
            going &= f["step_id"][succ] == step_id + k  # and the lane's next step is valid, current and written
            ret += f["rewards"][succ] * (going * gamma ** k)  # float64 discount, as the return accumulates
            last = np.where(going, succ, last)
            used += going
        return {"rewards": ret.astype(np.float32), "terminateds": f["terminateds"][last], "n_step": used,
                "last_indices": last}

    def _next_obs(self, last: np.ndarray) -> Any:
        """The next observation after valid slots ``last``: stored, or (shared mode) the successor slot's obs, or the
        lane's pending row for a lane's newest step."""
        if not self._shared_next_obs:
            return self._gather("next_obs", last)
        lane = last % self.num_lanes
        newest = self._flat["step_id"][last] + 1 >= self._lane_steps[lane]  # its successor is not written yet
        out = self._gather("obs", np.where(newest, last, (last + self.num_lanes) % self.capacity))
        if newest.any():
            rows = np.flatnonzero(newest)
            if self.device is not None:
                import torch

                rows_t = torch.as_tensor(rows, device=out.device)
                out[rows_t] = self._pending[torch.as_tensor(lane[rows], device=out.device)]
            else:
                out[rows] = self._pending[lane[rows]]
        return out

    def _continue_lanes(self, first_obs: Any, lane_start: int, n: int) -> None:
        """Shared mode: drops each lane's newest transition whose successor (this batch's ``obs[0]``) is not its
        next observation, i.e. the lane did not continue from the pending row."""
        if self._pending is None or not self._lane_steps[lane_start]:
            return
        pending = _to_numpy(self._pending[lane_start:lane_start + n]).reshape(n, -1)
        broken = np.flatnonzero((pending != np.asarray(first_obs).reshape(n, -1)).any(axis=1))
        if not len(broken):
            return
        lanes = lane_start + broken
        slots = ((self._lane_steps[lanes] - 1) % self.slots_per_lane) * self.num_lanes + lanes
        held = self._flat["step_id"][slots] >= 0
        self._evicted += int(held.sum())
        self._flat["step_id"][slots] = -1
        self._tree.update(slots, np.zeros(len(slots)))

    def _gather(self, key: str, indices: np.ndarray) -> Any:
        """Rows ``indices`` of a free column: numpy, or torch tensors on ``device``."""
        if self.device is not None:
            import torch

            return self._flat[key].index_select(0, torch.as_tensor(indices, device=self._flat[key].device))
        # take(axis=0) copies whole rows; fancy indexing on an [S, ...] array goes element by element (~5x slower).
        return self._flat[key].take(indices, axis=0)

    def get_state(self) -> dict[str, Any]:
        """Everything needed to restore this buffer exactly (copies; picklable): storage, cursors, step ids,
        sum tree, max priority, counters, settings and the RNG state."""
        return {
            "capacity": self.capacity, "num_lanes": self.num_lanes, "prioritized": self.prioritized,
            "alpha": self.alpha, "beta": self.beta, "eps": self.eps,
            "columns": {k: _to_numpy(v) for k, v in self._data.items()},
            "step_id": self._step_id.copy(), "lane_steps": self._lane_steps.copy(),
            "tree": self._tree.get_state()["tree"], "max_priority": self._max_priority,
            "added": self._added, "evicted": self._evicted, "sampled": self._sampled,
            "rng": self._rng.bit_generator.state,
            "shared_next_obs": self._shared_next_obs,
            "pending": None if self._pending is None else _to_numpy(self._pending),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restores ``get_state()``'s output. ``capacity``, ``num_lanes`` and ``prioritized`` must match this
        buffer's (they fix the layout and the meaning of the tree); alpha, beta and eps come from the state."""
        for key in ("capacity", "num_lanes", "prioritized"):
            if state[key] != getattr(self, key):
                raise ValueError(f"BatchedReplayBuffer.set_state: state has {key}={state[key]!r}, "
                                 f"this buffer {getattr(self, key)!r}.")
        self._tree.set_state({"capacity": self.capacity, "tree": state["tree"]})
        self._data = {k: (_to_device(v, self.device) if k in _FREE_COLUMNS else np.array(v))
                      for k, v in state["columns"].items()}
        self._spec = {k: (np.shape(v)[2:], np.asarray(v).dtype) for k, v in state["columns"].items()
                      if k in _FREE_COLUMNS}
        self._step_id = np.array(state["step_id"])
        self._continues = ~(self._data["terminateds"] | self._data["truncateds"])
        self._lane_steps = np.array(state["lane_steps"])
        self._reflatten()
        self.alpha, self.beta, self.eps = float(state["alpha"]), float(state["beta"]), float(state["eps"])
        self._max_priority = float(state["max_priority"])
        self._added, self._evicted, self._sampled = int(state["added"]), int(state["evicted"]), int(state["sampled"])
        self._rng.bit_generator.state = state["rng"]
        self._shared_next_obs = state.get("shared_next_obs", False if "next_obs" in state["columns"] else None)
        pending = state.get("pending")
        self._pending = None if pending is None else _to_device(pending, self.device)

    def _reflatten(self) -> None:
        """[C, L, ...] -> [C * L, ...] views of every per-slot array, for gathers by flat slot index."""
        arrays = {**self._data, "step_id": self._step_id, "continues": self._continues}
        self._flat = {k: v.reshape(self.capacity, *v.shape[2:]) for k, v in arrays.items()}

    def _allocate(self, batch: Mapping[str, np.ndarray]) -> None:
        """[C, L, *shape] storage for the free columns, in the first batch's per-step shapes and dtypes."""
        for key in _FREE_COLUMNS:
            if key not in batch:  # next_obs in shared mode: the successor slots hold it
                continue
            value = batch[key]
            shape = (self.slots_per_lane, self.num_lanes, *value.shape[2:])
            self._spec[key] = (value.shape[2:], value.dtype)
            if self.device is None:
                self._data[key] = np.zeros(shape, value.dtype)
            else:
                self._data[key] = _zeros_on(self.device, shape, value.dtype)
        if "next_obs" not in batch:
            self._pending = _to_device(np.zeros((self.num_lanes, *batch["obs"].shape[2:]), batch["obs"].dtype),
                                       self.device)
        self._reflatten()

    def _checked(self, columns: Mapping[str, Any], lane_start: int) -> dict[str, np.ndarray]:
        """The batch as arrays, after every check ``add_batch`` promises (so a rejected batch changes nothing)."""
        where = "BatchedReplayBuffer.add_batch"
        shared = "next_obs" not in columns
        missing = [k for k in _KNOWN if k not in columns and k not in _OPTIONAL_COLUMNS
                   and not (shared and k == "next_obs")]
        unknown = [k for k in columns if k not in _KNOWN]
        if missing or unknown:
            raise ValueError(f"{where}: missing columns {missing}, unknown columns {unknown}; "
                             f"expected {list(_KNOWN[:-1])} and optionally 'valid' (or 'obs' with T + 1 rows and "
                             "no 'next_obs').")
        if self._shared_next_obs is not None and shared != self._shared_next_obs:
            raise ValueError(f"{where}: this buffer was filled {'without' if self._shared_next_obs else 'with'} a "
                             f"'next_obs' column; pass the same form every time.")
        batch = {k: np.asarray(v) for k, v in columns.items()}
        if batch["rewards"].ndim != 2:
            raise ValueError(f"{where}: column 'rewards' has shape {batch['rewards'].shape}; expected [T, N].")
        t, n = batch["rewards"].shape
        for key, value in batch.items():
            fixed = key not in _FREE_COLUMNS
            rows = t + 1 if shared and key == "obs" else t
            if value.shape[:2] != (rows, n) or (fixed and value.ndim != 2):
                raise ValueError(f"{where}: column {key!r} has shape {value.shape}; expected "
                                 f"[{'T + 1' if rows > t else 'T'}, N{'' if fixed else ', ...'}] with T, N = {t}, "
                                 f"{n} (from 'rewards').")
        for key in ("terminateds", "truncateds", "valid"):
            if key in batch and batch[key].dtype != np.bool_:
                raise ValueError(f"{where}: column {key!r} must be bool, got {batch[key].dtype}.")
        if not np.can_cast(batch["rewards"].dtype, np.float32, "same_kind"):
            raise ValueError(f"{where}: column 'rewards' must be real numbers, got {batch['rewards'].dtype}.")
        for key in (k for k in _FREE_COLUMNS if k in batch):
            # Each free column has to match its storage; before the first batch is stored, next_obs has to match obs.
            first = batch["obs"] if key == "next_obs" else batch[key]
            ref_shape, ref_dtype = self._spec.get(key, (first.shape[2:], first.dtype))
            if batch[key].shape[2:] != ref_shape or batch[key].dtype != ref_dtype:
                stored = "the buffer stores" if key in self._spec else "'obs' has"
                raise ValueError(f"{where}: column {key!r} has per-step shape {batch[key].shape[2:]} and dtype "
                                 f"{batch[key].dtype}, but {stored} per-step shape {ref_shape} and dtype "
                                 f"{ref_dtype}.")
        if not (0 <= lane_start and lane_start + n <= self.num_lanes):
            raise ValueError(f"{where}: lanes [`lane_start`={lane_start}, {lane_start + n}) must lie in "
                             f"[0, num_lanes={self.num_lanes}).")
        cursors = self._lane_steps[lane_start:lane_start + n]
        if n and (cursors != cursors[0]).any():
            raise ValueError(f"{where}: lanes [{lane_start}, {lane_start + n}) are at different write cursors "
                             f"{np.unique(cursors).tolist()}; write a group of lanes always together.")
        return batch


def _check_beta(beta: float) -> float:
    """``beta`` as a float, or ``ValueError`` naming it (the constructor and ``sample`` both take one)."""
    if not 0 <= beta <= 1:
        raise ValueError(f"BatchedReplayBuffer: `beta` must be in [0, 1], got {beta}.")
    return float(beta)


def _ring_write(dst: np.ndarray, src: np.ndarray, start: int, lanes: slice) -> None:
    """dst[(start + i) % C, lanes] = src[i] for the T <= C rows of src, as at most two slice writes."""
    head = min(len(src), len(dst) - start)  # rows before the ring wraps
    dst[start:start + head, lanes] = src[:head]
    dst[:len(src) - head, lanes] = src[head:]


def _zeros_on(device: str, shape: tuple[int, ...], dtype: np.dtype) -> Any:
    """Zeros as a torch tensor on ``device``. On the CPU they are numpy's (calloc): the OS hands out zeroed pages as
    slots are first written, where ``torch.zeros`` writes every byte at once (0.8-0.9 s per 2.8 GB of Atari frames
    on a 2-core VM, all in the first ``add_batch``)."""
    import torch

    if torch.device(device).type == "cpu":
        return torch.from_numpy(np.zeros(shape, dtype))
    return torch.zeros(shape, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype, device=device)


def _to_device(array: np.ndarray, device: str | None, copy: bool = True) -> Any:
    """``array`` as a torch tensor on ``device`` (same dtype), or as numpy when device is None; ``copy=False``
    may share memory with ``array`` (fine for values that are copied into storage right after)."""
    if device is None:
        return np.array(array, copy=copy)
    import torch

    array = np.ascontiguousarray(array)
    if copy or not array.flags.writeable:
        # One copy, straight to the device. A read-only array (a batch read from Ray's object store) must not be
        # shared: torch warns that writing through such a tensor is undefined.
        return torch.tensor(array, device=device)
    return torch.as_tensor(array, device=device)


def _to_numpy(value: Any) -> np.ndarray:
    return value.detach().cpu().numpy().copy() if hasattr(value, "detach") else value.copy()
