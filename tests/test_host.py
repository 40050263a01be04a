"""The host stage (stackprobe.host, cases C51-C53): the PCIe tree, IOMMU mode, ACS and P2P answers read from a host
snapshot laid out as Linux lays it out (tests/host_fixtures.py), the risks for a group of GPUs, and what they do to
every peer-memory verdict and to NCCL's baseline. Each risk has its failing twin: the same host without it."""
from __future__ import annotations

import json
import os

import pytest

from host_fixtures import config_space, make_host
from stackprobe import host as H
from stackprobe import paths as P
from stackprobe.report import Report
from stackprobe.userwords import headline_line
from stackprobe.verdict import GATE_PASSES, ON_BY_DEFAULT, OPT_IN, STARTUP_FAILURE, Verdict
from validate_support import pip_target, run_suite, suite_venv, verdict


# --- readers -------------------------------------------------------------------------------------------------
def test_the_pcie_tree_from_sysfs_two_gpus_under_one_switch(tmp_path):
    h = H.read_snapshot(make_host(tmp_path))
    assert [g["bdf"] for g in h["gpus"]] == ["0000:03:00.0", "0000:04:00.0"]
    assert h["gpus"][0]["bridges"] == ["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"]
    p = h["pairs"]["0-1"]
    assert p["link"] == "PIX" and p["bridges"] == ["0000:02:00.0", "0000:01:00.0", "0000:02:01.0"]
    assert (p["cuda_peer"], p["nvml_p2p"], p["acs_redirect"]) == (True, "ok", [])
    assert h["iommu"]["mode"] == "passthrough" and h["driver"] == "580.95.05"


def test_two_root_ports_is_phb(tmp_path):
    h = H.read_snapshot(make_host(tmp_path, switch=False))
    assert h["pairs"]["0-1"]["link"] == "PHB"
    assert h["pairs"]["0-1"]["bridges"] == ["0000:00:01.0", "0000:00:02.0"]


def test_acs_from_the_config_space_and_as_a_user_without_root():
    on = H.acs_from_config(config_space(0x001D))
    assert on == {"present": True, "ctl": 0x1D, "redirect": True}
    assert H.acs_from_config(config_space(0x0011))["redirect"] is False      # SrcValid + UpstreamFwd only
    assert H.acs_from_config(config_space(None)) == {"present": False, "ctl": 0, "redirect": False}
    assert "needs root" in H.acs_from_config(config_space(0x001D, size=256))["unread"]


def test_acs_read_from_config_space_when_lspci_printed_none(tmp_path):
    h = H.read_snapshot(make_host(tmp_path, acs=True, lspci=False))
    assert h["pairs"]["0-1"]["acs_redirect"] == ["0000:02:00.0", "0000:02:01.0"]
    assert h["acs"]["source"] == "config space (sysfs)"
    assert any("no lspci.txt" in n for n in h["not_read"])


def test_unreadable_acs_is_said_never_taken_as_off(tmp_path):
    h = H.read_snapshot(make_host(tmp_path, acs=True, config_size=256))
    p = h["pairs"]["0-1"]
    assert p["acs_redirect"] == [] and set(p["acs_unread"]) == {"0000:02:00.0", "0000:01:00.0", "0000:02:01.0"}
    assert any("needs root" in n for n in h["not_read"])
    assert H.unassessed(h, 2) and not H.risks(h, 2)
    v = Verdict("flashinfer-pcie-ipc-allreduce", OPT_IN, scope="engine", engine="sglang")
    H.apply([v], h, 2)
    assert v.host_risk["level"] == "unassessed" and "not fully assessed" in v.host_risk["what"]


def test_off_the_target_the_section_says_so_in_one_line(tmp_path):
    (tmp_path / "sys" / "bus" / "pci" / "devices").mkdir(parents=True)
    h = H.read_host(tmp_path / "sys", tmp_path, "", "", None, {}, {}, {})
    assert h["present"] is False and "not read here" in h["line"] and H.HOST_CHECK in h["line"]
    v = Verdict("flashinfer-pcie-ipc-allreduce", OPT_IN, scope="engine", engine="sglang")
    H.apply([v], h, 8)
    assert v.host_risk["level"] == "unchecked"
    assert "\n".join(H.markdown(h, 8)).count("not read here") == 1


def test_every_backend_a_probe_answers_for_has_a_path_record():
    from stackprobe.probes import probes
    from stackprobe.engines.vllm import engine as vllm_engine
    names = {b for m in probes() for b in m.BACKENDS} | set(vllm_engine.BACKENDS)
    assert names - set(P.PATHS) == set()
    assert P.maps_peer_memory("flashinfer-pcie-ipc-allreduce") and not P.maps_peer_memory("nccl-ring")
    assert P.is_nccl("nccl-ring")


