"""P2P and topology before any peer-memory path (stackprobe.runtime.p2p): the IOMMU mode and ACS state read from a
fake sysfs tree and lspci text (no GPU), the skip decision, and the engine runner skipping custom allreduce and
PCIe IPC on a P2P-off topology, for real in two gloo worker processes."""
from __future__ import annotations

from dataclasses import asdict

import pytest

from stackprobe.runtime import p2p

LSPCI = """\
00:01.0 PCI bridge: Intel Corporation Root Port (rev 04) (prog-if 00 [Normal decode])
\tCapabilities: [220 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir{r} CmpltRedir{c} UpstreamFwd- EgressCtrl- DirectTrans-
41:00.0 VGA compatible controller: NVIDIA Corporation Device 2bb1 (rev a1)
"""


def _sysfs(tmp_path, group_types=(), units=("dmar0",)):
    root = tmp_path / "sys"
    (root / "class" / "iommu").mkdir(parents=True)
    for u in units:
        (root / "class" / "iommu" / u).mkdir()
    for n, t in enumerate(group_types):
        g = root / "kernel" / "iommu_groups" / str(n)
        g.mkdir(parents=True)
        (g / "type").write_text(t + "\n")
    return root


@pytest.mark.parametrize("types,cmdline,mode", [
    (("DMA-FQ", "DMA-FQ"), "quiet intel_iommu=on", "translated"),
    (("identity", "identity"), "intel_iommu=on iommu=pt", "passthrough"),
    ((), "intel_iommu=off", "off"),
    ((), "quiet", "unknown"),
])
def test_iommu_mode_from_a_fake_sysfs_tree_and_the_kernel_command_line(tmp_path, types, cmdline, mode):
    st = p2p.iommu_state(_sysfs(tmp_path, types, units=("dmar0",) if types else ()), cmdline)
    assert st["mode"] == mode
    assert st["cmdline"] == [a for a in cmdline.split() if "iommu" in a]


def test_acs_redirect_is_found_in_lspci_text_and_absent_when_off():
    on = p2p.acs_state(LSPCI.format(r="+", c="+"))
    assert on["bridges_with_acs"] == 1 and on["redirecting"][0]["device"] == "0000:00:01.0"   # lspci without -D: the domain added
    off = p2p.acs_state(LSPCI.format(r="-", c="-"))
    assert off["bridges_with_acs"] == 1 and off["redirecting"] == []


def _report(tmp_path, cuda=None, types=("identity",), acs="-", env=None):
    peers = {"count": 2, "cuda": cuda or {}, "nvml": {}, "errors": []}
    return p2p.host_report(_sysfs(tmp_path, types), "iommu=pt", LSPCI.format(r=acs, c=acs), peers, env or {})


def test_the_skip_rule(tmp_path):
    on = {"0-1": True, "1-0": True}
    off = {"0-1": True, "1-0": False}
    assert p2p.skip_reason(_report(tmp_path / "a", on), [0, 1]) is None
    why = p2p.skip_reason(_report(tmp_path / "b", off), [0, 1])
    assert why.startswith("skipped: no P2P between GPU 0 and 1") and "nvidia-smi topo -p2p r" in why
    # unknown and nothing risky: started; unknown with a translated IOMMU or ACS redirect: skipped
    assert p2p.skip_reason(_report(tmp_path / "c"), [0, 1]) is None
    assert "IOMMU in translated mode" in p2p.skip_reason(_report(tmp_path / "d", types=("DMA",)), [0, 1])
    assert "ACS redirect" in p2p.skip_reason(_report(tmp_path / "e", acs="+"), [0, 1])
    assert "NCCL_P2P_DISABLE=1" in p2p.skip_reason(_report(tmp_path / "f", on, env={"NCCL_P2P_DISABLE": "1"}), [0, 1])
    # CUDA saying peer access is possible never cancels a risk the host shows (NVIDIA/nccl#1999)
    why = p2p.skip_reason(_report(tmp_path / "g", on, types=("DMA-FQ",)), [0, 1])
    assert why and "IOMMU in translated mode" in why and "reported possible, which does not cancel it" in why
    assert "ACS redirect" in p2p.skip_reason(_report(tmp_path / "h", on, acs="+"), [0, 1])


