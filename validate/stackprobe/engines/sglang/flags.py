"""The installed SGLang's own server flags, read with ``ast``, and a user's command line checked against them.

:func:`server_flags` lists every flag the installed release defines: each ``add_argument("--flag", ...)`` call
in ``srt/server_args.py`` / ``srt/arg_groups/*.py`` (0.5.9 declares them all that way) and each arg-group field
``name: A[T, "help" | Arg(...)] = default`` that SGLang 0.5.23's ``add_cli_args_from_dataclass``
(``srt/arg_groups/arg_utils.py``) turns into ``--name-with-dashes`` (or ``Arg(cli_name=..., aliases=...)``),
skipping ``Arg(no_cli=True)``; a ``bool`` field is a switch (store_true there), a ``Literal[...]`` one has
choices. :func:`parse_server_config` tokenises a command line like a shell and checks each flag against that
table; :func:`config_value` answers "what is ``enable_symm_mem`` for this configuration" (given, else default).
"""
from __future__ import annotations

import ast
import difflib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ... import source
from ...serverconfig import ServerConfig
from . import engine as se

_SWITCH_ACTIONS = ("store_true", "store_false", "StoreTrue", "BooleanOptionalAction")
_ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class ConfigError(ValueError):
    """A server flag the installed SGLang does not define, a flag without its value, or a malformed
    ``NAME=VALUE``: one paragraph saying what to change."""


@dataclass(frozen=True)
class FlagSpec:
    """``flag`` (``--enable-symm-mem``), ``dest`` (``enable_symm_mem``), ``switch`` (takes no value),
    ``choices`` (list or None), ``default`` (literal, or the default's source text), ``where`` (``sglang/FILE:LINE``),
    ``number``: ``"int"`` / ``"float"`` when SGLang parses its value as one (``type=int``, a field typed ``int`` or
    ``Optional[int]``), ``"int list"`` / ``"float list"`` for several (``nargs``, ``List[int]``), else ""."""

    flag: str
    dest: str
    switch: bool
    choices: tuple | None
    default: object
    where: str
    number: str = ""


_CACHE: dict[tuple, dict] = {}


def _literal(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ast.unparse(node)


def _from_add_argument(call: ast.Call, path: Path, fields: dict) -> list[FlagSpec]:
    names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
             and a.value.startswith("--")]
    if not names:
        return []
    kw = {k.arg: k.value for k in call.keywords if k.arg}
    action = ast.unparse(kw["action"]) if "action" in kw else ""
    switch = any(a in action for a in _SWITCH_ACTIONS)
    dest = kw["dest"].value if isinstance(kw.get("dest"), ast.Constant) else names[0][2:].replace("-", "_")
    choices = _literal(kw["choices"]) if "choices" in kw else None
    default = fields[dest][0] if dest in fields else _literal(kw["default"]) if "default" in kw else \
        (False if "StoreTrue" in action or "store_true" in action else None)
    ref = re.fullmatch(r"ServerArgs\.(\w+)", str(default))
    if ref and ref.group(1) in fields:
        default = fields[ref.group(1)][0]
    tp = ast.unparse(kw["type"]) if "type" in kw else ""
    number = (tp + (" list" if "nargs" in kw else "")) if tp in ("int", "float") and not switch else ""
    out = [FlagSpec(n, dest, switch, tuple(choices) if isinstance(choices, (list, tuple)) else None, default,
                    f"{se.short(path)}:{call.lineno}", number) for n in names]
    if "BooleanOptionalAction" in action:
        out += [FlagSpec("--no-" + n[2:], dest, True, None, default, f"{se.short(path)}:{call.lineno}") for n in names]
    return out


def _annotated(node: ast.AnnAssign) -> tuple[ast.AST, ast.AST] | None:
    """(type, metadata) of ``A[T, meta]`` / ``Annotated[T, meta]``."""
    ann = node.annotation
    if not (isinstance(ann, ast.Subscript) and isinstance(ann.slice, ast.Tuple) and len(ann.slice.elts) >= 2):
        return None
    if ast.unparse(ann.value).split(".")[-1] not in ("A", "Annotated"):
        return None
    return ann.slice.elts[0], ann.slice.elts[1]


