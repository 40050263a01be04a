"""The report: a versioned JSON record, a Markdown matrix, and the comparison of two reports.

JSON layout (``schema`` = :data:`stackprobe.REPORT_SCHEMA_VERSION`)::

    {"schema": 1, "suite_version": "0.1.0", "created": "2026-...Z", "label": "...",
     "target_arch": "12.0", "tiers": ["static"], "options": {...},
     "environment": {...env.collect()...},
     "coverage": [PackageCoverage.to_json(), ...],
     "verdicts": [Verdict.to_json(), ...]}

The runtime tier adds verdicts with ``tier = "runtime"`` through :meth:`Report.add` and appends
"runtime" to ``tiers``; :meth:`Report.verdict` prefers a runtime verdict over a static one.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import REPORT_SCHEMA_VERSION, __version__
from .atomic import write_atomic
from .verdict import Verdict


class ReportError(ValueError):
    """A report file that is not a stackprobe report or has an unknown schema."""


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

    # --- access ----------------------------------------------------------------------------------
    def add(self, verdict: Verdict) -> None:
        """Add a verdict (the runtime tier calls this; it also records its tier in ``tiers``)."""
        self.verdicts.append(verdict)
        if verdict.tier not in self.tiers:
            self.tiers.append(verdict.tier)

    def backends(self) -> list[str]:
        seen = []
        for v in self.verdicts:
            if v.backend not in seen:
                seen.append(v.backend)
        return seen

    def verdict(self, backend: str) -> Verdict | None:
        """The verdict that counts for ``backend``: the runtime one when present, else the static one."""
        cands = [v for v in self.verdicts if v.backend == backend]
        for v in cands:
            if v.tier == "runtime":
                return v
        return cands[0] if cands else None

    def package_coverage(self, package: str) -> dict | None:
        return next((c for c in self.coverage if c.get("package") == package), None)

    # --- JSON ------------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "schema": self.schema, "suite_version": self.suite_version, "created": self.created, "label": self.label,
            "target_arch": self.target_arch, "tiers": list(self.tiers), "options": self.options,
            "environment": self.environment, "coverage": self.coverage,
            "verdicts": [v.to_json() for v in self.verdicts],
        }

    @classmethod
    def from_json(cls, d: dict) -> "Report":
        if not isinstance(d, dict) or "verdicts" not in d or "schema" not in d:
            raise ReportError("not a stackprobe report: it has no 'schema' and 'verdicts' keys")
        if d["schema"] > REPORT_SCHEMA_VERSION:
            raise ReportError(f"report schema {d['schema']} is newer than this suite's {REPORT_SCHEMA_VERSION}: "
                              "upgrade stackprobe to read it")
        return cls(target_arch=d["target_arch"], environment=d.get("environment", {}), coverage=d.get("coverage", []),
                   verdicts=[Verdict.from_json(v) for v in d["verdicts"]], tiers=d.get("tiers", ["static"]),
                   options=d.get("options", {}), label=d.get("label", ""), created=d.get("created", ""),
                   schema=d["schema"], suite_version=d.get("suite_version", ""))

    @classmethod
    def load(cls, path: str | Path) -> "Report":
        try:
            return cls.from_json(json.loads(Path(path).read_text()))
        except json.JSONDecodeError as e:
            raise ReportError(f"{path} is not JSON: {e}") from e

    def write_json(self, path: str | Path) -> None:
        write_atomic(path, json.dumps(self.to_json(), indent=2, default=str) + "\n")

    def write_markdown(self, path: str | Path) -> None:
        write_atomic(path, self.to_markdown())

    # --- Markdown --------------------------------------------------------------------------------
    def headline(self) -> str:
        env = self.environment
        t = env.get("torch", {})
        nv = env.get("nvcc", {})
        nvcc = (nv.get("cuda_home_nvcc") or nv.get("path") or (nv.get("pip") or [None])[0] or {}).get("release", "none")
        return (f"target {self.target_arch}; torch {t.get('version', '-')} (CUDA {t.get('cuda') or '-'}); nvcc {nvcc}; "
                f"NCCL {env.get('nccl', {}).get('torch') or env.get('nccl', {}).get('wheel') or '-'}; "
                f"GPUs {len(env.get('gpus', []))}; {driver_line(env.get('driver'))}"
                + (f" ({self.options.get('topology')}, {self.options.get('topology_source', '').split(' (')[0].split(':')[0]})"
                   if self.options.get("topology") else ""))

    def to_markdown(self) -> str:
        lines = [f"# stackprobe report{': ' + self.label if self.label else ''}", "",
                 f"{self.headline()}  ", f"tiers: {', '.join(self.tiers)}; created {self.created}; schema {self.schema}", ""]
        findings = self.environment.get("findings", [])
        if findings:
            lines += ["## Environment findings", ""]
            lines += [f"- **{f['level']}**{' (' + f['case'] + ')' if f.get('case') else ''}: {f['message']}" for f in findings]
            lines.append("")
        roots = self.environment.get("toolkit_roots") or []
        if roots:
            lines += ["## Toolkit roots", "", "| root | found by | nvcc | CUDART_VERSION | CUDA wheels | coherent |",
                      "| --- | --- | --- | --- | --- | --- |"]
            for r in roots:
                wheels = ", ".join(f"{d} {v}" for d, v in (r.get("wheels") or {}).items()) or "-"
                ok = {True: "yes", False: "**no**: " + r.get("problem", ""), None: "- (nothing to compare)"}[r.get("coherent")]
                lines.append(f"| {r['root']} | {', '.join(r.get('found_by', []))} | {r.get('nvcc') or '-'} | "
                             f"{r.get('cudart') or '-'} | {_cell(wheels)} | {_cell(ok)} |")
            lines.append("")
        lines += ["## Backends", "", "| backend | status | gate | cause | what would lift it |", "| --- | --- | --- | --- | --- |"]
        for b in self.backends():
            v = self.verdict(b)
            lift = v.lift + (f": {v.lift_detail}" if v.lift_detail else "")
            lines.append(f"| {b} | {v.status}{' (' + v.tier + ')' if v.tier != 'static' else ''} | {v.gate or '-'} | "
                         f"{_cell(v.cause)} | {_cell(lift)} |")
        lines += ["", "## Arch coverage", "", "| package | version | level | SASS | files without the target |",
                  "| --- | --- | --- | --- | --- |"]
        for c in self.coverage:
            sass = sorted({s for f in c.get("files", []) for s in f.get("sass", [])})
            lines.append(f"| {c['package']} | {c.get('version', '')} | {c['level']} | {' '.join(sass) or '-'} | "
                         f"{_cell(', '.join(c.get('files_without', [])) or '-')} |")
        notes = []
        for c in self.coverage:
            rows = [f for f in c.get("files", []) if f.get("level") in ("partial", "ptx-only", "same-major", "family")]
            notes += [f"- {c['package']}: {f['path']}: {coverage_note(f)}" for f in rows[:5]]
            if len(rows) > 5:
                notes.append(f"- {c['package']}: {len(rows) - 5} more files (the JSON report lists them)")
        if notes:
            lines += ["", "Which rule applies (CUDA's binary/PTX compatibility):", ""] + notes
        lines += ["", "## Evidence", ""]
        for v in self.verdicts:
            lines.append(f"### {v.backend} ({v.tier})")
            for e in v.evidence:
                lines.append(f"- {e.what}: `{_short_value(e.value)}`" + (f" ({e.source})" if e.source else ""))
            for w in v.warnings:
                lines.append(f"- warning: {w}")
            lines.append("")
        return "\n".join(lines)


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


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


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


def _evidence_map(v: Verdict | None) -> dict:
    return {e.what: e.value for e in v.evidence} if v else {}


def compare(reports: list[Report], labels: list[str] | None = None) -> list[Change]:
    """What changed per backend between ``reports`` (first = before, last = after: callers pass them from
    older to newer toolchain). ``why`` names the new gate and cause, and evidence entries whose values
    differ (e.g. the module's supported majors); a backend blocked in every report says first why it stays
    blocked (the last report's gate, cause and what would lift it)."""
    labels = labels or [r.label or f"#{i + 1}" for i, r in enumerate(reports)]
    backends: list[str] = []
    for r in reports:
        for b in r.backends():
            if b not in backends:
                backends.append(b)
    out = []
    for b in backends:
        vs = [r.verdict(b) for r in reports]
        statuses = [v.status if v else "absent" for v in vs]
        changed = len({(v.status, v.gate) if v else None for v in vs}) > 1
        why = []
        first = vs[0]
        for label, v in zip(labels[1:], vs[1:]):
            if v is None:
                continue
            if first is None or (v.status, v.gate) != (first.status, first.gate):
                why.append(f"{label}: {v.status}{' [' + v.gate + ']' if v.gate else ''}: {v.cause}"
                           + (f" (also: {v.warnings[0]})" if v.warnings else ""))
            a, bmap = _evidence_map(first), _evidence_map(v)
            diffs = [f"{k}: {_short_value(a.get(k), 80)} -> {_short_value(bmap.get(k), 80)}"
                     for k in bmap if k in a and a[k] != bmap[k] and "version" not in k.lower()]
            diffs += [f"{k}: {_short_value(a.get(k), 40)} -> {_short_value(bmap.get(k), 80)}"
                      for k in bmap if "version" in k.lower() and a.get(k) != bmap.get(k)]
            if diffs and (changed or len(diffs) < 4):
                why.append("; ".join(diffs[:4]))
        present = [v for v in vs if v is not None]
        if len(present) > 1 and all(v.status == "blocked" for v in present):
            # blocked everywhere: say why it stays blocked in the last (newest) report, before what differs
            last = present[-1]
            lift = last.lift_detail or last.lift
            why.insert(0, f"still blocked{' [' + last.gate + ']' if last.gate else ''}: {last.cause}"
                       + (f" (what would lift it: {lift})" if lift else ""))
        if not why and first is not None:
            why.append(f"{first.gate or 'no gate'}: {first.cause}")
        out.append(Change(b, statuses, changed, " | ".join(why)))
    return out


def comparison_markdown(reports: list[Report], labels: list[str] | None = None) -> str:
    """The comparison matrix: one row per backend, one status column per report, and why."""
    labels = labels or [r.label or f"#{i + 1}" for i, r in enumerate(reports)]
    lines = ["| backend | " + " | ".join(labels) + " | changed | why |",
             "| --- | " + " | ".join("---" for _ in labels) + " | --- | --- |"]
    for c in compare(reports, labels):
        lines.append(f"| {c.backend} | " + " | ".join(c.statuses) + f" | {'yes' if c.changed else 'no'} | {_cell(c.why)} |")
    lines += ["", "| environment | " + " | ".join(labels) + " |", "| --- | " + " | ".join("---" for _ in labels) + " |"]
    lines.append("| stack | " + " | ".join(_cell(r.headline()) for r in reports) + " |")
    lines.append("| findings | " + " | ".join(
        _cell("; ".join(f"{f['level']}{' ' + f['case'] if f.get('case') else ''}: {f['message']}"
                        for f in r.environment.get("findings", [])) or "-") for r in reports) + " |")
    pk = sorted({c["package"] for r in reports for c in r.coverage})
    for p in pk:
        cells = []
        for r in reports:
            c = r.package_coverage(p)
            cells.append(f"{c['version']}: {c['level']}" if c else "-")
        lines.append(f"| coverage {p} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
