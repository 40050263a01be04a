"""Invoke entry point: a thin layer that only parses flags and calls the package.

`invoke --list` shows every task; `invoke --help TASK` shows its flags. The tasks live in
cudastack.tasks_build (build, plan, bootstrap-base), cudastack.tasks_validate (validate) and
cudastack.tasks_registry (lock, push, pull, cluster-job, bake) and cudastack.tasks_radar (outdated, scan).
"""
from invoke import Collection

from cudastack import tasks_build, tasks_radar, tasks_registry, tasks_validate

ns = Collection()
for module in (tasks_build, tasks_validate, tasks_registry, tasks_radar):
    for t in module.TASKS:
        ns.add_task(t)
