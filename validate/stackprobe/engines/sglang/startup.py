"""SGLang's own start-up writes, read from its installed argument files: the environment variables it sets from a
server flag on every launch (:func:`startup_overwrites`), so a user's value of such a variable never reaches the code
that reads it, and the small ``ast`` readers both the dispatch reader (:mod:`.pcie_ipc`) and the do-not-set list
(:mod:`stackprobe.probes.pcie_ipc_engine`) use: :func:`env_write` (a statement writing a variable), :func:`reads_on`
(an expression true when a flag is on), :func:`flag_names` (``{dest: "--flag"}``)."""
from __future__ import annotations

import ast
import re
from typing import Any

from ... import source
from . import engine as se
from . import flags as sf


def arg_trees(eng):
    """``(path, ast.Module)`` of each of SGLang's argument files (``se._arg_sources``) that parses, in their order; a
    file that does not parse is left out (its readers then find nothing there and say so)."""
    for path in se._arg_sources(eng):
        try:
            yield path, source.parse(path)
        except (SyntaxError, ValueError, OSError):
            continue


def env_write(stmt: ast.AST) -> tuple[str, ast.AST] | None:
    """``(VARIABLE, value)`` of a statement writing an environment variable: ``os.environ["X"] = value`` or
    ``envs.X.set(value)`` (``EnvField.set`` writes ``os.environ``, sglang 0.5.23 ``srt/environ.py:91-93``); else None."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        m = re.fullmatch(r"os\.environ\[['\"](\w+)['\"]\]", ast.unparse(stmt.targets[0]))
        if m:
            return m.group(1), stmt.value
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        c = stmt.value
        if (isinstance(c.func, ast.Attribute) and c.func.attr == "set" and isinstance(c.func.value, ast.Attribute)
                and getattr(c.func.value.value, "id", "") == "envs" and len(c.args) == 1):
            return c.func.value.attr, c.args[0]
    return None


def reads_on(expr: ast.AST, dest: str) -> bool:
    """Whether ``expr`` reads ``.dest`` (or ``dest``) other than under a ``not``: true when the flag is on."""
    negated = {id(x) for n in source.walk(expr) if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)
               for x in source.walk(n.operand)}
    return any(id(n) not in negated and ((isinstance(n, ast.Attribute) and n.attr == dest)
                                         or (isinstance(n, ast.Name) and n.id == dest)) for n in source.walk(expr))


_OVERWRITES: dict[str, dict[str, dict]] = {}


def startup_overwrites(eng) -> dict[str, dict]:
    """:func:`_startup_overwrites` for every server flag, once per installed tree."""
    key = str(eng.root)
    if key not in _OVERWRITES:
        _OVERWRITES[key] = _startup_overwrites(eng, flag_names(eng))
    return _OVERWRITES[key]


def _startup_overwrites(eng, flag_of: dict[str, str]) -> dict[str, dict]:
    """``{VARIABLE: {"variable", "flag", "set_at", "function", "runs_at", "caller", "also_on"}}``: the variables SGLang
    itself writes on every start-up from a flag, so a user's own value never reaches the code that reads it. A write
    (:func:`env_write`) that is a statement of its function's own body (no condition around it) and whose value reads
    ``cfg.<dest>`` of a flag in ``flag_of``, in a function that another function of the argument files calls (or hands
    to ``run_hook``) as a statement of its own body. sglang 0.5.23: ``envs.SGLANG_ENABLE_DETERMINISTIC_INFERENCE.set("1"
    if cfg.enable_deterministic_inference else "0")`` (``serving_hook.py:444``) in ``handle_environment_variables``,
    which ``run_resolution_pipeline`` runs (``pipeline.py:332``) from ``ServerArgs``. ``also_on``: the conditions under
    which SGLang declares the flag on itself (``declare_resolution(..., enable_deterministic_inference=True)`` under
    ``if cfg.rl_on_policy_target is not None:``, ``attention_hook.py:588``)."""
    trees = [(se.short(path), tree) for path, tree in arg_trees(eng)]
    writes: dict[str, dict[str, Any]] = {}
    for at, tree in trees:
        for fn in (n for n in source.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for stmt in fn.body:
                w = env_write(stmt)
                dest = next((n.attr for n in source.walk(w[1]) if isinstance(n, ast.Attribute) and n.attr in flag_of),
                            None) if w else None
                if w and dest and w[0] not in writes:
                    writes[w[0]] = {"variable": w[0], "flag": flag_of[dest], "dest": dest,
                                    "set_at": f"{at}:{stmt.lineno}", "function": fn.name}
    out = {}
    for var, info in writes.items():
        for at, tree in trees:
            call = next(((fn.name, s) for fn in source.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                         for s in fn.body if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                         and info["function"] in [getattr(s.value.func, "id", "")]
                         + [a.id for a in s.value.args[:1] if isinstance(a, ast.Name)]), None)
            if call is not None:
                info.update(caller=call[0], runs_at=f"{at}:{call[1].lineno}")
                break
        else:
            continue        # not seen to run: no claim that it overwrites anything
        on: dict[int, tuple[int, str]] = {}     # each declaring call -> its innermost `if`
        for at, tree in trees:
            for n in (x for x in source.walk(tree) if isinstance(x, ast.If)):
                for c in (c for b in n.body for c in source.walk(b)):
                    if (isinstance(c, ast.Call) and "declare_resolution" in ast.unparse(c.func) and any(
                            k.arg == info["dest"] and isinstance(k.value, ast.Constant) and k.value.value is True
                            for k in c.keywords) and n.lineno >= on.get(id(c), (0, ""))[0]):
                        on[id(c)] = (n.lineno, f"`{ast.unparse(n.test)}` ({at}:{n.lineno})")
        info["also_on"] = list(dict.fromkeys(t for _, t in on.values()))
        out[var] = info
    return out


def flag_names(eng) -> dict[str, str]:
    """``{dest: "--flag"}`` of SGLang's server flags."""
    return {spec.dest: f for f, spec in sf.server_flags(eng).items() if getattr(spec, "dest", "")}


