"""The answer in a user's words: the headline per image, what an upgrade moved and why, and reading older
reports (stdlib only).

* :func:`headline` / :func:`headline_line`: per report, from its engine answers (``scope`` "engine", static, for
  the target): ``with no flags: <path a decode allreduce takes>; opt-in, worth measuring on the target: <path>
  (<setting>) [upstream's claim: ...]; do not set: <setting> (start-up failure)``, then ``falls back if set``,
  ``preempted`` and ``on as configured`` where present. Upstream's figures appear only as evidence labelled
  "upstream's claim" (file:line), never as the suite's measurement. Each engine answer is combined with the same
  backend's library answer (an opt-in whose library is blocked here is not worth measuring); a path that is not a
  decode allreduce (an MoE all-to-all) gets its own part; an engine answer that is ``error`` or ``not-assessed``
  is listed as not assessed, never dropped.
* :func:`engine_pins`: sglang's own ``Requires-Dist`` pins on torch, sglang-kernel / sgl-kernel and
  flashinfer-python (installed distribution metadata) and the CUDA build of the torch installed: why an sglang
  upgrade is tied to a CUDA major.
* :func:`moved_by`: which release moved a verdict between two reports (the serving engine that answers, sglang or
  vllm; flashinfer-python; the CUDA toolkit), from the gate that decides it and the versions each report records.
* :func:`translate_v2`: a schema-2 report's verdicts in schema-3 statuses (:data:`stackprobe.REPORT_SCHEMA_VERSION`),
  or :class:`SchemaError` when a verdict cannot be translated without guessing.
"""
from __future__ import annotations

import re
from typing import Any

from .engines import DEFAULT, registered, title_of
from .verdict import (BLOCKED, ERROR, FALLS_BACK, GATE_NEEDS_RUNTIME, GATE_PASSES, GATE_SETTING, NOT_ASSESSED,
                      NOT_INSTALLED, NOT_INTEGRATED, ON_AS_CONFIGURED, ON_BY_DEFAULT, OPT_IN, PREEMPTED, SKIPPED,
                      STARTUP_FAILURE, Verdict, unassessed_entry)

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
    at, mine = e.value.get("hidden"), e.value.get("workload_hidden")
    shape = (f", measured at hidden {at}" + (f", not the workload's {mine}" if mine and mine != at else "")) if at else ""
    return f"upstream's claim ({e.source.split(' (')[0]}), not measured here: {row[0]}: {cells}{shape}"


def avoid_items(report, v: Verdict) -> list[str]:
    """``["--enable-symm-mem (nccl-symm-mem serves instead)", "VLLM_USE_NCCL_SYMM_MEM=1 (nccl-symm-mem serves instead
    at 1 and 10-512 rows, ...)"]``: the settings that take ``v``'s path away once it is on, from the answer's "do not set
    with it" evidence (:func:`stackprobe.probes.pcie_ipc_engine.do_not_set`, vLLM's ``_pcie_ipc``) and from every
    other path whose per-width answer (:func:`width_change`) claims decode widths this path serves. A setting whose
    effect was not assessed (no path read takes the tensor: ``"then": ""``) is not here but in :func:`unassessed_items`."""
    e = _ev(v, "do not set with it")
    out = [f"{a['setting']} ({a['then']} serves instead" + (f": {a['why']}, {a['where']}" if a.get("why") else "")
           + ")" for a in ((e.value if e is not None else None) or []) if not _unassessed(a)]
    for other in _engine_answers(report) if report is not None else ():
        ch = width_change(report, other, against=v.backend)
        if ch:
            out.append(f"{_setting(other) or other.backend} ({other.backend} serves instead at {ch['rows']} rows, "
                       f"{ch['changed']} of {ch['captured']} captured decode widths; {ch['where']})")
    return out


_unassessed = unassessed_entry   # stackprobe.verdict.unassessed_entry (the probes use it too)


