"""The methods a user picks for one build: ``--method NAME=wheel|source`` swaps a wheel entry for its
``source:`` block, ``--source NAME=DIR`` gives a source build a local checkout. Works on a loaded
:class:`cudastack.recipes.load.RecipeSet` and returns a new one (see :func:`select_methods`)."""
from __future__ import annotations

import copy
from pathlib import Path

from cudastack.core.errors import UsageError
from cudastack.recipes.models import SOURCE_KINDS
from cudastack.recipes.load import METHODS, RecipeSet


def select_methods(recipes: RecipeSet, toolchain: str, methods: dict[str, str] | None = None,
                   sources: dict[str, str] | None = None) -> RecipeSet:
    """The recipes with the methods a user chose for one toolchain (``--method NAME=wheel|source``) and local
    source folders (``--source NAME=DIR``: a checkout that replaces the source block's location; its patches
    still apply). Returns a new RecipeSet (the input is not changed).

    Raises UsageError (one paragraph, before anything is built) for an unknown component or method, a
    component without a ``source:`` block, a folder that does not exist, or a selected source build that
    has no location and no ``--source``.
    """
    methods, sources = dict(methods or {}), dict(sources or {})
    if not methods and not sources:
        return recipes
    tc = recipes.toolchain(toolchain).name
    out = copy.copy(recipes)
    out.components = dict(recipes.components)
    for name, method in methods.items():
        c = recipes.component(name)
        if method not in METHODS:
            raise UsageError(f"--method {name}={method}: the method is 'wheel' or 'source'.")
        e = c.toolchains[tc]
        if method == e.method:
            continue
        if method == "wheel":
            raise UsageError(f"--method {name}=wheel: {c.file.name} builds {c.name} from source for CUDA {tc} and "
                             "names no wheel to use instead; edit the recipe to change that.")
        if e.alternative is None:
            raise UsageError(f"--method {name}=source: {c.file.name} has no source build for CUDA {tc} (no "
                             f"`source:` block under toolchains.{tc}). Add one (url + sha256, git + commit, or "
                             "path, with its knobs and patches), or leave the component on its wheel.")
        if c.kind == "image" and c.parallelism is None:
            raise UsageError(f"--method {name}=source: {c.file.name} declares no parallelism (memory per compile "
                             "job), which a source build needs.")
        alt = copy.copy(e.alternative)
        alt.index, alt.requires = e.index, dict(e.requires)
        c2 = copy.copy(c)
        c2.toolchains = dict(c.toolchains)
        c2.toolchains[tc] = alt
        out.components[c.name] = c2
    for name, folder in sources.items():
        c = out.component(name)
        e = c.toolchains[tc]
        if e.method != "source":
            raise UsageError(f"--source {name}={folder}: {c.name} is not built from source for CUDA {tc}; add "
                             f"--method {c.stem}=source.")
        p = Path(folder).expanduser().resolve()
        if not p.is_dir():
            raise UsageError(f"--source {name}={folder}: {p} is not a folder. Give the checkout (or unpacked "
                             "release) of the component's source.")
        e = copy.copy(e)
        e.sdist = e.git = e.url = None
        e.path = p
        e.raw = {**{k: v for k, v in e.raw.items() if k not in SOURCE_KINDS}, "path": str(p)}
        c2 = copy.copy(c)
        c2.toolchains = dict(c.toolchains)
        c2.toolchains[tc] = e
        out.components[c.name] = c2
    for c in out.components.values():
        e = c.toolchains[tc]
        if e.method == "source" and not e.source_kind:
            raise UsageError(f"{c.name}: its source build for CUDA {tc} pins no location ({e.upstream}). Give a "
                             f"checkout with --source {c.stem}=DIR.")
        if e.method == "source" and c.parallelism is None:
            raise UsageError(f"{c.name}: a source build needs the recipe's parallelism block ({c.file.name}).")
    return out
