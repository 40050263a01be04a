"""Arch coverage: which SASS and PTX architectures every shared object of a package carries, and a
per-package verdict for a target compute capability.

Two readers:

* ``elf`` (default): the suite's own ELF reader (:mod:`stackprobe.elfread`, standard library only, so it runs
  in any target environment) locates the ``.nv_fatbin`` section; the
  fatbin container and entry headers inside it are read with seeks, never the payloads, so a 1 GB
  ``flash_ops.abi3.so`` costs milliseconds. Compressed entries need no decompression: the headers are
  plain.
* ``cuobjdump --list-elf --list-ptx`` (NVIDIA's tool) on request.
  *Measured* with cuobjdump 13.5: it lists an ``sm_120f`` cubin as ``sm_120`` (the family suffix is
  lost), which is why the ELF reader is preferred when both exist.

Fatbin layout (measured on nvcc 13.1 output, cross-checked against cuobjdump): a container header
``<IHHQ`` = magic 0xBA55ED50, version, header size, payload size; then entries, each ``<HHIQ`` = kind
(1 PTX, 2 ELF cubin), version, header size, padded payload size; the entry's compute capability
number is the u32 at offset 28 (120 for sm_120) and its flags the u64 at offset 40: 0x100000 marks an
architecture-specific (``a``) target, 0x200000 a family-specific (``f``) target, 0x2000/0x8000
compression.

Levels for a target T (:data:`LEVELS`), following CUDA's compatibility rules (NVIDIA CUDA C++
Programming Guide, "Binary Compatibility" / "PTX Compatibility"; CUDA 12.9 family-specific targets;
see :meth:`stackprobe.archs.Arch.sass_level`):

* ``native``: SASS for exactly T's compute capability (any suffix);
* ``family``: an ``f`` SASS of T's major with a lower minor;
* ``same-major``: plain SASS of T's major with a lower minor (a cubin for X.y runs on X.z, z >= y;
  ``sm_120`` runs on 12.1, ``sm_80`` on 8.6 and 8.9); ``a`` SASS never runs on another compute capability;
* ``ptx-only``: no SASS that runs, but PTX the driver can JIT for T; the row names the PTX ISA version
  (read from the fatbin entry header: the u16 pair at offsets 24/26 is minor/major, *measured*: 9.1 for
  nvcc 13.1 output, equal to the ``.version`` line of its PTX) and the CUDA driver that can JIT it
  (:func:`stackprobe.driver.ptx_requirement`): a warning, slow first load, no arch-specific features;
* ``partial``: SASS that runs on T covers fewer fatbins (compilation units) than another arch does in
  the same file: some kernels have no image for T (``detail`` gives the counts);
* ``none``: no kernel image for T (case C6).

Which level applies to a file is the one that applies to most of its fatbins (``detail["levels"]``
counts them), so one ``sm_121a`` kernel in a file of 476 ``sm_120`` fatbins reads ``same-major`` for 12.1.
"""
from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

from .archs import Arch

FATBIN_MAGIC = 0xBA55ED50
_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
FLAG_ARCH_SPECIFIC = 0x100000
FLAG_FAMILY = 0x200000
FLAG_COMPRESSED = 0x2000 | 0x8000
KIND_PTX, KIND_ELF = 1, 2
LEVELS = ("native", "family", "same-major", "ptx-only", "partial", "none")
#: levels at which SASS runs on the target (no JIT): what a gate on compiled kernels accepts
SASS_LEVELS = ("native", "family", "same-major")
_SASS_LEVEL_NAME = {"exact": "native", "family": "family", "same-major": "same-major"}

# distributions holding CUDA code that static coverage inspects (PyPI names)
CUDA_DISTS = ("torch", "flash-attn", "flash_attn_3", "sglang-kernel", "sgl-kernel", "flashinfer-python",
              "flashinfer-jit-cache", "flashinfer-cubin", "mscclpp", "b12x", "deep-ep")


class CoverageReaderError(RuntimeError):
    """The reader asked for is unavailable (cuobjdump requested but not found)."""


