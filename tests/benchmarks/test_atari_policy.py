"""`rl-speed bench atari-policy`: plays one whole episode per emulator with a checkpoint's module (greedy, and
sampled for a policy-gradient module) and with random actions, under the sticky actions it was trained with and under
the standard 0.25, full games; a missing --checkpoint is a usage error."""

from __future__ import annotations

import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch

from rl_speed.cli.main import USAGE_ERROR, main

FRAMES = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
SHORT_PONG = {"game": "pong", "max_num_frames_per_episode": 200}  # every episode ends by truncation after 50 steps


def test_no_checkpoint_is_a_usage_error(capsys):
    assert main(["bench", "atari-policy", "--repeats", "2"]) == USAGE_ERROR
    assert "atari-policy needs --checkpoint DIR" in capsys.readouterr().err


def _checkpoint(tmp_path, module, env_config):
    module.save_to_path(tmp_path / "learner_group" / "learner" / "rl_module" / "default_policy")
    with open(tmp_path / "class_and_ctor_args.pkl", "wb") as f:  # as RLlib writes it: the config's state dict
        pickle.dump({"class": None, "ctor_args_and_kwargs": (({"env_config": env_config},), {})}, f)
    return tmp_path


def test_a_ppo_checkpoint_is_played_greedy_sampled_and_against_random(tmp_path, capsys):
    pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")
    from rl_speed.modules.pixels import NatureActorCritic

    torch.manual_seed(0)
    module = NatureActorCritic(observation_space=FRAMES, action_space=gym.spaces.Discrete(6), model_config={})
    checkpoint = _checkpoint(tmp_path / "ckpt", module, SHORT_PONG)
    assert main(["bench", "atari-policy", "--checkpoint", str(checkpoint), "--repeats", "2",
                 "--output", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    for policy in ("greedy", "sampled", "random"):
        for sticky in ("0", "0.25"):
            assert f"| {policy} | {sticky} |" in table
    assert "'game': 'pong'" in table


def test_protocols_are_the_trained_sticky_actions_and_the_standard_one_on_full_games():
    from benchmarks.evaluate.atari_policy import protocols

    configs = protocols({"game": "pong", "repeat_action_probability": 0.0, "episodic_life": True})
    assert sorted(configs) == [0.0, 0.25]
    assert all(not c["episodic_life"] and c["repeat_action_probability"] == p for p, c in configs.items())
    assert sorted(protocols({"game": "pong", "repeat_action_probability": 0.25})) == [0.25]


def test_a_q_network_is_played_greedy_only():
    pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")
    from benchmarks.evaluate.atari_policy import evaluate
    from rl_speed.modules.q_net import QNetModule

    module = QNetModule(observation_space=FRAMES, action_space=gym.spaces.Discrete(6), inference_only=True,
                        model_config={"encoder": "nature"})
    results = evaluate(module, SHORT_PONG, episodes=3)
    assert set(results) == {"greedy", "random"}
    for returns in results.values():
        assert returns.shape == (3,) and np.isfinite(returns).all() and (np.abs(returns) <= 21).all()


def test_plays_at_once_score_what_they_score_one_by_one():
    pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")
    from benchmarks.common import random_policy
    from benchmarks.evaluate.atari_policy import evaluate_protocols, module_policy, play, protocols
    from rl_speed.modules.pixels import NatureActorCritic

    torch.manual_seed(0)
    module = NatureActorCritic(observation_space=FRAMES, action_space=gym.spaces.Discrete(6), model_config={})
    configs = protocols({**SHORT_PONG, "max_num_frames_per_episode": 400})  # sticky 0.0 and 0.25, 100 steps a game
    at_once = evaluate_protocols(module, configs, episodes=3)
    for sticky, config in configs.items():
        one_by_one = {"greedy": play(module_policy(module, "greedy"), 3, config),
                      "sampled": play(module_policy(module, "sample"), 3, config),
                      "random": play(random_policy(6), 3, config)}
        assert list(at_once[sticky]) == list(one_by_one)
        for name, returns in one_by_one.items():
            assert np.array_equal(at_once[sticky][name], returns), (sticky, name)
