"""Moving column batches between the env runners and the algorithm: gather them each iteration (:class:`ColumnSampler`),
merge the runners' connector states (:func:`sync_connector_states`) and push the learners' weights back on a schedule
(:func:`sync_weights_if_due`).

Each runner samples into its own arrays and returns them whole (:class:`RunnerBatch`); nothing is shared between
runners, so there is no lock to contend for and no per-transition message.
"""

from __future__ import annotations

import functools
import logging
import time
import traceback
from typing import Any, NamedTuple

import ray

from ray.rllib.core import (
    COMPONENT_ENV_TO_MODULE_CONNECTOR,
    COMPONENT_LEARNER,
    COMPONENT_MODULE_TO_ENV_CONNECTOR,
    COMPONENT_RL_MODULE,
)
from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME, WEIGHTS_SEQ_NO

from rl_speed.columns import Columns, num_steps
from rl_speed.env_runners.shared_inference import publish_learner_weights

#: ColumnSampler's counters in the result dict, under ``SAMPLER_KEY`` (the seeds' collector monitoring).
SAMPLER_KEY = "sampler"

logger = logging.getLogger(__name__)


class EnvRunnerSamplingError(RuntimeError):
    """An env runner raised while sampling columns: the run stops (see :class:`ColumnSampler`)."""


class RunnerFailure(NamedTuple):
    """What a remote runner hands over instead of a batch when its ``sample_columns()`` raised."""

    worker_index: int
    error: str  # "Type: message"
    traceback: str


class RunnerBatch(NamedTuple):
    """What one env runner hands over per call: whole ``[T, N]`` column arrays, never per-step messages."""

    worker_index: int
    columns: Columns | ray.ObjectRef  # a reference when the sampler is ``by_reference``
    metrics: dict
    weights_seq_no: int  # the weights the runner sampled with (RLlib's counter, raised by every sync)
    num_steps: int  # valid transitions in ``columns``
    connector_state: dict  # the runner's env-to-module / module-to-env connector states after this batch
    sample_seconds: float  # wall-clock of the runner's sample_columns() call for this batch


def _connector_state(runner: Any) -> dict:
    return runner.get_state(components=[COMPONENT_ENV_TO_MODULE_CONNECTOR, COMPONENT_MODULE_TO_ENV_CONNECTOR])


def _timed_sample(runner: Any) -> tuple[Columns, float]:
    start = time.perf_counter()
    columns = runner.sample_columns()
    return columns, time.perf_counter() - start


def _sample_runner(runner: Any) -> RunnerBatch:
    columns, seconds = _timed_sample(runner)
    return RunnerBatch(runner.worker_index, columns, runner.get_metrics(), runner._weights_seq_no, num_steps(columns),
                       _connector_state(runner), seconds)


def _guarded(runner: Any, by_reference: bool) -> RunnerBatch | RunnerFailure:
    """A remote runner's batch, or the error it raised (returned, not raised, so the driver sees every runner's
    error itself rather than RLlib's fault tolerance logging it and training on without that runner)."""
    try:
        return _sample_runner_by_reference(runner) if by_reference else _sample_runner(runner)
    except Exception as e:
        return RunnerFailure(runner.worker_index, f"{type(e).__name__}: {e}", traceback.format_exc())


def _sample_runner_by_reference(runner: Any) -> RunnerBatch:
    """As :func:`_sample_runner`, but the columns stay in the object store (put by the runner, which owns them):
    the algorithm passes the reference on to a learner actor, which reads them from there; the driver never
    copies them."""
    columns, seconds = _timed_sample(runner)
    return RunnerBatch(runner.worker_index, ray.put(columns), runner.get_metrics(), runner._weights_seq_no,
                       num_steps(columns), _connector_state(runner), seconds)


