"""Environment health, the first stage of the static tier: what can load here, decided once before any
backend's gate is read (:func:`run`), and the blocks it puts on the backends that need something broken
(:func:`apply`, called by :func:`stackprobe.static.run_static` on each probe's answers as they are made).

The checks (each one's findings carry ``check``, ``level`` "error" | "warning" | "info", ``message``):

1. ``requirements``: every installed distribution's ``Requires-Dist`` (markers evaluated for this interpreter)
   against what is installed, as ``pip check`` reports it (:func:`requirement_breaks`; ``packaging``); the
   engine's exact pins first, each break named with the distribution that declares it. A break is an error
   and evidence on the backends whose distributions it involves; it blocks nothing alone: whether the pair
   loads together is what checks 2 and 3 decide.
2. ``imports``: each module a backend needs (:data:`stackprobe.probes.needs.NEEDS`) imported for real in a child
   interpreter (:mod:`stackprobe.health_child`) with a timeout, the exception's class and message recorded
   (:func:`classify`): an undefined symbol gets its demangled name and the library that should define it; a
   module that needs the driver or a GPU at import (no GPU here) is "needs-device", neither a pass nor a fail;
   a module that is absent is the probes' "not installed" (case C29), not a broken install.
3. ``shared_objects``: every extension of a backend distribution and every flashinfer-jit-cache module: its
   ``DT_NEEDED`` CUDA libraries against the stack's CUDA major (torch's, :func:`stack_cuda`): another major is
   a finding against that file (a CUDA 12 module on a CUDA 13 stack, case C42); where the import could not reach
   symbol resolution (it stopped at the driver's ``libcuda.so.1`` on a host without one), the extension's
   undefined c10/ATen/torch symbols are checked against what torch's libraries export
   (:func:`stackprobe.health_elf.missing_symbols`, case C41), and the evidence says it was decided statically.
4. ``nccl``: the libnccl that ``import torch`` maps in the child (``/proc/self/maps``) and its version
   (``ncclGetVersion`` and the library's own version string), not the wheel's metadata, beside the wheel that owns
   the file (its metadata version and whether the file still matches its RECORD, case C55); the known-bad data
   (:mod:`stackprobe.known_bad`) applied to that version (case C43; the NCCL probe blocks on the same entries).
5. ``toolchain``: the nvcc a JIT build would use (:func:`stackprobe.env.effective_nvcc`) against torch's CUDA
   major: a different major blocks every JIT-built path (``Need.jit``), toolchain, since the module it builds
   links the other major's ``libcudart`` (case C46).

6. ``triton``: the ptxas Triton would call, asked to compile for the target (:mod:`stackprobe.health_triton`,
   case C57), and the engine files that define Triton kernels.
7. ``driver_floors``: the driver floor of every CUDA user on a path: cuda-bindings imported by its modules,
   its extensions' CUDA major, the loaded NCCL's (:mod:`stackprobe.health_floors`, case C56).
8. ``jit_cache``: FlashInfer's JIT cache modules, checked like installed ones (:mod:`stackprobe.health_jitcache`,
   case C58); ``engine_cache``: the engines' own compile caches (SGLang's JIT and tvm-ffi caches, vLLM's
   torch_compile_cache) and Triton's kernel cache, each where the engine would load from
   (:mod:`stackprobe.health_enginecache`).

A check (or part of one) that cannot run here is listed in ``not_assessed`` ({"check", "what", "why"}) and
shown as "not assessed: what (why)" in the health section and the report's headline, never as "no errors"
(case C60). Shared objects are read with the suite's own ELF reader (:mod:`stackprobe.elfread`), so check 3
runs whatever the target environment lacks.

``run`` returns plain JSON data (kept in the report as ``environment.health``): ``{"seconds", "stack_cuda",
"requirements", "imports", "shared_objects", "nccl", "toolchain", "triton", "jit_cache", "engine_cache", "findings", "blocks", "not_assessed"}`` where ``blocks`` maps a
backend to ``[{"scope" ("" = both answers), "gate", "cause", "lift", "lift_detail", "evidence", "source"}]``.
"""
from __future__ import annotations

