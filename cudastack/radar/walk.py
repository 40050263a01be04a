"""The upgrade radar: per toolchain, which release of each component is pinned, which is newest on the
index, which is the newest the engine's pins allow, what holds it back, and what a move would change in
the static verdicts. Nothing is installed or built: everything is read from the package index
(:mod:`cudastack.pkgindex.client`) and from the released files themselves (:mod:`cudastack.radar.scan`).

Components (in this order, where the toolchain pins them): torch, flash-attn, sglang-kernel (or the
older sgl-kernel), flashinfer-python, flashinfer-cubin, sglang (the engine), cuda-toolkit.

What can hold a release back (``pin``, ``python-tag``, ``cuda-variant``, an engine release whose pins cannot be
met) is checked per release in :mod:`cudastack.radar.checks`; this module walks the releases, scans what a move
would change, and renders the table.

:func:`engine_pin_conflicts` is the check that refuses a toolchain whose component pins contradict the
engine's pins (``invoke build`` of a real image stops on it, naming the pin).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from cudastack.core.paths import PROJECT_ROOT
from cudastack.core.errors import RecipeError, StackError, UsageError
from cudastack.pkgindex.client import Index
from cudastack.radar.checks import Checker, Pin, engine_runtimes
from cudastack.recipes.graph import stacks
from cudastack.recipes.load import RecipeSet, Toolchain, load_recipes
from cudastack.radar import moves
from stackprobe import api as sp
from cudastack.plan.rules import parse_target_arch

LOCK_DIR = PROJECT_ROOT / "lockfiles"
MAX_WALK = 60                      # releases checked per component, newest first
#: components whose move is read as a site (every wheel the chain installs; flash-attn is built from source)
LAID_OUT = {"torch", "flashinfer-python", "sglang", "sglang-kernel", "sgl-kernel", "vllm", "b12x"}


@dataclass
class Row:
    """One component of one toolchain in the radar."""

    name: str
    pinned: Pin
    newest: str = ""
    allowed: str = ""
    holds: list[str] = field(default_factory=list)     # why releases newer than ``allowed`` are refused
    move: str = ""                                      # what a move would change in the verdicts
    detail: list = field(default_factory=list)          # per move: the set read, the changes, costs, headlines
    notes: list[str] = field(default_factory=list)


@dataclass
class Radar:
    toolchain: str
    cuda_version: str
    python: str
    target: str
    engine: str
    rows: list[Row]
    conflicts: list[str]
    index_url: str = ""
    as_of: str = ""                # UTC date of the oldest project page the answer used
    runtime: str = ""              # the runtime node whose image chain this radar answers for (runtime, vllm)


# ------------------------------------------------------------------------------------ pins
def lock_versions(tc_name: str, lock_dir: Path = LOCK_DIR, nodes: list[str] | None = None) -> dict[str, str] | None:
    """name -> version the lockfile records (packages asked for by name first), None without a lock. ``nodes``:
    read only these nodes' entries (one runtime's image chain: vLLM's torch 2.14.0 is not SGLang's 2.14.1)."""
    p = Path(lock_dir) / f"{tc_name}.lock.yaml"
    if not p.is_file():
        return None
    data = yaml.safe_load(p.read_text()) or {}
    if nodes is not None:
        data = {**data, "nodes": {n: e for n, e in (data.get("nodes") or {}).items() if n in nodes}}
    found: dict[str, tuple[bool, str]] = {}

    def walk(o):
        if isinstance(o, dict):
            if "name" in o and "version" in o and isinstance(o["name"], str):
                n, req = canonicalize_name(o["name"]), bool(o.get("requested"))
                if n not in found or (req and not found[n][0]):
                    found[n] = (req, str(o["version"]))
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)
    walk(data)
    out = {k: v for k, (_, v) in found.items()}
    if "cuda-toolkit" not in out and data.get("cuda_version"):
        out["cuda-toolkit"] = str(data["cuda_version"])
    return out


# ------------------------------------------------------------------------------------ the radar
def engine_requirements(ck: Checker) -> tuple[dict[str, Requirement], str]:
    pin = ck.pins.get(ck.engine)
    if pin is None:
        return {}, ""
    reqs, fn = ck.requires(ck.engine, Version(pin.version))
    return reqs, f"{ck.engine} {pin.version} ({fn} METADATA)"


def engine_pin_conflicts(recipes: RecipeSet, tc: Toolchain, index: Index, runtime: str | None = None) -> list[str]:
    """Each component pin of ``tc`` (in the image chain of runtime node ``runtime``; default SGLang's) the pinned
    engine's ``Requires-Dist`` excludes, as one sentence naming the engine's requirement and the recipe that pins
    the component. Empty when the set agrees."""
    ck = Checker(index, recipes, tc, runtime)
    engine, stack = ck.engine, ck.stack     # this chain's engine (sglang, vllm) and its rows
    reqs, label = engine_requirements(ck)
    out = []
    for name, pin in ck.pins.items():
        if name == engine or name not in reqs:
            continue
        r = reqs[name]
        if not r.specifier.contains(pin.version, prereleases=True):
            out.append(f"{label} Requires-Dist `{r}` but {pin.where} pins {name} {pin.version}: moving {name} alone is "
                       f"refused; wait for an {engine} release that admits {name} {pin.version} or pin {name} back")
    for name, pin in ck.pins.items():
        if name in (engine, "cuda-toolkit") or name not in stack:
            continue
        try:
            own, fn = ck.requires(name, Version(pin.version), pin.method)
        except UsageError:
            continue            # not on this index: the radar's row for it says so
        for dep, r in own.items():
            if dep in ck.pins and dep in stack and dep != name and not r.specifier.contains(ck.pins[dep].version, prereleases=True):
                out.append(f"{name} {pin.version} ({fn}) Requires-Dist `{r}` but {ck.pins[dep].where} pins "
                           f"{dep} {ck.pins[dep].version}")
    return out


def refuse_engine_pin_conflicts(plan, index: Index | None = None, say: Callable[[str], None] | None = None) -> None:
    """Before a real build: when the runtime recipe does not record the engine's ``requires`` (a new
    toolchain), read them from the index and raise RecipeError (exit 3) naming each pin that blocks.
    With ``say``, report instead of raising (dry run). An unreachable index is reported, not fatal."""
    recipes = load_recipes(plan.recipes_dir or None)
    tc = recipes.toolchain(plan.toolchain)
    runtime = [c for c in recipes.components.values() if c.kind == "runtime" and c.name in engine_runtimes(recipes, tc)]
    unchecked = [c.name for c in runtime if not c.toolchains[tc.name].requires]
    if not unchecked:
        return      # each runtime recipe records its engine's pins and the loader has checked them
    try:
        index = index or Index()
        conflicts = [x for r in unchecked for x in engine_pin_conflicts(recipes, tc, index, r)]
    except StackError as e:
        (say or (lambda m: None))(f"engine pins not checked against the index: {e}")
        return
    if not conflicts:
        return
    msg = (f"Toolchain {tc.name} cannot be built as pinned: " + "; ".join(conflicts) +
           ". See `invoke outdated --cuda " + tc.name + "` for what each pin allows.")
    if say:
        say("REFUSED for a real build: " + msg)
        return
    raise RecipeError(msg)


def radar(cuda: str, *, index: Index | None = None, recipes: RecipeSet | str | Path | None = None,
          target_arch: str = "12.0", world_size: int = 8, topology: str = "pcie", lock_dir: Path = LOCK_DIR,
          verdicts: bool = True, say: Callable[[str], None] = lambda m: None, runtime: str | None = None) -> Radar:
    """The radar of toolchain ``cuda`` for the image chain of runtime node ``runtime`` (default: the first,
    SGLang's; ``"vllm"``: vLLM's torch, FlashInfer, b12x and vllm): one :class:`Row` per pinned component.
    ``verdicts``: scan the pinned and the newer releases of the gate-carrying packages (downloads, cached by
    hash)."""
    index = index or Index()
    if not isinstance(recipes, RecipeSet):
        recipes = load_recipes(recipes)
    tc = recipes.toolchain(cuda)
    target = parse_target_arch(target_arch)
    ck = Checker(index, recipes, tc, runtime)
    chain = dict(stacks(recipes.components, tc.name)).get(ck.runtime) if ck.runtime else None
    locked = lock_versions(tc.name, lock_dir, chain)
    engine_reqs, engine_label = engine_requirements(ck)
    rows = []
    for name in ck.components:
        pin = ck.pins.get(name)
        if pin is None:
            continue
        pin.locked = None if locked is None else locked.get(name, "")
        row = Row(name, pin)
        proj = index.project(name)
        vs = proj.versions()
        row.newest = str(vs[-1]) if vs else "?"
        pv = Version(pin.version)
        allowed = None
        holds: dict[str, list] = {}     # reason kind -> [newest release's reason, releases refused]
        # newest first, down through the pin itself (a pin the engine refuses is itself held back)
        for i, v in enumerate(reversed(vs)):
            if i >= MAX_WALK:
                break
            rs = ck.reasons(name, v, engine_reqs, engine_label, pin.method)
            if not rs:
                allowed = v
                break
            for r in rs:
                kind = r.split(":", 1)[0] + (r.split("`")[1].split("=")[0].split("<")[0].split(">")[0] if "`" in r else "")
                holds.setdefault(kind, [r, 0])[1] += 1
        row.allowed = (str(allowed) if allowed is not None else
                       "none" if len(vs) <= MAX_WALK else f"none of the {MAX_WALK} newest")
        if allowed is not None and allowed < pv:
            row.notes.append(f"the pinned {pv} itself is refused; {allowed} is the newest allowed")
        row.holds = [r if n == 1 else f"{r} (and {n - 1} older release{'s' if n > 2 else ''} likewise)"
                     for r, n in holds.values()]
        if locked is not None and pin.locked and pin.locked != pin.version:
            row.notes.append(f"lockfile records {pin.locked}: run invoke lock --cuda {tc.name}")
        rows.append(row)
        say(f"{tc.name}: {name} pinned {pin.version}, newest {row.newest}, allowed {row.allowed}")
    for row in rows:
        row.move = move_effect(row, index, ck, target, world_size, topology, verdicts, say)
    conflicts = engine_pin_conflicts(recipes, tc, index, ck.runtime)
    fetched = [pr.fetched_at for pr in index._projects.values() if pr.fetched_at]
    as_of = time.strftime("%Y-%m-%d", time.gmtime(min(fetched))) if fetched else ""
    return Radar(tc.name, tc.cuda_version, ck.base_note, target.cc, engine_label, rows, conflicts,
                 index.url, as_of, runtime=ck.runtime or "")


def move_effect(row: Row, index: Index, ck: Checker, target, world_size: int, topology: str, verdicts: bool,
                say: Callable[[str], None]) -> str:
    """What moving ``row`` from its pin to the newest allowed and to the newest release changes in the suite's
    answers: the candidate sets laid out as sites and read by the suite's own static tier
    (:mod:`cudastack.radar.moves`), per engine and path old status -> new status with the deciding line, the
    move's costs and the pins it breaks. The details (sets, changes, headlines) go to ``row.detail``."""
    pv, nv = Version(row.pinned.version), Version(row.newest)
    try:
        av = Version(row.allowed)
    except ValueError:
        return "no release fits this toolchain's other pins (see held back by): no move to read"
    if nv <= pv and av >= pv:
        return "up to date"
    name = row.name
    if name == "cuda-toolkit":
        return _toolkit_effect(ck, pv, av, nv, target)
    if name not in LAID_OUT:
        return "no reader of the suite opens this package (built from source or data only): nothing to read"
    if not verdicts:
        return "not read (--no-verdicts)"
    prefix: dict = {}
    if name == "torch":
        fmt = lambda c: f"CUDA {c[0]}.{c[1]}" if c else "no CUDA"  # noqa: E731
        cu_p = ck.torch_cuda(pv)[0]
        prefix = {v: f"build {fmt(cu_p)} -> {fmt(ck.torch_cuda(v)[0])} (Requires-Dist); arch list not read (binaries); "
                  for v in (av, nv)}
    try:
        base = moves.statuses_of_base(ck, target.cc, world_size, topology)
        parts = []
        for label, v in (("newest allowed", av), ("newest", nv)):
            if v == pv or (label == "newest" and v == av):
                continue
            say(f"{ck.tc.name}: reading {name} {v} ({label}) as a site")
            text, detail = moves.describe(ck, name, v, label, target.cc, world_size, topology, base)
            cov = moves.kernel_coverage(ck, name, pv, v, target, world_size, topology)
            row.detail.append(detail)
            parts.append(text.replace(f"{v} ({label}): ", f"{v} ({label}): {prefix.get(v, '')}", 1)
                         + (f"; {cov}" if cov else ""))
        return " / ".join(parts) if parts else "up to date"
    except (StackError, sp.SiteError) as e:
        return f"not read: {e}"


