"""Pushes, pulls and digests against a real distribution registry and the real Docker engine.

A tiny image is made with ``docker import`` of a one-file rootfs (unique content per test, so every push
really uploads a layer); it is pushed, its digest read back through the engine (``get_registry_data``) and
through skopeo (no engine), checked against the sha256 of the manifest bytes the registry serves, removed
locally, pulled back by digest and verified.
"""
from __future__ import annotations

import io
import os
import hashlib
import tarfile

import pytest
import requests

from cudastack.registry import client as reg
from cudastack.registry import reference as registry_reference
from cudastack.registry import login as registry_login
from cudastack.registry import digest as registry_digest
from cudastack.core.errors import EnvironmentError_, RegistryError, UsageError
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
    assert registry_reference.is_loopback("127.0.0.1:5000") and registry_reference.is_loopback("localhost") and registry_reference.is_loopback("[::1]:5000")
    assert not registry_reference.is_loopback("registry.example.com:443") and not registry_reference.is_loopback("10.0.0.1:5000")


def test_credentials_from_docker_config(docker_config):
    docker_config("127.0.0.1:5999", "alice", "pw-xyz")
    assert registry_login.registry_credentials("127.0.0.1:5999") == {"Username": "alice", "Password": "pw-xyz"}
    assert registry_login.registry_credentials("127.0.0.1:6000") is None


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


def _push_tiny(engine, host: str, repo: str):
    """A fresh tiny image pushed to ``host/repo:v1`` through the tool: (image id, target tag, PushedImage).
    Every name it makes goes on the engine fixture's clean-up list."""
    client, made = engine
    name = "cudastack-test/tiny-" + os.urandom(4).hex()
    image_id = _tiny_image(client, name)
    target = f"{host}/{repo}:v1"
    made += [f"{name}:src", target]
    pushed = reg.push_image(f"{name}:src", target, client=client)
    made.append(pushed.reference)
    return image_id, target, pushed


def _served_digest(host: str, repo: str, reference: str, auth=None) -> str:
    """The sha256 of the manifest bytes the registry serves (the digest by definition), read with plain HTTP:
    the independent answer the tools are checked against."""
    accept = ("application/vnd.docker.distribution.manifest.v2+json, application/vnd.oci.image.manifest.v1+json, "
              "application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.index.v1+json")
    r = requests.get(f"http://{host}/v2/{repo}/manifests/{reference}", headers={"Accept": accept}, auth=auth,
                     timeout=30)
    r.raise_for_status()
    return "sha256:" + hashlib.sha256(r.content).hexdigest()


@pytest.mark.docker
@pytest.mark.registry
def test_push_digest_pull_by_digest(engine, registry_server, docker_config):
    client, _ = engine
    image_id, target, pushed = _push_tiny(engine, registry_server.host, "ci/tiny")

    # the pushed digest is what the registry serves, read three ways, and the engine's RepoDigests entry
    served = _served_digest(registry_server.host, "ci/tiny", "v1")
    assert pushed.digest == served
    assert registry_digest.resolve_digest(target, client=client) == served          # through the engine
    assert registry_digest.resolve_digest(target) == served                         # through skopeo, no engine
    assert registry_digest.resolve_digest(pushed.reference) == served
    assert pushed.reference == f"{registry_server.host}/ci/tiny@{served}"
    assert pushed.enroot == f"{registry_server.host}#ci/tiny@{served}"
    assert pushed.reference in client.images.get(target).attrs["RepoDigests"]
    assert pushed.image_id == image_id

    # delete every local name of the image, then pull it back by digest and verify
    client.images.remove(image_id, force=True)
    with pytest.raises(Exception):
        client.images.get(image_id)
    image = reg.pull_by_digest(pushed.enroot, expected_image_id=image_id, client=client)
    assert image.id == image_id
    assert pushed.reference in image.attrs["RepoDigests"]


@pytest.mark.docker
@pytest.mark.registry
def test_pull_detects_wrong_image_id(engine, registry_server, docker_config):
    client, _ = engine
    _, _, pushed = _push_tiny(engine, registry_server.host, "ci/other")
    with pytest.raises(RegistryError, match="lock records"):
        reg.pull_by_digest(pushed.reference, expected_image_id="sha256:" + "0" * 64, client=client)


