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
the progress line and dashboards work unchanged.
"""

from __future__ import annotations

import functools
import math
import os
import time
from typing import Any

import gymnasium as gym
import numpy as np
import torch
import tree

from gymnasium.wrappers.vector import DictInfoToList
from ray.rllib.core.columns import Columns as RLlibColumns
from ray.rllib.models.torch.torch_distributions import TorchCategorical
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.spaces.space_utils import get_base_struct_from_space, unsquash_action
from ray.rllib.core import DEFAULT_AGENT_ID, DEFAULT_MODULE_ID
from ray.rllib.utils.metrics import (
    EPISODE_DURATION_SEC_MEAN,
    EPISODE_LEN_MAX,
    EPISODE_LEN_MEAN,
    EPISODE_LEN_MIN,
    EPISODE_RETURN_MAX,
    EPISODE_RETURN_MEAN,
    EPISODE_RETURN_MIN,
    ENV_STEP_TIMER,
    RLMODULE_INFERENCE_TIMER,
    SAMPLE_TIMER,
)

from rl_speed import columns as C
from rl_speed.connectors import env_to_module as connectors
from rl_speed.columns import Columns, num_steps
from rl_speed.env_runners.episode_callbacks import EpisodeCallbacks, configured_callbacks


def bptt_horizon(config: Any) -> int:
    """Steps per truncated-BPTT chunk: the algorithm's ``bptt_horizon``, else RLlib's ``model_config["max_seq_len"]``
    (default 20)."""
    horizon = getattr(config, "bptt_horizon", None)
    if horizon is None:
        horizon = (config.model_config or {}).get("max_seq_len", 20)
    return int(horizon)


def _set_runner_threads(config: Any, worker_index: int) -> None:
    """Remote runners get as many torch/OMP threads as CPUs Ray gave them (default 1), so N runners on N cores
    do not oversubscribe; the local runner shares the driver's threads."""
    if worker_index and worker_index > 0:
        threads = max(1, int(config.num_cpus_per_env_runner or 1))
        torch.set_num_threads(threads)
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))


