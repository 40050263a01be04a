"""The issue's integration test on the project's small fixture chain (tests/fixtures/recipes: base-pip ->
cuda-ext (nvcc source build) -> runtime): lock, build locked (cudastack.build with the lock's build args,
after the lock was verified against the plan), record the outputs, push the runtime image to a local
registry, delete the local image, pull it by digest and check the digest and image id.

Needs Docker with BuildKit, the docker-registry binary and PyPI (the lock resolves the CUDA toolkit wheels).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from cudastack import lock as L
from cudastack import registry as R
from registry_server import docker_config, registry_server  # noqa: F401

FIXTURE_RECIPES = Path(__file__).parent / "fixtures" / "recipes"

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.network]


def test_fixture_chain_lock_build_push_pull(tmp_path, registry_server, docker_config):
    docker = pytest.importorskip("docker")
    from cudastack.build import run_build
    from cudastack.engine import Engine
    from cudastack.errors import EnvironmentError_
    from cudastack.plan import make_plan

    try:
        engine = Engine.connect()
    except EnvironmentError_ as exc:
        pytest.skip(str(exc))
    plan = make_plan(FIXTURE_RECIPES, "13.1", resources=engine.resources())
    path = tmp_path / "lockfiles" / "13.1.lock.yaml"
    lock = L.lock_plan(plan, path, client=docker.from_env())
    assert lock["nodes"]["base"]["os_image"]["image_id"].startswith("sha256:")
    assert lock["resolver"]["glibc"] == "2.36"          # asked of the bootstrapped bookworm image itself
    cuda = lock["nodes"]["base"]["installs"]["CUDA_PIP_SPECS"]["packages"]
    assert {"cuda-toolkit", "nvidia-cuda-nvcc"} <= {p["name"] for p in cuda}
    assert lock["nodes"]["cuda-ext"]["paths"][0]["sha256"]

    L.prepare_locked_build(plan, path, client=docker.from_env())
    assert "CUDA_PIP_SPECS_LOCKED" in plan.node("base").build_args
    record = run_build(plan, state_dir=tmp_path / "state", engine=engine, say=lambda s: None)
    L.record_build_outputs(path, record)
    runtime = plan.node("runtime")
    client = docker.from_env()
    image_id = client.images.get(runtime.tag).id
    # the built image holds exactly the locked versions (venv and the CUDA toolkit prefix)
    assert L.check_image_against_lock(runtime.tag, L.load_lock(path), client=client) == []
    assert L.load_lock(path)["outputs"]["runtime"]["image_id"] == image_id

    pushed = R.push_locked(plan, path, f"{registry_server.host}/ci", client=client)["runtime"]
    assert L.load_lock(path)["pushed"]["runtime"]["reference"] == pushed.reference

    # delete the image under every name, pull it back by digest, verify, and give it its tag back
    client.images.remove(image_id, force=True)
    assert not [i for i in client.images.list() if i.id == image_id]
    try:
        image = R.pull_locked(path, client=client)
        assert image.id == image_id
        assert pushed.reference in image.attrs["RepoDigests"]
        assert R.RegistryClient(registry_server.host).manifest_digest(
            R.parse_reference(pushed.reference).repository, pushed.digest) == pushed.digest
    finally:
        try:
            client.images.get(pushed.reference).tag(*runtime.tag.rsplit(":", 1))
            client.images.remove(pushed.reference)        # drop the registry's name, keep the image
        except Exception:  # noqa: BLE001
            pass
