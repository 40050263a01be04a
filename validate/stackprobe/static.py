"""The static tier: environment report, arch coverage and one static probe per backend, with no GPU.

Entry point for other tiers and tools: :func:`run_static` returns a :class:`stackprobe.report.Report`.
"""
from __future__ import annotations

import functools
import os
import sys
import time
import traceback
from pathlib import Path

from . import coverage as cov
from . import driver as drivermod
from .engines import DEFAULT, p2p_check, registered
from . import env as envmod
from . import gates
from . import health_stage
from . import host as hostmod
from .archs import Arch, ArchSpecError, parse_arch
from .probes import Context, probes
from .report import Report
import re

from .serverconfig import NO_FLAGS
from .verdict import (BLOCKED, ERROR, GATE_BINARY, LIFT_PACKAGE, NOT_ASSESSED, SCOPE_ENGINE, SCOPE_LIBRARY,
                      Verdict)

# Compute capabilities a target may name (NVIDIA's CUDA GPUs compute-capability table; sm_101 was
# renamed sm_110 in CUDA 13.0). Valid spellings per archs.VALID_FORMS. The same list as the build's arch table
# (the `archs:` keys of recipes/toolchains.yaml; tests/test_arch_everywhere.py keeps the two equal).
KNOWN_COMPUTE_CAPABILITIES = ("5.0", "5.2", "5.3", "6.0", "6.1", "6.2", "7.0", "7.2", "7.5", "8.0", "8.6", "8.7",
                              "8.9", "9.0", "10.0", "10.1", "10.3", "11.0", "12.0", "12.1")


class TargetArchError(ValueError):
    """An unknown or malformed target arch; the message lists the valid ones."""


def parse_target(spec: str | Arch) -> Arch:
    """Parse and check a target arch. Raises :class:`TargetArchError` listing the valid ones."""
    if isinstance(spec, Arch):
        arch = spec
    else:
        try:
            arch = parse_arch(spec)
        except ArchSpecError as e:
            raise TargetArchError(f"{e} Known targets: {', '.join(KNOWN_COMPUTE_CAPABILITIES)}.") from e
    if arch.cc not in KNOWN_COMPUTE_CAPABILITIES:
        raise TargetArchError(
            f"unknown target arch {spec!s}: no GPU has compute capability {arch.cc}. Pass one of "
            f"{', '.join(KNOWN_COMPUTE_CAPABILITIES)} (RTX PRO 6000 Blackwell and RTX 50xx are 12.0), "
            f"optionally with an a/f suffix (12.0a, 12.0f).")
    return arch


def post_pass(verdicts: list, environment: dict, target: Arch, topology: str, floor: dict | None,
              too_new: list | None = None) -> list:
    """Checks that hold for every backend, after the probes: a missing declared dependency (C29), the
    known-bad-releases data, PTX the driver cannot JIT (C27), then the driver floor (C28: every verdict
    blocked (driver) below it)."""
    installed = [d for d in envmod.BACKEND_DISTS if (environment.get("packages") or {}).get(d)]
    gates.apply_missing_dependency(verdicts, installed)
    from . import known_bad
    versions = {e.package: envmod.dist_version(e.package) for e in known_bad.load() if e.package != "nccl"}
    gates.apply_known_bad(verdicts, versions, target, topology)
    drivermod.apply_ptx_driver(verdicts, too_new or [])
    drivermod.apply_driver_floor(verdicts, floor)
    return verdicts


def run_health(environment: dict, target: Arch, topology: str, backends, timeout: float, quiet: bool) -> dict:
    """The environment health stage (:mod:`stackprobe.health`), kept in ``environment["health"]``."""
    _log("environment health", quiet)
    health = health_stage.run(environment, target, topology, backends, timeout)
    environment["health"] = health
    return health


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"[stackprobe] {msg}", file=sys.stderr, flush=True)


