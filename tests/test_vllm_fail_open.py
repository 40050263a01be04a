"""vLLM readers that meet what they cannot read say "not assessed", never admit or name a later path serving. Each
case reads the real vllm 0.33.0 wheel from PyPI (with flashinfer-python 0.7.2.post1, vLLM's own pin, and b12x 1.5.1)
and an edited copy of it (``engine_copy``) that plants what a future release could bring:

1. the TP allreduce dispatch (``CudaCommunicator.all_reduce``): a step whose verdict is an error, a step with no
   verdict whose reading fails (AITER's ROCm-only chain), and a step the reader cannot map to a backend each make the
   answer not assessed naming that step, where they used to count as "does not claim" and name the next step;
2. the fusion pass past its size table: FlashInfer's ``gen_trtllm_comm_module`` majors not read (not a literal) are
   not assessed, where they used to admit;
3. ``--compilation-config`` that is not a JSON object: a usage error from ``parse_config``, and a not-assessed
   answer in the reader, where a substring match used to answer;
4. the PCIe IPC lift names vLLM's own FlashInfer pin read from its distribution metadata, or says it was not read.
"""
from __future__ import annotations

import pytest

from validate_support import engine_copy, pip_target

pytestmark = pytest.mark.network

VLLM = "vllm==0.33.0"
FI = "flashinfer-python==0.7.2.post1"      # vllm 0.33.0's own pin (its METADATA Requires-Dist)
B12X = "b12x==1.5.1"
CC = "vllm/distributed/device_communicators/cuda_communicator.py"
FUSION = "flashinfer-allreduce-fusion"
PCIE = "flashinfer-pcie-ipc-allreduce"
IPC_ON = {"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1"}


@pytest.fixture(scope="module")
def wheels():
    return {"vllm": pip_target(VLLM), "b12x": pip_target(B12X), "fi": pip_target(FI)}


def _read(wheels, monkeypatch, root=None, env=None, args=None, topology="pcie", ws=8):
    """vLLM's answers in this process for ``root`` (an edited copy's ``vllm`` folder; default the wheel's)."""
    from stackprobe.archs import parse_arch
    from stackprobe.engines.vllm import engine as ve
    from stackprobe.probes import Context
    from stackprobe.serverconfig import ServerConfig

    for p in (wheels["b12x"], wheels["fi"]):
        monkeypatch.syspath_prepend(str(p))
    eng = ve.Engine("0.33.0", root or wheels["vllm"] / "vllm")
    ctx = Context(target=parse_arch("12.0"), env={}, coverage={}, topology=topology, world_size=ws,
                  server_config=ServerConfig(args=dict(args or {}), env=dict(env or {})))
    verdicts, dispatch = ve.engine_verdicts(ctx, engine=eng)
    return {v.backend: v for v in verdicts}, dispatch


def _copy(wheels, tmp_path, edits):
    return engine_copy(wheels["vllm"], tmp_path / "vllm-copy", edits) / "vllm"


def _widths_served(d: dict) -> set:
    return {g["serves"] for g in d["per_width"]["ranges"]}


# --- 1. the dispatch ------------------------------------------------------------------------------------------------
def test_dispatch_real_wheel_reads_every_step(wheels, monkeypatch):
    """The wheel as shipped: every step is read (AITER's step, which has no verdict, by its ROCm-only chain), NCCL
    serves by default and PCIe IPC when set, at every captured width."""
    _, d = _read(wheels, monkeypatch)
    assert d["serves"] == "nccl-ring", d["serves"]
    assert not any(s["claims"] == "not assessed" for s in d["steps"]), d["steps"]
    aiter = next(s for s in d["steps"] if s["backend"] == "aiter-custom-allreduce")
    assert aiter["claims"] is False and aiter["read"].startswith("ROCm only:")
    assert "vllm/_aiter_ops.py:" in aiter["read"] and "current_platform.is_rocm()" in aiter["read"]
    got, on = _read(wheels, monkeypatch, env=IPC_ON)
    assert on["serves"] == PCIE and _widths_served(on) == {PCIE}
    assert got[PCIE].status == "on-as-configured"