import json
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata, util
from pathlib import Path

from . import health_elf as elf
from .driver import stack_cuda
from .probes.needs import NEEDS

ENGINE_DIST = "sglang"
#: distributions whose extensions are checked (check 3); torch and NVIDIA's own wheels are the stack itself
EXTENSION_DISTS = ("sglang-kernel", "sgl-kernel", "flashinfer-python", "flashinfer-jit-cache", "mscclpp", "b12x",
                   "flash-attn", "deep-ep")
_UNDEFINED = re.compile(r"undefined symbol: (\S+)")
_NO_FILE = re.compile(r"(lib[\w.+-]+\.so[\w.]*): cannot open shared object file")
_NO_MODULE = re.compile(r"No module named '([\w.]+)'")
#: messages of a module that touches the driver or a GPU while it is imported (torch, FlashInfer, cuda-python)
_DEVICE = re.compile(r"libcuda\.so|NVIDIA driver|no CUDA GPUs|CUDA driver|cuInit|CUDA_ERROR_NO_DEVICE|"
                     r"cudaErrorNoDevice|invalid device ordinal|Torch not compiled with CUDA|No CUDA GPUs|"
                     r"found no NVIDIA|CUDA initialization|no CUDA-capable device|"
                     # FlashInfer's comm/cuda_ipc.py CudaRTLibrary(): it finds the libcudart a CUDA torch mapped;
                     # a CPU torch maps none (the stack, not this package, decides)
                     r"libcudart is not loaded", re.I)
#: import errors whose own text says what to change (FlashInfer's jit/env.py version check, case C44)
_KNOWN_LIFTS = ((re.compile(r"flashinfer-cubin version \((\S+)\) does not match flashinfer version \((\S+)\)"),
                 "align flashinfer-cubin with flashinfer-python, or remove it: pip install 'flashinfer-cubin=={2}' "
                 "(installed: flashinfer-cubin {1}, flashinfer-python {2})"),
                (re.compile(r"flashinfer-jit-cache version \((\S+)\) does not match flashinfer version \((\S+)\)"),
                 "align flashinfer-jit-cache with flashinfer-python, or remove it (installed: flashinfer-jit-cache {1}, "
                 "flashinfer-python {2})"))


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ------------------------------------------------------------------------------------------ 1. requirements
def installed() -> dict[str, metadata.Distribution]:
    """{normalised name: distribution} of every installed distribution, the first on ``sys.path`` winning (the
    one ``import`` and ``importlib.metadata.version`` see)."""
    out: dict = {}
    for d in metadata.distributions():
        name = d.metadata.get("Name") if d.metadata else None
        if name and _norm(name) not in out:
            out[_norm(name)] = d
    return out


class RequirementsUnreadable(RuntimeError):
    """No requirement parser in this interpreter: the declared-requirements check is not assessed."""


def _requirement_parser():
    """(InvalidRequirement, Requirement) from ``packaging``, else from the copy pip vendors
    (``pip._vendor.packaging``, the parser ``pip check`` itself uses); :class:`RequirementsUnreadable` when
    neither imports."""
    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:
        try:
            from pip._vendor.packaging.requirements import InvalidRequirement, Requirement  # type: ignore
        except ImportError as e:
            raise RequirementsUnreadable(
                "declared requirements not assessed: neither packaging nor pip imports in this interpreter "
                f"({type(e).__name__}: {e}); install either to have them checked") from None
    return InvalidRequirement, Requirement