def test_a_host_with_no_gpu_still_reports_iommu_and_acs(tmp_path):
    rep = p2p.host_report(_sysfs(tmp_path, ("DMA",)), "intel_iommu=on", LSPCI.format(r="+", c="+"),
                          {"count": 0, "cuda": {}, "nvml": {}, "errors": ["torch: no CUDA"]}, {})
    md = p2p.markdown(rep)
    assert "IOMMU: translated" in md and "1 redirecting of 1" in md


def test_a_p2p_off_topology_skips_pcie_ipc_and_custom_allreduce_with_the_reason(tmp_path):
    pytest.importorskip("torch")
    from stackprobe.runtime.bench import BenchConfig
    from stackprobe.runtime.engine import engine_verdicts
    from stackprobe.runtime.orchestrate import run_probe

    report = _report(tmp_path, {"0-1": False, "1-0": False})
    cfg = BenchConfig(sizes=[4096], rounds=4, sweep_rounds=2, graph_calls=2, graph_replays=1, warmup=1)
    run = run_probe("runtime_engine_fixtures:CpuP2pGateProbe", 2, asdict(cfg), device="cpu", timeout=180,
                    extra={"p2p": report})
    assert run.status == "ok", run.tail
    vs = {v.backend: v for v in engine_verdicts(run.ranks, {"world_size": 2})}
    for name in ("sglang-custom-allreduce", "sglang-pcie-ipc"):
        assert (vs[name].status, vs[name].gate) == ("skipped", "topology"), vs[name].cause
        assert vs[name].cause.startswith("skipped: no P2P between GPU 0 and 1")
    assert vs["sglang-pynccl"].status == "baseline"


# --- the P2P check (stackprobe.runtime.p2pcheck): real children, timeouts and kills on the cpu backend ----------------
def _alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _fault_env(spec):
    import os
    env = dict(os.environ)
    env.pop("STACKPROBE_P2P_FAULT", None)
    if spec:
        env["STACKPROBE_P2P_FAULT"] = spec
    return env


def test_c54_a_planted_hang_and_wrong_data_are_found_within_the_timeout_and_no_child_survives():
    """C54 on the cpu backend: the same child, timeout, kill and data check as on GPUs. Pair 0-1's copy stalls
    (and its child starts a helper first), pair 1-2's kernel step returns one wrong element; pair 0-2 reads ok."""
    import time

    from stackprobe.runtime import p2pcheck
    timeout = 4.0
    t0 = time.monotonic()
    rep = p2pcheck.run_check([0, 1, 2], device="cpu", nbytes=4096, timeout=timeout, repeats=2,
                             env=_fault_env("hang:0-1,corrupt:1-2:kernel"))
    by = {p["pair"]: p for p in rep["pairs"]}
    assert {k: p["status"] for k, p in by.items()} == {"0-1": "hang", "0-2": "ok", "1-2": "wrong-data"}
    hang = by["0-1"]["steps"]["copy"]
    assert hang["seconds"] < timeout + 3                      # found within the timeout (plus the kill's grace)
    assert len(hang["pids"]) == 2                              # the child and the helper it started before stalling
    assert not any(_alive(p) for p in hang["pids"]) and hang["leftover_pids"] == []
    assert by["0-1"]["steps"]["kernel"]["status"] == "not run"  # nothing more is sent over a pair that hung
    assert f"no answer within {timeout:g} s" in by["0-1"]["reason"]
    assert "int32 differ, first at 512" in by["1-2"]["reason"] and by["1-2"]["steps"]["copy"]["status"] == "ok"
    assert by["0-2"]["transfer_us"] > 0 and by["0-2"]["reason"] == ""
    assert rep["leftover_pids"] == [] and rep["summary"]["hang"] == 1
    assert time.monotonic() - t0 < 3 * timeout + 20
    md = p2pcheck.markdown(rep)
    assert "| 0-1 | hang |" in md and "| 1-2 | wrong-data |" in md and "| 0-2 | ok |" in md


