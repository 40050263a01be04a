"""The measured per-unit compile costs (``cudastack/unit_costs.yaml``): the classes a recipe's ``unit_cost`` may
name (checked when recipes load) and the figures the dry run's time estimate uses (:mod:`cudastack.plan.costs`)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

UNIT_COSTS = Path(__file__).resolve().parents[1] / "unit_costs.yaml"


@lru_cache(maxsize=1)
def unit_costs() -> dict:
    """The measured per-unit costs (``unit_costs.yaml``): {"measured", "host", "toolchain", "classes":
    {name: {"cu_seconds_per_arch", "cpp_seconds", "what"}}}."""
    return yaml.safe_load(UNIT_COSTS.read_text())
