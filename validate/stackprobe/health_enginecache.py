"""The engines' own compile caches read (part of check 8 of :mod:`stackprobe.health`, beside FlashInfer's in
:mod:`stackprobe.health_jitcache`): every compiled module an engine keeps on disk and would load before compiling,
checked like an installed one (the CUDA major of the libraries it links, its SASS for the target, the torch symbols
it needs), and every Triton cache entry checked against the target its key was made for.

Each layout is confirmed in the installed source (``marks``: strings its files must spell) before it is used; an
engine that is installed but spells none of the layouts read here is "not assessed: why", never "no errors".

Where the caches are, and when a cached module is loaded instead of compiled (read from the installed releases):

* **SGLang 0.5.23** (``sglang/kernels/jit/utils/compile``): ``$SGLANG_JIT_CACHE_DIR`` else ``~/.cache/sglang/jit``
  (``cache.py:317-319``, ``srt/environ.py:1397``); layout
  ``<root>/<target tag, e.g. sm90a>/<module>/build-<build_key>/deps-<deps_key>/<module>.so`` (``cache.py:15-21``;
  the tag ``cache.py:215-231``). ``load_jit`` looks a leaf up and loads it before compiling (``loader.py:135-138``);
  ``build_key`` folds in the target, the ``--version`` text of nvcc and the host compiler and the torch/tvm-ffi/
  FlashInfer versions (``cache.py:234-272``), and a leaf is a hit only if its recorded dependencies still hash to
  its name (``cache.py:369-419``); a cached module that fails to load is logged and rebuilt (``loader.py:139-146``).
  So a module of another CUDA major is loaded only while the nvcc that built it is the one found now: a warning.
* **SGLang 0.5.9** (``sglang/jit_kernel/utils.py:135,162-171``): ``tvm_ffi.cpp.load_inline`` with no build
  directory, so tvm-ffi's cache: ``$TVM_FFI_CACHE_DIR`` else ``~/.cache/tvm-ffi``, one folder
  ``<name>_<source hash>/`` holding ``<name>.so``, ``name`` = ``sgl_kernel_jit_<args>`` (apache-tvm-ffi 0.1.11
  ``cpp/extension.py:930-946``). The hash covers the sources and flags only (``extension.py:65-100``), not the
  compiler; ``build.ninja`` is rewritten only when its text changes (``extension.py:120-129``) and ``ninja``
  rebuilds only what is out of date (``extension.py:583-601``): a module built before the toolkit under the same
  path changed is what loads. Another CUDA major is an error.
* **vLLM 0.33.0**: ``$VLLM_CACHE_ROOT`` else ``$XDG_CACHE_HOME/vllm`` else ``~/.cache/vllm`` (``envs.py:340-345,
  712-719``); torch.compile artefacts under ``torch_compile_cache/<hash>/`` (``compilation/backends.py:1091-1097``),
  with Inductor's cache in ``inductor_cache/`` and Triton's in ``triton_cache/`` beside it, unless
  ``TRITON_CACHE_DIR`` was set by the caller (``compilation/compiler_interface.py:29-42``). The compiled graph is
  loaded from the cache before compiling (``compilation/backends.py:303-304``). Shared objects found there are
  checked like installed ones; its Triton entries as below.
* **SGLang 0.5.23 moves other caches at import**: ``import sglang`` runs ``redirect_third_party_caches()``
  (``sglang/__init__.py:10-14``), which ``setdefault``s ``TRITON_CACHE_DIR`` to ``$SGLANG_CACHE_DIR/triton`` and
  ``FLASHINFER_WORKSPACE_BASE`` to ``$SGLANG_CACHE_DIR`` (``srt/environ.py:2308-2336``; ``SGLANG_CACHE_DIR`` defaults
  to ``~/.cache/sglang``, ``:1383``): in an SGLang process Triton's and FlashInfer's caches are there, not at their
  own defaults (:func:`sglang_env`; both places are read).
* **Triton** (every engine's Triton kernels): ``$TRITON_CACHE_DIR`` else ``$TRITON_HOME/.triton/cache`` (triton
  3.9.0 ``knobs.py:345-355``; 3.2.0 ``runtime/cache.py:12-17,65``); one folder per key, holding ``<kernel>.json``
  (its ``"target": {"backend", "arch", "warp_size"}``) and ``<kernel>.cubin``. The key hashes Triton's own build,
  the kernel source, the backend's hash and the options (3.9.0 ``runtime/cache.py:319-321``; 3.2.0
  ``compiler/compiler.py:231``), the CUDA backend's hash being the ptxas version and the target arch (3.9.0
  ``backends/nvidia/compiler.py:675-677``; 3.2.0 ``:392-394``); an entry is reused when its metadata file exists
  under that key (3.9.0 ``compiler/compiler.py:264-270``; 3.2.0 ``:248-249``). So an entry made for another arch is
  never looked up here (said as info, not as staleness); what can run stale is an entry whose metadata names this
  target but whose cubin is for another SM (a copied or edited cache): an error.

:func:`scan` returns {"caches": [{"engine", "kind", "root", "source", "loader", "modules": [...], "triton": [...],
"other_targets": n}], "not_assessed": [{"what", "why"}]}; a module row is {"path", "module", "cuda", "mismatch",
"sass", "level", "symbols_missing", "finding": level or ""}; a Triton row {"path", "kernel", "arch", "cubin_sm",
"finding"}.
"""
from __future__ import annotations