def run_static(target_arch: str | Arch = "12.0", *, jit_compile: bool = False, cache_dir: str | Path | None = None,
               coverage_reader: str = "auto", world_size: int = 8, topology: str = "auto",
               backends: list[str] | None = None, label: str = "", timeout: float = 180.0,
               scan_dists: list[str] | tuple = (), quiet: bool = True, server_config=None, engines=None,
               engine_configs: dict | None = None) -> Report:
    """Run the static tier for ``target_arch`` in this environment and return the Report.

    ``jit_compile``: also compile FlashInfer's fusion module for the target (minutes, cached by content
    in ``cache_dir``, default ``$STACKPROBE_CACHE`` or ``~/.cache/stackprobe``). ``coverage_reader``:
    "auto" | "elf" | "cuobjdump". ``world_size``: the TP size verdicts are for. ``topology``: "auto"
    (detected with GPUs present, else the target host's PCIe assumed), "pcie" or "nvlink".
    ``backends``: restrict to these backend names. ``scan_dists``: more distributions to cover.
    ``server_config``: the engine flags and variables the verdicts are for (a :class:`ServerConfig`; None: no flags),
    recorded in ``options.server_config``. ``engines``: the serving engines that answer (:mod:`stackprobe.engines`,
    primary first; None: :data:`stackprobe.engines.DEFAULT` alone, as before the interface), named in the report's
    ``engines``; each goes through the same contract (``per_module``, ``answers``, ``sections``, ``not_assessed``);
    ``engine_configs``: engine name -> the ServerConfig that engine checked. Raises TargetArchError for a bad target.
    A probe that crashes gives an ``error`` verdict with the exception, not an exception here.

    Phases, in order: environment, arch coverage, driver (C27, C28), topology, context and report, engine pins and
    torch's arch list (C19), environment health, probe modules, engines, the post pass and the host, engine sections.
    """
    target = parse_target(target_arch)
    t0 = time.time()
    _log(f"environment (target {target})", quiet)
    environment = envmod.collect(timeout=timeout)
    _log("arch coverage", quiet)
    coverage_list, reader_error = _scan_coverage(environment, target, coverage_reader, scan_dists)
    too_new, floor = _driver_checks(environment, coverage_list)
    topo, topo_source = _resolve_topology(environment, topology)
    ctx = Context(target=target, env=environment, coverage={c.package: c for c in coverage_list},
                  world_size=world_size, topology=topo, topology_source=topo_source, jit_compile=jit_compile,
                  timeout=timeout, server_config=server_config or NO_FLAGS, engine_configs=dict(engine_configs or {}))
    if cache_dir:
        ctx.cache_dir = Path(cache_dir)
    report = Report(target_arch=str(target), environment=environment, coverage=[c.to_json() for c in coverage_list],
                    label=label, options={"jit_compile": jit_compile, "coverage_reader": coverage_reader,
                                          "reader_error": reader_error, "world_size": world_size,
                                          "topology": topo, "topology_source": topo_source,
                                          "server_config": ctx.server_config.to_json()})
    torch_gap = _pins_and_torch_gap(environment, target, coverage_list)
    host = {"compute_capability": target.cc, "topology": topo, "world_size": world_size, "topology_source": topo_source}
    health = run_health(environment, target, topo, backends, timeout, quiet)
    engines = list(engines) if engines else [registered()[DEFAULT]()]
    admit = functools.partial(_admit, report, health, host, torch_gap, target, backends)
    _run_probe_modules(ctx, [e for e in engines if e.per_module], backends, admit, quiet)
    _run_engines(ctx, engines, admit, quiet)
    post_pass(report.verdicts, environment, target, topo, floor, too_new)
    _log("host (P2P, IOMMU, ACS)", quiet)
    report.host = read_host_section(environment, ctx)
    hostmod.apply(report.verdicts, report.host, world_size, p2p_check=p2p_check)   # each engine's own P2P check
    _engine_sections(report, ctx, engines)
    report.options["seconds"] = round(time.time() - t0, 1)
    return report


def _scan_coverage(environment: dict, target: Arch, coverage_reader: str, scan_dists) -> tuple[list, str]:
    """Arch coverage of the CUDA distributions, ``scan_dists`` and libnccl; a reader error is a warning finding."""
    coverage_list, reader_error = [], ""
    try:
        coverage_list = cov.scan_installed(target, coverage_reader,
                                           tuple(cov.CUDA_DISTS) + tuple(d for d in scan_dists if d not in cov.CUDA_DISTS))
        nccl_cov = cov.scan_libnccl(target, coverage_reader)   # the baseline's own kernels (C26)
        if nccl_cov is not None:
            coverage_list.append(nccl_cov)
    except cov.CoverageReaderError as e:
        reader_error = str(e)
        environment.setdefault("findings", []).append({"case": "", "level": "warning", "message": f"arch coverage skipped: {e}"})
    return coverage_list, reader_error


