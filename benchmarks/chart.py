"""Writes a benchmark's markdown table to a file and draws its measured columns as a grouped bar chart (PNG)."""

from __future__ import annotations

import math
from pathlib import Path


def _number(cell: str) -> float | None:
    text = cell.strip().replace(",", "")
    if not text or text.endswith(("x", "%")):  # ratios and shares are derived, not measured
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_tables(markdown: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every ``| a | b |`` table in ``markdown`` as (header, rows)."""
    tables, current = [], []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            current.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif current:
            if len(current) > 2:
                tables.append((current[0], current[2:]))  # skip the |---| separator
            current = []
    return tables


def write_outputs(name: str, markdown: str, directory: str | Path) -> tuple[Path, Path | None]:
    """``DIR/NAME.md`` and, when a table has measured numeric columns, ``DIR/NAME.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    table_path = directory / f"{name}.md"
    table_path.write_text(markdown + "\n")
    tables = parse_tables(markdown)
    charts = []
    for header, rows in tables:
        columns = [i for i in range(len(header)) if any(_number(r[i]) is not None for r in rows if i < len(r))]
        labels = [" / ".join(r[i] for i in range(len(header)) if i not in columns and i < len(r))[:48] for r in rows]
        if columns and rows:
            charts.append((header, rows, columns, labels))
    if not charts:
        return table_path, None
    fig, axes = plt.subplots(len(charts), 1, figsize=(12, 4 * len(charts)), squeeze=False)
    for ax, (header, rows, columns, labels) in zip(axes[:, 0], charts):
        width = 0.8 / len(columns)
        for k, i in enumerate(columns):
            values = [_number(r[i]) if i < len(r) else None for r in rows]
            ax.bar([j + k * width for j in range(len(rows))], [v if v is not None else math.nan for v in values],
                   width=width, label=header[i])
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
        ax.set_xticklabels(labels, rotation=20, ha="right", fontsize=7)
        ax.set_yscale("log")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    fig.suptitle(f"rl-speed bench {name}")
    fig.tight_layout()
    chart_path = directory / f"{name}.png"
    fig.savefig(chart_path, dpi=100)
    plt.close(fig)
    return table_path, chart_path
