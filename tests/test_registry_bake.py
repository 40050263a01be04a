"""The bake file: structure of the docker-bake.json format, and every target really builds with BuildKit when
its fields (context, dockerfile, args, tags, target, output) are handed to `docker build` in the group's
order (buildx itself is not installed here; `contexts` maps each parent tag to its target, which a plain
`docker build` satisfies with the locally built parent tag)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from cudastack import bake as B
from cudastack.model import Plan
from cudastack.plan import PlannedNode

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
    from cudastack.errors import UsageError
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
            cmd = [docker_cli, "build", "--progress=plain", "-f", str(ctx / t["dockerfile"])]
            for k, v in t["args"].items():
                cmd += ["--build-arg", f"{k}={v}"]
            for tag in t.get("tags", []):
                cmd += ["-t", tag]
            if t.get("target"):
                cmd += ["--target", t["target"]]
            for o in t.get("output", []):
                cmd += ["--output", o.replace("dest=", f"dest={out}/", 1)]
            r = subprocess.run(cmd + [str(ctx)], capture_output=True, text=True, cwd=out,
                               env={**os.environ, "DOCKER_BUILDKIT": "1"})
            assert r.returncode == 0, r.stderr[-2000:]
            built.append(name)
        dest = out / data["target"]["ext"]["output"][0].split("dest=", 1)[1]
        assert (dest / "ext-1.0-py3-none-any.whl").read_text() == "ext"
        from cudastack.docker_engine import docker_client
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
