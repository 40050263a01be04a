"""What can hold one release of a toolchain's component back, read from the package index: the checks
behind the upgrade radar (:mod:`cudastack.radar.walk`, which walks each component's releases with them).

:class:`Checker` holds one toolchain's view (its base Python and glibc, the wheel tags and PEP 508 marker
environment they give, the recipe pins as :class:`Pin`) and answers, for a candidate release, the reasons
it is held back. The reasons (each names its source):

* ``pin``: the engine's ``Requires-Dist`` (the pinned sglang's core metadata, read from the index)
  excludes it, or the candidate's own ``Requires-Dist`` excludes another component's pinned release
  (sglang-kernel 0.4.10 requires ``torch==2.14.1``): moving one component alone is refused;
* ``python-tag``: no wheel the toolchain's base Python (``toolchains.yaml`` bases.<default>.python, on
  Linux x86_64 with the base OS's glibc) can install, and no sdist for a source recipe;
* ``cuda-variant``: torch's PyPI build targets another CUDA (read from its ``Requires-Dist``:
  ``cuda-toolkit[...]==13.2.2`` is a CUDA 13.2 build, ``nvidia-cuda-runtime-cu12==12.8.90`` a 12.8
  build); a kernel wheel (sgl-kernel, sglang-kernel) links another CUDA major's runtime (the
  ``libcudart.so.<major>`` its shared objects need, read with range requests: sglang-kernel 0.4.1 needs
  ``.so.12``, 0.4.10 ``.so.13``). A torch build whose CUDA is newer than the toolchain's toolkit, or of another major, belongs to
  another toolchain line. cuda-toolkit itself stays within its toolchain's major.minor line: a new minor
  is a new toolchain (one ``toolchains.yaml`` entry).
* For the engine (sglang) itself: a release whose pins cannot be met on this toolchain at all (its torch
  pin has no build for this CUDA line or Python).
"""
from __future__ import annotations

from dataclasses import dataclass

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from cudastack.core.errors import StackError
from cudastack.pkgindex.client import Index, IndexFile
from cudastack.pkgindex.wheels import marker_env, supported_tags
from cudastack.recipes.load import RecipeSet, Toolchain
from cudastack.radar.gates import pick_file
from stackprobe.api import version_tuple

ENGINE = "sglang"
COMPONENTS = ("torch", "flash-attn", "sglang-kernel", "sgl-kernel", "flashinfer-python", "flashinfer-cubin",
              "sglang", "cuda-toolkit")
STACK = set(COMPONENTS) - {"cuda-toolkit"}
#: per engine (the first package its runtime recipe pins): the rows of its radar, in order. vLLM's chain is its
#: own torch, FlashInfer as vLLM pins it, b12x (the `vllm[b12x]` extra) and vllm itself.
ENGINE_COMPONENTS = {"sglang": COMPONENTS,
                     "vllm": ("torch", "flashinfer-python", "b12x", "vllm", "cuda-toolkit")}
#: extras of the engine the image installs, whose Requires-Dist count as the engine's pins (vllm[b12x]: b12x==1.5.1)
ENGINE_EXTRAS = {"vllm": ("b12x",)}
KERNELS = {"sglang-kernel", "sgl-kernel"}   # compiled wheels whose CUDA build is read from their libcudart soname
# glibc of the base OS images (Debian 12 bookworm ships glibc 2.36; Ubuntu 24.04 ships 2.39, 22.04 2.35)
_GLIBC = {"bookworm": (2, 36), "trixie": (2, 41), "ubuntu24.04": (2, 39), "ubuntu22.04": (2, 35)}


@dataclass
class Pin:
    name: str
    version: str
    where: str                     # "recipes/torch.yaml toolchains.13.1"
    method: str = "wheel"          # wheel | source
    locked: str | None = None      # version in lockfiles/<tc>.lock.yaml (None: not locked)



# ------------------------------------------------------------------------------------ pins
def _base_env(tc: Toolchain) -> tuple[str, tuple[int, int], str]:
    b = tc.bases[tc.default_base]
    key = b.os_suite or next((k for k in _GLIBC if k in (b.image or "")), "")
    glibc = _GLIBC.get(key, (2, 28))
    return b.python, glibc, f"{tc.default_base} base: Python {b.python}, glibc {glibc[0]}.{glibc[1]} ({key or 'assumed'})"


