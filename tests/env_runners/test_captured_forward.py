"""The runners' captured action step (rl_speed.env_runners.captured_forward, ``cuda_graph_env_runners``): its body
acts as the eager step does, what it refuses, and (on a GPU box) a captured runner against an eager one."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from ray.rllib.core.columns import Columns

from rl_speed.env_runners.captured_forward import act, check_capturable

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on a GPU box)")

FRAMES = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)


def _module(module_class: type, obs_space: gym.Space = FRAMES, actions: gym.Space = gym.spaces.Discrete(6),
            model_config: dict | None = None):
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    torch.manual_seed(0)
    module = RLModuleSpec(module_class=module_class, observation_space=obs_space, action_space=actions,
                          model_config=model_config or {}).build()
    return module.eval()


def _nature(**model_config):
    from rl_speed.modules.pixels import NatureActorCritic

    return _module(NatureActorCritic, model_config=model_config)


def _frames(n: int, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (n, *FRAMES.shape), dtype=np.uint8))


def test_the_greedy_step_is_the_modules_argmax():
    module = _nature(normalize_obs=True)
    obs = _frames(32)
    with torch.inference_mode():
        actions, logp, logits = act(module, obs, explore=False)
        expected = module._forward_inference({Columns.OBS: obs})[Columns.ACTION_DIST_INPUTS]
    assert logp is None
    torch.testing.assert_close(logits, expected.float())
    assert torch.equal(actions, expected.argmax(-1)) and actions.dtype == torch.int64


def test_the_exploring_step_draws_from_the_policy_and_gives_its_log_probs():
    """The exponential race draws from softmax(logits): over 5,000 lanes of one frame the action frequencies are the
    policy's probabilities (within 0.03: about 4 standard errors), and the log-probs are the chosen actions'."""
    module = _nature()
    with torch.no_grad():  # a policy far from uniform, so a wrong draw would show
        head = next(m for m in reversed(list(module.modules())) if isinstance(m, torch.nn.Linear)
                    and m.out_features == 6)
        head.bias.copy_(torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5, 1.5]))
    obs = _frames(1).expand(5_000, *FRAMES.shape).contiguous()
    torch.manual_seed(1)
    with torch.inference_mode():
        actions, logp, logits = act(module, obs, explore=True)
    probs = torch.softmax(logits[0], -1)
    frequencies = torch.bincount(actions, minlength=6).float() / len(actions)
    assert (frequencies - probs).abs().max() < 0.03, (frequencies, probs)
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1).gather(-1, actions[:, None]).squeeze(-1))


def test_what_cannot_be_captured_is_named():
    from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule

    from rl_speed.modules.q_net import QNetModule

    assert "not a GPU" in check_capturable(_nature(), "cpu", FRAMES)
    assert "num_gpus_per_env_runner" in check_capturable(_nature(), "cpu", FRAMES)
    box = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    vector = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    gaussian = _module(DefaultPPOTorchRLModule, vector, box)
    assert "TorchDiagGaussian" in check_capturable(gaussian, "cpu", vector)
    lstm = _module(DefaultPPOTorchRLModule, vector, gym.spaces.Discrete(2), {"use_lstm": True})
    assert "stateful" in check_capturable(lstm, "cpu", vector)
    q_net = _module(QNetModule)
    assert "picks its own actions" in check_capturable(q_net, "cpu", FRAMES)
    mixed = gym.spaces.Dict({"a": vector})
    assert "one array" in check_capturable(_nature(), "cpu", mixed)


def _config(**changes):
    from rl_speed.algorithms.fast_ppo import FastPPOConfig

    config = (FastPPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=2, num_gpus_per_env_runner=0.1)
              .training(cuda_graph_env_runners=True))
    for key, value in changes.items():
        setattr(config, key, value)
    return config


def test_the_config_takes_it_with_gpu_runners():
    _config().validate()  # remote runners with a share of a GPU each: accepted


@pytest.mark.parametrize("changes, message", [
    ({"cuda_graph_env_runners": "yes"}, "must be true or false"),
    ({"num_gpus_per_env_runner": 0}, "num_gpus_per_env_runner"),
    ({"num_env_runners": 0}, "remote env runners"),
])
def test_the_config_refuses_it_where_runners_act_on_the_cpu(changes, message):
    with pytest.raises(ValueError, match=message):
        _config(**changes).validate()


def test_fast_dqn_refuses_it():
    from rl_speed.algorithms.fast_dqn import FastDQNConfig

    config = (FastDQNConfig().environment("CartPole-v1").env_runners(num_env_runners=1, num_gpus_per_env_runner=0.1)
              .training(cuda_graph_env_runners=True))
    with pytest.raises(ValueError, match="picks its own actions"):
        config.validate()


def test_multi_agent_and_rllibs_lstm_are_refused():
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    config = _config().environment(MultiAgentCartPole, env_config={"num_agents": 2}).multi_agent(
        policies={"p0", "p1"}, policy_mapping_fn=lambda aid, episode, **kw: f"p{aid}")
    with pytest.raises(ValueError, match="multi-agent"):
        config.validate()
    with pytest.raises(ValueError, match="use_lstm"):
        _config().rl_module(model_config={"use_lstm": True}).validate()


def _cartpole_runner(captured: bool):
    from rl_speed.algorithms.fast_ppo import FastPPOConfig
    from rl_speed.env_runners import BatchedEnvRunner

    config = (FastPPOConfig().environment("CartPole-v1")
              .env_runners(num_env_runners=1, num_envs_per_env_runner=64, rollout_fragment_length=50,
                           num_gpus_per_env_runner=0.5)
              .training(cuda_graph_env_runners=captured).debugging(seed=3))
    return BatchedEnvRunner(config=config, worker_index=1)


@needs_cuda
def test_a_captured_runner_acts_as_the_eager_one(ray_session):
    """Same seed, same weights: greedy rollouts identical step for step; exploring rollouts give the log-probs of
    the actions taken; new weights (RLlib's set_state) reach the replayed graph."""
    eager, captured = _cartpole_runner(False), _cartpole_runner(True)
    try:
        assert captured._captured is not None and eager._captured is None
        captured.module.set_state(eager.module.get_state())
        greedy = [runner.sample_columns(explore=False) for runner in (eager, captured)]
        np.testing.assert_array_equal(greedy[0]["actions"], greedy[1]["actions"])
        np.testing.assert_array_equal(greedy[0]["obs"], greedy[1]["obs"])
        cols = captured.sample_columns(explore=True)
        logits = torch.from_numpy(cols["action_dist_inputs"])
        expected = torch.log_softmax(logits, -1).gather(-1, torch.from_numpy(cols["actions"])[..., None])[..., 0]
        np.testing.assert_allclose(cols["action_logp"], expected.numpy(), rtol=1e-5, atol=1e-6)
        obs = cols["obs"][-1]
        old_logits = captured._compute_actions(obs, True, 0)[1]["action_dist_inputs"]
        captured.module.set_state({k: v * 1.5 for k, v in eager.module.get_state().items()})  # in place
        new_logits = captured._compute_actions(obs, True, 0)[1]["action_dist_inputs"]
        with torch.inference_mode():
            expected = captured.module._forward_exploration(
                {Columns.OBS: torch.from_numpy(obs).to(captured._device)})[Columns.ACTION_DIST_INPUTS].cpu().numpy()
        np.testing.assert_allclose(new_logits, expected, rtol=1e-5, atol=1e-5)
        assert np.abs(new_logits - old_logits).max() > 1e-3  # the replay read the new weights
    finally:
        eager.stop()
        captured.stop()
