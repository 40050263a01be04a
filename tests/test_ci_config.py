"""What CI relies on beyond the tests themselves: a hung test fails (pytest-timeout, configured in
pyproject.toml), and the declared dependencies match what the code imports."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_a_hung_test_fails_under_the_project_config(tmp_path):
    """A test that sleeps past the limit fails with pytest-timeout's message, run with the project's own
    pytest config (the limit lowered to 2 s with -o so the test is quick)."""
    (tmp_path / "test_hang.py").write_text("import time\n\ndef test_hangs():\n    time.sleep(60)\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ROOT / "pyproject.toml"),
                        "--rootdir", str(tmp_path), "-o", "timeout=2", str(tmp_path / "test_hang.py")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Timeout" in r.stdout and "1 failed" in r.stdout, r.stdout
    assert PYPROJECT["tool"]["pytest"]["ini_options"]["timeout"] >= 3000     # above the longest limit a test sets


def test_declared_dependencies_match_the_code():
    proj = PYPROJECT["project"]
    assert proj["requires-python"].startswith(">=3.11")          # tomllib is imported unconditionally
    deps = " ".join(proj["dependencies"])
    assert "uv>=" in deps                                          # `invoke lock`'s default resolver
    extras = proj["optional-dependencies"]
    assert any(d.startswith("kubernetes-validate") for d in extras["kubernetes"])
    assert {"ruff", "mypy"} <= {d.split(">")[0].split("=")[0] for d in extras["dev"]}


def test_the_mypy_baseline_fails_on_a_planted_new_error_and_passes_a_known_one(tmp_path):
    """scripts/mypy_baseline.py with real mypy on a small module: a baseline written from one error passes
    it (at another line too), a second planted error fails naming it, and a fixed one is reported."""
    script = [sys.executable, str(ROOT / "scripts" / "mypy_baseline.py"), "--cwd", str(tmp_path),
              "--baseline", str(tmp_path / "baseline.txt"), "--cache-dir", str(tmp_path / ".cache"), "mod.py"]
    mod = tmp_path / "mod.py"
    mod.write_text("def f(x: int) -> int:\n    return x\n\n\nf('a')\n")
    run = lambda: subprocess.run(script, capture_output=True, text=True, timeout=300)  # noqa: E731
    assert subprocess.run(script + ["--update"], capture_output=True, text=True, timeout=300).returncode == 0
    assert "[arg-type]" in (tmp_path / "baseline.txt").read_text()
    mod.write_text("\n\n" + mod.read_text())                     # the known error moves down: still known
    r = run()
    assert r.returncode == 0, r.stdout + r.stderr
    mod.write_text(mod.read_text() + "y: str = 1\n")              # planted
    r = run()
    assert r.returncode == 1 and "NEW: mod.py: [assignment]" in r.stdout, r.stdout + r.stderr
    mod.write_text("def f(x: int) -> int:\n    return x\n")         # both gone
    r = run()
    assert r.returncode == 0 and "fixed: mod.py: [arg-type]" in r.stdout, r.stdout
