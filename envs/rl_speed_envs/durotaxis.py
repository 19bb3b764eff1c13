"""Durotaxis: steer a migrating cell, a graph of adhesion nodes, up a stiffness gradient.

The substrate is the rectangle ``[0, width] x [0, height]``; its stiffness grows to the right,
``stiffness(x) = clip(stiffness_min + stiffness_gradient * x, 0, 1)``. The cell is a set of at most ``max_nodes``
nodes (2-D positions); two nodes are linked when they are at most ``link_radius`` apart. An episode starts with
``init_nodes`` nodes on a small circle around ``(start_x, height / 2)``.

Each step, with ``n`` the current node count:

1. **Delete**: ``k = floor(delete_ratio * n)`` nodes with the smallest x are removed (ties: lower slot first),
   found with ``argpartition`` in O(n) (:func:`leftmost_k`).
2. **Spawn**: every surviving node whose ``spawn`` flag is 1 tries to place a node at angle ``pi * spawn_params[0]``
   and distance ``spawn_min_distance + (spawn_params[1] + 1) / 2 * (spawn_max_distance - spawn_min_distance)``,
   clipped to the substrate. The adhesion holds with probability ``stiffness`` at the target (the durotactic
   bias: stiff ground holds). New nodes take free slots in slot order; requests beyond ``max_nodes`` are dropped
   (``info["spawn_dropped"]``).
3. Existing nodes age by one; new nodes start at age 0.

Reward = sum of the components reported in ``info["reward_components"]`` every step:

| component | value |
|---|---|
| ``progress`` | ``progress_weight`` x change of the centroid's x |
| ``connectivity`` | ``-failure_penalty`` if the graph fell apart into several components (terminates) |
| ``node_count`` | ``-node_penalty`` x abs(n - ``target_nodes``) |
| ``spawn`` / ``delete`` | ``-spawn_cost`` x nodes spawned, ``-delete_cost`` x nodes deleted |
| ``termination`` | ``+goal_bonus`` when the centroid reaches ``goal_x``, ``-failure_penalty`` when no node is left |

Episodes terminate when the graph disconnects, empties or its centroid reaches ``goal_x``, and are truncated after
``max_steps`` steps.

## Observation space (``Dict``; ``M = max_nodes``, ``E = M (M - 1) / 2``, so every edge fits)

| key | shape | dtype | content |
|---|---|---|---|
| ``nodes`` | ``[M, 7]`` | float32 | per slot: x / width, y / height, local stiffness, degree / (M - 1), (x - centroid x) / width, (y - centroid y) / height, age / max_steps; zeros in empty slots |
| ``edges`` | ``[E, 2]`` | int16 | slot pairs (i < j) of linked nodes, in pair order, first; zeros after |
| ``node_mask`` | ``[M]`` | int8 | 1 where a slot holds a node |
| ``edge_mask`` | ``[E]`` | int8 | 1 for the real rows of ``edges`` |

## Action space (``Dict``)

| key | shape | range | meaning |
|---|---|---|---|
| ``spawn`` | ``[M]`` | {0, 1} | spawn from this slot's node (ignored for empty slots) |
| ``spawn_params`` | ``[M, 2]`` | [-1, 1] | direction and distance, as above; finite values outside the range are clipped |
| ``delete_ratio`` | ``[1]`` | [0, 1] | fraction of nodes to delete, leftmost first |

Wrong shapes, NaN or infinite spawn parameters, spawn flags other than 0/1 and a delete ratio outside [0, 1] raise
``ValueError`` and leave the state unchanged.

Two forms with identical dynamics (a lockstep test pins it): :class:`DurotaxisEnv`, one graph, written plainly
(sorted selection, breadth-first connectivity) as the reference, and :class:`DurotaxisVectorEnv`, ``num_envs``
graphs stepped as ``[num_envs, M]`` arrays (argpartition selection, label-propagation connectivity, NEXT_STEP
autoreset). Lane ``i`` of ``DurotaxisVectorEnv.reset(seed=s)`` is ``DurotaxisEnv.reset(seed=s + i)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rl_speed_envs import counter_rng
from rl_speed_envs.checks import check_int

NUM_FEATURES = 7
REWARD_COMPONENTS = ("progress", "connectivity", "node_count", "spawn", "delete", "termination")


@dataclass(frozen=True)
class DurotaxisConfig:
    """Validated settings; both forms build one, so bad input fails the same way everywhere."""

    max_nodes: int = 24
    init_nodes: int = 6
    width: float = 20.0
    height: float = 4.0
    link_radius: float = 1.2
    spawn_min_distance: float = 0.3
    spawn_max_distance: float = 1.0
    stiffness_min: float = 0.1
    stiffness_gradient: float = 0.045
    start_x: float = 1.5
    goal_x: float = 18.0
    max_steps: int = 100
    target_nodes: int = 10
    progress_weight: float = 1.0
    node_penalty: float = 0.005
    spawn_cost: float = 0.002
    delete_cost: float = 0.002
    goal_bonus: float = 5.0
    failure_penalty: float = 2.0

    def __post_init__(self) -> None:
        ints = {"max_nodes": (2, 181), "init_nodes": (1, 181), "max_steps": (1, 10**7), "target_nodes": (0, 181)}
        for name, (low, high) in ints.items():
            check_int("Durotaxis", name, getattr(self, name), low, high)
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "float" and (not isinstance(value, (int, float, np.floating)) or isinstance(value, bool)
                                      or not np.isfinite(value) or value < 0):
                raise ValueError(f"Durotaxis: `{f.name}`={value!r} must be a finite number >= 0.")
        if self.init_nodes > self.max_nodes:
            raise ValueError(f"Durotaxis: `init_nodes`={self.init_nodes} exceeds `max_nodes`={self.max_nodes}.")
        for name in ("width", "height", "link_radius", "spawn_max_distance"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Durotaxis: `{name}` must be > 0.")
        if self.spawn_min_distance > self.spawn_max_distance:
            raise ValueError("Durotaxis: `spawn_min_distance` must not exceed `spawn_max_distance`.")
        if not 0 < self.start_x < self.goal_x <= self.width:
            raise ValueError(f"Durotaxis: need 0 < start_x ({self.start_x}) < goal_x ({self.goal_x}) <= width "
                             f"({self.width}).")

    @property
    def num_pairs(self) -> int:
        return self.max_nodes * (self.max_nodes - 1) // 2

    @property
    def init_radius(self) -> float:
        """Radius of the starting circle: small enough that all starting nodes are linked."""
        return 0.45 * self.link_radius

    def stiffness(self, x: np.ndarray) -> np.ndarray:
        return np.clip(self.stiffness_min + self.stiffness_gradient * x, 0.0, 1.0)

    @property
    def observation_space(self) -> spaces.Dict:
        m, e = self.max_nodes, self.num_pairs
        return spaces.Dict({
            "nodes": spaces.Box(-np.inf, np.inf, (m, NUM_FEATURES), np.float32),
            "edges": spaces.Box(0, m - 1, (e, 2), np.int16),
            "node_mask": spaces.MultiBinary(m),
            "edge_mask": spaces.MultiBinary(e),
        })

    @property
    def action_space(self) -> spaces.Dict:
        m = self.max_nodes
        return spaces.Dict({
            "spawn": spaces.MultiBinary(m),
            "spawn_params": spaces.Box(-1.0, 1.0, (m, 2), np.float32),
            "delete_ratio": spaces.Box(0.0, 1.0, (1,), np.float32),
        })


CONFIG_KEYS = tuple(f.name for f in fields(DurotaxisConfig))


def leftmost_k(x: np.ndarray, alive: np.ndarray, k: np.ndarray) -> np.ndarray:
    """``[B, M]`` mask of the ``k[b]`` alive slots with the smallest x in each row (ties: lower slot first).

    O(M) per row: one ``np.partition`` finds each row's k-th smallest value v (kth is the list of distinct k, so
    one call serves rows with different k); then all slots below v are taken, and the slots equal to v fill the
    rest in slot order. A sort would be O(M log M).
    """
    x = np.where(alive, x, np.inf)
    k = np.minimum(np.asarray(k, np.int64), alive.sum(axis=1))
    chosen = np.zeros(x.shape, bool)
    rows = k > 0
    if not rows.any():
        return chosen
    xr, kr = x[rows], k[rows]
    kth = np.partition(xr, np.unique(kr - 1), axis=1)
    value = np.take_along_axis(kth, (kr - 1)[:, None], axis=1)
    below = xr < value
    tied = xr == value
    room = kr[:, None] - below.sum(axis=1, keepdims=True)
    chosen[rows] = below | (tied & (np.cumsum(tied, axis=1) <= room))
    return chosen


def _check_actions(cfg: DurotaxisConfig, spawn: Any, params: Any, ratio: Any, batch: tuple[int, ...]) -> tuple:
    """Validated copies (spawn int8, params float64 clipped to [-1, 1], ratio float64), or ``ValueError``."""
    m = cfg.max_nodes
    spawn, params, ratio = np.asarray(spawn), np.asarray(params), np.asarray(ratio)
    where = "Durotaxis"
    for name, value, shape in (("spawn", spawn, (*batch, m)), ("spawn_params", params, (*batch, m, 2)),
                               ("delete_ratio", ratio, (*batch, 1))):
        if value.shape != shape:
            raise ValueError(f"{where}: action `{name}` has shape {value.shape}, expected {shape}.")
    if not np.isin(spawn, (0, 1)).all():
        raise ValueError(f"{where}: action `spawn` must hold only 0 or 1.")
    if not np.issubdtype(params.dtype, np.number) or not np.isfinite(params).all():
        raise ValueError(f"{where}: action `spawn_params` holds NaN or infinite values; it must be finite "
                         "(values outside [-1, 1] are clipped).")
    if not np.issubdtype(ratio.dtype, np.number) or not (np.isfinite(ratio) & (ratio >= 0) & (ratio <= 1)).all():
        raise ValueError(f"{where}: action `delete_ratio` must be in [0, 1], got {ratio.ravel()[:8]}. Clip it "
                         "(RLlib does so with normalize_actions/clip_actions).")
    return spawn.astype(np.int8), np.clip(params.astype(np.float64), -1.0, 1.0), ratio[..., 0].astype(np.float64)


def _spawn_targets(cfg: DurotaxisConfig, pos: np.ndarray, params: np.ndarray) -> np.ndarray:
    angle = np.pi * params[..., 0]
    distance = cfg.spawn_min_distance + (params[..., 1] + 1.0) * 0.5 * (cfg.spawn_max_distance
                                                                        - cfg.spawn_min_distance)
    target = pos + distance[..., None] * np.stack([np.cos(angle), np.sin(angle)], axis=-1)
    return np.clip(target, 0.0, [cfg.width, cfg.height])


def _initial_positions(cfg: DurotaxisConfig, phase: np.ndarray) -> np.ndarray:
    """``[B, init_nodes, 2]`` starting positions on a circle, rotated by ``phase`` (uniform in [0, 1))."""
    angles = 2 * np.pi * (phase[:, None] + np.arange(cfg.init_nodes) / cfg.init_nodes)
    centre = np.array([cfg.start_x, cfg.height / 2])
    return centre + cfg.init_radius * np.stack([np.cos(angles), np.sin(angles)], axis=-1)


@functools.lru_cache(maxsize=8)
def _pairs(m: int) -> tuple[np.ndarray, np.ndarray]:
    """Slot pairs ``i < j`` in pair order."""
    return np.triu_indices(m, 1)


@functools.lru_cache(maxsize=8)
def _incidence(m: int) -> np.ndarray:
    """``[E, M]``: pair e touches slot s; a linked-pair mask times it gives every node's degree."""
    i, j = _pairs(m)
    incidence = np.zeros((len(i), m))
    incidence[np.arange(len(i)), i] = 1.0
    incidence[np.arange(len(i)), j] = 1.0
    return incidence


