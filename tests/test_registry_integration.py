"""Lock -> locked build -> push -> delete -> pull by digest -> verify, with a real registry and engine, and the
failure cases (registry down, push refused, stale lock, image not the locked one): the lockfile stays byte
for byte in each.

The small chain: one image node whose pip install (tinyapp + its dependency) comes from a local PEP 503 index;
the locked build installs it with pip's hash-checking mode and the engine builds an image from the result.
"""
from __future__ import annotations

import io
import os
import tarfile

import pytest

from cudastack import lock as L
from cudastack.registry import client as R
from cudastack.registry import digest as registry_digest
from cudastack.core.errors import LockError, RegistryError, UsageError
from cudastack.plan.model import Node, Plan
from lock_support import TARGET, tiny_index
from registry_server import auth_registry_server, docker_config, registry_server  # noqa: F401

pytestmark = [pytest.mark.docker, pytest.mark.registry]


@pytest.fixture
def engine(docker_engine_scratch):
    return docker_engine_scratch


def chain(index_url: str, spec: str = "tinyapp==1.0") -> Plan:
    tag = f"cudastack-test/tiny-app:{os.urandom(6).hex()}"
    node = Node("runtime", "runtime", "images/runtime.Dockerfile", [], {"PIP_SPECS": spec, "PIP_INDEX_URL": index_url},
                hash=os.urandom(32).hex(), tag=tag)
    return Plan("9.9", "9.9.0", ["12.0"], "pip", [node], "wheelhouse/cu9.9")


def locked_build(client, lock: dict, plan: Plan, workdir) -> str:
    """The small chain's locked build: pip installs the node's closure in hash-checking mode, the engine
    packs it into an image (FROM scratch). Returns the image id."""
    site = workdir / "site"
    L.install_locked(lock, "runtime", "PIP_SPECS", target_dir=site)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(site, arcname="site")
        df = b"FROM scratch\nCOPY site /opt/site\n"
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(df)
        tar.addfile(info, io.BytesIO(df))
    buf.seek(0)
    image, _ = client.images.build(fileobj=buf, custom_context=True, tag=plan.nodes[0].tag, rm=True)
    return image.id


@pytest.fixture
def locked_chain(tmp_path, engine):
    client, made = engine
    index = tiny_index(tmp_path / "idx")
    plan = chain(index)
    path = tmp_path / "lockfiles" / "9.9.lock.yaml"
    lock = L.lock_plan(plan, path, target=TARGET)
    L.verify_plan_against_lock(plan, L.load_lock(path))
    image_id = locked_build(client, lock, plan, tmp_path)
    made.append(plan.nodes[0].tag)
    L.record_outputs(path, "runtime", image_id=image_id, tag=plan.nodes[0].tag)
    return client, made, plan, path, image_id, index


def test_lock_build_push_delete_pull_verify(locked_chain, registry_server, docker_config):
    client, made, plan, path, image_id, _ = locked_chain
    pushed = L.push_locked(plan, path, f"{registry_server.host}/ci", client=client)["runtime"]
    lock = L.load_lock(path)
    rec = lock["pushed"]["runtime"]
    assert rec["reference"] == pushed.reference == f"{registry_server.host}/ci/tiny-app@{pushed.digest}"
    assert rec["enroot"] == f"{registry_server.host}#ci/tiny-app@{pushed.digest}"
    assert rec["image_id"] == lock["outputs"]["runtime"]["image_id"] == image_id
    made.append(rec["reference"])
    made.append(R.push_target(plan.nodes[0].tag, f"{registry_server.host}/ci"))

    # delete the local image under every name, so the pull must fetch it
    client.images.remove(image_id, force=True)
    assert not [i for i in client.images.list() if i.id == image_id]

    image = L.pull_locked(path, client=client)
    assert image.id == image_id
    assert rec["reference"] in image.attrs["RepoDigests"]
    assert registry_digest.resolve_digest(rec["reference"]) == rec["digest"]
    # the pulled image holds the hash-checked packages
    assert any(m.startswith("opt") for m in _layer_paths(client, image))

    # C47 on the real push record: the digest alone edited is refused before the pull, naming the field
    import yaml
    data = yaml.safe_load(path.read_text())
    data["pushed"]["runtime"]["digest"] = "sha256:" + "0" * 64
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(LockError, match="pushed.runtime.digest"):
        L.pull_locked(path, client=client)


