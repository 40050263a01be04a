"""What happens when a gate of SGLang closes: does its exception reach the server's start-up uncaught, and by
which call path (read from the installed source with ``ast``; stdlib only).

Used by the engine answers to tell a *start-up failure* (``_resolve_backend`` raises ValueError on major 12 and
nothing between it and ``warmup`` catches it: sglang 0.5.23, case C35; ``TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES``
subscripted in a constructor that ``GroupCoordinator`` calls outside any ``try``: sglang 0.5.9, case C36) from a
quiet fallback.

A call is matched by name (``foo(...)`` or ``x.foo(...)``): this is a reading of the source, not a type-checked
call graph, so each step it reports names the file and line for a reader to check.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from .. import source

#: exception -> the names a handler may give that catch it (a bare ``except:`` is "")
_CATCHES = {"ValueError": ("ValueError", "Exception", "BaseException", ""),
            "KeyError": ("KeyError", "LookupError", "Exception", "BaseException", ""),
            "AssertionError": ("AssertionError", "Exception", "BaseException", "")}


def handler_names(handler: ast.ExceptHandler) -> list[str]:
    """The exception names an ``except`` clause lists (``""`` for a bare ``except:``)."""
    t = handler.type
    if t is None:
        return [""]
    elts = t.elts if isinstance(t, ast.Tuple) else [t]
    return [e.attr if isinstance(e, ast.Attribute) else getattr(e, "id", ast.unparse(e)) for e in elts]


def catches(handler: ast.ExceptHandler, exc: str) -> bool:
    return any(n in _CATCHES.get(exc, (exc, "Exception", "BaseException", "")) for n in handler_names(handler))


@dataclass
class Site:
    """One call of ``callee`` inside ``caller`` (``file:line``), and the enclosing ``try`` that catches the
    exception asked about, if any (``caught_at``: ``file:line except ...``)."""

    caller: str
    callee: str
    where: str
    caught_at: str = ""


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def sites(path: Path, tree: ast.Module, callee: str, exc: str, short) -> list[Site]:
    """Every call of ``callee`` in ``tree`` with the function it sits in and whether a ``try`` around it (inside
    that function) catches ``exc``."""
    out: list[Site] = []

    def walk(node, fn: str, guards: list):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                walk(child, child.name, [])
                continue
            if isinstance(child, ast.Try):
                caught = [h for h in child.handlers if catches(h, exc)]
                for stmt in child.body:
                    walk_one(stmt, fn, guards + caught)
                for part in (child.handlers, child.orelse, child.finalbody):
                    for stmt in part:
                        walk_one(stmt, fn, guards)
                continue
            walk_one(child, fn, guards)

    def walk_one(node, fn, guards):
        if isinstance(node, ast.Call) and _call_name(node) == callee and fn:
            g = guards[-1] if guards else None
            out.append(Site(fn, callee, f"{short(path)}:{node.lineno}",
                            f"{short(path)}:{g.lineno} except {', '.join(handler_names(g)) or '(bare)'}" if g else ""))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            walk(node, node.name, [])
        else:
            walk(node, fn, guards)

    walk(tree, "", [])
    return out


@dataclass
class CallPath:
    """How an exception raised in ``start`` reaches a root (``warmup``): ``steps`` from the root down to
    ``start`` (each a :class:`Site`), ``caught_at`` the first ``try`` on the way that catches it ("" when none:
    uncaught), ``found``: whether a root was reached."""

    start: str
    exc: str
    steps: list = field(default_factory=list)
    caught_at: str = ""
    found: bool = False

    def describe(self) -> str:
        if not self.found:
            return f"no call path from a start-up root to {self.start} found"
        chain = " -> ".join([self.steps[0].caller] + [f"{s.callee} ({s.where})" for s in self.steps])
        return chain + (f"; caught at {self.caught_at}" if self.caught_at else f"; no try on the path catches {self.exc}")


class _Index:
    def __init__(self, root: Path):
        self.files = sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
        self._text: dict[Path, str] = {}
        self._tree: dict[Path, ast.Module] = {}

    def text(self, p: Path) -> str:
        if p not in self._text:
            try:
                self._text[p] = p.read_text(encoding="utf-8", errors="replace")
            except OSError:
                self._text[p] = ""
        return self._text[p]

    def tree(self, p: Path):
        if p not in self._tree:
            try:
                self._tree[p] = source.parse(p)
            except (SyntaxError, ValueError, OSError):
                self._tree[p] = None
        return self._tree[p]


def call_path(root: Path, start: str, exc: str, short, *, roots: tuple[str, ...] = ("warmup",),
              max_depth: int = 6, max_files: int = 12) -> CallPath:
    """Breadth-first from the callers of function ``start`` up to a function named in ``roots`` (under ``root``,
    SGLang's ``srt`` folder), shortest path first. The answer's ``caught_at`` names the first ``try`` on the
    chosen path whose handler catches ``exc``; a path with such a ``try`` is kept only when no uncaught one
    reaches a root. Dunder methods and names called from more than ``max_files`` files are not followed (a
    name match there says nothing)."""
    idx = _Index(root)
    import re
    frontier = [(start, [], "")]
    seen = {start}
    best = None
    for _ in range(max_depth):
        nxt = []
        for name, chain, caught in frontier:
            pat = re.compile(rf"(?<![\w]){re.escape(name)}\(")
            files = [p for p in idx.files if f"{name}(" in idx.text(p) and pat.search(idx.text(p))]
            if name != start and len(files) > max_files:
                continue      # a name called everywhere (forward, run): not followed, this reading would guess
            for p in files:
                tree = idx.tree(p)
                if tree is None:
                    continue
                for s in sites(p, tree, name, exc, short):
                    steps = [s] + chain
                    c = caught or s.caught_at
                    if s.caller in roots:
                        cp = CallPath(start, exc, steps, c, True)
                        if not c:
                            return cp
                        best = best or cp
                    elif s.caller not in seen and not s.caller.startswith("__"):
                        seen.add(s.caller)
                        nxt.append((s.caller, steps, c))
        frontier = nxt
        if not frontier:
            break
    return best or CallPath(start, exc)


def guarded_call(path: Path, callee: str, exc: str, short) -> tuple[str, str] | None:
    """(call site ``file:line``, the enclosing ``try`` that catches ``exc`` or "") of the first call of ``callee``
    in ``path``; None when ``path`` does not call it."""
    try:
        tree = source.parse(path)
    except (SyntaxError, ValueError, OSError):
        return None
    found = sites(path, tree, callee, exc, short)
    return (found[0].where, found[0].caught_at) if found else None
