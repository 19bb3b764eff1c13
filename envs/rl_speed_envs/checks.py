"""Settings checks shared by the simulators, so every env names a bad value the same way."""

from __future__ import annotations

from typing import Any

import numpy as np


def check_int(env: str, name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` as an int if it is an integer (not a bool) in ``[low, high]`` (``high=None``: no upper bound);
    otherwise ``ValueError`` naming the env, the key, the value and the allowed range."""
    if (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < low
            or (high is not None and value > high)):
        allowed = f"from {low} to {high}" if high is not None else f">= {low}"
        raise ValueError(f"{env}: `{name}`={value!r} is invalid; use an integer {allowed}.")
    return int(value)
