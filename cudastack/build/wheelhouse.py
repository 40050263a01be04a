"""One toolchain's wheelhouse: the folder of wheels that wheels nodes export and runtime images install from,
and its manifest (``{"nodes": {name: {"hash", "tag", "wheels": {file: sha256}, "exported"}}}``), rewritten
atomically after each file is moved in with ``os.replace``, so a failed export leaves no half-written wheel
listed. :func:`sha256_file` is the digest every record and lock line uses. The layout on disk is described in
:mod:`cudastack.build.executor`'s docstring; callers may import these names from there.
"""
from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path

from cudastack.core.errors import BuildError
from cudastack.plan.planner import PlannedNode
from stackprobe.api import write_atomic


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Wheelhouse:
    """One toolchain's wheelhouse folder and its manifest (see module doc)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.manifest_path = self.path / "manifest.json"

    def manifest(self) -> dict:
        try:
            data = json.loads(self.manifest_path.read_text())
        except (OSError, ValueError):
            return {"nodes": {}}
        data.setdefault("nodes", {})
        return data

    def entry(self, node: str) -> dict | None:
        return self.manifest()["nodes"].get(node)

    def has(self, node: PlannedNode, verify: bool = False) -> bool:
        """Whether the manifest lists ``node`` at its hash with all wheels present (and, with ``verify``,
        matching their recorded sha256)."""
        e = self.entry(node.name)
        if not e or e.get("hash") != node.hash or not e.get("wheels"):
            return False
        for fname, digest in e["wheels"].items():
            p = self.path / fname
            if not p.is_file():
                return False
            if verify and sha256_file(p) != digest:
                return False
        return True

    def add(self, node: PlannedNode, exported: Path) -> dict[str, str]:
        """Move the wheels found under ``exported`` into the wheelhouse (atomically per file) and record
        them under ``node`` in the manifest (atomically). Returns {file name: sha256}."""
        wheels = sorted(p for p in exported.rglob("*.whl") if p.is_file())
        if not wheels:
            raise BuildError(f"Building {node.name} exported no wheel (looked in {exported}); see its log.")
        self.path.mkdir(parents=True, exist_ok=True)
        digests = {p.name: sha256_file(p) for p in wheels}
        for p in wheels:
            os.replace(p, self.path / p.name)
        m = self.manifest()
        # a file name now owned by this node is no longer another node's
        for other, e in m["nodes"].items():
            if other != node.name:
                e["wheels"] = {f: d for f, d in e.get("wheels", {}).items() if f not in digests}
        m["nodes"][node.name] = {"hash": node.hash, "tag": node.tag, "wheels": digests,
                                 "exported": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        write_atomic(self.manifest_path, json.dumps(m, indent=2, sort_keys=True) + "\n")
        return digests

