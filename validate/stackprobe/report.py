"""The report: a versioned JSON record, a Markdown matrix, and the comparison of two reports.

JSON layout (``schema`` = :data:`stackprobe.REPORT_SCHEMA_VERSION`)::

    {"schema": 1, "suite_version": "0.1.0", "created": "2026-...Z", "label": "...",
     "target_arch": "12.0", "tiers": ["static"], "options": {...},
     "environment": {...env.collect()...},
     "coverage": [PackageCoverage.to_json(), ...],
     "verdicts": [Verdict.to_json(), ...]}

Schema 2 adds ``provenance`` (``suite_digest``: sha256 over the suite's own files, as run; ``image``:
id, repo digests, plan hash and lock entry when run inside an image) and, per verdict, ``scope``
("library" / "engine") and ``host`` (where it was judged or measured).

Schema 3 gives engine answers the statuses a user acts on (on by default, opt-in, on as configured, start-up
failure if set, falls back if set, preempted, not integrated, not installed: :mod:`stackprobe.verdict`),
``options.server_config`` (the flags they are for) and ``environment.engine_pins``; a schema-2 report is read
through :func:`stackprobe.userwords.translate_v2` (or refused, never misread).

Two answers per backend: the library's (does FlashInfer / torch / NCCL admit the target) and the
engine's (will the installed SGLang enable it on the target host). :meth:`Report.verdict` returns the
headline: a runtime verdict measured on a host that matches the target (compute capability, topology,
world size: case C20), else the engine answer when the backend has one (``skipped (not installed:
sglang)`` without SGLang: case C18), else the library answer. A runtime verdict from another host is
shown beside it as "measured here", never as the target's verdict.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import REPORT_SCHEMA_VERSION, __version__, mdtable
from .atomic import write_atomic
from .engines import DEFAULT, registered, title_of
from .verdict import Verdict


SUITE_DIR = Path(__file__).resolve().parent


def suite_digest(root: str | Path = SUITE_DIR) -> str:
    """``sha256:<hex>`` over the suite's ``*.py`` files (relative path and content, sorted): which suite
    produced a report, independent of the image it ran in."""
    h = hashlib.sha256()
    root = Path(root)
    for p in sorted(root.rglob("*.py")):
        if "__pycache__" in p.parts:
            continue
        h.update(p.relative_to(root).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return "sha256:" + h.hexdigest()


def _runtime_names() -> dict[str, tuple[str, str]]:
    """runtime backend name -> (static backend, scope) from every probe module's ``RUNTIME``."""
    out: dict[str, tuple[str, str]] = {}
    try:
        from .probes import probes
        mods = probes()
    except Exception:  # noqa: BLE001 - a report must load even where a probe module cannot import
        return out
    for mod in mods:
        for scope, names in (getattr(mod, "RUNTIME", None) or {}).items():
            for n in names:
                out[n] = (mod.BACKENDS[0], scope)
    return out


def runtime_scope(v: Verdict) -> str:
    """"engine" for rows of SGLang's own communicators (stackprobe.runtime.engine), else "library" (a library
    kernel timed directly: never the engine's answer)."""
    return v.scope or _runtime_names().get(v.backend, ("", "library"))[1]


def host_label(host: dict) -> str:
    """``SM90, nvlink, ws 2`` from a verdict's host."""
    cc = str(host.get("compute_capability") or "?")
    sm = "SM" + cc.replace(".", "") if cc != "?" else "SM?"
    return f"{sm}, {host.get('topology') or '?'}, ws {host.get('world_size') or '?'}"


class ReportError(ValueError):
    """A report file that is not a stackprobe report or has an unknown schema."""


def translate_v3(d: dict) -> dict:
    """A schema-3 (or translated schema-2) report dict in the schema-4 layout, as a new dict: the top-level
    ``dispatch`` goes to the primary engine's entry (where it has none of its own), ``launch_environment`` to SGLang's
    (the only engine that wrote it), each of ``paths`` to the entry of the engine its verdict names (``engine``; none:
    :data:`stackprobe.engines.DEFAULT`), ``server_config`` (the primary engine's flags, a copy of
    ``options.server_config``) to the primary engine's entry. A report
    with no engine list gets one entry for :data:`~stackprobe.engines.DEFAULT` only when there is a section to hold.
    The ``schema`` number is kept: a comparison still says which layout it read."""
    d = dict(d)
    engines = [dict(e) for e in d.get("engines") or []]
    dispatch, launch = d.pop("dispatch", None) or {}, d.pop("launch_environment", None) or {}
    paths, config = d.pop("paths", None) or [], d.pop("server_config", None) or {}
    if config and not (d.get("options") or {}).get("server_config"):
        d["options"] = {**(d.get("options") or {}), "server_config": config}

    def entry(name: str) -> dict:
        found = next((e for e in engines if e.get("name") == name), None)
        if found is None:   # a report made before the engine list: the version as its environment recorded it
            found = {"name": name, "version": ((d.get("environment") or {}).get("packages") or {}).get(name)}
            engines.append(found)
        return found

    if dispatch or (config and engines):
        first = engines[0] if engines else entry(DEFAULT)
        if not first.get("dispatch"):
            first["dispatch"] = dispatch
        if config and "server_config" not in first:
            first["server_config"] = config
    if launch:
        entry(DEFAULT)["launch_environment"] = launch
    for p in paths:
        e = entry((p.get("engine") if isinstance(p, dict) else None) or DEFAULT)
        e["paths"] = list(e.get("paths") or []) + [p]
    d["engines"] = engines
    return d


