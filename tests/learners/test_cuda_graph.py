"""cuda_graph: the replayed whole-step graph trains exactly like the eager step (weights, BatchNorm statistics, target
network, Adam state, replay priorities, logged statistics), counts skipped non-finite steps, composes with bf16,
accumulation and compile, and bad settings fail at configuration time."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
import torch

from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import TD_ERROR_KEY

from rl_speed.algorithms.fast_dqn import FastDQNConfig
from rl_speed.algorithms.fast_ppo import FastPPOConfig
from rl_speed.columns import split_lanes
from rl_speed.modules.recurrent import RecurrentActorCritic
from rl_speed.learners.optimizer_step import NON_FINITE_SKIPPED

FRAMES = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
ACTIONS = gym.spaces.Discrete(7)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA learner")


@pytest.mark.parametrize("config_cls, training, learners, needle", [
    (FastDQNConfig, {"cuda_graph": "yes"}, {}, "must be true or false"),
    (FastDQNConfig, {"cuda_graph": True}, {}, "needs a CUDA learner"),
    (FastDQNConfig, {"cuda_graph": True, "mixed_precision": "fp16"}, {"num_gpus_per_learner": 1}, "bf16"),
    (FastDQNConfig, {"cuda_graph": True}, {"num_gpus_per_learner": 1, "num_learners": 2}, "num_learners"),
])
def test_bad_cuda_graph_settings_fail_at_validation(config_cls, training, learners, needle):
    config = config_cls().environment("CartPole-v1").training(**training).learners(**learners)
    with pytest.raises(ValueError, match="cuda_graph") as error:
        config.validate()
    assert needle in str(error.value)


def test_cuda_graph_takes_learning_rate_and_entropy_schedules():
    for config in (FastDQNConfig().training(lr=[[0, 1e-3], [1000, 1e-4]]),
                   FastPPOConfig().training(lr=[[0, 1e-3], [1000, 1e-4]], entropy_coeff=[[0, 0.01], [1000, 0.0]])):
        config.environment("CartPole-v1").training(cuda_graph=True).learners(num_gpus_per_learner=1).validate()


def test_cuda_graph_refuses_compile_modes_that_capture_graphs_themselves():
    config = (FastDQNConfig().environment("CartPole-v1").training(cuda_graph=True).learners(num_gpus_per_learner=1)
              .framework(torch_compile_learner=True, torch_compile_learner_dynamo_mode="reduce-overhead"))
    with pytest.raises(ValueError, match="captures CUDA graphs itself"):
        config.validate()


def _learner(**training):
    config = (FastDQNConfig()
              .environment(observation_space=FRAMES, action_space=ACTIONS)
              .training(train_batch_size=64, dueling=True, double_q=True, lr=1e-3, grad_clip=10.0,
                        target_network_update_freq=0, **training)
              .rl_module(model_config={"encoder": "nature"})
              .learners(num_gpus_per_learner=1)
              .debugging(seed=0))
    return config.build_learner()


def _batch(n, seed, reward_scale=1.0):
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (n, *FRAMES.shape), dtype=np.uint8)
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch({
        "obs": torch.as_tensor(frames, device="cuda"),
        "new_obs": torch.as_tensor(np.roll(frames, 1, axis=0), device="cuda"),
        "actions": torch.as_tensor(rng.integers(0, 7, n), device="cuda"),
        "rewards": (rng.normal(size=n) * reward_scale).astype(np.float32), "terminateds": rng.random(n) < 0.1,
        "n_step": np.full(n, 3.0, np.float32), "weights": rng.uniform(0.2, 1.0, n).astype(np.float32)})}, n)


def _train(learner, calls, minibatch=32, reward_scale=None):
    """`calls` update() calls of two minibatches each; returns each call's TD errors (the replay priorities)."""
    td_errors = []
    for i in range(calls):
        scale = reward_scale(i) if reward_scale else 1.0
        results = learner.update(batch=_batch(2 * minibatch, seed=i, reward_scale=scale), minibatch_size=minibatch,
                                 timesteps={"num_env_steps_sampled_lifetime": 1000 * (i + 1)})
        td_errors.append(np.concatenate([np.asarray(torch.as_tensor(t).cpu())
                                         for t in results[DEFAULT_MODULE_ID][TD_ERROR_KEY].peek()]))
    return td_errors, results


