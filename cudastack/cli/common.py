"""The command line's conventions, in one place for every task: :func:`stack_task` is ``invoke.task`` plus

- one mapping of a :class:`~cudastack.core.errors.StackError` to its exit code (``error: <message>`` on stderr,
  the code from the README's exit-code table), for every task; a run stopped from outside (Ctrl-C, SIGTERM) is
  ``interrupted: <what was done, how to resume>`` with exit 130 (:data:`cudastack.core.stop.EXIT_INTERRUPTED`),
  never an error;
- whole-number and choice flags checked while the command line is parsed: ``--world-size x`` or ``--topology
  ring`` is a one-line usage error with exit 2 (as argparse, pip and uv answer a bad option), before any work;
- each flag's default shown in ``--help`` (``(default: 13.1)``) unless its help text already gives it;
- default output folders and files (``.stack/``, ``bake/docker-bake.json``) under the project root
  (:data:`cudastack.core.paths.PROJECT_ROOT`) from any working directory; a path the user gives is read as
  given (relative to the working directory).
"""
from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import Callable, Iterable

from invoke import Exit, Task, task
from invoke.parser import Argument

from cudastack.core.errors import StackError, UsageError
from cudastack.core.paths import PROJECT_ROOT

#: The exit code of a usage error found while parsing (the same as :class:`UsageError`'s).
USAGE_EXIT = UsageError.exit_code


class _CheckedArgument(Argument):
    """An invoke Argument whose value is checked when it is parsed: a whole number for an ``int`` flag, one of
    ``choices`` for a choice flag. A bad value raises ``Exit(code=2)``, which invoke prints as one line."""

    choices: tuple[str, ...] = ()

    def set_value(self, value, cast: bool = True) -> None:
        flag = f"--{(self.name or '').replace('_', '-')}"
        try:
            super().set_value(value, cast=cast)
        except ValueError:
            raise Exit(f"error: {flag} {value!r}: give a whole number.", code=USAGE_EXIT) from None
        if self.choices and self._value not in self.choices:
            raise Exit(f"error: {flag} {value!r}: use one of {', '.join(self.choices)}.", code=USAGE_EXIT)


class StackTask(Task):
    """A Task whose int and choice flags are :class:`_CheckedArgument` (see :func:`stack_task`)."""

    choices: dict[str, tuple[str, ...]] = {}
    ints: frozenset[str] = frozenset()

    def get_arguments(self, ignore_unknown_help=None):
        args = super().get_arguments(ignore_unknown_help=ignore_unknown_help)
        for arg in args:
            if arg.name in self.ints:      # a whole-number flag whose default is None ("not given")
                arg.kind = int
            if arg.kind is int or arg.name in self.choices:
                arg.__class__ = _CheckedArgument
                arg.choices = tuple(self.choices.get(arg.name, ()))
        return args


def _with_defaults(fn: Callable, help: dict[str, str], choices: dict[str, tuple[str, ...]],
                   root_defaults: Iterable[str] = ()) -> dict[str, str]:
    """``help`` with each flag's default (and a choice flag's choices) appended where the text does not give
    them already; flags without help text get one naming the default."""
    out = dict(help)
    for name, p in list(inspect.signature(fn).parameters.items())[1:]:
        text = out.get(name, "")
        if name in choices and not all(c in text for c in choices[name]):
            text = f"{text} One of: {', '.join(choices[name])}.".strip()
        default = p.default
        if default not in (None, False, "", inspect.Parameter.empty) and "default" not in text.lower():
            where = " under the project root" if name in root_defaults else ""
            text = f"{text} (default: {default}{where})".strip()
        if text:
            out[name] = text
    return out


def stack_task(*, help: dict[str, str] | None = None, choices: dict[str, Iterable[str]] | None = None,
               ints: Iterable[str] = (), root_defaults: Iterable[str] = (), **kwargs) -> Callable[[Callable], Task]:
    """``@stack_task(help=..., choices={"topology": ("pcie", "nvlink")}, ints=["gpus"], iterable=[...])``: an
    invoke task with the conventions of this module. ``choices``: {parameter name: allowed values} (a default
    other than None must be among them); ``ints``: parameters whose default is None that take a whole number
    (a parameter with an int default is one already); ``root_defaults``: path parameters whose relative default
    is read under the project root when the flag is not given. A StackError raised by the task becomes
    ``Exit("error: ...", code=exc.exit_code)``. ValueError at import when a choice's default is not allowed."""
    allowed = {k: tuple(v) for k, v in (choices or {}).items()}

    def wrap(fn: Callable) -> Task:
        params = inspect.signature(fn).parameters
        for name, values in allowed.items():
            if name not in params or params[name].default not in (None, *values):
                raise ValueError(f"{fn.__name__}: choice flag {name!r} is not a parameter, or its default is not "
                                 f"one of {values}")

        rooted = {name: params[name].default for name in root_defaults}

        @functools.wraps(fn)
        def run(c, *args, **kw):
            for name, default in rooted.items():
                if kw.get(name) == default and not Path(default).is_absolute():
                    kw[name] = str(PROJECT_ROOT / default)
            try:
                return fn(c, *args, **kw)
            except StackError as exc:
                label = "interrupted" if getattr(exc, "interrupted", False) else "error"
                raise Exit(f"{label}: {exc}", code=exc.exit_code) from None
            except KeyboardInterrupt:      # stopped before the task's own account of it could start
                from cudastack.core.stop import EXIT_INTERRUPTED, requested
                raise Exit(f"interrupted: {fn.__name__.replace('_', '-')} was stopped ({requested() or 'SIGINT'}) "
                           "before it finished; every file it writes is replaced whole, so none is half-written. "
                           "Run the same command again.", code=EXIT_INTERRUPTED) from None

        klass = type(f"{fn.__name__}_task", (StackTask,), {"choices": allowed, "ints": frozenset(ints)})
        return task(klass=klass, help=_with_defaults(fn, help or {}, allowed, tuple(root_defaults)), **kwargs)(run)

    return wrap