@dataclass
class Report:
    target_arch: str
    environment: dict = field(default_factory=dict)
    coverage: list = field(default_factory=list)       # PackageCoverage.to_json() dicts
    verdicts: list = field(default_factory=list)       # Verdict objects
    tiers: list = field(default_factory=lambda: ["static"])
    options: dict = field(default_factory=dict)
    label: str = ""
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    schema: int = REPORT_SCHEMA_VERSION
    suite_version: str = __version__
    provenance: dict = field(default_factory=lambda: {"suite_digest": suite_digest()})
    # the serving engines that answered (stackprobe.engines), primary first, every engine alike (schema 4):
    # [{"name": "sglang" | "vllm" | ..., "title", "version", "server_config" (the flags it checked, ServerConfig JSON),
    #   "dispatch" (its dispatch of a decode allreduce, Dispatch JSON; {} when it has none), "paths" (the settings it
    #   ships that no verdict judges, Verdict JSON), "launch_environment" (SGLang: the variables its engine sets)}];
    # a schema-3 report's top-level sections are moved into these entries on load (translate_v3)
    engines: list = field(default_factory=list)
    # the box (stackprobe.host.read_host): PCIe tree, IOMMU, ACS, P2P per pair, the variables that change the path;
    # {} in reports made before the host stage
    host: dict = field(default_factory=dict)

    # --- engines ---------------------------------------------------------------------------------
    def primary_engine(self) -> str:
        """The engine whose answers make the headline and the matrix: the first of ``engines`` (default sglang)."""
        return (self.engines[0].get("name") if self.engines else "") or DEFAULT

    def _of_engine(self, v: Verdict, engine: str | None = None) -> bool:
        want = engine or self.primary_engine()
        return (v.engine or DEFAULT) == want

    @property
    def dispatch(self) -> dict:
        """The primary engine's dispatch of a decode allreduce (its ``engines`` entry's ``dispatch``); {} when none."""
        return (self.engines[0].get("dispatch") if self.engines else None) or {}

    @dispatch.setter
    def dispatch(self, value: dict) -> None:
        if not self.engines:
            self.engines.append({"name": DEFAULT})
        self.engines[0]["dispatch"] = value

    @property
    def paths(self) -> list:
        """Every engine's not-assessed paths (Verdict JSON), in the engines' order."""
        return [p for e in self.engines for p in e.get("paths") or []]

    @property
    def server_config(self) -> dict:
        """The flags the headline's verdicts are for (``options.server_config``)."""
        return (self.options or {}).get("server_config") or {}

    def engine_view(self, name: str) -> "Report":
        """This report with ``name`` as its primary engine (its dispatch as ``dispatch``): the same verdicts, for the
        headline and matrix of a second engine."""
        import copy
        view = copy.copy(self)
        first: dict = next((e for e in self.engines if e.get("name") == name), {"name": name})
        view.engines = [first] + [e for e in self.engines if e is not first]
        return view

    # --- access ----------------------------------------------------------------------------------
    def add(self, verdict: Verdict) -> None:
        """Add a verdict (the runtime tier calls this; it also records its tier in ``tiers``). A runtime
        verdict without ``host`` gets this environment's: compute capability of its GPUs, their
        topology, the world size it measured, driver, torch and NCCL versions (case C20)."""
        if verdict.tier == "runtime" and not verdict.host:
            verdict.host = self.measured_host(verdict)
        self.verdicts.append(verdict)
        if verdict.tier not in self.tiers:
            self.tiers.append(verdict.tier)

    def measured_host(self, verdict: Verdict) -> dict:
        env = self.environment or {}
        gpus = env.get("gpus") or []
        topo = env.get("topology") or {}
        t = env.get("torch") or {}
        return {"compute_capability": (gpus[0].get("capability") if gpus else None),
                "topology": ("nvlink" if topo.get("full_nvlink") else "pcie") if topo.get("pairs") else None,
                "world_size": (verdict.measurements or {}).get("world_size"),
                "driver": (gpus[0].get("driver") if gpus else None), "torch": t.get("version"),
                "nccl": (env.get("nccl") or {}).get("torch")}

    def target_host(self) -> dict:
        return {"compute_capability": self.target_arch.rstrip("af"), "topology": self.options.get("topology"),
                "world_size": self.options.get("world_size")}

    def host_matches_target(self, host: dict) -> bool:
        """Whether a runtime verdict's host is the target: same compute capability, topology, world size."""
        want = self.target_host()
        return all(host.get(k) is not None and str(host.get(k)) == str(want[k]) for k in want if want[k] is not None) \
            and host.get("compute_capability") is not None

    def answers(self, backend: str) -> dict:
        """``{"library": Verdict|None, "engine": Verdict|None, "runtime_target": [...], "measured_here":
        [...]}`` for ``backend``: its two static answers, runtime verdicts measured on the target, and
        runtime verdicts measured on another host (shown beside, never as the target's)."""
        names = _runtime_names()
        out: dict = {"library": None, "engine": None, "runtime_target": [], "measured_here": []}
        for v in self.verdicts:
            if v.tier == "static" and v.backend == backend:
                if v.scope == "engine" and not self._of_engine(v):
                    continue
                key = "engine" if v.scope == "engine" else "library"
                if out[key] is None:
                    out[key] = v
            elif v.tier == "runtime":
                static, scope = names.get(v.backend, (v.backend, v.scope or "library"))
                if static != backend and v.backend != backend:
                    continue
                out["runtime_target" if self.host_matches_target(v.host or {}) else "measured_here"].append(v)
        return out

    def backends(self) -> list[str]:
        """Backends in report order; runtime-only rows map onto their static backend."""
        names = _runtime_names()
        seen = []
        for v in self.verdicts:
            if v.tier == "static" and v.scope == "engine" and not self._of_engine(v):
                continue
            b = names.get(v.backend, (v.backend,))[0] if v.tier == "runtime" else v.backend
            if b not in seen:
                seen.append(b)
        return seen

    def verdict(self, backend: str) -> Verdict | None:
        """The headline for ``backend``: a runtime verdict measured on the target host (C20), else the
        engine answer when the backend has one (C18: skipped when SGLang is absent), else the library
        answer."""
        a = self.answers(backend)
        eng = [v for v in a["runtime_target"] if runtime_scope(v) == "engine"]
        lib = [v for v in a["runtime_target"] if runtime_scope(v) != "engine"]
        if eng:
            return eng[0]
        if a["engine"] is not None:      # a library kernel's timing never stands for what SGLang will do
            return a["engine"]
        return (lib[0] if lib else None) or a["library"] or (a["measured_here"][0] if a["measured_here"] else None)

    def package_coverage(self, package: str) -> dict | None:
        return next((c for c in self.coverage if c.get("package") == package), None)

    # --- JSON ------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "schema": self.schema, "suite_version": self.suite_version, "created": self.created, "label": self.label,
            "target_arch": self.target_arch, "tiers": list(self.tiers), "options": self.options,
            "provenance": self.provenance, "environment": self.environment, "coverage": self.coverage,
            "verdicts": [v.to_json() for v in self.verdicts], **self._engine_json(),
        }

    def _engine_json(self) -> dict:
        return {"engines": self.engines, "host": self.host}

    @classmethod
    def from_json(cls, d: dict, name: str = "report") -> "Report":
        """Raises ReportError for a file that is not a report, a newer schema, or a schema-2 report whose engine
        answers cannot be translated (:func:`stackprobe.userwords.translate_v2`)."""
        if not isinstance(d, dict) or "verdicts" not in d or "schema" not in d:
            raise ReportError("not a stackprobe report: it has no 'schema' and 'verdicts' keys")
        if d["schema"] > REPORT_SCHEMA_VERSION:
            raise ReportError(f"report schema {d['schema']} is newer than this suite's {REPORT_SCHEMA_VERSION}: "
                              "upgrade stackprobe to read it")
        if d["schema"] == 2:
            from .userwords import SchemaError, translate_v2
            try:
                d = translate_v2(json.loads(json.dumps(d)), name)
            except SchemaError as e:
                raise ReportError(str(e)) from e
            d.setdefault("options", {})["read_from_schema"] = 2
        if d["schema"] <= 3:
            d = translate_v3(d)
        return cls(target_arch=d["target_arch"], environment=d.get("environment", {}), coverage=d.get("coverage", []),
                   verdicts=[Verdict.from_json(v) for v in d["verdicts"]], tiers=d.get("tiers", ["static"]),
                   options=d.get("options", {}), label=d.get("label", ""), created=d.get("created", ""),
                   schema=d["schema"], suite_version=d.get("suite_version", ""),
                   provenance=d.get("provenance") or {"suite_digest": "unknown (report schema 1)"},
                   engines=d.get("engines") or [], host=d.get("host") or {})

    @classmethod
    def load(cls, path: str | Path) -> "Report":
        try:
            return cls.from_json(json.loads(Path(path).read_text()), str(path))
        except json.JSONDecodeError as e:
            raise ReportError(f"{path} is not JSON: {e}") from e

    def write_json(self, path: str | Path) -> None:
        write_atomic(path, json.dumps(self.to_json(), indent=2, default=str) + "\n")

    # --- Markdown --------------------------------------------------------------------------------
    def headline(self) -> str:
        from .env import nccl_text
        from .health_report import summary as health_summary
        env = self.environment
        t = env.get("torch", {})
        nv = env.get("nvcc", {})
        nvcc = (nv.get("cuda_home_nvcc") or nv.get("path") or (nv.get("pip") or [None])[0] or {}).get("release", "none")
        return (f"target {self.target_arch}; torch {t.get('version', '-')} (CUDA {t.get('cuda') or '-'}); nvcc {nvcc}; "
                f"NCCL {nccl_text(env)}; "
                f"GPUs {len(env.get('gpus', []))}; {driver_line(env.get('driver'))}"
                + (f" ({self.options.get('topology')}, {self.options.get('topology_source', '').split(' (')[0].split(':')[0]})"
                   if self.options.get("topology") else "")
                + (f"; {health_summary(env.get('health'))}" if env.get("health") else ""))

    def to_markdown(self) -> str:  # noqa: C901, PLR0912, PLR0915 - reason: one section per report block, in the order the Markdown shows them
        lines = [f"# stackprobe report{': ' + self.label if self.label else ''}", "",
                 f"{self.headline()}  ", f"tiers: {', '.join(self.tiers)}; created {self.created}; schema {self.schema}  ",
                 f"provenance: {_provenance(self.provenance)}", ""]
        from .summary import block as summary_block
        lines += summary_block(self)   # what a person reads in a minute and pastes into a bug report
        from .health_report import markdown as health_markdown
        lines += health_markdown(self.environment.get("health"))   # first: a broken install must not be missed
        from .host import markdown as host_markdown
        lines += host_markdown(self.host, int(self.options.get("world_size") or 8))   # the box, before any verdict
        from .userwords import headline_line, pins_line
        lines += [f"**What {self._title()} does here**: {headline_line(self)}.", ""]
        for e in self.engines[1:]:
            lines += [f"**What {e.get('title') or e.get('name')} {e.get('version') or ''} does here**: "
                      f"{headline_line(self.engine_view(e['name']))}.", ""]
        if pins_line(self):
            lines += [f"Engine pins: {pins_line(self)}.", ""]
        if (self.options or {}).get("read_from_schema"):
            lines += [f"(read from a schema-{self.options['read_from_schema']} report: statuses translated, see each "
                      "verdict's warnings)", ""]
        ran_in = (self.options or {}).get("ran_in") or {}
        if ran_in.get("hidden") or ran_in.get("env"):     # how the container differed from the image as shipped
            extra = [f"folders hidden: {', '.join(ran_in['hidden'])}" if ran_in.get("hidden") else "",
                     f"environment set: {', '.join(f'{k}={v}' for k, v in ran_in['env'].items())}"
                     if ran_in.get("env") else ""]
            lines += [f"ran with: {'; '.join(e for e in extra if e)}", ""]
        differs = self.host_differs()
        if differs:
            lines += [f"**The host differs from the target**: runtime verdicts here were measured on {differs}; they are "
                      "shown as \"measured here\" beside the target's static verdicts, never as the target's.", ""]
        findings = self.environment.get("findings", [])
        if findings:
            lines += ["## Environment findings", ""]
            lines += [f"- **{f['level']}**{' (' + f['case'] + ')' if f.get('case') else ''}: {f['message']}" for f in findings]
            lines.append("")
        spill = mdtable.Spill()   # what the cells below cannot hold, under one heading per path after the matrix
        roots = self.environment.get("toolkit_roots") or []
        if roots:
            lines += ["## Toolkit roots", "",
                      *mdtable.header(("root", "found by", "nvcc", "CUDART_VERSION", "CUDA wheels", "coherent"))]
            for r in roots:
                wheels = ", ".join(f"{d} {v}" for d, v in (r.get("wheels") or {}).items()) or "-"
                ok = {True: "yes", False: "**no**: " + r.get("problem", ""), None: "- (nothing to compare)"}[r.get("coherent")]
                key = f"toolkit root {r['root']}"
                lines.append(mdtable.row((r["root"], ", ".join(r.get("found_by", [])), r.get("nvcc") or "-",
                                          r.get("cudart") or "-", spill.cell(key, wheels, "CUDA wheels"),
                                          spill.cell(key, ok, "coherent"))))
            lines.append("")
        title = self._title()
        eng = (self.environment.get("packages") or {}).get(self.primary_engine()) or next(
            (e.get("version") for e in self.engines if e.get("name") == self.primary_engine() and e.get("version")), None)
        th = self.target_host()
        lines += [f"## Backends (target {th['compute_capability']}, {th['topology'] or '?'}, world size "
                  f"{th['world_size'] or '?'})", "",
                  "Headline: the engine's answer (" + (f"{title} {eng}" if eng else f"{title} not installed") +
                  ") where the backend has one, else the library's; a runtime verdict replaces it only when measured "
                  "on a host that matches the target.", "",
                  *mdtable.header(("backend", "headline", "library admits the target",
                                   f"{title + ' ' + eng if eng else title} will enable it here", "measured here",
                                   "gate", "cause", "what would lift it"))]
        for b in self.backends():
            v = self.verdict(b)
            a = self.answers(b)
            lift = v.lift + (f": {v.lift_detail}" if v.lift_detail else "")
            here = "; ".join(f"{'SGLang' if runtime_scope(r) == 'engine' else 'library kernel'} {r.backend}: "
                             f"{r.status} ({host_label(r.host or {})})" for r in a["measured_here"] + a["runtime_target"]
                             if r is not v) or "-"
            from .host import risk_phrase
            cause = v.cause + (f" **Host**: {risk_phrase(v)}." if risk_phrase(v) else "")
            lines.append(mdtable.row((b, _status(v), _status(a["library"]), _status(a["engine"]),
                                      spill.cell(b, here, "measured here"), v.gate or "-",
                                      spill.cell(b, cause, "cause"), spill.cell(b, lift, "what would lift it"))))
        lines += dispatch_markdown(self.dispatch, spill)
        from .pathsmd import not_assessed_markdown, per_width_markdown
        lines += per_width_markdown(self.dispatch)
        for e in self.engines[1:]:
            lines += other_engine_markdown(self, e, spill) + per_width_markdown(e.get("dispatch") or {})
        lines += not_assessed_markdown(self, spill)
        lines += ["", "## Arch coverage", "",
                  *mdtable.header(("package", "version", "level", "SASS", "files without the target"))]
        for c in self.coverage:
            sass = sorted({s for f in c.get("files", []) for s in f.get("sass", [])})
            lines.append(mdtable.row((c["package"], c.get("version", ""), c["level"],
                                      mdtable.listed(sass, 8, "architectures").replace(", ", " "),
                                      mdtable.listed(c.get("files_without", []), 3, "files"))))
        notes = []
        for c in self.coverage:
            rows = [f for f in c.get("files", []) if f.get("level") in ("partial", "ptx-only", "same-major", "family")]
            notes += [f"- {c['package']}: {f['path']}: {coverage_note(f)}" for f in rows[:5]]
            if len(rows) > 5:
                notes.append(f"- {c['package']}: {len(rows) - 5} more files (the JSON report lists them)")
        if notes:
            lines += ["", "Which rule applies (CUDA's binary/PTX compatibility):", ""] + notes
        for v in self.verdicts:   # the evidence of every answer, under its path's heading
            if not (v.evidence or v.warnings):
                continue
            who = (f"{v.tier}{', ' + v.scope if v.scope else ''}{', ' + v.engine if v.engine else ''}"
                   f"{', ' + host_label(v.host) if v.tier == 'runtime' and v.host else ''}")
            spill.add(v.backend, f"evidence ({who}; {v.status}{', ' + v.gate if v.gate else ''}):")
            for e in v.evidence:
                spill.add(v.backend, f"  - {e.what}: `{_short_value(e.value)}`" + (f" ({e.source})" if e.source else ""))
            for w in v.warnings:
                spill.add(v.backend, f"  - warning: {w}")
        lines += spill.markdown("Per path: cause, evidence and call chains", PER_PATH_INTRO)
        return "\n".join(lines) + "\n"


    def _title(self) -> str:
        return next((e.get("title") for e in self.engines if e.get("name") == self.primary_engine() and e.get("title")),
                    None) or title_of(self.primary_engine())

    def host_differs(self) -> str:
        """``SM90, nvlink, ws 2`` when runtime verdicts were measured on a host unlike the target, else ""."""
        hosts = {host_label(v.host or {}) for v in self.verdicts
                 if v.tier == "runtime" and not self.host_matches_target(v.host or {})}
        return "; ".join(sorted(hosts))


