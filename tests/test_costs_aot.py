"""Dry-run costs of a FlashInfer ahead-of-time node: its units are read from the generators' bodies in the
pinned flashinfer-python wheel (cudastack.plan.costs_aot), else the recipe's units_reference, else unknown."""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from cudastack.plan import costs
from cudastack.plan.costs_aot import count_aot_units, generator_sources
from cudastack.core.errors import RecipeError
from cudastack.plan.planner import make_plan, render_plan
from cudastack.recipes.load import load_recipes
from cudastack.plan.rules import Resources
from recipe_support import edit

RES = Resources(2, 23.5, "test builder")
MODULES = ["flashinfer.jit.comm:gen_trtllm_comm_module", "flashinfer.jit.comm:gen_pcie_ipc_comm_module"]
COMM_PY = '''
def gen_trtllm_comm_module():
    return gen_jit_spec("trtllm_comm", [
        jit_env.FLASHINFER_CSRC_DIR / "trtllm_allreduce.cu",
        jit_env.FLASHINFER_CSRC_DIR / "trtllm_allreduce_fusion.cu",
        jit_env.FLASHINFER_CSRC_DIR / "trtllm_moe_allreduce_fusion.cu",
        jit_env.FLASHINFER_CSRC_DIR / "tvm_binding.cpp",
    ])

def gen_pcie_ipc_comm_module():
    return gen_jit_spec("pcie_ipc_comm", [jit_env.FLASHINFER_CSRC_DIR / "pcie_ipc_all_reduce.cu"])

def gen_variants_module():
    return gen_jit_spec("v", [jit_env.FLASHINFER_CSRC_DIR / f"{name}" for name in NAMES])
'''


def _wheel(state: Path, version: str = "0.7.2", body: str = COMM_PY) -> Path:
    wh = state / "wheelhouse" / "cu13.1"
    wh.mkdir(parents=True, exist_ok=True)
    path = wh / f"flashinfer_python-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("flashinfer/jit/comm.py", body)
    return path


def test_units_are_the_files_each_generator_names(tmp_path):
    _wheel(tmp_path)
    c = count_aot_units(["flashinfer-python==0.7.2"], MODULES, tmp_path)
    assert c["known"] and (c["cu"], c["cpp"]) == (4, 1)
    assert "gen_trtllm_comm_module 3 .cu + 1 C++, gen_pcie_ipc_comm_module 1 .cu" in c["how"]
    # one module only: only its files
    assert count_aot_units(["flashinfer-python==0.7.2"], MODULES[1:], tmp_path)["cu"] == 1


def test_no_wheel_other_version_or_missing_generator_is_unknown_never_zero(tmp_path):
    assert not count_aot_units(["flashinfer-python==0.7.2"], MODULES, tmp_path)["known"]     # nothing fetched
    _wheel(tmp_path, version="0.7.4")
    c = count_aot_units(["flashinfer-python==0.7.2"], MODULES, tmp_path)
    assert not c["known"] and "not in a wheelhouse" in c["how"]
    _wheel(tmp_path)
    c = count_aot_units(["flashinfer-python==0.7.2"], ["flashinfer.jit.comm:gen_nope_module"], tmp_path)
    assert not c["known"] and "gen_nope_module is not defined in flashinfer/jit/comm.py" in c["how"]
    c = count_aot_units(["flashinfer-python==0.7.2"], ["flashinfer.jit.gemm:gen_x_module"], tmp_path)
    assert not c["known"] and "flashinfer/jit/gemm.py is not in" in c["how"]
    # a generator whose list is built at run time names no literal: unresolved, not a count of zero
    c = count_aot_units(["flashinfer-python==0.7.2"], ["flashinfer.jit.comm:gen_variants_module"], tmp_path)
    assert c["unresolved"] == ["flashinfer.jit.comm:gen_variants_module"]
    assert generator_sources(COMM_PY, "gen_missing") is None


def test_dry_run_of_the_13_1_aot_node_prints_flags_units_and_time(tmp_path, recipes_copy):
    plan = make_plan(None, "13.1", resources=RES)
    fresh = render_plan(plan, None, state_dir=str(tmp_path / "fresh")).split("] flashinfer ")[1].split("\n[")[0]
    assert "archs   sm_120f  (FLASHINFER_CUDA_ARCH_LIST=12.0f)" in fresh
    assert "units   4 .cu x 1 archs + 0 C/C++  -- the recipe's units_reference (flashinfer-python 0.7.2" in fresh
    cls = costs.unit_costs()["classes"]["flashinfer-jit"]
    assert f"time    about {costs._fmt(4 * cls['cu_seconds_per_arch'] / 2)} with 2 jobs" in fresh
    _wheel(tmp_path / "built")
    built = render_plan(plan, None, state_dir=str(tmp_path / "built")).split("] flashinfer ")[1].split("\n[")[0]
    assert "units   4 .cu x 1 archs + 1 C/C++  -- the sources each generator names in flashinfer_python-0.7.2" in built
    # a second arch doubles the device work
    two = make_plan(None, "13.1", archs="12.0;10.0", resources=RES)
    assert "archs   sm_120f sm_100f" in render_plan(two, None, state_dir=str(tmp_path / "fresh"))


@pytest.mark.parametrize("ref, needle", [
    ({"cu": -1, "how": "x"}, "expected a number >= 0"),
    ({"cu": 4}, "how"),
    ({"cu": 4, "how": ""}, "at least 1 character"),
])
def test_bad_units_reference_is_a_recipe_error(recipes_copy, ref, needle):
    edit(recipes_copy / "flashinfer.yaml", lambda d: d["toolchains"]["13.1"].update(units_reference=ref))
    with pytest.raises(RecipeError) as exc:
        load_recipes(recipes_copy)
    assert needle in str(exc.value) and "units_reference" in str(exc.value)


def test_units_reference_is_no_input_of_the_node_hash(recipes_copy):
    before = {n.name: n.hash for n in make_plan(recipes_copy, "13.1", resources=RES).nodes}
    edit(recipes_copy / "flashinfer.yaml", lambda d: d["toolchains"]["13.1"].update(
        units_reference={"cu": 9, "how": "changed"}))
    after = {n.name: n.hash for n in make_plan(recipes_copy, "13.1", resources=RES).nodes}
    assert before == after
    edit(recipes_copy / "flashinfer.yaml", lambda d: d["toolchains"]["13.1"].update(modules=MODULES[:1]))
    assert {n.name: n.hash for n in make_plan(recipes_copy, "13.1", resources=RES).nodes}["flashinfer"] != \
        after["flashinfer"]      # the same edit of a hashed key does move it


def test_builder_scope_source_sends_the_nodes_that_compile():
    from cudastack.build.builders import sent
    from cudastack.core.errors import UsageError

    nodes = {n.name: n for n in make_plan(None, "13.1", resources=RES).nodes}
    assert [n for n in nodes if sent(nodes[n], "source")] == ["flash-attn", "flashinfer"]   # source and aot
    assert [n for n in nodes if sent(nodes[n], "all")] == [n for n in nodes if n != "base"]
    with pytest.raises(UsageError, match="the nodes that compile"):
        sent(nodes["torch"], "wheels")
