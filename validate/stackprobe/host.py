"""The box before any peer-memory verdict: the GPUs' PCIe tree, the IOMMU mode, ACS on the bridges between GPUs,
P2P per pair, the driver, and the variables that change the path (stdlib only; it reads the host, never changes it).

Why: a path that maps a peer GPU's memory (SGLang's and vLLM's custom allreduce, FlashInfer's PCIe IPC allreduce,
torch / NCCL symmetric memory, expert-parallel all-to-all) and NCCL's own P2P transport hang, fail at set-up or
land wrong data where the IOMMU translates peer requests or a PCIe switch's ACS redirects them to the root complex;
CUDA's ``cudaDeviceCanAccessPeer`` still answers "possible" on such hosts (NVIDIA/nccl#1999, vllm-project/vllm
#42063, NVIDIA/TensorRT-LLM#16899). NVIDIA's own guidance (NCCL User Guide, Troubleshooting, "PCI Access Control
Services (ACS)"): IO virtualization (VT-d / IOMMU) can redirect all PCI point-to-point traffic to the CPU root
complex, causing a large slow-down or a hang; disable ACS on the PCIe switches, or use ``NCCL_P2P_DISABLE=1``
(SHM instead of P2P). So a risk the host shows is never cancelled by CUDA saying peer access is possible.

:func:`read_host` gathers (files and read-only commands only: no ``setpci``, no module parameters, no writes
under /sys):

* ``gpus``: NVIDIA display/3D controllers in sysfs (vendor 0x10de, class 0x0300xx / 0x0302xx), in PCI bus order
  (nvidia-smi's order), each with its root complex, the bridges above it, its NUMA node and IOMMU group type;
* ``pairs``: per pair, the link class in nvidia-smi's legend (PIX: one switch; PXB: several bridges below the host
  bridge; PHB: through the host bridge; NODE: between host bridges of one NUMA node; SYS: across NUMA nodes), the
  bridges a peer request crosses, which of them redirect (ACS) and which could not be read; CUDA's and NVML's P2P
  answers where known;
* ``iommu``: the mode (:func:`iommu_state`), ``acs``: where ACS was read from (``lspci -vvv`` text, else the
  config space through sysfs, whose extended part needs root on most hosts);
* ``env``: the variables that change the path (:data:`PEER_ENV`) from the process and from the server
  configuration asked about (``--env``), each with where it came from;
* ``not_read``: what could not be read, and why (never a guess).

Off the target (no NVIDIA GPU in sysfs, such as a builder or an image validated on one) ``present`` is False and
only the variables are judged: the report says the host check is to be made on the target.

:func:`risks` turns a host into the findings for a group of GPUs; :func:`apply` adds them to every verdict of a
path that maps peer memory (:mod:`stackprobe.paths`) and labels NCCL's baseline with its transport.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from collections.abc import Mapping
from pathlib import Path

from . import paths as pathsmod

#: variables that change how a peer-memory path or NCCL moves data (NCCL's environment variables page; the engines'
#: ``*_SKIP_P2P_CHECK``, read from their source by :mod:`stackprobe.engines.sglang.p2p_check` and :mod:`stackprobe.engines.vllm.p2p_check`)
PEER_ENV = ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE", "NCCL_IGNORE_DISABLED_P2P", "CUDA_VISIBLE_DEVICES",
            "SGLANG_SKIP_P2P_CHECK", "VLLM_SKIP_P2P_CHECK")
NVIDIA = "0x10de"
NCCL_GUIDE = ("NVIDIA's NCCL User Guide, Troubleshooting, 'PCI Access Control Services (ACS)': with VT-d/IOMMU or "
              "ACS, PCI peer-to-peer traffic is redirected to the CPU root complex (slow, or a hang); its advice: ACS "
              "off on the PCIe switches, or VT-d/IOMMU off. NCCL_P2P_DISABLE=1 (NCCL's Environment Variables page) "
              "makes NCCL use SHM instead of P2P")
# NVML's nvmlGpuP2PStatus_t (nvml.h): what a P2P status code means
NVML_P2P_STATUS = {0: "OK", 1: "chipset not supported", 2: "GPU not supported", 3: "IOH topology not supported",
                   4: "disabled by a driver registry key", 5: "not supported", 6: "unknown"}
# Linux enables ACS P2P Request and Completion Redirect on downstream ports whenever an IOMMU driver asks for ACS
# (drivers/pci/pci.c, pci_std_enable_acs under pci_request_acs), whatever the firmware set: an ACS fix must hold
# after boot (Documentation/admin-guide/kernel-parameters.txt: pci=disable_acs_redir=)
ACS_FIX = ("clear ACS redirect on those ports after each boot (kernel parameter pci=disable_acs_redir=<ports>, or setpci "
           "by the host's administrator, e.g. setpci -s {bdf} ECAP_ACS+0x6.w=0000), or VT-d/IOMMU off in the firmware; "
           "with an IOMMU on, Linux turns ACS redirect on at boot, so a firmware ACS switch alone does not hold")
HOST_CHECK = "python -m stackprobe.runtime p2p"
# PCIe ACS Extended Capability (PCI Express Base Specification, "ACS Extended Capability"; Linux
# include/uapi/linux/pci_regs.h: PCI_EXT_CAP_ID_ACS 0x0d, PCI_ACS_CTRL 0x06, PCI_ACS_RR 0x0004, PCI_ACS_CR 0x0008)
EXT_CAP_ACS = 0x0D
ACS_CTRL = 0x06
ACS_RR, ACS_CR = 0x0004, 0x0008


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() not in ("", "0", "false", "no", "off")


# --- IOMMU and ACS ------------------------------------------------------------------------------------
def iommu_state(sys_root: str | Path = "/sys", cmdline: str | None = None) -> dict:
    """``{"mode": "off" | "passthrough" | "translated" | "unknown", "units": [...], "group_types": {type: n},
    "cmdline": [iommu args]}`` from ``sys_root`` (``class/iommu/*``; ``kernel/iommu_groups/*/type``: ``identity`` is
    passthrough, ``DMA``/``DMA-FQ`` translated: Linux Documentation/ABI/testing/sysfs-kernel-iommu_groups) and the
    kernel command line (``/proc/cmdline`` when ``cmdline`` is None: ``iommu=pt``, ``intel_iommu=``, ``amd_iommu=``,
    ``iommu.passthrough=``)."""
    root = Path(sys_root)
    if cmdline is None:
        try:
            cmdline = Path("/proc/cmdline").read_text()
        except OSError:
            cmdline = ""
    args = [a for a in cmdline.split() if "iommu" in a]
    units = sorted(p.name for p in (root / "class" / "iommu").glob("*")) if (root / "class" / "iommu").is_dir() else []
    types: dict[str, int] = {}
    groups = root / "kernel" / "iommu_groups"
    for g in sorted(groups.glob("*")) if groups.is_dir() else []:
        try:
            t = (g / "type").read_text().strip()
        except OSError:
            t = "unreadable"
        types[t] = types.get(t, 0) + 1
    off = any(a in ("intel_iommu=off", "amd_iommu=off", "iommu=off") for a in args)
    pt = any(a in ("iommu=pt", "iommu.passthrough=1") for a in args)
    if types:
        mode = "translated" if any(t.startswith("DMA") for t in types) else (
            "passthrough" if set(types) <= {"identity"} else "unknown")
    elif off or (not units and groups.is_dir()):
        mode = "off"
    elif pt:
        mode = "passthrough"
    else:
        mode = "unknown"
    return {"mode": mode, "units": units, "group_types": types, "cmdline": args}


ACS_CTL = re.compile(r"ACSCtl:(.*)")
DEVICE_LINE = re.compile(r"^([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]|[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]) (.*)")


def bdf(text: str) -> str:
    """``01:00.0`` -> ``0000:01:00.0`` (lspci leaves the domain out unless ``-D``)."""
    return text if text.count(":") == 2 else "0000:" + text


def run_lspci() -> tuple[str | None, str]:
    """(``lspci -D -vvv`` text or None, where it came from or why not)."""
    exe = shutil.which("lspci")
    if not exe:
        return None, "unavailable: no lspci (Debian/Ubuntu: pciutils)"
    try:
        out = subprocess.run([exe, "-D", "-vvv"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"unavailable: {exc}"
    return out.stdout, "lspci -D -vvv"


def acs_state(lspci_text: str | None = None) -> dict:
    """``{"source", "redirecting": [{"device", "name", "ctl"}], "bridges_with_acs": n, "ctl": {bdf: ctl}}`` from
    ``lspci -vvv`` output (run here when ``lspci_text`` is None; ``source`` says "unavailable: why" when it cannot
    be). A device is redirecting when its ``ACSCtl`` line has ``ReqRedir+`` or ``CmpltRedir+``. lspci prints ACSCtl
    only for devices whose extended config space it could read: as a user without root it prints none."""
    source = "lspci -vvv (given)"
    if lspci_text is None:
        lspci_text, source = run_lspci()
        if lspci_text is None:
            return {"source": source, "redirecting": [], "bridges_with_acs": None, "ctl": {}}
    dev, name, red, ctl_of = None, "", [], {}
    for line in lspci_text.splitlines():
        m = DEVICE_LINE.match(line)
        if m:
            dev, name = bdf(m.group(1)), m.group(2)
            continue
        c = ACS_CTL.search(line)
        if c and dev:
            ctl = c.group(1).strip()
            ctl_of[dev] = ctl
            if "ReqRedir+" in ctl or "CmpltRedir+" in ctl:
                red.append({"device": dev, "name": name[:80], "ctl": ctl})
    return {"source": source, "redirecting": red, "bridges_with_acs": len(ctl_of), "ctl": ctl_of}


def acs_from_config(config: bytes) -> dict:
    """ACS control of one device from its config space (the bytes of sysfs ``config``): ``{"present": bool,
    "ctl": int, "redirect": bool}``, or ``{"unread": why}`` when only the first 256 bytes are readable (Linux
    returns the extended space to root only). Walks the extended capability list from offset 0x100 (each header:
    capability ID in bits 15:0, next offset in bits 31:20)."""
    if len(config) <= 0x100:
        return {"unread": f"only {len(config)} bytes of config space readable (the extended space, where ACS lives, "
                          "needs root)"}
    off, seen = 0x100, set()
    while off and off + 8 <= len(config) and off not in seen:
        seen.add(off)
        (hdr,) = struct.unpack_from("<I", config, off)
        if hdr in (0, 0xFFFFFFFF):
            break
        if hdr & 0xFFFF == EXT_CAP_ACS:
            (ctl,) = struct.unpack_from("<H", config, off + ACS_CTRL)
            return {"present": True, "ctl": ctl, "redirect": bool(ctl & (ACS_RR | ACS_CR))}
        off = (hdr >> 20) & 0xFFC
    return {"present": False, "ctl": 0, "redirect": False}


# --- the PCIe tree ------------------------------------------------------------------------------------
def _read(p: Path) -> str:
    try:
        return p.read_text().strip()
    except OSError:
        return ""


def pci_gpus(sys_root: str | Path = "/sys") -> list[dict]:
    """NVIDIA GPUs in ``sys_root/bus/pci/devices`` in PCI bus order: ``[{"index", "bdf", "device", "numa_node",
    "root_complex", "bridges": [bdf, ...] (root port first), "iommu_group", "iommu_type"}]``. The chain comes from
    the device's real path (``/sys/devices/pci0000:00/0000:00:01.0/.../0000:41:00.0``)."""
    devices = Path(sys_root) / "bus" / "pci" / "devices"
    out: list[dict] = []
    for dev in sorted(devices.iterdir()) if devices.is_dir() else []:
        if _read(dev / "vendor") != NVIDIA or not _read(dev / "class").startswith(("0x0300", "0x0302")):
            continue
        real = dev.resolve()
        parts = real.parts
        rc = next((i for i, p in enumerate(parts) if p.startswith("pci") and ":" in p), None)
        chain = list(parts[rc + 1:-1]) if rc is not None else []
        group = (dev / "iommu_group")
        gname = os.path.basename(os.readlink(group)) if group.is_symlink() else None
        gtype = _read(group / "type") if gname is not None else ""
        out.append({"index": len(out), "bdf": dev.name, "device": _read(dev / "device"),
                    "numa_node": _read(dev / "numa_node") or "-1", "root_complex": parts[rc] if rc is not None else "",
                    "bridges": chain, "iommu_group": gname, "iommu_type": gtype or None, "sysfs": str(dev)})
    return out


