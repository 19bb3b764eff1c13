"""Learner-side pieces of the columnar path."""

from rl_speed.connectors.gae import standardize, vectorized_gae

__all__ = ["standardize", "vectorized_gae"]
