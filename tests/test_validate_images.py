"""``invoke validate --image ...`` on a real Docker engine.

* The build pipeline's fixture chain (tests/fixtures/recipes: base -> cuda-ext -> runtime for CUDA 13.1 on
  the pip base) is built through ``cudastack.build.executor.run_build`` (a no-op when its tags exist, as after the
  build integration test): the suite runs inside the runtime image (its own copy) and inside the base
  image (no suite: this checkout's validate/ is mounted read-only), and the two reports are compared.
* Bad input: an image that does not exist, an image with no Python.
* Full-stack runtime images made by ``invoke build`` (label org.cudastack.kind=runtime, with sglang), when
  this engine has them (marked `stack`: CI does not build them), and the committed reports of the two
  full-stack images: each verdict must follow the evidence the suite read (C9, C10, C11), and the evidence
  must be there.
"""
from __future__ import annotations

import io
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from cudastack.core.errors import ValidationError
from cudastack.jobs.validate import validate_image, validate_many

from validate_support import CACHE

pytestmark = [pytest.mark.docker, pytest.mark.network]

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"


@pytest.fixture(scope="module")
def client():
    from cudastack.core.docker_engine import docker_client
    c = docker_client()
    c.ping()
    return c


@pytest.fixture(scope="module")
def chain():
    """The fixture chain's plan, built (or found cached) through the build pipeline."""
    from cudastack.build.executor import run_build
    from cudastack.build.engine import Engine
    from cudastack.plan.planner import make_plan
    from cudastack.plan.rules import host_resources

    plan = make_plan(FIXTURES / "recipes", "13.1", resources=host_resources(), prefix="cudastack-test")
    run_build(plan, state_dir=CACHE / "validate-build-state", engine=Engine.connect(), say=lambda s: None)
    return plan


def test_suite_runs_in_the_runtime_image_and_in_an_image_without_it(chain):
    from stackprobe.report import suite_digest

    runtime, base = chain.node("runtime").tag, chain.node("base").tag
    reports, md = validate_many([runtime, base], "12.0", say=lambda s: None,
                                extra=["--scan-dist", "cuda-ext-fixture"])
    r_rt, r_base = reports
    # the checkout's suite by default, in both; its digest and each image's id and plan hash in the report
    assert all(r.options["ran_in"]["suite"].startswith("suite mounted read-only") for r in reports)
    for r, node in ((r_rt, "runtime"), (r_base, "base")):
        prov = r.provenance
        assert prov["suite_digest"] == suite_digest()
        assert prov["image"]["id"].startswith("sha256:") and prov["image"]["plan_hash"] == chain.node(node).hash
        assert prov["image"]["node"] == node and "lock_entry" in prov["image"]
    own = validate_many([runtime], "12.0", say=lambda s: None, image_suite=True)[0][0]
    assert own.options["ran_in"]["suite"] == "image's own suite" and own.provenance["suite"] == "image's own suite"
    for r in reports:
        assert r.options["ran_in"]["python"] == "/opt/venv/bin/python"
        assert r.environment["nvcc"]["cuda_home_nvcc"]["release"] == "13.1"   # the PyPI toolkit as CUDA_HOME
        assert r.verdict("flashinfer-allreduce-fusion").status == "skipped"   # not in the fixture chain
    cov = r_rt.package_coverage("cuda-ext-fixture")
    assert cov is not None and cov["level"] == "native"
    assert any("sm_120" in f["sass"] for f in cov["files"])               # built by the pipeline for 12.0
    assert r_base.package_coverage("cuda-ext-fixture") is None
    assert md.startswith("## Environment health\n")   # health first, then the matrix
    assert f"\n| backend | {runtime} | {base} | changed | why |\n" in md
    assert "coverage cuda-ext-fixture" in md


