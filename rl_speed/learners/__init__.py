"""Learner pieces shared by every rl_speed algorithm."""

from rl_speed.learners.fast_update import FastUpdateMixin
from rl_speed.learners.train_step import TrainStepMixin

__all__ = ["FastUpdateMixin", "TrainStepMixin"]
