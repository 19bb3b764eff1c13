"""How long ``rl-speed train`` takes from its launch to its first iteration's progress line, with the local Ray's
workers importing the experiment's algorithm and env-runner modules in advance (the default, :mod:`rl_speed.ray_start`)
and without (``--no-preload``); with Tune's runtime env kept on the trial (its actor and runners then start fresh
processes; :func:`rl_speed.ray_start.tune_trials_on_prestarted_workers` drops it by default); and beside them the same
experiment without Tune (the race's path).

Each start is a fresh ``rl-speed train FILE --experiment NAME --stop '{"training_iteration": 1}'`` process, the
variants alternating; the figure is the wall clock from launching it to the line of iteration 1 (Python's start, the
experiment's validation, Ray's start, Tune's trial actor and its env runners, the first iteration). The variant
"without Tune" is a fresh process that does what ``rl-speed train`` does up to Tune (the same validation, the same
local Ray with its modules preloaded) and then builds the algorithm in its own process and trains one iteration, as
the Atari race's contenders do (:func:`direct_start`): what it saves is what Tune's trial actor costs. Run:
``rl-speed bench cli-start --repeats 3`` (the CPU Atari Pong preset, the [atari] extra); ``--device cuda`` the GPU
preset on a GPU box; ``--config '{"num_env_runners": 1}'`` over the preset's config (the CPU preset samples in the
trial's own process: Ray's first worker takes the trial as it would without preloading, so only remote runners can
gain).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import ROOT, TUNED_EXAMPLES
from benchmarks.common import check_cuda, machine

#: device -> (experiment file, experiment)
PRESETS = {"cpu": ("atari_ppo.yaml", "pong-fastppo"), "cuda": ("atari_ppo_gpu.yaml", "pong-fastppo-gpu")}
#: variant -> (the ``rl-speed train`` flags it adds, or None: the experiment without Tune (:func:`direct_start`);
#: env vars set for it). ``PL_DISABLE_FORK=0`` differs from the value Tune gives its trials, so Tune's runtime env
#: stays and the trial and its runners start fresh processes, as before rl_speed.ray_start.tune_trials_on_prestarted_workers.
VARIANTS = {"modules preloaded (default)": ([], {}), "--no-preload": (["--no-preload"], {}),
            "Tune's runtime env kept (PL_DISABLE_FORK=0)": ([], {"PL_DISABLE_FORK": "0"}),
            "without Tune (the race's path)": (None, {})}
#: the row the others are compared with
BASE = "Tune's runtime env kept (PL_DISABLE_FORK=0)"


def one_start(device: str, flags: list[str] | None, overrides: dict | None = None,
              env_vars: dict[str, str] | None = None) -> float:
    """Seconds from launching ``rl-speed train`` (with ``flags``; None: :func:`direct_start` instead; ``env_vars`` set
    in its environment) to its progress line for iteration 1."""
    file, experiment = PRESETS[device]
    with tempfile.TemporaryDirectory(prefix="cli_start_") as storage:
        if flags is None:
            command = [sys.executable, "-c", "import sys; from benchmarks.scaling.cli_start import direct_start; "
                       "direct_start(*sys.argv[1:])", str(TUNED_EXAMPLES / file), experiment,
                       json.dumps(overrides or {})]
        else:
            command = [sys.executable, "-c", "import sys; from rl_speed.cli.main import main; sys.exit(main())",
                       "train", str(TUNED_EXAMPLES / file), "--experiment", experiment, "--stop",
                       '{"training_iteration": 1}', "--storage-path", storage, *flags,
                       *(["--config", json.dumps(overrides)] if overrides else [])]
        start = time.monotonic()
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, **(env_vars or {})})
        first, lines = None, []
        for line in proc.stdout:
            lines.append(line)
            if first is None and line.startswith(f"{experiment} | iter 1 "):
                first = time.monotonic() - start
        if proc.wait() or first is None:
            shown = command[3:] if flags is not None else ["direct_start", *command[3:]]  # without `python -c CODE`
            raise RuntimeError(f"cli-start: `{' '.join(shown)}` failed (rc {proc.returncode}) or printed no "
                               f"line for iteration 1:\n{''.join(lines[-40:])}")
    return first


def direct_start(file: str, experiment: str, overrides: str) -> None:
    """The variant without Tune, in a fresh process: ``rl-speed train``'s validation and local Ray (the same
    preloaded modules; Ray counts the CPUs and GPUs, as for ``rl-speed train`` without ``--num-cpus``), then the
    experiment's algorithm built here and one iteration, ending with a line as ``rl-speed train``'s first progress
    line begins."""
    from pathlib import Path

    import ray

    import rl_speed
    from rl_speed.experiments import load_experiments
    from rl_speed.ray_start import init_local_ray, preload_modules

    rl_speed.register()
    (exp,) = load_experiments(Path(file), config_override=json.loads(overrides), only=[experiment])
    init_local_ray(preload_modules([(exp.algo_class, exp.config)]), log_to_driver=False)
    try:
        algo = exp.config.build_algo()
        algo.train()
        print(f"{experiment} | iter 1 (without Tune)", flush=True)
        algo.stop()
    finally:
        ray.shutdown()


def run(repeats: int = 3, device: str = "cpu", overrides: dict | None = None) -> str:
    check_cuda("cli-start", device, "time the CPU preset")
    seconds: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name, (flags, env_vars) in VARIANTS.items():
            seconds[name].append(one_start(device, flags, overrides, env_vars))
    file, experiment = PRESETS[device]
    base = statistics.median(seconds[BASE])
    rows = [f"| {name} | {statistics.median(s):.1f} | {base / statistics.median(s):.2f}x | "
            + ", ".join(f"{x:.1f}" for x in s) + " |" for name, s in seconds.items()]
    return "\n".join([
        "### `rl-speed train`: seconds from launch to the first iteration's progress line", "",
        f"Command: `rl-speed bench cli-start --repeats {repeats}{' --device cuda' if device == 'cuda' else ''}"
        f"{f' --config {json.dumps(overrides)!r}' if overrides else ''}` · "
        f"machine: {machine()} · date: {time.strftime('%Y-%m-%d')} · `{file}`'s `{experiment}`, stopped after one "
        "iteration; each start a fresh process, the variants alternating.", "",
        f"| variant | median (s) | speed-up vs {BASE.split(' (')[0]} | each start (s) |", "|---|---:|---:|---|", *rows,
    ])
