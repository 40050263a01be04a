"""Which ``if`` tests SGLang's ``GroupCoordinator.__init__`` puts around each communicator it builds, read from the
installed ``srt/distributed/parallel_state.py`` (stackprobe.runtime.sglang_state.construction_gates): the
world-size-1 report says why nothing came up from these, so they must follow the file, not a list of ours.
Each claim has its failing twin on an edited copy (engine_copy fails loudly when an edit's text is not found)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from validate_support import ROOT, engine_copy, pip_target

sys.path.insert(0, str(ROOT / "validate"))
from stackprobe.runtime.sglang_state import COMMS, construction_gates  # noqa: E402

PS = "sglang/srt/distributed/parallel_state.py"
PYNCCL_GATE = "        if use_pynccl and self.world_size > 1:\n            self.pynccl_comm = PyNcclCommunicator("


@pytest.fixture(scope="module")
def sglang() -> Path:
    return pip_target("sglang==0.5.23")


def _line_of(text: str, needle: str) -> int:
    return text[:text.index(needle)].count("\n") + 1


@pytest.mark.network      # the sglang fixture downloads sglang 0.5.23 from PyPI
def test_every_built_communicator_is_found_at_its_own_line_with_its_world_size_test(sglang):
    text = (sglang / PS).read_text()
    gates = construction_gates(text)
    assert set(gates) == set(COMMS)
    lines = text.splitlines()
    for attr, g in gates.items():
        assert g["built_at"] is not None, attr
        assert re.match(rf"\s*self\.{attr}\s*=", lines[g["built_at"] - 1]), (attr, lines[g["built_at"] - 1])
        assert g["tests"], attr
        for t in g["tests"]:
            assert lines[t["line"] - 1].lstrip().startswith(("if ", "elif ")), (attr, t)
    assert gates["pynccl_comm"]["tests"] == [{"line": _line_of(text, PYNCCL_GATE.lstrip("\n")) ,
                                              "test": "use_pynccl and self.world_size > 1"}]
    assert "eligible_group(" in gates["pcie_ipc_comm"]["tests"][0]["test"]
    # every path but PCIe IPC (whose gate is eligible_group, which reads the world size itself) needs world size > 1
    for attr in ("pynccl_comm", "ca_comm", "pymscclpp_comm", "torch_symm_mem_comm"):
        assert any("self.world_size > 1" in t["test"] for t in gates[attr]["tests"]), attr


@pytest.mark.network      # the sglang fixture downloads sglang 0.5.23 from PyPI
def test_a_copy_without_the_world_size_test_reports_the_gate_it_has(sglang, tmp_path):
    edited = engine_copy(sglang, tmp_path / "nows", {PS: (PYNCCL_GATE, PYNCCL_GATE.replace(
        " and self.world_size > 1", ""))})
    g = construction_gates((edited / PS).read_text())["pynccl_comm"]
    assert [t["test"] for t in g["tests"]] == ["use_pynccl"]


@pytest.mark.network      # the sglang fixture downloads sglang 0.5.23 from PyPI
def test_a_copy_that_never_builds_pynccl_says_so(sglang, tmp_path):
    edited = engine_copy(sglang, tmp_path / "nobuild", {PS: (PYNCCL_GATE, PYNCCL_GATE.replace(
        "self.pynccl_comm = PyNcclCommunicator(", "_unused = PyNcclCommunicator("))})
    assert construction_gates((edited / PS).read_text())["pynccl_comm"] == {"built_at": None, "tests": []}


def test_an_else_branch_reads_as_the_negated_test():
    src = ("class GroupCoordinator:\n    def __init__(self, a):\n        if a > 1:\n            pass\n"
           "        else:\n            self.pynccl_comm = PyNcclCommunicator()\n")
    assert construction_gates(src)["pynccl_comm"] == {"built_at": 6, "tests": [{"line": 3, "test": "not (a > 1)"}]}


def test_a_source_without_the_class_is_an_error_not_an_empty_answer():
    with pytest.raises(ValueError, match="no GroupCoordinator.__init__"):
        construction_gates("class Other:\n    def __init__(self):\n        self.pynccl_comm = X()\n")
