"""The registry node cache (cudastack.build.node_cache) for real: Debian's docker-registry on loopback, the live Docker
engine, BuildKit builds of a three-node chain small enough to build in seconds (an image node, a wheels node whose
builder stage keeps its wheel in /wheels as images/wheels.Dockerfile does, and a runtime that copies the
wheelhouse), each node labelled and tagged by run_build exactly as a real plan's.

* a build fills the cache; an emptied engine with an empty state folder then pulls every node (no docker build),
  the wheel comes back into the wheelhouse with the same sha256, and the dry run says where each node is;
* faults: the registry unreachable at the start (one paragraph, before any work; --cache-optional warns and
  builds), the registry killed while a layer downloads (the node is built instead, nothing half-written in the
  wheelhouse), a read-only registry that refuses every push (the build stands, the failures are reported), a
  login that appears nowhere in the record, the logs or what was said;
* under a lock, a pulled node whose image id or wheel sha256 differs from the lock is refused, naming the node.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from cudastack.core.errors import LockError, RegistryError, UsageError
from cudastack.build.node_cache import ENV_VAR, NodeCache, cache_prefix
from registry_server import (REGISTRY_BIN, _free_port, auth_registry_server, docker_config,  # noqa: F401
                             registry_server, start_registry)

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.docker, pytest.mark.registry]


# ------------------------------------------------------------------------------------------ the small chain
def _wheel(path: Path, payload: bytes) -> Path:
    """A wheel file (a zip with a module and a RECORD-less dist-info; the wheelhouse only reads names and bytes)."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("tinycache/__init__.py", "")
        z.writestr("tinycache/blob.bin", payload)
        z.writestr("tinycache-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinycache\nVersion: 0.1\n")
    return path


def small_plan(tmp: Path, nonce: str, *, wheel_bytes: int = 4096):
    """A BuildPlan of three nodes (base: image, wheels, runtime) whose hashes carry ``nonce``; its Dockerfiles
    and contexts live under ``tmp``."""
    from cudastack.plan.planner import BuildPlan, PlannedNode

    files, whl = tmp / "files", tmp / "whl"
    files.mkdir(parents=True, exist_ok=True)
    whl.mkdir(exist_ok=True)
    (files / "payload").write_text(f"base {nonce}\n")
    _wheel(whl / "tinycache-0.1-py3-none-any.whl", os.urandom(wheel_bytes))
    (tmp / "base.Dockerfile").write_text("FROM scratch\nCOPY files/payload /payload\n")
    (tmp / "wheels.Dockerfile").write_text("ARG PARENT_IMAGE\nFROM ${PARENT_IMAGE} AS builder\nCOPY whl/ /wheels/\n"
                                           "FROM scratch AS wheels\nCOPY --from=builder /wheels/ /\n")
    (tmp / "runtime.Dockerfile").write_text("ARG PARENT_IMAGE\nFROM ${PARENT_IMAGE}\nARG WHEEL_NAMES\n"
                                            "COPY wheelhouse/ /wheelhouse/\n")

    def node(name, kind, parents, context):
        h = hashlib.sha256(f"{nonce}/{name}".encode()).hexdigest()
        return PlannedNode(name=name, kind=kind, dockerfile=str(tmp / f"{name}.Dockerfile"), parents=parents,
                           build_args={}, hash=h, tag=f"cudastack-test/cache-{name}:{h[:16]}", context=context)

    nodes = [node("base", "image", [], {"files": str(files)}),
             node("wheels", "wheels", ["base"], {"whl": str(whl)}),
             node("runtime", "runtime", ["base", "wheels"], {})]
    for n in nodes[1:]:
        n.build_args["PARENT_IMAGE"] = nodes[0].tag
    nodes[2].build_args["WHEEL_NAMES"] = ""
    return BuildPlan(toolchain="cachetest", cuda_version="0", target_archs=["12.0"], base_kind="image", nodes=nodes,
                     wheelhouse="wheelhouse/cachetest")


def empty_engine(client, plan) -> None:
    """Remove every name of every node's image (tags and the registry digests pulls leave): the engine then holds
    none of the plan, as on a fresh builder."""
    for n in plan.nodes:
        try:
            img = client.images.get(n.tag)
        except Exception:  # noqa: BLE001 - not there
            continue
        for ref in list(img.tags) + list(img.attrs.get("RepoDigests") or []):
            try:
                client.images.remove(ref, force=True)
            except Exception:  # noqa: BLE001
                pass


