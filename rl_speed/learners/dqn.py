"""The torch learner FastDQN uses by default: RLlib's DQN loss with rl_speed's fused update."""

from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner

from rl_speed.learners.fast_update import FastUpdateMixin


class FastDQNTorchLearner(FastUpdateMixin, DQNTorchLearner):
    """RLlib's DQNTorchLearner (loss, target updates) with one fused clip + finiteness check per update."""