#: the paragraph under the per-path section's heading
PER_PATH_INTRO = ("One heading per path with more to say than its cells above: the full cause, what would lift it, the "
                  "call chain of the dispatch, and the evidence each answer read (values over 300 characters are cut "
                  "here; the JSON report has them whole). A path whose cells say it all has no heading.")


def other_engine_markdown(report: Report, e: dict, spill: mdtable.Spill | None = None) -> list[str]:
    """A second engine's answers (``## vLLM 0.33.0's answers``): one row per backend it answers for, then its dispatch.
    Long causes and lifts go to ``spill`` (a section of their own after the dispatch when none is given)."""
    own = spill is None
    spill = spill if spill is not None else mdtable.Spill()
    name, title = e.get("name"), e.get("title") or e.get("name")
    rows = [v for v in report.verdicts if v.tier == "static" and v.scope == "engine" and report._of_engine(v, name)]
    lines = ["", f"## {title} {e.get('version') or '(not installed)'}'s answers", "",
             *mdtable.table(("backend", "answer", "gate", "cause", "what would lift it"),
                            ((v.backend, _status(v), v.gate or "-", spill.cell(f"{v.backend} ({title})", v.cause, "cause"),
                              spill.cell(f"{v.backend} ({title})", v.lift + (f": {v.lift_detail}" if v.lift_detail else ""),
                                         "what would lift it")) for v in rows))]
    lines += dispatch_markdown(e.get("dispatch") or {}, spill)
    return lines + (spill.markdown(f"{title}'s answers in full", PER_PATH_INTRO) if own else [])


