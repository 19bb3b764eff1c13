"""bench.frame_norm: every row standardizes the frames the same (the rows differ only in layout and passes), and the
bench's table names each row."""

from __future__ import annotations

import pytest
import torch

from benchmarks.throughput import frame_norm
from rl_speed.modules.layers import RunningNorm


def test_the_three_standardizations_agree_and_only_the_layout_differs():
    norm = RunningNorm((4, 6, 5))
    norm.update(torch.rand(64, 4, 6, 5) * 3 + 1)
    frames = torch.rand(8, 6, 5, 4).permute(0, 3, 1, 2)  # channels-last, as the preprocessed Atari frames
    outputs = {row: frame_norm.standardize(row, norm)(frames.clone()) for row in frame_norm.ROWS[1:]}
    reference = outputs["in the frames' layout"]
    for row, out in outputs.items():
        torch.testing.assert_close(out, reference, msg=row)
    assert reference.stride() == frames.stride()
    assert outputs["addcmul's contiguous output"].is_contiguous()  # what made the conv's input NCHW
    assert frame_norm.standardize("no normalize_obs", norm) is None
    with pytest.raises(ValueError, match="unknown row 'fused'"):
        frame_norm.standardize("fused", norm)


def test_the_table_has_every_row_on_the_cpu():
    table = frame_norm.run(repeats=1, device="cpu")
    for row in frame_norm.ROWS:
        assert f"| {row} |" in table
