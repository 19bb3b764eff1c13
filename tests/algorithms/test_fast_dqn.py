"""FastDQN: same loss as stock DQN on the same transitions, config validation, checkpoint/restore with the buffer,
remote env runners, and the algorithm registered for Tune/YAML."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import rl_speed

rl_speed.register()

from ray.rllib.core import DEFAULT_MODULE_ID  # noqa: E402
from ray.rllib.env.single_agent_episode import SingleAgentEpisode  # noqa: E402

from rl_speed.algorithms.fast_dqn import FastDQNConfig  # noqa: E402


def _config(**training) -> FastDQNConfig:
    return (
        FastDQNConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=8, rollout_fragment_length=32)
        .rl_module(model_config={"fcnet_hiddens": [32], "head_fcnet_hiddens": []})
        .training(**{"train_batch_size_per_learner": 64, "n_step": 3, "training_intensity": 4,
                     "num_steps_sampled_before_learning_starts": 256,
                     "replay_buffer_config": {"type": "PrioritizedEpisodeReplayBuffer", "capacity": 5000}, **training})
        .debugging(seed=3)
    )


def _loss(learner, batch) -> float:
    module = learner.module[DEFAULT_MODULE_ID]
    tensors = {k: torch.as_tensor(np.asarray(v)) for k, v in batch.items()}
    with torch.no_grad():
        fwd = module.forward_train(tensors)
        loss = learner.compute_loss_for_module(module_id=DEFAULT_MODULE_ID, config=learner.config,
                                               batch=tensors, fwd_out=fwd)
    return float(loss)


def test_loss_on_fixed_transitions_equals_stock_dqn_pipeline(ray_session):
    algo = _config().build_algo()
    try:
        for _ in range(3):
            algo.train()
        # 512 draws: enough that windows cut short by an episode end are always among them (the check below).
        sample = algo.replay_buffer.sample(512, n_step=3, gamma=0.99, beta=0.4)
        learner = algo.learner_group._learner
        # Stock path: the 1-step episodes RLlib's PrioritizedEpisodeReplayBuffer would hand to the learner
        # connector pipeline (n-step reward, weights and n_step as extra model outputs).
        episodes = [
            SingleAgentEpisode(
                observations=[sample["obs"][i], sample["next_obs"][i]], actions=[sample["actions"][i]],
                rewards=[sample["rewards"][i]], terminated=bool(sample["terminateds"][i]),
                extra_model_outputs={"weights": [sample["weights"][i]], "n_step": [sample["n_step"][i]]},
                observation_space=learner.module[DEFAULT_MODULE_ID].observation_space,
                action_space=learner.module[DEFAULT_MODULE_ID].action_space, len_lookback_buffer=0,
            ).to_numpy()
            for i in range(512)
        ]
        stock_batch = learner._learner_connector(rl_module=learner.module, batch={}, episodes=episodes,
                                                 shared_data={}, metrics=None)[DEFAULT_MODULE_ID]
        ours = {"obs": sample["obs"], "new_obs": sample["next_obs"], "actions": sample["actions"],
                "rewards": sample["rewards"], "terminateds": sample["terminateds"],
                "n_step": sample["n_step"].astype(np.float32), "weights": sample["weights"]}
        ours_loss, stock_loss = _loss(learner, ours), _loss(learner, stock_batch)
        assert ours_loss > 0 and abs(ours_loss - stock_loss) < 1e-6
        assert (sample["n_step"] < 3).any() and (sample["n_step"] == 3).any()  # episode ends inside the window
    finally:
        algo.stop()


@pytest.mark.parametrize(
    "training, needle",
    [
        ({"replay_buffer_config": {"type": "PrioritizedEpisodeReplayBuffer", "capacity": 10}}, "capacity"),
        ({"n_step": 0}, "n_step"),
        ({"n_step": (1, 3)}, "n_step"),
        ({"replay_buffer_config": {"type": "PrioritizedEpisodeReplayBuffer", "capacity": 5000, "alpha": -1}}, "alpha"),
        ({"replay_buffer_config": {"type": "PrioritizedEpisodeReplayBuffer", "capacity": 5000, "beta": 2}}, "beta"),
        ({"replay_buffer_config": {"type": "ReservoirReplayBuffer", "capacity": 5000}}, "replay_buffer_config.type"),
        ({"replay_buffer_config": {"type": "PrioritizedEpisodeReplayBuffer", "capacity": 5000,
                                   "importance_weights": "global"}}, "importance_weights"),
        ({"replay_buffer_config": {"type": "PrioritizedEpisodeReplayBuffer", "capacity": 5000,
                                   "prioritized_replay_eps": 1e-6}}, r"keys \['prioritized_replay_eps'\]"),
        ({"training_intensity": -1}, "training_intensity"),
        ({"train_every_env_steps": 4}, "either"),
    ],
)
def test_bad_settings_fail_at_validation_naming_the_key(training, needle):
    with pytest.raises(ValueError, match=needle):
        _config(**training).validate()


@pytest.mark.parametrize("weights", ["batch", "buffer"])
def test_importance_weights_setting_reaches_the_buffer(ray_session, weights):
    config = _config(replay_buffer_config={"type": "PrioritizedEpisodeReplayBuffer", "capacity": 5000,
                                           "importance_weights": weights})
    algo = config.build_algo()
    try:
        assert algo.replay_buffer.importance_weights == weights
    finally:
        algo.stop()


def test_continuous_actions_are_refused_with_a_pointer(ray_session):
    config = _config().environment("Pendulum-v1")
    with pytest.raises(Exception, match="Discrete action space"):
        config.build_algo()


def test_native_vector_env_is_chosen_when_the_env_has_one():
    config = _config().environment("rl_speed/Snake-v0", env_config={"observation": "flat"})
    config.validate()
    assert config.gym_env_vectorize_mode == "vector_entry_point"


def test_remote_env_runners_fill_the_buffer_and_learn(ray_session):
    algo = _config().env_runners(num_env_runners=1).build_algo()
    try:
        results = [algo.train() for _ in range(3)]
    finally:
        algo.stop()
    last = results[-1]
    assert last["replay_buffer"]["added"] == last["env_runners"]["num_env_steps_sampled_lifetime"]
    assert last["learners"][DEFAULT_MODULE_ID]["num_module_steps_trained_lifetime"] > 0


RESTORE = """
import json, sys, numpy as np, rl_speed
rl_speed.register()
import ray
ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
from rl_speed.algorithms.fast_dqn import FastDQN
algo = FastDQN.from_checkpoint(sys.argv[1])
state = algo.replay_buffer.get_state()
digest = {k: float(np.asarray(v, dtype=np.float64).sum()) for k, v in sorted(state.items())
          if isinstance(v, np.ndarray) and v.dtype != object}
