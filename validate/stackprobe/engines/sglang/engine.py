"""The serving engine's side of every backend: SGLang as installed, read from its source (``ast``).

A backend's *engine gate* is every condition on SGLang's path from its server argument or environment
variable to the communicator being enabled, including the per-call checks. Each backend module reads its
own conditions with the helpers here and answers with a :class:`~stackprobe.verdict.Verdict` of scope
``engine``. Rules (issue "Verdicts answer what SGLang will do on the target box"):

* no SGLang installed: ``skipped (not installed: sglang)``; the headline then never says gate-passes
  for the engine (case C18);
* a gate whose source cannot be found or parsed: ``error`` naming the package, its version and the file
  (case C17: "gate not found in sglang X at FILE"), never gate-passes;
* a backend the installed SGLang never references: ``not-integrated``;
* statuses say what a user gets with the server configuration asked about (``ctx.server_config``, default
  :data:`~stackprobe.serverconfig.NO_FLAGS`: change nothing), one rule for every backend
  (:meth:`EngineAnswer.verdict`). A gate off by default (a server argument, an environment variable) is an
  *opt-in* (``Gate.opt_in``); it admits when the configuration sets it. With every other gate open the path is
  ``on-by-default`` (no opt-in on its path), ``opt-in`` (the exact flag or variable is the lift) or
  ``on-as-configured`` (the configuration sets every opt-in). Otherwise the first closed gate that is not an
  opt-in decides, by what SGLang does there (``Gate.on_fail``): ``raise`` (an uncaught exception at start-up:
  ``startup-failure-if-set``, naming the raise and the call path that reaches it), ``decline`` (the communicator
  disables itself or is not built: ``falls-back-if-set`` on an opt-in path, naming the check and where the
  tensor goes instead), a missing package (``not-installed``), else ``blocked`` (its kind: topology,
  python-table, ...). An on-by-default path that declines is ``blocked`` (kind), as nothing is to be set.

Several closed gates: the first on SGLang's path that is not an opt-in is the verdict's gate; the others are
listed in the cause; the lift is the hardest of them (``nothing-on-this-topology`` wins over a package upgrade)
and ``lift_detail`` names every closed gate's lift in path order, an unset opt-in's flag first.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from ... import source
from ...env import dist_version
from ...verdict import (BLOCKED, ERROR, FALLS_BACK, GATE_NOT_INSTALLED, GATE_NOT_INTEGRATED, GATE_SETTING, LIFT_NONE_NEEDED,
                       LIFT_NOTHING, LIFT_PACKAGE, LIFT_SETTING, NOT_ASSESSED, NOT_INSTALLED, NOT_INTEGRATED,
                       ON_AS_CONFIGURED, ON_BY_DEFAULT, OPT_IN, SCOPE_ENGINE, SKIPPED, STARTUP_FAILURE, Verdict)

DIST = "sglang"
# lifts, hardest first: what a user must do when several gates close
_LIFT_ORDER = (LIFT_NOTHING, LIFT_PACKAGE, "cuda-upgrade", "rebuild-with-arch", LIFT_SETTING, "unknown", LIFT_NONE_NEEDED, "")


class GateNotFound(LookupError):
    """A gate's source is missing or unreadable in the installed engine: the verdict is ``error``."""


class NotAssessed(GateNotFound):
    """A gate whose source is read but whose answer for the configuration asked about cannot be judged from it (a
    condition on a setting the configuration does not decide): the verdict is ``not-assessed`` with the reason (the
    message, starting "not assessed: "), never a pass. A GateNotFound, so every caller that refuses to guess on a
    missing gate refuses here too."""


