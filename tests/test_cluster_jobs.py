"""Cluster jobs: the Slurm script passes shellcheck and bash -n; the Kubernetes Job validates against the
Kubernetes schema (kubernetes-validate, bundled schemas, strict); the container command really runs the
suite and its JSON report comes back out of the log."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cudastack.registry import cluster
from cudastack.core.errors import UsageError

DIGEST = "sha256:" + "ab" * 32
IMAGE = f"127.0.0.1:5000/ci/runtime@{DIGEST}"


@pytest.mark.parametrize("kw", [dict(gpus=8), dict(gpus=2, nodes=4, partition="gpu", account="ml",
                                                   probe_args=["--runtime", "--target-arch", "12.0"])])
def test_slurm_script_passes_shellcheck(tmp_path, kw):
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed")
    text = cluster.slurm_script(IMAGE, toolchain="13.1", **kw)
    path = tmp_path / "job.sbatch"
    cluster.write_job(str(path), text)
    r = subprocess.run(["shellcheck", "--severity=style", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert f"IMAGE='127.0.0.1:5000#ci/runtime@{DIGEST}'" in text
    assert '--container-image="$IMAGE"' in text
    assert f"#SBATCH --gpus-per-node={kw['gpus']}" in text
    assert f"#SBATCH --nodes={kw.get('nodes', 1)}" in text


def test_slurm_script_accepts_enroot_spelling():
    a = cluster.slurm_script(IMAGE, gpus=1, toolchain="13.1")
    b = cluster.slurm_script(f"127.0.0.1:5000#ci/runtime@{DIGEST}", gpus=1, toolchain="13.1")
    assert a == b


@pytest.mark.parametrize("kw", [dict(gpus=8), dict(gpus=8, nodes=3, host_path="/var/lib/stackprobe",
                                                   node_selector={"nvidia.com/gpu.product": "RTX-PRO-6000"},
                                                   image_pull_secret="regcred", probe_args=["--target-arch", "12.0"])])
def test_kubernetes_job_validates(kw):
    job = cluster.kubernetes_job(IMAGE, toolchain="13.1", **kw)
    version = cluster.validate_kubernetes(job)
    assert version
    spec = job["spec"]["template"]["spec"]
    c = spec["containers"][0]
    assert c["image"] == IMAGE
    assert c["resources"]["limits"]["nvidia.com/gpu"] == kw["gpus"]
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == kw.get("nodes", 1)
    assert "python -m stackprobe --json" in c["args"][0]
    # the rendered YAML is the same object
    assert yaml.safe_load(cluster.render_manifest(job)) == job
    if kw.get("host_path"):
        assert spec["volumes"][0]["hostPath"]["path"] == "/var/lib/stackprobe"
        assert spec["affinity"]["podAntiAffinity"]
    else:
        assert "emptyDir" in spec["volumes"][0]


def test_validator_rejects_a_broken_job():
    job = cluster.kubernetes_job(IMAGE, gpus=1, toolchain="13.1")
    job["spec"]["template"]["spec"]["containers"][0]["resourcez"] = {}
    with pytest.raises(UsageError, match="does not validate"):
        cluster.validate_kubernetes(job)


@pytest.mark.parametrize("bad, match", [
    (dict(image="127.0.0.1:5000/ci/runtime:latest"), "no digest"),
    (dict(gpus=0), "--gpus"),
    (dict(nodes=0), "--nodes"),
    (dict(name="Bad_Name"), "DNS-1123"),
    (dict(host_path="relative/dir"), "absolute"),
])
def test_bad_input(bad, match):
    kw = dict(image=IMAGE, gpus=1, toolchain="13.1")
    kw.update(bad)
    image = kw.pop("image")
    with pytest.raises(UsageError, match=match):
        cluster.kubernetes_job(image, **kw)


def test_slurm_bad_time():
    with pytest.raises(UsageError, match="--time"):
        cluster.slurm_script(IMAGE, gpus=1, time_limit="one hour")


def test_container_command_runs_the_suite_and_keeps_the_report(tmp_path):
    """Run the Job's container command for real (the suite from this checkout as `python`), with the reports
    folder at a temporary path; the JSON report is both in the folder and recoverable from the log."""
    import importlib.util
    if importlib.util.find_spec("stackprobe.__main__") is None:
        pytest.skip("the validation suite has no `python -m stackprobe` entry point yet")
    mount = str(tmp_path / "reports")
    os.makedirs(mount)
    job = cluster.kubernetes_job(IMAGE, gpus=1, toolchain="13.1", container_mount=mount,
                                 probe_args=["--target-arch", "12.0"])
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bindir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "NODE_NAME": "node-a", "JOB_COMPLETION_INDEX": "0"}
    r = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env, timeout=900)
    reports = cluster.reports_from_log(r.stdout)
    assert "node-a" in reports, r.stdout[-2000:] + r.stderr[-2000:]
    on_disk = Path(mount) / "stackprobe-node-a-0.json"
    assert on_disk.exists()
    import json
    assert json.loads(on_disk.read_text()) == reports["node-a"]


SERVER = "--enable-symm-mem --tp 8"
SERVER_ENV = ["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1"]


def _suite_argv_slurm(text: str) -> list[str]:
    """The ``python -m stackprobe ...`` argv the Slurm job's container step runs (its bash -c payload)."""
    import shlex
    step = text[text.index("srun --ntasks-per-node=1 --container-image"):]
    payload = shlex.split(step.replace("\\\n", " "))
    inner = payload[payload.index("-c") + 1]
    return shlex.split(inner.split("exec ", 1)[1].replace('"$REPORT"', "R"))