before = algo.replay_buffer.get_metrics()
result = algo.train()
print(json.dumps({"digest": digest, "metrics": {k: float(v) for k, v in before.items()},
                  "iteration": result["training_iteration"],
                  "steps": result["env_runners"]["num_env_steps_sampled_lifetime"]}))
algo.stop()
ray.shutdown()
"""


def test_checkpoint_restores_buffer_and_counters_in_a_new_process(ray_session, tmp_path):
    algo = _config().build_algo()
    try:
        for _ in range(3):
            result = algo.train()
        algo.save_to_path(str(tmp_path))
        state = algo.replay_buffer.get_state()
        digest = {k: float(np.asarray(v, dtype=np.float64).sum()) for k, v in sorted(state.items())
                  if isinstance(v, np.ndarray) and v.dtype != object}
        metrics = {k: float(v) for k, v in algo.replay_buffer.get_metrics().items()}
        steps = result["env_runners"]["num_env_steps_sampled_lifetime"]
    finally:
        algo.stop()
    proc = subprocess.run([sys.executable, "-c", RESTORE, str(tmp_path)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    restored = json.loads(proc.stdout.strip().splitlines()[-1])
    assert restored["digest"] == digest
    assert restored["metrics"] == metrics
    assert restored["iteration"] == 4  # training continues from iteration 3
    assert restored["steps"] > steps  # lifetime counters continue, not restart


def test_weights_reach_the_env_runners_every_k_iterations(ray_session):
    algo = _config(sync_weights_every=2).build_algo()

    def runner_matches_learner() -> bool:
        runner = algo.env_runner.module.state_dict()
        learner = algo.learner_group._learner.module[DEFAULT_MODULE_ID].state_dict()
        return all(torch.equal(runner[k], learner[k]) for k in runner)

    try:
        algo.train()  # iteration 0: synced at the end of each training step
        assert runner_matches_learner()
        algo.train()  # iteration 1: the learner moved on, the runner kept its weights
        assert not runner_matches_learner()
        algo.train()  # iteration 2: synced again
        assert runner_matches_learner()
    finally:
        algo.stop()


def test_env_without_native_vector_form_runs_through_sync_vectorization(ray_session):
    config = _config().environment("Acrobot-v1")
    config.validate()
    assert config.gym_env_vectorize_mode == "sync"  # Acrobot has no vector entry point
    algo = config.build_algo()
    try:
        result = algo.train()
    finally:
        algo.stop()
    assert result["replay_buffer"]["added"] == result["env_runners"]["num_env_steps_sampled_lifetime"] > 0


def test_async_sampling_fills_the_buffer_from_remote_runners(ray_session):
    algo = _config(async_sampling=True).env_runners(num_env_runners=1).build_algo()
    try:
        for _ in range(4):
            result = algo.train()
        assert result["replay_buffer"]["size"] >= 3 * 8 * 32 * 0.8
        assert algo._sampler._in_flight == 1
        sampler = result["sampler"]
        # (DQN's min_sample_timesteps_per_iteration runs several training steps per train() call)
        assert sampler["batches_received_lifetime"] >= 4 and sampler["batches_dropped_lifetime"] == 0
        assert sampler["requests_in_flight"] == 1
        # Each batch after the first was sampled while the learner moved on: one update call behind the sync.
        assert sampler["batches_stale_lifetime"] >= 2 and sampler["weights_lag_max"] >= 1
        assert 0.05 <= result["monitor"]["epsilon"] <= 1.0
        assert result["monitor"]["replay_ratio"] == pytest.approx(4.0, rel=0.15)  # training_intensity 4
    finally:
        algo.stop()


def test_streaming_runners_keep_getting_the_learners_weights(ray_session):
    """See test_fast_ppo's test of the same name: the weights lag stays bounded under streaming sampling."""
    algo = _config(async_sampling=True).env_runners(num_env_runners=2).build_algo()
    try:
        lags = [algo.train()["sampler"]["weights_lag_max"] for _ in range(8)]
        assert max(lags) <= 4, lags
    finally:
        algo.stop()