@dataclass
class Engine:
    """The installed SGLang: ``version`` (distribution metadata) and ``root`` (the ``sglang`` folder)."""

    version: str
    root: Path
    #: the package folder's name, in every error (a second engine's reader subclasses this one)
    pkg = "sglang"

    def file(self, rel: str) -> Path:
        """``srt/layers/x.py`` -> its path; raises :class:`GateNotFound` naming package, version, file."""
        p = self.root / rel
        if not p.is_file():
            raise GateNotFound(f"gate not found in {self.pkg} {self.version} at {self.pkg}/{rel}: the file does not exist")
        return p

    def tree(self, rel: str) -> ast.Module:
        p = self.file(rel)
        try:
            return source.parse(p)
        except (SyntaxError, ValueError) as e:
            raise GateNotFound(f"gate not readable in {self.pkg} {self.version} at {self.pkg}/{rel}: {e}") from e

    def function(self, rel: str, name: str) -> ast.FunctionDef:
        fn = source.functions(self.tree(rel)).get(name)
        if fn is None:
            raise GateNotFound(f"gate not found in {self.pkg} {self.version} at {self.pkg}/{rel}: no function {name}")
        return fn

    def references(self, *needles: str) -> list[str]:
        """``file:line`` of every line of SGLang's Python source that mentions one of ``needles``
        (case-insensitive), at most 5."""
        pat = re.compile("|".join(re.escape(n) for n in needles), re.IGNORECASE)
        hits = []
        for p in sorted(self.root.rglob("*.py")):
            try:
                text = p.read_text(encoding="utf-8", errors="replace")
                if not pat.search(text):      # the needles hold no line break: no hit in the file, none in a line
                    continue
                for i, line in enumerate(text.splitlines(), 1):
                    if pat.search(line):
                        hits.append(f"{short(p)}:{i}")
                        if len(hits) >= 5:
                            return hits
            except OSError:
                continue
        return hits


def short(path: Path) -> str:
    parts = Path(path).parts
    return "/".join(parts[len(parts) - 1 - parts[::-1].index("sglang"):]) if "sglang" in parts else str(path)


def installed() -> Engine | None:
    """The installed SGLang, or None (no distribution metadata or no importable ``sglang`` folder)."""
    ver, root = dist_version(DIST), source.package_dir("sglang")
    if ver is None or root is None:
        return None
    return Engine(ver, root)


def not_installed(backend: str) -> Verdict:
    """Case C18: the engine answer when SGLang is absent."""
    return Verdict(backend, SKIPPED, scope=SCOPE_ENGINE, gate=GATE_NOT_INSTALLED, lift=LIFT_PACKAGE,
                   cause="not installed: sglang (the engine answer needs the serving engine)",
                   lift_detail="pip install sglang")


def target_host(ctx) -> dict:
    return {"compute_capability": ctx.target.cc, "topology": ctx.topology, "world_size": ctx.world_size,
            "topology_source": ctx.topology_source}


@dataclass
class Gate:
    """One condition on SGLang's path. ``admits``: True / False for the target host and the configuration asked
    about. ``kind``/``lift`` as in :mod:`stackprobe.verdict`; ``where``: ``sglang/FILE:LINE what``.

    ``opt_in``: the gate is a flag or variable off by default (``flag`` names it, ``set_to`` its value); it admits
    when the configuration sets it (``configured``). ``on_fail``: what SGLang does when this gate closes on a path
    that was asked for: ``"raise"`` (an exception nothing on the start-up path catches; ``raises`` names it and the
    call path), ``"decline"`` (the communicator is not built or disables itself; ``falls_to`` says where the tensor
    goes instead), or ``""`` (not characterised: the verdict says ``blocked``)."""

    name: str
    admits: bool
    where: str
    kind: str = ""
    cause: str = ""
    lift: str = ""
    lift_detail: str = ""
    value: object = None
    flag: str = ""
    opt_in: bool = False
    configured: bool = False
    set_to: str = ""
    on_fail: str = ""
    falls_to: str = ""
    raises: str = ""


#: where a decode-step allreduce goes when an out-of-place path declines: SGLang's in-place NCCL call (pynccl)
NCCL_FALLBACK = "NCCL (pynccl, SGLang's in-place fallback)"


def configured(ctx, flag: str, equals: str | None = None) -> bool:
    """Whether the server configuration asked about (``ctx.server_config``) sets ``flag``: a server argument
    (``--enable-symm-mem``: given at all; with ``equals``, given with that value) or an environment variable
    (``NAME``, truthy: 1/true/yes/on)."""
    sc = getattr(ctx, "server_config", None)
    if sc is None or not flag:
        return False
    if flag.startswith("--"):
        got = sc.flag(flag)
        return got is not None and (equals is None or str(got) == equals)
    return env_truthy(sc.var(flag))


def _flags(gates) -> str:
    """The flags and variables of ``gates`` as a user types them: ``--flag value`` or ``NAME=1``. A flag that two
    gates set (vLLM's ``--compilation-config``, whose later gate's JSON carries the earlier one's keys too) is
    written once, with the last gate's value: given twice on a command line, argparse keeps only the last."""
    typed: dict[str, str] = {}
    for g in gates:
        if g.flag:
            typed.pop(g.flag, None)
            typed[g.flag] = f"{g.flag} {g.set_to}".strip() if g.flag.startswith("--") else f"{g.flag}=1"
    return ", ".join(typed.values())


