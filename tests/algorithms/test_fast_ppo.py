"""FastPPO: the learner's column batch against a per-lane reference, training with remote runners, continuous
actions through sync vectorization, DDP learners, weight-sync schedule, checkpoints, and validation messages."""

from __future__ import annotations

import numpy as np
import pytest
import ray
import torch

import rl_speed

rl_speed.register()

from ray.rllib.core import DEFAULT_MODULE_ID  # noqa: E402
from ray.rllib.core.columns import Columns as RLlibColumns  # noqa: E402
from ray.rllib.evaluation.postprocessing import Postprocessing  # noqa: E402

from rl_speed.algorithms.fast_ppo import PROFILE_KEY, FastPPOConfig  # noqa: E402
from rl_speed.columns import concat_lanes  # noqa: E402


def _config(**training) -> FastPPOConfig:
    return (
        FastPPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0, num_envs_per_env_runner=8, rollout_fragment_length=32)
        .rl_module(model_config={"fcnet_hiddens": [16], "head_fcnet_hiddens": []})
        .training(**{"train_batch_size_per_learner": 256, "minibatch_size": 64, "num_epochs": 2, **training})
        .debugging(seed=1)
    )


def _reference_gae(values, rewards, terminateds, truncateds, valid, gamma, lam):
    """Per lane, per step, plain Python: the textbook recursion restarted at every episode end."""
    t_len, n = rewards.shape
    adv = np.zeros((t_len, n))
    for lane in range(n):
        next_adv = 0.0
        for t in reversed(range(t_len)):
            if not valid[t, lane]:
                next_adv = 0.0
                continue
            bootstrap = 0.0 if terminateds[t, lane] else values[t + 1, lane]
            delta = rewards[t, lane] + gamma * bootstrap - values[t, lane]
            if terminateds[t, lane] or truncateds[t, lane]:
                next_adv = 0.0
            next_adv = delta + gamma * lam * next_adv
            adv[t, lane] = next_adv
    return adv


def test_learner_batch_matches_per_lane_reference(ray_session):
    algo = _config(gamma=0.9, lambda_=0.8).build_algo()
    try:
        columns = algo.env_runner.sample_columns()
        learner = algo.learner_group._learner
        flat = learner.compute_advantages(DEFAULT_MODULE_ID, columns)
        module = learner.module[DEFAULT_MODULE_ID]
        obs = torch.from_numpy(columns["obs"])
        with torch.no_grad():
            values = module.compute_values({RLlibColumns.OBS: obs.reshape(-1, 4)}).reshape(33, 8).numpy()
        valid = columns["valid"]
        assert (~valid).any() and columns["terminateds"].any()  # the batch crosses episode ends
        adv = _reference_gae(values, columns["rewards"], columns["terminateds"], columns["truncateds"], valid,
                             0.9, 0.8)
        targets = adv + values[:-1]
        np.testing.assert_allclose(flat[Postprocessing.VALUE_TARGETS].numpy().reshape(32, 8)[valid],
                                   targets[valid], rtol=1e-4, atol=1e-4)
        real = adv[valid]
        np.testing.assert_allclose(flat[Postprocessing.ADVANTAGES].numpy().reshape(32, 8)[valid],
                                   (real - real.mean()) / real.std(), rtol=1e-3, atol=1e-3)
        assert np.all(flat[Postprocessing.ADVANTAGES].numpy().reshape(32, 8)[~valid] == 0)
        np.testing.assert_array_equal(flat[RLlibColumns.LOSS_MASK].numpy(), valid.reshape(-1))
        np.testing.assert_array_equal(flat[RLlibColumns.ACTIONS].numpy(), columns["actions"].reshape(-1))
        np.testing.assert_array_equal(flat[RLlibColumns.OBS].numpy(), columns["obs"][:-1].reshape(-1, 4))
    finally:
        algo.stop()


