"""MultiAgentBatchedEnvRunner: RLlib's MultiAgentEnvRunner with a columnar method for envs whose agents act together.

A lane is one agent slot of one env copy: with ``N`` copies of a ``MultiAgentEnv`` whose ``possible_agents`` are
``A``, lane ``i * A + a`` is agent ``a`` of copy ``i`` and :meth:`sample_columns` returns ``[T, N * A]`` columns
(:mod:`rl_speed.columns`) plus the ``module`` column: which module acted for that lane (``policy_mapping_fn``, asked
once per agent per episode). Each step makes one forward pass per module over the lanes it acts for; lanes whose
agent is absent, already done, or whose copy is resetting are ``valid`` False (not trained on, not counted).

What the env must be (checked when the config is validated, :func:`check_multi_agent_env`): agents from a known
``possible_agents`` list. Agents with different observation or action spaces (FastPPO) get the per-module layout
(:data:`rl_speed.columns.BY_MODULE`: each module's observations, actions and outputs in its own columns). Agents act
simultaneously, or (FastPPO) in turns: an agent that acted and has no next observation waits, its transition open,
until it observes again; the rewards and the episode end it gets meanwhile go to the step it acted in, and the
``next_row`` column tells GAE where its next observation is (:mod:`rl_speed.columns`). A transition still open when
the rollout ends is not trained on (RLlib's runner moves it into the next chunk). Agents may end early (their own
``terminateds`` / ``truncateds``); the copy ends at ``__all__`` and restarts one step later, as gymnasium's NEXT_STEP
autoreset does (that step is not a transition). A reward given to an agent that has not acted yet is added to its
next action's reward, as RLlib's episodes do.

The user's env-to-module pieces run per copy on its observation dict (RLlib's ``FlattenObservations(multi_agent=True)``
and ``MultiAgentObservationPreprocessor`` subclasses; :func:`rl_speed.connectors.env_to_module.multi_agent_pipeline`).
RLlib's own ``sample()`` (episodes; evaluation, ``Algorithm.evaluate()``) is inherited and shares the envs.
Episode metrics use RLlib's keys and windows: ``episode_return_mean`` is the sum over agents,
``agent_episode_returns_mean/<agent>``, ``module_episode_returns_mean/<module>``, env steps and agent / module steps;
as on RLlib's runner, the episode keys appear once the first episode has ended.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import tree

from ray.rllib.env.multi_agent_env import MultiAgentEnv
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.env.multi_agent_episode import MultiAgentEpisode
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import (
    NUM_AGENT_STEPS_SAMPLED,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES,
    NUM_EPISODES_LIFETIME,
    NUM_MODULE_STEPS_SAMPLED,
    NUM_MODULE_STEPS_SAMPLED_LIFETIME,
    SAMPLE_TIMER,
)
from ray.rllib.utils.spaces.space_utils import get_base_struct_from_space

from rl_speed import columns as C
from rl_speed.columns import Columns
from rl_speed.connectors.env_to_module import apply_per_copy, multi_agent_pipeline
from rl_speed.env_runners.episode_callbacks import MultiAgentEpisodeCallbacks, configured_callbacks
from rl_speed.env_runners import stepping
from rl_speed.env_runners.stepping import (clip_rewards, module_actions, set_runner_threads, to_env_actions,
                                           write_step)


NOT_OPEN, DROPPED = -1, -2  # a lane's open-transition row (turn-based envs): none, or one in an earlier rollout


class TurnBasedEnvError(ValueError):
    """The env's agents act in turns; the columnar path needs agents that act together."""


def _zeros(sample: Any, rows: int) -> Any:
    """``[rows, ...]`` zeros shaped like one observation (a structure of arrays for Dict / Tuple spaces)."""
    return tree.map_structure(lambda x: np.zeros((rows, *np.shape(x)), np.asarray(x).dtype), sample)