def test_streaming_sampling_takes_batches_from_every_runner_without_waiting_for_all(ray_session):
    algo = _config(async_sampling=True).env_runners(num_env_runners=2).build_algo()
    seen: set[int] = set()
    sample = algo._sampler.sample

    def recording_sample():
        batches = sample()
        seen.update(b.worker_index for b in batches)
        assert 1 <= len(batches) <= 2  # whatever is ready, at least one
        return batches

    algo._sampler.sample = recording_sample
    try:
        for _ in range(3):
            result = algo.train()
        assert seen == {1, 2}
        assert 1 <= result["sampler"]["requests_in_flight"] <= 2  # every runner that handed over is sampling again
        assert result["replay_buffer"]["size"] > 0
    finally:
        algo.stop()


def test_synchronous_sampling_is_never_stale_and_a_lost_runner_counts_as_dropped(ray_session):
    # One training step per train() call, so an iteration whose batch is dropped ends instead of sampling on.
    algo = _config().env_runners(num_env_runners=1).reporting(min_sample_timesteps_per_iteration=0).build_algo()
    try:
        for _ in range(3):
            result = algo.train()
        sampler = result["sampler"]
        assert sampler["batches_received_lifetime"] >= 3
        assert (sampler["batches_dropped_lifetime"], sampler["batches_stale_lifetime"], sampler["weights_lag_max"]) \
            == (0, 0, 0)
        algo.config._is_frozen = False
        algo.config.sample_timeout_s = 1e-4  # no runner answers a remote call in time: its batch is dropped
        result = algo.train()
        assert result["sampler"]["batches_dropped_lifetime"] >= 1
    finally:
        algo.stop()