def test_trains_with_remote_runner_reports_profile_and_restores(ray_session, tmp_path):
    config = _config().env_runners(num_env_runners=1, num_envs_per_env_runner=8, rollout_fragment_length=32)
    algo = config.build_algo()
    try:
        before = algo.learner_group._learner.module[DEFAULT_MODULE_ID].state_dict()
        before = {k: v.clone() for k, v in before.items()}
        for _ in range(2):
            result = algo.train()
        after = algo.learner_group._learner.module[DEFAULT_MODULE_ID].state_dict()
        assert any(not torch.equal(before[k], after[k]) for k in before)
        sampled = result["env_runners"]["num_env_steps_sampled_lifetime"]  # real steps: reset steps not counted
        assert 0.8 * 2 * 256 <= sampled <= 2 * 256
        profile = result[PROFILE_KEY]
        assert set(profile) >= {"sample_s", "advantages_s", "learn_s", "sync_weights_s", "sample_share"}
        assert abs(sum(profile[k] for k in profile if k.endswith("_share")) - 1.0) < 1e-6
        # Trained steps count real transitions once per epoch (2 epochs).
        trained = result["learners"]["__all_modules__"]["num_env_steps_trained"]
        assert 2 * 0.8 * 256 <= trained <= 2 * 256
        path = algo.save_to_path(str(tmp_path / "ckpt"))
        weights = algo.learner_group._learner.module[DEFAULT_MODULE_ID].state_dict()
    finally:
        algo.stop()
    restored = config.build_algo()
    try:
        restored.restore_from_path(path)
        got = restored.learner_group._learner.module[DEFAULT_MODULE_ID].state_dict()
        assert all(torch.equal(weights[k], got[k]) for k in weights)
        assert sampled < restored.train()["env_runners"]["num_env_steps_sampled_lifetime"] <= sampled + 256
    finally:
        restored.stop()


def test_continuous_actions_through_sync_vectorization(ray_session):
    config = (_config().environment("Pendulum-v1")
              .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=16,
                           gym_env_vectorize_mode="sync")
              .training(train_batch_size_per_learner=64, minibatch_size=32))
    algo = config.build_algo()
    try:
        result = algo.train()
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] == 64  # Pendulum only truncates at 200
        columns = algo.env_runner.sample_columns()
        assert columns["actions"].shape == (16, 4, 1) and columns["action_dist_inputs"].shape == (16, 4, 2)
        # What the env received is inside its bounds even when the module's raw action is not.
        sent = algo.env_runner._env_actions(np.array([[5.0], [-5.0], [0.0], [0.5]], np.float32))
        np.testing.assert_allclose(sent[:, 0], [2.0, -2.0, 0.0, 1.0])
    finally:
        algo.stop()


def test_weights_reach_runners_only_every_k_iterations(ray_session):
    algo = _config(sync_weights_every=3).env_runners(num_env_runners=1).build_algo()
    try:
        def runner_weights():
            return algo.env_runner_group.foreach_env_runner(
                lambda r: {k: v.clone() for k, v in r.module.state_dict().items()}, local_env_runner=False)[0]

        start = runner_weights()
        algo.train()  # iteration 0 -> synced (0 % 3 == 0)
        first = runner_weights()
        algo.train()  # iteration 1 -> not synced
        second = runner_weights()
        assert any(not torch.equal(start[k], first[k]) for k in start)
        assert all(torch.equal(first[k], second[k]) for k in first)
    finally:
        algo.stop()


