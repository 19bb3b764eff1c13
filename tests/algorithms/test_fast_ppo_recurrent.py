"""FastPPO with rl_speed's LSTM module and with RLlib's own (use_lstm): the runner's carried state and the learner's
chunks / padded sequences agree, state resets at episode starts, the recurrent policies solve a memory task a
feed-forward one cannot, and bad BPTT settings are named at validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rl_speed

rl_speed.register()

from ray.rllib.core import DEFAULT_MODULE_ID  # noqa: E402
from ray.rllib.core.columns import Columns as RLlibColumns  # noqa: E402
from ray.rllib.core.rl_module.rl_module import RLModuleSpec  # noqa: E402

from rl_speed.algorithms.fast_ppo import FastPPOConfig  # noqa: E402
from rl_speed.modules.recurrent import RecurrentActorCritic  # noqa: E402


def _config(recurrent: bool = True, length: int = 5, **training) -> FastPPOConfig:
    config = (
        FastPPOConfig()
        .environment("rl_speed/CueCorridor-v0", env_config={"length": length})
        .env_runners(num_env_runners=0, num_envs_per_env_runner=64, rollout_fragment_length=32)
        .training(**{"train_batch_size_per_learner": 2048, "minibatch_size": 512, "num_epochs": 4, "lr": 1e-3,
                     "bptt_horizon": 16, "entropy_coeff": 0.01, **training})
        .rl_module(model_config={"fcnet_hiddens": [32], "lstm_cell_size": 32})
        .debugging(seed=0)
    )
    if recurrent:
        config = config.rl_module(rl_module_spec=RLModuleSpec(module_class=RecurrentActorCritic))
    return config


def test_learner_chunks_replay_the_runner_recurrence(ray_session):
    algo = _config(num_epochs=1).env_runners(num_envs_per_env_runner=4).training(
        train_batch_size_per_learner=128, minibatch_size=64).build_algo()
    try:
        runner = algo.env_runner
        runner.sample_columns()  # so the second rollout starts from a carried, non-zero state
        columns = runner.sample_columns()
        assert columns["state_in"]["h"].shape == (2, 4, 32) and np.abs(columns["state_in"]["h"][0]).sum() > 0
        assert columns["is_first"].any() and not columns["is_first"].all()
        learner = algo.learner_group._learner
        batch = learner.compute_advantages(DEFAULT_MODULE_ID, columns)
        # Reference: the module stepped one observation at a time from the rollout's first state, resetting the
        # state where an episode starts, as the runner did.
        module = learner.module[DEFAULT_MODULE_ID]
        state = {k: torch.from_numpy(v[0]) for k, v in columns["state_in"].items()}
        values = []
        with torch.no_grad():
            for t in range(33):
                if t < 32:
                    first = torch.from_numpy(columns["is_first"][t])[:, None]
                else:
                    first = torch.from_numpy(~columns["valid"][31])[:, None]
                state = {k: v * (~first) for k, v in state.items()}
                out = module._forward({RLlibColumns.OBS: torch.from_numpy(columns["obs"][t]),
                                       RLlibColumns.STATE_IN: state})
                values.append(module.compute_values({}, embeddings=out[RLlibColumns.EMBEDDINGS]))
                state = out[RLlibColumns.STATE_OUT]
        reference = torch.stack(values[:32])  # [T, N]
        got = batch[RLlibColumns.VF_PREDS].reshape(2, 4, 16).transpose(1, 2).reshape(32, 4)
        torch.testing.assert_close(got, reference, rtol=1e-5, atol=1e-5)
        assert batch[RLlibColumns.OBS].shape == (8, 16, 4)  # [K * N, L, obs]
    finally:
        algo.stop()


def test_lstm_solves_the_cue_corridor_and_a_feed_forward_policy_cannot(ray_session):
    returns = {}
    for recurrent in (True, False):
        algo = _config(recurrent).build_algo()
        try:
            for _ in range(40):
                result = algo.train()
            returns[recurrent] = result["env_runners"]["episode_return_mean"]
        finally:
            algo.stop()
    assert returns[True] > 0.9, returns  # remembers the cue
    assert abs(returns[False]) < 0.3, returns  # a memoryless policy is at chance (expected return 0)


@pytest.mark.parametrize("change, message", [
    (lambda c: c.training(bptt_horizon=10), "not a multiple of the recurrent chunk length 10 (`bptt_horizon`)"),
    (lambda c: c.training(minibatch_size=520), "`minibatch_size`=520 must be a multiple of `bptt_horizon`=16"),
    (lambda c: c.training(bptt_horizon=0), "`bptt_horizon`=0 must be an integer >= 1"),
])
def test_bad_bptt_settings_fail_at_validation(change, message):
    with pytest.raises(ValueError) as info:
        change(_config()).validate()
    assert message in str(info.value)


def _rllib_lstm_config(**training) -> FastPPOConfig:
    """RLlib's own LSTM (the default module with ``use_lstm``) on the cue corridor."""
    return (FastPPOConfig().environment("rl_speed/CueCorridor-v0", env_config={"length": 5})
            .env_runners(num_env_runners=0, num_envs_per_env_runner=64, rollout_fragment_length=32)
            .training(**{"train_batch_size_per_learner": 2048, "minibatch_size": 512, "num_epochs": 4, "lr": 1e-3,
                         "entropy_coeff": 0.01, **training})
            .rl_module(model_config={"use_lstm": True, "max_seq_len": 16, "lstm_cell_size": 32,
                                     "fcnet_hiddens": [32], "vf_share_layers": True})
            .debugging(seed=0))