def dispatch_markdown(d: dict, spill: mdtable.Spill | None = None) -> list[str]:
    """"SGLang's dispatch for a decode allreduce": the flags asked about, step order, the served path and the
    preempted ones (from ``Report.dispatch``); [] without one. A step's long condition or call chain goes to
    ``spill`` under the step's path (a section of its own after the table when none is given)."""
    own = spill is None
    spill = spill if spill is not None else mdtable.Spill()
    if not d:
        return []
    cfg = (d.get("config") or {}).get("describe") or "no flags"
    name = next((n for n in registered() if d.get(n)), DEFAULT)   # the dispatch records its engine's version by name
    who, ver = title_of(name), d.get(name)
    lines = ["", f"## {who}'s dispatch for a decode allreduce ({who.lower()} {ver}, {cfg})", ""]
    if d.get("error"):
        return lines + [f"**error**: {d['error']}"]
    t = d.get("tensor") or {}
    lines += [f"Decode tensor {t.get('dtype')} {t.get('shape')} ({t.get('bytes')} bytes). Serves: **{d.get('serves') or '-'}**"
              + (f"; undecided: {d['undecided']}" if d.get("undecided") else "")
              + ("; preempted: " + ", ".join(f"{k} by {v}" for k, v in d["preempted"].items()) if d.get("preempted") else ""),
              "", *mdtable.table(("#", "step", "built", "per-call admits", "its condition holds", "where"),
                                 ((i, s["backend"], spill.cell(s["backend"], s.get("built", s.get("status", "-")),
                                                               f"{who} dispatch step {i}, built"),
                                   spill.cell(s["backend"], s.get("admits", "-"), f"{who} dispatch step {i}, per-call admits"),
                                   spill.cell(s["backend"], s["claims"], f"{who} dispatch step {i}, its condition holds"),
                                   spill.cell(s["backend"], s["where"], f"{who} dispatch step {i}, where"))
                                  for i, s in enumerate(d.get("steps") or [], 1)))]
    return lines + (spill.markdown(f"{who}'s dispatch in full", PER_PATH_INTRO) if own else [])


