"""Overlapped lane groups (rl_speed.env_runners.overlapped): a runner whose Atari env steps two lane groups apart
records exactly the columns and episodes of the plain loop, across calls, and refuses what it cannot honour."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import rl_speed
from rl_speed.env_runners.overlapped import check_overlap_supported

ale_py = pytest.importorskip("ale_py", reason="the [atari] extra is not installed")


def _runner(groups: int, evaluation: bool = False, **callbacks):
    rl_speed.register()
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rl_speed.algorithms.fast_ppo import FastPPOConfig
    from rl_speed.env_runners import BatchedEnvRunner
    from rl_speed.modules.pixels import NatureActorCritic

    # 200 frames = 50 agent steps per episode: two calls of 30 steps cross every lane's episode end and reset step
    config = (FastPPOConfig()
              .environment("rl_speed/Atari-v0", env_config={"game": "pong", "max_num_frames_per_episode": 200,
                                                            "lane_groups": groups})
              .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=30,
                           gym_env_vectorize_mode="vector_entry_point")
              .rl_module(rl_module_spec=RLModuleSpec(module_class=NatureActorCritic))
              .callbacks(**callbacks)
              .debugging(seed=0))
    if evaluation:  # what an algorithm's evaluation runners get
        config = config.get_evaluation_config_object()
    return BatchedEnvRunner(config=config)


def test_overlapped_groups_record_the_plain_loops_columns_and_episodes():
    torch.manual_seed(0)
    plain, overlapped = _runner(1), _runner(2)
    try:
        overlapped.module.load_state_dict(plain.module.state_dict())
        for call in range(2):  # the second call continues the first's episodes
            expected = plain.sample_columns(explore=False)
            got = overlapped.sample_columns(explore=False)
            assert set(got) == set(expected), call
            for key in ("obs", "actions", "rewards", "terminateds", "truncateds", "valid"):
                np.testing.assert_array_equal(got[key], expected[key], err_msg=f"{call} {key}")
            for key in set(expected) - {"obs", "actions", "rewards", "terminateds", "truncateds", "valid"}:
                np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, atol=1e-5, err_msg=f"{call} {key}")
        assert (~expected["valid"]).any()  # the rollouts crossed episode ends
        metrics = [runner.get_metrics() for runner in (plain, overlapped)]
        for key in ("episode_return_mean", "episode_len_mean", "num_env_steps_sampled_lifetime", "game_return_mean"):
            assert float(metrics[1][key]) == pytest.approx(float(metrics[0][key])), key
        assert float(metrics[0]["episode_len_mean"]) == 50
        # a Pong game is one episode, its score the sum of its rewards (each +-1: clipped or not)
        assert float(metrics[0]["game_return_mean"]) == pytest.approx(float(metrics[0]["episode_return_mean"]))
    finally:
        plain.stop()
        overlapped.stop()


def test_random_actions_fill_every_lane_of_both_groups():
    runner = _runner(2)
    try:
        columns = runner.sample_columns(random_actions=True)
        assert columns["actions"].shape == (30, 4) and columns["obs"].shape == (31, 4, 84, 84, 4)
        assert columns["valid"].all()  # no episode ended within 30 steps
        assert len(np.unique(columns["actions"])) > 1
    finally:
        runner.stop()


def test_a_runner_with_episode_callbacks_is_refused_when_built():
    with pytest.raises(ValueError, match=r"`lane_groups`=2 .* episode callbacks \['on_episode_step'\]"):
        _runner(2, on_episode_step=lambda **kwargs: None)


def test_an_evaluation_runner_with_episode_callbacks_samples_through_rllib_and_refuses_the_overlapped_loop():
    seen = []
    runner = _runner(2, evaluation=True, on_episode_end=lambda episode, **kwargs: seen.append(episode.get_return()))
    try:
        episodes = runner.sample(num_episodes=4, explore=False)  # RLlib's sample(): every group stepped together
        assert len(seen) >= 4 and all(e.is_done for e in episodes)
        with pytest.raises(ValueError, match=r"episode callbacks \['on_episode_end'\]"):
            runner.sample_columns()
    finally:
        runner.stop()


def _grouped_env(wrapped: bool = False):
    from gymnasium.vector import VectorWrapper

    from rl_speed_envs.atari import AtariVectorEnv

    env = AtariVectorEnv(2, lane_groups=2)
    return VectorWrapper(env) if wrapped else env


@pytest.mark.parametrize("stateful, pieces, wrapped, named", [
    (True, [], False, "a recurrent module"),
    (False, ["piece"], False, "env-to-module connector pieces"),
    (False, [], True, r"a wrapper around the env \(VectorWrapper\)"),  # e.g. the race's judge
])
def test_what_the_overlapped_loop_cannot_honour_is_named(stateful, pieces, wrapped, named):
    env = _grouped_env(wrapped)
    runner = SimpleNamespace(module=SimpleNamespace(is_stateful=lambda: stateful), _connectors=pieces,
                             _callback_names=frozenset(), env=env)
    try:
        with pytest.raises(ValueError, match=named) as info:
            check_overlap_supported(runner)
        assert "Set `lane_groups: 1` in env_config" in str(info.value)
    finally:
        env.close()
