"""Issue "Every verdict a maintainer would sign": each numbered point of two reviews of the SGLang and vLLM answers,
read from the real wheels from PyPI (sglang 0.5.9 / 0.5.23, flashinfer-python 0.6.3 / 0.7.2, vllm 0.33.0 / 0.34.0 /
0.21.0), with edited copies where a point needs a release that does not exist. Cases C61-C63 among them. Each test
names the point it covers; each fails on the behaviour before the change (the reason is in its docstring)."""
from __future__ import annotations

import json
import subprocess

import pytest

from stackprobe.report import Report
from stackprobe.userwords import headline, headline_line
from validate_support import engine_copy, evidence, pip_target, suite_env, verdict

pytestmark = pytest.mark.network

EP = "ep-flashinfer-a2a"
PCIE = "flashinfer-pcie-ipc-allreduce"
NO_NVCC = {"CUDA_HOME": "/nonexistent-cuda"}

DRIVER = """
import json, sys
from stackprobe.static import run_static
from stackprobe.serverconfig import ServerConfig
from stackprobe.engines import select
cfg, kw = json.loads(sys.argv[1]), json.loads(sys.argv[2])
engines = select(kw.pop("engine"))
sc = ServerConfig(args=cfg.get("args", {}), env=cfg.get("env", {}), source="test")
configs = {e.name: e.parse_config(cfg.get("argv", ""), []) for e in engines} if cfg.get("argv") else None
print(json.dumps(run_static(server_config=sc, engines=engines, **kw).to_json(), default=str))
"""


@pytest.fixture(scope="module")
def drive(venv, tmp_path_factory):
    """``drive(paths, args=..., env=..., backends=..., extra=..., engine=...)`` -> (report dict, Report) of the static
    tier for 12.0, PCIe, world size 8 and that server configuration."""
    script = tmp_path_factory.mktemp("driver") / "drive.py"
    script.write_text(DRIVER)

    def run(paths, *, args=None, env=None, backends=(), extra=None, engine="auto", path_first=None):
        kw = {"topology": "pcie", "world_size": 8, "backends": list(backends) or None, "engine": engine}
        p = subprocess.run([str(venv), str(script), json.dumps({"args": args or {}, "env": env or {}}), json.dumps(kw)],
                           capture_output=True, text=True, timeout=900,
                           env=suite_env(paths, extra=extra, path_first=path_first))
        assert p.returncode == 0, p.stderr[-3000:]
        d = json.loads(p.stdout)
        return d, Report.from_json(d)
    return run


# --- point 1 and C61: EP over FlashInfer all-to-all ------------------------------------------------------------
@pytest.fixture(scope="module")
def ep059(drive, sglang059, fi063):
    """sglang 0.5.9 + flashinfer-python 0.6.3, no nvcc in reach (CUDA_HOME points nowhere, PATH has none)."""
    return drive([sglang059, fi063], backends=(EP, PCIE), extra=NO_NVCC)


def test_c61_point1a_blocked_library_is_not_worth_measuring_and_the_headline_says_why(ep059):
    """Point 1(a), case C61. Before: the headline read "opt-in, worth measuring on the target: ep-flashinfer-a2a"
    while the same report's library answer was blocked (toolchain)."""
    d, report = ep059
    lib, eng = verdict(d, EP, "library"), verdict(d, EP, "engine")
    assert (lib["status"], lib["gate"]) == ("blocked", "toolchain") and eng["status"] == "opt-in"
    h, line = headline(report), headline_line(report)
    assert not any(EP in x for x in h["opt_in"])
    assert "worth measuring on the target: ep-flashinfer-a2a" not in line
    assert "not worth measuring here: ep-flashinfer-a2a" in line
    assert "the library is blocked (toolchain) here: no nvcc in reach" in line


def test_c61_point1a_twin_an_unblocked_library_leaves_it_worth_measuring(drive, sglang059, fi063, nvcc131):
    """The failing twin of C61: with an nvcc in reach the library answer waits for GPUs, and the engine's opt-in
    stays worth measuring (the library gate can pass as well as fail)."""
    d, report = drive([sglang059, fi063], backends=(EP,), extra=NO_NVCC, path_first=[nvcc131])
    assert verdict(d, EP, "library")["gate"] == "needs-runtime"
    assert "opt-in, worth measuring on the target: ep-flashinfer-a2a" in headline_line(report)


def test_point1e_all_to_all_has_its_own_line_apart_from_the_decode_allreduce(ep059):
    """Point 1(e). Before: EP all-to-all was listed first among the decode-allreduce opt-ins."""
    _, report = ep059
    h, line = headline(report), headline_line(report)
    assert not any(EP in x for k in ("opt_in", "library_blocked", "do_not_set", "falls_back", "preempted")
                   for x in h[k])
    assert list(h["other"]) == ["MoE all-to-all for expert parallelism"]
    part = line.split("apart from the decode allreduce, ")[1]
    assert part.startswith("MoE all-to-all for expert parallelism (it changes the deployment): ")
    allreduce_part = line.split("apart from the decode allreduce")[0]
    assert EP not in allreduce_part