def _suite_argv_kubernetes(job: dict) -> list[str]:
    import shlex
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    return shlex.split(script.splitlines()[2].replace('"$REPORT"', "R"))


def test_both_jobs_run_the_p2p_check_first_and_go_on_to_the_suite_whatever_it_finds():
    """The P2P check (python -m stackprobe.runtime p2p) is each job's first step on the node; its failure is said,
    not fatal: the suite's report (host section, runtime tier) still gets written."""
    import shlex
    slurm = cluster.slurm_script(IMAGE, gpus=8, toolchain="13.1")
    step = slurm[slurm.index("srun --ntasks-per-node=1 --container-image"):]
    inner = shlex.split(step.replace("\\\n", " "))
    inner = inner[inner.index("-c") + 1]
    assert inner.index("python -m stackprobe.runtime p2p") < inner.index("exec python -m stackprobe")
    assert "|| echo" in inner.split("exec ", 1)[0]
    script = cluster.kubernetes_job(IMAGE, gpus=8, toolchain="13.1")["spec"]["template"]["spec"]["containers"][0]["args"][0]
    lines = script.splitlines()
    assert lines[1].startswith("python -m stackprobe.runtime p2p") and "|| echo" in lines[1]
    assert lines[2].startswith("python -m stackprobe --json")


def test_both_jobs_hand_the_server_configuration_to_the_suite_and_its_runtime_tier():
    """The argv each job runs, read by the suite's own parser: the static answer and run_runtime(report, args)
    get the user's --server-args / --env; --runtime (the default probe argument) stays."""
    from stackprobe.__main__ import _glue_server_args, build_parser
    slurm = cluster.slurm_script(IMAGE, gpus=8, toolchain="13.1", probe_args=["--runtime"], server_args=SERVER,
                                 env=SERVER_ENV)
    job = cluster.kubernetes_job(IMAGE, gpus=8, toolchain="13.1", probe_args=["--runtime"], server_args=SERVER,
                                 env=SERVER_ENV)
    cluster.validate_kubernetes(job)
    for argv in (_suite_argv_slurm(slurm), _suite_argv_kubernetes(job)):
        assert argv[:3] == ["python", "-m", "stackprobe"]
        a = build_parser().parse_args(_glue_server_args(argv[3:]))
        assert (a.runtime, a.server_args, a.env, a.json) == (True, SERVER, SERVER_ENV, "R")
    # without a server configuration the argv has none (the default: no flags)
    a = build_parser().parse_args(_suite_argv_slurm(cluster.slurm_script(IMAGE, gpus=8, toolchain="13.1",
                                                                         probe_args=["--runtime"]))[3:])
    assert (a.server_args, a.env) == ("", [])


def test_the_slurm_job_with_a_server_configuration_passes_shellcheck(tmp_path):
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed")
    path = tmp_path / "job.sbatch"
    cluster.write_job(str(path), cluster.slurm_script(IMAGE, gpus=8, toolchain="13.1", server_args=SERVER + " --x 'a b'",
                                                      env=SERVER_ENV + ["NCCL_P2P_LEVEL=SYS"]))
    r = subprocess.run(["shellcheck", "--severity=style", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


@pytest.mark.parametrize("kw, match", [
    (dict(env=["SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"]), "NAME=VALUE"),
    (dict(env=["1BAD=x"]), "NAME=VALUE"),
    (dict(env=["A B=x"]), "NAME=VALUE"),
    (dict(server_args="--model-path 'unclosed"), "shell-quoted"),
])
def test_a_bad_server_configuration_is_refused_in_both_jobs(kw, match):
    with pytest.raises(UsageError, match=match):
        cluster.slurm_script(IMAGE, gpus=1, toolchain="13.1", **kw)
    with pytest.raises(UsageError, match=match):
        cluster.kubernetes_job(IMAGE, gpus=1, toolchain="13.1", **kw)
