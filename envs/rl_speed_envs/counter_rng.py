"""A counter-based random stream that numpy can evaluate for many envs at once.

Each env owns a 64-bit key and a draw counter; draw ``k`` of env ``i`` is ``splitmix64(key_i + k * GOLDEN)``.
A vector env draws for any subset of its boards with one array expression (no per-board ``Generator`` loop), and a
scalar env seeded with the same seed produces the identical stream, which is what the lockstep tests rely on.
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, elementwise on a uint64 array (wrap-around arithmetic is intended)."""
    x = np.asarray(x, dtype=np.uint64)
    z = (x ^ (x >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def key_from_seed(seeds: np.ndarray) -> np.ndarray:
    """Derives a stream key per seed: ``[N] int -> [N] uint64``."""
    return splitmix64(np.asarray(seeds, dtype=np.int64).astype(np.uint64) + _GOLDEN)


def uniform(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """One float64 in [0, 1) per (key, counter) pair; the caller advances its counters."""
    bits = splitmix64(keys + counters.astype(np.uint64) * _GOLDEN)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)  # 53 random bits / 2**53


def lane_keys(seed: int | None, count: int, np_random: np.random.Generator,
              keys: np.ndarray | None) -> tuple[np.ndarray, bool]:
    """Stream keys of a vector env's ``count`` lanes at ``reset(seed=...)``: with a seed, lane ``i`` gets the key of a
    scalar env reset with ``seed + i``; without one, the current keys stay (streams continue), or fresh keys come from
    the env's ``np_random`` on the first reset. Returns ``(keys, reseeded)``; when reseeded, restart the draw
    counters."""
    if seed is not None:
        return key_from_seed(seed + np.arange(count)), True
    if keys is None:
        return np_random.integers(0, 2**63, size=count).astype(np.uint64), False
    return keys, False
