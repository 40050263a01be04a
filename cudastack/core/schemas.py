"""Typed file models: the base class, pydantic errors as one readable line each, and the JSON Schemas.

Recipes, toolchains and lockfiles are described by pydantic v2 models (one model per section, see
:mod:`cudastack.recipes.models`); every model derives from :class:`Section`, which forbids unknown keys.
:func:`explain` turns a :class:`pydantic.ValidationError` into ``key 'a."13.1".b': what is wrong and what to
write instead``: key paths in the files' own terms, the allowed keys for an unknown key, never pydantic's
multi-line text. Callers wrap it in their own error (RecipeError, LockError) with the file's name.

The JSON Schemas of the models are committed next to the data (:data:`SCHEMAS`); CI compares them with
the models. Regenerate after changing a model::

    python -m cudastack.core.schemas --write      # regenerate every committed schema
    python -m cudastack.core.schemas --check      # exit 1 and name each stale file
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from cudastack.core.paths import PROJECT_ROOT

ROOT = PROJECT_ROOT

#: committed schema file (relative to the repository root) -> "module:Model" it is generated from
SCHEMAS = {
    "recipes/schema/toolchains.schema.json": "cudastack.recipes.models:ToolchainsFile",
    "recipes/schema/component.schema.json": "cudastack.recipes.models:ComponentFile",
    "lockfiles/schema/lock.schema.json": "cudastack.lock.model:LockFile",
}

_PATTERN_HELP: dict[str, str] = {}


def checked_pattern(regex: str, help: str, **field: Any) -> Any:
    """A ``Field(pattern=regex)`` whose mismatch reads ``'<value>' <help>`` in :func:`explain`."""
    _PATTERN_HELP[regex] = help
    return Field(pattern=regex, **field)


class Section(BaseModel):
    """Base of every file model: unknown keys are errors, YAML numbers are accepted where a string is
    expected (``version: 13.1``), and a key left empty in YAML (``knobs:``) counts as an empty mapping or
    list where the field is one."""

    model_config = ConfigDict(extra="forbid", coerce_numbers_to_str=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_is_empty(cls, data: Any) -> Any:
        if data is None:
            return {}
        if isinstance(data, dict) and None in data.values():
            by_key = {f.alias or n: f for n, f in cls.model_fields.items()}
            data = {k: (get_origin(by_key[k].annotation)() if v is None and k in by_key
                        and get_origin(by_key[k].annotation) in (dict, list) else v) for k, v in data.items()}
        return data


# ----------------------------------------------------------------------------------------- errors
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def key_path(loc: tuple) -> str:
    """``("toolchains", "13.1", "patches", 0, "file")`` -> ``toolchains."13.1".patches[0].file``."""
    out = ""
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = str(part) if _PLAIN_KEY.match(str(part)) else json.dumps(str(part))
            out += f".{text}" if out else text
    return out


def _unwrap(t: Any) -> Any:
    while True:
        if get_origin(t) is Annotated:
            t = get_args(t)[0]
        elif get_origin(t) in (Union, types.UnionType):
            members = [a for a in get_args(t) if a is not type(None)]
            if len(members) != 1:
                return t
            t = members[0]
        else:
            return t


def _model_at(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The model class that validates the mapping at ``loc`` (None when the path leaves the models)."""
    t: Any = root
    for part in loc:
        t = _unwrap(t)
        if isinstance(t, type) and issubclass(t, BaseModel):
            field = next((f for n, f in t.model_fields.items() if (f.alias or n) == part), None)
            if field is None:
                return None
            t = field.annotation
        elif get_origin(t) is dict:
            t = get_args(t)[1]
        elif get_origin(t) in (list, tuple):
            t = get_args(t)[0]
        else:
            return None
    t = _unwrap(t)
    return t if isinstance(t, type) and issubclass(t, BaseModel) else None


def _type_name(value: Any) -> str:
    if isinstance(value, (bool, int, float)) or (isinstance(value, str) and len(value) <= 40):
        return repr(value)
    return {dict: "a mapping", list: "a list", str: "a string", type(None): "nothing (an empty value)"}.get(
        type(value), type(value).__name__)


