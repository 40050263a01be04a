"""Checks that span the component files of a recipes folder (after each file loaded on its own): the ``needs``
graph (one base, image parents, no cycle) and the version pins (torch line, ``requires``). Errors are
:class:`cudastack.errors.RecipeError` naming the file and key; see :func:`cudastack.recipes.load_recipes`."""
from __future__ import annotations

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from cudastack.errors import RecipeError
from cudastack.schemas import key_path

_fail = RecipeError.at


def check_graph(components: dict) -> None:
    """The ``needs`` graph of the components ({node name: Component}): one base, every name known, an image
    parent for every non-base node, only runtime nodes need wheels nodes, no cycle. Raises RecipeError."""
    bases = [c for c in components.values() if c.kind == "base"]
    if len(bases) != 1:
        names = ", ".join(c.file.name for c in bases) or "none"
        raise RecipeError(f"A recipes folder needs exactly one component of kind 'base' (found: {names}).")
    for c in components.values():
        for i, n in enumerate(c.needs):
            if n not in components:
                raise _fail(c.file, f"needs[{i}]", f"'{n}' is not a component here "
                                                   f"(known: {', '.join(components)}).")
        if c.kind != "base":
            if not c.needs:
                raise _fail(c.file, "needs", f"a {c.kind} node needs at least its image parent.")
            if not any(components[n].kind in ("base", "image") for n in c.needs):
                raise _fail(c.file, "needs", "none of these is a base or image node to build FROM.")
        elif c.needs:
            raise _fail(c.file, "needs", "the base node needs nothing.")
        if c.kind in ("base", "image", "wheels"):
            for n in c.needs:
                if components[n].kind in ("wheels", "runtime") and c.kind != "runtime":
                    raise _fail(c.file, "needs", f"'{n}' is a {components[n].kind} node; only a runtime node "
                                                 "installs other nodes' wheels.")
    # cycles
    state: dict[str, int] = {}

    def visit(name: str, trail: list[str]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise _fail(components[name].file, "needs", f"cycle: {' -> '.join(trail + [name])}.")
        state[name] = 1
        for n in components[name].needs:
            visit(n, trail + [name])
        state[name] = 2

    for name in components:
        visit(name, [])


def check_pins(components: dict, toolchains: dict) -> None:
    """Per toolchain, the pins of all components ({node name: Component}, {name: Toolchain}) agree: torch
    follows the toolchain's torch line, every ``requires`` names a pinned version. Raises RecipeError."""
    for tc in toolchains:
        pinned: dict[str, tuple] = {}
        for c in components.values():
            for spec in c.toolchains[tc].packages:
                r = Requirement(spec)
                pinned[canonicalize_name(r.name)] = (next(iter(r.specifier)).version, c)
            if c.toolchains[tc].sdist:
                s = c.toolchains[tc].sdist
                pinned[canonicalize_name(s["package"])] = (s["version"], c)
        torch = pinned.get("torch")
        if torch and torch[0] != toolchains[tc].torch_version:
            raise _fail(torch[1].file, key_path(("toolchains", tc, "packages")),
                        f"torch=={torch[0]} but toolchains.yaml says toolchain {tc} uses the torch "
                        f"{toolchains[tc].torch_version} line; make them agree.")
        for c in components.values():
            for pkg, ver in c.toolchains[tc].requires.items():
                key = key_path(("toolchains", tc, "requires", pkg))
                have = pinned.get(canonicalize_name(pkg))
                if have is None:
                    raise _fail(c.file, key, f"no recipe pins {pkg} for toolchain {tc}.")
                if have[0] != ver:
                    raise _fail(c.file, key, f"{pkg}=={ver} is required but {have[1].file.name} pins "
                                             f"{pkg}=={have[0]}: the set is inconsistent.")