def _driver_checks(environment: dict, coverage_list: list) -> tuple[list, dict | None]:
    """PTX the driver cannot JIT (C27) and the stack's driver floor (C28), each an error finding; returns both."""
    driver = environment.get("driver") or {}
    too_new = drivermod.ptx_too_new(coverage_list, driver)
    for p in too_new:   # C27 on a host with a driver
        environment.setdefault("findings", []).append({"case": "C27", "level": "error", "message":
            f"{p['package']}: {p['path']} is PTX-only with PTX ISA {p['ptx_isa']} (CUDA {p['needs_cuda']}), but the "
            f"driver JITs up to CUDA {p['driver_cuda']}: loading it fails with cudaErrorUnsupportedPtxVersion; "
            f"upgrade the driver or install a build with SASS for the target."})
    stack_cuda, _ = drivermod.stack_cuda_version(environment)
    floor = drivermod.driver_floor(stack_cuda, driver)
    if floor:
        environment.setdefault("findings", []).append({"case": "C28", "level": "error", "message": floor["cause"]
                                                       + f"; every verdict is blocked (driver): {floor['lift']}."})
    return too_new, floor


def _resolve_topology(environment: dict, topology: str) -> tuple[str, str]:
    """The topology the verdicts are for and where it came from: given, detected from GPUs, or PCIe assumed."""
    if topology != "auto":
        return topology, "given"
    t = environment.get("topology") or {}
    if environment.get("gpus") and t.get("pairs"):
        return ("nvlink" if t.get("full_nvlink") else "pcie"), "detected (nvidia-smi topo -m)"
    return "pcie", "assumed: no GPUs here; the target host is PCIe (pass --topology nvlink to change)"


def _pins_and_torch_gap(environment: dict, target: Arch, coverage_list: list) -> str:
    """Record the engine pins, then whether torch's arch list misses the target (C19, an error finding)."""
    from .userwords import engine_pins
    environment["engine_pins"] = engine_pins(environment)
    torch_gap = torch_lacks_target(environment, target, next((c for c in coverage_list if c.package == "torch"), None))
    if torch_gap:
        environment.setdefault("findings", []).append({"case": "C19", "level": "error", "message": torch_gap})
    return torch_gap


def _admit(report: Report, health: dict, host: dict, torch_gap: str, target: Arch, backends: list[str] | None,
           verdicts: list) -> None:
    """Apply the health stage, the host and a torch arch gap (C19) to new verdicts, then add those asked for."""
    health_stage.apply(verdicts, health)   # decided once, before the gates were read
    for v in verdicts:
        if not v.host:
            v.host = dict(host)
        if torch_gap and v.is_open and not v.backend.startswith("nccl-"):
            v.status, v.gate, v.lift = BLOCKED, GATE_BINARY, LIFT_PACKAGE
            v.cause = f"{torch_gap} (case C19); this backend runs torch kernels"
            v.lift_detail = f"a torch build whose arch list covers {target.cc} (TORCH_CUDA_ARCH_LIST={target.cc})"
        if not backends or v.backend in backends:
            report.add(v)


def _run_probe_modules(ctx, per_module: list, backends: list[str] | None, admit, quiet: bool) -> None:
    """Each probe module's library gate and the per-module engines' gates; a gate that crashes is an error verdict."""
    for mod in probes():
        names = list(getattr(mod, "BACKENDS", ()))
        if backends and not set(names) & set(backends):
            continue
        _log(f"probe {', '.join(names)}", quiet)
        verdicts = []
        gates_of = [(SCOPE_LIBRARY, "", getattr(mod, "library_gate", None) or mod.probe)]
        gates_of += [(SCOPE_ENGINE, e.name, lambda c, m=mod, e=e: e.answers(c, m)) for e in per_module
                     if getattr(mod, "engine_gate", None)]
        for scope, who, fn in gates_of:
            try:
                verdicts += fn(ctx)
            except Exception as e:  # noqa: BLE001 - a probe bug is a verdict, not the end of the suite
                tb = traceback.format_exc().strip().splitlines()
                verdicts += [Verdict(n, ERROR, scope=scope, cause=f"static {scope} gate crashed: {type(e).__name__}: {e}",
                                     warnings=[" / ".join(tb[-3:])], engine=who) for n in names]
        admit(verdicts)


def _run_engines(ctx, engines: list, admit, quiet: bool) -> None:
    """The answers of each engine that is not per module; a reader that crashes is an error verdict."""
    for eng in engines:
        if eng.per_module:
            continue
        _log(f"engine {eng.name}", quiet)
        try:
            admit(eng.answers(ctx))
        except Exception as e:  # noqa: BLE001 - an engine reader bug is a verdict, not the end of the suite
            tb = traceback.format_exc().strip().splitlines()
            admit([Verdict(f"{eng.name}-engine", ERROR, scope=SCOPE_ENGINE, engine=eng.name,
                           cause=f"the {eng.title} engine reader crashed: {type(e).__name__}: {e}",
                           warnings=[" / ".join(tb[-3:])])])


