"""rl_speed/Atari-v0: ale-py's C++ vector env as a NEXT_STEP gymnasium VectorEnv of channels-last uint8 frame stacks,
its scalar form, and config checks that name the key (before ale-py is needed)."""

from __future__ import annotations

import builtins

import numpy as np
import pytest

from rl_speed_envs.atari import CONFIG_KEYS, check_config, rom_name


def test_game_names_and_bad_keys_are_checked_without_ale_py():
    assert rom_name("ALE/Pong-v5") == "pong" and rom_name("SpaceInvaders") == "space_invaders"
    with pytest.raises(ValueError, match="unknown env_config keys \\['gam'\\]"):
        check_config({"gam": "pong"})
    with pytest.raises(ValueError, match="`frameskip` must be an integer >= 1"):
        check_config({"frameskip": 0})
    assert set(check_config({})) == set(CONFIG_KEYS)


def test_a_missing_extra_says_how_to_install_it(monkeypatch):
    from rl_speed_envs import atari

    real_import = builtins.__import__

    def no_ale(name, *args, **kwargs):
        if name == "ale_py":
            raise ImportError("No module named 'ale_py'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ale)
    with pytest.raises(ImportError, match=r"pip install 'rl_speed\[atari\]'"):
        atari.AtariVectorEnv(2)


def test_vector_form_frames_autoreset_and_scalar_form():
    pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    from rl_speed_envs.atari import AtariEnv, AtariVectorEnv

    # 200 frames = 50 agent steps per episode, so the test sees an episode end and the reset step after it
    env = AtariVectorEnv(2, game="ALE/Pong-v5", max_num_frames_per_episode=200)
    try:
        obs, _ = env.reset(seed=3)
        assert obs.shape == (2, 84, 84, 4) and obs.dtype == np.uint8 and obs.flags.c_contiguous
        assert env.single_observation_space.shape == (84, 84, 4) and env.single_action_space.n == 6
        ended_at = None
        for t in range(80):
            obs, rewards, terminated, truncated, _ = env.step(np.zeros(2, np.int64))
            assert rewards.dtype == np.float32 and set(np.unique(rewards)) <= {-1.0, 0.0, 1.0}  # clipped
            if ended_at is None and (terminated | truncated).all():
                ended_at = t
            elif ended_at is not None:
                # NEXT_STEP: the step after the end only resets; its obs starts a new stack
                assert not (terminated | truncated).any() and (rewards == 0).all()
                break
        assert ended_at is not None
    finally:
        env.close()
    scalar = AtariEnv(game="pong")
    try:
        first, _ = scalar.reset(seed=3)
        vector = AtariVectorEnv(1, game="pong")
        assert np.array_equal(first, vector.reset(seed=3)[0][0])  # the same preprocessing and seeding
        vector.close()
        obs, reward, terminated, truncated, _ = scalar.step(0)
        assert obs.shape == (84, 84, 4) and isinstance(reward, float) and not terminated
    finally:
        scalar.close()
    with pytest.raises(ValueError, match="could not start game 'nosuchgame'"):
        AtariVectorEnv(1, game="nosuchgame")


def test_lane_groups_step_apart_and_together_like_one_vector_env():
    pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    from rl_speed_envs.atari import AtariVectorEnv

    one, grouped = AtariVectorEnv(4, max_num_frames_per_episode=200), AtariVectorEnv(4, lane_groups=2,
                                                                                       max_num_frames_per_episode=200)
    try:
        assert (grouped.lane_groups, grouped.group_size) == (2, 2)
        assert np.array_equal(one.reset(seed=5)[0], grouped.reset(seed=5)[0])  # consecutive seeds over all lanes
        rng = np.random.default_rng(0)
        for t in range(120):  # past an episode end (50 agent steps) and its reset step
            actions = rng.integers(0, 6, 4)
            expected = one.step(actions)[:4]
            if t % 2:
                got = grouped.step(actions)[:4]
            else:  # the groups one at a time, the second sent before the first is received
                grouped.send_group(1, actions[2:])
                grouped.send_group(0, actions[:2])
                first, second = grouped.recv_group(0), grouped.recv_group(1)
                got = tuple(np.concatenate(pair) for pair in zip(first, second))
            for a, b in zip(expected, got):
                assert np.array_equal(a, b), t
    finally:
        one.close()
        grouped.close()
    with pytest.raises(ValueError, match="`lane_groups`=3 must divide the 4 envs"):
        AtariVectorEnv(4, lane_groups=3)
    with pytest.raises(ValueError, match="`lane_groups` must be an integer >= 1"):
        check_config({"lane_groups": 0})
