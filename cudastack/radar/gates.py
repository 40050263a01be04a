"""Reading one released package's gates, straight from the index: no install, no image, no GPU.

For one release, :func:`scan_release` downloads a file (a wheel the toolchain's Python can install,
else a pure-Python wheel, else the sdist), unpacks it into the cache by sha256 and reads the gates the
validation suite reads, with the suite's own readers pointed at the unpacked tree:

* flashinfer-python: ``supported_major_versions`` of every ``gen_*`` JIT module in
  ``flashinfer/jit/comm.py`` (:func:`stackprobe.probes.flashinfer_common.module_majors`, ``ast``; the
  allreduce-fusion module is ``gen_trtllm_comm_module``, gate ``fusion``), and whether the PCIe IPC
  allreduce (``PcieIpcAllReduceWorkspace``) exists;
* sglang: custom allreduce's PCIe world-size rule (``world_size > N and not full_nvlink``) and
  ``CustomAllreduce._SUPPORTED_WORLD_SIZES`` (:mod:`stackprobe.probes.sglang_custom_ar`), the keys of
  ``TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES`` (:mod:`stackprobe.probes.torch_symm_mem`);
* any file with shared objects: arch coverage of each library for the target
  (:func:`stackprobe.coverage.scan_files`, the ELF fatbin reader), gate ``arch-coverage``: admits when
  every library has SASS for the target (``native`` or ``family``).

Each gate's ``admits`` is True / False, or None where the gate does not apply to the file (no shared
objects) or could not be read (with the reason). A scan result is cached under
``scan/<file sha256>/<key>.json`` where the key covers the target, world size, topology and a digest of
the reader sources, so a changed reader re-scans.

:mod:`cudastack.radar.scan` (ranges of releases, the first release that lifts a gate, the report) calls
:func:`scan_release` and re-exports this module's public names.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from cudastack.core.errors import UsageError
from cudastack.pkgindex.client import Index, IndexFile, atomic_write
from cudastack.pkgindex.wheels import supported_tags
from stackprobe import api as sp
from stackprobe.api import Arch

SCAN_FORMAT = 1
SCAN_SUFFIXES = (".py", ".so", ".cubin")    # what the readers read: Python sources and shared objects
FUSION_FN = "gen_trtllm_comm_module"
_READERS = [*sp.radar_reader_files(), Path(__file__)]


def _readers_digest() -> str:
    h = hashlib.sha256()
    for p in _READERS:
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


@dataclass
class Gate:
    """One gate read from one release. ``admits``: True/False, None = not applicable / unreadable."""

    name: str
    value: object
    admits: bool | None
    where: str = ""

    def to_json(self) -> dict:
        return {"name": self.name, "value": self.value, "admits": self.admits, "where": self.where}


@dataclass
class ReleaseScan:
    package: str
    version: str
    filename: str
    sha256: str
    gates: dict[str, Gate] = field(default_factory=dict)
    cached: bool = False

    def to_json(self) -> dict:
        return {"package": self.package, "version": self.version, "filename": self.filename, "sha256": self.sha256,
                "gates": {k: g.to_json() for k, g in self.gates.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "ReleaseScan":
        return cls(d["package"], d["version"], d["filename"], d["sha256"],
                   {k: Gate(g["name"], g["value"], g["admits"], g["where"]) for k, g in d["gates"].items()})


# ---------------------------------------------------------------------------------- file choice
def pick_file(files: list[IndexFile], python: str = "3.11", glibc: tuple[int, int] = (2, 36)) -> IndexFile | None:
    """The file of a release to scan: the best wheel ``python`` on Linux x86_64 can install, else any
    Linux x86_64 wheel, else the sdist. Yanked files are never picked."""
    files = [f for f in files if not f.yanked]
    ranked = {t: i for i, t in enumerate(supported_tags(python, glibc))}
    wheels = [(min(ranked.get(t, 10**6) for t in f.tags), f) for f in files if f.kind == "wheel"]
    ok = sorted((r, f.filename, f) for r, f in wheels if r < 10**6)
    if ok:
        return ok[0][2]
    linux = sorted((f.filename, f) for _, f in wheels if any("x86_64" in t.platform for t in f.tags))
    if linux:
        return linux[0][1]
    sd = [f for f in files if f.kind == "sdist"]
    return sd[0] if sd else None


def _package_root(unpacked: Path, top: str) -> Path | None:
    """Folder holding the import package ``top`` (wheel: the root; sdist: one level down, or deeper
    for a src/ layout)."""
    for cand in (unpacked, *sorted(unpacked.glob("*")), *sorted(unpacked.glob("*/src")), *sorted(unpacked.glob("*/python"))):
        if (cand / top).is_dir():
            return cand
    return None


# ---------------------------------------------------------------------------------- gate readers
def flashinfer_gates(root: Path, target: Arch) -> dict[str, Gate]:
    """JIT module majors and PCIe IPC allreduce of an unpacked flashinfer-python (``root`` holds
    ``flashinfer/``)."""
    out: dict[str, Gate] = {}
    try:
        majors, where = sp.flashinfer_module_majors(FUSION_FN, root=root)
        out["fusion"] = Gate("fusion", majors, majors is None or target.major in majors,
                             f"{where}: supported_major_versions")
    except sp.SourceNotFound as e:
        out["fusion"] = Gate("fusion", "absent", False, f"{e}")
    except SyntaxError as e:
        out["fusion"] = Gate("fusion", "unreadable", None, f"{e}")
    try:
        for fn, majors in sorted(sp.flashinfer_all_module_majors(root=root).items()):
            if fn == FUSION_FN or majors is None:
                continue
            out[f"jit:{fn}"] = Gate(f"jit:{fn}", majors, target.major in majors,
                                    f"flashinfer/jit/comm.py {fn} (ast)")
    except (sp.SourceNotFound, SyntaxError):
        pass
    hits = sp.find_files_containing(root / "flashinfer", "class PcieIpcAllReduceWorkspace")
    out["pcie-ipc"] = Gate("pcie-ipc", "present" if hits else "absent", bool(hits),
                           (hits[0].relative_to(root).as_posix() if hits else "no class PcieIpcAllReduceWorkspace under flashinfer/"))
    return out


def sglang_gates(root: Path, target: Arch, world_size: int, topology: str) -> dict[str, Gate]:
    """Custom allreduce (PCIe world-size rule, supported sizes) and the symm-mem table of an unpacked
    sglang (``root`` holds ``sglang/``)."""
    pkg = root / "sglang"
    out: dict[str, Gate] = {}
    rule = sp.find_pcie_world_size_rule(pkg)
    sizes, sizes_where = None, ""
    p = pkg / "srt" / "distributed" / "device_communicators" / "custom_all_reduce.py"
    if p.is_file():
        try:
            sizes, line = sp.class_attribute(p, "CustomAllreduce", "_SUPPORTED_WORLD_SIZES")
            sizes_where = f"{sp.short_source_path(p)}:{line}"
        except (sp.SourceNotFound, ValueError, SyntaxError):
            pass
    if rule is None and sizes is None:
        out["custom-allreduce"] = Gate("custom-allreduce", "absent", None, "no custom allreduce rule or sizes found")
    else:
        admits = True
        parts = []
        if rule is not None:
            parts.append(f"disabled when world_size > {rule[0]} without full NVLink")
            if world_size > rule[0] and topology != "nvlink":
                admits = False
        if sizes is not None:
            parts.append(f"_SUPPORTED_WORLD_SIZES {sorted(sizes)}")
            if world_size not in sizes:
                admits = False
        where = "; ".join(w for w in ((rule[1] if rule else ""), sizes_where) if w)
        out["custom-allreduce"] = Gate("custom-allreduce", "; ".join(parts), admits,
                                       f"{where} (ast), world size {world_size} on {topology}")
    srt = pkg / "srt"
    try:
        path, table, line = sp.find_assignment(srt if srt.is_dir() else pkg, sp.SYMM_MEM_TABLE)
        keys = sorted(table)
        style, lwhere = sp.symm_mem_lookup_style(pkg)
        ok = target.major in table
        if ok and isinstance(table[target.major], dict):
            ok = world_size in table[target.major]
        out["symm-mem-table"] = Gate("symm-mem-table", {"keys": keys, "lookup": style}, ok,
                                     f"{sp.short_source_path(path)}:{line} {sp.SYMM_MEM_TABLE} (ast); lookup {lwhere}")
    except (sp.SourceNotFound, SyntaxError, ValueError) as e:
        out["symm-mem-table"] = Gate("symm-mem-table", "absent", None, f"{sp.SYMM_MEM_TABLE}: {e}")
    return out


def coverage_gate(unpacked: Path, target: Arch, package: str, version: str) -> Gate:
    """Arch coverage of every shared object under ``unpacked`` for ``target`` (ELF fatbin reader)."""
    files = [(p.relative_to(unpacked).as_posix(), str(p)) for p in sorted(unpacked.rglob("*"))
             if p.is_file() and sp.is_coverage_candidate(p.name)]
    if not files:
        return Gate("arch-coverage", "no shared objects", None, "no .so/.cubin in the file")
    cov = sp.coverage_scan_files(files, target, "elf", package=package, version=version)
    return _coverage_gate(cov)


def _coverage_gate(cov) -> Gate:
    if cov.level == "no-cuda-code":
        return Gate("arch-coverage", "no-cuda-code", None, f"{cov.scanned} libraries, none with a fatbin")
    summary = {"level": cov.level, "libraries": len(cov.files), "without": cov.files_without[:5],
               "ptx_only": cov.files_ptx_only[:5]}
    return Gate("arch-coverage", summary, cov.level in ("native", "family"),
                f"stackprobe.coverage ELF reader over {cov.scanned} files")


def kernel_gates(unpacked: Path, target: Arch, package: str, version: str) -> dict[str, Gate]:
    """sgl-kernel / sglang-kernel: arch coverage of every library, and of the custom allreduce kernels
    alone (``common_ops``: the libraries the suite's custom allreduce probe reads; any one build of it
    with SASS for the target admits)."""
    files = [(p.relative_to(unpacked).as_posix(), str(p)) for p in sorted(unpacked.rglob("*"))
             if p.is_file() and sp.is_coverage_candidate(p.name)]
    cov = sp.coverage_scan_files(files, target, "elf", package=package, version=version)
    ops = [f for f in cov.files if "common_ops" in f.path]
    out = {"arch-coverage": _coverage_gate(cov)}
    out["custom-allreduce-kernels"] = Gate(
        "custom-allreduce-kernels", {"level": max((f.level for f in ops), key=lambda lv: -sp.COVERAGE_LEVELS.index(lv))
                                     if ops else "absent", "libraries": len(ops),
                                     "without": [f.path for f in ops if f.level == "none"][:3], "ptx_only": []},
        any(f.level in ("native", "family") for f in ops) if ops else False,
        "common_ops libraries, stackprobe.coverage ELF reader")
    return out


def _scan_unpacked(package: str, version: str, unpacked: Path, target: Arch, world_size: int,
                   topology: str) -> dict[str, Gate]:
    gates: dict[str, Gate] = {}
    name = package.lower().replace("_", "-")
    if name == "flashinfer-python":
        root = _package_root(unpacked, "flashinfer")
        if root is None:
            gates["fusion"] = Gate("fusion", "no flashinfer package in the file", None, str(unpacked))
        else:
            gates.update(flashinfer_gates(root, target))
    elif name == "sglang":
        root = _package_root(unpacked, "sglang")
        if root is None:
            gates["custom-allreduce"] = Gate("custom-allreduce", "no sglang package in the file", None, str(unpacked))
        else:
            gates.update(sglang_gates(root, target, world_size, topology))
    if name in ("sglang-kernel", "sgl-kernel"):
        gates.update(kernel_gates(unpacked, target, package, version))
        return gates
    cov = coverage_gate(unpacked, target, package, version)
    if cov.admits is not None or not gates:
        gates["arch-coverage"] = cov
    return gates


def scan_release(index: Index, package: str, version: Version, target: Arch, *, world_size: int = 8,
                 topology: str = "pcie", python: str = "3.11", keep_unpacked: bool | None = None) -> ReleaseScan:
    """Download, unpack and read the gates of one release (cached by file sha256 and scan key). The
    unpacked tree is removed once the result is cached unless ``keep_unpacked`` (default: the
    ``CUDASTACK_KEEP_UNPACKED`` environment variable is set): wheels such as sglang-kernel unpack to GBs."""
    if keep_unpacked is None:
        keep_unpacked = os.environ.get("CUDASTACK_KEEP_UNPACKED", "") not in ("", "0")
    proj = index.project(package)
    f = pick_file(proj.files.get(version, []), python)
    if f is None:
        raise UsageError(f"{package} {version} has no wheel or sdist on {index.url} to scan.")
    key = f"{target.cc}-ws{world_size}-{topology}-f{SCAN_FORMAT}-{_readers_digest()}"
    path = index.cache / "scan" / f.sha256 / f"{key}.json"
    if path.is_file():
        try:
            res = ReleaseScan.from_json(json.loads(path.read_text()))
            res.cached = True
            return res
        except (ValueError, KeyError):
            pass
    unpacked = index.unpack(f, SCAN_SUFFIXES)
    gates = _scan_unpacked(package, str(version), unpacked, target, world_size, topology)
    res = ReleaseScan(proj.name, str(version), f.filename, f.sha256, gates)
    atomic_write(path, json.dumps(res.to_json(), default=str).encode())
    if not keep_unpacked:
        shutil.rmtree(unpacked, ignore_errors=True)   # the download and the result stay; unpacking again takes seconds
    return res
