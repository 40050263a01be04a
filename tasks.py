"""Invoke entry point: a thin layer that only parses flags and calls the package.

`invoke --list` shows every task; `invoke --help TASK` shows its flags. The tasks live in
cudastack.cli.build (build, plan, bootstrap-base), cudastack.cli.validate (validate) and
cudastack.cli.registry (lock, push, pull, cluster-job, bake) and cudastack.cli.radar (outdated, scan).
"""
from invoke import Collection

from cudastack.cli import build as tasks_build
from cudastack.cli import radar as tasks_radar
from cudastack.cli import registry as tasks_registry
from cudastack.cli import validate as tasks_validate

ns = Collection()
for module in (tasks_build, tasks_validate, tasks_registry, tasks_radar):
    for t in module.TASKS:
        ns.add_task(t)
