"""SGLang's TP allreduce dispatch read from the real sglang 0.5.23 and 0.5.9 wheels (and FlashInfer 0.7.2 for PCIe
IPC's library check), and edited copies of them: C37 (PCIe IPC preempted by NCCL symmetric memory), C39 (an unknown
communicator in the dispatch), C40 (PCIe IPC's row bound), C48 (custom allreduce's per-call gate read from its own
code), swapped steps, an unmappable step, and server flags checked against the release's own definitions."""
from __future__ import annotations

import sys

import pytest

from validate_support import engine_copy, evidence, pip_target, run_suite, suite_venv, verdict

pytestmark = pytest.mark.network

from stackprobe.archs import parse_arch  # noqa: E402
from stackprobe.probes import Context  # noqa: E402
from stackprobe.engines.sglang import engine as se  # noqa: E402
from stackprobe.engines.sglang import paths as sp  # noqa: E402
from stackprobe.engines.sglang import pcie_ipc as pi  # noqa: E402
from stackprobe.engines.sglang.dispatch import (ConfigError, DecodeTensor, DispatchError, parse_server_config,  # noqa: E402
                                               read_dispatch)

PS = "sglang/srt/distributed/parallel_state.py"
PCIE = "flashinfer-pcie-ipc-allreduce"
PCIE_ON = ["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1"]


@pytest.fixture(scope="module")
def sg23():
    return pip_target("sglang==0.5.23")


@pytest.fixture(scope="module")
def fi():
    d = pip_target("flashinfer-python==0.7.2")
    sys.path.insert(0, str(d))          # FlashInfer's own PCIe IPC admission is read from its source
    yield d
    sys.path.remove(str(d))


def _eng(folder, version="0.5.23"):
    return se.Engine(version, folder / "sglang")


def _dispatch(eng, server_args="", env=(), workload=None, ws=8, topo="pcie"):
    cfg = parse_server_config(server_args, list(env), eng)
    ctx = Context(target=parse_arch("12.0"), env={}, coverage={}, world_size=ws, topology=topo, server_config=cfg)
    return read_dispatch(eng, ctx, workload), cfg


def test_no_flags_nccl_serves_and_the_order_is_read_from_0_5_23(sg23, fi):
    d, _ = _dispatch(_eng(sg23))
    assert d.serves == "nccl-ring" and d.preempted == {}
    order = [s.backend for s in d.steps]
    assert order.index("nccl-symm-mem") < order.index("flashinfer-allreduce-only") < order.index(
        "sglang-custom-allreduce") < order.index(PCIE) < order.index("mscclpp") < order.index("torch-symm-mem")
    assert d.step(PCIE).where == f"{PS}:970" and d.step("nccl-symm-mem").where == f"{PS}:755"
    assert d.step(PCIE).built is False and "eligible_group" in d.step(PCIE).why


def test_pcie_ipc_opted_in_serves_the_decode_tensor(sg23, fi):
    d, _ = _dispatch(_eng(sg23), env=PCIE_ON)
    assert d.serves == PCIE and d.step(PCIE).admits is True
    assert "should_pcie_ipc_ar" in d.step(PCIE).why


def test_c37_pcie_ipc_preempted_by_nccl_symmetric_memory(sg23, fi):
    d, _ = _dispatch(_eng(sg23), "--enable-symm-mem", PCIE_ON)
    assert d.serves == "nccl-symm-mem"
    assert d.preempted == {PCIE: "nccl-symm-mem"}
    assert d.to_json()["preempted"] == {PCIE: "nccl-symm-mem"}


def test_0_5_9_has_its_own_order_and_no_pcie_ipc(fi):
    d, _ = _dispatch(_eng(pip_target("sglang==0.5.9"), "0.5.9"), "--enable-symm-mem", PCIE_ON)
    order = [s.backend for s in d.steps]
    assert PCIE not in order and "flashinfer-allreduce-only" not in order
    assert order.index("nccl-symm-mem") < order.index("sglang-custom-allreduce") < order.index("mscclpp")
    assert d.serves == "nccl-symm-mem" and d.step("nccl-symm-mem").where == f"{PS}:584"


