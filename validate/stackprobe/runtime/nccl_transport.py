"""NCCL's transport as NCCL states it: which of P2P, SHM or NET each channel's connection uses, read from the
``NCCL_DEBUG=INFO`` lines the ranks print while they connect.

NCCL prints one INFO line per connection it sets up (subsystems ``INIT`` plus ``P2P``, ``SHM`` or ``NET``; the
line prefix is ``host:pid:tid [cudaDev] NCCL INFO `` from ``src/debug.cc``, NCCL 2.30.7 line 354). The formats,
from NVIDIA/nccl's own source (v2.27.7-1 and master after v2.30.7-1, ``src/transport/``):

* P2P (``p2p.cc``, master 416/423/429/437, v2.27.7 386/393/398/406)::

    Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/direct pointer%s     (ranks in one process)
    Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/%s%s%s               (CUMEM or MNNVL, "/read", "/CE")
    Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/IPC%s%s              (legacy CUDA IPC, "/read", "/CE")
    Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/indirect/%d[%d]%s    (through an intermediate GPU)

* SHM (``shm.cc``, v2.27.7-v2.29.2 line 128/129; master 116 drops the second part)::

    Channel %02d : %d[%d] -> %d[%d] via SHM/%s/%s                     ("direct" or "CE", send then receive)
    Channel %02d : %d[%d] -> %d[%d] via SHM/direct

* NET (``net.cc``, master 324/328/377, v2.27.7 218/222/264)::

    Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s%s     (net name, device, "/GDRDMA", "(PCI)",
    Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d(%d)%s%s%s  "/Shared"; (%d) the PXN proxy rank)
    Channel %02d/%d : %d[%d] -> %d[%d] [receive] via NET/%s/%d%s%s%s

Each ``%d[%d]`` is a rank and its NVML device index. :func:`parse` turns log text into one record per connection;
:func:`summarize` into the transport the run used: ``P2P``, ``SHM``, ``NET`` or ``mixed (...)``; a log with no such
line gives ``"not assessed: NCCL printed no transport lines"`` (with a hint when ``NCCL_DEBUG=INFO`` was not in
effect), never a guess. :data:`DEBUG_ENV` is what the runtime tier's baseline process group runs with.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable

DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,P2P,SHM,NET"}
NOT_ASSESSED = "not assessed: NCCL printed no transport lines"

LINE = re.compile(
    r"NCCL INFO Channel (?P<channel>\d+)(?:/(?P<conn>\d+))? : (?P<from_rank>\d+)\[(?P<from_dev>\d+)\] -> "
    r"(?P<to_rank>\d+)\[(?P<to_dev>\d+)\](?: \[(?P<side>send|receive)\])? via (?P<via>(?P<transport>P2P|SHM|NET)/"
    r"[^\r\n]*?)\s*$")
VERSION = re.compile(r"NCCL INFO NCCL version (?P<version>\S+)")
INFO = re.compile(r"NCCL INFO ")


def parse(text: str) -> list[dict]:
    """One record per transport line: ``{"channel", "conn" (None for SHM), "from_rank", "from_dev", "to_rank",
    "to_dev", "side" ("send"/"receive" for NET, else None), "transport" (P2P|SHM|NET), "mechanism" (IPC, CUMEM,
    MNNVL, direct pointer, indirect, direct/CE for SHM, the network's name for NET), "read" (P2P read mode),
    "via" (the text after "via ")}``, in log order, duplicates kept."""
    out = []
    for line in text.splitlines():
        m = LINE.search(line)
        if not m:
            continue
        via = m.group("via")
        parts = via.split("/")
        out.append({"channel": int(m.group("channel")), "conn": int(m.group("conn")) if m.group("conn") else None,
                    "from_rank": int(m.group("from_rank")), "from_dev": int(m.group("from_dev")),
                    "to_rank": int(m.group("to_rank")), "to_dev": int(m.group("to_dev")), "side": m.group("side"),
                    "transport": m.group("transport"), "mechanism": parts[1] if len(parts) > 1 else "",
                    "read": m.group("transport") == "P2P" and "read" in parts[2:], "via": via})
    return out


def summarize(texts: Iterable[str], env: dict[str, str] | None = None) -> dict:
    """The transport of one process group from its ranks' logs (``texts``). Returns ``{"summary": "P2P" | "SHM" |
    "NET" | "mixed (NET, P2P)" | NOT_ASSESSED, "assessed": bool, "transports": {P2P|SHM|NET: connections},
    "mechanisms": {"P2P/CUMEM": n, ...}, "pairs": {"0->1": ["P2P/CUMEM/read"], ...}, "connections": [parse
    records, duplicates across ranks removed], "nccl_version": from "NCCL version" lines or None, "info_lines": n,
    "why": ""}``. ``env``: the environment the ranks ran with, to say why nothing was printed (NCCL_DEBUG not INFO)."""
    texts = list(texts)
    seen, conns = set(), []
    for t in texts:
        for r in parse(t):
            key = (r["channel"], r["conn"], r["from_rank"], r["to_rank"], r["side"], r["via"])
            if key not in seen:
                seen.add(key)
                conns.append(r)
    versions = sorted({m.group("version") for t in texts for m in VERSION.finditer(t)})
    info = sum(len(INFO.findall(t)) for t in texts)
    out: dict = {"connections": conns, "nccl_version": versions[0] if len(versions) == 1 else (versions or None),
                 "info_lines": info, "transports": dict(Counter(r["transport"] for r in conns)),
                 "mechanisms": dict(Counter(f"{r['transport']}/{r['mechanism']}" for r in conns)), "pairs": {}}
    for r in conns:
        vias = out["pairs"].setdefault(f"{r['from_rank']}->{r['to_rank']}", [])
        if r["via"] not in vias:
            vias.append(r["via"])
    if not conns:
        level = (env or {}).get("NCCL_DEBUG")
        if env is not None and (level or "").upper() not in ("INFO", "TRACE"):
            why = f"NCCL_DEBUG was {level!r} in the ranks, not INFO" if level else "NCCL_DEBUG was not set in the ranks"
        elif not info:
            why = ("no NCCL INFO line at all in the ranks' output (NCCL not loaded; its output sent elsewhere by "
                   "NCCL_DEBUG_FILE; or the ranks killed before their buffered stdout reached the log: NCCL writes "
                   "to C stdout, src/debug.cc, flushed at exit)")
        else:
            why = (f"{info} NCCL INFO lines but none for a connection (NCCL_DEBUG_SUBSYS without INIT/P2P/SHM/NET, "
                   "or a world size of 1: no peers to connect)")
        out.update(summary=NOT_ASSESSED, assessed=False, why=why)
        return out
    kinds = sorted(out["transports"])
    out.update(summary=kinds[0] if len(kinds) == 1 else f"mixed ({', '.join(kinds)})", assessed=True, why="")
    return out


def label(result: dict | None) -> str:
    """One phrase for a report: ``"over P2P (P2P/CUMEM 4)"``, ``"over SHM (SHM/direct 2)"``, or the not-assessed
    text with its reason."""
    if not result:
        return "transport not assessed: NCCL's log was not captured"
    if not result.get("assessed"):
        return f"transport {result['summary']}" + (f" ({result['why']})" if result.get("why") else "")
    mech = ", ".join(f"{k} {v}" for k, v in sorted(result["mechanisms"].items()))
    return f"over {result['summary']} ({mech} connections)"
