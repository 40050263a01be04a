"""The one Docker SDK client of the build half, bound to the engine the docker CLI talks to.

Builds run through the docker CLI (BuildKit); inspect, tag, run, push and the cache check go through the
docker SDK. Both must reach the same engine, or a build lands on one engine while the cache check looks at
another. The CLI picks its engine in this order (Docker's CLI reference, "docker context" and "Environment
variables"): ``DOCKER_HOST``; else the context ``DOCKER_CONTEXT`` names; else ``currentContext`` of
``config.json`` in ``$DOCKER_CONFIG`` (default ``~/.docker``), which ``docker context use`` writes; else the
default context (the local socket). The SDK's ``docker.from_env()`` reads only ``DOCKER_HOST`` in the 7.0 and
7.1 releases this project admits (``docker>=7.0``), so every client here comes from :func:`docker_client`,
which walks the same order with the SDK's own readers (``docker.utils.kwargs_from_env`` for ``DOCKER_HOST``
and its TLS variables, ``docker.context.ContextAPI`` for the context's endpoint and TLS material).

Errors: :class:`cudastack.core.errors.EnvironmentError_` (exit 5, the one "no engine" code of build and validate
alike) naming the endpoint, where it came from, and how to start or choose an engine.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping

from cudastack.core.errors import EnvironmentError_

ENGINE_HINT = ("Start one: `sudo dockerd &` (or `sudo systemctl start docker`), or choose a running engine with "
               "`docker context use NAME` or DOCKER_HOST. On Debian/Ubuntu `sudo apt-get install docker.io` "
               "installs one.")


@dataclass(frozen=True)
class Endpoint:
    """Where the docker CLI would send a command: ``kwargs`` for ``docker.DockerClient`` (``base_url``,
    ``tls``; empty for the SDK's default socket) and ``source``, how it was chosen (for messages)."""

    kwargs: Mapping[str, Any]
    source: str

    @property
    def url(self) -> str:
        return str(self.kwargs.get("base_url") or "unix:///var/run/docker.sock")


def engine_endpoint(environ: Mapping[str, str] | None = None) -> Endpoint:
    """The engine the docker CLI uses with ``environ``'s DOCKER_HOST / DOCKER_CONTEXT (default ``os.environ``;
    ``DOCKER_CONFIG`` is read from the process environment, where the SDK's readers look); see the module doc
    for the order. Raises EnvironmentError_ when the named context does not exist (the CLI refuses it too)."""
    from docker.context import ContextAPI
    from docker.context.config import get_current_context_name
    from docker.utils import kwargs_from_env

    env = dict(os.environ if environ is None else environ)
    if env.get("DOCKER_HOST"):
        return Endpoint(kwargs_from_env(environment=env), f"DOCKER_HOST={env['DOCKER_HOST']}")
    name, where = env.get("DOCKER_CONTEXT"), "DOCKER_CONTEXT"
    if not name:
        name, where = get_current_context_name(), "currentContext of the docker config (`docker context use`)"
    if not name or name == "default":
        return Endpoint({}, "the default context")
    ctx = ContextAPI.get_context(name)
    if ctx is None or not ctx.Host:
        raise EnvironmentError_(f"The docker context {name!r} ({where}) does not exist or names no Docker endpoint. "
                                "List them with `docker context ls`; choose one with `docker context use NAME`.")
    kwargs: dict[str, Any] = {"base_url": ctx.Host}
    if ctx.TLSConfig is not None:
        kwargs["tls"] = ctx.TLSConfig
    return Endpoint(kwargs, f"docker context {name!r} ({where})")


def docker_client(timeout: int = 120, environ: Mapping[str, str] | None = None):
    """A ``docker.DockerClient`` for :func:`engine_endpoint` that answers ping (``timeout``: seconds per API
    call). Raises EnvironmentError_ (exit 5) in one paragraph when no engine answers there."""
    import docker

    ep = engine_endpoint(environ)
    try:
        client = docker.DockerClient(timeout=timeout, **ep.kwargs)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - DockerException, requests' ConnectionError, FileNotFoundError ...
        raise EnvironmentError_(f"No Docker engine answers at {ep.url} ({ep.source}; {type(exc).__name__}: {exc}). "
                                f"{ENGINE_HINT}") from None
    return client