def test_rllib_lstm_sequences_replay_the_runner_recurrence(ray_session):
    """use_lstm: the learner's padded sequences (cut at chunk and episode starts) give every step the value a
    step-by-step pass gives, with the state reset where episodes start, as RLlib's own learner does."""
    algo = (_rllib_lstm_config(num_epochs=1, train_batch_size_per_learner=128, minibatch_size=64)
            .env_runners(num_envs_per_env_runner=4).build_algo())
    try:
        runner = algo.env_runner
        runner.sample_columns()
        columns = runner.sample_columns()
        assert columns["is_first"].any() and not columns["is_first"].all()
        learner = algo.learner_group._learner
        batch = learner.compute_advantages(DEFAULT_MODULE_ID, columns)
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        first_state = torch.utils._pytree.tree_map(lambda v: torch.from_numpy(v[0]), columns["state_in"])
        state, values = first_state, []
        with torch.no_grad():
            for t in range(32):
                keep = (~torch.from_numpy(columns["is_first"][t])).float()
                state = torch.utils._pytree.tree_map(lambda v: v * keep.reshape(-1, *([1] * (v.dim() - 1))), state)
                obs = torch.from_numpy(columns["obs"][t])[:, None]
                out = module._forward({RLlibColumns.OBS: obs, RLlibColumns.STATE_IN: state})
                values.append(module.compute_values({RLlibColumns.OBS: obs, RLlibColumns.STATE_IN: state})[:, 0])
                state = out[RLlibColumns.STATE_OUT]
        reference = torch.stack(values)  # [T, N]
        mask = batch[RLlibColumns.LOSS_MASK]
        got = batch[RLlibColumns.VF_PREDS]
        assert got.shape == mask.shape and got.shape[1] == 16  # [S, L] sequences
        assert mask.sum() == columns["valid"].sum()  # padding is masked, every real step is in
        # every real step's value, wherever its sequence starts
        from rl_speed.learners.sequences import EpisodeSequences

        seqs = EpisodeSequences(torch.from_numpy(columns["is_first"]), 16)
        torch.testing.assert_close(seqs.scatter(got), reference, rtol=1e-4, atol=1e-5)
    finally:
        algo.stop()


def test_rllib_lstm_solves_the_cue_corridor(ray_session):
    algo = _rllib_lstm_config().build_algo()
    try:
        for _ in range(40):
            result = algo.train()
        assert result["env_runners"]["episode_return_mean"] > 0.9  # remembers the cue
    finally:
        algo.stop()


def test_rllib_lstm_with_several_learners_is_refused():
    with pytest.raises(ValueError, match="use_lstm"):
        _rllib_lstm_config().learners(num_learners=2).validate()


def test_recurrent_token_module_trains_on_mettagrid_chunks(ray_session):
    """``rl_module: recurrent_tokens`` on the real MettaGrid: the learner's rows are BPTT chunks of token
    observations ``[K * N, L, slots, 3]`` and an update runs."""
    pytest.importorskip("mettagrid", reason="the [mettagrid] extra is not installed")
    from rl_speed.modules.tokens import RecurrentTokenActorCritic

    config = (FastPPOConfig()
              .environment("rl_speed/MettaGrid-v0", env_config={"num_agents": 8, "width": 11, "height": 11,
                                                                 "walls": 4, "altars": 8, "view": 9, "max_steps": 32})
              .env_runners(num_env_runners=0, num_envs_per_env_runner=16, rollout_fragment_length=16)
              .training(train_batch_size_per_learner=256, minibatch_size=128, num_epochs=1, bptt_horizon=8)
              .rl_module(rl_module_spec=RLModuleSpec(module_class=RecurrentTokenActorCritic),
                         model_config={"token_dim": 8, "fcnet_hiddens": [16], "lstm_cell_size": 8}))
    assert config.is_recurrent
    algo = config.build_algo()
    try:
        columns = algo.env_runner.sample_columns()
        batch = algo.learner_group._learner.compute_advantages(DEFAULT_MODULE_ID, columns)
        obs = batch[RLlibColumns.OBS]
        assert obs.shape[:2] == (2 * 16, 8) and obs.shape[-1] == 3 and obs.dtype == torch.uint8
        result = algo.train()
        assert np.isfinite(result["learners"][DEFAULT_MODULE_ID]["total_loss"])
    finally:
        algo.stop()
