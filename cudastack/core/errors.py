"""Typed errors of the build side, each with its own process exit code.

Every error carries one paragraph that says what is wrong and what to change. They are raised
before any expensive work starts (recipe load, plan, preflight) wherever the fault can be known then.
Exit codes (stable, documented in the README):

=====  ==========================  ==============================================================
code   class                       meaning
=====  ==========================  ==============================================================
2      UsageError                  bad command-line input (unknown CUDA version, component, flag)
3      RecipeError                 a recipe file is malformed: unknown key, missing pin, bad type
4      ArchError                   impossible arch/toolkit combination (cases C1, C2, C3)
5      EnvironmentError_           the host cannot do the work: no daemon, no BuildKit, no disk
6      BuildError                  a docker build step failed (log path and last lines attached)
7      LockError                   a lockfile is missing, stale or does not match what was resolved
8      RegistryError               a registry refused, was down, or reported another digest
9      ValidationError             the validation suite could not run (image missing, no Python)
10     UnhealthyEnvironment        ``--strict``: the environment health stage found an error (reports written)
130    BuildInterrupted            stopped from outside (Ctrl-C, SIGTERM): what was done, how to resume
=====  ==========================  ==============================================================
"""
from __future__ import annotations


class StackError(Exception):
    """Base of every error this tool raises on purpose. ``exit_code`` is the process exit status."""

    exit_code = 1

    def __init__(self, message: str):
        from cudastack.core.credentials import scrub

        super().__init__(scrub(" ".join(message.split())))    # a URL's login never reaches a message


class UsageError(StackError):
    exit_code = 2


class RecipeError(StackError):
    exit_code = 3

    @classmethod
    def at(cls, file: object, key: str, msg: str) -> "RecipeError":
        """The one-paragraph form of every recipe error: ``Recipe FILE key 'KEY': MSG`` (``Recipe FILE: MSG``
        when no key is concerned)."""
        return cls(f"Recipe {file} key '{key}': {msg}" if key else f"Recipe {file}: {msg}")


class ArchError(StackError):
    exit_code = 4


class EnvironmentError_(StackError):
    exit_code = 5


class BuildError(StackError):
    exit_code = 6
    excerpt: str = ""           # the failing step's last lines (set by cudastack.build.engine)
    log_path: str = ""
    counter: str = ""           # how far the compile got ("[41/73]"), when it counted
    interrupted: bool = False   # stopped from outside (Ctrl-C, SIGTERM), not failed


class BuildInterrupted(BuildError):
    """A build stopped from outside (Ctrl-C, SIGTERM) at any point: not a failure. Its message says what was
    built and how to resume; the record's status is "interrupted". Exit 128 + SIGINT, the shell's code for a
    command ended by Ctrl-C (bash(1), "EXIT STATUS")."""

    exit_code = 130
    interrupted = True


class LockError(StackError):
    exit_code = 7


class RegistryError(StackError):
    exit_code = 8


class ValidationError(StackError):
    exit_code = 9


class UnhealthyEnvironment(StackError):
    """``validate --strict``: a report's environment health stage found an error (the reports are written)."""

    exit_code = 10
