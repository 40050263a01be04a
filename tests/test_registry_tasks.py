"""The invoke tasks of this area, run as a user runs them: exit codes and messages of bad input, and the
cluster-job task writing a checked file."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DIGEST = "sha256:" + "cd" * 32


def invoke(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, timeout=300)


def test_tasks_are_listed():
    r = invoke("--list")
    assert r.returncode == 0
    for name in ("lock", "push", "pull", "cluster-job", "bake"):
        assert f"  {name} " in r.stdout


def test_pull_without_lockfile_exits_7(tmp_path):
    r = invoke("pull", "--cuda", "9.9", "--lockfiles", str(tmp_path))
    assert r.returncode == 7
    assert "invoke lock --cuda 9.9" in r.stderr


def test_push_needs_registry(tmp_path):
    r = invoke("push", "--cuda", "13.1", "--lockfiles", str(tmp_path))
    assert r.returncode == 2 and "--registry is required" in r.stderr
    r = invoke("push", "--cuda", "13.1", "--registry", "http://x:5000", "--lockfiles", str(tmp_path))
    assert r.returncode == 2 and "without a scheme" in r.stderr


def test_cluster_job_task(tmp_path):
    out = tmp_path / "job.k8s.yaml"
    r = invoke("cluster-job", "--scheduler", "kubernetes", "--gpus", "8", "--nodes", "2",
               "--image", f"127.0.0.1:5000/ci/runtime@{DIGEST}", "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert "validates against the Kubernetes" in r.stderr
    import yaml
    job = yaml.safe_load(out.read_text())
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == f"127.0.0.1:5000/ci/runtime@{DIGEST}"
    assert "--runtime" in job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    r = invoke("cluster-job", "--scheduler", "pbs", "--gpus", "8", "--image", f"r.io/x@{DIGEST}")
    assert r.returncode == 2 and "--scheduler" in r.stderr
    r = invoke("cluster-job", "--scheduler", "slurm", "--gpus", "8", "--image", "r.io/x:latest",
               "--output", str(tmp_path / "j.sbatch"))
    assert r.returncode == 2 and "no digest" in r.stderr
    assert not (tmp_path / "j.sbatch").exists()


def test_cluster_job_without_the_kubernetes_validator_says_so_in_one_paragraph(tmp_path):
    """The task run for real in a Python where ``import kubernetes_validate`` fails (blocked in sys.modules,
    as when the extra is not installed): exit 5, one paragraph naming the extra, and no file written."""
    out = tmp_path / "job.k8s.yaml"
    code = ("import sys; sys.modules['kubernetes_validate'] = None; from invoke.main import program; "
            "program.run(sys.argv)")
    r = subprocess.run([sys.executable, "-c", code, "-r", str(ROOT), "cluster-job", "--scheduler", "kubernetes",
                        "--gpus", "8", "--image", f"r.io/x@{DIGEST}", "--output", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 5, r.stderr
    msg = r.stderr.strip()
    assert "Traceback" not in msg and len(msg.splitlines()) == 1, msg
    assert "kubernetes-validate" in msg and "'.[kubernetes]'" in msg and "--scheduler slurm" in msg
    assert not out.exists()
    # Slurm needs no validator
    r = subprocess.run([sys.executable, "-c", code, "-r", str(ROOT), "cluster-job", "--scheduler", "slurm",
                        "--gpus", "8", "--image", f"r.io/x@{DIGEST}", "--output", str(tmp_path / "j.sbatch")],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr


def test_cluster_job_from_lock_without_push(tmp_path):
    from cudastack import lock as L
    from test_lock_io import _lock
    L.write_lock(tmp_path / "9.9.lock.yaml", _lock())
    r = invoke("cluster-job", "--cuda", "9.9", "--scheduler", "slurm", "--gpus", "1", "--lockfiles", str(tmp_path))
    assert r.returncode == 7 and "records no pushed runtime image" in r.stderr


@pytest.mark.parametrize("task", ["lock", "bake"])
def test_unknown_toolchain(task, tmp_path):
    r = invoke(task, "--cuda", "99.9", "--lockfiles", str(tmp_path)) if task == "lock" else \
        invoke(task, "--cuda", "99.9", "--output", str(tmp_path / "b.json"))
    assert r.returncode == 2, r.stderr
    assert "99.9" in r.stderr


@pytest.mark.network      # the locked dry run checks hashes on PyPI and the engine
@pytest.mark.docker
@pytest.mark.parametrize("cuda", ["13.1", "12.8"])
def test_committed_lockfiles_match_the_recipes(cuda):
    """The committed lockfiles still match the recipes and Dockerfiles, with the options each lock remembers
    (12.8: --base pip --skip flash-attn): `invoke build --cuda X --locked --dry-run` accepts them. A recipe
    change without `invoke lock` fails here, naming the stale entry. Where a node's plan is unchanged since
    its locked build, the locked tag computed now is the tag that build recorded (locked hashes are stable)."""
    r = invoke("build", "--cuda", cuda, "--locked", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert "verified against the plan; locked tags below" in r.stderr

    from cudastack import lock as L
    from cudastack.plan.planner import make_plan

    lock = L.load_lock(cuda)
    arch, base, skip = L.plan_options(cuda, None, None, None)
    plan = make_plan(None, cuda, archs=arch, base=base, skip=skip or ())
    plan_hashes = {n.name: n.hash for n in plan.nodes}
    L.apply_lock(plan, lock)

    def unchanged(name):
        return lock["nodes"][name]["plan_hash"] == plan_hashes[name] and all(
            unchanged(p) for p in plan.node(name).parents)

    for name, out in (lock.get("outputs") or {}).items():
        if unchanged(name):
            assert plan.node(name).tag == out["tag"], name
            assert out["tag"] in r.stdout


def test_lock_remembers_its_options(tmp_path):
    from cudastack import lock as L

    lk = {"toolchain": "12.8", "base_kind": "pip", "target_archs": ["12.0"], "skipped": ["flash-attn"]}
    assert L.lock_command(lk) == "invoke lock --cuda 12.8 --base pip --skip flash-attn"
    assert L.lock_command(dict(lk, target_archs=["12.0", "12.1"], skipped=[])) == \
        "invoke lock --cuda 12.8 --base pip --arch 12.0,12.1"
    (tmp_path / "12.8.lock.yaml").write_text(L.render_lock(dict(lk, lock_version=1, cuda_version="12.8.1")))
    assert L.plan_options("12.8", None, None, None, tmp_path) == ("12.0", "pip", ["flash-attn"])
    assert L.plan_options("12.8", "12.1", "nvidia", ["x"], tmp_path) == ("12.1", "nvidia", ["x"])
    assert L.plan_options("9.9", None, None, None, tmp_path) == (None, None, None)


def _pushed_lock(tmp_path, **edit) -> Path:
    """A 9.9 lock whose runtime push is recorded with its three spellings in agreement, then ``edit`` applied."""
    from cudastack import lock as L
    from test_lock_io import _lock
    d = _lock()
    d["nodes"]["runtime"] = d["nodes"].pop("app")
    ref = f"127.0.0.1:9/ci/runtime@{DIGEST}"
    d["pushed"] = {"runtime": dict({"digest": DIGEST, "reference": ref, "enroot": f"127.0.0.1:9#ci/runtime@{DIGEST}",
                                    "image_id": "sha256:" + "ef" * 32, "tag": "127.0.0.1:9/ci/runtime:abc"}, **edit)}
    L.write_lock(tmp_path / "9.9.lock.yaml", d)
    return tmp_path


OTHER = "sha256:" + "0a" * 32


@pytest.mark.parametrize("field,value,names", [
    ("digest", OTHER, "pushed.runtime.digest"),
    ("enroot", f"127.0.0.1:9#ci/runtime@{OTHER}", "pushed.runtime.enroot"),
    ("reference", f"127.0.0.1:9/ci/runtime@{OTHER}", "pushed.runtime.digest"),
    ("reference", "127.0.0.1:9/ci/runtime:latest", "pushed.runtime.reference"),
])
def test_c47_one_edited_spelling_is_refused_by_pull_and_cluster_job(tmp_path, field, value, names):
    """C47: an edit to one of the push record's spellings alone is refused before any pull or job file, naming
    the field; exit 7 (lock), never 0."""
    lockdir = _pushed_lock(tmp_path, **{field: value})
    out = tmp_path / "job.sbatch"
    for args in (("pull", "--cuda", "9.9"),
                 ("cluster-job", "--cuda", "9.9", "--scheduler", "slurm", "--gpus", "1", "--output", str(out))):
        r = invoke(*args, "--lockfiles", str(lockdir))
        assert r.returncode == 7, (args[0], r.stderr)
        assert names in r.stderr and "must name one digest" in r.stderr, r.stderr
    assert not out.exists()


@pytest.mark.docker
def test_c47_agreeing_spellings_pass_the_check(tmp_path):
    """The same lock unedited: cluster-job writes the job from it (with the enroot spelling the lock records), and
    pull goes past the check to the registry (which does not answer here: exit 8, not 7)."""
    lockdir = _pushed_lock(tmp_path)
    out = tmp_path / "job.sbatch"
    r = invoke("cluster-job", "--cuda", "9.9", "--scheduler", "slurm", "--gpus", "1", "--output", str(out),
               "--lockfiles", str(lockdir))
    assert r.returncode == 0, r.stderr
    assert f"127.0.0.1:9#ci/runtime@{DIGEST}" in out.read_text()
    r = invoke("pull", "--cuda", "9.9", "--lockfiles", str(lockdir))
    assert r.returncode == 8, r.stderr
