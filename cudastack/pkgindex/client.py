"""A package-index client for the upgrade radar: releases, files, core metadata and downloads, cached.

Speaks the Simple Repository API in its JSON form (PEP 691, ``Accept:
application/vnd.pypi.simple.v1+json``) against any index (PyPI's ``https://pypi.org/simple`` by
default, or a local one). A project page is cached for ``ttl`` seconds (it changes when a release is
uploaded); everything keyed by a file's sha256 is cached for good, because a file on an index never
changes under its hash:

* core metadata (``METADATA`` / ``PKG-INFO``): from the PEP 658 ``<file>.metadata`` URL when the index
  advertises it (``core-metadata``), else read out of the wheel with HTTP range requests (only the zip's
  central directory and the METADATA member travel: a 900 MB torch wheel costs a few hundred KiB), else
  from a full download (an index that ignores ``Range``, or an sdist);
* downloads, checked against the index's sha256 before they are kept (written to a temporary name and
  renamed, so an interrupted download leaves nothing behind);
* unpacked trees (wheel = zip, sdist = tar.gz/zip), one folder per file hash, marked complete last.

Layout under the cache root (``$CUDASTACK_CACHE`` or ``~/.cache/cudastack``)::

    index/<sha256 of index URL>[:16]/<project>.json   project pages (PEP 691 JSON + fetch time)
    metadata/<sha256>.METADATA                        core metadata by file hash
    files/<sha256>/<filename>                         downloads
    unpacked/<sha256>/                                unpacked trees (``.complete`` marks a finished one)

Errors: :class:`cudastack.core.errors.RegistryError` (exit 8) when the index is down, answers something other
than PEP 691 JSON, or a download's sha256 differs from the index's; :class:`UsageError` for an unknown
project. Sources: PEP 503, PEP 691 (JSON simple API), PEP 658/714 (``core-metadata``), PEP 427 (wheel
file names), the zip format (APPNOTE) as Python's ``zipfile`` reads it. Reading a wheel's zip over ranges, its
METADATA member, and the tags/markers an interpreter accepts live in :mod:`cudastack.pkgindex.wheels`.

Why our own client and not ``pypi-simple`` (PyPI, 1.8: it parses PEP 691 pages, fetches PEP 658 metadata and
checks a download's digest): what this module adds around those reads would stay ours (the cache keyed by
sha256, the project-page TTL with a stale copy when the index is down, METADATA and a shared object's header
read over HTTP ranges when an index has no PEP 658 file, the unpack guard), so only the page parsing would
move; that swap, and the dependency it adds, are not made yet.
"""
from __future__ import annotations

import email.parser
import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from urllib.parse import urljoin

import requests
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (InvalidSdistFilename, InvalidWheelFilename, canonicalize_name, parse_sdist_filename,
                             parse_wheel_filename)
from packaging.version import InvalidVersion, Version

from cudastack.core.errors import RegistryError, UsageError
from cudastack.pkgindex.wheels import HTTP_TIMEOUT, NoRanges, RangeFile, read_metadata_member
from stackprobe.api import atomic_path, write_atomic

DEFAULT_INDEX = "https://pypi.org/simple"
PEP691 = "application/vnd.pypi.simple.v1+json"
DEFAULT_TTL_S = 3600
_TIMEOUT = HTTP_TIMEOUT