def link(a: dict, b: dict) -> tuple[str, list[str]]:
    """(link class in nvidia-smi's legend, the bridges a peer request between GPUs ``a`` and ``b`` crosses, up to and
    including their common ancestor). See the module docstring for the classes."""
    if a["root_complex"] != b["root_complex"]:
        return ("SYS" if a["numa_node"] != b["numa_node"] else "NODE"), a["bridges"][:1] + b["bridges"][:1]
    common = 0
    for x, y in zip(a["bridges"], b["bridges"]):
        if x != y:
            break
        common += 1
    if common == 0:
        return "PHB", a["bridges"][:1] + b["bridges"][:1]
    crossed = a["bridges"][common:] + [a["bridges"][common - 1]] + b["bridges"][common:]
    return ("PIX" if len(crossed) <= 3 and common >= 2 else "PXB"), crossed


def bridge_acs(sys_root: str | Path, bridges: list[str], lspci: dict) -> dict:
    """Per bridge: ``{"redirect": bool, "ctl": text, "source"}`` or ``{"unread": why}``, from lspci's ACSCtl where
    it printed one, else the config space in sysfs."""
    out = {}
    for b in bridges:
        if b in lspci.get("ctl", {}):
            ctl = lspci["ctl"][b]
            out[b] = {"redirect": "ReqRedir+" in ctl or "CmpltRedir+" in ctl, "ctl": ctl, "source": "lspci"}
            continue
        cfg = Path(sys_root) / "bus" / "pci" / "devices" / b / "config"
        try:
            data = cfg.read_bytes()
        except OSError as exc:
            out[b] = {"unread": f"config space not readable: {exc.strerror or exc}"}
            continue
        r = acs_from_config(data)
        if "unread" in r:
            out[b] = r
        else:
            out[b] = {"redirect": r["redirect"], "ctl": f"0x{r['ctl']:04x}" if r["present"] else "no ACS capability",
                      "source": "config space"}
    return out


