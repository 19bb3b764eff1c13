"""`rl-speed bench` output: the markdown table goes to a file and its measured columns to a bar chart PNG."""

from __future__ import annotations

from PIL import Image

from benchmarks.chart import parse_tables, write_outputs

TABLE = """### x

| env | size | stock | fast | fast / stock |
|---|---|---:|---:|---:|
| CartPole | 64 | 19,411 | 99,267 | 5.1x |
| Snake | 64 | 14,166 | 67,449 | 4.8x |
"""


def test_table_and_bar_chart_are_written(tmp_path):
    (header, rows), = parse_tables(TABLE)
    assert header == ["env", "size", "stock", "fast", "fast / stock"] and len(rows) == 2
    table, chart = write_outputs("ppo", TABLE, tmp_path / "out")
    assert table.read_text().strip() == TABLE.strip()
    with Image.open(chart) as image:
        assert image.size[0] >= 1000


def test_no_chart_without_measured_columns(tmp_path):
    table, chart = write_outputs("ratios", "| a | b |\n|---|---|\n| x | 2.0x |\n", tmp_path)
    assert table.exists() and chart is None