def cache_root() -> Path:
    """``$CUDASTACK_CACHE`` or ``~/.cache/cudastack``."""
    env = os.environ.get("CUDASTACK_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "cudastack"


@dataclass(frozen=True)
class IndexFile:
    """One file of a release as the index lists it. ``kind``: "wheel" | "sdist"; ``tags``: the wheel's
    compatibility tags (empty for an sdist); ``core_metadata``: the index serves ``url + ".metadata"``."""

    project: str
    version: Version
    filename: str
    url: str
    sha256: str
    kind: str
    tags: frozenset = frozenset()
    requires_python: str = ""
    size: int = 0
    yanked: bool = False
    core_metadata: bool = False


@dataclass
class Project:
    """A project page: its files grouped by version (every version, pre-releases and yanked included)."""

    name: str
    index_url: str
    files: dict[Version, list[IndexFile]] = field(default_factory=dict)
    fetched_at: float = 0.0
    from_cache: bool = False

    def versions(self, prereleases: bool = False) -> list[Version]:
        """Versions with at least one file that is not yanked, ascending (PEP 440 order)."""
        return sorted(v for v, fs in self.files.items()
                      if any(not f.yanked for f in fs) and (prereleases or not (v.is_prerelease or v.is_devrelease)))

    def newest(self, prereleases: bool = False) -> Version | None:
        vs = self.versions(prereleases)
        return vs[-1] if vs else None



def atomic_write(path: Path, data: bytes) -> None:
    """The project's one atomic writer (:func:`stackprobe.atomic.write_atomic`)."""
    write_atomic(path, data)


class Index:
    """A PEP 691 index with a local cache. ``url``: the simple index root (default PyPI);
    ``cache``: the cache root (default :func:`cache_root`); ``ttl``: seconds a project page is reused;
    ``refresh``: ask the index again for every project page."""

    def __init__(self, url: str | None = None, cache: str | Path | None = None, ttl: float = DEFAULT_TTL_S,
                 refresh: bool = False, session: requests.Session | None = None):
        self.url = (url or os.environ.get("CUDASTACK_INDEX") or DEFAULT_INDEX).rstrip("/") + "/"
        self.cache = Path(cache) if cache else cache_root()
        self.ttl = ttl
        self.refresh = refresh
        self.session = session or requests.Session()
        self._projects: dict[str, Project] = {}
        self.stats = {"pages_fetched": 0, "pages_cached": 0, "metadata_fetched": 0, "metadata_cached": 0,
                      "downloads": 0, "downloads_cached": 0, "bytes_downloaded": 0}

    # ------------------------------------------------------------------------------- project pages
    def _page_path(self, name: str) -> Path:
        return self.cache / "index" / hashlib.sha256(self.url.encode()).hexdigest()[:16] / f"{name}.json"

    def project(self, name: str) -> Project:
        """The project page of ``name`` (cached ``ttl`` seconds; a stale copy is used, with a note in
        ``from_cache``, only when the index cannot be reached). Raises UsageError (no such project) or
        RegistryError (index down, not PEP 691 JSON)."""
        cname = canonicalize_name(name)
        if cname in self._projects:
            return self._projects[cname]
        path = self._page_path(cname)
        cached = None
        if path.is_file():
            try:
                cached = json.loads(path.read_text())
            except (OSError, ValueError):
                cached = None
        if cached and not self.refresh and time.time() - cached.get("fetched_at", 0) < self.ttl:
            self.stats["pages_cached"] += 1
            proj = self._parse(cname, cached["page"], cached["fetched_at"], True)
        else:
            url = urljoin(self.url, f"{cname}/")
            try:
                r = self.session.get(url, headers={"Accept": f"{PEP691}, application/json;q=0.5"}, timeout=_TIMEOUT)
            except requests.RequestException as exc:
                if cached:
                    proj = self._parse(cname, cached["page"], cached["fetched_at"], True)
                    self._projects[cname] = proj
                    return proj
                raise RegistryError(f"The package index {self.url} cannot be reached ({type(exc).__name__}: {exc}). "
                                    "Check the network or point --index (or CUDASTACK_INDEX) at a reachable "
                                    "PEP 691 index.") from None
            if r.status_code == 404:
                raise UsageError(f"The package index {self.url} has no project '{name}' (HTTP 404 for {url}). "
                                 "Check the name (PyPI spells it e.g. flashinfer-python, sglang-kernel).")
            ctype = r.headers.get("content-type", "").split(";")[0].strip()
            if r.status_code != 200 or "json" not in ctype:
                raise RegistryError(f"The package index {self.url} answered HTTP {r.status_code} ({ctype or 'no type'}) "
                                    f"for {url}; the radar needs the Simple API's JSON form (PEP 691, {PEP691}). "
                                    "Use an index that serves it (PyPI does).")
            page = r.json()
            now = time.time()
            atomic_write(path, json.dumps({"fetched_at": now, "url": url, "page": page}).encode())
            self.stats["pages_fetched"] += 1
            proj = self._parse(cname, page, now, False)
        self._projects[cname] = proj
        return proj

    def _parse(self, name: str, page: dict, fetched_at: float, from_cache: bool) -> Project:
        proj = Project(name, self.url, fetched_at=fetched_at, from_cache=from_cache)
        base = urljoin(self.url, f"{name}/")
        for f in page.get("files", []):
            fn = f.get("filename", "")
            try:
                if fn.endswith(".whl"):
                    _, ver, _, tags = parse_wheel_filename(fn)
                    kind = "wheel"
                else:
                    _, ver = parse_sdist_filename(fn)
                    tags, kind = frozenset(), "sdist"
            except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
                continue
            sha = (f.get("hashes") or {}).get("sha256", "")
            if not sha:
                continue
            cm = f.get("core-metadata", f.get("data-dist-info-metadata", False))
            proj.files.setdefault(ver, []).append(IndexFile(
                name, ver, fn, urljoin(base, f.get("url", fn)), sha, kind, frozenset(tags),
                f.get("requires-python") or "", int(f.get("size") or 0), bool(f.get("yanked")), bool(cm)))
        return proj

    # ----------------------------------------------------------------------------- metadata
    def metadata(self, f: IndexFile) -> Message:
        """Core metadata of file ``f`` (an ``email.message.Message``: ``get_all("Requires-Dist")``),
        cached by the file's sha256. Raises RegistryError when it cannot be read."""
        path = self.cache / "metadata" / f"{f.sha256}.METADATA"
        if path.is_file():
            self.stats["metadata_cached"] += 1
            return email.parser.BytesParser().parsebytes(path.read_bytes())
        data = None
        if f.core_metadata:
            r = self.session.get(f.url + ".metadata", timeout=_TIMEOUT)
            if r.status_code == 200:
                data = r.content
        if data is None and f.kind == "wheel":
            data = self._wheel_metadata_by_ranges(f)
        if data is None:
            data = self._metadata_from_file(self.download(f), f)
        atomic_write(path, data)
        self.stats["metadata_fetched"] += 1
        return email.parser.BytesParser().parsebytes(data)

    def _wheel_metadata_by_ranges(self, f: IndexFile) -> bytes | None:
        size = f.size
        try:
            if not size:
                h = self.session.head(f.url, timeout=_TIMEOUT, allow_redirects=True)
                size = int(h.headers.get("content-length") or 0)
            if not size:
                return None
            with zipfile.ZipFile(RangeFile(self.session, f.url, size)) as z:
                return read_metadata_member(z)
        except (NoRanges, zipfile.BadZipFile, requests.RequestException, ValueError):
            return None

    def _metadata_from_file(self, local: Path, f: IndexFile) -> bytes:
        if f.kind == "wheel":
            with zipfile.ZipFile(local) as z:
                data = read_metadata_member(z)
            if data is None:
                raise RegistryError(f"{f.filename} has no *.dist-info/METADATA: not a valid wheel.")
            return data
        if local.name.endswith(".zip"):
            with zipfile.ZipFile(local) as z:
                names = [n for n in z.namelist() if n.count("/") == 1 and n.endswith("/PKG-INFO")]
                if names:
                    return z.read(names[0])
        else:
            with tarfile.open(local) as t:
                for m in t.getmembers():
                    if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO"):
                        return t.extractfile(m).read()
        raise RegistryError(f"{f.filename} has no top-level PKG-INFO: cannot read its metadata.")

    def requires(self, f: IndexFile, env: dict | None = None) -> list[Requirement]:
        """``Requires-Dist`` of ``f`` whose markers hold in ``env`` (PEP 508 marker environment; no
        extras requested). Unparseable lines are skipped."""
        out = []
        for line in self.metadata(f).get_all("Requires-Dist") or []:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None:
                e = dict(env or {})
                e.setdefault("extra", "")
                try:
                    if not req.marker.evaluate(e):
                        continue
                except Exception:  # noqa: BLE001 - an unknown marker variable: keep the requirement
                    pass
            out.append(req)
        return out

    def cuda_runtime_major(self, f: IndexFile) -> tuple[int | None, str]:
        """CUDA major a wheel's shared objects link (``libcudart.so.<major>`` in the dynamic section
        of its smallest ``.so``: the first MiB of that member, read with range requests), cached by
        sha256. (None, why) for a wheel with no ``.so`` or no libcudart reference."""
        path = self.cache / "cudart" / f"{f.sha256}.json"
        if path.is_file():
            d = json.loads(path.read_text())
            return d["major"], d["evidence"]
        import re

        def read(z: zipfile.ZipFile) -> tuple[int | None, str]:
            sos = sorted((i for i in z.infolist() if i.filename.endswith(".so") and i.file_size > 0),
                         key=lambda i: i.file_size)
            for i in sos[:3]:
                with z.open(i) as m:
                    head = m.read(1 << 20)
                found = sorted({int(x) for x in re.findall(rb"libcudart\.so\.(\d+)", head)})
                if found:
                    return found[-1], f"{f.filename}: {i.filename} needs libcudart.so.{found[-1]}"
            return None, f"{f.filename}: no libcudart.so.N in its shared objects"
        try:
            with zipfile.ZipFile(RangeFile(self.session, f.url, f.size)) as z:
                major, ev = read(z)
        except (NoRanges, zipfile.BadZipFile, requests.RequestException, ValueError):
            with zipfile.ZipFile(self.download(f)) as z:
                major, ev = read(z)
        atomic_write(path, json.dumps({"major": major, "evidence": ev}).encode())
        return major, ev

    # ----------------------------------------------------------------------------- downloads
    def download(self, f: IndexFile) -> Path:
        """The file, downloaded once and kept under ``files/<sha256>/``. RegistryError when the bytes do
        not hash to the index's sha256 (nothing is kept) or the download fails."""
        dest = self.cache / "files" / f.sha256 / f.filename
        if dest.is_file():
            self.stats["downloads_cached"] += 1
            return dest
        h = hashlib.sha256()
        n = 0
        try:
            with atomic_path(dest) as tmp, open(tmp, "wb") as out:
                with self.session.get(f.url, stream=True, timeout=_TIMEOUT) as r:
                    if r.status_code != 200:
                        raise RegistryError(f"Download of {f.filename} from {f.url} failed: HTTP {r.status_code}.")
                    for chunk in r.iter_content(1 << 20):
                        out.write(chunk)
                        h.update(chunk)
                        n += len(chunk)
                if h.hexdigest() != f.sha256:   # raised inside the block: the temp file is removed, nothing kept
                    raise RegistryError(f"{f.filename} from {f.url} hashes to sha256:{h.hexdigest()} but the index "
                                        f"{self.url} lists sha256:{f.sha256}; nothing was kept. The file or the "
                                        "index changed under its hash: do not use it.")
        except requests.RequestException as exc:
            raise RegistryError(f"Download of {f.filename} from {f.url} failed: {type(exc).__name__}: {exc}.") from None
        self.stats["downloads"] += 1
        self.stats["bytes_downloaded"] += n
        return dest

    def unpack(self, f: IndexFile, suffixes: tuple[str, ...] = ()) -> Path:
        """The file's contents under ``unpacked/<sha256>[-<suffixes>]/`` (wheel: the zip as is; sdist: the
        archive, with its top folder). ``suffixes``: extract only members whose names end with one of them
        or contain ``.so.`` (e.g. ``(".py", ".so")``: what static readers read), else everything. Members
        with absolute paths or ``..`` are refused (RegistryError)."""
        tag = ("-" + hashlib.sha256(",".join(suffixes).encode()).hexdigest()[:8]) if suffixes else ""
        root = self.cache / "unpacked" / f"{f.sha256}{tag}"
        if (root / ".complete").is_file():
            return root
        local = self.download(f)
        if root.exists():
            shutil.rmtree(root)

        def wanted(name: str) -> bool:
            return not suffixes or name.endswith(suffixes) or ".so." in name.rsplit("/", 1)[-1]
        tmp = Path(tempfile.mkdtemp(dir=self.cache / "files", prefix=".unpack."))
        try:
            if local.name.endswith((".whl", ".zip")):
                with zipfile.ZipFile(local) as z:
                    names = z.namelist()
                    for n in names:
                        _safe_member(n, f)
                    z.extractall(tmp, members=[n for n in names if wanted(n)])
            else:
                with tarfile.open(local) as t:
                    members = []
                    for m in t.getmembers():
                        _safe_member(m.name, f)
                        if (m.isfile() and wanted(m.name)) or m.isdir():
                            members.append(m)
                    t.extractall(tmp, members=members)
            (tmp / ".complete").write_text(f"{f.sha256} {' '.join(suffixes) or 'all members'}\n")
            root.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, root)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return root


def _safe_member(name: str, f: IndexFile) -> None:
    if name.startswith("/") or ".." in Path(name).parts:
        raise RegistryError(f"{f.filename} holds a member outside its folder ({name!r}); refusing to unpack it.")
