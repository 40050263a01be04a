"""JIT caches read (check 8 of :mod:`stackprobe.health`, case C58): the modules FlashInfer compiled earlier and
keeps on disk, each checked like an installed extension (the CUDA major of the libraries it links, its SASS for
the target), because FlashInfer loads a cached module before it would compile one.

FlashInfer's rules, read from the installed release (0.7.2 here; the layout is confirmed in the installed
``flashinfer/jit/env.py`` before it is used, else the check is "not assessed"):

* ``FLASHINFER_BASE_DIR`` = ``$FLASHINFER_WORKSPACE_BASE``, else the home folder; the cache is
  ``<base>/.cache/flashinfer/<flashinfer version>/<archs>/cached_ops/<module>/<module>.so``, ``<archs>`` the target
  architectures joined by ``_`` (``jit/env.py``: ``FLASHINFER_CACHE_DIR``, ``_get_workspace_dir_name``,
  ``FLASHINFER_JIT_DIR``; ``jit/core.py`` ``jit_library_path``);
* ``JitSpec.build_and_load`` calls ``try_load()`` first and builds only when that returns nothing
  (``jit/core.py``): a stale module in the cache is what runs (flashinfer-ai/flashinfer#5145).

:func:`scan` returns {"root", "version", "layout" (True: the installed env.py spells these rules), "modules":
[{"module", "archs", "path", "cuda", "mismatch", "level", "sass"}], "not_assessed"}.
"""
from __future__ import annotations

import os
from pathlib import Path

from . import health_elf as elf
from .paths import records

#: strings the installed ``flashinfer/jit/env.py`` must contain for the layout read here to be its layout
LAYOUT_MARKS = ("FLASHINFER_WORKSPACE_BASE", '".cache" / "flashinfer"', "flashinfer_version / arch", '"cached_ops"')
#: backends and the FlashInfer JIT generator whose module they load, read from the path records
#: (``Needs.jit_generator``; the probes' own: flashinfer_fusion.MODULE_FN, flashinfer_pcie_ipc's call)
BACKEND_MODULE_FN = {r.id: r.needs.jit_generator for r in records() if r.needs is not None and r.needs.jit_generator}


def cache_root(env=None) -> Path:
    env = os.environ if env is None else env
    base = env.get("FLASHINFER_WORKSPACE_BASE") or os.path.expanduser("~")
    return Path(base) / ".cache" / "flashinfer"


def _layout_ok(fi_root: Path | None) -> tuple[bool, str]:
    if fi_root is None:
        return False, "the flashinfer package folder was not found"
    env_py = fi_root / "jit" / "env.py"
    try:
        text = env_py.read_text(errors="replace")
    except OSError as e:
        return False, f"{env_py} unreadable ({e})"
    missing = [m for m in LAYOUT_MARKS if m not in text]
    if missing:
        return False, (f"this FlashInfer's jit/env.py does not spell the cache layout this suite reads "
                       f"(lacks {', '.join(missing)})")
    return True, str(env_py)


def scan(dists: dict, stack_major: int | None, target, env=None) -> dict:
    """The cached modules of the installed FlashInfer release ({} when flashinfer-python is not installed)."""
    d = dists.get("flashinfer-python")
    if d is None:
        return {}
    from importlib import util

    from .coverage import level_for, read_elf

    try:
        spec = util.find_spec("flashinfer")
    except (ImportError, ValueError):
        spec = None
    fi_root = Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None
    ok, where = _layout_ok(fi_root)
    root = cache_root(env) / d.version
    out: dict = {"root": str(root), "version": d.version, "layout": ok, "layout_source": where, "modules": []}
    if not ok:
        out["not_assessed"] = where
        return out
    if not root.is_dir():
        return out
    for so in sorted(root.glob("*/cached_ops/*/*.so")):
        if so.stem != so.parent.name:
            continue
        row = {"module": so.stem, "archs": so.parent.parent.parent.name, "path": str(so), "cuda": {}, "mismatch": []}
        try:
            majors = elf.cuda_majors(elf.needed(str(so)))
            ims = read_elf(str(so))
        except Exception as e:  # noqa: BLE001 - an unreadable cached module is said, not skipped
            row["error"] = f"{type(e).__name__}: {e}"
            out["modules"].append(row)
            continue
        row["cuda"] = majors
        row["mismatch"] = sorted(s for s, m in majors.items() if stack_major is not None and m != stack_major)
        row["sass"] = sorted({i.name for i in ims if i.kind == "sass"})
        row["level"] = level_for(ims, target) if ims else "none"
        out["modules"].append(row)
    return out


def scan_all(dists: dict, stack_major: int | None, target, env=None) -> dict:
    """:func:`scan` at FlashInfer's own default, and also where ``import sglang`` points FlashInfer's workspace
    (SGLang 0.5.23 sets ``FLASHINFER_WORKSPACE_BASE`` to ``$SGLANG_CACHE_DIR`` when unset:
    :func:`stackprobe.health_enginecache.sglang_env`); the modules of both, ``roots`` every folder read."""
    from .health_enginecache import sglang_env

    out = scan(dists, stack_major, target, env)
    if out:
        out["roots"] = [out["root"]]
    sg = sglang_env(dists, env)
    if not out or not out.get("layout") or sg is None or cache_root(sg) == cache_root(env):
        return out
    more = scan(dists, stack_major, target, sg)
    out["roots"].append(more["root"])
    out["modules"] += [dict(m, via="import sglang (FLASHINFER_WORKSPACE_BASE=$SGLANG_CACHE_DIR)")
                       for m in more.get("modules", [])]
    return out


def backend_modules() -> dict:
    """{backend: JIT module name} from the installed FlashInfer's generators (read with ``ast``; none imported)."""
    from .probes import flashinfer_common as fi

    out = {}
    for b, fn in BACKEND_MODULE_FN.items():
        try:
            name, _ = fi.module_name(fn)
        except Exception:  # noqa: BLE001 - an unreadable generator: the module is not tied to a backend
            name = None
        if name:
            out[b] = name
    return out


def describe(row: dict, stack_cuda: str | None) -> str:
    return (f"FlashInfer's JIT cache module {row['module']} ({row['path']}) links {', '.join(row['mismatch'])}, another "
            f"CUDA major than the stack's (torch: CUDA {stack_cuda}): FlashInfer loads a cached module before it would "
            "compile one (jit/core.py build_and_load: try_load first; flashinfer-ai/flashinfer#5145), so this file is "
            "what runs, and it cannot load with this torch")
