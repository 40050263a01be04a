"""A small evaluator of SGLang's own conditions, read with ``ast`` (stdlib only).

SGLang decides which communicator serves an allreduce in plain Python: ``if self.ca_comm is not None and not
self.ca_comm.disabled and self.ca_comm.should_custom_ar(input_)``, ``if inp.dtype is not torch.bfloat16: return
False``. This module evaluates such code for one configuration without importing it: every name, attribute or
call the code reads is looked up by its source text (``"self.world_size"``, ``"inp.numel()"``) through a
``resolve`` callback the caller writes from the server configuration, the target host and the tensor.

Three-valued: a value the caller cannot know (a tuned table only the running server has) is :data:`UNKNOWN`;
``and`` / ``or`` short-circuit on known operands, anything else that touches UNKNOWN is UNKNOWN. A name the
callback does not know raises :class:`Unbound`: the caller decides whether that is an error (a dispatch step)
or an undecided answer (a per-call check), never a pass.
"""
from __future__ import annotations

import ast
import operator
from dataclasses import dataclass, field
from typing import Any, Callable


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"

    def __bool__(self) -> bool:   # a caller that forgets to check must not read it as True or False
        raise TypeError("UNKNOWN has no truth value")


UNKNOWN = _Unknown()


class Unbound(LookupError):
    """``text`` (the source of a name, attribute or call) has no value for this configuration."""

    def __init__(self, text: str, line: int = 0):
        super().__init__(text)
        self.text, self.line = text, line


_CMP = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
        ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Is: lambda a, b: a is b or (a == b and not _mutable(a)),
        ast.IsNot: lambda a, b: not (a is b or (a == b and not _mutable(a))),
        ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Mod: operator.mod, ast.Div: operator.truediv}
_BUILTINS = {"str": str, "int": int, "bool": bool, "len": len, "min": min, "max": max}


def _mutable(v) -> bool:
    return isinstance(v, (list, dict, set))


@dataclass
class Outcome:
    """What running a function body gave: ``value`` (the returned value, UNKNOWN, or None when it fell off the
    end), ``line`` (the deciding ``return``), ``trace``: every condition tested, as (line, source, value), in
    order; ``writes``: ``os.environ`` assignments seen, name -> (value, line)."""

    value: Any = None
    line: int = 0
    returned: bool = False
    trace: list = field(default_factory=list)
    writes: dict = field(default_factory=dict)


class Evaluator:
    """Evaluate expressions with ``resolve(text) -> value`` (raise :class:`Unbound` when unknown) and locals."""

    def __init__(self, resolve: Callable[[str], Any], lenient: bool = False):
        self.resolve = resolve
        self.locals: dict[str, Any] = {}
        self.lenient = lenient   # unknown names read UNKNOWN; an undecided ``if`` is skipped (for side effects)

    def value(self, node: ast.AST) -> Any:  # noqa: C901, PLR0912 - reason: an expression evaluator: one branch per ast node type
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            vals = [self.value(e) for e in node.elts]
            return UNKNOWN if any(v is UNKNOWN for v in vals) else tuple(vals)
        if isinstance(node, ast.BoolOp):
            is_and = isinstance(node.op, ast.And)
            unknown = False
            last = None
            for v in node.values:
                last = self.value(v)
                if last is UNKNOWN:
                    unknown = True
                    continue
                if (not last) if is_and else bool(last):
                    return last
            return UNKNOWN if unknown else last
        if isinstance(node, ast.UnaryOp):
            v = self.value(node.operand)
            if v is UNKNOWN:
                return UNKNOWN
            return (not v) if isinstance(node.op, ast.Not) else -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.Compare):
            left = self.value(node.left)
            for op, comp in zip(node.ops, node.comparators):
                right = self.value(comp)
                if left is UNKNOWN or right is UNKNOWN:
                    return UNKNOWN
                if not _CMP[type(op)](left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
            a, b = self.value(node.left), self.value(node.right)
            return UNKNOWN if a is UNKNOWN or b is UNKNOWN else _BIN[type(node.op)](a, b)
        if isinstance(node, ast.IfExp):
            t = self.value(node.test)
            return UNKNOWN if t is UNKNOWN else self.value(node.body if t else node.orelse)
        if isinstance(node, ast.Name) and node.id in self.locals:
            return self.locals[node.id]
        text = ast.unparse(node)
        try:
            return self.resolve(text)
        except Unbound:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _BUILTINS:
                args = [self.value(a) for a in node.args]
                return UNKNOWN if any(a is UNKNOWN for a in args) else _BUILTINS[node.func.id](*args)
            if self.lenient:
                return UNKNOWN
            raise Unbound(text, getattr(node, "lineno", 0)) from None

    def run(self, body: list, out: Outcome | None = None) -> Outcome:
        """Run statements: ``if`` / ``elif`` / ``else``, ``return``, assignments to local names, ``os.environ[...] =``
        and ``os.environ.setdefault(...)`` (recorded, not applied); other expression statements (logging, warnings)
        are skipped. A statement of another kind that holds a ``return`` makes the outcome UNKNOWN (it might
        return), never a guess."""
        out = out or Outcome()
        for st in body:
            if isinstance(st, ast.Return):
                out.value = self.value(st.value) if st.value is not None else None
                out.line, out.returned = st.lineno, True
                return out
            if isinstance(st, ast.If):
                t = self.value(st.test)
                out.trace.append((st.lineno, ast.unparse(st.test), t))
                if t is UNKNOWN:
                    if self.lenient:
                        continue
                    out.value, out.line, out.returned = UNKNOWN, st.lineno, True
                    return out
                if self.run(st.body if t else st.orelse, out).returned:
                    return out
                continue
            if isinstance(st, ast.Assign) and len(st.targets) == 1:
                tgt = st.targets[0]
                if isinstance(tgt, ast.Name):
                    try:
                        self.locals[tgt.id] = self.value(st.value)
                    except Unbound:
                        self.locals[tgt.id] = UNKNOWN
                    continue
                if isinstance(tgt, ast.Subscript) and ast.unparse(tgt.value) == "os.environ":
                    out.writes[str(self.value(tgt.slice))] = (self.value(st.value), st.lineno)
                    continue
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) \
                    and ast.unparse(st.value.func) == "os.environ.setdefault":
                name, val = (self.value(a) for a in st.value.args[:2])
                out.writes.setdefault(name, (("setdefault", val), st.lineno))
                continue
            if isinstance(st, (ast.Expr, ast.Pass, ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Import,
                               ast.ImportFrom)):
                continue
            if any(isinstance(n, ast.Return) for n in ast.walk(st)):
                out.value, out.line, out.returned = UNKNOWN, st.lineno, True
                return out
        return out


def run_function(fn: ast.FunctionDef, resolve: Callable[[str], Any]) -> Outcome:
    """Run ``fn``'s body with ``resolve``; a name it cannot resolve in a condition raises :class:`Unbound`."""
    return Evaluator(resolve).run(fn.body)


def deciding(out: Outcome) -> str:
    """``L123 `test``` of the last condition tested before the outcome, for evidence."""
    if not out.trace:
        return f"L{out.line}"
    line, text, val = out.trace[-1]
    return f"L{line} `{text}` -> {val!r}"