def unassessed_items(report, v: Verdict) -> list[str]:
    """``["--enable-mscclpp with flashinfer-pcie-ipc-allreduce on (not assessed: with it set the dispatch is undecided
    (...) and no step read here takes the tensor instead)"]``: the settings of ``v``'s "do not set with it" evidence
    whose effect the dispatch read could not decide (:func:`stackprobe.probes.pcie_ipc_engine.do_not_set` keeps them
    with ``"then": ""`` and a ``not assessed:`` note), so the headline lists them as not assessed instead of dropping
    them or telling the user to leave them unset."""
    e = _ev(v, "do not set with it")
    return [f"what takes {v.backend} away once on (not assessed: {a['then']})" if a.get("setting") == "not assessed"
            else f"{a['setting']} with {v.backend} on ({a['note']})"
            for a in ((e.value if e is not None else None) or []) if _unassessed(a)]


def _avoid(report, v: Verdict) -> str:
    """``; do not set with it: A, B`` from :func:`avoid_items`, else ""."""
    items = avoid_items(report, v)
    return "; do not set with it: " + ", ".join(items) if items else ""


def _row_ranges(rows: list[int]) -> str:
    """``1 and 10-512`` for rows [1, 10, 11, ..., 512]."""
    out: list[list[int]] = []
    for r in sorted(rows):
        if out and out[-1][1] == r - 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return " and ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


def width_change(report, v: Verdict, against: str = "") -> dict | None:
    """What setting ``v``'s opt-in would change per decode width, for a path that falls back for the one decode tensor
    asked about but claims by a per-call size rule (its "per-call size rule (rows -> claims)" evidence: ``band``
    (lower, upper) bytes, claims ``<= lower or >= upper``; ``band`` None: every size; vLLM's
    ``should_nccl_symm_mem_allreduce``, ``all_reduce_utils.py``). Over the report's per-width dispatch
    (``dispatch["per_width"]``: the widths captured, what serves each now) and the dispatch order (``dispatch["steps"]``:
    the path claims only widths whose present server comes after it). Returns ``{"rows": "1 and 10-512", "keep":
    "2-9", "changed": N, "captured": M, "from": {path serving those widths now}, "where": FILE:LINE}`` when set it
    would take some captured width, else None (one row count is not the answer: a path declining the 3-row tensor
    may take 1 row and 10 rows and more). ``against``: ask instead what it would take from that path, once that
    path is on and serves every width (the opt-in or the path serving now; None when ``v`` comes after it)."""
    if v.status != FALLS_BACK:
        return None
    e = _ev(v, "per-call size rule (rows")
    d = getattr(report, "dispatch", None) or {}
    pw, steps = d.get("per_width") or {}, [s.get("backend") for s in d.get("steps") or []]
    widths = pw.get("widths") or []
    if e is None or not isinstance(e.value, dict) or not widths or v.backend not in steps:
        return None
    band = e.value.get("band")
    per_row = widths[0]["bytes"] // max(1, widths[0]["rows"])

    def claims(rows: int) -> bool:
        b = rows * per_row
        return band is None or b <= band[0] or b >= band[1]

    mine = steps.index(v.backend)
    if against:
        if against not in steps or steps.index(against) < mine:
            return None
        widths = [{**w, "serves": against} for w in widths]
    later = {w["serves"] for w in widths if w["serves"] in steps and steps.index(w["serves"]) > mine}
    took = [w for w in widths if claims(w["rows"]) and w["serves"] in later]
    if not took:
        return None
    top = max(w["rows"] for w in widths)
    return {"rows": _row_ranges([r for r in range(1, top + 1) if claims(r)]),
            "keep": _row_ranges([r for r in range(1, top + 1) if not claims(r)]), "changed": len(took),
            "captured": len(widths), "from": sorted({w["serves"] for w in took}),
            "where": str(e.value.get("where") or e.source)}


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
    name = report.primary_engine() if hasattr(report, "primary_engine") else DEFAULT
    ver = ((report.environment or {}).get("packages") or {}).get(name)
    return str(ver or next((e.get("version") for e in getattr(report, "engines", None) or []
                            if e.get("name") == name and e.get("version")), "") or "")


#: library statuses that keep an engine's opt-in from being worth measuring: the library cannot run it here
_LIBRARY_CLOSED = (BLOCKED, ERROR)


