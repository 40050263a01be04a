"""The plan's graph: which components are nodes (``--skip``), in what order they build, what kind each node is,
its parents (image parent first), and whether its image depends on the target arch list (which names its tag).

The DAG comes from the recipes' ``kind`` and ``needs`` (:mod:`cudastack.recipes.load`); nothing here reads files
or talks to Docker. Used by :func:`cudastack.plan.planner.make_plan`.
"""
from __future__ import annotations

from typing import Iterable

from cudastack.core.errors import UsageError
from cudastack.plan.model import Knob
from cudastack.recipes.load import COMPILING_METHODS, Component, RecipeSet


def only_skips(recipes: RecipeSet, only: Iterable[str]) -> list[str]:
    """The ``--skip`` list that ``--only NODE ...`` means: every component that is neither a named node nor one
    of their ancestors (file stems). UsageError for an unknown name (:meth:`RecipeSet.component`)."""
    from cudastack.recipes.graph import ancestors

    keep: set[str] = set()
    for o in only:
        keep |= set(ancestors(recipes.components, recipes.component(o).name))
    return [c.stem for c in recipes.components.values() if c.name not in keep]


def topo_order(components: dict[str, Component], tc_name: str) -> list[Component]:
    """Parents before children; among the nodes ready at each step, wheel/image nodes before source and aot
    builds (a slow compile such as flash-attn goes last, so a failure or a long build there leaves every
    other node built), then file order."""
    order = list(components)
    pending = dict.fromkeys(order)
    done: list[str] = []
    while pending:
        ready = [n for n in pending if all(p in done for p in components[n].needs)]
        ready.sort(key=lambda n: (components[n].kind == "runtime",
                                  components[n].toolchains[tc_name].method in COMPILING_METHODS, order.index(n)))
        done.append(ready[0])
        del pending[ready[0]]
    return [components[n] for n in done]


def resolve_skips(recipes: RecipeSet, skip: Iterable[str], unavailable: dict[str, str] | None = None) -> set[str]:
    """Node names to leave out for ``--skip`` values (node names or file stems). UsageError for an
    unknown component or one that cannot be left out (the base; a node another kept node builds FROM).
    ``unavailable``: nodes the toolchain cannot take (left out anyway; a node that needs them goes with them)."""
    gone = set(unavailable or ())
    out = set()
    for s in skip:
        c = recipes.component(s)
        if c.kind == "base":
            raise UsageError(f"Cannot skip '{s}': it is the base every other node builds on.")
        out.add(c.name)
    for c in recipes.components.values():
        if c.name in out or c.name in gone:
            continue
        for n in c.needs:
            if n in out and not (c.kind == "runtime" and recipes.components[n].kind == "wheels"):
                raise UsageError(f"Cannot skip '{n}': '{c.name}' needs it. Skip '{c.name}' too "
                                 f"(--skip {n} --skip {c.name}) or keep {n}.")
    return out


def node_kind(c: Component, base_kind: str) -> str:
    """The plan node kind (:data:`cudastack.plan.model.NODE_KINDS`): the recipes' ``base`` becomes ``base-pip`` or
    ``base-nvidia`` by ``--base``; every other kind stays."""
    return f"base-{base_kind}" if c.kind == "base" else c.kind


def node_parents(c: Component, recipes: RecipeSet, skipped: set[str]) -> tuple[list[str], str]:
    """(parents, image parent) of component ``c``: the ``needs`` that are not skipped, the image parent (the
    first base/image node among them, whose image this node builds FROM) first; ([], "") for the base."""
    parents = [n for n in c.needs if n not in skipped]
    image_parent = next(p for p in parents if recipes.components[p].kind in ("base", "image")) if parents else ""
    parents = ([image_parent] + [p for p in parents if p != image_parent]) if image_parent else []
    return parents, image_parent


def arch_dependent(c: Component, knobs: list[Knob], parents: list[str], known: dict[str, bool]) -> bool:
    """Whether the node's image depends on the target arch list: it sets its arch knob, it is the runtime
    image, or a parent depends on it (``known``: the answer for the nodes planned so far). Such a node's
    repository name carries the arch tag (:func:`image_repository`)."""
    dep = any(k.name == c.arch_knob.knob for k in knobs) if c.arch_knob else False
    return dep or c.kind == "runtime" or any(known.get(p) for p in parents)


def arch_tag(archs) -> str:
    """``sm120`` / ``sm120a-sm121a``: the target archs (:class:`cudastack.plan.rules` arch specs) in a tag."""
    return "-".join(f"sm{a.number}{a.suffix}" for a in archs)


def image_repository(prefix: str, toolchain: str, base_kind: str, target, name: str, dependent: bool) -> str:
    """``<prefix>/cu<toolchain>-<base>[-<arch tag>]-<node>``, e.g. ``cudastack/cu13.1-pip-sm120-runtime``."""
    return f"{prefix}/cu{toolchain}-{base_kind}{'-' + arch_tag(target) if dependent else ''}-{name}"