def test_twin_an_earlier_step_in_error_is_not_assessed_not_the_next_step(wheels, monkeypatch, tmp_path):
    """Twin: PCIe IPC's gate moved (its verdict an error). On NVLink vLLM's custom allreduce comes after it and is on:
    the old reader named it serving; now the answer and every width are not assessed, naming the PCIe IPC step, and
    custom allreduce's own verdict is an error saying it comes after that step."""
    root = _copy(wheels, tmp_path, {f"{CC.rsplit('/', 1)[0]}/flashinfer_pcie_ipc_all_reduce.py":
                                    ("_SUPPORTED_WORLD_SIZES = (2, 4, 8)", "_WORLD_SIZES = (2, 4, 8)")})
    real, rd = _read(wheels, monkeypatch, topology="nvlink")
    assert rd["serves"] == "vllm-custom-allreduce" and real["vllm-custom-allreduce"].status == "on-by-default"
    got, d = _read(wheels, monkeypatch, root=root, topology="nvlink")
    assert got[PCIE].status == "error"
    assert d["serves"].startswith(f"not assessed: the {PCIE} step (vllm/{CC.removeprefix('vllm/')}:"), d["serves"]
    assert "_SUPPORTED_WORLD_SIZES" in d["serves"]
    assert all(w.startswith(f"not assessed: the {PCIE} step") for w in _widths_served(d)), _widths_served(d)
    ca = got["vllm-custom-allreduce"]
    assert ca.status == "error" and ca.cause.startswith(f"not assessed: the {PCIE} step"), ca.cause
    assert "vllm-custom-allreduce comes after it" in ca.cause
    row = next(s for s in d["steps"] if s["backend"] == PCIE)
    assert row["claims"] == "not assessed" and "_SUPPORTED_WORLD_SIZES" in row["not assessed"]
    # on PCIe nothing else is on either: still not assessed, never nccl-ring named behind an unread step
    _, pcie = _read(wheels, monkeypatch, root=root)
    assert pcie["serves"].startswith(f"not assessed: the {PCIE} step") and "nccl-ring" not in _widths_served(pcie)


def test_twin_a_step_without_a_verdict_that_cannot_be_read_is_not_assessed(wheels, monkeypatch, tmp_path):
    """Twin: AITER's is_custom_all_reduce_enabled loses its @if_aiter_supported wrapper (the ROCm-only chain breaks).
    The AITER step has no verdict: the old reader counted it as not claiming and named nccl-ring; now the answer is
    not assessed naming the AITER step and the missing link."""
    root = _copy(wheels, tmp_path, {"vllm/_aiter_ops.py": (
        "    @if_aiter_supported\n    def is_custom_all_reduce_enabled", "    def is_custom_all_reduce_enabled")})
    _, d = _read(wheels, monkeypatch, root=root)
    assert d["serves"].startswith("not assessed: the aiter-custom-allreduce step"), d["serves"]
    assert "no longer wrapped in @if_aiter_supported" in d["serves"]
    assert "nccl-ring" not in _widths_served(d)


def test_twin_a_step_the_reader_cannot_map_is_not_assessed(wheels, monkeypatch, tmp_path):
    """Twin: a new step before torch symmetric memory hands the tensor to a communicator this reader does not know.
    The old reader's fixed STEP_MARKERS never saw it and named nccl-ring (PCIe) or PCIe IPC (set); now the dispatch
    is not read (an error naming the file, line and condition) and the would-serve answer is an error."""
    root = _copy(wheels, tmp_path, {CC: (
        "        symm_mem_comm = self.symm_mem_comm\n        if symm_mem_comm is not None and",
        "        new_comm = self.new_comm\n        if new_comm is not None and new_comm.should_use(input_):\n"
        "            return new_comm.all_reduce(input_)\n"
        "        symm_mem_comm = self.symm_mem_comm\n        if symm_mem_comm is not None and")})
    got, d = _read(wheels, monkeypatch, root=root, env=IPC_ON)
    assert "serves" not in d and "cannot map to a backend" in d["error"], d
    assert "new_comm is not None and new_comm.should_use(input_)" in d["error"]
    assert f"{CC}:" in d["error"] and d["error"].startswith("not assessed:")
    assert got[PCIE].status == "error" and "cannot map to a backend" in got[PCIE].cause