def _observe(cfg: DurotaxisConfig, pos: np.ndarray, alive: np.ndarray, age: np.ndarray,
             linked: np.ndarray) -> dict[str, np.ndarray]:
    """Observations of ``[B, M]`` graphs; ``linked`` is the ``[B, E]`` pair mask (alive and within reach)."""
    b, m = alive.shape
    live = alive.astype(np.float64)
    count = np.maximum(live.sum(axis=1, keepdims=True), 1.0)
    centroid = (pos * live[..., None]).sum(axis=1) / count  # [B, 2]
    i, j = _pairs(m)
    degree = linked @ _incidence(m)
    nodes = np.stack([pos[..., 0] / cfg.width, pos[..., 1] / cfg.height, cfg.stiffness(pos[..., 0]),
                      degree / (m - 1), (pos[..., 0] - centroid[:, :1]) / cfg.width,
                      (pos[..., 1] - centroid[:, 1:]) / cfg.height, age / cfg.max_steps], axis=-1)
    nodes *= live[..., None]
    # Compact the linked pairs to the front of each row, keeping pair order.
    edges = np.zeros((b, len(i), 2), np.int16)
    row, pair = np.nonzero(linked)
    slot = (np.cumsum(linked, axis=1) - 1)[row, pair]
    edges[row, slot, 0], edges[row, slot, 1] = i[pair], j[pair]
    edge_mask = np.arange(len(i)) < linked.sum(axis=1, keepdims=True)
    return {"nodes": nodes.astype(np.float32), "edges": edges, "node_mask": alive.astype(np.int8),
            "edge_mask": edge_mask.astype(np.int8)}


