"""Reading wheels for the package-index client: a zip over HTTP range requests, the METADATA member, and
the tags and markers an interpreter accepts.

:class:`RangeFile` lets :mod:`zipfile` read one member of a remote wheel by fetching only the blocks it
touches (the zip's central directory and that member), so the core metadata or a shared object's header of a
900 MB wheel costs a few hundred KiB; it raises :class:`NoRanges` when a server ignores ``Range``.
:func:`read_metadata_member` picks ``*.dist-info/METADATA`` out of an open wheel. :func:`supported_tags` and
:func:`marker_env` give the PEP 425 tags and PEP 508 marker environment of a CPython on Linux, for choosing a
release's file and evaluating its ``Requires-Dist``. :mod:`cudastack.pkgindex.client` (the index client and cache)
is the caller and re-exports the public names. Sources: PEP 427 (wheel layout), PEP 425/600 (tags,
manylinux), PEP 508 (markers), the zip format (APPNOTE) as Python's ``zipfile`` reads it.
"""
from __future__ import annotations

import io
import zipfile

import requests
from packaging.tags import Tag

#: Seconds to connect / to read, for every request to an index (:mod:`requests` timeout tuple).
HTTP_TIMEOUT = (10, 120)
_BLOCK = 256 * 1024


class RangeFile(io.RawIOBase):
    """A read-only, seekable view of a remote file over HTTP range requests (block cached), so
    ``zipfile`` can read one member of a large wheel. Raises :class:`NoRanges` when the server answers
    a range request with the whole body."""

    def __init__(self, session: requests.Session, url: str, size: int):
        self._s, self._url, self._size, self._pos = session, url, size, 0
        self._blocks: dict[int, bytes] = {}
        self.requests = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def _block(self, i: int) -> bytes:
        if i not in self._blocks:
            start = i * _BLOCK
            end = min(self._size, start + _BLOCK) - 1
            r = self._s.get(self._url, headers={"Range": f"bytes={start}-{end}"}, timeout=HTTP_TIMEOUT, stream=True)
            self.requests += 1
            if r.status_code != 206:
                r.close()
                raise NoRanges(f"HTTP {r.status_code} to a range request")
            self._blocks[i] = r.content
        return self._blocks[i]

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = self._size - self._pos
        n = min(n, self._size - self._pos)
        out = bytearray()
        while n > 0:
            i, off = divmod(self._pos, _BLOCK)
            chunk = self._block(i)[off:off + n]
            if not chunk:
                break
            out += chunk
            self._pos += len(chunk)
            n -= len(chunk)
        return bytes(out)

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)


class NoRanges(Exception):
    pass


def read_metadata_member(z: zipfile.ZipFile) -> bytes | None:
    """The ``<name>.dist-info/METADATA`` member of wheel ``z`` (bytes), or None when it has none."""
    names = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
    if not names:
        return None
    return z.read(names[0])


# ----------------------------------------------------------------------------------- tags
MIN_MANYLINUX_MINOR = 5         # manylinux1 == manylinux_2_5 (PEP 600)


def manylinux_platforms(glibc: str, machine: str = "x86_64") -> list[str]:
    """Every manylinux platform tag a system with ``glibc`` ("2.36") satisfies, newest first: PEP 600
    ``manylinux_2_Y_<machine>`` for Y down to 5 plus the legacy aliases manylinux2014 (2.17), manylinux2010
    (2.12) and manylinux1 (2.5) (PEP 599, 571, 513). pip's ``--platform`` takes exact tags only. Our own code:
    ``packaging.tags`` builds this list only for the running interpreter's glibc (its ``_manylinux`` module is
    private), and the target here is an image's. Raises UsageError for a glibc not of the form 2.N."""
    import re

    from cudastack.core.errors import UsageError

    m = re.fullmatch(r"2\.(\d+)", glibc.strip())
    if not m:
        raise UsageError(f"glibc version {glibc!r} is not of the form 2.N (e.g. 2.36).")
    minor = int(m.group(1))
    tags = [f"manylinux_2_{y}_{machine}" for y in range(minor, MIN_MANYLINUX_MINOR - 1, -1)]
    for alias, y in (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5)):
        if minor >= y:
            tags.append(f"{alias}_{machine}")
    return tags


def supported_tags(python: str, glibc: tuple[int, int] = (2, 28), machine: str = "x86_64") -> list[Tag]:
    """Wheel tags an interpreter ``python`` ("3.11") on Linux ``machine`` with ``glibc`` accepts, best
    first (CPython, abi3, py3-none; manylinux_2_5 .. glibc plus the legacy aliases; linux_<machine>)."""
    from packaging import tags as T

    major, minor = (int(x) for x in python.split(".")[:2])
    plats = manylinux_platforms(f"{glibc[0]}.{glibc[1]}", machine) + [f"linux_{machine}"]
    out = list(T.cpython_tags((major, minor), platforms=plats))
    out += list(T.compatible_tags((major, minor), f"cp{major}{minor}", platforms=plats))
    return out


def marker_env(python: str, machine: str = "x86_64") -> dict:
    """A PEP 508 marker environment for CPython ``python`` on Linux ``machine``."""
    return {"python_version": ".".join(python.split(".")[:2]), "python_full_version": python.split("+")[0] + (".0" if python.count(".") == 1 else ""),
            "implementation_name": "cpython", "platform_python_implementation": "CPython", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": machine, "os_name": "posix", "platform_release": "",
            "platform_version": "", "implementation_version": python, "extra": ""}
