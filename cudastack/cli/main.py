"""The task collection and the ``cudastack`` console script.

``invoke TASK`` (through the project's ``tasks.py``) and ``cudastack TASK`` run the same tasks with the same
flags; ``cudastack --version`` prints the installed distribution's version (``importlib.metadata``)."""
from __future__ import annotations

from importlib import metadata

from invoke import Collection, Program

from cudastack.cli import build, radar, registry, validate


def namespace() -> Collection:
    """Every task of :mod:`cudastack.cli` in one invoke Collection (build, plan, bootstrap-base, validate, lock,
    push, pull, cluster-job, bake, outdated, scan)."""
    ns = Collection()
    for module in (build, validate, registry, radar):
        for t in module.TASKS:
            ns.add_task(t)
    return ns


def version() -> str:
    """The installed ``cudastack`` distribution's version, or ``unknown`` when it is not installed (a bare
    checkout on PYTHONPATH)."""
    try:
        return metadata.version("cudastack")
    except metadata.PackageNotFoundError:
        return "unknown"


def main() -> None:
    """``cudastack [--version] [--list] TASK [flags]``: invoke's Program over :func:`namespace`."""
    Program(namespace=namespace(), version=version(), name="cudastack", binary="cudastack").run()
