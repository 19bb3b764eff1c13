"""Durotaxis: argpartition leftmost-k against a sort, the batched env against the per-graph reference in lockstep,
graph invariants, reward components, terminations, and bad input named without corrupting the state."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from rl_speed_envs.durotaxis import (
    REWARD_COMPONENTS,
    DurotaxisEnv,
    DurotaxisVectorEnv,
    leftmost_k,
)


def sorted_leftmost_k(x: np.ndarray, alive: np.ndarray, k: int) -> np.ndarray:
    """The plain definition: sort alive slots by (x, slot) and take the first k."""
    slots = np.flatnonzero(alive)
    order = slots[np.lexsort((slots, x[slots]))]
    chosen = np.zeros(len(x), bool)
    chosen[order[:k]] = True
    return chosen


@pytest.mark.parametrize("distinct_values", [3, 1000])  # 3: many ties
def test_leftmost_k_equals_sorted_selection(distinct_values):
    rng = np.random.default_rng(distinct_values)
    b, m = 400, 17
    x = rng.integers(0, distinct_values, (b, m)) / 7.0
    alive = rng.random((b, m)) < 0.7
    k = rng.integers(0, m + 3, b)  # includes 0 and more than the alive count
    got = leftmost_k(x, alive, k)
    for row in range(b):
        np.testing.assert_array_equal(got[row], sorted_leftmost_k(x[row], alive[row], k[row]), err_msg=f"row {row}")


def random_actions(rng: np.random.Generator, n: int, m: int, max_ratio: float) -> dict:
    return {"spawn": rng.integers(0, 2, (n, m)).astype(np.int8),
            "spawn_params": rng.uniform(-1.3, 1.3, (n, m, 2)).astype(np.float32),  # some outside [-1, 1]: clipped
            # about 1 in 6 exactly max_ratio, so ratio 1 empties graphs
            "delete_ratio": np.minimum(rng.uniform(0, 1.2 * max_ratio, (n, 1)), max_ratio).astype(np.float32)}


def assert_obs_equal(batched: dict, i: int, single: dict) -> None:
    for key in ("edges", "node_mask", "edge_mask"):
        np.testing.assert_array_equal(batched[key][i], single[key], err_msg=key)
    np.testing.assert_allclose(batched["nodes"][i], single["nodes"], atol=1e-6)


@pytest.mark.parametrize("config, max_ratio, expect", [
    ({}, 0.3, "truncated"),
    ({"max_nodes": 6, "init_nodes": 4, "max_steps": 7}, 0.5, "dropped"),  # full graphs drop spawns
    ({"width": 6.0, "start_x": 1.0, "goal_x": 2.5, "stiffness_min": 0.8}, 0.2, "goal"),
    ({"init_nodes": 3, "link_radius": 1.05}, 1.0, "failure"),  # empty and disconnected graphs
])
def test_vector_matches_scalar_in_lockstep(config, max_ratio, expect):
    n = 6
    vec = DurotaxisVectorEnv(num_envs=n, **config)
    singles = [DurotaxisEnv(**config) for _ in range(n)]
    obs, _ = vec.reset(seed=11)
    for i, env in enumerate(singles):
        assert_obs_equal(obs, i, env.reset(seed=11 + i)[0])
    rng = np.random.default_rng(0)
    resetting = np.zeros(n, bool)
    ends = dict.fromkeys(("truncated", "dropped", "goal", "failure"), 0)
    for _ in range(150):
        actions = random_actions(rng, n, vec.cfg.max_nodes, max_ratio)
        obs, rewards, terms, truncs, info = vec.step(actions)
        for i, env in enumerate(singles):
            if resetting[i]:
                o, r, term, trunc = *env.reset()[:1], 0.0, False, False
                parts = dict.fromkeys(REWARD_COMPONENTS, 0.0)
            else:
                o, r, term, trunc, single_info = env.step({k: v[i] for k, v in actions.items()})
                parts = single_info["reward_components"]
                assert info["num_nodes"][i] == single_info["num_nodes"]
                assert info["spawn_dropped"][i] == single_info["spawn_dropped"]
            assert_obs_equal(obs, i, o)
            assert (terms[i], truncs[i]) == (term, trunc)
            assert rewards[i] == pytest.approx(r, abs=1e-5)
            for name in REWARD_COMPONENTS:
                assert info["reward_components"][name][i] == pytest.approx(parts[name], abs=1e-9), name
        parts = info["reward_components"]
        ends["truncated"] += truncs.sum()
        ends["dropped"] += (info["spawn_dropped"] > 0).sum()
        ends["goal"] += (parts["termination"] > 0).sum()
        ends["failure"] += ((parts["termination"] < 0) | (parts["connectivity"] < 0)).sum()
        resetting = terms | truncs
    assert ends[expect] > 0, ends  # the case this configuration is for was exercised


def test_invariants_under_random_play():
    env = DurotaxisVectorEnv(num_envs=32)
    cfg = env.cfg
    obs, _ = env.reset(seed=3)
    rng = np.random.default_rng(1)
    for _ in range(120):
        obs, rewards, terms, truncs, info = env.step(random_actions(rng, 32, cfg.max_nodes, 0.4))
        node_mask, edge_mask = obs["node_mask"].astype(bool), obs["edge_mask"].astype(bool)
        np.testing.assert_array_equal(node_mask.sum(1), info["num_nodes"])  # mask consistent with the count
        np.testing.assert_array_equal(node_mask, env.alive)
        assert np.isfinite(env.pos).all() and np.isfinite(obs["nodes"]).all()
        live = env.pos[env.alive]
        assert (live >= 0).all() and (live[:, 0] <= cfg.width).all() and (live[:, 1] <= cfg.height).all()
        assert (obs["nodes"][~node_mask] == 0).all()  # padded slots carry no features
        # Real edge rows come first, link two present nodes (i < j) within reach; padded rows are zeros.
        counts = edge_mask.sum(1)
        assert (edge_mask == (np.arange(cfg.num_pairs) < counts[:, None])).all()
        b, e = np.nonzero(edge_mask)
        i, j = obs["edges"][b, e, 0], obs["edges"][b, e, 1]
        assert (i < j).all() and node_mask[b, i].all() and node_mask[b, j].all()
        gap = env.pos[b, i] - env.pos[b, j]
        assert ((gap ** 2).sum(-1) <= cfg.link_radius ** 2).all()
        assert (obs["edges"][~edge_mask] == 0).all()
        # Degree feature = edges touching the node.
        degree = np.zeros(node_mask.shape)
        np.add.at(degree, (b, i), 1)
        np.add.at(degree, (b, j), 1)
        np.testing.assert_allclose(obs["nodes"][..., 3], degree / (cfg.max_nodes - 1), atol=1e-6)
        total = sum(info["reward_components"][name] for name in REWARD_COMPONENTS)
        np.testing.assert_allclose(rewards, total, atol=1e-5)


def test_scalar_env_passes_gymnasium_checker():
    check_env(DurotaxisEnv(), skip_render_check=True)


def test_terminations_and_their_rewards():
    # Delete everything: the graph empties.
    env = DurotaxisEnv()
    env.reset(seed=0)
    m = env.cfg.max_nodes
    no_spawn = {"spawn": np.zeros(m, np.int8), "spawn_params": np.zeros((m, 2), np.float32)}
    _, reward, term, trunc, info = env.step({**no_spawn, "delete_ratio": np.ones(1, np.float32)})
    assert term and not trunc and info["num_nodes"] == 0
    assert info["reward_components"]["termination"] == -env.cfg.failure_penalty
    # Two nodes out of reach of each other: disconnected.
    env.reset(seed=0)
    env.alive[:] = False
    env.alive[:2] = True
    env.pos[:2] = [[2.0, 2.0], [2.0 + 2 * env.cfg.link_radius, 2.0]]
    _, reward, term, _, info = env.step({**no_spawn, "delete_ratio": np.zeros(1, np.float32)})
    assert term and info["reward_components"]["connectivity"] == -env.cfg.failure_penalty
    # Centroid past the goal: reached, with the bonus.
    env = DurotaxisEnv(width=6.0, start_x=1.0, goal_x=1.2)
    env.reset(seed=0)
    right = np.zeros((m, 2), np.float32)
    right[:, 1] = 1.0  # angle 0 (right), longest distance
    _, reward, term, _, info = env.step({"spawn": np.ones(m, np.int8), "spawn_params": right,
                                         "delete_ratio": np.full(1, 0.5, np.float32)})
    assert term and info["centroid_x"] >= 1.2 and info["reward_components"]["termination"] == env.cfg.goal_bonus
    # Truncation after max_steps.
    env = DurotaxisEnv(max_steps=3)
    env.reset(seed=0)
    for step in range(3):
        _, _, term, trunc, _ = env.step({**no_spawn, "delete_ratio": np.zeros(1, np.float32)})
    assert trunc and not term


def test_leftmost_nodes_are_deleted():
    env = DurotaxisEnv(init_nodes=8)
    env.reset(seed=5)
    m = env.cfg.max_nodes
    x_before = env.pos[:8, 0].copy()
    env.step({"spawn": np.zeros(m, np.int8), "spawn_params": np.zeros((m, 2), np.float32),
              "delete_ratio": np.full(1, 0.25, np.float32)})
    gone = np.flatnonzero(~env.alive[:8])
    np.testing.assert_array_equal(np.sort(gone), np.sort(np.argsort(x_before, kind="stable")[:2]))


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(spawn=a["spawn"][:-1]), r"`spawn` has shape \(23,\), expected \(24,\)"),
    (lambda a: a["spawn_params"].__setitem__((0, 0), np.nan), "NaN or infinite"),
    (lambda a: a["spawn_params"].__setitem__((0, 1), np.inf), "NaN or infinite"),
    (lambda a: a.update(delete_ratio=np.array([1.5], np.float32)), r"`delete_ratio` must be in \[0, 1\]"),
    (lambda a: a.update(delete_ratio=np.array([-0.1], np.float32)), r"`delete_ratio` must be in \[0, 1\]"),
    (lambda a: a.update(delete_ratio=np.array([np.nan], np.float32)), r"`delete_ratio` must be in \[0, 1\]"),
    (lambda a: a["spawn"].__setitem__(0, 2), "`spawn` must hold only 0 or 1"),
    (lambda a: a.pop("spawn"), "must be a dict with keys"),
])
def test_bad_actions_are_named_and_change_nothing(change, message):
    env = DurotaxisEnv()
    env.reset(seed=2)
    action = env.action_space.sample()
    change(action)
    before = (env.pos.copy(), env.alive.copy(), env.age.copy(), env.steps, env._draws.copy())
    with pytest.raises(ValueError, match=message):
        env.step(action)
    after = (env.pos, env.alive, env.age, env.steps, env._draws)
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)


def test_vector_bad_actions_change_nothing():
    env = DurotaxisVectorEnv(num_envs=3)
    env.reset(seed=0)
    actions = random_actions(np.random.default_rng(0), 3, env.cfg.max_nodes, 0.2)
    actions["delete_ratio"][2] = 1.01
    pos, alive = env.pos.copy(), env.alive.copy()
    with pytest.raises(ValueError, match="delete_ratio"):
        env.step(actions)
    np.testing.assert_array_equal(env.pos, pos)
    np.testing.assert_array_equal(env.alive, alive)
    with pytest.raises(ValueError, match=r"`spawn_params` has shape \(3, 24\)"):
        env.step({**actions, "spawn_params": actions["spawn_params"][..., 0]})


def test_out_of_range_spawn_params_are_clipped():
    envs = [DurotaxisEnv(), DurotaxisEnv()]
    for env in envs:
        env.reset(seed=4)
    m = envs[0].cfg.max_nodes
    wild = np.random.default_rng(0).uniform(-3, 3, (m, 2)).astype(np.float32)
    base = {"spawn": np.ones(m, np.int8), "delete_ratio": np.zeros(1, np.float32)}
    a = envs[0].step({**base, "spawn_params": wild})[0]
    b = envs[1].step({**base, "spawn_params": np.clip(wild, -1, 1)})[0]
    np.testing.assert_array_equal(a["nodes"], b["nodes"])


@pytest.mark.parametrize("config, message", [
    ({"max_nodes": 1}, "`max_nodes`=1 is invalid"),
    ({"init_nodes": 30}, "`init_nodes`=30 exceeds `max_nodes`=24"),
    ({"link_radius": -1.0}, "`link_radius`=-1.0 must be a finite number >= 0"),
    ({"goal_x": 0.5}, "need 0 < start_x"),
    ({"max_steps": "100"}, "`max_steps`='100' is invalid"),
    ({"spawn_min_distance": 2.0}, "`spawn_min_distance` must not exceed"),
])
def test_bad_config_is_named(config, message):
    with pytest.raises(ValueError, match=message):
        DurotaxisEnv(**config)
    with pytest.raises(ValueError, match=message):
        DurotaxisVectorEnv(num_envs=2, **config)
