"""Learner pieces shared by every rl_speed algorithm."""

from rl_speed.learners.fast_update import FastUpdateMixin

__all__ = ["FastUpdateMixin"]
