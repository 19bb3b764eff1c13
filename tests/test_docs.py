"""The documents: README.md is a front page (at most 150 lines), every relative link in it and in docs/ reaches a
file, and no document reads as a work log (no headings citing issue numbers, no sessions, no machines lent)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_readme_is_a_front_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_every_relative_link_reaches_a_file():
    broken = [(doc.relative_to(ROOT), target) for doc in DOCUMENTS
              for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text())
              if not target.startswith(("http://", "https://", "mailto:")) and not (doc.parent / target).exists()]
    assert not broken, broken


def test_no_document_reads_as_a_work_log():
    patterns = [r"^#+ .*\bissues? \d+", r"\bsessions?\b(?![-_])", r"\blent\b", r"\bdevice time\b"]
    found = [(doc.relative_to(ROOT), line.strip()[:80]) for doc in DOCUMENTS for line in doc.read_text().splitlines()
             if any(re.search(p, line, re.IGNORECASE) for p in patterns)]
    assert not found, found
