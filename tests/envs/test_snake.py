"""Snake: the native vector env against the scalar reference, flood fill against BFS, gymnasium conformance."""

from __future__ import annotations

import pickle
from collections import deque

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rl_speed_envs import register_gymnasium
from rl_speed_envs.snake import FOOD, SnakeEnv, SnakeVectorEnv, reachable_fractions

CONFIGS = [
    dict(),  # defaults: 10 x 10 grid observation
    dict(height=5, width=7, max_steps_without_food=9, observation="flat", flood_fill=True),
    dict(height=4, width=4, max_steps_without_food=30, observation="grid", flood_fill=True),
]


def _row(obs, i):
    return {k: v[i] for k, v in obs.items()} if isinstance(obs, dict) else obs[i]


def _assert_same_obs(a, b, where):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{where} key {k}")
    else:
        np.testing.assert_array_equal(a, b, err_msg=where)


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_vector_env_matches_scalar_envs_in_lockstep(kwargs):
    n, steps = 12, 1000
    vec = SnakeVectorEnv(num_envs=n, **kwargs)
    scalars = [SnakeEnv(**kwargs) for _ in range(n)]
    vec_obs, _ = vec.reset(seed=100)
    for i, env in enumerate(scalars):
        obs, _ = env.reset(seed=100 + i)
        _assert_same_obs(obs, _row(vec_obs, i), f"reset board {i}")
    rng = np.random.default_rng(7)
    done = np.zeros(n, dtype=bool)
    counts = {"food": 0, "death": 0, "truncated": 0}
    for t in range(steps):
        actions = rng.integers(0, 4, n)
        vec_obs, rewards, terminated, truncated, _ = vec.step(actions)
        for i, env in enumerate(scalars):
            if done[i]:  # NEXT_STEP autoreset: this step resets the board and ignores its action
                obs, _ = env.reset()
                reward, term, trunc = 0.0, False, False
            else:
                obs, reward, term, trunc, _ = env.step(actions[i])
            where = f"step {t} board {i}"
            _assert_same_obs(obs, _row(vec_obs, i), where)
            assert (reward, term, trunc) == (rewards[i], terminated[i], truncated[i]), where
            done[i] = term or trunc
        counts["food"] += int((rewards > 0).sum())
        counts["death"] += int((rewards < 0).sum())
        counts["truncated"] += int(truncated.sum())
    assert counts["food"] > 50 and counts["death"] > 50, counts  # the run exercised eating and dying
    if kwargs.get("max_steps_without_food", 100) <= 10:
        assert counts["truncated"] > 0, counts


def _hamiltonian_action(grid: np.ndarray) -> int:
    """Follows a Hamiltonian cycle of an even-height board: boustrophedon over columns 1.., back up column 0."""
    h, w = grid.shape
    y, x = map(int, np.argwhere(grid >= 3)[0])
    if x == 0:
        ny, nx = (y - 1, 0) if y > 0 else (0, 1)
    elif y % 2 == 0:
        ny, nx = (y, x + 1) if x < w - 1 else (y + 1, x)
    else:
        ny, nx = (y, x - 1) if x > 1 else ((y + 1, x) if y < h - 1 else (y, 0))
    return {(-1, 0): 0, (0, 1): 1, (1, 0): 2, (0, -1): 3}[(ny - y, nx - x)]


def test_filling_the_board_wins_identically_in_both_forms():
    n, kwargs = 4, dict(height=4, width=4, max_steps_without_food=16)
    vec = SnakeVectorEnv(num_envs=n, **kwargs)
    scalars = [SnakeEnv(**kwargs) for _ in range(n)]
    vec_obs, _ = vec.reset(seed=11)
    obs = [env.reset(seed=11 + i)[0] for i, env in enumerate(scalars)]
    returns, won = np.zeros(n), np.zeros(n, dtype=bool)
    for _ in range(400):
        actions = np.array([_hamiltonian_action(o) for o in obs])
        vec_obs, rewards, terminated, truncated, _ = vec.step(actions)
        for i, env in enumerate(scalars):
            if won[i]:
                continue
            obs[i], reward, term, trunc, _ = env.step(actions[i])
            np.testing.assert_array_equal(obs[i], vec_obs[i])
            assert (reward, term, trunc) == (rewards[i], terminated[i], truncated[i])
            assert not trunc and reward >= 0  # the cycle never dies and food is always reached in time
            returns[i] += reward
            won[i] = term
        if won.all():
            break
    assert won.all()
    np.testing.assert_array_equal(returns, 16 - 3)  # from length 3 to a full 4 x 4 board


def test_vector_step_returns_batched_arrays_of_the_declared_spaces():
    vec = SnakeVectorEnv(num_envs=5, flood_fill=True)
    obs, info = vec.reset(seed=0)
    assert info == {}
    assert obs in vec.observation_space
    obs, rewards, terminated, truncated, _ = vec.step(np.zeros(5, dtype=np.int64))
    assert obs in vec.observation_space and obs["grid"].dtype == np.uint8
    assert rewards.shape == terminated.shape == truncated.shape == (5,)
    assert terminated.dtype == truncated.dtype == bool


