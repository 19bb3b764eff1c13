"""The env runner of ``rl-speed bench atari-startup`` (:mod:`benchmarks.scaling.atari_startup`), in its own module
so that the bench imports RLlib and torch only when a start asks for them (the start's imports are what it times)."""

from __future__ import annotations

import time
from typing import Any

from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.annotations import override

from benchmarks.race.judge import process_start
from rl_speed.env_runners.batched import BatchedEnvRunner


class TimedEnvRunner(BatchedEnvRunner):
    """The preset's env runner, noting on the host's monotonic clock when its process started, its ``__init__``
    began (the actor's imports done), its envs and its module were built and it was ready (``startup``)."""

    @override(BatchedEnvRunner)
    def __init__(self, **kwargs: Any) -> None:
        self.startup = {"process": process_start(), "init": time.monotonic()}
        super().__init__(**kwargs)
        self.startup["ready"] = time.monotonic()

    @override(SingleAgentEnvRunner)
    def make_env(self) -> None:
        super().make_env()
        self.startup.setdefault("env", time.monotonic())  # the first build (RLlib may call it again later)

    @override(SingleAgentEnvRunner)
    def make_module(self) -> None:
        super().make_module()
        self.startup.setdefault("module", time.monotonic())