def _linked(cfg: DurotaxisConfig, pos: np.ndarray, alive: np.ndarray) -> np.ndarray:
    """``[B, E]``: both slots hold nodes and they are within ``link_radius``."""
    i, j = _pairs(alive.shape[1])
    gap = pos[:, i] - pos[:, j]
    return alive[:, i] & alive[:, j] & ((gap ** 2).sum(axis=-1) <= cfg.link_radius ** 2)


def _centroid_x(pos: np.ndarray, alive: np.ndarray, default: np.ndarray) -> np.ndarray:
    count = alive.sum(axis=-1)
    total = np.where(alive, pos[..., 0], 0.0).sum(axis=-1)
    return np.where(count > 0, total / np.maximum(count, 1), default)


class DurotaxisEnv(gym.Env):
    """One graph, written for clarity: the reference the vector env is tested against (see the module docstring)."""

    metadata = {"render_modes": []}
    config_keys = CONFIG_KEYS

    def __init__(self, **config: Any) -> None:
        self.cfg = cfg = DurotaxisConfig(**config)
        self.observation_space, self.action_space = cfg.observation_space, cfg.action_space
        m = cfg.max_nodes
        self._components_template = dict.fromkeys(REWARD_COMPONENTS, 0.0)
        self._key = counter_rng.key_from_seed(np.array([0]))
        self._draws = np.zeros(1, np.uint64)
        self.pos = np.zeros((m, 2))
        self.alive = np.zeros(m, bool)
        self.age = np.zeros(m, np.int64)
        self.steps = 0
        self._started = False

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        cfg = self.cfg
        if seed is not None:
            self._key, self._draws = counter_rng.key_from_seed(np.array([seed])), np.zeros(1, np.uint64)
        phase = counter_rng.uniform(self._key, self._draws)
        self._draws += np.uint64(1)
        self.pos[:] = 0.0
        self.alive[:] = False
        self.age[:] = 0
        self.pos[:cfg.init_nodes] = _initial_positions(cfg, phase)[0]
        self.alive[:cfg.init_nodes] = True
        self.steps = 0
        self._started = True
        return self._observation(), {}

    def step(self, action: dict) -> tuple[dict, float, bool, bool, dict]:
        if not self._started:
            raise RuntimeError("Durotaxis: call reset() before step().")
        if not isinstance(action, dict) or set(action) != {"spawn", "spawn_params", "delete_ratio"}:
            raise ValueError("Durotaxis: the action must be a dict with keys spawn, spawn_params, delete_ratio; "
                             f"got {type(action).__name__} {sorted(action) if isinstance(action, dict) else ''}.")
        cfg, m = self.cfg, self.cfg.max_nodes
        spawn, params, ratio = _check_actions(cfg, action["spawn"], action["spawn_params"], action["delete_ratio"],
                                              ())
        old_x = _centroid_x(self.pos, self.alive, np.float64(cfg.start_x))
        n = int(self.alive.sum())
        # Delete: the k leftmost nodes by a full sort (the vector env does it in O(n); the test pins they agree).
        k = int(np.floor(ratio * n))
        order = np.argsort(np.where(self.alive, self.pos[:, 0], np.inf), kind="stable")
        deleted = np.zeros(m, bool)
        deleted[order[:k]] = True
        self.alive &= ~deleted
        # Spawn from surviving requesters; adhesion holds with the stiffness at the target.
        targets = _spawn_targets(cfg, self.pos, params)
        draws = counter_rng.uniform(self._key, self._draws + np.arange(m, dtype=np.uint64))
        self._draws += np.uint64(m)
        holds = self.alive & (spawn == 1) & (draws < cfg.stiffness(targets[:, 0]))
        self.age[self.alive] += 1
        free = [s for s in range(m) if not self.alive[s]]
        placed = dropped = 0
        for parent in np.flatnonzero(holds):
            if placed == len(free):
                dropped += 1
                continue
            slot = free[placed]
            self.pos[slot], self.alive[slot], self.age[slot] = targets[parent], True, 0
            placed += 1
        self.steps += 1

        n = int(self.alive.sum())
        reached = False
        connected = self._connected()
        new_x = _centroid_x(self.pos, self.alive, old_x)
        components = self._components_template.copy()
        components["progress"] = cfg.progress_weight * float(new_x - old_x)
        components["node_count"] = -cfg.node_penalty * abs(n - cfg.target_nodes)
        components["spawn"] = -cfg.spawn_cost * placed
        components["delete"] = -cfg.delete_cost * k
        if n == 0:
            components["termination"] = -cfg.failure_penalty
        elif not connected:
            components["connectivity"] = -cfg.failure_penalty
        elif new_x >= cfg.goal_x:
            components["termination"] = cfg.goal_bonus
            reached = True
        terminated = n == 0 or not connected or reached
        truncated = not terminated and self.steps >= cfg.max_steps
        info = {"reward_components": components, "num_nodes": n, "centroid_x": float(new_x),
                "spawn_dropped": dropped}
        return self._observation(), float(sum(components.values())), terminated, truncated, info

    def _connected(self) -> bool:
        """Breadth-first search over the proximity graph from the first node."""
        live = np.flatnonzero(self.alive)
        if len(live) <= 1:
            return True
        gap = self.pos[live, None] - self.pos[None, live]
        adjacent = (gap ** 2).sum(axis=-1) <= self.cfg.link_radius ** 2
        reached = np.zeros(len(live), bool)
        frontier = [0]
        reached[0] = True
        while frontier:
            node = frontier.pop()
            for other in np.flatnonzero(adjacent[node] & ~reached):
                reached[other] = True
                frontier.append(other)
        return bool(reached.all())

    def _observation(self) -> dict[str, np.ndarray]:
        pos, alive = self.pos[None], self.alive[None]
        return {k: v[0] for k, v in _observe(self.cfg, pos, alive, self.age[None],
                                             _linked(self.cfg, pos, alive)).items()}