@dataclass
class EngineAnswer:
    """Collects the gates of one backend in SGLang's path order and makes the engine verdict."""

    backend: str
    engine: Engine
    ctx: object
    gates: list = field(default_factory=list)

    def add(self, gate: Gate) -> Gate:
        self.gates.append(gate)
        return gate

    def verdict(self, passes_cause: str) -> Verdict:
        """The engine verdict by the module's rule (see the module docstring); ``passes_cause``: what SGLang
        does once every gate admits."""
        ver = self.engine.version
        who_eng = getattr(self.engine, "title", "SGLang")   # the engine interface: vLLM's reader says "vLLM"
        v = Verdict(self.backend, ON_BY_DEFAULT, scope=SCOPE_ENGINE, lift=LIFT_NONE_NEEDED, host=target_host(self.ctx))
        v.add(f"{getattr(self.engine, 'dist', DIST)} version", ver, "distribution metadata")
        sc = getattr(self.ctx, "server_config", None)
        v.add("server configuration asked about", sc.describe() if sc is not None else "no flags",
              (sc.source if sc is not None and sc.source else "") or "default: change nothing")
        for g in self.gates:
            v.add(f"engine gate: {g.name}", {"admits": g.admits, "value": g.value}, g.where)
        opt = [g for g in self.gates if g.opt_in]
        unset = [g for g in opt if not g.admits]
        closed = [g for g in self.gates if not g.admits and not g.opt_in]
        if opt:
            v.add("user setting", _flags(opt), "the opt-in gates on its path, as a user types them")
        if not closed:
            if not opt:
                v.cause = passes_cause
            elif unset:
                v.status, v.gate, v.lift = OPT_IN, GATE_SETTING, LIFT_SETTING
                v.cause = (f"{who_eng} {ver}: opt-in: set {_flags(unset)}; every other gate on its path admits the target "
                           f"({'; '.join(f'{g.cause} ({g.where})' for g in unset)}). Once set: {passes_cause}")
                v.lift_detail = "; ".join(dict.fromkeys(g.lift_detail for g in unset if g.lift_detail))
            else:
                v.status = ON_AS_CONFIGURED
                v.cause = (f"{who_eng} {ver}: the configuration asked about sets {_flags(opt)} and every gate on its path "
                           f"admits the target: {passes_cause}")
            return v
        first = closed[0]
        rest = [g for g in self.gates if not g.admits and g is not first]
        hardest = min([first] + rest, key=lambda g: _LIFT_ORDER.index(g.lift) if g.lift in _LIFT_ORDER else len(_LIFT_ORDER))
        v.gate, v.lift = first.kind, hardest.lift
        said = f"{first.cause} ({first.where})"
        asked = [g for g in opt if g.admits]
        if first.kind == GATE_NOT_INSTALLED:
            v.status = NOT_INSTALLED
            v.cause = f"{who_eng} {ver}: {said}" + (f"; setting {_flags(opt)} then falls back to {first.falls_to}"
                                                  if opt and first.falls_to else "")
        elif first.on_fail == "raise":
            v.status = STARTUP_FAILURE
            who = (f"the configuration asked about sets {_flags(asked)}: the server fails at start-up"
                   if asked and not unset else f"setting {_flags(opt) or 'it'} makes the server fail at start-up")
            v.cause = f"{who_eng} {ver}: {who}: {first.raises or first.cause} ({first.where})"
            if first.raises and first.cause:
                v.cause += f"; why: {first.cause}"
        elif first.on_fail == "decline" and opt:
            v.status = FALLS_BACK
            who = (f"the configuration asked about sets {_flags(asked)}" if asked and not unset
                   else f"setting {_flags(opt)} is accepted")
            v.cause = (f"{who_eng} {ver}: {who}, then the check {first.name} declines: {said}; the tensor goes to "
                       f"{first.falls_to or NCCL_FALLBACK} instead")
        else:
            v.status = BLOCKED
            v.cause = f"{who_eng} {ver}: {said}"
        others = [g for g in rest if not g.opt_in]
        if others:
            v.cause += "; also " + "; ".join(f"{g.cause} ({g.where})" for g in others)
        if unset:
            v.cause += "; the setting itself: " + "; ".join(f"{g.cause} ({g.where})" for g in unset)
        ordered = [g for g in self.gates if not g.admits]      # path order: an unset opt-in's flag first
        v.lift_detail = "; ".join(dict.fromkeys(g.lift_detail for g in ordered if g.lift_detail))
        return v