@cuda
def test_replayed_graph_trains_like_the_eager_step(ray_session, monkeypatch):  # (a GPU learner asks Ray for GPUs)
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)  # the same conv algorithms in both learners
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    eager, graphed = _learner(), _learner(cuda_graph=True)
    graphed.module[DEFAULT_MODULE_ID].load_state_dict(eager.module[DEFAULT_MODULE_ID].state_dict())
    initial = {k: v.clone() for k, v in graphed.module[DEFAULT_MODULE_ID].state_dict().items()}
    eager_td, eager_results = _train(eager, 6)
    graphed_td, graphed_results = _train(graphed, 6)
    assert graphed._step_graphs.replays == 12 - 3  # 3 eager warm-up steps, then every minibatch replayed
    for a, b in zip(eager_td, graphed_td):
        assert len(b) == 64  # one priority per row of both minibatches
        np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4)
    for key in ("qf_loss", "qf_mean", "td_error_mean"):
        assert graphed_results[DEFAULT_MODULE_ID][key].peek() == pytest.approx(
            eager_results[DEFAULT_MODULE_ID][key].peek(), rel=1e-3, abs=1e-4)
    ours = graphed.module[DEFAULT_MODULE_ID].state_dict()  # weights, BatchNorm statistics and the target network
    for name, value in eager.module[DEFAULT_MODULE_ID].state_dict().items():
        torch.testing.assert_close(ours[name], value, rtol=1e-3, atol=1e-4, msg=name)
    tracked = [v.item() for k, v in ours.items() if k.endswith("num_batches_tracked") and "target" not in k]
    assert tracked and min(tracked) >= 12  # BatchNorm saw every minibatch, replays included (equal to eager above)
    targets = [k for k in ours if "target" in k and ours[k].is_floating_point()]
    assert targets and any(not torch.equal(ours[k], initial[k]) for k in targets)  # synced in place

@cuda
def test_a_replayed_non_finite_step_is_skipped_and_counted(ray_session):
    learner = _learner(cuda_graph=True)
    _train(learner, 3)  # warm-up and capture
    before = {k: v.detach().clone() for k, v in learner.module[DEFAULT_MODULE_ID].named_parameters()}
    _, results = _train(learner, 1, reward_scale=lambda i: float("nan"))
    assert results[NON_FINITE_SKIPPED].peek() == 2  # both replayed minibatches skipped
    for name, p in learner.module[DEFAULT_MODULE_ID].named_parameters():
        torch.testing.assert_close(p, before[name], msg=name)
    _, results = _train(learner, 1)
    assert results[NON_FINITE_SKIPPED].peek() == 0  # finite again: nothing skipped in this call
    assert any(not torch.equal(p, before[k]) for k, p in learner.module[DEFAULT_MODULE_ID].named_parameters())


@cuda
@pytest.mark.parametrize("training, compile", [({"mixed_precision": "bf16", "grad_accumulation_steps": 2}, False),
                                               ({"mixed_precision": "bf16"}, True)])
def test_graph_composes_with_bf16_accumulation_and_compile(ray_session, training, compile):
    config_learner = _learner(cuda_graph=True, **training)
    if compile:
        config = config_learner.config.copy(copy_frozen=False).framework(
            torch_compile_learner=True, torch_compile_learner_what_to_compile="forward_train")
        config_learner = config.build_learner()
    # detached: a clone with a grad_fn would hold the parameters' autograd nodes across the capture and break it
    before = {k: v.detach().clone() for k, v in config_learner.module[DEFAULT_MODULE_ID].named_parameters()}
    _, results = _train(config_learner, 5, minibatch=64 if training.get("grad_accumulation_steps") else 32)
    assert config_learner._step_graphs.replays > 0
    assert np.isfinite(results[DEFAULT_MODULE_ID]["qf_loss"].peek())
    assert any(not torch.equal(p, before[k]) for k, p in config_learner.module[DEFAULT_MODULE_ID].named_parameters())


@pytest.mark.parametrize("change, needle", [
    (lambda c: c.learners(num_gpus_per_learner=0), "needs a CUDA learner"),
    (lambda c: c.multi_agent(policies={"a", "b"}, policy_mapping_fn=lambda agent, *args, **kwargs: "a"),
     "capture is for a single module"),
    (lambda c: c.rl_module(model_config={"use_lstm": True}), "use `rl_module: recurrent`"),
])
def test_fast_ppo_cuda_graph_refuses_what_a_replay_cannot_see(change, needle):
    config = change(FastPPOConfig().environment("CartPole-v1").training(cuda_graph=True)
                    .learners(num_gpus_per_learner=1))
    with pytest.raises(ValueError, match="cuda_graph") as error:
        config.validate()
    assert needle in str(error.value)


