"""RLlib connector pieces: :class:`VectorizedGAE`, the drop-in for RLlib's GAE in stock PPO's learner pipeline."""

from rl_speed.connectors.vectorized_gae import VectorizedGAE

__all__ = ["VectorizedGAE"]
