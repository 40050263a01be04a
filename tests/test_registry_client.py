"""Registry client against a real distribution registry and the real Docker engine.

A tiny image is made with ``docker import`` of a one-file rootfs (unique content per test, so every push
really uploads a layer); it is pushed, its digest read over the HTTP API, removed locally, pulled back by
digest and verified.
"""
from __future__ import annotations

import io
import os
import tarfile

import pytest

from cudastack import registry as reg
from cudastack.errors import RegistryError, UsageError
from registry_server import auth_registry_server, docker_config, registry_server  # noqa: F401


# ----------------------------------------------------------------------------------------- pure functions
@pytest.mark.parametrize("text, expect", [
    ("debian", ("docker.io", "library/debian", None, None)),
    ("nvidia/cuda:13.1.1-cudnn-devel-ubuntu24.04", ("docker.io", "nvidia/cuda", "13.1.1-cudnn-devel-ubuntu24.04", None)),
    ("127.0.0.1:5000/cudastack-test/runtime:abc", ("127.0.0.1:5000", "cudastack-test/runtime", "abc", None)),
    ("localhost/x/y", ("localhost", "x/y", None, None)),
    ("127.0.0.1:5000#cudastack-test/runtime@sha256:" + "a" * 64, ("127.0.0.1:5000", "cudastack-test/runtime", None, "sha256:" + "a" * 64)),
    ("ghcr.io/o/n:t@sha256:" + "b" * 64, ("ghcr.io", "o/n", "t", "sha256:" + "b" * 64)),
])
def test_parse_reference(text, expect):
    r = reg.parse_reference(text)
    assert (r.registry, r.repository, r.tag, r.digest) == expect


@pytest.mark.parametrize("bad", ["", "UPPER/case", "a b", "x@sha256:123", "host:5000/name:bad tag", "n@md5:" + "a" * 32])
def test_parse_reference_rejects(bad):
    with pytest.raises(UsageError):
        reg.parse_reference(bad)


def test_both_spellings():
    r = reg.parse_reference("127.0.0.1:5000/ns/runtime:t").with_digest("sha256:" + "c" * 64)
    assert r.pinned() == "127.0.0.1:5000/ns/runtime@sha256:" + "c" * 64
    assert r.enroot() == "127.0.0.1:5000#ns/runtime@sha256:" + "c" * 64
    assert reg.parse_reference(r.enroot()) == reg.parse_reference(r.pinned())


@pytest.mark.parametrize("value, expect", [
    ("127.0.0.1:5000/ci", ("127.0.0.1:5000", "ci")), ("registry.example.com", ("registry.example.com", "")),
    ("localhost:5000/a/b/", ("localhost:5000", "a/b"))])
def test_parse_registry_prefix(value, expect):
    assert reg.parse_registry_prefix(value) == expect


@pytest.mark.parametrize("bad", ["http://127.0.0.1:5000", "myname", "host.io/UPPER"])
def test_parse_registry_prefix_rejects(bad):
    with pytest.raises(UsageError):
        reg.parse_registry_prefix(bad)


def test_loopback_detection():
    assert reg.is_loopback("127.0.0.1:5000") and reg.is_loopback("localhost") and reg.is_loopback("[::1]:5000")
    assert not reg.is_loopback("registry.example.com:443") and not reg.is_loopback("10.0.0.1:5000")


def test_credentials_from_docker_config(docker_config):
    docker_config("127.0.0.1:5999", "alice", "pw-xyz")
    assert reg.registry_credentials("127.0.0.1:5999") == {"Username": "alice", "Password": "pw-xyz"}
    assert reg.registry_credentials("127.0.0.1:6000") is None


