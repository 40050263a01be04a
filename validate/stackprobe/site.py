"""The static tier on a site: released packages laid out as folders (their ``*.dist-info`` and Python files, no
binaries, nothing installed), read by the suite's own readers, and what a move from one site to another changes.

A site is a list of folders, each a ``sys.path`` entry holding one or more distributions as a wheel lays them out
(``<dist>-<version>.dist-info/`` beside the import packages). The readers find an installed package through
``importlib.util.find_spec`` and ``importlib.metadata`` (:mod:`stackprobe.source`, ``dist_version``), both of which
walk ``sys.path``, so a site needs no hook in them: :func:`run` starts a child interpreter with ``-S`` (no
site-packages: nothing of the interpreter's own environment is visible) whose ``sys.path`` is this suite, the site's
folders and the standard library, and runs :func:`stackprobe.static.run_static` there, with two parts of the tier
replaced because they need what a site does not have:

* the environment report (:func:`site_environment`): no interpreter of the stack runs, so torch is described from
  its metadata (its version, and its CUDA build from its ``Requires-Dist``), the image's nvcc by its release only,
  no driver, no GPUs;
* the environment health stage (:func:`site_health`): ``import`` of each backend and the shared-object checks
  need the binaries; they say "not assessed" with the reason. The declared-requirements check runs (metadata only)
  where a requirement parser (``packaging``) is on the site;
* the library gates are not run: each backend's library answer is ``not-assessed`` with the reason (they import the
  library with torch or read its binaries; :func:`site_library_answers` catches any other library answer).

Everything else is the tier as it runs in an image: the engine readers (:mod:`stackprobe.engines`, read from the
sources with ``ast``), the dispatch walk, the user statuses and the headline
(:func:`stackprobe.userwords.headline_line`). The engine answers are the ones the suite gives for the same packages
installed (the image's nvcc given by release, so a JIT-built module is not refused for want of one).

:func:`changes` compares two :func:`run` results (old site, new site): per engine and backend, old status -> new
status with the deciding line (the new verdict's cause). :func:`move_costs` reads what a FlashInfer move costs
beyond the statuses, from the two sites' sources: an ahead-of-time module to rebuild (the wrapper calls a function
the old module does not export) and a tune cache to redo (a ``*TUNE_VERSION`` constant changed).

Standard library only: this module runs inside images too.
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Sequence

SUITE_ROOT = str(Path(__file__).resolve().parent.parent)
NOT_ASSESSED_IMPORTS = ("not assessed: the packages are laid out from their wheels without binaries and not "
                        "installed, so no import and no shared-object check runs")

_BOOT = ("import sys, json\n"
         "args = json.loads(sys.stdin.read())\n"
         "sys.path[:0] = [args['suite']] + list(args['roots'])\n"
         "from stackprobe.site import _child_main\n"
         "_child_main(args)\n")


def bare_python(cache: str | Path | None = None) -> str:
    """An interpreter that sees no installed package: a virtual environment without pip or system site-packages
    (``venv``, created once under ``cache``, default ``$STACKPROBE_CACHE`` or ``~/.cache/stackprobe``). The tier's
    own child interpreters (:mod:`stackprobe.isolate`) run ``sys.executable``, so they too see only the suite and the
    site (``PYTHONPATH``), never the packages of the interpreter that runs the radar."""
    import venv

    base = Path(cache or os.environ.get("STACKPROBE_CACHE") or Path.home() / ".cache" / "stackprobe")
    d = base / f"site-python-{sys.version_info[0]}.{sys.version_info[1]}"
    py = d / "bin" / "python"
    if not py.exists():
        tmp = base / f".site-python-{os.getpid()}"
        venv.create(tmp, with_pip=False, system_site_packages=False, symlinks=True, clear=True)
        try:
            os.replace(tmp, d)
        except OSError:        # another process made it first
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
    return str(py)


class SiteError(RuntimeError):
    """The site could not be read: a folder is missing, or the child interpreter failed (its stderr's tail)."""


def run(roots: Sequence[str | Path], target: str = "12.0", *, world_size: int = 8, topology: str = "pcie",
        engine: str = "auto", server_args: str = "", env: list[str] | tuple = (), toolkit: str | None = None,
        python: str | None = None, timeout: float = 600.0) -> dict:
    """The static tier over the site ``roots`` (folders, first wins as on ``sys.path``), in a child interpreter
    ``python -S`` (default: :func:`bare_python`, so nothing of this interpreter's packages is visible). ``target``: compute capability; ``world_size``: TP size; ``topology``:
    "pcie" or "nvlink" (no GPU to detect it); ``engine``: sglang, vllm or auto; ``server_args`` / ``env``: the
    engine flags asked about (as ``--server-args`` / ``--env``); ``toolkit``: the CUDA release ("13.1") of the nvcc the
    image the site stands for carries (None: no nvcc, so a JIT-only module reads "blocked (toolchain)"). Returns ``{"report": report JSON, "headline":
    {engine: sentence}, "seconds": float}``. Raises :class:`SiteError` (a missing folder, a failed child, a bad
    flag: its one-paragraph message)."""
    missing = [str(r) for r in roots if not Path(r).is_dir()]
    if missing:
        raise SiteError(f"site folder(s) missing: {', '.join(missing)}; lay the wheels out first")
    resolved = [str(Path(r).resolve()) for r in roots]
    args = {"suite": SUITE_ROOT, "roots": resolved, "target": str(target),
            "world_size": int(world_size), "topology": topology, "engine": engine, "server_args": server_args,
            "env": list(env), "toolkit": toolkit}
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "CUDA_", "FLASHINFER_", "NCCL_",
                                                                          "VLLM_", "SGLANG_"))}
    child_env["PYTHONPATH"] = os.pathsep.join([SUITE_ROOT] + resolved)   # the tier's own children see the site
    child_env["PYTHONDONTWRITEBYTECODE"] = "1"
    child_env["PYTHONNOUSERSITE"] = "1"
    child_env["PATH"] = "/usr/bin:/bin"     # no nvcc of this host: a site has none
    try:
        p = subprocess.run([python or bare_python(), "-S", "-c", _BOOT], input=json.dumps(args), capture_output=True,
                           text=True, timeout=timeout, env=child_env)
    except subprocess.TimeoutExpired:
        raise SiteError(f"the static tier on the site did not finish in {timeout:.0f} s") from None
    line = next((ln for ln in reversed(p.stdout.splitlines()) if ln.startswith("SITE-RESULT ")), None)
    if p.returncode != 0 or line is None:
        raise SiteError(f"the static tier on the site failed (exit {p.returncode}): {p.stderr.strip()[-1500:]}")
    out = json.loads(line[len("SITE-RESULT "):])
    if out.get("error"):
        raise SiteError(out["error"])
    return out


