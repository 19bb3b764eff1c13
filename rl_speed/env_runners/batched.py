"""BatchedEnvRunner: an RLlib EnvRunner whose columnar method, :meth:`BatchedEnvRunner.sample_columns`, returns
``[T, N]`` column arrays instead of episode objects.

It subclasses RLlib's ``SingleAgentEnvRunner`` to keep everything RLlib already does right (env creation through
``vector_entry_point`` / sync vectorization, module construction, weight sync via ``get_state`` / ``set_state``,
metrics plumbing, remote-actor behaviour) and adds one method: ``sample_columns()`` makes one module forward on the
whole ``[N, ...]`` observation batch per step, written straight into pre-allocated columns (see
:mod:`rl_speed.columns`). The per-env ``SingleAgentEpisode`` objects and connector pipelines of the stock runner are
not used on that path: the env-to-module pieces a user configured run in their columnar forms
(:mod:`rl_speed.connectors.env_to_module`, once per step on all N lanes; a piece without one is refused), and the
columns hold what the module saw.

RLlib's own ``sample()`` (episodes, through the connector pipelines) is inherited and works on the same runner: RLlib's
evaluation, ``Algorithm.evaluate()`` and users' scripts call it. The two share the runner's env, so whichever runs
after the other starts its episodes from a reset.

Episode returns and lengths of the columnar path are accumulated in arrays and reported under RLlib's usual keys
(``episode_return_mean``, ``episode_len_mean``, ``num_env_steps_sampled_lifetime``, ...), so Tune stop criteria,
the progress line and dashboards work unchanged. An env whose step infos report whole games (``game_reward`` and
``game_over`` arrays, as rl_speed's Atari env does) also gets ``game_return_mean``: the mean unclipped score of the
games finished, over the same window, on both paths (RLlib's ``sample()``, so evaluation too: RLlib reports its
episode keys there, the runner adds the games). Under ``life_episodes`` an episode is one life of a game, so that
key, not ``episode_return_mean``, holds the game's score (e.g. a Breakout preset's stop).
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import numpy as np
import torch
import tree

from gymnasium.wrappers.vector import DictInfoToList
from ray.rllib.env.env_runner import ENV_STEP_FAILURE, EnvRunner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.spaces.space_utils import get_base_struct_from_space
from ray.rllib.core import DEFAULT_AGENT_ID, DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import (
    EPISODE_DURATION_SEC_MEAN,
    EPISODE_LEN_MAX,
    EPISODE_LEN_MEAN,
    EPISODE_LEN_MIN,
    EPISODE_RETURN_MAX,
    EPISODE_RETURN_MEAN,
    EPISODE_RETURN_MIN,
    SAMPLE_TIMER,
)

from rl_speed import columns as C
from rl_speed.connectors import env_to_module as connectors
from rl_speed.columns import Columns, num_steps
from rl_speed.env_runners import stepping
from rl_speed.env_runners.captured_forward import CapturedForward, check_capturable
from rl_speed.env_runners.episode_callbacks import EpisodeCallbacks, configured_callbacks
from rl_speed.env_runners.overlapped import check_overlap_supported, lane_groups, sample_overlapped
from rl_speed.env_runners.shared_inference import InferenceClient, serving_problem
from rl_speed.env_runners.stepping import (clip_rewards, module_actions, set_runner_threads, to_env_actions,
                                           write_step)

#: The result key (under ``env_runners``) of the mean score of whole games, for envs whose infos report them.
GAME_RETURN_MEAN = "game_return_mean"


def bptt_horizon(config: Any) -> int:
    """Steps per truncated-BPTT chunk: the algorithm's ``bptt_horizon``, else RLlib's ``model_config["max_seq_len"]``
    (default 20)."""
    horizon = getattr(config, "bptt_horizon", None)
    if horizon is None:
        horizon = (config.model_config or {}).get("max_seq_len", 20)
    return int(horizon)


class BatchedEnvRunner(SingleAgentEnvRunner):
    """Samples ``rollout_fragment_length`` steps from all ``N`` vector sub-envs at once into column arrays.

    Use with ``config.env_runners(env_runner_cls=BatchedEnvRunner, num_envs_per_env_runner=N,
    gym_env_vectorize_mode="vector_entry_point")`` (or ``"sync"`` for envs without a native vector form).
    ``sample_columns()`` returns a :data:`rl_speed.columns.Columns` dict; ``sample()`` is RLlib's (episodes).
    """

    #: Start the env's first (seeded) reset as soon as the env is built, where the env can do it in the background
    #: (``prefetch_reset``, e.g. :class:`rl_speed_envs.atari.AtariVectorEnv`, whose seeded reset takes about 0.11 s
    #: an emulator): the runner builds its module and the driver its learner meanwhile.
    prefetch_first_reset = True
    #: The columnar path's next reset is seeded (``config.seed``, per worker): the first reset of every env the
    #: runner makes, as RLlib's runner seeds it.
    _seed_next_reset = True

    @override(SingleAgentEnvRunner)
    def __init__(self, *, config: Any, **kwargs: Any) -> None:
        set_runner_threads(config, kwargs.get("worker_index", 0))
        super().__init__(config=config, **kwargs)
        n = self.num_envs
        self._obs: Any = None  # [N, ...] last observation, continued across sample_columns() calls
        self._resetting = np.zeros(n, dtype=bool)  # lanes whose next step is a NEXT_STEP reset step
        self._episode_return = np.zeros(n, dtype=np.float64)
        self._episode_len = np.zeros(n, dtype=np.int64)
        self._episode_start = np.full(n, time.perf_counter())
        self._finished: list[np.ndarray] = []  # [k, 3] (return, length, seconds) of episodes since last metrics
        self._num_finished = 0
        # Whole games, for an env whose infos report them (several episodes a game under Atari's life_episodes)
        self._game_return = np.zeros(n, dtype=np.float64)
        self._finished_games: list[np.ndarray] = []
        self._reports_games = False
        self.module.eval()  # this copy only acts; set once instead of on every forward call
        # Recurrent modules: the state of every lane, carried across sample_columns() calls, and which lanes' next
        # observation starts an episode (the state is reset there).
        self._state: Any = None
        self._is_first = np.ones(n, dtype=bool)
        # RLlib's own stateful modules (use_lstm) act on [N, 1, ...]; rl_speed's recurrent module on [N, ...].
        self._needs_time_axis = self.module.is_stateful() and not getattr(self.module, "resets_state_at_is_first",
                                                                          False)
        self._columnar = False  # sample_columns() has run: get_metrics() reports its episode window
        # The columnar forms of the env-to-module pieces the user configured (RLlib built its pipeline above): an
        # unsupported piece fails here, while the algorithm is built, before any training.
        self._connectors = connectors.columnar_pipeline(self._env_to_module, n)
        # RLlib's episode callbacks and rl_speed's on_sample_columns: episode views are built only when one is set
        # (rl_speed.env_runners.episode_callbacks); without them the path below pays nothing.
        self._callback_names = configured_callbacks(self.config, self._callbacks)
        self._episode_callbacks: EpisodeCallbacks | None = None
        # cuda_graph_env_runners: a remote runner's action step as one captured CUDA graph (the local runner, whose
        # module RLlib keeps on the CPU, samples only without remote runners, which the config refuses then).
        self._captured: CapturedForward | None = None
        if (getattr(self.config, "cuda_graph_env_runners", False) and self.worker_index > 0
                and not self.config.in_evaluation):  # (evaluation acts through RLlib's sample(), eagerly)
            problem = check_capturable(self.module, self._device, self.module.observation_space)
            if problem:
                raise ValueError(f"BatchedEnvRunner: `cuda_graph_env_runners: true` cannot be used here: {problem}.")
            self._captured = CapturedForward(self.module, self._device)
        # shared_inference: a remote runner's action step is served in the learner's process (FastPPO connects it
        # once the algorithm is built; rl_speed.env_runners.shared_inference); evaluation acts through sample().
        self._shared: InferenceClient | None = None
        self._acts_through_server = bool(getattr(self.config, "shared_inference", False) and self.worker_index > 0
                                         and not self.config.in_evaluation)
        if self.env is not None and lane_groups(self.env) > 1 and not self.config.in_evaluation:
            # Refused while the algorithm is built, before any training. An evaluation runner samples through
            # RLlib's sample(), which steps every group together and honours all of it (checked only if its
            # sample_columns() is called).
            check_overlap_supported(self)

    @override(SingleAgentEnvRunner)
    def make_env(self) -> None:
        super().make_env()
        # A new env (RLlib calls this again after a user changes env_config): the columnar path starts its episodes
        # from a seeded reset of it, as RLlib's sample() does.
        self._obs = None
        self._seed_next_reset = True
        prefetch = getattr(self.env.unwrapped, "prefetch_reset", None)
        # Not with a runner-side callback: RLlib calls on_episode_created before the env's reset, which a callback
        # may rely on (e.g. to set the env up); the reset then happens where it always did.
        if prefetch is not None and self.prefetch_first_reset and not configured_callbacks(self.config,
                                                                                         self._callbacks):
            prefetch(seed=self._seed)  # the seed of the first reset, in sample_columns() and in RLlib's sample()

    @functools.cached_property
    def _action_struct(self) -> Any:
        """The action space as a structure of leaf spaces (one Box, or a dict of them), derived once rather than on
        every step; on first use, because a local runner beside remote ones may have no env at construction."""
        return get_base_struct_from_space(self.env.single_action_space)

    @override(SingleAgentEnvRunner)
    def sample(self, **kwargs: Any) -> list:
        """RLlib's ``sample()``: episodes through the connector pipelines (evaluation, ``Algorithm.evaluate()``)."""
        self._needs_initial_reset |= self._obs is not None  # the columnar path moved the env on: start over
        self._obs = None  # and the next sample_columns() starts from a reset too
        return super().sample(**kwargs)

    @override(EnvRunner)
    def _try_env_reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, Any]:
        """RLlib's ``sample()`` resets the env here: every lane's game starts anew."""
        self._game_return[:] = 0.0
        return super()._try_env_reset(seed=seed, options=options)

    @override(EnvRunner)
    def _try_env_step(self, actions: Any) -> Any:
        """RLlib's ``sample()`` steps the env here (the columnar path steps it itself): whole games are counted from
        the step's infos, one dict per lane there (RLlib's ``DictInfoToList``), as on the columnar path."""
        results = super()._try_env_step(actions)
        if results != ENV_STEP_FAILURE:  # (as RLlib tests it)
            self._track_games(results[4])
        return results

    def sample_columns(self, *, num_timesteps: int | None = None, explore: bool | None = None,
                       random_actions: bool = False, force_reset: bool = False) -> Columns:
        """Steps all N sub-envs ``T`` times, ``T = ceil(num_timesteps / N)`` or ``rollout_fragment_length``, and
        returns the :mod:`rl_speed.columns` batch; consecutive calls continue the same episodes."""
        if explore is None:
            explore = self.config.explore
        n = self.num_envs
        steps = (math.ceil(num_timesteps / n) if num_timesteps is not None
                 else self.config.get_rollout_fragment_length(self.worker_index))
        callbacks = self._episode_callbacks
        if callbacks is None and self._callback_names:  # (built on first use: a local runner may have no env before)
            callbacks = self._episode_callbacks = EpisodeCallbacks(self, self._callback_names)
        with self.metrics.log_time(SAMPLE_TIMER):
            if callbacks is not None:
                callbacks.sample_start()
            if self._obs is None or force_reset:
                if callbacks is not None:
                    callbacks.before_reset()
                # The first reset is seeded (config.seed, per worker), as RLlib's runner seeds its first one.
                raw_obs, infos = self.env.reset(seed=self._seed if self._seed_next_reset else None)
                self._seed_next_reset = False
                if callbacks is not None:
                    callbacks.after_reset(raw_obs, infos)
                self._obs = connectors.apply(self._connectors, raw_obs, connectors.Step(np.ones(self.num_envs, bool)))
                self._resetting[:] = False
                self._is_first[:] = True
                self._episode_return[:] = 0.0
                self._game_return[:] = 0.0
                self._episode_len[:] = 0
                self._episode_start[:] = time.perf_counter()
            self._columnar = True
            columns = self._sample_steps(steps, explore, random_actions)
            if callbacks is not None:
                callbacks.sample_end(columns)
        valid_steps = num_steps(columns)
        self._increase_sampled_metrics(valid_steps, self._num_finished)
        self._num_finished = 0
        self.num_env_steps_sampled_lifetime += valid_steps * (self.config.num_env_runners or 1)
        return columns

    def _sample_steps(self, steps: int, explore: bool, random_actions: bool) -> Columns:
        if lane_groups(self.env) > 1:  # the env's lane groups step apart: overlap them with the forward
            if self.config.in_evaluation:
                check_overlap_supported(self)
            return sample_overlapped(self, steps, explore, random_actions)
        n = self.num_envs
        columns = self._new_columns(steps)
        # RLlib wraps the vector env in DictInfoToList, which rebuilds N info dicts per step; columns carry no
        # infos (episode callbacks read a lane's from the vector env's dict of arrays), so step the wrapped env.
        env = self.env.env if isinstance(self.env, DictInfoToList) else self.env
        callbacks = self._episode_callbacks
        runners = self.config.num_env_runners or 1
        stateful = self.module.is_stateful()
        if stateful:
            horizon = bptt_horizon(self.config)
            if steps % horizon:
                raise ValueError(f"BatchedEnvRunner: the rollout of {steps} steps must be a multiple of "
                                 f"bptt_horizon={horizon}; set rollout_fragment_length to a multiple of it.")
            if self._state is None:
                # (torch.as_tensor: a user's module may give its initial state as numpy arrays, as RLlib's allows)
                self._state = tree.map_structure(
                    lambda s: torch.as_tensor(s).to(self._device).expand(n, *np.shape(s)).clone(),
                    self.module.get_initial_state())
            columns[C.IS_FIRST] = np.empty((steps, n), bool)
            columns[C.STATE_IN] = tree.map_structure(
                lambda s: np.empty((steps // horizon, *s.shape), np.float32), self._state)
        clock = time.perf_counter
        env_seconds = inference_seconds = 0.0  # RLlib's env_step_timer / rlmodule_inference_timer, per step
        for t in range(steps):
            write_step(columns[C.OBS], t, self._obs)
            if stateful:
                columns[C.IS_FIRST][t] = self._is_first
                if self._is_first.any():
                    first = torch.from_numpy(self._is_first).to(self._device)
                    with torch.inference_mode():  # the state tensors come from inference-mode forwards
                        for s in tree.flatten(self._state):
                            s[first] = 0.0
                if t % horizon == 0:
                    write_step(columns[C.STATE_IN], t // horizon,
                           tree.map_structure(lambda s: s.cpu().numpy(), self._state))
            if random_actions:
                actions, extra = self.env.action_space.sample(), {}
            else:
                step_t = self.num_env_steps_sampled_lifetime + t * n * runners
                start = clock()
                actions, extra = self._compute_actions(self._obs, explore, step_t)
                inference_seconds += clock() - start
            for key, value in extra.items():
                if key not in columns:
                    columns[key] = np.empty((steps, n, *value.shape[1:]), value.dtype)
                columns[key][t] = value
            start = clock()
            raw_obs, rewards, terminateds, truncateds, infos = env.step(self._env_actions(actions))
            env_seconds += clock() - start
            valid = ~self._resetting
            if callbacks is not None:
                callbacks.after_step(t, actions, raw_obs, rewards, terminateds, truncateds, infos, valid)
            write_step(columns[C.ACTIONS], t, actions)
            columns[C.REWARDS][t] = clip_rewards(rewards, self.config.clip_rewards)  # metrics keep the raw ones
            columns[C.TERMINATEDS][t] = terminateds
            columns[C.TRUNCATEDS][t] = truncateds
            columns[C.VALID][t] = valid
            self._track_episodes(rewards, terminateds | truncateds, valid)
            self._track_games(infos)
            self._is_first = ~valid  # a reset step's next observation starts an episode
            obs = (connectors.apply(self._connectors, raw_obs, connectors.Step(self._is_first, actions, rewards))
                   if self._connectors else raw_obs)
            self._resetting = terminateds | truncateds
            self._obs = obs
        write_step(columns[C.OBS], steps, self._obs)
        stepping.log_step_timers(self.metrics, steps, env_seconds, None if random_actions else inference_seconds)
        if stateful:  # the state obs[T] is acted on with (unless obs[T] starts an episode: then zeros)
            columns[C.STATE_OUT] = tree.map_structure(lambda s: s.cpu().numpy()[None].copy(), self._state)
        return columns

    def _new_columns(self, steps: int) -> Columns:
        """Empty columns for a rollout of ``steps`` steps of every lane (the observations have ``steps + 1`` rows)."""
        n = self.num_envs
        return {
            C.OBS: tree.map_structure(lambda o: np.empty((steps + 1, *o.shape), o.dtype), self._obs),
            C.ACTIONS: tree.map_structure(lambda s: np.empty((steps, n, *s.shape), s.dtype), self._action_struct),
            C.REWARDS: np.empty((steps, n), np.float32),
            C.TERMINATEDS: np.empty((steps, n), bool),
            C.TRUNCATEDS: np.empty((steps, n), bool),
            C.VALID: np.empty((steps, n), bool),
        }

    def connect_shared_inference(self, spec: dict) -> None:
        """Acts through the inference server ``spec`` describes from now on (``shared_inference``: the algorithm
        calls it once it is built, and again for a runner it restored). Refused for a runner on another machine than
        the server or with a module the server cannot act for."""
        import ray

        node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
        if spec["node_id"] is not None and node != spec["node_id"]:
            raise ValueError(f"BatchedEnvRunner {self.worker_index}: `shared_inference: true` serves the runners "
                             "through shared memory on the learner's machine, and this runner runs on another one; "
                             "leave it off on a cluster of several machines.")
        problem = serving_problem(self.module, self.module.observation_space)
        if problem is None and tuple(self.module.observation_space.shape) != tuple(spec["layout"]["obs_shape"]):
            problem = (f"the runner's module takes {self.module.observation_space.shape} observations, the "
                       f"server's {tuple(spec['layout']['obs_shape'])}")
        if problem:
            raise ValueError(f"BatchedEnvRunner: `shared_inference: true` cannot be used here: {problem}.")
        if self._shared is not None:
            self._shared.close()
        self._shared = InferenceClient(spec, slot=self.worker_index - 1,
                                       seed=None if self._seed is None else (self._seed, self.worker_index))

    @override(SingleAgentEnvRunner)
    def stop(self) -> None:
        if getattr(self, "_shared", None) is not None:
            self._shared.close()
            self._shared = None
        super().stop()

    def _compute_actions(self, obs: Any, explore: bool, t: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        if self._acts_through_server:
            if self._shared is None:
                raise RuntimeError(f"BatchedEnvRunner {self.worker_index}: `shared_inference` is on but this runner "
                                   "was not connected to the learner's inference server (the algorithm connects its "
                                   "runners when it is built and when it restores one).")
            return self._shared(obs, explore, self._weights_seq_no)
        if self._captured is not None:
            if self._captured.module is not self.module:  # (RLlib rebuilt the module: capture its replacement)
                self._captured = CapturedForward(self.module, self._device)
            return self._captured(obs, explore)
        actions, extra, state = module_actions(self.module, obs, explore, t, state=self._state,
                                               time_axis=self._needs_time_axis, device=self._device)
        if state is not None:
            self._state = state
        return actions, extra

    def _env_actions(self, actions: Any) -> Any:
        return to_env_actions(actions, self._action_struct, self.config)

    def _track_episodes(self, rewards: np.ndarray, done: np.ndarray, valid: np.ndarray,
                        lanes: slice = slice(None)) -> None:
        """Episode returns and lengths of one step of ``lanes`` (every lane, or one lane group's)."""
        returns, lengths, starts = self._episode_return[lanes], self._episode_len[lanes], self._episode_start[lanes]
        returns += np.where(valid, rewards, 0.0)  # (views: these write into the runner's arrays)
        lengths += valid
        ended = done & valid
        if ended.any():
            now = time.perf_counter()
            self._finished.append(np.stack([returns[ended], lengths[ended], now - starts[ended]], axis=1))
            self._num_finished += int(ended.sum())
            returns[ended] = 0.0
            lengths[ended] = 0
            starts[ended] = now

    def _track_games(self, infos: Any, lanes: slice = slice(None)) -> None:
        """Whole games' scores of one step of ``lanes``, where the step's ``infos`` (a dict of arrays, or one dict
        per lane) report them: every step's ``game_reward`` counts (also a reset step's, whose training reward an
        env may withhold), and ``game_over`` ends a game. Infos without them: nothing."""
        if isinstance(infos, (list, tuple)) and infos and all("game_over" in info for info in infos):
            infos = {"game_reward": np.array([info["game_reward"] for info in infos], np.float64),
                     "game_over": np.array([info["game_over"] for info in infos], bool)}
        if not isinstance(infos, dict) or "game_over" not in infos:
            return
        self._reports_games = True
        games = self._game_return[lanes]  # (a view)
        games += infos["game_reward"]
        over = np.asarray(infos["game_over"], bool)
        if over.any():
            self._finished_games.append(games[over].copy())
            games[over] = 0.0

    @override(SingleAgentEnvRunner)
    def get_metrics(self) -> dict:
        """Reports RLlib's episode keys with RLlib's meaning: statistics over the episodes finished since the last
        call (at most the last ``metrics_num_episodes_for_smoothing``, divided among runners), NaN when none did.
        One ``log_value`` per key per call, where logging each episode of hundreds of boards would cost more than
        sampling them. Episodes of RLlib's own ``sample()`` are reported by RLlib's code, as on any runner."""
        if self._columnar:
            self._log_column_episodes()
        elif self._reports_games:  # RLlib's own sample() only: RLlib reports the episodes, the runner the games
            self._log_games()
        return super().get_metrics()

    def _metrics_window(self) -> int:
        # As RLlib's runner: statistics over the episodes finished since the last call, at most the last
        # `metrics_num_episodes_for_smoothing / num_env_runners` of them; NaN in a call after which none finished.
        return max(1, math.ceil(self.config.metrics_num_episodes_for_smoothing / (self.config.num_env_runners or 1)))

    def _log_games(self) -> None:
        games = (np.concatenate(self._finished_games)[-self._metrics_window():] if self._finished_games
                 else np.array([np.nan]))
        self._finished_games.clear()
        self.metrics.log_value(GAME_RETURN_MEAN, float(games.mean()), reduce="mean", window=1)

    def _log_column_episodes(self) -> None:
        window = self._metrics_window()
        recent = np.concatenate(self._finished)[-window:] if self._finished else np.zeros((0, 3))
        self._finished.clear()
        if len(recent):
            returns, lengths, seconds = recent.T
        else:
            # (RLlib omits the keys until the first episode ends; NaN from the first result on gives Tune's
            # progress.csv, which takes its columns from the first result, the columns.)
            returns = lengths = seconds = np.array([np.nan])
        for key, value, reduce in (
            (EPISODE_RETURN_MEAN, returns.mean(), "mean"), (EPISODE_LEN_MEAN, lengths.mean(), "mean"),
            (EPISODE_DURATION_SEC_MEAN, seconds.mean(), "mean"),
            (("agent_episode_return_mean", DEFAULT_AGENT_ID), returns.mean(), "mean"),
            (("module_episode_return_mean", DEFAULT_MODULE_ID), returns.mean(), "mean"),
            (EPISODE_RETURN_MIN, returns.min(), "min"), (EPISODE_RETURN_MAX, returns.max(), "max"),
            (EPISODE_LEN_MIN, lengths.min(), "min"), (EPISODE_LEN_MAX, lengths.max(), "max"),
        ):
            self.metrics.log_value(key, float(value), reduce=reduce, window=1)
        if self._reports_games:
            self._log_games()
