"""Results as data: what a benchmark run writes (:func:`write_result`), and the results page built from the
committed files (:func:`render_page`, ``python -m benchmarks.results`` writes ``docs/results.md``).

``results/NAME/result.json``: the run's tables (header and rows, as printed), the command, the machine, the date
and the commit. ``results/claims.yaml``: one entry per claim the documents make (claim, figure, baseline, machine,
date, command, study: the docs page that tells the story). A claim whose ``source`` names a ``result.json`` (and
``row`` / ``column`` in its first table, or ``table`` for another) takes its figure from that file, so the page
cannot drift from the data; the others carry the figure as recorded by the study on its date.
"""

from __future__ import annotations

import datetime
import json
import subprocess
from pathlib import Path
from typing import Any

from benchmarks import ROOT
from benchmarks.chart import parse_tables, write_outputs
from benchmarks.common import machine

CLAIMS = ROOT / "results" / "claims.yaml"
PAGE = ROOT / "docs" / "results.md"


def _commit() -> str:
    """The checkout's commit, with ``+dirty`` where its tracked files other than results and documents differ from
    it (the code measured is then not exactly that commit's; a result rewritten by this very run does not count)."""
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        return "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!results", ":!docs"],
                           capture_output=True, text=True, cwd=ROOT).stdout.strip()
    return proc.stdout.strip() + ("+dirty" if dirty else "")


def write_result(name: str, markdown: str, directory: str | Path, command: str) -> list[Path]:
    """``DIR/NAME.md`` (the markdown), ``DIR/NAME.png`` (its measured columns, if any) and ``DIR/result.json``."""
    commit = _commit()  # before this run's files change the tree
    table, chart = write_outputs(name, markdown, directory)
    data = {"benchmark": name, "command": command, "machine": machine(),
            "date": datetime.date.today().isoformat(), "commit": commit,
            "tables": [{"header": header, "rows": rows} for header, rows in parse_tables(markdown)]}
    path = Path(directory) / "result.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return [p for p in (table, chart, path) if p is not None]


def figure_from(claim: dict) -> str:
    """A claim's figure: read from its ``source`` result.json (row label in the first column, column by header),
    or the recorded ``figure``."""
    if "source" not in claim:
        return str(claim["figure"])
    data = json.loads((ROOT / claim["source"]).read_text())
    table = data["tables"][claim.get("table", 0)]
    column = table["header"].index(claim["column"])
    for row in table["rows"]:
        if row[0] == claim["row"]:
            return row[column]
    raise KeyError(f"{claim['source']}: no row {claim['row']!r} in table {claim.get('table', 0)}")


def render_page(claims: list[dict[str, Any]]) -> str:
    lines = ["# Results", "",
             "Generated from `results/claims.yaml` and the `result.json` files it names "
             "(`python -m benchmarks.results`); one row per claim. Each study page tells the question, today's "
             "answer, the command, and its dated history.", "",
             "| claim | figure | baseline | machine | date | command | study |", "|---|---|---|---|---|---|---|"]
    for claim in claims:
        cells = [claim["claim"], figure_from(claim), claim.get("baseline", ""), claim["machine"], str(claim["date"]),
                 f"`{claim['command']}`", f"[{claim['study']}]({claim['study']})"]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def load_claims(path: Path = CLAIMS) -> list[dict[str, Any]]:
    import yaml

    return yaml.safe_load(path.read_text())


def main() -> None:
    PAGE.write_text(render_page(load_claims()))
    print(f"written: {PAGE}")


if __name__ == "__main__":
    main()