def test_hidden_toolkit_folders_leave_the_suite_no_nvcc(chain):
    """--hide covers folders of the image in the validation container only: with the toolkit's bin folder
    hidden the suite finds no nvcc (the same image without --hide finds CUDA 13.1's), and the report says what
    was hidden."""
    runtime = chain.node("runtime").tag
    seen = validate_image(runtime, "12.0")
    assert seen.environment["nvcc"]["cuda_home_nvcc"]["release"] == "13.1"
    hidden = validate_image(runtime, "12.0", hide=["/usr/local/cuda/bin/"])
    assert hidden.options["ran_in"]["hidden"] == ["/usr/local/cuda/bin"]
    nvcc = hidden.environment["nvcc"]
    assert not (nvcc.get("cuda_home_nvcc") or {}).get("release") and not (nvcc.get("path") or {}).get("release")
    assert not [n for n in nvcc.get("pip") or [] if (n or {}).get("release")]
    assert validate_image(runtime, "12.0").environment["nvcc"]["cuda_home_nvcc"]["release"] == "13.1"  # image unchanged
    from cudastack.core.errors import UsageError
    with pytest.raises(UsageError, match="no such folder in .*nothing would be hidden"):   # a typo hides nothing
        validate_image(runtime, "12.0", hide=["/usr/local/cuda/bin", "/usr/local/cdua/bin"])


