"""A fake host for the host stage (stackprobe.host): a sysfs tree laid out as Linux lays it out (devices under
``devices/pci0000:00/...`` with their config space, ``bus/pci/devices/<bdf>`` symlinks, ``kernel/iommu_groups/<n>``
with ``type``), the kernel command line, ``lspci -D -vvv`` text, as read from real two-GPU PCIe hosts: two GPUs
under one PCIe switch (root port 0000:00:01.0, switch upstream port 0000:01:00.0, downstream ports 0000:02:00.0 and
0000:02:01.0, GPUs 0000:03:00.0 and 0000:04:00.0), or under two root ports."""
from __future__ import annotations

import os

import json
import struct
from pathlib import Path

NV_GPU = "0x2bb1"   # RTX PRO 6000 Blackwell's PCI device id

# lspci -D -vvv lines for one bridge, in lspci's own layout (pciutils ls-ecaps.c prints ACSCap then ACSCtl)
LSPCI_BRIDGE = """\
{bdf} PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0) (prog-if 00 [Normal decode])
\tControl: I/O+ Mem+ BusMaster+ SpecCycle- MemWINV- VGASnoop- ParErr- Stepping- SERR+ FastB2B- DisINTx+
\tCapabilities: [a00 v1] Access Control Services
\t\tACSCap:\tSrcValid+ TransBlk+ ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl+ DirectTrans+
\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir{r} CmpltRedir{c} UpstreamFwd+ EgressCtrl- DirectTrans-
"""
LSPCI_GPU = """\
{bdf} VGA compatible controller: NVIDIA Corporation GB202GL [RTX PRO 6000 Blackwell Workstation Edition] (rev a1) (prog-if 00 [VGA controller])
\tSubsystem: NVIDIA Corporation Device 204b
"""


def config_space(acs_ctl: int | None, size: int = 4096) -> bytes:
    """A device's config space: 4096 bytes (what root reads) with an ACS extended capability at 0xa00 whose control
    register is ``acs_ctl`` (None: no ACS capability), chained after an AER capability at 0x100."""
    b = bytearray(size)
    struct.pack_into("<HH", b, 0, 0x10B5, 0xC030)
    if size > 0x100:
        nxt = 0xA00 if acs_ctl is not None else 0
        struct.pack_into("<I", b, 0x100, 0x0001 | (1 << 16) | (nxt << 20))   # AER, then ACS (or the end)
        if acs_ctl is not None:
            struct.pack_into("<I", b, 0xA00, 0x000D | (1 << 16))
            struct.pack_into("<HH", b, 0xA04, 0x007F, acs_ctl)
    return bytes(b[:size])


def make_host(root: Path, *, switch: bool = True, acs: bool = False, iommu_type: str = "identity",
              cmdline: str = "BOOT_IMAGE=/vmlinuz root=/dev/nvme0n1p2 ro intel_iommu=on iommu=pt",
              config_size: int = 4096, lspci: bool = True, gpus: int = 2, nvml_ok: bool = True,
              cuda_peers: bool | None = True) -> Path:
    """Lay out a host snapshot under ``root`` (``sys/``, ``proc/``, ``lspci.txt``, ``nvml.json``, ``cuda_peers.json``)
    and return ``root``. ``acs``: the switch's downstream ports (or the root ports) redirect peer requests
    (ReqRedir+ CmpltRedir+, control 0x001d; off: 0x0011). ``config_size`` 256: config space as a user without root
    reads it. ``iommu_type``: the GPUs' iommu group type (``DMA-FQ`` translated)."""
    sysr = root / "sys"
    devs = sysr / "devices" / "pci0000:00"
    ctl = 0x001D if acs else 0x0011
    if switch:
        bridges = {"0000:00:01.0": [], "0000:01:00.0": ["0000:00:01.0"]}
        ports = [f"0000:02:0{i}.0" for i in range(gpus)]
        for p in ports:
            bridges[p] = ["0000:00:01.0", "0000:01:00.0"]
        gpu_paths = {f"0000:{3 + i:02x}:00.0": bridges[ports[i]] + [ports[i]] for i in range(gpus)}
        redirecting = ports
    else:
        ports = [f"0000:00:0{1 + i}.0" for i in range(gpus)]
        bridges = {p: [] for p in ports}
        gpu_paths = {f"0000:{0x41 + 0x40 * i:02x}:00.0": [ports[i]] for i in range(gpus)}
        redirecting = ports
    lspci_text = []
    for b, up in bridges.items():
        d = devs.joinpath(*up, b)
        d.mkdir(parents=True, exist_ok=True)
        (d / "vendor").write_text("0x10b5\n")
        (d / "class").write_text("0x060400\n")
        (d / "config").write_bytes(config_space(ctl if b in redirecting else 0x0011, config_size))
        lspci_text.append(LSPCI_BRIDGE.format(bdf=b, r="+" if (acs and b in redirecting) else "-",
                                              c="+" if (acs and b in redirecting) else "-"))
    groups = sysr / "kernel" / "iommu_groups"
    for n, (g, up) in enumerate(gpu_paths.items()):
        d = devs.joinpath(*up, g)
        d.mkdir(parents=True)
        (d / "vendor").write_text("0x10de\n")
        (d / "device").write_text(NV_GPU + "\n")
        (d / "class").write_text("0x030000\n")
        (d / "numa_node").write_text("0\n")
        (d / "config").write_bytes(config_space(None, config_size))
        (groups / str(40 + n)).mkdir(parents=True)
        (groups / str(40 + n) / "type").write_text(iommu_type + "\n")
        (d / "iommu_group").symlink_to(os.path.relpath(groups / str(40 + n), d))   # relative, as sysfs's are
        lspci_text.append(LSPCI_GPU.format(bdf=g))
    (sysr / "class" / "iommu" / "dmar0").mkdir(parents=True)
    bus = sysr / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    for b, up in list(bridges.items()) + list(gpu_paths.items()):
        (bus / b).symlink_to(os.path.relpath(devs.joinpath(*up, b), bus))
    proc = root / "proc"
    (proc / "driver" / "nvidia").mkdir(parents=True)
    (proc / "cmdline").write_text(cmdline + "\n")
    (proc / "driver" / "nvidia" / "version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16-I3-B03-4-3)\n")
    if lspci:
        (root / "lspci.txt").write_text("".join(lspci_text) if config_size > 256 else "".join(
            t for t in lspci_text if "ACSCtl" not in t))
    pairs = [f"{i}-{j}" for i in range(gpus) for j in range(gpus) if i != j]
    (root / "nvml.json").write_text(json.dumps({k: {"p2p_read": "ok" if nvml_ok else "status 4",
                                                    "link": "NVML_TOPOLOGY_SINGLE" if switch else "NVML_TOPOLOGY_HOSTBRIDGE"} for k in pairs}))
    if cuda_peers is not None:
        (root / "cuda_peers.json").write_text(json.dumps({k: cuda_peers for k in pairs}))
    return root
