"""Checks that span the component files of a recipes folder (after each file loaded on its own): the ``needs``
graph (one base, image parents, no cycle) and the version pins (torch line, ``requires``). Errors are
:class:`cudastack.core.errors.RecipeError` naming the file and key; see :func:`cudastack.recipes.load.load_recipes`."""
from __future__ import annotations

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from cudastack.core.errors import RecipeError
from cudastack.core.schemas import key_path

_fail = RecipeError.at


def check_graph(components: dict) -> None:  # noqa: C901 - reason: one raise per rule of the needs graph, each with its own message
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


def available(components: dict, tc: str) -> dict:
    """{node name: why} of the components toolchain ``tc`` cannot take: those whose entry is ``method:
    unavailable`` (their ``why``) and every node that needs one of them (naming it)."""
    out: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for c in components.values():
            if c.name in out:
                continue
            e = c.toolchains[tc]
            if e.method == "unavailable":
                out[c.name] = e.why
                changed = True
            elif (n := next((n for n in c.needs if n in out), None)) is not None:
                out[c.name] = f"needs {n}, which CUDA {tc} cannot take ({out[n]})"
                changed = True
    return out


def ancestors(components: dict, name: str) -> list[str]:
    """``name`` and every node it needs, directly or not, nearest first (file order among equals)."""
    out: list[str] = []
    todo = [name]
    while todo:
        n = todo.pop(0)
        if n not in out:
            out.append(n)
            todo.extend(components[n].needs)
    return out


def stacks(components: dict, tc: str) -> list[tuple[str, list[str]]]:
    """The image chains of toolchain ``tc`` whose pins must agree: one per runtime node the toolchain takes
    (the runtime and its ancestors), plus, when some node is in no runtime's chain, one of the remaining nodes
    and their ancestors. Returns [(label, node names)]; the label is the runtime's node name (or "" for the rest).
    Two runtimes may pin different versions of one package (SGLang's torch 2.14.1, vLLM's 2.14.0): each is built
    as its own image chain on the shared base; :func:`stack_differences` names them."""
    gone = available(components, tc)
    live = {n: c for n, c in components.items() if n not in gone}
    out = [(c.name, ancestors(live, c.name)) for c in live.values() if c.kind == "runtime"]
    covered = {n for _, names in out for n in names}
    rest = [n for n in live if n not in covered]
    if rest or not out:
        names: list[str] = []
        for n in rest or list(live):
            names += [a for a in ancestors(live, n) if a not in names]
        out.append(("", names))
    return out


def _stack_pins(components: dict, tc: str, names: list[str]) -> dict[str, tuple]:
    """{canonical name: (version, Component)} of the packages and sdists the nodes ``names`` pin for ``tc``;
    RecipeError when two of them pin one package at different versions (one image cannot hold both)."""
    pinned: dict[str, tuple] = {}

    def put(pkg: str, ver: str, c) -> None:
        have = pinned.get(pkg)
        if have is not None and have[0] != ver:
            raise _fail(c.file, key_path(("toolchains", tc, "packages")),
                        f"pins {pkg}=={ver} but {have[1].file.name} pins {pkg}=={have[0]} in the same image chain "
                        f"({' -> '.join(reversed(names))}); one image holds one version: make them agree.")
        pinned[pkg] = (ver, c)

    for n in names:
        c = components[n]
        for spec in c.toolchains[tc].packages:
            r = Requirement(spec)
            put(canonicalize_name(r.name), next(iter(r.specifier)).version, c)
        if c.toolchains[tc].sdist:
            sd = c.toolchains[tc].sdist
            put(canonicalize_name(sd["package"]), sd["version"], c)
    return pinned


def _minor(v: str) -> tuple:
    return tuple(int(x) for x in v.split(".")[:2] if x.isdigit())


