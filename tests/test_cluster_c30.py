"""Case C30: the Slurm job checks ``enroot version`` on every node before importing a digest reference
(enroot < 4.0.0 cannot parse ``REGISTRY#IMAGE@sha256:...``), and a loopback registry is refused or warned.

The generated script runs for real in bash; ``srun`` and ``enroot`` are stand-ins on PATH (no Slurm
cluster here): ``srun`` runs its command on this host, ``enroot version`` prints a given release."""
from __future__ import annotations

import subprocess

import pytest

from cudastack.registry import cluster
from cudastack.core.errors import UsageError

DIGEST = "sha256:" + "ab" * 32
REMOTE = f"registry.example.com:5000/ci/runtime@{DIGEST}"
LOOPBACK = f"127.0.0.1:5000/ci/runtime@{DIGEST}"


def stand_ins(folder, enroot_version):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "srun").write_text(
        "#!/bin/bash\n"
        "# stand-in for Slurm's srun: a container step is only recorded; any other step runs here\n"
        'for a in "$@"; do case "$a" in --container-image=*) echo "CONTAINER STEP $a"; exit 0;; esac; done\n'
        'while [ "${1#--}" != "$1" ]; do shift; done\n'
        'exec "$@"\n')
    if enroot_version is not None:
        (folder / "enroot").write_text(f'#!/bin/sh\n[ "$1" = version ] && echo {enroot_version}\n')
    for f in folder.iterdir():
        f.chmod(0o755)
    return folder


def run_script(text, tmp_path, enroot_version, extra_env=None):
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    bin_dir = stand_ins(tmp_path / f"bin-{enroot_version}", enroot_version)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path), "STACKPROBE_REPORT_DIR": str(tmp_path / "r"),
           **(extra_env or {})}
    return subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("old", ["3.5.0", "3.4.1"])
def test_c30_job_stops_on_enroot_older_than_4(tmp_path, old):
    p = run_script(cluster.slurm_script(REMOTE, gpus=8, toolchain="13.1"), tmp_path, old)
    assert p.returncode == 3
    assert f"enroot {old}" in p.stderr and "older than 4.0.0" in p.stderr and "REGISTRY#IMAGE@sha256" in p.stderr
    assert "CONTAINER STEP" not in p.stdout


@pytest.mark.parametrize("new", ["4.0.0", "4.1.2"])
def test_c30_job_imports_with_enroot_4(tmp_path, new):
    p = run_script(cluster.slurm_script(REMOTE, gpus=8, toolchain="13.1"), tmp_path, new)
    assert p.returncode == 0, p.stderr
    assert f"enroot {new}" in p.stdout and f"CONTAINER STEP --container-image=registry.example.com:5000#ci/runtime@{DIGEST}" in p.stdout


def test_c30_job_stops_without_enroot(tmp_path):
    p = run_script(cluster.slurm_script(REMOTE, gpus=8, toolchain="13.1"), tmp_path, None)
    assert p.returncode == 3 and "enroot is not installed" in p.stderr


def test_c30_loopback_registry_is_refused_on_request_and_warned_otherwise(tmp_path):
    with pytest.raises(UsageError, match="loopback"):
        cluster.slurm_script(LOOPBACK, gpus=8, toolchain="13.1", loopback="refuse")
    with pytest.raises(UsageError, match="loopback"):
        cluster.kubernetes_job(LOOPBACK, gpus=8, toolchain="13.1", loopback="refuse")
    text = cluster.slurm_script(LOOPBACK, gpus=8, toolchain="13.1")
    assert "# WARNING: The image's registry 127.0.0.1:5000 is a loopback address" in text
    p = run_script(text, tmp_path, "4.0.0")
    assert p.returncode == 2 and "STACKPROBE_ALLOW_LOOPBACK=1" in p.stderr and "CONTAINER STEP" not in p.stdout
    p = run_script(text, tmp_path, "4.0.0", {"STACKPROBE_ALLOW_LOOPBACK": "1"})
    assert p.returncode == 0 and "CONTAINER STEP" in p.stdout
    job = cluster.kubernetes_job(LOOPBACK, gpus=8, toolchain="13.1")
    assert "loopback" in job["metadata"]["annotations"]["cudastack/warning"]
    # a reachable registry carries no warning and is not refused
    assert "WARNING" not in cluster.slurm_script(REMOTE, gpus=8, toolchain="13.1", loopback="refuse")
    assert "cudastack/warning" not in cluster.kubernetes_job(REMOTE, gpus=8, toolchain="13.1")["metadata"]["annotations"]


def test_c30_script_with_checks_passes_shellcheck(tmp_path):
    for image in (REMOTE, LOOPBACK):
        f = tmp_path / "j.sh"
        f.write_text(cluster.slurm_script(image, gpus=8, toolchain="13.1"))
        p = subprocess.run(["shellcheck", "-s", "bash", str(f)], capture_output=True, text=True)
        assert p.returncode == 0, p.stdout
