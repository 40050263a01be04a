"""A small package index on 127.0.0.1 for the radar's tests: real HTTP, real wheels (zip files with a
dist-info) and sdists, PEP 691 JSON project pages. It honours ``Range: bytes=A-B`` (206 with
``Content-Range``, as PyPI's file host does), so range reads run without the network; ``ranges=False``
makes it ignore ``Range`` (200 with the whole file), so the client's fall-back to a full download is
exercised too. :func:`check_torch_held_by_engine` and friends are the relations the radar's answers must
keep, against PyPI and against a local index whose newest releases move forward."""
from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version


def make_wheel(out: Path, name: str, version: str, requires: tuple[str, ...] | list[str] = (),
               files: dict[str, str | bytes] | None = None, tag: str = "py3-none-any") -> Path:
    """A wheel ``<name>-<version>-<tag>.whl`` with METADATA (Requires-Dist lines) and ``files``."""
    dist = name.replace("-", "_")
    path = Path(out) / f"{dist}-{version}-{tag}.whl"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"] + [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, text in (files or {}).items():
            z.writestr(rel, text)
        z.writestr(f"{dist}-{version}.dist-info/METADATA", "\n".join(meta) + "\n")
        z.writestr(f"{dist}-{version}.dist-info/WHEEL", f"Wheel-Version: 1.0\nTag: {tag}\n")
        z.writestr(f"{dist}-{version}.dist-info/RECORD", "")
    return path


def make_sdist(out: Path, name: str, version: str, requires: tuple[str, ...] | list[str] = ()) -> Path:
    """An sdist ``<name>-<version>.tar.gz`` holding only ``<name>-<version>/PKG-INFO``."""
    dist = name.replace("-", "_")
    path = Path(out) / f"{dist}-{version}.tar.gz"
    meta = "\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
                     + [f"Requires-Dist: {r}" for r in requires]).encode() + b"\n"
    with tarfile.open(path, "w:gz") as t:
        info = tarfile.TarInfo(f"{dist}-{version}/PKG-INFO")
        info.size = len(meta)
        t.addfile(info, io.BytesIO(meta))
    return path


def comm_py(majors: list[int] | None, extra: str = "") -> str:
    """A flashinfer/jit/comm.py whose fusion module passes ``supported_major_versions=majors``."""
    arg = "" if majors is None else f", supported_major_versions={majors!r}"
    return (f"def gen_jit_spec(*a, **k):\n    return None\n\n"
            f"def gen_trtllm_comm_module():\n    return gen_jit_spec('trtllm_comm', []{arg})\n{extra}")


class FakeIndex:
    """``with FakeIndex(folder) as ix: ix.url`` serves every ``*.whl`` and ``*.tar.gz`` in ``folder`` (read
    at each request: files added inside the block are listed at once). ``bad_hash``: file names listed with a
    wrong sha256; ``html``: answer project pages as PEP 503 HTML only; ``ranges``: honour ``Range``.
    ``requests``: every path asked for; ``range_requests``: (path, Range header) of each range read."""

    def __init__(self, folder: Path, bad_hash: set[str] | frozenset[str] = frozenset(), html: bool = False,
                 ranges: bool = True):
        self.folder, self.bad_hash, self.html, self.ranges = Path(folder), set(bad_hash), html, ranges
        self.requests: list[str] = []
        self.range_requests: list[tuple[str, str]] = []

    def _page(self, project: str) -> dict | None:
        files = []
        for p in sorted([*self.folder.glob("*.whl"), *self.folder.glob("*.tar.gz")]):
            if canonicalize_name(p.name.split("-")[0]) != project:
                continue
            sha = hashlib.sha256(p.read_bytes()).hexdigest()
            if p.name in self.bad_hash:
                sha = "0" * 64
            files.append({"filename": p.name, "url": f"../../files/{p.name}", "hashes": {"sha256": sha},
                          "size": p.stat().st_size})
        if not files:
            return None
        return {"meta": {"api-version": "1.1"}, "name": project, "files": files, "versions": []}

    def __enter__(self):
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):  # noqa: N802
                outer.requests.append(self.path)
                parts = [p for p in self.path.split("/") if p]
                if len(parts) == 2 and parts[0] == "simple":
                    page = outer._page(canonicalize_name(parts[1]))
                    if page is None:
                        self.send_error(404)
                        return
                    if outer.html:
                        body = "".join(f'<a href="{f["url"]}">{f["filename"]}</a>' for f in page["files"]).encode()
                        ctype = "text/html"
                    else:
                        body, ctype = json.dumps(page).encode(), "application/vnd.pypi.simple.v1+json"
                elif len(parts) == 2 and parts[0] == "files" and (outer.folder / parts[1]).is_file():
                    body, ctype = (outer.folder / parts[1]).read_bytes(), "application/octet-stream"
                else:
                    self.send_error(404)
                    return
                status, rng = 200, self.headers.get("Range", "")
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng.strip())
                if outer.ranges and ctype == "application/octet-stream" and m:
                    outer.range_requests.append((self.path, rng))
                    start = int(m.group(1))
                    end = min(int(m.group(2)) if m.group(2) else len(body) - 1, len(body) - 1)
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.end_headers()
                        return
                    status, total, body = 206, len(body), body[start:end + 1]
                self.send_response(status)
                if status == 206:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{total}")
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/simple"
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


# ------------------------------------------------------------------------------------ relations that stay true
# What the radar must answer whatever upstream publishes next: each check reads the radar's JSON rows
# (cudastack.radar.walk.to_json) and asserts relations (the newest is at least a release known to exist; the
# engine's pin holds a component at its pin; the first release that lifts a gate), never which release is
# newest today.
def radar_row(data: list[dict], tc: str, component: str, runtime: str | None = None) -> dict:
    """The row of ``component`` in ``tc``'s radar for runtime node ``runtime`` (default: the first, SGLang's)."""
    t = next(t for t in data if t["toolchain"] == tc and runtime in (None, t.get("runtime")))
    return next(r for r in t["rows"] if r["component"] == component)


def check_held_by_engine(data: list[dict], tc: str, component: str, pin: str, known_newer: str,
                         runtime: str | None = None) -> dict:
    """``component`` of ``tc`` is pinned at ``pin``, the engine's ``Requires-Dist `<component>==<pin>``` holds
    it there, and the index's newest is at least ``known_newer`` (a release known to exist past the pin).
    ``runtime``: whose image chain (default SGLang's; "vllm")."""
    r = radar_row(data, tc, component, runtime)
    assert r["pinned"] == pin, r
    assert Version(r["newest"]) >= Version(known_newer) > Version(pin), r
    assert r["newest_allowed"] == pin, r
    assert any(_pins(h, component, pin) for h in r["held_back_by"]), r["held_back_by"]
    return r


def _pins(text: str, component: str, pin: str) -> bool:
    """``text`` quotes a ``Requires-Dist `<component>==<pin>``` (the name as the metadata spells it)."""
    for spec in re.findall(r"Requires-Dist `([^`]+)`", text):
        req = Requirement(spec)
        if canonicalize_name(req.name) == component and str(req.specifier) == f"=={pin}":
            return True
    return False


def check_engine_refuses(data: list[dict], tc: str, engine: str, requirement: str, component: str) -> None:
    """The engine's ``Requires-Dist `requirement``` refuses ``tc``'s pin of ``component`` moved alone."""
    conflicts = next(t for t in data if t["toolchain"] == tc)["conflicts"]
    assert any(c.startswith(engine) and f"Requires-Dist `{requirement}`" in c
               and f"moving {component} alone is refused" in c for c in conflicts), conflicts
