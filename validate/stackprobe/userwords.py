"""The answer in a user's words: the headline per image, what an upgrade moved and why, and reading older
reports (stdlib only).

* :func:`headline` / :func:`headline_line`: per report, from its engine answers (``scope`` "engine", static, for
  the target): ``with no flags: <path a decode allreduce takes>; opt-in, worth measuring on the target: <path>
  (<setting>) [upstream's claim: ...]; do not set: <setting> (start-up failure)``, then ``falls back if set``,
  ``preempted`` and ``on as configured`` where present. Upstream's figures appear only as evidence labelled
  "upstream's claim" (file:line), never as the suite's measurement.
* :func:`engine_pins`: sglang's own ``Requires-Dist`` pins on torch, sglang-kernel / sgl-kernel and
  flashinfer-python (installed distribution metadata) and the CUDA build of the torch installed: why an sglang
  upgrade is tied to a CUDA major.
* :func:`moved_by`: which release moved a verdict between two reports (sglang, flashinfer-python, the CUDA
  toolkit), from the gate that decides it and the versions each report records.
* :func:`translate_v2`: a schema-2 report's verdicts in schema-3 statuses (:data:`stackprobe.REPORT_SCHEMA_VERSION`),
  or :class:`SchemaError` when a verdict cannot be translated without guessing.
"""
from __future__ import annotations

import re

from .verdict import (BLOCKED, FALLS_BACK, GATE_PASSES, GATE_SETTING, NOT_INSTALLED, NOT_INTEGRATED, ON_AS_CONFIGURED,
                      ON_BY_DEFAULT, OPT_IN, PREEMPTED, STARTUP_FAILURE, Verdict)

PIN_DISTS = ("torch", "sglang-kernel", "sgl-kernel", "flashinfer-python", "flashinfer_python")
DISPATCH = "TP allreduce dispatch: the path a decode-step allreduce takes"
NCCL = "NCCL (pynccl)"


def _ev(v: Verdict, prefix: str):
    return next((e for e in v.evidence if e.what.startswith(prefix)), None)


def _setting(v: Verdict) -> str:
    e = _ev(v, "user setting")
    return str(e.value) if e is not None else (v.lift_detail.split(";")[0] if v.lift_detail else "")


def upstream_claim(v: Verdict) -> str:
    """``upstream's claim (FILE:LINES): 12 KiB: FlashInfer 5.3 us, NCCL 205.1 us`` from the first evidence labelled
    upstream's claim (its first row against its header), else ""."""
    e = _ev(v, "upstream's claim")
    if e is None or not isinstance(e.value, dict) or not e.value.get("rows"):
        return ""
    head, row = e.value.get("header") or [], e.value["rows"][0]
    cells = ", ".join(f"{h} {c}" for h, c in zip(head[1:], row[1:]))
    return f"upstream's claim ({e.source.split(' (')[0]}), not measured here: {row[0]}: {cells}"


def _engine_answers(report) -> list[Verdict]:
    out = []
    for b in report.backends():
        v = report.answers(b)["engine"]
        if v is not None:
            out.append(v)
    return out


def _engine_version(report) -> str:
    """The installed version of the report's primary engine ("" when it is not installed: then its rows are
    "not installed" skips, and no headline may speak for it)."""
    name = report.primary_engine() if hasattr(report, "primary_engine") else "sglang"
    ver = ((report.environment or {}).get("packages") or {}).get(name)
    return str(ver or next((e.get("version") for e in getattr(report, "engines", None) or []
                            if e.get("name") == name and e.get("version")), "") or "")