_ALSO_ON = re.compile(r"^`(?P<test>.*)` \((?P<where>[^()]*)\)$", re.DOTALL)


def _flag_resolver(eng, config):
    """``resolve`` for :mod:`.pyeval`: ``cfg.<dest>`` / ``server_args.<dest>`` / ``self.<dest>`` as that flag's value
    in ``config`` (given, else the installed default); anything else is unbound."""
    from .pyeval import Unbound

    def resolve(text: str):
        m = re.fullmatch(r"(?:cfg|server_args|self)\.(\w+)", text)
        if m:
            try:
                return sf.config_value(eng, config, "--" + m.group(1).replace("_", "-"))[0]
            except se.GateNotFound:
                pass
        raise Unbound(text)
    return resolve


def judge(eng, config, expr: ast.AST) -> tuple[object, str]:
    """``(value, "")`` of an expression of SGLang's argument code for ``config`` (:func:`_flag_resolver`), or ``(None,
    why)`` when it reads something the configuration does not decide or is decided at run time."""
    from .pyeval import UNKNOWN, Evaluator, Unbound

    try:
        got = Evaluator(_flag_resolver(eng, config)).value(expr)
    except Unbound as e:
        return None, f"it reads `{e.text}`, which the configuration does not decide"
    except (TypeError, ValueError, ArithmeticError) as e:
        return None, f"not evaluated ({type(e).__name__}: {e})"
    return (None, "decided at run time") if got is UNKNOWN else (got, "")


