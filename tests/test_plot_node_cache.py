"""benchmarks/plot_node_cache.py: reads both JSON forms the node-cache results hold and draws them; a folder
without figures is an error, not an empty plot."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from plot_node_cache import draw, rows  # noqa: E402


def test_both_forms_are_read_and_drawn(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps([{"plan": "CI fixture chain", "cold_s": 48.3, "cache_s": 9.0}]))
    (tmp_path / "one.json").write_text(json.dumps({"plan": "flash-attn chain (pip base), more", "cold": {"wall_s": 4574},
                                                   "from_cache": {"wall_s": 73}}))
    assert rows(tmp_path) == [("CI fixture chain", 48.3, 9.0), ("flash-attn chain", 4574.0, 73.0)]
    png = draw(tmp_path)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_a_folder_without_figures_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no \\*.json figures"):
        rows(tmp_path)
    (tmp_path / "other.json").write_text(json.dumps({"unrelated": 1}))
    assert rows(tmp_path) == []
    with pytest.raises(FileNotFoundError, match="no cold/from-cache pair"):
        draw(tmp_path)
    assert not (tmp_path / "node-cache.png").exists()
