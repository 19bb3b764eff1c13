"""RLlib's episode callbacks on the columnar path: ``on_episode_created``, ``on_episode_start``, ``on_episode_step``,
``on_episode_end`` and ``on_sample_end``, called by :class:`~rl_speed.env_runners.BatchedEnvRunner` with RLlib's
keyword arguments and at RLlib's moments, plus rl_speed's vectorized hook ``on_sample_columns``
(:class:`rl_speed.callbacks.ColumnarCallback`).

RLlib's runner keeps a ``SingleAgentEpisode`` per env and appends to it every step; that is most of its cost on fast
envs. Here nothing is built unless a callback is configured (:func:`configured_callbacks`); then
:class:`EpisodeCallbacks` records each step of all lanes as a few ``[N, ...]`` arrays (:class:`StepHistory`) and
hands callbacks a :class:`LaneEpisode`: a view of one lane's episode over those arrays, with what RLlib's examples
read from an episode (``get_return()``, ``len()``, ``get_observations/actions/rewards/infos(indices)``,
``custom_data``, ``id_``, ``is_done``, ``is_terminated``, ``is_truncated``, ``get_duration_s()``, ``env_steps()``).
Anything else a callback asks of it is answered by an RLlib ``SingleAgentEpisode`` built from the kept steps.

Differences from RLlib's episodes (stated, not hidden):

* ``get_return()`` and ``len()`` cover the whole episode. RLlib's cover the episode's chunk since the last
  ``sample()`` (its ``on_episode_end`` passes the earlier chunks as ``prev_episode_chunks``; here that list is empty,
  so the RLlib idiom ``episode.get_return() + sum(c.get_return() for c in prev_episode_chunks)`` gives the same
  number on both).
* Step data (observations, infos, actions, rewards) reach back to the episode's start or to the start of the
  previous ``sample_columns()`` call, whichever is later (RLlib's chunks: its current ``sample()`` call); reading
  further back raises an ``IndexError`` that says so. This bounds the memory at two rollouts.
* The terminal step is there: ``on_episode_end`` sees the episode's final observation and info
  (``get_observations(-1)``, ``get_infos(-1)``), which RLlib's vector env has already replaced by the reset
  (ray-project/ray#46843).
* Observations are the env's (before env-to-module connectors), rewards are unclipped, as in RLlib's episodes.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import numpy as np
import tree

from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils import force_list

EPISODE_CALLBACKS = ("on_episode_created", "on_episode_start", "on_episode_step", "on_episode_end")
SAMPLE_CALLBACKS = ("on_sample_end",)
#: rl_speed's vectorized hook (rl_speed.callbacks.ColumnarCallback): once per sample_columns() call.
COLUMNS_HOOK = "on_sample_columns"


def configured_callbacks(config: Any, objects: list) -> frozenset[str]:
    """The runner-side callbacks a user set: a ``callbacks(on_episode_end=...)`` shorthand, an ``RLlibCallback``
    subclass that defines the method, or (``on_sample_columns``) a callback object that has it."""
    return frozenset(name for name in EPISODE_CALLBACKS + SAMPLE_CALLBACKS + (COLUMNS_HOOK,)
                     if callables_of(name, config, objects))


def callables_of(name: str, config: Any, objects: list) -> list:
    """What RLlib's ``make_callback(name, ...)`` would call: the objects' methods (where a subclass defines them;
    RLlib's own are no-ops), then the config's shorthand functions."""
    hooks = [getattr(cb, name) for cb in objects if callable(getattr(cb, name, None))
             and getattr(type(cb), name, None) is not getattr(RLlibCallback, name, None)]
    return hooks + force_list(getattr(config, f"callbacks_{name}", None))


def lane_info(infos: Any, lane: int) -> dict:
    """Lane ``lane``'s info dict from a vector env's infos: gymnasium's dict of arrays (``{"k": [N], "_k": mask}``,
    nested for dict values) or a list of per-env dicts (RLlib's ``DictInfoToList``)."""
    if isinstance(infos, (list, tuple)):
        return infos[lane]
    out = {}
    for key, value in infos.items():
        if isinstance(key, str) and key.startswith("_"):
            continue
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[lane]:
            continue
        out[key] = lane_info(value, lane) if isinstance(value, dict) else value[lane]
    return out


class StepHistory:
    """Every env event of a runner's N lanes, as ``[N, ...]`` rows, from event ``first`` on.

    Event ``e`` holds the observation and infos the env returned, and (for a step, not a reset) the action that was
    sent and the reward that came back. A lane's episode that starts at event ``s`` (its reset) and has ``L`` steps
    owns observations / infos ``s .. s + L`` and actions / rewards ``s + 1 .. s + L``."""

    def __init__(self) -> None:
        self.first = 0
        self.obs: list = []
        self.infos: list = []
        self.actions: list = []
        self.rewards: list = []

    @property
    def next(self) -> int:
        """The index the next event gets."""
        return self.first + len(self.obs)

    def add(self, obs: Any, infos: Any, actions: Any = None, rewards: Any = None) -> int:
        """Records one event (copies: native vector envs write into the same arrays every step); returns its index."""
        self.obs.append(tree.map_structure(np.array, obs))
        self.infos.append(infos)
        self.actions.append(actions)
        self.rewards.append(None if rewards is None else np.array(rewards, np.float64))
        return self.next - 1

    def trim(self, keep_from: int) -> None:
        """Forgets events before ``keep_from``."""
        drop = min(keep_from - self.first, len(self.obs))
        if drop > 0:
            for rows in (self.obs, self.infos, self.actions, self.rewards):
                del rows[:drop]
            self.first += drop


class LaneEpisode:
    """One lane's episode, as RLlib's callbacks receive it (see the module docstring for what it offers). While the
    episode runs, its start, length and return are the owner's per-lane arrays (kept for all lanes at once); they are
    copied into the view when the episode ends."""

    __slots__ = ("env_index", "custom_data", "is_terminated", "is_truncated", "observation_space", "action_space",
                 "_owner", "_number", "_start", "_length", "_return", "_start_time", "_end_time")

    def __init__(self, owner: "EpisodeCallbacks", env_index: int) -> None:
        owner.episodes_created += 1
        self._number = owner.episodes_created
        self.env_index = env_index
        self.custom_data: dict = {}
        self.is_terminated = False
        self.is_truncated = False
        self.observation_space = owner.observation_space
        self.action_space = owner.action_space
        self._owner = owner
        self._length: int | None = None  # None while the episode runs (then the owner's arrays hold these)
        self._return: float | None = None
        self._start: int | None = None
        self._start_time: float | None = None
        self._end_time: float | None = None

    def freeze(self, terminated: bool) -> None:
        """The episode ended: keep its figures (the owner's arrays move on to the lane's next episode)."""
        owner, lane = self._owner, self.env_index
        self._start, self._start_time = int(owner.start_event[lane]), float(owner.start_time[lane])
        self._length, self._return = int(owner.length[lane]), float(owner.returns[lane])
        self.is_terminated, self.is_truncated = terminated, not terminated
        self._end_time = time.perf_counter()

    @property
    def id_(self) -> str:
        """Unique among all runners' episodes: the runner's random prefix and a count (made when read)."""
        return f"{self._owner.id_prefix}{self._number:x}"

    @property
    def is_done(self) -> bool:
        return self.is_terminated or self.is_truncated

    @property
    def is_reset(self) -> bool:
        return self._length is not None or bool(self._owner.started[self.env_index])

    @property
    def t_started(self) -> int:
        return 0

    @property
    def t(self) -> int:
        return len(self)

    def __len__(self) -> int:
        if self._length is not None:
            return self._length
        return int(self._owner.length[self.env_index]) if self.is_reset else 0

    def env_steps(self) -> int:
        return len(self)

    def agent_steps(self) -> int:
        return len(self)

    def get_return(self) -> float:
        """The sum of the episode's (unclipped) rewards so far, over the whole episode."""
        if self._return is not None:
            return self._return
        return float(self._owner.returns[self.env_index]) if self.is_reset else 0.0

    def get_duration_s(self) -> float:
        if self._start_time is not None:
            return self._end_time - self._start_time
        return time.perf_counter() - self._owner.start_time[self.env_index] if self.is_reset else 0.0

    def get_observations(self, indices: Any = None, **kwargs: Any) -> Any:
        return self._get("obs", indices, kwargs)

    def get_infos(self, indices: Any = None, **kwargs: Any) -> Any:
        return self._get("infos", indices, kwargs)

    def get_actions(self, indices: Any = None, **kwargs: Any) -> Any:
        return self._get("actions", indices, kwargs)

    def get_rewards(self, indices: Any = None, **kwargs: Any) -> Any:
        return self._get("rewards", indices, kwargs)

    def to_episode(self) -> SingleAgentEpisode:
        """The kept steps as an RLlib ``SingleAgentEpisode`` chunk (``t_started`` = the first kept step)."""
        history, lane, start, length = self._owner.history, self.env_index, self._require_start(), len(self)
        first = max(start, history.first)
        events = range(first - history.first, start + length + 1 - history.first)
        return SingleAgentEpisode(
            id_=self.id_, observation_space=self.observation_space, action_space=self.action_space,
            observations=[_lane(history.obs[e], lane) for e in events],
            infos=[lane_info(history.infos[e], lane) for e in events],
            actions=[_lane(history.actions[e], lane) for e in events[1:]],
            rewards=[float(history.rewards[e][lane]) for e in events[1:]],
            terminated=self.is_terminated, truncated=self.is_truncated, t_started=first - start,
            len_lookback_buffer=0)

    def __getattr__(self, name: str) -> Any:
        # What the view does not offer itself (e.g. get_extra_model_outputs, slice) comes from RLlib's episode.
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.to_episode(), name)

    def __repr__(self) -> str:
        return f"LaneEpisode(env_index={self.env_index}, len={len(self)}, return={self.get_return()}, done={self.is_done})"

    def _require_start(self) -> int:
        if self._start is not None:
            return self._start
        if not self.is_reset:
            raise IndexError("LaneEpisode: this episode has no data yet (on_episode_created runs before the reset).")
        return int(self._owner.start_event[self.env_index])

    def _get(self, kind: str, indices: Any, kwargs: dict) -> Any:
        """One step's value by a plain int index (the common case, e.g. ``-1``) straight from the history; anything
        else (lists, slices, ``fill``, ...) through RLlib's episode."""
        if kwargs or not isinstance(indices, (int, np.integer)):
            return getattr(self.to_episode(), f"get_{kind if kind != 'obs' else 'observations'}")(indices, **kwargs)
        history, start, length = self._owner.history, self._require_start(), len(self)
        per_step = kind in ("actions", "rewards")  # one per step, not one per observation
        count = length if per_step else length + 1
        i = int(indices) + count if indices < 0 else int(indices)
        if not 0 <= i < count:
            raise IndexError(f"LaneEpisode.get_{kind}({indices}): the episode has {count} of them.")
        event = start + i + per_step
        if event < history.first:
            raise IndexError(
                f"LaneEpisode.get_{kind}({indices}): step {i} of this {length}-step episode is no longer kept: the "
                "columnar runner keeps an episode's steps back to the start of the previous sample_columns() call. "
                "Read what you need in on_episode_step as it happens, or keep it in episode.custom_data.")
        row = getattr(history, kind)[event - history.first]
        if kind == "infos":
            return lane_info(row, self.env_index)
        if kind == "rewards":
            return float(row[self.env_index])
        return _lane(row, self.env_index)


