"""The README's exit-code table, walked: one real command per documented code, run through `invoke` as a
user would, with the code it must return. Codes 5, 6 and 8 need a Docker engine (5: one that is not there);
6 is a real BuildKit build that fails at its first step (a base image with no shell)."""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
NOSHELL = "cudastack-test/exit-codes-noshell:1"


def readme_table() -> dict[int, str]:
    """{code: meaning} from the list that opens docs/exit-codes.md, moved there from the README (including
    invoke's own exit 1)."""
    text = (ROOT / "docs" / "exit-codes.md").read_text().split("# Exit codes", 1)[1].split("\nEvery task and", 1)[0]
    table = {int(code): meaning.strip() for code, meaning in re.findall(r"(?:^|;\s*)(\d+) ([^;]+?)(?=;|\.\s|$)",
                                                                         " ".join(text.split()))}
    if re.search(r"exit 1\b", text):
        table[1] = "unknown flag (invoke's parser)"
    return table


def _invoke(*args: str, cwd: Path = ROOT, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full = dict(os.environ, **(env or {}))
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], capture_output=True, text=True,
                          cwd=cwd, env=full, timeout=timeout)


@pytest.fixture
def fixture_copy(tmp_path) -> Path:
    """A writable copy of tests/fixtures (the one-toolchain recipes and the CUDA extension they build)."""
    shutil.copytree(FIXTURES / "recipes", tmp_path / "fx" / "recipes")
    shutil.copytree(FIXTURES / "cuda_ext", tmp_path / "fx" / "cuda_ext")
    return tmp_path / "fx" / "recipes"


def _with_nvidia_base(recipes: Path, image: str) -> None:
    data = yaml.safe_load((recipes / "toolchains.yaml").read_text())
    data["toolchains"]["13.1"]["bases"]["nvidia"] = {"image": image, "python": "3.12", "has_nvcc": True}
    (recipes / "toolchains.yaml").write_text(yaml.safe_dump(data, sort_keys=False))


def test_readme_table_is_the_errors_table():
    """The README's codes are the ones cudastack.core.errors defines, plus invoke's 1 and success."""
    from cudastack.core import errors

    table = readme_table()
    assert set(table) == {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 130}, table
    classes = {c.exit_code: c.__name__ for c in vars(errors).values()
               if isinstance(c, type) and issubclass(c, errors.StackError) and c is not errors.StackError}
    assert set(classes) == set(table) - {0, 1}, classes


def _no_engine():
    return {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


CASES = {
    0: lambda fx, tmp: _invoke("build", "--cuda", "13.1", "--recipes", str(fx), "--prefix", "cudastack-test",
                               "--dry-run"),
    1: lambda fx, tmp: _invoke("build", "--x"),
    2: lambda fx, tmp: _invoke("build", "--cuda", "9.9", "--dry-run"),
    4: lambda fx, tmp: _invoke("build", "--cuda", "12.8", "--base", "pip", "--dry-run"),
    5: lambda fx, tmp: _invoke("build", "--cuda", "13.1", "--recipes", str(fx), "--prefix", "cudastack-test",
                               "--state-dir", str(tmp / "state"), env=_no_engine()),
    7: lambda fx, tmp: _invoke("cluster-job", "--cuda", "13.1", "--scheduler", "slurm", "--gpus", "8",
                               "--lockfiles", str(tmp), "--output", str(tmp / "job.sbatch")),
    9: lambda fx, tmp: _invoke("validate", "--image", "cudastack-test/no-such-image:never", "--out", str(tmp)),
    130: lambda fx, tmp: _interrupted(tmp),
    10: lambda fx, tmp: _invoke("validate", "--strict", "--out", str(tmp / "reports"),
                                env={"PYTHONPATH": os.pathsep.join(filter(None, [str(_planted_conflict(tmp)),
                                                                                 os.environ.get("PYTHONPATH")]))}),
}


def _interrupted(tmp: Path) -> subprocess.CompletedProcess:
    """`invoke validate` (about a minute here) stopped as a terminal stops it: SIGINT to its process group once it
    has started validating. Every task ends a stop as "interrupted", exit 130 (build's own account of one, with
    its record, is tests/test_build_stops.py)."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "invoke", "-r", str(ROOT), "validate", "--out", str(tmp / "r")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr is not None
    err = proc.stderr.readline()                    # "validating the current environment"
    time.sleep(1)
    os.killpg(proc.pid, signal.SIGINT)
    out, rest = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err + rest)


def _planted_conflict(tmp: Path) -> Path:
    """A site folder holding one installed distribution whose exact pin the environment's torch breaks (what
    ``pip check`` reports as a conflict): the health stage's error that ``--strict`` turns into exit 10."""
    info = tmp / "planted-site" / "cudastack_planted_conflict-0.0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cudastack-planted-conflict\nVersion: 0.0.0\n"
                                   "Requires-Dist: torch==0.0.1\n")
    return info.parent


#: cases whose command needs a Docker engine: the dry run rehearses the build's checks, validate --image runs a container
NEEDS_DOCKER = {0, 9}