def _status(v: Verdict | None) -> str:
    if v is None:
        return "-"
    s = v.status + (f" ({v.gate})" if v.gate and v.status in ("blocked", "skipped") else "")
    risk = (v.host_risk or {}).get("level")
    if risk:   # what the box means for it (stackprobe.host.apply): never hidden behind an open status
        s += {"risk": "; **host: fix first**", "transport": "; over SHM/NET, not P2P", "unassessed": "; host not fully read",
              "unchecked": "; check the host on the target"}.get(risk, "")
    return s + (f" [{v.tier}]" if v.tier != "static" else "")


def _provenance(p: dict) -> str:
    img = p.get("image") or {}
    parts = [f"suite {p.get('suite_digest', '?')}"]
    if img:
        parts.append(f"image {img.get('id', '?')}")
        if img.get("repo_digests"):
            parts.append(f"digest {', '.join(img['repo_digests'])}")
        if img.get("plan_hash"):
            parts.append(f"plan hash {img['plan_hash']}")
        lock = img.get("lock_entry")
        parts.append(f"lock entry {lock['lockfile']}#{lock['node']}" if lock else "lock entry: none matches this image id")
    return "; ".join(parts)


def driver_line(driver: dict | None) -> str:
    """``"driver 580.95.05 (CUDA 13.0)"`` or ``"no driver: static only"``."""
    d = driver or {}
    if not d.get("version"):
        return d.get("none") or "no driver: static only"
    return f"driver {d['version']}" + (f" (CUDA {d['cuda']})" if d.get("cuda") else "")


