"""engine/bench/heatmap.py: a PNG from labels and a matrix with gaps; shapes checked."""

import pytest

from kvloop.engine.bench.heatmap import write_heatmap


def test_writes_a_png_with_missing_cells(tmp_path):
    out = tmp_path / "sub" / "ratio.png"
    values = [[1.2, None, 0.8], [1.0, 1.0, float("nan")]]
    ok = write_heatmap(out, ["W1", "W2"], ["0.5x", "1x", "1.5x"], values,
                       "codesign / continuous+lru goodput", fmt="{:.2f}", center=1.0)
    assert ok and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_all_equal_or_all_missing_still_draws(tmp_path):
    assert write_heatmap(tmp_path / "a.png", ["r"], ["c"], [[1.0]], "t")
    assert write_heatmap(tmp_path / "b.png", ["r"], ["c"], [[None]], "t", center=0.0)


def test_shape_mismatch_is_refused(tmp_path):
    with pytest.raises(ValueError):
        write_heatmap(tmp_path / "x.png", ["r1", "r2"], ["c"], [[1.0]], "t")