def headline(report) -> dict:
    """``{"config": "no flags" | the flags, "serves": path, "opt_in": [...], "do_not_set": [...], "falls_back":
    [...], "preempted": [...], "on": [...]}`` (each entry one phrase) from ``report``'s engine answers."""
    cfg = ((report.options or {}).get("server_config") or {}).get("describe") or "no flags"
    eng = _engine_answers(report)
    # the dispatch walk's own answer first (Report.dispatch, the section below the headline), so the two never
    # disagree; a verdict's dispatch evidence where a report has no walk (schema 2, or a probe run alone)
    walked = str((getattr(report, "dispatch", None) or {}).get("serves") or "")
    serves = "" if walked in ("", "nccl-ring") else walked
    for v in eng if not walked else ():
        e = _ev(v, DISPATCH)
        if e is not None and e.value:
            serves = str(e.value)
            break
    on = [v for v in eng if v.status in (ON_BY_DEFAULT, ON_AS_CONFIGURED)]
    if not serves:
        serves = ", ".join(v.backend for v in on) or f"{NCCL}: no other path is on and admitted"
    out = {"config": cfg, "serves": serves, "opt_in": [], "do_not_set": [], "falls_back": [], "preempted": [],
           "on": [f"{v.backend} ({v.status})" for v in on], "engine": bool(eng) and bool(_engine_version(report))}
    for v in eng:
        if v.status == OPT_IN:
            claim = upstream_claim(v)
            out["opt_in"].append(f"{v.backend} ({_setting(v)})" + (f" [{claim}]" if claim else ""))
        elif v.status == STARTUP_FAILURE:
            out["do_not_set"].append(f"{_setting(v) or v.backend} ({v.backend}: start-up failure)")
        elif v.status == FALLS_BACK:
            out["falls_back"].append(f"{_setting(v) or v.backend} ({v.backend})")
        elif v.status == PREEMPTED:
            out["preempted"].append(f"{v.backend} ({v.cause.split(': ', 2)[1] if ': ' in v.cause else v.cause})")
    return out


def headline_line(report) -> str:
    """The headline as one sentence (see the module docstring)."""
    h = headline(report)
    if not h["engine"]:
        title = report._title() if hasattr(report, "_title") else "SGLang"
        return (f"no serving engine answer ({title} is not installed here): nothing below says what a server would "
                "do; the library answers say what could work")
    parts = [f"with {h['config']}: a decode-step allreduce takes {h['serves']}"]
    if h["opt_in"]:
        parts.append("opt-in, worth measuring on the target: " + "; ".join(h["opt_in"]))
    if h["do_not_set"]:
        parts.append("do not set: " + "; ".join(h["do_not_set"]))
    if h["falls_back"]:
        # the declined tensor goes on down the dispatch to what serves it with the flags asked about
        to = "NCCL" if h["serves"].startswith(("NCCL", "nccl-ring")) else h["serves"]
        parts.append(f"accepted but falls back to {to} if set (no gain): " + "; ".join(h["falls_back"]))
    if h["preempted"]:
        parts.append("preempted: " + "; ".join(h["preempted"]))
    return "; ".join(parts)


def engine_pins(environment: dict) -> dict:
    """sglang's own pins read from its installed ``Requires-Dist`` (unconditional entries naming
    :data:`PIN_DISTS`) and the CUDA version of the installed torch build: ``{"sglang": version or None,
    "requires": {name: requirement}, "torch": version, "torch_cuda": "13.0" | None}``."""
    from .gates import requirements

    pkgs = environment.get("packages") or {}
    reqs = {name: text for name, text in requirements("sglang") if name.lower().replace("_", "-") in
            {d.replace("_", "-") for d in PIN_DISTS}}
    t = environment.get("torch") or {}
    return {"sglang": pkgs.get("sglang"), "requires": reqs, "torch": t.get("version"), "torch_cuda": t.get("cuda")}


