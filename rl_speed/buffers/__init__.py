"""Replay storage for column batches: a vectorized sum tree and a lane-ring replay buffer with n-step returns."""

from rl_speed.buffers.replay import BatchedReplayBuffer
from rl_speed.buffers.sum_tree import SumTree

__all__ = ["BatchedReplayBuffer", "SumTree"]
