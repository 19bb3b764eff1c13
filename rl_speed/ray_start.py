"""A local Ray whose worker processes import the experiments' algorithm and env-runner modules before they take work.

Every env runner (and, under Tune, every trial) is an actor. Ray places it on a worker process it started in advance,
and only then does that process import the actor's class: RLlib, torch and rl_speed, seconds per process, and
all the runners at once, after the driver has built their configs. Ray can have its workers import modules as soon
as they start (its ``preload_python_modules`` setting), while the driver is still importing and building: on a
16-core H200 box this brings the Pong preset's first iteration from 18.6 s to 15.7 s after process start (medians
of 3, ``rl-speed bench atari-startup --device cuda``; results/atari-startup/2026-12-02-h200-bytecode.md).

The cost: each of Ray's idle workers holds those modules, about 215 MiB more (USS) than an idle worker without them,
measured on the CPU. Only a Ray this process starts can be told; a running cluster keeps its own setting.

Under Tune the prestarted workers went unused until :func:`tune_trials_on_prestarted_workers`: Tune makes each
trial's actor class with a runtime env that sets env vars (``PL_DISABLE_FORK``, and those of the driver's it passes
on), Ray starts a new worker process for an actor with a runtime env of its own instead of taking a prestarted one,
and the actors an actor creates inherit its runtime env. So the trial and every env runner it created started a fresh
process, which imported RLlib, torch and rl_speed only then: `rl-speed train` printed its first progress line at 19.3 s
instead of 17.1 s with the trial on a prestarted worker (2-core CPU, one runner, medians of 3;
results/cli-start/2026-12-05-cpu-prestarted-trials.md), and 9.7 s after the same experiment without Tune on a 16-core
H200 box before the change (results/cli-start/2026-12-05-h200.md).

A script can also start Ray while it imports RLlib, torch and rl_speed (``init_local_ray(import_beside=...)``): Ray's
start is mostly other processes starting (its GCS, raylet and prestarted workers), the imports are this process's, and
one after the other they add up. On a 16-core H200 box, without the preload, starting Ray beside the driver's imports
brought the Pong preset's first iteration 1.6 s and 2.7 s earlier (two boxes, medians of 3;
results/atari-startup/2026-12-02-h200-bytecode.md, 2026-12-03-h200-prefetch.md); with it, 3.4 s earlier than the
preload alone (22.8 s against 26.2 s, medians of 3; results/atari-startup/2026-12-05-h200.md). On a 2-core CPU
neither gains (results/atari-startup/2026-12-05-cpu.md): both cores are busy through the start.

The algorithm's own build waits for its env runners to start, then builds the learner, whose first torch optimizer
imports ``torch._dynamo`` (torch wraps ``Optimizer.__init__`` to keep it out of compiled graphs and imports the
compiler on its first call): 1.6 s on a 2-core EPYC, after every runner is up. FastPPO and FastDQN import
:data:`LEARNER_IMPORTS` in another thread while their runners start (:func:`import_learner_modules_beside_runners`)
when the learner is local and on a GPU: on the Pong preset on an H200 box the build then ends 0.7-0.8 s after the
last runner is ready, against 1.9-2.5 s (results/atari-startup/2026-12-05-h200-learner-imports.md).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any


def preload_modules(configs: Iterable[tuple[type, Any]]) -> list[str]:
    """The modules a worker imports for these experiments: each algorithm's (a Tune trial's actor) and each env
    runner class's (the runners). ``configs``: (algorithm class, its AlgorithmConfig) pairs."""
    modules = set()
    for algo_class, config in configs:
        modules.add(algo_class.__module__)
        if config.env_runner_cls is not None:
            modules.add(config.env_runner_cls.__module__)
        else:  # RLlib's own runner, chosen when the algorithm builds
            modules.add("ray.rllib.env.multi_agent_env_runner" if config.is_multi_agent
                        else "ray.rllib.env.single_agent_env_runner")
    modules.discard("__main__")  # a script's own classes: a worker cannot import the driver's script by that name
    return sorted(modules)