def _from_field(node: ast.AnnAssign, path: Path) -> list[FlagSpec]:
    got = _annotated(node)
    if got is None or not isinstance(node.target, ast.Name):
        return []
    tp, meta = got
    kw = {k.arg: k.value for k in meta.keywords if k.arg} if isinstance(meta, ast.Call) else {}
    if not (isinstance(meta, ast.Constant) and isinstance(meta.value, str)) and not (
            isinstance(meta, ast.Call) and ast.unparse(meta.func).split(".")[-1] == "Arg"):
        return []
    if isinstance(kw.get("no_cli"), ast.Constant) and kw["no_cli"].value is True:
        return []
    name = node.target.id
    cli = kw["cli_name"].value if isinstance(kw.get("cli_name"), ast.Constant) else "--" + name.replace("_", "-")
    aliases = _literal(kw["aliases"]) if "aliases" in kw else []
    tps = ast.unparse(tp)
    inner = re.sub(r"^Optional\[(.*)\]$", r"\1", tps)
    switch = inner == "bool" and "action" not in kw
    choices = None
    lit = re.match(r"^Literal\[(.*)\]$", inner)
    if lit:
        try:
            choices = tuple(ast.literal_eval(f"[{lit.group(1)}]"))
        except (ValueError, SyntaxError):
            choices = None
    default = _literal(node.value) if node.value is not None else None
    where = f"{se.short(path)}:{node.lineno}"
    return [FlagSpec(n, name, switch, choices, default, where, _number_of(inner, kw)) for n in [cli] + list(aliases or [])
            if isinstance(n, str)]


def _number_of(inner: str, kw: dict) -> str:
    """``number`` of a field typed ``inner`` (``Optional[...]`` stripped): "int", "float", "int list", "float list"
    or "" (a field with its own ``type_parser`` or ``action`` is left unchecked: SGLang parses it its own way)."""
    if "type_parser" in kw or "action" in kw or "type" in kw:
        return ""
    if inner in ("int", "float"):
        return inner
    m = re.fullmatch(r"(?:List|list|Tuple|tuple)\[(int|float)(?:, \.\.\.)?\]", inner)
    return f"{m.group(1)} list" if m else ""



