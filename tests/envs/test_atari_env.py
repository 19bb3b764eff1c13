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
        with pytest.raises(ValueError, match=r"reset\(\) takes no options"):
            scalar.reset(seed=3, options={"reset_mask": np.array([True])})
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


def test_an_experiment_file_checks_lane_groups_against_its_runners_lanes(tmp_path):
    """``lane_groups`` is checked for ``num_envs_per_env_runner`` lanes (the vector form FastPPO's runners build),
    without building them; stock PPO's one-emulator envs cannot split, so there it is refused."""
    pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    from rl_speed.experiments import ExperimentFileError, load_experiments

    def experiment(run: str, lanes: int, groups: int):
        path = tmp_path / f"{run}-{lanes}-{groups}.yaml"
        path.write_text(f"x:\n  run: {run}\n  env: rl_speed/Atari-v0\n  config:\n    num_envs_per_env_runner: {lanes}\n"
                        f"    env_config: {{game: pong, lane_groups: {groups}}}\n")
        return load_experiments(path)[0]

    assert experiment("FastPPO", 4, 2).config.env_config["lane_groups"] == 2
    with pytest.raises(ExperimentFileError, match=r"x\.config\.env_config.*`lane_groups`=3 must divide the 4 envs"):
        experiment("FastPPO", 4, 3)
    with pytest.raises(ExperimentFileError, match=r"`lane_groups`=2 splits .* one-emulator form .* Remove"):
        experiment("PPO", 4, 2)


def _plain_breakout(num_envs: int, **config):
    """ale-py's own vector env with rl_speed's settings and unclipped rewards: the reference a test replays."""
    import ale_py
    from gymnasium.vector import AutoresetMode

    return ale_py.AtariVectorEnv("breakout", num_envs, num_threads=1, reward_clipping=False, img_height=84,
                                 img_width=84, grayscale=True, maxpool=True, autoreset_mode=AutoresetMode.NEXT_STEP,
                                 **config)


def _replay_against_plain_ale(steps: int, num_envs: int, **config) -> dict:
    """Random actions into a ``life_episodes`` Breakout env and the same actions (a no-op where a lane begins an
    episode after a lost life) into ale-py's own env: the frames must be the game's, step for step; returns what the
    run saw."""
    from rl_speed_envs.atari import AtariVectorEnv

    ours, plain = AtariVectorEnv(num_envs, game="breakout", life_episodes=True, **config), _plain_breakout(
        num_envs, **{k: v for k, v in config.items() if k != "reward_clipping"})
    seen = {"life_ends": 0, "game_overs": 0, "restarts": 0}
    try:
        obs, _ = ours.reset(seed=3)
        ref_obs, ref_info = plain.reset(seed=3)
        assert np.array_equal(obs, ref_obs.transpose(0, 2, 3, 1))
        rng, lives, starting = np.random.default_rng(0), ref_info["lives"], np.zeros(num_envs, bool)
        for t in range(steps):
            actions = rng.integers(0, 4, num_envs)
            restart = ours._ended_in_noop.copy()
            obs, rewards, terminated, truncated, info = ours.step(actions)
            ref_obs, ref_rewards, ref_term, ref_trunc, ref_info = plain.step(np.where(starting, 0, actions))
            assert np.array_equal(obs, ref_obs.transpose(0, 2, 3, 1)), t  # the same game, frame for frame
            lost = (ref_info["lives"] < lives) & ~(ref_term | ref_trunc) & ~starting & ~restart
            normal = ~starting & ~restart
            assert np.array_equal(terminated[normal], (ref_term | lost)[normal]), t
            assert np.array_equal(truncated[normal], ref_trunc[normal]), t
            assert not (terminated | truncated)[starting].any()  # a reset step of the NEXT_STEP protocol
            assert np.array_equal(rewards, np.where(normal, np.sign(ref_rewards), 0.0)), t
            assert np.array_equal(info["game_reward"], np.where(restart, 0.0, ref_rewards)), t
            assert np.array_equal(info["game_over"], (ref_term | ref_trunc) & ~restart), t
            seen["life_ends"] += int(lost.sum())
            seen["game_overs"] += int(info["game_over"].sum())
            seen["restarts"] += int(restart.sum())
            starting, lives = ours._continuing.copy(), ref_info["lives"]
    finally:
        ours.close()
        plain.close()
    return seen