def requirement_breaks(dists: dict | None = None) -> list[dict]:
    """What ``pip check`` reports, from the installed metadata: [{"dist", "version", "requirement", "name",
    "installed" (None: not installed), "kind" ("conflict" | "missing"), "exact_pin"}], the engine's exact
    pins first, then other conflicts, then missing distributions. Requirements behind an ``extra`` marker
    are left out (an extra is asked for by name; pip check does the same).

    Raises :class:`RequirementsUnreadable` where neither ``packaging`` nor pip's vendored copy of it imports in
    this interpreter (the suite runs in the target environment, which need not have either)."""
    InvalidRequirement, Requirement = _requirement_parser()

    dists = installed() if dists is None else dists
    out = []
    for key, d in sorted(dists.items()):
        for text in d.requires or []:
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            if req.marker is not None:
                try:
                    if not req.marker.evaluate({"extra": ""}):
                        continue
                except Exception:  # noqa: BLE001 - an unparseable marker is not this check's finding
                    continue
            have = dists.get(_norm(req.name))
            ver = have.version if have is not None else None
            if ver is not None and (not req.specifier or req.specifier.contains(ver, prereleases=True)):
                continue
            out.append({"dist": d.metadata["Name"], "version": d.version, "requirement": str(req).split(";")[0].strip(),
                        "name": req.name, "installed": ver, "kind": "conflict" if ver is not None else "missing",
                        "exact_pin": any(s.operator in ("==", "===") for s in req.specifier)})
    def rank(b):
        return (0 if b["exact_pin"] and _norm(b["dist"]) == ENGINE_DIST and b["kind"] == "conflict"
                          else 1 if b["kind"] == "conflict" else 2)
    return sorted(out, key=lambda b: (rank(b), b["dist"], b["name"]))


def describe_break(b: dict) -> str:
    got = f"installed {b['name']} {b['installed']}" if b["installed"] else f"{b['name']} is not installed"
    return f"{b['dist']} {b['version']} requires {b['requirement']}, {got}"


_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*\(?([^;()]*)\)?\s*(?:;(.*))?$")


def declared_requirement(name: str, dists: dict) -> dict | None:
    """The first installed distribution whose ``Requires-Dist`` names ``name`` (extras left out), read with a
    plain parser (no ``packaging`` needed): {"dist", "version", "requirement", "pin" (the ``==`` version or
    None)}; None when nothing requires it."""
    for key, d in sorted(dists.items()):
        for text in d.requires or []:
            m = _REQ.match(text)
            if not m or _norm(m.group(1)) != _norm(name) or "extra" in (m.group(3) or ""):
                continue
            spec = m.group(2).strip()
            pin = re.fullmatch(r"===?\s*([\w.+!-]+)", spec)
            return {"dist": d.metadata["Name"], "version": d.version, "requirement": f"{m.group(1)}{spec}",
                    "pin": pin.group(1) if pin else None}
    return None