@pytest.mark.parametrize("runners", [0, 2])  # 0: the driver splits the lanes; 2: each learner fetches a runner's
def test_two_ddp_learners_get_one_lane_shard_each(ray_session, runners):
    config = (_config().learners(num_learners=2, num_cpus_per_learner=0.5)
              .env_runners(num_env_runners=runners, num_cpus_per_env_runner=0.5,
                           num_envs_per_env_runner=8 if runners == 0 else 4))
    algo = config.build_algo()
    try:
        if runners:
            batches = [s.columns for s in algo._sampler.sample()]
            assert all(isinstance(b, ray.ObjectRef) for b in batches)  # the driver holds references only
            assert algo._training_data(batches) == {"batch_refs": batches}
            assert "batches" in algo._training_data(batches[:1] * 3)  # 3 runners' batches do not split over 2
        result = algo.train()
        assert 0.8 * 256 <= result["env_runners"]["num_env_steps_sampled_lifetime"] <= 256
        # each learner's fetch + advantages (the fetch and join a part of it) and minibatch loop, fastest and slowest
        profile = result["rl_speed_profile"]
        for phase in ("advantages", "join", "updates"):
            assert 0 < profile[f"learner_{phase}_s_min"] <= profile[f"learner_{phase}_s_max"] < 60, profile
        assert profile["learner_join_s_max"] <= profile["learner_advantages_s_max"]
        assert profile["learner_updates_s_max"] <= profile["learn_s"] + profile["advantages_s"]
        trained = result["learners"]["__all_modules__"]["num_env_steps_trained"]
        assert trained == result["env_runners"]["num_env_steps_sampled"] * 2  # 2 epochs over every sampled step
        weights = algo.learner_group.foreach_learner(
            lambda learner: {k: v.clone() for k, v in learner.module[DEFAULT_MODULE_ID].state_dict().items()})
        first, second = (w.get() if hasattr(w, "get") else w for w in weights)
        assert all(torch.equal(first[k], second[k]) for k in first)  # DDP kept the replicas identical
    finally:
        algo.stop()


def test_runner_batches_joined_on_the_learner_equal_one_joined_batch(ray_session):
    algo = _config().env_runners(num_envs_per_env_runner=4).build_algo()
    try:
        learner = algo.learner_group._learner
        first, second = algo.env_runner.sample_columns(), algo.env_runner.sample_columns()
        apart, = learner.prepare_columns([first, second], minibatch_size=64)
        joined, = learner.prepare_columns([concat_lanes([first, second])], minibatch_size=64)
        assert apart.minibatch_rows == joined.minibatch_rows and apart.module_steps == joined.module_steps
        for key in joined.batch:
            torch.testing.assert_close(apart.batch[key], joined.batch[key])
        with pytest.raises(ValueError, match="different rollout lengths"):
            learner.prepare_columns([first, {k: v[:-1] for k, v in second.items()}], minibatch_size=64)
    finally:
        algo.stop()


@pytest.mark.parametrize("change, message", [
    (lambda c: c.training(minibatch_size=512), "`minibatch_size` (512) must be <= `train_batch_size_per_learner`"),
    (lambda c: c.learners(num_learners=3), "must split evenly over num_learners=3"),
    (lambda c: c.env_runners(batch_mode="complete_episodes"), "`batch_mode` must be 'truncate_episodes'"),
    (lambda c: c.training(sync_weights_every=0), "`sync_weights_every`=0 must be an integer >= 1"),
    (lambda c: c.training(use_critic=False), "`use_gae` and `use_critic` must be True"),
    (lambda c: c.env_runners(num_env_runners=0, num_envs_per_env_runner=0), "num_envs_per_env_runner"),
])
def test_bad_settings_fail_at_validation_naming_the_key(change, message):
    with pytest.raises(ValueError) as info:
        change(_config()).validate()
    assert message in str(info.value)


def test_async_sampling_overlaps_the_update_and_keeps_counting(ray_session):
    algo = _config(async_sampling=True).env_runners(num_env_runners=2, num_envs_per_env_runner=4).build_algo()
    try:
        steps = [algo.train()["env_runners"]["num_env_steps_sampled_lifetime"] for _ in range(4)]
        assert steps == sorted(steps) and 0.8 * 4 * 256 <= steps[-1] <= 4 * 256
        assert algo._sampler._in_flight == 2  # the next batch is already being sampled
    finally:
        algo.stop()