def test_life_episodes_end_an_episode_at_a_lost_life_and_play_on_in_the_same_game():
    pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    seen = _replay_against_plain_ale(600, 4)
    assert seen["life_ends"] >= 8 and seen["game_overs"] >= 2  # random play loses a life every ~25 steps


def test_a_game_that_ends_in_the_no_op_after_a_lost_life_ends_the_episode_at_ale_pys_restart():
    pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    # With seed 3 and these random actions, a frame cap of 416 falls on one lane's no-op after a lost life (found by
    # trying the caps from 400 up)
    assert _replay_against_plain_ale(416 // 4 + 3, 8, max_num_frames_per_episode=416)["restarts"] == 1


def test_life_episodes_and_ale_pys_episodic_life_are_refused_together():
    with pytest.raises(ValueError, match="choose one: `episodic_life` \\(ale-py's\\) starts a new game there"):
        check_config({"episodic_life": True, "life_episodes": True})


def test_every_step_reports_the_games_unclipped_reward_and_its_end():
    pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    from rl_speed_envs.atari import AtariEnv, AtariVectorEnv

    env, plain = AtariVectorEnv(2, game="breakout"), _plain_breakout(2)
    scalar = AtariEnv(game="breakout")
    try:
        env.reset(seed=1), plain.reset(seed=1), scalar.reset(seed=1)
        rng, scored = np.random.default_rng(1), 0.0
        for _ in range(600):
            actions = rng.integers(0, 4, 2)
            _, rewards, terminated, truncated, info = env.step(actions)
            _, ref_rewards, ref_term, ref_trunc, _ = plain.step(actions)
            assert np.array_equal(rewards, np.sign(ref_rewards)) and np.array_equal(info["game_reward"], ref_rewards)
            assert np.array_equal(info["game_over"], terminated | truncated)
            _, reward, _, _, scalar_info = scalar.step(actions[0])
            assert (reward, scalar_info["game_reward"]) == (float(np.sign(ref_rewards[0])), float(ref_rewards[0]))
            scored += ref_rewards.sum()
        assert scored > 0
    finally:
        env.close()
        plain.close()
        scalar.close()


def test_a_prefetched_reset_gives_what_the_same_reset_gives_and_any_other_call_waits_for_it():
    pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    from rl_speed_envs.atari import AtariVectorEnv

    plain, early = AtariVectorEnv(2, lane_groups=2), AtariVectorEnv(2, lane_groups=2)
    try:
        expected = plain.reset(seed=7)[0]
        early.prefetch_reset(seed=7)
        assert np.array_equal(early.reset(seed=7)[0], expected)
        actions = np.array([1, 2])
        assert all(np.array_equal(a, b) for a, b in zip(plain.step(actions)[:4], early.step(actions)[:4]))
        early.prefetch_reset(seed=7)
        assert not np.array_equal(early.reset(seed=8)[0], expected)  # another seed: a reset of its own
        early.prefetch_reset(seed=7)  # stepped without reset(): the step waits for the emulators' reset
        plain.reset(seed=7)
        assert all(np.array_equal(a, b) for a, b in zip(plain.step(actions)[:4], early.step(actions)[:4]))
        with pytest.raises(ValueError, match=r"reset\(\) takes no options \(got \['reset_mask'\]\)"):
            early.reset(seed=7, options={"reset_mask": np.array([True, False])})  # ale-py's, not honoured here
        early.prefetch_reset(seed=7)  # closed while it runs: close waits for it
    finally:
        plain.close()
        early.close()


def test_a_prefetched_reset_that_failed_raises_at_the_next_reset(monkeypatch):
    pytest.importorskip("ale_py", reason="the [atari] extra is not installed")
    from rl_speed_envs.atari import AtariVectorEnv

    env = AtariVectorEnv(1)
    try:
        def broken(seed):
            raise RuntimeError("emulator gone")

        monkeypatch.setattr(env, "_reset", broken)
        env.prefetch_reset(seed=1)
        with pytest.raises(RuntimeError, match="emulator gone"):
            env.reset(seed=1)
    finally:
        monkeypatch.undo()
        env.close()
