"""Integration on the real engine: the fixture recipes build base -> cuda-ext (from source, nvcc, arch 12.0)
-> wheelhouse -> runtime for CUDA 13.1 on the pip base (bootstrapped Debian OS image). Inside the runtime
image: the extension's shared object carries sm_120 SASS (NVIDIA's cuobjdump), its thrust host code runs
(case C7), and it is byte-identical to the one in the wheel whose sha256 the record holds. A second run
issues no docker build. A failing node leaves no tag and no wheel, and the rerun resumes from the cache."""
from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import pytest
import yaml

from cudastack.build.executor import run_build
from cudastack.build.wheelhouse import sha256_file
from cudastack.build.engine import Engine
from cudastack.core.errors import BuildError
from cudastack.plan.planner import make_plan
from cudastack.plan.rules import host_resources

pytestmark = [pytest.mark.docker, pytest.mark.network]

FIXTURES = Path(__file__).parent / "fixtures"
TEST_PREFIX = "cudastack-test"   # image repositories of the fixture chain, apart from the real stack's


@pytest.fixture(scope="module")
def engine():
    return Engine.connect()


@pytest.fixture(scope="module")
def cuobjdump() -> Path:
    """NVIDIA's cuobjdump from its PyPI wheel (validate_support.cuobjdump: unpacked once into the test cache);
    returns its bin folder."""
    from validate_support import cuobjdump as fetch_cuobjdump

    return fetch_cuobjdump().parent


@pytest.fixture(scope="module")
def built(engine, tmp_path_factory):
    state = tmp_path_factory.mktemp("state")
    plan = make_plan(FIXTURES / "recipes", "13.1", resources=host_resources(), prefix=TEST_PREFIX)
    lines: list[str] = []
    record = run_build(plan, state_dir=state, engine=engine, say=lines.append)
    return plan, state, record, lines


def docker_run(engine, image: str, *cmd: str, volumes: dict[str, str] | None = None) -> str:
    """Run ``cmd`` in a throw-away container of ``image`` through the docker SDK; returns its stdout."""
    vols = {src: {"bind": dst, "mode": "ro"} for src, dst in (volumes or {}).items()}
    out = engine.client.containers.run(image, list(cmd), remove=True, volumes=vols, stdout=True, stderr=False)
    return out.decode()


def test_chain_builds_and_records_the_wheel(built):
    plan, state, record, lines = built
    assert record["status"] == "ok"
    by = {n["name"]: n for n in record["nodes"]}
    assert list(by) == ["base", "cuda-ext", "runtime"]
    assert by["cuda-ext"]["status"] == "built"          # a fresh state dir has no wheel: it is exported
    assert all(n["status"] in ("built", "skipped") and n["image_id"].startswith("sha256:") for n in by.values())
    assert all(n["size_bytes"] > 0 for n in by.values())
    wheels = by["cuda-ext"]["wheels"]
    assert len(wheels) == 1
    (name, digest), = wheels.items()
    assert name.startswith("cuda_ext_fixture-0.1.0-") and name.endswith(".whl")
    wh = state / plan.wheelhouse
    assert sha256_file(wh / name) == digest
    assert json.loads((wh / "manifest.json").read_text())["nodes"]["cuda-ext"]["wheels"] == wheels
    assert sorted(p.name for p in wh.iterdir()) == sorted([name, "manifest.json"])   # no temp leftovers
    latest = json.loads((state / "records" / "latest-cu13.1.json").read_text())
    assert latest["run_id"] == record["run_id"]
    assert by["cuda-ext"]["knobs"]["CUDA_EXT_ARCHS"] == "120"
    assert any("cuda-ext" in s and "built in" in s for s in lines)


def test_runtime_image_holds_sm_120_sass_from_the_recorded_wheel(built, cuobjdump, engine):
    plan, state, record, _ = built
    runtime = plan.node("runtime").tag
    out = docker_run(engine, runtime, "python", "-c",
                     "import hashlib, cuda_ext_fixture as c; print(c.LIB_PATH); print(c.host_sum([1, 2, 3, 4]));"
                     "print(' '.join(c.compiled_archs())); print(hashlib.sha256(open(c.LIB_PATH, 'rb').read()).hexdigest())")
    so_path, host_sum, archs, so_sha = out.split()
    assert host_sum == "10"          # C7: the thrust host code compiled with CUDA 13 and runs
    assert archs == "120"
    elf = docker_run(engine, runtime, "/opt/cuobjdump/cuobjdump", "--list-elf", so_path, volumes={str(cuobjdump): "/opt/cuobjdump"})
    assert "sm_120" in elf, elf
    # the installed .so is the one inside the recorded wheel, whose sha256 matches the record
    (name, digest), = {n["name"]: n for n in record["nodes"]}["cuda-ext"]["wheels"].items()
    whl = state / plan.wheelhouse / name
    assert hashlib.sha256(whl.read_bytes()).hexdigest() == digest
    with zipfile.ZipFile(whl) as z:
        member = next(n for n in z.namelist() if n.endswith(".so"))
        assert hashlib.sha256(z.read(member)).hexdigest() == so_sha


def test_second_run_issues_no_docker_build(built, engine):
    plan, state, _, _ = built
    before = engine.builds_issued
    record = run_build(plan, state_dir=state, engine=engine, say=lambda s: None)
    assert record["docker_builds"] == 0 and engine.builds_issued == before
    assert {n["status"] for n in record["nodes"]} == {"skipped"}


