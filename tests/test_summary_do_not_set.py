"""What a report's Summary block tells a user to leave unset, on the real wheels (vllm 0.33.0 + flashinfer-python
0.7.2.post1; sglang 0.5.23 + flashinfer-python 0.7.2), each with a failing twin (an edited copy of the engine source
where the condition is absent gives the old answer):

* a path whose per-width answer serves some captured decode widths (vLLM's ``VLLM_USE_NCCL_SYMM_MEM=1``: its size
  band at world size 8, ``all_reduce_utils.py``, declines 2-9 rows of hidden 7168 and claims 1 row and 10 rows or
  more) is never "accepted, no gain": with no flags it changes the path for those widths (try and measure, widths
  named); with PCIe IPC on it is listed under "do not set with it" (it is tried first, ``cuda_communicator.py``);
* ``VLLM_BATCH_INVARIANT=1`` turns vLLM's PCIe IPC off (``cuda_communicator.py:73-76``), read from the source;
* the Summary block shows the serving path's "do not set with it" list (SGLang with PCIe IPC on) and vLLM's
  ``--all2all-backend flashinfer_nvlink_one_sided`` start-up failure on PCIe as a "do not set" line.
"""
from __future__ import annotations

import copy
import re

import pytest

from stackprobe.summary import block
from stackprobe.userwords import headline_line
from test_validate_verdicts_signed import DRIVER, drive  # noqa: F401 - the shared static-tier driver fixture
from validate_support import engine_copy, pip_target

pytestmark = pytest.mark.network

PCIE = "flashinfer-pcie-ipc-allreduce"
UTILS = "vllm/distributed/device_communicators/all_reduce_utils.py"
COMM = "vllm/distributed/device_communicators/cuda_communicator.py"
BAND = "8: (16 * KiB, 128 * KiB),"
INVARIANT = ("envs.VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC\n                and not envs.VLLM_BATCH_INVARIANT\n",
             "envs.VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC\n")
PCIE_ON = {"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1"}
SYMM = "VLLM_USE_NCCL_SYMM_MEM=1"


@pytest.fixture(scope="module")
def v033():
    return [pip_target("vllm==0.33.0"), pip_target("flashinfer-python==0.7.2.post1")]


@pytest.fixture(scope="module")
def v033_edited(v033, tmp_path_factory):
    """vllm 0.33.0 with NCCL symmetric memory's band at world size 8 widened to every size (it declines every decode
    width) and the ``not envs.VLLM_BATCH_INVARIANT`` gone from PCIe IPC's assignment."""
    dest = tmp_path_factory.mktemp("vllm-edited")
    return [engine_copy(v033[0], dest, {UTILS: (BAND, "8: (0, 1 << 60),"), COMM: INVARIANT}), v033[1]]


def _lines(report, key: str) -> list[str]:
    return [ln[20:] for ln in block(report) if ln.startswith(key + ":")]


def test_no_flags_nccl_symmetric_memory_changes_the_path_for_named_widths(drive, v033):
    """Items 10 and 7. Before: "accepted, no gain: VLLM_USE_NCCL_SYMM_MEM=1 (nccl-symm-mem)" (true for 2-9 rows
    only), and PCIe IPC's try-and-measure line named nothing to leave unset."""
    _, report = drive(v033, engine="vllm")
    assert not any(SYMM in ln for ln in _lines(report, "accepted, no gain"))
    symm = [ln for ln in _lines(report, "try and measure") if ln.startswith(SYMM)]
    assert symm == [f"{SYMM} (nccl-symm-mem): changes the path for 79 of 85 captured decode widths (1 and 10-512 "
                    f"rows: nccl-symm-mem instead of NCCL; vllm/{UTILS.removeprefix('vllm/')}:123); no change at 2-9 "
                    "rows: measure those widths"]
    pcie = next(ln for ln in _lines(report, "try and measure") if ln.startswith(PCIE))
    assert "do not set with it: VLLM_BATCH_INVARIANT=1 (NCCL (pynccl, allreduce algorithm tree) serves instead: " in pcie
    assert f"{COMM}:75)" in pcie
    assert f"{SYMM} (nccl-symm-mem serves instead at 1 and 10-512 rows, 79 of 85 captured decode widths" in pcie
    assert "opt-in, worth measuring on the target: " in headline_line(report)


