"""Where the start of FastPPO's Pong preset goes, from process start to the end of its first iteration.

A race run's clock starts with its process, and about 30 s pass before the first iteration ends (2026-12-02's runs):
this bench splits them. Each (variant, repeat) is a fresh process, as a race run is: its imports, Ray's start, the
algorithm's build and its first ``train()``. Its env runners (``timed_runner.TimedEnvRunner``, the preset's runner
noting when things happen) say when their worker process started, when their ``__init__`` began (the actor's imports
done), when their envs and their module (on a runner with a GPU share: its CUDA context) were built and when they
were ready; the driver's build ends after the last runner is ready with the spaces' probe, the learner's build and
the first weight sync. Every time is seconds since the process started, on the host's monotonic clock. A variant
may start Ray while another thread imports RLlib and torch (the two are serial otherwise; the thread here also notes
when the imports are done, which :func:`rl_speed.ray_start.init_local_ray`'s ``import_beside`` does not) and have
Ray's workers import the runner's modules as they start (:mod:`rl_speed.ray_start`) (:class:`Variant`).
Run: ``rl-speed bench atari-startup --device cuda --repeats 3`` (the [atari] extra); ``--device cpu`` builds the
preset shrunk to this machine (a check, not a figure).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from benchmarks import ROOT
from benchmarks.common import build_with_every_runner, check_cuda, local_ray, machine, usable_cpus
from benchmarks.race.judge import process_start


@dataclass(frozen=True)
class Variant:
    """Config keys over the preset's, and whether Ray starts in this thread while another imports RLlib, torch and
    rl_speed (``ray.init`` itself must stay in the main thread: started from another one, it lost its GCS)."""

    changes: dict = field(default_factory=dict)
    ray_beside_imports: bool = False
    preload: bool = False  # Ray's prestarted workers import the runner's modules before an actor is placed on them
    #: the learner's imports (:data:`rl_speed.ray_start.LEARNER_IMPORTS`) in another thread while the runners start,
    #: as FastPPO does for a local learner on a GPU; off: imported by the learner's build, after the last runner
    learner_imports_beside: bool = False


#: The preset, then one cut of its start after another: Ray's prestarted workers importing the runners' modules
#: before the runners are placed on them (the race's start and `rl-speed train`'s since 2026-12-02); then Ray also
#: started beside the driver's imports (the race's since 2026-12-05, :func:`rl_speed.ray_start.init_local_ray`'s
#: ``import_beside``). Measured before, on 2026-12-02/03 (other rows): Ray beside the imports without the preload,
#: 1.6 s and 2.7 s earlier; the runners' first reset at their first sample instead of prefetched, 1.6 s later; the
#: driver's CUDA context created beside Ray's start, no gain (those variants are in git's history before 2026-12-05).
CPU_VARIANTS = {"preset": Variant(), "the runners' modules preloaded": Variant(preload=True),
                "and Ray started beside the imports": Variant(ray_beside_imports=True, preload=True)}
#: On a GPU also FastPPO's learner imports beside its runners' start (since 2026-12-05; the rows above without it).
#: On the CPU it changes nothing: FastPPO starts them only for a learner on a GPU.
CUDA_VARIANTS = {**CPU_VARIANTS, "and the learner's imports beside the runners' start": Variant(
    ray_beside_imports=True, preload=True, learner_imports_beside=True)}
#: What a runner imports (its class's module, the env's), for Ray's prestarted workers to import in advance.
RUNNER_MODULES = ("benchmarks.scaling.timed_runner", "rl_speed_envs.atari")
#: A runner's moments, in the order they happen.
RUNNER_MOMENTS = ("process", "init", "env", "module", "ready")


def heavy_imports() -> None:
    """What the driver imports before it builds anything: RLlib, torch, ale-py's env and rl_speed (seconds)."""
    import benchmarks.scaling.timed_runner  # noqa: F401  (RLlib's env runner, torch, rl_speed's runner)
    import benchmarks.throughput.atari  # noqa: F401  (the presets)


