"""One target-arch rule for every task (issue: `invoke validate --arch 13.0` exited 2, `invoke outdated --arch 13.0`
started downloading, `invoke scan --arch 13.0` exited 0 with a report for "target 13.0"; build and validate
accepted different lists). Every task that takes `--arch` refuses a misspelt arch and a compute capability the
arch table does not know with exit 4 (the README's code), before any download: here no index, registry or
Docker engine is reachable, and the refusal must come anyway, with nothing fetched into a fresh cache.
`python -m stackprobe` spells the flag `--arch` too (the old `--target-arch` still works, with a note), and
its list of compute capabilities is the build's arch table.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
INVOKE = [sys.executable, "-m", "invoke", "-r", str(ROOT)]

#: every task that takes --arch, with the other flags it needs to get as far as its arch check
TASKS = {
    "build": ["build", "--cuda", "13.1"],
    "build --dry-run": ["build", "--cuda", "13.1", "--dry-run"],
    "plan": ["plan", "--cuda", "13.1"],
    "lock": ["lock", "--cuda", "13.1"],
    "push": ["push", "--cuda", "13.1", "--registry", "127.0.0.1:9/nowhere"],
    "bake": ["bake", "--cuda", "13.1"],
    "validate": ["validate"],
    "outdated": ["outdated", "--cuda", "13.1"],
    "scan": ["scan", "--package", "flashinfer-python"],
}
BAD = {"13.0": "not a known compute capability", "12.O": "--arch '12.O'"}


def _offline(tmp: Path) -> dict:
    """Nothing reachable: a dead proxy for every HTTP client, no Docker engine, fresh caches."""
    dead = "http://127.0.0.1:9"
    return {**os.environ, "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "http_proxy": dead, "https_proxy": dead,
            "NO_PROXY": "", "no_proxy": "", "DOCKER_HOST": f"unix://{tmp}/no-docker.sock",
            "CUDASTACK_CACHE": str(tmp / "cache"), "XDG_CACHE_HOME": str(tmp / "xdg"), "UV_CACHE_DIR": str(tmp / "uv")}


@pytest.mark.parametrize("spec", sorted(BAD))
@pytest.mark.parametrize("task", sorted(TASKS))
def test_a_bad_arch_exits_4_on_every_task_before_any_download(task, spec, tmp_path):
    args = TASKS[task] + ["--arch", spec]
    if task in ("bake",):
        args += ["--output", str(tmp_path / "bake.json")]
    if task in ("validate", "outdated"):
        args += ["--out", str(tmp_path / "out")]
    if task in ("build", "build --dry-run", "plan", "bake"):
        args += ["--state-dir", str(tmp_path / "state")]
    if task == "lock":
        args += ["--lockfiles", str(tmp_path / "locks")]
    r = subprocess.run([*INVOKE, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, env=_offline(tmp_path))
    assert r.returncode == 4, f"{task} --arch {spec}: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
    assert BAD[spec] in r.stderr, r.stderr[-1500:]
    fetched = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".whl", ".gz", ".json", ".md")]
    assert not fetched, f"{task} wrote or fetched before refusing: {fetched}"


@pytest.mark.parametrize("task", ["validate", "scan"])
def test_a_known_arch_gets_past_the_check(task, tmp_path):
    """The failing twin: 9.0 is in the table, so these tasks go on to their work (which then needs the index
    or an environment: any exit but 4)."""
    args = TASKS[task] + ["--arch", "9.0"] + (["--out", str(tmp_path / "out")] if task == "validate" else [])
    r = subprocess.run([*INVOKE, *args], cwd=ROOT, capture_output=True, text=True, timeout=600, env=_offline(tmp_path))
    assert r.returncode != 4, r.stderr[-1500:]


def test_stackprobe_knows_the_build_s_arch_table():
    from stackprobe.static import KNOWN_COMPUTE_CAPABILITIES

    table = yaml.safe_load((ROOT / "recipes" / "toolchains.yaml").read_text())["archs"]
    assert list(KNOWN_COMPUTE_CAPABILITIES) == list(table)


def test_stackprobe_spells_it_arch_and_still_takes_the_old_spelling_with_a_note():
    from stackprobe.__main__ import build_parser

    assert build_parser().parse_args(["--arch", "9.0"]).target_arch == "9.0"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "validate")}
    new = subprocess.run([sys.executable, "-m", "stackprobe", "--arch", "12.O"], capture_output=True, text=True,
                         env=env, timeout=120)
    old = subprocess.run([sys.executable, "-m", "stackprobe", "--target-arch", "12.O"], capture_output=True,
                         text=True, env=env, timeout=120)
    assert new.returncode == old.returncode == 2, (new.stderr, old.stderr)
    assert "note: --target-arch is the old spelling of --arch" in old.stderr
    assert "old spelling" not in new.stderr
    assert "--arch CC" in subprocess.run([sys.executable, "-m", "stackprobe", "--help"], capture_output=True,
                                         text=True, env=env, timeout=120).stdout