def _ppo_algo(learners=0, **training):
    """FastPPO with rl_speed's LSTM module on GPU learners (the grid preset's kind of step, small); on several
    learners each gets an equal share of the same 2048 rows."""
    shares = max(1, learners)
    config = (FastPPOConfig()
              .environment("rl_speed/CueCorridor-v0", env_config={"length": 5})
              .env_runners(num_env_runners=0, num_envs_per_env_runner=64, rollout_fragment_length=32)
              .training(train_batch_size_per_learner=2048 // shares, minibatch_size=512 // shares, num_epochs=2,
                        bptt_horizon=16, **{"lr": 1e-3, "entropy_coeff": 0.01, **training})
              .rl_module(rl_module_spec=RLModuleSpec(module_class=RecurrentActorCritic),
                         model_config={"fcnet_hiddens": [32], "lstm_cell_size": 32})
              .learners(num_learners=learners, num_gpus_per_learner=1)
              .debugging(seed=0))
    return config.build_algo()


def _ppo_update(algo, columns):
    """One ``update()`` call as FastPPO's training step makes it, on a copy of ``columns``, with the minibatch
    shuffle reseeded (both learners draw the same order)."""
    torch.manual_seed(0)
    steps = {"num_env_steps_sampled_lifetime": 2048, "num_agent_steps_sampled_lifetime": 2048}
    (results,) = algo.learner_group.update(batch=[copy.deepcopy(columns)], minibatch_size=512, num_epochs=2,
                                           shuffle_batch_per_epoch=True, timesteps=steps)
    return results[DEFAULT_MODULE_ID]


@cuda
def test_fast_ppo_replayed_graph_follows_lr_and_entropy_schedules_like_the_eager_step(ray_session, monkeypatch):
    """RLlib's schedules move the lr and the entropy coefficient after each update(); a replayed graph reads both
    from device tensors set in place, so it trains exactly as the eager step (here 2,048 lifetime steps of each
    schedule's 4,096: lr 1e-3 -> 5.5e-4, entropy 0.05 -> 0.025 after the first call)."""
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    schedules = {"lr": [[0, 1e-3], [4096, 1e-4]], "entropy_coeff": [[0, 0.05], [4096, 0.0]]}
    eager, graphed = _ppo_algo(**schedules), _ppo_algo(cuda_graph=True, **schedules)
    try:
        learners = [algo.learner_group._learner for algo in (eager, graphed)]
        learners[1].module[DEFAULT_MODULE_ID].load_state_dict(learners[0].module[DEFAULT_MODULE_ID].state_dict())
        for call in range(3):
            columns = eager.env_runner.sample_columns()
            expected, ours = _ppo_update(eager, columns), _ppo_update(graphed, columns)
            for key in ("total_loss", "policy_loss", "entropy", "mean_kl_loss"):
                assert ours[key].peek() == pytest.approx(expected[key].peek(), rel=1e-3, abs=1e-4), (call, key)
            weights = learners[1].module[DEFAULT_MODULE_ID].state_dict()
            for name, value in learners[0].module[DEFAULT_MODULE_ID].state_dict().items():
                torch.testing.assert_close(weights[name], value, rtol=1e-3, atol=1e-4, msg=name)
            for learner in learners:
                (optimizer,) = learner._optimizer_parameters
                assert float(optimizer.param_groups[0]["lr"]) == pytest.approx(5.5e-4)
                coeff = learner.entropy_coeff(DEFAULT_MODULE_ID)
                assert float(coeff) == pytest.approx(0.025)
        assert learners[1]._step_graphs.replays > 0
    finally:
        eager.stop()
        graphed.stop()