# --- 2. the fusion pass: FlashInfer's majors ------------------------------------------------------------------------
def test_twin_fusion_majors_not_read_are_not_assessed(wheels, monkeypatch, tmp_path):
    """Real: gen_trtllm_comm_module passes supported_major_versions=[9, 10, 12] (flashinfer/jit/comm.py:198): 12.0 is
    admitted, the size override is an opt-in. Twin: a FlashInfer copy whose majors are not a literal: the old reader
    took "not read" as admitting (opt-in); now admits is None, the text says not assessed, and no opt-in is offered."""
    got, _ = _read(wheels, monkeypatch)
    ev = next(e for e in got[FUSION].evidence if e.what.startswith("past the size table"))
    assert ev.value["admits"] is True and ev.value["majors"] == [9, 10, 12]
    assert got[FUSION].status == "opt-in"
    fi = engine_copy(wheels["fi"], tmp_path / "fi", {"flashinfer/jit/comm.py": (
        "supported_major_versions=[9, 10, 12]", "supported_major_versions=TRTLLM_MAJORS")})
    monkeypatch.setitem(wheels, "fi", fi)
    twin, _ = _read(wheels, monkeypatch)
    v = twin[FUSION]
    ev = next(e for e in v.evidence if e.what.startswith("past the size table"))
    assert ev.value["admits"] is None and ev.value["majors"] is None
    assert "is not assessed" in ev.value["text"] and "`TRTLLM_MAJORS` is not a literal list" in ev.value["text"]
    assert v.status == "falls-back-if-set", (v.status, v.cause)
    # the majors, when read, are cited (file:line and the FlashInfer release)
    assert "flashinfer/jit/comm.py:198 (flashinfer-python 0.7.2.post1)" in \
        next(e for e in got[FUSION].evidence if e.what.startswith("past the size table")).value["text"]


# --- 3. --compilation-config that is not a JSON object ---------------------------------------------------------------
@pytest.mark.parametrize("value", ["{pass_config: {fuse_allreduce_rms: true}}", '"fuse_allreduce_rms true"', "3",
                                   '{"pass_config": "fuse_allreduce_rms=true"}'])
def test_twin_compilation_config_not_json_is_a_usage_error_and_not_assessed(wheels, monkeypatch, value):
    """Real: a JSON object asks for the pass (on as configured or opt-in). Twins: values that are not a JSON object
    (each names fuse_allreduce_rms and true, which the old substring match took as asked): parse_config stops with
    one paragraph naming the value, and the reader, given such a value anyway, answers not assessed naming it."""
    from stackprobe.engines.sglang.flags import ConfigError
    from stackprobe.engines.vllm import engine as ve

    eng = ve.Engine("0.33.0", wheels["vllm"] / "vllm")
    good = '{"pass_config": {"fuse_allreduce_rms": true}}'
    assert ve.parse_config(f"--compilation-config '{good}'", [], eng).args["--compilation-config"] == good
    with pytest.raises(ConfigError) as e:
        ve.parse_config(f"--compilation-config '{value}'", [], eng)
    msg = str(e.value)
    assert repr(value) in msg and "json.loads" in msg and "\n" not in msg
    got, _ = _read(wheels, monkeypatch, args={"--compilation-config": value})
    v = got[FUSION]
    assert v.status == "error" and v.cause.startswith(f"not assessed: --compilation-config {value!r}"), v.cause
    asked, _ = _read(wheels, monkeypatch, args={"--compilation-config": good})
    assert asked[FUSION].status == "opt-in"            # asked for, the size table still needs the override


