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

from ... import source

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
    #: the conditions the call sits under inside its function, as source text: an enclosing ``if`` test, ``not
    #: (test)`` in its ``else`` or after an ``if test: ... return`` earlier in the same block
    under: tuple = ()


def _call_name(node: ast.Call) -> str:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def _returns(stmts: list) -> bool:
    return bool(stmts) and isinstance(stmts[-1], (ast.Return, ast.Raise))


def sites(path: Path, tree: ast.Module, callee: str, exc: str, short) -> list[Site]:  # noqa: C901 - reason: an ast walk: one branch per statement type that guards a call
    """Every call of ``callee`` in ``tree`` with the function it sits in, whether a ``try`` around it (inside
    that function) catches ``exc``, and the conditions it sits under (:attr:`Site.under`)."""
    out: list[Site] = []

    def block(stmts: list, fn: str, guards: list, conds: tuple):
        for stmt in stmts:
            walk_one(stmt, fn, guards, conds)
            if isinstance(stmt, ast.If) and _returns(stmt.body) and not stmt.orelse:
                conds = conds + (f"not ({ast.unparse(stmt.test)})",)     # what follows runs only when it is false

    def walk(node, fn: str, guards: list, conds: tuple = ()):
        if isinstance(node, ast.If):
            block(node.body, fn, guards, conds + (ast.unparse(node.test),))
            block(node.orelse, fn, guards, conds + (f"not ({ast.unparse(node.test)})",))
            walk_one(node.test, fn, guards, conds)
            return
        if isinstance(node, ast.Try):
            caught = [h for h in node.handlers if catches(h, exc)]
            block(node.body, fn, guards + caught, conds)
            for part in (node.handlers, node.orelse, node.finalbody):
                block(part, fn, guards, conds)
            return
        fields = [getattr(node, f, None) for f in node._fields]
        for value in fields:
            if isinstance(value, list) and value and all(isinstance(x, ast.stmt) for x in value):
                block(value, fn, guards, conds)
            elif isinstance(value, list):
                for x in value:
                    if isinstance(x, ast.AST):
                        walk_one(x, fn, guards, conds)
            elif isinstance(value, ast.AST):
                walk_one(value, fn, guards, conds)

    def walk_one(node, fn, guards, conds):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            block(node.body, node.name, [], ())
            return
        if isinstance(node, ast.ClassDef):
            block(node.body, fn, guards, conds)
            return
        if isinstance(node, ast.Call) and _call_name(node) == callee and fn:
            g = guards[-1] if guards else None
            out.append(Site(fn, callee, f"{short(path)}:{node.lineno}",
                            f"{short(path)}:{g.lineno} except {', '.join(handler_names(g)) or '(bare)'}" if g else "",
                            conds))
        walk(node, fn, guards, conds)

    block(tree.body, "", [], ())
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
              max_depth: int = 6, max_files: int = 12, admits=None) -> CallPath:
    """Breadth-first from the callers of function ``start`` up to a function named in ``roots`` (under ``root``,
    SGLang's ``srt`` folder), shortest path first. The answer's ``caught_at`` names the first ``try`` on the
    chosen path whose handler catches ``exc``; a path with such a ``try`` is kept only when no uncaught one
    reaches a root. Dunder methods and names called from more than ``max_files`` files are not followed (a
    name match there says nothing). ``admits``: ``f(site) -> bool``; a call site it refuses (its conditions,
    :attr:`Site.under`, are false for the configuration asked about) is not followed, so the path is the one that
    configuration takes (issue 39 point 2: the fusion raise is reached through the workspace for ``auto`` /
    ``trtllm`` / ``mnnvl`` and through the CuTe DSL branch only for ``cutedsl``)."""
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
                    if admits is not None and not admits(s):
                        continue
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
