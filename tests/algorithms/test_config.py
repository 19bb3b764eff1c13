"""Config-time checks shared by the columnar algorithms (rl_speed/algorithms/config.py): here, that a ``model_config``
key the chosen module would not read is refused, naming what it reads, instead of changing nothing."""

from __future__ import annotations

import pytest

pytest.importorskip("ray.rllib")

from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig  # noqa: E402
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec  # noqa: E402
from ray.rllib.core.rl_module.rl_module import RLModuleSpec  # noqa: E402

from rl_speed.algorithms.fast_dqn import FastDQNConfig  # noqa: E402
from rl_speed.algorithms.fast_ppo import FastPPOConfig  # noqa: E402
from rl_speed.modules.pixels import NatureActorCritic  # noqa: E402
from rl_speed.modules.q_net import QNetModule  # noqa: E402
from rl_speed.modules.recurrent import RecurrentActorCritic  # noqa: E402


def _refusal(config) -> str:
    with pytest.raises(ValueError) as error:
        config.validate()
    return str(error.value)


def _nature(model_config) -> FastPPOConfig:
    return FastPPOConfig().environment("CartPole-v1").rl_module(
        rl_module_spec=RLModuleSpec(module_class=NatureActorCritic), model_config=model_config)


def test_a_key_the_module_does_not_read_is_refused_naming_what_it_reads():
    message = _refusal(_nature({"fcnet_hiddens": [256], "conv_filters": [[16, [8, 8], 4]]}))
    assert "['conv_filters'] are not read by NatureActorCritic" in message and "it reads fcnet_hiddens" in message


def test_the_keys_a_module_reads_pass_and_the_algorithms_own_defaults_are_not_the_users():
    _nature({"fcnet_hiddens": [256], "vf_share_layers": True}).validate()
    # PPO adds `vf_share_layers: False` to every module's model_config itself; NatureActorCritic shares, but the user
    # did not ask otherwise
    config = FastPPOConfig().environment("CartPole-v1").rl_module(
        rl_module_spec=RLModuleSpec(module_class=NatureActorCritic))
    assert config.model_config["vf_share_layers"] is False
    config.validate()


def test_a_value_the_module_does_not_implement_is_refused():
    assert "`model_config.vf_share_layers`=False is not what NatureActorCritic implements (True)" in _refusal(
        _nature({"vf_share_layers": False}))


def test_a_default_model_config_dataclass_counts_only_the_fields_changed_from_its_defaults():
    _nature(DefaultModelConfig(fcnet_hiddens=[128])).validate()
    assert "['fcnet_activation']" in _refusal(_nature(DefaultModelConfig(fcnet_activation="relu")))


def test_a_module_spec_with_its_own_model_config_is_checked_with_that_one():
    config = FastPPOConfig().environment("CartPole-v1").rl_module(rl_module_spec=RLModuleSpec(
        module_class=RecurrentActorCritic, model_config={"lstm_cell_size": 32, "use_lstm": True}))
    assert "['use_lstm'] are not read by RecurrentActorCritic" in _refusal(config)


def test_a_module_spec_given_the_algorithms_whole_model_config_counts_only_what_the_user_set():
    # RLlib's own default DQN spec is built with `model_config=config.model_config`: the user's keys plus DQN's own
    # (num_atoms, v_min, ...) and, from a DefaultModelConfig, every default field; only the user's count
    for given in ({"fcnet_hiddens": [64]}, DefaultModelConfig(fcnet_hiddens=[64])):
        config = FastDQNConfig().environment("CartPole-v1").rl_module(model_config=given)
        config.rl_module(rl_module_spec=RLModuleSpec(module_class=QNetModule, model_config=config.model_config))
        assert "num_atoms" in config.model_config
        config.validate()
    config = FastDQNConfig().environment("CartPole-v1").rl_module(model_config={"conv_filters": [[16, [4, 4], 2]]})
    config.rl_module(rl_module_spec=RLModuleSpec(module_class=QNetModule, model_config=config.model_config))
    assert "['conv_filters'] are not read by QNetModule" in _refusal(config)


def test_every_module_of_a_multi_agent_spec_is_checked():
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    spec = MultiRLModuleSpec(rl_module_specs={
        "p0": RLModuleSpec(module_class=QNetModule, model_config={"fcnet_hiddens": [32]}),
        "p1": RLModuleSpec(module_class=QNetModule, model_config={"post_fcnet_hiddens": [32]})})
    config = (FastDQNConfig().environment(MultiAgentCartPole, env_config={"num_agents": 2})
              .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda agent, *a, **k: f"p{agent}")
              .rl_module(rl_module_spec=spec))
    assert "['post_fcnet_hiddens'] are not read by QNetModule" in _refusal(config)


def test_rllibs_modules_and_a_users_subclass_read_what_they_read():
    FastPPOConfig().environment("CartPole-v1").rl_module(model_config={"conv_filters": None}).validate()

    class Mine(NatureActorCritic):  # may read more keys than ours: not ours to check
        pass

    FastPPOConfig().environment("CartPole-v1").rl_module(rl_module_spec=RLModuleSpec(module_class=Mine),
                                                         model_config={"my_width": 3}).validate()


