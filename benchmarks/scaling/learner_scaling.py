"""Learner scaling over the GPUs of one host: FastPPO's GPU presets with ``num_learners`` 1, 2, 4, 8 (DDP, one GPU
each) and the same runners, so the same train batch per iteration split over more learners (strong scaling).

Presets: MettaGrid (``tuned_examples/mettagrid_ppo_gpu.yaml``, when the ``[mettagrid]`` extra is installed) and the
grid arena (``tuned_examples/grid_ppo_gpu.yaml``). Every row uses the host's cores for env runners (all but the
learners' and the driver's, rounded down to a multiple of the largest learner count), each runner as in the preset,
so the batch is ``runners x lanes x rollout_fragment_length``; ``minibatch_size`` stays the preset's (per learner,
as in RLlib). Learner counts go up to the host's GPUs.

Per row, over ``seconds`` after the warm-up iterations: agent steps/s end to end; the learner's time per iteration
(``learn`` + ``advantages`` of ``rl_speed_profile``, median) and its share of the iteration; the learner rate (batch /
learner time); scaling efficiency against one learner, ``rate(k) / (k x rate(1))``, of the learner rate and end to
end. Where the learner share is small, the runners (or the driver) bound the run, and the end-to-end efficiency says
nothing about the learners: the table says which. Per learner, the fastest and the slowest one's batch fetch +
advantages and minibatch loop (DDP learners wait for the slowest at every all-reduce), so a learner time that does
not shrink with more learners shows where it stays.

``gpus_seen`` adds rows where every learner actor sees all of the host's GPUs (``"all"``) beside RLlib's default,
each sees only its own (``"own"``). NVIDIA/nccl#129 says NCCL moves data GPU to GPU only between processes that see
each other's GPU; on the 2x H200 host (docs/studies/learner-scaling.md) it went GPU to GPU either way (its cuMem path) and the rows
differed within noise (see also :mod:`benchmarks.scaling.allreduce`). ``"all"`` sets Ray Train's
``TRAIN_ENABLE_SHARE_CUDA_VISIBLE_DEVICES`` while the learner group is built; each learner still trains on its own
GPU (Ray's ``get_devices`` picks it by its GPU id). ``overrides``: config keys set on every row (e.g.
``{"torch_compile_learner": false}``, or ``{"learner_config_dict": {"ppo_loss": "rllib"}}`` for RLlib's PPO loss).
``profile=True`` adds, per row, one iteration with every learner under ``torch.profiler``: its device-busy and NCCL
time, kernels, launches, host syncs and ops (:mod:`benchmarks.scaling.learner_profile`), to tell a learner that waits
for its host thread or for the other learners from one that computes. ``pin_cores=True`` gives each learner actor a
physical core of its own and the runners the others (:mod:`benchmarks.scaling.core_pinning`).

Run on the device with ``rl-speed bench learner-scaling --device cuda`` (``--learners 1,4`` picks the counts,
``--config '{"cuda_graph": false}'`` sets ``overrides``).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from benchmarks.scaling import core_pinning
from benchmarks.common import (gpu_keys_off, interleaved, learner_seconds, machine, median_of, median_run,
                                   rate_range, timed_run, usable_cpus)
from benchmarks import TUNED_EXAMPLES

TUNED = TUNED_EXAMPLES
PRESETS = {"MettaGrid": TUNED / "mettagrid_ppo_gpu.yaml", "grid arena": TUNED / "grid_ppo_gpu.yaml"}


def _load(path: Path) -> Any:
    from rl_speed.experiments import load_experiments

    (experiment,) = load_experiments(path)
    return experiment.config.copy(copy_frozen=False)


def _scaled(preset: Any, runners: int, learners: int, device: str, cpus_per_learner: int = 1) -> Any:
    batch = runners * preset.num_envs_per_env_runner * preset.rollout_fragment_length
    config = preset.copy(copy_frozen=False)
    config.env_runners(num_env_runners=runners).training(
        train_batch_size_per_learner=batch // learners,
        minibatch_size=min(preset.minibatch_size, batch // learners))
    if device == "cuda":
        return config.learners(num_learners=learners, num_gpus_per_learner=1, num_cpus_per_learner=cpus_per_learner)
    return gpu_keys_off(config.learners(num_learners=learners, num_cpus_per_learner=1))


def per_learner_spread(result: dict) -> str:
    """The fastest and the slowest learner's seconds per update, medians over a :func:`timed_run`: batch fetch, join
    and advantages (in brackets the fetch and join alone: reading the object store and copying to the device), then
    the minibatch loop (``rl_speed_profile/learner_*_s_min`` / ``_max``). What the learner time minus these leaves is
    the driver's side of the update call (Ray's calls, metrics)."""
    profiles = result["profiles"]

    def spread(name: str) -> str:
        return f"{median_of(profiles, f'learner_{name}_s_min'):.3f}-{median_of(profiles, f'learner_{name}_s_max'):.3f}"

    return f"{spread('advantages')} s (join {spread('join')} s) / {spread('updates')} s"


#: Ray Train's switch for its GPU workers' CUDA_VISIBLE_DEVICES: 1 shows each worker every GPU of its node.
SHARE_GPUS_ENV = "TRAIN_ENABLE_SHARE_CUDA_VISIBLE_DEVICES"
GPUS_SEEN = ("own", "all")


@contextlib.contextmanager
def learners_seeing(seen: str) -> Iterator[None]:
    """While a learner group is built: its learner actors see only their own GPU (``"own"``, RLlib's default) or
    every GPU of the host (``"all"``)."""
    before = os.environ.get(SHARE_GPUS_ENV)
    os.environ[SHARE_GPUS_ENV] = "1" if seen == "all" else "0"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(SHARE_GPUS_ENV)
        else:
            os.environ[SHARE_GPUS_ENV] = before


def profiled_iteration(algo: Any) -> list[dict] | str:
    """:func:`benchmarks.scaling.learner_profile.profile_one_iteration`, or why it failed (the timed row still counts)."""
    from benchmarks.scaling.learner_profile import profile_one_iteration

    try:
        return profile_one_iteration(algo)
    except Exception as e:  # a profiler that cannot run here must not discard the row's timing
        return f"profile failed: {type(e).__name__}: {str(e)[:200]}"


def profile_row(k: int, seen: str, calls: int, result: dict) -> str:
    """One table row of the learners' profiled iteration (:func:`profiled_iteration`), min-max over the learners."""
    summaries = result["after"]
    head = f"| {k} | {seen} | {calls} | {learner_seconds(result):.3f} s |"
    if isinstance(summaries, str) or not summaries:
        return f"{head} {summaries or 'no learner answered'} | | | | | |"

    def spread(key: str, unit: str = "") -> str:
        values = [s[key] for s in summaries]
        fmt = (lambda v: f"{v:.3f}") if unit else (lambda v: f"{v:,}")
        low, high = fmt(min(values)), fmt(max(values))
        return (low if low == high else f"{low}-{high}") + unit

    return (f"{head} {spread('device_busy_s', ' s')} | {spread('nccl_s', ' s')} | {spread('kernels')} | "
            f"{spread('launches')} | {spread('host_sync_s', ' s')} | {spread('ops')} |")


#: Keys that size a row (set by :func:`_scaled` from ``runners`` and ``learners``), which ``overrides`` may not set.
#: (``minibatch_size`` may be overridden: the header and the profile read it from each row's config.)
SIZING_KEYS = {"num_env_runners", "num_envs_per_env_runner", "rollout_fragment_length", "train_batch_size_per_learner",
               "num_learners", "num_gpus_per_learner", "num_cpus_per_learner"}


def efficiency(rate: float, k: int, first_k: int, first_rate: float) -> float:
    """Scaling efficiency of ``rate`` at ``k`` learners against the first row run (``first_k`` learners):
    ``rate(k) / (k x rate(1))``, with rate(1) the first row's rate per learner."""
    return rate / k / (first_rate / first_k)


def learner_counts(gpus: int) -> list[int]:
    """1, 2, 4, 8, ... up to ``gpus``."""
    return [k for k in (1, 2, 4, 8) if k <= max(1, gpus)]


def run(repeats: int = 1, device: str = "cpu", seconds: float = 40.0, warmup: int = 3,
        presets: tuple[str, ...] | None = None, runners: int | None = None, cpus_per_learner: int = 1,
        learners: tuple[int, ...] | None = None, gpus_seen: tuple[str, ...] = ("own",),
        overrides: dict | None = None, profile: bool = False, pin_cores: bool = False) -> str:
    """``repeats``: runs per row, interleaved in rounds (:func:`interleaved`); each row reports the median run
    (:func:`median_run`) and the range of the end-to-end rate. ``cpus_per_learner`` (GPU learners): CPUs Ray
    reserves for each learner actor, taken from the runners when ``runners`` is not given (a learner whose update is
    bound by its CPU thread may starve beside busy runners). ``learners``: the learner counts to run (default 1, 2,
    4, 8 up to the host's GPUs); efficiencies are against the first. ``gpus_seen`` and ``overrides``: see the module
    docstring. ``profile``: after each row's timed run, one more iteration with every learner under
    ``torch.profiler`` (:mod:`benchmarks.scaling.learner_profile`), reported in a second table per preset.
    ``pin_cores``: each learner actor on a physical core of its own, the runners on the others
    (:mod:`benchmarks.scaling.core_pinning`)."""
    import ray

    import rl_speed
    from rl_speed.algorithms.config import update_config
    from rl_speed.registry import check_env_installed

    rl_speed.register()
    gpus = 0
    if device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
    counts = list(learners) if learners else learner_counts(gpus if device == "cuda" else 2)
    cpus = usable_cpus()
    if repeats < 1:
        raise ValueError(f"learner_scaling.run: `repeats` must be >= 1, got {repeats}.")
    if cpus_per_learner < 1:
        raise ValueError(f"learner_scaling.run: `cpus_per_learner` must be >= 1, got {cpus_per_learner}.")
    if any(k < 1 or (device == "cuda" and k > max(1, gpus)) for k in counts):
        raise ValueError(f"learner_scaling.run: `learners` {counts} must be counts from 1 to the host's GPUs "
                         f"({gpus}) on cuda, >= 1 on cpu.")
    if not gpus_seen or any(seen not in GPUS_SEEN for seen in gpus_seen):
        raise ValueError(f"learner_scaling.run: `gpus_seen` {list(gpus_seen)} must name some of {list(GPUS_SEEN)}.")
    unknown = [key for key in overrides or {} if not hasattr(_load(PRESETS["grid arena"]), key)]
    if unknown:
        raise ValueError(f"learner_scaling.run: `overrides` names unknown config keys {unknown}.")
    sizing = sorted(set(overrides or {}) & SIZING_KEYS)
    if sizing:  # the rows' batch, learner rate and header are computed from the runners and the preset's sizes
        raise ValueError(f"learner_scaling.run: `overrides` may not set {sizing}: each row's runners, learners and "
                         "batch come from `runners` and `learners` (and the preset's lanes and fragment length).")
    if pin_cores:
        core_pinning.split_cores(counts[-1])  # refuses a host too small for the largest row, before Ray starts
    per_learner = cpus_per_learner if device == "cuda" else 1  # CPU learners keep one core each (_scaled)
    learner_cpus = counts[-1] * per_learner
    if runners is None:  # every core not taken by a learner or the driver, as a multiple of the largest count
        runners = max(counts[-1], (cpus - learner_cpus - 1) // counts[-1] * counts[-1])
    names, skipped = [], []
    for name in presets or PRESETS:
        try:
            check_env_installed(_load(PRESETS[name]).env)
            names.append(name)
        except ImportError as e:
            skipped.append(f"{name} not run: {e}")
    ray.init(address="local", num_cpus=max(cpus, runners + learner_cpus + 1), num_gpus=gpus, include_dashboard=False,
             log_to_driver=False)
    sections = []
    try:
        for name in names:
            preset = _load(PRESETS[name])
            batch = runners * preset.num_envs_per_env_runner * preset.rollout_fragment_length
            plan = [(k, seen) for k in counts for seen in gpus_seen]
            configs = {k: update_config(_scaled(preset, runners, k, device, cpus_per_learner), overrides or {})
                       for k in counts}
            runs: dict[tuple[int, str], list[dict]] = {key: [] for key in plan}
            failed: dict[tuple[int, str], str] = {}
            for k, seen in interleaved(plan, repeats):  # A, B, C, A, B, C, ...: drift hits every row alike
                if (k, seen) in failed:
                    continue
                try:
                    with learners_seeing(seen):
                        runs[(k, seen)].append(timed_run(configs[k].copy(copy_frozen=False), seconds, warmup,
                                                         after=profiled_iteration if profile else None,
                                                         before=core_pinning.pin_cores if pin_cores else None))
                except Exception as e:  # report, do not hide, a configuration that fails on this host
                    failed[(k, seen)] = f"failed: {type(e).__name__}: {str(e)[:300]}"
            rows, profile_rows, base = [], [], None
            for k, seen in plan:
                if not runs[(k, seen)]:
                    rows.append(f"| {k} | {seen} | {failed[(k, seen)]} | | | | | | |")
                    continue
                result = median_run(runs[(k, seen)])
                if profile:
                    config = configs[k]
                    calls = -(-config.train_batch_size_per_learner // config.minibatch_size) * config.num_epochs
                    profile_rows.append(profile_row(k, seen, calls, result))
                learner_s = learner_seconds(result)
                iteration_s = float(np.median(result["iteration_s"]))
                learner_rate = batch / learner_s
                base = base or (k, learner_rate, result["rate"])
                rows.append(f"| {k} | {seen} | {result['rate']:,.0f}{rate_range(runs[(k, seen)])} | "
                            f"{learner_s:.3f} s of "
                            f"{iteration_s:.3f} s ({learner_s / iteration_s:.0%}) | {per_learner_spread(result)} | "
                            f"{learner_rate:,.0f} | "
                            f"{efficiency(learner_rate, k, base[0], base[1]):.0%} | "
                            f"{efficiency(result['rate'], k, base[0], base[2]):.0%} | "
                            f"{result['iterations']} |")
            sections += [
                f"#### {name}: `{PRESETS[name].name}`, {runners} runners x {preset.num_envs_per_env_runner} lanes x "
                f"{preset.rollout_fragment_length} steps = {batch:,} agent steps per iteration, minibatch "
                f"{' / '.join(f'{configs[k].minibatch_size:,}' for k in counts)} per learner (at {counts} learners)",
                "",
                "| learners | GPUs each learner sees | agent steps/s end to end | learner time per iteration (share) "
                "| per learner: fetch + advantages (join) / minibatch loop (fastest-slowest) | learner steps/s "
                "| learner efficiency | end-to-end efficiency | iterations |",
                "|---:|---|---:|---|---|---:|---:|---:|---:|",
                *rows,
                "",
            ]
            if profile:
                sections += [
                    f"Profiled iteration (one per row, after its timed run; `{name}`): per learner, min-max over the "
                    "learners (benchmarks.scaling.learner_profile).",
                    "",
                    "| learners | GPUs each learner sees | minibatch calls per learner | learner time per iteration "
                    "(timed) | device busy | NCCL kernels | kernels | kernel launches | host syncs | aten ops |",
                    "|---:|---|---:|---|---|---|---|---|---|---|",
                    *profile_rows,
                    "",
                ]
    finally:
        ray.shutdown()
    return "\n".join([
        "### Learner scaling over GPUs of one host (FastPPO GPU presets, DDP)",
        "",
        f"Command: `rl-speed bench learner-scaling --device {device}` · machine: {machine()}, {gpus} GPU(s) · "
        f"CPUs usable: {cpus} · CPUs per learner: {per_learner} · date: "
        f"{time.strftime('%Y-%m-%d')} · overrides: {overrides or 'none'} · "
        f"{'each learner pinned to a physical core of its own, the runners to the rest' if pin_cores else 'unpinned'}"
        f" · each row over {seconds:.0f} s after "
        f"{warmup} warm-up iterations, {repeats} run(s) per row in interleaved rounds, the median run shown; "
        "learner time = learn + advantages seconds of rl_speed_profile (median); efficiency = rate(k) / (k x rate(1)), "
        "with rate(1) the first row's rate per learner where it has more than one.",
        "",
        *sections,
        *[f"- {note}" for note in skipped],
    ])
