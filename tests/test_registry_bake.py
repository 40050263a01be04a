"""The bake file: structure of the docker-bake.json format, and every target really builds with BuildKit when
its fields (context, dockerfile, args, tags, target, output) are handed to `docker build` in the group's order
(`contexts` maps each parent tag to its target, which a plain `docker build` satisfies with the locally built parent
tag). With the docker buildx plugin (0.13 here, on this engine's docker driver, whose BuildKit is 0.8): buildx's own
`bake --print` reads the file, and `docker buildx bake` itself builds a file whose parents come from the node cache
by digest; a file with named contexts (BuildKit >= 0.10) is built target by target."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from cudastack.build import bake as B
from cudastack.plan.model import Plan
from cudastack.plan.planner import PlannedNode
from registry_server import registry_server  # noqa: F401

DOCKERFILES = {
    "base": "FROM scratch\nCOPY src/ /a/\n",
    "app": "ARG PARENT_IMAGE\nFROM ${PARENT_IMAGE}\nARG MSG=none\nLABEL msg=${MSG}\nCOPY src/ /b/\n",
    "ext": "ARG PARENT_IMAGE\nFROM ${PARENT_IMAGE} AS builder\nCOPY src/ /wheels/\nFROM scratch AS wheels\n"
           "COPY --from=builder /wheels/ /\n",
}


def tiny_plan(tmp_path) -> Plan:
    suffix = os.urandom(4).hex()
    nodes = []
    for name, text in DOCKERFILES.items():
        d = tmp_path / "defs" / name
        (d / "src").mkdir(parents=True)
        (d / "Dockerfile").write_text(text)
        (d / "src" / (f"{name}-1.0-py3-none-any.whl" if name == "ext" else f"{name}.txt")).write_text(name)
        nodes.append(PlannedNode(name=name, kind={"base": "base-pip", "app": "image", "ext": "wheels"}[name],
                                 dockerfile=str(d / "Dockerfile"), parents=[] if name == "base" else (["base"] if name == "app" else ["app"]),
                                 build_args={}, hash=os.urandom(32).hex(), tag=f"cudastack-test/bake-{name}:{suffix}",
                                 method="wheel" if name == "ext" else "", context={"src": str(d / "src")}))
    nodes[1].build_args = {"PARENT_IMAGE": nodes[0].tag, "MSG": "hello"}
    nodes[2].build_args = {"PARENT_IMAGE": nodes[1].tag, "METHOD": "wheel"}
    return Plan("9.9", "9.9.0", ["12.0"], "pip", nodes, "wheelhouse/cu9.9")


def test_bake_file_structure(tmp_path):
    plan = tiny_plan(tmp_path)
    data = B.write_bake(plan, tmp_path / "out" / "docker-bake.json", state_dir=tmp_path / "state")
    assert json.loads((tmp_path / "out" / "docker-bake.json").read_text()) == data
    assert data["group"]["default"]["targets"] == ["base", "app", "ext"]
    assert data["group"]["wheels"]["targets"] == ["ext"]
    t = data["target"]
    assert t["app"]["contexts"] == {plan.nodes[0].tag: "target:base"}
    assert t["ext"]["contexts"] == {plan.nodes[1].tag: "target:app"}
    assert t["app"]["args"]["MSG"] == "hello" and t["app"]["tags"] == [plan.nodes[1].tag]
    assert t["ext"]["target"] == "wheels" and t["ext"]["output"][0].startswith("type=local,dest=")
    assert "tags" not in t["ext"]
    for name, entry in t.items():
        ctx = tmp_path / "out" / entry["context"]
        assert (ctx / entry["dockerfile"]).read_text() == DOCKERFILES[name]
        assert (ctx / "src").is_dir()
        assert entry["secret"] == ["id=cabundle,src=${CUDASTACK_CA_BUNDLE}"]
    assert data["variable"]["CUDASTACK_CA_BUNDLE"]["default"]


def test_bad_output_name(tmp_path):
    from cudastack.core.errors import UsageError
    with pytest.raises(UsageError, match=".json"):
        B.write_bake(tiny_plan(tmp_path), tmp_path / "bake.hcl", state_dir=tmp_path / "state")


@pytest.mark.docker
def test_bake_targets_build(tmp_path):
    docker_cli = "/usr/bin/docker" if os.path.exists("/usr/bin/docker") else shutil.which("docker")
    if not docker_cli or subprocess.run([docker_cli, "info"], capture_output=True).returncode != 0:
        pytest.skip("no Docker engine")
    plan = tiny_plan(tmp_path)
    out = tmp_path / "out"
    data = B.write_bake(plan, out / "docker-bake.json", state_dir=tmp_path / "state")
    built = []
    try:
        for name in data["group"]["default"]["targets"]:
            t = data["target"][name]
            for parent_tag, ref in t.get("contexts", {}).items():
                assert ref.startswith("target:") and ref[len("target:"):] in built
            ctx = out / t["context"]
            cmd = _target_command([docker_cli, "build"], t, out, labels=False, push=False)
            r = subprocess.run(cmd + [str(ctx)], capture_output=True, text=True, cwd=out,
                               env={**os.environ, "DOCKER_BUILDKIT": "1"})
            assert r.returncode == 0, r.stderr[-2000:]
            built.append(name)
        dest = out / data["target"]["ext"]["output"][0].split("dest=", 1)[1]
        assert (dest / "ext-1.0-py3-none-any.whl").read_text() == "ext"
        from cudastack.core.docker_engine import docker_client
        client = docker_client()
        app = client.images.get(plan.nodes[1].tag)
        assert app.labels.get("msg") == "hello"
        c = client.containers.create(app.id, command=["none"])
        try:
            names = {m for m in _archive_names(c, "/a") + _archive_names(c, "/b")}
        finally:
            c.remove()
        assert {"a/base.txt", "b/app.txt"} <= names
    finally:
        for n in plan.nodes:
            subprocess.run([docker_cli, "rmi", "-f", n.tag], capture_output=True)


def _archive_names(container, path):
    import io
    import tarfile
    stream, _ = container.get_archive(path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
        return tar.getnames()


# ------------------------------------------------------------------------------------------ with a node cache
def _buildx(tmp_path, monkeypatch) -> str:
    """A docker CLI with the buildx plugin (CUDASTACK_TEST_BUILDX names a docker-buildx binary where the CLI has
    none; DOCKER_CONFIG then points at a folder of this test's own); skip when there is none."""
    plugin = os.environ.get("CUDASTACK_TEST_BUILDX", "")
    if plugin:
        cfg = tmp_path / "dockercfg"
        (cfg / "cli-plugins").mkdir(parents=True)
        shutil.copy2(plugin, cfg / "cli-plugins" / "docker-buildx")
        monkeypatch.setenv("DOCKER_CONFIG", str(cfg))
    docker_cli = shutil.which("docker") or "docker"
    if subprocess.run([docker_cli, "buildx", "version"], capture_output=True).returncode != 0:
        pytest.skip("no docker buildx plugin (set CUDASTACK_TEST_BUILDX to a docker-buildx binary)")
    return docker_cli


def _ca_file(tmp_path):
    """A CA bundle file for the bake's ``cabundle`` secret (the system's where there is one)."""
    f = tmp_path / "ca.pem"
    if not f.exists():
        sys_ca = "/etc/ssl/certs/ca-certificates.crt"
        f.write_text(open(sys_ca).read() if os.path.isfile(sys_ca) else "")
    return f


def _bake_run(docker_cli: str, out, data: dict, names: list[str]) -> None:
    """Build the targets ``names`` of the bake dict as `docker buildx bake` hands them to BuildKit, one `docker
    buildx build` each on this engine's docker driver (its BuildKit 0.8 has no named contexts: a parent comes by
    its local tag or, from the cache, by digest): output type=registry is --push, type=local an export."""
    for name in names:
        t = data["target"][name]
        ctx = out / t["context"]
        cmd = _target_command([docker_cli, "buildx", "build"], t, out, labels=True, push=True)
        r = subprocess.run(cmd + [str(ctx)], capture_output=True, text=True, cwd=out)
        assert r.returncode == 0, f"{name}: {r.stderr[-2000:]}"


@pytest.mark.docker
@pytest.mark.registry
def test_bake_reads_and_fills_the_node_cache(tmp_path, monkeypatch, engine, registry_server):  # noqa: F811
    import hashlib

    import requests

    from cudastack.build.node_cache import NodeCache
    from cudastack.build.wheelhouse import Wheelhouse
    from test_node_cache import empty_engine

    docker_cli = _buildx(tmp_path, monkeypatch)
    client = engine.client
    plan = tiny_plan(tmp_path)
    cache = NodeCache.open(f"{registry_server.host}/ci", client)
    names = [cache.target(n) for n in plan.nodes]
    try:
        # an empty cache: every node is built, and pushed by its -cache target (a wheels node: its builder stage)
        data = B.write_bake(plan, tmp_path / "out" / "docker-bake.json", state_dir=tmp_path / "state", cache=cache)
        assert data["x-cudastack-served"] == {}
        assert "x-cudastack-served" not in json.loads((tmp_path / "out" / "docker-bake.json").read_text())
        assert data["group"]["default"]["targets"] == ["base", "base-cache", "app", "app-cache", "ext", "ext-cache"]
        assert data["group"]["cache"]["targets"] == ["base-cache", "app-cache", "ext-cache"]
        push = data["target"]["ext-cache"]
        assert push["target"] == "builder" and push["tags"] == [cache.target(plan.nodes[2])]
        assert push["output"] == ["type=registry"] and push["args"] == data["target"]["ext"]["args"]
        # buildx's own parser reads the file: groups, targets, the cabundle secret's variable
        env = dict(os.environ, CUDASTACK_CA_BUNDLE=str(_ca_file(tmp_path)))
        r = subprocess.run([docker_cli, "buildx", "bake", "-f", "docker-bake.json", "--print"], capture_output=True,
                           text=True, cwd=tmp_path / "out", env=env, timeout=120)
        assert r.returncode == 0, r.stderr[-3000:]
        printed = json.loads(r.stdout)
        assert printed["group"]["default"]["targets"] == data["group"]["default"]["targets"]
        assert printed["target"]["ext-cache"]["output"] == ["type=registry"]
        assert printed["target"]["app"]["contexts"] == {plan.nodes[0].tag: "target:base"}
        assert printed["target"]["base"]["secret"] == [f"id=cabundle,src={_ca_file(tmp_path)}"]
        # named contexts need BuildKit >= 0.10; this engine's docker driver has 0.8, so these targets are built
        # one `docker buildx build` each (a parent by its local tag)
        _bake_run(docker_cli, tmp_path / "out", data, data["group"]["default"]["targets"])
        digests = {n.name: cache.probe(n) for n in plan.nodes}
        assert all(digests.values()), digests

        # the ext node leaves the registry; base and app leave this engine: a second file builds ext FROM the
        # cache's app by digest, and pushes ext again
        ext = plan.nodes[2]
        name = cache.target(ext).split("/", 1)[1].rsplit(":", 1)[0]
        assert requests.delete(f"http://{registry_server.host}/v2/{name}/manifests/{digests['ext']}",
                               timeout=10).status_code == 202
        empty_engine(client, plan)
        for ref in names:
            subprocess.run([docker_cli, "rmi", "-f", ref], capture_output=True)
        data2 = B.write_bake(plan, tmp_path / "out2" / "docker-bake.json", state_dir=tmp_path / "state",
                             cache=cache)
        app_ref = f"{cache.target(plan.nodes[1]).rsplit(':', 1)[0]}@{digests['app']}"
        assert data2["x-cudastack-served"] == {"base": f"{cache.target(plan.nodes[0]).rsplit(':', 1)[0]}@"
                                                       f"{digests['base']}", "app": app_ref}
        assert data2["group"]["default"]["targets"] == ["ext", "ext-cache"]
        assert set(data2["target"]) == {"ext", "ext-cache"}
        assert data2["target"]["ext"]["args"]["PARENT_IMAGE"] == app_ref and "contexts" not in data2["target"]["ext"]
        assert not (tmp_path / "out2" / "ctx" / "app").exists()
        # this file has no named contexts (its parent comes by digest), so buildx's own bake runs it here
        env = dict(os.environ, CUDASTACK_CA_BUNDLE=str(_ca_file(tmp_path)))
        r = subprocess.run([docker_cli, "buildx", "bake", "-f", "docker-bake.json", "ext", "ext-cache"],
                           capture_output=True, text=True, cwd=tmp_path / "out2", env=env, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        assert (tmp_path / "out2" / data2["target"]["ext"]["output"][0].split("dest=", 1)[1] /
                "ext-1.0-py3-none-any.whl").read_text() == "ext"
        # what bake pushed is what invoke build --cache pulls: the node's label, its wheel in /wheels
        digest = cache.probe(ext)
        assert digest
        got = cache.restore(ext, digest, Wheelhouse(tmp_path / "wh" / "cu9.9"), say=lambda s: None)
        assert got["wheels"] == {"ext-1.0-py3-none-any.whl": hashlib.sha256(b"ext").hexdigest()}
    finally:
        empty_engine(client, plan)
        for ref in names:
            subprocess.run([docker_cli, "rmi", "-f", ref], capture_output=True)


@pytest.mark.docker      # bake asks the engine before its --cache check
def test_bake_cache_bad_input_stops_before_anything_is_written(tmp_path):
    """Through invoke: --cache-read-only without a cache is exit 2, a cache whose registry does not answer exit 8,
    both in one paragraph and before the bake file or any context is written."""
    import sys
    from pathlib import Path

    from registry_server import _free_port

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out" / "docker-bake.json"
    args = [sys.executable, "-m", "invoke", "-r", str(root), "bake", "--cuda", "13.1", "--recipes",
            str(root / "tests" / "fixtures" / "recipes"), "--output", str(out), "--state-dir", str(tmp_path / "s")]
    env = {k: v for k, v in os.environ.items() if k != "CUDASTACK_NODE_CACHE"}
    env["PYTHONPATH"] = f"{root}:{root / 'validate'}"
    p = subprocess.run(args + ["--cache-read-only"], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 2 and "--cache-read-only needs a node cache" in p.stderr, p.stderr
    dead = f"127.0.0.1:{_free_port()}/ci"
    p = subprocess.run(args + ["--cache", dead], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 8 and f"The node cache {dead}" in p.stderr and "does not answer" in p.stderr, p.stderr
    assert not (tmp_path / "out").exists()


def _target_command(build: list, t: dict, out, *, labels: bool, push: bool) -> list:
    """The docker build command line (without the context) for one bake target ``t`` of a file written in
    ``out``: its Dockerfile, build args, (labels), tags, target stage and outputs (a ``type=registry`` output as
    ``--push`` when ``push``; a local ``dest=`` made relative to ``out``)."""
    ctx = out / t["context"]
    cmd = [*build, "--progress=plain", "-f", str(ctx / t["dockerfile"])]
    for k, v in t["args"].items():
        cmd += ["--build-arg", f"{k}={v}"]
    for k, v in (t["labels"].items() if labels else ()):
        cmd += ["--label", f"{k}={v}"]
    for tag in t.get("tags", []):
        cmd += ["-t", tag]
    if t.get("target"):
        cmd += ["--target", t["target"]]
    for o in t.get("output", []):
        cmd += ["--push"] if push and o == "type=registry" else ["--output", o.replace("dest=", f"dest={out}/", 1)]
    return cmd


def test_a_baked_runtime_records_the_wheels_its_context_holds(tmp_path):
    """A runtime built by bake carries the label `invoke build` gives its runtimes (org.cudastack.wheels: the digest
    of the wheelhouse wheels its context holds), so a later `invoke build` keeps it; the twin: other wheels in the
    wheelhouse give another label."""
    from pathlib import Path

    from cudastack.build.context import WHEELS_LABEL, runtime_wheels_digest
    from cudastack.build.wheelhouse import Wheelhouse
    from cudastack.plan.planner import make_plan
    from cudastack.plan.rules import host_resources

    plan = make_plan(Path(__file__).parent / "fixtures" / "recipes", "13.1", resources=host_resources(),
                     prefix="cudastack-test")
    state = tmp_path / "state"
    runtime = plan.node("runtime")
    empty = B.write_bake(plan, tmp_path / "a" / "docker-bake.json", state_dir=state)["target"]["runtime"]["labels"]
    wh = Wheelhouse(state / plan.wheelhouse)
    assert empty[WHEELS_LABEL] == runtime_wheels_digest(wh, runtime)
    wh.path.mkdir(parents=True)
    (wh.path / "cuda_ext_fixture-0.1.0-cp311-cp311-linux_x86_64.whl").write_bytes(b"a wheel")
    (wh.path / "manifest.json").write_text(json.dumps({"nodes": {"cuda-ext": {
        "hash": plan.node("cuda-ext").hash, "tag": plan.node("cuda-ext").tag,
        "wheels": {"cuda_ext_fixture-0.1.0-cp311-cp311-linux_x86_64.whl": "0" * 64}}}}))
    full = B.write_bake(plan, tmp_path / "b" / "docker-bake.json", state_dir=state)["target"]["runtime"]["labels"]
    assert full[WHEELS_LABEL] == runtime_wheels_digest(wh, runtime) != empty[WHEELS_LABEL]
