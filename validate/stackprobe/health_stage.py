"""The environment health stage put together (:func:`run`) and its blocks applied to each probe's answers
(:func:`apply`); the checks themselves are in :mod:`stackprobe.health` (checks 1-3) and here (4: the libnccl
that loads, 5: the JIT toolchain). Shapes are described in :mod:`stackprobe.health`.
"""
from __future__ import annotations

import os
import re
import time

from . import health as h
from . import health_elf as elf
from . import health_enginecache, health_floors, health_jitcache, health_triton, known_bad
from .archs import parse_arch
from .env import effective_nvcc
from .probes.needs import NEEDS
from .verdict import (BLOCKED, GATE_BROKEN_INSTALL, GATE_DRIVER, GATE_NOT_INSTALLED, GATE_TOOLCHAIN, LIFT_CUDA, LIFT_DRIVER,
                      LIFT_PACKAGE)

_BLOCKING_IMPORTS = ("undefined-symbol", "error", "crash", "timeout")


def loaded_nccl(maps: dict, target, topology: str, dists: dict | None = None) -> dict:
    """The libnccl the import child mapped after ``import torch`` and the known-bad entries that apply to its
    version: {"library", "version", "version_string", "wheel": {"dist", "version", "record", "file"} (the
    distribution whose RECORD lists that file and what its metadata says: a replaced file "differs", case C55;
    None when no installed distribution owns it), "known_bad": [{"id", "symptom", "source", "fixed_in"}]}
    ({} when torch maps none: a CPU build, or NCCL linked in statically)."""
    libs = (maps or {}).get("nccl") or []
    if not libs:
        return {}
    lib = libs[0]
    ver = lib.get("version") or (lib.get("version_string") or "").split("+")[0] or None
    hits = known_bad.matches("nccl", ver, target, topology) if ver else []
    owner = h.file_owner("libnccl.so.2", dists, prefer=(lib.get("path"),)) if dists else None
    if owner and owner["path"] != os.path.realpath(lib.get("path") or ""):
        owner = None
    return {"library": lib.get("path"), "version": ver, "version_string": lib.get("version_string"),
            "others_mapped": [x.get("path") for x in libs[1:]],
            "wheel": {k: owner[k] for k in ("dist", "version", "record", "file", "required_by")} if owner else None,
            "known_bad": [{"id": e.id, "symptom": e.symptom, "source": e.source, "fixed_in": e.fixed_in,
                           "backends": list(e.backends)} for e in hits]}


_C_LIBRARIES = {lib for _, lib in elf.C_PREFIX_LIBRARY}


def symbol_owners(imports: dict, dists: dict, maps: dict) -> None:
    """For an import that failed on an undefined C symbol of another library (``ncclCommResume`` -> libnccl.so.2),
    the file that library resolves to here (the one the child mapped first) and the distribution that owns it
    (:func:`stackprobe.health.file_owner`), kept in the import result as ``owner`` (``mapped``: the mapped path
    when no distribution owns it: LD_PRELOAD or LD_LIBRARY_PATH put it there)."""
    mapped = [x.get("path") for x in (maps or {}).get("nccl") or []]
    for r in imports.values():
        if r.get("kind") != "undefined-symbol" or r.get("expected_in") not in _C_LIBRARIES:
            continue
        prefer = tuple(mapped) if r["expected_in"].startswith("libnccl") else ()
        owner = h.file_owner(r["expected_in"], dists, prefer=prefer)
        if owner is None:
            continue
        if prefer and owner["path"] != os.path.realpath(prefer[0]):
            owner["mapped"] = prefer[0]
        nccl = next((x for x in (maps or {}).get("nccl") or [] if os.path.realpath(x.get("path") or "") ==
                     (owner.get("mapped") and os.path.realpath(owner["mapped"]) or owner["path"])), None)
        owner["loaded"] = (f"NCCL {nccl.get('version_string') or nccl.get('version')}" if nccl else "")
        r["owner"] = owner


def toolchain(environment: dict) -> dict:
    """The nvcc a JIT build would use against torch's CUDA: {"nvcc", "nvcc_cuda", "torch_cuda", "mismatch"}."""
    nvcc = effective_nvcc(environment) or {}
    cuda, where = h.stack_cuda(environment)
    rel = nvcc.get("release")
    mismatch = bool(rel and cuda and rel.split(".")[0] != cuda.split(".")[0])
    return {"nvcc": nvcc.get("path"), "nvcc_cuda": rel, "torch_cuda": cuda, "torch_cuda_source": where,
            "mismatch": mismatch}