def _library_block(report, backend: str) -> Verdict | None:
    """The library answer (scope "library", static) for ``backend`` when it says the library cannot run here
    (:data:`_LIBRARY_CLOSED`, or a ``skipped`` that is not waiting for GPUs), else None."""
    answers = getattr(report, "answers", None)
    lib = answers(backend)["library"] if answers is not None else None
    if lib is None:
        return None
    if lib.status in _LIBRARY_CLOSED or (lib.status == SKIPPED and lib.gate not in ("", GATE_NEEDS_RUNTIME)):
        return lib
    return None


def collective(backend: str, v: Verdict | None = None) -> str:
    """Which collective ``backend`` is: "allreduce" (a decode-step TP allreduce) or what its probe module declares in
    ``COLLECTIVE`` (``{"ep-flashinfer-a2a": "MoE all-to-all (expert parallelism)"}``); a verdict's own "collective"
    evidence wins (reports carry it)."""
    e = _ev(v, "collective") if v is not None else None
    if e is not None and e.value:
        return str(e.value)
    try:
        from .probes import probes
        for m in probes():
            found = (getattr(m, "COLLECTIVE", None) or {}).get(backend)
            if found:
                return str(found)
    except Exception:   # noqa: BLE001 - an old report read where the probes cannot load: the name decides
        pass
    return "allreduce"


def _short_cause(v: Verdict, limit: int = 220) -> str:
    text = (v.cause or v.status).strip()
    return text if len(text) <= limit else text[:limit].rsplit(" ", 1)[0] + " ..."


def headline(report) -> dict:
    """``{"config": "no flags" | the flags, "serves": path, "opt_in": [...], "do_not_set": [...], "falls_back":
    [...], "preempted": [...], "on": [...], "library_blocked": [...], "other": {collective: [...]},
    "not_assessed": [...], "avoid": [...]}`` (each entry one phrase; ``avoid``: "path: setting (what serves
    instead)" for the path that serves, :func:`avoid_items`) from ``report``'s engine answers, combined with each backend's
    library answer: an engine opt-in whose library answer is blocked (no compiler for a JIT-only module, a table
    without the target) is not worth measuring and goes to ``library_blocked`` with the library's cause. Paths that
    are not a decode allreduce (:func:`collective`) go to ``other`` under their collective. An engine answer that is
    ``error`` or ``not-assessed`` (a reader that met a release it does not know) goes to ``not_assessed``: an error is
    never dropped from the headline."""
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
    allreduce = [v for v in eng if collective(v.backend, v) == "allreduce"]
    on = [v for v in allreduce if v.status in (ON_BY_DEFAULT, ON_AS_CONFIGURED)]
    if not serves:
        serves = ", ".join(v.backend for v in on) or f"{NCCL}: no other path is on and admitted"
    out: dict[str, Any] = {"config": cfg, "serves": serves, "opt_in": [], "do_not_set": [], "falls_back": [],
           "preempted": [], "on": [f"{v.backend} ({v.status})" for v in on], "engine": bool(eng) and bool(_engine_version(report)),
           "library_blocked": [], "other": {}, "not_assessed": [], "fix_host_first": [], "avoid": [],
           "serves_host": _serves_host(report, eng, serves)}
    for v in eng:
        kind = collective(v.backend, v)
        phrase = _phrase(report, v)
        if phrase is None:
            continue
        key, text = phrase
        if key == "avoid":
            continue        # said beside the path it takes widths from (avoid_items of the path that serves)
        if key == "not_assessed":
            out["not_assessed"].append(text)
        elif kind == "allreduce":
            out[key].append(text)
        else:
            out["other"].setdefault(kind, []).append(f"{_OTHER_WORDS[key]}: {text}")
    for v in on:            # the path that serves: what a user must leave unset to keep it
        out["avoid"] += avoid_items(report, v)
    for v in eng:           # a setting whose effect on a path was not read: not assessed, never dropped
        out["not_assessed"] += unassessed_items(report, v)
    for v in eng:
        out["do_not_set"] += _raising_choices(report, v)
    return out


