"""Runs validated experiments through Ray Tune with a live progress line and a final readout."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TextIO

from rl_speed.experiments import Experiment


#: The phases of ``rl_speed_profile`` (rl_speed.algorithms.telemetry) and their names on the progress line.
PHASE_LABELS = {"sample": "sample", "advantages": "gae", "replay": "replay", "learn": "learn", "sync_weights": "sync"}


def progress_fields(result: dict) -> dict[str, float]:
    """The numbers the progress line shows, from one RLlib result dict (missing ones are NaN)."""
    nan = float("nan")
    runners = result.get("env_runners", {})
    steps_this_iter = runners.get("num_env_steps_sampled", nan)
    seconds = result.get("time_this_iter_s") or nan
    learner = next(iter(v for k, v in result.get("learners", {}).items() if k != "__all_modules__"), {})
    sampler = result.get("sampler", {})
    return {
        "iteration": result.get("training_iteration", 0),
        "env_steps": runners.get("num_env_steps_sampled_lifetime", nan),
        "env_steps_per_s": steps_this_iter / seconds,
        "return_mean": runners.get("episode_return_mean", nan),
        # whole games' scores, where the env reports games (Atari; under life_episodes an episode is one life)
        "game_return_mean": runners.get("game_return_mean", nan),
        "time_total_s": result.get("time_total_s", nan),
        # rl_speed's per-iteration profile (absent for stock algorithms): shares of the iteration's time per phase.
        **{f"{k}_share": result.get("rl_speed_profile", {}).get(f"{k}_share", nan) for k in PHASE_LABELS},
        # Collector and replay monitoring (FastDQN; the sampler keys also FastPPO): NaN where absent.
        "replay_size": result.get("replay_buffer", {}).get("size", nan),
        "loss": learner.get("qf_loss", learner.get("total_loss", nan)),
        "td_error": learner.get("td_error_mean", nan),
        "epsilon": result.get("monitor", {}).get("epsilon", nan),
        "replay_ratio": result.get("monitor", {}).get("replay_ratio", nan),
        **{k: sampler.get(f"batches_{k}_lifetime", nan) for k in ("dropped", "stale")},
        "in_flight": sampler.get("requests_in_flight", nan),
    }


def _known(f: dict[str, float], key: str) -> bool:
    value = f.get(key, float("nan"))
    return value == value  # NaN (absent) is not equal to itself


def format_progress(name: str, f: dict[str, float]) -> str:
    line = (f"{name} | iter {f['iteration']:,} | env steps {f['env_steps']:,.0f} | "
            f"{f['env_steps_per_s']:,.0f} env steps/s | return {f['return_mean']:.3f} | ")
    if _known(f, "game_return_mean"):
        line += f"game {f['game_return_mean']:.2f} | "
    line += f"{f['time_total_s']:.0f} s"
    shares = [f"{label} {f[f'{phase}_share']:.0%}" for phase, label in PHASE_LABELS.items()
              if _known(f, f"{phase}_share")]
    if shares:  # the algorithm reports where its time went (FastPPO: gae; FastDQN: replay)
        line += " | time: " + ", ".join(shares)
    if _known(f, "replay_size"):
        line += (f" | replay {f['replay_size']:,.0f} | loss {f['loss']:.3g} | td {f['td_error']:.3g} | "
                 f"eps {f['epsilon']:.2f} | ratio {f['replay_ratio']:.1f}")
    if _known(f, "dropped"):
        line += f" | batches dropped {f['dropped']:,.0f}, stale {f['stale']:,.0f}, in flight {f['in_flight']:.0f}"
    return line


def make_progress_callback(name: str, stream: TextIO = sys.stdout) -> Any:
    """A Tune callback printing one progress line per result; it redraws in place on a terminal."""
    from ray.tune import Callback

    class ProgressLine(Callback):
        def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info: Any) -> None:
            line = format_progress(name if len(trials) == 1 else f"{name}/{trial.trial_id}", progress_fields(result))
            if stream.isatty():
                stream.write("\r\033[K" + line)
            else:
                stream.write(line + "\n")
            stream.flush()

        def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
            stream.write(f"\n{name}: trial {trial.trial_id} failed; see {trial.error_file}\n")

    return ProgressLine()


def experiment_path(storage_path: str | None, name: str) -> Path:
    """Where Tune keeps an experiment: ``STORAGE/NAME`` (Tune's default storage is ``~/ray_results``)."""
    return Path(storage_path or Path.home() / "ray_results").expanduser().resolve() / name


def check_resumable(experiments: list[Experiment], storage_path: str | None) -> str | None:
    """None if every experiment has a run to resume, else a message naming what is missing (checked before Ray
    starts, so a wrong path costs a second)."""
    from ray.tune import Tuner

    for exp in experiments:
        path = experiment_path(storage_path, exp.name)
        if not Tuner.can_restore(path):
            return (f"--resume: there is no run of experiment `{exp.name}` to resume at {path}. Fix: pass the "
                    "--storage-path the run was started with, or drop --resume to start a new run.")
    return None


def run_experiments(experiments: list[Experiment], storage_path: str | None, verbose: bool = False,
                    stream: TextIO = sys.stdout, resume: bool = False,
                    worker_environ: Mapping[str, str] | None = None) -> int:
    """Runs each experiment with Tune (Ray must be initialized); returns a process exit status.

    ``resume``: continue each experiment's unfinished or errored trials from their last checkpoints (Tune's
    experiment state + RLlib's algorithm checkpoint: weights, optimizer, counters and, for FastDQN, the replay
    buffer), with the stop criteria of the original run. ``worker_environ``: the environment of the local Ray's
    workers (:func:`init_ray`'s answer): the trials then run on Ray's prestarted workers where Tune's runtime env
    would change nothing (:func:`rl_speed.ray_start.tune_trials_on_prestarted_workers`); None on a cluster.
    """
    from ray import tune

    from rl_speed.ray_start import tune_trials_on_prestarted_workers

    status = 0
    for exp in experiments:
        if resume:
            tuner = tune.Tuner.restore(str(experiment_path(storage_path, exp.name)), trainable=exp.algo_class,
                                       resume_unfinished=True, resume_errored=True, param_space=exp.config)
        else:
            run_config = tune.RunConfig(
                name=exp.name,
                storage_path=str(Path(storage_path).resolve()) if storage_path else None,
                stop=exp.stop or None,
                checkpoint_config=tune.CheckpointConfig(**exp.checkpoint_config),
                callbacks=[make_progress_callback(exp.name, stream)],
                verbose=1 if verbose else 0,
            )
            tuner = tune.Tuner(exp.algo_class, param_space=exp.config,
                               tune_config=tune.TuneConfig(num_samples=exp.num_samples), run_config=run_config)
        start = time.perf_counter()
        with tune_trials_on_prestarted_workers(worker_environ):
            results = tuner.fit()
        wall = time.perf_counter() - start
        stream.write("\n" if stream.isatty() else "")
        stream.write(f"{exp.name}: finished in {wall:.0f} s. Results: {results.experiment_path}\n")
        for result in results:
            if result.error is not None:
                status = 1
                stream.write(f"  trial at {result.path} FAILED: {type(result.error).__name__}: {result.error}\n")
                continue
            f = progress_fields(result.metrics or {})
            mean_rate = f["env_steps"] / f["time_total_s"] if f["time_total_s"] else float("nan")
            stream.write(f"  {f['env_steps']:,.0f} env steps in {f['iteration']} iterations, "
                         f"{mean_rate:,.0f} env steps/s on average, final mean return {f['return_mean']:.3f}\n")
            stream.write(f"  trial results: {result.path}\n")
            if result.checkpoint is not None:
                stream.write(f"  checkpoint:    {result.checkpoint.path}\n")
    stream.flush()
    return status


def init_ray(address: str | None, num_cpus: int | None, num_gpus: int | None, verbose: bool,
             preload: Iterable[str] = ()) -> dict[str, str] | None:
    """Joins ``address``, or the cluster of the ``ray job`` we run in (RAY_ADDRESS), and returns None; or starts a
    private local Ray whose workers import ``preload`` (:mod:`rl_speed.ray_start`) before they take work and have the
    env vars Tune gives its trials, and returns the environment its workers inherit (for :func:`run_experiments`)."""
    import ray

    from rl_speed.ray_start import init_local_ray, set_tune_trial_env_vars

    if address or os.environ.get("RAY_ADDRESS"):
        ray.init(address=address, log_to_driver=verbose)
        return None
    worker_environ = set_tune_trial_env_vars()
    # address="local" always starts a new Ray, never attaching to some other `ray start` on this machine.
    init_local_ray(preload, num_cpus=num_cpus, num_gpus=num_gpus, log_to_driver=verbose)
    return worker_environ