def error(backend: str, engine: Engine, exc: Exception, ctx=None) -> Verdict:
    """Case C17: a gate that moved or vanished is an error naming package, version and file; a gate read but not
    decidable for the configuration (:class:`NotAssessed`) is ``not-assessed`` with its reason."""
    unjudged = isinstance(exc, NotAssessed)
    v = Verdict(backend, NOT_ASSESSED if unjudged else ERROR, scope=SCOPE_ENGINE, cause=str(exc),
                lift_detail="give the settings the condition reads in the server configuration asked about"
                if unjudged else "teach this suite where the gate lives in this sglang release (it refuses to guess)",
                host=target_host(ctx) if ctx is not None else {})
    v.add("sglang version", engine.version, "distribution metadata")
    return v


def not_integrated(backend: str, engine: Engine, needles: tuple[str, ...], ctx=None) -> Verdict:
    """The installed SGLang never references the backend."""
    return Verdict(backend, NOT_INTEGRATED, scope=SCOPE_ENGINE, gate=GATE_NOT_INTEGRATED, lift=LIFT_PACKAGE,
                   cause=f"not integrated in sglang {engine.version}: its source never references "
                         f"{' / '.join(needles)}, so no server argument enables it",
                   lift_detail="an sglang release that integrates it", host=target_host(ctx) if ctx else {}
                   ).add("sglang references", [], f"sglang/**/*.py searched for {list(needles)}")


# --- reading conditions ---------------------------------------------------------------------------
_SM_NAME = re.compile(r"^_?(is_(?:sm\d+\w*|blackwell\w*|hopper\w*))$")


def platform_majors(engine: Engine) -> dict[str, list[int]]:
    """SGLang's platform predicates -> the compute-capability majors they admit, read from the
    ``device_capability_majors=`` of each ``is_sm..._supported = lru_cache(...)(partial(...))`` in
    ``srt/utils/common.py``. Keys are the predicate names without ``_supported`` (``is_sm90``)."""
    rel = "srt/utils/common.py"
    out: dict[str, list[int]] = {}
    for node in engine.tree(rel).body:
        if not isinstance(node, ast.Assign):
            continue
        majors = [v for v in source.keyword_literals(node.value, "device_capability_majors") if v]
        if not majors:
            continue
        for t in node.targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    out[n.id.removesuffix("_supported")] = sorted(majors[0])
    if not out:
        raise GateNotFound(f"gate not found in sglang {engine.version} at sglang/{rel}: no is_sm*_supported "
                           "predicate with device_capability_majors")
    return out


def predicate_majors(node: ast.AST, table: dict[str, list[int]]) -> tuple[list[str], list[int]]:
    """The platform predicates (``get_platform().is_sm90``, ``_is_sm100_supported``) named under
    ``node`` and the union of the majors they admit. Raises GateNotFound for a predicate not in table."""
    names, majors = [], set()
    for n in ast.walk(node):
        ident = n.attr if isinstance(n, ast.Attribute) else n.id if isinstance(n, ast.Name) else None
        m = _SM_NAME.match(ident or "")
        if not m:
            continue
        key = m.group(1).removesuffix("_supported")
        if key not in table:
            raise GateNotFound(f"platform predicate {ident} is not defined in sglang/srt/utils/common.py")
        names.append(ident)
        majors.update(table[key])
    return names, sorted(majors)


def raising_arch_check(fn: ast.FunctionDef) -> ast.If | None:
    """The first ``if not (<platform predicates>): raise`` in ``fn``."""
    for node in ast.walk(fn):
        if (isinstance(node, ast.If) and isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)
                and any(isinstance(b, ast.Raise) for b in node.body)
                and any(_SM_NAME.match(getattr(n, "attr", getattr(n, "id", "")) or "") for n in ast.walk(node.test))):
            return node
    return None


def env_flag(engine: Engine, name: str) -> tuple[object, str]:
    """Default of ``name = EnvBool(<default>)`` in ``srt/environ.py`` and ``file:line``. Raises GateNotFound."""
    rel = "srt/environ.py"
    for node in ast.walk(engine.tree(rel)):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets) and isinstance(node.value, ast.Call):
                args = node.value.args
                try:
                    default = ast.literal_eval(args[0]) if args else None
                except ValueError:
                    default = ast.unparse(args[0])
                return default, f"sglang/{rel}:{node.lineno} {ast.unparse(node.value)}"
    raise GateNotFound(f"gate not found in sglang {engine.version} at sglang/{rel}: {name} is not declared")


