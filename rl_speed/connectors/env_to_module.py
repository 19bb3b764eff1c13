"""Columnar forms of RLlib's env-to-module connector pieces: each runs once per step on the whole ``[N, ...]``
observation batch of a :class:`rl_speed.env_runners.BatchedEnvRunner`, where RLlib's piece runs once per episode.

A user's config names RLlib's own classes (``env_runners(env_to_module_connector=lambda env, spaces, device:
MeanStdFilter())``); RLlib builds its pipeline on the runner as usual, and :func:`columnar_pipeline` maps each piece
to its columnar form here. The forms keep their state *in RLlib's piece* (the MeanStdFilter's running statistics are
the piece's own ``RunningStat`` objects), so RLlib's machinery keeps working unchanged: the runner's state (and so
checkpoints) holds the piece's state, ``Algorithm`` merges it across env runners after every iteration
(``merge_env_runner_states``) and pushes it to the evaluation runners, which run RLlib's own pipeline.

Each form returns what RLlib's piece would put in front of the module for that lane, so the columns (and the
replay buffer, and the learner) see exactly the module's inputs. A user's own pieces run as RLlib documents them:
``SingleAgentObservationPreprocessor`` subclasses (per lane, or all lanes at once through ``preprocess_batch``), and
any other ``ConnectorV2`` piece that only rewrites each episode's last observation (one shim episode per lane that
refuses, by name, any other access). Pieces that cannot run are refused with :class:`UnsupportedConnector` when the
config is validated (never silently skipped). Multi-agent pipelines run per env copy on its observation dict
(:func:`multi_agent_pipeline`). RLlib's default pieces (observations, time rank, states,
batching, numpy-to-tensor) are what the columnar runner does natively.

Lanes are visited in index order within a step, as RLlib visits its episodes, so stateful forms (the filter's
statistics) give each lane the same result as RLlib's sequential loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import gymnasium as gym
import numpy as np
import tree

from ray.rllib.connectors.common import (
    AddObservationsFromEpisodesToBatch,
    AddStatesFromEpisodesToBatch,
    AddTimeDimToBatchAndZeroPad,
    AgentToModuleMapping,
    BatchIndividualItems,
    NumpyToTensor,
)
from ray.rllib.connectors.common.flatten_observations import FlattenObservations
from ray.rllib.connectors.connector_v2 import ConnectorV2
from ray.rllib.connectors.common.frame_stacking import FrameStacking
from ray.rllib.connectors.env_to_module import MeanStdFilter, PrevActionsPrevRewards
from ray.rllib.connectors.env_to_module.observation_preprocessor import (
    MultiAgentObservationPreprocessor,
    SingleAgentObservationPreprocessor,
)
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.utils.annotations import override
from ray.rllib.utils.filter import RunningStat
from ray.rllib.utils.numpy import SMALL_NUMBER, flatten_inputs_to_1d_tensor, one_hot

#: RLlib's default env-to-module pieces: the columnar runner does their work itself.
NATIVE = (AddObservationsFromEpisodesToBatch, AddTimeDimToBatchAndZeroPad, AddStatesFromEpisodesToBatch,
          AgentToModuleMapping, BatchIndividualItems, NumpyToTensor)


class UnsupportedConnector(ValueError):
    """A connector piece the columnar path has no form of."""


@dataclass
class Step:
    """What the forms may read besides the observations, for the step that produced them."""

    is_first: np.ndarray  # [N] bool: this observation starts an episode (a reset observation)
    actions: Any = None  # [N, ...]: the action that led to it (None after a reset of every lane)
    rewards: np.ndarray | None = None  # [N]


class ColumnarMeanStdFilter:
    """RLlib's ``MeanStdFilter`` on ``[N, ...]``: the N observations are pushed into the piece's running statistics
    (and its delta buffer) in lane order, and lane i is normalized with the statistics after its own push, exactly
    as RLlib's loop over episodes does; the N pushes are computed in closed form (shifted sums), not one by one."""

    def __init__(self, piece: MeanStdFilter) -> None:
        if piece._multi_agent:
            raise UnsupportedConnector("MeanStdFilter(multi_agent=True) has no columnar form; rl_speed's multi-agent "
                                       "envs take the batched (agents-as-lanes) form: use MeanStdFilter().")
        if piece._filters is None:
            piece._init_new_filters()
        self.piece = piece

    def __call__(self, obs: Any, step: Step) -> Any:
        f = self.piece._filters[None]
        update = self.piece._update_stats
        if f.no_preprocessor:
            return tree.map_structure_up_to(obs, lambda x, rs, buf, shape: self._leaf(x, rs, buf, shape, f, update),
                                            obs, f.running_stats, f.buffer, f.shape)
        return self._leaf(obs, f.running_stats, f.buffer, f.shape, f, update)

    @staticmethod
    def _leaf(x: np.ndarray, rs: RunningStat, buffer: RunningStat, shape: Any, f: Any, update: bool) -> np.ndarray:
        if shape is None:  # Discrete / MultiDiscrete leaves are left as they are
            return x
        x = np.asarray(x)
        if update:
            mean, std = _push_all(rs, x)
            _push_all(buffer, x)
        else:
            mean, std = rs.mean[None], rs.std[None]
        out = x
        if f.demean:
            out = out - mean
        if f.destd:
            out = out / (std + SMALL_NUMBER)
        if f.clip:
            out = np.clip(out, -f.clip, f.clip)
        return out.astype(x.dtype)