def test_swapped_steps_change_serves_and_preempted(sg23, fi, tmp_path):
    # move the symm-mem step after the out-of-place methods: PCIe IPC now claims the tensor first
    src = (sg23 / PS).read_text()
    a0 = src.index("        if (\n            self.pynccl_comm is not None\n            and self.is_symmetric_memory_enabled()")
    a1 = src.index("        if self._can_use_flashinfer_allreduce(input_):\n            return flashinfer_allreduce", a0)
    b0 = src.index("        outplace_all_reduce_method = self._resolve_outplace_all_reduce_method(", a1)
    b1 = src.index("        if outplace_all_reduce_method is not None:", b0)
    moved = src[a0:a1]
    new = src[:a0] + src[a1:b0] + src[b0:b1] + moved + src[b1:]
    copy = engine_copy(sg23, tmp_path / "sg", {PS: (src, new)})
    d, _ = _dispatch(_eng(copy), "--enable-symm-mem", PCIE_ON)
    assert d.serves == PCIE and d.preempted == {"nccl-symm-mem": PCIE}
    order = [s.backend for s in d.steps]
    assert order.index(PCIE) < order.index("nccl-symm-mem")


def test_unmappable_step_is_an_error(sg23, fi, tmp_path):
    copy = engine_copy(sg23, tmp_path / "sg", {PS: (
        '            return "pcie_ipc"\n', '            return "pcie_ipc_v2"\n')})
    with pytest.raises(DispatchError, match="outplace method 'pcie_ipc_v2'.*unknown communication path"):
        _dispatch(_eng(copy), env=PCIE_ON)


def test_c39_one_more_communicator_called_by_the_dispatch(venv_suite, sg23, fi, tmp_path):
    comm = "sglang/srt/distributed/device_communicators"
    edits = {PS: ('        if (\n            self.qr_comm is not None\n',
                  '        if self.ring_ipc_comm is not None and self.ring_ipc_comm.should_ring(input_):\n'
                  '            return "ring_ipc"\n        if (\n            self.qr_comm is not None\n')}
    copy = engine_copy(sg23, tmp_path / "sg", edits)
    (copy / comm / "ring_ipc_ar.py").write_text('"""A new PCIe ring communicator."""\nclass RingIpcCommunicator:\n    pass\n')
    with pytest.raises(DispatchError, match=r"self\.ring_ipc_comm.*unknown communication path, not assessed") as e:
        _dispatch(_eng(copy))
    assert e.value.unknown == "ring_ipc_comm" and e.value.where.startswith(f"{PS}:")
    rows = [r for r in sp.inventory(_eng(copy)) if r["status"] == "unknown"]
    assert [r["path"] for r in rows] == ["ring_ipc_ar.py"] and "unknown communication path: not assessed" in rows[0]["why"]
    assert sp.findings(_eng(copy))[0]["case"] == "C39"
    # the real wheel: every module is known
    assert not [r for r in sp.inventory(_eng(sg23)) if r["status"] == "unknown"]
    # and the suite's report says so, never silence
    report, _ = run_suite(venv_suite, [copy, fi], ["--backend", "nccl-ring", "--env", PCIE_ON[0]])
    assert report["engines"][0]["dispatch"]["error"] and report["engines"][0]["dispatch"]["unknown"] == "ring_ipc_comm"
    msgs = [f["message"] for f in report["environment"]["findings"] if f.get("case") == "C39"]
    assert any("ring_ipc_ar.py" in m for m in msgs) and any("ring_ipc_comm" in m for m in msgs)
    assert any(p["backend"] == "ring_ipc_ar.py" and p["status"] == "not-assessed" for p in report["engines"][0]["paths"])


@pytest.fixture(scope="module")
def venv_suite():
    return suite_venv()


