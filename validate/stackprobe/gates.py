"""Gates shared by every backend, each a function the backend probes (or a post-pass) call:

* :func:`nccl_library_gate`: the baseline's own library (case C26): libnccl's arch coverage
  (:func:`stackprobe.coverage.scan_libnccl`) and the known-bad-releases data
  (:mod:`stackprobe.known_bad`) for ``nccl-ring`` / ``nccl-tree``;
* :func:`apply_missing_dependency`: a backend whose import fails because a distribution its package
  requires is not installed reads ``blocked (not installed: <dist>)`` (case C29), found from the import
  error and the package's own ``Requires-Dist``, never matched to an arch case;
* :func:`apply_known_bad`: any other verdict whose backend is named by a known-bad entry that applies;
* the driver floor is :func:`stackprobe.driver.apply_driver_floor` (case C28).
"""
from __future__ import annotations

import re
from importlib import metadata

from . import known_bad
from .verdict import (BLOCKED, GATE_BINARY, GATE_KNOWN_BAD, GATE_NOT_INSTALLED, LIFT_PACKAGE)

_NO_MODULE = re.compile(r"No module named '([\w.]+)'")
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _open(v) -> bool:
    """A verdict a library gate may still close: passing, or waiting for the runtime tier."""
    return v.is_open


def nccl_library_gate(ctx, verdicts: list, version: str | None) -> list:
    """Apply libnccl's coverage and the known-bad data to the NCCL verdicts (``nccl-ring``, ``nccl-tree``).

    ``ctx.coverage["libnccl"]``: the :class:`PackageCoverage` of the libnccl found (absent: no library
    file to scan; torch may link NCCL statically). ``version``: the NCCL version the process loads
    (torch's ``torch.cuda.nccl.version()``, else the library's). A coverage of ``none`` blocks
    (compiled-binary: no kernel image for the target); ``ptx-only`` adds a warning with the PTX ISA and
    the driver it needs; a known-bad entry that applies blocks with gate ``known-bad-release``, citing
    the entry. Returns ``verdicts``."""
    cov = (ctx.coverage or {}).get("libnccl")
    target = ctx.target
    for v in verdicts:
        if cov is not None:
            f = cov.files[0] if cov.files else None
            v.add("libnccl coverage", {"level": cov.level, "sass": f.sass if f else [], "ptx": f.ptx if f else [],
                                       **(f.detail if f else {})},
                  f"{cov.source or 'libnccl'}: {f.path if f else '-'} (fatbin headers)")
            if cov.level == "none" and _open(v):
                v.status, v.gate, v.lift = BLOCKED, GATE_BINARY, LIFT_PACKAGE
                v.cause = (f"libnccl {cov.version or ''} carries no SASS or PTX that runs on {target.cc}: "
                           f"{', '.join(f.sass) if f else '-'} (CUDA error 'no kernel image is available')")
                v.lift_detail = f"an NCCL build with sm_{target.number} SASS (a newer nvidia-nccl wheel)"
            elif cov.level == "ptx-only":
                need = (f.detail.get("ptx_needs") if f else "") or ""
                v.warnings.append(f"libnccl has no SASS for {target.cc}, only PTX ({', '.join(f.ptx) if f else ''}; {need}): "
                                  "the driver JIT-compiles its kernels at first use")
            elif cov.level == "partial" and f:
                v.warnings.append(f"libnccl: {f.detail.get('target')} of {f.detail.get('most')} fatbins carry code for "
                                  f"{target.cc}")
        kb = {"world_size": getattr(ctx, "world_size", None),                       # C59: the entry's conditions
              "driver": ((getattr(ctx, "env", None) or {}).get("driver") or {}).get("version")}
        for entry in known_bad.matches("nccl", version, target, ctx.topology, v.backend, context=kb):
            v.add(f"known-bad release {entry.id}", entry.describe(version, kb), entry.source)
            if _open(v) or v.gate == GATE_BINARY:
                v.status, v.gate, v.lift = BLOCKED, GATE_KNOWN_BAD, LIFT_PACKAGE
                v.cause = entry.describe(version, kb)
                v.lift_detail = entry.lift()
            else:
                v.warnings.append(entry.describe(version, kb))
    return verdicts