_TOOLKIT: dict = {"release": None}
_CUDA_PIN = re.compile(r"^(cuda-toolkit|nvidia-cuda-runtime(?:-cu\d+)?)\b[^=;]*==\s*(\d+)\.(\d+)", re.I)


def torch_cuda_from_metadata() -> tuple[str | None, str]:
    """The CUDA build of the torch on ``sys.path`` from its ``Requires-Dist`` (PyPI's CUDA builds pin
    ``cuda-toolkit[...]==13.2.2`` or ``nvidia-cuda-runtime-cu12==12.8.90``): ("13.2", evidence), or (None, why)."""
    from importlib import metadata

    try:
        reqs = metadata.requires("torch") or []
    except metadata.PackageNotFoundError:
        return None, "torch is not in the site"
    for r in reqs:
        m = _CUDA_PIN.match(r.replace("_", "-"))
        if m:
            return f"{m.group(2)}.{m.group(3)}", f"torch Requires-Dist {r.split(';')[0].strip()}"
    return None, "torch's Requires-Dist pins no CUDA runtime (a CPU build?)"


def site_library_answers(report) -> int:
    """Every library answer (scope "library", static) made ``not-assessed`` on a site, the answer the tier gave kept
    as evidence. The library gates import the library with torch (FlashInfer's effective arch list, its JIT
    modules), read its shared objects (arch coverage, kernel libraries) or ask which dependencies load; a site has
    none of that, so what they say there is about the site, not the release (``No module named 'torch'``, "no
    common_ops library"). The engine answers, read from the sources, are the site's answers. Returns how many."""
    from .verdict import NOT_ASSESSED, SCOPE_LIBRARY

    n = 0
    for v in report.verdicts:
        if v.tier != "static" or v.scope != SCOPE_LIBRARY or v.status == NOT_ASSESSED:
            continue
        v.add("answer on the site (laid out, not installed)", f"{v.status} ({v.gate or '-'}): {v.cause}", "static gate")
        v.status, v.gate = NOT_ASSESSED, ""
        v.cause = ("not assessed: " + NOT_ASSESSED_IMPORTS + " (a library gate imports the library or reads its "
                   "binaries)")
        n += 1
    return n