def _lane(row: Any, lane: int) -> Any:
    return tree.map_structure(lambda x: x[lane], row)


class RunnerCallbacks:
    """What the single- and multi-agent runners' callback helpers share: calling a callback with RLlib's keyword
    arguments, and the once-per-sample hooks (``on_sample_columns``, then ``on_sample_end``)."""

    def __init__(self, runner: Any, names: frozenset[str]) -> None:
        self.runner = runner
        self.names = names
        # The callables of each hook, in RLlib's order (callback objects, then the shorthand functions), looked up
        # once: RLlib's make_callback re-lists them on every call.
        self._hooks = {name: callables_of(name, runner.config, runner._callbacks) for name in names}
        # The runner's unwrapped env, looked up once per env (the wrapper chain costs per call; RLlib may rebuild it).
        self._env_source: Any = None
        self._env: Any = None
        self._sample_views: list = []  # episodes that ended in this sample (for on_sample_end)
        self._ended: list[tuple] = []  # (t, env_index, return, length, terminated) arrays (for on_sample_columns)

    def open_episodes(self) -> list:
        raise NotImplementedError

    def sample_end(self, columns: dict) -> None:
        runner = self.runner
        if COLUMNS_HOOK in self.names:
            keys = ("t", "env_index", "return", "length", "terminated")
            dtypes = (np.int64, np.int64, np.float64, np.int64, bool)
            ended = ({k: np.concatenate(parts) for k, parts in zip(keys, zip(*self._ended))} if self._ended
                     else {k: np.zeros(0, d) for k, d in zip(keys, dtypes)})
            for hook in self._hooks[COLUMNS_HOOK]:
                hook(env_runner=runner, metrics_logger=runner.metrics, columns=columns, ended=ended)
        self._ended = []
        if "on_sample_end" in self.names:
            samples = self._sample_views + self.open_episodes()
            for hook in self._hooks["on_sample_end"]:
                hook(env_runner=runner, metrics_logger=runner.metrics, samples=samples)
        self._sample_views = []

    def _ended_episode(self, episode: Any, env_index: int | None = None) -> None:
        self._call("on_episode_end", episode, env_index, prev_episode_chunks=[])
        if "on_sample_end" in self.names:
            self._sample_views.append(episode)

    def _call(self, which: str, episode: Any, env_index: int | None = None, **extra: Any) -> None:
        hooks = self._hooks.get(which)
        if not hooks:
            return
        runner = self.runner
        if self._env_source is not runner.env:
            self._env_source, self._env = runner.env, runner.env.unwrapped
        kwargs = dict(episode=episode, env_runner=runner, metrics_logger=runner.metrics, env=self._env,
                      rl_module=runner.module, env_index=episode.env_index if env_index is None else env_index,
                      **extra)
        for hook in hooks:
            hook(**kwargs)