def engine_runtimes(recipes: RecipeSet, tc: Toolchain) -> dict[str, str]:
    """{runtime node: engine} of toolchain ``tc``, in file order: the runtime nodes the toolchain takes, each with
    the first package its recipe pins (sglang, vllm). Empty when the recipes have no runtime."""
    from cudastack.recipes.graph import stacks

    out = {}
    for label, _ in stacks(recipes.components, tc.name):
        if label:
            pkgs = recipes.components[label].toolchains[tc.name].packages
            out[label] = canonicalize_name(Requirement(pkgs[0]).name) if pkgs else ""
    return out


def recipe_pins(recipes: RecipeSet, tc: Toolchain, runtime: str | None = None) -> dict[str, Pin]:
    """Every package the image chain of runtime node ``runtime`` pins for toolchain ``tc`` (canonical name -> Pin;
    default: SGLang's chain, the first runtime), cuda-toolkit from the toolchain. One chain only: vLLM's torch
    2.14.0 never stands in SGLang's row, nor SGLang's 2.14.1 in vLLM's."""
    from cudastack.recipes.graph import chain_pins

    out: dict[str, Pin] = {}
    for name, (version, c) in chain_pins(recipes.components, tc.name, runtime).items():
        e = c.toolchains[tc.name]
        where = f"recipes/{c.file.name} toolchains.{tc.name}"
        sd = e.sdist and canonicalize_name(e.sdist["package"]) == name
        out[name] = Pin(name, str(version), where, "source" if sd else "wheel")
    out["cuda-toolkit"] = Pin("cuda-toolkit", tc.cuda_version,
                              f"recipes/toolchains.yaml toolchains.{tc.name}.cuda_version", "toolchain")
    return out


