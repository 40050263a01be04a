"""Reading gates from an installed package's source without importing it (Python's ``ast``).

Used where importing a backend is impossible or unsafe (FACTS: ``import flashinfer`` 0.6.16 fails on
a host with no GPU; sglang needs dozens of dependencies). Every function here returns where it read the
value, so a verdict can cite file and function.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import re
from pathlib import Path
from typing import Any, Iterator


class SourceNotFound(LookupError):
    """The package, file, function or name is not in the installed source."""


def package_dir(top: str) -> Path | None:
    """Folder of top-level package ``top`` on sys.path, found without importing it."""
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(spec.origin).parent if spec.origin else None


def module_file(dotted: str) -> Path:
    """``"sglang.srt.distributed.device_communicators.all_reduce_utils"`` -> its .py file (no import).
    Raises :class:`SourceNotFound`."""
    top, *rest = dotted.split(".")
    base = package_dir(top)
    if base is None:
        raise SourceNotFound(f"package {top!r} is not installed")
    p = base.joinpath(*rest)
    for cand in (p.with_suffix(".py"), p / "__init__.py"):
        if cand.is_file():
            return cand
    raise SourceNotFound(f"{dotted} has no source file under {base}")


def parse(path: Path) -> ast.Module:
    """The module ``path`` holds, parsed once per text: the readers ask for the same few large files (SGLang's
    ``server_args.py``, ``parallel_state.py``) hundreds of times in one run. The file is read on every call and the
    tree is keyed by its name and text, so an edited file is parsed again. The tree is shared: callers read it and
    never change it. Raises ``SyntaxError`` / ``ValueError`` as :func:`ast.parse`."""
    return _parse_text(Path(path).read_text(encoding="utf-8", errors="replace"), str(path))


@functools.lru_cache(maxsize=1024)
def _parse_text(text: str, filename: str) -> ast.Module:
    return ast.parse(text, filename=filename)


#: walk() per module, class or function node, keyed by id(node); the entry holds the node (its id is not reused)
_WALKS: dict[int, tuple[ast.AST, list]] = {}
_WALKED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def walk(node: ast.AST) -> list[ast.AST] | Iterator[ast.AST]:
    """:func:`ast.walk` (the same nodes, in the same order), kept per module, class or function: the readers walk
    the same large modules and functions of a parsed (shared, never changed) tree again and again. Other nodes are
    walked afresh. The list returned is shared: iterate it, do not change it."""
    if not isinstance(node, _WALKED):
        return ast.walk(node)
    hit = _WALKS.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    nodes = list(ast.walk(node))
    if len(_WALKS) > 65536:
        _WALKS.clear()
    _WALKS[id(node)] = (node, nodes)
    return nodes


#: functions() per tree, keyed by id(tree); the entry holds the tree, so its id is not reused while kept
_FUNCTIONS: dict[int, tuple[ast.AST, dict]] = {}


def functions(tree: ast.AST) -> dict[str, ast.FunctionDef]:
    """Every (possibly nested or method) function definition by name (first wins in :func:`ast.walk` order).
    Computed once per tree (the dict returned is shared: read it, do not change it)."""
    hit = _FUNCTIONS.get(id(tree))
    if hit is not None and hit[0] is tree:
        return hit[1]
    out: dict = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.setdefault(node.name, node)
    if len(_FUNCTIONS) > 4096:
        _FUNCTIONS.clear()
    _FUNCTIONS[id(tree)] = (tree, out)
    return out


def keyword_literals(node: ast.AST, keyword: str) -> list[Any]:
    """Literal values passed as ``keyword=`` in every call under ``node`` (non-literals skipped)."""
    vals = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            for kw in sub.keywords:
                if kw.arg == keyword:
                    try:
                        vals.append(ast.literal_eval(kw.value))
                    except ValueError:
                        vals.append(None)
    return vals


def _eval_with_consts(node: ast.AST, consts: dict) -> Any:
    """literal_eval that also resolves simple module-level numeric constants and arithmetic
    (``64 * MiB``), as size tables are written."""
    expr = ast.Expression(body=node)
    for sub in ast.walk(expr):
        if isinstance(sub, ast.Name) and sub.id not in consts:
            raise ValueError(f"name {sub.id} is not a module constant")
        if isinstance(sub, (ast.Call, ast.Attribute, ast.Lambda, ast.Subscript)):
            raise ValueError("not a literal table")
    return eval(compile(expr, "<table>", "eval"), {"__builtins__": {}}, dict(consts))  # noqa: S307 - names are vetted above


def module_assignment(path: Path, name: str) -> tuple[Any, int]:
    """Value of the module-level assignment ``name = <literal table>`` in ``path`` and its line.
    Numeric module constants used in it (``MiB = 1024 * 1024``) are resolved. Raises SourceNotFound."""
    tree = parse(path)
    consts: dict = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else ([node.target] if isinstance(node, ast.AnnAssign) and node.value else [])
        for t in targets:
            if not isinstance(t, ast.Name):
                continue
            if t.id == name:
                return _eval_with_consts(node.value, consts), node.lineno
            try:
                v = _eval_with_consts(node.value, consts)
                if isinstance(v, (int, float, str)):
                    consts[t.id] = v
            except (ValueError, SyntaxError, TypeError, NameError, ArithmeticError):
                pass
    raise SourceNotFound(f"{name} is not assigned at module level in {path}")


def find_assignment(root: Path, name: str, glob: str = "**/*.py") -> tuple[Path, Any, int]:
    """First file under ``root`` assigning ``name`` at module level (a quick text filter first)."""
    for p in sorted(root.glob(glob)):
        try:
            text = p.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if f"{name} =" not in text and f"{name}=" not in text and f"{name}:" not in text:
            continue
        try:
            value, line = module_assignment(p, name)
            return p, value, line
        except (SourceNotFound, SyntaxError, ValueError):
            continue
    raise SourceNotFound(f"no module under {root} assigns {name}")


def find_files_containing(root: Path, needle: str, glob: str = "**/*.py") -> list[Path]:
    out = []
    for p in sorted(root.glob(glob)):
        try:
            if needle in p.read_text(encoding="utf-8", errors="replace"):
                out.append(p)
        except OSError:
            continue
    return out


def load_function(path: Path, name: str):
    """Compile the installed source of a *pure* function (no imports, no globals beyond builtins) and
    return it with its line, so its own code can be called where importing its module is impossible.
    Raises SourceNotFound."""
    tree = parse(path)
    fn = functions(tree).get(name)
    if fn is None:
        raise SourceNotFound(f"{name} is not defined in {path}")
    mod = ast.Module(body=[fn], type_ignores=[])
    ns: dict = {}
    exec(compile(mod, str(path), "exec"), ns)  # noqa: S102 - the installed package's own function
    return ns[name], fn.lineno


def class_attribute(path: Path, cls: str, attr: str) -> tuple[Any, int]:
    """Literal value of ``attr`` assigned in the body of class ``cls``."""
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for st in node.body:
                if isinstance(st, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in st.targets):
                    return ast.literal_eval(st.value), st.lineno
    raise SourceNotFound(f"{cls}.{attr} is not assigned in {path}")


def imports_from(path: Path, prefix: str) -> list[tuple[str, str, int]]:
    """(module, name, line) for every ``from <module> import <name>`` whose module starts with prefix."""
    out = []
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(prefix):
            for a in node.names:
                out.append((node.module, a.name, node.lineno))
    return out


def defined_names(path: Path) -> set[str]:
    """Names a module defines or imports at top level (functions, classes, assignments, imports)."""
    names = set()
    for node in parse(path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Try):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names.update((a.asname or a.name).split(".")[0] for a in sub.names)
    return names


def matching_lines(root: Path, rel: str, pattern: str) -> list[tuple[int, str]]:
    """``[(line number, stripped text)]`` of the lines of ``root/rel`` that match the regular expression ``pattern``.
    Raises LookupError when the file does not exist in the installed release."""
    p = root / rel
    if not p.is_file():
        raise LookupError(f"{root.name}/{rel} does not exist in the installed release")
    rx = re.compile(pattern)
    return [(i, ln.strip()) for i, ln in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if rx.search(ln)]
