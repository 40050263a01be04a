"""Reaching a registry and the Docker engine before any login is handed over: the credential store's login
for a registry (read through the docker SDK's ``docker.auth``), the registry's HTTP base URL, :func:`ping`
(one credential-free ``GET /v2/``, Distribution spec "API version check"), :func:`check_login_destination`
(credentials go only over https or to this machine, the rule of :mod:`cudastack.core.credentials`),
:func:`checked_login` (the two together); the engine's client is :func:`cudastack.core.docker_engine.docker_client`. Why this is our own code and not a
maintained client's is in :mod:`cudastack.registry.client`'s docstring; callers import these names from there.
"""
from __future__ import annotations

import re
from typing import Optional

import requests

from cudastack.core.errors import EnvironmentError_, RegistryError
from cudastack.registry.reference import DOCKER_HUB, DOCKER_HUB_API, is_loopback


# --------------------------------------------------------------------------------------------- credentials
def registry_credentials(registry: str, config_path: Optional[str] = None) -> Optional[dict]:
    """The credentials the Docker credential store holds for ``registry`` (host[:port]), as the docker SDK
    resolves them: ``{"Username": ..., "Password": ...}`` or ``{"IdentityToken": ...}``, or None.
    Raises EnvironmentError_ when a configured credential helper fails (the helper's name, never a secret)."""
    import docker.auth
    import docker.errors

    try:
        cfg = docker.auth.load_config(config_path=config_path)
        auth = cfg.resolve_authconfig(registry if registry != DOCKER_HUB else None)
    except docker.errors.DockerException as exc:
        raise EnvironmentError_(
            f"The Docker credential store could not be read for {registry} ({type(exc).__name__}). Check the "
            "credsStore/credHelpers entries in your Docker config.json (DOCKER_CONFIG) and that the helper runs."
        ) from None
    if not auth:
        return None
    out = {k: auth[k] for k in ("Username", "Password", "IdentityToken") if auth.get(k)}
    # legacy "auth": base64(user:pass) entries are decoded by load_config into username/password
    if not out and auth.get("username"):
        out = {"Username": auth["username"], "Password": auth.get("password", "")}
    return out or None


# --------------------------------------------------------------------------------------------- reachability
def registry_url(registry: str) -> str:
    """Base URL of ``registry``'s HTTP API: ``http://`` for a loopback host (insecure by default for the
    engine), ``https://`` otherwise; Docker Hub's API is on ``registry-1.docker.io``."""
    host = DOCKER_HUB_API if registry == DOCKER_HUB else registry
    return f"{'http' if is_loopback(host) else 'https'}://{host}"


def ping(registry: str, *, timeout: float = 30.0) -> Optional[str]:
    """``GET /v2/`` on ``registry`` (host[:port]) with no credentials. Returns the ``WWW-Authenticate``
    challenge of a 401 (None on 200). Raises RegistryError when nothing answers, TLS fails, or the answer is
    not a V2 registry's. Our own call: see the module docstring."""
    url = f"{registry_url(registry)}/v2/"
    try:
        r = requests.get(url, timeout=timeout, allow_redirects=False)
    except requests.exceptions.SSLError as exc:
        raise RegistryError(
            f"TLS with the registry {registry} failed ({type(exc).__name__}). If it serves plain HTTP, use a "
            "loopback address or put it behind https; if it uses a private CA, set REQUESTS_CA_BUNDLE and add "
            "the CA to the engine (/etc/docker/certs.d). Nothing was sent."
        ) from None
    except requests.exceptions.RequestException as exc:
        raise RegistryError(
            f"The registry {registry} does not answer at {url} ({type(exc).__name__}). Start it or check its "
            "host and port (push: --registry; pull: the reference the lockfile recorded); nothing was pushed, "
            "pulled or recorded."
        ) from None
    if r.status_code == 200:
        return None
    if r.status_code == 401:
        return r.headers.get("WWW-Authenticate", "")
    raise RegistryError(f"{url} answered HTTP {r.status_code}; this is not a Docker Registry V2 endpoint. "
                        "Check the registry host and port.")


def _login_url_ok(url: str) -> bool:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.scheme == "https" or (parts.scheme == "http" and is_loopback(parts.hostname or ""))


def check_login_destination(registry: str, challenge: Optional[str], credentials: Optional[dict]) -> None:
    """Raise RegistryError, before any tool is handed a login, when the store holds ``credentials`` for
    ``registry`` and its Bearer ``challenge`` (from :func:`ping`) names a token service (``realm``) that is
    neither https nor loopback. (The registry itself is reached over https unless it is on loopback:
    :func:`registry_url`.) No credentials: nothing to check."""
    if not credentials:
        return
    scheme, _, rest = (challenge or "").strip().partition(" ")
    params = dict(re.findall(r'(\w+)="([^"]*)"', rest))
    realm = params.get("realm", "")
    if scheme.lower() == "bearer" and realm and not _login_url_ok(realm):
        from urllib.parse import urlsplit

        p = urlsplit(realm)
        raise RegistryError(
            f"The registry {registry} asks for the login to be sent to its token service at "
            f"{p.scheme or '?'}://{p.netloc.rsplit('@', 1)[-1]}{p.path}, which is neither https nor a loopback "
            "address; credentials are sent only over https (or to this machine). Nothing was sent. Serve the "
            "registry's token service over https, or use a registry on a loopback address."
        )


def checked_login(registry: str, *, timeout: float = 30.0) -> Optional[dict]:
    """The credential store's login for ``registry`` (or None), once :func:`ping` answered and
    :func:`check_login_destination` allows handing it to a tool. Raises RegistryError otherwise."""
    challenge = ping(registry, timeout=timeout)
    creds = registry_credentials(registry)
    check_login_destination(registry, challenge, creds)
    return creds


# --------------------------------------------------------------------------------------------- engine side