def check_multi_agent_env(env: MultiAgentEnv, name: str, turn_based: bool = False, mixed_spaces: bool = False,
                          module_obs_spaces: dict | None = None) -> None:
    """Refuses envs the multi-agent columns cannot represent, naming the reason: (unless ``mixed_spaces`` is
    supported) agents with different spaces, or (unless ``turn_based`` is) agents that act in turns (a reset or a step
    whose observations leave out an agent that is not done). ``module_obs_spaces``: each agent's observation space
    after the env-to-module pieces."""
    env = env.unwrapped
    agents = list(env.possible_agents or [])
    if not agents:
        raise ValueError(f"{name}: the MultiAgentEnv has no `possible_agents`; the columnar path needs the full list "
                         "of agents up front (one lane per agent). Set `self.possible_agents` in its __init__.")
    obs_spaces = {aid: (module_obs_spaces or {}).get(aid) or env.get_observation_space(aid) for aid in agents}
    act_spaces = {aid: env.get_action_space(aid) for aid in agents}
    for kind, spaces in (("observation", obs_spaces), ("action", act_spaces)) if not mixed_spaces else ():
        first = spaces[agents[0]]
        other = next((aid for aid in agents if spaces[aid] != first), None)
        if other is not None:
            raise ValueError(f"{name}: agents {agents[0]!r} and {other!r} have different {kind} spaces ({first} vs "
                             f"{spaces[other]}); {name}'s multi-agent columns need one {kind} space for all agents "
                             "(FastPPO trains agents with different spaces). Pad the spaces to one shape, or use "
                             "stock RLlib.")
    if turn_based:
        return
    obs, _ = env.reset(seed=0)
    absent = [aid for aid in agents if aid not in obs]
    if absent:
        raise TurnBasedEnvError(
            f"{name}: after reset, agents {absent[:5]} have no observation: this looks like a turn-based env "
            f"(agents acting in sequence), which {name}'s columns do not represent; FastPPO trains turn-based envs, "
            "or use stock RLlib.")
    actions = {aid: act_spaces[aid].sample() for aid in obs}
    obs, _, terminateds, truncateds, _ = env.step(actions)
    if not (terminateds.get("__all__") or truncateds.get("__all__")):
        skipped = [aid for aid in actions if aid not in obs and not terminateds.get(aid) and not truncateds.get(aid)]
        if skipped:
            raise TurnBasedEnvError(
                f"{name}: agents {skipped[:5]} acted, are not done, and have no next observation: this looks like "
                f"a turn-based env (agents acting in sequence), which {name}'s columns do not represent; FastPPO "
                "trains turn-based envs, or use stock RLlib.")