def check_pins(components: dict, toolchains: dict) -> None:
    """Per toolchain and per image chain (:func:`stacks`), the pins of the components ({node name: Component},
    {name: Toolchain}) agree: one version per package in a chain, every ``requires`` names a version the chain
    pins, and torch follows the toolchain's torch line. A runtime whose engine ``requires`` another torch of the
    same minor line (vLLM 0.33.0: torch==2.14.0 on the 2.14.1 line) may pin it in its own chain; another minor
    (a torch of another CUDA build) is an error. Raises RecipeError naming file and key."""
    for tc in toolchains:
        line = toolchains[tc].torch_version
        for label, names in stacks(components, tc):
            pinned = _stack_pins(components, tc, names)
            runtime = components[label] if label else None
            for n in names:
                c = components[n]
                for pkg, ver in c.toolchains[tc].requires.items():
                    key = key_path(("toolchains", tc, "requires", pkg))
                    have = pinned.get(canonicalize_name(pkg))
                    chain = " -> ".join(reversed(names))
                    if have is None:
                        raise _fail(c.file, key, f"no recipe of the image chain {chain} pins {pkg} for toolchain {tc}.")
                    if have[0] != ver:
                        raise _fail(c.file, key, f"{pkg}=={ver} is required (the engine's own METADATA pin, recorded in "
                                                 f"`requires`) but {have[1].file.name} pins {pkg}=={have[0]} in the "
                                                 f"image chain {chain}: the set is inconsistent. Pin {pkg}=={ver} in "
                                                 f"{have[1].file.name}, or move the engine to a release that accepts "
                                                 f"{pkg} {have[0]}.")
            torch = pinned.get("torch")
            if torch is None or torch[0] == line:
                continue
            asked = (runtime.toolchains[tc].requires.get("torch") if runtime else None)
            if asked == torch[0] and _minor(torch[0]) == _minor(line):
                continue     # the engine's own torch, on this toolchain's line: its own image chain
            why = (f" (the {_minor(torch[0])[0]}.{_minor(torch[0])[1]} line is another CUDA build: put it on the "
                   "toolchain of that line)" if asked == torch[0] else
                   "; a runtime whose engine pins another torch of the same line records it in `requires`")
            raise _fail(torch[1].file, key_path(("toolchains", tc, "packages")),
                        f"torch=={torch[0]} but toolchains.yaml says toolchain {tc} uses the torch "
                        f"{line} line; make them agree{why}.")


def stack_differences(components: dict, tc: str) -> list[str]:
    """One line per package that two runtime image chains of ``tc`` pin at different versions, naming each
    runtime's engine pin and each version (empty with one runtime). The plan prints them: the reason the engines
    are separate images on one base."""
    chains = [(label, names, _stack_pins(components, tc, names)) for label, names in stacks(components, tc) if label]
    lines = []
    for i, (la, na, pa) in enumerate(chains):
        for lb, nb, pb in chains[i + 1:]:
            diff = sorted(p for p in set(pa) & set(pb) if pa[p][0] != pb[p][0])
            if not diff:
                continue
            ea, eb = components[la].toolchains[tc].packages[:1], components[lb].toolchains[tc].packages[:1]
            what = "; ".join(f"{p} {pa[p][0]} ({pa[p][1].file.name}) vs {pb[p][0]} ({pb[p][1].file.name})" for p in diff)
            shared = [n for n in na if n in nb]
            engines = [", ".join(e) or "no engine pin" for e in (ea, eb)]
            lines.append(f"runtimes {la} ({engines[0]}) and {lb} ({engines[1]}) pin different versions: {what}. "
                         f"One image cannot hold both: each is its own image chain, sharing "
                         f"{', '.join(shared) or 'nothing'}.")
    return lines


def chain_pins(components: dict, tc: str, runtime: str | None = None) -> dict[str, tuple]:
    """{canonical name: (version, Component)} of every package and sdist the image chain of runtime node
    ``runtime`` pins for toolchain ``tc`` (default: the first runtime in file order whose engine is not
    vLLM's, i.e. SGLang's; the whole set where there is no runtime). KeyError for a runtime ``tc`` does
    not take. The radar and the tests read one engine's versions through this, never a flat merge of both."""
    chains = dict(stacks(components, tc))
    if runtime is None:
        runtime = next(iter(chains))
    return _stack_pins(components, tc, chains[runtime])
