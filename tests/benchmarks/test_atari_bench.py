"""`rl-speed bench atari`: stock RLlib's PPO / DQN get the GPU presets' env, runners, module and training settings,
so the env-steps/s ratio compares the data paths only."""

from __future__ import annotations

import pytest
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.algorithms.ppo import PPOConfig

from benchmarks.throughput import atari

# Loading the presets checks that their env can start.
pytest.importorskip("ale_py", reason="needs the [atari] extra: python -m pip install 'rl_speed[atari]'")

SHARED = ["env", "env_config", "num_env_runners", "num_envs_per_env_runner", "rollout_fragment_length",
          "train_batch_size_per_learner", "lr", "gamma", "grad_clip", "num_gpus_per_learner",
          "num_gpus_per_env_runner"]
PER_ALGO = {"PPO": ["minibatch_size", "num_epochs", "lambda_", "clip_param", "entropy_coeff", "vf_loss_coeff",
                    "use_kl_loss"],
            "DQN": ["training_intensity", "n_step", "double_q", "dueling", "target_network_update_freq",
                    "num_steps_sampled_before_learning_starts", "epsilon", "min_sample_timesteps_per_iteration"]}


@pytest.mark.parametrize("algo", ["PPO", "DQN"])
def test_stock_config_mirrors_the_preset(algo):
    _, fast = atari.preset(algo, device="cuda")
    stock = atari.stock_config(algo, fast)
    assert isinstance(stock, PPOConfig if algo == "PPO" else DQNConfig) and type(stock).__module__.startswith("ray.")
    for key in SHARED + PER_ALGO[algo]:
        assert getattr(stock, key) == getattr(fast, key), key
    # the preset's module keys, less normalize_obs: stock learners would never update its statistics
    assert fast.model_config["normalize_obs"] is True and "normalize_obs" not in stock.model_config
    assert stock.model_config == {k: v for k, v in fast.model_config.items() if k != "normalize_obs"}
    expected_module = "NatureActorCritic" if algo == "PPO" else "QNetModule"
    assert stock.rl_module_spec.module_class.__name__ == expected_module
    if algo == "DQN":  # RLlib's episode buffer, same type name and capacity, in host memory
        assert stock.replay_buffer_config["type"] == fast.replay_buffer_config["type"]
        assert stock.replay_buffer_config["capacity"] == fast.replay_buffer_config["capacity"]
        assert "storage_device" not in stock.replay_buffer_config


def test_cpu_preset_shrinks_runners_and_replay():
    _, ppo = atari.preset("PPO", device="cpu", cpus=2)
    assert ppo.num_env_runners == 1 and ppo.num_gpus_per_learner == 0
    assert ppo.train_batch_size_per_learner == ppo.num_envs_per_env_runner * ppo.rollout_fragment_length
    _, dqn = atari.preset("DQN", device="cpu", cpus=2)
    assert dqn.replay_buffer_config["storage_device"] == "cpu" and dqn.replay_buffer_config["capacity"] == 100_000
    assert atari.warmup_iterations("DQN", dqn) == 2 + 5  # 50,000 steps before learning, 10,000 per iteration


def test_preset_picks_the_games_experiment_and_names_the_games_it_has():
    name, breakout = atari.preset("DQN", device="cuda", game="breakout")
    assert name == "breakout-fastdqn-gpu" and breakout.env_config["game"] == "breakout"
    name, pong = atari.preset("PPO", device="cuda", game="pong")  # not the file's Pong under sticky actions
    assert name == "pong-fastppo-gpu" and "repeat_action_probability" not in pong.env_config
    with pytest.raises(ValueError, match=r"atari_ppo_gpu.yaml has no experiment for game 'tennis'; it has \['pong', "
                                         r"'breakout'\]"):
        atari.preset("PPO", game="tennis")
