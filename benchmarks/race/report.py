"""The race's report: markdown tables per task and the running-mean charts."""

from __future__ import annotations

import math
import statistics

import numpy as np

from benchmarks.race.contenders import Task
from benchmarks.race.judge import best_mean, reached
from benchmarks.race.stats import _all_seeds_median, _summary, permutation_p


def _steps_table(first_column: str, steps: dict[str, list[float]]) -> list[str]:
    """An ablation's markdown table: env steps to the target per seed (sorted) and their median, one row per setting."""
    return [f"| {first_column} | env steps per seed (sorted) | median |", "|---|---|---:|",
            *[f"| {name} | {' · '.join(f'{x:,.0f}' for x in sorted(v))} | {statistics.median(v):,.0f} |"
              for name, v in steps.items()]]


def race_chart(task: Task, family: str, results: dict[str, list], directory: str) -> str:
    """PNG of the judge's running mean of the task's window of returns against wall-clock seconds, one line per
    contender and seed (one colour per contender), the target dashed; returns its path."""
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, (contender, logs) in enumerate(results.items()):
        for i, log in enumerate(logs):
            if len(log) < task.window:
                continue
            times = [t for t, _, _ in log][task.window - 1:]
            means = np.convolve([r for _, _, r in log], np.ones(task.window) / task.window, mode="valid")
            ax.plot(times, means, color=f"C{k}", alpha=0.8, linewidth=1.2, label=contender if i == 0 else None)
    ax.axhline(task.target, color="black", linestyle="--", linewidth=1, label=f"target {task.target:g}")
    ax.set_xlabel("wall-clock seconds since start")
    ax.set_ylabel(f"mean return of the last {task.window} episodes")
    ax.set_title(f"{task.env_id} ({family.upper()})")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(directory) / f"race-{task.env_id.replace('/', '_')}-{family}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def task_section(task: Task, results: dict[str, list], family: str = "ppo") -> str:
    """The markdown table of one task: per contender, wall-clock and env steps to the target, and the best mean."""
    rows = []
    steps_to_target: dict[str, list[float]] = {}
    for contender, logs in results.items():
        if not logs:
            rows.append(f"| {contender} | not run (extra not installed) | | | |")
            continue
        hits = [reached(log, task.target, task.window) for log in logs]
        ok = [h for h in hits if h is not None]
        steps_to_target[contender] = [float(s) for _, s in ok]
        means = [m for m in (best_mean(log, task.window) for log in logs) if m > float("-inf")]
        best = (_summary(means, ".2f") if means else "") + (  # a seed with fewer episodes than the window has none
            f" ({len(logs) - len(means)} of {len(logs)} with fewer than {task.window} episodes)"
            if len(means) < len(logs) else "")
        if ok:
            hit_times = [t for t, _ in ok]
            times = _summary(hit_times, '.1f') + " s" + _all_seeds_median(hit_times, len(logs))
            rows.append(f"| {contender} | {times} | "
                        f"{_summary([s for _, s in ok], ',.0f')} | {len(ok)}/{len(logs)} | {best} |")
        else:
            rows.append(f"| {contender} | not reached | | 0/{len(logs)} | {best} |")
    lines = [f"#### {task.env_id} ({family.upper()}): target {task.target:g}, at most {task.max_steps:,} env steps", "",
             f"| contender | wall-clock to target | env steps to target | reached | best last-{task.window} mean |",
             "|---|---:|---:|---:|---:|", *rows]
    fast, stock, source = (("FastDQN", "DQN", "zoo") if family == "dqn" else ("FastPPO", "PPO", task.source))
    a, b = steps_to_target.get(f"{fast} ({source})", []), steps_to_target.get(f"{stock} ({source})", [])
    if len(a) >= 2 and len(b) >= 2:
        p = permutation_p([math.log(x) for x in a], [math.log(x) for x in b])
        lines += ["", f"Equivalence at identical hyperparameters ({fast} vs {stock}, {source}): median env steps "
                      f"{statistics.median(a):,.0f} vs {statistics.median(b):,.0f}, ratio "
                      f"{statistics.median(a) / statistics.median(b):.2f}; exact two-sided permutation test on "
                      f"mean log(env steps): p = {p:.3f} ({len(a)} vs {len(b)} seeds)."]
    return "\n".join(lines)