def _push_all(rs: RunningStat, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pushes ``x[0], ..., x[N-1]`` into ``rs`` (Welford, as ``RunningStat.push`` does one by one) and returns the mean
    and std after each push, ``[N, ...]`` each.

    With ``m0`` the mean before (or ``x[0]`` if nothing was pushed yet), ``y = x - m0``, ``c_k = n0 + k``:
    ``mean_k = m0 + cumsum(y)_k / c_k`` and ``S_k = S0 + cumsum(y^2)_k - cumsum(y)_k^2 / c_k``.
    """
    x64 = x.astype(np.float64)
    n0, m0, s0 = rs.num_pushes, rs.mean_array.copy(), rs.sum_sq_diff_array.copy()
    shift = m0 if n0 > 0 else x64[0]
    y = x64 - shift
    counts = (n0 + np.arange(1, len(x) + 1, dtype=np.float64)).reshape(-1, *([1] * (x.ndim - 1)))
    sum_y, sum_y2 = np.cumsum(y, axis=0), np.cumsum(y * y, axis=0)
    means = shift + sum_y / counts
    sums_sq = s0 + sum_y2 - sum_y * sum_y / counts
    var = np.where(counts > 1, sums_sq / np.maximum(counts - 1, 1), 0.0).astype(np.float32)
    std = np.sqrt(np.maximum(0, var))
    # RLlib's delta arrays take the same increments as the state (the first push assigns them).
    rs.mean_delta_array[...] = (means[-1] if n0 == 0 else rs.mean_delta_array + (means[-1] - m0))
    rs.sum_sq_diff_delta_array[...] += sums_sq[-1] - s0
    rs.mean_array[...] = means[-1]
    rs.sum_sq_diff_array[...] = sums_sq[-1]
    rs.num_pushes += len(x)
    rs.num_pushes_delta += len(x)
    return means, std


class ColumnarFlattenObservations:
    """RLlib's ``FlattenObservations`` on ``[N, ...]``: Dict / Tuple observations (keys removed first) become one
    float32 vector per lane, Discrete leaves one-hot, in one ``flatten_inputs_to_1d_tensor`` call with a batch axis."""

    def __init__(self, piece: FlattenObservations) -> None:
        if piece._multi_agent:
            raise UnsupportedConnector("FlattenObservations(multi_agent=True) has no columnar form; rl_speed's "
                                       "multi-agent envs take the batched (agents-as-lanes) form: use "
                                       "FlattenObservations().")
        self.struct = piece._input_obs_base_struct
        self.keys_to_remove = set(piece._keys_to_remove)

    def __call__(self, obs: Any, step: Step) -> np.ndarray:
        if self.keys_to_remove:
            obs = {k: v for k, v in obs.items() if k not in self.keys_to_remove}
        return flatten_inputs_to_1d_tensor(obs, self.struct, batch_axis=True).astype(np.float32)


class ColumnarPrevActionsPrevRewards:
    """RLlib's ``PrevActionsPrevRewards`` on ``[N, ...]``: each lane's last ``n`` actions (one-hot) and rewards of the
    current episode, zeros before the episode's start, beside the observation in RLlib's dict layout."""

    def __init__(self, piece: PrevActionsPrevRewards, num_lanes: int) -> None:
        if piece._multi_agent:
            raise UnsupportedConnector("PrevActionsPrevRewards(multi_agent=True) has no columnar form; use "
                                       "PrevActionsPrevRewards().")
        space = piece.input_action_space
        if not isinstance(space, gym.spaces.Discrete):
            raise UnsupportedConnector(f"PrevActionsPrevRewards needs a Discrete action space (RLlib's piece "
                                       f"one-hots the actions); the env has {space}.")
        self.piece = piece
        self.num_actions = int(space.n)
        self.actions = np.zeros((num_lanes, piece.n_prev_actions, self.num_actions), np.float32)
        self.rewards = np.zeros((num_lanes, piece.n_prev_rewards), np.float32)

    def __call__(self, obs: Any, step: Step) -> dict:
        first = step.is_first
        if step.actions is not None:
            self.actions[:, :-1] = self.actions[:, 1:].copy()
            self.actions[:, -1] = one_hot(np.asarray(step.actions), depth=self.num_actions)
            self.rewards[:, :-1] = self.rewards[:, 1:].copy()
            self.rewards[:, -1] = step.rewards
        self.actions[first] = 0.0
        self.rewards[first] = 0.0
        out = {PrevActionsPrevRewards.ORIG_OBS_KEY: obs}
        if self.piece.n_prev_actions:
            out[PrevActionsPrevRewards.PREV_ACTIONS_KEY] = self.actions.reshape(len(first), -1).copy()
        if self.piece.n_prev_rewards:
            out[PrevActionsPrevRewards.PREV_REWARDS_KEY] = self.rewards.copy()
        return out


class ColumnarFrameStacking:
    """RLlib's ``FrameStackingEnvToModule`` on ``[N, ...]``: the last ``num_frames`` observations of each lane's
    episode along the last axis (zeros before the episode's start). The columns then hold the stacked frames, which
    is what RLlib's learner-side ``FrameStackingLearner`` rebuilds from episodes, so the learner needs no piece."""

    def __init__(self, piece: FrameStacking) -> None:
        if piece._multi_agent:
            raise UnsupportedConnector("FrameStackingEnvToModule(multi_agent=True) has no columnar form; use "
                                       "FrameStackingEnvToModule(num_frames=k).")
        self.num_frames = piece.num_frames
        self.stack: np.ndarray | None = None

    def __call__(self, obs: np.ndarray, step: Step) -> np.ndarray:
        if self.stack is None:
            self.stack = np.zeros((*obs.shape[:-1], obs.shape[-1] * self.num_frames), obs.dtype)
        width = obs.shape[-1]
        self.stack[..., :-width] = self.stack[..., width:].copy()
        self.stack[step.is_first, ..., :-width] = 0
        self.stack[..., -width:] = obs
        return self.stack.copy()


class ColumnarObservationPreprocessor:
    """A user's ``SingleAgentObservationPreprocessor`` (RLlib's documented hook for per-observation work) on
    ``[N, ...]``: the piece's ``preprocess_batch(observations)`` if it defines one (rl_speed's columnar interface:
    ``[N, ...]`` in, ``[N, ...]`` out, one call per step), else its ``preprocess(observation, episode)`` once per lane
    in lane order, the results stacked (a Python call per lane per step: about what RLlib's runner pays for it).

    The columnar runner has no episode objects, so ``episode`` is None; a piece that reads it is refused when the
    config is validated (probed with one observation of its input space), naming ``preprocess_batch`` as the way."""

    def __init__(self, piece: Any) -> None:
        self.piece = piece
        self.batched = getattr(piece, "preprocess_batch", None)
        if self.batched is None:
            try:
                piece.preprocess(piece.input_observation_space.sample(), None)
            except Exception as e:
                raise UnsupportedConnector(
                    f"{type(piece).__name__}.preprocess(observation, episode) failed with episode=None "
                    f"({type(e).__name__}: {e}): the columnar runner has no episode objects. Give the piece a "
                    "`preprocess_batch(self, observations)` method that maps the [N, ...] observations of all lanes "
                    "at once (rl_speed.connectors.env_to_module.ColumnarObservationPreprocessor), or use stock "
                    "RLlib.") from e

    def __call__(self, obs: Any, step: Step) -> Any:
        if self.batched is not None:
            return self.batched(obs)
        return _stack([self.piece.preprocess(lane, None) for lane in _lanes(obs)])


def _lanes(obs: Any) -> list:
    """``[N, ...]`` observations (a structure for Dict / Tuple spaces) as N per-lane observations."""
    return [tree.map_structure(lambda x, i=i: x[i], obs) for i in range(len(tree.flatten(obs)[0]))]


def _stack(rows: list) -> Any:
    """Per-lane results back into ``[N, ...]`` arrays (leaf by leaf)."""
    return tree.map_structure(lambda *xs: np.stack(xs), *rows)


def columnar_pipeline(rllib_pipeline: Any, num_lanes: int) -> list:
    """The columnar forms of the pieces of the runner's RLlib env-to-module pipeline, in order; raises
    :class:`UnsupportedConnector` naming the first piece that has none."""
    forms: list = []
    for piece in rllib_pipeline.connectors:
        if isinstance(piece, NATIVE):
            continue
        forms.append(_form(piece, num_lanes))
    return forms


def _form(piece: Any, num_lanes: int) -> Any:
    if type(piece) is MeanStdFilter:
        return ColumnarMeanStdFilter(piece)
    # (RLlib exports FlattenObservations and FrameStackingEnvToModule as partials of these classes.)
    if type(piece) is FlattenObservations and not piece._as_learner_connector:
        return ColumnarFlattenObservations(piece)
    if type(piece) is PrevActionsPrevRewards:
        return ColumnarPrevActionsPrevRewards(piece, num_lanes)
    if type(piece) is FrameStacking and not piece._as_learner_connector:
        return ColumnarFrameStacking(piece)
    if isinstance(piece, SingleAgentObservationPreprocessor):
        return ColumnarObservationPreprocessor(piece)
    if isinstance(piece, ConnectorV2):
        return ColumnarLastObservationPiece(piece)
    raise UnsupportedConnector(
        f"The env-to-module connector piece {type(piece).__name__} has no columnar form, and rl_speed never skips a "
        f"connector silently. Columnar forms exist for {', '.join(SUPPORTED)}. Move the transformation into the env "
        "(a gymnasium wrapper) or the RLModule, or train with stock PPO / DQN.")


SUPPORTED = ("MeanStdFilter", "FlattenObservations", "PrevActionsPrevRewards", "FrameStackingEnvToModule",
             "SingleAgentObservationPreprocessor subclasses", "any ConnectorV2 piece that only rewrites each "
             "episode's last observation")


class LastObservationEpisode(SingleAgentEpisode):
    """One lane's current observation as the last entry of an episode: all a piece may touch is
    ``get_observations(-1)`` and ``set_observations(new_data=..., at_indices=-1)``. Anything else (earlier steps,
    actions, rewards, ids, ...) raises :class:`UnsupportedConnector` naming it, rather than giving a wrong answer:
    the columnar runner keeps no episode history."""

    _ALLOWED = frozenset({"get_observations", "set_observations", "_only_last", "observation", "piece_name"})

    @override(SingleAgentEpisode)
    def __init__(self, observation: Any, piece_name: str) -> None:  # (no SingleAgentEpisode state on purpose)
        object.__setattr__(self, "observation", observation)
        object.__setattr__(self, "piece_name", piece_name)

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("__") or name in LastObservationEpisode._ALLOWED:
            return object.__getattribute__(self, name)
        raise UnsupportedConnector(
            f"{object.__getattribute__(self, 'piece_name')} reads `episode.{name}`: on the columnar path a raw "
            "ConnectorV2 piece sees only each lane's last observation (get_observations(-1) / set_observations("
            "at_indices=-1)). Write it as a SingleAgentObservationPreprocessor (with `preprocess_batch` for all "
            "lanes at once), or use stock RLlib.")

    @override(SingleAgentEpisode)
    def get_observations(self, indices: Any = -1, **kwargs: Any) -> Any:
        self._only_last("get_observations", indices, kwargs)
        return self.observation

    @override(SingleAgentEpisode)
    def set_observations(self, *, new_data: Any, at_indices: Any = -1, **kwargs: Any) -> None:
        self._only_last("set_observations", at_indices, kwargs)
        object.__setattr__(self, "observation", new_data)

    def _only_last(self, method: str, index: Any, kwargs: dict) -> None:
        if index != -1 or any(v not in (None, False) for v in kwargs.values()):
            raise UnsupportedConnector(
                f"{self.piece_name} calls `episode.{method}({index!r}, {kwargs})`: on the columnar path a raw "
                "ConnectorV2 piece sees only each lane's last observation (index -1). Write it as a "
                "SingleAgentObservationPreprocessor, or use stock RLlib.")


class ColumnarLastObservationPiece:
    """Any other ``ConnectorV2`` piece that rewrites each episode's last observation in place (RLlib's pattern for
    decoders, e.g. its protobuf example): called once per step with one :class:`LastObservationEpisode` per lane, in
    lane order, and the rewritten observations stacked (a Python call per lane per step, as RLlib's runner pays).
    Probed when the config is validated with the env's first observation (:func:`probe_raw_pieces`); a piece that
    touches more than the last observation, or writes into the batch itself, is refused naming what it did."""

    def __init__(self, piece: Any) -> None:
        self.piece = piece
        self.name = type(piece).__name__

    def _call(self, observations: list) -> list:
        episodes = [LastObservationEpisode(o, self.name) for o in observations]
        batch: dict = {}
        self.piece(rl_module=None, batch=batch, episodes=episodes, explore=None, shared_data={})
        if batch:
            raise UnsupportedConnector(f"{self.name} writes {sorted(batch)} into the batch itself; on the columnar "
                                       "path a raw ConnectorV2 piece may only rewrite each lane's last observation. "
                                       "Use stock RLlib for it.")
        return [e.observation for e in episodes]

    def __call__(self, obs: Any, step: Step) -> Any:
        return _stack(self._call(_lanes(obs)))


def probe_raw_pieces(forms: list, first_obs: Callable[[], Any]) -> None:
    """Runs the forms on one real observation (``first_obs()``, ``[1, ...]``; made only when needed) when any of them
    is a raw ConnectorV2 piece, so a piece that cannot run on the columnar path is refused before anything starts,
    with what it did."""
    if not any(isinstance(f, ColumnarLastObservationPiece) for f in forms):
        return
    obs, step = first_obs(), Step(np.ones(1, bool))
    for form in forms:
        try:
            obs = form(obs, step)
        except UnsupportedConnector:
            raise
        except Exception as e:
            raise UnsupportedConnector(
                f"{type(getattr(form, 'piece', form)).__name__} failed on the env's first observation on the columnar "
                f"path ({type(e).__name__}: {e}); a raw ConnectorV2 piece runs there with one observation per lane, "
                "`rl_module=None` and no history. Write it as a SingleAgentObservationPreprocessor, or use stock "
                "RLlib.") from e


def apply(forms: list, obs: Any, step: Step) -> Any:
    for form in forms:
        obs = form(obs, step)
    return obs


# Multi-agent pipelines. The multi-agent runner receives one observation dict per env copy per step (agent id ->
# observation, only the agents that observe), as RLlib's pieces see the last entry of each MultiAgentEpisode; the
# forms map such a dict to the module inputs, once per copy per step, in copy order (RLlib's episode order).


class MultiAgentFlattenObservations:
    """RLlib's ``FlattenObservations(multi_agent=True, agent_ids=..., keys_to_remove=...)`` on one copy's dict: each
    listed agent's observation (all agents if none are listed) flattened by its own space, others as they are."""

    def __init__(self, piece: FlattenObservations) -> None:
        self.piece = piece
        self.structs = piece._input_obs_base_struct  # agent id -> the agent's space structure (keys removed)
        self.agent_ids = set(piece._agent_ids) if piece._agent_ids is not None else None
        self.keys_to_remove = set(piece._keys_to_remove)

    def __call__(self, observations: dict) -> dict:
        out = {}
        for aid, obs in observations.items():
            if self.agent_ids is not None and aid not in self.agent_ids:
                out[aid] = obs
                continue
            if self.keys_to_remove:
                obs = {k: v for k, v in obs.items() if k not in self.keys_to_remove}
            out[aid] = np.asarray(flatten_inputs_to_1d_tensor(obs, self.structs[aid], batch_axis=False),
                                  np.float32).reshape(-1)
        return out


class MultiAgentPreprocessorForm:
    """A user's ``MultiAgentObservationPreprocessor``: its ``preprocess(observations, episode)`` once per copy per
    step (a Python call per copy, as on RLlib's runner), with ``episode`` None (the columnar runner keeps no episode
    objects; a piece that reads it is refused when the config is validated, probed with a sample of its input)."""

    def __init__(self, piece: MultiAgentObservationPreprocessor) -> None:
        self.piece = piece
        try:
            piece.preprocess(piece.input_observation_space.sample(), None)
        except Exception as e:
            raise UnsupportedConnector(
                f"{type(piece).__name__}.preprocess(observations, episode) failed with episode=None "
                f"({type(e).__name__}: {e}): the columnar runner has no episode objects; make the piece work from "
                "the observations alone, or use stock RLlib.") from e

    def __call__(self, observations: dict) -> dict:
        return self.piece.preprocess(observations, None)


def multi_agent_pipeline(rllib_pipeline: Any) -> list:
    """The per-copy forms of the pieces of the runner's multi-agent env-to-module pipeline, in order; raises
    :class:`UnsupportedConnector` naming the first piece that has none."""
    forms: list = []
    for piece in rllib_pipeline.connectors:
        if isinstance(piece, NATIVE):
            continue
        if type(piece) is FlattenObservations and piece._multi_agent and not piece._as_learner_connector:
            forms.append(MultiAgentFlattenObservations(piece))
        elif isinstance(piece, MultiAgentObservationPreprocessor):
            forms.append(MultiAgentPreprocessorForm(piece))
        else:
            raise UnsupportedConnector(
                f"The multi-agent env-to-module connector piece {type(piece).__name__} has no columnar form, and "
                f"rl_speed never skips a connector silently. Multi-agent forms exist for {', '.join(MULTI_AGENT)}. "
                "Move the transformation into the env or the RLModule, or train with stock RLlib.")
    return forms


MULTI_AGENT = ("FlattenObservations(multi_agent=True)", "MultiAgentObservationPreprocessor subclasses")


def apply_per_copy(forms: list, observations: dict) -> dict:
    for form in forms:
        observations = form(observations)
    return observations
