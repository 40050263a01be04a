"""A fresh builder under ``--locked`` with a node cache: the pip base's OS image comes from the cache (its id
checked against the lock's), not from mmdebstrap, and the registry login is written into no lock.

The fixture chain (tests/fixtures/recipes) is locked for real, built with a cache on a loopback registry that asks
for a login, its outputs recorded into the lock; then the plan's images and the OS image's tag are removed from
the engine and the locked build is prepared and run again with the cache. Failing twins: a cache whose OS image
tag holds another image (refused, nothing tagged), and a cache without it (said; the caller would bootstrap).

Needs Docker with BuildKit, the docker-registry and htpasswd binaries and PyPI (the lock resolves for real).
"""
from __future__ import annotations

import base64
import io
import os

import pytest

from cudastack import lock as L
from cudastack.build.node_cache import NodeCache
from cudastack.plan.planner import make_plan
from cudastack.registry.cache_parents import os_image_target, pull_os_image
from cudastack.registry.client import push_image
from registry_server import auth_registry_server, docker_config  # noqa: F401
from test_node_cache import cleanup, empty_engine  # noqa: F401
from test_registry_fixture_chain import FIXTURE_RECIPES, TEST_PREFIX, fixture_plan_and_lock

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.network]


@pytest.fixture
def os_tag_kept(engine):
    """Keeps the fixture's OS image under a second name while a test removes its tag (other tests use it), and
    gives the tag back afterwards if the test left it missing."""
    tag = make_plan(FIXTURE_RECIPES, "13.1", resources=engine.resources(), prefix=TEST_PREFIX).nodes[0].build_args["OS_IMAGE"]
    image = engine.client.images.get(tag)
    keep = f"cudastack-test/keep-os:{os.urandom(4).hex()}"
    image.tag(*keep.split(":"))
    yield tag, image.id
    if not engine.exists(tag):
        engine.client.images.get(keep).tag(*tag.split(":"))
    engine.client.images.remove(keep)


def test_fresh_locked_builder_pulls_the_os_image_and_writes_no_login(tmp_path, engine, cleanup, os_tag_kept,  # noqa: F811
                                                                     auth_registry_server, docker_config):  # noqa: F811
    from cudastack.build.executor import run_build

    os_tag, os_id = os_tag_kept
    reg = auth_registry_server
    docker_config(reg.host, reg.username, reg.password)
    secrets = [reg.password, base64.b64encode(f"{reg.username}:{reg.password}".encode()).decode()]
    client = engine.client
    plan, path, lock = fixture_plan_and_lock(engine, tmp_path)
    assert lock["nodes"]["base"]["os_image"]["image_id"] == os_id
    cache = NodeCache.open(f"{reg.host}/ci", client)
    cache.lock = L.prepare_locked_build(plan, path, client=client, cache=cache)
    cleanup.append(plan)
    rec = run_build(plan, state_dir=tmp_path / "s1", engine=engine, cache=cache, say=lambda s: None)
    assert rec["status"] == "ok", rec["error"]
    base = rec["nodes"][0]["cache"]
    assert base["status"] == "pushed" and base["os_image"]["image_id"] == os_id, base
    assert base["os_image"]["target"] == os_image_target(cache, os_tag, os_id)
    L.record_build_outputs(path, rec)
    text = path.read_bytes()
    assert b"outputs:" in text
    for s in secrets:
        assert s.encode() not in text, "the registry login was written into the lock"

    # a fresh builder: none of the plan's images and no OS image tag on the engine
    empty_engine(client, plan)
    client.images.remove(os_tag)
    assert not engine.exists(os_tag)
    said: list[str] = []
    plan2 = make_plan(FIXTURE_RECIPES, "13.1", resources=engine.resources(), prefix=TEST_PREFIX)
    cache2 = NodeCache.open(f"{reg.host}/ci", client, read_only=True)
    cache2.lock = L.prepare_locked_build(plan2, path, client=client, say=said.append, cache=cache2)
    assert client.images.get(os_tag).id == os_id
    assert any("pulled from the node cache" in s for s in said), said
    assert not any("making it again" in s for s in said), "mmdebstrap ran although the cache holds the OS image"
    rec2 = run_build(plan2, state_dir=tmp_path / "s2", engine=engine, cache=cache2, say=said.append)
    assert [n["status"] for n in rec2["nodes"]] == ["pulled"] * len(plan2.nodes)
    assert rec2["nodes"][-1]["image_id"] == rec["nodes"][-1]["image_id"]
    L.record_build_outputs(path, rec2)
    for s in secrets:
        assert s.encode() not in path.read_bytes()
        assert s not in "\n".join(said)


def test_an_os_image_of_another_id_in_the_cache_is_refused(tmp_path, engine, os_tag_kept,  # noqa: F811
                                                           auth_registry_server, docker_config):  # noqa: F811
    os_tag, os_id = os_tag_kept
    reg = auth_registry_server
    docker_config(reg.host, reg.username, reg.password)
    client = engine.client
    cache = NodeCache.open(f"{reg.host}/ci", client)
    said: list[str] = []
    # not in the cache: said, nothing pulled
    client.images.remove(os_tag)
    assert pull_os_image(cache, os_tag, os_id, said.append) is False
    assert "has no OS image" in said[-1] and not engine.exists(os_tag)

    # another image under the name of the locked id: refused, the tag never set, no name of it left behind
    kept = client.images.get(os_id).tags[0]      # the name the fixture keeps while the tag is removed
    dockerfile = io.BytesIO(f"FROM {kept}\nLABEL nonce={os.urandom(4).hex()}\n".encode())
    other = client.images.build(fileobj=dockerfile, rm=True)[0]
    target = os_image_target(cache, os_tag, os_id)
    push_image(other.id, target, client=client)
    client.images.remove(target)
    assert pull_os_image(cache, os_tag, os_id, said.append) is False
    assert "refused the node cache's OS image" in said[-1] and other.id in said[-1] and os_id in said[-1]
    assert not engine.exists(os_tag)
    assert not [i for i in client.images.list() if any(d.startswith(target.rsplit(":", 1)[0])
                                                       for d in i.attrs.get("RepoDigests") or [])]
    assert not [i for i in client.images.list() if i.id == other.id]       # its only name was the pulled one

