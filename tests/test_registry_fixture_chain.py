"""The issue's integration test on the project's small fixture chain (tests/fixtures/recipes: base-pip ->
cuda-ext (nvcc source build) -> runtime): lock, build locked (cudastack.build.executor with the lock's build args,
after the lock was verified against the plan), record the outputs, push the runtime image to a local
registry, delete the local image, pull it by digest and check the digest and image id.

Needs Docker with BuildKit, the docker-registry binary and PyPI (the lock resolves the CUDA toolkit wheels).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from cudastack import lock as L
from cudastack.registry import client as R
from cudastack.registry import digest as registry_digest
from registry_server import docker_config, registry_server  # noqa: F401

FIXTURE_RECIPES = Path(__file__).parent / "fixtures" / "recipes"
TEST_PREFIX = "cudastack-test"   # image repositories of the fixture chain, apart from the real stack's

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.network]


def fixture_plan_and_lock(engine, tmp_path):
    """The fixture chain's plan and its lock, resolved for real into ``tmp_path/lockfiles``: (plan, path, lock)."""
    from cudastack.plan.planner import make_plan

    plan = make_plan(FIXTURE_RECIPES, "13.1", resources=engine.resources(), prefix=TEST_PREFIX)
    path = tmp_path / "lockfiles" / "13.1.lock.yaml"
    return plan, path, L.lock_plan(plan, path, client=engine.client)


def test_fixture_chain_lock_build_push_pull(tmp_path, engine, registry_server, docker_config):
    from cudastack.build.executor import run_build

    plan, path, lock = fixture_plan_and_lock(engine, tmp_path)
    assert lock["nodes"]["base"]["os_image"]["image_id"].startswith("sha256:")
    assert lock["resolver"]["glibc"] == "2.36"          # asked of the bootstrapped bookworm image itself
    cuda = lock["nodes"]["base"]["installs"]["CUDA_PIP_SPECS"]["packages"]
    assert {"cuda-toolkit", "nvidia-cuda-nvcc"} <= {p["name"] for p in cuda}
    assert lock["nodes"]["cuda-ext"]["paths"][0]["sha256"]

    plan_tags = {n.name: n.tag for n in plan.nodes}
    L.prepare_locked_build(plan, path, client=engine.client)
    assert "CUDA_PIP_SPECS_LOCKED" in plan.node("base").build_args
    assert "nvidia-cuda-nvcc==" in plan.node("base").build_args["CUDA_PIP_SPECS_LOCKED"]
    # a locked build never reuses what an unlocked build tagged: every node gets its own locked tag
    assert all(plan.node(n).tag != tag for n, tag in plan_tags.items())
    assert plan.node("cuda-ext").build_args["PARENT_IMAGE"] == plan.node("base").tag
    record = run_build(plan, state_dir=tmp_path / "state", engine=engine, say=lambda s: None)
    assert record["status"] == "ok", record["error"]
    # every pip install step of the base ran with its locked requirements: BuildKit records the build args a
    # RUN used in the image history (the step's cache key), so this holds for cached builds too
    steps = [h["CreatedBy"] for h in engine.client.images.get(plan.node("base").tag).history()]
    for arg in ("VENV_PIP_SPECS_LOCKED", "CUDA_PIP_SPECS_LOCKED"):
        used = [s for s in steps if f"{arg}=# base" in s and "--require-hashes" in s]
        assert used and "--hash=sha256:" in used[0], f"no RUN step of the base used {arg}"
    L.record_build_outputs(path, record)
    runtime = plan.node("runtime")
    client = engine.client
    image_id = client.images.get(runtime.tag).id
    # the built image holds exactly the locked versions (venv and the CUDA toolkit prefix)
    assert L.check_image_against_lock(runtime.tag, L.load_lock(path), client=client) == []
    assert L.load_lock(path)["outputs"]["runtime"]["image_id"] == image_id

    pushed = L.push_locked(plan, path, f"{registry_server.host}/ci", client=client)["runtime"]
    assert L.load_lock(path)["pushed"]["runtime"]["reference"] == pushed.reference

    # delete the image under every name, pull it back by digest, verify, and give it its tag back
    client.images.remove(image_id, force=True)
    assert not [i for i in client.images.list() if i.id == image_id]
    try:
        image = L.pull_locked(path, client=client)
        assert image.id == image_id
        assert pushed.reference in image.attrs["RepoDigests"]
        assert registry_digest.resolve_digest(pushed.reference) == pushed.digest
    finally:
        try:
            client.images.get(pushed.reference).tag(*runtime.tag.rsplit(":", 1))
            client.images.remove(pushed.reference)        # drop the registry's name, keep the image
        except Exception:  # noqa: BLE001
            pass


