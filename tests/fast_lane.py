"""pytest plugin: the fast lane's guard (``scripts/dev.sh test --fast`` sets ``CUDASTACK_FAST_LANE=1``).

The fast lane runs every test not marked docker, registry, network, gpu or stack. So that a test that needs a
service but lacks its marker fails loudly there instead of passing by luck (a warm cache, a daemon that happens
to run), the lane makes every service unreachable for the whole run:

* Docker: ``DOCKER_HOST`` points at a socket nobody serves (the SDK and the CLI, in this process and in every
  child, get "no engine answers");
* the network: every HTTP client in a child process goes through a dead proxy (``HTTP(S)_PROXY`` =
  127.0.0.1:9), pip does not retry, uv is offline, and in this process a connection to any address other than
  loopback raises :class:`ServiceNotMarked` naming the test and the marker it lacks.

The network lane (``CUDASTACK_NETWORK_LANE=1``: the tests marked network and no other service, run beside the
Docker lane by ``scripts/dev.sh test``) gets the Docker half only: ``DOCKER_HOST`` points nowhere, so a test there
that reaches for the engine fails naming the marker it lacks, instead of racing the Docker lane's builds.

In CI mode (``CUDASTACK_REQUIRE_ALL``, tests/require_all.py) a test that skips because the engine is missing
fails too. Off these lanes this plugin does nothing.
"""
from __future__ import annotations

import ipaddress
import os
import socket

import pytest

DEAD_PROXY = "http://127.0.0.1:9"
NO_DOCKER = "unix:///nonexistent/fast-lane-no-docker.sock"
_current = {"test": "?"}


class ServiceNotMarked(ConnectionRefusedError):
    """A test of the fast lane reached for the network."""


def active() -> bool:
    return os.environ.get("CUDASTACK_FAST_LANE", "").strip().lower() in ("1", "true", "yes")


def network_lane() -> bool:
    return os.environ.get("CUDASTACK_NETWORK_LANE", "").strip().lower() in ("1", "true", "yes")


def _loopback(address) -> bool:
    if not isinstance(address, tuple):          # AF_UNIX paths and the like: local
        return True
    host = str(address[0])
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False                            # a host name: resolving it is the network already


def _guarded(orig):
    def connect(self, address):
        if not _loopback(address):
            raise ServiceNotMarked(
                f"fast lane: {_current['test']} connected to {address!r}, but it carries no network (or registry) "
                "marker. Mark it @pytest.mark.network (PyPI), @pytest.mark.registry or @pytest.mark.docker, or make "
                "it work offline.")
        return orig(self, address)
    return connect


def _docker_guarded(orig):
    def connect(self, address):
        if address == NO_DOCKER.removeprefix("unix://"):
            raise ServiceNotMarked(f"network lane: {_current['test']} connected to Docker ({NO_DOCKER}), but it "
                                   "carries no docker marker. Mark it @pytest.mark.docker.")
        return orig(self, address)
    return connect


def pytest_configure(config):
    if network_lane() and not active():
        os.environ.update({"DOCKER_HOST": NO_DOCKER, "DOCKER_CONTEXT": ""})
        socket.socket.connect = _docker_guarded(socket.socket.connect)      # type: ignore[method-assign]
        return
    if not active():
        return
    os.environ.update({"DOCKER_HOST": NO_DOCKER, "DOCKER_CONTEXT": "", "HTTP_PROXY": DEAD_PROXY,
                       "HTTPS_PROXY": DEAD_PROXY, "http_proxy": DEAD_PROXY, "https_proxy": DEAD_PROXY,
                       "ALL_PROXY": DEAD_PROXY, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
                       "PIP_RETRIES": "0", "PIP_TIMEOUT": "5", "UV_OFFLINE": "1"})
    socket.socket.connect = _guarded(socket.socket.connect)            # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded(socket.socket.connect_ex)      # type: ignore[method-assign]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _current["test"] = item.nodeid
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed:
        return
    text = str(rep.longrepr)
    if network_lane() and not active() and "fast-lane-no-docker" in text:
        rep.sections.append(("network lane", "This test reached Docker, which the network lane makes unreachable: "
                             "it needs the docker marker."))
        return
    if not active():
        return
    if "fast-lane-no-docker" in text or "127.0.0.1:9" in text or "ServiceNotMarked" in text:
        rep.sections.append(("fast lane", "This test reached Docker or the network, which the fast lane makes "
                             "unreachable: it needs the marker of that service (docker, registry, network)."))
