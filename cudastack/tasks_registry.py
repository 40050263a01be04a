"""Invoke tasks (registry). Thin: parse flags, call the package, map StackError to its exit code."""
from invoke import task  # noqa: F401

TASKS: list = []
