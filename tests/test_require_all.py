"""CI mode (tests/require_all.py): a skipped test fails unless it is marked gpu or stack. Runs pytest for
real on a small test file, once with CI mode on and once with it off."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

SAMPLE = '''
import pytest

def test_missing_tool():
    pytest.skip("shellcheck is not installed")

@pytest.mark.gpu
def test_needs_gpu():
    pytest.skip("no NVIDIA GPU visible")

@pytest.mark.stack
def test_needs_stack():
    pytest.skip("no full-stack runtime image")

@pytest.fixture
def registry():
    pytest.skip("docker-registry is not installed")

def test_fixture_skips(registry):
    pass

@pytest.mark.xfail(reason="known")
def test_known_failure():
    assert False

def test_passes():
    pass
'''


def _pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    full = {k: v for k, v in os.environ.items() if k not in ("CI", "CUDASTACK_REQUIRE_ALL")}
    full.update(env, PYTHONPATH=str(TESTS))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "require_all", "-q", "-rfEs", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
                          capture_output=True, text=True, env=full, cwd=tmp_path, timeout=120)


@pytest.mark.parametrize("env", [{"CUDASTACK_REQUIRE_ALL": "1"}, {"CI": "true"}])
def test_ci_mode_turns_skips_into_failures(tmp_path, env):
    r = _pytest(tmp_path, **env)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "1 failed" in out and "1 error" in out and "2 skipped" in out and "1 xfailed" in out, out
    assert "skipped in CI mode" in out and "shellcheck is not installed" in out and "docker-registry" in out


@pytest.mark.parametrize("env", [{}, {"CI": "true", "CUDASTACK_REQUIRE_ALL": "0"}])
def test_skips_stay_skips_outside_ci(tmp_path, env):
    r = _pytest(tmp_path, **env)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "4 skipped" in out and "1 passed" in out, out


def test_ci_entry_points_turn_ci_mode_on():
    """.ci/run sets CI=true and scripts/dev.sh test sets CUDASTACK_REQUIRE_ALL (unless already set)."""
    root = TESTS.parent
    assert "export CI=true" in (root / ".ci" / "run").read_text()
    assert 'export CUDASTACK_REQUIRE_ALL="${CUDASTACK_REQUIRE_ALL:-1}"' in (root / "scripts" / "dev.sh").read_text()