# --- P2P answers and the driver -----------------------------------------------------------------------
def nvml_p2p(count: int) -> dict:
    """``{"i-j": {"p2p_read": "ok" | "status N", "link": NVML topology level}}`` from NVML through pynvml
    (``nvmlDeviceGetP2PStatus``, ``nvmlDeviceGetTopologyCommonAncestor``), or ``{"not_read": why}``."""
    try:
        import pynvml as nv
    except ImportError:
        return {"not_read": "pynvml (nvidia-ml-py) is not importable here"}
    out: dict = {}
    try:
        nv.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVML absent or no driver: said, not raised
        return {"not_read": f"NVML did not initialise: {exc}"}
    try:
        n = min(count, nv.nvmlDeviceGetCount()) if count else nv.nvmlDeviceGetCount()
        hs = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        levels = {v: k for k, v in vars(nv).items() if k.startswith("NVML_TOPOLOGY_") and isinstance(v, int)}
        for i in range(n):
            for j in range(n):
                if i == j:
                    continue
                rec = {}
                try:
                    st = nv.nvmlDeviceGetP2PStatus(hs[i], hs[j], nv.NVML_P2P_CAPS_INDEX_READ)
                    rec["p2p_read"] = "ok" if st == nv.NVML_P2P_STATUS_OK else f"status {st}"
                except Exception as exc:  # noqa: BLE001
                    rec["p2p_read"] = f"error: {exc}"
                try:
                    rec["link"] = levels.get(nv.nvmlDeviceGetTopologyCommonAncestor(hs[i], hs[j]), "unknown")
                except Exception as exc:  # noqa: BLE001
                    rec["link"] = f"error: {exc}"
                out[f"{i}-{j}"] = rec
    finally:
        nv.nvmlShutdown()
    return out