@pytest.mark.parametrize("model_config, fragment", [
    ({"conv_filters": [[16, [4, 4], 2]]}, "['conv_filters'] are not read by QNetModule"),
    ({"encoder": "resnet"}, "`encoder`='resnet' is invalid"),
    ({"encoder": "nature", "fcnet_activation": "tanh"}, "the 'nature' encoder uses ReLU throughout"),
    ({"encoder": "mlp", "conv_channels": [16]}, "`conv_channels` sizes the 'cnn' encoder, not 'mlp'"),
    ({"batch_norm": False}, "`batch_norm` applies to the 'nature' encoder only"),
])
def test_fastdqns_q_network_refuses_keys_it_would_ignore(model_config, fragment):
    # FastDQN's default module: a stock DQN config's `conv_filters` would otherwise build another CNN, silently
    config = FastDQNConfig().environment("CartPole-v1").rl_module(model_config=model_config)
    assert fragment in _refusal(config)


def test_fastdqn_refuses_distributional_and_noisy_q_learning_its_q_network_does_not_do():
    assert "`num_atoms`=51 asks for distributional Q-learning" in _refusal(
        FastDQNConfig().environment("CartPole-v1").training(num_atoms=51))
    assert "`noisy: true` asks for noisy layers" in _refusal(
        FastDQNConfig().environment("CartPole-v1").training(noisy=True))
    FastDQNConfig().environment("CartPole-v1").rl_module(
        model_config={"fcnet_hiddens": [64], "dueling": True, "encoder": "mlp"}).validate()


def test_normalize_obs_is_refused_where_nothing_would_update_its_statistics():
    from ray.rllib.algorithms.ppo import PPOConfig

    from rl_speed.algorithms.config import check_model_config_keys

    _nature({"normalize_obs": True}).validate()  # FastPPO's learner updates them once per batch
    stock = PPOConfig().environment("CartPole-v1").rl_module(
        rl_module_spec=RLModuleSpec(module_class=NatureActorCritic), model_config={"normalize_obs": True})
    with pytest.raises(ValueError, match="needs a learner that updates the running statistics"):
        check_model_config_keys(stock, "PPO")  # (what the YAML loader calls for stock algorithms)
    assert "each would update its own statistics" in _refusal(
        _nature({"normalize_obs": True}).learners(num_learners=2))
    assert "`model_config.normalize_obs`='yes' is not what NatureActorCritic implements" in _refusal(
        _nature({"normalize_obs": "yes"}))
    # FastDQN's Q-network too: its learner folds in each replayed batch; stock DQN's would not
    from ray.rllib.algorithms.dqn import DQNConfig

    FastDQNConfig().environment("CartPole-v1").rl_module(model_config={"normalize_obs": True}).validate()
    stock_dqn = DQNConfig().environment("CartPole-v1").rl_module(
        rl_module_spec=RLModuleSpec(module_class=QNetModule), model_config={"normalize_obs": True})
    with pytest.raises(ValueError, match="DQNTorchLearner would leave them at their start"):
        check_model_config_keys(stock_dqn, "DQN")


def test_normalize_value_is_refused_where_its_statistics_would_not_be_kept():
    from ray.rllib.algorithms.ppo import PPOConfig

    from rl_speed.algorithms.config import check_model_config_keys

    _nature({"normalize_value": True}).validate()  # FastPPO's learner converts, folds and standardizes
    stock = PPOConfig().environment("CartPole-v1").rl_module(
        rl_module_spec=RLModuleSpec(module_class=NatureActorCritic), model_config={"normalize_value": True})
    with pytest.raises(ValueError, match="`normalize_value: true` needs a learner that updates the running statistics "
                                         "\\(FastPPO's\\); PPOTorchLearner would leave"):
        check_model_config_keys(stock, "PPO")  # RLlib's GAE would read standardized values as returns
    assert "each would update its own statistics" in _refusal(
        _nature({"normalize_value": True}).learners(num_learners=2))
    several = _nature({"normalize_value": True}).multi_agent(
        policies={"a", "b"}, policy_mapping_fn=lambda agent_id, episode, **kwargs: "a")
    assert "`normalize_value: true` with 2 modules" in _refusal(several)
    assert "`model_config.normalize_value`=1.5 is not what NatureActorCritic implements" in _refusal(
        _nature({"normalize_value": 1.5}))
    # FastDQN's Q-network has no value head to normalize: a key it does not read
    assert "normalize_value" in _refusal(
        FastDQNConfig().environment("CartPole-v1").rl_module(model_config={"normalize_value": True}))


def test_update_config_sets_model_config_which_rllibs_update_from_dict_cannot():
    from rl_speed.algorithms.config import update_config

    with pytest.raises(AttributeError, match="model_config"):  # why update_config exists; gone, it can go too
        FastPPOConfig().update_from_dict({"model_config": {"normalize_obs": True}})
    config = _nature({"fcnet_hiddens": [64]})
    assert update_config(config, {"lr": 1e-3, "model_config": {"normalize_obs": True}}) is config
    assert config.lr == 1e-3
    assert config.model_config["normalize_obs"] is True and "fcnet_hiddens" not in config.model_config  # replaced
    assert update_config(config, {"num_epochs": 3}).model_config["normalize_obs"] is True  # untouched without it