def test_fresh_state_folder_dry_run_says_to_export_not_to_build(built, engine, tmp_path):
    """A wheels node whose image exists but whose wheels a fresh state folder lacks reads "to export" (no
    compile, no cost lines, no disk counted); with its wheels in the wheelhouse it reads "cached"."""
    from cudastack.build.executor import dry_run

    plan, state, _, _ = built
    fresh = dry_run(plan, state_dir=tmp_path / "fresh", engine=engine)
    node = fresh.split("] cuda-ext ")[1].split("\n[")[0]
    assert node.strip().startswith("kind wheels (source)  to export (its image exists") and "    units " not in node
    assert "to build" not in fresh and "about 0 GiB of disk needed" in fresh
    assert "] cuda-ext  kind wheels (source)  cached" in dry_run(plan, state_dir=state, engine=engine)


def test_failing_node_leaves_no_tag_no_wheel_and_the_rerun_resumes(built, engine, tmp_path):
    plan, state, _, _ = built
    recipes = tmp_path / "recipes"
    shutil.copytree(FIXTURES / "recipes", recipes)
    ext = recipes / "cuda-ext.yaml"
    d = yaml.safe_load(ext.read_text())
    d["toolchains"]["13.1"]["path"] = str((FIXTURES / "cuda_ext").resolve())
    d["toolchains"]["13.1"]["knobs"] = {"CUDA_EXT_ARCHS": "999"}          # nvcc: unsupported gpu architecture
    ext.write_text(yaml.safe_dump(d))
    bad = make_plan(recipes, "13.1", resources=host_resources(), prefix=TEST_PREFIX)
    wh = state / plan.wheelhouse
    files_before = sorted(p.name for p in wh.iterdir())
    manifest_before = (wh / "manifest.json").read_text()
    with pytest.raises(BuildError) as e:
        run_build(bad, state_dir=state, engine=engine, say=lambda s: None)
    msg = str(e.value)
    assert "cuda-ext" in msg and ".log" in msg and "failing step" in msg and "999" in msg
    assert not engine.exists(bad.node("cuda-ext").tag)
    assert not engine.exists(bad.node("runtime").tag)
    assert sorted(p.name for p in wh.iterdir()) == files_before
    assert (wh / "manifest.json").read_text() == manifest_before
    rec = json.loads((state / "records" / "latest-cu13.1.json").read_text())
    assert rec["status"] == "failed"
    assert [n["status"] for n in rec["nodes"]] == ["skipped", "failed", "not reached"]   # resumed from base
    good = run_build(plan, state_dir=state, engine=engine, say=lambda s: None)
    assert good["docker_builds"] == 0 and good["status"] == "ok"


def test_a_runtime_that_installed_other_wheels_than_the_wheelhouse_lists_is_built_again(built, engine, tmp_path):
    """A node's tag is keyed by its inputs, not by its parents' wheel bytes: a wheels node exported again with
    other bytes (a compile that is not bit-for-bit reproducible, once BuildKit's cache was pruned) must not leave
    the old runtime image in place. Here a second state folder holds the same wheel with other bytes (a zip
    comment): the runtime is built again and then records that wheel (label org.cudastack.wheels); back in the
    first state folder it is built again once more, and a rerun there is a no-op. Twin: the first folder's own
    rerun (test_second_run_issues_no_docker_build) keeps the runtime."""
    from cudastack.build.context import WHEELS_LABEL, runtime_wheels_digest
    from cudastack.build.wheelhouse import Wheelhouse

    plan, state, _, _ = built
    other = tmp_path / "state"
    shutil.copytree(state / plan.wheelhouse, other / plan.wheelhouse)
    wh = Wheelhouse(other / plan.wheelhouse)
    (name, _), = wh.entry("cuda-ext")["wheels"].items()
    with zipfile.ZipFile(wh.path / name, "a") as z:
        z.comment = b"exported again: other bytes, same wheel"
    manifest = json.loads((wh.path / "manifest.json").read_text())
    manifest["nodes"]["cuda-ext"]["wheels"][name] = sha256_file(wh.path / name)
    (wh.path / "manifest.json").write_text(json.dumps(manifest))
    runtime = plan.node("runtime")
    from cudastack.build.executor import dry_run
    planned = dry_run(plan, state_dir=other, engine=engine).split("] runtime ")[1].split("\n[")[0]
    assert "cached" not in planned.splitlines()[0], planned       # the plan and the disk check count it
    lines: list[str] = []
    record = run_build(plan, state_dir=other, engine=engine, say=lines.append)
    by = {n["name"]: n for n in record["nodes"]}
    assert [by[n]["status"] for n in ("base", "cuda-ext", "runtime")] == ["skipped", "skipped", "built"]
    assert any("runtime" in s and "installed other wheels than the wheelhouse lists now" in s for s in lines), lines
    assert engine.inspect(runtime.tag)["labels"][WHEELS_LABEL] == runtime_wheels_digest(wh, runtime)
    # the first folder's wheelhouse lists its own bytes again: built again there, then a no-op
    back = run_build(plan, state_dir=state, engine=engine, say=lambda s: None)
    assert {n["name"]: n["status"] for n in back["nodes"]}["runtime"] == "built"
    assert engine.inspect(runtime.tag)["labels"][WHEELS_LABEL] == runtime_wheels_digest(
        Wheelhouse(state / plan.wheelhouse), runtime)
    assert run_build(plan, state_dir=state, engine=engine, say=lambda s: None)["docker_builds"] == 0