class ColumnSampler:
    """Gathers :class:`RunnerBatch` es from the env runners each iteration, and counts what happened to them.

    With ``config.async_sampling`` (and remote runners) every runner starts its next batch the moment it hands one
    over, so sampling overlaps the learner's update and no runner waits for another. The price: each batch was
    sampled with the weights from one or two syncs earlier (the pushed weights queue behind the in-flight sample on
    each runner), or three for a FastPPO batch kept over from the previous call. A runner hands a batch over when the
    driver fetches it, which the driver does between learner updates: with RLlib's
    ``max_requests_in_flight_per_env_runner`` at 2, each runner also holds its next request, so it goes on sampling
    while the driver waits for the learner (the MettaGrid GPU preset: 1.09x-1.24x), and the weights lag grows by
    about one update. PPO's importance ratio and KL term use the behaviour policy's recorded log-probs and logits,
    so they stay correct.

    ``by_reference=True`` (FastPPO with learner actors): remote runners hand over object references instead of
    arrays (:func:`_sample_runner_by_reference`), so a batch goes from a runner to the learner that trains on it
    without passing through the driver.

    ``streaming=True`` (FastDQN: a replay buffer takes batches in any order and number): a call returns as soon as
    at least one batch is ready. Otherwise (FastPPO: one train batch of ``num_env_runners`` runner batches) a call
    returns once that many batches are in, from whichever runners delivered them: a fast runner may give two and a
    slow one none, and a batch beyond the count waits for the next call. Waiting instead for one batch from every
    runner held each iteration to the slowest runner: on the MettaGrid GPU preset the slowest of 15 runners took
    1.5x the fastest's time (0.59 vs 0.38 s per batch), so the others idled a third of the time. In both modes the
    next request goes to a runner as soon as its batch is fetched (RLlib's
    ``foreach_env_runner_async_fetch_ready``).

    Result keys (``sampler/...``): ``batches_received_lifetime``; ``batches_dropped_lifetime`` (synchronous sampling:
    asked for but not back by ``sample_timeout_s``, from a failed, restarting or slow runner; under async sampling a
    late batch is taken by a later call, and a failed runner's lost request shows in RLlib's fault-tolerance
    metrics); ``batches_stale_lifetime`` (sampled with
    weights older than the newest pushed to the runners); ``weights_lag_max`` (by how many learner update calls,
    this iteration); ``requests_in_flight`` (the queue: samples running on the runners after this call);
    ``sample_s_min`` / ``sample_s_max`` (the fastest and slowest runner's ``sample_columns()`` wall-clock among the
    batches of this call: how long a runner is busy per batch, and how far the slowest one holds the others up. RLlib's
    ``env_runners/sample`` timer is an EMA of coefficient 0.01 per call, which reads close to the first, slow calls
    for a hundred calls); ``runner_errors_lifetime`` (see below).

    A remote runner whose ``sample_columns()`` raises stops the run with :class:`EnvRunnerSamplingError`, naming the
    runner, the error and its traceback. Stock RLlib, with its default ``restart_failed_env_runners``, logs such an
    error and trains on with the other runners, so a config error found only in the runners (or an env bug) gave a
    run that reported success on fewer runners. With ``fault_tolerance(ignore_env_runner_failures=True)`` the error
    is logged, counted in ``runner_errors_lifetime`` and the run goes on without that batch. A runner process that
    dies (not an exception) is still RLlib's to restart, as configured.
    """

    TAG = "rl_speed_columns"

    def __init__(self, algo: Any, streaming: bool = False, by_reference: bool = False) -> None:
        self.algo = algo
        self.streaming = streaming
        self._sample_remote = functools.partial(_guarded, by_reference=by_reference)
        self._in_flight = 0
        self._early: list[RunnerBatch] = []  # FastPPO: batches beyond one train batch, for the next call

    def sample(self) -> list[RunnerBatch]:
        algo = self.algo
        group = algo.env_runner_group
        remote = group.num_remote_env_runners()
        if not algo.config.async_sampling or remote == 0:
            results = self._without_failures(self._sample_all())
            self._record(results, asked=max(1, remote))
            return results
        return self._stream(wanted=1 if self.streaming else max(1, remote))

    def _without_failures(self, results: list) -> list[RunnerBatch]:
        """The batches; a runner's error stops the run, or is logged and counted (see the class docstring)."""
        failures = [r for r in results if isinstance(r, RunnerFailure)]
        if failures:
            if not self.algo.config.ignore_env_runner_failures:
                first = failures[0]
                raise EnvRunnerSamplingError(
                    f"env runner {first.worker_index} raised while sampling: {first.error}\n{first.traceback}\nThe "
                    "run stops: training on the other runners would hide the error (stock RLlib logs it and goes "
                    "on). To go on without the failed runners' batches, set "
                    "`config.fault_tolerance(ignore_env_runner_failures=True)`.")
            for failure in failures:
                logger.error("env runner %d raised while sampling (ignore_env_runner_failures: going on): %s\n%s",
                             failure.worker_index, failure.error, failure.traceback)
            self.algo.metrics.log_value((SAMPLER_KEY, "runner_errors_lifetime"), len(failures),
                                        reduce="lifetime_sum")
        return [r for r in results if not isinstance(r, RunnerFailure)]

    def _sample_all(self) -> list[RunnerBatch]:
        """A batch from every env runner, waiting for all; remote ones sample in parallel."""
        algo = self.algo
        if algo.env_runner_group.num_remote_env_runners() == 0:
            return [_sample_runner(algo.env_runner)]
        return algo.env_runner_group.foreach_env_runner(self._sample_remote, local_env_runner=False,
                                                        timeout_seconds=algo.config.sample_timeout_s)

    def _stream(self, wanted: int) -> list[RunnerBatch]:
        """Up to ``wanted`` batches (fewer only if ``sample_timeout_s`` passes), as they arrive from any runner;
        every runner that hands one over gets its next request at once. FastDQN (``wanted`` 1) takes every batch
        that is ready; FastPPO keeps batches beyond ``wanted`` for the next call."""
        group = self.algo.env_runner_group
        results, self._early = self._early, []
        deadline = time.monotonic() + (self.algo.config.sample_timeout_s or 60.0)
        while len(results) < wanted and time.monotonic() < deadline:
            results += self._without_failures(group.foreach_env_runner_async_fetch_ready(
                self._sample_remote, tag=self.TAG, timeout_seconds=0.02))
        if not self.streaming:
            results, self._early = results[:wanted], results[wanted:]
        # A fetch sends each runner it took from one new request, so a runner that handed over two batches at once
        # holds one; top every runner up to max_requests_in_flight_per_env_runner, so none idles while the driver
        # waits for the learner (each call sends one more request to each runner below the cap).
        for _ in range(max(0, int(self.algo.config.max_requests_in_flight_per_env_runner) - 1)):
            group.foreach_env_runner_async(self._sample_remote, tag=self.TAG)
        self._in_flight = group.num_in_flight_async_reqs(tag=self.TAG)
        # A shortfall is not a drop: the batches still come, and a later call takes them. A failed runner's lost
        # request shows in RLlib's fault-tolerance metrics.
        self._record(results, asked=len(results))
        return results

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
        if results:
            seconds = [r.sample_seconds for r in results]
            log((SAMPLER_KEY, "sample_s_min"), min(seconds), window=1)
            log((SAMPLER_KEY, "sample_s_max"), max(seconds), window=1)