def _raising_choices(report, v: Verdict) -> list[str]:
    """``["--all2all-backend flashinfer_nvlink_one_sided (ep-flashinfer-a2a: start-up failure without NVLink: ...)"]``:
    the values of an answer's setting whose set-up raises uncaught on this topology, from its evidence ``"<value>
    set-up: ... (raises, ... does not catch it)"`` (True) and the engine gate that lists ``<value>`` among its
    choices (vLLM's ``_all2all``: FlashInfer's NVLink check, ``nvlink_common.py``); a value the answer already says
    is a start-up failure (its own setting) is not repeated. PCIe only: with NVLink the check passes. Worded from the
    report's topology (:func:`_topology_words`): "on PCIe" only where it was detected or given."""
    if (report.options or {}).get("topology") not in (None, "pcie") or v.status == STARTUP_FAILURE:
        return []
    where = _topology_words(report)
    out = []
    for e in v.evidence:
        if "set-up:" not in e.what or "(raises" not in e.what or e.value is not True:
            continue
        name = e.what.split(" set-up:")[0]
        gate = next((g for g in v.evidence if g.what.startswith("engine gate: ") and isinstance(g.value, dict)
                     and name in json_text(g.value.get("value"))), None)
        flag = gate.what.removeprefix("engine gate: ") + " " if gate is not None else ""
        why = e.what.split(" set-up: ")[1]
        out.append(f"{flag}{name} ({v.backend}: start-up failure {where}: {why}, {e.source})")
    return out


def _topology_words(report) -> str:
    """``on PCIe`` where the report's topology is PCIe, detected or given; ``on PCIe (assumed, not read: ...)`` where it
    was assumed (no GPUs where the report was made); ``on this topology (not read; without NVLink)`` where the report
    names none."""
    opts = report.options or {}
    if opts.get("topology") != "pcie":
        return "on this topology (not read; without NVLink)"
    src = str(opts.get("topology_source") or "")
    if src.startswith("assumed"):
        why = src.removeprefix("assumed").lstrip(": ").split(";")[0].split(" (")[0]
        return f"on PCIe (assumed, not read{': ' + why if why else ''})"
    return "on PCIe"


def json_text(value) -> str:
    """``value`` as JSON text (a quick containment test over nested lists and dicts)."""
    import json
    return json.dumps(value, default=str)


_OTHER_WORDS = {"opt_in": "opt-in, worth measuring on the target", "library_blocked": "not worth measuring here",
                "fix_host_first": "fix the host first",
                "do_not_set": "do not set", "falls_back": "falls back if set", "preempted": "preempted",
                "on": "on"}


def _phrase(report, v: Verdict) -> tuple[str, str] | None:
    """(headline key, phrase) for one engine answer, or None when the headline has nothing to say of it."""
    if v.status in (ERROR, NOT_ASSESSED):
        who = f"{v.engine} " if v.engine else ""
        return "not_assessed", f"{v.backend} ({who}answer {v.status}: {_short_cause(v)})"
    if v.status in (OPT_IN, ON_BY_DEFAULT, ON_AS_CONFIGURED):
        risk = v.host_risk or {}
        if risk.get("level") == "risk":
            # a peer-memory path on a host that shows a P2P risk is never "worth measuring" (stackprobe.host); said
            # first, before the library's answer here: what to switch off now holds whatever the library says
            setting = _setting(v) if v.status == OPT_IN else v.status.replace("-", " ")
            now = risk.get("now") or "leave it off"
            return "fix_host_first", f"{v.backend} ({setting}): {risk.get('short') or risk['what']}; now: {now}"
        lib = _library_block(report, v.backend)
        if lib is not None:
            return "library_blocked", (f"{v.backend} ({_setting(v) or v.status}): the engine admits it, but the "
                                       f"library is {status_word(lib)} here: {_short_cause(lib)}")
        if v.status == OPT_IN:
            claim = upstream_claim(v)
            return "opt_in", (f"{v.backend} ({_setting(v)})" + (f" [{claim}]" if claim else "") + user_caveats(v)
                              + _host_caveat(v) + _avoid(report, v))
        if collective(v.backend, v) != "allreduce":
            return "on", f"{v.backend} ({v.status})"
        return None
    if v.status == STARTUP_FAILURE:
        return "do_not_set", f"{_setting(v) or v.backend} ({v.backend}: start-up failure)"
    if v.status == FALLS_BACK:
        if v.backend in _width_servers(report):     # it declines the decode tensor, yet serves other widths
            return None
        ch = width_change(report, v)
        if ch is not None:
            served = [b for b in ch["from"] if b != "nccl-ring"]
            if served:      # set, it takes widths from a path that is on: listed with that path's "do not set with it"
                return "avoid", (f"{_setting(v) or v.backend} ({v.backend} takes {ch['rows']}-row decode tensors from "
                                 f"{', '.join(served)}: {ch['changed']} of {ch['captured']} captured widths; {ch['where']})")
            return "opt_in", (f"{_setting(v) or v.backend} ({v.backend}): changes the path for {ch['changed']} of "
                              f"{ch['captured']} captured decode widths ({ch['rows']} rows: {v.backend} instead of "
                              f"NCCL; {ch['where']})" + (f"; no change at {ch['keep']} rows" if ch["keep"] else "")
                              + ": measure those widths")
        return "falls_back", f"{_setting(v) or v.backend} ({v.backend})"
    if v.status == PREEMPTED:
        return "preempted", f"{v.backend} ({v.cause.split(': ', 2)[1] if ': ' in v.cause else v.cause})"
    return None


