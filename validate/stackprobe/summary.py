"""The summary block every Markdown report opens with: what a person reads in a minute and pastes into a bug report,
one ``key: value`` line each, as torch's and vLLM's ``collect_env`` print theirs (stdlib only).

Lines, in order: ``target``, ``host`` (the report's host section in one line, or that it was not read), ``engine``
(each engine that answered, with its version), ``stack`` (torch and its CUDA build, FlashInfer, NCCL), ``health``
(:func:`stackprobe.health_report.summary`), then one line per path under the heading that says what to do with it:

* ``serves now``: the path a decode-step allreduce takes with the flags asked about (and what the host says of it);
* ``do not set with it``: a setting that takes that path away (it turns it off, or a path earlier in the dispatch
  takes some decode widths from it), one line each (:func:`stackprobe.userwords.avoid_items`); an opt-in's own list
  follows it on its ``try and measure`` line;
* ``fix the host first``: a peer-memory path, on or opt-in, on a box that shows a P2P risk (:mod:`stackprobe.host`);
* ``try and measure``: an opt-in the engine and the library admit (with the host check asked for off the target);
* ``do not set``: a flag that makes the server fail at start-up;
* ``accepted, no gain``: a flag that is accepted and then falls back, or a path another path preempts;
* ``engine admits, library blocked``: an opt-in whose library cannot run here;
* ``other collective``: paths that are not the decode allreduce (expert-parallel all-to-all), with their answer;
* ``broken here``: a health error, or a path blocked by a broken install;
* ``not assessed (N)``: engine answers the readers could not give (a release they do not know), and health checks
  that could not run.

Every phrase comes from :func:`stackprobe.userwords.headline`, so the block and the headline never disagree.
"""
from __future__ import annotations

from .verdict import GATE_BROKEN_INSTALL

WIDTH = 19


def _line(key: str, value: str) -> str:
    return f"{(key + ':').ljust(WIDTH)} {value}"


def _host(report) -> str:
    h = getattr(report, "host", None) or {}
    if not h:
        return "not read (a report made before the host stage)"
    if not h.get("present"):
        return "no GPU here: not read; check the target first (python -m stackprobe.host, python -m stackprobe.runtime p2p)"
    from .host import risks
    ws = int((report.options or {}).get("world_size") or 8)
    found = risks(h, ws)
    text = h.get("line", "")
    if found:
        text += "; RISK: " + "; ".join(r.get("short") or r["what"] for r in found)
    if h.get("not_read"):
        text += f"; not read: {len(h['not_read'])} item(s) (see the host section)"
    return text


def _engines(report) -> str:
    out = [f"{e.get('name')} {e.get('version') or '(not installed)'}" for e in (report.engines or [])]
    if not out:   # a report made before the engine list: SGLang's (engines.DEFAULT), as the environment recorded it
        from .engines import DEFAULT
        ver = ((report.environment or {}).get("packages") or {}).get(DEFAULT)
        out = [f"{DEFAULT} {ver or '(not installed)'}"]
    return ", ".join(out)


def _stack(report) -> str:
    env = report.environment or {}
    t, pk, n = env.get("torch") or {}, env.get("packages") or {}, env.get("nccl") or {}
    fi = pk.get("flashinfer-python") or pk.get("flashinfer_python")
    from .env import nccl_text   # the NCCL that loads, beside the wheel's metadata where they differ (C55)
    nccl = nccl_text(env) if (n.get("loaded") or n.get("torch")) else (n.get("library") or n.get("wheel"))
    return (f"torch {t.get('version') or '-'} (CUDA {t.get('cuda') or '-'}); flashinfer-python {fi or '-'}; "
            f"NCCL {nccl or '-'}")


def block(report) -> list[str]:
    """The summary block's Markdown lines (a heading and one fenced ``key: value`` block)."""
    from .health_report import summary as health_summary
    from .userwords import headline

    opts = report.options or {}
    lines = [_line("target", f"{report.target_arch} ({opts.get('topology') or '?'}, world size "
                             f"{opts.get('world_size') or '?'}; flags: "
                             f"{(opts.get('server_config') or {}).get('describe') or 'no flags'})"),
             _line("host", _host(report)), _line("engine", _engines(report)), _line("stack", _stack(report))]
    health = (report.environment or {}).get("health")
    lines.append(_line("health", health_summary(health).removeprefix("health: ") or "not assessed (no health stage)"))
    h = headline(report)
    if not h["engine"]:
        lines.append(_line("serves now", "no serving engine is installed here: nothing below says what a server would "
                                         "do; the library answers (the matrix) say what could work"))
    else:
        lines.append(_line("serves now", h["serves"] + (f" ({h['serves_host']})" if h.get("serves_host") else "")))
        lines += [_line("do not set with it", a) for a in h.get("avoid", [])]
        for key, items in (("fix the host first", h.get("fix_host_first", [])), ("try and measure", h["opt_in"]),
                           ("do not set", h["do_not_set"]),
                           ("accepted, no gain", h["falls_back"] + [f"preempted: {p}" for p in h["preempted"]]),
                           ("engine admits, library blocked", h.get("library_blocked", []))):
            lines += [_line(key, item) for item in items]
        for kind, items in (h.get("other") or {}).items():
            lines += [_line("other collective", f"{kind}: {item}") for item in items]
    broken = [f["message"] for f in (health or {}).get("findings", []) if f.get("level") == "error"]
    broken += [f"{v.backend}: {v.cause}" for v in report.verdicts
               if v.gate == GATE_BROKEN_INSTALL and v.tier == "static" and v.scope == "library"]
    lines += [_line("broken here", b[:300]) for b in broken]
    gaps = [f"{g['what']} ({g['why']})" for g in (health or {}).get("not_assessed") or []]
    gaps += list(h.get("not_assessed", [])) if h["engine"] else []
    if gaps:
        lines.append(_line(f"not assessed ({len(gaps)})", "; ".join(gaps)))
    return ["## Summary", "", "```text", *lines, "```", ""]