def init_local_ray(preload: Iterable[str] = (), *, import_beside: Iterable[str] = (), **init_kwargs: Any) -> None:
    """``ray.init(address="local", **init_kwargs)`` (always a new Ray, never one already running on this machine),
    its workers importing ``preload`` before they take work. ``import_beside``: modules this process imports in
    another thread while Ray starts (e.g. the ``preload`` modules, which the driver needs too); an import's error is
    raised here after Ray is shut down.

    Only imports go beside Ray's start: building an RLlib config registers envs with Tune, whose registry, once Ray's
    key-value store answers, writes to it through a Ray that is not connected yet and starts a second one ("Perhaps
    you called ray.init twice"; found 2026-12-05). ``ray.init`` stays in the calling thread: started from another
    one, Ray lost its GCS (2026-12-02)."""
    import ray

    preload = list(preload)
    if preload:
        init_kwargs["_system_config"] = {"preload_python_modules": preload}
    beside = _Importer(list(import_beside)) if import_beside else None
    try:
        ray.init(address="local", **init_kwargs)
    finally:
        if beside is not None:
            beside.join()
    if beside is not None and beside.error is not None:
        ray.shutdown()
        raise beside.error


class _Importer(threading.Thread):
    """Imports modules in a thread of its own; keeps the error for the caller's thread to raise."""

    def __init__(self, modules: list[str]) -> None:
        super().__init__(name="rl_speed-imports", daemon=True)
        self.modules = modules
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            for module in self.modules:
                importlib.import_module(module)
        except BaseException as error:  # raised by init_local_ray in the caller's thread
            self.error = error


#: What a local torch learner's build imports that nothing before it has: the compiler torch's optimizers import at
#: their first construction. (A benchmark empties it to time the build without the overlap.)
LEARNER_IMPORTS: tuple[str, ...] = ("torch._dynamo",)


def import_learner_modules_beside_runners(config: Any) -> threading.Thread | None:
    """Starts importing :data:`LEARNER_IMPORTS` in another thread, to be called before the algorithm's build starts
    its env runners, which it waits for before it builds the learner; the thread, or None where nothing is to be
    gained: a learner in another process (``num_learners`` > 0), a learner on the CPU (seeded, a CPU-only torch's
    ``use_deterministic_algorithms`` imports the compiler itself right away in this thread, and two threads importing
    one package at once could meet half-imported modules), or nothing left to import. A failed import is left to the
    learner's build, which imports the module again and raises its error there."""
    modules = [m for m in LEARNER_IMPORTS if m not in sys.modules]
    if not modules or config.num_learners > 0 or not config.num_gpus_per_learner:
        return None
    return _Importer(modules)


def set_tune_trial_env_vars() -> dict[str, str]:
    """Sets in this process's environment, where unset, the env vars Tune gives every trial actor (its
    ``DEFAULT_ENV_VARS``), so that the workers of a Ray started from here afterwards have them already, and returns
    that environment: call it right before :func:`init_local_ray`, then run Tune under
    :func:`tune_trials_on_prestarted_workers` with what it returned."""
    from ray.tune.execution.class_cache import DEFAULT_ENV_VARS

    for name, value in DEFAULT_ENV_VARS.items():
        os.environ.setdefault(name, value)
    return dict(os.environ)


@contextlib.contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set while the block runs, so that the processes started inside (a local Ray and
    its workers among them) inherit them; restored after."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def tune_trials_on_prestarted_workers(worker_environ: Mapping[str, str] | None) -> Iterator[None]:
    """Within it, Tune makes a trial's actor class without its runtime env where that env would change nothing: where
    it only sets env vars and each of them has that value in ``worker_environ``, the environment every worker of the
    local Ray inherited (this process's environment when it started Ray). The trial then runs on one of Ray's
    prestarted workers, with the modules they preloaded, and the env runners it creates can too (on a busy machine
    Ray may still start a fresh process for some of them). Where a value
    differs (or Tune's runtime env sets anything else), Tune's runtime env stays, as without this; with
    ``worker_environ`` None (a cluster this process did not start, whose workers' environment it cannot know), Tune
    is left as it is.

    Tune offers no setting for the trial's runtime env: this replaces ``_ActorClassCache.get`` of Ray 2.60's Tune
    while the block runs (a Tune that no longer has it fails here, loudly) and puts it back after."""
    if worker_environ is None:
        yield
        return
    import ray
    from ray.tune.execution.class_cache import _ActorClassCache

    tune_get = _ActorClassCache.get

    def get(cache: _ActorClassCache, trainable_cls: type) -> Any:
        if trainable_cls not in cache._cache:
            runtime_env = dict(tune_get(cache, trainable_cls)._default_options.get("runtime_env") or {})
            env_vars = runtime_env.pop("env_vars", {})
            if not runtime_env and all(worker_environ.get(name) == value for name, value in env_vars.items()):
                cache._cache[trainable_cls] = ray.remote(trainable_cls)
        return cache._cache[trainable_cls]

    _ActorClassCache.get = get
    try:
        yield
    finally:
        _ActorClassCache.get = tune_get
