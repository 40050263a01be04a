"""P2P and topology before any peer-memory path: may a path that maps a peer GPU's memory be started here?

FlashInfer's PCIe IPC allreduce and SGLang's custom allreduce open the peers' buffers through CUDA IPC and
read/write them directly. Neither checks P2P first (FACTS, "PCIe IPC in SGLang 0.5.23"); where P2P is off or
broken (an IOMMU in translated mode, ACS redirecting peer requests to the root complex: rtx6kpro#15,
NVIDIA/nccl#2079) the set-up can hang the whole group. :func:`host_report` gathers, without starting any
peer path:

* ``peers``: the CUDA peer-access matrix (``torch.cuda.can_device_access_peer``) and NVML's P2P read status and
  link type per pair (``nvmlDeviceGetP2PStatus``, ``nvmlDeviceGetTopologyCommonAncestor``), where present;
* ``iommu``: the mode from sysfs (``/sys/class/iommu/*``, ``/sys/kernel/iommu_groups/*/type``: ``identity`` is
  passthrough, ``DMA``/``DMA-FQ`` translated; Linux Documentation/ABI/testing/sysfs-kernel-iommu_groups) and the
  kernel command line (``iommu=pt``, ``intel_iommu=``, ``amd_iommu=``, ``iommu.passthrough=``);
* ``acs``: bridges whose ACS control has request or completion redirect on (``lspci -vvv``'s
  ``ACSCtl: ... ReqRedir+ CmpltRedir+``), when lspci is there;
* ``env``: ``NCCL_P2P_DISABLE`` / ``NCCL_P2P_LEVEL``.

The IOMMU/ACS part reads files only, so it reports on a host with no GPU. :func:`skip_reason` turns a report
into the decision for one path: ``None`` (start it) or ``"skipped: ..."`` with what to check. The rule: P2P off
for any pair of the group skips; so does any risk the host shows (IOMMU translated, ACS redirect,
NCCL_P2P_DISABLE=1), whatever CUDA's peer-access answer says: on the hosts that hang, CUDA answers "possible"
(NVIDIA/nccl#1999; :mod:`stackprobe.host`).
"""
from __future__ import annotations

import os
from pathlib import Path

from ..host import acs_state, iommu_state, nvml_p2p  # noqa: F401 - the readers live in the host stage; re-exported for callers

NEEDS_P2P = ("sglang-custom-allreduce", "sglang-pcie-ipc")
WHAT_TO_CHECK = ("check: nvidia-smi topo -p2p r (OK for every pair), the IOMMU mode (iommu=pt or off on the kernel "
                 "command line; /sys/kernel/iommu_groups/*/type 'identity'), ACS on the PCIe switches "
                 "(lspci -vvv: ACSCtl ReqRedir- CmpltRedir-), and NCCL_P2P_DISABLE unset")


def peer_matrix(count: int | None = None) -> dict:
    """``{"count", "cuda": {"i-j": bool}, "nvml": {"i-j": {"p2p_read", "link"}}, "errors": [...]}`` for every
    ordered pair of visible GPUs; empty maps where torch has no CUDA or NVML is missing."""
    out: dict = {"count": 0, "cuda": {}, "nvml": {}, "errors": []}
    try:
        import torch
        if torch.cuda.is_available():
            n = torch.cuda.device_count() if count is None else count
            out["count"] = n
            for i in range(n):
                for j in range(n):
                    if i != j:
                        out["cuda"][f"{i}-{j}"] = bool(torch.cuda.can_device_access_peer(i, j))
    except Exception as exc:  # noqa: BLE001 - a report, not a failure
        out["errors"].append(f"torch: {exc}")
    nvml = nvml_p2p(0)     # the host stage's one NVML reader (every GPU NVML sees)
    if "not_read" in nvml:
        out["errors"].append(f"nvml: {nvml['not_read']}")
    else:
        out["nvml"] = nvml
        out["count"] = max(out["count"], max((int(k.split("-")[0]) + 1 for k in nvml), default=0))
    return out


