"""The columnar batch every rl_speed algorithm consumes: a dict of ``[T, N, ...]`` numpy arrays, and the one home of
its schema.

A plain dict (not a class) so it crosses Ray's object store as a handful of large arrays with zero-copy reads.
``N`` = env lanes of one runner, ``T`` = steps of one ``BatchedEnvRunner.sample_columns()`` call. Every key:

| key | shape | dtype | written by | read by |
|---|---|---|---|---|
| ``obs`` | ``[T + 1, N, ...]`` | the env's (a dict of such arrays for ``Dict`` spaces) | runner | buffer, PPO learner |
| ``actions`` | ``[T, N, ...]`` | the env's (a dict for ``Dict`` action spaces) | runner | buffer, PPO learner |
| ``rewards`` | ``[T, N]`` | float32 | runner | buffer, GAE |
| ``terminateds`` / ``truncateds`` | ``[T, N]`` | bool | runner | buffer, GAE |
| ``valid`` | ``[T, N]`` | bool | runner | buffer, GAE, PPO loss mask |
| ``action_logp`` | ``[T, N]`` | float32 | runner (sampling modules, exploring) | PPO loss |
| ``action_dist_inputs`` | ``[T, N, ...]`` | float32 | runner (sampling modules, exploring) | PPO's KL term |
| ``is_first`` | ``[T, N]`` | bool | runner (stateful modules) | PPO learner: the recurrent state is reset there |
| ``state_in`` | ``[T / L, N, ...]`` | float32 (a structure like the module's state) | runner (stateful modules) | PPO learner: the state at the start of each ``L``-step chunk |
| ``state_out`` | ``[1, N, ...]`` | float32 (like ``state_in``) | runner (stateful modules) | PPO learner (RLlib's stateful modules): the state after the last step, from which ``obs[T]`` is valued |
| ``module`` | ``[T + 1, N]`` | int16 | multi-agent runner | PPO learner: which module owns ``obs[t]`` of a lane (an index into the sorted module ids of the ``MultiRLModule``; -1: no agent) |
| ``env_step`` | ``[T, N]`` | bool | multi-agent runner | PPO learner's env-step count: True on the first lane of each env copy at each step the copy took (agent steps are ``valid``) |
| ``by_module`` | ``[1, N]`` | bool | multi-agent runner, agents with different spaces | marks the per-module layout: ``obs``, ``actions``, ``action_logp`` and ``action_dist_inputs`` are dicts keyed by module id, each in that module's space (zeros where another module acts) |
| ``next_row`` | ``[T, N]`` | int32 | multi-agent runner, turn-based envs | GAE: the row of ``obs`` that holds the lane's next observation after step t (``t + 1`` unless other agents took turns in between) |

``obs[t]`` is what the module saw at step t and ``obs[T]`` the observation after the last step, so the next
observation of step t is always ``obs[t + 1]``. ``terminateds`` / ``truncateds`` say the episode ended at step t
(``obs[t + 1]`` is then its final observation). ``valid`` is False for gymnasium NEXT_STEP autoreset steps: the step
after an episode end only resets the env, its action is ignored, and it is not a transition. So a valid step t is
always followed by ``obs[t + 1]`` of the same episode: after a termination or truncation it is the final observation
(truncations bootstrap from it), and the reset observation only arrives one step later, on the invalid step.

Multi-agent columns (:class:`rl_speed.env_runners.multi_agent.MultiAgentBatchedEnvRunner`): a lane is one agent slot
of one env copy (lane ``i * A + a`` is agent ``a`` of copy ``i``), ``valid`` is True where that agent acted, and
``module`` says which module acted (fixed per slot for an episode; the invalid reset step after an episode end still
belongs to the ended episode, like ``obs[t + 1]`` there). In turn-based envs (agents acting in sequence) an agent
that acted may observe again only some steps later: ``next_row`` then says where its next observation is, the
rewards and episode end it receives meanwhile are written to the step it acted in, and the steps it waits are not
``valid`` (as RLlib's per-agent episodes hold only the agent's own steps, nothing is discounted over the wait).

Value estimates are not a column: the PPO learner computes them with the weights it trains, so a module's acting-time
``vf_preds`` would never be read.

Lanes are independent env copies, so column batches from several runners join along N (:func:`concat_lanes`) and a
batch splits along N into one shard per learner without cutting any trajectory (:func:`split_lanes`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tree

Columns = dict[str, Any]

OBS = "obs"
ACTIONS = "actions"
REWARDS = "rewards"
TERMINATEDS = "terminateds"
TRUNCATEDS = "truncateds"
VALID = "valid"
ACTION_LOGP = "action_logp"
ACTION_DIST_INPUTS = "action_dist_inputs"
IS_FIRST = "is_first"
STATE_IN = "state_in"
STATE_OUT = "state_out"
MODULE = "module"
ENV_STEP = "env_step"
NEXT_ROW = "next_row"
BY_MODULE = "by_module"

REQUIRED = (OBS, ACTIONS, REWARDS, TERMINATEDS, TRUNCATEDS, VALID)
#: Keys with one row per step (``[T, N, ...]``); ``obs`` has T + 1 rows and ``state_in`` one row per chunk.
PER_STEP = (ACTIONS, TERMINATEDS, TRUNCATEDS, VALID, ACTION_LOGP, ACTION_DIST_INPUTS, IS_FIRST, ENV_STEP, NEXT_ROW)


def num_steps(columns: Columns) -> int:
    """Number of real (valid) transitions in a column batch (agent steps, for multi-agent columns)."""
    return int(columns[VALID].sum())


def num_env_steps(columns: Columns) -> int:
    """Env steps in a column batch: the ``env_step`` marks of multi-agent columns (one per env copy per step), else
    the valid transitions (one lane is one env)."""
    return int(columns[ENV_STEP].sum()) if ENV_STEP in columns else num_steps(columns)


def next_obs(columns: Columns) -> Any:
    """``obs[1:]`` (a view, no copy): the observation after each step."""
    return tree.map_structure(lambda o: o[1:], columns[OBS])


def check(columns: Columns) -> None:
    """Raises ``ValueError`` naming the key if a column batch breaks the layout above."""
    missing = [k for k in REQUIRED if k not in columns]
    if missing:
        raise ValueError(f"Columns: missing keys {missing}; a column batch needs {list(REQUIRED)}.")
    t, n = columns[REWARDS].shape
    for key in PER_STEP:
        for value in tree.flatten(columns.get(key, [])):
            if value.shape[:2] != (t, n):
                raise ValueError(f"Columns: `{key}` has shape {value.shape}, expected [{t}, {n}, ...].")
    for value in tree.flatten(columns[OBS]):
        if np.shape(value)[:2] != (t + 1, n):
            raise ValueError(f"Columns: `obs` has shape {np.shape(value)}, expected [{t + 1}, {n}, ...] (T + 1 rows).")
    if MODULE in columns and np.shape(columns[MODULE]) != (t + 1, n):
        raise ValueError(f"Columns: `module` has shape {np.shape(columns[MODULE])}, expected [{t + 1}, {n}].")
    for value in tree.flatten(columns.get(STATE_OUT, [])):
        if value.shape[:2] != (1, n):
            raise ValueError(f"Columns: `state_out` has shape {value.shape}, expected [1, {n}, ...].")
    for value in tree.flatten(columns.get(STATE_IN, [])):
        if value.shape[1] != n or value.shape[0] < 1 or t % value.shape[0]:
            raise ValueError(f"Columns: `state_in` has shape {value.shape}, expected [K, {n}, ...] with K dividing "
                             f"T = {t} (one row per chunk).")


def pack_struct(obs: Any) -> np.ndarray:
    """A Dict / Tuple observation batch ``[T, N, ...]`` per leaf -> one ``[T, N]`` numpy structured array with a field
    per leaf (named by its path), each in the leaf's own dtype and shape: uint8 leaves stay uint8 in a replay buffer
    that stores one ``obs`` array. :func:`unpack_struct` reverses it."""
    leaves = tree.flatten_with_path(obs)
    rows = leaves[0][1].shape[:2]
    dtype = np.dtype([("/".join(map(str, path)), leaf.dtype, leaf.shape[2:]) for path, leaf in leaves])
    packed = np.empty(rows, dtype)
    for path, leaf in leaves:
        packed["/".join(map(str, path))] = leaf
    return packed


def unpack_struct(packed: np.ndarray, structure: Any) -> Any:
    """The leaves of a :func:`pack_struct` array, back in ``structure`` (a Dict / Tuple observation of one step)."""
    paths = ["/".join(map(str, path)) for path, _ in tree.flatten_with_path(structure)]
    return tree.unflatten_as(structure, [packed[p] for p in paths])


def check_same_length(batches: list[Columns], who: str) -> None:
    """Raises ``ValueError`` (prefixed ``who``) unless every batch has the same T: lanes join only side by side."""
    lengths = {b[REWARDS].shape[0] for b in batches}
    if len(lengths) != 1:
        raise ValueError(f"{who}: runners returned different rollout lengths {sorted(lengths)}; every env "
                         "runner must sample the same number of steps (same rollout_fragment_length).")


def concat_lanes(batches: list[Columns]) -> Columns:
    """Joins column batches of equal T side by side: ``[T, N1] + [T, N2] -> [T, N1 + N2]``."""
    if len(batches) == 1:
        return batches[0]
    check_same_length(batches, "concat_lanes")
    return tree.map_structure(lambda *xs: np.concatenate(xs, axis=1), *batches)


def split_lanes(columns: Columns, num_shards: int) -> list[Columns]:
    """Splits ``[T, N]`` columns into ``num_shards`` batches of ``N / num_shards`` lanes each (views, no copies)."""
    n = columns[REWARDS].shape[1]
    if n % num_shards:
        raise ValueError(f"split_lanes: {n} lanes do not split evenly over {num_shards} learners; make "
                         "num_envs_per_env_runner * max(1, num_env_runners) a multiple of num_learners.")
    size = n // num_shards
    return [tree.map_structure(lambda x: x[:, i * size:(i + 1) * size], columns) for i in range(num_shards)]