class BatchedEnvRunner(SingleAgentEnvRunner):
    """Samples ``rollout_fragment_length`` steps from all ``N`` vector sub-envs at once into column arrays.

    Use with ``config.env_runners(env_runner_cls=BatchedEnvRunner, num_envs_per_env_runner=N,
    gym_env_vectorize_mode="vector_entry_point")`` (or ``"sync"`` for envs without a native vector form).
    ``sample_columns()`` returns a :data:`rl_speed.columns.Columns` dict; ``sample()`` is RLlib's (episodes).
    """

    @override(SingleAgentEnvRunner)
    def __init__(self, *, config: Any, **kwargs: Any) -> None:
        _set_runner_threads(config, kwargs.get("worker_index", 0))
        super().__init__(config=config, **kwargs)
        n = self.num_envs
        self._obs: Any = None  # [N, ...] last observation, continued across sample_columns() calls
        self._resetting = np.zeros(n, dtype=bool)  # lanes whose next step is a NEXT_STEP reset step
        self._episode_return = np.zeros(n, dtype=np.float64)
        self._episode_len = np.zeros(n, dtype=np.int64)
        self._episode_start = np.full(n, time.perf_counter())
        self._finished: list[np.ndarray] = []  # [k, 3] (return, length, seconds) of episodes since last metrics
        self._num_finished = 0
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
        if self.env is not None and lane_groups(self.env) > 1:
            check_overlap_supported(self)  # refused while the algorithm is built, before any training

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
                raw_obs, infos = self.env.reset(seed=None if self._columnar else self._seed)
                if callbacks is not None:
                    callbacks.after_reset(raw_obs, infos)
                self._obs = connectors.apply(self._connectors, raw_obs, connectors.Step(np.ones(self.num_envs, bool)))
                self._resetting[:] = False
                self._is_first[:] = True
                self._episode_return[:] = 0.0
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
            _write(columns[C.OBS], t, self._obs)
            if stateful:
                columns[C.IS_FIRST][t] = self._is_first
                if self._is_first.any():
                    first = torch.from_numpy(self._is_first).to(self._device)
                    with torch.inference_mode():  # the state tensors come from inference-mode forwards
                        for s in tree.flatten(self._state):
                            s[first] = 0.0
                if t % horizon == 0:
                    _write(columns[C.STATE_IN], t // horizon,
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
            _write(columns[C.ACTIONS], t, actions)
            columns[C.REWARDS][t] = clip_rewards(rewards, self.config.clip_rewards)  # metrics keep the raw ones
            columns[C.TERMINATEDS][t] = terminateds
            columns[C.TRUNCATEDS][t] = truncateds
            columns[C.VALID][t] = valid
            self._track_episodes(rewards, terminateds | truncateds, valid)
            self._is_first = ~valid  # a reset step's next observation starts an episode
            obs = (connectors.apply(self._connectors, raw_obs, connectors.Step(self._is_first, actions, rewards))
                   if self._connectors else raw_obs)
            self._resetting = terminateds | truncateds
            self._obs = obs
        _write(columns[C.OBS], steps, self._obs)
        log_step_timers(self.metrics, steps, env_seconds, None if random_actions else inference_seconds)
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

    def _compute_actions(self, obs: Any, explore: bool, t: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
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

    @override(SingleAgentEnvRunner)
    def get_metrics(self) -> dict:
        """Reports RLlib's episode keys with RLlib's meaning: statistics over the episodes finished since the last
        call (at most the last ``metrics_num_episodes_for_smoothing``, divided among runners), NaN when none did.
        One ``log_value`` per key per call, where logging each episode of hundreds of boards would cost more than
        sampling them. Episodes of RLlib's own ``sample()`` are reported by RLlib's code, as on any runner."""
        if self._columnar:
            self._log_column_episodes()
        return super().get_metrics()

    def _log_column_episodes(self) -> None:
        # As RLlib's runner: statistics over the episodes finished since the last call, at most the last
        # `metrics_num_episodes_for_smoothing / num_env_runners` of them; NaN in a call after which none finished.
        window = max(1, math.ceil(self.config.metrics_num_episodes_for_smoothing / (self.config.num_env_runners or 1)))
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


def log_step_timers(metrics: Any, steps: int, env_seconds: float, inference_seconds: float | None) -> None:
    """RLlib's ``env_step_timer`` and ``rlmodule_inference_timer`` (seconds per step of all lanes) for one
    ``sample_columns()`` call of ``steps`` steps; ``inference_seconds`` None: no forward ran (random actions).

    RLlib's runner pushes one value per step into an EMA of coefficient 0.01; one push per call of the per-step mean,
    with coefficient 1 - 0.99**steps, weighs the history the same way at a cost per call."""
    ema = 1.0 - 0.99**steps
    metrics.log_value(ENV_STEP_TIMER, env_seconds / steps, ema_coeff=ema)
    if inference_seconds is not None:
        metrics.log_value(RLMODULE_INFERENCE_TIMER, inference_seconds / steps, ema_coeff=ema)


def clip_rewards(rewards: np.ndarray, setting: bool | float | None) -> np.ndarray:
    """RLlib's ``clip_rewards`` for the training columns: True -> the sign of each reward, a number c -> clipped to
    [-c, c], None / False -> unchanged. Episode returns in the metrics stay unclipped, as on RLlib's old stack."""
    if setting is True:
        return np.sign(rewards)
    if setting:  # a number
        return np.clip(rewards, -abs(float(setting)), abs(float(setting)))
    return rewards


def _write(target: Any, t: int, value: Any) -> None:
    """``target[t] = value`` leaf by leaf (Dict / Tuple observations and actions are structures of arrays)."""
    if isinstance(target, np.ndarray):
        target[t] = value
        return
    for dst, src in zip(tree.flatten(target), tree.flatten(value)):
        dst[t] = src


def module_actions(module: Any, obs: Any, explore: bool, t: int, *, state: Any = None, time_axis: bool = False,
                   device: Any = None) -> tuple[Any, dict[str, np.ndarray], Any]:
    """One forward pass of ``module`` (in eval mode) over a batch of observations: ``(actions, extra, state_out)``.

    Modules that pick actions themselves (DQN's epsilon-greedy) return ``actions``; others return distribution
    inputs, which are sampled here (PPO), and ``extra`` holds the log-probs and distribution inputs PPO's loss reads.
    ``time_axis``: RLlib's own stateful modules act on ``[B, 1, ...]``, as RLlib's AddTimeDimToBatchAndZeroPad
    makes it. ``device``: where the module lives (RLlib puts a runner's module on a GPU when
    ``num_gpus_per_env_runner`` > 0); the observations go there and the outputs come back as numpy arrays."""
    with torch.inference_mode():
        obs_t = (torch.from_numpy(obs) if isinstance(obs, np.ndarray)  # the common case, without tree's cost
                 else tree.map_structure(lambda o: torch.from_numpy(np.asarray(o)), obs))  # Dict / Tuple
        if device is not None and torch.device(device).type != "cpu":
            obs_t = tree.map_structure(lambda o: o.to(device, non_blocking=True), obs_t)
        if time_axis:
            obs_t = tree.map_structure(lambda o: o[:, None], obs_t)
        batch = {RLlibColumns.OBS: obs_t}
        if state is not None:
            batch[RLlibColumns.STATE_IN] = state
        # The private forwards: the public ones walk every submodule with .eval()/.train() on each call, and the
        # runners' modules never leave eval mode (set when the runner is built).
        if explore:
            out = module._forward_exploration(batch, t=t)
        else:
            out = module._forward_inference(batch)
        if time_axis:
            stepped = (RLlibColumns.ACTIONS, RLlibColumns.ACTION_DIST_INPUTS, RLlibColumns.ACTION_LOGP)
            out = {k: (tree.map_structure(lambda x: x[:, 0], v) if k in stepped else v) for k, v in out.items()}
        extra: dict[str, np.ndarray] = {}
        if RLlibColumns.ACTIONS in out:
            actions = out[RLlibColumns.ACTIONS]
            # A module that samples its own actions (e.g. autoregressive ones) gives PPO's log-probs and
            # distribution inputs with them, as RLlib's GetActions connector then passes them on.
            if explore and RLlibColumns.ACTION_LOGP in out:
                extra[C.ACTION_LOGP] = out[RLlibColumns.ACTION_LOGP].float().cpu().numpy()
                if RLlibColumns.ACTION_DIST_INPUTS in out:
                    extra[C.ACTION_DIST_INPUTS] = out[RLlibColumns.ACTION_DIST_INPUTS].float().cpu().numpy()
        else:
            dist_cls = (module.get_exploration_action_dist_cls() if explore
                        else module.get_inference_action_dist_cls())
            logits = out[RLlibColumns.ACTION_DIST_INPUTS]
            if explore and dist_cls is TorchCategorical:
                actions, logp = sample_categorical(logits)
            else:
                dist = dist_cls.from_logits(logits)
                if not explore:
                    dist = dist.to_deterministic()
                actions = dist.sample()
                logp = dist.logp(actions) if explore else None
            if explore:
                extra[C.ACTION_LOGP] = logp.float().cpu().numpy()
                # PPO's KL term compares the learner's distribution with the one that acted.
                extra[C.ACTION_DIST_INPUTS] = logits.float().cpu().numpy()
    # (A heuristic module, e.g. RLlib's RandomRLModule, may give numpy actions.)
    return (tree.map_structure(lambda a: a.cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a), actions),
            extra, out.get(RLlibColumns.STATE_OUT))


def sample_categorical(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Actions and their log-probs from ``TorchCategorical`` logits, as its ``sample()`` and ``logp()`` give them (the
    same multinomial draw over the same probabilities), with one log-softmax for both: RLlib's pair normalizes twice
    and builds a torch ``Categorical`` per call, about 40% of the sampling time of a 576-lane forward on one core."""
    logp_all = torch.log_softmax(logits, -1)
    actions = torch.multinomial(logp_all.exp(), 1, True)
    return actions.squeeze(-1), logp_all.gather(-1, actions).squeeze(-1)


def to_env_actions(actions: Any, action_struct: Any, config: Any) -> Any:
    """What the env receives, as RLlib's ``NormalizeAndClipActions`` connector does it: for each bounded ``Box``
    (also inside a ``Dict`` action space), the module's actions (roughly in [-1, 1]) are unsquashed to the bounds if
    ``normalize_actions``, or clipped to them if ``clip_actions``. The columns keep the module's own actions, which
    the log-probs refer to."""

    def to_env(action: np.ndarray, space: gym.Space) -> np.ndarray:
        if not isinstance(space, gym.spaces.Box) or not space.is_bounded("both"):
            return action
        if config.normalize_actions:
            action = unsquash_action(action, space)
        elif not config.clip_actions:
            return action
        return np.clip(action, space.low, space.high).astype(space.dtype, copy=False)

    return tree.map_structure(to_env, actions, action_struct)


# (imported last: rl_speed.env_runners.overlapped uses this module's helpers)
from rl_speed.env_runners.overlapped import check_overlap_supported, lane_groups, sample_overlapped  # noqa: E402
