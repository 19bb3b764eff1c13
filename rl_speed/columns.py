"""The columnar batch every rl_speed algorithm consumes: a dict of ``[T, N, ...]`` numpy arrays.

A plain dict (not a class) so it crosses Ray's object store as a handful of large arrays with zero-copy reads.
Keys (``N`` = env lanes of one runner, ``T`` = steps of one ``sample()`` call):

| key | shape | dtype | meaning |
|---|---|---|---|
| ``obs`` | ``[T + 1, N, ...]`` | the env's | ``obs[t]`` is what the module saw at step t; ``obs[T]`` the observation after the last step, so the next observation of step t is always ``obs[t + 1]`` |
| ``actions`` | ``[T, N, ...]`` | the env's | the module's actions (a dict of such arrays for ``Dict`` action spaces) |
| ``rewards`` | ``[T, N]`` | float32 | |
| ``terminateds`` / ``truncateds`` | ``[T, N]`` | bool | the episode ended at step t (``obs[t + 1]`` is then its final observation) |
| ``valid`` | ``[T, N]`` | bool | False for gymnasium NEXT_STEP autoreset steps: the step after an episode end only resets the env, its action is ignored, and it is not a transition |
| ``action_logp`` | ``[T, N]`` | float32 | optional (policy-gradient modules): log-prob of ``actions`` |
| ``vf_preds`` | ``[T, N]`` | float32 | optional: value estimates of ``obs[t]`` when the module computed them while acting |

Because of NEXT_STEP autoreset, a valid step t is always followed by ``obs[t + 1]`` of the same episode: after a
termination or truncation it is the final observation (truncations bootstrap from it), and the reset observation
only arrives one step later, on the invalid step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tree

Columns = dict[str, Any]
REQUIRED = ("obs", "actions", "rewards", "terminateds", "truncateds", "valid")


def num_steps(columns: Columns) -> int:
    """Number of real (valid) transitions in a column batch."""
    return int(columns["valid"].sum())


def next_obs(columns: Columns) -> Any:
    """``obs[1:]`` (a view, no copy): the observation after each step."""
    obs = columns["obs"]
    return {k: v[1:] for k, v in obs.items()} if isinstance(obs, dict) else obs[1:]


def check(columns: Columns) -> None:
    """Raises ``ValueError`` naming the key if a column batch breaks the layout above."""
    missing = [k for k in REQUIRED if k not in columns]
    if missing:
        raise ValueError(f"Columns: missing keys {missing}; a column batch needs {list(REQUIRED)}.")
    t, n = columns["rewards"].shape
    for key in ("actions", "terminateds", "truncateds", "valid", "action_logp", "vf_preds"):
        for value in tree.flatten(columns.get(key, [])):
            if value.shape[:2] != (t, n):
                raise ValueError(f"Columns: `{key}` has shape {value.shape}, expected [{t}, {n}, ...].")
    obs = columns["obs"]
    for key, value in (obs.items() if isinstance(obs, dict) else [("obs", obs)]):
        if np.shape(value)[:2] != (t + 1, n):
            raise ValueError(f"Columns: `{key}` has shape {np.shape(value)}, expected [{t + 1}, {n}, ...] (T + 1 rows).")