def test_locked_build_stops_on_a_changed_hash(tmp_path, engine):
    """A lock whose sha256 for one package differs from the file on the index: the locked Docker build of the
    base fails in pip's hash-checking mode, the error names the package and the node, and the lockfile is
    byte for byte what it was. (The tampered hash stands in for a file re-uploaded upstream.)"""
    from cudastack.build.executor import run_build
    from cudastack.core.errors import LockError

    plan, path, _ = fixture_plan_and_lock(engine, tmp_path)

    def tamper(lock):
        for p in lock["nodes"]["base"]["installs"]["VENV_PIP_SPECS"]["packages"]:
            if p["name"] == "packaging":
                p["sha256"] = "0" * 64
    L.update_lock(path, tamper)
    before = path.read_bytes()
    # the locked build's own check finds it first, against the index's published hashes (C32) ...
    with pytest.raises(LockError) as early:
        L.prepare_locked_build(plan, path, client=engine.client)
    assert "packaging==25.0 (node base, installs.VENV_PIP_SPECS" in str(early.value)
    assert not plan.locked
    # ... and without that check, pip's hash-checking mode inside the Docker build refuses the file
    L.prepare_locked_build(plan, path, client=engine.client, check_hashes=False)
    record_state = tmp_path / "state"
    with pytest.raises(LockError) as err:
        run_build(plan, state_dir=record_state, engine=engine, say=lambda s: None)
    msg = str(err.value)
    assert "packaging==25.0" in msg and "Locked build of base" in msg and "0000000000000000" in msg
    assert "the lock and the index disagree on packaging==25.0" in msg
    assert path.read_bytes() == before
    assert not engine.exists(plan.node("base").tag)


def test_nvidia_base_is_locked_and_built_by_digest(tmp_path, engine, registry_server, docker_config):
    """The NVIDIA-base path end to end, with a loopback registry standing in for Docker Hub (unreachable
    here): our CUDA 13.1 pip base (it has nvcc 13.1, like nvidia/cuda:13.1.1-devel) is pushed as
    HOST/nvidia/cuda:13.1.1-devel; `lock` reads its digest from the registry (skopeo); the tag is then moved to an
    image without nvcc; the locked build still builds FROM the locked digest (base-nvidia checks nvcc's
    version, so building on the moved tag would fail)."""
    from cudastack.build.executor import run_build
    from cudastack.plan.planner import make_plan

    client = engine.client
    pip_plan = make_plan(FIXTURE_RECIPES, "13.1", resources=engine.resources(), prefix=TEST_PREFIX)
    pip_plan.nodes = pip_plan.nodes[:1]                                  # the pip base only
    run_build(pip_plan, state_dir=tmp_path / "state", engine=engine, say=lambda s: None)
    upstream = f"{registry_server.host}/nvidia/cuda:13.1.1-devel-fixture"
    try:
        _nvidia_base_by_digest(tmp_path, engine, client, pip_plan, upstream)
    finally:
        for name in (upstream, f"{upstream.rsplit(':', 1)[0]}@"):
            for image in client.images.list():
                for t in image.tags + (image.attrs.get("RepoDigests") or []):
                    if t.startswith(name):
                        client.images.remove(t)       # the registry's names only; the images keep their tags


def _nvidia_base_by_digest(tmp_path, engine, client, pip_plan, upstream):
    import shutil

    import yaml

    from cudastack.build.executor import run_build
    from cudastack.plan.planner import make_plan

    first = R.push_image(pip_plan.nodes[0].tag, upstream, client=client)

    recipes = tmp_path / "recipes"                                       # the toolchain and the base only
    recipes.mkdir()
    shutil.copy2(FIXTURE_RECIPES / "base.yaml", recipes)
    shutil.copy2(FIXTURE_RECIPES / "toolchains.yaml", recipes)
    tc_file = recipes / "toolchains.yaml"
    tc = yaml.safe_load(tc_file.read_text())
    tc["toolchains"]["13.1"]["bases"]["nvidia"] = {"image": upstream, "python": "3.11", "has_nvcc": True}
    tc_file.write_text(yaml.safe_dump(tc))
    plan = make_plan(recipes, "13.1", base="nvidia", resources=engine.resources(), prefix=TEST_PREFIX)
    assert [n.kind for n in plan.nodes] == ["base-nvidia"]
    assert plan.nodes[0].kind == "base-nvidia"
    path = tmp_path / "lockfiles" / "13.1.lock.yaml"
    lock = L.lock_plan(plan, path, client=client)
    rec = lock["nodes"]["base"]["base_image"]
    assert rec["digest"] == first.digest and rec["reference"] == first.reference

    # upstream moves the tag to another image (here: the bare OS image, no CUDA at all)
    moved = R.push_image("cudastack-test/debian:bookworm", upstream, client=client)
    assert moved.digest != first.digest
    L.prepare_locked_build(plan, path, client=client)
    assert plan.nodes[0].build_args["BASE_IMAGE"] == first.reference
    record = run_build(plan, state_dir=tmp_path / "state", engine=engine, say=lambda s: None)
    assert record["status"] == "ok", record["error"]
    log = Path(record["nodes"][0]["log"]).read_text() if record["nodes"][0]["log"] else ""
    assert record["nodes"][0]["status"] == "skipped" or f"FROM {first.reference}" in log
    out = client.containers.run(plan.nodes[0].tag, ["nvcc", "--version"], remove=True).decode()
    assert "release 13.1" in out
