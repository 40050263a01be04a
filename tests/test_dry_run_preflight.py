"""The dry run checks what the real run would refuse (issue: "About 41 GiB of disk needed", exit 0, and the real
build 30 s later refused for disk): the engine, the disk where the images and the state go, the builder. A
refusal comes out of `invoke build --dry-run` with the same message and exit code as out of `invoke build`.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INVOKE = [sys.executable, "-m", "invoke", "-r", str(ROOT)]


def _invoke(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "CUDASTACK_NO_DISK_CHECK"}   # the disk check is under test
    return subprocess.run([*INVOKE, *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**base, **(env or {})})


def _error_line(text: str) -> str:
    """The ``error: `` line, with the free space of a disk other than the state folder's masked: the Docker
    engine's data root (checked first, and refused first on a machine with less free than a full build needs) is
    on a disk shared with the test lanes that run beside this one (downloads, builds), so its figure may move by a
    tenth of a GiB between the dry run and the real run; the state folder's 64 MiB tmpfs does not."""
    line = next(ln for ln in text.splitlines() if ln.startswith("error: "))
    return re.sub(r"(\S+) has \d+(?:\.\d+)? GiB free",
                  lambda m: m.group(0) if "/small/" in m.group(1) else f"{m.group(1)} has <n> GiB free", line)


@pytest.fixture
def small_state(tmp_path):
    """A 64 MiB tmpfs as the state folder (root only)."""
    where = tmp_path / "small"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield where
    subprocess.run(["umount", str(where)], check=False)


@pytest.mark.docker
def test_dry_run_on_a_too_small_state_folder_refuses_as_the_build_does(small_state):
    dry = _invoke("build", "--cuda", "13.1", "--dry-run", "--state-dir", str(small_state / "state"))
    assert dry.returncode == 5, dry.stdout[-2000:] + dry.stderr[-2000:]
    assert "REFUSED (exit 5)" in dry.stdout and f"{small_state / 'state'} has 0.1 GiB free" in dry.stdout, dry.stdout[-1500:]
    assert "The build would stop there, before any work, with exit 5" in dry.stderr
    real = _invoke("build", "--cuda", "13.1", "--state-dir", str(small_state / "state"))
    assert real.returncode == 5, real.stderr[-2000:]
    assert _error_line(dry.stderr) == _error_line(real.stderr)
    assert "Too little free disk" in _error_line(real.stderr)
    assert not (small_state / "state" / "records").exists(), "the refusal left a journal"


@pytest.mark.docker
def test_dry_run_with_room_passes_its_checks_and_exits_0(tmp_path):
    """The failing twin's other side: enough disk (this machine's, for the fixture chain's 5 GiB), an engine that
    answers: exit 0."""
    dry = _invoke("build", "--cuda", "13.1", "--dry-run", "--state-dir", str(tmp_path / "state"), "--recipes",
                  str(ROOT / "tests" / "fixtures" / "recipes"))
    assert dry.returncode == 0, dry.stdout[-1500:] + dry.stderr[-1500:]
    assert "Before its first node the build checks:" in dry.stdout
    assert "Docker engine and BuildKit: ok" in dry.stdout and ": enough" in dry.stdout


def test_dry_run_without_an_engine_refuses_as_the_build_does(tmp_path):
    """No Docker engine answers (DOCKER_HOST at a socket nobody serves): the dry run exits 5 with the build's
    message instead of printing the plan and exit 0."""
    env = {"DOCKER_HOST": f"unix://{tmp_path}/no-docker.sock", "DOCKER_CONTEXT": ""}
    dry = _invoke("build", "--cuda", "13.1", "--dry-run", "--state-dir", str(tmp_path / "s"), env=env)
    real = _invoke("build", "--cuda", "13.1", "--state-dir", str(tmp_path / "s"), env=env)
    assert dry.returncode == real.returncode == 5, (dry.stderr[-1500:], real.stderr[-1500:])
    assert "Docker engine and BuildKit: REFUSED (exit 5)" in dry.stdout
    assert _error_line(dry.stderr) == _error_line(real.stderr)
    # `invoke plan` stays a plan: it prints the same plan and exits 0 without an engine
    plan = _invoke("plan", "--cuda", "13.1", "--state-dir", str(tmp_path / "s"), env=env)
    assert plan.returncode == 0, plan.stderr[-1500:]