def file_owner(soname: str, dists: dict, prefer: tuple = ()) -> dict | None:
    """The installed file a library name resolves to and the distribution whose RECORD lists it: a path in
    ``prefer`` (what the process mapped) first, else the first distribution shipping a file of that name.
    Returns {"soname", "path", "file" (relative to site-packages), "dist", "version" (its metadata),
    "record" ("matches" | "differs" | "unhashed"): the file's sha256 against the RECORD's (a file replaced after
    the install differs), "required_by" (:func:`declared_requirement`)}; None when no distribution has it."""
    import base64
    import hashlib

    want = {os.path.realpath(p) for p in prefer if p}
    cands = []
    for key, d in dists.items():
        for f in d.files or []:
            if f.name == soname or (soname.endswith(".so") and f.name.startswith(soname + ".")):
                loc = os.path.realpath(str(f.locate()))
                if os.path.isfile(loc):
                    cands.append((loc not in want, key, d, f, loc))
    if not cands:
        return None
    _, key, d, f, loc = sorted(cands, key=lambda c: c[:2])[0]
    record = "unhashed"
    if f.hash is not None and f.hash.mode == "sha256":
        h = hashlib.sha256()
        with open(loc, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
        record = "matches" if base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode() == f.hash.value else "differs"
    return {"soname": soname, "path": loc, "file": str(f), "dist": d.metadata["Name"], "version": d.version,
            "record": record, "required_by": declared_requirement(d.metadata["Name"], dists)}


def restore_lift(owner: dict, loaded: str = "") -> str:
    """``pip install --force-reinstall 'dist==X'`` for a library file that is not what its wheel installed: X from
    the requirement that pins it (torch's ``nvidia-nccl-cu13==2.30.7``), else the wheel's own metadata version."""
    req = owner.get("required_by") or {}
    ver = req.get("pin") or owner["version"]
    why = (f"{req['dist']} {req['version']}'s requirement {req['requirement']}" if req
           else "the version its metadata names")
    state = {"differs": "differs from the wheel's RECORD (replaced after install)", "matches": "matches its RECORD",
             "unhashed": "has no hash in the RECORD"}[owner["record"]]
    return (f"pip install --force-reinstall '{owner['dist']}=={ver}' ({why}): {owner['file']}"
            + (f" is {loaded}, " if loaded else " ") + f"{state}")


# ------------------------------------------------------------------------------------------------ 2. imports
def classify(result: dict) -> dict:
    """Add ``kind`` to one import result: "ok"; "undefined-symbol" (with ``symbol``, ``demangled``,
    ``expected_in``); "needs-device" (the driver or a GPU asked for at import); "missing-module" /
    "missing-library" (with ``missing``); "crash" / "timeout"; "error" (any other exception)."""
    r = dict(result)
    if r.get("ok"):
        r["kind"] = "ok"
        return r
    msg = r.get("error", "")
    if r.get("kind") in ("crash", "timeout"):
        return r
    m = _UNDEFINED.search(msg)
    if m:
        sym = m.group(1)
        dem = elf.demangle([sym]).get(sym, sym)
        r.update(kind="undefined-symbol", symbol=sym, demangled=dem, expected_in=elf.expected_library(dem))
    elif _DEVICE.search(msg):
        r["kind"] = "needs-device"
    elif _NO_FILE.search(msg):
        r.update(kind="missing-library", missing=_NO_FILE.search(msg).group(1))
    elif _NO_MODULE.search(msg) and r.get("error_class") in ("ModuleNotFoundError", "ImportError"):
        r.update(kind="missing-module", missing=_NO_MODULE.search(msg).group(1))
    elif r.get("error_class") == "ImportError" and any(_NO_MODULE.search(c) for c in r.get("chain") or []):
        # a package that re-raises a missing module with its own words (FlashInfer's "Could not import the 'cuda'
        # module", flashinfer/comm/mnnvl.py): the module it could not find is in the chain
        r.update(kind="missing-module", missing=next(_NO_MODULE.search(c).group(1) for c in r["chain"] if _NO_MODULE.search(c)))
    else:
        r["kind"] = "error"
    return r


def gist(r: dict, limit: int = 220) -> str:
    """One line of an import error: the line naming the driver, a missing file or an undefined symbol when the
    message has one (sgl_kernel's loader prints a page), else its first non-empty line."""
    text = r.get("error") or ""
    lines = [x.strip(" -") for x in text.splitlines() if x.strip()]
    for rx in (_UNDEFINED, _NO_FILE, _DEVICE):
        hit = next((x for x in lines if rx.search(x)), None)
        if hit:
            return hit[:limit]
    return (lines[0] if lines else r.get("kind", ""))[:limit]


def _child(modules: list[str], timeout: float) -> tuple[dict, dict]:
    """Import ``modules`` in children of this interpreter (:mod:`stackprobe.health_child`): one child while it
    lives; a module during which the child crashes or hangs is recorded as such and the rest go to a new child.
    Returns ({module: result}, the maps record of the first child that got through)."""
    from .isolate import _SUITE_ROOT
    from .runtime.orchestrate import run_in_session

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([_SUITE_ROOT] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    results, maps, todo = {}, {}, list(modules)
    while todo:
        t0 = time.time()
        proc = run_in_session([sys.executable, "-m", "stackprobe.health_child"], input=json.dumps(todo),
                              timeout=timeout, env=env)
        begun = None
        for line in proc.stdout.splitlines():
            if line.startswith("HEALTH-BEGIN "):
                begun = line.split(" ", 1)[1]
            elif line.startswith("HEALTH-RESULT "):
                r = json.loads(line.split(" ", 1)[1])
                results[r["module"]] = r
                begun = None
            elif line.startswith("HEALTH-MAPS ") and not maps:
                maps = json.loads(line.split(" ", 1)[1])
        todo = [m for m in todo if m not in results]
        if not todo:
            break
        bad = begun or todo[0]
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:400]
        results[bad] = {"module": bad, "ok": False, "seconds": round(time.time() - t0, 1),
                        "kind": "timeout" if proc.timed_out else "crash", "error_class": "",
                        "error": (f"timed out after {timeout:.0f} s" if proc.timed_out
                                  else f"the interpreter died importing it (exit code {proc.returncode}): {tail}")}
        todo = [m for m in todo if m != bad]
    return results, maps


def _providers_installed(provides, dists) -> bool:
    return any(_norm(p) in dists for p in provides)


def run_imports(dists: dict, backends, timeout: float) -> tuple[dict, dict]:
    """Import every module the ``backends`` need (library modules where a providing distribution is installed;
    engine modules where sglang is), the library's and the engine's in two children side by side."""
    lib, eng = [], []
    for b in backends:
        need = NEEDS[b]
        for mod, provides in need.modules:
            if _providers_installed(provides, dists) and mod not in lib:
                lib.append(mod)
        if ENGINE_DIST in dists:
            eng += [m for m in need.engine_modules if m not in eng]
    with ThreadPoolExecutor(max_workers=2) as pool:
        f_lib = pool.submit(_child, lib, timeout)
        f_eng = pool.submit(_child, eng, timeout) if eng else None
        results, maps = f_lib.result()
        if f_eng is not None:
            results.update(f_eng.result()[0])
    return {m: classify(r) for m, r in results.items()}, maps


# -------------------------------------------------------------------------------------- 3. shared objects
def torch_lib_dirs() -> list[str]:
    """torch's ``lib/`` folder (libc10.so, libtorch*.so), found without importing torch."""
    try:
        spec = util.find_spec("torch")
    except (ImportError, ValueError):
        spec = None
    return [str(Path(r) / "lib") for r in (spec.submodule_search_locations or [])] if spec else []


def dist_shared_objects(dist: str) -> tuple[str, list[tuple[str, str]]] | None:
    from .coverage import dist_files
    found = dist_files(dist)
    if found is None:
        return None
    ver, files = found
    return ver, [(rel, p) for rel, p in files if not rel.endswith(".cubin") and elf.is_elf(p)]


def scan_shared_objects(dists: dict, major: int | None) -> list[dict]:
    """For each installed :data:`EXTENSION_DISTS` distribution: each shared object whose DT_NEEDED names CUDA
    libraries (``cuda``: {soname: major}) and, where that major differs from the stack's ``major``, ``mismatch``."""
    out = []
    for dist in EXTENSION_DISTS:
        if _norm(dist) not in dists:
            continue
        ver, files = dist_shared_objects(dist) or (None, [])
        for rel, path in files:
            try:
                needs = elf.needed(path)
            except Exception as e:  # noqa: BLE001 - an unreadable file is a finding, not a crash
                out.append({"dist": dist, "version": ver, "file": rel, "error": f"{type(e).__name__}: {e}"})
                continue
            majors = elf.cuda_majors(needs)
            if not majors:
                continue
            other = sorted({s for s, m in majors.items() if major is not None and m != major})
            out.append({"dist": dist, "version": ver, "file": rel, "path": path, "cuda": majors,
                        "torch_libs": [s for s in needs if s.startswith(("libc10", "libtorch"))], "mismatch": other})
    return out


def artifact_mismatch(path: str, environment: dict | None = None) -> dict | None:
    """For one artifact (a flashinfer-jit-cache module): {"needs": [sonames of another CUDA major], "stack": the
    stack's CUDA version} when its CUDA libraries' major differs from the stack's (case C42), else None."""
    cuda, _ = stack_cuda(environment or {})
    if not cuda:
        return None
    try:
        majors = elf.cuda_majors(elf.needed(path))
    except Exception:  # noqa: BLE001
        return None
    other = sorted(s for s, m in majors.items() if m != int(cuda.split(".")[0]))
    return {"needs": other, "stack": cuda} if other else None
