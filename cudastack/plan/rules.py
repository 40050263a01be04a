"""Arch/toolkit rules, checked before any build (cases C1, C2, C3, C4, C8, C10 of the project's cases).

Every fact comes from the recipes' data (``recipes/toolchains.yaml``: the arch table with the first CUDA
that compiles each compute capability and the release that dropped it, and the suffix rules), so a
new toolkit is a data change. The spelling of arch specs is :mod:`stackprobe.archs`.

* C1: an arch whose first CUDA is newer than the toolchain (12.1 on CUDA 12.8: needs 12.9) is refused,
  naming the minimum and the toolchains that can build it.
* C2: an arch the toolchain's CUDA dropped (5.x, 6.x, 7.0, 7.2 on CUDA 13) is refused.
* C3: an ``f`` target below the suffix's first CUDA (12.0f on 12.8: needs 12.9) is refused, suggesting
  the ``a`` spelling where that exists.
* A ``pip`` base whose toolkit wheels carry no nvcc (CUDA 12) with any ``source`` recipe is refused.
* C4: FlashInfer-style ``suffixed`` knobs always get an explicit suffix: ``f`` where the toolchain has
  family targets (CUDA >= 12.9), else ``a``.
* C10: a ``cmake-fixed`` component (sgl-kernel) ignores TORCH_CUDA_ARCH_LIST; its coverage is computed
  from the archs its build files hard-code.
* C8: :func:`memory_rule` derives MAX_JOBS / NVCC_THREADS from cores, memory and the recipe's budget.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cudastack.core.errors import ArchError, UsageError
from cudastack.plan.model import Knob
from cudastack.recipes.load import ArchKnob, Component, Parallelism, RecipeSet, Toolchain
from stackprobe.api import Arch, ArchSpecError, parse_arch, parse_arch_list, version_tuple

HEADROOM = 0.9          # share of the builder's memory the compile jobs may use (the rest: OS, daemon, linker)


def _v(text: str) -> tuple[int, ...]:
    return version_tuple(text)


def parse_target_archs(specs: str | list[str]) -> list[Arch]:
    """Parse ``--arch`` (``"12.0"``, ``"12.0a;9.0"``, ...). Raises ArchError naming the valid forms."""
    try:
        archs = parse_arch_list(specs)
    except ArchSpecError as exc:
        given = specs if isinstance(specs, str) else ";".join(map(str, specs))
        raise ArchError(f"--arch {given!r}: {exc}") from None
    if not archs:
        raise ArchError("No target arch given: pass --arch with a compute capability such as 12.0.")
    return archs


def known_arch_error(arch: Arch, recipes: RecipeSet) -> ArchError:
    """The one refusal of a compute capability missing from the arch table (``archs:`` of the recipes'
    toolchains.yaml, the one list every task checks against): exit 4, naming the known ones."""
    known = ", ".join(recipes.archs)
    return ArchError(f"Arch {arch} is not a known compute capability (known: {known}; the arch table of "
                     "recipes/toolchains.yaml). Pass --arch with one of them, e.g. 12.0 for RTX PRO 6000 Blackwell / "
                     "RTX 50xx.")


def parse_target_arch(spec: str, recipes: RecipeSet | str | Path | None = None) -> Arch:
    """Parse one target compute capability (``--arch`` of validate, outdated and scan: ``"12.0"``, ``"12.0a"``)
    and check it against the same arch table as the build's list (``recipes``: a RecipeSet or its folder,
    default the project's recipes/). Raises ArchError (exit 4) for a bad spelling (``--arch '<spec>': <the
    accepted spellings>``) or a compute capability the table does not know (:func:`known_arch_error`); callers
    check before any download."""
    from cudastack.recipes.load import load_recipes

    try:
        arch = parse_arch(str(spec))
    except ArchSpecError as exc:
        raise ArchError(f"--arch {spec!r}: {exc}") from None
    rs = recipes if isinstance(recipes, RecipeSet) else load_recipes(recipes)
    if arch.cc not in rs.archs:
        raise known_arch_error(arch, rs)
    return arch


def check_arch(recipes: RecipeSet, tc: Toolchain, arch: Arch, name_others: bool = True) -> None:
    """Refuse one target arch that ``tc``'s nvcc cannot compile (C1, C2, C3). Raises ArchError; with
    ``name_others`` its message names the other toolchains that can (never nested: two toolchains refusing the
    same arch would otherwise ask each other forever)."""
    cuda = _v(tc.cuda_version)
    info = recipes.archs.get(arch.cc)
    if info is None:
        raise known_arch_error(arch, recipes)
    if cuda < _v(info.min_cuda):
        raise ArchError(f"Arch {arch} needs CUDA >= {info.min_cuda}, but toolchain {tc.name} is CUDA "
                        f"{tc.cuda_version}: its nvcc rejects compute_{arch.number} (\"Unsupported gpu "
                        f"architecture\"). Use a toolchain with CUDA >= {info.min_cuda}"
                        f"{_others(recipes, arch, tc) if name_others else ''} or drop {arch} from --arch.")
    if info.dropped_in and cuda >= _v(info.dropped_in):
        raise ArchError(f"CUDA {info.dropped_in} dropped arch {arch.cc} (Maxwell, Pascal and Volta: sm_50 to "
                        f"sm_72 are gone from CUDA 13), so toolchain {tc.name} (CUDA {tc.cuda_version}) cannot "
                        f"build for it. Build {arch.cc} with a CUDA 12 toolchain{_others(recipes, arch, tc) if name_others else ''} "
                        f"or remove it from --arch.")
    if arch.suffix:
        rule = recipes.suffixes.get(arch.suffix)
        if rule is None:
            raise ArchError(f"Arch {arch}: the recipes define no rule for suffix '{arch.suffix}'.")
        if "min_arch" in rule and (arch.major, arch.minor) < _v(rule["min_arch"])[:2]:
            raise ArchError(f"Arch {arch}: '{arch.suffix}' targets exist only for compute capability "
                            f">= {rule['min_arch']}; write {arch.cc} without the suffix.")
        if cuda < _v(rule["min_cuda"]):
            hint = ""
            alt = recipes.suffixes.get("a")
            if arch.suffix == "f" and alt and cuda >= _v(alt["min_cuda"]):
                hint = (f" For toolchain {tc.name} write {arch.cc}a (architecture-specific: runs on "
                        f"exactly {arch.cc}) instead,")
            raise ArchError(f"Arch {arch}: '{arch.suffix}' (family-specific) targets need CUDA >= "
                            f"{rule['min_cuda']}, but toolchain {tc.name} is CUDA {tc.cuda_version} "
                            f"(nvcc rejects compute_{arch.number}{arch.suffix}).{hint} or use a toolchain with "
                            f"CUDA >= {rule['min_cuda']}{_others(recipes, arch, tc) if name_others else ''}.")


def _others(recipes: RecipeSet, arch: Arch, tc: Toolchain) -> str:
    ok = []
    for other in recipes.toolchains.values():
        if other.name == tc.name:
            continue
        try:
            check_arch(recipes, other, arch, name_others=False)
        except ArchError:
            continue
        ok.append(other.name)
    return f" (here: --cuda {' or --cuda '.join(ok)})" if ok else ""


def check_archs(recipes: RecipeSet, tc: Toolchain, archs: list[Arch]) -> None:
    """Refuse the whole target list if any arch is impossible for ``tc`` (first fault wins)."""
    for a in archs:
        check_arch(recipes, tc, a)


def check_base(tc: Toolchain, base_kind: str, source_components: list[Component]) -> None:
    """Refuse a base that cannot build the plan's source recipes: the ``pip`` base of a CUDA 12 toolchain
    has no nvcc (PyPI's nvidia-cuda-nvcc-cu12 ships only ptxas). Raises UsageError for a base the toolchain
    does not have, ArchError (exit 4: an impossible toolkit combination) naming the fixes for a source recipe
    on a base without nvcc."""
    if base_kind not in tc.bases:
        raise UsageError(f"Toolchain {tc.name} has no '{base_kind}' base (it has: {', '.join(tc.bases)}).")
    base = tc.bases[base_kind]
    if source_components and not base.has_nvcc:
        names = ", ".join(c.name for c in source_components)
        skips = " ".join(f"--skip {c.name}" for c in source_components)
        raise ArchError(f"The '{base_kind}' base of toolchain {tc.name} has no nvcc (PyPI's CUDA "
                        f"{tc.name.split('.')[0]} toolkit wheels carry no compiler), but {names} "
                        f"{'builds' if len(source_components) == 1 else 'build'} from source. Use --base nvidia "
                        f"(NVIDIA's devel image has nvcc), or {skips} to leave them out, or a CUDA 13.x toolchain "
                        "whose toolkit wheels ship nvcc.")


# ------------------------------------------------------------------------------------ arch knobs
@dataclass(frozen=True)
class ArchMapping:
    """What one component's arch knob becomes. ``knob``/``value`` empty for cmake-fixed styles;
    ``note`` says how the value was chosen; ``uncovered``: target archs no hard-coded arch covers."""

    knob: str
    value: str
    note: str
    uncovered: tuple[str, ...] = ()


def family_suffix(recipes: RecipeSet, tc: Toolchain, arch: Arch) -> str:
    """The suffix a FlashInfer-style explicit list gets for ``arch`` on ``tc``: ``f`` where the toolkit
    has family targets (CUDA >= 12.9 per the recipes), else ``a``, else none (case C4)."""
    cuda = _v(tc.cuda_version)
    for sfx in ("f", "a"):
        rule = recipes.suffixes.get(sfx)
        if not rule or cuda < _v(rule["min_cuda"]):
            continue
        if "min_arch" in rule and (arch.major, arch.minor) < _v(rule["min_arch"])[:2]:
            continue
        return sfx
    return ""


def map_archs(recipes: RecipeSet, tc: Toolchain, ak: ArchKnob, archs: list[Arch]) -> ArchMapping:
    """Map the target arch list onto a component's own knob (see ``arch_knob`` in recipes.py)."""
    if ak.style == "torch-list":
        return ArchMapping(ak.knob, ak.separator.join(str(a) for a in archs), "target archs as written")
    if ak.style == "numbers":
        stripped = [a for a in archs if a.suffix]
        note = "compute capability as an integer (major*10+minor)"
        if stripped:
            note += f"; suffix dropped for {', '.join(map(str, stripped))} (this knob takes plain numbers)"
        vals = []
        for a in archs:
            if str(a.number) not in vals:
                vals.append(str(a.number))
        return ArchMapping(ak.knob, ak.separator.join(vals), note)
    if ak.style == "suffixed":
        vals, why = [], []
        for a in archs:
            if a.suffix:
                vals.append(f"{a.cc}{a.suffix}")
                why.append(f"{a.cc}{a.suffix} as given")
            else:
                sfx = family_suffix(recipes, tc, a)
                vals.append(f"{a.cc}{sfx}")
                why.append(f"{a.cc}{sfx}: " + ("family target, CUDA >= 12.9" if sfx == "f" else
                                               "arch-specific, no family targets before CUDA 12.9" if sfx == "a"
                                               else "no suffix exists for it"))
        return ArchMapping(ak.knob, ak.separator.join(vals), "explicit suffix (C4): " + "; ".join(why))
    # cmake-fixed (C10)
    cuda = _v(tc.cuda_version)
    built = [parse_arch(spec) for spec, min_cuda in ak.covers if cuda >= _v(min_cuda)]
    uncovered = tuple(str(a) for a in archs if not any(b.sass_runs_on(a) for b in built))
    ignored = f"; ignores {', '.join(ak.ignores)}" if ak.ignores else ""
    note = (f"archs hard-coded in its build files for CUDA {tc.cuda_version}: "
            f"{', '.join(b.sm for b in built) or 'none'}{ignored}")
    return ArchMapping("", "", note, uncovered)


# ---------------------------------------------------------------------------------- memory rule
@dataclass(frozen=True)
class Resources:
    """The builder's resources. ``cores``: CPUs usable; ``mem_gib``: memory the jobs may count on
    (the smaller of the total and the cgroup limit); ``origin``: where the numbers come from."""

    cores: int
    mem_gib: float
    origin: str = "host"


def memory_rule(par: Parallelism, res: Resources, max_jobs: int | None = None,
                nvcc_threads: int | None = None) -> list[Knob]:
    """Derive the parallelism knobs of one source recipe (case C8).

    Rule: ``jobs = max(1, min(cores, floor(HEADROOM * mem / per_job)))`` where ``per_job`` is the recipe's
    ``memory_gib_per_job`` (declared at ``nvcc_threads`` threads; scaled up when more threads are asked
    for); ``threads = max(1, min(recipe nvcc_threads, cores // jobs))``. ``max_jobs`` / ``nvcc_threads``
    (the CLI flags) replace the derived values and are marked source "cli". Returns one Knob per name in
    ``jobs_knobs`` and ``threads_knobs``, each with the rule and the numbers in ``why``.
    """
    if max_jobs is not None and max_jobs < 1:
        raise UsageError(f"--max-jobs {max_jobs}: give a positive number of compile jobs.")
    if nvcc_threads is not None and nvcc_threads < 1:
        raise UsageError(f"--nvcc-threads {nvcc_threads}: give a positive number of threads.")
    per_job = par.memory_gib_per_job
    if nvcc_threads is not None and nvcc_threads > par.nvcc_threads:
        per_job = per_job * nvcc_threads / par.nvcc_threads
    usable = HEADROOM * res.mem_gib
    by_mem = math.floor(usable / per_job)
    if max_jobs is not None:
        jobs, jsrc = max_jobs, "cli"
        jwhy = f"--max-jobs {max_jobs} (the rule would give {max(1, min(res.cores, by_mem))})"
        if max_jobs * per_job > usable:
            jwhy += f"; WARNING: {max_jobs} x {per_job:g} GiB > {usable:.1f} GiB usable, expect OOM kills"
    else:
        jobs, jsrc = max(1, min(res.cores, by_mem)), "memory-rule"
        jwhy = (f"min({res.cores} cores, floor({HEADROOM:g} x {res.mem_gib:.1f} GiB / {per_job:g} GiB per job) "
                f"= {by_mem}) = {jobs}" + (" (at least 1)" if by_mem < 1 else "") + f" [{res.origin}]")
    if nvcc_threads is not None:
        threads, tsrc, twhy = nvcc_threads, "cli", f"--nvcc-threads {nvcc_threads}"
    else:
        threads, tsrc = max(1, min(par.nvcc_threads, res.cores // jobs)), "memory-rule"
        twhy = (f"min(recipe {par.nvcc_threads}, {res.cores} cores // {jobs} jobs) = {threads}; "
                f"budget {par.memory_gib_per_job:g} GiB per job at {par.nvcc_threads} threads")
    return ([Knob(k, str(jobs), jsrc, jwhy) for k in par.jobs_knobs]
            + [Knob(k, str(threads), tsrc, twhy) for k in par.threads_knobs])


def nvcc_gencode_flags(arch_list: str) -> list[str]:
    """The ``-gencode`` flags FlashInfer's CompilationContext passes to nvcc for a suffixed
    ``FLASHINFER_CUDA_ARCH_LIST`` ("12.0f" -> ``-gencode=arch=compute_120f,code=sm_120f``; flashinfer
    0.7.2 ``compilation_context.py`` get_nvcc_flags_list: a suffixed entry is used verbatim). Shown in the
    dry run of an ``aot`` node; raises UsageError for an entry that is not ``major.minor[a|f]``."""
    out = []
    for word in arch_list.split():
        m = re.fullmatch(r"(\d+)\.(\d)([af]?)", word)
        if not m:
            raise UsageError(f"FLASHINFER_CUDA_ARCH_LIST entry '{word}' is not an arch like 12.0a or 12.0f.")
        n = f"{m.group(1)}{m.group(2)}{m.group(3)}"
        out.append(f"-gencode=arch=compute_{n},code=sm_{n}")
    return out


def _cgroup_value(*paths: str) -> str | None:
    for p in paths:
        try:
            return Path(p).read_text().strip()
        except OSError:
            continue
    return None


def host_resources() -> Resources:
    """This host's usable cores (affinity and cgroup CPU quota) and memory (the smaller of MemTotal and the
    cgroup limit), from /proc and /sys/fs/cgroup. Units: cores, GiB. MemAvailable is not an input: it moves
    with the load (a running compile), and a dry run must print the MAX_JOBS the build will use."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_value("/sys/fs/cgroup/cpu.max")
    if quota and not quota.startswith("max"):
        q, period = quota.split()[:2]
        cores = max(1, min(cores, int(int(q) // int(period))))
    mem = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            k, v = line.split(":", 1)
            mem[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    total = mem.get("MemTotal", 0)
    limit = _cgroup_value("/sys/fs/cgroup/memory.max")
    candidates = [total] if total else []
    if limit and limit.isdigit():
        candidates.append(int(limit))
    gib = min(candidates) / 2**30 if candidates else 1.0
    cg = f", cgroup limit {int(limit) / 2**30:.1f} GiB" if limit and limit.isdigit() else ""
    return Resources(cores, round(gib, 1), f"host: {cores} cores, MemTotal {total / 2**30:.1f} GiB{cg}")
