"""`invoke build`'s options are declared once, as cudastack.jobs.build.BuildOptions: the task keeps its explicit
parameters (invoke reads its flags from them) and hands their values over as one frozen BuildOptions."""
from __future__ import annotations

import dataclasses
import inspect

import pytest
from invoke import Context
from invoke.exceptions import Exit

from cudastack.cli import build as cli
from cudastack.jobs.build import BuildOptions


def option_mismatch(fn, options=BuildOptions) -> list[str]:
    """One line per parameter of the task function ``fn`` (less its context ``c``; ``json`` is the field
    ``json_out``) that ``options`` lacks or defaults otherwise, and per field no parameter gives."""
    params = {("json_out" if n == "json" else n): p.default
              for n, p in inspect.signature(fn).parameters.items() if n != "c"}
    fields = {f.name: f.default for f in dataclasses.fields(options)}
    out = [f"{n}: a flag of the task, not a field" for n in params if n not in fields]
    out += [f"{n}: a field no flag gives" for n in fields if n not in params]
    out += [f"{n}: default {params[n]!r} in the task, {fields[n]!r} in BuildOptions"
            for n in params if n in fields and params[n] != fields[n]]
    return out


def test_the_task_and_build_options_name_the_same_options_with_the_same_defaults():
    assert option_mismatch(cli.build.body) == []


def test_a_flag_missing_from_build_options_is_found():
    """The failing twin: a task with one more flag, and one with another default, are reported."""
    def task(c, cuda="13.1", newflag=None, json=None):
        return None

    @dataclasses.dataclass(frozen=True)
    class Opts:
        cuda: str = "12.8"
        json_out: str | None = None

    assert option_mismatch(task, Opts) == ["newflag: a flag of the task, not a field",
                                           "cuda: default '13.1' in the task, '12.8' in BuildOptions"]


def test_build_options_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        BuildOptions().cuda = "12.8"   # type: ignore[misc]


def test_the_task_hands_its_flags_to_the_job(monkeypatch):
    """Through the real task (no Docker needed: each refusal comes before any engine is asked): --only with --skip,
    and --cache-read-only without a node cache, reach the job and are refused there with exit 2."""
    monkeypatch.delenv("CUDASTACK_NODE_CACHE", raising=False)
    with pytest.raises(Exit) as exc:
        cli.build(Context(), only=["runtime"], skip=["cuda-ext"], dry_run=True)
    assert exc.value.code == 2 and "--only and --skip together" in str(exc.value.message)
    with pytest.raises(Exit) as exc:
        cli.build(Context(), cache_read_only=True, dry_run=True)
    assert exc.value.code == 2 and "--cache-read-only and --cache-optional need a node cache" in str(exc.value.message)
