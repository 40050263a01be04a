"""Index credentials for real: a recipe names a private index with its login in the URL
(``http://ci-user:<secret>@<host>:<port>/simple``, served here with HTTP basic auth on the Docker bridge's
address so build containers reach it). A real build of the fixture chain downloads a wheel from it, which
proves the login reached pip, and then the secret's bytes are looked for, and must be absent, in:

* the image's history (``docker history --no-trunc``: every build arg a RUN saw) and its config;
* every layer (``docker save`` of the image, base layers included);
* the build logs, the build record and the dry-run text;
* a lockfile written for the plan, and the lock's index entry (the URL without its login).
"""
from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest
import yaml

from cudastack import lock as L
from cudastack.build.executor import dry_run, run_build
from cudastack.build.engine import Engine
from cudastack.plan.planner import make_plan
from cudastack.plan.rules import host_resources
from lock_support import make_wheel

pytestmark = [pytest.mark.docker, pytest.mark.network]

FIXTURES = Path(__file__).parent / "fixtures"


def _bridge_gateway() -> str:
    """This host's address on the Docker bridge (what build containers reach it by): the bridge network's
    gateway, or the docker0 interface's address when the network does not list one."""
    out = subprocess.run(["docker", "network", "inspect", "bridge", "--format", "{{json .IPAM.Config}}"],
                         capture_output=True, text=True)
    for cfg in json.loads(out.stdout or "[]") or []:
        if cfg.get("Gateway"):
            return cfg["Gateway"]
    import socket

    import psutil

    addrs = [a.address for a in psutil.net_if_addrs().get("docker0", []) if a.family == socket.AF_INET]
    assert addrs, f"no Docker bridge (docker0) to serve the private index on: {out.stderr.strip()}"
    return addrs[0]


class _PrivateIndex(http.server.BaseHTTPRequestHandler):
    """PEP 503 index of one wheel behind HTTP basic auth; counts the requests that carried the login."""

    auth = ""
    wheel: Path
    authorized: list = []

    def do_GET(self):  # noqa: N802
        cls = type(self)
        if self.headers.get("Authorization", "") != f"Basic {cls.auth}":
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="private"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        cls.authorized.append(self.path)
        name = cls.wheel.name
        if self.path.rstrip("/") == "/simple/tinysecret":
            digest = hashlib.sha256(cls.wheel.read_bytes()).hexdigest()
            body = f'<html><body><a href="/files/{name}#sha256={digest}">{name}</a></body></html>'.encode()
            ctype = "text/html"
        elif self.path == f"/files/{name}":
            body, ctype = cls.wheel.read_bytes(), "application/octet-stream"
        else:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


@pytest.fixture
def private_index(tmp_path):
    host = _bridge_gateway()
    secret = "tok-" + os.urandom(12).hex()

    class Index(_PrivateIndex):
        auth = base64.b64encode(f"ci-user:{secret}".encode()).decode()
        wheel = make_wheel(tmp_path / "files", "tinysecret", "1.0", payload=os.urandom(4).hex())
        authorized: list = []

    srv = http.server.ThreadingHTTPServer((host, 0), Index)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"{host}:{srv.server_address[1]}", secret, Index
    srv.shutdown()


def _scan_save(engine: Engine, tag: str, needle: bytes) -> int:
    """Bytes of ``docker save`` of ``tag`` read while looking for ``needle`` (AssertionError when found)."""
    n, tail = 0, b""
    for chunk in engine.client.images.get(tag).save(chunk_size=8 << 20):
        block = tail + chunk
        assert needle not in block, f"the secret is in a layer or the config of {tag}"
        tail = block[-len(needle):]
        n += len(chunk)
    return n


def test_index_login_travels_as_a_secret_and_is_written_nowhere(private_index, tmp_path):
    hostport, secret, index = private_index
    recipes = tmp_path / "recipes"
    shutil.copytree(FIXTURES / "recipes", recipes)
    (recipes / "cuda-ext.yaml").write_text(yaml.safe_dump({
        "kind": "wheels", "needs": ["base"], "description": "a wheel from a private index with a login",
        "est_disk_gib": 0.1,
        "toolchains": {"13.1": {"method": "wheel", "packages": ["tinysecret==1.0"],
                                "index": f"http://ci-user:{secret}@{hostport}/simple",
                                "knobs": {"PIP_TRUSTED_HOST": hostport}}}}))
    plan = make_plan(recipes, "13.1", resources=host_resources(), prefix="cudastack-test")
    plan.nodes = [n for n in plan.nodes if n.name != "runtime"]     # the base and the private wheel suffice
    node = plan.node("cuda-ext")
    assert node.build_args["PIP_INDEX_URL"] == f"http://{hostport}/simple"
    assert secret not in json.dumps(node.build_args) and secret not in json.dumps(node.inputs)
    state = tmp_path / "state"
    engine = Engine.connect()
    lines: list[str] = []
    record = run_build(plan, state_dir=state, engine=engine, say=lines.append)

    # the login reached pip inside the build: the wheel came from the private index
    assert any(p.startswith("/files/tinysecret-1.0") for p in index.authorized), index.authorized
    assert {n["name"]: n for n in record["nodes"]}["cuda-ext"]["wheels"]
    needle = secret.encode()
    history = subprocess.run(["docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", node.tag],
                             capture_output=True, text=True, check=True).stdout
    assert f"PIP_INDEX_URL=http://{hostport}/simple" in history      # the URL without its login is there
    assert secret not in history
    assert secret not in json.dumps(engine.client.images.get(node.tag).attrs)
    assert _scan_save(engine, node.tag, needle) > 0
    for f in state.rglob("*"):
        if f.is_file() and f.suffix != ".whl":
            assert needle not in f.read_bytes(), f"the secret is in {f.relative_to(state)}"
    assert not list(state.glob(".secrets-*")), "the secret's file outlives the build"
    assert secret not in "\n".join(lines)
    assert secret not in dry_run(plan, state_dir=state, engine=engine)

    # the lock: index and package URLs without the login; the plan still matches it; hashes checkable with it
    lock = {"lock_version": 1, "toolchain": "13.1", "cuda_version": plan.cuda_version, "base_kind": "pip",
            "nodes": {"cuda-ext": {"kind": "wheels", "method": "wheel", "plan_hash": node.hash,
                                   "index": f"http://ci-user:{secret}@{hostport}/simple", "installs": {
                                       "PIP_SPECS": {"requested": ["tinysecret==1.0"], "packages": [{
                                           "name": "tinysecret", "version": "1.0", "filename": index.wheel.name,
                                           "url": f"http://ci-user:{secret}@{hostport}/files/{index.wheel.name}",
                                           "sha256": hashlib.sha256(index.wheel.read_bytes()).hexdigest()}]}}}}}
    path = tmp_path / "lockfiles" / "13.1.lock.yaml"
    text = L.render_lock(lock)
    assert secret not in text and "ci-user" not in text
    path.parent.mkdir()
    path.write_text(text)
    written = L.load_lock(path)
    assert written["nodes"]["cuda-ext"]["index"] == f"http://{hostport}/simple"
    assert not [s for s in L.stale_entries(plan, written) if ".index" in s]
    logins = {f"http://{hostport}/simple": node.index_secret}
    assert L.verify_locked_hashes(written, logins=logins)["index"] == 1