def test_async_sampling_runners_keep_getting_the_learners_weights(ray_session):
    """Weight pushes have a request tag of their own: under RLlib's "set_state" tag they were dropped behind the
    connector-state broadcast of the same iteration, and the runners' weights lag grew by one per iteration."""
    algo = _config(async_sampling=True).env_runners(num_env_runners=2, num_envs_per_env_runner=4).build_algo()
    try:
        samplers = [algo.train()["sampler"] for _ in range(10)]
        lags = [sampler["weights_lag_max"] for sampler in samplers]
        # Sampled with the weights of one or two updates ago, plus one iteration for a batch kept over from the
        # previous call (a runner holds one request at a time, so at most one batch is kept): never older.
        assert max(lags) <= 3, lags
        # The runners' own sample_columns() wall-clock, fastest and slowest of the batches of the iteration.
        assert all(0 < s["sample_s_min"] <= s["sample_s_max"] < 60 for s in samplers), samplers
    finally:
        algo.stop()


def test_runners_holding_two_requests_keep_sampling_and_every_iteration_trains_one_batch_each(ray_session):
    """RLlib's ``max_requests_in_flight_per_env_runner`` reaches the column sampler: each runner holds two sample
    requests (so it samples on while the driver waits for the learner), every iteration still trains on one batch per
    runner, and the weights lag stays bounded (about one update more than with one request)."""
    algo = (_config(async_sampling=True).env_runners(num_env_runners=2, num_envs_per_env_runner=4,
                                                      max_requests_in_flight_per_env_runner=2).build_algo())
    try:
        results = [algo.train() for _ in range(8)]
        assert [r["sampler"]["batches_received_lifetime"] for r in results] == [2 * (i + 1) for i in range(8)]
        # Every call ends with each runner holding two requests (a fetch sends one, so the sampler tops them up;
        # without that, a runner that handed over both batches held one: 2-4 in flight, by timing)
        assert [r["sampler"]["requests_in_flight"] for r in results] == [4] * 8
        assert max(r["sampler"]["weights_lag_max"] for r in results) <= 5
    finally:
        algo.stop()


def test_every_runner_samples_one_rollout_length_where_the_batch_does_not_split_over_the_lanes():
    """RLlib's `rollout_fragment_length: auto` gives the first runners one step more where the batch does not divide
    by the lanes (4,000 over 12 lanes: 334 and 333, as RLlib's async vectorization example configures it), which
    columns cannot join: FastPPO gives every runner the longer one (the batch rounds up to 4,008)."""
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    config = (FastPPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=2, num_envs_per_env_runner=6, gym_env_vectorize_mode="async"))
    config.validate()
    assert [config.get_rollout_fragment_length(i) for i in (0, 1, 2)] == [334, 334, 334]
    config.env_runners(rollout_fragment_length=50)
    assert config.get_rollout_fragment_length(2) == 50


class _Frames:
    """A 40 x 40 uint8 frame with one bright pixel that moves a column per step over a grey background (Pong's
    picture in miniature); episodes of 6 steps. A gymnasium env, built from its class in the runner's process."""

    def __new__(cls, config=None):
        import gymnasium as gym

        class Frames(gym.Env):
            observation_space = gym.spaces.Box(0, 255, (40, 40, 1), np.uint8)
            action_space = gym.spaces.Discrete(2)

            def _frame(self):
                frame = np.full((40, 40, 1), 90, np.uint8)
                frame[20, self.t * 5, 0] = 236
                return frame

            def reset(self, *, seed=None, options=None):
                self.t = 0
                return self._frame(), {}

            def step(self, action):
                self.t += 1
                return self._frame(), float(action), self.t == 6, False, {}

        return Frames()


