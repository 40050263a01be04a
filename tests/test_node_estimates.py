"""Estimates for every node (issue: six of eight nodes said "no estimate" on a fresh checkout although measured
times were on record; FlashInfer's AOT node was estimated 14 min 58 s and built in 5 min 23 s). The dry run's
bases, in order: a past build at the node's hash, the unit-cost estimate (source and aot nodes), a measured
build of the node kept as data (cudastack/node_times.yaml, with what, where and when); each line names its basis.
No Docker: the plan is rendered as a fresh checkout's dry run sees it (every node to build, no records)."""
from __future__ import annotations

import json

import pytest

from cudastack.core.errors import StackError
from cudastack.plan import cache_estimates as E
from cudastack.plan.planner import make_plan
from cudastack.plan.render import render_plan
from cudastack.plan.rules import Resources

RES = Resources(2, 24.0, "test: 2 cores, 24 GiB")     # the builder the measurements come from


def _expect_lines(plan, state, basis) -> dict:
    text = render_plan(plan, {n.name: False for n in plan.nodes}, state_dir=str(state), basis=basis)
    out = {}
    for block in text.split("\n[")[1:]:
        name = block.split("]", 1)[1].split()[0]
        out[name] = next((ln.strip() for ln in block.splitlines() if ln.strip().startswith("expect  build:")), "")
    return out


def test_a_fresh_checkout_has_an_estimate_for_every_13_1_node_each_with_its_basis(tmp_path):
    plan = make_plan(None, "13.1", resources=RES)
    lines = _expect_lines(plan, tmp_path, E.Basis(E.read_history(tmp_path / "records"),
                                                  measured=E.measured_times("13.1")))
    assert set(lines) == {n.name for n in plan.nodes} and len(lines) == 8, lines
    for name, line in lines.items():
        assert line.startswith("expect  build: about "), (name, line)
        assert "no estimate" not in line, (name, line)
        assert "cudastack/node_times.yaml" in line or "cudastack/unit_costs.yaml" in line, (name, line)
    assert "a measured build of this node, not of this hash" in lines["torch"]
    assert "the unit-cost estimate" in lines["flash-attn"]
    # the failing twin: without the measured times (as before) the wheel and image nodes have no basis
    bare = _expect_lines(plan, tmp_path, E.Basis(E.read_history(tmp_path / "records")))
    assert sum("no estimate" in ln for ln in bare.values()) == 6, bare


def test_a_past_build_at_the_hash_wins_over_the_measured_time(tmp_path):
    plan = make_plan(None, "13.1", resources=RES)
    torch = plan.node("torch")
    (tmp_path / "records").mkdir()
    rec = {"format": 1, "run_id": "20261207T000000.00Z", "toolchain": "13.1", "host": "here",
           "nodes": [{"name": "torch", "hash": torch.hash, "status": "built", "duration_s": 99.0}]}
    (tmp_path / "records" / "build-cu13.1-20261207T000000.00Z.json").write_text(json.dumps(rec))
    lines = _expect_lines(plan, tmp_path, E.Basis(E.read_history(tmp_path / "records"),
                                                  measured=E.measured_times("13.1")))
    assert "about 1 min 39 s: built in that time at this hash" in lines["torch"], lines["torch"]


def test_the_aot_node_s_estimate_is_calibrated_to_its_measured_build(tmp_path):
    """Measured: 5 min 23 s for the 13.1 FlashInfer AOT node (4 .cu units for 12.0f, MAX_JOBS=2, 2 cores)."""
    plan = make_plan(None, "13.1", resources=RES)
    line = _expect_lines(plan, tmp_path, E.Basis(E.read_history(tmp_path / "records")))["flashinfer"]
    assert "about 5 min 23 s: the unit-cost estimate" in line, line


@pytest.mark.parametrize("entry", [
    {"toolchain": "13.1", "node": "torch", "seconds": 0, "what": "x", "where": "y"},
    {"toolchain": "13.1", "node": "torch", "seconds": 64, "what": "x", "where": ""},
    {"toolchain": 13.1, "node": "torch", "seconds": 64, "what": "x", "where": "y"},
])
def test_a_malformed_measured_time_is_refused_naming_the_entry(entry, tmp_path):
    import yaml

    f = tmp_path / "node_times.yaml"
    f.write_text(yaml.safe_dump({"nodes": [entry]}))
    with pytest.raises(StackError, match=r"nodes\[0\]: give toolchain and node"):
        E.measured_times("13.1", f)