# ------------------------------------------------------------------------------------ the checker
class Checker:
    """Reads the index for one toolchain: files a Python can install, torch's CUDA build, Requires-Dist."""

    def __init__(self, index: Index, recipes: RecipeSet, tc: Toolchain, runtime: str | None = None):
        """``runtime``: the runtime node whose image chain and engine this view answers for (default: the first,
        SGLang's); its engine is the first package the runtime recipe pins."""
        self.index, self.recipes, self.tc = index, recipes, tc
        self.python, self.glibc, self.base_note = _base_env(tc)
        self.tags = set(supported_tags(self.python, self.glibc))
        self.env = marker_env(self.python)
        runtimes = engine_runtimes(recipes, tc)
        self.runtime = runtime or next(iter(runtimes), None)
        self.engine = runtimes.get(self.runtime, ENGINE) if self.runtime else ENGINE
        self.components = ENGINE_COMPONENTS.get(self.engine, COMPONENTS)
        self.stack = set(self.components) - {"cuda-toolkit"}
        self.pins = recipe_pins(recipes, tc, self.runtime)
        self.cuda = version_tuple(tc.cuda_version)[:2]

    def file_for(self, name: str, v: Version, method: str = "wheel") -> IndexFile | None:
        fs = [f for f in self.index.project(name).files.get(v, []) if not f.yanked]
        if method == "source":
            return next((f for f in fs if f.kind == "sdist"), None)
        ok = [f for f in fs if f.kind == "wheel" and f.tags & self.tags]
        return pick_file(ok, self.python, self.glibc) if ok else None

    def requires(self, name: str, v: Version, method: str = "wheel") -> tuple[dict[str, Requirement], str]:
        f = self.file_for(name, v, method) or pick_file(self.index.project(name).files.get(v, []), self.python, self.glibc)
        if f is None:
            return {}, ""
        reqs = list(self.index.requires(f, self.env))
        if canonicalize_name(name) == self.engine:     # the extras the image installs (vllm[b12x]) pin too
            for extra in ENGINE_EXTRAS.get(self.engine, ()):
                reqs += [r for r in self.index.requires(f, dict(self.env, extra=extra)) if r.marker is not None]
        return {canonicalize_name(r.name): r for r in reqs}, f.filename

    def torch_cuda(self, v: Version) -> tuple[tuple[int, int] | None, str]:
        """(major, minor) of the CUDA that torch ``v``'s installable wheel is built for, and the evidence."""
        reqs, fn = self.requires("torch", v)
        for n, r in reqs.items():
            spec = next(iter(r.specifier), None)
            if spec is None or spec.operator != "==":
                continue
            if n == "cuda-toolkit" or n == "nvidia-cuda-runtime" or n.startswith("nvidia-cuda-runtime-cu"):
                major, minor = version_tuple(spec.version)[:2]
                return (major, minor), f"{fn}: Requires-Dist {r.name}=={spec.version}"
        return None, f"{fn}: no CUDA runtime in Requires-Dist (a CPU build?)"

    # -- hold-back reasons for one candidate release
    def reasons(self, name: str, v: Version, engine_reqs: dict[str, Requirement], engine_label: str,
                method: str) -> list[str]:
        out: list[str] = []
        if name == "cuda-toolkit":
            if version_tuple(str(v))[:2] != self.cuda:
                out.append(f"toolchain line: cuda-toolkit {v} is CUDA {v.major}.{v.minor}, toolchain {self.tc.name} "
                           f"is the {self.tc.name} line (a newer CUDA is a new toolchains.yaml entry)")
            return out
        f = self.file_for(name, v, method)
        if f is None:
            fs = self.index.project(name).files.get(v, [])
            kinds = sorted({t.interpreter for f2 in fs for t in f2.tags}) or ["sdist only"]
            out.append(f"python-tag: no {'sdist' if method == 'source' else 'wheel'} for Python {self.python} on "
                       f"Linux x86_64 glibc {self.glibc[0]}.{self.glibc[1]} (files: {', '.join(kinds)})")
            return out
        if name == "torch":
            cu, ev = self.torch_cuda(v)
            if cu is None or cu[0] != self.cuda[0] or cu > self.cuda:
                what = "no CUDA build" if cu is None else f"CUDA {cu[0]}.{cu[1]}"
                out.append(f"cuda-variant: torch {v}'s PyPI build is {what} ({ev}); toolchain {self.tc.name} is "
                           f"CUDA {self.tc.cuda_version}")
        if name in KERNELS:
            major, ev = self.index.cuda_runtime_major(f)
            if major is not None and major != self.cuda[0]:
                out.append(f"cuda-variant: {name} {v} is a CUDA {major} build ({ev}); toolchain {self.tc.name} is "
                           f"CUDA {self.tc.cuda_version}")
        if name in engine_reqs and name != self.engine and not engine_reqs[name].specifier.contains(v, prereleases=True):
            out.append(f"pin: {engine_label} Requires-Dist `{engine_reqs[name]}`")
        own, fn = self.requires(name, v, method)
        for dep, r in own.items():
            if dep not in self.stack or dep == name:
                continue
            if name == self.engine:
                ok, why = self.satisfiable(dep, r)
                if not ok:
                    out.append(f"pin: {name} {v} Requires-Dist `{r}`, {why}")
            elif dep in self.pins and not r.specifier.contains(self.pins[dep].version, prereleases=True):
                out.append(f"pin: {name} {v} Requires-Dist `{r}` but {self.pins[dep].where} pins "
                           f"{dep} {self.pins[dep].version}")
        return out

    def satisfiable(self, dep: str, r: Requirement) -> tuple[bool, str]:
        """Whether some release of ``dep`` within ``r`` can go on this toolchain (Python tag, CUDA build)."""
        try:
            proj = self.index.project(dep)
        except StackError as e:
            return False, f"{dep} cannot be read from the index ({e})"
        cands = [v for v in reversed(proj.versions(True)) if r.specifier.contains(v, prereleases=True)][:4]
        if not cands:
            return False, f"no {dep} release on the index matches"
        why = []
        for v in cands:
            rs = self.reasons(dep, v, {}, "", self.pins.get(dep, Pin(dep, "", "")).method)
            rs = [x for x in rs if not x.startswith("pin:")]
            if not rs:
                return True, ""
            why.append(rs[0])
        return False, why[0]