def apply_known_bad(verdicts: list, versions: dict, target, topology: str = "",
                    entries: list | None = None) -> list:
    """Block every open verdict whose backend a known-bad entry names, for the installed ``versions``
    ({distribution: version}); NCCL's entries are applied by :func:`nccl_library_gate`. Returns ``verdicts``."""
    entries = known_bad.load() if entries is None else entries
    for v in verdicts:
        for e in entries:
            if e.package == "nccl" or (e.backends and v.backend not in e.backends):
                continue
            ver = versions.get(e.package)
            if e.applies(ver, target, topology):
                v.add(f"known-bad release {e.id}", e.describe(ver), e.source)
                if _open(v):
                    v.status, v.gate, v.lift = BLOCKED, GATE_KNOWN_BAD, LIFT_PACKAGE
                    v.cause, v.lift_detail = e.describe(ver), f"{e.package} >= {e.fixed_in}"
    return verdicts


def requirements(dist: str) -> list[tuple[str, str]]:
    """(name, requirement text) of ``dist``'s unconditional ``Requires-Dist`` (entries behind an
    ``extra ==`` marker are left out); [] when ``dist`` is not installed."""
    try:
        reqs = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return []
    out = []
    for r in reqs:
        if "extra" in r.partition(";")[2]:
            continue
        m = _REQ_NAME.match(r)
        if m:
            out.append((m.group(1), r.split(";")[0].strip()))
    return out


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def missing_dependency(error: str, dists: list[str] | tuple) -> dict | None:
    """The distribution behind an import error: ``error`` holds ``No module named 'X'`` and one of the
    installed ``dists`` (e.g. flashinfer-python) requires a distribution, not installed, whose name
    matches module X (``tvm_ffi`` -> ``apache-tvm-ffi``). Returns ``{"dist", "module", "required_by",
    "requirement"}`` or None (the module is not a declared dependency: not this case)."""
    m = _NO_MODULE.search(error or "")
    if not m:
        return None
    module = m.group(1).split(".")[0]
    nm = _norm(module)
    best = None
    for owner in dists:
        for name, text in requirements(owner):
            nn = _norm(name)
            # how well the distribution's name fits the module: exact, "apache-tvm-ffi" for tvm_ffi,
            # "cuda-python" for cuda, then any name containing it
            score = 0 if nn == nm else 1 if nn.endswith("_" + nm) else 2 if nn.startswith(nm + "_") else \
                3 if nm in nn else None
            if score is not None and (best is None or score < best[0]) and not _installed(name):
                best = (score, {"dist": name, "module": module, "required_by": owner, "requirement": text})
    return best[1] if best else None


def _texts(v) -> list[str]:
    out = [v.cause] + list(v.warnings)
    for e in v.evidence:
        out.append(str(e.value))
    return out


def apply_missing_dependency(verdicts: list, dists: list[str] | tuple) -> list:
    """Post-pass (case C29): a verdict whose evidence shows ``No module named 'X'`` where X is a declared,
    missing dependency of an installed backend distribution (``dists``) becomes ``blocked``, gate
    ``not-installed``, cause ``not installed: <dist>``; the backend's own answer is kept as evidence.
    Returns ``verdicts``."""
    for v in verdicts:
        if v.gate == GATE_NOT_INSTALLED:
            continue
        found = None
        for text in _texts(v):
            found = missing_dependency(text, dists)
            if found:
                break
        if not found:
            continue
        v.add("verdict before the dependency check", f"{v.status} ({v.gate or '-'}): {v.cause}", "backend probe")
        v.add("missing dependency", found, f"{found['required_by']} Requires-Dist (distribution metadata)")
        v.status, v.gate, v.lift = BLOCKED, GATE_NOT_INSTALLED, LIFT_PACKAGE
        v.cause = (f"not installed: {found['dist']} ({found['required_by']} requires {found['requirement']}; "
                   f"importing it fails with No module named '{found['module']}')")
        v.lift_detail = f"pip install '{found['requirement']}'"
    return verdicts