def coverage_note(f: dict) -> str:
    """One line saying which compatibility rule gives a file its level, with the counts."""
    d, level = f.get("detail") or {}, f.get("level")
    if level == "ptx-only":
        return (f"PTX only ({', '.join(f.get('ptx', []))}, PTX ISA {', '.join(d.get('ptx_isa') or ['?'])}); "
                + (d.get("ptx_needs") or "driver JIT at load"))
    counts = f"{d.get('target')} of {d.get('most')} {d.get('unit', 'fatbins')} ({d.get('most_arch')}: {d.get('most')})"
    if level == "partial":
        return f"partial: SASS for the target in {counts}"
    rule = {"same-major": "plain SASS of the same major, lower minor (runs on a higher minor)",
            "family": "family-specific (f) SASS of the same major"}.get(level, level)
    return f"{rule}; {counts}; by level {d.get('levels')}"


def _short_value(value, limit: int = 300) -> str:
    s = json.dumps(value, default=str) if not isinstance(value, str) else value
    return (s[:limit] + "...") if len(s) > limit else s


# --- comparison ------------------------------------------------------------------------------------
@dataclass
class Change:
    """One backend across reports: ``statuses`` per label, ``changed``, and ``why`` (the gate,
    cause and the evidence values that differ)."""

    backend: str
    statuses: list
    changed: bool
    why: str
    brief: str = ""     # the table cell: each status move and the first evidence value that differs