def site_environment(timeout: float = 0.0) -> dict:
    """The environment report of a site (the shape of :func:`stackprobe.env.collect`): packages from their
    metadata, torch's version and CUDA build from its metadata (:func:`torch_cuda_from_metadata`); the image's
    nvcc as given to :func:`run` (``toolkit``: its release only, nothing runs), no driver or GPUs."""
    from . import env as envmod

    packages = {d: v for d in envmod.BACKEND_DISTS if (v := envmod.dist_version(d))}
    cuda, where = torch_cuda_from_metadata()
    torch = {"version": packages.get("torch"), "cuda": cuda, "cuda_source": where,
             "import_error": "not imported: " + NOT_ASSESSED_IMPORTS} if packages.get("torch") else \
        {"import_error": "torch is not in the site"}
    rel = _TOOLKIT["release"]
    nvcc = {"path": "(the image's CUDA toolkit: bin/nvcc)", "realpath": "(site)", "release": rel,
            "version": rel, "site": "given, not run"} if rel else None
    return {"python": {"version": sys.version.split()[0], "executable": "(site: none runs)", "platform": "site"},
            "torch": torch, "nvcc": {"path": None, "on_path": [], "cuda_home": "(the image's)" if nvcc else None,
                                     "cuda_home_source": "CUDA_HOME", "cuda_home_nvcc": nvcc, "pip": []},
            "nccl": {}, "packages": packages, "env": {}, "gpus": [], "p2p": {}, "topology": {}, "driver": {},
            "toolkit_roots": [], "findings": [], "site": True}


def site_health(environment: dict, target, topology: str, backends=None, timeout: float = 0.0,
                quiet: bool = True) -> dict:
    """The health stage of a site: the declared-requirements check (metadata; "not assessed" without a
    requirement parser), imports and shared objects "not assessed" (see :data:`NOT_ASSESSED_IMPORTS`); no blocks."""
    from . import health as h

    try:
        breaks, unread = h.requirement_breaks(h.installed()), None
    except h.RequirementsUnreadable as e:
        breaks, unread = [], str(e)
    findings = [{"check": "requirements", "level": "error" if b["kind"] == "conflict" else "warning",
                 "message": h.describe_break(b)} for b in breaks if b["kind"] == "conflict"]
    if unread:
        findings.insert(0, {"check": "requirements", "level": "warning", "message": unread})
    findings.append({"check": "imports", "level": "warning", "message": NOT_ASSESSED_IMPORTS})
    cuda, where = h.stack_cuda(environment)
    health: dict = {"seconds": 0.0, "stack_cuda": cuda, "stack_cuda_source": where, "requirements": breaks,
            "requirements_not_assessed": unread, "imports": [], "imports_not_assessed": NOT_ASSESSED_IMPORTS,
            "shared_objects": [], "shared_objects_not_assessed": NOT_ASSESSED_IMPORTS, "static_symbols": {},
            "nccl": {}, "toolchain": {}, "findings": findings, "blocks": {}}
    environment["health"] = health          # where the tier's own run_health keeps it
    return health