def test_c40_row_bound_with_and_without_cuda_graphs(sg23, fi):
    eng = _eng(sg23)
    seed = DecodeTensor()                             # bf16 [3, 7168]: batch 1 x 3 EAGLE-3 tokens
    cfg = parse_server_config("", PCIE_ON, eng)
    b = pi.row_bound(eng, cfg, seed)
    assert b["admits"] is True and b["max_numel"] is None and "largest captured batch" in b["source"]
    # without CUDA graphs: the fixed 64-row width, read from _FALLBACK_DECODE_WIDTH
    nog = parse_server_config("--disable-cuda-graph", PCIE_ON, eng)
    b = pi.row_bound(eng, nog, seed)
    assert b["rows"] == 64 and b["max_numel"] == 64 * 7168 and "pcie_ipc_ar.py:81 _FALLBACK_DECODE_WIDTH" in b["where"]
    wide = DecodeTensor(batch=32)                     # 96 rows > 64: stays on NCCL
    assert pi.row_bound(eng, nog, wide)["admits"] is False
    d, _ = _dispatch(eng, "--disable-cuda-graph", PCIE_ON, wide)
    assert d.serves == "nccl-ring" and d.step(PCIE).admits is False
    # a captured max batch given: batch x draft tokens
    mbs = parse_server_config("--cuda-graph-max-bs-decode 16 --speculative-algorithm EAGLE3 "
                              "--speculative-num-draft-tokens 4", PCIE_ON, eng)
    b = pi.row_bound(eng, mbs, DecodeTensor(tokens=4, batch=16))
    assert b["rows"] == 64 and b["admits"] is True
    assert pi.row_bound(eng, mbs, DecodeTensor(tokens=4, batch=17))["admits"] is False
    # SGLANG_PCIE_IPC_MAX_NUMEL overrides
    ov = parse_server_config("", PCIE_ON + ["SGLANG_PCIE_IPC_MAX_NUMEL=7168"], eng)
    assert pi.row_bound(eng, ov, seed)["admits"] is False
    ev = {e.what: e for e in pi.pcie_ipc_admission(eng, cfg, seed)}
    assert "admitted when rows x hidden <= the bound" in ev["prefill chunks"].value
    assert ev["world sizes"].value["supported"] == [2, 4, 8]
    assert ev["opt-in"].value["on"] is True and ev["autotune at warmup"].value["runs"] is True
    assert "none" in ev["peer-to-peer check"].value
    det = pi.pcie_ipc_admission(eng, parse_server_config("--enable-deterministic-inference", PCIE_ON, eng), seed)
    assert next(e for e in det if e.what.startswith("deterministic")).value["on"] is True
    d, _ = _dispatch(eng, "--enable-deterministic-inference", PCIE_ON)
    assert d.serves == "nccl-ring" and d.step(PCIE).built is False


def test_c48_loosened_init_rule_stays_blocked_by_should_custom_ar(venv_suite, sg23, tmp_path):
    rel = "sglang/srt/distributed/device_communicators/custom_all_reduce_utils.py"
    copy = engine_copy(sg23, tmp_path / "sg", {rel: ("if world_size > 2 and not full_nvlink:",
                                                     "if world_size > 8 and not full_nvlink:")})
    report, _ = run_suite(venv_suite, [copy], ["--backend", "sglang-custom-allreduce"])
    v = verdict(report, "sglang-custom-allreduce", "engine")
    assert evidence(v, "engine gate: PCIe world-size rule")["value"]["admits"] is True     # the loosened init rule
    per = evidence(v, "engine gate: per-call check should_custom_ar")
    assert per["value"]["admits"] is False                                                 # its own condition
    assert "custom_all_reduce.py:274 should_custom_ar" in per["source"] and "self.world_size == 2" in per["source"]
    assert v["status"] == "blocked" and v["gate"] == "topology"


def test_unknown_server_flag_is_a_one_paragraph_error(sg23, venv_suite):
    eng = _eng(sg23)
    with pytest.raises(ConfigError) as e:
        parse_server_config("--enable-symm-memory", [], eng)
    msg = str(e.value)
    assert "\n" not in msg and "--enable-symm-memory is not a server flag of the installed sglang 0.5.23" in msg
    assert "did you mean --enable-symm-mem" in msg
    for bad, needle in (("--tp-size", "takes a value"), ("--enable-symm-mem=1", "takes no value"),
                        ("--moe-a2a-backend nope", "not one of")):
        with pytest.raises(ConfigError, match=needle):
            parse_server_config(bad, [], eng)
    with pytest.raises(ConfigError, match="is not NAME=VALUE"):
        parse_server_config("", ["1BAD"], eng)
    _, p = run_suite(venv_suite, [sg23], ["--server-args", "--enable-symm-memory"], check=False)
    assert p.returncode == 2 and "did you mean --enable-symm-mem" in p.stderr