@pytest.mark.parametrize("bad", ["usr/local/cuda/bin", "/", "/usr/../etc"])
def test_bad_hide_folders_are_refused_before_any_container(bad):
    p = subprocess.run([sys.executable, "-m", "invoke", "validate", "--image", "cudastack-test/no-such-image:never",
                        "--hide", bad], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 2 and "--hide" in p.stderr and "absolute folder" in p.stderr, p.stderr
    assert "does not exist" not in p.stderr          # refused before the image is even looked up


def test_missing_image_is_a_validation_error():
    with pytest.raises(ValidationError, match="does not exist"):
        validate_image("cudastack-test/no-such-image:never")


def test_image_without_python_is_a_validation_error(client):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"no python here\n"
        info = tarfile.TarInfo("README")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    tag = "cudastack-test/validate-nopython:1"
    client.api.import_image_from_data(buf.getvalue(), repository=tag.split(":")[0], tag="1")
    try:
        with pytest.raises(ValidationError, match="no Python 3"):
            validate_image(tag)
    finally:
        client.images.remove(tag, force=True)


def test_invoke_validate_exit_code_for_a_missing_image():
    p = subprocess.run([sys.executable, "-m", "invoke", "validate", "--image", "cudastack-test/no-such-image:never"],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert p.returncode == 9 and "does not exist" in p.stderr


def _evidence(verdict, what):
    """The value of ``verdict``'s first evidence item whose name satisfies ``what``, or None."""
    return next((e.value for e in verdict.evidence if what(e.what)), None)


def _check_verdicts_follow_evidence(r, where: str) -> None:
    """Hand-written rules (C9, C10, C11, C13) against the evidence a static report read; the evidence must be
    there. The headline is the engine's answer; the library's answer is checked on its own."""
    sym = r.answers("torch-symm-mem")["engine"]
    assert sym is not None and r.verdict("torch-symm-mem") is sym, f"{where}: headline is not the engine's answer"
    keys = _evidence(sym, lambda w: w.startswith("engine gate: TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES keys"))
    keys = keys.get("value") if isinstance(keys, dict) else keys
    assert isinstance(keys, list) and keys, f"{where}: torch-symm-mem gave no evidence of SGLang's size table"
    closed = ("startup-failure-if-set", "falls-back-if-set")        # C36: 0.5.9 KeyError at start-up, 0.5.23 .get()
    if 12 not in keys:
        assert (sym.status, sym.gate) in [(s, "python-table") for s in closed], (where, sym)              # C11
    else:
        assert sym.status in closed, (where, sym)                        # C14: multicast_ptr == 0 on PCIe
    fus = r.answers("flashinfer-allreduce-fusion")["library"]
    majors = _evidence(fus, lambda w: w.endswith("supported majors"))
    assert isinstance(majors, list) and majors, f"{where}: the fusion probe gave no evidence of FlashInfer's JIT list"
    if 12 in majors:
        assert fus.status == "gate-passes", (where, fus)                                                 # C9
    else:
        assert (fus.status, fus.gate) == ("blocked", "python-table"), (where, fus)
    assert r.verdict("flashinfer-allreduce-fusion").status in closed, where         # C13/C35: SGLang's own checks
    assert r.provenance["suite_digest"].startswith("sha256:"), where
    kern = r.package_coverage("sglang-kernel") or r.package_coverage("sgl-kernel")
    assert kern, f"{where}: no coverage of sglang-kernel / sgl-kernel"
    if r.environment["torch"].get("cuda", "").startswith("13"):
        ops = [f for f in kern["files"] if "common_ops" in f["path"]]
        assert ops and all("sm_120a" in f["sass"] for f in ops), (where, ops)                           # C10


COMMITTED = sorted((ROOT / "results" / "validate").glob("*.json"))


@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_committed_full_stack_reports_follow_the_rules(path):
    """The committed static reports of the two full-stack runtime images obey the same rules."""
    from stackprobe.report import Report

    _check_verdicts_follow_evidence(Report.load(path), path.name)


def test_rules_fail_on_missing_evidence_or_a_wrong_verdict():
    """The rules can fail: evidence dropped from a report, or a verdict that contradicts its evidence."""
    import json

    from stackprobe.report import Report

    assert len(COMMITTED) >= 2
    d = json.loads(COMMITTED[0].read_text())
    for v in d["verdicts"]:
        if v["backend"] == "torch-symm-mem":
            v["evidence"] = [e for e in v["evidence"] if "MAX_SIZES" not in e["what"]]
    with pytest.raises(AssertionError, match="no evidence of SGLang's size table"):
        _check_verdicts_follow_evidence(Report.from_json(d), "no-evidence")
    d = json.loads(COMMITTED[0].read_text())
    for v in d["verdicts"]:
        if v["backend"] == "flashinfer-allreduce-fusion":
            v["status"], v["gate"] = ("blocked", "python-table") if v["status"] == "gate-passes" else ("gate-passes", None)
    with pytest.raises(AssertionError):
        _check_verdicts_follow_evidence(Report.from_json(d), "flipped")


def _full_stack_images(client) -> dict:
    """Newest runtime image per toolchain that holds sglang (made by `invoke build`)."""
    found: dict = {}
    imgs = sorted(client.images.list(filters={"label": "org.cudastack.kind=runtime"}),
                  key=lambda i: i.attrs.get("Created", ""), reverse=True)
    for img in imgs:
        tc = img.labels.get("org.cudastack.toolchain")
        if not img.tags or tc in found:
            continue
        out = client.containers.run(img.tags[0], ["/opt/venv/bin/python", "-c",
                                                  "import importlib.util as u; print(u.find_spec('sglang') is not None)"],
                                    remove=True, entrypoint=[], network_disabled=True).decode().strip()
        if out == "True":
            found[tc] = img.tags[0]
    return found


@pytest.mark.stack
def test_full_stack_images_verdicts_follow_the_evidence(client):
    images = _full_stack_images(client)
    if not images:
        pytest.skip("no full-stack runtime image on this engine yet (run `invoke build --cuda 13.1`)")
    order = sorted(images, key=lambda t: [int(x) for x in t.split(".")], reverse=True)
    reports, md = validate_many([images[t] for t in order], "12.0", say=lambda s: None)
    assert all(r.options["ran_in"]["suite"].startswith("suite mounted") for r in reports)
    for r in reports:
        _check_verdicts_follow_evidence(r, r.options["ran_in"]["image"])
    if len(reports) > 1:
        assert md.count("\n| ") >= 9


def test_markdown_names_hidden_folders_and_set_variables():
    from stackprobe.report import Report

    r = Report(target_arch="12.0", label="img")
    assert "ran with:" not in r.to_markdown()
    r.options["ran_in"] = {"hidden": ["/usr/local/cuda/bin"], "env": {"CUDA_HOME": "/nonexistent"}}
    assert "ran with: folders hidden: /usr/local/cuda/bin; environment set: CUDA_HOME=/nonexistent" in r.to_markdown()