def _memo_parse(parse):
    """``parse`` (:func:`stackprobe.source.parse`) remembered per path for one run on a site (the readers parse the
    same engine files many times; a site's files do not change while it is read)."""
    seen: dict = {}

    def memo(path):
        key = str(path)
        if key not in seen:
            seen[key] = parse(path)
        return seen[key]
    return memo


def _not_assessed_library(backends: tuple):
    """A library gate for a site: one ``not-assessed`` library answer per backend, saying why (see
    :func:`site_library_answers`)."""
    def gate(ctx) -> list:
        from .verdict import NOT_ASSESSED, SCOPE_LIBRARY, Verdict
        return [Verdict(b, NOT_ASSESSED, scope=SCOPE_LIBRARY, cause="not assessed: " + NOT_ASSESSED_IMPORTS
                        + " (a library gate imports the library or reads its binaries)") for b in backends]
    return gate


def _child_main(args: dict) -> None:
    """In the child (see :func:`run`): the tier with the site's environment and health, one JSON line out."""
    from . import static
    from .engines import EngineChoiceError, select
    from .engines.sglang.flags import ConfigError
    from .engines.sglang import engine as sglang_engine

    _TOOLKIT["release"] = args.get("toolkit")
    static.envmod.collect = site_environment      # the parts of the tier a site cannot run (module docstring)
    static.run_health = site_health
    from . import source
    source.parse = _memo_parse(source.parse)      # a site never changes under a run: each file is parsed once
    from .probes import probes
    for mod in probes():                          # the library gates: not assessed, without their import children
        mod.library_gate = _not_assessed_library(tuple(getattr(mod, "BACKENDS", ())))
    try:
        engines = select(args["engine"])
        configs = {e.name: e.parse_config(args["server_args"], args["env"]) for e in engines}
        report = static.run_static(args["target"], world_size=args["world_size"], topology=args["topology"],
                                   coverage_reader="elf", label="site", server_config=configs[engines[0].name],
                                   engines=engines, engine_configs=configs, timeout=120.0)
    except (EngineChoiceError, ConfigError, sglang_engine.GateNotFound, static.TargetArchError) as e:
        print("SITE-RESULT " + json.dumps({"error": str(e)}))
        return
    site_library_answers(report)
    from .userwords import headline_line
    heads = {e["name"]: headline_line(report.engine_view(e["name"])) for e in report.engines}
    print("SITE-RESULT " + json.dumps({"report": report.to_json(), "headline": heads,
                                       "seconds": report.options.get("seconds")}, default=str))


# ------------------------------------------------------------------------------------------ comparing two sites
def statuses(result: dict) -> dict:
    """``{(who, backend): {"status", "gate", "cause"}}`` of the static answers in a :func:`run` result: ``who`` is the
    engine ("sglang", "vllm") for an engine answer, "library" for a library answer."""
    out: dict = {}
    for v in result["report"].get("verdicts", []):
        if v.get("tier", "static") != "static":
            continue
        who = (v.get("engine") or "sglang") if v.get("scope") == "engine" else "library"
        out.setdefault((who, v["backend"]), {"status": v["status"], "gate": v.get("gate") or "",
                                             "cause": v.get("cause") or ""})
    return out


def _word(s: dict | None) -> str:
    if s is None:
        return "absent"
    return s["status"] + (f" ({s['gate']})" if s["gate"] and s["status"] in ("blocked", "skipped", "error") else "")


def changes(old: dict, new: dict) -> list[dict]:
    """Per engine (or "library") and backend whose status moved between two :func:`run` results: ``{"engine", "backend", "old",
    "new", "deciding"}`` (``deciding``: the new verdict's cause, or the old one's when the backend is gone), in the
    order of the new report. Headline moves are in :func:`headline_change`."""
    a, b = statuses(old), statuses(new)
    out = []
    for key in list(b) + [k for k in a if k not in b]:
        sa, sb = a.get(key), b.get(key)
        if _word(sa) == _word(sb):
            continue
        out.append({"engine": key[0], "backend": key[1], "old": _word(sa), "new": _word(sb),
                    "deciding": (sb or sa or {}).get("cause", "")})
    return out


