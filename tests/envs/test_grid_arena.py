"""Grid arena: the batched form against the per-map reference in lockstep, invariants over long random play,
the MultiAgentEnv form through RLlib's own checker, and clear errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest

from rl_speed_envs.grid_arena import (
    CONVERTER,
    EMPTY,
    MINE,
    NUM_ACTIONS,
    WALL,
    GridArena,
    GridArenaConfig,
    GridArenaVectorEnv,
)

# Crowded small maps, so that random play moves, collides, harvests, converts and attacks often.
CROWDED = dict(height=9, width=9, num_agents=6, num_mines=8, num_converters=3, wall_density=0.05, regen_steps=3,
               ore_capacity=3, ore_per_heart=2, freeze_steps=2, max_steps=40)


def _biased_actions(rng, count):
    """Random actions tilted towards the interactions (pick up, use, attack) so they all occur."""
    return rng.choice(NUM_ACTIONS, size=count, p=[0.05, 0.25, 0.1, 0.1, 0.2, 0.15, 0.15])


@pytest.mark.parametrize("config", [CROWDED, {**CROWDED, "observation": "planes", "view": 5},
                                    dict(num_agents=24, max_steps=30)])
def test_batched_matches_per_map_reference_in_lockstep(config):
    maps, seed = 3, 11
    batched = GridArenaVectorEnv(num_envs=maps * GridArenaConfig(**config).num_agents, **config)
    agents = batched.cfg.num_agents
    refs = [GridArena(**config) for _ in range(maps)]
    obs, _ = batched.reset(seed=seed)
    ref_obs = [ref.reset(seed=seed + i) for i, ref in enumerate(refs)]
    np.testing.assert_array_equal(obs, np.concatenate(ref_obs))
    rng = np.random.default_rng(0)
    resetting = np.zeros(maps, bool)
    counts = np.zeros(NUM_ACTIONS)
    total_reward = 0.0
    for _ in range(100):  # 2.5 episodes of 40 steps: autoresets included
        actions = _biased_actions(rng, maps * agents)
        obs, rewards, terminated, truncated, _ = batched.step(actions)
        for i, ref in enumerate(refs):
            lanes = slice(i * agents, (i + 1) * agents)
            if resetting[i]:  # NEXT_STEP autoreset: this step only resets the map
                expected_obs, expected_rewards, term, trunc = ref.reset(), np.zeros(agents, np.float32), False, False
            else:
                expected_obs, expected_rewards, term, trunc = ref.step(actions[lanes])
            np.testing.assert_array_equal(obs[lanes], expected_obs)
            np.testing.assert_array_equal(rewards[lanes], expected_rewards)
            assert (terminated[lanes] == term).all() and (truncated[lanes] == trunc).all()
            np.testing.assert_array_equal(batched.ore[i], ref.ore)
            np.testing.assert_array_equal(batched.hearts[i], ref.hearts)
            np.testing.assert_array_equal(batched.frozen[i], ref.frozen)
            resetting[i] = term or trunc
        counts += np.bincount(actions, minlength=NUM_ACTIONS)
        total_reward += rewards.sum()
    assert total_reward > 0  # harvesting happened, so the interesting branches were compared


def test_invariants_over_random_play():
    env = GridArenaVectorEnv(num_envs=8 * 6, **CROWDED)
    env.reset(seed=3)
    rng = np.random.default_rng(1)
    hearts_seen = attacks_seen = 0
    for _ in range(400):
        before_frozen = env.frozen.copy()
        env.step(_biased_actions(rng, env.num_envs))
        attacks_seen += int((env.frozen > before_frozen).sum())
        maps = np.arange(env.num_maps)[:, None]
        # Agents stand on empty cells, never on walls, mines or converters, and never two on one cell.
        assert (env.objects[maps, env.y, env.x] == EMPTY).all()
        cells = env.y * env.cfg.width + env.x
        assert all(len(set(row)) == env.cfg.num_agents for row in cells)
        np.testing.assert_array_equal(env.occupant[maps, env.y, env.x],
                                      np.broadcast_to(np.arange(1, env.cfg.num_agents + 1), env.y.shape))
        assert (env.occupant > 0).sum() == env.num_maps * env.cfg.num_agents
        # Inventories stay within [0, capacity]; ore is conserved by converters and attacks.
        assert ((env.ore >= 0) & (env.ore <= env.cfg.ore_capacity)).all()
        np.testing.assert_array_equal(env.ore_harvested,
                                      env.ore.sum(1) + env.cfg.ore_per_heart * env.hearts.sum(1))
        assert ((env.cooldown >= 0) & (env.cooldown <= env.cfg.regen_steps)).all()
        assert (env.cooldown[env.objects != MINE] == 0).all()
        hearts_seen += int(env.hearts.sum())
    assert hearts_seen > 0 and attacks_seen > 0
    # The map keeps its border walls and object counts.
    assert (env.objects[:, 0] == WALL).all() and (env.objects[:, :, -1] == WALL).all()
    assert ((env.objects == CONVERTER).sum((1, 2)) == CROWDED["num_converters"]).all()


def test_observation_contents():
    env = GridArena(**{**CROWDED, "observation": "planes", "view": 5})
    obs = env.reset(seed=0)
    assert obs.shape == (6, 5, 5, 5) and obs.dtype == np.uint8
    for a in range(6):
        assert obs[a, 3, 2, 2] == env.orientation[a] + 1  # itself at the centre of the agent plane
        y, x = env.y[a], env.x[a]
        window = env.objects[max(0, y - 2):y + 3, max(0, x - 2):x + 3] == WALL
        assert obs[a, 0].sum() >= window.sum()  # walls of the map in view (plus outside cells as walls)
    assert env.observation_space.contains(obs[0])
    flat = GridArena(**CROWDED).reset(seed=0)
    assert flat.shape == (6, 5 * 11 * 11) and flat.dtype == np.float32


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_agents=0), "`num_agents`=0 is invalid"),
    (dict(view=4), "`view`=4 must be odd"),
    (dict(height=6, width=6, num_agents=20), "enlarge the map"),
    (dict(observation="rgb"), "`observation`='rgb' is invalid"),
    (dict(wall_density=1.5), "`wall_density`=1.5 must be a number in [0, 1)"),
])
def test_bad_config_is_named(kwargs, message):
    with pytest.raises(ValueError, match=None) as info:
        GridArena(**kwargs)
    assert message in str(info.value)


def test_bad_lane_count_and_actions_are_named():
    with pytest.raises(ValueError, match="multiple of num_agents=24"):
        GridArenaVectorEnv(num_envs=30)
    env = GridArenaVectorEnv(num_envs=24)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="needs 24 integer actions"):
        env.step(np.zeros(23, np.int64))
    with pytest.raises(ValueError, match=r"actions must be in 0..6"):
        env.step(np.full(24, 7))
    with pytest.raises(ValueError, match="needs 24 integer actions"):
        env.step(np.zeros(24, np.float32))


def test_multi_agent_env_form_passes_rllib_check_and_matches_the_arena():
    from ray.rllib.utils.pre_checks.env import check_multiagent_environments

    from rl_speed.multi_agent import GridArenaMultiAgentEnv

    env = GridArenaMultiAgentEnv(**CROWDED)
    check_multiagent_environments(env)
    obs, _ = env.reset(seed=5)
    ref = GridArena(**CROWDED)
    np.testing.assert_array_equal(np.stack(list(obs.values())), ref.reset(seed=5))
    rng = np.random.default_rng(2)
    for _ in range(CROWDED["max_steps"]):
        actions = _biased_actions(rng, 6)
        obs, rewards, terms, truncs, _ = env.step({f"agent_{i}": int(a) for i, a in enumerate(actions)})
        ref_obs, ref_rewards, _, ref_trunc = ref.step(actions)
        np.testing.assert_array_equal(np.stack(list(obs.values())), ref_obs)
        np.testing.assert_allclose(list(rewards.values()), ref_rewards)
    assert truncs["__all__"] and not terms["__all__"]
    with pytest.raises(ValueError, match="unknown config keys"):
        GridArenaMultiAgentEnv(num_agent=3)
    with pytest.raises(ValueError, match="every agent acts every step"):
        env.reset()
        env.step({"agent_0": 0})