class EpisodeCallbacks(RunnerCallbacks):
    """The user's runner-side callbacks on one single-agent columnar runner; built only when some are configured.

    The runner calls :meth:`sample_start` first in each ``sample_columns()`` call, :meth:`before_reset` /
    :meth:`after_reset` around a reset of all lanes, :meth:`after_step` after every env step of all lanes and
    :meth:`sample_end` once the batch is complete. Each lane's episode state (start, length, return) is an array over
    all lanes, updated once per step; a lane's :class:`LaneEpisode` is made only when a callback is handed it."""

    def __init__(self, runner: Any, names: frozenset[str]) -> None:
        super().__init__(runner, names)
        self.observation_space = runner.env.single_observation_space
        self.action_space = runner.env.single_action_space
        n = runner.num_envs
        self.history = StepHistory()
        self.id_prefix = uuid.uuid4().hex[:16]
        self.episodes_created = 0
        self.returns = np.zeros(n, np.float64)
        self.length = np.zeros(n, np.int64)
        self.started = np.zeros(n, bool)  # the lane's current episode has its reset observation
        self.start_event = np.zeros(n, np.int64)
        self.start_time = np.zeros(n, np.float64)
        self.episodes: list[LaneEpisode | None] = [None] * n  # made on first use
        # Only on_sample_columns set: no views and no history, just the ended episodes' arrays.
        self._views = bool(names - {COLUMNS_HOOK})
        self._sample_first = 0  # the first event of the current and of the previous sample_columns() call
        self._previous_sample_first = 0

    def episode(self, lane: int) -> LaneEpisode:
        """Lane ``lane``'s current episode (made now if no callback has needed it yet)."""
        episode = self.episodes[lane]
        if episode is None:
            episode = self.episodes[lane] = LaneEpisode(self, lane)
        return episode

    def open_episodes(self) -> list:
        return [self.episode(lane) for lane in np.flatnonzero(self.started)]

    def sample_start(self) -> None:
        """Forgets the events no open episode may read any more (see the module docstring)."""
        self._previous_sample_first, self._sample_first = self._sample_first, self.history.next
        oldest = int(self.start_event[self.started].min()) if self.started.any() else self.history.next
        self.history.trim(max(oldest, self._previous_sample_first))

    def before_reset(self) -> None:
        """New episodes on every lane (the old ones are abandoned, as RLlib's runner abandons them on a reset)."""
        self.episodes = [None] * len(self.episodes)
        self.started[:] = False
        if "on_episode_created" in self.names:
            for lane in range(len(self.episodes)):
                self._call("on_episode_created", self.episode(lane))

    def after_reset(self, obs: Any, infos: Any) -> None:
        self.returns[:] = 0.0
        self.length[:] = 0
        if self._views:
            self._start(np.ones(len(self.episodes), bool), self.history.add(obs, infos))

    def after_step(self, t: int, actions: Any, obs: Any, rewards: np.ndarray, terminateds: np.ndarray,
                   truncateds: np.ndarray, infos: Any, valid: np.ndarray) -> None:
        """One env step of all lanes: ``valid`` lanes took a step of their episode, the others were reset (NEXT_STEP
        autoreset) and start a new one."""
        event = self.history.add(obs, infos, actions, rewards) if self._views else None
        self.returns += np.where(valid, rewards, 0.0)
        self.length += valid
        if "on_episode_step" in self.names:
            for lane in np.flatnonzero(valid):
                self._call("on_episode_step", self.episode(lane))
        ended = (terminateds | truncateds) & valid
        if ended.any():
            lanes = np.flatnonzero(ended)
            if COLUMNS_HOOK in self.names:
                self._ended.append((np.full(len(lanes), t), lanes, self.returns[lanes].copy(),
                                    self.length[lanes].copy(), terminateds[lanes].copy()))
            if self._views:
                self._end(lanes, terminateds)
            self.returns[lanes] = 0.0
            self.length[lanes] = 0
        if self._views and not valid.all():
            self._start(~valid, event)

    def _end(self, lanes: np.ndarray, terminateds: np.ndarray) -> None:
        created = "on_episode_created" in self.names
        self.started[lanes] = False  # (the ended episodes keep theirs: freeze() below)
        for lane in lanes:
            episode = self.episode(lane)
            episode.freeze(bool(terminateds[lane]))
            self._ended_episode(episode)
            self.episodes[lane] = None
            if created:  # as RLlib's runner: the lane's next episode is made right after the end
                self._call("on_episode_created", self.episode(lane))

    def _start(self, lanes: np.ndarray, event: int) -> None:
        """``lanes`` (a mask) got their reset observation at ``event``."""
        self.started[lanes] = True
        self.start_event[lanes] = event
        self.start_time[lanes] = time.perf_counter()
        if "on_episode_start" in self.names:
            for lane in np.flatnonzero(lanes):
                self._call("on_episode_start", self.episode(lane))