def sync_connector_states(algo: Any, results: list[RunnerBatch]) -> None:
    """RLlib's merge and broadcast of the runners' connector states (e.g. a MeanStdFilter's statistics) and of the
    sampled-steps counter, fed with the states the runners handed over with their batches.

    ``Algorithm.step`` would do this after every iteration by asking every runner for its state: one more round trip
    per iteration, which under async sampling queues behind the sample a runner is busy with, so the wait for the
    next batch lands in RLlib's connector-sync timer instead of the ``sample`` phase. Columnar configs switch that off
    (``_dont_auto_sync_env_runner_states``, as RLlib's IMPALA does) and call this from their training step instead;
    the broadcast is fire-and-forget, as in RLlib.
    """
    if not results:
        return
    remote = algo.env_runner_group.num_remote_env_runners() > 0
    algo.env_runner_group.sync_env_runner_states(
        config=algo.config,
        connector_states=[r.connector_state for r in results] if remote else None,
        env_steps_sampled=algo.metrics.peek((ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0),
        env_to_module=algo.env_to_module_connector, module_to_env=algo.module_to_env_connector)


#: The request tag of weight pushes (see :func:`sync_weights_if_due`).
WEIGHTS_TAG = "rl_speed_weights"


def sync_weights_if_due(algo: Any) -> None:
    """Pushes the learners' weights to the env runners every ``config.sync_weights_every`` iterations: fire and
    forget, under a request tag of their own.

    Why not RLlib's ``EnvRunnerGroup.sync_weights``: it sends under the tag "set_state", which the connector-state
    broadcast of the same iteration (:func:`sync_connector_states`) uses too, and RLlib keeps at most
    ``max_requests_in_flight_per_env_runner`` (1) requests per tag in flight on a runner, dropping the rest. Under
    async sampling that broadcast always waits behind the sample the runner has just been given, so every weight push
    was dropped and the runners sampled with their first weights for the whole run (``sampler/weights_lag_max`` grew
    by one per iteration; found 2026-11-27 when the async MettaGrid GPU preset did not learn). A push of its own can
    still be dropped while the previous push waits behind a sample; the next one then goes through."""
    if algo.iteration % algo.config.sync_weights_every:
        return
    group = algo.env_runner_group
    server = getattr(algo, "_inference", None)
    if server is not None:  # shared_inference: the server holds each version before a runner may act with it
        publish_learner_weights(algo, server)
    state = algo.learner_group.get_state(components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}",
                                         inference_only=True)[COMPONENT_LEARNER]
    state = {key: state[key] for key in (COMPONENT_RL_MODULE, WEIGHTS_SEQ_NO) if key in state}
    if group.num_remote_env_runners():
        group.foreach_env_runner_async_fetch_ready("set_state", tag=WEIGHTS_TAG, kwargs={"state": ray.put(state)},
                                                   timeout_seconds=0.0)
    if algo.env_runner is not None:  # the newest version (ColumnSampler measures lags against it)
        algo.env_runner.set_state(state)