# --- 4. the PCIe IPC lift: vLLM's own pin, read -----------------------------------------------------------------------
def test_twin_pcie_ipc_lift_reads_vllms_own_pin(wheels, monkeypatch, tmp_path):
    """Real: the pin comes from vllm-0.33.0.dist-info METADATA (Requires-Dist: flashinfer-python==0.7.2.post1). Twin:
    a copy whose metadata drops that requirement: the lift says the pin was not read (the old text named 0.7.2.post1
    and >=0.7.2 whatever the metadata said)."""
    from stackprobe.engines.vllm import engine as ve

    eng = ve.Engine("0.33.0", wheels["vllm"] / "vllm")
    assert ve.own_pin(eng, "flashinfer-python") == ("flashinfer-python==0.7.2.post1",
                                                    "vllm-0.33.0.dist-info METADATA Requires-Dist")
    meta = "vllm-0.33.0.dist-info/METADATA"
    copy = engine_copy(wheels["vllm"], tmp_path / "vllm-copy", {meta: (
        "Requires-Dist: flashinfer-python==0.7.2.post1\n", "")})
    twin = ve.Engine("0.33.0", copy / "vllm")
    pin, why = ve.own_pin(twin, "flashinfer-python")
    assert pin is None and why == "vllm-0.33.0.dist-info METADATA Requires-Dist names no flashinfer-python"
    # the gate's lift, as the verdict shows it when the installed FlashInfer lacks the workspace (0.6.3: no PCIe IPC)
    monkeypatch.setitem(wheels, "fi", pip_target("flashinfer-python==0.6.3"))
    got, _ = _read(wheels, monkeypatch, env=IPC_ON)
    assert "vLLM's own pin: flashinfer-python==0.7.2.post1, vllm-0.33.0.dist-info METADATA" in got[PCIE].lift_detail
    assert "whose flashinfer/comm defines PcieIpcAllReduceWorkspace" in got[PCIE].lift_detail
    gone, _ = _read(wheels, monkeypatch, root=copy / "vllm", env=IPC_ON)
    assert "vLLM's own pin not read: vllm-0.33.0.dist-info METADATA Requires-Dist names no flashinfer-python" \
        in gone[PCIE].lift_detail
    assert "0.7.2" not in gone[PCIE].lift_detail


# --- 5. integer flags: a value that is not a whole number is a usage error, never read as 1 -----------------------------
@pytest.mark.parametrize("value", ["two", "2.5", "0x2z"])
def test_twin_a_data_parallel_size_that_is_not_an_integer_is_a_usage_error(wheels, monkeypatch, value):
    """Real: ``--data-parallel-size 2`` is read as 2 (the two-sided all-to-all's DP x TP). Twins: values vLLM's
    ``int`` would refuse: parse_config stops with one paragraph naming flag and value, and the reader, given one
    anyway, raises the same error (the old reader took any such value as 1: no data parallelism)."""
    from stackprobe.engines.sglang.flags import ConfigError
    from stackprobe.engines.vllm import engine as ve

    eng = ve.Engine("0.33.0", wheels["vllm"] / "vllm")
    assert ve.parse_config("--data-parallel-size 2", [], eng).args["--data-parallel-size"] == "2"
    with pytest.raises(ConfigError) as e:
        ve.parse_config(f"--data-parallel-size {value}", [], eng)
    msg = str(e.value)
    assert repr(value) in msg and "whole number" in msg and "\n" not in msg
    with pytest.raises(ConfigError):
        _read(wheels, monkeypatch, args={"--enable-expert-parallel": True, "--data-parallel-size": value})
    got, _ = _read(wheels, monkeypatch, args={"--enable-expert-parallel": True, "--data-parallel-size": "2",
                                              "--all2all-backend": "flashinfer_nvlink_two_sided"})
    assert got["ep-flashinfer-a2a"].status != "error", got["ep-flashinfer-a2a"].cause
