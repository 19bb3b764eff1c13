"""``rl-speed plot RESULTS_DIR``: one PNG comparing runs: mean return and env steps/s against env steps and wall time.

Reads every Tune trial (``result.json``, else ``progress.csv``) under the directory, so stock-vs-fast runs kept side by side in one storage
path compare at a glance: one line per run, labelled ``experiment/trial``.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

RETURN = "env_runners/episode_return_mean"
STEPS = "env_runners/num_env_steps_sampled_lifetime"
TIME = "time_total_s"


class PlotError(ValueError):
    """Nothing to plot at the given path; the message says what was expected."""


def _number(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _flat(result: dict, key: str) -> float:
    value: Any = result
    for part in key.split("/"):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) else math.nan


def _trial_rows(trial: Path) -> list[dict[str, float]]:
    """Tune's ``result.json`` (one JSON result per line) if present, else ``progress.csv``. result.json first: after a
    resumed run Tune appends to progress.csv under the first run's header although its key order differs."""
    if (trial / "result.json").exists():
        rows = []
        for line in open(trial / "result.json"):
            if line.strip():
                result = json.loads(line)
                rows.append({k: _flat(result, k) for k in (RETURN, STEPS, TIME)})
        return rows
    with open(trial / "progress.csv", newline="") as f:
        return [{k: _number(row.get(k)) for k in (RETURN, STEPS, TIME)} for row in csv.DictReader(f)]


def read_runs(results: Path) -> dict[str, list[dict[str, float]]]:
    """``{label: rows}`` for every trial directory under ``results`` with results."""
    runs = {}
    trials = {p.parent for p in [*results.rglob("progress.csv"), *results.rglob("result.json")]}
    for trial in sorted(trials):
        rows = _trial_rows(trial)
        if rows:
            label = trial.name if trial == results else str(trial.relative_to(results))
            runs[label if len(label) <= 60 else label[:28] + "..." + label[-29:]] = rows
    return runs


def plot_results(results: str | Path, output: str | Path | None = None) -> Path:
    """Writes the PNG and returns its path."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    results = Path(results).expanduser()
    if not results.is_dir():
        raise PlotError(f"rl-speed plot: {results} is not a directory. Fix: pass a Tune results directory "
                        "(the --storage-path of `rl-speed train`, or one experiment in it).")
    runs = read_runs(results)
    if not runs:
        raise PlotError(f"rl-speed plot: no result.json / progress.csv under {results}. Fix: pass the directory `rl-speed train` "
                        "wrote (its readout prints `Results: ...`).")
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for label, rows in runs.items():
        steps = [r[STEPS] for r in rows]
        seconds = [r[TIME] for r in rows]
        returns = [r[RETURN] for r in rows]
        rates = [(s1 - s0) / (t1 - t0) if t1 > t0 else math.nan
                 for (s0, t0), (s1, t1) in zip(zip([0.0] + steps, [0.0] + seconds), zip(steps, seconds))]
        axes[0].plot(steps, returns, label=label)
        axes[1].plot(seconds, returns, label=label)
        axes[2].plot(steps, rates, label=label)
    for ax, (x, y) in zip(axes, [("env steps", "mean episode return"), ("wall time (s)", "mean episode return"),
                                 ("env steps", "env steps / s")]):
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"rl_speed runs under {results}")
    fig.tight_layout()
    output = Path(output) if output else results / "rl_speed_plot.png"
    fig.savefig(output, dpi=100)
    plt.close(fig)
    return output