# --- risks, each with its twin -------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,kind", [
    ({"acs": True}, "acs-redirect"),
    ({"iommu_type": "DMA-FQ", "cmdline": "quiet intel_iommu=on"}, "iommu-translated"),
    ({"nvml_ok": False, "cuda_peers": None}, "p2p-off"),
])
def test_each_risk_is_found_and_its_twin_is_clean(tmp_path, kw, kind):
    bad = H.read_snapshot(make_host(tmp_path / "bad", **kw))
    assert [r["kind"] for r in H.risks(bad, 2)] == [kind]
    good = H.read_snapshot(make_host(tmp_path / "good"))
    assert H.risks(good, 2) == []


def test_cuda_saying_peer_access_is_possible_never_cancels_a_risk(tmp_path):
    h = H.read_snapshot(make_host(tmp_path, acs=True, cuda_peers=True))
    assert h["pairs"]["0-1"]["cuda_peer"] is True
    v = Verdict("vllm-custom-allreduce", ON_BY_DEFAULT, scope="engine", engine="vllm")
    H.apply([v], h, 2, p2p_check={"vllm": {"checks": False, "how": "trusts the driver"}}.get)
    assert v.host_risk["level"] == "risk" and "ACS redirects" in v.host_risk["what"]
    assert v.host_risk["now"].startswith("--disable-custom-all-reduce; and NCCL_P2P_DISABLE=1 for NCCL")


def test_a_variable_in_the_server_configuration_is_judged_off_the_target_too(tmp_path):
    (tmp_path / "sys").mkdir()
    h = H.read_host(tmp_path / "sys", tmp_path, "", "", None, {}, {}, {"NCCL_P2P_DISABLE": "1"})
    assert h["env"]["NCCL_P2P_DISABLE"]["from"] == "server configuration (--env)"
    ring = Verdict("nccl-ring", GATE_PASSES, scope="library")
    ipc = Verdict("flashinfer-pcie-ipc-allreduce", OPT_IN, scope="engine", engine="sglang")
    closed = Verdict("flashinfer-allreduce-fusion", STARTUP_FAILURE, scope="engine", engine="sglang")
    H.apply([ring, ipc, closed], h, 8)
    assert ring.host_risk["level"] == "transport" and "SHM, not P2P" in ring.host_risk["what"]
    assert ipc.host_risk["level"] == "risk" and "whatever NCCL's variable says" in ipc.host_risk["what"]
    assert closed.host_risk == {}       # a path that does not run is not judged on the box
    # the twin: NCCL_P2P_DISABLE=0 says nothing
    h0 = H.read_host(tmp_path / "sys", tmp_path, "", "", None, {}, {}, {"NCCL_P2P_DISABLE": "0"})
    ring0 = Verdict("nccl-ring", GATE_PASSES, scope="library")
    H.apply([ring0], h0, 8)
    assert ring0.host_risk == {}


