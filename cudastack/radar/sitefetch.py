"""Laying released wheels out as a site without installing them: only the members the validation suite's readers
open travel, read out of the wheel's zip over HTTP range requests.

A wheel is a zip (PEP 427) whose central directory sits at its end; each member's local header records where its
compressed bytes lie. :class:`SpanReader` is a seekable, read-only view of a remote file that serves
:mod:`zipfile` from ranges it has fetched and can fetch many members in a few requests
(:meth:`SpanReader.prefetch` merges neighbouring members' byte ranges into one ``Range: bytes=A-B`` each). So
laying out a 430 MB vllm wheel costs its central directory and its Python files (a few tens of MB, not the
``.so`` files), and a torch wheel only its ``*.dist-info`` (a few hundred KiB): the readers need torch's version
and CUDA variant (its ``Requires-Dist``), never its code.

:func:`lay_out` writes one release's wanted members under ``<cache>/site/<sha256>-<what>/`` (marked complete last,
so an interrupted lay-out is redone, and kept for good: a file on an index never changes under its hash). The
folder is a ``sys.path`` entry: ``importlib.metadata`` finds the ``*.dist-info`` and ``importlib.util.find_spec``
the packages, which is how the suite's readers (:mod:`stackprobe.source`, ``dist_version``) find an installed
package. :mod:`stackprobe.site` runs the readers over such folders.

When a server ignores ``Range`` (HTTP 200 to a range request), the whole file is downloaded through
:meth:`cudastack.pkgindex.client.Index.download` (checked against its sha256) and the same members are read from it.
Bytes that travelled are counted in ``Index.stats["bytes_ranged"]`` (range reads) and ``bytes_downloaded``
(whole files), so a benchmark can add them up. Sources: PEP 427 (wheel layout), RFC 9110 section 14 (range
requests, 206 Partial Content), the zip format (APPNOTE 4.3.7 local file header: 30 bytes plus name and extra
field) as Python's :mod:`zipfile` reads it.
"""
from __future__ import annotations

import io
import os
import shutil
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

import requests

from cudastack.core.errors import RegistryError
from cudastack.pkgindex.client import Index, IndexFile
from cudastack.pkgindex.wheels import HTTP_TIMEOUT

#: what to take out of a wheel: "meta" = only ``*.dist-info/*`` (no package folder: a folder of a few files would
#: import as a namespace package); "py" = that and every ``*.py`` file
WHAT = ("meta", "py")
#: the distributions whose Python sources the readers open; every other one is laid out with its metadata only
SOURCE_DISTS = ("vllm", "sglang", "flashinfer-python", "b12x", "sglang-kernel", "sgl-kernel")
_TAIL = 64 * 1024          # the first read at the end: the zip's end record and most of a small central directory
_GAP = 256 * 1024          # members closer than this are fetched in one range
_LOCAL_SLACK = 1024        # a local header's name and extra field, read with the member's bytes


class RangeUnsupported(Exception):
    """The server answered a range request with the whole body (or an error)."""


class SpanReader(io.RawIOBase):
    """A seekable view of ``url`` (``size`` bytes) over HTTP range requests, served from the spans fetched so far.
    ``fetched``: bytes that travelled; ``requests``: range requests made. Raises :class:`RangeUnsupported` when the
    server does not answer 206."""

    def __init__(self, session: requests.Session, url: str, size: int):
        self._s, self._url, self._size, self._pos = session, url, size, 0
        self._spans: list[tuple[int, bytes]] = []
        self.fetched = 0
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

    def _get(self, start: int, end: int) -> None:
        """Fetch bytes ``start`` .. ``end`` - 1 and keep them as one span."""
        end = min(end, self._size)
        if start >= end:
            return
        try:
            r = self._s.get(self._url, headers={"Range": f"bytes={start}-{end - 1}"}, timeout=HTTP_TIMEOUT)
        except requests.RequestException as e:
            raise RegistryError(f"range read of {self._url} failed: {type(e).__name__}: {e}") from None
        self.requests += 1
        if r.status_code != 206:
            raise RangeUnsupported(f"HTTP {r.status_code} to a range request for {self._url}")
        self.fetched += len(r.content)
        self._spans.append((start, r.content))

    def _find(self, pos: int) -> tuple[int, bytes] | None:
        for start, data in self._spans:
            if start <= pos < start + len(data):
                return start, data
        return None

    def prefetch(self, ranges: list[tuple[int, int]]) -> None:
        """Fetch ``[(start, end), ...]`` (end exclusive), merging ranges closer than 256 KiB into one request."""
        merged: list[list[int]] = []
        for a, b in sorted(ranges):
            if merged and a - merged[-1][1] <= _GAP:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        for a, b in merged:
            self._get(a, b)

    def readinto(self, buf) -> int:
        if self._pos >= self._size:
            return 0
        hit = self._find(self._pos)
        if hit is None:
            self._get(self._pos, self._pos + max(len(buf), _TAIL))
            hit = self._find(self._pos)
            if hit is None:
                return 0
        start, data = hit
        chunk = data[self._pos - start:self._pos - start + len(buf)]
        buf[:len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)