def _bfs_reachable(free: np.ndarray, start: tuple[int, int]) -> int:
    h, w = free.shape
    seen, queue = {start}, deque([start])
    while queue:
        y, x = queue.popleft()
        for dy, dx in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            nxt = (y + dy, x + dx)
            if 0 <= nxt[0] < h and 0 <= nxt[1] < w and free[nxt] and nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return len(seen)


def _reference_fractions(free, head_y, head_x, heading):
    dy, dx = [-1, 0, 1, 0], [0, 1, 0, -1]
    out = np.zeros(3)
    for k, turn in enumerate((0, 3, 1)):  # straight, left, right
        d = (heading + turn) % 4
        y, x = head_y + dy[d], head_x + dx[d]
        if 0 <= y < free.shape[0] and 0 <= x < free.shape[1] and free[y, x]:
            out[k] = _bfs_reachable(free, (y, x)) / max(free.sum(), 1)
    return out


@pytest.mark.parametrize("shape", [(4, 4), (7, 5), (10, 10), (16, 64)])
def test_vectorized_flood_fill_matches_bfs(shape):
    rng = np.random.default_rng(shape[0] * 100 + shape[1])
    n = 200
    free = rng.random((n, *shape)) < rng.uniform(0.3, 0.9, (n, 1, 1))  # random walls, many enclosed pockets
    head_y, head_x = rng.integers(0, shape[0], n), rng.integers(0, shape[1], n)
    heading = rng.integers(0, 4, n)
    got = reachable_fractions(free, head_y, head_x, heading)
    want = np.array([_reference_fractions(free[i], head_y[i], head_x[i], heading[i]) for i in range(n)])
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert (want > 0).any() and (want == 0).any()


def test_flood_fill_features_of_real_games_match_bfs():
    vec = SnakeVectorEnv(num_envs=32, height=6, width=6, observation="grid", flood_fill=True)
    obs, _ = vec.reset(seed=3)
    rng = np.random.default_rng(3)
    for _ in range(200):
        obs, *_ = vec.step(rng.integers(0, 4, 32))
        grid = obs["grid"]
        for i in range(32):
            hy, hx = np.argwhere(grid[i] >= 3)[0]
            free = grid[i] <= FOOD
            want = _reference_fractions(free, hy, hx, int(grid[i, hy, hx]) - 3)
            np.testing.assert_allclose(obs["reachable"][i], want, rtol=1e-6)


@pytest.mark.parametrize("kwargs", CONFIGS)
def test_scalar_env_passes_gymnasium_check_env(kwargs):
    check_env(SnakeEnv(**kwargs), skip_render_check=False)


def test_registered_ids_make_scalar_and_native_vector_envs():
    register_gymnasium()
    register_gymnasium()  # idempotent
    env = gym.make("rl_speed/Snake-v0", height=6)
    assert env.unwrapped.cfg.height == 6
    vec = gym.make_vec("rl_speed/Snake-v0", num_envs=8, vectorization_mode="vector_entry_point", height=6)
    assert isinstance(vec.unwrapped, SnakeVectorEnv) and vec.num_envs == 8


def test_envs_pickle_mid_episode_and_continue_identically():
    vec = SnakeVectorEnv(num_envs=4, flood_fill=True)
    vec.reset(seed=1)
    for _ in range(10):
        vec.step(np.ones(4, dtype=np.int64))
    clone = pickle.loads(pickle.dumps(vec))
    actions = np.array([0, 1, 2, 3])
    a, b = vec.step(actions), clone.step(actions)
    _assert_same_obs(a[0], b[0], "pickled vector env")
    np.testing.assert_array_equal(a[1], b[1])


def test_render_ansi_shows_the_board():
    env = SnakeEnv(height=5, width=6, render_mode="ansi")
    env.reset(seed=0)
    board = env.render()
    assert board.count("\n") == 5 and ">" in board and "*" in board


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(height=3), "`height`=3"),
        (dict(width=65), "`width`=65"),
        (dict(height=8.5), "`height`=8.5"),
        (dict(max_steps_without_food=0), "`max_steps_without_food`=0"),
        (dict(observation="pixels"), "`observation`='pixels'"),
        (dict(flood_fill="yes"), "`flood_fill`='yes'"),
    ],
)
def test_bad_arguments_fail_with_the_key_and_allowed_values(kwargs, needle):
    with pytest.raises(ValueError, match="use") as e:
        SnakeEnv(**kwargs)
    assert needle in str(e.value)
    with pytest.raises(ValueError):
        SnakeVectorEnv(num_envs=2, **kwargs)


def test_bad_actions_fail_clearly_and_leave_the_state_untouched():
    vec = SnakeVectorEnv(num_envs=3)
    obs, _ = vec.reset(seed=0)
    for bad in (np.array([0, 1]), np.array([0, 1, 4]), np.array([0.5, 1.0, 2.0])):
        with pytest.raises(ValueError, match="actions"):
            vec.step(bad)
    env = SnakeEnv()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="not in Discrete"):
        env.step(7)
    with pytest.raises(RuntimeError, match="reset"):
        SnakeVectorEnv(num_envs=2).step(np.zeros(2, dtype=np.int64))
    # The failed calls changed nothing: the next valid step matches a fresh env's first step.
    fresh = SnakeVectorEnv(num_envs=3)
    fresh.reset(seed=0)
    np.testing.assert_array_equal(vec.step(np.ones(3, dtype=np.int64))[0], fresh.step(np.ones(3, dtype=np.int64))[0])
