"""Do env runners always start? Builds an algorithm from a preset again and again, each time counting the remote
env runners that came up healthy, then stops it: ``builds`` x ``num_env_runners`` runner starts.

Why: once, one runner in 90 failed to start on a GPU host (a half-imported ``rl_speed_envs`` in a Ray worker), and
RLlib's default ``restart_failed_env_runners`` then trains on without it. Run: ``rl-speed bench runner-starts
--device cuda --repeats 8`` (repeats = builds), on the box the preset is for.

Ray starts as ``rl-speed train`` starts it: its workers import the experiment's algorithm and runner modules as they
start (:func:`rl_speed.ray_start.preload_modules`), so the starts tested are the ones users get. Under a caller's
Ray (a test session's) the bench uses that Ray as it is.
"""

from __future__ import annotations

import time

from benchmarks import TUNED_EXAMPLES
from benchmarks.common import local_ray, machine, usable_cpus


def run(repeats: int = 8, device: str = "cpu", preset: str = "atari_ppo_gpu.yaml") -> str:
    import rl_speed
    from rl_speed.experiments import load_experiments
    from rl_speed.ray_start import preload_modules

    rl_speed.register()
    experiment = load_experiments(TUNED_EXAMPLES / preset)[0]
    config = experiment.config
    if device != "cuda":
        config = config.copy(copy_frozen=False)
        config.env_runners(num_env_runners=max(1, usable_cpus() - 1), num_gpus_per_env_runner=0)
        config.learners(num_gpus_per_learner=0).training(cuda_graph=False, cuda_graph_env_runners=False)
    wanted = config.num_env_runners
    started, seconds = [], []
    preload = tuple(preload_modules([(experiment.algo_class, config)]))
    with local_ray(num_cpus=usable_cpus(), num_gpus=1 if device == "cuda" else 0, preload=preload) as own_ray:
        for _ in range(repeats):
            begin = time.monotonic()
            algo = config.build_algo()
            try:
                started.append(algo.env_runner_group.num_healthy_remote_env_runners())
            finally:
                algo.stop()
            seconds.append(time.monotonic() - begin)
    failed = sum(wanted - s for s in started)
    return "\n".join([
        "### Env runner starts", "",
        f"Command: `rl-speed bench runner-starts --repeats {repeats}{' --device cuda' if device == 'cuda' else ''}`"
        f" · machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · `{preset}`'s first experiment, "
        f"{wanted} remote runners per build; "
        + (f"Ray's workers preload {', '.join(f'`{m}`' for m in preload)} (as `rl-speed train` starts Ray)."
           if own_ray else "the caller's Ray, nothing preloaded."), "",
        "| builds | runner starts | failed to start | seconds per build (median) |", "|---:|---:|---:|---:|",
        f"| {repeats} | {repeats * wanted} | {failed} | {sorted(seconds)[len(seconds) // 2]:.1f} |",
    ])