def _block(scope, gate, cause, lift, detail, evidence, source, dists=()) -> dict:
    """One block; ``dists``: the installed distributions whose broken import it reports (a probe's "not installed:
    <dist>" for one of them is overruled: installed and broken is not "not installed", case C55)."""
    return {"scope": scope, "gate": gate, "cause": cause, "lift": lift, "lift_detail": detail, "evidence": evidence,
            "source": source, "dists": list(dists)}


def _owner_lift(r: dict) -> str:
    o = r.get("owner")
    if not o:
        return ""
    if o.get("mapped"):
        return (f"take {o['mapped']} ({o.get('loaded') or 'another build'}) off the load path (LD_PRELOAD / "
                f"LD_LIBRARY_PATH: no installed distribution owns it), so that {o['file']} of {o['dist']} {o['version']} "
                f"loads; it lacks {r.get('demangled')}")
    return h.restore_lift(o, o.get("loaded", "")) + f"; the file that loads lacks {r.get('demangled')}"


def _import_lift(r: dict, provides, breaks=()) -> str:
    if _owner_lift(r):
        return _owner_lift(r)
    for pattern, text in h._KNOWN_LIFTS:
        m = pattern.search(r.get("error", ""))
        if m:
            return text.format(m.group(0), *m.groups())
    pin = next((x for x in (_pin_lift(list(breaks), d) for d in provides) if x), "")
    if pin:
        return pin
    if r["kind"] == "undefined-symbol":
        return (f"install a {'/'.join(provides)} build made for the installed torch (or the torch it was built "
                f"against): {r.get('expected_in') or 'its library'} does not define {r.get('demangled')}")
    return f"reinstall {'/'.join(provides)} so that `import {r['module']}` succeeds (the error above)"


def _pin_lift(breaks: list, dist: str) -> str:
    """``pip install 'dist==X'`` where an installed distribution pins ``dist`` exactly (the engine's pin first)."""
    b = next((b for b in breaks if b["exact_pin"] and b["kind"] == "conflict" and h._norm(b["name"]) == h._norm(dist)), None)
    return (f"pip install '{b['requirement']}' ({b['dist']} {b['version']}'s pin; a build made for the installed torch)"
            if b else "")


def _breaks_for(breaks: list, dists) -> list[str]:
    names = {h._norm(d) for d in dists}
    return [h.describe_break(b) for b in breaks if b["kind"] == "conflict"
            and (h._norm(b["name"]) in names or h._norm(b["dist"]) in names)]