def test_the_tool_never_writes_to_the_host(tmp_path):
    root = make_host(tmp_path, acs=True)
    before = {p: (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
              for p in root.rglob("*")}
    H.read_snapshot(root)
    after = {p: (p.stat().st_mtime_ns, p.read_bytes() if p.is_file() and not p.is_symlink() else b"")
             for p in root.rglob("*")}
    assert before == after
    src = (H.__file__ and open(H.__file__).read())
    assert "setpci -s" in src and "subprocess.run([exe, \"-D\", \"-vvv\"]" in src   # advice only; lspci reads
    assert ".write_" not in src and "open(" not in src.replace("Path(", "")


# --- C51-C53 on the real wheels --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wheels():
    return {"sglang": pip_target("sglang==0.5.23"), "fi": pip_target("flashinfer-python==0.7.2"),
            "nccl": pip_target("nvidia-nccl-cu12==2.27.7"), "vllm": pip_target("vllm==0.33.0")}


def _suite(paths, args, snapshot=None):
    extra = {"STACKPROBE_HOST_ROOT": str(snapshot)} if snapshot else {}
    rep, _ = run_suite(suite_venv(), paths, ["--topology", "pcie", *args], extra_env=extra)
    return rep


@pytest.mark.network
def test_c51_acs_redirect_puts_the_nccl_baseline_and_every_peer_path_at_risk(tmp_path, wheels):
    bad = _suite([wheels["sglang"], wheels["fi"], wheels["nccl"]], ["--world-size", "2", "--engine", "sglang"],
                 make_host(tmp_path / "acs", acs=True))
    ring = verdict(bad, "nccl-ring", "library")
    assert ring["status"] == "gate-passes" and ring["host_risk"]["level"] == "risk"
    assert "ACS redirects peer requests" in ring["host_risk"]["what"]
    assert ring["host_risk"]["now"].startswith("NCCL_P2P_DISABLE=1") and "clear ACS redirect" in ring["host_risk"]["fix"]
    peer = [v for v in bad["verdicts"] if P.maps_peer_memory(v["backend"]) and v["status"] in
            ("opt-in", "on-by-default", "on-as-configured", "gate-passes")]
    assert peer and all(v["host_risk"]["level"] == "risk" for v in peer)
    line = headline_line(Report.from_json(bad))
    assert "fix the host first" in line and "worth measuring on the target: flashinfer-pcie-ipc" not in line
    assert "NCCL's P2P transport at hang risk: ACS redirect on 0000:02:00.0, 0000:02:01.0" in line
    md = Report.from_json(bad).to_markdown()
    assert "## Host (P2P, IOMMU, ACS)" in md and "0000:02:00.0, 0000:02:01.0" in md
    # the twin: the same host with ACS off
    good = _suite([wheels["sglang"], wheels["fi"], wheels["nccl"]], ["--world-size", "2", "--engine", "sglang"],
                  make_host(tmp_path / "ok"))
    assert verdict(good, "nccl-ring", "library")["host_risk"] == {}
    assert "fix the host first" not in headline_line(Report.from_json(good))
    assert "worth measuring on the target: flashinfer-pcie-ipc-allreduce" in headline_line(Report.from_json(good))


@pytest.mark.network
def test_c52_vllm_custom_allreduce_on_by_default_at_risk_with_an_iommu_that_translates(tmp_path, wheels):
    snap = make_host(tmp_path / "dma", iommu_type="DMA-FQ", cmdline="BOOT_IMAGE=/vmlinuz quiet intel_iommu=on")
    rep = _suite([wheels["vllm"], wheels["fi"]], ["--world-size", "2", "--engine", "vllm"], snap)
    v = verdict(rep, "vllm-custom-allreduce", "engine")
    assert v["status"] == "on-by-default" and v["host_risk"]["level"] == "risk"
    assert "IOMMU translates" in v["host_risk"]["what"] and "DMA-FQ" in v["host_risk"]["what"]
    assert v["host_risk"]["now"].startswith("--disable-custom-all-reduce; and NCCL_P2P_DISABLE=1")
    assert "iommu=pt" in v["host_risk"]["fix"] and "check ACS again" in v["host_risk"]["fix"]
    # NCCL, the fallback, is judged on the box even where the checking environment has no NCCL (review #34)
    assert verdict(rep, "nccl-ring", "library")["host_risk"]["level"] == "risk"
    chk = v["host_risk"]["engine_check"]
    assert chk["checks"] is False and "trusts the driver" in chk["how"] and "VLLM_SKIP_P2P_CHECK" in chk["how"]
    envs = (wheels["vllm"] / "vllm" / "envs.py").read_text().splitlines()
    line = int(chk["where"][0].split(":")[1])
    assert '"VLLM_SKIP_P2P_CHECK"' in envs[line - 1]
    assert "def _can_p2p(" in (wheels["vllm"] / chk["where"][1].split(":")[0]).read_text().splitlines()[
        int(chk["where"][1].split(":")[1]) - 1]
    head = headline_line(Report.from_json(rep).engine_view("vllm"))
    assert "fix the host first" in head and "vllm-custom-allreduce (on by default)" in head
    # the twin: passthrough
    ok = _suite([wheels["vllm"], wheels["fi"]], ["--world-size", "2", "--engine", "vllm"], make_host(tmp_path / "pt"))
    assert verdict(ok, "vllm-custom-allreduce", "engine")["host_risk"] == {}


@pytest.mark.network
def test_c53_p2p_disabled_and_pcie_ipc_on_is_not_reported_as_all_well(wheels):
    args = ["--world-size", "8", "--engine", "sglang", "--env", "NCCL_P2P_DISABLE=1",
            "--env", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1"]
    rep = _suite([wheels["sglang"], wheels["fi"], wheels["nccl"]], args)
    assert rep["host"]["present"] is False
    ipc = verdict(rep, "flashinfer-pcie-ipc-allreduce", "engine")
    assert ipc["status"] == "on-as-configured" and ipc["host_risk"]["level"] == "risk"
    assert "opens peer memory through CUDA IPC does so whatever NCCL's variable says" in ipc["host_risk"]["what"]
    assert ipc["host_risk"]["now"] == "leave SGLANG_ENABLE_PCIE_IPC_ALLREDUCE unset"
    ring = verdict(rep, "nccl-ring", "library")
    assert "SHM, not P2P" in ring["host_risk"]["what"]
    line = headline_line(Report.from_json(rep))
    assert "fix the host first" in line and "the baseline runs over SHM, not P2P" in line
    # the twin: PCIe IPC on, P2P not disabled: served, with the host check still asked for on the target
    rep2 = _suite([wheels["sglang"], wheels["fi"], wheels["nccl"]],
                  ["--world-size", "8", "--engine", "sglang", "--env", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1"])
    ipc2 = verdict(rep2, "flashinfer-pcie-ipc-allreduce", "engine")
    assert ipc2["host_risk"]["level"] == "unchecked"
    assert "fix the host first" not in headline_line(Report.from_json(rep2))


@pytest.mark.network
def test_sglang_does_not_check_p2p_by_default_read_from_its_source(wheels):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(wheels["sglang"])]))
    import subprocess
    import sys
    from validate_support import SUITE
    env["PYTHONPATH"] = os.pathsep.join([str(SUITE), str(wheels["sglang"])])
    out = subprocess.run([sys.executable, "-c", "import json; from stackprobe.engines import p2p_check as c; "
                          "print(json.dumps(c('sglang')))"], capture_output=True, text=True, env=env, timeout=300)
    chk = json.loads(out.stdout)
    assert chk["checks"] is False and chk["turn_on"] == "--enable-p2p-check", chk
    rel, line = chk["where"][0].split(":")
    assert "monkey_patch_p2p_access_check()" in (wheels["sglang"] / rel).read_text().splitlines()[int(line) - 1]


def test_the_host_command_exits_3_on_a_risk_and_0_on_its_twin(tmp_path, capsys):
    assert H.main(["--snapshot", str(make_host(tmp_path / "acs", acs=True)), "--world-size", "2",
                   "--out", str(tmp_path / "o")]) == 3
    assert "ACS redirects peer requests" in capsys.readouterr().out
    assert json.loads((tmp_path / "o" / "host.json").read_text())["pairs"]["0-1"]["acs_redirect"]
    assert H.main(["--snapshot", str(make_host(tmp_path / "ok")), "--world-size", "2"]) == 0
    assert H.main(["--snapshot", str(make_host(tmp_path / "user", config_size=256)), "--world-size", "2"]) == 4
    (tmp_path / "nogpu" / "sys").mkdir(parents=True)
    assert H.main(["--snapshot", str(tmp_path / "nogpu")]) == 4      # nothing read is never "no risk"
    one = make_host(tmp_path / "one", gpus=1)
    assert H.main(["--snapshot", str(one), "--world-size", "8"]) == 4   # one GPU: nothing to pair, not "no risk"
    assert "nothing to pair" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        H.main(["--snapshot", str(tmp_path / "nowhere")])
    assert e.value.code == 2


def test_the_runtime_gate_reads_the_path_records():
    """The P2P check gates every runtime row whose path maps peer memory (read from stackprobe.paths), never NCCL's."""
    from stackprobe.runtime.p2pcheck import peer_memory_paths
    rows = peer_memory_paths()
    assert {"sglang-pcie-ipc", "sglang-custom-allreduce", "torch-symm-mem-one-shot", "sglang-torch-symm-mem",
            "flashinfer-pcie-ipc-allreduce"} <= rows
    assert not rows & {"nccl-ring", "nccl-tree", "sglang-pynccl", "nccl-allreduce-tree"}


def test_a_lift_that_would_switch_on_a_peer_memory_path_waits_for_the_host_fix(tmp_path):
    h = H.read_snapshot(make_host(tmp_path / "acs", acs=True))
    ca = Verdict("sglang-custom-allreduce", "blocked", scope="engine", engine="sglang", gate="topology",
                 lift="nothing-on-this-topology", lift_detail="FlashInfer PCIe IPC (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1)")
    H.apply([ca], h, 2)
    assert "after the host fix: this box shows ACS redirect on 0000:02:00.0" in ca.lift_detail
    twin = Verdict("sglang-custom-allreduce", "blocked", scope="engine", engine="sglang", gate="topology",
                   lift="nothing-on-this-topology", lift_detail="FlashInfer PCIe IPC (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1)")
    H.apply([twin], H.read_snapshot(make_host(tmp_path / "ok")), 2)
    assert "after the host fix" not in twin.lift_detail


def test_nvml_p2p_status_codes_are_said_in_words(tmp_path):
    h = H.read_snapshot(make_host(tmp_path, nvml_ok=False, cuda_peers=None))
    r = H.risks(h, 2)[0]
    assert "NVML status 4: disabled by a driver registry key" in r["what"] and "registry key" in r["fix"]