def one_start(variant: Variant, device: str) -> dict:
    """In a fresh process: the preset with ``variant`` started through its first iteration. The driver's moments
    and each runner's, as seconds since this process started."""
    start = process_start()
    driver: dict[str, float] = {}
    if not variant.learner_imports_beside:
        import rl_speed.ray_start

        rl_speed.ray_start.LEARNER_IMPORTS = ()  # the learner's build imports them, after the last runner

    def imports() -> None:
        heavy_imports()
        driver["imported"] = time.monotonic() - start

    beside = threading.Thread(target=imports) if variant.ray_beside_imports else None
    if beside is not None:
        beside.start()
    else:
        imports()
    preload = RUNNER_MODULES if variant.preload else ()
    # (a test's Ray, if one is up, is used as it is: then nothing is preloaded)
    with local_ray(num_cpus=usable_cpus(), num_gpus=1 if device == "cuda" else 0, preload=preload):
        driver["ray_up"] = time.monotonic() - start
        if beside is not None:
            beside.join()
        import rl_speed
        from benchmarks.scaling.timed_runner import TimedEnvRunner
        from benchmarks.throughput.atari import preset
        from rl_speed.algorithms.config import update_config

        rl_speed.register()
        _, config = preset("PPO", device=device)
        config.debugging(seed=0)  # seeded as the race's runs (a seeded ale-py reset reloads each emulator's ROM)
        config.env_runners(env_runner_cls=TimedEnvRunner)
        update_config(config, variant.changes)
        algo = build_with_every_runner(config)
        driver["built"] = time.monotonic() - start
        runners = algo.env_runner_group.foreach_env_runner(lambda r: r.startup, local_env_runner=False)
        algo.train()
        driver["first_iteration"] = time.monotonic() - start
        algo.stop()
    return {"driver": driver, "runners": [{k: r[k] - start for k in RUNNER_MOMENTS} for r in runners]}


def measure(variants: dict[str, Variant], repeats: int, device: str) -> dict[str, list[dict]]:
    """Every variant ``repeats`` times, variants alternating, each start in its own process."""
    out: dict[str, list[dict]] = {name: [] for name in variants}
    for _ in range(repeats):
        for name, variant in variants.items():
            command = [sys.executable, "-m", "benchmarks.scaling.atari_startup", json.dumps(asdict(variant)), device]
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"atari-startup: the {name!r} start failed (rc {done.returncode}):\n"
                                   f"{done.stderr[-3000:]}")
            out[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


def phases(start: dict) -> dict[str, float]:
    """One start's moments (seconds since process start): the driver's, the runners' as the median runner's, and
    when the last runner was ready (the build waits for every runner)."""
    runners = start["runners"]
    row = {"imported": start["driver"]["imported"], "ray_up": start["driver"]["ray_up"]}
    for moment in RUNNER_MOMENTS:
        row[f"runner_{moment}_median"] = statistics.median(r[moment] for r in runners)
    row["runner_ready_last"] = max(r["ready"] for r in runners)
    row["built"] = start["driver"]["built"]
    row["first_iteration"] = start["driver"]["first_iteration"]
    return row


COLUMNS = {"imported": "imports done", "ray_up": "Ray up", "runner_process_median": "runner process started",
           "runner_init_median": "runner imports done", "runner_env_median": "envs built",
           "runner_module_median": "module built", "runner_ready_median": "runner ready",
           "runner_ready_last": "last runner ready", "built": "algorithm built",
           "first_iteration": "first iteration done"}


def run(repeats: int = 3, device: str = "cpu") -> str:
    check_cuda("atari-startup", device, "check the bench on the CPU (the preset shrunk to this machine)")
    variants = CUDA_VARIANTS if device == "cuda" else CPU_VARIANTS
    out = measure(variants, repeats, device)
    rows, each = [], []
    for name, starts in out.items():
        table = [phases(s) for s in starts]
        cells = [f"{statistics.median(t[key] for t in table):.1f}" for key in COLUMNS]
        rows.append(f"| {name} | {len(starts[0]['runners'])} | " + " | ".join(cells) + " |")
        each += [f"| {name} | {i} | " + " | ".join(f"{t[key]:.1f}" for key in COLUMNS) + " |"
                 for i, t in enumerate(table, 1)]
    return "\n".join([
        "### FastPPO's Pong preset: where its start goes (seconds since process start)", "",
        f"Command: `rl-speed bench atari-startup --repeats {repeats}{' --device cuda' if device == 'cuda' else ''}` · "
        f"machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · `atari_ppo_gpu.yaml`'s Pong experiment"
        f"{'' if device == 'cuda' else ' shrunk to this CPU (a check)'}; each start a fresh process, variants "
        f"alternating, median of {repeats} starts per cell; a runner's moments are the median runner's, except "
        "'last runner ready'.", "",
        "| variant | runners | " + " | ".join(COLUMNS.values()) + " |",
        "|---|---:|" + "---:|" * len(COLUMNS), *rows, "",
        "Each start (the medians above are over these):", "",
        "| variant | start | " + " | ".join(COLUMNS.values()) + " |",
        "|---|---:|" + "---:|" * len(COLUMNS), *each,
    ])


if __name__ == "__main__":  # one start, in this fresh process (measure() runs it): its moments as JSON
    print(json.dumps(one_start(Variant(**json.loads(sys.argv[1])), sys.argv[2])))