def test_the_same_pairs_read_ok_without_planted_faults_and_a_crash_is_an_error():
    from stackprobe.runtime import p2pcheck
    rep = p2pcheck.run_check([0, 1, 2], device="cpu", nbytes=4096, timeout=20, repeats=2, env=_fault_env(""))
    assert [p["status"] for p in rep["pairs"]] == ["ok", "ok", "ok"]
    assert all(p["steps"]["kernel"]["status"] == "ok" and len(p["steps"]["kernel"]["directions"]) == 4
               for p in rep["pairs"])
    bad = p2pcheck.run_check([0, 1], device="cpu", nbytes=4096, timeout=20, repeats=2, env=_fault_env("crash:0-1"))
    assert bad["pairs"][0]["status"] == "error" and "exited 3 without a result" in bad["pairs"][0]["reason"]


def test_one_device_has_nothing_to_pair_and_starts_no_child():
    from stackprobe.runtime import p2pcheck
    rep = p2pcheck.run_check([0], device="cpu")
    assert rep["pairs"] == [] and rep["note"].startswith("nothing to pair: 1 device visible")
    rep = p2pcheck.run_check([], device="cuda")
    assert rep["note"].startswith("nothing to pair: 0 GPUs visible")


def test_the_gate_passes_only_pairs_that_passed():
    from stackprobe.runtime import p2pcheck
    rep = {"pairs": [{"pair": "0-1", "status": "ok", "reason": ""},
                     {"pair": "1-2", "status": "wrong-data", "reason": "copy: 1 of 1024 int32 differ"}]}
    assert p2pcheck.gate_reason(rep, [0, 1]) is None
    why = p2pcheck.gate_reason(rep, [0, 1, 2])
    assert why.startswith("not started: the P2P check did not pass on GPU 0-2 not checked; GPU 1-2 wrong-data")
    assert p2pcheck.gate_reason(None, [0, 1]).startswith("not started: the P2P check did not run")
    assert {"sglang-custom-allreduce", "flashinfer-pcie-ipc-allreduce"} <= p2pcheck.peer_memory_paths()


def test_c54_the_suite_starts_a_peer_memory_path_only_where_its_pairs_passed():
    """One suite run at world sizes 2 and 3 after a real P2P check with pair 0-2 planted to hang and pair 1-2 to return
    wrong data: the peer-memory row runs on GPUs 0-1 (its pair passed) and is not started at world size 3, the report
    saying why (both pairs, each with its status)."""
    pytest.importorskip("torch")
    from stackprobe.runtime import p2pcheck
    from stackprobe.runtime.bench import BenchConfig
    from stackprobe.runtime.report import markdown
    from stackprobe.runtime.suite import run_suite

    check = p2pcheck.run_check([0, 1, 2], device="cpu", nbytes=4096, timeout=4, repeats=2,
                               env=_fault_env("hang:0-2,corrupt:1-2"))
    assert [p["status"] for p in check["pairs"]] == ["ok", "hang", "wrong-data"]
    cfg = BenchConfig(sizes=[4096], dtype="float32", warmup=1, rounds=2, sweep_rounds=1, graph_calls=4,
                      graph_replays=1)
    rep = run_suite(["torch-gloo", "p2p_fixture_probes:PeerPathProbe"], [2, 3], cfg, device="cpu", timeout=180,
                    p2p_check=check, peer_paths={"fixture-peer-path"}, progress=lambda m: None)
    rows = {r["world_size"]: {x["backend"]: x for x in r["rows"]} for r in rep["runs"]}
    assert rows[2]["fixture-peer-path"]["outcome"] == "ok"
    skipped = rows[3]["fixture-peer-path"]
    assert skipped["outcome"] == "skipped"
    assert skipped["skip_reason"].startswith("not started: the P2P check did not pass on GPU 0-2 hang (copy: no "
                                             "answer within 4 s")
    assert "; GPU 1-2 wrong-data (copy: copy 1->2: 1 of 1024 int32 differ" in skipped["skip_reason"]
    assert rows[3]["torch-gloo"]["outcome"] == "ok"            # the baseline is not a peer-memory path
    assert rep["p2p_check"] is check
    md = markdown(rep)
    assert "not started: the P2P check did not pass on GPU 0-2 hang" in md
    assert "P2P check before any peer-memory path (4096 B peer copy" in md and "0-1 ok" in md and "0-2 hang" in md