def _layer_paths(client, image) -> list[str]:
    data = b"".join(client.api.get_image(image.id))
    names = []
    with tarfile.open(fileobj=io.BytesIO(data)) as outer:
        for m in outer.getmembers():
            if m.name.endswith("layer.tar") or m.name.startswith("blobs/"):
                f = outer.extractfile(m)
                if f is None:
                    continue
                try:
                    with tarfile.open(fileobj=io.BytesIO(f.read())) as layer:
                        names += layer.getnames()
                except tarfile.TarError:
                    continue
    return names


def test_registry_down_leaves_lock(locked_chain, registry_server, docker_config):
    client, made, plan, path, _, _ = locked_chain
    before = path.read_bytes()
    host = registry_server.host
    registry_server.stop()
    with pytest.raises(RegistryError, match="does not answer"):
        L.push_locked(plan, path, f"{host}/ci", client=client)
    assert path.read_bytes() == before


def test_push_refused_wrong_credentials_leaves_lock(locked_chain, auth_registry_server, docker_config):
    client, made, plan, path, _, _ = locked_chain
    from cudastack.core.docker_engine import docker_client
    before = path.read_bytes()
    host = auth_registry_server.host
    made.append(R.push_target(plan.nodes[0].tag, f"{host}/ci"))
    docker_config(host, auth_registry_server.username, "not-the-password")
    with pytest.raises(RegistryError, match="refused the push"):
        L.push_locked(plan, path, f"{host}/ci", client=docker_client())
    assert path.read_bytes() == before

    # with the right credentials from the credential store it works, and no credential lands in the lock
    docker_config(host, auth_registry_server.username, auth_registry_server.password)
    pushed = L.push_locked(plan, path, f"{host}/ci", client=docker_client())["runtime"]
    text = path.read_text()
    assert pushed.reference in text
    assert auth_registry_server.password not in text and auth_registry_server.username not in text


def test_stale_lock_refuses_push_and_names_entry(locked_chain, registry_server, docker_config):
    client, made, plan, path, _, index = locked_chain
    before = path.read_bytes()
    newer = chain(index, spec="tinyapp==1.0 tinyext==0.1")
    newer.nodes[0].tag = plan.nodes[0].tag
    with pytest.raises(LockError) as exc:
        L.push_locked(newer, path, f"{registry_server.host}/ci", client=client)
    assert "nodes.runtime.installs.PIP_SPECS.requested" in str(exc.value)
    assert "invoke lock --cuda 9.9" in str(exc.value)
    assert path.read_bytes() == before


def test_image_not_the_locked_build_is_refused(locked_chain, registry_server, docker_config):
    client, made, plan, path, image_id, _ = locked_chain
    before = path.read_bytes()
    # another image under the node's tag (e.g. an unlocked rebuild)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(32)
        info = tarfile.TarInfo("other")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    client.api.import_image_from_data(buf.getvalue(), repository=plan.nodes[0].tag.split(":")[0],
                                      tag=plan.nodes[0].tag.split(":")[1])
    made.append(image_id)
    with pytest.raises(UsageError, match="locked build recorded"):
        L.push_locked(plan, path, f"{registry_server.host}/ci", client=client)
    assert path.read_bytes() == before


def test_pull_without_push_record(locked_chain):
    client, made, plan, path, _, _ = locked_chain
    before = path.read_bytes()
    with pytest.raises(LockError, match="records no push"):
        L.pull_locked(path, client=client)
    assert path.read_bytes() == before
