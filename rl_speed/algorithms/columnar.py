"""What every rl_speed algorithm does with column batches outside its learner: gather them from the env runners,
join or split them along the lane axis, and push weights back to the runners on a schedule.

Lanes (the N axis) are independent env copies, so column batches from several runners join along N, and a batch
splits along N into one shard per learner without cutting any trajectory.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np
import tree

from ray.rllib.algorithms.algorithm_config import NotProvided
from ray.rllib.utils.metrics import SYNCH_WORKER_WEIGHTS_TIMER, TIMERS

from rl_speed.columns import Columns
from rl_speed.env_runners import BatchedEnvRunner
from rl_speed.learners.cuda_graph import check_cuda_graph_keys
from rl_speed.learners.train_step import check_train_step_keys


class RunnerBatch(NamedTuple):
    """What one env runner hands over per call: whole ``[T, N]`` column arrays, never per-step messages."""

    worker_index: int
    columns: Columns
    metrics: dict
    weights_seq_no: int  # the weights the runner sampled with (RLlib's counter, raised by every sync)


def _sample_runner(runner: Any) -> RunnerBatch:
    return RunnerBatch(runner.worker_index, runner.sample(), runner.get_metrics(), runner._weights_seq_no)


def sample_columns(algo: Any) -> list[RunnerBatch]:
    """A :class:`RunnerBatch` from every env runner of ``algo``; remote ones sample in parallel."""
    if algo.env_runner_group.num_remote_env_runners() == 0:
        return [_sample_runner(algo.env_runner)]
    return algo.env_runner_group.foreach_env_runner(_sample_runner, local_env_runner=False,
                                                    timeout_seconds=algo.config.sample_timeout_s)


#: ColumnSampler's counters in the result dict, under ``SAMPLER_KEY`` (the seeds' collector monitoring).
SAMPLER_KEY = "sampler"


class ColumnSampler:
    """Gathers :class:`RunnerBatch` es from the env runners each iteration, and counts what happened to them.

    Each runner samples into its own arrays and returns them whole; nothing is shared between runners, so there is no
    lock to contend for and no per-transition message. With ``config.async_sampling`` (and remote runners) every
    runner starts its next batch as soon as it hands one over, so sampling overlaps the learner's update instead of
    waiting for it. The price: each batch was sampled with the weights from one sync earlier (the pushed weights
    queue behind the in-flight sample on each runner). PPO's importance ratio and KL term use the behaviour policy's
    recorded log-probs and logits, so they stay correct.

    ``streaming=True`` (FastDQN: a replay buffer takes batches in any order and number): instead of waiting for
    every runner, a call returns as soon as at least one batch is ready, and each runner that handed one over gets
    its next request at once (RLlib's ``foreach_env_runner_async_fetch_ready``: fetch, then launch on idle runners),
    so no runner waits for the slowest one. Otherwise (FastPPO: one train batch needs every runner's lanes) a call
    waits for all runners' batches.

    Result keys (``sampler/...``): ``batches_received_lifetime``; ``batches_dropped_lifetime`` (asked for but not
    back by ``sample_timeout_s``: a failed, restarting or slow runner; in streaming mode a failed runner's lost request
    shows in RLlib's fault-tolerance metrics instead); ``batches_stale_lifetime`` (sampled with
    weights older than the newest pushed to the runners); ``weights_lag_max`` (by how many learner update calls,
    this iteration); ``requests_in_flight`` (the queue: samples running on the runners after this call).
    """

    TAG = "rl_speed_columns"

    def __init__(self, algo: Any, streaming: bool = False) -> None:
        self.algo = algo
        self.streaming = streaming
        self._in_flight = 0

    def sample(self) -> list[RunnerBatch]:
        algo = self.algo
        group = algo.env_runner_group
        remote = group.num_remote_env_runners()
        if not algo.config.async_sampling or remote == 0:
            results = sample_columns(algo)
            self._record(results, asked=max(1, remote))
            return results
        if self.streaming:
            return self._stream()
        if not self._in_flight:
            self._launch()
        results: list = []
        deadline = time.monotonic() + (algo.config.sample_timeout_s or 60.0)
        while len(results) < self._in_flight and time.monotonic() < deadline:
            ready = group.fetch_ready_async_reqs(tags=self.TAG, timeout_seconds=1.0)
            results += [result for _, result in ready]
        asked, self._in_flight = self._in_flight, 0  # a runner that failed or timed out is dropped this iteration
        self._launch()  # the next batch starts now, while the learner updates on this one
        self._record(results, asked)
        return results

    def _stream(self) -> list[RunnerBatch]:
        group = self.algo.env_runner_group
        results: list = []
        deadline = time.monotonic() + (self.algo.config.sample_timeout_s or 60.0)
        while not results and time.monotonic() < deadline:
            results += group.foreach_env_runner_async_fetch_ready(_sample_runner, tag=self.TAG, timeout_seconds=0.1)
        self._in_flight = group.num_in_flight_async_reqs(tag=self.TAG)
        self._record(results, asked=len(results))
        return results

    def _launch(self) -> None:
        self._in_flight = self.algo.env_runner_group.foreach_env_runner_async(_sample_runner, tag=self.TAG)

    def _record(self, results: list[RunnerBatch], asked: int) -> None:
        local = self.algo.env_runner  # every sync reaches the local runner too: its version is the newest pushed
        newest = local._weights_seq_no if local is not None else max((r.weights_seq_no for r in results), default=0)
        lags = [max(0, newest - r.weights_seq_no) for r in results]
        log = self.algo.metrics.log_value
        log((SAMPLER_KEY, "batches_received_lifetime"), len(results), reduce="lifetime_sum")
        log((SAMPLER_KEY, "batches_dropped_lifetime"), max(0, asked - len(results)), reduce="lifetime_sum")
        log((SAMPLER_KEY, "batches_stale_lifetime"), sum(lag > 0 for lag in lags), reduce="lifetime_sum")
        log((SAMPLER_KEY, "weights_lag_max"), max(lags, default=0), window=1)
        log((SAMPLER_KEY, "requests_in_flight"), self._in_flight, window=1)


def concat_lanes(batches: list[Columns]) -> Columns:
    """Joins column batches of equal T side by side: ``[T, N1] + [T, N2] -> [T, N1 + N2]``."""
    if len(batches) == 1:
        return batches[0]
    lengths = {b["rewards"].shape[0] for b in batches}
    if len(lengths) != 1:
        raise ValueError(f"concat_lanes: runners returned different rollout lengths {sorted(lengths)}; every env "
                         "runner must sample the same number of steps (same rollout_fragment_length).")
    return tree.map_structure(lambda *xs: np.concatenate(xs, axis=1), *batches)


def split_lanes(columns: Columns, num_shards: int) -> list[Columns]:
    """Splits ``[T, N]`` columns into ``num_shards`` batches of ``N / num_shards`` lanes each (views, no copies)."""
    n = columns["rewards"].shape[1]
    if n % num_shards:
        raise ValueError(f"split_lanes: {n} lanes do not split evenly over {num_shards} learners; make "
                         "num_envs_per_env_runner * max(1, num_env_runners) a multiple of num_learners.")
    size = n // num_shards
    return [tree.map_structure(lambda x: x[:, i * size:(i + 1) * size], columns) for i in range(num_shards)]


def sync_weights_if_due(algo: Any) -> None:
    """Pushes the learners' weights to the env runners every ``config.sync_weights_every`` iterations."""
    if algo.iteration % algo.config.sync_weights_every == 0:
        with algo.metrics.log_time((TIMERS, SYNCH_WORKER_WEIGHTS_TIMER)):
            algo.env_runner_group.sync_weights(from_worker_or_learner_group=algo.learner_group, inference_only=True)


class ColumnarConfigMixin:
    """What every columnar algorithm config shares; mix in before RLlib's config class.

    Defaults: the env runner is :class:`BatchedEnvRunner`. Keys (through ``training()``):

    * ``sync_weights_every``: push learner weights to the env runners every this many iterations (default 1).
    * ``async_sampling``: remote runners sample the next batch while the learner updates (see
      :class:`ColumnSampler`; default False).
    * ``mixed_precision`` ("off" | "bf16" | "fp16") and ``grad_accumulation_steps`` (default 1): the learner's
      update step (see :mod:`rl_speed.learners.train_step`).
    * ``cuda_graph`` (default False): a CUDA learner replays its whole optimizer step as one captured CUDA graph
      (see :mod:`rl_speed.learners.cuda_graph`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env_runner_cls = BatchedEnvRunner
        self.sync_weights_every: int = 1
        self.async_sampling: bool = False
        self.mixed_precision: str = "off"
        self.grad_accumulation_steps: int = 1
        self.cuda_graph: bool = False

    def training(self, *, sync_weights_every: int = NotProvided, async_sampling: bool = NotProvided,
                 mixed_precision: str = NotProvided, grad_accumulation_steps: int = NotProvided,
                 cuda_graph: bool = NotProvided, **kwargs: Any) -> Any:
        super().training(**kwargs)
        if cuda_graph is not NotProvided:
            self.cuda_graph = cuda_graph
        if mixed_precision is not NotProvided:
            self.mixed_precision = mixed_precision
        if grad_accumulation_steps is not NotProvided:
            self.grad_accumulation_steps = grad_accumulation_steps
        if sync_weights_every is not NotProvided:
            self.sync_weights_every = sync_weights_every
        if async_sampling is not NotProvided:
            self.async_sampling = async_sampling
        return self

    def validate_columnar(self, name: str) -> None:
        from rl_speed.registry import check_env_installed

        check_env_installed(self.env)  # a missing optional extra (e.g. [mario]) fails here, with its install command
        if self.gym_env_vectorize_mode in ("sync", gym.VectorizeMode.SYNC) and has_vector_entry_point(self.env):
            self.gym_env_vectorize_mode = "vector_entry_point"  # the native vector env where the env has one
        if not isinstance(self.async_sampling, bool):
            self._value_error(f"{name}: `async_sampling`={self.async_sampling!r} must be true or false.")
        if not isinstance(self.sync_weights_every, int) or self.sync_weights_every < 1:
            self._value_error(f"{name}: `sync_weights_every`={self.sync_weights_every!r} must be an integer >= 1.")
        check_train_step_keys(self, name)
        check_cuda_graph_keys(self, name)
        if not self.in_evaluation and self.batch_mode != "truncate_episodes":
            self._value_error(f"{name}: `batch_mode` must be 'truncate_episodes' (columns have a fixed length).")
        if self.num_envs_per_env_runner < 1:
            self._value_error(f"{name}: `num_envs_per_env_runner`={self.num_envs_per_env_runner!r} must be >= 1.")


def has_vector_entry_point(env: Any) -> bool:
    """True if ``env`` names an rl_speed env or a gymnasium id with a native vector form."""
    if not isinstance(env, str):
        return False
    from rl_speed.registry import ENVIRONMENTS

    if env in ENVIRONMENTS:
        return ENVIRONMENTS[env][1] is not None
    try:
        return gym.spec(env).vector_entry_point is not None
    except Exception:
        return False


#: Ray metrics (``ray.util.metrics``) every columnar algorithm exports each iteration, so they show on the Ray
#: dashboard and its Prometheus endpoint. name -> description.
RAY_METRICS = {
    "rl_speed_env_steps_per_s": "Env steps sampled per second in the last training iteration.",
    "rl_speed_learner_updates_per_s": "Gradient updates (minibatches) per second in the last training iteration.",
    "rl_speed_replay_size": "Transitions held by the replay buffer (FastDQN).",
    "rl_speed_time_share": "Share of the last iteration's time spent in each phase (tag `phase`).",
}
_gauges: dict[str, Any] = {}


def export_ray_metrics(algo: Any, values: dict[str, float], shares: dict[str, float] | None = None) -> None:
    """Sets the gauges of :data:`RAY_METRICS` for this algorithm (tags: ``algorithm``, ``trial``)."""
    from ray.util.metrics import Gauge

    tags = {"algorithm": type(algo).__name__, "trial": str(getattr(algo, "trial_id", "") or "default")}
    for name, value in values.items():
        if name not in _gauges:
            _gauges[name] = Gauge(name, description=RAY_METRICS[name], tag_keys=("algorithm", "trial"))
        _gauges[name].set(float(value), tags=tags)
    if shares:
        name = "rl_speed_time_share"
        if name not in _gauges:
            _gauges[name] = Gauge(name, description=RAY_METRICS[name], tag_keys=("algorithm", "trial", "phase"))
        for phase, share in shares.items():
            _gauges[name].set(float(share), tags={**tags, "phase": phase})