def pins_line(report) -> str:
    """``sglang 0.5.23 requires torch==2.14.1, sglang-kernel==0.4.10, flashinfer_python[cu13]==0.7.2 (Requires-Dist);
    torch 2.14.1 here is built for CUDA 13.0`` or "" without sglang."""
    p = (report.environment or {}).get("engine_pins") or {}
    if not p.get("sglang"):
        return ""
    reqs = ", ".join(p.get("requires", {}).values()) or "no torch / kernel pins"
    cuda = f"torch {p.get('torch') or '?'} here is built for CUDA {p['torch_cuda']}" if p.get("torch_cuda") else \
        f"torch {p.get('torch') or '?'} here has no CUDA build"
    return f"sglang {p['sglang']} requires {reqs} (its Requires-Dist); {cuda}"


def cuda_tie(before, after) -> str:
    """Why moving from ``before`` to ``after`` ties the stack to a CUDA major: the newer sglang's own pins (a
    ``[cuXY]`` extra, its exact torch) and the CUDA build of the torch installed beside it; "" when the newer
    report has no sglang pins."""
    p = (after.environment or {}).get("engine_pins") or {}
    if not p.get("sglang"):
        return ""
    reqs = p.get("requires") or {}
    cu = [r for r in reqs.values() if re.search(r"\[cu\d+\]", r)]
    torch_req = next((r for n, r in reqs.items() if n == "torch"), "")
    old = ((before.environment or {}).get("engine_pins") or {})
    built = (f"torch {p.get('torch')} beside it is built for CUDA {p['torch_cuda']}" if p.get("torch_cuda")
             else f"the torch here ({p.get('torch') or 'none'}) has no CUDA build to confirm it")
    majors = sorted({m for r in cu for m in re.findall(r"\[cu(\d\d)", r)})
    major = f"CUDA {majors[0][:2]}" if majors else (f"CUDA {str(p['torch_cuda']).split('.')[0]}" if p.get("torch_cuda")
                                                    else "its CUDA build")
    was = f" (sglang {old['sglang']} pinned {', '.join((old.get('requires') or {}).values())})" if old.get("sglang") else ""
    return (f"the upgrade is tied to {major}: sglang {p['sglang']} pins {', '.join(x for x in [torch_req] + cu if x) or 'nothing'} "
            f"(its Requires-Dist){was}; {built}")


def _versions(report) -> dict:
    env = report.environment or {}
    pk = env.get("packages") or {}
    nv = env.get("nvcc") or {}
    nvcc = (nv.get("cuda_home_nvcc") or nv.get("path") or (nv.get("pip") or [None])[0] or {}).get("release")
    return {"sglang": pk.get("sglang"), "flashinfer-python": pk.get("flashinfer-python") or pk.get("flashinfer_python"),
            "CUDA toolkit": nvcc or (env.get("torch") or {}).get("cuda")}


def _decider(v: Verdict | None) -> str:
    """Which package a verdict's deciding gate belongs to: "sglang" (engine gates, sources under sglang/),
    "flashinfer-python" (library gates under flashinfer/), "CUDA toolkit" (toolchain, compiled-binary), else ""."""
    if v is None:
        return ""
    if v.gate in ("toolchain", "compiled-binary", "driver"):
        return "CUDA toolkit"
    if v.scope == "engine" or "SGLang" in v.cause or "sglang/" in v.cause:
        return "sglang"
    if "FlashInfer" in v.cause or "flashinfer" in v.cause.lower():
        return "flashinfer-python"
    return ""


def moved_by(before, after, backend: str) -> str:
    """``sglang 0.5.9 -> 0.5.23 (its gate)`` for a verdict whose status moved between ``before`` and ``after``
    (Reports), naming the release whose gate decides the new verdict (or the old one) and, beside it, every other
    component whose version also moved; "" when nothing moved or no version differs."""
    a, b = before.verdict(backend), after.verdict(backend)
    if a is not None and b is not None and (a.status, a.gate) == (b.status, b.gate):
        return ""
    va, vb = _versions(before), _versions(after)
    moved = {k: (va[k], vb[k]) for k in va if va[k] != vb[k]}
    if not moved:
        return ""
    lead = _decider(b) or _decider(a)
    order = ([lead] if lead in moved else []) + [k for k in moved if k != lead]
    first = order[0]
    text = f"{first} {moved[first][0] or 'absent'} -> {moved[first][1] or 'absent'}"
    if first == lead:
        text += " (its gate decides)"
    others = [f"{k} {moved[k][0] or 'absent'} -> {moved[k][1] or 'absent'}" for k in order[1:]]
    return text + (f"; also moved: {', '.join(others)}" if others else "")


