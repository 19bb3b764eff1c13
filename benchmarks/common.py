"""Shared pieces of the benchmarks: timing by medians and a machine description."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time
from typing import Any, Callable, Iterator


def median_rate(step: Callable[[], int], repeats: int = 5, min_seconds: float = 0.5) -> float:
    """Median over ``repeats`` runs of items per second; each run calls ``step`` (returning items done) for at
    least ``min_seconds``. Medians, because this machine is shared and noisy."""
    rates = []
    for _ in range(repeats):
        items, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < min_seconds:
            items += step()
        rates.append(items / elapsed)
    return statistics.median(rates)


def median_seconds(fn: Callable[[], object], repeats: int, *, warmup: bool = False,
                   sync: Callable[[], None] | None = None) -> float:
    """Median wall time of ``repeats`` calls of ``fn``; ``warmup`` makes one untimed call first, ``sync`` (e.g.
    ``torch.cuda.synchronize``) runs before each clock read so asynchronous device work is counted."""
    if warmup:
        fn()
        if sync:
            sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def tanh_mlp(inputs: int, outputs: int, hidden: list[int]) -> "torch.nn.Module":
    """The bare loops' network: ``hidden`` tanh layers and a linear output (RLlib's default MLP shape)."""
    from rl_speed.modules.layers import mlp

    return mlp(inputs, hidden, "tanh", out_dim=outputs)[0]


def train_rate(config: Any, iterations: int, warmup: int = 1, agents_per_step: int = 1) -> tuple[float, dict]:
    """Builds the algorithm, trains ``warmup`` iterations, then returns (env steps/s over the next ``iterations``
    iterations, the last result). ``agents_per_step`` turns env steps into agent steps (multi-agent envs whose env
    step moves every agent)."""
    algo = build_with_every_runner(config)
    try:
        for _ in range(warmup):
            result = algo.train()
        before = result["env_runners"]["num_env_steps_sampled_lifetime"]
        start = time.perf_counter()
        for _ in range(iterations):
            result = algo.train()
        elapsed = time.perf_counter() - start
        return (result["env_runners"]["num_env_steps_sampled_lifetime"] - before) * agents_per_step / elapsed, result
    finally:
        algo.stop()


def agent_steps(result: dict, agents_per_lane_step: int = 1) -> float:
    """Agent steps sampled so far, from RLlib's per-agent keys (``num_agent_steps_sampled_lifetime``) where the
    runner reports them, else env steps x ``agents_per_lane_step``."""
    runners = result["env_runners"]
    per_agent = runners.get("num_agent_steps_sampled_lifetime")
    if isinstance(per_agent, dict) and per_agent:
        return float(sum(per_agent.values()))
    return float(runners["num_env_steps_sampled_lifetime"]) * agents_per_lane_step


def gpu_keys_off(config: Any) -> Any:
    """A GPU preset's config for CPU learners (in place, returned): no GPU, no torch.compile, no captured step
    (``cuda_graph``, which needs a CUDA learner). The one list of a preset's GPU-only keys for every benchmark."""
    return config.learners(num_gpus_per_learner=0).framework(torch_compile_learner=False).training(cuda_graph=False)