import json
import os
from importlib import util
from pathlib import Path
from typing import Any

from . import health_elf as elf

#: per layout: the engine distribution, its files (relative to the package named first) and what they must spell
LAYOUTS: dict[str, dict[str, Any]] = {
    "sglang-jit": {
        "dist": "sglang", "package": "sglang",
        "files": {"kernels/jit/utils/compile/cache.py": ("SGLANG_JIT_CACHE_DIR", '"~/.cache/sglang/jit"',
                                                          '_BUILD_KEY_PREFIX = "build-"', '_DEPS_KEY_PREFIX = "deps-"',
                                                          '"--version"'),
                  "kernels/jit/utils/compile/loader.py": ("_find_prebuilt(spec=spec, scope=scope)",
                                                           "return _load(prebuilt)")},
        "env": "SGLANG_JIT_CACHE_DIR", "default": "~/.cache/sglang/jit",
        "cuda_level": "warning",
        "loader": ("SGLang loads a cached leaf before compiling (kernels/jit/utils/compile/loader.py:135-138), but "
                   "its build_key includes nvcc's --version (cache.py:234-272) and a failed load is rebuilt "
                   "(loader.py:139-146): this module is loaded only while the nvcc that built it is the one found"),
    },
    "sglang-tvm-ffi": {
        "dist": "sglang", "package": "sglang",
        "files": {"jit_kernel/utils.py": ("from tvm_ffi.cpp import load_inline", '"sgl_kernel_jit_"',
                                          "build_directory=build_directory")},
        "also": ("tvm_ffi", {"cpp/extension.py": ("TVM_FFI_CACHE_DIR", '"~/.cache/tvm-ffi"',
                                                  'f"{name}_{source_hash}"', "def _maybe_write")}),
        "env": "TVM_FFI_CACHE_DIR", "default": "~/.cache/tvm-ffi",
        "cuda_level": "error",
        "loader": ("SGLang's JIT kernels build through tvm_ffi.cpp.load_inline, whose cache folder is keyed on the "
                   "sources and flags, not the compiler (tvm_ffi/cpp/extension.py:65-100, 930-946), and ninja "
                   "rebuilds only what is out of date (extension.py:583-601): this file is what loads"),
    },
    "vllm-torch-compile": {
        "dist": "vllm", "package": "vllm",
        "files": {"compilation/backends.py": ('"torch_compile_cache"', "envs.VLLM_CACHE_ROOT",
                                              "compiled_graph = self.load("),
                  "compilation/compiler_interface.py": ('"inductor_cache"', '"triton_cache"', "TRITON_CACHE_DIR"),
                  "envs.py": ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME")},
        "env": "VLLM_CACHE_ROOT", "default": "", "sub": "torch_compile_cache",
        "cuda_level": "warning",
        "loader": ("vLLM loads a compiled graph from torch_compile_cache before compiling "
                   "(vllm/compilation/backends.py:303-304), from the folder its env/config/code/compiler hash names "
                   "(backends.py:1091-1097)"),
    },
}
#: what SGLang must spell for its import-time redirect (:func:`sglang_env`)
SGLANG_REDIRECT = {"__init__.py": ("_redirect_third_party_caches()",),
                   "srt/environ.py": ("def third_party_cache_defaults", '"TRITON_CACHE_DIR": os.path.join(base, "triton")',
                                      '"FLASHINFER_WORKSPACE_BASE": base', 'SGLANG_CACHE_DIR = EnvStr(os.path.expanduser'
                                      '("~/.cache/sglang"))', "os.environ.setdefault(key, value)")}
#: what the installed triton must spell for the cache rules above (3.2.0: runtime/cache.py; 3.9.0: knobs.py)
TRITON_MARKS = ("TRITON_CACHE_DIR", "TRITON_HOME", ".triton")
TRITON_KEY_MARKS = ("triton_key()", "backend.hash()")


def _package_dir(name: str) -> Path | None:
    try:
        spec = util.find_spec(name)
    except (ImportError, ValueError):
        return None
    locs = list(spec.submodule_search_locations or []) if spec else []
    return Path(locs[0]) if locs else None


def _spelled(root: Path | None, files: dict) -> tuple[bool, str]:
    """(True, files read) when every file under ``root`` spells its marks, else (False, what is missing)."""
    if root is None:
        return False, "package folder not found"
    for rel, marks in files.items():
        try:
            text = (root / rel).read_text(errors="replace")
        except OSError:
            return False, f"{rel} absent"
        missing = [m for m in marks if m not in text]
        if missing:
            return False, f"{rel} lacks {', '.join(missing)}"
    return True, ", ".join(str(root / r) for r in files)


def _layout_spelled(lay: dict) -> tuple[bool, str]:
    """:func:`_spelled` for every package a layout reads: its engine's ``files``, then the ``also`` package's (a
    missing mark there is said with that package's name first). (True, the files read) or (False, what is missing)."""
    read = []
    for i, (package, files) in enumerate([(lay["package"], lay["files"]), *([lay["also"]] if lay.get("also") else [])]):
        ok, where = _spelled(_package_dir(package), files)
        if not ok:
            return False, f"{package} {where}" if i else where
        read.append(where)
    return True, ", ".join(read)


def layout_root(name: str, env=None) -> Path:
    """The cache folder of layout ``name`` under environment ``env`` (default ``os.environ``)."""
    env = os.environ if env is None else env
    lay = LAYOUTS[name]
    if name == "vllm-torch-compile":
        base = env.get("VLLM_CACHE_ROOT") or os.path.join(
            env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm")
        return Path(os.path.expanduser(base)) / lay["sub"]
    return Path(os.path.expanduser(env.get(lay["env"]) or lay["default"]))


def sglang_env(dists: dict, env=None) -> dict | None:
    """The environment an SGLang process runs with after ``import sglang`` redirected the third-party caches
    (``TRITON_CACHE_DIR``, ``FLASHINFER_WORKSPACE_BASE`` set where unset, under ``$SGLANG_CACHE_DIR``), or None when
    SGLang is not installed or does not spell that redirect (then nothing moves)."""
    env = dict(os.environ if env is None else env)
    if dists.get("sglang") is None or not _spelled(_package_dir("sglang"), SGLANG_REDIRECT)[0]:
        return None
    base = os.path.expanduser(env.get("SGLANG_CACHE_DIR") or "~/.cache/sglang")
    env.setdefault("TRITON_CACHE_DIR", os.path.join(base, "triton"))
    env.setdefault("FLASHINFER_WORKSPACE_BASE", base)
    return env


def triton_root(env=None) -> Path:
    """Triton's default cache folder: ``$TRITON_CACHE_DIR``, else ``$TRITON_HOME/.triton/cache``."""
    env = os.environ if env is None else env
    named = (env.get("TRITON_CACHE_DIR") or "").strip()
    if named:
        return Path(named)
    return Path(env.get("TRITON_HOME") or os.path.expanduser("~")) / ".triton" / "cache"


def target_number(target) -> int:
    return target.major * 10 + target.minor


def check_module(path: Path, stack_major: int | None, target, torch_dirs: list) -> dict:
    """One cached shared object checked like an installed extension: {"path", "cuda", "mismatch", "sass", "level",
    "symbols_missing" (None: not judged), "symbols_note", "error"}."""
    from .coverage import SASS_LEVELS, level_for, read_elf

    row: dict = {"path": str(path), "cuda": {}, "mismatch": [], "sass": [], "level": "", "symbols_missing": None}
    try:
        majors = elf.cuda_majors(elf.needed(str(path)))
        ims = read_elf(str(path))
    except Exception as e:  # noqa: BLE001 - an unreadable cached module is said, not skipped
        row["error"] = f"not assessed: {type(e).__name__}: {e}"
        return row
    row["cuda"] = majors
    row["mismatch"] = sorted(s for s, m in majors.items() if stack_major is not None and m != stack_major)
    row["sass"] = sorted({i.name for i in ims if i.kind == "sass"})
    row["level"] = (level_for(ims, target) if ims else "no device code") if target is not None else "not assessed"
    row["arch_bad"] = bool(ims) and target is not None and row["level"] not in SASS_LEVELS + ("ptx-only",)
    if any(s.startswith(("libc10", "libtorch")) for s in elf.needed(str(path))):
        if not torch_dirs:
            row["symbols_note"] = "not assessed: torch's lib folder not found"
        else:
            try:
                res = elf.missing_symbols(str(path), torch_dirs)
                if res.get("undecided"):
                    row["symbols_note"] = f"not assessed: {res['undecided']}"
                else:
                    row["symbols_missing"] = [m["demangled"] for m in res["missing"]]
            except Exception as e:  # noqa: BLE001
                row["symbols_note"] = f"not assessed: {type(e).__name__}: {e}"
    return row


def triton_entries(root: Path, target) -> tuple[list[dict], int, int]:
    """(rows for entries whose metadata names ``target``, entries for other CUDA targets, entries not CUDA) of a
    Triton cache folder. A row: {"path", "kernel", "arch", "cubin_sm", "finding", "why"}."""
    from .coverage import cubin_arch
    from .elfread import ELF

    rows: list[dict] = []
    other = foreign = 0
    if not root.is_dir():
        return rows, other, foreign
    for meta in sorted(root.glob("*/*.json")):
        if meta.name.startswith("__grp__"):
            continue
        try:
            data = json.loads(meta.read_text())
            tgt = data.get("target") or {}
        except (OSError, ValueError, AttributeError):
            continue   # not a kernel's metadata (autotuning results and the like share the folder)
        if not isinstance(tgt, dict) or "arch" not in tgt:
            continue
        if tgt.get("backend") != "cuda":
            foreign += 1
            continue
        if target is None or tgt.get("arch") != target_number(target):
            other += 1
            continue
        row = {"path": str(meta), "kernel": meta.stem, "arch": tgt.get("arch"), "cubin_sm": None, "finding": ""}
        cubin = meta.with_suffix(".cubin")
        if not cubin.is_file():
            row["why"] = "not assessed: no .cubin beside the metadata"
        else:
            try:
                with ELF(str(cubin)) as e:
                    a = cubin_arch(e) if e.osabi == 0x41 else None
                row["cubin_sm"] = a.major * 10 + a.minor if a else None
                if a is None:
                    row["why"] = "not assessed: the .cubin is no CUDA ELF this reader knows"
                elif row["cubin_sm"] != tgt.get("arch"):
                    row["finding"] = "error"
                    row["why"] = (f"its metadata names sm_{tgt.get('arch')} (this target), so Triton reuses it by key "
                                  f"(compiler/compiler.py: metadata found under the key -> CompiledKernel), but the "
                                  f"cubin is {a.sm}: the launch fails with no kernel image for this device")
            except Exception as ex:  # noqa: BLE001
                row["why"] = f"not assessed: {type(ex).__name__}: {ex}"
        rows.append(row)
    return rows, other, foreign


def _tag_matches(tag: str, target) -> bool:
    """SGLang's target tag (``sm90a``; cache.py:215-231) names ``target``."""
    base = f"sm{target.major}{target.minor}"
    return tag == base or (tag.startswith(base) and tag[len(base):].isalpha())


def _modules(name: str, root: Path, target) -> tuple[list[tuple[str, Path]], int]:
    """([(module, .so path)] the layout would consider for ``target``, count under other targets)."""
    out: list[tuple[str, Path]] = []
    other = 0
    if not root.is_dir():
        return out, other
    if name == "sglang-jit":
        for so in sorted(root.glob("*/*/build-*/deps-*/*.so")):
            module, tag = so.parents[2].name, so.parents[3].name
            if so.stem != module:
                continue
            if target is not None and not _tag_matches(tag, target):
                other += 1
                continue
            out.append((module, so))
    elif name == "sglang-tvm-ffi":
        for so in sorted(root.glob("sgl_kernel_jit_*/sgl_kernel_jit_*.so")):
            if so.parent.name.startswith(so.stem + "_"):
                out.append((so.stem, so))
    else:
        out = [(so.stem, so) for so in sorted(root.rglob("*.so")) if "triton_cache" not in so.parts]
    return out, other


def scan(dists: dict, stack_major: int | None, target, env=None, torch_dirs: list[str] | None = None) -> dict:
    """The engines' caches under ``env`` (default ``os.environ``) for the installed engines (``dists``: normalised
    name -> distribution). ``target`` an :class:`stackprobe.archs.Arch` or None. See the module doc."""
    out: dict = {"caches": [], "not_assessed": []}
    if torch_dirs is None:
        from . import health as h
        torch_dirs = h.torch_lib_dirs()
    read_by: dict = {}
    for name, lay in LAYOUTS.items():
        d = dists.get(lay["dist"])
        if d is None:
            continue
        ok, where = _layout_spelled(lay)
        read_by.setdefault(lay["dist"], []).append("" if ok else f"{name}: {where}")
        if not ok:
            continue
        root = layout_root(name, env)
        mods, other = _modules(name, root, target)
        cache = {"engine": f"{lay['dist']} {d.version}", "kind": name, "root": str(root), "source": where,
                 "loader": lay["loader"], "modules": [], "triton": [], "other_targets": other}
        for module, so in mods:
            row = dict(check_module(so, stack_major, target, torch_dirs), module=module)
            row["finding"] = (lay["cuda_level"] if row["mismatch"] or row.get("symbols_missing") else
                              "warning" if row.get("arch_bad") else "")
            cache["modules"].append(row)
        if name == "vllm-torch-compile" and root.is_dir():
            for tdir in sorted(root.glob("*/triton_cache")):
                rows, o, _ = triton_entries(tdir, target)
                cache["triton"] += rows
                cache["other_targets"] += o
        out["caches"].append(cache)
    for dist, results in read_by.items():
        if not any(r == "" for r in results):
            out["not_assessed"].append({"what": f"{dist} {dists[dist].version}'s compile cache",
                                        "why": "its source spells no cache layout this suite reads ("
                                               + "; ".join(results) + ")"})
    tri = dists.get("triton")
    if tri is not None:
        _triton_cache(tri, target, env, out, dists)
    return out


def _triton_cache(tri, target, env, out: dict, dists: dict) -> None:
    """Triton's process-wide cache (the installed triton's rules confirmed first) into ``out``."""
    troot = _package_dir("triton")
    texts = ""
    for rel in ("runtime/cache.py", "knobs.py", "compiler/compiler.py"):
        try:
            texts += (troot / rel).read_text(errors="replace") if troot else ""
        except OSError:
            pass
    missing = [m for m in TRITON_MARKS + TRITON_KEY_MARKS if m not in texts]
    if troot is None or missing:
        out["not_assessed"].append({"what": f"Triton {tri.version}'s kernel cache",
                                    "why": f"its runtime/cache.py, knobs.py and compiler/compiler.py lack "
                                           f"{', '.join(missing) or 'everything'}"})
        return
    roots = [(triton_root(env), "triton")]
    sg = sglang_env(dists, env)
    if sg is not None and triton_root(sg) != roots[0][0]:
        roots.append((triton_root(sg), "triton (where import sglang points it)"))
    for root, kind in roots:
        rows, other, _ = triton_entries(root, target)
        out["caches"].append({"engine": f"triton {tri.version}", "kind": kind, "root": str(root),
                              "source": str(troot), "loader": "Triton reuses an entry found under its key "
                              "(triton_key, source, ptxas version and target arch, options)",
                              "modules": [], "triton": rows, "other_targets": other})


def unread(scanned: dict) -> list[dict]:
    """The cached modules and Triton entries :func:`scan` found but could not judge, as not-assessed entries
    ({"what", "why"}) for the health section: a module whose target level or torch symbols were not read
    (``level`` / ``symbols_note`` "not assessed: ..."), a Triton entry with no readable cubin. A cache that could
    not be judged is said so, never counted as read and clean."""
    out = []
    for c in (scanned or {}).get("caches", []):
        for m in c["modules"]:
            for why in (m.get("symbols_note"), "no target given" if m.get("level") == "not assessed" else None):
                if why:
                    out.append({"what": f"{c['engine']}'s cached module {m['path']}",
                                "why": why.removeprefix("not assessed: ")})
        for t in c["triton"]:
            if not t["finding"] and str(t.get("why", "")).startswith("not assessed"):
                out.append({"what": f"Triton cache entry {t['path']} ({c['engine']}'s {c['kind']} cache)",
                            "why": t["why"].removeprefix("not assessed: ")})
    return out


def findings(scanned: dict, stack_cuda: str | None) -> list[dict]:
    """Findings (check ``engine_cache``) for the rows :func:`scan` flagged, plus one info line per cache read."""
    out = []
    for c in (scanned or {}).get("caches", []):
        for m in c["modules"]:
            if m.get("error"):
                out.append({"check": "engine_cache", "level": "warning",
                            "message": f"{c['engine']}'s cached module {m['path']}: {m['error']}"})
            if not m["finding"]:
                continue
            whys = []
            if m["mismatch"]:
                whys.append(f"links {', '.join(m['mismatch'])}, another CUDA major than the stack's (torch: CUDA "
                            f"{stack_cuda})")
            if m.get("symbols_missing"):
                whys.append(f"needs {len(m['symbols_missing'])} torch symbol(s) this torch does not export (first: "
                            f"{m['symbols_missing'][0]})")
            if m.get("arch_bad"):
                whys.append(f"has no SASS that runs on the target (SASS: {', '.join(m['sass']) or 'none'}; "
                            f"{m['level']})")
            why = "; ".join(whys)
            out.append({"check": "engine_cache", "level": m["finding"],
                        "message": f"{c['engine']}'s compile cache ({c['kind']}) module {m['module']} ({m['path']}) "
                                   f"{why}: {c['loader']}"})
        for t in c["triton"]:
            if t["finding"]:
                out.append({"check": "engine_cache", "level": t["finding"],
                            "message": f"Triton cache entry {t['kernel']} ({t['path']}) under {c['engine']}'s "
                                       f"{c['kind']} cache: {t['why']}"})
        n_mod, n_tri = len(c["modules"]), len(c["triton"])
        if not (n_mod or n_tri or c["other_targets"]):
            continue   # an empty or absent cache: nothing to say
        out.append({"check": "engine_cache", "level": "info",
                    "message": f"{c['engine']} {c['kind']} cache {c['root']}: {n_mod} module(s) and {n_tri} Triton "
                               f"entr{'y' if n_tri == 1 else 'ies'} for this target read"
                               + (f"; {c['other_targets']} for other targets not read (their key names another "
                                  "target, so they are never loaded here)" if c["other_targets"] else "")})
    return out