@cuda
def test_fast_ppo_replayed_graph_trains_like_the_eager_step(ray_session, monkeypatch):
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", True)  # the same LSTM kernels in both learners
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    eager, graphed = _ppo_algo(), _ppo_algo(cuda_graph=True)
    try:
        learners = [algo.learner_group._learner for algo in (eager, graphed)]
        learners[1].module[DEFAULT_MODULE_ID].load_state_dict(learners[0].module[DEFAULT_MODULE_ID].state_dict())
        for call in range(2):  # the second call reads the KL coefficient RLlib updated in place after the first
            columns = eager.env_runner.sample_columns()  # one rollout, the same data for both learners
            expected, ours = _ppo_update(eager, columns), _ppo_update(graphed, columns)
            for key in ("total_loss", "policy_loss", "vf_loss", "entropy", "mean_kl_loss", "vf_explained_var"):
                assert ours[key].peek() == pytest.approx(expected[key].peek(), rel=1e-3, abs=1e-4), (call, key)
            weights = learners[1].module[DEFAULT_MODULE_ID].state_dict()
            for name, value in learners[0].module[DEFAULT_MODULE_ID].state_dict().items():
                torch.testing.assert_close(weights[name], value, rtol=1e-3, atol=1e-4, msg=name)
        assert learners[1]._step_graphs.replays == 16 - 3  # 2 calls x 2 epochs x 4 minibatches, 3 warm-up steps
    finally:
        eager.stop()
        graphed.stop()


def test_fast_ppo_cuda_graph_on_several_learners_validates_and_refuses_ddp_options():
    config = (FastPPOConfig().environment("CartPole-v1").training(cuda_graph=True)
              .learners(num_learners=2, num_gpus_per_learner=1))
    config.validate()  # the step averages the gradients itself (rl_speed.learners.gradient_all_reduce)
    config = config.copy(copy_frozen=False).framework(torch_ddp_kwargs={"find_unused_parameters": True})
    with pytest.raises(ValueError, match="torch_ddp_kwargs"):
        config.validate()


def _weights_of_each_learner(algo):
    return [r.get()[DEFAULT_MODULE_ID] for r in algo.learner_group.foreach_learner(
        lambda learner: {DEFAULT_MODULE_ID: {k: v.detach().cpu() for k, v in
                                             learner.module[DEFAULT_MODULE_ID].unwrapped().state_dict().items()}})]


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="two learners with a GPU each need two GPUs")
def test_graph_on_two_learners_trains_like_ddp(ray_session):
    """Two learners, one GPU each: the captured step with its own all-reduce against RLlib's DDP, eagerly, from the
    same weights on the same rows; the two learners also stay equal to each other."""
    steps = {"num_env_steps_sampled_lifetime": 2048, "num_agent_steps_sampled_lifetime": 2048}
    weights, trained, replays = None, {}, []
    for name, training in (("ddp", {}), ("graph", {"cuda_graph": True})):
        algo = _ppo_algo(learners=2, **training)
        try:
            if weights is None:
                weights, rollouts = algo.learner_group.get_weights(), [algo.env_runner.sample_columns()
                                                                      for _ in range(2)]
            algo.learner_group.set_weights(weights)
            for columns in rollouts:
                algo.learner_group.update(batches=split_lanes(copy.deepcopy(columns), 2), minibatch_size=256,
                                          num_epochs=2, shuffle_batch_per_epoch=False, timesteps=steps)
            trained[name] = _weights_of_each_learner(algo)
            if training:
                replays = [r.get() for r in algo.learner_group.foreach_learner(lambda l: l._step_graphs.replays)]
        finally:
            algo.stop()
    assert replays == [16 - 3, 16 - 3]  # per learner: 2 calls x 2 epochs x 4 minibatches, 3 warm-up steps
    first, second = trained["graph"]
    for name, value in first.items():
        torch.testing.assert_close(second[name], value, rtol=0, atol=0, msg=name)  # one all-reduce: equal
        torch.testing.assert_close(value, trained["ddp"][0][name], rtol=1e-3, atol=1e-4, msg=name)
    assert any(not torch.equal(first[k], torch.as_tensor(v).cpu()) for k, v in weights[DEFAULT_MODULE_ID].items())


@cuda
def test_graph_resumes_a_checkpoint_made_without_it(ray_session):
    """A checkpoint's optimizer state brings `capturable=False`; the captured step needs it on."""
    eager = _learner()
    _train(eager, 2)
    graphed = _learner(cuda_graph=True)
    graphed.set_state(eager.get_state())
    assert all(g["capturable"] for o in graphed._optimizer_parameters for g in o.param_groups)
    _train(graphed, 3)
    assert graphed._step_graphs.replays == 6 - 3
    eager.set_state(graphed.get_state())  # and back: an eager learner runs without it
    assert not any(g["capturable"] for o in eager._optimizer_parameters for g in o.param_groups)
    _train(eager, 1)
