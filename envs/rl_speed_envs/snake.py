"""Snake: a scalar ``gymnasium.Env`` and a native ``gymnasium.vector.VectorEnv`` with identical dynamics.

The scalar env keeps the body as a deque of cells (the plain reference). The vector env keeps, for every board, a
grid of "steps until this cell is vacated" counters: moving decrements every counter at once and writes the new head,
so N boards step with a handful of array operations and no per-board Python loop. Both draw food positions from the
same counter-based stream (:mod:`rl_speed_envs.counter_rng`), so under the same seeds they agree step for step.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rl_speed_envs import counter_rng

# Absolute directions: 0 up, 1 right, 2 down, 3 left.
_DY = np.array([-1, 0, 1, 0], dtype=np.int64)
_DX = np.array([0, 1, 0, -1], dtype=np.int64)
# Grid codes of the "grid" observation.
EMPTY, FOOD, BODY, HEAD_UP = 0, 1, 2, 3  # the head is HEAD_UP + heading (3..6)
_INITIAL_LENGTH = 3
OBSERVATIONS = ("grid", "flat")


@dataclass(frozen=True)
class SnakeConfig:
    """Validated Snake settings; every env form builds one so bad input fails the same way everywhere."""

    height: int = 10
    width: int = 10
    max_steps_without_food: int = 100
    observation: str = "grid"
    flood_fill: bool = False

    def __post_init__(self) -> None:
        for name in ("height", "width"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or not 4 <= value <= 64:
                raise ValueError(f"Snake: `{name}`={value!r} is invalid; use an integer from 4 to 64.")
        steps = self.max_steps_without_food
        if not isinstance(steps, (int, np.integer)) or steps < 1:
            raise ValueError(f"Snake: `max_steps_without_food`={steps!r} is invalid; use an integer >= 1.")
        if self.observation not in OBSERVATIONS:
            raise ValueError(
                f"Snake: `observation`={self.observation!r} is invalid; use one of {', '.join(OBSERVATIONS)}."
            )
        if not isinstance(self.flood_fill, (bool, np.bool_)):
            raise ValueError(f"Snake: `flood_fill`={self.flood_fill!r} is invalid; use true or false.")

    @property
    def num_cells(self) -> int:
        return self.height * self.width


def observation_space(cfg: SnakeConfig) -> spaces.Space:
    """The single-board observation space for a config (see the Observation Space table in :class:`SnakeEnv`)."""
    h, w = cfg.height, cfg.width
    if cfg.observation == "grid":
        grid = spaces.Box(0, HEAD_UP + 3, (h, w), np.uint8)
        if not cfg.flood_fill:
            return grid
        return spaces.Dict({"grid": grid, "reachable": spaces.Box(0.0, 1.0, (3,), np.float32)})
    size = 3 * h * w + 4 + (3 if cfg.flood_fill else 0)
    return spaces.Box(0.0, 1.0, (size,), np.float32)


def encode(cfg: SnakeConfig, grid: np.ndarray, reachable: np.ndarray | None) -> Any:
    """Turns ``[N, H, W]`` uint8 grids (and ``[N, 3]`` reachable fractions) into a batch of observations."""
    if cfg.observation == "grid":
        return grid if reachable is None else {"grid": grid, "reachable": reachable}
    n = grid.shape[0]
    flat = grid.reshape(n, -1)  # [N, H, W] -> [N, H*W]
    parts = [flat == FOOD, flat == BODY, flat >= HEAD_UP]
    heading = flat.max(axis=1).astype(np.int64) - HEAD_UP  # the head is the largest code on the board
    parts.append(np.eye(4, dtype=bool)[heading])
    if reachable is not None:
        parts.append(reachable)
    return np.concatenate(parts, axis=1, dtype=np.float32)


def reachable_fractions(free: np.ndarray, head_y: np.ndarray, head_x: np.ndarray, heading: np.ndarray) -> np.ndarray:
    """Flood-fill features for N boards at once: ``[N, 3]`` float32, columns straight / left / right.

    Entry ``k`` is the number of free cells reachable from the cell next to the head in relative direction ``k``
    (0 if that cell is a wall or body), divided by the number of free cells on the board. Each board row is a
    64-bit mask, so one flood-fill iteration for all boards and all three seeds is a few shifts over ``[N, 3, H]``.

    Args:
        free: ``[N, H, W]`` bool, True where a cell is empty or holds food.
        head_y, head_x, heading: ``[N]`` ints.
    """
    n, h, w = free.shape
    bit = np.left_shift(np.uint64(1), np.arange(w, dtype=np.uint64))  # [W]
    free_rows = (free * bit).sum(axis=2, dtype=np.uint64)  # [N, H, W] -> [N, H] row masks
    directions = (heading[:, None] + np.array([0, 3, 1])) % 4  # [N, 3]: straight, left, right
    ty = head_y[:, None] + _DY[directions]
    tx = head_x[:, None] + _DX[directions]
    inside = (ty >= 0) & (ty < h) & (tx >= 0) & (tx < w)
    ty_c, tx_c = np.clip(ty, 0, h - 1), np.clip(tx, 0, w - 1)
    rows = np.arange(n)[:, None]
    start = inside & free[rows, ty_c, tx_c]  # [N, 3]
    reach = np.zeros((n, 3, h), dtype=np.uint64)
    reach[rows, np.arange(3)[None, :], ty_c] = np.where(start, bit[tx_c], np.uint64(0))
    allowed = free_rows[:, None, :]  # [N, 1, H]
    one = np.uint64(1)
    while True:
        grown = reach | (reach << one) | (reach >> one)
        grown[:, :, 1:] |= reach[:, :, :-1]
        grown[:, :, :-1] |= reach[:, :, 1:]
        grown &= allowed
        if np.array_equal(grown, reach):
            break
        reach = grown
    counts = np.bitwise_count(reach).sum(axis=2)  # [N, 3]
    total = np.bitwise_count(free_rows).sum(axis=1)[:, None]  # [N, 1]
    return (counts / np.maximum(total, 1)).astype(np.float32)


class SnakeEnv(gym.Env):
    """The classic game of Snake on an ``H x W`` board.

    ## Description
    The snake starts with length 3 in the middle of the board, heading right. Each step it moves one cell in the
    chosen direction; eating the food makes it one cell longer and a new food appears on a uniformly random free cell.
    Moving into a wall or into its own body (the tail's cell is free, since the tail moves away) ends the game.
    :class:`SnakeVectorEnv` steps many boards with identical dynamics.

    ## Action Space
    ``Discrete(4)``: 0 up, 1 right, 2 down, 3 left. The action opposite to the current heading is ignored (the snake
    keeps going straight), as in the arcade game.

    ## Observation Space
    | observation | flood_fill | space | dtype | content |
    |---|---|---|---|---|
    | ``"grid"`` | off | ``Box(0, 6, (H, W))`` | uint8 | 0 empty, 1 food, 2 body, 3 + heading for the head |
    | ``"grid"`` | on | ``Dict(grid=..., reachable=Box(0, 1, (3,)))`` | uint8 / float32 | grid as above, and the fractions below |
    | ``"flat"`` | off | ``Box(0, 1, (3*H*W + 4,))`` | float32 | food, body and head planes, heading one-hot |
    | ``"flat"`` | on | ``Box(0, 1, (3*H*W + 7,))`` | float32 | as above, then the three reachable fractions |

    The reachable fractions are the free cells reachable (4-neighbour flood fill) after moving straight, left or right
    relative to the heading, divided by all free cells; 0 where that move hits a wall or the body.

    ## Rewards
    +1 for eating food, -1 for dying, 0 otherwise.

    ## Starting State
    Body at ``(H//2, W//2 - 2 .. W//2)``, heading right, food on a random free cell.

    ## Episode End
    Terminated on death, or when the snake fills the board (after the +1 of the last food). Truncated after
    ``max_steps_without_food`` consecutive steps without eating.

    ## Arguments
    ``height``, ``width`` (4..64, default 10), ``max_steps_without_food`` (default 100), ``observation``
    (``"grid"`` or ``"flat"``), ``flood_fill`` (bool), ``render_mode`` (None or ``"ansi"``).
    ``gym.make("rl_speed/Snake-v0", height=8)`` after ``rl_speed_envs.register_gymnasium()``.

    ## Version History
    * v0: initial version.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 10}

    def __init__(
        self,
        height: int = 10,
        width: int = 10,
        max_steps_without_food: int = 100,
        observation: str = "grid",
        flood_fill: bool = False,
        render_mode: str | None = None,
    ) -> None:
        self.cfg = SnakeConfig(height, width, max_steps_without_food, observation, flood_fill)
        if render_mode not in (None, "ansi"):
            raise ValueError(f"Snake: `render_mode`={render_mode!r} is invalid; use None or 'ansi'.")
        self.render_mode = render_mode
        self.observation_space = observation_space(self.cfg)
        self.action_space = spaces.Discrete(4)
        self._key: np.ndarray | None = None  # [1] uint64 stream key
        self._draws = np.zeros(1, dtype=np.uint64)
        self._body: deque[tuple[int, int]] = deque()  # tail ... head
        self._heading = 1
        self._food = (0, 0)
        self._steps_without_food = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self._key, self._draws = counter_rng.key_from_seed([seed]), np.zeros(1, dtype=np.uint64)
        elif self._key is None:
            self._key = self.np_random.integers(0, 2**63, size=1).astype(np.uint64)
        cy, cx = self.cfg.height // 2, self.cfg.width // 2
        self._body = deque((cy, cx - k) for k in range(_INITIAL_LENGTH - 1, -1, -1))
        self._heading = 1
        self._steps_without_food = 0
        self._place_food()
        return self._observe(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if self._key is None:
            raise RuntimeError("Snake: call reset() before step().")
        if not self.action_space.contains(action):
            raise ValueError(f"Snake: action {action!r} is not in Discrete(4); use 0 up, 1 right, 2 down, 3 left.")
        action = int(action)
        if action != (self._heading + 2) % 4:
            self._heading = action
        hy, hx = self._body[-1]
        ny, nx = hy + int(_DY[self._heading]), hx + int(_DX[self._heading])
        ate = (ny, nx) == self._food
        blocked = list(self._body) if ate else list(self._body)[1:]  # the tail moves away unless we grow
        if not (0 <= ny < self.cfg.height and 0 <= nx < self.cfg.width) or (ny, nx) in blocked:
            return self._observe(), -1.0, True, False, {}
        self._body.append((ny, nx))
        if not ate:
            self._body.popleft()
            self._steps_without_food += 1
            truncated = self._steps_without_food >= self.cfg.max_steps_without_food
            return self._observe(), 0.0, False, truncated, {}
        self._steps_without_food = 0
        won = len(self._body) == self.cfg.num_cells
        if not won:
            self._place_food()
        return self._observe(), 1.0, won, False, {}

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        chars = np.array(list(".*o^>v<"))
        return "\n".join("".join(row) for row in chars[self._grid()]) + "\n"

    def _place_food(self) -> None:
        taken = set(self._body)
        free = [(y, x) for y in range(self.cfg.height) for x in range(self.cfg.width) if (y, x) not in taken]
        u = counter_rng.uniform(self._key, self._draws)[0]
        self._draws += np.uint64(1)
        self._food = free[int(u * len(free))]

    def _grid(self) -> np.ndarray:
        grid = np.zeros((self.cfg.height, self.cfg.width), dtype=np.uint8)
        for y, x in self._body:
            grid[y, x] = BODY
        grid[self._food] = FOOD
        grid[self._body[-1]] = HEAD_UP + self._heading
        return grid

    def _observe(self) -> Any:
        grid = self._grid()[None]  # [1, H, W]
        reachable = None
        if self.cfg.flood_fill:
            hy, hx = self._body[-1]
            reachable = reachable_fractions(
                (grid == EMPTY) | (grid == FOOD), np.array([hy]), np.array([hx]), np.array([self._heading])
            )
        batch = encode(self.cfg, grid, reachable)
        return {k: v[0] for k, v in batch.items()} if isinstance(batch, dict) else batch[0]


class SnakeVectorEnv(VectorEnv):
    """``num_envs`` Snake boards stepped together with array operations; dynamics identical to :class:`SnakeEnv`.

    Autoreset follows gymnasium's NEXT_STEP mode (what RLlib's ``vector_entry_point`` expects): the step after a
    board's episode ends ignores that board's action, resets it and returns its first observation with reward 0.
    ``reset(seed=s)`` seeds board ``i`` like ``SnakeEnv().reset(seed=s + i)``.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": []}

    def __init__(
        self,
        num_envs: int = 1,
        height: int = 10,
        width: int = 10,
        max_steps_without_food: int = 100,
        observation: str = "grid",
        flood_fill: bool = False,
    ) -> None:
        if not isinstance(num_envs, (int, np.integer)) or num_envs < 1:
            raise ValueError(f"Snake: `num_envs`={num_envs!r} is invalid; use an integer >= 1.")
        self.cfg = cfg = SnakeConfig(height, width, max_steps_without_food, observation, flood_fill)
        self.num_envs = n = int(num_envs)
        self.single_observation_space = observation_space(cfg)
        self.single_action_space = spaces.Discrete(4)
        self.observation_space = batch_space(self.single_observation_space, n)
        self.action_space = batch_space(self.single_action_space, n)
        self._rows = np.arange(n)
        self._body = np.zeros((n, cfg.height, cfg.width), dtype=np.int16)  # steps until each cell is vacated
        self._length = np.zeros(n, dtype=np.int16)
        self._head_y = np.zeros(n, dtype=np.int64)
        self._head_x = np.zeros(n, dtype=np.int64)
        self._heading = np.zeros(n, dtype=np.int64)
        self._food_y = np.zeros(n, dtype=np.int64)
        self._food_x = np.zeros(n, dtype=np.int64)
        self._steps_without_food = np.zeros(n, dtype=np.int64)
        self._needs_reset = np.zeros(n, dtype=bool)
        self._keys: np.ndarray | None = None
        self._draws = np.zeros(n, dtype=np.uint64)

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed if isinstance(seed, (int, type(None))) else None)
        if seed is not None:
            seeds = seed + self._rows if isinstance(seed, (int, np.integer)) else np.asarray(seed)
            if seeds.shape != (self.num_envs,):
                raise ValueError(f"Snake: reset(seed=...) needs one int or {self.num_envs} ints, got {seed!r}.")
            self._keys, self._draws = counter_rng.key_from_seed(seeds), np.zeros(self.num_envs, dtype=np.uint64)
        elif self._keys is None:
            self._keys = self.np_random.integers(0, 2**63, size=self.num_envs).astype(np.uint64)
        self._reset_boards(np.ones(self.num_envs, dtype=bool))
        return self._observe(), {}

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        if self._keys is None:
            raise RuntimeError("Snake: call reset() before step().")
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,) or not np.issubdtype(actions.dtype, np.integer):
            raise ValueError(
                f"Snake: step() needs {self.num_envs} integer actions, got shape {actions.shape} "
                f"dtype {actions.dtype}."
            )
        if ((actions < 0) | (actions > 3)).any():
            raise ValueError(f"Snake: actions must be in 0..3 (up, right, down, left), got {actions}.")
        h, w = self.cfg.height, self.cfg.width
        active = ~self._needs_reset  # boards that move; the others reset (NEXT_STEP autoreset)
        if not active.all():
            self._reset_boards(~active)

        turn = active & (actions != (self._heading + 2) % 4)
        self._heading = np.where(turn, actions, self._heading)
        ny = self._head_y + _DY[self._heading]
        nx = self._head_x + _DX[self._heading]
        wall = (ny < 0) | (ny >= h) | (nx < 0) | (nx >= w)
        cy, cx = np.clip(ny, 0, h - 1), np.clip(nx, 0, w - 1)
        ate = ~wall & (cy == self._food_y) & (cx == self._food_x)
        hit = ~wall & (self._body[self._rows, cy, cx] > 1)  # counter 1 is the tail, which moves away
        dead = active & (wall | hit)
        moving = active & ~dead
        grow = moving & ate
        slide = moving & ~ate

        # Sliding boards age every body cell by one step; growing boards keep their tail.
        np.subtract(self._body, 1, out=self._body, where=(self._body > 0) & slide[:, None, None])
        self._length += grow
        self._body[self._rows[moving], cy[moving], cx[moving]] = self._length[moving]
        self._head_y = np.where(moving, cy, self._head_y)
        self._head_x = np.where(moving, cx, self._head_x)
        self._steps_without_food = np.where(grow, 0, self._steps_without_food + slide)
        won = grow & (self._length == h * w)
        if (grow & ~won).any():
            self._place_food(grow & ~won)

        rewards = grow.astype(np.float32) - dead.astype(np.float32)
        terminated = dead | won
        truncated = slide & (self._steps_without_food >= self.cfg.max_steps_without_food)
        self._needs_reset = terminated | truncated
        return self._observe(), rewards, terminated, truncated, {}

    def _reset_boards(self, mask: np.ndarray) -> None:
        cy, cx = self.cfg.height // 2, self.cfg.width // 2
        self._body[mask] = 0
        for k in range(_INITIAL_LENGTH):  # fixed 3-cell start, not a per-board loop
            self._body[mask, cy, cx - _INITIAL_LENGTH + 1 + k] = k + 1
        self._length[mask] = _INITIAL_LENGTH
        self._head_y[mask], self._head_x[mask], self._heading[mask] = cy, cx, 1
        self._steps_without_food[mask] = 0
        self._needs_reset[mask] = False
        self._place_food(mask)

    def _place_food(self, mask: np.ndarray) -> None:
        """Puts food on a uniformly random free cell (row-major order, as the scalar env) of each masked board."""
        idx = np.flatnonzero(mask)
        free = self._body[idx].reshape(len(idx), -1) == 0  # [k, H*W]
        u = counter_rng.uniform(self._keys[idx], self._draws[idx])
        self._draws[idx] += np.uint64(1)
        target = (u * free.sum(axis=1)).astype(np.int64)  # index among the free cells
        cell = np.argmax(np.cumsum(free, axis=1) > target[:, None], axis=1)
        self._food_y[idx], self._food_x[idx] = np.divmod(cell, self.cfg.width)

    def _observe(self) -> Any:
        grid = (self._body > 0).view(np.uint8) * np.uint8(BODY)  # [N, H, W]
        grid[self._rows, self._food_y, self._food_x] = FOOD
        grid[self._rows, self._head_y, self._head_x] = HEAD_UP + self._heading
        reachable = None
        if self.cfg.flood_fill:
            reachable = reachable_fractions(grid <= FOOD, self._head_y, self._head_x, self._heading)
        return encode(self.cfg, grid, reachable)
