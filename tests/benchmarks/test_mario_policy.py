"""`rl-speed bench mario-policy`: plays whole episodes on the real emulator with a trained module and with random
actions, loads the module and env settings from a checkpoint folder, and fails clearly on a missing or wrong
--checkpoint."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch

from benchmarks.common import load_policy_module
from benchmarks.evaluate.mario_policy import epsilon_greedy, play, random_policy
from rl_speed.cli.main import USAGE_ERROR, main
from rl_speed.modules.q_net import QNetModule

FRAMES = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)


def test_no_checkpoint_is_a_usage_error(capsys):
    assert main(["bench", "mario-policy", "--repeats", "2"]) == USAGE_ERROR
    assert "needs --checkpoint DIR" in capsys.readouterr().err


def test_a_folder_that_is_no_checkpoint_is_named(tmp_path, capsys):
    assert main(["bench", "mario-policy", "--checkpoint", str(tmp_path), "--output", str(tmp_path)]) == USAGE_ERROR
    err = capsys.readouterr().err
    assert str(tmp_path) in err and "checkpoint_NNNNNN" in err


def _module() -> QNetModule:
    torch.manual_seed(0)
    return QNetModule(observation_space=FRAMES, action_space=gym.spaces.Discrete(7), inference_only=True,
                      model_config={"encoder": "nature", "dueling": True})


def test_checkpoint_round_trip_gives_the_module_and_its_env_config(tmp_path):
    module = _module()
    module.save_to_path(tmp_path / "learner_group" / "learner" / "rl_module" / "default_policy")
    with open(tmp_path / "class_and_ctor_args.pkl", "wb") as f:  # as RLlib writes it: the config's state dict
        pickle.dump({"class": None, "ctor_args_and_kwargs": (({"env_config": {"max_steps": 30}},), {})}, f)
    loaded, env_config = load_policy_module(tmp_path)
    assert env_config == {"max_steps": 30}
    frames = torch.as_tensor(np.random.default_rng(0).integers(0, 256, (3, 84, 84, 4), dtype=np.uint8))
    loaded.eval(), module.eval()
    with torch.inference_mode():
        torch.testing.assert_close(loaded.q(frames), module.q(frames))


def test_both_policies_play_whole_episodes_on_the_emulator():
    pytest.importorskip("gym_super_mario_bros", reason="needs the [mario] extra")
    config = {"max_steps": 25}  # short episodes: every one ends by truncation
    for policy in (random_policy(7), epsilon_greedy(_module(), epsilon=0.5)):
        results = play(policy, episodes=3, env_config=config, num_envs=2)
        assert len(results["returns"]) == len(results["x_pos"]) == 3
        assert np.isfinite(results["returns"]).all() and (results["x_pos"] > 0).all()


def test_episodes_split_over_worker_processes(tmp_path):
    """Each worker process loads the checkpoint and plays its share of the episodes from seeds no other uses."""
    pytest.importorskip("gym_super_mario_bros", reason="needs the [mario] extra")
    from benchmarks.evaluate.mario_policy import compare

    _module().save_to_path(tmp_path / "learner_group" / "learner" / "rl_module" / "default_policy")
    with open(tmp_path / "class_and_ctor_args.pkl", "wb") as f:
        pickle.dump({"class": None, "ctor_args_and_kwargs": (({"env_config": {"max_steps": 20}},), {})}, f)
    results = compare(str(tmp_path), episodes=5, workers=2)
    for name in ("random", "trained"):
        assert len(results[name]["returns"]) == len(results[name]["x_pos"]) == 5


def test_a_device_it_cannot_use_is_a_usage_error(tmp_path, capsys):
    args = ["bench", "mario-policy", "--checkpoint", str(tmp_path), "--device", "cuda", "--output", str(tmp_path)]
    assert main(args) == USAGE_ERROR
    assert "--device cuda is not supported" in capsys.readouterr().err
