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
    if errs:
        lines += [f"> **ERROR: this environment is not healthy ({len(errs)} error{'s' * (len(errs) != 1)})**: the "
                  "backends that need what is broken read blocked below, whatever their gates say.", ""]
    else:
        lines += ["no errors: what the backends need is installed coherently and loads (or needs a GPU to tell).", ""]
    nccl = health.get("nccl") or {}
    tool = health.get("toolchain") or {}
    lines.append(f"stack CUDA {health.get('stack_cuda') or '-'} (torch); nvcc for JIT builds: "
                 f"{tool.get('nvcc') or 'none'} (CUDA {tool.get('nvcc_cuda') or '-'}); libnccl loaded by torch: "
                 f"{nccl.get('library') or 'none mapped'} ({nccl.get('version_string') or nccl.get('version') or '-'}); "
                 f"checks took {health.get('seconds', '-')} s  ")
    lines.append("")
    lines += [f"- **error** ({f['check']}): {f['message']}" for f in errs]
    lines += [f"- warning ({f['check']}): {f['message']}" for f in warns[:12]]
    if len(warns) > 12:
        lines.append(f"- ... {len(warns) - 12} more warnings (the JSON report's environment.health.findings)")
    lines += [f"- info ({f['check']}): {f['message']}" for f in infos[:6]]
    blocks = health.get("blocks") or {}
    if blocks:
        lines += ["", *mdtable.table(("backend", "blocked by the environment", "what to change"),
                                     ((b, bl[0]["gate"] + ": " + bl[0]["cause"], bl[0]["lift_detail"])
                                      for b, bl in blocks.items()))]
    lines.append("")
    return lines


def comparison(reports: list, labels: list[str]) -> list[str]:
    """The health rows of a comparison, first: errors per report and the backends each blocks."""
    if not any((r.environment or {}).get("health") for r in reports):
        return []
    lines = ["## Environment health", "", *mdtable.header(["", *labels])]
    errs = []
    for r in reports:
        fs = [f for f in ((r.environment or {}).get("health") or {}).get("findings", []) if f["level"] == "error"]
        errs.append("; ".join(f"**error** ({f['check']}): {f['message']}" for f in fs) or "no errors")
    lines.append(mdtable.row(["errors", *errs]))
    lines.append(mdtable.row(["blocked by the environment", *(
        ", ".join(((r.environment or {}).get("health") or {}).get("blocks", {})) or "-" for r in reports)]))
    return lines + [""]
