"""Shared helper of the recipe and plan tests (the ``recipes_copy`` fixture is in conftest.py)."""
from __future__ import annotations

from pathlib import Path

import yaml


def edit(path: Path, fn) -> None:
    """Load the YAML file at ``path``, let ``fn`` change the data in place, write it back."""
    data = yaml.safe_load(path.read_text())
    fn(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
