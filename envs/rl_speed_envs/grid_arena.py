"""Grid arena: a MettaGrid-style multi-agent gridworld, as a per-map reference and a native batched vector env.

A walled ``height x width`` map holds interior walls, mines (ore sources that regenerate), converters (ore into
hearts) and ``num_agents`` agents, each with a position, an orientation, an ore inventory and a heart count.

Actions (``Discrete(7)``), taken by agents in index order within a step, each acting on the cell it faces:

| id | action | effect |
|---|---|---|
| 0 | noop | |
| 1 | move | step forward if the cell is empty (no wall, mine, converter or agent) |
| 2 / 3 | rotate left / right | turn 90 degrees |
| 4 | pick up | harvest one ore from a ready mine (if the inventory holds less than ``ore_capacity``); the mine then regenerates for ``regen_steps`` steps. Reward ``ore_reward`` |
| 5 | use | put ``ore_per_heart`` ore into a converter and get one heart. Reward ``heart_reward`` |
| 6 | attack | freeze the agent in front (if not frozen) for ``freeze_steps`` of its turns and take one ore from it |

A frozen agent's actions are ignored. Episodes end by truncation after ``max_steps``; nothing terminates them.

Observation of each agent: an egocentric ``view x view`` window centred on it (not rotated; cells outside the map
read as walls) of 5 uint8 planes: wall, ready mine, converter, agent (orientation + 1, itself included at the
centre), and own ore count (at the centre only). ``observation="planes"`` gives ``[5, view, view]`` uint8,
``"flat"`` the same values as a float32 vector (for RLlib's default MLP encoders, which reject uint8).

Two forms with identical dynamics (a lockstep test pins it):

* :class:`GridArena`: one map, plain Python per agent (the reference; RLlib's ``MultiAgentEnv`` form in
  ``rl_speed.multi_agent`` wraps it).
* :class:`GridArenaVectorEnv`: ``num_envs`` lanes = maps x agents, agents flattened into the batch dimension (lane
  ``m * num_agents + a`` is agent ``a`` of map ``m``). One step runs a loop over the agent index (the action order)
  whose body is array operations over all maps, so its cost grows with ``num_agents``, not with the number of maps.
  NEXT_STEP autoreset per map.

Map ``i`` of ``GridArenaVectorEnv.reset(seed=s)`` gets the layouts of ``GridArena.reset(seed=s + i)``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rl_speed_envs import counter_rng
from rl_speed_envs.checks import check_int

EMPTY, WALL, MINE, CONVERTER = 0, 1, 2, 3
NOOP, MOVE, ROTATE_LEFT, ROTATE_RIGHT, PICK_UP, USE, ATTACK = range(7)
NUM_ACTIONS = 7
NUM_PLANES = 5
_DY = np.array([-1, 0, 1, 0], dtype=np.int64)  # orientation 0 up, 1 right, 2 down, 3 left
_DX = np.array([0, 1, 0, -1], dtype=np.int64)
_DY_LIST, _DX_LIST = _DY.tolist(), _DX.tolist()
OBSERVATIONS = ("flat", "planes")


@dataclass(frozen=True)
class GridArenaConfig:
    """Validated settings; both forms build one, so bad input fails the same way everywhere."""

    height: int = 25
    width: int = 25
    num_agents: int = 24
    num_mines: int = 16
    num_converters: int = 6
    wall_density: float = 0.06
    view: int = 11
    max_steps: int = 256
    regen_steps: int = 16
    ore_capacity: int = 4
    ore_per_heart: int = 2
    ore_reward: float = 0.1
    heart_reward: float = 1.0
    freeze_steps: int = 4
    observation: str = "flat"

    def __post_init__(self) -> None:
        ints = {"height": (5, 256), "width": (5, 256), "num_agents": (1, 1024), "num_mines": (0, 10**6),
                "num_converters": (0, 10**6), "view": (3, 63), "max_steps": (1, 10**7), "regen_steps": (0, 10**6),
                "ore_capacity": (1, 255), "ore_per_heart": (1, 255), "freeze_steps": (0, 10**6)}
        for name, (low, high) in ints.items():
            check_int("GridArena", name, getattr(self, name), low, high)
        if self.view % 2 == 0:
            raise ValueError(f"GridArena: `view`={self.view} must be odd (the agent sits at the centre).")
        if not isinstance(self.wall_density, (int, float)) or not 0 <= self.wall_density < 1:
            raise ValueError(f"GridArena: `wall_density`={self.wall_density!r} must be a number in [0, 1).")
        for name in ("ore_reward", "heart_reward"):
            if not isinstance(getattr(self, name), (int, float)):
                raise ValueError(f"GridArena: `{name}`={getattr(self, name)!r} must be a number.")
        if self.observation not in OBSERVATIONS:
            raise ValueError(f"GridArena: `observation`={self.observation!r} is invalid; use one of "
                             f"{', '.join(OBSERVATIONS)}.")
        needed = self.num_walls + self.num_mines + self.num_converters + self.num_agents
        if needed > self.interior:
            raise ValueError(
                f"GridArena: {self.num_agents} agents, {self.num_mines} mines, {self.num_converters} converters and "
                f"{self.num_walls} walls need {needed} cells but the {self.height}x{self.width} map has "
                f"{self.interior} inside its border; enlarge the map or lower the counts / `wall_density`.")

    @property
    def interior(self) -> int:
        return (self.height - 2) * (self.width - 2)

    @property
    def num_walls(self) -> int:
        return int(round(self.wall_density * self.interior))

    @property
    def observation_space(self) -> spaces.Space:
        shape = (NUM_PLANES, self.view, self.view)
        if self.observation == "planes":
            return spaces.Box(0, 255, shape, np.uint8)
        return spaces.Box(0.0, 255.0, (int(np.prod(shape)),), np.float32)


CONFIG_KEYS = tuple(f.name for f in fields(GridArenaConfig))


def generate_layout(cfg: GridArenaConfig, key: np.uint64, episode: int) -> dict[str, np.ndarray]:
    """The map of episode ``episode`` of the stream ``key``: objects ``[H, W]``, agent cells and orientations."""
    stream = np.array([key], np.uint64) + np.array([episode], np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    seed = int(counter_rng.splitmix64(stream)[0])
    rng = np.random.default_rng(seed)
    h, w = cfg.height, cfg.width
    objects = np.full((h, w), WALL, dtype=np.int8)
    objects[1:-1, 1:-1] = EMPTY
    cells = rng.permutation(cfg.interior)
    ys, xs = cells // (w - 2) + 1, cells % (w - 2) + 1
    counts = [cfg.num_walls, cfg.num_mines, cfg.num_converters]
    start = 0
    for kind, count in zip((WALL, MINE, CONVERTER), counts):
        objects[ys[start:start + count], xs[start:start + count]] = kind
        start += count
    agents = slice(start, start + cfg.num_agents)
    return {"objects": objects, "y": ys[agents].astype(np.int64), "x": xs[agents].astype(np.int64),
            "orientation": rng.integers(0, 4, cfg.num_agents).astype(np.int64)}


class GridArena:
    """One map, stepped agent by agent in plain Python: the reference the batched form is tested against.

    ``reset(seed)`` and ``step(actions)`` take and return per-agent arrays: observations ``[A, ...]``, rewards
    ``[A]``, and one ``terminated`` / ``truncated`` flag for the map. No autoreset: call ``reset`` after an end.
    """

    def __init__(self, **config: Any) -> None:
        self.cfg = cfg = GridArenaConfig(**config)
        self.observation_space = cfg.observation_space
        self.action_space = spaces.Discrete(NUM_ACTIONS)
        self._key = counter_rng.key_from_seed(np.array([0]))[0]
        self._episode = -1
        self.objects = np.zeros((cfg.height, cfg.width), np.int8)
        self.cooldown = np.zeros((cfg.height, cfg.width), np.int64)
        self.y = self.x = self.orientation = np.zeros(cfg.num_agents, np.int64)
        self.ore = np.zeros(cfg.num_agents, np.int64)
        self.hearts = np.zeros(cfg.num_agents, np.int64)
        self.frozen = np.zeros(cfg.num_agents, np.int64)
        self.steps = 0
        self.ore_harvested = 0  # lifetime of this episode; conservation: harvested == held + hearts * ore_per_heart
        r = cfg.view // 2
        self._planes = np.zeros((NUM_PLANES, cfg.height + 2 * r, cfg.width + 2 * r), np.uint8)
        self._planes[0] = 1  # outside the map reads as wall
        self._windows = np.lib.stride_tricks.sliding_window_view(self._planes, (cfg.view, cfg.view), axis=(1, 2))

    def reset(self, seed: int | None = None) -> np.ndarray:
        if seed is not None:
            self._key, self._episode = counter_rng.key_from_seed(np.array([seed]))[0], -1
        self._episode += 1
        layout = generate_layout(self.cfg, self._key, self._episode)
        self.objects = layout["objects"]
        self.y, self.x, self.orientation = layout["y"].copy(), layout["x"].copy(), layout["orientation"].copy()
        self.cooldown = np.zeros_like(self.objects, dtype=np.int64)
        for array in (self.ore, self.hearts, self.frozen):
            array[:] = 0
        self.steps = self.ore_harvested = 0
        return self.observe()

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, bool, bool]:
        cfg = self.cfg
        actions = _check_actions(actions, cfg.num_agents).tolist()
        # The agent loop runs on Python lists (numpy scalar reads and writes cost several times more); the arrays are
        # written back after it.
        y, x, orientation = self.y.tolist(), self.x.tolist(), self.orientation.tolist()
        ore, hearts, frozen = self.ore.tolist(), self.hearts.tolist(), self.frozen.tolist()
        objects, cooldown = self.objects, self.cooldown
        rewards = [0.0] * cfg.num_agents
        occupant = {(y[a], x[a]): a for a in range(cfg.num_agents)}
        for a in range(cfg.num_agents):
            if frozen[a] > 0:
                frozen[a] -= 1
                continue
            act, o = actions[a], orientation[a]
            ty, tx = y[a] + _DY_LIST[o], x[a] + _DX_LIST[o]
            target = int(objects[ty, tx])
            if act == ROTATE_LEFT:
                orientation[a] = (o + 3) % 4
            elif act == ROTATE_RIGHT:
                orientation[a] = (o + 1) % 4
            elif act == MOVE and target == EMPTY and (ty, tx) not in occupant:
                del occupant[(y[a], x[a])]
                occupant[(ty, tx)] = a
                y[a], x[a] = ty, tx
            elif act == PICK_UP and target == MINE and cooldown[ty, tx] == 0 and ore[a] < cfg.ore_capacity:
                ore[a] += 1
                self.ore_harvested += 1
                cooldown[ty, tx] = cfg.regen_steps
                rewards[a] += cfg.ore_reward
            elif act == USE and target == CONVERTER and ore[a] >= cfg.ore_per_heart:
                ore[a] -= cfg.ore_per_heart
                hearts[a] += 1
                rewards[a] += cfg.heart_reward
            elif act == ATTACK and (ty, tx) in occupant:
                b = occupant[(ty, tx)]
                if frozen[b] == 0:
                    frozen[b] = cfg.freeze_steps
                    if ore[b] > 0 and ore[a] < cfg.ore_capacity:
                        ore[b] -= 1
                        ore[a] += 1
        self.y, self.x, self.orientation = np.array(y), np.array(x), np.array(orientation)
        self.ore, self.hearts, self.frozen = np.array(ore), np.array(hearts), np.array(frozen)
        np.subtract(self.cooldown, 1, out=self.cooldown, where=self.cooldown > 0)
        self.steps += 1
        return self.observe(), np.array(rewards, np.float32), False, self.steps >= cfg.max_steps

    def observe(self) -> np.ndarray:
        cfg, r = self.cfg, self.cfg.view // 2
        inner = self._planes[:, r:r + cfg.height, r:r + cfg.width]  # the border keeps reading as wall
        inner[0] = self.objects == WALL
        inner[1] = (self.objects == MINE) & (self.cooldown == 0)
        inner[2] = self.objects == CONVERTER
        inner[3] = 0
        inner[3, self.y, self.x] = self.orientation + 1
        views = self._windows[:, self.y, self.x].transpose(1, 0, 2, 3)  # [A, planes, view, view], one gather
        views[:, 4, r, r] = np.minimum(self.ore, 255)
        return _encode(cfg, views)


class GridArenaVectorEnv(VectorEnv):
    """Maps x agents as lanes, stepped with array operations over maps (see the module docstring)."""

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(self, num_envs: int | None = None, **config: Any) -> None:
        self.cfg = cfg = GridArenaConfig(**config)
        a = cfg.num_agents
        num_envs = a if num_envs is None else num_envs
        if not isinstance(num_envs, (int, np.integer)) or num_envs < a or num_envs % a:
            raise ValueError(f"GridArena: `num_envs`={num_envs!r} counts agent lanes and must be a positive "
                             f"multiple of num_agents={a} (maps x agents); e.g. num_envs_per_env_runner={4 * a}.")
        self.num_envs = int(num_envs)
        self.num_maps = m = self.num_envs // a
        self.single_observation_space = cfg.observation_space
        self.single_action_space = spaces.Discrete(NUM_ACTIONS)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._maps = np.arange(m)
        self.objects = np.zeros((m, cfg.height, cfg.width), np.int8)
        self.cooldown = np.zeros((m, cfg.height, cfg.width), np.int64)
        self.occupant = np.zeros((m, cfg.height, cfg.width), np.int64)  # agent index + 1, 0 = none
        self.y, self.x, self.orientation, self.ore, self.hearts, self.frozen = (
            np.zeros((m, a), np.int64) for _ in range(6))
        self.steps = np.zeros(m, np.int64)
        self.ore_harvested = np.zeros(m, np.int64)
        self._needs_reset = np.zeros(m, bool)
        self._keys: np.ndarray | None = None
        self._episodes = np.zeros(m, np.int64)
        r = cfg.view // 2
        self._planes = np.zeros((m, 4, cfg.height + 2 * r, cfg.width + 2 * r), np.uint8)
        self._planes[:, 0] = 1  # outside the map reads as wall

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed if isinstance(seed, (int, type(None))) else None)
        if seed is not None:
            seeds = seed + self._maps if isinstance(seed, (int, np.integer)) else np.asarray(seed)
            if seeds.shape != (self.num_maps,):
                raise ValueError(f"GridArena: reset(seed=...) needs one int or {self.num_maps} ints (one per map), "
                                 f"got {seed!r}.")
            self._keys = counter_rng.key_from_seed(seeds)
            self._episodes[:] = -1
        elif self._keys is None:
            self._keys = self.np_random.integers(0, 2**63, size=self.num_maps).astype(np.uint64)
            self._episodes[:] = -1
        self._reset_maps(np.ones(self.num_maps, bool))
        return self._observe(), {}

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        if self._keys is None:
            raise RuntimeError("GridArena: call reset() before step().")
        cfg = self.cfg
        actions = _check_actions(actions, self.num_envs).reshape(self.num_maps, cfg.num_agents)
        active = ~self._needs_reset
        if not active.all():
            self._reset_maps(~active)
        rewards = np.zeros((self.num_maps, cfg.num_agents), np.float32)
        maps = self._maps
        for a in range(cfg.num_agents):  # the action order; the body is vectorized over maps
            act = actions[:, a]
            frozen = self.frozen[:, a] > 0
            self.frozen[:, a] -= active & frozen
            acting = active & ~frozen
            o = self.orientation[:, a]
            y, x = self.y[:, a], self.x[:, a]
            ty, tx = y + _DY[o], x + _DX[o]  # in bounds: agents never stand on the border walls
            target = self.objects[maps, ty, tx]
            in_front = self.occupant[maps, ty, tx]
            self.orientation[:, a] = np.where(acting & (act == ROTATE_LEFT), (o + 3) % 4,
                                              np.where(acting & (act == ROTATE_RIGHT), (o + 1) % 4, o))
            move = acting & (act == MOVE) & (target == EMPTY) & (in_front == 0)
            if move.any():
                mm = maps[move]
                self.occupant[mm, y[move], x[move]] = 0
                self.occupant[mm, ty[move], tx[move]] = a + 1
                self.y[move, a], self.x[move, a] = ty[move], tx[move]
            pick = (acting & (act == PICK_UP) & (target == MINE) & (self.cooldown[maps, ty, tx] == 0)
                    & (self.ore[:, a] < cfg.ore_capacity))
            if pick.any():
                self.ore[:, a] += pick
                self.ore_harvested += pick
                self.cooldown[maps[pick], ty[pick], tx[pick]] = cfg.regen_steps
                rewards[:, a] += pick * np.float32(cfg.ore_reward)
            use = acting & (act == USE) & (target == CONVERTER) & (self.ore[:, a] >= cfg.ore_per_heart)
            if use.any():
                self.ore[:, a] -= use * cfg.ore_per_heart
                self.hearts[:, a] += use
                rewards[:, a] += use * np.float32(cfg.heart_reward)
            attack = acting & (act == ATTACK) & (in_front > 0)
            if attack.any():
                victim = np.maximum(in_front - 1, 0)
                attack &= self.frozen[maps, victim] == 0
                mm, vv = maps[attack], victim[attack]
                self.frozen[mm, vv] = cfg.freeze_steps
                steal = attack & (self.ore[maps, victim] > 0) & (self.ore[:, a] < cfg.ore_capacity)
                self.ore[maps[steal], victim[steal]] -= 1
                self.ore[steal, a] += 1
        cooling = (self.cooldown > 0) & active[:, None, None]
        np.subtract(self.cooldown, 1, out=self.cooldown, where=cooling)
        self.steps += active
        truncated = active & (self.steps >= cfg.max_steps)
        self._needs_reset = truncated
        lanes = np.repeat(truncated, cfg.num_agents)
        return self._observe(), rewards.reshape(-1), np.zeros(self.num_envs, bool), lanes, {}

    def _reset_maps(self, mask: np.ndarray) -> None:
        self._episodes[mask] += 1
        for m in np.flatnonzero(mask):  # once per episode per map: a Python loop here costs nothing per step
            layout = generate_layout(self.cfg, self._keys[m], int(self._episodes[m]))
            self.objects[m] = layout["objects"]
            self.y[m], self.x[m], self.orientation[m] = layout["y"], layout["x"], layout["orientation"]
            self.occupant[m] = 0
            self.occupant[m, layout["y"], layout["x"]] = np.arange(1, self.cfg.num_agents + 1)
        for array in (self.cooldown, self.ore, self.hearts, self.frozen):
            array[mask] = 0
        self.steps[mask] = 0
        self.ore_harvested[mask] = 0
        self._needs_reset[mask] = False

    def _observe(self) -> Any:
        cfg, r, v = self.cfg, self.cfg.view // 2, self.cfg.view
        inner = self._planes[:, :, r:r + cfg.height, r:r + cfg.width]
        inner[:, 0] = self.objects == WALL
        inner[:, 1] = (self.objects == MINE) & (self.cooldown == 0)
        inner[:, 2] = self.objects == CONVERTER
        inner[:, 3] = 0
        inner[self._maps[:, None], 3, self.y, self.x] = self.orientation + 1
        # Channel-first planes, so each agent's window is one strided [4, v, v] block: [M, 4, H, W, v, v] view.
        windows = np.lib.stride_tricks.sliding_window_view(self._planes, (v, v), axis=(2, 3))
        views = np.empty((self.num_maps, cfg.num_agents, NUM_PLANES, v, v), np.uint8)
        views[:, :, :4] = windows[self._maps[:, None], :, self.y, self.x]
        views[:, :, 4] = 0
        views[:, :, 4, r, r] = np.minimum(self.ore, 255)
        return _encode(cfg, views.reshape(self.num_envs, NUM_PLANES, v, v))


def _encode(cfg: GridArenaConfig, views: np.ndarray) -> np.ndarray:
    if cfg.observation == "planes":
        return views
    return views.reshape(len(views), -1).astype(np.float32)


def _check_actions(actions: Any, count: int) -> np.ndarray:
    actions = np.asarray(actions)
    if actions.shape != (count,) or not np.issubdtype(actions.dtype, np.integer):
        raise ValueError(f"GridArena: step() needs {count} integer actions (one per agent lane), got shape "
                         f"{actions.shape} dtype {actions.dtype}.")
    if ((actions < 0) | (actions >= NUM_ACTIONS)).any():
        raise ValueError(f"GridArena: actions must be in 0..{NUM_ACTIONS - 1} (noop, move, rotate left, rotate "
                         f"right, pick up, use, attack), got values {np.unique(actions[(actions < 0) | (actions >= NUM_ACTIONS)])}.")
    return actions
