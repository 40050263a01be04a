"""How the runtime tier plugs into the static tier's report and CLI (``python -m stackprobe --runtime``)."""
import argparse

import pytest

from stackprobe.report import Report
from stackprobe.runtime import run_runtime, static_skips
from stackprobe.runtime.suite import gpu_count
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


@pytest.mark.skipif(gpu_count() > 0, reason="checks the no-GPU answer")
def test_runtime_without_gpus_exits_3_with_a_message(capsys):
    args = argparse.Namespace(world_size=8, backends=None, quiet=True, label="", json=None)
    with pytest.raises(SystemExit) as e:
        run_runtime(Report(target_arch="12.0"), args)
    assert e.value.code == 3
    assert "needs NVIDIA GPUs" in capsys.readouterr().err
