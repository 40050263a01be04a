"""Draw the node cache's figures: per plan, the cold build against the build from the registry node cache
(seconds, log scale), with the ratio written beside each pair.

Reads ``results/node-cache/*.json``: the rows ``benchmarks/cold_builder.py --json`` writes (a list of
``{"plan", "cold_s", "cache_s", ...}``) and single-run summaries (a dict with ``"plan"``, ``"cold": {"wall_s"}``
and ``"from_cache": {"wall_s"}``). Writes ``node-cache.png`` beside them.

Usage: ``python benchmarks/plot_node_cache.py [FOLDER]`` (default ``results/node-cache``). Raises
FileNotFoundError for a folder without JSON, or whose JSON holds no pair.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(folder: Path) -> list[tuple[str, float, float]]:
    """``(label, cold seconds, from-cache seconds)`` for every figure pair in the folder's JSON files."""
    out = []
    files = sorted(folder.glob("*.json"))
    if not files:
        raise FileNotFoundError(f"{folder}: no *.json figures to draw")
    for f in files:
        data = json.loads(f.read_text())
        for r in data if isinstance(data, list) else [data]:
            if "cold_s" in r:
                out.append((r["plan"], float(r["cold_s"]), float(r["cache_s"])))
            elif "cold" in r and "from_cache" in r:
                out.append((r["plan"].split(",")[0].split(" (")[0], float(r["cold"]["wall_s"]),
                            float(r["from_cache"]["wall_s"])))
    return out


def draw(folder: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = rows(folder)
    if not data:
        raise FileNotFoundError(f"{folder}: its JSON files hold no cold/from-cache pair to draw")
    fig, ax = plt.subplots(figsize=(9, 1.2 + 0.9 * len(data)))
    for i, (label, cold, cache) in enumerate(data):
        y = len(data) - 1 - i
        ax.barh(y + 0.18, cold, height=0.34, color="#b04a3a", label="cold build" if i == 0 else None)
        ax.barh(y - 0.18, cache, height=0.34, color="#3a7ab0", label="from the node cache" if i == 0 else None)
        ax.text(cold * 1.08, y + 0.18, f"{cold:,.0f} s", va="center", fontsize=8)
        ax.text(cache * 1.08, y - 0.18, f"{cache:,.1f} s  ({cold / cache:,.1f}x)", va="center", fontsize=8)
    ax.set_yticks(range(len(data)), [d[0] for d in reversed(data)], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("wall time, seconds (log scale)")
    ax.set_title("Cold build vs an emptied engine served by the registry node cache (2-core builder)", fontsize=9)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    out = folder / "node-cache.png"
    fig.savefig(out, dpi=120)
    return out


if __name__ == "__main__":
    print(draw(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "results" / "node-cache"))