def _toolkit_effect(ck: Checker, pv: Version, av: Version, nv: Version, target) -> str:
    from cudastack.plan.rules import family_suffix

    def sfx(v: Version) -> str:
        tc = Toolchain(ck.tc.name, str(v), ck.tc.default_base, ck.tc.bases, ck.tc.torch_version, ck.tc.torch_cuda,
                       ck.tc.torch_index, {})
        return family_suffix(ck.recipes, tc, target)
    parts = []
    if av != pv:
        parts.append(f"{av} (newest allowed): a patch release of the same line, no arch rule in toolchains.yaml changes")
    if sfx(nv) != sfx(pv):
        parts.append(f"{nv} (newest): FlashInfer's arch list becomes {target.cc}{sfx(nv)} instead of {target.cc}{sfx(pv)}")
    else:
        parts.append(f"{nv} (newest): a new toolchain line; target {target.cc} spelled {target.cc}{sfx(nv)} either way")
    return " / ".join(parts)


# ------------------------------------------------------------------------------------ output
def render_markdown(r: Radar) -> str:
    """One Markdown table for one toolchain, with the engine-pin conflicts under it."""
    chain = f", {r.runtime}'s image chain" if r.runtime and r.runtime != "runtime" else ""
    lines = [f"## CUDA {r.toolchain}{chain} (toolkit {r.cuda_version}; {r.python}; target {r.target})", "",
             f"Engine: {r.engine or 'none pinned'}. Read from {r.index_url} (project pages of {r.as_of or 'unknown date'}) "
             "and from the released files; `invoke outdated` writes this table.", "",
             *sp.md_header(("component", "pinned", "newest", "newest allowed", "held back by",
                              "what a move would change in the verdicts"))]
    spill = sp.MdSpill()   # long reasons and moves, under one heading per component after the table
    for row in r.rows:
        p = row.pinned
        pinned = p.version + ("" if p.locked is None else " (locked)" if p.locked == p.version else
                              f" (lock: {p.locked or 'not recorded'})")
        # the deciding reason in the cell (an engine's pin where there is one), every reason below
        first = next((h for h in row.holds if h.startswith("pin:")), row.holds[0]) if row.holds else ""
        held = (f"{first} (+{len(row.holds) - 1} more below)" if len(row.holds) > 1 else
                first if row.holds else ("-" if row.allowed == row.newest else ""))
        if len(row.holds) > 1:
            for h in row.holds:
                spill.add(row.name, f"held back by: {h}")
        move = row.move + ("; " + "; ".join(row.notes) if row.notes else "")
        lines.append(sp.md_row((row.name, pinned, row.newest, row.allowed, spill.cell(row.name, held, "held back by"),
                                  spill.cell(row.name, move, "what a move would change"))))
    lines += spill.markdown("Per component, in full", "One heading per component whose cells above were cut: every "
                            "reason it is held back and what each move would change, whole (radar.json has the "
                            "per-move detail: the sets read, statuses old -> new, costs).", level=3)
    lines.append("")
    if r.conflicts:
        lines.append("Pins that refuse this toolchain as written:")
        for c in r.conflicts:
            lines.append(f"- {c}")
    else:
        lines.append("The component pins agree with the engine's pins.")
    return "\n".join(lines) + "\n"