class MultiAgentBatchedEnvRunner(MultiAgentEnvRunner):
    """See the module docstring. FastPPO and FastDQN use it for multi-agent configs (``config.multi_agent(...)``)."""

    #: The columnar path's next round of resets is seeded (``config.seed``): the first of every env the runner makes,
    #: as RLlib's runner seeds it; cleared once every copy has reset (:meth:`_reset_copy`).
    _seed_next_reset = True

    @override(MultiAgentEnvRunner)
    def __init__(self, *, config: Any, **kwargs: Any) -> None:
        set_runner_threads(config, kwargs.get("worker_index", 0))
        super().__init__(config=config, **kwargs)
        self.module_ids = sorted(self.module.keys()) if self.module is not None else []
        for mid in self.module_ids:
            if hasattr(self.module[mid], "eval"):  # (heuristic modules, e.g. RLlib's RandomRLModule, are not torch)
                self.module[mid].eval()  # these copies only act; set once instead of on every forward call
        self._obs: Any = None  # [L, ...] last observation of every lane, continued across sample_columns() calls
        self._columnar = False
        self._finished: list[tuple] = []  # episodes finished since the last get_metrics()
        # The per-copy forms of the user's env-to-module pieces (RLlib built its pipeline above).
        self._forms = multi_agent_pipeline(self._env_to_module) if self._env_to_module is not None else []
        # Turn-based envs: the algorithm's learner reads `next_row` (FastPPO); others refuse them at config time.
        self._turn_based = bool(getattr(self.config, "supports_turn_based_envs", False))
        self._extra_shapes: dict[tuple[str, str], tuple] = {}  # (output key, module) -> per-step shape (by_module)
        # RLlib's episode callbacks and rl_speed's on_sample_columns: episodes are built only when one is set.
        names = configured_callbacks(self.config, self._callbacks)
        self._episode_callbacks = MultiAgentEpisodeCallbacks(self, names) if names else None

    @override(MultiAgentEnvRunner)
    def make_env(self) -> None:
        super().make_env()
        # A new env (RLlib calls this again after a user changes env_config; the old one is closed): the columnar
        # path builds its lanes on it and starts from a seeded reset, as RLlib's sample() does.
        self._obs = None
        self._seed_next_reset = True

    def _build_lanes(self) -> None:
        envs = [e.unwrapped for e in self.env.envs]
        self._agents = list(envs[0].possible_agents)
        self._envs = envs
        n, a = len(envs), len(self._agents)
        lanes = n * a
        obs_spaces = [self._forms[-1].piece.observation_space[aid] if self._forms  # what the module sees
                      else envs[0].get_observation_space(aid) for aid in self._agents]
        act_spaces = [envs[0].get_action_space(aid) for aid in self._agents]
        # Agents with different spaces: obs, actions and the module's outputs are kept per module (see C.BY_MODULE).
        self._by_module = any(o != obs_spaces[0] for o in obs_spaces) or any(x != act_spaces[0] for x in act_spaces)
        if self._by_module:
            self._obs = {mid: _zeros(self.module[mid].observation_space.sample(), lanes) for mid in self.module_ids}
            self._action_struct = {mid: get_base_struct_from_space(self.module[mid].action_space)
                                   for mid in self.module_ids}
        else:
            self._obs = _zeros(obs_spaces[0].sample(), lanes)
            self._action_struct = get_base_struct_from_space(act_spaces[0])
        self._present = np.zeros(lanes, bool)  # the agent has an observation and acts next step
        self._done = np.zeros(lanes, bool)  # the agent's episode ended before its copy's
        self._module = np.full(lanes, -1, np.int16)
        self._resetting = np.zeros(n, bool)  # copies whose next step is a reset step
        self._pending_reward = np.zeros(lanes, np.float64)
        self._open = np.full(lanes, NOT_OPEN, np.int64)  # turn-based: the row of a lane's open transition
        self._lane_return = np.zeros(lanes, np.float64)
        self._lane_steps = np.zeros(lanes, np.int64)
        self._env_len = np.zeros(n, np.int64)
        self._env_start = np.full(n, time.perf_counter())

    @override(MultiAgentEnvRunner)
    def sample(self, **kwargs: Any) -> list:
        """RLlib's ``sample()``: episodes through the connector pipelines (evaluation, ``Algorithm.evaluate()``)."""
        self._needs_initial_reset |= self._obs is not None  # the columnar path moved the envs on: start over
        self._obs = None  # and the next sample_columns() starts from a reset too
        return super().sample(**kwargs)

    def sample_columns(self, *, num_timesteps: int | None = None, explore: bool | None = None,
                       random_actions: bool = False, force_reset: bool = False) -> Columns:
        """Steps all N env copies ``T`` times (``T = ceil(num_timesteps / N)`` or ``rollout_fragment_length``)
        and returns ``[T, N * A]`` columns; consecutive calls continue the same episodes."""
        if explore is None:
            explore = self.config.explore
        steps = (math.ceil(num_timesteps / self.num_envs) if num_timesteps is not None
                 else self.config.get_rollout_fragment_length(self.worker_index))
        with self.metrics.log_time(SAMPLE_TIMER):
            if self._obs is None or force_reset:
                self._build_lanes()
                for i, env in enumerate(self._envs):
                    self._reset_copy(i, env)
            self._columnar = True
            columns, env_steps, episodes = self._sample_steps(steps, explore, random_actions)
            if self._episode_callbacks is not None:
                self._episode_callbacks.sample_end(columns)
        self._log_sampled(columns, env_steps, episodes)
        self.num_env_steps_sampled_lifetime += env_steps * (self.config.num_env_runners or 1)
        return columns

    def _sample_steps(self, steps: int, explore: bool, random_actions: bool) -> tuple[Columns, int, int]:
        n, a = len(self._envs), len(self._agents)
        lanes = n * a
        columns: Columns = {
            C.OBS: tree.map_structure(lambda o: np.empty((steps + 1, *o.shape), o.dtype), self._obs),
            C.ACTIONS: tree.map_structure(lambda s: np.zeros((steps, lanes, *s.shape), s.dtype), self._action_struct),
            C.REWARDS: np.zeros((steps, lanes), np.float32),
            C.TERMINATEDS: np.zeros((steps, lanes), bool),
            C.TRUNCATEDS: np.zeros((steps, lanes), bool),
            C.VALID: np.zeros((steps, lanes), bool),
            C.MODULE: np.empty((steps + 1, lanes), np.int16),
            C.ENV_STEP: np.zeros((steps, lanes), bool),
        }
        if self._by_module:
            columns[C.BY_MODULE] = np.ones((1, lanes), bool)
        if self._turn_based:
            columns[C.NEXT_ROW] = np.repeat(np.arange(1, steps + 1, dtype=np.int32)[:, None], lanes, axis=1)
        runners = self.config.num_env_runners or 1
        env_steps = episodes = 0
        agents = self._agents
        clock = time.perf_counter
        env_seconds = inference_seconds = 0.0
        for t in range(steps):
            write_step(columns[C.OBS], t, self._obs)
            columns[C.MODULE][t] = self._module
            acting = self._present & ~np.repeat(self._resetting, a)
            start = clock()
            actions = self._act(columns, t, acting, explore, random_actions,
                                self.num_env_steps_sampled_lifetime + t * n * runners)
            inference_seconds += clock() - start
            flat = list(actions) if isinstance(actions, (np.ndarray, list)) else None  # per-lane actions, read once
            for i, env in enumerate(self._envs):
                base = i * a
                if self._resetting[i]:
                    self._reset_copy(i, env)
                    continue
                if flat is not None and acting[base:base + a].all():  # the common case: everyone acts
                    action_dict = dict(zip(agents, flat[base:base + a]))
                elif flat is not None:
                    action_dict = {aid: flat[base + k] for k, aid in enumerate(agents) if acting[base + k]}
                else:
                    action_dict = {aid: tree.map_structure(lambda x, k=base + k: x[k], actions)
                                   for k, aid in enumerate(self._agents) if acting[base + k]}
                start = clock()
                result = env.step(action_dict)
                env_seconds += clock() - start
                if self._forms:
                    result = (apply_per_copy(self._forms, result[0]), *result[1:])
                ended = self._step_copy(i, result, acting[base:base + a], columns, t)
                if self._episode_callbacks is not None:  # the module's actions, as RLlib's episodes keep them
                    acted = {aid: self._lane_action(columns, t, base + k)
                             for k, aid in enumerate(agents) if acting[base + k]}
                    self._episode_callbacks.after_step(i, t, acted, result, ended)
                columns[C.ENV_STEP][t, base] = True
                env_steps += 1
                if ended:
                    self._resetting[i] = True
                    self._finish_episode(i)
                    episodes += 1
        write_step(columns[C.OBS], steps, self._obs)
        columns[C.MODULE][steps] = self._module
        still_open = np.flatnonzero(self._open >= 0)  # their next observation comes in a later rollout
        columns[C.VALID][self._open[still_open], still_open] = False
        self._open[still_open] = DROPPED
        stepping.log_step_timers(self.metrics, steps, env_seconds, None if random_actions else inference_seconds)
        return columns, env_steps, episodes

    def _step_copy(self, i: int, result: tuple, acting: np.ndarray, columns: Columns, t: int) -> bool:
        """Writes one env step of copy ``i`` into step ``t`` of its lanes (array ops over the copy's agents);
        returns whether the copy's episode ended (``__all__``)."""
        obs, rewards, terminateds, truncateds, _ = result
        agents, a = self._agents, len(self._agents)
        lanes = slice(i * a, (i + 1) * a)
        self._env_len[i] += 1
        if self._plain_step(result, acting, lanes, columns, t):
            return False
        term_all, trunc_all = bool(terminateds.get("__all__")), bool(truncateds.get("__all__"))
        ended = term_all or trunc_all
        raw = np.array([rewards.get(aid, 0.0) for aid in agents], np.float64)
        open_row = self._open[lanes]
        waiting = open_row != NOT_OPEN  # turn-based: acted earlier, no observation since
        # A reward for an agent that has not acted yet waits for its first action (RLlib's episodes do the same).
        reward = np.where(acting, raw + self._pending_reward[lanes], 0.0)
        self._pending_reward[lanes] = np.where(acting | waiting, 0.0, raw + self._pending_reward[lanes])
        ends = acting | waiting  # the transitions an episode end applies to
        terminated = np.array([bool(terminateds.get(aid, term_all)) for aid in agents]) & ends
        truncated = np.array([bool(truncateds.get(aid, trunc_all)) for aid in agents]) & ends & ~terminated
        if ended:
            truncated |= ends & ~terminated  # the copy ended around agents that were not done: cut, bootstrap
        done = terminated | truncated
        has_obs = np.array([aid in obs for aid in agents])
        skipped = acting & ~has_obs & ~done
        if skipped.any():
            if not self._turn_based:
                raise TurnBasedEnvError(
                    f"MultiAgentBatchedEnvRunner: agent {agents[int(np.argmax(skipped))]!r} acted, is not done, and "
                    "has no next observation: the env is turn-based (agents acting in sequence), which this "
                    "algorithm's columns do not represent; FastPPO trains turn-based envs, or use stock RLlib.")
            self._open[np.arange(lanes.start, lanes.stop)[skipped]] = t
        if waiting.any():
            self._close_waiting(lanes.start, waiting, open_row, raw, terminated, truncated, has_obs | done, t,
                                columns)
        columns[C.REWARDS][t, lanes] = clip_rewards(reward, self.config.clip_rewards)  # metrics keep the raw ones
        columns[C.TERMINATEDS][t, lanes] = terminated & acting
        columns[C.TRUNCATEDS][t, lanes] = truncated & acting
        columns[C.VALID][t, lanes] = acting
        self._lane_return[lanes] += reward + np.where(waiting, raw, 0.0)
        self._lane_steps[lanes] += acting
        self._done[lanes] |= done
        joining = has_obs & ~acting & ~self._done[lanes] & (not ended)  # late joiners, and agents whose turn it is
        write = has_obs & (acting | joining | waiting)  # next (or final) observations, and joiners' first
        if write.all() and isinstance(self._obs, np.ndarray):  # the common case: one array copy per env step
            self._obs[lanes] = np.stack([obs[aid] for aid in agents])
        elif write.all() and not self._by_module:
            write_step(self._obs, lanes, tree.map_structure(lambda *xs: np.stack(xs), *[obs[aid] for aid in agents]))
        else:
            for k in np.flatnonzero(write):
                self._set_obs(i * a + k, obs[agents[k]])
        self._present[lanes] = (acting & ~done & has_obs) | joining
        return ended

    def _close_waiting(self, first: int, waiting: np.ndarray, open_row: np.ndarray, raw: np.ndarray,
                       terminated: np.ndarray, truncated: np.ndarray, closing: np.ndarray, t: int,
                       columns: Columns) -> None:
        """Turn-based: what waiting agents receive in step ``t`` goes to the step they acted in (their open row):
        rewards, and the episode's end; an observation (or the end) closes the transition, its next observation in
        ``obs[t + 1]``. A transition opened in an earlier rollout was dropped from training: only the metrics see it."""
        for k in np.flatnonzero(waiting):
            lane, row = first + k, open_row[k]
            if row >= 0:
                columns[C.REWARDS][row, lane] += clip_rewards(raw[k], self.config.clip_rewards)
                columns[C.TERMINATEDS][row, lane] = terminated[k]
                columns[C.TRUNCATEDS][row, lane] = truncated[k]
                if closing[k]:
                    columns[C.NEXT_ROW][row, lane] = t + 1
            if closing[k]:
                self._open[lane] = NOT_OPEN

    def _plain_step(self, result: tuple, acting: np.ndarray, lanes: slice, columns: Columns, t: int) -> bool:
        """The common step, written with a few array ops: every agent acted, every one has its next observation,
        none is done and the copy goes on. Returns False (nothing written) for any other step."""
        obs, rewards, terminateds, truncateds, _ = result
        agents = self._agents
        if (len(obs) != len(agents) or any(terminateds.values()) or any(truncateds.values()) or not acting.all()
                or not isinstance(self._obs, np.ndarray)):
            return False
        try:
            rows = [obs[aid] for aid in agents]
        except KeyError:  # another agent set than possible_agents: the general path names the problem
            return False
        reward = np.array([rewards.get(aid, 0.0) for aid in agents], np.float64) + self._pending_reward[lanes]
        self._pending_reward[lanes] = 0.0
        columns[C.REWARDS][t, lanes] = clip_rewards(reward, self.config.clip_rewards)
        columns[C.VALID][t, lanes] = True  # terminated / truncated stay False (the columns start zeroed)
        self._lane_return[lanes] += reward
        self._lane_steps[lanes] += 1
        self._obs[lanes] = rows  # one copy from the list (np.stack first would copy twice and cost more)
        return True

    def _reset_copy(self, i: int, env: MultiAgentEnv) -> None:
        """The NEXT_STEP reset of copy ``i``: a new episode, its agents mapped to modules."""
        a = len(self._agents)
        seed = None
        if self._seed_next_reset and self._seed is not None:
            seed = self._seed + i
        callbacks = self._episode_callbacks
        # What policy_mapping_fn receives (its id_ tells episodes apart); with callbacks, the episode they get.
        episode = callbacks.new_episode(i, env) if callbacks is not None else MultiAgentEpisode()
        obs, infos = env.reset(seed=seed)
        if self._forms:
            obs = apply_per_copy(self._forms, obs)
        if i == len(self._envs) - 1:
            self._seed_next_reset = False
        if callbacks is not None:
            callbacks.after_reset(i, obs, infos)
        lanes = slice(i * a, (i + 1) * a)
        self._present[lanes] = False
        self._done[lanes] = False
        self._pending_reward[lanes] = 0.0
        self._open[lanes] = NOT_OPEN
        self._lane_return[lanes] = 0.0
        self._lane_steps[lanes] = 0
        for k, aid in enumerate(self._agents):
            # (An episode for callbacks maps each agent once itself; ask it, so both agree for a random mapping.)
            module_id = (episode.module_for(aid) if callbacks is not None
                         else self.config.policy_mapping_fn(aid, episode))
            if module_id not in self.module_ids:
                raise ValueError(f"MultiAgentBatchedEnvRunner: policy_mapping_fn mapped agent {aid!r} to "
                                 f"{module_id!r}, which is not one of the modules {self.module_ids}.")
            self._module[i * a + k] = self.module_ids.index(module_id)
            if aid in obs:
                self._set_obs(i * a + k, obs[aid])
                self._present[i * a + k] = True
        self._resetting[i] = False
        self._env_len[i] = 0
        self._env_start[i] = time.perf_counter()

    def _act(self, columns: Columns, t: int, acting: np.ndarray, explore: bool, random_actions: bool,
             timestep: int) -> Any:
        """One forward pass per module over the lanes it acts for; actions (and log-probs, distribution inputs)
        written into the columns. Returns the env's actions for all lanes (zeros where nobody acts)."""
        by_module = self._by_module
        actions = tree.map_structure(lambda c: c[t], columns[C.ACTIONS])
        env_actions: list | None = [None] * len(acting) if by_module else None
        for index, mid in enumerate(self.module_ids):
            idx = np.flatnonzero(acting & (self._module == index))
            if not len(idx):
                continue
            obs = tree.map_structure(lambda o: o[idx], self._obs[mid] if by_module else self._obs)
            if random_actions:
                space = self.module[mid].action_space
                chosen, extra = np.stack([space.sample() for _ in idx]), {}
            else:
                chosen, extra, _ = module_actions(self.module[mid], obs, explore, timestep, device=self._device)
            for key, value in extra.items():
                if by_module:
                    self._extra_column(columns, key, mid, value)[t, idx] = value
                    continue
                if key not in columns:
                    columns[key] = np.zeros((len(columns[C.REWARDS]), len(acting), *value.shape[1:]), value.dtype)
                columns[key][t, idx] = value
            mine = actions[mid] if by_module else actions
            tree.map_structure(lambda dst, src: dst.__setitem__(idx, src), mine, chosen)
            if by_module:
                converted = to_env_actions(chosen, self._action_struct[mid], self.config)
                for j, lane in enumerate(idx):
                    env_actions[lane] = tree.map_structure(lambda x, j=j: x[j], converted)
        if by_module:
            return env_actions
        return to_env_actions(actions, self._action_struct, self.config)

    # Agents with different spaces (C.BY_MODULE): each module's observations, actions and outputs in its own columns.

    def _set_obs(self, lane: int, value: Any) -> None:
        """The lane's observation, into the array of the module that acts for it."""
        write_step(self._obs[self.module_ids[self._module[lane]]] if self._by_module else self._obs, lane, value)

    def _lane_action(self, columns: Columns, t: int, lane: int) -> Any:
        chosen = columns[C.ACTIONS][self.module_ids[self._module[lane]]] if self._by_module else columns[C.ACTIONS]
        return tree.map_structure(lambda c: c[t, lane], chosen)

    def _extra_column(self, columns: Columns, key: str, mid: str, value: np.ndarray) -> np.ndarray:
        """``columns[key][mid]``, made on first use (every module's entry, so all runners' columns match)."""
        if key not in columns:
            t_len, lanes = columns[C.REWARDS].shape
            columns[key] = {}
            for other in self.module_ids:
                shape = value.shape[1:] if other == mid else self._extra_shape(key, other)
                columns[key][other] = np.zeros((t_len, lanes, *shape), np.float32)
        return columns[key][mid]

    def _extra_shape(self, key: str, mid: str) -> tuple:
        """The per-step shape of a module's output ``key`` (log-probs, distribution inputs), from one forward pass of
        a sampled observation; () where the module gives none (a heuristic module)."""
        cache = self._extra_shapes
        if (key, mid) not in cache:
            sample = _zeros(self.module[mid].observation_space.sample(), 1)
            _, extra, _ = module_actions(self.module[mid], sample, True, 0, device=self._device)
            for k, v in extra.items():
                cache[(k, mid)] = v.shape[1:]
            cache.setdefault((key, mid), ())
        return cache[(key, mid)]

    def _finish_episode(self, i: int) -> None:
        a = len(self._agents)
        lanes = range(i * a, (i + 1) * a)
        took_part = [lane for lane in lanes if self._lane_steps[lane]]
        agent_returns = {str(self._agents[lane - i * a]): float(self._lane_return[lane]) for lane in took_part}
        agent_steps = {str(self._agents[lane - i * a]): int(self._lane_steps[lane]) for lane in took_part}
        module_returns: dict[str, float] = {}
        for lane in took_part:
            mid = self.module_ids[self._module[lane]]
            module_returns[mid] = module_returns.get(mid, 0.0) + float(self._lane_return[lane])
        self._finished.append((int(self._env_len[i]), float(sum(agent_returns.values())),
                               time.perf_counter() - self._env_start[i], agent_returns, module_returns, agent_steps))

    def _log_sampled(self, columns: Columns, env_steps: int, episodes: int) -> None:
        """RLlib's sampled-step counters with the call's totals (the stock runner logs them per step)."""
        log = self.metrics.log_value
        log(NUM_ENV_STEPS_SAMPLED, env_steps, reduce="sum")
        log(NUM_ENV_STEPS_SAMPLED_LIFETIME, env_steps, reduce="lifetime_sum", with_throughput=True)
        log(NUM_EPISODES, episodes, reduce="sum")
        log(NUM_EPISODES_LIFETIME, episodes, reduce="lifetime_sum")
        a = len(self._agents)
        valid = columns[C.VALID]
        per_agent = valid.reshape(len(valid), -1, a).sum(axis=(0, 1))
        for k, aid in enumerate(self._agents):
            if per_agent[k]:
                log((NUM_AGENT_STEPS_SAMPLED, str(aid)), int(per_agent[k]), reduce="sum")
                log((NUM_AGENT_STEPS_SAMPLED_LIFETIME, str(aid)), int(per_agent[k]), reduce="lifetime_sum")
        per_module = np.bincount(columns[C.MODULE][:-1][valid].astype(np.int64), minlength=len(self.module_ids))
        for index, mid in enumerate(self.module_ids):
            if per_module[index]:
                log((NUM_MODULE_STEPS_SAMPLED, mid), int(per_module[index]), reduce="sum")
                log((NUM_MODULE_STEPS_SAMPLED_LIFETIME, mid), int(per_module[index]), reduce="lifetime_sum")

    @override(MultiAgentEnvRunner)
    def get_metrics(self) -> dict:
        """RLlib's episode keys over the episodes finished since the last call (at most the last
        ``metrics_num_episodes_for_smoothing`` / runners of them, as RLlib's runner), NaN when none did."""
        if self._columnar:
            window = max(1, math.ceil(self.config.metrics_num_episodes_for_smoothing
                                      / (self.config.num_env_runners or 1)))
            recent, self._finished = self._finished[-window:], []
            for length, ret, seconds, agents, modules, agent_steps in recent:
                self._log_episode_metrics(length, ret, seconds, agents, modules, agent_steps)  # RLlib's own
        return super().get_metrics()