class DurotaxisVectorEnv(VectorEnv):
    """``num_envs`` graphs as ``[num_envs, max_nodes]`` arrays; dynamics identical to :class:`DurotaxisEnv`."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int = 1, **config: Any) -> None:
        check_int("Durotaxis", "num_envs", num_envs, 1)
        self.cfg = cfg = DurotaxisConfig(**config)
        self.num_envs = b = int(num_envs)
        m = cfg.max_nodes
        self.single_observation_space, self.single_action_space = cfg.observation_space, cfg.action_space
        self.observation_space = batch_space(self.single_observation_space, b)
        self.action_space = batch_space(self.single_action_space, b)
        self._keys: np.ndarray | None = None
        self._draws = np.zeros(b, np.uint64)
        self.pos = np.zeros((b, m, 2))
        self.alive = np.zeros((b, m), bool)
        self.age = np.zeros((b, m), np.int64)
        self.steps = np.zeros(b, np.int64)
        self._needs_reset = np.zeros(b, bool)
        self._components = np.zeros((len(REWARD_COMPONENTS), b))  # pre-allocated, one row per component
        self._slot_index = np.arange(m)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        super().reset(seed=seed)
        self._keys, reseeded = counter_rng.lane_keys(seed, self.num_envs, self.np_random, self._keys)
        if reseeded:
            self._draws[:] = 0
        self._start(np.ones(self.num_envs, bool))
        self._needs_reset[:] = False
        return self._observation(), {}

    def _start(self, lanes: np.ndarray) -> None:
        cfg = self.cfg
        phase = counter_rng.uniform(self._keys[lanes], self._draws[lanes])
        self._draws[lanes] += np.uint64(1)
        self.pos[lanes] = 0.0
        self.alive[lanes] = False
        self.age[lanes] = 0
        pos = self.pos[lanes]
        pos[:, :cfg.init_nodes] = _initial_positions(cfg, phase)
        self.pos[lanes] = pos
        self.alive[np.ix_(lanes, np.arange(cfg.init_nodes))] = True
        self.steps[lanes] = 0

    def step(self, actions: dict) -> tuple[dict, np.ndarray, np.ndarray, np.ndarray, dict]:
        if self._keys is None:
            raise RuntimeError("Durotaxis: call reset() before step().")
        if not isinstance(actions, dict) or set(actions) != {"spawn", "spawn_params", "delete_ratio"}:
            raise ValueError("Durotaxis: actions must be a dict with keys spawn, spawn_params, delete_ratio "
                             "(each batched over num_envs).")
        cfg, b, m = self.cfg, self.num_envs, self.cfg.max_nodes
        spawn, params, ratio = _check_actions(cfg, actions["spawn"], actions["spawn_params"],
                                              actions["delete_ratio"], (b,))
        resetting = self._needs_reset
        if resetting.any():
            self._start(resetting)
        act = ~resetting
        old_x = _centroid_x(self.pos, self.alive, np.full(b, cfg.start_x))
        n = self.alive.sum(axis=1)
        k = np.where(act, np.floor(ratio * n).astype(np.int64), 0)
        deleted = leftmost_k(self.pos[..., 0], self.alive, k)
        self.alive &= ~deleted
        targets = _spawn_targets(cfg, self.pos, params)
        draws = counter_rng.uniform(self._keys[:, None], self._draws[:, None] + self._slot_index.astype(np.uint64))
        self._draws[act] += np.uint64(m)
        holds = self.alive & (spawn == 1) & (draws < cfg.stiffness(targets[..., 0])) & act[:, None]
        self.age += self.alive & act[:, None]
        # The r-th holding parent of a row takes the row's r-th free slot (both in slot order), if there is one.
        free = ~self.alive
        parent_rank = np.cumsum(holds, axis=1) - 1
        num_free = free.sum(axis=1)
        placed_parent = holds & (parent_rank < num_free[:, None])
        row, parent = np.nonzero(placed_parent)
        free_order = np.argsort(~free, axis=1, kind="stable")  # free slots first, in slot order
        slot = free_order[row, parent_rank[row, parent]]
        self.pos[row, slot] = targets[row, parent]
        self.alive[row, slot] = True
        self.age[row, slot] = 0
        placed = placed_parent.sum(axis=1)
        dropped = holds.sum(axis=1) - placed
        self.steps += act

        n = self.alive.sum(axis=1)
        linked = _linked(cfg, self.pos, self.alive)
        connected = self._connected(linked)
        new_x = _centroid_x(self.pos, self.alive, old_x)
        empty = n == 0
        broken = ~empty & ~connected
        reached = ~empty & connected & (new_x >= cfg.goal_x)
        c = self._components
        c[0] = cfg.progress_weight * (new_x - old_x)
        c[1] = np.where(broken, -cfg.failure_penalty, 0.0)
        c[2] = -cfg.node_penalty * np.abs(n - cfg.target_nodes)
        c[3] = -cfg.spawn_cost * placed
        c[4] = -cfg.delete_cost * k
        c[5] = np.where(empty, -cfg.failure_penalty, np.where(reached, cfg.goal_bonus, 0.0))
        c *= act  # reset steps are not transitions
        terminated = act & (empty | broken | reached)
        truncated = act & ~terminated & (self.steps >= cfg.max_steps)
        self._needs_reset = terminated | truncated
        components = c.copy()
        info = {"reward_components": dict(zip(REWARD_COMPONENTS, components)), "num_nodes": n,
                "centroid_x": new_x, "spawn_dropped": dropped}
        rewards = components.sum(axis=0).astype(np.float32)
        return self._observation(linked), rewards, terminated, truncated, info

    def _connected(self, linked: np.ndarray) -> np.ndarray:
        """``[B]``: each graph is one component. Label propagation: every node takes the smallest label among
        itself and its neighbours until nothing changes (at most ``max_nodes`` rounds, usually the diameter)."""
        b, m = self.alive.shape
        i, j = _pairs(m)
        adjacent = np.zeros((b, m, m), bool)
        adjacent[:, i, j] = linked
        adjacent[:, j, i] = linked
        adjacent[:, self._slot_index, self._slot_index] = self.alive
        big = m
        label = np.where(self.alive, self._slot_index, big)
        for _ in range(m):
            new = np.where(adjacent, label[:, None, :], big).min(axis=2)
            new = np.where(self.alive, new, big)
            if np.array_equal(new, label):
                break
            label = new
        first = label.min(axis=1, keepdims=True)
        return ((label == first) | ~self.alive).all(axis=1)

    def _observation(self, linked: np.ndarray | None = None) -> dict[str, np.ndarray]:
        if linked is None:
            linked = _linked(self.cfg, self.pos, self.alive)
        return _observe(self.cfg, self.pos, self.alive, self.age, linked)
