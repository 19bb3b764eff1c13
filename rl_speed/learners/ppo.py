"""Stock PPO's torch learner with rl_speed's VectorizedGAE in place of RLlib's GeneralAdvantageEstimation.

``config.learners(learner_class=VectorizedGAEPPOTorchLearner)``; everything else is RLlib's PPO.
"""

from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.connectors.learner.general_advantage_estimation import GeneralAdvantageEstimation

from rl_speed.connectors.vectorized_gae import VectorizedGAE


class VectorizedGAEPPOTorchLearner(PPOTorchLearner):
    """RLlib's PPOTorchLearner whose learner pipeline ends with VectorizedGAE."""

    def build(self) -> None:
        super().build()
        if self._learner_connector is not None and self.config.add_default_connectors_to_learner_pipeline:
            self._learner_connector.remove(GeneralAdvantageEstimation)
            self._learner_connector.append(VectorizedGAE(gamma=self.config.gamma, lambda_=self.config.lambda_))