def test_epsilon_at_follows_dqns_piecewise_schedule():
    from rl_speed.algorithms.fast_dqn import epsilon_at

    assert epsilon_at(0.1, 10**6) == 0.1
    assert epsilon_at([[0, 1.0], [100, 0.0]], 25) == pytest.approx(0.75)
    assert epsilon_at([[0, 1.0], [100, 0.05]], 10**6) == pytest.approx(0.05)


def test_iteration_reports_its_time_split_over_all_training_steps(ray_session):
    from rl_speed.algorithms.telemetry import PROFILE_KEY

    # min_time_s_per_iteration makes one train() call run several training steps: the profile sums over all.
    algo = _config().reporting(min_time_s_per_iteration=0.5).build_algo()
    try:
        algo.train()
        result = algo.train()
    finally:
        algo.stop()
    profile = result[PROFILE_KEY]
    assert set(profile) == {f"{p}_{k}" for p in ("sample", "replay", "learn", "sync_weights") for k in ("s", "share")}
    assert abs(sum(profile[k] for k in profile if k.endswith("_share")) - 1.0) < 1e-6
    assert profile["learn_s"] > 0 and profile["replay_s"] > 0
    assert 0.4 <= sum(profile[k] for k in profile if k.endswith("_s")) <= result["time_this_iter_s"]
    assert result["timers"]["learner_update_timer"] > 0  # RLlib's own timer keys, from the same measurements


@pytest.mark.parametrize("training, lanes, fragment, ratio", [
    ({"training_intensity": 0.5}, 256, 8, 0.5),  # batch 64: 128 env steps per update; 16 updates = 8 per lane
    ({}, 8, 16, 64 / 8),  # RLlib's native ratio: one update of 64 per n_step (1) step on each of 8 lanes
    ({"train_every_env_steps": 4}, 8, 8, 64 / 4),
])
def test_auto_fragment_samples_16_updates_worth_per_training_step_at_the_configured_ratio(
        ray_session, training, lanes, fragment, ratio):
    config = (_config(**training).env_runners(num_envs_per_env_runner=lanes, rollout_fragment_length="auto")
              .training(num_steps_sampled_before_learning_starts=0, n_step=1, training_intensity=training.get(
                  "training_intensity"), train_every_env_steps=training.get("train_every_env_steps")))
    assert config.get_rollout_fragment_length() == fragment
    algo = config.build_algo()
    try:
        for _ in range(2):
            result = algo.train()
    finally:
        algo.stop()
    assert result["monitor"]["replay_ratio"] == pytest.approx(ratio, rel=0.15)


def test_normalize_obs_statistics_follow_the_replayed_batches_and_reach_the_runners(ray_session):
    algo = _config().rl_module(model_config={"fcnet_hiddens": [32], "head_fcnet_hiddens": [],
                                             "normalize_obs": True}).build_algo()
    try:
        module = algo.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped()
        result = {}
        while not result.get("learners", {}).get(DEFAULT_MODULE_ID, {}).get("num_module_steps_trained_lifetime"):
            result = algo.train()
        replayed = result["learners"][DEFAULT_MODULE_ID]["num_module_steps_trained_lifetime"]
        assert module.q.obs_norm.count.item() == 1 + replayed  # every replayed row folded in once
        assert module.q.obs_norm.var.min() < 0.5  # CartPole's velocities and angles: far from the start's 1
        runner_state = algo.env_runner.module.state_dict()
        for key in ("q.obs_norm.mean", "q.obs_norm.var", "q.obs_norm.count"):
            torch.testing.assert_close(runner_state[key], module.state_dict()[key])
    finally:
        algo.stop()
