"""The race's one judge: every contender's envs go through it; it logs each finished episode's return with the
wall-clock time since the contender started and the process-wide env steps (see :mod:`benchmarks.race.race`)."""

from __future__ import annotations

import glob
import os
import time
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

WINDOW = 20  # finished episodes in the judge's running mean


def process_start() -> float:
    """When this process started, on the monotonic clock the judges share: a contender's clock counts from it, so the
    interpreter's start and the imports before the contender is built (RLlib's and torch's: seconds) count too. Linux
    only: the kernel's start time of the process (``/proc/self/stat``, clock ticks since boot) against
    ``CLOCK_BOOTTIME``, the clock it is counted on."""
    try:
        with open("/proc/self/stat") as f:  # the command name (field 2) may hold spaces: split after its ")"
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    except OSError as error:
        raise RuntimeError("the race's clock starts at the process's start, read from /proc/self/stat: it runs on "
                           "Linux only") from error
    since_start = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.monotonic() - since_start


@dataclass(frozen=True)
class JudgeFiles:
    """Where the judges of several processes on one host log (a contender whose env runners are Ray actors): one CSV
    per process in ``directory``, each line ``seconds,env steps,return``. Seconds count on the host's monotonic clock
    (shared by its processes) from ``start``, the driver process's start (:func:`process_start`); env
    steps are the writing process's own count. :meth:`read` merges the files into one log."""

    directory: str
    start: float

    def record(self, steps: int, returns: list[float]) -> None:
        now = time.monotonic() - self.start
        with open(os.path.join(self.directory, f"{os.getpid()}.csv"), "a") as f:  # appended, so a crash keeps it
            f.writelines(f"{now:.3f},{steps},{r!r}\n" for r in returns)

    def read(self) -> list[tuple[float, int, float]]:
        """All processes' episodes in time order; env steps at an episode = the sum over processes of the count each
        had logged by then (steps a process made after its last finished episode are not yet counted)."""
        events = []
        for i, path in enumerate(sorted(glob.glob(os.path.join(self.directory, "*.csv")))):
            with open(path) as f:
                for line in f:
                    t, steps, ret = line.split(",")
                    events.append((float(t), i, int(steps), float(ret)))
        events.sort()
        latest: dict[int, int] = {}
        log = []
        for t, i, steps, ret in events:
            latest[i] = steps
            log.append((t, sum(latest.values()), ret))
        return log


class EpisodeJudge(gym.Wrapper):
    """Logs ``(seconds since start, env steps so far, return)`` for every finished episode (see the module docstring).
    The log and the counters are shared by every instance in this process; with ``files``, episodes go to those
    instead (for envs in other processes)."""

    log: list[tuple[float, int, float]] = []
    steps = 0
    start = time.perf_counter()

    @classmethod
    def begin(cls) -> None:
        cls.log, cls.steps, cls.start = [], 0, time.perf_counter()

    @classmethod
    def record(cls, returns: list[float], files: JudgeFiles | None) -> None:
        if files is None:
            now = time.perf_counter() - cls.start
            cls.log.extend((now, cls.steps, r) for r in returns)
        else:
            files.record(cls.steps, returns)

    def __init__(self, env: gym.Env, files: JudgeFiles | None = None) -> None:
        super().__init__(env)
        self._return = 0.0
        self._files = files

    def reset(self, **kwargs: Any) -> Any:
        self._return = 0.0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        EpisodeJudge.steps += 1
        # An env that reports its game (rl_speed's Atari) is judged on whole games and unclipped scores
        self._return += float(info.get("game_reward", reward))
        if info.get("game_over", terminated or truncated):
            EpisodeJudge.record([self._return], self._files)
            self._return = 0.0
        return obs, reward, terminated, truncated, info


class VectorEpisodeJudge(gym.vector.VectorWrapper):
    """The judge for a native NEXT_STEP vector env: the same log as :class:`EpisodeJudge`, reset steps not counted."""

    def __init__(self, env: gym.vector.VectorEnv, files: JudgeFiles | None = None) -> None:
        super().__init__(env)
        self._returns = np.zeros(env.num_envs)
        self._resetting = np.zeros(env.num_envs, bool)
        self._files = files

    def reset(self, **kwargs: Any) -> Any:
        self._returns[:] = 0.0
        self._resetting[:] = False
        return self.env.reset(**kwargs)

    def step(self, actions: Any) -> Any:
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        live = ~self._resetting
        EpisodeJudge.steps += int(live.sum())
        if "game_over" in info:  # an env that reports its game (rl_speed's Atari): whole games, unclipped scores
            self._returns += info["game_reward"]
            done = np.asarray(info["game_over"], bool)
        else:
            self._returns += np.where(live, rewards, 0.0)
            done = (terminated | truncated) & live
        if done.any():
            EpisodeJudge.record([float(r) for r in self._returns[done]], self._files)
            self._returns[done] = 0.0
        self._resetting = terminated | truncated
        return obs, rewards, terminated, truncated, info


def judged_id(env_id: str, files: JudgeFiles | None = None) -> str:
    """An env id for ``env_id`` wrapped in the judge, registered on first use: with gymnasium for gymnasium envs,
    with Tune for rl_speed's envs (whose native vector form gets :class:`VectorEpisodeJudge`). With ``files`` (env
    runners in other processes), always with Tune, whose registry reaches Ray's workers."""
    from rl_speed.registry import ENVIRONMENTS, make_env_creator

    judged = f"rl_speed_race/{env_id}"
    if env_id in ENVIRONMENTS or files is not None:
        from ray.tune.registry import register_env

        creator = make_env_creator(env_id) if env_id in ENVIRONMENTS else lambda cfg: gym.make(env_id, **cfg)
        register_env(judged, lambda cfg: (VectorEpisodeJudge(creator(cfg), files) if "num_envs" in cfg
                                          else EpisodeJudge(creator(cfg), files)))
    elif judged not in gym.registry:
        gym.register(judged, entry_point=lambda **kw: EpisodeJudge(gym.make(env_id, **kw)))
    return judged


def reached(log: list[tuple[float, int, float]], target: float, window: int = WINDOW) -> tuple[float, int] | None:
    """(seconds, env steps) at the first episode after which the mean of the last ``window`` returns >= target."""
    returns = [r for _, _, r in log]
    for i in range(window - 1, len(log)):
        if np.mean(returns[i - window + 1:i + 1]) >= target:
            return log[i][0], log[i][1]
    return None


def best_mean(log: list[tuple[float, int, float]], window: int = WINDOW) -> float:
    """The best running mean of ``window`` returns in a log (-inf with fewer episodes)."""
    returns = np.array([r for _, _, r in log])
    if len(returns) < window:
        return float("-inf")
    return float(np.convolve(returns, np.ones(window) / window, mode="valid").max())