# --- older reports -----------------------------------------------------------------------------------
class SchemaError(ValueError):
    """A report of an older schema whose verdicts cannot be read in this schema's words without guessing."""


def _v2_opt_in_only(d: dict) -> bool:
    """A schema-2 engine verdict ``blocked (setting)`` whose only closed gates are off-by-default opt-ins: its
    evidence has ``engine gate:`` entries, every closed one reading "off by default" or an ``opt-in`` gate."""
    closed = [e for e in d.get("evidence", []) if e.get("what", "").startswith("engine gate:")
              and isinstance(e.get("value"), dict) and e["value"].get("admits") is False]
    if not closed:
        return False
    return all("off by default" in str(e["value"].get("value")) or e["what"].startswith("engine gate: opt-in")
               or (isinstance(e["value"].get("value"), dict) and e["value"]["value"].get("default") is False)
               for e in closed)


def translate_v2(d: dict, name: str = "report") -> dict:
    """Schema-2 verdict dicts of report ``d`` (``d["verdicts"]``) in schema-3 statuses, in place; returns ``d``.
    Engine answers only (library and runtime statuses did not change): ``gate-passes`` -> ``on-by-default``
    (schema 2 read every off-by-default flag as closed, so an engine pass had none); ``blocked (not-integrated)``
    -> ``not-integrated``; ``blocked (not-installed)`` -> ``not-installed``; ``blocked (setting)`` whose only
    closed gates are opt-ins -> ``opt-in``. A ``blocked`` engine answer of another kind stays ``blocked`` with a
    warning: schema 2 did not tell a start-up failure from a quiet fallback. Raises :class:`SchemaError` for a
    ``blocked (setting)`` engine answer whose evidence does not show its opt-in (it would be a guess)."""
    for v in d.get("verdicts", []):
        if v.get("scope") != "engine" or v.get("tier", "static") != "static":
            continue
        old = f"{v['status']}{' (' + v['gate'] + ')' if v.get('gate') else ''}"
        new = None
        if v["status"] == GATE_PASSES:
            new = ON_BY_DEFAULT
        elif v["status"] == BLOCKED and v.get("gate") == "not-integrated":
            new = NOT_INTEGRATED
        elif v["status"] == BLOCKED and v.get("gate") == "not-installed":
            new = NOT_INSTALLED
        elif v["status"] == BLOCKED and v.get("gate") == GATE_SETTING:
            if not _v2_opt_in_only(d=v):
                raise SchemaError(
                    f"{name} is a schema-2 report whose engine answer for {v['backend']} reads 'blocked (setting)' "
                    "without the gate evidence that says which flag or variable it waits for; schema 3 tells an "
                    "opt-in from a setting that breaks start-up, and this one cannot be told without guessing. "
                    "Re-run the suite (schema 3) on that image and compare the new report.")
            new = OPT_IN
        if new is not None:
            v["status"] = new
        v.setdefault("warnings", []).append(
            f"read from a schema-2 report: {old}" + (f" -> {new}" if new else
                                                    " (schema 2 did not tell a start-up failure from a fallback)"))
    return d


def status_word(v: Verdict | None) -> str:
    """A verdict's status with its gate kind where the kind matters to a user (blocked, skipped)."""
    if v is None:
        return "-"
    return v.status + (f" ({v.gate})" if v.gate and v.status in (BLOCKED, "skipped") else "")

