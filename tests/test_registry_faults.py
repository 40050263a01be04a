"""Registry faults for real:

* a loopback docker-registry killed in the middle of a push: the error says the registry went away (not
  "docker login"), and nothing is recorded;
* a registry whose Bearer challenge names a token service (realm) over plain HTTP on a non-loopback address:
  no tool is handed the login (not skopeo, not the engine), and the realm server never sees the secret's
  bytes; over loopback the same login is sent (skopeo runs the token flow);
* a registry on another host that serves plain HTTP: it is only ever reached over https, so the TLS
  handshake fails and no request (with or without the login) reaches it.
"""
from __future__ import annotations

import base64
import hashlib
import http.server
import io
import os
import tarfile
import threading
import time

import pytest

from cudastack.registry import client as reg
from cudastack.registry import digest as registry_digest
from cudastack.core.errors import RegistryError
from registry_server import docker_config, start_registry  # noqa: F401


def _big_image(client, name: str, mib: int = 256) -> str:
    """``docker import`` of a rootfs with ``mib`` MiB of random bytes (incompressible: the engine's gzip and
    upload of the layer take seconds). Returns the image id."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = os.urandom(mib << 20)
        info = tarfile.TarInfo("blob.bin")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    client.api.import_image_from_data(buf.getvalue(), repository=name, tag="src")
    return client.images.get(f"{name}:src").id


@pytest.mark.docker
@pytest.mark.registry
def test_registry_killed_mid_push_says_it_went_away(docker_engine_scratch, tmp_path, docker_config):  # noqa: F811
    client, made = docker_engine_scratch
    registry = start_registry(tmp_path / "registry", auth=False)
    try:
        name = "cudastack-test/midpush-" + os.urandom(4).hex()
        _big_image(client, name)
        target = f"{registry.host}/ci/midpush:v1"
        made += [f"{name}:src", target]
        uploads = registry.root / "data"
        killed = threading.Event()

        def kill_when_uploading() -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if any(p.name == "_uploads" for p in uploads.rglob("_uploads")):
                    registry.proc.kill()          # SIGKILL: the registry vanishes mid-upload
                    registry.proc.wait()
                    killed.set()
                    return
                time.sleep(0.05)

        watcher = threading.Thread(target=kill_when_uploading, daemon=True)
        watcher.start()
        with pytest.raises(RegistryError) as exc:
            reg.push_image(f"{name}:src", target, client=client)
        watcher.join(timeout=5)
        assert killed.is_set(), "the push finished before the registry could be killed"
        msg = str(exc.value)
        assert "went away during the push" in msg and "no longer answers" in msg, msg
        assert "docker login" not in msg
        assert exc.value.exit_code == 8
    finally:
        registry.stop()


class _Recorder(http.server.BaseHTTPRequestHandler):
    """Records every request (path + Authorization header) and answers as the class says."""

    seen: list = []
    challenge = ""

    def do_GET(self):  # noqa: N802
        type(self).seen.append((self.path, self.headers.get("Authorization", "")))
        if self.path.startswith("/v2/") and type(self).challenge and \
                self.headers.get("Authorization", "") != "Bearer t0k3n":
            self.send_response(401)
            self.send_header("WWW-Authenticate", type(self).challenge)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b'{"token": "t0k3n"}' if self.path.startswith("/token") else b"{}"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Docker-Content-Digest", "sha256:" + "a" * 64)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *a):
        pass


def _serve(host: str, handler) -> http.server.ThreadingHTTPServer:
    srv = http.server.ThreadingHTTPServer((host, 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def _non_loopback_address() -> str:
    """An IPv4 address of this host that is not loopback (any interface's: the Docker bridge, the LAN)."""
    import socket

    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    pytest.fail("this host has no non-loopback IPv4 address to serve the token service on")


@pytest.mark.docker
def test_login_is_never_sent_to_a_plain_http_realm_off_this_host(docker_config, docker_engine_scratch):  # noqa: F811
    client, _ = docker_engine_scratch
    secret = "pw-" + os.urandom(8).hex()

    class Realm(_Recorder):
        seen: list = []

    class Registry(_Recorder):
        seen: list = []

    realm = _serve(_non_loopback_address(), Realm)
    registry = _serve("127.0.0.1", Registry)
    host = f"127.0.0.1:{registry.server_address[1]}"
    docker_config(host, "ci-user", secret)
    sent = base64.b64encode(f"ci-user:{secret}".encode()).decode()
    try:
        rhost, rport = realm.server_address[:2]
        Registry.challenge = f'Bearer realm="http://{rhost}:{rport}/token",service="r",scope="repository:ci/x:pull"'
        for kw in ({}, {"client": client}):                      # skopeo, then the engine
            with pytest.raises(RegistryError, match="neither https nor a loopback") as exc:
                registry_digest.resolve_digest(f"{host}/ci/x:v1", **kw)
            assert secret not in str(exc.value)
        with pytest.raises(RegistryError, match="neither https nor a loopback"):
            reg.pull_by_digest(f"{host}/ci/x@sha256:" + "a" * 64, client=client)
        blob = repr(Realm.seen) + repr(Registry.seen)
        assert Realm.seen == [] and secret not in blob and sent not in blob
        assert all(path == "/v2/" and auth == "" for path, auth in Registry.seen), Registry.seen

        # the same login to a token service on loopback is sent by skopeo, and the digest read
        Realm.seen.clear()
        loop_realm = _serve("127.0.0.1", Realm)
        try:
            Registry.challenge = (f'Bearer realm="http://127.0.0.1:{loop_realm.server_address[1]}/token",'
                                  'service="r",scope="repository:ci/x:pull"')
            assert registry_digest.resolve_digest(f"{host}/ci/x:v1") == "sha256:" + hashlib.sha256(b"{}").hexdigest()
            assert any(auth == f"Basic {sent}" for _, auth in Realm.seen), Realm.seen
        finally:
            loop_realm.shutdown()
    finally:
        realm.shutdown()
        registry.shutdown()


@pytest.mark.network      # connects to an address off this host
def test_plain_http_registry_off_this_host_gets_nothing(docker_config):  # noqa: F811
    secret = "pw-" + os.urandom(8).hex()

    class Registry(_Recorder):
        seen: list = []
        challenge = 'Basic realm="r"'

    srv = _serve(_non_loopback_address(), Registry)
    try:
        host, port = srv.server_address[:2]
        docker_config(f"{host}:{port}", "u", secret)
        with pytest.raises(RegistryError, match="TLS with the registry .* failed.*Nothing was sent"):
            registry_digest.resolve_digest(f"{host}:{port}/ci/x:v1")
        assert Registry.seen == [], Registry.seen        # only a TLS hello arrived, never an HTTP request
    finally:
        srv.shutdown()