@pytest.mark.docker
@pytest.mark.registry
@pytest.mark.parametrize("via", ["engine", "skopeo"])
def test_unknown_digest_and_tag(engine, registry_server, docker_config, via):
    client, _ = engine
    _push_tiny(engine, registry_server.host, "ci/known")
    kw = {"client": client} if via == "engine" else {}
    unknown = f"{registry_server.host}/ci/known@sha256:" + "1" * 64
    with pytest.raises(RegistryError, match=r"has no manifest .*ci/known@sha256:1111.*HTTP 404") as exc:
        registry_digest.resolve_digest(unknown, **kw)
    assert exc.value.exit_code == 8
    with pytest.raises(RegistryError, match=r"has no manifest .*ci/known:nope"):
        registry_digest.resolve_digest(f"{registry_server.host}/ci/known:nope", **kw)
    # a digest the registry never stored cannot be pulled either, and nothing is pulled
    with pytest.raises(RegistryError, match="HTTP 404"):
        reg.pull_by_digest(unknown, client=client)


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
    for kw in ({}, {"client": client}):
        with pytest.raises(RegistryError, match="does not answer"):
            registry_digest.resolve_digest(f"{host}/ci/tiny:v1", **kw)


@pytest.mark.docker
@pytest.mark.registry
def test_auth_registry(engine, auth_registry_server, docker_config):
    from cudastack.core.docker_engine import docker_client

    client, made = engine
    host = auth_registry_server.host
    user, password = auth_registry_server.username, auth_registry_server.password
    name = "cudastack-test/tiny-" + os.urandom(4).hex()
    _tiny_image(client, name)
    made += [f"{name}:src", f"{host}/ci/tiny:v1"]

    # no credentials at all: push and digest reads say what to do
    with pytest.raises(RegistryError, match="has no login for it.*docker login"):
        reg.push_image(f"{name}:src", f"{host}/ci/tiny:v1", client=docker_client())
    for kw in ({}, {"client": docker_client()}):
        with pytest.raises(RegistryError, match="credential store has none for it.*docker login"):
            registry_digest.resolve_digest(f"{host}/ci/tiny:v1", **kw)

    # wrong credentials: the push and both digest reads are refused; no message carries the password
    docker_config(host, user, "wrong-password-123")
    with pytest.raises(RegistryError, match="refused the login from the Docker credential store") as exc:
        reg.push_image(f"{name}:src", f"{host}/ci/tiny:v1", client=docker_client())
    assert "wrong-password-123" not in str(exc.value)

    # right credentials from the credential store: push, then read the digest through engine and skopeo
    docker_config(host, user, password)
    right = docker_client()
    pushed = reg.push_image(f"{name}:src", f"{host}/ci/tiny:v1", client=right)
    assert pushed.digest == _served_digest(host, "ci/tiny", "v1", auth=(user, password))
    assert registry_digest.resolve_digest(f"{host}/ci/tiny@{pushed.digest}") == pushed.digest
    assert registry_digest.resolve_digest(f"{host}/ci/tiny:v1", client=right) == pushed.digest
    assert password not in repr(pushed.as_dict())
    image_id = right.images.get(f"{host}/ci/tiny:v1").id            # pulled back with the same login
    right.images.remove(image_id, force=True)
    made.append(pushed.reference)
    assert reg.pull_by_digest(pushed.enroot, expected_image_id=image_id, client=docker_client()).id == image_id

    docker_config(host, user, "nope-" + password[::-1])
    for kw in ({}, {"client": docker_client()}):
        with pytest.raises(RegistryError, match="refused the credentials from the Docker credential store") as exc:
            registry_digest.resolve_digest(f"{host}/ci/tiny:v1", **kw)
        assert "nope-" not in str(exc.value) and password not in str(exc.value)


# ----------------------------------------------------------------------------------------- bearer tokens
def _manifest_server(seen: dict):
    """A loopback HTTP server speaking the Docker token-auth spec (Docker Hub and most cloud registries use
    it; the distribution registry needs a token service and TLS for it): ``/v2/`` and manifests answer 401
    with a Bearer challenge until the token comes back; ``/token`` hands out the token for basic auth (GET)
    or for a refresh token (POST, OAuth2 ``grant_type=refresh_token``). Returns (server, manifest bytes)."""
    import http.server
    import json
    import threading
    from urllib.parse import parse_qs

    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                           "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": 2,
                                      "digest": "sha256:" + "4" * 64}, "layers": []}).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, body=b"", headers=()):
            self.send_response(code)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() != "chunked":
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if not size:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()

        def do_POST(self):
            seen["token_post"] = parse_qs(self._body().decode())
            self._send(200, b'{"access_token": "tok-123"}', [("Content-Type", "application/json")])

        def do_GET(self):
            if self.path.startswith("/token"):
                seen["token_auth"] = self.headers.get("Authorization")
                seen["token_query"] = self.path
                self._send(200, b'{"token": "tok-123"}', [("Content-Type", "application/json")])
            elif self.headers.get("Authorization") != "Bearer tok-123":
                self._send(401, headers=[("WWW-Authenticate", f'Bearer realm="http://{host}/token",'
                                                              'service="reg.test",scope="repository:library/x:pull"')])
            elif "/manifests/" in self.path:
                seen["accept"] = self.headers.get("Accept")
                self._send(200, manifest, [("Content-Type", "application/vnd.oci.image.manifest.v1+json")])
            else:
                self._send(200, b"{}")

        do_HEAD = do_GET

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    host = f"127.0.0.1:{srv.server_address[1]}"
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, host, manifest


