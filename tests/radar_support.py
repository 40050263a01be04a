"""A small package index on 127.0.0.1 for the radar's failing cases: real HTTP, real wheels (zip files
with a dist-info), PEP 691 JSON project pages. It ignores ``Range`` (answers 200 with the whole file),
so the client's fall-back from range reads to a full download is exercised too."""
from __future__ import annotations

import hashlib
import json
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from packaging.utils import canonicalize_name


def make_wheel(out: Path, name: str, version: str, requires: list[str] = (), files: dict[str, str] | None = None,
               tag: str = "py3-none-any") -> Path:
    """A wheel ``<name>-<version>-<tag>.whl`` with METADATA (Requires-Dist lines) and ``files``."""
    dist = name.replace("-", "_")
    path = Path(out) / f"{dist}-{version}-{tag}.whl"
    meta = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"] + [f"Requires-Dist: {r}" for r in requires]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, text in (files or {}).items():
            z.writestr(rel, text)
        z.writestr(f"{dist}-{version}.dist-info/METADATA", "\n".join(meta) + "\n")
        z.writestr(f"{dist}-{version}.dist-info/WHEEL", f"Wheel-Version: 1.0\nTag: {tag}\n")
        z.writestr(f"{dist}-{version}.dist-info/RECORD", "")
    return path


def comm_py(majors: list[int] | None, extra: str = "") -> str:
    """A flashinfer/jit/comm.py whose fusion module passes ``supported_major_versions=majors``."""
    arg = "" if majors is None else f", supported_major_versions={majors!r}"
    return (f"def gen_jit_spec(*a, **k):\n    return None\n\n"
            f"def gen_trtllm_comm_module():\n    return gen_jit_spec('trtllm_comm', []{arg})\n{extra}")


class FakeIndex:
    """``with FakeIndex(folder) as ix: ix.url`` serves every ``*.whl`` in ``folder``. ``bad_hash``: file
    names listed with a wrong sha256; ``html``: answer project pages as PEP 503 HTML only."""

    def __init__(self, folder: Path, bad_hash: set[str] = frozenset(), html: bool = False):
        self.folder, self.bad_hash, self.html = Path(folder), set(bad_hash), html
        self.requests: list[str] = []

    def _page(self, project: str) -> dict | None:
        files = []
        for p in sorted(self.folder.glob("*.whl")):
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
                self.send_response(200)
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