@pytest.fixture
def cleanup(engine):
    plans: list = []
    yield plans
    for p in plans:
        empty_engine(engine.client, p)


def _quiet(lines: list[str]):
    return lines.append


# ------------------------------------------------------------------------------------------ pure parts
def test_cache_prefix_from_flag_or_environment_and_a_login_is_never_echoed():
    assert cache_prefix("127.0.0.1:5000/ci/", environ={}) == "127.0.0.1:5000/ci"
    assert cache_prefix(None, environ={ENV_VAR: "reg.example.com/team"}) == "reg.example.com/team"
    assert cache_prefix("127.0.0.1:5000/a", environ={ENV_VAR: "reg.example.com/b"}) == "127.0.0.1:5000/a"
    assert cache_prefix(None, environ={}) == ""
    for bad in ("ci-user:s3cret-pw@127.0.0.1:5000/ci", "https://ci-user:s3cret-pw@127.0.0.1:5000/ci"):
        with pytest.raises(UsageError) as exc:
            cache_prefix(bad, environ={})
        assert "s3cret-pw" not in str(exc.value) and "docker login 127.0.0.1:5000" in str(exc.value)
    with pytest.raises(UsageError, match=ENV_VAR):
        cache_prefix(None, environ={ENV_VAR: "justaname"})


def test_dry_run_text_names_each_state(tmp_path):
    from cudastack.plan.render import render_plan

    plan = small_plan(tmp_path, "render")
    text = render_plan(plan, {"base": True, "wheels": False, "runtime": False},
                       remote={"wheels": "sha256:" + "ab" * 32, "runtime": None}, cache_prefix="127.0.0.1:1/ci")
    assert "] base  kind image  cached here" in text
    assert f"] wheels  kind wheels  in the registry cache (sha256:{'ab' * 32}" in text
    assert "] runtime  kind runtime  to build" in text
    assert "Node cache: 127.0.0.1:1/ci" in text and "1 of 3 nodes cached here, 1 in the registry cache" in text


# ------------------------------------------------------------------------------------------ fill, then serve
def test_a_build_fills_the_cache_and_an_emptied_engine_pulls_every_node(tmp_path, engine, cleanup,
                                                                       registry_server, docker_config):  # noqa: F811
    from cudastack.build.executor import dry_run, run_build

    client = engine.client
    plan = small_plan(tmp_path / "chain", os.urandom(6).hex())
    cleanup.append(plan)
    prefix = f"{registry_server.host}/ci"
    cache = NodeCache.open(prefix, client)
    assert "] base  kind image  to build" in dry_run(plan, state_dir=tmp_path / "s1", engine=engine, cache=cache)
    lines: list[str] = []
    first = run_build(plan, state_dir=tmp_path / "s1", engine=engine, cache=cache, say=_quiet(lines))
    assert first["status"] == "ok" and [n["status"] for n in first["nodes"]] == ["built"] * 3
    assert [n["cache"]["status"] for n in first["nodes"]] == ["pushed"] * 3
    assert first["cache_failures"] == []
    # the push leaves no registry name behind in the engine: only the node's own tag
    assert all(client.images.get(n.tag).tags == [n.tag] for n in plan.nodes)
    ids = {n["name"]: n["image_id"] for n in first["nodes"]}
    wheels = first["nodes"][1]["wheels"]

    empty_engine(client, plan)
    assert not any(engine.exists(n.tag) for n in plan.nodes)
    text = dry_run(plan, state_dir=tmp_path / "s2", engine=engine, cache=cache)
    for n in first["nodes"]:
        assert f"] {n['name']}  kind {n['kind']}  in the registry cache ({n['cache']['digest']}" in text, text
    assert "0 of 3 nodes cached here, 3 in the registry cache" in text

    builds = engine.builds_issued
    second = run_build(plan, state_dir=tmp_path / "s2", engine=engine, cache=cache, say=_quiet(lines))
    assert second["status"] == "ok" and [n["status"] for n in second["nodes"]] == ["pulled"] * 3
    assert second["docker_builds"] == 0 and engine.builds_issued == builds
    assert {n["name"]: n["image_id"] for n in second["nodes"]} == ids          # the very images built before
    wh = tmp_path / "s2" / plan.wheelhouse
    assert second["nodes"][1]["wheels"] == wheels
    assert {p.name for p in wh.iterdir()} == set(wheels) | {"manifest.json"}
    assert hashlib.sha256((wh / next(iter(wheels))).read_bytes()).hexdigest() == next(iter(wheels.values()))
    assert not list(wh.parent.glob(".export-*"))
    assert "cached here" in dry_run(plan, state_dir=tmp_path / "s2", engine=engine, cache=cache)
    third = run_build(plan, state_dir=tmp_path / "s2", engine=engine, cache=cache, say=_quiet(lines))
    assert {n["status"] for n in third["nodes"]} == {"skipped"} and third["docker_builds"] == 0


