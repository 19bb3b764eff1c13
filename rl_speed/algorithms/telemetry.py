"""Where a columnar algorithm's time goes, and what it exports: one phase timer for FastPPO and FastDQN.

Each phase of a training step runs inside ``timer.phase(name, rllib_timer)``: one measurement feeds both the
rl_speed profile and, where RLlib has a timer key for that phase (``timers/env_runner_sampling_timer``,
``learner_update_timer``, ...), RLlib's timer, so the stock keys stay meaningful. A ``train()`` call may run several
training steps (DQN does, until ``min_time_s_per_iteration`` / ``min_sample_timesteps_per_iteration``); the timer
sums over all of them and reports the iteration so far after each step:

* ``rl_speed_profile/<phase>_s`` and ``<phase>_share`` (the progress line of ``rl-speed train`` shows the shares);
* Ray gauges (:data:`RAY_METRICS`) on the dashboard and its Prometheus endpoint.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Iterator

from ray.rllib.utils.metrics import TIMERS

PROFILE_KEY = "rl_speed_profile"

#: Ray metrics (``ray.util.metrics``) every columnar algorithm exports each iteration. name -> description.
RAY_METRICS = {
    "rl_speed_env_steps_per_s": "Env steps sampled per second in the last training iteration.",
    "rl_speed_learner_updates_per_s": "Gradient updates (minibatches) per second in the last training iteration.",
    "rl_speed_replay_size": "Transitions held by the replay buffer (FastDQN).",
    "rl_speed_time_share": "Share of the last iteration's time spent in each phase (tag `phase`).",
}
_gauges: dict[str, Any] = {}


def lock_metrics_for_parallel_evaluation(algo: Any) -> None:
    """With ``evaluation_parallel_to_training``, RLlib trains in a worker thread that compiles ``algo.metrics`` at the
    end of its iteration while the main thread logs the evaluation's results into the same logger. RLlib's logger
    guards every read and write with a lock, but a dummy one by default, so a key added during the compile can break
    it ("Could not pack sequence. Structure had 109 elements, but flat_sequence had 108", seen in this project's
    evaluation test). A real re-entrant lock, as RLlib's own IMPALA learner sets on its logger, serializes them."""
    if algo.config.evaluation_parallel_to_training:
        algo.metrics._threading_lock = threading.RLock()


class PhaseTimer:
    """Seconds per phase of the current training iteration (see the module docstring)."""

    def __init__(self, algo: Any, phases: tuple[str, ...]) -> None:
        self.algo = algo
        self.phases = phases
        self._iteration = -1
        self.seconds: dict[str, float] = {}
        self._env_steps = self._updates = 0

    def begin_step(self) -> None:
        """Called first in every training step: a new ``train()`` call starts a new sum."""
        if self._iteration != self.algo.iteration:
            self._iteration = self.algo.iteration
            self.seconds = dict.fromkeys(self.phases, 0.0)
            self._env_steps = self._updates = 0

    @contextlib.contextmanager
    def phase(self, name: str, rllib_timer: str | None = None) -> Iterator[None]:
        start = time.perf_counter()
        try:
            if rllib_timer is None:
                yield
            else:
                with self.algo.metrics.log_time((TIMERS, rllib_timer)):
                    yield
        finally:
            self.seconds[name] += time.perf_counter() - start

    def move(self, seconds: float, source: str, target: str) -> None:
        """Books ``seconds`` measured inside phase ``source`` (e.g. the learner's GAE inside its update call) as
        phase ``target``."""
        seconds = min(seconds, self.seconds[source])
        self.seconds[source] -= seconds
        self.seconds[target] += seconds

    def report(self, env_steps: int, updates: int, replay_size: int | None = None) -> None:
        """Logs the profile of the iteration so far and sets the Ray gauges; ``env_steps`` / ``updates`` are this
        step's."""
        self._env_steps += env_steps
        self._updates += updates
        total = sum(self.seconds.values()) or 1.0
        profile = {**{f"{p}_s": s for p, s in self.seconds.items()},
                   **{f"{p}_share": s / total for p, s in self.seconds.items()}}
        self.algo.metrics.log_dict(profile, key=PROFILE_KEY, window=1)
        values = {"rl_speed_env_steps_per_s": self._env_steps / total,
                  "rl_speed_learner_updates_per_s": self._updates / total}
        if replay_size is not None:
            values["rl_speed_replay_size"] = replay_size
        export_ray_metrics(self.algo, values, {p: s / total for p, s in self.seconds.items()})


def export_ray_metrics(algo: Any, values: dict[str, float], shares: dict[str, float] | None = None) -> None:
    """Sets the gauges of :data:`RAY_METRICS` for this algorithm (tags: ``algorithm``, ``trial``)."""
    from ray.util.metrics import Gauge

    tags = {"algorithm": type(algo).__name__, "trial": str(getattr(algo, "trial_id", "") or "default")}
    for name, value in values.items():
        if name not in _gauges:
            _gauges[name] = Gauge(name, description=RAY_METRICS[name], tag_keys=("algorithm", "trial"))
        _gauges[name].set(float(value), tags=tags)
    if shares:
        name = "rl_speed_time_share"
        if name not in _gauges:
            _gauges[name] = Gauge(name, description=RAY_METRICS[name], tag_keys=("algorithm", "trial", "phase"))
        for phase, share in shares.items():
            _gauges[name].set(float(share), tags={**tags, "phase": phase})