class MultiAgentEpisodeCallbacks(RunnerCallbacks):
    """The user's runner-side callbacks on a :class:`~rl_speed.env_runners.MultiAgentBatchedEnvRunner`, which steps
    its env copies one by one anyway: each copy's episode is a real RLlib ``MultiAgentEpisode`` (whole, never cut:
    ``get_return()`` and ``len()`` cover the episode), built only when a callback is configured."""

    def __init__(self, runner: Any, names: frozenset[str]) -> None:
        super().__init__(runner, names)
        self.episodes: dict[int, MultiAgentEpisode] = {}

    def open_episodes(self) -> list:
        return [ep for ep in self.episodes.values() if ep.is_reset]

    def new_episode(self, i: int, env: Any) -> MultiAgentEpisode:
        """Copy ``i``'s next episode, before its env resets (``on_episode_created``)."""
        agents = env.possible_agents
        episode = MultiAgentEpisode(observation_space={aid: env.get_observation_space(aid) for aid in agents},
                                    action_space={aid: env.get_action_space(aid) for aid in agents},
                                    agent_to_module_mapping_fn=self.runner.config.policy_mapping_fn)
        self.episodes[i] = episode
        self._call("on_episode_created", episode, i)
        return episode

    def after_reset(self, i: int, obs: dict, infos: dict) -> None:
        self.episodes[i].add_env_reset(observations=obs, infos=infos)
        self._call("on_episode_start", self.episodes[i], i)

    def after_step(self, i: int, t: int, actions: dict, result: tuple, ended: bool) -> None:
        """One step of copy ``i``: ``actions`` the module's actions of the agents that acted, ``result`` the env's
        step tuple, ``ended`` whether the copy's episode ended (``__all__``)."""
        obs, rewards, terminateds, truncateds, infos = result
        episode = self.episodes[i]
        episode.add_env_step(obs, actions, rewards, infos, terminateds=terminateds, truncateds=truncateds)
        self._call("on_episode_step", episode, i)
        if ended:
            if COLUMNS_HOOK in self.names:
                self._ended.append(([t], [i], [episode.get_return()], [episode.env_steps()],
                                    [bool(terminateds.get("__all__"))]))
            self._ended_episode(episode, i)