def test_point1b_fd_exchange_read_from_each_flashinfer_release(ep059, drive, sglang, fi):
    """Point 1(b). Before: every release read "SYS_PTRACE for the fd exchange". FlashInfer 0.6.3 takes peers' fds with
    pidfd_getfd (ptrace access); 0.7.2 passes them over SCM_RIGHTS (flashinfer/comm/fd_exchange.py:15-19)."""
    d, _ = ep059
    old = evidence(verdict(d, EP, "library"), "MnnvlMemory POSIX fd exchange")
    assert old["value"].startswith("pidfd_getfd") and "CAP_SYS_PTRACE" in old["value"]
    assert old["source"] == "flashinfer/comm/mnnvl.py:503 open_mnnvl_memory"
    d2, _ = drive([sglang, fi], backends=(EP,), extra=NO_NVCC)
    for v in (verdict(d2, EP, "library"), verdict(d2, EP, "engine")):
        new = evidence(v, "MnnvlMemory POSIX fd exchange")
        assert new["value"].startswith("SCM_RIGHTS") and "no CAP_SYS_PTRACE is needed" in new["value"]
        assert new["source"] == "flashinfer/comm/mnnvl.py:398 _create_and_map_handles -> flashinfer/comm/fd_exchange.py exchange_fds"
        assert "SYS_PTRACE for the fd exchange" not in json.dumps(v)