def decide(backends, imports: dict, breaks: list, shared: list, static_syms: dict, tool: dict, dists: dict) -> dict:
    """{backend: [block]} from the checks' results (see :mod:`stackprobe.health` for what blocks)."""
    blocks: dict = {}
    for b in backends:
        need, out = NEEDS[b], []
        for mod, provides in need.modules:
            r = imports.get(mod)
            if not r:
                continue
            pins = _breaks_for(breaks, provides)
            if r["kind"] in _BLOCKING_IMPORTS:
                what = (f"undefined symbol {r['demangled']} ({r['symbol']}; expected in {r.get('expected_in') or '?'})"
                        if r["kind"] == "undefined-symbol" else f"{r.get('error_class') or r['kind']}: {h.gist(r, 400)}")
                out.append(_block("", GATE_BROKEN_INSTALL,
                                  f"broken install: `import {mod}` fails here ({what})"
                                  + (f"; and {'; '.join(pins)}" if pins else ""),
                                  LIFT_PACKAGE, _import_lift(r, provides, breaks), {"import": r, "requirement_breaks": pins},
                                  f"import {mod} in a child interpreter ({r.get('where') or 'at import'})",
                                  dists=[d for d in provides if h._norm(d) in dists]))
            elif r["kind"] in ("needs-device", "missing-library"):
                for dist in provides:
                    found = static_syms.get(h._norm(dist))
                    if found and found["missing"]:
                        s = found["missing"][0]
                        out.append(_block("", GATE_BROKEN_INSTALL,
                                          f"broken install: {found['file']} of {dist} {found['version']} needs "
                                          f"{s['demangled']}, which none of torch's libraries it links exports "
                                          f"(expected in {s['expected_in'] or '?'}; {len(found['missing'])} symbol(s) "
                                          f"missing); `import {mod}` stopped earlier here ({h.gist(r)}), "
                                          "so this was decided statically from the ELF symbol tables"
                                          + (f"; and {'; '.join(pins)}" if pins else ""),
                                          LIFT_PACKAGE, _pin_lift(breaks, dist) or f"install a {dist} build made for the installed torch",
                                          {"static_symbols": found, "import": r, "requirement_breaks": pins},
                                          "health_elf.missing_symbols (.dynsym vs torch/lib exports)"))
                        break
        for s in shared:
            if s.get("mismatch") and s["dist"] in need.dists and s["dist"] != "flashinfer-jit-cache":
                out.append(_block("", GATE_BROKEN_INSTALL,
                                  f"broken install: {s['dist']} {s['version']} {s['file']} needs {', '.join(s['mismatch'])} "
                                  f"but the stack is CUDA {tool.get('torch_cuda')}: the file cannot load with this torch",
                                  LIFT_PACKAGE, f"a {s['dist']} build for CUDA {tool.get('torch_cuda')}", s, "DT_NEEDED"))
                break
        if need.jit and tool.get("mismatch"):
            out.append(_block("", GATE_TOOLCHAIN,
                              f"FlashInfer would JIT-build this module with nvcc {tool['nvcc']} (CUDA {tool['nvcc_cuda']}) "
                              f"against torch built with CUDA {tool['torch_cuda']}: the module links "
                              f"libcudart.so.{tool['nvcc_cuda'].split('.')[0]}, another major than torch's (case C46)",
                              LIFT_CUDA, f"an nvcc of CUDA {tool['torch_cuda'].split('.')[0]}.x first (CUDA_HOME, then "
                              f"PATH), or a torch built for CUDA {tool['nvcc_cuda'].split('.')[0]}", tool,
                              "stackprobe.env.effective_nvcc vs torch.version.cuda"))
        for mod in need.engine_modules:
            r = imports.get(mod)
            if r and r["kind"] in _BLOCKING_IMPORTS:
                out.append(_block("engine", GATE_BROKEN_INSTALL,
                                  f"broken install: the engine's `import {mod}` fails here "
                                  f"({r.get('error_class') or r['kind']}: {h.gist(r, 300)})",
                                  LIFT_PACKAGE, _import_lift(r, ("sglang",)), {"import": r},
                                  f"import {mod} in a child interpreter ({r.get('where') or 'at import'})"))
        if out:
            blocks[b] = out
    return blocks


def static_symbols(dists: dict, imports: dict, backends) -> dict:
    """Where a needed module's import stopped before symbol resolution, its distribution's extensions that link
    torch checked statically: {normalised dist: {"dist", "version", "file", "missing", ...}} (the first file with
    missing symbols, else the last checked)."""
    out = {}
    torch_dirs = h.torch_lib_dirs()
    for b in backends:
        for mod, provides in NEEDS[b].modules:
            r = imports.get(mod)
            if not r or r["kind"] not in ("needs-device", "missing-library") or mod.startswith("torch"):
                continue
            for dist in provides:
                if h._norm(dist) not in dists or h._norm(dist) in out:
                    continue
                ver, files = h.dist_shared_objects(dist) or (None, [])
                # the file the import tried first (named in its error), then the others
                files = sorted(files, key=lambda f: f[1] not in (r.get("error") or ""))
                checked = []
                for rel, path in files:
                    try:
                        if not any(s.startswith(("libc10", "libtorch")) for s in elf.needed(path)):
                            continue
                        res = elf.missing_symbols(path, torch_dirs)
                    except Exception as e:  # noqa: BLE001 - unreadable: say so
                        res = {"error": f"{type(e).__name__}: {e}", "missing": []}
                    checked.append(dict(res, file=rel))
                bad = [c for c in checked if c["missing"]]
                first = (bad or checked or [{"missing": []}])[0]
                out[h._norm(dist)] = dict(first, dist=dist, version=ver,
                                          files_missing=[{"file": c["file"], "missing": len(c["missing"])} for c in bad],
                                          files_checked=len(checked))
    return out