#: the label prefix of evidence a reader adds for what a user who switches the path on must know (read from the
#: source, with its FILE:LINE): it goes into the summary's line beside the setting
CAVEAT = "caveat: "


def user_caveats(v: Verdict) -> str:
    """`` [caveat: <value> (FILE:LINE)]`` per evidence labelled :data:`CAVEAT` (a reader's note read from the source:
    vLLM's fusion pass picks one-shot at every size on 12.0, a set-up failure stops start-up, ...), else ""."""
    return "".join(f" [{e.what}{e.value} ({e.source})]" for e in v.evidence if e.what.startswith(CAVEAT))


def _host_caveat(v: Verdict) -> str:
    """`` [check the host on the target first ...]`` for an opt-in peer-memory path whose host was not read or not
    fully read (:func:`stackprobe.host.apply`), else ""."""
    r = v.host_risk or {}
    if r.get("level") == "unchecked":
        return " [check the host on the target first: python -m stackprobe.runtime p2p (P2P per pair, IOMMU, ACS)]"
    if r.get("level") == "unassessed":
        return f" [{r['what']}: {r['fix']}]"
    return ""


def _serves_host(report, eng: list, serves: str) -> str:
    """What the host means for the path that serves: the NCCL baseline's transport (SHM, not P2P) or its P2P risk, or
    the serving peer-memory path's risk; "" when the host says nothing."""
    if serves.startswith(("NCCL", "nccl")):
        pick = next((v for v in report.verdicts if v.backend == "nccl-ring" and v.host_risk and v.tier == "static"), None)
    else:
        pick = next((v for v in eng if serves.startswith(v.backend) and v.host_risk), None)
    if pick is None:
        return ""
    r = pick.host_risk
    if r["level"] == "risk":
        return f"at risk on this host: {r.get('short') or r['what']}: fix the host first, below"
    return r["what"] if r["level"] == "transport" else ""


def _width_servers(report) -> set:
    """The paths that serve some decode width in the report's per-width dispatch (``dispatch["per_width"]``)."""
    pw = (getattr(report, "dispatch", None) or {}).get("per_width") or {}
    return {g.get("serves") for g in pw.get("ranges") or []}