def _message(err: dict, root: type[BaseModel]) -> str:
    kind, value, ctx = err["type"], err.get("input"), err.get("ctx") or {}
    if kind == "extra_forbidden":
        model = _model_at(root, err["loc"][:-1])
        allowed = sorted(f.alias or n for n, f in model.model_fields.items()) if model else []
        close = difflib.get_close_matches(str(err["loc"][-1]), allowed, n=1)
        hint = f"Did you mean '{close[0]}'?" if close else "Check the spelling."
        return f"unknown key (allowed here: {', '.join(allowed)}). {hint}"
    if kind == "missing":
        return "required key is missing."
    if kind == "string_type" and isinstance(value, bool):
        return f"YAML read {value!r} as a boolean: quote the value (\"{str(value).upper()}\")."
    expected = {"string_type": "a string", "dict_type": "a mapping", "model_type": "a mapping",
                "list_type": "a list", "tuple_type": "a list", "bool_type": "true or false",
                "float_type": "a number", "int_type": "a whole number", "int_from_float": "a whole number"}
    if kind in expected:
        return f"expected {expected[kind]}, got {_type_name(value)}."
    if kind == "string_pattern_mismatch":
        help = _PATTERN_HELP.get(ctx.get("pattern", ""), f"does not match the pattern {ctx.get('pattern')}")
        return f"'{value}' {help}."
    if kind == "literal_error":
        shown = f"'{value}'" if isinstance(value, str) else _type_name(value)
        return f"{shown} is not allowed here (expected {ctx.get('expected')})."
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": "> ", "greater_than_equal": ">= ", "less_than": "< ", "less_than_equal": "<= "}[kind]
        bound = next(iter(ctx.values()), "")
        return f"{value!r} is out of range: expected a number {op}{bound}."
    if kind == "too_short":
        return f"expected a non-empty {'mapping' if isinstance(value, dict) else 'list'}."
    if kind == "value_error" and "error" in ctx:
        return str(ctx["error"]).rstrip(".") + "."
    return err["msg"].rstrip(".") + "."


def explain(exc: ValidationError, root: type[BaseModel], *, more: int = 2) -> str:
    """One line for ``exc`` (raised validating ``root``): ``key 'K': what is wrong.`` for the first error
    (an unknown key first: a misspelt key also makes its correct spelling "missing"), then up to ``more``
    further errors as ``Also key 'K2': ...``."""
    errors = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")
    parts = [f"key '{key_path(e['loc'])}': {_message(e, root)}" for e in errors]
    text = parts[0] + "".join(f" Also {p}" for p in parts[1:1 + more])
    if len(parts) > 1 + more:
        text += f" ({len(parts) - 1 - more} more.)"
    return text


# ------------------------------------------------------------------------------------ JSON Schema
def _load_model(ref: str) -> type[BaseModel]:
    module, name = ref.split(":")
    return getattr(__import__(module, fromlist=[name]), name)


def render(ref: str) -> str:
    """The JSON Schema text (draft 2020-12, with a trailing newline) of the model ``module:Model``."""
    model = _load_model(ref)
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **model.model_json_schema()}
    return json.dumps(schema, indent=2) + "\n"


def _same(path: Path, text: str) -> bool:
    try:
        return json.loads(path.read_text()) == json.loads(text)    # key order and layout do not count
    except (OSError, ValueError):
        return False


def stale(root: Path | None = None) -> list[str]:
    """The committed schema files under ``root`` (default: this checkout) that are missing or say something
    else than what the models generate (compared as JSON data)."""
    root = root or ROOT
    return [rel for rel, ref in SCHEMAS.items() if not _same(root / rel, render(ref))]


def write(root: Path | None = None) -> list[str]:
    """Regenerate every file of :data:`SCHEMAS` under ``root`` (default: this checkout); returns the ones
    that changed."""
    root = root or ROOT
    changed = stale(root)
    for rel in changed:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(render(SCHEMAS[rel]))
    return changed


def main(argv: typing.Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cudastack.core.schemas", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="regenerate the committed schema files")
    ap.add_argument("--check", action="store_true", help="exit 1 when a committed schema file is stale")
    args = ap.parse_args(argv)
    if args.write:
        for rel in write():
            print(f"wrote {rel}")
        return 0
    bad = stale()
    for rel in bad:
        print(f"{rel} is stale: regenerate it with `python -m cudastack.core.schemas --write`", file=sys.stderr)
    if not bad:
        print(f"{len(SCHEMAS)} committed schema files are up to date: {', '.join(SCHEMAS)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