@pytest.mark.parametrize("code", [pytest.param(c, marks=pytest.mark.docker) if c in NEEDS_DOCKER else c
                                  for c in sorted(CASES)])
def test_exit_code(code, fixture_copy, tmp_path):
    p = CASES[code](fixture_copy, tmp_path)
    assert p.returncode == code, f"{readme_table()[code]}: exit {p.returncode}\n{p.stdout[-1500:]}\n{p.stderr[-1500:]}"
    if code:
        assert p.stderr.strip(), "an error exit says why"
    if code == 1:
        assert "No idea what '--x' is!" in p.stderr
    if code == 130:
        assert "interrupted: validate was stopped (SIGINT)" in p.stderr and "Traceback" not in p.stderr, p.stderr
    if code == 10:
        assert "cudastack-planted-conflict 0.0.0 requires torch==0.0.1" in p.stderr, p.stderr[-1500:]
        assert list((tmp_path / "reports").glob("*.json")), "--strict exits after the reports are written"


def test_exit_code_10_needs_the_fault():
    """The same run with nothing planted is not exit 10: the code comes from the planted conflict, not --strict."""
    with __import__("tempfile").TemporaryDirectory() as d:
        p = _invoke("validate", "--strict", "--out", str(Path(d) / "reports"))
    assert p.returncode == 0, p.stderr[-1500:]


def test_no_engine_is_exit_5_from_build_and_validate_alike(tmp_path):
    """One code for "no Docker engine answers", whichever command meets it first."""
    p = _invoke("validate", "--image", "cudastack-test/no-such-image:never", "--out", str(tmp_path), env=_no_engine())
    assert p.returncode == 5, p.stderr[-1500:]
    assert "No Docker engine answers at unix:///nonexistent/docker.sock (DOCKER_HOST=" in p.stderr, p.stderr


def test_exit_code_3_recipe_error(fixture_copy):
    (fixture_copy / "base.yaml").write_text((fixture_copy / "base.yaml").read_text() + "bogus_key: 1\n")
    p = _invoke("build", "--cuda", "13.1", "--recipes", str(fixture_copy), "--dry-run")
    assert p.returncode == 3, p.stderr
    assert "bogus_key" in p.stderr and "base.yaml" in p.stderr


def test_exit_code_4_covers_arch_and_a_source_recipe_without_nvcc():
    p = _invoke("build", "--cuda", "12.8", "--base", "pip", "--dry-run")
    assert p.returncode == 4 and "has no nvcc" in p.stderr and "--skip flash-attn" in p.stderr, p.stderr
    p = _invoke("build", "--cuda", "12.8", "--arch", "12.1", "--dry-run")
    assert p.returncode == 4 and "12.9" in p.stderr, p.stderr


@pytest.fixture
def noshell_image(docker_engine_scratch) -> str:
    """A local image holding one file and no shell: every RUN on it fails at once."""
    client, made = docker_engine_scratch
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"no shell here\n"
        info = tarfile.TarInfo("README")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    repo, tag = NOSHELL.split(":")
    client.api.import_image_from_data(buf.getvalue(), repository=repo, tag=tag)
    made.append(NOSHELL)
    return NOSHELL


@pytest.mark.docker
def test_exit_code_6_build_failed(fixture_copy, tmp_path, noshell_image):
    _with_nvidia_base(fixture_copy, noshell_image)
    for f in ("base.yaml", "cuda-ext.yaml", "runtime.yaml"):   # the build must start on a nearly full host too:
        d = yaml.safe_load((fixture_copy / f).read_text())     # the disk check (exit 5) is not what is tested here
        d["est_disk_gib"] = 0
        (fixture_copy / f).write_text(yaml.safe_dump(d, sort_keys=False))
    p = _invoke("build", "--cuda", "13.1", "--base", "nvidia", "--recipes", str(fixture_copy),
                "--prefix", "cudastack-test", "--state-dir", str(tmp_path / "state"))
    assert p.returncode == 6, p.stderr[-2000:]
    assert "Building base failed" in p.stderr and "Full log:" in p.stderr, p.stderr[-2000:]


@pytest.mark.docker
def test_exit_code_8_unreachable_base_registry(fixture_copy, tmp_path, docker_engine_scratch):
    """A base image that must come from a registry that does not answer is refused before any build, and
    the message suggests the pip base (the 12.8 default, NVIDIA's image on Docker Hub, hits this offline)."""
    _with_nvidia_base(fixture_copy, "127.0.0.1:9/nvidia/cuda:13.1.1-cudnn-devel-ubuntu24.04")
    state = tmp_path / "state"
    p = _invoke("build", "--cuda", "13.1", "--base", "nvidia", "--recipes", str(fixture_copy),
                "--prefix", "cudastack-test", "--state-dir", str(state))
    assert p.returncode == 8, p.stderr[-2000:]
    assert "does not answer" in p.stderr and "--base pip" in p.stderr and "Nothing was built" in p.stderr
    assert not (state / "records").exists(), "refused before the build: no run was recorded"


def test_every_documented_code_has_a_case():
    covered = set(CASES) | {3, 6, 8}   # 3, 6 and 8: their own tests above
    assert covered == set(readme_table())