def run(environment: dict, target, topology: str, backends=None, timeout: float = 120.0) -> dict:
    """The health stage (checks 1-8 of :mod:`stackprobe.health`) for ``backends`` (default: every backend of
    :data:`NEEDS`). Also writes the NCCL that loads into ``environment["nccl"]["loaded"]`` (the header's NCCL)."""
    t0 = time.time()
    backends = [b for b in NEEDS if not backends or b in backends]
    dists = h.installed()
    try:
        breaks, unread = h.requirement_breaks(dists), None
    except h.RequirementsUnreadable as e:
        breaks, unread = [], str(e)
    imports, maps = h.run_imports(dists, backends, min(timeout, 300.0))
    symbol_owners(imports, dists, maps)
    cuda, cuda_where = h.stack_cuda(environment)
    major = int(cuda.split(".")[0]) if cuda else None
    shared = h.scan_shared_objects(dists, major)
    syms = static_symbols(dists, imports, backends)
    nccl = loaded_nccl(maps, target, topology, dists)
    if nccl.get("version") and isinstance(environment, dict):   # the header and rows name what loads (C55)
        environment.setdefault("nccl", {}).update(loaded=nccl["version"], loaded_path=nccl.get("library"))
    tool = toolchain(environment)
    tri = health_triton.check(parse_arch(target) if isinstance(target, str) else target, dists)
    blocks = decide(backends, imports, breaks, shared, syms, tool, dists)
    findings = _findings(breaks, imports, shared, syms, nccl, tool)
    arch = parse_arch(target) if isinstance(target, str) else target
    jc = health_jitcache.scan_all(dists, major, arch)   # also where import sglang moves it
    jit_cache_blocks(jc, backends, cuda, blocks, findings)
    ec = health_enginecache.scan(dists, major, arch)   # the engines' own compile caches and Triton's (check 8)
    findings += health_enginecache.findings(ec, cuda)
    fl = health_floors.floors(backends, dists, shared, nccl)
    floor_blocks(fl, (environment or {}).get("driver") or {}, blocks, findings)
    tri_finding = health_triton.finding(tri)
    if tri_finding:
        findings.append(tri_finding)
    gaps = not_assessed(unread, shared, syms, nccl, cuda, imports)
    gaps += [dict(g, check="engine_cache") for g in ec["not_assessed"] + health_enginecache.unread(ec)]
    if jc.get("not_assessed"):
        gaps.append({"check": "jit_cache", "what": f"FlashInfer {jc['version']}'s JIT cache", "why": jc["not_assessed"]})
    if tri.get("not_assessed"):
        gaps.append({"check": "triton", "what": f"whether Triton {tri['version']} compiles for {tri['target']}",
                     "why": tri["not_assessed"]})
    for g in gaps:
        findings.insert(0, {"check": g["check"], "level": "warning", "message": f"not assessed: {g['what']} ({g['why']})"})
    return {"seconds": round(time.time() - t0, 1), "stack_cuda": cuda, "stack_cuda_source": cuda_where,
            "requirements": breaks, "requirements_not_assessed": unread, "imports": list(imports.values()), "shared_objects": shared,
            "static_symbols": syms, "nccl": nccl, "toolchain": tool, "triton": tri, "driver_floors": fl, "jit_cache": jc, "engine_cache": ec, "findings": findings, "blocks": blocks,
            "not_assessed": gaps}


def jit_cache_blocks(jc: dict, backends, stack_cuda, blocks: dict, findings: list) -> None:
    """Error findings for FlashInfer JIT cache modules of another CUDA major than the stack's, and a broken-install
    block on the backend whose module it is (:mod:`stackprobe.health_jitcache`, case C58)."""
    bad = [m for m in (jc or {}).get("modules", []) if m.get("mismatch")]
    if not bad:
        return
    mods = health_jitcache.backend_modules()
    for m in bad:
        msg = health_jitcache.describe(m, stack_cuda)
        findings.append({"check": "jit_cache", "level": "error", "message": msg})
        for b in backends:
            if mods.get(b) == m["module"]:
                blocks.setdefault(b, []).insert(0, _block(
                    "", GATE_BROKEN_INSTALL, f"broken install: {msg}", LIFT_PACKAGE,
                    f"remove {os.path.dirname(m['path'])} (FlashInfer then compiles the module with the nvcc it finds, "
                    f"or loads one from flashinfer-jit-cache)", m, "FlashInfer JIT cache (jit/env.py layout), DT_NEEDED"))


