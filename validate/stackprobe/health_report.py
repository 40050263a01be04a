"""The environment health section of the Markdown report and of the comparison, shown first: its errors are
what a user must not miss (``--strict`` turns them into an exit code, :data:`EXIT_UNHEALTHY`)."""
from __future__ import annotations

from stackprobe import mdtable

#: ``python -m stackprobe --strict`` (and ``invoke validate --strict``): the report is written, and the
#: environment health stage found at least one error
EXIT_UNHEALTHY = 10


def markdown(health: dict | None) -> list[str]:
    """Lines of the "Environment health" section ([] for a report made before the stage existed)."""
    if not health:
        return []
    fs = health.get("findings", [])
    errs = [f for f in fs if f["level"] == "error"]
    warns = [f for f in fs if f["level"] == "warning"]
    infos = [f for f in fs if f["level"] == "info"]
    lines = ["## Environment health", ""]
    gaps = health.get("not_assessed") or []
    if errs:
        lines += [f"> **ERROR: this environment is not healthy ({len(errs)} error{'s' * (len(errs) != 1)})**: the "
                  "backends that need what is broken read blocked below, whatever their gates say.", ""]
    elif gaps:
        lines += [f"> **not assessed: {'; '.join(_gap(g) for g in gaps)}**: no errors in the checks that ran, which "
                  "says nothing about these.", ""]
    else:
        lines += ["no errors: what the backends need is installed coherently and loads (or needs a GPU to tell).", ""]
    if errs and gaps:
        lines += [f"> **not assessed: {'; '.join(_gap(g) for g in gaps)}**", ""]
    nccl = health.get("nccl") or {}
    tool = health.get("toolchain") or {}
    lines.append(f"stack CUDA {health.get('stack_cuda') or '-'} (torch); nvcc for JIT builds: "
                 f"{tool.get('nvcc') or 'none'} (CUDA {tool.get('nvcc_cuda') or '-'}); libnccl loaded by torch: "
                 f"{nccl.get('library') or 'none mapped'} ({nccl.get('version_string') or nccl.get('version') or '-'}"
                 f"{_wheel_note(nccl)}); "
                 f"checks took {health.get('seconds', '-')} s  ")
    lines.append("")
    lines += [f"- **error** ({f['check']}): {f['message']}" for f in errs]
    warns = [f for f in warns if not f["message"].startswith("not assessed: ")]   # shown above
    lines += [f"- warning ({f['check']}): {f['message']}" for f in warns[:12]]
    if len(warns) > 12:
        lines.append(f"- ... {len(warns) - 12} more warnings (the JSON report's environment.health.findings)")
    lines += [f"- info ({f['check']}): {f['message']}" for f in infos[:6]]
    blocks = health.get("blocks") or {}
    if blocks:
        spill = mdtable.Spill()
        lines += ["", *mdtable.table(("backend", "blocked by the environment", "what to change"),
                                     ((b, spill.cell(b, bl[0]["gate"] + ": " + bl[0]["cause"], "blocked by"),
                                       spill.cell(b, bl[0]["lift_detail"], "what to change"))
                                      for b, bl in blocks.items()))]
        lines += spill.markdown("Blocked by the environment, in full", "Per backend, the cells above whole.", level=3)
    lines.append("")
    return lines


def _wheel_note(nccl: dict) -> str:
    """", wheel metadata nvidia-nccl-cu13 2.30.7, the file differs from its RECORD" where the loaded library is not
    what its wheel says (case C55)."""
    w = nccl.get("wheel") or {}
    if not w or not nccl.get("version") or str(w.get("version", "")).split("+")[0] == nccl["version"]:
        return ""
    return (f"; wheel metadata {w['dist']} {w['version']}"
            + (", the file differs from its RECORD" if w.get("record") == "differs" else ""))


def _gap(g: dict) -> str:
    return f"{g['what']} ({g['why']})"


def summary(health: dict | None) -> str:
    """The health stage in a few words for the report's headline: "health: 2 errors", "health: no errors;
    not assessed: declared requirements (why)", "" for a report without the stage."""
    if not health:
        return ""
    n = sum(1 for f in health.get("findings", []) if f.get("level") == "error")
    gaps = health.get("not_assessed") or []
    head = f"health: {n} error{'s' * (n != 1)}" if n else "health: no errors"
    return head + (f"; not assessed: {', '.join(g['what'] for g in gaps)}" if gaps else "")


def comparison(reports: list, labels: list[str]) -> list[str]:
    """The health rows of a comparison, first: errors per report and the backends each blocks."""
    if not any((r.environment or {}).get("health") for r in reports):
        return []
    lines = ["## Environment health", "", *mdtable.header(["", *labels])]
    errs = []
    for r in reports:
        fs = [f for f in ((r.environment or {}).get("health") or {}).get("findings", []) if f["level"] == "error"]
        gaps = ((r.environment or {}).get("health") or {}).get("not_assessed") or []
        errs.append("; ".join([f"**error** ({f['check']}): {f['message']}" for f in fs]
                              + [f"**not assessed**: {_gap(g)}" for g in gaps]) or "no errors")
    spill = mdtable.Spill()
    lines.append(mdtable.row(["errors", *(spill.cell(lab, e, "errors") for lab, e in zip(labels, errs))]))
    lines.append(mdtable.row(["blocked by the environment", *(
        spill.cell(lab, ", ".join(((r.environment or {}).get("health") or {}).get("blocks", {})) or "-",
                   "blocked by the environment") for lab, r in zip(labels, reports))]))
    return lines + spill.markdown("Environment health in full", "Per image, the health cells above whole.", level=3) + [""]
