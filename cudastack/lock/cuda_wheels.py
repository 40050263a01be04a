"""One CUDA release per toolchain in a locked closure (case C25).

PyPI's CUDA 13 component wheels (nvidia-cuda-nvcc, -crt, -cccl, -runtime, -nvrtc, -cupti, nvidia-nvvm, ...)
all install into one ``site-packages/nvidia/cu13`` tree, and their versions carry the CUDA release
(13.0.88 is CUDA 13.0; the cccl wheel 13.3.5.0.6 is CCCL 3.5.0 of CUDA 13.5:
:func:`stackprobe.archs.cuda_wheel_release`). A package that asks for a component without an upper bound
(sglang's ``humming-kernels[cu13]`` requires plain ``nvidia-cuda-nvcc`` and ``nvidia-cuda-cccl``) lets pip pick
the newest one while torch pins the runtime of its own release, and the tree mixes releases: nvcc 13.5 with
CUDA 13.0 runtime headers, which CCCL refuses ("CUDA compiler and CUDA toolkit headers are incompatible").

:func:`cohere` keeps them on one release: the one of ``nvidia-cuda-runtime`` (the runtime the stack loads,
pinned exactly by torch), re-resolving with ``name==<release>.*`` constraints; when pip cannot satisfy them,
it returns a note naming the requirements that force the mix.
"""
from __future__ import annotations

import re
from typing import Callable, Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from cudastack.core.errors import LockError
from stackprobe.api import cuda_wheel_release
#: the runtime whose release anchors the others (CUDA 13 name, then the CUDA 12 one)
ANCHORS = ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11")


def is_toolkit_wheel(name: str) -> bool:
    """A CUDA toolkit component wheel whose version is a CUDA release: ``nvidia-cuda-*`` (any -cu12 suffix)
    and ``nvidia-nvvm``; not the libraries versioned on their own (cuBLAS, cuDNN, NCCL)."""
    return name.startswith("nvidia-cuda-") or name in ("nvidia-nvvm", "nvidia-nvvm-cu12")


def releases(pkgs: list[dict]) -> dict[str, tuple[str, str]]:
    """{name: (version, CUDA release)} of the toolkit wheels in a resolved closure (``[{"name", "version"}]``)."""
    return {p["name"]: (p["version"], cuda_wheel_release(p["name"], p["version"]))
            for p in pkgs if is_toolkit_wheel(p["name"])}


def anchor(pkgs: list[dict]) -> Optional[str]:
    """The release the closure's toolkit wheels should share: ``nvidia-cuda-runtime``'s, else the most common."""
    rel = releases(pkgs)
    for a in ANCHORS:
        if a in rel:
            return rel[a][1]
    if not rel:
        return None
    counts: dict[str, int] = {}
    for _, r in rel.values():
        counts[r] = counts.get(r, 0) + 1
    return max(sorted(counts), key=counts.__getitem__)


def off_release(pkgs: list[dict]) -> dict[str, str]:
    """{name: version} of the toolkit wheels not on :func:`anchor`'s release (empty: coherent)."""
    a = anchor(pkgs)
    return {n: v for n, (v, r) in releases(pkgs).items() if a and r != a}


def requirers(name: str, requires: dict, specs: list[str], unbounded_only: bool = False) -> list[str]:
    """Who asks for ``name``: "<package> requires <requirement>" (with "(extra X)" when behind an extra)
    for each Requires-Dist naming it (``requires`` as :func:`cudastack.lock.pip_resolve` fills it) and
    "requested: <spec>" for a top-level spec; once each. ``unbounded_only``: only requirements without an
    upper bound or exact pin (the ones that let pip pick a newer release)."""
    out: list[str] = []
    for s in specs:
        r = _requirement(s)
        if r is not None and canonicalize_name(r.name) == name and not (unbounded_only and _bounded(r)):
            out.append(f"requested: {s}")
    for owner, info in sorted(requires.items()):
        for text in info.get("requires_dist", []):
            r = _requirement(text)
            if r is None or canonicalize_name(r.name) != name or (unbounded_only and _bounded(r)):
                continue
            extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", str(r.marker or ""))
            req = text.partition(";")[0].strip()
            line = f"{owner}{f' (extra {extra.group(1)})' if extra else ''} requires {req}"
            if line not in out:
                out.append(line)
    return out


def _requirement(text: str) -> Requirement | None:
    try:
        return Requirement(text)
    except InvalidRequirement:
        return None


def _bounded(req: Requirement) -> bool:
    """An exact pin or an upper bound (``==``, ``===``, ``<``, ``<=``, ``~=``): pip cannot pick a newer release."""
    return any(s.operator in ("==", "===", "<", "<=", "~=") for s in req.specifier)


def cohere(pkgs: list[dict], requires: dict, specs: list[str],
           resolve: Callable[[dict[str, str]], list[dict]]) -> tuple[list[dict], Optional[str]]:
    """Keep a closure's CUDA toolkit wheels on one release.

    ``pkgs``: pip's resolution; ``requires``: its Requires-Dist per package; ``specs``: the top-level
    requirements; ``resolve(constraints)``: resolve again with {name: specifier} constraints (e.g.
    ``{"nvidia-cuda-nvcc": "==13.0.*"}``), raising LockError when pip cannot. Returns (closure, note):
    the closure unchanged and no note when it is already coherent; the re-resolved closure and a note saying
    what was constrained; or the original closure and a note naming which requirements force the mix."""
    off = off_release(pkgs)
    if not off:
        return pkgs, None
    target = anchor(pkgs)
    cons = {n: f"=={target}.*" for n in off}
    try:
        again = resolve(cons)
    except LockError as e:
        why = "; ".join(r for n in sorted(off) for r in requirers(n, requires, specs)) or "no requirement names them"
        return pkgs, (f"CUDA toolkit wheels mix releases ({', '.join(f'{n} {v}' for n, v in sorted(off.items()))} "
                      f"beside CUDA {target}) and cannot be kept on {target}: {why}. pip: {str(e)[:300]}")
    left = off_release(again)
    if left:
        return pkgs, (f"CUDA toolkit wheels still mix releases after constraining them to {target}: "
                      + ", ".join(f"{n} {v}" for n, v in sorted(left.items())))
    moved = {p["name"]: p["version"] for p in again if p["name"] in off}
    forced_by = "; ".join(r for n in sorted(off) for r in requirers(n, requires, specs, unbounded_only=True))
    return again, (f"CUDA toolkit wheels kept on CUDA {target} (the release of nvidia-cuda-runtime): "
                   + ", ".join(f"{n} {off[n]} -> {moved.get(n, '?')}" for n in sorted(off))
                   + (f" (asked for without an upper bound by: {forced_by})" if forced_by else ""))
