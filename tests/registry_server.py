"""Pytest fixtures: a real distribution registry (Debian's ``docker-registry``) on a free loopback port.

``registry_server`` serves without auth, ``auth_registry_server`` with htpasswd basic auth (bcrypt, made by
``htpasswd -Bbn``). Both yield a :class:`LocalRegistry`. ``docker_config`` points DOCKER_CONFIG at a fresh
folder so tests never read or write the user's credentials. Import the fixtures into a test module with
``from registry_server import registry_server, auth_registry_server, docker_config  # noqa: F401``.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

REGISTRY_BIN = shutil.which("docker-registry") or shutil.which("registry")


@dataclass
class LocalRegistry:
    host: str                 # "127.0.0.1:PORT"
    root: Path
    username: str = ""
    password: str = ""
    proc: subprocess.Popen | None = None

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_registry(root: Path, *, auth: bool) -> LocalRegistry:
    if not REGISTRY_BIN:
        pytest.skip("docker-registry (the distribution registry) is not installed")
    root.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    reg = LocalRegistry(host=f"127.0.0.1:{port}", root=root)
    lines = [
        "version: 0.1",
        "log:", "  level: warn",
        "storage:", "  filesystem:", f"    rootdirectory: {root / 'data'}", "  delete:", "    enabled: true",
        "http:", f"  addr: 127.0.0.1:{port}",
    ]
    if auth:
        if not shutil.which("htpasswd"):
            pytest.skip("htpasswd (apache2-utils) is not installed")
        reg.username, reg.password = "ci-user", "s3cret-" + os.urandom(6).hex()
        out = subprocess.run(["htpasswd", "-Bbn", reg.username, reg.password], check=True,
                             capture_output=True, text=True).stdout
        (root / "htpasswd").write_text(out)
        lines += ["auth:", "  htpasswd:", "    realm: basic-realm", f"    path: {root / 'htpasswd'}"]
    (root / "config.yml").write_text("\n".join(lines) + "\n")
    log = open(root / "registry.log", "wb")
    reg.proc = subprocess.Popen([REGISTRY_BIN, "serve", str(root / "config.yml")], stdout=log, stderr=log)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            r = requests.get(f"http://{reg.host}/v2/", timeout=1)
            if r.status_code in (200, 401):
                return reg
        except requests.RequestException:
            pass
        if reg.proc.poll() is not None:
            break
        time.sleep(0.2)
    reg.stop()
    raise RuntimeError(f"docker-registry did not start: {(root / 'registry.log').read_text()[-2000:]}")


@pytest.fixture
def registry_server(tmp_path_factory):
    reg = start_registry(tmp_path_factory.mktemp("registry"), auth=False)
    yield reg
    reg.stop()


@pytest.fixture
def auth_registry_server(tmp_path_factory):
    reg = start_registry(tmp_path_factory.mktemp("registry-auth"), auth=True)
    yield reg
    reg.stop()


@pytest.fixture
def docker_config(tmp_path, monkeypatch):
    """An empty Docker config folder (DOCKER_CONFIG). Returns a function login(host, user, password) that
    writes an ``auths`` entry the way ``docker login`` does without a credential helper."""
    folder = tmp_path / "docker-config"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"auths": {}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))

    def login(host: str, user: str, password: str) -> Path:
        cfg = json.loads((folder / "config.json").read_text())
        cfg["auths"][host] = {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}
        (folder / "config.json").write_text(json.dumps(cfg))
        return folder / "config.json"

    login.folder = folder
    return login
