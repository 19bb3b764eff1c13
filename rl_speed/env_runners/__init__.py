"""RLlib EnvRunners of the columnar data path."""

from rl_speed.env_runners.batched import BatchedEnvRunner

__all__ = ["BatchedEnvRunner"]