def floor_blocks(fl: dict, driver: dict, blocks: dict, findings: list) -> None:
    """Blocks (gate ``driver``) and error findings for the CUDA users on each path whose driver floor this host's
    driver is below (:mod:`stackprobe.health_floors`, case C56); nothing without a driver (static only)."""
    said = set()
    for b, rows in fl.items():
        for row in rows:
            if not health_floors.below(driver, row):
                continue
            cause = (f"{row['user']} on this path needs a driver >= {row['needs']} (CUDA {row['cuda_major']}.x; "
                     f"{row['source']}): {row['evidence']}; this host's driver is {driver.get('version')}"
                     + (f" (CUDA {driver['cuda']})" if driver.get("cuda") else ""))
            blocks.setdefault(b, []).append(_block("", GATE_DRIVER, cause, LIFT_DRIVER,
                                                   f"driver >= {row['needs'].split('.')[0]}", row,
                                                   "stackprobe.health_floors (import walk, DT_NEEDED, NCCL version)"))
            if row["user"] not in said:
                said.add(row["user"])
                findings.append({"check": "driver_floors", "level": "error", "message": cause})
            break


def not_assessed(unread, shared: list, syms: dict, nccl: dict, cuda: str | None, imports: dict) -> list[dict]:
    """The checks (or parts of them) that could not run here, each ``{"check", "what", "why"}``: shown as
    "not assessed: what (why)" in the health section and the report's headline, never as "no errors" (C60).

    * ``requirements``: no requirement parser (neither ``packaging`` nor pip's vendored copy imports);
    * ``shared_objects``: files the ELF reader could not read; CUDA libraries linked by extensions while the
      stack's CUDA version is unknown (no torch, or a CPU build: nothing to compare their major with); torch
      symbols not judged (:func:`stackprobe.health_elf.missing_symbols`'s ``undecided``);
    * ``nccl``: a CUDA torch whose import mapped no libnccl (NCCL linked in statically, or the import failed
      before it): the loaded NCCL's version is not known."""
    out = []
    if unread:
        out.append({"check": "requirements", "what": "declared requirements", "why": unread.split(": ", 1)[-1]})
    bad = [s for s in shared if s.get("error")]
    if bad:
        out.append({"check": "shared_objects", "what": "shared-object dependencies of " + ", ".join(
            sorted({f"{s['dist']} {s['file']}" for s in bad})[:4]) + (" ..." if len(bad) > 4 else ""),
                    "why": bad[0]["error"]})
    linked = [s for s in shared if s.get("cuda")]
    if linked and not cuda:
        out.append({"check": "shared_objects", "what": "CUDA major of " + ", ".join(
            sorted({s["dist"] for s in linked})) + "'s extensions",
                    "why": "the stack's CUDA version is unknown (no torch here, or a CPU build): nothing to compare "
                           "the CUDA libraries they link with"})
    for d in syms.values():
        if d.get("undecided") or d.get("error"):
            out.append({"check": "shared_objects", "what": f"torch symbols {d['dist']} {d.get('file', '')} needs",
                        "why": d.get("undecided") or d.get("error")})
    torch_imp = imports.get("torch")
    if cuda and not nccl:
        out.append({"check": "nccl", "what": "the libnccl torch loads",
                    "why": ("`import torch` mapped no libnccl (NCCL linked in statically?)" if not torch_imp or
                            torch_imp.get("kind") == "ok" else f"`import torch` failed before mapping one ({h.gist(torch_imp)})")})
    return out