def test_the_suite_on_gpus_records_the_check_even_with_nothing_to_pair():
    from stackprobe.runtime.suite import _p2p_first
    one = _p2p_first(None, "cuda", 1, [1], 60.0, lambda m: None)
    assert one["pairs"] == [] and one["note"].startswith("nothing to pair: 1 GPU visible (0)")
    assert _p2p_first(None, "cpu", 0, [2], 60.0, lambda m: None) is None     # CPU run: no GPU pairs, no check
    given = {"pairs": []}
    assert _p2p_first(given, "cuda", 8, [8], 60.0, lambda m: None) is given


def test_the_p2p_subcommand_exit_codes():
    import subprocess
    import sys
    base = [sys.executable, "-m", "stackprobe.runtime", "p2p", "--device", "cpu", "--bytes", "4K", "--timeout", "20"]
    ok = subprocess.run(base, capture_output=True, text=True, timeout=120, env=_fault_env(""))
    assert ok.returncode == 0 and "| 0-1 | ok |" in ok.stdout, ok.stderr
    bad = subprocess.run(base, capture_output=True, text=True, timeout=120, env=_fault_env("corrupt:0-1"))
    assert bad.returncode == 1 and "| 0-1 | wrong-data |" in bad.stdout
    one = subprocess.run(base + ["--devices", "0"], capture_output=True, text=True, timeout=120, env=_fault_env(""))
    assert one.returncode == 4 and "nothing to pair" in one.stdout     # not judged: never a go (it was 0)
    usage = subprocess.run(base[:-2] + ["--timeout", "0"], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "timeout" in usage.stderr


def test_the_one_device_self_test_runs_the_same_children_and_can_fail():
    """With one device there is nothing to pair; --self-test sends the same copy and kernel read/write from the device
    to itself (on a one-GPU host: the check's own torch copy, PTX kernel and data check), and fails on wrong data."""
    import subprocess
    import sys

    from stackprobe.runtime import p2pcheck
    rep = p2pcheck.run_check([0], device="cpu", nbytes=4096, timeout=20, repeats=2, self_test=True,
                             env=_fault_env(""))
    st = rep["self_test"]
    assert rep["pairs"] == [] and rep["note"].startswith("nothing to pair")
    assert (st["status"], st["steps"]["copy"]["status"], st["steps"]["kernel"]["status"]) == ("ok", "ok", "ok")
    assert [(d["from"], d["to"], d["mode"]) for d in st["steps"]["kernel"]["directions"]] == [(0, 0, "read"),
                                                                                              (0, 0, "write")]
    assert "**ok**" in p2pcheck.markdown(rep)
    cmd = [sys.executable, "-m", "stackprobe.runtime", "p2p", "--device", "cpu", "--devices", "0", "--self-test",
           "--bytes", "4K", "--timeout", "20"]
    bad = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=_fault_env("corrupt:0-0:kernel"))
    assert bad.returncode == 1 and "**wrong-data**" in bad.stdout


def test_the_p2p_exit_status_is_a_go_only_when_every_pair_is_ok():
    from stackprobe.runtime.__main__ import p2p_exit

    pair = lambda st: {"pair": "0-1", "status": st}  # noqa: E731
    assert p2p_exit({"pairs": [pair("ok"), pair("ok")], "leftover_pids": []}) == 0
    assert p2p_exit({"pairs": [pair("ok"), pair("unsupported")], "leftover_pids": []}) == 3   # was 0
    assert p2p_exit({"pairs": [pair("unsupported"), pair("hang")], "leftover_pids": []}) == 1
    assert p2p_exit({"pairs": [pair("ok")], "leftover_pids": [123]}) == 1
    assert p2p_exit({"pairs": [], "leftover_pids": []}) == 4                                   # was 0
    assert p2p_exit({"pairs": [], "self_test": pair("ok"), "leftover_pids": []}) == 0
    assert p2p_exit({"pairs": [], "self_test": pair("wrong-data"), "leftover_pids": []}) == 1