def test_cli_records_config_dispatch_and_launch_environment(venv_suite, sg23, fi):
    report, _ = run_suite(venv_suite, [sg23, fi], ["--backend", "nccl-ring", "--server-args", "--enable-symm-mem",
                                                   "--env", PCIE_ON[0]])
    assert report["engines"][0]["server_config"]["args"] == {"--enable-symm-mem": True}
    assert report["engines"][0]["server_config"]["env"] == {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    assert report["engines"][0]["dispatch"]["serves"] == "nccl-symm-mem"
    assert report["engines"][0]["dispatch"]["preempted"] == {PCIE: "nccl-symm-mem"}
    le = report["engines"][0]["launch_environment"]
    assert le["NCCL_CUMEM_ENABLE"]["value"] == "1" and le["NCCL_NVLS_ENABLE"]["value"] == "1"
    assert le["CUDA_DEVICE_MAX_CONNECTIONS"] == {"value": "8", "source":
                                                 "sglang/srt/entrypoints/engine.py:1921 _set_envs_and_config"}
    names = {p["backend"] for p in report["engines"][0]["paths"]}
    assert {"nccl-symm-mem", "dp-attention", "--moe-a2a-backend deepep", "triton_symm_mem_ag.py"} <= names
    plain, _ = run_suite(venv_suite, [sg23, fi], ["--backend", "nccl-ring"])
    assert plain["engines"][0]["dispatch"]["serves"] == "nccl-ring"
    assert plain["engines"][0]["launch_environment"]["NCCL_CUMEM_ENABLE"]["value"] == "0"


def test_invoke_validate_passes_server_args_and_env_to_the_suite(venv_suite, sg23, fi, monkeypatch):
    import os

    from cudastack.core.errors import UsageError
    from cudastack.jobs.validate import SUITE_DIR, suite_args, validate_here
    args = suite_args(server_args="--enable-symm-mem", server_env={"A": "1"})
    assert "--server-args=--enable-symm-mem" in args and args[args.index("--env") + 1] == "A=1"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(map(str, (SUITE_DIR, sg23, fi))))
    r = validate_here("12.0", python=str(venv_suite), topology="pcie", server_args="--enable-symm-mem",
                      server_env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}, extra=["--backend", "nccl-ring"])
    assert r.server_config["args"] == {"--enable-symm-mem": True}
    assert r.dispatch["serves"] == "nccl-symm-mem" and r.dispatch["preempted"] == {PCIE: "nccl-symm-mem"}
    assert any(e["what"] == "row bound" for e in r.dispatch["pcie_ipc_admission"])
    assert "SGLang's dispatch for a decode allreduce" in r.to_markdown()
    with pytest.raises(UsageError, match="--enable-symm-memory is not a server flag"):
        validate_here("12.0", python=str(venv_suite), server_args="--enable-symm-memory")


def test_a_step_to_an_unknown_call_is_an_error_never_a_pass(sg23, fi, tmp_path):
    copy = engine_copy(sg23, tmp_path / "sg", {PS: (
        "        if self._can_use_flashinfer_allreduce(input_):\n            return flashinfer_allreduce(",
        "        if self._can_use_ring(input_):\n            return ring_allreduce(input_)\n"
        "        if self._can_use_flashinfer_allreduce(input_):\n            return flashinfer_allreduce(")})
    with pytest.raises(DispatchError, match=r"`self._can_use_ring\(input_\)` hands the tensor to a path this reader "
                                            "cannot map"):
        _dispatch(_eng(copy), env=PCIE_ON)


@pytest.mark.parametrize("modules,importable", [(("__init__.py",), False),
                                                (("__init__.py", "ext/__init__.py", "default_algos/__init__.py"), True)])
def test_mscclpp_package_reads_the_submodules_sglang_imports(sg23, tmp_path, monkeypatch, modules, importable):
    """PyMscclppCommunicator imports mscclpp, mscclpp.ext and mscclpp.default_algos (sglang 0.5.23 pymscclpp.py:
    1048-1050), any ImportError leaving it disabled (:1051-1057). Before: only the top-level package was looked up,
    so a mscclpp package without ext read importable. The twin: with both subpackages (as microsoft/mscclpp ships
    them) it is importable. Nothing is imported: the planted package's __init__ would raise."""
    from stackprobe.engines.sglang import dispatch as dw

    pkg = tmp_path / "site" / "mscclpp"
    for rel in modules:
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text("raise RuntimeError('imported')\n" if rel == "__init__.py" else "")
    monkeypatch.syspath_prepend(str(pkg.parent))
    got = dw.mscclpp_package(_eng(sg23))
    assert got["modules"] == ["mscclpp", "mscclpp.ext", "mscclpp.default_algos"]
    assert got["importable"] is importable and "mscclpp" not in sys.modules
    if importable:
        assert got["why"].startswith("the mscclpp package is importable here")
    else:
        assert got["why"].startswith("the mscclpp package is not importable here as SGLang imports it "
                                     "(mscclpp.ext, mscclpp.default_algos not found in it)"), got["why"]
        assert "pymscclpp.py:1047-1057" in got["why"]
