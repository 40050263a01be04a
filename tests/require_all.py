"""pytest plugin: in CI every prerequisite that scripts/dev.sh installs must be there, so a skipped test is a
failure there. Only tests marked ``gpu`` (no GPU on a CI machine) and ``stack`` (they read the full-stack
images ``invoke build`` makes, hours of compiling that CI does not do) may skip.

CI mode is on when ``CUDASTACK_REQUIRE_ALL=1`` (``scripts/dev.sh test`` sets it unless it is already set) or
``CI=true`` (``.ci/run`` sets it; most CI services set it too). ``CUDASTACK_REQUIRE_ALL=0`` turns it off.
"""
from __future__ import annotations

import os

import pytest

MAY_SKIP = ("gpu", "stack")


def require_all() -> bool:
    """True when skips of tests not marked gpu/stack must fail (see the module docstring)."""
    flag = os.environ.get("CUDASTACK_REQUIRE_ALL", "").strip().lower()
    if flag in ("0", "false", "no"):
        return False
    if flag in ("1", "true", "yes"):
        return True
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not rep.skipped or hasattr(rep, "wasxfail") or not require_all():
        return
    if any(item.get_closest_marker(m) for m in MAY_SKIP):
        return
    reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
    rep.outcome = "failed"
    rep.longrepr = (f"skipped in CI mode (CUDASTACK_REQUIRE_ALL / CI): {reason}\n"
                    "A prerequisite that scripts/dev.sh installs is missing; only tests marked "
                    f"{' or '.join(MAY_SKIP)} may skip. Run `bash scripts/dev.sh test` as root to install it, "
                    "or set CUDASTACK_REQUIRE_ALL=0 to allow skips.")