@dataclass(frozen=True)
class Image:
    """One fatbin entry: ``kind`` "sass" or "ptx", ``arch`` its target, ``compressed``; ``unit`` names the
    fatbin container (one per compilation unit) it sits in ("" when the reader cannot tell, cuobjdump);
    ``ptx_isa`` the PTX ISA version ("9.1") of a PTX entry ("" when unknown)."""

    kind: str
    arch: Arch
    compressed: bool = False
    unit: str = ""
    ptx_isa: str = ""

    @property
    def name(self) -> str:
        return self.arch.sm if self.kind == "sass" else self.arch.compute


def _arch_from(number: int, flags: int) -> Arch:
    suffix = "a" if flags & FLAG_ARCH_SPECIFIC else ("f" if flags & FLAG_FAMILY else "")
    return Arch(number // 10, number % 10, suffix)


def _iter_fatbin_entries(f, base: int, size: int):
    """Yield (kind, arch_number, flags, container index, (major, minor) from offsets 26/24) for every
    entry of every fatbin container in the byte range [base, base+size) of the open file ``f``."""
    off, container = 0, -1
    while off + 16 <= size:
        f.seek(base + off)
        head = f.read(16)
        if len(head) < 16:
            return
        magic, _ver, hsize, fsize = struct.unpack("<IHHQ", head)
        if magic != FATBIN_MAGIC:
            # padding between containers: look for the next magic in chunks
            f.seek(base + off)
            chunk = f.read(min(1 << 16, size - off))
            idx = chunk.find(_MAGIC_BYTES, 1)
            if idx < 0:
                off += max(len(chunk) - 3, 1)
                continue
            off += idx
            continue
        eoff, end = off + hsize, off + hsize + fsize
        container += 1
        while eoff + 16 <= end:
            f.seek(base + eoff)
            eh = f.read(48)
            if len(eh) < 48:
                return
            kind, _ev, ehsize, psize = struct.unpack_from("<HHIQ", eh)
            vminor, vmajor = struct.unpack_from("<HH", eh, 24)
            number = struct.unpack_from("<I", eh, 28)[0]
            flags = struct.unpack_from("<Q", eh, 40)[0]
            if ehsize == 0:
                break
            yield kind, number, flags, container, (vmajor, vminor)
            eoff += ehsize + psize
        off = max(end, off + 16)


_TKINFO_ARCH = re.compile(rb"-arch[ =]sm_(\d+)([af]?)\b")


def cubin_arch(elf) -> Arch | None:
    """The target of a raw CUDA ELF (``.cubin``, OS ABI 0x41; ``elf`` a :class:`stackprobe.elfread.ELF`). The SM
    number is in ``e_flags`` (bits 8..15 for ELF ABI version >= 8, bits 0..7 before). The ``a``/``f`` suffix is
    read from the ``.note.nv.tkinfo`` note (ptxas's options, ``-arch sm_120a``): *measured* on nvcc 13.1,
    ``e_flags`` are identical for sm_120, sm_120a and sm_120f cubins, so the flags alone cannot keep the suffix."""
    flags = elf.header["flags"]
    abi = elf.header["abiversion"]
    number = (flags >> 8) & 0xFF if abi >= 8 else flags & 0xFF
    if not number:
        return None
    suffix = ""
    note = elf.section(".note.nv.tkinfo")
    if note is not None:
        m = _TKINFO_ARCH.search(elf.read(note.offset, note.size))
        if m and int(m.group(1)) == number:
            suffix = m.group(2).decode()
    return Arch(number // 10, number % 10, suffix)


def read_elf(path: str) -> list[Image]:
    """Fatbin images of one ELF file (shared object or object file) via the suite's own ELF reader
    (:mod:`stackprobe.elfread`), each with its fatbin container (``unit``) and, for PTX, its PTX ISA version.
    A raw CUDA ELF (``.cubin``) gives one SASS image (:func:`cubin_arch`, suffix kept)."""
    from .elfread import ELF, SHT_NOBITS, ELFReadError

    images: list[Image] = []
    try:
        elf = ELF(path)
    except (ELFReadError, OSError):
        return images
    with elf, open(path, "rb") as f:
        if elf.osabi == 0x41:  # CUDA cubin
            arch = cubin_arch(elf)
            return [Image("sass", arch, unit="cubin")] if arch else images
        for name in (".nv_fatbin", "__nv_relfatbin"):
            sec = elf.section(name)
            if sec is None or sec.type == SHT_NOBITS:
                continue
            for kind, number, flags, container, (vmaj, vmin) in _iter_fatbin_entries(f, sec.offset, sec.size):
                if kind in (KIND_PTX, KIND_ELF) and number:
                    images.append(Image("ptx" if kind == KIND_PTX else "sass", _arch_from(number, flags),
                                        bool(flags & FLAG_COMPRESSED), f"{name}#{container}",
                                        f"{vmaj}.{vmin}" if kind == KIND_PTX and vmaj else ""))
    return images


_CUOBJ_LINE = re.compile(r"^(ELF|PTX) file\s+\d+:\s+\S*?\.(sm|compute)_(\d+)([af]?)\.(cubin|ptx)\s*$")


def find_cuobjdump() -> str | None:
    """cuobjdump on PATH, under CUDA_HOME/bin, in a PyPI toolkit (nvidia/cu13/bin) or Triton's wheel."""
    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    cands = [Path(home) / "bin" / "cuobjdump"]
    import sys
    for entry in sys.path:
        cands += list(Path(entry).glob("nvidia/cu*/bin/cuobjdump"))
        cands.append(Path(entry) / "triton" / "backends" / "nvidia" / "bin" / "cuobjdump")
    for c in cands:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    return None


def read_cuobjdump(path: str, exe: str) -> list[Image]:
    """Images listed by ``cuobjdump --list-elf --list-ptx`` (suffix ``f`` is reported as plain)."""
    p = subprocess.run([exe, "--list-elf", "--list-ptx", path], capture_output=True, text=True, timeout=600)
    images = []
    for line in p.stdout.splitlines():
        m = _CUOBJ_LINE.match(line.strip())
        if m:
            number = int(m.group(3))
            images.append(Image("sass" if m.group(1) == "ELF" else "ptx",
                                Arch(number // 10, number % 10, m.group(4))))
    return images


def pick_reader(preference: str = "auto") -> tuple[str, str | None]:
    """("elf", None) or ("cuobjdump", exe). ``preference``: "auto", "elf" or "cuobjdump".
    Raises :class:`CoverageReaderError` when the asked reader (or, for auto, any) is unavailable."""
    if preference in ("elf", "auto"):   # the suite's own reader (stackprobe.elfread): always available
        return "elf", None
    exe = find_cuobjdump()
    if exe:
        return "cuobjdump", exe
    raise CoverageReaderError(
        "no cuobjdump for --coverage-reader cuobjdump: put NVIDIA's cuobjdump on PATH (CUDA toolkit, or "
        "`pip install nvidia-cuda-cuobjdump`), or use the default reader (elf).")


def level_for(images: list[Image], target: Arch) -> str:
    """One of :data:`LEVELS` for the images of one file (see module doc)."""
    return file_level(images, target)[0]


def file_level(images: list[Image], target: Arch) -> tuple[str, dict]:
    """(level, detail) for the images of one file and target ``target`` (see module doc).

    ``detail``: ``{"unit": "fatbins" | "images", "target": n, "most": m, "most_arch": name,
    "levels": {level: n}}`` when some SASS runs on the target: ``target`` units (fatbin containers, or
    images for a reader that cannot tell containers apart) hold SASS that runs on it, ``most`` is the
    largest number of units holding one arch's SASS (``most_arch``); ``target < most`` is ``partial``.
    For PTX: ``{"ptx_isa": ["9.1"], ...}``. Empty otherwise."""
    sass = [i for i in images if i.kind == "sass"]
    rank = {lvl: i for i, lvl in enumerate(LEVELS)}
    runs = [(i, i.arch.sass_level(target)) for i in sass]
    runnable = [(i, _SASS_LEVEL_NAME[lv]) for i, lv in runs if lv]
    detail: dict = {}
    if runnable:
        by_container = all(i.unit for i in sass)
        if by_container:
            best: dict = {}
            for i, lv in runnable:
                if i.unit not in best or rank[lv] < rank[best[i.unit]]:
                    best[i.unit] = lv
            levels: dict = {}
            for lv in best.values():
                levels[lv] = levels.get(lv, 0) + 1
            covered = len(best)
            per_arch: dict = {}
            for i in sass:
                per_arch.setdefault(i.name, set()).add(i.unit)
            per_arch = {k: len(v) for k, v in per_arch.items()}
        else:
            per_arch = {}
            for i in sass:
                per_arch[i.name] = per_arch.get(i.name, 0) + 1
            levels = {}
            for i, lv in runnable:
                levels[lv] = max(levels.get(lv, 0), per_arch[i.name])
            covered = max(per_arch[i.name] for i, _ in runnable)
        most_arch = max(sorted(per_arch), key=lambda k: per_arch[k])
        detail = {"unit": "fatbins" if by_container else "images", "target": covered, "most": per_arch[most_arch],
                  "most_arch": most_arch, "levels": levels}
        if covered < per_arch[most_arch]:
            return "partial", detail
        return min(levels, key=lambda lv: (-levels[lv], rank[lv])), detail
    ptx = [i for i in images if i.kind == "ptx" and i.arch.ptx_jits_on(target)]
    if ptx:
        from .driver import ptx_requirement
        isas = sorted({i.ptx_isa for i in ptx if i.ptx_isa}, key=lambda v: tuple(int(x) for x in v.split(".")))
        detail = {"ptx_isa": isas}
        if isas:
            detail["ptx_needs"] = ptx_requirement(isas[-1])
        return "ptx-only", detail
    return "none", detail


@dataclass
class FileCoverage:
    """One file holding CUDA code. ``path`` relative to its site directory; ``sass``/``ptx``: sorted
    unique arch names; ``counts``: images per arch name; ``level`` for the target; ``detail``: the
    counts behind the level (:func:`file_level`); ``ptx_isa``: PTX ISA versions of its PTX images."""

    path: str
    sass: list[str]
    ptx: list[str]
    level: str
    counts: dict = field(default_factory=dict)
    compressed: bool = False
    detail: dict = field(default_factory=dict)
    ptx_isa: list = field(default_factory=list)


@dataclass
class PackageCoverage:
    """Coverage of one distribution for the target.

    ``level``: the worst level over its libraries (files with the same name in different folders,
    e.g. ``sgl_kernel/sm90/common_ops.abi3.so`` and ``sm100/common_ops.abi3.so``, are alternative
    builds: the best of them counts), or "partial" when some libraries cover the target and others
    do not, "no-cuda-code" when no file carries a fatbin, "unreadable" on reader errors.
    ``files_without``: files whose level is "none" (case C6 names them); ``files_partial``: files where
    fewer fatbins carry code for the target than for another arch.
    """

    package: str
    version: str
    target: str
    reader: str
    level: str
    files: list[FileCoverage] = field(default_factory=list)
    files_without: list[str] = field(default_factory=list)
    files_ptx_only: list[str] = field(default_factory=list)
    files_partial: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    scanned: int = 0
    source: str = ""   # where the files come from when not the distribution itself (libnccl: its wheel or path)

    def to_json(self) -> dict:
        return asdict(self)


def _candidate(path: str) -> bool:
    base = os.path.basename(path)
    return base.endswith((".so", ".cubin")) or ".so." in base


def scan_files(files: list[tuple[str, str]], target: Arch, reader: str = "auto",
               package: str = "", version: str = "") -> PackageCoverage:
    """Coverage of explicit files: ``files`` is [(relative name, absolute path)]."""
    kind, exe = pick_reader(reader)
    cov = PackageCoverage(package, version, str(target), kind, "no-cuda-code")
    for rel, absolute in files:
        if not _candidate(rel):
            continue
        cov.scanned += 1
        try:
            images = read_elf(absolute) if kind == "elf" else read_cuobjdump(absolute, exe)
        except Exception as e:  # noqa: BLE001 - one unreadable file is an error entry, not a crash
            cov.errors.append(f"{rel}: {type(e).__name__}: {e}")
            continue
        if not images:
            continue
        counts: dict = {}
        for i in images:
            counts[i.name] = counts.get(i.name, 0) + 1
        level, detail = file_level(images, target)
        cov.files.append(FileCoverage(
            rel, sorted({i.name for i in images if i.kind == "sass"}), sorted({i.name for i in images if i.kind == "ptx"}),
            level, counts, any(i.compressed for i in images), detail,
            sorted({i.ptx_isa for i in images if i.ptx_isa})))
    _aggregate(cov)
    return cov


def _aggregate(cov: PackageCoverage) -> None:
    if not cov.files:
        cov.level = "unreadable" if cov.errors else "no-cuda-code"
        return
    rank = {lvl: i for i, lvl in enumerate(LEVELS)}
    groups: dict = {}
    for fc in cov.files:
        groups.setdefault(os.path.basename(fc.path), []).append(fc)
    best = {name: min((f.level for f in members), key=rank.__getitem__) for name, members in groups.items()}
    cov.files_without = sorted(f.path for name, members in groups.items() if best[name] == "none" for f in members)
    cov.files_ptx_only = sorted(f.path for name, members in groups.items() if best[name] == "ptx-only" for f in members)
    cov.files_partial = sorted(f.path for name, members in groups.items() if best[name] == "partial" for f in members)
    worst = max(best.values(), key=rank.__getitem__)
    covered = any(v in SASS_LEVELS for v in best.values())
    cov.level = "partial" if worst == "none" and covered else worst


def dist_files(name: str) -> tuple[str, list[tuple[str, str]]] | None:
    """(version, [(relative path, absolute path)]) of an installed distribution, or None."""
    try:
        dist = metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None
    out = []
    for pp in dist.files or []:
        s = str(pp)
        if _candidate(s):
            out.append((s, str(pp.locate())))
    return dist.version, out


def scan_package(name: str, target: Arch, reader: str = "auto") -> PackageCoverage | None:
    """Coverage of installed distribution ``name`` (None when not installed)."""
    found = dist_files(name)
    if found is None:
        return None
    version, files = found
    return scan_files(files, target, reader, package=name, version=version)


def scan_installed(target: Arch, reader: str = "auto", names: tuple = CUDA_DISTS) -> list[PackageCoverage]:
    """Coverage of every installed distribution among ``names``."""
    out = []
    for n in names:
        c = scan_package(n, target, reader)
        if c is not None:
            out.append(c)
    return out


# ------------------------------------------------------------------------------------------- libnccl
NCCL_DISTS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12")
SYSTEM_LIB_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                   "/usr/local/cuda/lib64", "/usr/local/cuda/lib", "/usr/local/nccl/lib")


def find_libnccl() -> dict | None:
    """The libnccl a process here loads: an nvidia-nccl-cu13/cu12 wheel's ``libnccl.so.2`` (what PyPI's
    torch loads), else the first ``libnccl.so.2`` on ``LD_LIBRARY_PATH`` or in the system library folders.
    Returns ``{"path", "dist", "version"}`` (dist/version empty for a system library) or None."""
    for d in NCCL_DISTS:
        found = dist_files(d)
        if found:
            version, files = found
            for rel, absolute in files:
                if os.path.basename(rel).startswith("libnccl.so") and os.path.isfile(absolute):
                    return {"path": absolute, "rel": rel, "dist": d, "version": version}
    dirs = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p] + list(SYSTEM_LIB_DIRS)
    for folder in dirs:
        p = Path(folder) / "libnccl.so.2"
        if p.is_file():
            return {"path": str(p.resolve()), "rel": str(p), "dist": "", "version": ""}
    return None


_NCCL_VERSION_STRING = re.compile(rb"NCCL version (\d+\.\d+\.\d+(?:\+cuda[\d.]+)?)")


def file_nccl_version(path: str) -> str:
    """The ``NCCL version X.Y.Z+cudaA.B`` string a libnccl file carries (the banner NCCL prints with
    ``NCCL_DEBUG=INFO``), read without loading it; "" when absent or unreadable. Its version is what loads
    whatever the wheel's metadata says (an edited or replaced file, case C55)."""
    import mmap

    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            i = m.find(b"NCCL version ")
            while i >= 0:
                hit = _NCCL_VERSION_STRING.match(m[i:i + 80])
                if hit:
                    return hit.group(1).decode()
                i = m.find(b"NCCL version ", i + 1)
    except (OSError, ValueError):
        pass
    return ""


def scan_libnccl(target: Arch, reader: str = "auto") -> PackageCoverage | None:
    """Coverage of the libnccl :func:`find_libnccl` finds, as package ``libnccl`` (the baseline's own
    kernels: case C26), or None when there is none."""
    lib = find_libnccl()
    if lib is None:
        return None
    own = file_nccl_version(lib["path"])
    version = lib["version"] or own.split("+")[0]
    if own and lib["version"] and own.split("+")[0] != lib["version"]:   # the row names what loads (C55)
        version = f"{own} (the file; wheel metadata {lib['dist']} {lib['version']})"
    cov = scan_files([(lib["rel"], lib["path"])], target, reader, package="libnccl", version=version)
    cov.source = lib["dist"] or lib["path"]
    return cov
