"""Learner pieces shared by every rl_speed algorithm: the minibatch loop and the optimizer step (mixins), and the
algorithms' learners (:mod:`rl_speed.learners.ppo`, :mod:`rl_speed.learners.dqn`). Learners never import
algorithms (a test keeps it so)."""

from rl_speed.learners.optimizer_step import OptimizerStepMixin
from rl_speed.learners.update_loop import UpdateLoopMixin

__all__ = ["OptimizerStepMixin", "UpdateLoopMixin"]