def also_on_holds(eng, config, over: dict) -> tuple[bool | None, str]:
    """Whether SGLang turns ``over["flag"]`` on itself for ``config`` (``over``: an entry of
    :func:`startup_overwrites`): each ``also_on`` condition (``cfg.rl_on_policy_target is not None``,
    ``attention_hook.py:586``) evaluated (:func:`judge`). ``(True, why)`` when one holds, ``(False, "")`` when none
    does, ``(None, why)`` when one cannot be judged from the configuration (it reads something that is not a server
    flag, or a value decided at run time): never taken as off."""
    unjudged = []
    for cond in over.get("also_on") or []:
        m = _ALSO_ON.match(cond)
        try:
            got, why = judge(eng, config, ast.parse(m.group("test"), mode="eval").body) if m else (None, "not read")
        except SyntaxError as e:
            got, why = None, f"not parsed ({e})"
        if why:
            unjudged.append(f"{cond}: {why}")
        elif got:
            return True, f"SGLang turns {over['flag']} on itself when {cond}, which holds for this configuration"
    if unjudged:
        return None, (f"SGLang turns {over['flag']} on itself under conditions this reader cannot judge from the "
                      f"configuration asked about ({'; '.join(unjudged)})")
    return False, ""


_COND_WRITES: dict[tuple[str, str], list] = {}


def _cond_writes(eng, var: str) -> list[tuple[ast.AST | None, ast.AST, str]]:
    """``(if test, value, "FILE:LINE")`` of every write of ``var`` (:func:`env_write`) in the argument files whose
    innermost enclosing statement holding it is an ``if`` body, and ``(None, value, "FILE:LINE in FUNCTION")`` of one
    that is a statement of a function's own body (for a variable not in :func:`startup_overwrites`: a function not
    seen to run), once per installed tree."""
    key = (str(eng.root), var)
    if key not in _COND_WRITES:
        found: list = []
        for path, tree in arg_trees(eng):
            for fn in (x for x in source.walk(tree) if isinstance(x, (ast.FunctionDef, ast.AsyncFunctionDef))):
                for stmt in fn.body:    # a statement of a function's own body: written whenever the function runs
                    w = env_write(stmt)
                    if w and w[0] == var:
                        found.append((None, w[1], f"{se.short(path)}:{stmt.lineno} in {fn.name}"))
            for n in (x for x in source.walk(tree) if isinstance(x, ast.If)):
                inner = {id(c) for b in n.body for i in source.walk(b) if isinstance(i, ast.If) for c in source.walk(i)}
                for node in (c for b in n.body for c in source.walk(b) if id(c) not in inner):
                    w = env_write(node)
                    if w and w[0] == var:
                        found.append((n.test, w[1], f"{se.short(path)}:{getattr(node, 'lineno', n.lineno)}"))
        _COND_WRITES[key] = found
    return _COND_WRITES[key]


def conditional_write(eng, config, var: str) -> tuple[object, str]:
    """What SGLang's argument code writes into ``var`` at start-up for ``config`` where the write sits under an ``if``
    (not an overwrite on every start-up: :func:`startup_overwrites`): the last such write whose innermost ``if`` test
    holds (:func:`judge`), as ``(value, "VAR=value (FILE:LINE, when `test`)")``; ``(None, "")`` when none holds;
    ``(None, "not assessed: ...")`` when a test or the value cannot be judged from the configuration; ``(value,
    "maybe: ...")`` for an unconditional write in a function not seen to run (the caller decides only where both
    outcomes agree)."""
    got: tuple[object, str] = (None, "")
    for test_node, value_node, at in _cond_writes(eng, var):
        if test_node is None:
            value, why = judge(eng, config, value_node)
            if why:
                return None, f"not assessed: {var} is written at {at}, and its value: {why}"
            got = (value, f"maybe: {var}={value} ({at}, a function not seen to run on every launch)")
            continue
        test = ast.unparse(test_node)
        held, why = judge(eng, config, test_node)
        if why:
            return None, f"not assessed: {var} is written at {at} when `{test}`, and {why}"
        if not held:
            continue
        value, why = judge(eng, config, value_node)
        if why:
            return None, f"not assessed: {var} is written at {at} when `{test}` (which holds), and its value: {why}"
        got = (value, f"{var}={value} ({at}, when `{test}`)")
    return got