def _engine_sections(report: Report, ctx, engines: list) -> None:
    """Each engine's entry in ``report.engines`` (report schema 4, every engine alike): name, title, version, the flags
    it checked (``server_config``), its sections (:meth:`ServingEngine.sections`: dispatch, paths, launch environment)
    and, appended to its ``paths``, the settings and modules it ships that no verdict judges (not assessed)."""
    for eng in engines:
        sections = dict(eng.sections(report, ctx) or {})
        config = (ctx.engine_configs or {}).get(eng.name) or ctx.server_config
        entry = {"name": eng.name, "title": eng.title, "version": eng.version(), "server_config": config.to_json(),
                 "dispatch": sections.pop("dispatch", None) or {}, **sections}
        try:    # the settings and modules it ships that no verdict judges (issue 39 point 6)
            extra = eng.not_assessed(ctx)
        except Exception as e:  # noqa: BLE001 - a reader that crashes is a not-assessed row, never a crashed run
            extra = [Verdict(f"{eng.name}-paths", NOT_ASSESSED, scope=SCOPE_ENGINE, engine=eng.name,
                             cause=f"not assessed: the settings and modules {eng.title} ships could not be enumerated "
                                   f"({type(e).__name__}: {e})").to_json()]
        if extra:
            entry["paths"] = list(entry.get("paths") or []) + extra
        report.engines.append(entry)


def read_host_section(environment: dict, ctx) -> dict:
    """The report's host section (:func:`stackprobe.host.read_host`) with CUDA's peer answers from the environment
    report and the variables of the server configuration asked about (every engine's ``--env``); a reader that
    crashes is reported in the section, never raised. ``STACKPROBE_HOST_ROOT=DIR`` reads a saved host instead
    (:func:`stackprobe.host.read_snapshot`): the target's files judged on another machine."""
    config_env = dict(ctx.server_config.env)
    for cfg in (ctx.engine_configs or {}).values():
        config_env.update(getattr(cfg, "env", {}) or {})
    try:
        snap = os.environ.get("STACKPROBE_HOST_ROOT")
        if snap:
            return hostmod.read_snapshot(snap, config_env=config_env)
        return hostmod.read_host(cuda_peers=environment.get("p2p") or None, config_env=config_env)
    except Exception as e:  # noqa: BLE001 - the host reader's bug is a finding, not the end of the suite
        return {"present": False, "gpus": [], "pairs": {}, "env": hostmod.peer_env(None, config_env),
                "not_read": [f"host reader crashed: {type(e).__name__}: {e}"],
                "line": f"not assessed: the host reader crashed ({type(e).__name__}: {e}); run "
                        f"{hostmod.HOST_CHECK} on the target"}


_ARCH_ENTRY = re.compile(r"^(sm|compute)_(\d+)(\d)([af]?)$")


def arch_entry_runs_on(entry: str, target: Arch) -> bool:
    """Whether one entry of torch's arch list (``sm_90``, ``sm_120a``, ``compute_90``) can run on
    ``target`` (CUDA C Programming Guide, binary compatibility): SASS ``sm_XY`` runs on X.z for z >= Y;
    ``sm_XYa`` only on X.Y; ``sm_XYf`` on the X family at minor >= Y; PTX ``compute_XY`` JIT-compiles
    on any compute capability >= X.Y."""
    m = _ARCH_ENTRY.match(entry.strip())
    if not m:
        return False
    kind, major, minor, suffix = m.group(1), int(m.group(2)), int(m.group(3)), m.group(4)
    if kind == "compute":
        return (major, minor) <= (target.major, target.minor)
    if suffix == "a":
        return (major, minor) == (target.major, target.minor)
    return major == target.major and minor <= target.minor


def torch_lacks_target(environment: dict, target: Arch, coverage=None) -> str:
    """Case C19: a one-sentence finding when this CUDA build of torch carries no kernel image for
    ``target`` (its own ``torch.cuda.get_arch_list()``, or, where that is unreadable, the static coverage of
    its shared objects: level "none"), else "". A CPU-only torch (no CUDA version) is not judged here: it
    is reported by the environment."""
    t = environment.get("torch") or {}
    archs = t.get("arch_list") or []
    if not t.get("cuda"):
        return ""
    if not archs:
        if coverage is not None and getattr(coverage, "level", "") == "none":
            return (f"torch {t.get('version')} carries no kernel image for {target.cc}: none of its shared objects has "
                    f"SASS or PTX for it ({', '.join(coverage.files_without[:3]) if getattr(coverage, 'files_without', None) else 'static coverage'})")
        return ""
    if any(arch_entry_runs_on(a, target) for a in archs):
        return ""
    return (f"torch {t.get('version')} carries no kernel image for {target.cc}: its arch list is {archs} "
            f"(torch.cuda.get_arch_list())")
