"""Callbacks on the columnar path.

RLlib's own callbacks work unchanged with FastPPO and FastDQN (``config.callbacks(callbacks_class=...)`` or the
``on_episode_end=...`` shorthand): the columnar runners call ``on_environment_created``, ``on_episode_created``,
``on_episode_start``, ``on_episode_step``, ``on_episode_end`` and ``on_sample_end`` with RLlib's keyword arguments,
and what they log through ``metrics_logger`` appears under ``result["env_runners"]`` as on stock RLlib (see
:mod:`rl_speed.env_runners.episode_callbacks` for the episode a callback receives and how it differs from RLlib's).
Per-episode callbacks cost a Python call per episode (and ``on_episode_step`` one per lane per step).

:class:`ColumnarCallback` adds one hook for custom metrics at full speed: ``on_sample_columns`` runs once per
``sample_columns()`` call with the whole ``[T, N]`` batch and the episodes that ended in it, as arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ray.rllib.callbacks.callbacks import RLlibCallback


class ColumnarCallback(RLlibCallback):
    """An ``RLlibCallback`` with rl_speed's vectorized hook; every RLlib hook keeps its meaning. Use it as any
    callbacks class: ``config.callbacks(MyCallback)`` (YAML: ``callbacks_class: my_package.MyCallback``).

    Example, the mean of an info key at episode ends, without any per-episode Python::

        class FoodEaten(ColumnarCallback):
            def on_sample_columns(self, *, env_runner, metrics_logger, columns, ended, **kwargs):
                if len(ended["env_index"]):
                    metrics_logger.log_value("episode_len_p90", float(np.percentile(ended["length"], 90)))
    """

    def on_sample_columns(self, *, env_runner: Any, metrics_logger: Any, columns: dict,
                          ended: dict[str, np.ndarray], **kwargs: Any) -> None:
        """Called by rl_speed's columnar runners once per ``sample_columns()`` call, after the batch is complete
        (stock RLlib's runners never call it).

        Args:
            env_runner: the runner (``BatchedEnvRunner`` or ``MultiAgentBatchedEnvRunner``).
            metrics_logger: the runner's ``MetricsLogger``; what is logged appears under ``result["env_runners"]``.
            columns: the batch (:mod:`rl_speed.columns`: ``obs [T + 1, N, ...]``, ``actions``, ``rewards`` (clipped
                if ``clip_rewards``), ``terminateds``, ``truncateds``, ``valid`` ``[T, N]``, ...). Read, do not write:
                the learner trains on these arrays.
            ended: the episodes that ended in this batch, one entry each: ``t`` (the step of ``columns`` where it
                ended), ``env_index`` (its lane; for multi-agent runners its env copy), ``return`` (unclipped, summed
                over agents), ``length`` (env steps) and ``terminated`` (False: truncated).
        """