def test_point1b_twin_a_planted_pidfd_exchange_in_0_7_2_reads_ptrace(venv, fi, tmp_path):
    """The twin: the 0.7.2 wheel edited so MnnvlMemory takes fds with pidfd_getfd again reads ptrace, not SCM_RIGHTS."""
    rel = "flashinfer/comm/mnnvl.py"
    copy = engine_copy(fi, tmp_path / "fi", {rel: ("all_handles_data = exchange_fds(comm, exported_fd)",
                                                   "all_handles_data = [SYS_pidfd_getfd for _ in ()]")})
    p = subprocess.run([str(venv), "-c", "from stackprobe.probes.ep_flashinfer_a2a import _fd_exchange; "
                        "print(_fd_exchange()[0])"], capture_output=True, text=True, env=suite_env([copy]), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("pidfd_getfd")


def test_point1c_dp_attention_advised_with_the_flag_that_replaces_the_deprecated_one(drive, sglang, sglang059, fi, fi063):
    """Point 1(c). Before: 0.5.23's lift read "--enable-dp-attention --dp-size 8", a flag 0.5.23 deprecates for
    --attn-dp-size (srt/server_args.py:416-424); 0.5.9, which does not deprecate it, keeps the old pair."""
    d, _ = drive([sglang, fi], backends=(EP,), extra=NO_NVCC)
    g = evidence(verdict(d, EP, "engine"), "engine gate: required setting: DP attention")
    sp = g["value"]["value"]["spelling"]
    assert sp["flags"] == ["--attn-dp-size", "8"] and sp["deprecated"] == ["--enable-dp-attention", "--dp-size"]
    assert sp["note"].startswith("--enable-dp-attention is deprecated in sglang 0.5.23 for --attn-dp-size <dp-size> "
                                 "(sglang/srt/server_args.py:418-424")
    d9, _ = drive([sglang059, fi063], backends=(EP,), extra=NO_NVCC)
    assert "--attn-dp-size" not in json.dumps(verdict(d9, EP, "engine"))
    # the user who gives the new flag has DP attention set
    d3, _ = drive([sglang, fi], backends=(EP,), extra=NO_NVCC,
                  args={"--moe-a2a-backend": "flashinfer", "--attn-dp-size": "8"})
    g3 = evidence(verdict(d3, EP, "engine"), "engine gate: required setting: DP attention")
    assert g3["value"]["admits"] is True


def test_point1d_quantization_assert_is_read_and_a_wrong_quantization_is_a_start_up_failure(drive, sglang059, fi063):
    """Point 1(d). Before: the quantization assert under the flashinfer_cutlass runner (0.5.23 moe_hook.py:80-88,
    0.5.9 server_args.py:2137-2141) was not read, so --quantization fp8 still read opt-in / on as configured."""
    args = {"--moe-a2a-backend": "flashinfer", "--moe-runner-backend": "flashinfer_cutlass"}
    ok, _ = drive([sglang059, fi063], backends=(EP,), extra=NO_NVCC, args=args)
    g = evidence(verdict(ok, EP, "engine"), "engine gate: required setting: quantization with --moe-runner-backend")
    assert g["value"] == {"admits": True, "value": {"allowed": ["modelopt_fp4", "modelopt_fp8", None], "configured": None}}
    assert g["source"].startswith("sglang/srt/server_args.py:2137-2141 `assert self.quantization in")
    bad, _ = drive([sglang059, fi063], backends=(EP,), extra=NO_NVCC, args={**args, "--quantization": "fp8"})
    v = verdict(bad, EP, "engine")
    assert v["status"] == "startup-failure-if-set" and "AssertionError" in v["cause"] and "'fp8'" in v["cause"]


# --- point 11 and C63: readers across vLLM releases ------------------------------------------------------------
@pytest.fixture(scope="module")
def v034():
    """vllm 0.34.0 beside flashinfer-python 0.7.4: 0.34.0 pins flashinfer-python==0.7.3, which PyPI lacks, so both
    are installed without dependencies (the suite reads source only)."""
    return [pip_target("vllm==0.34.0"), pip_target("flashinfer-python==0.7.4")]


@pytest.fixture(scope="module")
def v021():
    return [pip_target("vllm==0.21.0"), pip_target("flashinfer-python==0.7.2")]


def test_c63_vllm_0_34_two_sided_is_a_start_up_failure_through_moe_ep(drive, v034):
    """Case C63. Before: "error: gate not found" (the reader looked for flashinfer.comm.mnnvl), and the headline
    dropped EP silently."""
    d, report = drive(v034, backends=(EP,), engine="vllm")
    v = next(x for x in d["verdicts"] if x["backend"] == EP and x.get("engine") == "vllm")
    assert (v["status"], v["gate"]) == ("startup-failure-if-set", "topology")
    assert "FlashInferNVLinkTwoSidedManager" in v["cause"]
    assert "flashinfer/moe_ep/backends/split/comm/nvlink_common.py:86 `raise RuntimeError(...)`" in v["cause"]
    assert "gate not found" not in json.dumps(v)
    line = headline_line(report)
    assert "MoE all-to-all for expert parallelism (it changes the deployment): do not set: " in line
    assert "ep-flashinfer-a2a: start-up failure" in line


def test_c63_twin_a_flashinfer_whose_nvlink_check_does_not_raise_leaves_it_an_opt_in(drive, v034, tmp_path):
    """The twin: the same 0.34.0 with a FlashInfer copy whose mnnvl_mapping_and_config no longer raises reads opt-in."""
    rel = "flashinfer/moe_ep/backends/split/comm/nvlink_common.py"
    src = (v034[1] / rel).read_text()
    start = src.index("        raise RuntimeError(")
    raised = src[start:src.index("        )", start) + 10]
    fi = engine_copy(v034[1], tmp_path / "fi", {rel: (raised, "        pass\n")})
    d, _ = drive([v034[0], fi], backends=(EP,), engine="vllm")
    v = next(x for x in d["verdicts"] if x["backend"] == EP and x.get("engine") == "vllm")
    assert v["status"] == "opt-in" and "start-up failure" not in v["cause"]


def test_point11_vllm_0_21_has_no_pcie_ipc_not_integrated_and_errors_stay_in_the_headline(drive, v021):
    """Point 11. Before: vllm 0.21.0's PCIe IPC read "error: gate not found" (the release has no PCIe IPC at all), the
    dispatch could not be read for the same reason, and error answers were dropped from the headline."""
    d, report = drive(v021, engine="vllm")
    vs = {x["backend"]: x for x in d["verdicts"] if x.get("engine") == "vllm"}
    assert (vs[PCIE]["status"], vs[PCIE]["gate"]) == ("not-integrated", "not-integrated")
    assert "never mentions PcieIpcAllReduce or FLASHINFER_PCIE_IPC" in vs[PCIE]["cause"]
    assert d["engines"][0]["dispatch"].get("serves") == "nccl-ring" and "error" not in d["engines"][0]["dispatch"]
    errors = [b for b, x in vs.items() if x["status"] == "error"]
    assert errors, "vllm 0.21.0 has a path this reader does not know (the all-to-all's use_all2all)"
    line = headline_line(report)
    assert "not assessed (the reader could not answer for this release" in line
    for b in errors:
        assert f"{b} (vllm answer error: not assessed: vllm 0.21.0 is a release this reader does not know" in line


def test_point11_twin_a_renamed_variable_in_a_release_that_has_pcie_ipc_stays_an_error(drive, tmp_path):
    """The twin: vllm 0.33.0 with its PCIe IPC variable renamed still ships the path (its module mentions
    PcieIpcAllReduce), so the reader's miss is an error shown as not assessed, never "not integrated"."""
    vllm = pip_target("vllm==0.33.0")
    root = engine_copy(vllm, tmp_path / "vllm", {"vllm/envs.py": ('"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": lambda',
                                                                 '"VLLM_ALLREDUCE_USE_FI_PCIE_IPC": lambda')})
    d, report = drive([root, pip_target("flashinfer-python==0.7.2.post1")], backends=(PCIE,), engine="vllm")
    v = next(x for x in d["verdicts"] if x["backend"] == PCIE and x.get("engine") == "vllm")
    assert v["status"] == "error"
    assert f"{PCIE} (vllm answer error" in headline_line(report)


# --- point 8 and C62: the answer per decode width ---------------------------------------------------------------
NCCL_SYMM_AND_PCIE = {"VLLM_USE_NCCL_SYMM_MEM": "1", "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1"}


@pytest.fixture(scope="module")
def v033():
    return [pip_target("vllm==0.33.0"), pip_target("flashinfer-python==0.7.2.post1")]


def test_c62_point8_nccl_symmetric_memory_and_pcie_ipc_per_decode_width(drive, v033):
    """Case C62, point 8. Before: one row count (the 3-row verify tensor) was the answer: "NCCL symmetric memory falls
    back if set", although at world size 8 its band (all_reduce_utils.py) leaves it 1 row and 10 rows or more, where
    it preempts PCIe IPC."""
    d, report = drive(v033, env=NCCL_SYMM_AND_PCIE, engine="vllm")
    pw = d["engines"][0]["dispatch"]["per_width"]
    assert [(g["serves"], g["rows"]) for g in pw["ranges"]] == [
        ("nccl-symm-mem", "1"), ("flashinfer-pcie-ipc-allreduce", "2-9"), ("nccl-symm-mem", "10-512")]
    assert pw["ranges"][1]["captured"] == [2, 3, 4, 6, 8, 9]          # draft steps and 3-token verify steps
    assert {w["rows"]: w["serves"] for w in pw["widths"]}[18] == "nccl-symm-mem"
    assert pw["source"].startswith("vllm/config/vllm.py:") and "default_max_graph_size" in pw["source"]
    line = headline_line(report)
    assert ("per decode width: nccl-symm-mem at 1 and 10-512 rows; flashinfer-pcie-ipc-allreduce at 2-9 rows"
            in line)
    assert "falls back to" not in line or "VLLM_USE_NCCL_SYMM_MEM=1 (nccl-symm-mem)" not in line
    nccl = next(x for x in d["verdicts"] if x["backend"] == "nccl-symm-mem" and x.get("engine") == "vllm")
    assert "One row count is not the answer" in nccl["cause"]


def test_c62_twin_without_nccl_symmetric_memory_one_path_serves_every_width(drive, v033):
    """The twin: PCIe IPC alone serves every captured width, and the headline names no per-width split."""
    d, report = drive(v033, env={"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1"}, engine="vllm")
    assert [g["serves"] for g in d["engines"][0]["dispatch"]["per_width"]["ranges"]] == ["flashinfer-pcie-ipc-allreduce"]
    assert "per decode width" not in headline_line(report)


# --- point 12: the comparison names the right engine's release ---------------------------------------------------
def test_point12_a_vllm_comparison_names_vllm_as_the_release_that_moved_a_verdict(drive, v033, v034):
    """Point 12. Before: userwords._decider knew sglang, flashinfer-python and the toolkit only, so the EP move from
    vllm 0.33.0 (opt-in) to 0.34.0 (start-up failure) was put on flashinfer-python."""
    from stackprobe.userwords import moved_by
    _, before = drive(v033, backends=(EP,), engine="vllm")
    _, after = drive(v034, backends=(EP,), engine="vllm")
    assert before.verdict(EP).status == "opt-in" and after.verdict(EP).status == "startup-failure-if-set"
    text = moved_by(before, after, EP)
    assert text.startswith("vllm 0.33.0 -> 0.34.0 (its gate decides)")
    assert "also moved: flashinfer-python 0.7.2.post1 -> 0.7.4" in text and "sglang" not in text


# --- points 3, 4, 5: SGLang's PCIe IPC beside its opt-in ----------------------------------------------------------
PCIE_REL = "sglang/srt/distributed/device_communicators/pcie_ipc_ar.py"


@pytest.fixture(scope="module")
def pcie23(drive, sglang, fi, nvcc131):
    return drive([sglang, fi], backends=(PCIE,), path_first=[nvcc131])


def test_point3_a_failed_set_up_is_caught_and_the_user_is_told_how_to_confirm_it_served(pcie23):
    """Point 3. Before: the report never said that a failed PCIe IPC set-up is caught (parallel_state.py:492-501,
    pcie_ipc_ar.py:286-295) and leaves the server on NCCL with one warning, nor which log lines confirm the path
    served, nor that --disable-flashinfer-autotune skips FlashInfer's tuning."""
    d, _ = pcie23
    v = verdict(d, PCIE, "engine")
    assert v["status"] == "opt-in"
    caught = evidence(v, "set-up failure: caught")["value"]
    assert [c["where"] for c in caught] == [
        "sglang/srt/distributed/parallel_state.py:492-501 (__init__)",
        f"{PCIE_REL}:278-295 (_ensure_workspace)", f"{PCIE_REL}:359-368 (_tune)"]
    assert caught[0]["warning"] == "Setup FlashInfer PCIe-IPC allreduce failed with {e}."
    lines = [c["line"] for c in evidence(v, "how to confirm it served")["value"]]
    assert lines == ["FlashInfer PCIe-IPC workspace built (world=%d, max_numel=%d, hidden=%d)",
                     "FlashInfer PCIe-IPC all-reduce autotuned %d shape(s) (hidden=%d, rows=%s)"]
    assert evidence(v, "autotune switch")["value"] == "--disable-flashinfer-autotune"
    assert "the server starts on NCCL with one warning" in v["cause"]
    assert "--disable-flashinfer-autotune (sglang/srt/arg_groups/fields/exec_.py:394) skips" in v["cause"]


def test_point3_twin_an_uncaught_constructor_is_not_read_as_caught(venv, sglang):
    """The twin: with the constructor's handler gone (an edited copy), the reader finds no caught set-up and says so
    (GateNotFound: the answer becomes an error, never a quiet fallback it did not read)."""
    import tempfile
    from pathlib import Path
    rel = "sglang/srt/distributed/parallel_state.py"
    src = (sglang / rel).read_text()
    old = 'logger.warning(f"Setup FlashInfer PCIe-IPC allreduce failed with {e}.")'
    with tempfile.TemporaryDirectory() as tmp:
        copy = engine_copy(sglang, Path(tmp) / "sg", {rel: (old, "raise")})
        assert old in src
        p = subprocess.run([str(venv), "-c", "from stackprobe.engines.sglang import engine as se\nfrom stackprobe.probes import pcie_ipc_engine as pe\n"
                            "try:\n    pe.setup_fallback(se.installed())\nexcept se.GateNotFound as e:\n    print('GNF', e)"],
                           capture_output=True, text=True, env=suite_env([copy]), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.startswith("GNF gate not found in sglang 0.5.23 at sglang/srt/distributed/parallel_state.py")


def test_point4_do_not_set_beside_the_opt_in_is_read_from_the_dispatch(pcie23):
    """Point 4. Before: the configuration that turns PCIe IPC on was not told to leave --enable-deterministic-inference
    (turns it off; NCCL_ALGO=allreduce:tree, so pynccl on Tree) and --enable-symm-mem (preempts it; sets NCCL_CUMEM_ENABLE=1, NCCL_NVLS_ENABLE=1) unset."""
    d, report = pcie23
    v = verdict(d, PCIE, "engine")
    avoid = {a["setting"]: a for a in evidence(v, "do not set with it")["value"]}
    assert avoid["--enable-symm-mem"]["then"] == "nccl-symm-mem"
    also = " ".join(avoid["--enable-symm-mem"]["also_sets"])
    assert "NCCL_CUMEM_ENABLE=" in also and "NCCL_NVLS_ENABLE=" in also and "srt/entrypoints/engine.py:19" in also
    det = avoid["--enable-deterministic-inference"]
    assert det["then"] == "NCCL (pynccl, allreduce algorithm tree)"
    assert "NCCL_ALGO='allreduce:tree'" in " ".join(det["also_sets"])
    assert det["where"] == "sglang/srt/distributed/device_communicators/pcie_ipc_ar.py:111"   # what turns it off
    assert "SGLANG_USE_1STAGE_ALLREDUCE=1" in avoid
    line = headline_line(report)
    assert "do not set with it: " in line and "--enable-symm-mem (nccl-symm-mem serves instead: " in line


def test_point4_twin_a_setting_already_given_is_not_listed_and_nothing_is_listed_when_the_path_does_not_serve(
        drive, sglang, fi, nvcc131):
    """The twin: with --enable-symm-mem given PCIe IPC does not serve (preempted), so there is nothing to protect."""
    d, _ = drive([sglang, fi], backends=(PCIE,), path_first=[nvcc131], args={"--enable-symm-mem": True})
    v = verdict(d, PCIE, "engine")
    assert evidence(v, "do not set with it")["value"] == []


def test_review26_enable_mscclpp_is_not_listed_without_the_mscclpp_package(pcie23):
    """Review item 26. Before: "--enable-mscclpp (nccl-ring serves instead)": the dispatch left undecided by MSCCL++'s
    run-time per-call check was read as NCCL. Without the mscclpp package (not among sglang 0.5.23's Requires-Dist,
    not in this environment) PyMscclppCommunicator stays disabled (pymscclpp.py:1029, 1047-1057), so PCIe IPC still
    serves and the flag is not listed."""
    d, report = pcie23
    v = verdict(d, PCIE, "engine")
    avoid = {a["setting"]: a for a in evidence(v, "do not set with it")["value"]}
    assert "--enable-mscclpp" not in avoid
    assert "--enable-symm-mem" in avoid                 # the list itself is still read
    assert "--enable-mscclpp (" not in headline_line(report)


def test_review26_twin_with_the_mscclpp_package_importable_mscclpp_serves_captured_decode(drive, sglang, fi, nvcc131,
                                                                                          tmp_path):
    """The twin: the same wheels with a package named mscclpp on the path (its three modules, empty: only
    importability is read, with importlib.util.find_spec) list --enable-mscclpp as taken over by MSCCL++ for captured
    decode (parallel_state.py:669 change_state(enable=True); :966-973; :983), naming the package, never as NCCL."""
    pkg = tmp_path / "site" / "mscclpp"
    pkg.mkdir(parents=True)
    for m in ("__init__.py", "ext.py", "default_algos.py"):
        (pkg / m).write_text("")
    d, _ = drive([sglang, fi, pkg.parent], backends=(PCIE,), path_first=[nvcc131])
    v = verdict(d, PCIE, "engine")
    avoid = {a["setting"]: a for a in evidence(v, "do not set with it")["value"]}
    m = avoid["--enable-mscclpp"]
    assert m["then"] == "mscclpp" and m["needs"] == "mscclpp"
    assert m["note"].startswith("MSCCL++ serves captured decode instead: the mscclpp package is importable here")
    assert "pymscclpp.py:1047-1057" in m["note"] and "without the mscclpp package --enable-mscclpp has no effect" in m["note"]
    assert "--enable-mscclpp (MSCCL++ serves captured decode instead" in v["cause"]
    assert "--enable-mscclpp (nccl-ring serves instead)" not in v["cause"]


def test_point5_upstreams_figure_names_its_hidden_size_beside_the_workloads(pcie23):
    """Point 5. Before: upstream's 12 KiB figure was cited without saying it was measured at hidden 6144, not the
    workload's 7168."""
    _, report = pcie23
    line = headline_line(report)
    assert "12 KiB: FlashInfer 5.3 us, NCCL 205.1 us" in line
    assert "measured at hidden 6144, not the workload's 7168" in line


# --- point 2: the fusion raise's call chain per backend value ---------------------------------------------------------
FUSION = "flashinfer-allreduce-fusion"
AUTO_PATH = ("pre_initialize_workspaces (sglang/srt/model_executor/runner/base_runner.py:329) -> "
             "ensure_workspace_initialized (sglang/srt/layers/flashinfer_comm_fusion.py:1063) -> "
             "resolve_flashinfer_allreduce_fusion_backend (sglang/srt/layers/flashinfer_comm_fusion.py:778) -> "
             "_resolve_backend (sglang/srt/layers/flashinfer_comm_fusion.py:100)")
CUTEDSL_PATH = ("resolve_flashinfer_allreduce_fusion_backend (sglang/srt/model_executor/runner/base_runner.py:317) -> "
                "_resolve_backend (sglang/srt/layers/flashinfer_comm_fusion.py:100)")


def _platform(v: dict) -> dict:
    return evidence(v, "engine gate: platform check")["value"]["value"]


def test_point2_fusion_call_chain_follows_the_backend_value(drive, sglang, fi, nvcc131):
    """Point 2. Before: every value was cited through base_runner.py:317, the branch only cutedsl takes (the shortest
    path, whatever the configuration)."""
    d, _ = drive([sglang, fi], backends=(FUSION,), path_first=[nvcc131])
    v = verdict(d, FUSION, "engine")
    per = _platform(v)["call path per value"]
    assert AUTO_PATH in per["auto/trtllm/mnnvl"] and CUTEDSL_PATH in per["cutedsl"]
    assert AUTO_PATH in _platform(v)["call path"]                                      # the default value, auto
    d2, _ = drive([sglang, fi], backends=(FUSION,), path_first=[nvcc131],
                  args={"--flashinfer-allreduce-fusion-backend": "cutedsl"})
    assert CUTEDSL_PATH in _platform(verdict(d2, FUSION, "engine"))["call path"]


def test_point2_twin_a_predicate_that_names_another_value_moves_the_path(drive, sglang, fi, nvcc131, tmp_path):
    """The twin: an edited copy whose uses_cutedsl_ar_fusion() tests "auto" sends auto through :317 instead."""
    rel = "sglang/srt/layers/flashinfer_comm_fusion.py"
    copy = engine_copy(sglang, tmp_path / "sg", {rel: ('return get_exec().comm.flashinfer_allreduce_fusion_backend == "cutedsl"',
                                                      'return get_exec().comm.flashinfer_allreduce_fusion_backend == "auto"')})
    d, _ = drive([copy, fi], backends=(FUSION,), path_first=[nvcc131])
    per = _platform(verdict(d, FUSION, "engine"))["call path per value"]
    assert CUTEDSL_PATH in per["auto"] and AUTO_PATH in per["trtllm/mnnvl/cutedsl"]


# --- point 10: vLLM's two-sided all-to-all and the expert kernels -------------------------------------------------
def test_point10_expert_kernel_gate_and_the_deprecated_flashinfer_class_are_read(drive, v033):
    """Point 10. Before: the two-sided answer did not read the expert-kernel gate (Triton triton_moe.py:187-191,
    DeepGEMM, CUTLASS and Marlin refuse two-sided) nor that FlashInfer's MnnvlMoe behind it is deprecated since 0.7.1
    (trtllm_alltoall.py:434-447)."""
    d, _ = drive(v033, backends=(EP,), engine="vllm")
    v = next(x for x in d["verdicts"] if x["backend"] == EP and x.get("engine") == "vllm")
    k = evidence(v, "expert kernels and the two-sided all-to-all")["value"]
    refuse = " ".join(k["refuse"])
    for cls in ("TritonExperts (vllm/model_executor/layers/fused_moe/experts/triton_moe.py:187)", "DeepGemmExperts",
                "MarlinExpertsBase", "CutlassExperts"):
        assert cls in refuse
    assert "MnnvlMoe, deprecated since 0.7.1 (flashinfer/comm/trtllm_alltoall.py:440" in v["cause"]


def test_point10_twin_a_triton_kernel_that_admits_two_sided_is_not_listed_as_refusing(drive, v033, tmp_path):
    rel = "vllm/model_executor/layers/fused_moe/experts/triton_moe.py"
    src = (v033[0] / rel).read_text()
    old = ("        return not (\n            moe_parallel_config.use_fi_nvl_two_sided_kernels\n"
           "            or moe_parallel_config.use_fi_nvl_one_sided_kernels\n        )")
    assert src.count(old) >= 1
    copy = engine_copy(v033[0], tmp_path / "v", {rel: (old, "        return True")})
    d, _ = drive([copy, v033[1]], backends=(EP,), engine="vllm")
    v = next(x for x in d["verdicts"] if x["backend"] == EP and x.get("engine") == "vllm")
    k = evidence(v, "expert kernels and the two-sided all-to-all")["value"]
    assert not any(x.startswith("TritonExperts ") for x in k["refuse"])


FI_CUTLASS = "vllm/model_executor/layers/fused_moe/experts/flashinfer_cutlass_moe.py"


def test_review12_expert_kernels_that_admit_two_sided_on_12_0_are_read_from_their_own_predicates(drive, v033):
    """Review item 12. Before: FlashInferExperts (flashinfer_cutlass_moe.py:194 returns True; its device check
    :128-139 admits capability family 120) and FlashInferMoeEpExperts (flashinfer_moe_ep.py:109) were filed under
    "unknown", and the answer read "none admit it". Now each kernel's own predicates are read for the two-sided
    parallel config and 12.0."""
    d, report = drive(v033, backends=(EP,), engine="vllm")
    v = next(x for x in d["verdicts"] if x["backend"] == EP and x.get("engine") == "vllm")
    k = evidence(v, "expert kernels and the two-sided all-to-all")["value"]
    admit = " ".join(k["admit"])
    assert f"FlashInferExperts ({FI_CUTLASS}:194); device check {FI_CUTLASS}:128-139" in admit
    assert k["assumed"]["FlashInferExperts"] == ["has_flashinfer_cutlass_fused_moe()"]
    # FlashInferMoeEpExperts admits EP, but its device check (flashinfer_moe_ep.py _SUPPORTED_CAPABILITIES) is 10.x
    assert any(x.startswith("FlashInferMoeEpExperts (") for x in k["other_device"])
    assert not any(x.startswith(("FlashInferExperts ", "FlashInferMoeEpExperts ")) for x in k["unknown"])
    assert "none admit" not in v["cause"]
    assert ("on 12.0 FlashInferExperts (experts/flashinfer_cutlass_moe.py:194, experts/flashinfer_cutlass_moe.py:"
            "128-139; given has_flashinfer_cutlass_fused_moe())") in v["cause"]
    assert "TritonOrCutlassExperts refuses as its halves do (CutlassExpertsFp8, TritonExperts" in v["cause"]
    for cls in ("TritonExperts", "DeepGemmExperts", "MarlinExpertsBase", "CutlassExpertsFp8"):
        assert cls in " ".join(k["refuse"])
    assert "on 12.0 FlashInferExperts" in report.to_markdown()


def test_review12_twin_a_flashinfer_kernel_whose_predicate_returns_false_refuses(drive, v033, tmp_path):
    """The twin: a copy of vllm 0.33.0 whose FlashInferExperts._supports_parallel_config returns False lists it as
    refusing; and one whose device check drops family 120 lists it as not for 12.0."""
    src = (v033[0] / FI_CUTLASS).read_text()
    ret = "        # TODO: the per-tensor fp8 kernels don't work with MNNVL FI A2As.\n        return True"
    assert src.count(ret) == 1
    copy = engine_copy(v033[0], tmp_path / "v", {FI_CUTLASS: (ret, ret.replace("True", "False"))})
    d, _ = drive([copy, v033[1]], backends=(EP,), engine="vllm")
    v = next(x for x in d["verdicts"] if x["backend"] == EP and x.get("engine") == "vllm")
    k = evidence(v, "expert kernels and the two-sided all-to-all")["value"]
    assert any(x.startswith("FlashInferExperts (") for x in k["refuse"])
    assert not any(x.startswith("FlashInferExperts (") for x in k["admit"])
    fam = "                or p.is_device_capability_family(120)\n"
    assert src.count(fam) == 1
    copy2 = engine_copy(v033[0], tmp_path / "v2", {FI_CUTLASS: (fam, "")})
    d, _ = drive([copy2, v033[1]], backends=(EP,), engine="vllm")
    v = next(x for x in d["verdicts"] if x["backend"] == EP and x.get("engine") == "vllm")
    k = evidence(v, "expert kernels and the two-sided all-to-all")["value"]
    assert any(x.startswith("FlashInferExperts (") for x in k["other_device"])


# --- point 6: enumeration from the installed server-argument field groups and modules ----------------------------
def test_point6_communication_settings_enumerated_from_the_field_groups_and_kernel_modules(venv, sglang):
    """Point 6. Before: the not-assessed list came from a list of names the suite knew, so --speculative-moe-a2a-backend,
    --dcp-comm-backend, --boundary-reduction, ... and the kernels under sglang/kernels/ops/communication/ were neither
    assessed nor named as not assessed."""
    p = subprocess.run([str(venv), "-c", "import json\nfrom stackprobe.engines.sglang import engine as se, paths as sp\n"
                        "print(json.dumps(sp.inventory(se.installed())))"], capture_output=True, text=True,
                       env=suite_env([sglang]), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    rows = {r["path"]: r for r in json.loads(p.stdout)}
    for flag, where in (("--speculative-moe-a2a-backend", "sglang/srt/arg_groups/fields/spec.py:181"),
                        ("--dcp-comm-backend", "sglang/srt/arg_groups/fields/parallel.py:127"),
                        ("--boundary-reduction", ""), ("--enable-scattered-sconv", ""),
                        ("--enable-fused-moe-sum-all-reduce", ""), ("--enable-quant-communications", ""),
                        ("--enable-tp-lm-head-all-to-all", "")):
        assert rows[flag]["status"] == "not-assessed" and rows[flag]["where"].startswith(where), flag
    assert rows["kernels/ops/communication/all_reduce_fusion.py"]["status"] == "not-assessed"
    assert "--moe-a2a-backend" not in rows          # judged (ep-flashinfer-a2a), listed by its choices instead


def test_point6_twin_a_new_field_in_a_copy_is_enumerated_without_teaching_the_suite(venv, sglang, tmp_path):
    """The twin: a field added to the communication group of an edited copy appears as not assessed (nothing in the
    suite names it)."""
    rel = "sglang/srt/arg_groups/fields/exec_.py"
    src = (sglang / rel).read_text()
    anchor = "class ExecComm(msgspec.Struct):\n"
    assert anchor in src
    copy = engine_copy(sglang, tmp_path / "sg", {rel: (anchor, anchor + "    enable_planted_allreduce_path: bool = False\n")})
    p = subprocess.run([str(venv), "-c", "import json\nfrom stackprobe.engines.sglang import engine as se, paths as sp\n"
                        "print(json.dumps([r['path'] for r in sp.inventory(se.installed())]))"], capture_output=True,
                       text=True, env=suite_env([copy]), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "--enable-planted-allreduce-path" in json.loads(p.stdout)


# --- point 7: the Markdown shows the not-assessed list and the per-width answer ------------------------------------
def test_point7_markdown_lists_the_not_assessed_paths_and_the_per_width_answer(pcie23, drive, v033):
    """Point 7. Before: the not-assessed list was in the JSON's ``paths`` only, and the Markdown had no per-width table."""
    d, report = pcie23
    md = report.to_markdown()
    assert f"## Not assessed here ({len(report.paths)})" in md and len(report.paths) > 10
    assert "| --speculative-moe-a2a-backend |" in md and "sglang/srt/arg_groups/fields/spec.py:181" in md
    _, vr = drive(v033, env=NCCL_SYMM_AND_PCIE, engine="vllm")
    vmd = vr.to_markdown()
    assert "### Per decode width (hidden 7168, bfloat16, 3 tokens per verify step)" in vmd
    assert "| 2-9 | flashinfer-pcie-ipc-allreduce | 2, 3, 4, 6, 8, 9 |" in vmd


def test_point7_twin_a_report_without_paths_has_no_such_section(pcie23):
    import copy
    _, report = pcie23
    bare = copy.copy(report)
    bare.engines = [{k: v for k, v in e.items() if k != "paths"} for e in report.engines]   # schema 4: per engine
    assert report.paths and not bare.paths
    assert "## Not assessed here" not in bare.to_markdown()