def server_flags(engine: se.Engine) -> dict[str, FlagSpec]:
    """Every flag of the installed SGLang -> :class:`FlagSpec` (cached per release folder). Raises
    :class:`~stackprobe.engines.sglang.engine.GateNotFound` when no flag at all is found (the argument files moved)."""
    key = (str(engine.root), engine.version)
    if key in _CACHE:
        return _CACHE[key]
    trees = {}
    for p in se._arg_sources(engine):
        try:
            trees[p] = source.parse(p)
        except (SyntaxError, ValueError, OSError):
            continue
    fields: dict[str, tuple] = {}
    for path, tree in trees.items():
        for cls in (n for n in source.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in cls.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                    fields.setdefault(node.target.id, (_literal(node.value), f"{se.short(path)}:{node.lineno}"))
    out: dict[str, FlagSpec] = {}
    for path, tree in trees.items():
        for node in source.walk(tree):
            specs = []
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
                specs = _from_add_argument(node, path, fields)
            elif isinstance(node, ast.AnnAssign):
                specs = _from_field(node, path)
            for s in specs:
                out.setdefault(s.flag, s)
    if not out:
        raise se.GateNotFound(f"gate not found in sglang {engine.version}: no server flag defined in "
                              f"{', '.join('sglang/' + r for r in se.ARG_FILES)}")
    _CACHE[key] = out
    return out


def parse_server_config(server_args: str, env: list[str] | tuple = (), engine: se.Engine | None = None,
                        source_text: str = "") -> ServerConfig:
    """``server_args``: the server's own flags as one shell-quoted string (``"--enable-symm-mem --tp-size 8"``),
    tokenised like a shell (``shlex``); ``env``: ``NAME=VALUE`` strings. Each flag is checked against the flags
    the installed SGLang defines (:func:`server_flags`): a switch takes no value, any other flag one or more
    (``--flag value`` or ``--flag=value``), a flag with choices one of them. ``engine``: the installed SGLang
    (None: flags are kept unchecked, for a machine without SGLang; the engine answers then say it is absent).
    Returns a :class:`~stackprobe.serverconfig.ServerConfig` (``args``: flag -> True or the value string, in
    order). Raises :class:`ConfigError` (one paragraph) for an unknown flag, a missing or unexpected value, a
    value outside the choices, unbalanced quotes, or a malformed ``NAME=VALUE``."""
    bad_env = [e for e in env if not _ENV_RE.match(e)]
    if bad_env:
        raise ConfigError(f"--env {bad_env[0]!r} is not NAME=VALUE: pass each server environment variable as "
                          "NAME=VALUE (a letter or underscore first, then letters, digits, underscores), e.g. "
                          "--env SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1.")
    envd = dict(e.split("=", 1) for e in env)
    try:
        tokens = shlex.split(server_args or "")
    except ValueError as e:
        raise ConfigError(f"--server-args {server_args!r} does not tokenise like a shell command line ({e}): "
                          "close the quote, or quote the whole option list once, e.g. "
                          "--server-args \"--enable-symm-mem --tp-size 8\".") from e
    flags = server_flags(engine) if engine is not None else None
    who = f"sglang {engine.version}" if engine is not None else "sglang"
    args: dict = {}
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            raise ConfigError(f"--server-args: {tok!r} is not a flag and follows no flag that takes a value; pass "
                              f"the server's flags as {who} spells them (--name or --name value).")
        name, eq, inline = tok.partition("=")
        spec = flags.get(name) if flags is not None else None
        if flags is not None and spec is None:
            near = difflib.get_close_matches(name, list(flags), n=3)
            raise ConfigError(f"--server-args: {name} is not a server flag of the installed {who} (its flags are "
                              f"read from {', '.join('sglang/' + r for r in se.ARG_FILES)}); "
                              + (f"did you mean {' or '.join(near)}? " if near else "")
                              + "Fix the spelling or drop the flag (this suite judges the flags the installed "
                                "release accepts).")
        i += 1
        if spec is not None and spec.switch:
            if eq:
                raise ConfigError(f"--server-args: {name} is a switch in {who} ({spec.where}) and takes no value; "
                                  f"write {name} alone.")
            args[name] = True
            continue
        values = [inline] if eq else []
        while not eq and i < len(tokens) and not tokens[i].startswith("--"):
            values.append(tokens[i])
            i += 1
        if not values and spec is None and not eq:
            args[name] = True    # unchecked (no SGLang here): a bare flag reads as a switch
            continue
        if not values:
            raise ConfigError(f"--server-args: {name} takes a value in {who} ({spec.where}); write {name} VALUE"
                              + (f" with VALUE one of {', '.join(map(str, spec.choices))}." if spec.choices else "."))
        value = " ".join(values)
        if spec is not None and spec.choices and value not in [str(c) for c in spec.choices]:
            raise ConfigError(f"--server-args: {name} {value!r} is not one of {who}'s choices "
                              f"{', '.join(map(str, spec.choices))} ({spec.where}).")
        if spec is not None and spec.number:
            _check_number(spec, name, values, who)
        args[name] = value
    text = source_text or " ".join(x for x in ([f'--server-args "{server_args}"'] if server_args else [])
                                   + [f"--env {e}" for e in env])
    return ServerConfig(args=args, env=envd, source=text)


def _is_number(text: str, kind: str) -> bool:
    try:
        (int if kind == "int" else float)(text)
    except ValueError:
        return False
    return True


def _check_number(spec: FlagSpec, name: str, values: list[str], who: str) -> None:
    """Raise :class:`ConfigError` when a value of a numeric flag is not a number of its kind (SGLang itself would
    refuse it at start-up; the readers would otherwise compute with text)."""
    kind = spec.number.split()[0]
    parts = [p for v in values for p in v.split()] if spec.number.endswith("list") else [" ".join(values)]
    bad = next((p for p in parts if not _is_number(p, kind)), None)
    if bad is None:
        return
    what = "a whole number" if kind == "int" else "a number"
    eg = "8" if kind == "int" else "0.5"
    several = " (one or more, separated by spaces)" if spec.number.endswith("list") else ""
    raise ConfigError(f"--server-args: {name} {bad!r} is not {what}: {who} reads {name} as {kind}{several} "
                      f"({spec.where}); write {name} followed by {what}, e.g. {name} {eg}, or drop the flag.")


def _coerce(value, default):
    if value is True or not isinstance(value, str):
        return value
    if isinstance(default, bool) or value.lower() in ("true", "false"):
        return value.lower() in ("1", "true", "yes", "on")
    if isinstance(default, int) or re.fullmatch(r"-?\d+", value):
        try:
            return int(value)
        except ValueError:
            return value
    return value


def config_value(engine: se.Engine, config: ServerConfig, *names: str) -> tuple[object, str]:
    """(value, where) of the server option ``names`` (its flag spellings, newest first: ``"--cuda-graph-max-bs-decode",
    "--cuda-graph-max-bs"``) for ``config``: the first spelling the installed SGLang defines; the value given under
    any flag with the same destination (coerced to the default's type; a switch is True; ``--no-x`` is False) and
    "given: --flag", else the installed default and its ``file:line``. Raises GateNotFound when the release defines
    none of ``names``."""
    flags = server_flags(engine)
    main = next((flags[n] for n in names if n in flags), None)
    if main is None:
        raise se.GateNotFound(f"gate not found in sglang {engine.version}: no server flag {' / '.join(names)} "
                              f"(searched {', '.join('sglang/' + r for r in se.ARG_FILES)})")
    for s in [s for s in flags.values() if s.dest == main.dest]:
        if s.flag in config.args:
            v = config.args[s.flag]
            if s.flag.startswith("--no-") and v is True:
                return False, f"given: {s.flag}"
            return _coerce(v, s.default), f"given: {s.flag}" + ("" if v is True else f" {v}")
    return main.default, f"default at {main.where} ({main.flag} not given)"
