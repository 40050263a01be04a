"""CI's two lanes (scripts/dev.sh test): the fast lane runs beside the lane of tests that need a service. The two
marker expressions must be complements, so together they run every test exactly once."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: files with tests on both sides of the split (fast, docker, network, registry)
SAMPLE = ["tests/test_radar.py", "tests/test_host.py", "tests/test_node_cache.py", "tests/test_readme_facts.py"]


def _lane_expressions(script: str) -> tuple[str, str]:
    fast = re.search(r'fast_expr="([^"]+)"', script)
    assert fast, "scripts/dev.sh names no fast_expr for its two lanes"
    services = re.search(r'python -m pytest -ra --durations=25 -m "([^"]+)"\n', script)
    assert services, "scripts/dev.sh runs no services lane with a -m expression"
    return fast.group(1), services.group(1).replace("$fast_expr", fast.group(1))


def _collected(expr: str | None) -> set[str]:
    cmd = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *SAMPLE]
    if expr is not None:
        cmd += ["-m", expr]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300).stdout
    return {line for line in out.splitlines() if "::" in line}


def _partition(fast: str, services: str) -> tuple[set[str], set[str], set[str]]:
    return _collected(fast), _collected(services), _collected(None)


def test_the_two_lanes_run_every_test_once():
    script = (ROOT / "scripts" / "dev.sh").read_text()
    fast, services = _lane_expressions(script)
    # the fast lane of `dev.sh test --fast` and the background lane select the same tests
    assert f'-m "{fast}"' in script.replace('"$fast_expr"', f'"{fast}"')
    a, b, everything = _partition(fast, services)
    assert a and b, (len(a), len(b))
    assert not (a & b), sorted(a & b)[:5]
    assert a | b == everything, sorted(everything - (a | b))[:5]


def test_twin_a_services_lane_that_drops_network_tests_misses_some():
    script = (ROOT / "scripts" / "dev.sh").read_text()
    fast, _ = _lane_expressions(script)
    a, b, everything = _partition(fast, "docker or registry")   # forgets network, gpu, stack
    assert a | b != everything and any("test_radar.py" in t for t in everything - (a | b))