def host_report(sys_root: str | Path = "/sys", cmdline: str | None = None, lspci_text: str | None = None,
                peers: dict | None = None, env: dict | None = None) -> dict:
    """The whole report (see the module docstring); ``peers`` given (a saved :func:`peer_matrix`) skips the
    GPU queries."""
    env = os.environ if env is None else env
    return {"peers": peer_matrix() if peers is None else peers, "iommu": iommu_state(sys_root, cmdline),
            "acs": acs_state(lspci_text),
            "env": {k: env[k] for k in ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL") if k in env}}


def risks(report: dict) -> list[str]:
    """What on this host makes unknown P2P risky: translated IOMMU, ACS redirect, NCCL_P2P_DISABLE=1."""
    out = []
    if report["iommu"]["mode"] == "translated":
        out.append(f"IOMMU in translated mode ({report['iommu']['group_types']})")
    if report["acs"]["redirecting"]:
        out.append(f"ACS redirect on {len(report['acs']['redirecting'])} bridge(s), e.g. "
                   f"{report['acs']['redirecting'][0]['device']}")
    if report["env"].get("NCCL_P2P_DISABLE") not in (None, "", "0"):
        out.append(f"NCCL_P2P_DISABLE={report['env']['NCCL_P2P_DISABLE']}")
    return out


def pair_status(report: dict, i: int, j: int) -> bool | None:
    """True / False from CUDA's peer access (both directions) or NVML's P2P read status; None when neither
    is known."""
    cuda, nvml = report["peers"].get("cuda", {}), report["peers"].get("nvml", {})
    ks = (f"{i}-{j}", f"{j}-{i}")
    if all(k in cuda for k in ks):
        return all(cuda[k] for k in ks)
    if all(k in nvml for k in ks):
        return all(nvml[k].get("p2p_read") == "ok" for k in ks)
    return None


def skip_reason(report: dict, devices: list[int]) -> str | None:
    """None when a peer-memory path may start on ``devices`` (GPU indices of the group), else the reason:
    P2P off for a pair, or any risk :func:`risks` finds (whatever CUDA says of peer access), or NCCL_P2P_DISABLE set."""
    r = risks(report)
    for a in range(len(devices)):
        for b in range(a + 1, len(devices)):
            i, j = devices[a], devices[b]
            st = pair_status(report, i, j)
            if st is False:
                return f"skipped: no P2P between GPU {i} and {j} (peer access reported off); {WHAT_TO_CHECK}"
            if r:   # a risk is never cancelled by CUDA or NVML saying peer access is possible
                known = {True: "reported possible", None: "not reported"}[st]
                return (f"skipped: this host shows {'; '.join(r)} (a P2P risk between GPU {i} and {j}; peer access "
                        f"{known}, which does not cancel it); {WHAT_TO_CHECK}")
    if report["env"].get("NCCL_P2P_DISABLE") not in (None, "", "0"):
        return f"skipped: NCCL_P2P_DISABLE={report['env']['NCCL_P2P_DISABLE']} says P2P is off here; {WHAT_TO_CHECK}"
    return None


def markdown(report: dict) -> str:
    """A short Markdown page of one report."""
    p, io, acs = report["peers"], report["iommu"], report["acs"]
    lines = ["# P2P and topology", "", f"GPUs: {p.get('count')}; IOMMU: {io['mode']} (units {io['units']}, group "
             f"types {io['group_types']}, kernel args {io['cmdline']}); ACS: {acs['source']}, "
             f"{len(acs['redirecting'])} redirecting of {acs['bridges_with_acs']}; env {report['env']}", "",
             f"Risks for unknown P2P: {risks(report) or 'none'}", ""]
    if p.get("cuda") or p.get("nvml"):
        from .. import mdtable

        lines += mdtable.table(("pair", "CUDA peer access", "NVML P2P read", "link"),
                               ((k, p.get("cuda", {}).get(k, "-"), p.get("nvml", {}).get(k, {}).get("p2p_read", "-"),
                                 p.get("nvml", {}).get(k, {}).get("link", "-"))
                                for k in sorted(set(p.get("cuda", {})) | set(p.get("nvml", {})))))
    if p.get("errors"):
        lines += ["", f"Errors: {p['errors']}"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    """``python -m stackprobe.runtime.p2p [--out DIR]``: print (and write p2p.json / p2p.md) this host's report."""
    import argparse
    import json

    from ..atomic import write_atomic
    a = argparse.ArgumentParser(prog="python -m stackprobe.runtime.p2p")
    a.add_argument("--out", default="")
    ns = a.parse_args(argv)
    rep = host_report()
    if ns.out:
        Path(ns.out).mkdir(parents=True, exist_ok=True)
        write_atomic(Path(ns.out) / "p2p.json", json.dumps(rep, indent=2) + "\n")
        write_atomic(Path(ns.out) / "p2p.md", markdown(rep))
    print(markdown(rep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