def render_text(r: Radar) -> str:
    out = [f"CUDA {r.toolchain} ({r.python}); engine {r.engine}" + (f" ({r.runtime}'s image chain)" if r.runtime else "")]
    for row in r.rows:
        out.append(f"  {row.name:18} pinned {row.pinned.version:12} newest {row.newest:12} allowed {row.allowed}")
        for h in row.holds:
            out.append(f"      held back by {h}")
        if row.move:
            out.append(f"      move: {row.move}")
    for c in r.conflicts:
        out.append(f"  REFUSED: {c}")
    return "\n".join(out)


def to_json(r: Radar) -> dict:
    return {"toolchain": r.toolchain, "runtime": r.runtime, "cuda_version": r.cuda_version, "base": r.python,
            "target": r.target,
            "index": r.index_url, "as_of": r.as_of,
            "engine": r.engine, "conflicts": r.conflicts,
            "rows": [{"component": x.name, "pinned": x.pinned.version, "pinned_where": x.pinned.where,
                      "locked": x.pinned.locked, "newest": x.newest, "newest_allowed": x.allowed, "held_back_by": x.holds,
                      "move": x.move, "move_detail": x.detail, "notes": x.notes} for x in r.rows]}


def from_json(d: dict) -> Radar:
    """The :class:`Radar` that :func:`to_json` wrote (one item of ``radar.json``), to render its Markdown again.
    Raises KeyError for a dict without the keys :func:`to_json` writes."""
    rows = [Row(x["component"], Pin(x["component"], x["pinned"], x.get("pinned_where", ""), locked=x.get("locked")),
                x.get("newest", ""), x.get("newest_allowed", ""), list(x.get("held_back_by") or []), x.get("move", ""),
                list(x.get("move_detail") or []), list(x.get("notes") or [])) for x in d["rows"]]
    return Radar(d["toolchain"], d["cuda_version"], d["base"], d["target"], d["engine"], rows, list(d["conflicts"]),
                 d.get("index", ""), d.get("as_of", ""), d.get("runtime", ""))


def toolchain_names(recipes: RecipeSet | None, cuda: str | None) -> list[str]:
    recipes = recipes or load_recipes()
    if cuda:
        return [recipes.toolchain(str(cuda)).name]
    return list(recipes.toolchains)


_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def out_name(tc: str, runtime: str = "") -> str:
    """``cu13.1.md`` for SGLang's chain (runtime node ``runtime``), ``cu13.1-vllm.md`` for another runtime's."""
    tail = f"-{_SAFE.sub('_', runtime)}" if runtime and runtime != "runtime" else ""
    return f"cu{_SAFE.sub('_', tc)}{tail}.md"


def runtimes(recipes: RecipeSet, tc_name: str) -> list[str]:
    """The runtime nodes toolchain ``tc_name`` takes (one radar each), SGLang's first; [""] with none."""
    return list(engine_runtimes(recipes, recipes.toolchain(tc_name))) or [""]
