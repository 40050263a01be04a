"""Remote builders share the registry node cache through the node tags, for real: a second dockerd (its own socket,
data root and bridge, from tests/test_builder_integration.py) behind a docker context is the big builder, which
buildx lists with the docker driver; a Debian docker-registry on a free loopback port is the cache; the chain is
tests/test_node_cache.py's three small nodes, its wheels node marked as one that compiles so that
``--builder-nodes source`` sends it.

1. The wheels node is built on the big builder; its wheel comes back into this run's wheelhouse and the builder
   itself pushes the node's ``builder`` stage (which holds /wheels) to the node's cache tag; the base and the
   runtime are built here and pushed from here.
2. A second builder (buildx's ``default``, this engine's docker driver) on an emptied engine with an empty state
   folder gets every node from the cache: no docker build is issued anywhere, the wheel has the same sha256.
3. Under a lock: the wheels node built on the big builder is recorded by where it was built and the digest that
   builder pushed, not by its marker's id (made on this engine, pullable nowhere), so a locked second builder gets
   it from the cache; a lock holding the marker's id, or another digest, refuses it, naming the node.
4. The parent check leaves out the nodes the cache serves: the big builder's engine lacks the wheels node's parent,
   which is an error when the node would be sent there and none when the cache serves it.
5. A node sent to the big builder whose parent only the cache holds: the parent is pulled here, and the builder is
   given it as ``PARENT_IMAGE=HOST/PREFIX/<repo>@sha256:...``, which its engine pulls from the registry itself.

Needs root, dockerd, the docker buildx plugin (CUDASTACK_TEST_BUILDX names a docker-buildx binary where the CLI has
none) and docker-registry.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess

import pytest

from cudastack.core.errors import LockError, UsageError
from cudastack.lock.outputs import apply_build_outputs
from registry_server import registry_server  # noqa: F401
from test_builder_integration import buildx_config, second_dockerd, second_engine  # noqa: F401
from test_node_cache import empty_engine, small_plan

pytestmark = [pytest.mark.docker, pytest.mark.registry, pytest.mark.network]


def _on(sock, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "-H", f"unix://{sock}", *args], capture_output=True, text=True, timeout=300)


def test_a_node_built_on_a_builder_fills_the_cache_and_a_second_builder_pulls_it(second_engine, registry_server,  # noqa: F811, PLR0915
                                                                                tmp_path):
    from cudastack.build.executor import run_build
    from cudastack.build.builders import check_parents, inspect_builder
    from cudastack.build.engine import Engine
    from cudastack.build.node_cache import NodeCache

    ctx, sock = second_engine
    big = inspect_builder(ctx)
    assert big.driver == "docker" and big.endpoint == ctx
    engine = Engine.connect()
    assert engine.buildkit.mode == "buildx"
    plan = small_plan(tmp_path / "chain", os.urandom(6).hex())
    base, wnode = plan.node("base"), plan.node("wheels")
    wnode.method = "source"                         # a node that compiles: --builder-nodes source sends it
    cache = NodeCache.open(f"{registry_server.host}/ci", engine.client)
    try:
        # the big builder's engine needs the wheels node's parent: build the base here, load it there
        run_build(dataclasses.replace(plan, nodes=[base]), state_dir=tmp_path / "s0", engine=engine,
                  say=lambda s: None)
        save = subprocess.Popen(["docker", "save", base.tag], stdout=subprocess.PIPE)
        subprocess.run(["docker", "-H", f"unix://{sock}", "load"], stdin=save.stdout, check=True, capture_output=True)
        assert save.wait() == 0
        assert "parents present" in check_parents(big, plan, "source", docker=engine.buildkit.docker)[0]

        lines: list[str] = []
        first = run_build(plan, state_dir=tmp_path / "s1", engine=engine, cache=cache, builder=big,
                          builder_nodes="source", say=lines.append)
        by = {n["name"]: n for n in first["nodes"]}
        assert [by[n]["status"] for n in ("base", "wheels", "runtime")] == ["skipped", "built", "built"]
        assert by["wheels"]["builder"] == ctx and "builder" not in by["runtime"]
        assert by["wheels"]["cache"]["status"] == "pushed" and by["wheels"]["cache"]["by"] == ctx, by["wheels"]
        assert by["wheels"]["cache"]["digest"] == cache.probe(wnode)             # the registry serves it
        assert [by[n]["cache"]["status"] for n in ("base", "runtime")] == ["pushed", "pushed"]
        assert first["cache_failures"] == []
        assert any(f"pushed to the node cache as {by['wheels']['cache']['reference']} by builder {ctx}" in s
                   for s in lines)
        # there: the stage it pushed and nothing left under the cache's name; here: the marker naming the builder
        assert _on(sock, "image", "inspect", cache.target(wnode)).returncode != 0
        assert engine.client.images.get(wnode.tag).labels["org.cudastack.builder"] == ctx
        (wheel, digest), = by["wheels"]["wheels"].items()

        # what a locked build records: no image id for the wheels node (its marker is made here and names nothing
        # another machine can pull), the builder and the digest it pushed; the others' image ids as built here
        lock = {"nodes": {n.name: {} for n in plan.nodes}}
        apply_build_outputs(lock, first)
        wout = lock["outputs"]["wheels"]
        assert "image_id" not in wout and wout["built_on"] == ctx, wout
        assert wout["cache_digest"] == by["wheels"]["cache"]["digest"]
        assert wout["wheels"] == [{"filename": wheel, "sha256": digest}]
        assert lock["outputs"]["runtime"]["image_id"] == by["runtime"]["image_id"]
        small = inspect_builder("default")

        def locked_pull(lock_dict: dict, state: str):
            empty_engine(engine.client, plan)
            cache.lock = lock_dict
            return run_build(plan, state_dir=tmp_path / state, engine=engine, cache=cache, builder=small,
                             builder_nodes="source", say=lambda s: None)

        # failing twins: the marker's id in the lock (what was recorded before), a cache digest edited in the lock
        marker = {**lock, "outputs": {**lock["outputs"], "wheels": {**wout, "image_id": by["wheels"]["image_id"]}}}
        with pytest.raises(LockError, match=r"The node cache's wheels .* its image id is sha256:"):
            locked_pull(marker, "s-marker")
        edited = {**lock, "outputs": {**lock["outputs"], "wheels": {**wout, "cache_digest": "sha256:" + "2" * 64}}}
        with pytest.raises(LockError, match=r"The node cache's wheels .*outputs.wheels.cache_digest is sha256:2{64} "
                                            rf"\(what builder {ctx} pushed\)"):
            locked_pull(edited, "s-edited")
        assert not (tmp_path / "s-edited" / plan.wheelhouse / wheel).exists()

        # a second builder, on an emptied engine with an empty state folder, under the lock: every node comes from
        # the cache
        builds = engine.builds_issued
        second = locked_pull(lock, "s2")
        assert [n["status"] for n in second["nodes"]] == ["pulled"] * 3, second["nodes"]
        assert second["docker_builds"] == 0 and engine.builds_issued == builds
        sec = {n["name"]: n for n in second["nodes"]}
        assert sec["wheels"]["wheels"] == {wheel: digest} and "builder" not in sec["wheels"]
        assert (tmp_path / "s2" / plan.wheelhouse / wheel).is_file()
        assert sec["wheels"]["cache"]["digest"] == by["wheels"]["cache"]["digest"]

        # the parent check: a node the cache serves is not sent, so its parent need not be on the builder
        empty_engine(engine.client, plan)
        assert _on(sock, "image", "rm", "-f", base.tag).returncode == 0
        with pytest.raises(UsageError, match="does not hold the parent image"):
            check_parents(big, plan, "source", docker=engine.buildkit.docker)
        note = check_parents(big, plan, "source", docker=engine.buildkit.docker, served={"wheels"})
        assert note == [f"builder {ctx}: no node of this plan is sent (--builder-nodes source)"]

        # a sent node whose parent only the cache holds: the builder gets the parent by digest and pulls it itself
        new = {n: dataclasses.replace(plan.node(n), hash=h, tag=f"cudastack-test/cache-{n}:{h[:16]}")
               for n, h in (("wheels", os.urandom(32).hex()), ("runtime", os.urandom(32).hex()))}
        plan5 = dataclasses.replace(plan, nodes=[base, new["wheels"], new["runtime"]])
        assert cache.probe(new["wheels"]) is None and cache.probe(base)
        note = check_parents(big, plan5, "source", docker=engine.buildkit.docker, served={"base"}, pullable={"base"})
        assert note[0].endswith("base pulled there from the node cache by digest"), note
        lines = []
        fifth = run_build(plan5, state_dir=tmp_path / "s5", engine=engine, cache=cache, builder=big,
                          builder_nodes="source", say=lines.append)
        f5 = {n["name"]: n for n in fifth["nodes"]}
        assert [f5[n]["status"] for n in ("base", "wheels", "runtime")] == ["pulled", "built", "built"], fifth["error"]
        assert f5["wheels"]["builder"] == ctx and f5["wheels"]["parent_from_cache"] == f5["base"]["cache"]["reference"]
        assert "@sha256:" in f5["wheels"]["parent_from_cache"]
        # the builder's engine never held the parent's local tag: BuildKit there took the FROM from the registry
        assert _on(sock, "image", "inspect", base.tag).returncode != 0
        with pytest.raises(UsageError, match="does not hold the parent image"):     # without the cache: refused
            check_parents(big, plan5, "source", docker=engine.buildkit.docker)
        assert any("its parent comes to builder" in line for line in lines)
        empty_engine(engine.client, plan5)
    finally:
        empty_engine(engine.client, plan)
        _on(sock, "image", "rm", "-f", base.tag)