def headline_line(report) -> str:
    """The headline as one sentence (see the module docstring)."""
    h = headline(report)
    if not h["engine"]:
        title = report._title() if hasattr(report, "_title") else "SGLang"
        return (f"no serving engine answer ({title} is not installed here): nothing below says what a server would "
                "do; the library answers say what could work")
    parts = [f"with {h['config']}: a decode-step allreduce takes {h['serves']}"
             + (f" ({h['serves_host']})" if h.get("serves_host") else "")]
    if h.get("avoid"):
        parts.append("do not set with it: " + "; ".join(h["avoid"]))
    ring = next((v for v in getattr(report, "verdicts", []) if v.backend == "nccl-ring" and v.tier == "static"
                 and (v.host_risk or {}).get("level") in ("risk", "transport")), None)
    if ring is not None and not h["serves"].startswith(("NCCL", "nccl")):
        # the baseline every path falls back to, said even where it does not serve: at risk (NVIDIA/nccl#1999), or
        # moving data over SHM because P2P is disabled
        r = ring.host_risk
        parts.append(f"NCCL, the baseline and fallback: {r.get('short') or r['what']}"
                     + (f"; now: {r['now']}" if r.get("now") else ""))
    if h.get("fix_host_first"):
        fixes = sorted({f for v in _engine_answers(report) if (v.host_risk or {}).get("level") == "risk"
                        for f in v.host_risk["fix"].split("; ")})
        parts.append("fix the host first (a peer-memory path on a box that shows a P2P risk): "
                     + "; ".join(h["fix_host_first"]) + (f"; the host fix: {'; '.join(fixes)}" if fixes else ""))
    if h["opt_in"]:
        parts.append("opt-in, worth measuring on the target: " + "; ".join(h["opt_in"]))
    if h["library_blocked"]:
        parts.append("admitted by the engine but not worth measuring here (its library is blocked): "
                     + "; ".join(h["library_blocked"]))
    if h["do_not_set"]:
        parts.append("do not set: " + "; ".join(h["do_not_set"]))
    if h["falls_back"]:
        # the declined tensor goes on down the dispatch to what serves it with the flags asked about
        to = "NCCL" if h["serves"].startswith(("NCCL", "nccl-ring")) else h["serves"]
        parts.append(f"accepted but falls back to {to} if set (no gain): " + "; ".join(h["falls_back"]))
    if h["preempted"]:
        parts.append("preempted: " + "; ".join(h["preempted"]))
    for kind, items in h["other"].items():
        parts.append(f"apart from the decode allreduce, {kind} (it changes the deployment): " + "; ".join(items))
    if h["not_assessed"]:
        parts.append("not assessed (the reader could not answer for this release; nothing is claimed for these): "
                     + "; ".join(h["not_assessed"]))
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


def _engine_dists() -> tuple[str, ...]:
    """The engines whose source a verdict's cause may cite (``sglang/FILE``, ``vllm/FILE``), in :func:`_decider`:
    every engine in :mod:`stackprobe.engines`' registry, by name."""
    return tuple(registered())


def _versions(report) -> dict:
    """The releases a verdict can move with: every serving engine the report records (its ``engines`` list or its
    packages), flashinfer-python and the CUDA toolkit."""
    env = report.environment or {}
    pk = env.get("packages") or {}
    nv = env.get("nvcc") or {}
    nvcc = (nv.get("cuda_home_nvcc") or nv.get("path") or (nv.get("pip") or [None])[0] or {}).get("release")
    out = {}
    for name in _engine_dists():
        ver = pk.get(name) or next((e.get("version") for e in getattr(report, "engines", None) or []
                                    if e.get("name") == name and e.get("version")), None)
        if ver or name == (report.primary_engine() if hasattr(report, "primary_engine") else DEFAULT):
            out[name] = ver
    out["flashinfer-python"] = pk.get("flashinfer-python") or pk.get("flashinfer_python")
    out["CUDA toolkit"] = nvcc or (env.get("torch") or {}).get("cuda")
    return out


def _decider(v: Verdict | None) -> str:
    """Which package a verdict's deciding gate belongs to: the engine that answers (``Verdict.engine``, "sglang" in
    reports made before the engine interface; or the engine whose source the cause cites, ``vllm/...``),
    "flashinfer-python" (library gates under flashinfer/), "CUDA toolkit" (toolchain, compiled-binary), else ""."""
    if v is None:
        return ""
    if v.gate in ("toolchain", "compiled-binary", "driver"):
        return "CUDA toolkit"
    if v.scope == "engine":
        return v.engine or next((n for n in _engine_dists() if f"{n}/" in v.cause), DEFAULT)
    cited = next((n for n in _engine_dists() if f"{n}/" in v.cause or f"{title_of(n)} " in v.cause), "")
    if cited:
        return cited
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
    moved = {k: (va.get(k), vb.get(k)) for k in dict.fromkeys([*va, *vb]) if va.get(k) != vb.get(k)}
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