# ----------------------------------------------------------------------------------------- real registry
def _tiny_image(client, name: str) -> str:
    """``docker import`` of a rootfs holding one random file; returns the image id."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(64).hex().encode()
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    out = client.api.import_image_from_data(buf.getvalue(), repository=name, tag="src")
    image = client.images.get(f"{name}:src")
    assert out
    return image.id


@pytest.fixture
def engine(docker_engine_scratch):
    return docker_engine_scratch


@pytest.mark.docker
@pytest.mark.registry
def test_push_head_pull_by_digest(engine, registry_server, docker_config):
    client, made = engine
    name = "cudastack-test/tiny-" + os.urandom(4).hex()
    image_id = _tiny_image(client, name)
    target = f"{registry_server.host}/ci/tiny:v1"
    made += [f"{name}:src", target]
    pushed = reg.push_image(f"{name}:src", target, client=client)

    # the digest over the HTTP API equals the engine's RepoDigests entry, in both spellings
    http_digest = reg.RegistryClient(registry_server.host).manifest_digest("ci/tiny", "v1")
    assert pushed.digest == http_digest
    assert pushed.reference == f"{registry_server.host}/ci/tiny@{http_digest}"
    assert pushed.enroot == f"{registry_server.host}#ci/tiny@{http_digest}"
    assert pushed.reference in client.images.get(target).attrs["RepoDigests"]
    assert pushed.image_id == image_id

    # delete every local name of the image, then pull it back by digest and verify
    client.images.remove(image_id, force=True)
    with pytest.raises(Exception):
        client.images.get(image_id)
    made.append(pushed.reference)
    image = reg.pull_by_digest(pushed.enroot, expected_image_id=image_id, client=client)
    assert image.id == image_id
    assert pushed.reference in image.attrs["RepoDigests"]


@pytest.mark.docker
@pytest.mark.registry
def test_pull_detects_wrong_image_id(engine, registry_server, docker_config):
    client, made = engine
    name = "cudastack-test/tiny-" + os.urandom(4).hex()
    _tiny_image(client, name)
    target = f"{registry_server.host}/ci/other:v1"
    made += [f"{name}:src", target]
    pushed = reg.push_image(f"{name}:src", target, client=client)
    made.append(pushed.reference)
    with pytest.raises(RegistryError, match="lock records"):
        reg.pull_by_digest(pushed.reference, expected_image_id="sha256:" + "0" * 64, client=client)
    # a digest the registry never stored
    with pytest.raises(RegistryError, match="404"):
        reg.pull_by_digest(f"{registry_server.host}/ci/other@sha256:" + "1" * 64, client=client)


@pytest.mark.docker
@pytest.mark.registry
def test_registry_down(engine, registry_server, docker_config):
    client, made = engine
    name = "cudastack-test/tiny-" + os.urandom(4).hex()
    _tiny_image(client, name)
    made.append(f"{name}:src")
    host = registry_server.host
    registry_server.stop()
    with pytest.raises(RegistryError, match="does not answer"):
        reg.push_image(f"{name}:src", f"{host}/ci/tiny:v1", client=client)
    with pytest.raises(RegistryError, match="does not answer"):
        reg.pull_by_digest(f"{host}/ci/tiny@sha256:" + "2" * 64, client=client)


@pytest.mark.docker
@pytest.mark.registry
def test_auth_registry(engine, auth_registry_server, docker_config):
    client, made = engine
    host = auth_registry_server.host
    name = "cudastack-test/tiny-" + os.urandom(4).hex()
    _tiny_image(client, name)
    made += [f"{name}:src", f"{host}/ci/tiny:v1"]

    # no credentials at all: the HTTP API says what to do
    with pytest.raises(RegistryError, match="docker login"):
        reg.RegistryClient(host, credentials={}).manifest_digest("ci/tiny", "v1")

    # wrong credentials: the engine's push is refused; the message never carries the password
    docker_config(host, auth_registry_server.username, "wrong-password-123")
    import docker
    wrong = docker.from_env()
    with pytest.raises(RegistryError, match="refused the push") as exc:
        reg.push_image(f"{name}:src", f"{host}/ci/tiny:v1", client=wrong)
    assert "wrong-password-123" not in str(exc.value)

    # right credentials from the credential store: push, then HEAD with basic auth
    docker_config(host, auth_registry_server.username, auth_registry_server.password)
    right = docker.from_env()
    pushed = reg.push_image(f"{name}:src", f"{host}/ci/tiny:v1", client=right)
    assert reg.RegistryClient(host).manifest_digest("ci/tiny", pushed.digest) == pushed.digest
    assert auth_registry_server.password not in repr(pushed.as_dict())
    with pytest.raises(RegistryError, match="refused the credentials"):
        reg.RegistryClient(host, credentials={"Username": "ci-user", "Password": "nope"}).manifest_digest(
            "ci/tiny", "v1")


# ----------------------------------------------------------------------------------------- bearer tokens
def test_bearer_token_flow():
    """The token flow of the Docker token-auth spec, against a loopback HTTP server that speaks it (Docker Hub
    and most cloud registries use it; the distribution registry needs a token service and TLS for it)."""
    import base64
    import http.server
    import json
    import threading

    digest = "sha256:" + "9" * 64
    seen = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path.startswith("/token"):
                seen["token_auth"] = self.headers.get("Authorization")
                seen["token_query"] = self.path
                body = json.dumps({"token": "tok-123"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            else:
                self.send_response(404)
                self.end_headers()

        def do_HEAD(self):
            if self.headers.get("Authorization") != "Bearer tok-123":
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="http://{host}/token",service="reg.test",'
                                                     'scope="repository:library/debian:pull"')
                self.end_headers()
                return
            seen["accept"] = self.headers.get("Accept")
            self.send_response(200)
            self.send_header("Docker-Content-Digest", digest)
            self.end_headers()

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    host = f"127.0.0.1:{srv.server_address[1]}"
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        client = reg.RegistryClient(host, credentials={"Username": "u", "Password": "p"})
        assert client.manifest_digest("library/debian", "bookworm") == digest
        assert seen["token_auth"] == "Basic " + base64.b64encode(b"u:p").decode()
        assert "service=reg.test" in seen["token_query"] and "scope=repository" in seen["token_query"]
        assert "application/vnd.docker.distribution.manifest.v2+json" in seen["accept"]
        assert "application/vnd.oci.image.index.v1+json" in seen["accept"]
    finally:
        srv.shutdown()