def _wanted(name: str, what: str) -> bool:
    first = name.split("/", 1)[0]
    if first.endswith(".dist-info"):
        return not name.endswith("/RECORD")
    return what == "py" and name.endswith(".py")


def _safe(name: str, f: IndexFile) -> PurePosixPath:
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts:
        raise RegistryError(f"{f.filename} holds a member outside its folder ({name!r}); refusing to lay it out.")
    return p


def _extract(z: zipfile.ZipFile, infos: list[zipfile.ZipInfo], dest: Path, f: IndexFile) -> int:
    for i in infos:
        out = dest / _safe(i.filename, f)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_bytes(z.read(i))
    return len(infos)


def site_dir(index: Index, f: IndexFile, what: str) -> Path:
    return index.cache / "site" / f"{f.sha256}-{what}"


def lay_out(index: Index, f: IndexFile, what: str = "py") -> Path:
    """The wanted members of wheel ``f`` under the cache (see the module docstring); returns the folder, a
    ``sys.path`` entry. ``what``: "meta" (``*.dist-info`` only) or "py" (and every ``*.py``). Raises ValueError for
    another ``what`` or an sdist, RegistryError when the file cannot be read."""
    if what not in WHAT:
        raise ValueError(f"what={what!r}: use one of {WHAT}")
    if f.kind != "wheel":
        raise ValueError(f"{f.filename} is not a wheel: only a wheel's zip can be laid out without building it")
    root = site_dir(index, f, what)
    if (root / ".complete").is_file():
        index.stats["sites_cached"] = index.stats.get("sites_cached", 0) + 1
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=root.parent, prefix=".layout."))
    try:
        n = _lay_out_ranged(index, f, what, tmp)
        (tmp / ".complete").write_text(f"{f.filename} {f.sha256} {what}: {n} members\n")
        if root.exists():
            shutil.rmtree(root)
        os.replace(tmp, root)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    index.stats["sites_laid_out"] = index.stats.get("sites_laid_out", 0) + 1
    return root


def _lay_out_ranged(index: Index, f: IndexFile, what: str, dest: Path) -> int:
    size = f.size
    try:
        if not size:
            h = index.session.head(f.url, timeout=HTTP_TIMEOUT, allow_redirects=True)
            size = int(h.headers.get("content-length") or 0)
        if not size:
            raise RangeUnsupported("no size known")
        rd = SpanReader(index.session, f.url, size)
        try:
            rd.prefetch([(max(0, size - _TAIL), size)])
            with zipfile.ZipFile(rd) as z:
                infos = [i for i in z.infolist() if not i.is_dir() and _wanted(i.filename, what)]
                rd.prefetch([(i.header_offset, i.header_offset + 30 + len(i.filename.encode()) + _LOCAL_SLACK
                              + i.compress_size) for i in infos])
                return _extract(z, infos, dest, f)
        finally:
            index.stats["bytes_ranged"] = index.stats.get("bytes_ranged", 0) + rd.fetched
            index.stats["range_requests"] = index.stats.get("range_requests", 0) + rd.requests
    except (RangeUnsupported, zipfile.BadZipFile):
        with zipfile.ZipFile(index.download(f)) as z:
            infos = [i for i in z.infolist() if not i.is_dir() and _wanted(i.filename, what)]
            return _extract(z, infos, dest, f)


def bytes_moved(index: Index) -> int:
    """Bytes that travelled for ``index`` so far: whole downloads plus range reads (the project pages and PEP 658
    metadata files are not counted by the client; they are a few hundred KiB)."""
    return int(index.stats.get("bytes_downloaded", 0)) + int(index.stats.get("bytes_ranged", 0))