def _brief(labels: list[str], vs: list, libs: list) -> str:
    """The comparison cell of one path: ``"[<label>: ][library ]<old> -> <new>"`` (the label where more than
    two reports are compared) per answer whose status or gate
    moved, then the first evidence entry whose value differs, e.g. ``"supported majors: [9, 10] -> [9, 10, 12]"``
    (the full cause of each move stays in ``why``)."""
    def st(v) -> str:
        return f"{v.status}{' [' + v.gate + ']' if v.gate else ''}" if v is not None else "absent"

    moves, diff = [], ""
    for prefix, row in (("", vs), ("library ", libs)):
        if row[0] is None and all(v is None for v in row):
            continue
        for i, (label, v) in enumerate(zip(labels[1:], row[1:]), 1):
            if (prefix and v is vs[i]) or st(v) == st(row[0]):
                continue
            moves.append(f"{label + ': ' if len(labels) > 2 else ''}{prefix}{st(row[0])} -> {st(v)}")
        if not diff:
            a, b = _evidence_map(row[0]), _evidence_map(row[-1])
            diff = next((f"{k}: {_short_value(a[k], 60)} -> {_short_value(b[k], 60)}" for k in b
                         if k in a and a[k] != b[k] and "version" not in k.lower()), "")
    return "; ".join(moves + ([diff] if diff else []))


def _evidence_map(v: Verdict | None) -> dict:
    return {e.what: e.value for e in v.evidence} if v else {}


def _why(label: str, first: Verdict | None, v: Verdict | None, changed: bool, prefix: str = "") -> list[str]:
    if v is None:
        return []
    why = []
    if first is None or (v.status, v.gate) != (first.status, first.gate):
        why.append(f"{label}: {prefix}{v.status}{' [' + v.gate + ']' if v.gate else ''}: {v.cause}"
                   + (f" (also: {v.warnings[0]})" if v.warnings else ""))
    a, bmap = _evidence_map(first), _evidence_map(v)
    diffs = [f"{k}: {_short_value(a.get(k), 80)} -> {_short_value(bmap.get(k), 80)}"
             for k in bmap if k in a and a[k] != bmap[k] and "version" not in k.lower()]
    diffs += [f"{k}: {_short_value(a.get(k), 40)} -> {_short_value(bmap.get(k), 80)}"
              for k in bmap if "version" in k.lower() and a.get(k) != bmap.get(k)]
    if diffs and (changed or len(diffs) < 4):
        why.append(prefix + "; ".join(diffs[:4]))
    return why