def _findings(breaks, imports, shared, syms, nccl, tool) -> list[dict]:
    f = []
    for b in breaks:
        f.append({"check": "requirements", "level": "error" if b["kind"] == "conflict" else "warning",
                  "message": h.describe_break(b)})
    for r in imports.values():
        if r["kind"] == "ok":
            continue
        level = "error" if r["kind"] in _BLOCKING_IMPORTS else "info" if r["kind"] == "needs-device" else "warning"
        extra = (f": undefined symbol {r['demangled']} (expected in {r.get('expected_in') or '?'})"
                 if r["kind"] == "undefined-symbol" else "")
        what = {"needs-device": "needs the driver or a GPU at import (not decided here)",
                "missing-module": f"needs {r.get('missing')}, not installed", "missing-library":
                f"needs {r.get('missing')}, not found"}.get(r["kind"], r["kind"])
        f.append({"check": "imports", "level": level, "message":
                  f"import {r['module']}: {what}{extra} ({r.get('error_class') or ''}: {h.gist(r)})"})
    for s in shared:
        if s.get("mismatch"):
            f.append({"check": "shared_objects", "level": "error", "message":
                      f"{s['dist']} {s['version']} {s['file']} needs {', '.join(s['mismatch'])}: another CUDA major than "
                      "the stack's (torch's); it cannot load here"})
    for d in syms.values():
        for s in d.get("missing", [])[:3]:
            f.append({"check": "shared_objects", "level": "error", "message":
                      f"{d['dist']} {d['version']} {d['file']}: undefined symbol {s['demangled']} is exported by none of "
                      f"torch's libraries it links (expected in {s['expected_in'] or '?'}; decided statically)"})
    w = nccl.get("wheel") or {}
    if w and nccl.get("version") and w.get("version") and nccl["version"] != w["version"].split("+")[0]:
        f.append({"check": "nccl", "level": "error", "message":
                  f"the libnccl torch loads ({nccl['library']}) is NCCL {nccl.get('version_string') or nccl['version']}, "
                  f"but the wheel it belongs to says {w['dist']} {w['version']} (the file "
                  f"{'differs from' if w.get('record') == 'differs' else 'is listed in'} the wheel's RECORD): "
                  f"what loads is not what was installed"})
    for e in nccl.get("known_bad", []):
        f.append({"check": "nccl", "level": "error", "message":
                  f"the libnccl torch loads ({nccl['library']}, {nccl.get('version_string') or nccl['version']}) is a "
                  f"known-bad release ({e['id']}): {e['symptom']}; fixed in {e['fixed_in']} [{e['source']}]"})
    if tool.get("mismatch"):
        f.append({"check": "toolchain", "level": "error", "message":
                  f"nvcc {tool['nvcc']} is CUDA {tool['nvcc_cuda']} but torch is built with CUDA {tool['torch_cuda']}: "
                  "every JIT-built module would link another CUDA major than torch's (C46)"})
    return f


def errors(health: dict | None) -> list[dict]:
    """The findings of level "error" (what ``--strict`` fails on)."""
    return [f for f in (health or {}).get("findings", []) if f.get("level") == "error"]


def apply(verdicts: list, health: dict | None) -> list:
    """Put the stage's blocks on ``verdicts`` (one probe's answers): the first block of the verdict's backend whose
    scope fits makes it ``blocked``; the answer the probe gave stays as evidence, as do later blocks. A verdict
    whose package is not installed keeps that answer, unless this stage found that package installed and its
    import broken (the probe's own import failed and read it as absent: then it is a broken install, C55). A JIT-toolchain block spares a verdict whose evidence
    says no JIT is needed (an ahead-of-time module). Returns ``verdicts``."""
    for v in verdicts:
        todo = [b for b in (health or {}).get("blocks", {}).get(v.backend, []) if not b["scope"] or b["scope"] == v.scope]
        if v.gate == GATE_NOT_INSTALLED:   # stays, unless the package it names is installed and its import broken
            named = re.match(r"not installed: ([\w.-]+)", v.cause or "")
            todo = [b for b in todo if named and b["gate"] == GATE_BROKEN_INSTALL
                    and h._norm(named.group(1)) in {h._norm(d) for d in b.get("dists") or ()}]
        if any(e.what == "JIT needed" and str(e.value).startswith("no") for e in v.evidence):
            todo = [b for b in todo if b["gate"] != GATE_TOOLCHAIN]
        for i, b in enumerate(todo):
            if i == 0:
                v.add("answer before the environment health check", f"{v.status} ({v.gate or '-'}): {v.cause}",
                      f"{v.scope or 'static'} gate")
                v.status, v.gate, v.cause, v.lift, v.lift_detail = BLOCKED, b["gate"], b["cause"], b["lift"], b["lift_detail"]
            v.add(f"environment health: {b['gate']}", b["evidence"], b["source"])
    return verdicts