def test_pcie_ipc_on_lists_what_takes_it_away_in_the_summary(drive, v033):
    """Items 9, 7 and 13. Before: "accepted, no gain: VLLM_USE_NCCL_SYMM_MEM=1" with PCIe IPC on, although it is tried
    first and takes 1-row and >=10-row decode tensors; no "do not set with it" line; the one-sided all-to-all's
    start-up failure only under the EP heading."""
    _, report = drive(v033, env=PCIE_ON, engine="vllm")
    assert report.dispatch["serves"] == PCIE
    assert not _lines(report, "accepted, no gain")
    avoid = _lines(report, "do not set with it")
    assert avoid[0].startswith("VLLM_BATCH_INVARIANT=1 (NCCL (pynccl, allreduce algorithm tree) serves instead: "
                               "use_flashinfer_pcie_ipc_allreduce is ... and not envs.VLLM_BATCH_INVARIANT: PCIe IPC is "
                               "not built; it sets NCCL_ALGO=ring,tree;allreduce:tree (vllm/model_executor/determinism/"
                               f"batch_invariant.py:1419), {COMM}:75)")
    assert avoid[1].startswith(f"{SYMM} (nccl-symm-mem serves instead at 1 and 10-512 rows, 79 of 85 captured")
    assert len(avoid) == 2
    dns = _lines(report, "do not set")
    assert [d.split(" (")[0] for d in dns] == ["--all2all-backend flashinfer_nvlink_one_sided"]
    assert "nvlink_common.py:86" in dns[0] and "start-up failure on PCIe" in dns[0]
    assert "do not set with it: VLLM_BATCH_INVARIANT=1" in headline_line(report)


def test_twin_an_edited_vllm_without_the_conditions_gives_the_old_answers(drive, v033_edited):
    """The twin: a band that declines every width leaves NCCL symmetric memory "accepted, no gain"; without the
    VLLM_BATCH_INVARIANT condition PCIe IPC has nothing to leave unset."""
    _, plain = drive(v033_edited, engine="vllm")
    assert _lines(plain, "accepted, no gain") == [f"{SYMM} (nccl-symm-mem)"]
    pcie = next(ln for ln in _lines(plain, "try and measure") if ln.startswith(PCIE))
    assert "do not set with it" not in pcie
    _, on = drive(v033_edited, env=PCIE_ON, engine="vllm")
    assert _lines(on, "do not set with it") == []
    assert _lines(on, "accepted, no gain") == [f"{SYMM} (nccl-symm-mem)"]


def test_twin_the_one_sided_all_to_all_is_no_start_up_failure_on_nvlink(drive, v033):
    """The twin of the one-sided line: on an NVLink topology FlashInfer's check passes, so no "do not set" line."""
    _, report = drive(v033, env=PCIE_ON, engine="vllm", backends=("ep-flashinfer-a2a",))
    assert _lines(report, "do not set")
    nv = copy.copy(report)
    nv.options = {**report.options, "topology": "nvlink"}
    assert _lines(nv, "do not set") == []


def test_sglang_pcie_ipc_on_shows_its_do_not_set_with_it_list(drive, sglang, fi, nvcc131):
    """Item 32. Before: SGLang's report with PCIe IPC on had no "do not set with it" in its Summary block (only under
    the path's heading)."""
    _, report = drive([sglang, fi], backends=(PCIE,), path_first=[nvcc131],
                      env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"})
    assert report.dispatch["serves"] == PCIE
    avoid = _lines(report, "do not set with it")
    # each entry cites where SGLang reads the setting and the line that then serves instead (before: no line for
    # three of them, and only the NCCL_ALGO pin for the flag): tests/test_sglang_do_not_set_cited.py
    ps, pcie = "sglang/srt/distributed/parallel_state.py", "sglang/srt/distributed/device_communicators/pcie_ipc_ar.py"
    assert any(a.startswith("--enable-symm-mem (nccl-symm-mem serves instead: GroupCoordinator.all_reduce gives the "
                            "tensor to nccl-symm-mem before PCIe IPC's step when `self.is_symmetric_memory_enabled()`")
               and re.search(rf", {ps}:\d+\)$", a) for a in avoid), avoid
    det = next(a for a in avoid if a.startswith("--enable-deterministic-inference (NCCL (pynccl, allreduce algorithm "
                                                "tree) serves instead: it sets SGLANG_ENABLE_DETERMINISTIC_INFERENCE ("))
    assert re.search(r"; it sets NCCL_ALGO=allreduce:tree \(sglang/srt/arg_groups/attention_hook.py:676\), "
                     rf"{pcie}:\d+\)$", det), det
    assert any(a.startswith("SGLANG_USE_1STAGE_ALLREDUCE=1 (NCCL (pynccl) serves instead: read by "
                            f"_deterministic_collectives_enabled ({ps}:") and re.search(rf", {pcie}:\d+\)$", a)
               for a in avoid), avoid
    assert all(re.search(r"\.py:\d+\)$", a) for a in avoid), avoid
    cause = next(v.cause for v in report.verdicts if v.backend == PCIE and v.scope == "engine")
    listed = cause.split("; do not set with it: ", 1)[1]
    assert "SGLANG_USE_1STAGE_ALLREDUCE=1 (NCCL (pynccl) serves instead: read by _deterministic_collectives_enabled" \
        in listed and "(nccl-symm-mem serves instead;" not in listed


def test_sglang_twin_with_symm_mem_given_pcie_ipc_does_not_serve_and_nothing_is_listed(drive, sglang, fi, nvcc131):
    """The twin: with --enable-symm-mem given, PCIe IPC is preempted: no path of its own to protect, no such line."""
    _, report = drive([sglang, fi], backends=(PCIE,), path_first=[nvcc131],
                      env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}, args={"--enable-symm-mem": True})
    assert report.dispatch["serves"] != PCIE
    assert _lines(report, "do not set with it") == []
