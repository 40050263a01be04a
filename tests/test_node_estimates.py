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


def test_one_unit_count_for_the_dry_run_and_the_build_s_counter(tmp_path):
    """flash-attn 2.8.3.post2's setup.py names 72 .cu + flash_api.cpp for CUDA and 7 csrc/flash_attn_ck/*.cpp for
    ROCm; its CUDA build's ninja counter reads /73 (the build's progress, "compiled n/73"). The dry run counted 80.
    Here a tree laid out like that sdist's setup.py: the count is 73, and the twin without the ROCm rule is 80."""
    from cudastack.plan import costs

    cu = [f"csrc/flash_attn/src/flash_fwd_hdim{h}_{t}_{c}sm80.cu" for h in (32, 64, 96, 128, 192, 256)
          for t in ("fp16", "bf16") for c in ("", "causal_")] * 1
    cu += [n.replace("fwd", "bwd") for n in cu] + [n.replace("fwd", "fwd_split") for n in cu]
    ck = [f"csrc/flash_attn_ck/{n}.cpp" for n in ("flash_api", "flash_common", "mha_bwd", "mha_fwd_kvcache",
                                                  "mha_fwd", "mha_varlen_bwd", "mha_varlen_fwd")]
    setup = ("if not IS_ROCM:\n    sources = ['csrc/flash_attn/flash_api.cpp'" + "".join(f", '{n}'" for n in cu) + "]\n"
             "else:\n    sources = [" + ", ".join(f"'{n}'" for n in ck) + "]\n")
    names = cu + ck + ["csrc/flash_attn/flash_api.cpp", "setup.py"]
    tree = costs.Tree(names, lambda n: setup if n == "setup.py" else "", "flash_attn-like/")
    count = costs.count_setup_py(tree)
    assert (len(cu), count.cu, count.cpp) == (72, 72, 1), count
    assert costs._other_backend("csrc/flash_attn_ck/mha_fwd.cpp") and not costs._other_backend("csrc/flash_attn/x.cu")
    import unittest.mock as um
    with um.patch.object(costs, "_other_backend", lambda path: False):      # the count before: 80
        before = costs.count_setup_py(tree)
    assert (before.cu, before.cpp) == (72, 8), before
    plan = make_plan(None, "13.1", resources=RES)
    text = render_plan(plan, None, state_dir=str(tmp_path)).split("] flash-attn ")[1].split("\n[")[0]
    assert "units   72 .cu x 1 archs + 1 C/C++" in text, text