def compare(reports: list[Report], labels: list[str] | None = None) -> list[Change]:
    """What changed per backend between ``reports`` (first = before, last = after: callers pass them from
    older to newer toolchain): the headline (engine answer where SGLang is installed) and the library answer,
    each compared. ``why`` names the new gate and cause, and evidence entries whose values differ (e.g. the
    module's supported majors); a backend blocked in every report says first why it stays blocked (the last
    report's gate, cause and what would lift it)."""
    labels = labels or [r.label or f"#{i + 1}" for i, r in enumerate(reports)]
    backends: list[str] = []
    for r in reports:
        for b in r.backends():
            if b not in backends:
                backends.append(b)
    out = []
    for b in backends:
        vs = [r.verdict(b) for r in reports]
        libs = [r.answers(b)["library"] for r in reports]
        statuses = [v.status if v else "absent" for v in vs]
        changed = len({(v.status, v.gate) if v else None for v in vs}) > 1
        lib_changed = len({(v.status, v.gate) if v else None for v in libs}) > 1
        why = []
        for label, v, lib, in zip(labels[1:], vs[1:], libs[1:]):
            why += _why(label, vs[0], v, changed)
            if lib is not None and lib is not v and (lib_changed or not why):
                why += _why(label, libs[0], lib, lib_changed, prefix="library ")
        present = [v for v in vs if v is not None]
        if len(present) > 1 and all(v.status == "blocked" for v in present):
            # blocked everywhere: say why it stays blocked in the last (newest) report, before what differs
            last = present[-1]
            lift = last.lift_detail or last.lift
            why.insert(0, f"still blocked{' [' + last.gate + ']' if last.gate else ''}: {last.cause}"
                       + (f" (what would lift it: {lift})" if lift else ""))
        if not why and vs[0] is not None:
            why.append(f"{vs[0].gate or 'no gate'}: {vs[0].cause}")
        out.append(Change(b, statuses, changed or lib_changed, " | ".join(why),
                          _brief(labels, vs, libs) if changed or lib_changed else ""))
    return out


def comparison_markdown(reports: list[Report], labels: list[str] | None = None) -> str:
    """The comparison matrix: one row per backend, one status column per report, and why."""
    labels = labels or [r.label or f"#{i + 1}" for i, r in enumerate(reports)]
    lines = []
    digests = {r.provenance.get("suite_digest") for r in reports}
    if len(digests) > 1:
        lines += [f"> **warning**: these reports were made by different suites ({', '.join(sorted(map(str, digests)))}); "
                  "a verdict may differ because the suite changed, not the image.", ""]
    from .health_report import comparison as health_comparison
    lines += health_comparison(reports, labels)
    from .userwords import cuda_tie, headline_line, moved_by, pins_line
    lines += ["## What each image gives a user", ""]
    lines += [f"- **{lab}**: {headline_line(r)}." + (f" Pins: {pins_line(r)}." if pins_line(r) else "")
              for lab, r in zip(labels, reports)]
    moves = [(c.backend, moved_by(reports[0], reports[-1], c.backend)) for c in compare(reports, labels) if c.changed]
    moves = [(b, m) for b, m in moves if m]
    if moves:
        lines += ["", f"Which release moved which verdict ({labels[0]} -> {labels[-1]}):", ""]
        lines += [f"- {b}: {m}" for b, m in moves]
    if len(reports) > 1 and cuda_tie(reports[0], reports[-1]):
        lines += ["", f"Why: {cuda_tie(reports[0], reports[-1])}."]
    lines += [""]
    spill = mdtable.Spill()   # the why of each path in full, under its own heading after the tables
    lines += mdtable.header(("backend", *labels, "changed", "why"))
    for c in compare(reports, labels):
        cells = []
        for lab, r, st in zip(labels, reports, c.statuses):
            a = r.answers(c.backend)
            both = f"library {_status(a['library'])}; engine {_status(a['engine'])}" if a["engine"] else ""
            here = "; ".join(f"measured here ({host_label(x.host or {})}): {x.status}" for x in a["measured_here"])
            cells.append(spill.cell(c.backend, "; ".join(x for x in (f"**{st}**", both, here) if x), lab))
        # the cell: what moved and the first value that differs; every part of the why in full below
        why = spill.cell(c.backend, c.brief or c.why.split(" | ")[0], "why")
        for part in c.why.split(" | ")[1 - bool(c.brief):]:
            spill.add(c.backend, part)
        why += " (more below)" if (c.brief or " | " in c.why) and not why.endswith("below)") else ""
        lines.append(mdtable.row((c.backend, *cells, "yes" if c.changed else "no", why)))
    lines += ["", *mdtable.header(("environment", *labels))]
    lines.append(mdtable.row(("stack", *(spill.cell("stack", r.headline(), lab) for lab, r in zip(labels, reports)))))
    lines.append(mdtable.row(("provenance", *(spill.cell("provenance", _provenance(r.provenance), lab)
                                              for lab, r in zip(labels, reports)))))
    lines.append(mdtable.row(("findings", *(spill.cell("findings", "; ".join(
        f"{f['level']}{' ' + f['case'] if f.get('case') else ''}: {f['message']}"
        for f in r.environment.get("findings", [])) or "-", lab) for lab, r in zip(labels, reports)))))
    pk = sorted({c["package"] for r in reports for c in r.coverage})
    for p in pk:
        cells = []
        for r in reports:
            c = r.package_coverage(p)
            cells.append(f"{c['version']}: {c['level']}" if c else "-")
        lines.append(mdtable.row((f"coverage {p}", *cells)))
    lines += spill.markdown("Per path and row, in full", "One heading per path or row whose cells above were cut or "
                            "whose why has more parts: the whole text, per image.")
    return "\n".join(lines) + "\n"
