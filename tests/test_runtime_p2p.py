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
    assert on["bridges_with_acs"] == 1 and on["redirecting"][0]["device"] == "00:01.0"
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
