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

``CUDASTACK_LANE_SHARD=k/n`` runs shard ``k`` of ``n`` of whatever the run selects (``-m``): whole test files
(module fixtures stay in one process) dealt to the shards largest first, each to the shard with the fewest tests
so far, so ``n`` processes started with ``0/n`` .. ``n-1/n`` run every selected test once (the network lane runs as
two, scripts/dev.sh).

In CI mode (``CUDASTACK_REQUIRE_ALL``, tests/require_all.py) a test that skips because the engine is missing
fails too. Off these lanes this plugin does nothing.
"""
from __future__ import annotations

import ipaddress
import os
import re
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
    _SHARD["value"] = os.environ.pop("CUDASTACK_LANE_SHARD", "")
    _SHARD["start"] = os.environ.pop("CUDASTACK_LANE_SHARD_START", "")
    sh = shard()                                # a bad value stops the run here, before collection
    if sh is not None:
        handicap(sh[1])
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


_SHARD: dict[str, str] = {}


def shard() -> tuple[int, int] | None:
    """``(k, n)`` from ``CUDASTACK_LANE_SHARD`` as this run found it (None when unset); a value that is not ``k/n``
    with 0 <= k < n is a usage error naming the variable. The variable is taken out of the environment at
    configure time, so a pytest that a test starts runs its own selection whole."""
    value = _SHARD.get("value", os.environ.get("CUDASTACK_LANE_SHARD", "")).strip()
    if not value:
        return None
    m = re.fullmatch(r"(\d+)/(\d+)", value)
    if not m or not int(m.group(1)) < int(m.group(2)):
        raise pytest.UsageError(f"CUDASTACK_LANE_SHARD={value!r}: give k/n with 0 <= k < n (e.g. 0/2 and 1/2 for two "
                                "processes), or leave it unset to run every selected test")
    return int(m.group(1)), int(m.group(2))


def handicap(n: int) -> list[int] | None:
    """``CUDASTACK_LANE_SHARD_START`` as this run found it: ``n`` comma-separated test counts, each shard's load
    before dealing (scripts/dev.sh gives the shard that runs after the fast lane a head start's worth of tests to
    the other); unset: none. Every shard of a lane must be given the same value."""
    value = _SHARD.get("start", os.environ.get("CUDASTACK_LANE_SHARD_START", "")).strip()
    if not value:
        return None
    parts = value.split(",")
    if len(parts) != n or not all(x.strip().isdigit() for x in parts):
        raise pytest.UsageError(f"CUDASTACK_LANE_SHARD_START={value!r}: give {n} comma-separated whole numbers, one "
                                "per shard (e.g. 0,60), or leave it unset")
    return [int(x) for x in parts]


def deal(counts: dict[str, int], n: int, start: list[int] | None = None) -> list[set[str]]:
    """Files (name -> number of selected tests) dealt to ``n`` shards: largest first (ties by name), each to the
    shard with the fewest tests so far (ties to the lowest index). ``start``: each shard's load before the first
    file (a shard that starts later begins with a handicap). Deterministic: every process computes the same."""
    shards: list[set[str]] = [set() for _ in range(n)]
    load = list(start) if start else [0] * n
    for name in sorted(counts, key=lambda f: (-counts[f], f)):
        i = min(range(n), key=lambda j: (load[j], j))
        shards[i].add(name)
        load[i] += counts[name]
    return shards


@pytest.hookimpl(trylast=True)      # after -m / -k deselected theirs: deal only what this run selects
def pytest_collection_modifyitems(config, items):
    sh = shard()
    if sh is None:
        return
    k, n = sh
    counts: dict[str, int] = {}
    for it in items:
        counts[str(it.path)] = counts.get(str(it.path), 0) + 1
    mine = deal(counts, n, handicap(n))[k]
    keep = [it for it in items if str(it.path) in mine]
    drop = [it for it in items if str(it.path) not in mine]
    if drop:
        config.hook.pytest_deselected(items=drop)
    items[:] = keep
