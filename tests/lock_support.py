"""Helpers for the lock tests: real wheels of tiny packages and a local PEP 503 simple index serving them.

A wheel is a zip with ``<name>-<version>.dist-info/{METADATA,WHEEL,RECORD}`` (PEP 427, core metadata 2.1);
pip installs these for real. :func:`make_index` lays them out as ``simple/<project>/index.html`` with
``#sha256=`` fragments, which pip reads through a ``file://`` index URL like any index.
"""
from __future__ import annotations

import base64
import sys
import hashlib
import os
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name


#: the resolver target of the tests: this interpreter's Python, a Debian bookworm glibc
TARGET = {"python_version": "%d.%d" % sys.version_info[:2], "glibc": "2.36", "machine": "x86_64",
          "implementation": "cp"}


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(folder: Path, name: str, version: str, requires: list[str] = (), payload: str = "",
               extras: list[str] = ()) -> Path:
    """Write ``<name>-<version>-py3-none-any.whl`` into ``folder``; ``payload`` changes the file's bytes;
    ``extras``: the ``Provides-Extra`` names (their Requires-Dist carry ``extra == '<name>'`` markers)."""
    dist = name.replace("-", "_")
    files = {
        f"{dist}/__init__.py": f"__version__ = {version!r}\n# {payload}\n".encode(),
        f"{dist}-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            + "".join(f"Provides-Extra: {e}\n" for e in extras)
            + "".join(f"Requires-Dist: {r}\n" for r in requires)).encode(),
        f"{dist}-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: cudastack-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{p},{_record_hash(d)},{len(d)}\n" for p, d in files.items())
    record += f"{dist}-{version}.dist-info/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, d in files.items():
            zf.writestr(zipfile.ZipInfo(p, date_time=(2020, 1, 1, 0, 0, 0)), d)
        zf.writestr(zipfile.ZipInfo(f"{dist}-{version}.dist-info/RECORD", date_time=(2020, 1, 1, 0, 0, 0)), record)
    return path


def make_index(root: Path, files: list[Path]) -> str:
    """A PEP 503 simple index under ``root/simple`` for ``files``; returns its ``file://`` URL."""
    simple = root / "simple"
    by_project: dict[str, list[Path]] = {}
    for f in files:
        by_project.setdefault(canonicalize_name(f.name.split("-")[0]), []).append(f)
    for project, fs in by_project.items():
        d = simple / project
        d.mkdir(parents=True, exist_ok=True)
        links = "".join(
            f'<a href="{f.resolve().as_uri()}#sha256={hashlib.sha256(f.read_bytes()).hexdigest()}">{f.name}</a>\n'
            for f in fs)
        (d / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")
    (simple / "index.html").write_text("".join(f'<a href="{p}/">{p}</a>\n' for p in by_project))
    return simple.resolve().as_uri()


def tiny_index(root: Path, payload: str = "v1") -> str:
    """Index with tinyapp 1.0 (needs tinylib>=1.0), tinylib 1.0 and 1.1, tinyext 0.1."""
    wheels = root / "files"
    files = [make_wheel(wheels, "tinyapp", "1.0", ["tinylib>=1.0"], payload),
             make_wheel(wheels, "tinylib", "1.0", [], payload),
             make_wheel(wheels, "tinylib", "1.1", [], payload),
             make_wheel(wheels, "tinyext", "0.1", [], payload)]
    return make_index(root, files)


def file_bytes(path: Path) -> bytes:
    return Path(path).read_bytes() if os.path.exists(path) else b""
