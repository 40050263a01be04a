"""Credentials inside URLs: split them off, keep them out of everything that is written down.

A recipe may name a private package index with the login in the URL's userinfo
(``https://user:token@pypi.example/simple``, RFC 3986 section 3.2.1). That URL must reach pip inside the build
and nothing else:

* the plan's build arg ``PIP_INDEX_URL`` carries the URL without userinfo (build args persist in the image
  history: ``docker history`` shows every ``ARG`` value a ``RUN`` saw); the full URL goes to the build as the
  BuildKit secret ``pipindex`` (a file mounted only for the ``RUN`` that needs it, never stored in a layer),
  which the images' ``with-build-ca`` wrapper exports as ``PIP_INDEX_URL`` for pip;
* lockfiles, build records and build logs pass through :func:`scrub`, which removes the userinfo of every
  URL in a string (or in every string of a JSON-like structure).
"""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

#: scheme://userinfo@ : the userinfo part of any URL in free text (logs: pip prints index URLs)
_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<userinfo>[^/?#@\s'\"<>]+)@")


def _drop(m: re.Match) -> str:
    # ssh's user name (git+ssh://git@github.com/...) is an account, not a secret: kept
    if "ssh" in m.group("scheme").lower() and ":" not in m.group("userinfo"):
        return m.group(0)
    return m.group("scheme")


def split_userinfo(url: str) -> tuple[str, bool]:
    """(``url`` without its userinfo, whether it had one): ``https://u:p@host:8443/simple`` ->
    (``https://host:8443/simple``, True). A string that is not a URL comes back unchanged with False."""
    if not url or "@" not in url:
        return url, False
    parts = urlsplit(url)
    if not parts.scheme or "@" not in parts.netloc:
        return url, False
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment)), True


def redact(url: str) -> str:
    """``url`` without its userinfo (see :func:`split_userinfo`)."""
    return split_userinfo(url)[0]


def scrub(value: Any) -> Any:
    """Remove the userinfo of every URL in ``value``: a string, or the strings inside dicts, lists and tuples
    (keys included); other values come back as they are."""
    if isinstance(value, str):
        return _USERINFO.sub(_drop, value) if "@" in value else value
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    if isinstance(value, tuple):
        return tuple(scrub(v) for v in value)
    return value