def driver_version(proc_root: str | Path = "/proc") -> str | None:
    """The NVIDIA kernel module's version from ``/proc/driver/nvidia/version`` (``... Kernel Module  580.65.06 ...``)."""
    m = re.search(r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", _read(Path(proc_root) / "driver" / "nvidia" / "version"))
    return m.group(1) if m else None


def peer_env(process_env: dict | None = None, config_env: dict | None = None) -> dict:
    """``{name: {"value", "from": "process" | "server configuration"}}`` for :data:`PEER_ENV`; the server
    configuration asked about wins (it is what the server would run with)."""
    src: Mapping[str, str] = os.environ if process_env is None else process_env
    out = {k: {"value": src[k], "from": "process environment"} for k in PEER_ENV if k in src}
    for k, v in (config_env or {}).items():
        if k in PEER_ENV:
            out[k] = {"value": v, "from": "server configuration (--env)"}
    return out


# --- the whole host -----------------------------------------------------------------------------------
def read_host(sys_root: str | Path = "/sys", proc_root: str | Path = "/proc", cmdline: str | None = None,
              lspci_text: str | None = None, cuda_peers: dict | None = None, nvml: dict | None = None,
              process_env: dict | None = None, config_env: dict | None = None) -> dict:
    """The host section (see the module docstring). ``cuda_peers``: ``{"i-j": bool}`` from
    ``torch.cuda.can_device_access_peer`` (the environment report's ``p2p``); ``nvml``: a saved :func:`nvml_p2p`
    (None: read it here when GPUs are present). Every reader that could not run is named in ``not_read``."""
    env = peer_env(process_env, config_env)
    gpus = pci_gpus(sys_root)
    if not gpus:
        return {"present": False, "gpus": [], "pairs": {}, "env": env, "not_read": [],
                "line": "no NVIDIA GPU on this machine: the host (PCIe tree, IOMMU, ACS, P2P) was not read here; "
                        f"peer-memory paths need the host check on the target ({HOST_CHECK}) before they are "
                        "switched on"}
    not_read = []
    if cmdline is None:
        cmdline = _read(Path(proc_root) / "cmdline")
    io = iommu_state(sys_root, cmdline)
    lspci = acs_state(lspci_text)
    if lspci["bridges_with_acs"] is None:
        not_read.append(f"lspci: {lspci['source']}")
    nvml = nvml_p2p(len(gpus)) if nvml is None else nvml
    if "not_read" in nvml:
        not_read.append(f"NVML P2P status: {nvml['not_read']}")
    pairs: dict[str, dict] = {}
    for a in gpus:
        for b in gpus:
            if b["index"] <= a["index"]:
                continue
            cls, crossed = link(a, b)
            acs = bridge_acs(sys_root, crossed, lspci)
            key = f"{a['index']}-{b['index']}"
            rev = f"{b['index']}-{a['index']}"
            cuda = None
            if cuda_peers and key in cuda_peers and rev in cuda_peers:
                cuda = bool(cuda_peers[key]) and bool(cuda_peers[rev])
            nv = None
            if key in nvml and rev in nvml:
                nv = "ok" if all(nvml[k].get("p2p_read") == "ok" for k in (key, rev)) else \
                    f"{nvml[key].get('p2p_read')} / {nvml[rev].get('p2p_read')}"
            pairs[key] = {"link": cls, "bridges": crossed,
                          "acs_redirect": [b_ for b_, r in acs.items() if r.get("redirect")],
                          "acs_unread": {b_: r["unread"] for b_, r in acs.items() if "unread" in r},
                          "acs": acs, "cuda_peer": cuda, "nvml_p2p": nv}
    why_unread: dict[str, str] = {}
    for p in pairs.values():
        why_unread.update(p["acs_unread"])
    unread = sorted(why_unread)
    if unread:
        not_read.append(f"ACS on {len(unread)} bridge(s) between GPUs ({', '.join(unread[:4])}): "
                        f"{why_unread[unread[0]]}; run as root, or lspci -vvv as root, to read it")
    return {"present": True, "gpus": gpus, "pairs": pairs, "iommu": io,
            "acs": {"source": lspci["source"] if lspci["ctl"] else "config space (sysfs)",
                    "redirecting": lspci["redirecting"]},
            "driver": driver_version(proc_root), "env": env, "not_read": not_read,
            "line": f"{len(gpus)} GPU(s); IOMMU {io['mode']}; "
                    f"{sum(1 for p in pairs.values() if p['acs_redirect'])} pair(s) behind an ACS redirect"}


def read_snapshot(root: str | Path, config_env: dict | None = None, process_env: dict | None = None) -> dict:
    """:func:`read_host` over a saved host: ``DIR/sys`` (the sysfs tree, symlinks kept), ``DIR/proc/cmdline``,
    ``DIR/proc/driver/nvidia/version``, and where present ``DIR/lspci.txt`` (``lspci -D -vvv`` output, run as root to
    include ACS), ``DIR/nvml.json`` (:func:`nvml_p2p`) and ``DIR/cuda_peers.json`` (``{"i-j": bool}``). Raises
    FileNotFoundError naming the folder when ``DIR/sys`` is missing."""
    import json
    root = Path(root)
    if not (root / "sys").is_dir():
        raise FileNotFoundError(f"{root}/sys does not exist: a host snapshot holds the target's sysfs tree under sys/")

    def opt(name: str):
        p = root / name
        return p.read_text() if p.is_file() else None

    nvml = json.loads(opt("nvml.json")) if opt("nvml.json") else {"not_read": "the snapshot has no nvml.json"}
    peers = json.loads(opt("cuda_peers.json")) if opt("cuda_peers.json") else None
    lspci = opt("lspci.txt")
    host = read_host(root / "sys", root / "proc", _read(root / "proc" / "cmdline"), lspci if lspci is not None else "",
                     peers, nvml, process_env, config_env)
    if lspci is None and host.get("present"):
        host["not_read"].insert(0, "lspci: the snapshot has no lspci.txt (ACS read from the config space in sys/)")
    host["snapshot"] = str(root)
    return host


# --- judging a group ----------------------------------------------------------------------------------
def group(host: dict, world_size: int) -> list[int]:
    """The GPU indices a group of ``world_size`` takes: ``CUDA_VISIBLE_DEVICES`` (integers) when set, else the
    first ``world_size`` GPUs in bus order."""
    cvd = ((host.get("env") or {}).get("CUDA_VISIBLE_DEVICES") or {}).get("value", "")
    ids = [int(x) for x in cvd.split(",") if x.strip().isdigit()] if cvd else list(range(len(host.get("gpus") or [])))
    return ids[:world_size]


def p2p_disabled(host: dict) -> str:
    """``NCCL_P2P_DISABLE=1 (process environment)`` when NCCL is told not to use P2P (also ``NCCL_P2P_LEVEL=LOC``
    or ``0``), else ""."""
    env = host.get("env") or {}
    d = env.get("NCCL_P2P_DISABLE")
    if d and _truthy(d["value"]):
        return f"NCCL_P2P_DISABLE={d['value']} ({d['from']})"
    lvl = env.get("NCCL_P2P_LEVEL")
    if lvl and lvl["value"].strip().upper() in ("LOC", "0"):
        return f"NCCL_P2P_LEVEL={lvl['value']} ({lvl['from']})"
    return ""


def risks(host: dict, world_size: int) -> list[dict]:
    """What on this host makes a peer-memory path unsafe for a group of ``world_size`` GPUs: ``[{"kind", "what",
    "fix"}]`` with kind ``p2p-disabled`` (a variable says P2P is off), ``iommu-translated``, ``acs-redirect``,
    ``p2p-off`` (CUDA or NVML says a pair has no peer access). CUDA saying peer access is possible never removes one."""
    out = []
    why = p2p_disabled(host)
    if why:
        out.append({"kind": "p2p-disabled", "short": f"{why.split(' (')[0]} is set (such a setting often works around a "
                    "P2P problem on the box)", "what": f"{why}: NCCL is told not to use P2P here (such a setting often "
                    "works around a P2P problem on the box); a path that opens peer memory through CUDA IPC does so "
                    "whatever NCCL's variable says", "fix": "find why P2P was disabled (run the host check) before "
                    "switching a peer-memory path on"})
    if not host.get("present"):
        return out
    ids = set(group(host, world_size))
    gpus = [g for g in host["gpus"] if g["index"] in ids]
    translated = [g for g in gpus if (g.get("iommu_type") or "").startswith("DMA")]
    if translated or (not any(g.get("iommu_type") for g in gpus) and host["iommu"]["mode"] == "translated"):
        kinds = sorted({g["iommu_type"] for g in translated}) or sorted(host["iommu"]["group_types"])
        out.append({"kind": "iommu-translated", "short": f"the IOMMU translates the GPUs' DMA ({', '.join(kinds)})",
                    "what": f"the IOMMU translates the GPUs' DMA (iommu group type "
                    f"{', '.join(kinds)}; kernel args {' '.join(host['iommu']['cmdline']) or 'none'})",
                    "fix": "iommu=pt on the kernel command line (with intel_iommu=on or amd_iommu=on), then check ACS "
                           "again (with the IOMMU on, Linux keeps ACS redirect on switch ports), or VT-d/IOMMU off in "
                           "the firmware"})
    pairs = {k: p for k, p in host["pairs"].items() if {int(x) for x in k.split("-")} <= ids}
    red = {k: p["acs_redirect"] for k, p in pairs.items() if p["acs_redirect"]}
    if red:
        bridges = sorted({b for bs in red.values() for b in bs})
        more = f" and {len(bridges) - 2} more" if len(bridges) > 2 else ""
        out.append({"kind": "acs-redirect", "short": f"ACS redirect on {', '.join(bridges[:2])}{more}",
                    "what": f"ACS redirects peer requests to the root complex on {', '.join(bridges[:4])} (between "
                    f"GPU pair(s) {', '.join(list(red)[:4])})",
                    "fix": ACS_FIX.format(bdf=bridges[0])})
    off = [k for k, p in pairs.items() if p.get("cuda_peer") is False or (p.get("nvml_p2p") not in (None, "ok"))]
    if off:
        codes = sorted({c for k in off for c in re.findall(r"status (\d+)", str(pairs[k].get("nvml_p2p")))})
        meaning = "; ".join(f"NVML status {c}: {NVML_P2P_STATUS.get(int(c), 'undocumented')}" for c in codes)
        listed = ", ".join(off[:4]) + (f" and {len(off) - 4} more" if len(off) > 4 else "")
        out.append({"kind": "p2p-off", "short": f"no peer access on {len(off)} GPU pair(s)"
                    + (f" ({meaning})" if meaning else ""), "what": f"no peer access between {len(off)} GPU pair(s) "
                    f"({listed}; CUDA / NVML P2P status{': ' + meaning if meaning else ''})",
                    "fix": ("find and remove the driver registry key that disables P2P (NVML status 4), then check "
                            "nvidia-smi topo -p2p r" if "4" in codes else
                            "check nvidia-smi topo -p2p r: peer access needs a P2P-capable driver and topology")})
    return out


def unassessed(host: dict, world_size: int) -> list[str]:
    """What the host check could not read for the group (ACS on a bridge between two of its GPUs, NVML)."""
    if not host.get("present"):
        return []
    ids = set(group(host, world_size))
    out = sorted({b for k, p in host["pairs"].items() if {int(x) for x in k.split("-")} <= ids for b in p["acs_unread"]})
    return [f"ACS on {', '.join(out[:4])} not read (the extended config space needs root)"] if out else []


def nccl_transport(host: dict) -> str:
    """The transport NCCL's baseline is expected to use, from the variables: ``SHM, not P2P (...)`` or ``""``. (The
    runtime tier states the transport NCCL really chose from its own ``NCCL_DEBUG=INFO`` lines.)"""
    why = p2p_disabled(host)
    if not why:
        return ""
    shm = (host.get("env") or {}).get("NCCL_SHM_DISABLE")
    if shm and _truthy(shm["value"]):
        return f"NET (sockets), not P2P or SHM: {why} and NCCL_SHM_DISABLE={shm['value']}"
    return f"SHM, not P2P: {why}"


# --- verdicts -----------------------------------------------------------------------------------------
def apply(verdicts: list, host: dict, world_size: int, p2p_check=None) -> list:
    """Add the host to every open verdict of a path that maps peer memory (:func:`stackprobe.paths.maps_peer_memory`)
    and to NCCL's baseline, in ``Verdict.host_risk``: ``{"level": "risk" | "unassessed" | "unchecked" | "transport",
    "what": what the user meets, "found": [risk dicts], "now": what to switch off now, "fix": the host fix, "engine_check":
    does the engine check P2P itself, "source": NVIDIA's guidance}``. Closed verdicts (the path does not run) are left
    alone. ``p2p_check``: engine name -> that engine's own P2P check (:func:`stackprobe.engines.p2p_check`: the
    registry is a layer above this module, so the caller passes it); None: ``engine_check`` says it was not read.
    Returns ``verdicts``."""
    found = risks(host, world_size)
    host_found = [r for r in found if r["kind"] != "p2p-disabled"]
    missing = unassessed(host, world_size)
    checks: dict[str, dict] = {}
    for v in verdicts:
        if pathsmod.is_nccl(v.backend):
            _nccl(v, host, host_found)   # whatever NCCL's status here: on the target NCCL runs (torch ships it)
            continue
        if not v.is_open:
            _lift_caveat(v, found)
            continue
        engine = v.engine or ("sglang" if v.scope == "engine" else "")
        if not pathsmod.maps_peer_memory(v.backend):
            _lift_caveat(v, found)
            continue
        now = pathsmod.switch_off(v.backend, engine) if engine else ""
        if host_found and now:
            # switched off, the tensor goes to NCCL, whose P2P transport meets the same host (NVIDIA/nccl#1999)
            now += "; and NCCL_P2P_DISABLE=1 for NCCL, which takes the tensor then and whose P2P transport meets the same risk"
        rec: dict = {"now": now, "source": NCCL_GUIDE}
        if v.backend.endswith("custom-allreduce") and engine:
            if engine not in checks:
                checks[engine] = (p2p_check(engine) if p2p_check is not None
                                  else {"error": "not assessed: no reader of the engine's own P2P check was given"})
            rec["engine_check"] = checks[engine]
        if found:
            rec.update(level="risk", found=found, what="hang or set-up failure risk on this host: " +
                       "; ".join(r["what"] for r in found), short="; ".join(r["short"] for r in found),
                       fix="; ".join(r["fix"] for r in found))
        elif v.scope != "engine":
            continue   # "check the host first" is advice to a user of the engine, not part of the library's answer
        elif not host.get("present"):
            rec.update(level="unchecked", found=[], what=host["line"], fix=f"run {HOST_CHECK} on the target")
        elif missing:
            rec.update(level="unassessed", found=[], what="host not fully assessed: " + "; ".join(missing),
                       fix=f"read it as root, or run {HOST_CHECK} on this host")
        else:
            continue
        v.host_risk = rec
        v.add("host (peer memory)", {k: rec[k] for k in ("level", "what", "fix")}, "stackprobe.host")
    return verdicts


def _lift_caveat(v, found: list) -> None:
    """A lift that would switch on a path mapping peer memory (the verdict's own path, or one its lift names) says it
    comes after the host fix, on a box that shows a risk."""
    if not found or not v.lift_detail or "after the host fix" in v.lift_detail:
        return
    names = [r.id for r in pathsmod.PATHS.values() if r.peer_memory is True] + ["PCIe IPC", "custom allreduce",
                                                                                 "symmetric memory", "TP <= 2"]
    if pathsmod.maps_peer_memory(v.backend) or any(n in v.lift_detail for n in names):
        v.lift_detail += (" (after the host fix: this box shows " + "; ".join(r.get("short") or r["what"] for r in found)
                          + ", and any path that maps peer memory meets it)")


def _nccl(v, host: dict, found: list) -> None:
    transport = nccl_transport(host)
    if transport:
        v.host_risk = {"level": "transport", "what": f"the baseline runs over {transport}", "found": [],
                       "now": "", "fix": "", "source": NCCL_GUIDE}
    elif found:
        v.host_risk = {"level": "risk", "found": found, "source": NCCL_GUIDE,
                       "what": "NCCL's P2P transport is at hang risk on this host: " + "; ".join(r["what"] for r in found),
                       "short": "NCCL's P2P transport at hang risk: " + "; ".join(r["short"] for r in found),
                       "now": pathsmod.switch_off(v.backend, "*") if v.backend == "nccl-ring" else "NCCL_P2P_DISABLE=1",
                       "fix": "; ".join(r["fix"] for r in found)}
    else:
        return
    v.add("host (NCCL transport)", {k: v.host_risk[k] for k in ("level", "what")}, "stackprobe.host")


def risk_phrase(v) -> str:
    """One phrase for a verdict's host finding, for headlines and matrix cells ("" when it has none)."""
    r = getattr(v, "host_risk", None) or {}
    if not r:
        return ""
    if r["level"] == "risk":
        return f"fix the host first: {r['what']}; now: {r.get('now') or 'leave it off'}; fix: {r['fix']}"
    if r["level"] == "transport":
        return r["what"]
    if r["level"] == "unchecked":
        return f"check the host on the target first ({HOST_CHECK}: P2P per pair, IOMMU, ACS)"
    return f"{r['what']}; {r['fix']}"


def markdown(host: dict | None, world_size: int) -> list[str]:
    """The report's host section (Markdown lines)."""
    if not host:
        return []
    lines = ["## Host (P2P, IOMMU, ACS)", ""]
    env = host.get("env") or {}
    envtxt = ", ".join(f"{k}={e['value']} ({e['from']})" for k, e in env.items()) or "none of " + ", ".join(PEER_ENV[:3])
    if not host.get("present"):
        return lines + [f"{host['line']}. Variables that change the path: {envtxt}.", ""]
    r = risks(host, world_size)
    ids = group(host, world_size)
    few = (f" (only {len(ids)} GPU(s) here for a group of {world_size}: " +
           ("nothing to pair, so no peer path is judged on this host)" if len(ids) < 2 else "the pairs present are judged)")
           if len(ids) < world_size else "")
    lines += [f"{host['line']}; driver {host.get('driver') or 'not read'}; group of {world_size}: GPUs "
              f"{ids}{few}; variables: {envtxt}.", "",
              "**Risks for peer memory**: " + ("; ".join(f"{x['what']} (fix: {x['fix']})" for x in r) or "none found"),
              ""]
    if host.get("not_read"):
        lines += ["**Not read**: " + "; ".join(host["not_read"]), ""]
    from . import mdtable
    lines += mdtable.table(("pair", "link", "bridges crossed", "ACS redirect", "CUDA peer", "NVML P2P"),
                           ((k, p["link"], ", ".join(p["bridges"]) or "-", ", ".join(p["acs_redirect"]) or
                             ("not read" if p["acs_unread"] else "no"),
                             {True: "yes", False: "no", None: "-"}[p["cuda_peer"]], p["nvml_p2p"] or "-")
                            for k, p in host["pairs"].items()))
    return lines + [""]


def main(argv=None) -> int:
    """``python -m stackprobe.host [--world-size N] [--env NAME=VALUE ...] [--snapshot DIR] [--out DIR]``: read this
    host (or a saved one), print its section and the risks for a group of N GPUs; write host.json and host.md under
    ``--out``. Exit 0 when the host was read and shows no risk, 3 when it shows one (the section says which and what
    to change), 4 when it could not be judged (no GPU here, fewer than two GPUs in the group, or ACS on a bridge
    between the group's GPUs unreadable without root): never 0 for a host not read. 2 for bad arguments. Reads only: it changes nothing on the host."""
    import argparse
    import json

    from .atomic import write_atomic
    a = argparse.ArgumentParser(prog="python -m stackprobe.host", description=(main.__doc__ or "").split(":", 1)[-1])
    a.add_argument("--world-size", type=int, default=8, help="GPUs in the group judged (default: 8)")
    a.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="a variable the server would run with (NCCL_P2P_DISABLE=1 ...)")
    a.add_argument("--snapshot", default="", help="a saved host folder (sys/, proc/, lspci.txt) instead of this host")
    a.add_argument("--out", default="", help="folder for host.json and host.md")
    ns = a.parse_args(argv)
    bad = [e for e in ns.env if "=" not in e]
    if bad:
        a.error(f"--env {bad[0]!r}: give NAME=VALUE, e.g. --env NCCL_P2P_DISABLE=1")
    cfg = dict(e.split("=", 1) for e in ns.env)
    try:
        h = read_snapshot(ns.snapshot, cfg) if ns.snapshot else read_host(config_env=cfg)
    except FileNotFoundError as exc:
        a.error(str(exc))
    md = "\n".join(markdown(h, ns.world_size)) + "\n"
    if ns.out:
        Path(ns.out).mkdir(parents=True, exist_ok=True)
        write_atomic(Path(ns.out) / "host.json", json.dumps(h, indent=2, default=str) + "\n")
        write_atomic(Path(ns.out) / "host.md", md)
    print(md)
    if risks(h, ns.world_size):
        return 3
    fewer = h.get("present") and len(group(h, ns.world_size)) < 2
    return 4 if (not h.get("present") or fewer or unassessed(h, ns.world_size)) else 0


if __name__ == "__main__":
    raise SystemExit(main())
