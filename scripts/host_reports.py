"""Make the host-stage example reports under ``results/host/``: the static tier on the real engine wheels from
PyPI (sglang 0.5.23 + flashinfer-python 0.7.2 + nvidia-nccl-cu12 2.27.7; vllm 0.33.0 + flashinfer-python 0.7.2),
judged on host snapshots laid out by ``tests/host_fixtures.py`` (the layout Linux gives sysfs, lspci's text):

* ``p2p-off``: sglang, world size 8, eight GPUs whose NVML P2P status is not OK (P2P off on the box), the server run
  with ``NCCL_P2P_DISABLE=1`` and ``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1`` (case C53 on a GPU host);
* ``acs-redirect``: sglang, world size 2, two GPUs under one switch whose downstream ports redirect (case C51);
* ``iommu-translated``: vllm, world size 2, IOMMU group type DMA-FQ (case C52).

Each gets ``<name>.json`` and ``<name>.md`` and its snapshot under ``snapshots/<name>/`` (what the reports read).
Usage: ``python scripts/host_reports.py [OUT]`` (default ``results/host``); needs the network for the wheels.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from host_fixtures import make_host  # noqa: E402
from stackprobe.atomic import write_atomic  # noqa: E402
from stackprobe.report import Report  # noqa: E402
from validate_support import pip_target, run_suite, suite_venv  # noqa: E402

CASES = {
    "p2p-off": ("sglang", {"gpus": 8, "nvml_ok": False, "cuda_peers": False}, 8,
                ["--env", "NCCL_P2P_DISABLE=1", "--env", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1"]),
    "acs-redirect": ("sglang", {"acs": True}, 2, []),
    "iommu-translated": ("vllm", {"iommu_type": "DMA-FQ", "cmdline": "BOOT_IMAGE=/vmlinuz ro quiet intel_iommu=on"},
                         2, []),
}


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "results" / "host"
    wheels = {"sglang": [pip_target("sglang==0.5.23"), pip_target("flashinfer-python==0.7.2"),
                         pip_target("nvidia-nccl-cu12==2.27.7")],
              "vllm": [pip_target("vllm==0.33.0"), pip_target("flashinfer-python==0.7.2")]}
    for name, (engine, host_kw, ws, extra) in CASES.items():
        snap = out / "snapshots" / name
        shutil.rmtree(snap, ignore_errors=True)
        make_host(snap, **host_kw)
        rep, _ = run_suite(suite_venv(), wheels[engine], ["--topology", "pcie", "--world-size", str(ws), "--engine",
                                                         engine, "--label", f"host {name}", *extra],
                           extra_env={"STACKPROBE_HOST_ROOT": str(snap)})
        r = Report.from_json(rep)
        r.host["snapshot"] = f"snapshots/{name}"        # the folder beside the report, not this machine's path
        for g in r.host.get("gpus", []):
            g["sysfs"] = str(g["sysfs"]).replace(str(out) + "/", "")
        r.write_json(out / f"{name}.json")
        write_atomic(out / f"{name}.md", r.to_markdown())
        print(f"{name}: {out / (name + '.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
