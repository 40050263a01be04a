"""Fixtures shared by several test files."""
from __future__ import annotations

import os
import shutil

import pytest

from cudastack.recipes.load import DEFAULT_RECIPES_DIR

# The suite's dry runs and builds plan real stacks (41 GiB for 13.1) for the machine a user builds on, not for this
# one: their exit codes must not depend on the free disk here. The tests of the disk check itself remove it
# (tests/test_dry_run_preflight.py, tests/test_build_stops.py).
os.environ.setdefault("CUDASTACK_NO_DISK_CHECK", "1")

# In CI a skip is a failure, apart from GPU and full-stack tests (tests/require_all.py).
pytest_plugins = ["require_all", "validate_fixtures", "fast_lane"]   # validate_fixtures: the real SGLang / FlashInfer
# wheels; fast_lane: `scripts/dev.sh test --fast` makes Docker and the network unreachable (tests/fast_lane.py)


@pytest.fixture
def recipes_copy(tmp_path):
    """A writable copy of the real recipes folder."""
    dst = tmp_path / "recipes"
    shutil.copytree(DEFAULT_RECIPES_DIR, dst)
    return dst


@pytest.fixture
def engine():
    """A cudastack Engine on the live Docker daemon (skip when there is none; a file that needs another scope
    defines its own)."""
    pytest.importorskip("docker")
    from cudastack.build.engine import Engine
    from cudastack.core.errors import EnvironmentError_

    try:
        return Engine.connect()
    except EnvironmentError_ as exc:
        pytest.skip(str(exc))


@pytest.fixture
def docker_engine_scratch():
    """``(client, made)``: a docker SDK client to a live engine (skip when none answers) and a list the test
    appends image references to; every reference in it is removed afterwards."""
    pytest.importorskip("docker")
    from cudastack.core.docker_engine import docker_client

    try:
        c = docker_client()
        c.ping()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"no Docker engine: {exc}")
    made: list[str] = []
    yield c, made
    for ref in made:
        try:
            c.images.remove(ref, force=True)
        except Exception:  # noqa: BLE001
            pass
