"""How the runtime tier plugs into the static tier's report and CLI (``python -m stackprobe --runtime``)."""
import argparse

import pytest

from stackprobe.report import Report
from stackprobe.runtime import run_runtime, static_skips
from stackprobe.verdict import Verdict


def test_static_gate_skips_runtime_probes_only_on_the_target_compute_capability():
    static = [Verdict("sglang-custom-allreduce", "blocked", gate="not-installed", cause="sglang is not installed"),
              Verdict("torch-symm-mem", "blocked", gate="python-table", cause="KeyError: 12 in the size table"),
              Verdict("nccl-tree", "blocked", gate="topology", cause="no intra-node tree")]
    on_target = static_skips(static, "12.0", "12.0")
    assert on_target["torch-symm-mem-one-shot"][0] == "python-table"
    assert "KeyError: 12" in on_target["torch-symm-mem-two-shot"][1]
    assert "sglang-custom-allreduce" in on_target
    assert "nccl-tree" not in on_target and "nccl-allreduce-tree" not in on_target  # topology: runtime decides
    assert static_skips(static, "12.0", "9.0") == {}  # an SM90 host runs what an SM120 gate refuses


def test_runtime_without_gpus_refuses_with_a_message(capsys, monkeypatch):
    """The runtime hook refuses to start when no GPU is visible (forced here, so it runs on GPU hosts too)."""
    import stackprobe.runtime.suite as suite

    monkeypatch.setattr(suite, "gpu_count", lambda: 0)
    args = argparse.Namespace(world_size=8, backends=None, quiet=True, label="", json=None)
    with pytest.raises(SystemExit) as e:
        run_runtime(Report(target_arch="12.0"), args)
    assert e.value.code not in (0, None)
    assert "needs NVIDIA GPUs" in capsys.readouterr().err


def test_cli_runtime_without_gpus_writes_the_static_report_and_exits_9(tmp_path, capsys, monkeypatch):
    """`python -m stackprobe --runtime` with no GPU: the static report is written and the exit code is the
    README's 9 (validation could not run), not 3 (a recipe error)."""
    import json

    import stackprobe.runtime.suite as suite
    from stackprobe.__main__ import main

    monkeypatch.setattr(suite, "gpu_count", lambda: 0)
    out = tmp_path / "report.json"
    rc = main(["--target-arch", "12.0", "--backend", "nccl-ring", "--quiet", "--runtime", "--json", str(out)])
    assert rc == 9
    data = json.loads(out.read_text())
    assert data["target_arch"] == "12.0" and any(v["backend"] == "nccl-ring" for v in data["verdicts"])
    assert data["options"]["runtime"].startswith("not run: no NVIDIA GPU")
    assert "static report is written" in capsys.readouterr().err


@pytest.mark.parametrize("status, code", [("baseline", 0), ("failed", 9)])
def test_runtime_run_exits_9_when_its_baseline_did_not_run(status, code, tmp_path, monkeypatch):
    """`python -m stackprobe.runtime run`: the README's codes. A baseline that did not run leaves no ratio to
    form: exit 9 (validation could not run), where it used to be 3 (a recipe error's code). The suite itself is
    stood in for (its own tests run it for real); the exit code is read from what it reports."""
    import signal

    import stackprobe.runtime.__main__ as rt

    monkeypatch.setattr(signal, "signal", lambda *a: None)   # main() hooks SIGTERM: not in the test process
    report = {"baseline": "torch-gloo",
              "runs": [{"world_size": 2, "verdicts": [{"backend": "torch-gloo", "status": status, "measurements": {}}]}]}
    monkeypatch.setattr(rt, "gpu_count", lambda: 0)
    monkeypatch.setattr(rt, "run_suite", lambda *a, **k: report)
    monkeypatch.setattr(rt, "write", lambda rep, out: {"json": tmp_path / "runtime.json"})
    assert rt.main(["run", "--device", "cpu", "--out", str(tmp_path)]) == code