def env_truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


# --- server arguments -----------------------------------------------------------------------------
ARG_FILES = ("srt/server_args.py", "srt/arg_groups")


def _arg_sources(engine: Engine) -> list[Path]:
    out = []
    for rel in ARG_FILES:
        p = engine.root / rel
        if p.is_file():
            out.append(p)
        elif p.is_dir():
            out.extend(sorted(p.rglob("*.py")))
    return out


def unparsed(root: Path, patterns: tuple[str, ...]) -> list[tuple[str, str]]:
    """The files under ``root`` matching ``patterns`` (globs relative to it) that do not parse, as (relative path,
    error): an enumeration that skips such a file drops its settings, so its caller says which file it could not
    read instead. [] when every file parses."""
    out = []
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            try:
                source.parse(path)
            except (SyntaxError, ValueError, OSError) as e:
                out.append((str(path.relative_to(root)), f"{type(e).__name__}: {e}"))
    return out


def arg_ifs(engine: Engine):
    """Every ``if`` statement in SGLang's argument files (:data:`ARG_FILES`), as (path, ast.If) in file order;
    a file that does not parse is left out (the callers' gates then report "not found")."""
    for path in _arg_sources(engine):
        try:
            tree = source.parse(path)
        except (SyntaxError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.If):
                yield path, node


def _field_default(trees: dict[Path, ast.Module], dest: str) -> tuple[object, str] | None:
    """The class-level ``dest: T = default`` (ServerArgs' dataclass field, or an arg group's field) and file:line."""
    for path, tree in trees.items():
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in cls.body:
                if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == dest
                        and node.value is not None):
                    try:
                        default = ast.literal_eval(node.value)
                    except ValueError:
                        default = ast.unparse(node.value)
                    return default, f"{short(path)}:{node.lineno} {cls.name}.{dest}"
    return None


def _cli_name_rule(trees: dict[Path, ast.Module]) -> str | None:
    """file:line of the arg groups' rule that turns a field name into its flag: ``"--" + name.replace("_", "-")``."""
    for path, tree in trees.items():
        for n in ast.walk(tree):
            if (isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and isinstance(n.left, ast.Constant)
                    and n.left.value == "--" and isinstance(n.right, ast.Call) and isinstance(n.right.func, ast.Attribute)
                    and n.right.func.attr == "replace"
                    and [getattr(a, "value", None) for a in n.right.args] == ["_", "-"]):
                return f"{short(path)}:{n.lineno}"
    return None


def server_argument(engine: Engine, flags: tuple[str, ...]) -> dict:  # noqa: C901, PLR0912 - reason: both flag layouts (0.5.9 add_argument, 0.5.23 arg-group fields) in one pass
    """The first of ``flags`` (``--enable-mscclpp``; candidates, newest name first) that the installed SGLang
    declares, read from its source: an ``add_argument("--flag", ...)`` call in ``srt/server_args.py`` (0.5.9) or
    ``srt/arg_groups/*.py``, or (0.5.23) an arg-group dataclass field whose name the arg groups turn into the
    flag (``"--" + name.replace("_", "-")``) and that is not ``Arg(no_cli=True)``. Returns ``{"flag", "where",
    "dest", "default", "default_where"}``; the default is the ServerArgs / field default (a store_true flag
    without one defaults to False). Raises :class:`GateNotFound` naming the sglang version and the files searched."""
    paths = _arg_sources(engine)
    trees = {}
    for p in paths:
        try:
            trees[p] = source.parse(p)
        except (SyntaxError, ValueError, OSError):
            continue
    rule = _cli_name_rule(trees)
    for flag in flags:
        dest = flag[2:].replace("-", "_")
        for path, tree in trees.items():
            for call in ast.walk(tree):
                if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                        and call.func.attr == "add_argument"):
                    continue
                const = next((a for a in call.args if isinstance(a, ast.Constant) and a.value == flag), None)
                if const is None:
                    continue
                kw = {k.arg: k.value for k in call.keywords}
                if isinstance(kw.get("dest"), ast.Constant):
                    dest = kw["dest"].value
                fd = _field_default(trees, dest)
                if fd is None and "default" in kw:
                    try:
                        fd = (ast.literal_eval(kw["default"]), f"{short(path)}:{kw['default'].lineno} default=")
                    except ValueError:
                        fd = None
                action = kw.get("action")
                if fd is None and isinstance(action, ast.Constant) and action.value == "store_true":
                    fd = (False, f"{short(path)}:{const.lineno} action='store_true'")
                return {"flag": flag, "where": f"{short(path)}:{const.lineno} add_argument({flag!r})", "dest": dest,
                        "default": fd[0] if fd else None, "default_where": fd[1] if fd else ""}
        # an arg-group field whose name the arg groups turn into this flag
        if rule is None:
            continue
        for path, tree in trees.items():
            for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
                for node in cls.body:
                    if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                            and node.target.id == dest):
                        continue
                    ann = ast.unparse(node.annotation)
                    if "no_cli=True" in ann.replace(" ", "") or "cli_name=" in ann:
                        continue
                    try:
                        default = ast.literal_eval(node.value) if node.value is not None else None
                    except ValueError:
                        default = ast.unparse(node.value)
                    where = f"{short(path)}:{node.lineno} {cls.name}.{dest}"
                    return {"flag": flag, "where": f"{where} (flag from the field name, {rule})", "dest": dest,
                            "default": default, "default_where": where}
    searched = sorted({f"sglang/{rel}" + ("/*.py" if (engine.root / rel).is_dir() else "") for rel in ARG_FILES
                       if (engine.root / rel).exists()}) or [f"sglang/{rel}" for rel in ARG_FILES]
    raise GateNotFound(f"gate not found in sglang {engine.version}: no server argument {' / '.join(flags)} "
                       f"(searched add_argument calls and arg-group fields in {', '.join(searched)})")