def test_read_only_cache_pulls_but_never_pushes(tmp_path, engine, cleanup, registry_server, docker_config):  # noqa: F811
    from cudastack.build.executor import run_build

    plan = small_plan(tmp_path / "chain", os.urandom(6).hex())
    cleanup.append(plan)
    cache = NodeCache.open(f"{registry_server.host}/ci", engine.client, read_only=True)
    rec = run_build(plan, state_dir=tmp_path / "s", engine=engine, cache=cache, say=lambda s: None)
    assert [n["status"] for n in rec["nodes"]] == ["built"] * 3 and not any("cache" in n for n in rec["nodes"])
    assert all(cache.probe(n) is None for n in plan.nodes)


# ------------------------------------------------------------------------------------------ faults
def test_registry_unreachable_at_start_is_one_paragraph_before_any_work(tmp_path, engine):
    dead = f"127.0.0.1:{_free_port()}/ci"
    with pytest.raises(RegistryError) as exc:
        NodeCache.open(dead, engine.client)
    msg = str(exc.value)
    assert exc.value.exit_code == 8 and "\n" not in msg
    assert f"The node cache {dead}" in msg and "does not answer" in msg and "--cache-optional" in msg
    said: list[str] = []
    assert NodeCache.open(dead, engine.client, optional=True, say=said.append) is None
    assert said and said[0].startswith("warning: the node cache") and "Building without it" in said[0]

    # through invoke: exit 8 before any work (no record, no wheelhouse, no bootstrap), and a warning with
    # --cache-optional (a dry run: the plan is printed as without a cache)
    state = tmp_path / "state"
    args = [sys.executable, "-m", "invoke", "-r", str(ROOT), "build", "--cuda", "13.1", "--recipes",
            str(ROOT / "tests" / "fixtures" / "recipes"), "--prefix", "cudastack-test", "--state-dir", str(state)]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'validate'}")
    env.pop(ENV_VAR, None)
    p = subprocess.run(args + ["--cache", dead], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 8, p.stderr
    assert "The node cache" in p.stderr and "Nothing was built or pulled" in p.stderr
    assert not state.exists()
    p = subprocess.run(args + ["--dry-run", "--cache-optional"], capture_output=True, text=True,
                       env=dict(env, **{ENV_VAR: dead}), timeout=300)
    assert p.returncode == 0, p.stderr
    assert "warning: the node cache" in p.stderr and "] base  kind base-pip" in p.stdout
    assert "Node cache:" not in p.stdout


def _big_layer_image(client, name: str, node, mib: int = 192) -> None:
    """``docker import`` of a rootfs whose /wheels holds a ``mib`` MiB wheel of random bytes, labelled as
    ``node``: it never came from BuildKit, so once removed none of its layers is left on the engine and a pull
    has to download them."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(mib << 20)
        info = tarfile.TarInfo("wheels/tinycache-0.1-py3-none-any.whl")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    client.api.import_image_from_data(buf.getvalue(), repository=name, tag="src",
                                      changes=[f"LABEL org.cudastack.hash={node.hash}"])


def test_registry_gone_mid_pull_builds_the_node_and_leaves_the_wheelhouse_whole(tmp_path, engine, cleanup,
                                                                                docker_config):  # noqa: F811
    from cudastack.build.executor import run_build
    from cudastack.registry.client import push_image

    client = engine.client
    registry = start_registry(tmp_path / "registry", auth=False)
    plan = small_plan(tmp_path / "chain", os.urandom(6).hex())
    cleanup.append(plan)
    wnode = plan.node("wheels")
    try:
        cache = NodeCache.open(f"{registry.host}/ci", client)
        src = "cudastack-test/midpull-" + os.urandom(4).hex()
        _big_layer_image(client, src, wnode)
        push_image(f"{src}:src", cache.target(wnode), client=client)
        for ref in (f"{src}:src", cache.target(wnode)):
            client.images.remove(ref, force=True)
        killed: list[str] = []

        def say(line: str) -> None:
            lines.append(line)
            if "cache: downloading layer" in line and not killed:
                registry.proc.kill()                # SIGKILL while the engine downloads the layer
                registry.proc.wait()
                killed.append(line)

        lines: list[str] = []
        rec = run_build(plan, state_dir=tmp_path / "s", engine=engine, cache=cache, say=say)
    finally:
        registry.stop()
    assert killed, "the pull finished before the registry could be killed:\n" + "\n".join(lines)
    by = {n["name"]: n for n in rec["nodes"]}
    assert rec["status"] == "ok" and by["wheels"]["status"] == "built"
    assert by["wheels"]["cache"]["status"] == "push failed"          # the registry is gone for the push too
    assert any(f["node"] == "wheels" and f["op"] == "pull" for f in rec["cache_failures"])
    assert any("the node cache could not serve it" in s and "building it instead" in s for s in lines)
    # the wheelhouse holds the wheel that was built (a few KiB), nothing of the half-pulled one, no temp folder
    wh = tmp_path / "s" / plan.wheelhouse
    (name, digest), = by["wheels"]["wheels"].items()
    assert {p.name for p in wh.iterdir()} == {name, "manifest.json"}
    assert (wh / name).stat().st_size < 1 << 20
    assert hashlib.sha256((wh / name).read_bytes()).hexdigest() == digest
    assert not list(wh.parent.glob(".export-*"))
    assert engine.client.images.get(wnode.tag).labels["org.cudastack.hash"] == wnode.hash


def _read_only_registry(root: Path):
    """Debian's docker-registry in maintenance read-only mode: reads answer, every push is refused (HTTP 405)."""
    if not REGISTRY_BIN:
        pytest.skip("docker-registry is not installed")
    import time

    import requests

    from registry_server import LocalRegistry

    root.mkdir(parents=True)
    port = _free_port()
    (root / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n"
        f"    rootdirectory: {root / 'data'}\n  maintenance:\n    readonly:\n      enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n")
    reg = LocalRegistry(host=f"127.0.0.1:{port}", root=root)
    reg.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(root / "config.yml")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            if requests.get(f"http://{reg.host}/v2/", timeout=1).status_code == 200:
                return reg
        except requests.RequestException:
            time.sleep(0.2)
    reg.stop()
    pytest.fail("the read-only docker-registry did not start")


def test_a_refused_push_leaves_the_build_and_is_reported(tmp_path, engine, cleanup, docker_config):  # noqa: F811
    from cudastack.build.executor import run_build

    registry = _read_only_registry(tmp_path / "ro-registry")
    plan = small_plan(tmp_path / "chain", os.urandom(6).hex())
    cleanup.append(plan)
    lines: list[str] = []
    try:
        cache = NodeCache.open(f"{registry.host}/ci", engine.client)
        rec = run_build(plan, state_dir=tmp_path / "s", engine=engine, cache=cache, say=lines.append)
    finally:
        registry.stop()
    assert rec["status"] == "ok" and [n["status"] for n in rec["nodes"]] == ["built"] * 3
    assert all(engine.exists(n.tag) for n in plan.nodes)
    assert [n["cache"]["status"] for n in rec["nodes"]] == ["push failed"] * 3
    assert [f["op"] for f in rec["cache_failures"]] == ["push"] * 3
    assert all("refused the push" in f["error"] and "405" in f["error"] for f in rec["cache_failures"])
    saved = json.loads(Path(rec["record_path"]).read_text())
    assert saved["cache_failures"] == rec["cache_failures"] and saved["status"] == "ok"
    assert sum("pushing it to the node cache failed; the build's result stands" in s for s in lines) == 3
    # no registry name is left on the engine by the refused pushes
    assert all(engine.client.images.get(n.tag).tags == [n.tag] for n in plan.nodes)


def test_the_login_appears_in_no_record_log_or_message(tmp_path, engine, cleanup, auth_registry_server,
                                                      docker_config):  # noqa: F811
    from cudastack.build.executor import dry_run, run_build

    reg = auth_registry_server
    docker_config(reg.host, reg.username, reg.password)
    secrets = [reg.password, base64.b64encode(f"{reg.username}:{reg.password}".encode()).decode()]
    plan = small_plan(tmp_path / "chain", os.urandom(6).hex())
    cleanup.append(plan)
    lines: list[str] = []
    cache = NodeCache.open(f"{reg.host}/ci", engine.client)
    rec = run_build(plan, state_dir=tmp_path / "s1", engine=engine, cache=cache, say=lines.append)
    assert [n["cache"]["status"] for n in rec["nodes"]] == ["pushed"] * 3      # the login worked
    empty_engine(engine.client, plan)
    lines.append(dry_run(plan, state_dir=tmp_path / "s2", engine=engine, cache=cache))
    rec2 = run_build(plan, state_dir=tmp_path / "s2", engine=engine, cache=cache, say=lines.append)
    assert [n["status"] for n in rec2["nodes"]] == ["pulled"] * 3
    written = [p.read_bytes() for d in (tmp_path / "s1", tmp_path / "s2") for p in d.rglob("*") if p.is_file()
               and p.suffix != ".whl"]
    blob = b"\n".join(written) + "\n".join(lines).encode() + json.dumps([rec, rec2]).encode()
    for s in secrets:
        assert s.encode() not in blob


# ------------------------------------------------------------------------------------------ under a lock
def test_locked_build_refuses_a_pulled_node_that_differs_from_the_lock(tmp_path, engine, cleanup,
                                                                      registry_server, docker_config):  # noqa: F811
    from cudastack.build.executor import run_build

    client = engine.client
    plan = small_plan(tmp_path / "chain", os.urandom(6).hex())
    cleanup.append(plan)
    cache = NodeCache.open(f"{registry_server.host}/ci", client)
    first = run_build(plan, state_dir=tmp_path / "s1", engine=engine, cache=cache, say=lambda s: None)
    by = {n["name"]: n for n in first["nodes"]}
    (wname, wdigest), = by["wheels"]["wheels"].items()

    def lock(**outputs):
        return {"nodes": {n.name: {"kind": n.kind} for n in plan.nodes}, "outputs": outputs}

    # the lock's outputs agree with the cache: every node is used
    empty_engine(client, plan)
    cache.lock = lock(base={"tag": plan.node("base").tag, "image_id": by["base"]["image_id"]},
                      wheels={"tag": plan.node("wheels").tag, "wheels": [{"filename": wname, "sha256": wdigest}]})
    ok = run_build(plan, state_dir=tmp_path / "s2", engine=engine, cache=cache, say=lambda s: None)
    assert [n["status"] for n in ok["nodes"]] == ["pulled"] * 3

    # a wheel whose sha256 differs from the lock's record: refused, naming the node and the file
    empty_engine(client, plan)
    cache.lock = lock(wheels={"tag": plan.node("wheels").tag, "wheels": [{"filename": wname, "sha256": "0" * 64}]})
    with pytest.raises(LockError) as exc:
        run_build(plan, state_dir=tmp_path / "s3", engine=engine, cache=cache, say=lambda s: None)
    msg = str(exc.value)
    assert exc.value.exit_code == 7
    assert "The node cache's wheels" in msg and "differs from the lock" in msg and wname in msg
    assert "0000000000000000" in msg and wdigest[:16] in msg
    assert not engine.exists(plan.node("wheels").tag)                     # never tagged, never used
    assert not [i for i in client.images.list() if any(d.startswith(cache.target(plan.node("wheels")).rsplit(":", 1)[0])
                                                       for d in i.attrs.get("RepoDigests") or [])]   # nor kept
    wh = tmp_path / "s3" / plan.wheelhouse
    assert not wh.exists() or {p.name for p in wh.iterdir()} <= {"manifest.json"}
    rec = json.loads((tmp_path / "s3" / "records" / "latest-cucachetest.json").read_text())
    assert [n["status"] for n in rec["nodes"]] == ["pulled", "failed", "not reached"]
    assert rec["nodes"][1]["cache"]["status"] == "refused"

    # an image id that differs from the lock's outputs: refused too (the base, first in the plan)
    empty_engine(client, plan)
    cache.lock = lock(base={"tag": plan.node("base").tag, "image_id": "sha256:" + "1" * 64})
    with pytest.raises(LockError, match=r"The node cache's base .* its image id is sha256:[0-9a-f]{64}, the lock's "
                                        r"outputs.base.image_id is sha256:1111"):
        run_build(plan, state_dir=tmp_path / "s4", engine=engine, cache=cache, say=lambda s: None)
    assert not engine.exists(plan.node("base").tag)
