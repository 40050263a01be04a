"""What the engines' path enumerations share (:mod:`.sglang_paths`, :mod:`.vllm_paths`): a settings file read with
its lines, the help text of the comment lines above a declaration, and the term filter that says whether a setting
names a communication path."""
from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path

from .. import source


def parse_with_lines(path: Path) -> tuple[ast.Module, list[str]] | None:
    """(syntax tree, lines) of a settings file (``srt/environ.py``, ``envs.py``); None when it is absent, unreadable
    or does not parse: nothing is listed from it (the enumerations' ``paths`` name such a file as not assessed)."""
    try:
        return source.parse(path), path.read_text(encoding="utf-8", errors="replace").splitlines()
    except (SyntaxError, ValueError, OSError):
        return None


def comment_above(lines: list[str], lineno: int) -> list[str]:
    """The comment lines right above line ``lineno`` (1-based), up to the first line that is not a comment."""
    i = lineno - 2
    while i >= 0 and lines[i].strip().startswith("#"):
        i -= 1
    return lines[i + 1:lineno - 1]


def comment_help(lines: Iterable[str]) -> str:
    """A declaration's help text from the lines before it: each comment line without its ``#``, joined by spaces;
    lines that are no comment and separator lines (``# ====``, ``# ----``) left out."""
    texts = (ln.strip().lstrip("#").strip() for ln in lines if ln.strip().startswith("#"))
    return " ".join(t for t in texts if not set(t) <= set("=-# "))


def names_setting(terms: re.Pattern, name: str, help_text: str, choices: Iterable = (),
                  name_terms: re.Pattern | None = None) -> bool:
    """Whether ``terms`` match a setting's name (also with its ``_`` read as spaces, so ``..._NCCL_...`` matches
    ``\\bnccl``), its help text or one of its choices, or ``name_terms`` its name."""
    return bool(terms.search(name) or terms.search(name.replace("_", " ")) or terms.search(help_text)
                or (name_terms is not None and name_terms.search(name)) or any(terms.search(str(c)) for c in choices))
