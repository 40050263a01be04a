"""scripts/same_outputs.py, the check that a move changes no plan, bake file or cluster job: identical on two
copies of the project, different (exit 1, a diff naming the changed node) when one copy's Dockerfile changes,
and a command that fails in both copies is a difference, never a pass."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _copy(dst: Path) -> Path:
    dst.mkdir()
    for d in ("cudastack", "validate", "recipes", "images", "lockfiles"):
        shutil.copytree(ROOT / d, dst / d, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copy2(ROOT / "tasks.py", dst / "tasks.py")
    return dst


def _run(a: Path, b: Path, work: Path, *only: str) -> subprocess.CompletedProcess:
    args = [x for name in only for x in ("--only", name)]
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "same_outputs.py"), str(a), str(b),
                           "--work", str(work), *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    base = tmp_path_factory.mktemp("trees")
    return _copy(base / "a"), _copy(base / "b")


def test_two_copies_are_identical_then_a_changed_dockerfile_is_found(trees, tmp_path):
    a, b = trees
    same = _run(a, b, tmp_path / "w1", "plan-13.1", "cluster-slurm")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "IDENTICAL" in same.stdout and "2 commands, 5 outputs per tree" in same.stdout
    runtime = b / "images" / "runtime.Dockerfile"
    runtime.write_text(runtime.read_text() + "\n# a planted change: the runtime node's hash moves\n")
    diff = _run(a, b, tmp_path / "w2", "plan-13.1")
    assert diff.returncode == 1, diff.stdout + diff.stderr
    assert "DIFFERENT: 1 output(s) differ" in diff.stdout and "+++ new plan-13.1: stdout" in diff.stdout
    assert "runtime" in "".join(ln for ln in diff.stdout.splitlines(True) if ln.startswith("+"))


def test_a_command_failing_in_both_trees_is_not_a_pass(trees, tmp_path):
    a, _ = trees
    broken = tmp_path / "broken"
    shutil.copytree(a, broken)
    (broken / "recipes" / "toolchains.yaml").write_text("toolchains: {13.1: {unknown_key: 1}}\n")
    proc = _run(broken, broken, tmp_path / "w", "plan-13.1")
    assert proc.returncode == 1
    assert "plan-13.1 exited 3 in the old tree" in proc.stdout and "plan-13.1 exited 3 in the new tree" in proc.stdout


def test_not_a_checkout_is_a_usage_error(tmp_path):
    proc = _run(tmp_path, tmp_path, tmp_path / "w")
    assert proc.returncode == 2 and "is not a checkout of this project" in proc.stderr