def test_normalize_value_gae_in_returns_units_and_the_head_trained_on_standardized_targets(ray_session):
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rl_speed.gae import vectorized_gae
    from rl_speed.modules.pixels import NatureActorCritic

    algo = (FastPPOConfig().environment(_Frames)
            .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=8)
            .rl_module(rl_module_spec=RLModuleSpec(module_class=NatureActorCritic),
                       model_config={"normalize_value": True})
            .training(train_batch_size_per_learner=32, minibatch_size=16, num_epochs=1, gamma=0.9, lambda_=0.8)
            .debugging(seed=3)).build_algo()
    try:
        learner = algo.learner_group._learner
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        norm = module.value_norm
        norm.mean.fill_(2.0), norm.var.fill_(9.0), norm.count.fill_(50.0)  # statistics of earlier batches
        columns = algo.env_runner.sample_columns()
        valid = torch.from_numpy(columns["valid"])
        assert (~valid).any()  # reset steps are not steps taken: not folded in
        with torch.no_grad():
            head = module.compute_values({RLlibColumns.OBS: torch.from_numpy(columns["obs"]).flatten(0, 1)})
        values = (head.clamp(-5, 5) * 3.0 + 2.0).reshape(9, 4)  # the head's output in returns' units
        advantages, targets = vectorized_gae(
            values, torch.from_numpy(columns["rewards"]), torch.from_numpy(columns["terminateds"]),
            torch.from_numpy(columns["truncateds"]), valid, gamma=0.9, lambda_=0.8)
        batch = learner.compute_advantages(DEFAULT_MODULE_ID, columns)
        real = targets[valid].double()
        n = len(real)
        count = 50.0 + n
        mean = 2.0 + (real.mean() - 2.0) * n / count
        var = (9.0 * 50.0 + real.var(unbiased=False) * n + (real.mean() - 2.0) ** 2 * 50.0 * n / count) / count
        assert norm.count.item() == count
        torch.testing.assert_close(norm.mean, mean)
        torch.testing.assert_close(norm.var, var)
        # the loss's targets: the returns standardized by the statistics that now include them
        expected = ((targets - mean) / torch.sqrt(var + 1e-5)).clamp(-5, 5).float().reshape(-1)
        torch.testing.assert_close(batch[Postprocessing.VALUE_TARGETS], expected)
        # advantages from values in returns' units (then standardized over real steps, as without the key)
        a = advantages[valid]
        torch.testing.assert_close(batch[Postprocessing.ADVANTAGES].reshape(8, 4)[valid],
                                   (a - a.mean()) / a.std(unbiased=False).clamp(min=1e-4), rtol=1e-4, atol=1e-4)
        result = algo.train()
        assert np.isfinite(result["learners"][DEFAULT_MODULE_ID]["vf_loss"])
    finally:
        algo.stop()


def test_normalize_obs_statistics_follow_each_batchs_real_steps_and_reach_the_runners(ray_session):
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rl_speed.modules.pixels import NatureActorCritic

    algo = (FastPPOConfig().environment(_Frames)
            .env_runners(num_env_runners=0, num_envs_per_env_runner=4, rollout_fragment_length=8)
            .rl_module(rl_module_spec=RLModuleSpec(module_class=NatureActorCritic),
                       model_config={"normalize_obs": True})
            .training(train_batch_size_per_learner=32, minibatch_size=16, num_epochs=1)
            .debugging(seed=2)).build_algo()
    try:
        learner = algo.learner_group._learner
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        columns = algo.env_runner.sample_columns()
        valid = columns["valid"]
        assert (~valid).any()  # the batch holds lanes' reset steps, which are not steps taken
        learner.compute_advantages(DEFAULT_MODULE_ID, columns)
        pixels = columns["obs"][:-1][valid].astype(np.float64).transpose(0, 3, 1, 2) / 255
        n = len(pixels)
        assert module.obs_norm.count.item() == 1 + n
        np.testing.assert_allclose(module.obs_norm.mean.numpy(), pixels.mean(0) * n / (n + 1), rtol=1e-6)
        result = algo.train()  # one more batch, then its weights and statistics go to the runner
        trained = result["learners"]["__all_modules__"]["num_env_steps_trained"]  # the real steps of that batch
        assert 0 < trained < 32 and module.obs_norm.count.item() == 1 + n + trained
        runner_state = algo.env_runner.module.state_dict()
        for key in ("obs_norm.mean", "obs_norm.var", "obs_norm.count"):
            torch.testing.assert_close(runner_state[key], module.state_dict()[key])
    finally:
        algo.stop()