def deprecated_flag(engine: Engine, flag: str) -> dict | None:
    """Where the installed SGLang registers ``flag`` as deprecated, read from its argument sources (``ast``): an
    ``add_argument("<flag>", action=<a Deprecated... action>, new_flag="...")`` call (sglang 0.5.23
    ``srt/server_args.py:416-424`` registers ``--enable-dp-attention`` with ``new_flag="--attn-dp-size <dp-size>"``).
    Returns ``{"flag", "new_flag", "where"}`` or None when the release does not deprecate it."""
    for path in _arg_sources(engine):
        try:
            tree = source.parse(path)
        except (SyntaxError, ValueError, OSError):
            continue
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "add_argument"
                    and any(isinstance(a, ast.Constant) and a.value == flag for a in call.args)):
                continue
            kw = {k.arg: k.value for k in call.keywords}
            action = ast.unparse(kw["action"]) if "action" in kw else ""
            if "deprecat" not in action.lower():
                continue
            new = kw.get("new_flag")
            return {"flag": flag, "new_flag": new.value if isinstance(new, ast.Constant) else "",
                    "where": f"{short(path)}:{call.lineno}-{call.end_lineno} add_argument({flag!r}, action={action})"}
    return None


def server_argument_gate(engine: Engine, flags: tuple[str, ...], *, ctx=None, on_when: object = True,
                         set_to: str = "", equals: str | None = None) -> Gate:
    """The server-argument gate: ``flags`` read by :func:`server_argument` (GateNotFound when none is declared).
    On by default (``default == on_when``): the gate admits unless the configuration asked about
    (``ctx.server_config``) gives the flag that turns it off (``--disable-custom-all-reduce``). Off by default: an
    opt-in (kind ``setting``, lift the flag; ``set_to``: the value to pass, e.g. ``flashinfer`` for
    ``--moe-a2a-backend``; empty for a store_true flag) that admits when the configuration gives the flag. Its
    value names the flag, its default, where the default is declared and what the configuration sets. ``equals``:
    the value the configuration must give (``flashinfer`` for ``--moe-a2a-backend``); None: any value."""
    a = server_argument(engine, flags)
    on = a["default"] == on_when
    given = configured(ctx, a["flag"], equals) if ctx is not None else False
    state = "on by default" if on else "off by default"
    setting = f"{a['flag']} {set_to}".strip()
    value = f"{a['flag']} (default {a['default']!r} at {a['default_where']}: {state})" + (
        "; the configuration asked about sets it" if given else "")
    if on:
        return Gate("server argument", not given, a["where"], GATE_SETTING,
                    f"the configuration asked about sets {a['flag']}, which turns it off", LIFT_SETTING,
                    f"leave {a['flag']} unset", flag=a["flag"], value=value, configured=given)
    return Gate("server argument", given, a["where"], GATE_SETTING,
                f"{a['flag']} is off by default (default {a['default']!r} at {a['default_where']})", LIFT_SETTING,
                f"{setting} (off by default in sglang {engine.version})", flag=a["flag"], opt_in=True,
                configured=given, set_to=set_to, value=value)