def headline_change(old: dict, new: dict) -> dict:
    """``{engine: (old sentence, new sentence)}`` for each engine whose headline differs."""
    return {e: (old["headline"].get(e, ""), h) for e, h in new["headline"].items() if old["headline"].get(e) != h}


# ------------------------------------------------------------------------------------------ what a move costs
def _pkg(roots: Sequence[str | Path], top: str) -> Path | None:
    return next((Path(r) / top for r in roots if (Path(r) / top).is_dir()), None)


def module_calls(root: Path, builder: str) -> dict[str, set[str]]:
    """Functions called on the module ``builder`` (``gen_pcie_ipc_comm_module``) builds, per file that loads it:
    ``{"flashinfer/FILE": {NAME, ...}}`` with every ``module.NAME(`` and ``<loader>().NAME(`` call in each
    ``flashinfer/**.py`` outside ``jit/`` that calls ``builder()`` ({} when none does)."""
    out: dict[str, set[str]] = {}
    for p in sorted(root.rglob("*.py")):
        text = p.read_text(encoding="utf-8", errors="replace")
        if f"{builder}()" not in text or p.parent.name == "jit":
            continue
        tree = ast.parse(text)
        loaders = {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                   and any(isinstance(c, ast.Call) and ast.unparse(c.func) == builder for c in ast.walk(f))}
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                if (isinstance(owner, ast.Name) and owner.id == "module") or (
                        isinstance(owner, ast.Call) and ast.unparse(owner.func) in loaders):
                    names.add(node.func.attr)
        names.discard("build_and_load")
        if names:
            out[p.relative_to(root.parent).as_posix()] = names
    return out


def tune_versions(root: Path) -> dict:
    """``{"flashinfer/FILE NAME": value}`` for every module-level integer constant whose name ends in
    ``TUNE_VERSION`` under ``root`` (a tune cache records it; a changed value makes old caches be ignored)."""
    out = {}
    for p in sorted(root.rglob("*tun*.py")):
        for node in ast.parse(p.read_text(encoding="utf-8", errors="replace")).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, int):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id.endswith("TUNE_VERSION"):
                        out[f"{p.relative_to(root.parent).as_posix()} {t.id}"] = (node.value.value, node.lineno)
    return out


#: the FlashInfer JIT modules whose cost a move is read for: (builder, what the suite calls it)
AOT_MODULES = (("gen_pcie_ipc_comm_module", "PCIe IPC allreduce"),)


def move_costs(old_roots: Sequence[str | Path], new_roots: Sequence[str | Path]) -> list[str]:
    """What moving FlashInfer from the ``old_roots`` site to the ``new_roots`` site costs besides the statuses, one
    sentence each: an ahead-of-time module to rebuild (the new wrapper calls functions the old module does not
    export, read with ``ast``) or to build (the old release loads no such module), a tune cache to redo (a ``*TUNE_VERSION`` changed). [] when FlashInfer is in neither
    site or nothing of this kind changed."""
    a, b = _pkg(old_roots, "flashinfer"), _pkg(new_roots, "flashinfer")
    if a is None or b is None:
        return []
    out = []
    for builder, title in AOT_MODULES:
        ca, cb = module_calls(a, builder), module_calls(b, builder)
        had = set().union(*ca.values()) if ca else set()
        if cb and not ca:
            out.append(f"AOT module to build: the {title} module ({builder}) is new (the old release loads none)")
            continue
        for where, names in cb.items():
            added = sorted(names - had)
            if added:
                out.append(f"AOT module to rebuild: the {title} module ({builder}); {where} now calls "
                           f"{', '.join(added)}, which a module built for the old release does not export")
    ta, tb = tune_versions(a), tune_versions(b)
    for k in sorted(set(ta) & set(tb)):
        if ta[k][0] != tb[k][0]:
            f, name = k.split(" ")
            out.append(f"tune cache to redo: {name} {ta[k][0]} -> {tb[k][0]} ({f}:{tb[k][1]}); caches tuned with "
                       f"{ta[k][0]} are ignored")
    return out
