"""Super Mario Bros env: a missing [mario] extra and bad settings fail with clear messages (always run); with the
real emulator installed, uint8 (84, 84, 4) observations, progress to the right, truncation, bad actions."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from rl_speed_envs.mario import SuperMarioBrosEnv


def test_missing_extra_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "gym_super_mario_bros", None)  # import now raises ImportError
    with pytest.raises(ImportError, match=r"pip install --ignore-requires-python nes-py==9\.0\.1 "
                                          r"gym-super-mario-bros==9\.1\.0"):
        SuperMarioBrosEnv()


def test_missing_extra_fails_at_configuration_time(monkeypatch, tmp_path):
    from rl_speed.algorithms.fast_dqn import FastDQNConfig
    from rl_speed.experiments import ExperimentFileError, load_experiments

    monkeypatch.setitem(sys.modules, "gym_super_mario_bros", None)
    with pytest.raises(ImportError, match=r"needs the NES emulator \(the \[mario\] extra"):
        FastDQNConfig().environment("rl_speed/SuperMarioBros-v0").validate()
    path = tmp_path / "mario.yaml"
    path.write_text("mario:\n  run: DQN\n  env: rl_speed/SuperMarioBros-v0\n")  # stock DQN: the CLI checks too
    with pytest.raises(ExperimentFileError, match=r"mario\.env.*cannot start.*pip install"):
        load_experiments(path)


@pytest.mark.parametrize("config, message", [
    ({"world": 9}, "`world`=9 is invalid"),
    ({"frame_skip": 0}, "`frame_skip`=0 is invalid"),
    ({"size": "84"}, "`size`='84' is invalid"),
])
def test_bad_settings_are_named_before_the_emulator_starts(config, message):
    with pytest.raises(ValueError, match=message):
        SuperMarioBrosEnv(**config)


@pytest.fixture
def emulator():
    pytest.importorskip("gym_super_mario_bros", reason="the [mario] extra is not installed")


def test_real_emulator_frames_move_right(emulator):
    env = SuperMarioBrosEnv(max_steps=60)
    obs, info = env.reset(seed=0)
    assert obs.shape == (84, 84, 4) and obs.dtype == np.uint8 and env.observation_space.contains(obs)
    start = info["x_pos"]
    for step in range(60):
        obs, reward, terminated, truncated, info = env.step(3)  # right + B
        assert obs.dtype == np.uint8 and isinstance(reward, float)
        if terminated or truncated:
            break
    assert info["x_pos"] > start + 100
    assert truncated or terminated
    assert not np.array_equal(obs[..., 0], obs[..., -1])  # the stack holds different frames
    with pytest.raises(ValueError, match=r"action must be an integer in \[0, 7\)"):
        env.step(7)
    env.close()


def test_gymnasium_checker_passes(emulator):
    from gymnasium.utils.env_checker import check_env

    env = SuperMarioBrosEnv(max_steps=20)
    check_env(env, skip_render_check=True)
    env.close()