def check_cuda(bench: str, device: str, without_it: str) -> None:
    """Refuses ``--device cuda`` on a machine where torch finds no CUDA GPU, before the bench builds anything;
    ``without_it`` says what the bench does with the flag left out."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{bench} --device cuda: this machine has no CUDA GPU torch can use; leave --device out "
                         f"to {without_it}.")


@contextlib.contextmanager
def local_ray(num_cpus: int, num_gpus: int | None = None, preload: tuple[str, ...] = ()) -> Iterator[bool]:
    """A private local Ray for a benchmark's run (``address="local"`` never attaches to another cluster), shut down
    after it; a caller's Ray (a test session's) is used as it is and left running. Also where RLlib would otherwise
    start a default Ray itself (it finds a GPU runner's or learner's device through Ray's runtime context).
    ``preload``: modules its worker processes import before they take work (:mod:`rl_speed.ray_start`). Yields
    whether it started the Ray (False: the caller's, with nothing preloaded)."""
    import ray

    from rl_speed.ray_start import init_local_ray

    if ray.is_initialized():
        yield False
        return
    gpus = {} if num_gpus is None else {"num_gpus": num_gpus}
    init_local_ray(preload, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, **gpus)
    try:
        yield True
    finally:
        ray.shutdown()


def usable_cpus() -> int:
    """CPUs this process may run on (``taskset`` / cgroup affinity), which ``os.cpu_count()`` ignores."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def build_with_every_runner(config: Any) -> Any:
    """``config.build_algo()``, refused if an env runner failed to start. RLlib's default
    ``restart_failed_env_runners`` takes such a runner out of service and trains on without it, so the run would
    sample with fewer runners than configured and its figures would not compare with runs that had them all."""
    algo = config.build_algo()
    group = algo.env_runner_group
    wanted = algo.config.num_env_runners
    started = group.num_healthy_remote_env_runners() if group is not None else 0
    if started < wanted:
        algo.stop()
        raise RuntimeError(f"{started} of the {wanted} env runners configured started (the log above says why); a "
                           "run with fewer runners does not compare with the others and is not kept. Run it again.")
    return algo


def timed_run(config: Any, seconds: float, warmup: int = 2, after: Callable[[Any], Any] | None = None,
              before: Callable[[Any], Any] | None = None) -> dict:
    """Builds ``config``'s algorithm and trains it for ``seconds`` after ``warmup`` iterations: agent steps/s
    (RLlib's agent-step keys, so a multi-agent env step counts its agents), each iteration's ``rl_speed_profile`` and
    wall time, each iteration's ``sampler`` counters with the runners' step timers (:func:`_runner_timers`), and the
    finite ``episode_return_mean`` values seen; ``cores``: the cores busy on average per process group over the timed
    iterations (:class:`benchmarks.process_cpu.CoresByProcess`).
    ``before(algo)``, if given, runs once the algorithm is built, before the warm-up; ``after(algo)`` after the timed
    iterations (outside the timing). Their values are ``"before"`` and ``"after"``."""
    import numpy as np

    from benchmarks.process_cpu import CoresByProcess

    algo = build_with_every_runner(config)
    try:
        prepared = before(algo) if before is not None else None
        for _ in range(warmup):
            result = algo.train()
        start_steps = agent_steps(result)
        cores = CoresByProcess()
        cores.start()
        start, returns, profiles, samplers, iteration_s = time.perf_counter(), [], [], [], []
        while (now := time.perf_counter()) - start < seconds:
            result = algo.train()
            iteration_s.append(time.perf_counter() - now)
            value = result["env_runners"].get("episode_return_mean")
            if value is not None and np.isfinite(value):
                returns.append(float(value))
            profiles.append(result.get("rl_speed_profile", {}))
            samplers.append({**result.get("sampler", {}), **_runner_timers(result["env_runners"])})
        elapsed = time.perf_counter() - start
        busy = cores.stop(algo)
        steps = agent_steps(result) - start_steps
        return {"rate": steps / elapsed, "returns": returns, "profiles": profiles, "samplers": samplers,
                "iteration_s": iteration_s, "iterations": len(profiles), "cores": busy,
                "before": prepared, "after": after(algo) if after is not None else None}
    finally:
        algo.stop()


def _runner_timers(env_runners: dict) -> dict:
    """RLlib's per-step runner timers (``env_step_timer``, ``rlmodule_inference_timer``: seconds per step of all of a
    runner's lanes, averaged over the runners) of one iteration's results, where the runners logged them."""
    from ray.rllib.utils.metrics import ENV_STEP_TIMER, RLMODULE_INFERENCE_TIMER

    return {key: float(env_runners[key]) for key in (ENV_STEP_TIMER, RLMODULE_INFERENCE_TIMER) if key in env_runners}


def remote_values(results: Any) -> list:
    """The return values of a ``foreach_learner`` / ``foreach_env_runner`` call, raising the first actor's error."""
    out = []
    for result in results:
        if not result.ok:
            raise result.get()
        out.append(result.get())
    return out


def interleaved(plan: list, repeats: int) -> list:
    """``repeats`` rounds of ``plan`` in order (A, B, A, B, ...), so that a slow drift of the host (thermal, other
    tenants) falls on every row alike instead of on the rows run last."""
    return [key for _ in range(repeats) for key in plan]


def median_run(runs: list[dict]) -> dict:
    """The run with the median end-to-end rate (the lower middle one of an even count): its learner split is
    reported with it, so the row's figures come from one run."""
    return sorted(runs, key=lambda r: r["rate"])[(len(runs) - 1) // 2]


def rate_range(runs: list[dict]) -> str:
    """`` (lowest-highest, N runs)`` of the runs' end-to-end rates, for a row that reports its :func:`median_run`;
    empty for a single run."""
    rates = sorted(r["rate"] for r in runs)
    return f" ({rates[0]:,.0f}-{rates[-1]:,.0f}, {len(rates)} runs)" if len(rates) > 1 else ""


def median_of(rows: list[dict], key: str) -> float:
    """The median of ``key`` over the rows that have it (per-iteration dicts of a :func:`timed_run`, e.g. its
    ``profiles`` or ``samplers``); NaN if none does."""
    import numpy as np

    values = [row[key] for row in rows if key in row]
    return float(np.median(values)) if values else float("nan")


#: The learner's phases of an iteration in ``rl_speed_profile``: FastPPO's values and GAE (advantages) and its
#: updates (learn), FastDQN's replay (adding, sampling, priorities) and its updates (learn).
LEARNER_PHASES = ("advantages_s", "learn_s", "replay_s")


def learner_seconds(run: dict) -> float:
    """A :func:`timed_run`'s learner time per iteration: the sum of the :data:`LEARNER_PHASES` an algorithm's
    ``rl_speed_profile`` reports (FastPPO: values + GAE + updates; FastDQN: replay + updates), median over the
    iterations that learned; NaN if none did."""
    import numpy as np

    times = [sum(p.get(key, 0.0) for key in LEARNER_PHASES) for p in run["profiles"] if p.get("learn_s")]
    return float(np.median(times)) if times else float("nan")


def checkpoint_module_dir(checkpoint: Any) -> Any:
    """Where an RLlib algorithm checkpoint directory holds its trained (single-agent) module: a Path."""
    from pathlib import Path

    from ray.rllib.core import DEFAULT_MODULE_ID

    return Path(checkpoint) / "learner_group" / "learner" / "rl_module" / DEFAULT_MODULE_ID


def load_policy_module(checkpoint: Any) -> tuple[Any, dict]:
    """The trained RLModule (single-agent) of an algorithm checkpoint directory and its run's ``env_config``."""
    import pickle
    from pathlib import Path

    from ray.rllib.core.rl_module.rl_module import RLModule

    checkpoint = Path(checkpoint)
    module_dir = checkpoint_module_dir(checkpoint)
    if not module_dir.is_dir():
        raise FileNotFoundError(f"{checkpoint} is not an RLlib algorithm checkpoint (no "
                                f"{module_dir.relative_to(checkpoint)}); pass the checkpoint_NNNNNN folder that "
                                "`rl-speed train` printed.")
    with open(checkpoint / "class_and_ctor_args.pkl", "rb") as f:
        config = pickle.load(f)["ctor_args_and_kwargs"][0][0]  # (args, kwargs) -> args -> the config's state dict
    return RLModule.from_checkpoint(module_dir), dict(config.get("env_config", {}))


#: A batch of observations ``[N, ...]`` -> ``[N]`` actions (the policy benches' players).
Policy = Callable[[Any], Any]


def random_policy(num_actions: int, seed: int = 0) -> Policy:
    """Uniformly random actions, one per observation in the batch."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return lambda obs: rng.integers(0, num_actions, len(obs))
