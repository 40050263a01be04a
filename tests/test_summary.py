"""The summary block every Markdown report opens with (stackprobe.summary): one key: value line each, the same
phrases as the headline, read from committed reports (no network, no GPU), each with a twin that flips a line."""
from __future__ import annotations

import copy
from pathlib import Path

from stackprobe.report import Report
from stackprobe.summary import block

ROOT = Path(__file__).resolve().parents[1]


def _block(r: Report) -> str:
    return "\n".join(block(r))


def test_a_p2p_off_box_puts_pcie_ipc_under_fix_the_host_first_never_try_and_measure():
    r = Report.load(ROOT / "results" / "host" / "p2p-off.json")
    text = _block(r)
    assert text.startswith("## Summary") and "```text" in text
    assert "fix the host first: flashinfer-pcie-ipc-allreduce (on as configured)" in text
    assert "try and measure:" not in text
    assert "host:               8 GPU(s)" in text and "RISK: NCCL_P2P_DISABLE=1 is set" in text
    assert r.to_markdown().index("## Summary") < r.to_markdown().index("## Environment health")


def test_the_same_report_without_the_risk_reads_try_and_measure():
    r = Report.load(ROOT / "results" / "host" / "p2p-off.json")
    twin = copy.deepcopy(r)
    for v in twin.verdicts:
        if v.backend == "flashinfer-pcie-ipc-allreduce" and v.scope == "engine":
            v.status, v.host_risk = "opt-in", {}
            v.add("user setting", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1")
    twin.dispatch = {}
    text = _block(twin)
    assert "try and measure:    flashinfer-pcie-ipc-allreduce (SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1)" in text
    assert "fix the host first: flashinfer-pcie-ipc" not in text


def test_an_older_report_names_its_engine_and_says_the_host_was_not_read():
    r = Report.load(ROOT / "tests" / "data" / "schema3" / "validate" / "cudastack_cu13.1-pip-sm120-runtime_7dbd01ad3ef27600.json")
    text = _block(r)
    assert "engine:             sglang 0.5.23" in text
    assert "host:               not read (a report made before the host stage)" in text
    assert "do not set:         --flashinfer-allreduce-fusion-backend auto" in text


def test_no_engine_installed_says_so_in_one_line():
    r = Report.load(ROOT / "results" / "host" / "p2p-off.json")
    r.environment = dict(r.environment, packages={})
    r.engines = [{"name": "sglang", "title": "SGLang", "version": None}]
    text = _block(r)
    assert "serves now:         no serving engine is installed here" in text
    assert "fix the host first" not in text