@pytest.mark.parametrize("flow", ["basic", "refresh-token"])
def test_bearer_token_flows_through_skopeo(docker_config, flow):
    """The login from the credential store reaches skopeo, which runs the token flow (basic auth to the
    token service, or the refresh-token grant for an ``identitytoken`` entry), and the digest is the sha256
    of the manifest it served."""
    import base64
    import json

    seen: dict = {}
    srv, host, manifest = _manifest_server(seen)
    try:
        if flow == "basic":
            docker_config(host, "u", "p")
        else:
            cfg = docker_config.folder / "config.json"
            cfg.write_text(json.dumps({"auths": {host: {"auth": base64.b64encode(b"u:").decode(),
                                                        "identitytoken": "refresh-xyz"}}}))
        assert registry_login.registry_credentials(host) == (
            {"Username": "u", "Password": "p"} if flow == "basic" else {"IdentityToken": "refresh-xyz"})
        digest = registry_digest.resolve_digest(f"{host}/library/x:bookworm")
        assert digest == "sha256:" + hashlib.sha256(manifest).hexdigest()
        if flow == "basic":
            assert seen["token_auth"] == "Basic " + base64.b64encode(b"u:p").decode()
            assert "service=reg.test" in seen["token_query"] and "scope=repository" in seen["token_query"]
        else:
            assert seen["token_post"]["grant_type"] == ["refresh_token"]
            assert seen["token_post"]["refresh_token"] == ["refresh-xyz"]
        assert "application/vnd.oci.image.manifest.v1+json" in seen["accept"]
    finally:
        srv.shutdown()


def test_tool_output_never_carries_the_login():
    """A tool that quotes the password or refresh token it was given (in an error) has it cut out of every
    message; the URL's userinfo too (StackError's scrub)."""
    ref = reg.parse_reference("127.0.0.1:9/ci/x:v1")
    creds = {"Username": "u", "Password": "s3cret-pw"}
    err = "unauthorized: bad password s3cret-pw for http://u:s3cret-pw@127.0.0.1:9/v2/"
    for exc in (reg.push_failure(ref, err, creds), registry_digest._read_failure(ref, "v1", err, creds, "skopeo"),
                registry_digest._read_failure(ref, "v1", "odd failure s3cret-pw", creds, "skopeo")):
        assert "s3cret-pw" not in str(exc) and "***" in str(exc), str(exc)
    token = {"IdentityToken": "refresh-abc"}
    assert "refresh-abc" not in str(registry_digest._read_failure(ref, "v1", "denied refresh-abc", token, "the Docker engine"))


def test_error_words_are_whole_words():
    """An HTTP status inside a digest's hex is no status: a refused login quoting a URL whose digest holds
    '404' is still a refused login, and a message naming a 404 is an unknown manifest."""
    ref = reg.parse_reference("127.0.0.1:9/ci/x@sha256:" + "0" * 61 + "404")
    url = f'Get "http://127.0.0.1:9/v2/ci/x/manifests/{ref.digest}": no basic auth credentials'
    assert "has none for it" in str(registry_digest._read_failure(ref, ref.digest, url, None, "the Docker engine"))
    assert "has no manifest" in str(registry_digest._read_failure(ref, ref.digest, "HTTP 404 from the registry", None, "x"))


@pytest.mark.docker
@pytest.mark.registry
def test_without_skopeo_the_engine_reads_and_without_either_it_says_so(engine, registry_server, docker_config,
                                                                         monkeypatch, tmp_path):
    client, made = engine
    name = "cudastack-test/tiny-" + os.urandom(4).hex()
    _tiny_image(client, name)
    target = f"{registry_server.host}/ci/noskopeo:v1"
    made += [f"{name}:src", target]
    pushed = reg.push_image(f"{name}:src", target, client=client)
    bare = tmp_path / "bin"                          # a PATH without skopeo
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    assert registry_digest.resolve_digest(target) == pushed.digest          # the local engine, found from the environment
    with pytest.raises(EnvironmentError_, match="needs skopeo"):
        registry_digest.skopeo_digest(reg.parse_reference(target))
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(EnvironmentError_, match="No Docker engine answers.*install skopeo") as exc:
        registry_digest.resolve_digest(target)
    assert exc.value.exit_code == 5
