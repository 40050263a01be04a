"""CI's three lanes (scripts/dev.sh test): the fast lane and the network lane run beside the lane of tests that
need Docker, the registry, a GPU or a stack. The three marker expressions must partition the tests, so together
they run every test exactly once."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from fast_lane import deal

ROOT = Path(__file__).resolve().parents[1]
#: files with tests on more than one side of the split (fast, docker, network, registry)
SAMPLE = ["tests/test_radar.py", "tests/test_host.py", "tests/test_node_cache.py", "tests/test_readme_facts.py",
          "tests/test_images.py"]


def _lane_expressions(script: str) -> tuple[str, str, str]:
    """(fast, network, services) -m expressions of dev.sh's three lanes, the variables substituted."""
    fast = re.search(r'fast_expr="([^"]+)"', script)
    net = re.search(r'net_expr="([^"]+)"', script)
    assert fast and net, "scripts/dev.sh names no fast_expr / net_expr for its lanes"
    services = re.search(r'python -m pytest -ra --durations=25 -m "([^"]+)"\n', script)
    assert services, "scripts/dev.sh runs no services lane with a -m expression"
    expr = services.group(1).replace("$fast_expr", fast.group(1)).replace("$net_expr", net.group(1))
    return fast.group(1), net.group(1), expr


def _collected(expr: str | None, shard: str = "", start: str = "") -> set[str]:
    cmd = [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", *SAMPLE]
    if expr is not None:
        cmd += ["-m", expr]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDASTACK_LANE_SHARD")}
    if shard:
        env["CUDASTACK_LANE_SHARD"] = shard
    if start:
        env["CUDASTACK_LANE_SHARD_START"] = start
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env).stdout
    return {line for line in out.splitlines() if "::" in line}


def _check_partition(lanes: list[str]) -> tuple[list[set[str]], set[str]]:
    return [_collected(e) for e in lanes], _collected(None)


def test_the_three_lanes_run_every_test_once():
    script = (ROOT / "scripts" / "dev.sh").read_text()
    fast, net, services = _lane_expressions(script)
    # the fast lane of `dev.sh test --fast` and the background lane select the same tests
    assert f'-m "{fast}"' in script.replace('"$fast_expr"', f'"{fast}"')
    assert 'CUDASTACK_NETWORK_LANE=1' in script and '-m "$net_expr"' in script
    (a, n, b), everything = _check_partition([fast, net, services])
    assert a and n and b, (len(a), len(n), len(b))
    assert not (a & b) and not (a & n) and not (n & b), sorted((a & b) | (a & n) | (n & b))[:5]
    assert a | n | b == everything, sorted(everything - (a | n | b))[:5]
    # the network lane holds only tests that need PyPI and no other service
    assert any("test_radar.py" in t for t in n) and not any("test_build_dry_run_plans_13_2" in t for t in n)


def test_twin_a_services_lane_that_drops_network_tests_misses_some():
    script = (ROOT / "scripts" / "dev.sh").read_text()
    fast, _, _ = _lane_expressions(script)
    (a, b), everything = _check_partition([fast, "docker or registry"])   # forgets network, gpu, stack
    assert a | b != everything and any("test_radar.py" in t for t in everything - (a | b))


def test_twin_a_network_lane_that_admits_docker_tests_runs_some_twice():
    script = (ROOT / "scripts" / "dev.sh").read_text()
    fast, _, services = _lane_expressions(script)
    (_, n, b), _ = _check_partition([fast, "network", services])          # forgets "and not docker"
    assert n & b and any("test_build_dry_run_plans_13_2" in t for t in n & b)


def test_the_network_lanes_two_shards_run_each_of_its_tests_once():
    script = (ROOT / "scripts" / "dev.sh").read_text()
    _, net, _ = _lane_expressions(script)
    assert "CUDASTACK_LANE_SHARD=0/2" in script and "CUDASTACK_LANE_SHARD=1/2" in script
    start = re.search(r'net_start="([^"]+)"', script).group(1)
    assert script.count('CUDASTACK_LANE_SHARD_START="$net_start"') == 2      # both shards deal alike
    whole = _collected(net)
    # with the script's head start (this sample is small: shard 1 may get nothing), and with none (both get some)
    for given in (start, "0,0"):
        a, b = _collected(net, "0/2", given), _collected(net, "1/2", given)
        assert not (a & b) and a | b == whole, (given, len(a), len(b), len(whole))
    assert a and b, (len(a), len(b))
    files = lambda tests: {t.split("::")[0] for t in tests}     # noqa: E731
    assert not (files(a) & files(b)), files(a) & files(b)          # whole files: module fixtures stay in one process


def test_twin_a_shard_out_of_range_is_a_usage_error_not_an_empty_run():
    r = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", SAMPLE[0]], cwd=ROOT,
                       capture_output=True, text=True, timeout=300, env={**os.environ, "CUDASTACK_LANE_SHARD": "2/2"})
    assert r.returncode != 0 and "CUDASTACK_LANE_SHARD='2/2': give k/n with 0 <= k < n" in r.stdout + r.stderr


def test_files_are_dealt_largest_first_to_the_lightest_shard():
    shards = deal({"a": 10, "b": 7, "c": 4, "d": 3, "e": 1}, 2)
    assert shards == [{"a", "d"}, {"b", "c", "e"}]                 # loads 13 and 12
    assert deal({"x": 1}, 2) == [{"x"}, set()]
    # a shard that starts later carries a handicap: the other takes the largest file and more
    assert deal({"a": 10, "b": 7, "c": 4, "d": 3, "e": 1}, 2, [0, 12]) == [{"a", "b", "e"}, {"c", "d"}]  # 18, 19


def test_twin_a_start_list_of_the_wrong_length_is_a_usage_error():
    r = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", SAMPLE[0]], cwd=ROOT,
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CUDASTACK_LANE_SHARD": "0/2", "CUDASTACK_LANE_SHARD_START": "60"})
    assert r.returncode != 0 and "CUDASTACK_LANE_SHARD_START='60': give 2 comma-separated" in r.stdout + r.stderr


def test_a_pytest_started_by_a_sharded_test_does_not_inherit_the_shard(tmp_path):
    """Tests that start pytest themselves (test_suite_footprint) must run their selection whole: the plugin takes
    CUDASTACK_LANE_SHARD out of the environment once it has read it."""
    (tmp_path / "test_child.py").write_text("import os\n\ndef test_env():\n"
                                            "    assert 'CUDASTACK_LANE_SHARD' not in os.environ\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "fast_lane", "-p", "no:cacheprovider",
                        str(tmp_path / "test_child.py")], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "CUDASTACK_LANE_SHARD": "0/1", "PYTHONPATH": str(ROOT / "tests")})
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout[-1500:]
