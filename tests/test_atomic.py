"""The one atomic writer (stackprobe.atomic): the mode follows the umask, file and folder are fsync'ed, and a
failed write leaves the old file and no temp file. Every writer of reports, manifests, records and locks uses
it (no second copy of the pattern in the tree)."""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from stackprobe import atomic
from stackprobe.atomic import atomic_path, current_umask, write_atomic

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def umask():
    """Set the process umask for one test, restore it afterwards."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda m: os.umask(m)
    os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600), (0o027, 0o640)])
def test_mode_follows_umask(tmp_path, umask, mask, mode):
    umask(mask)
    assert current_umask() == mask
    p = write_atomic(tmp_path / "sub" / "report.json", "{}\n")
    assert stat.S_IMODE(p.stat().st_mode) == mode
    assert p.read_text() == "{}\n"
    # a rewrite of a file left 0600 by an older writer gets the umask's mode too
    os.chmod(p, 0o600)
    write_atomic(p, b"{\"a\": 1}\n")
    assert stat.S_IMODE(p.stat().st_mode) == mode
    assert sorted(f.name for f in p.parent.iterdir()) == ["report.json"]


def test_file_and_folder_are_fsynced(tmp_path, monkeypatch):
    synced: list[str] = []
    real = os.fsync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(atomic.os, "fsync", spy)
    write_atomic(tmp_path / "m.json", "x")
    assert any(s.startswith(str(tmp_path / ".m.json.")) for s in synced), synced     # the temp file's data
    assert synced[-1] == str(tmp_path), synced                                       # then the folder


def test_failed_replace_keeps_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    p = write_atomic(tmp_path / "13.1.lock.yaml", "old\n")

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic.os, "replace", boom)
    with pytest.raises(OSError, match="No space"):
        write_atomic(p, "new\n")
    assert p.read_text() == "old\n"
    assert [f.name for f in tmp_path.iterdir()] == [p.name]


def test_failed_write_inside_the_block_keeps_old_file(tmp_path):
    p = write_atomic(tmp_path / "plot.png", b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(p) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("savefig failed")
    assert p.read_bytes() == b"old"
    assert [f.name for f in tmp_path.iterdir()] == [p.name]


def test_failed_fsync_keeps_old_file_and_leaves_no_temp(tmp_path, monkeypatch):
    """fsync reporting an I/O error (EIO: the data may not be on disk) fails the write before the rename."""
    p = write_atomic(tmp_path / "manifest.json", "old")

    def eio(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(atomic.os, "fsync", eio)
    with pytest.raises(OSError, match="Input/output"):
        write_atomic(p, "new")
    assert p.read_text() == "old"
    assert [f.name for f in tmp_path.iterdir()] == [p.name]


def test_one_atomic_writer_in_the_tree():
    """``mkstemp`` + ``os.replace`` (the atomic-write pattern) appears only in stackprobe/atomic.py; the other
    writers import it. A second hand-rolled copy (the six that existed had 0600 modes, no fsync or leftover
    temp files) fails this test."""
    offenders = []
    for folder in ("cudastack", "validate/stackprobe", "benchmarks", "scripts"):
        for f in (ROOT / folder).rglob("*.py"):
            if f.name == "atomic.py":
                continue
            text = f.read_text()
            if re.search(r"\bmkstemp\(", text) or re.search(r"\.tmp\b.*\n.*os\.replace\(|with_suffix\(\"\.tmp\"\)", text):
                offenders.append(str(f.relative_to(ROOT)))
    assert offenders == []


def test_build_side_uses_the_suite_writer():
    from cudastack.build import bake
    from cudastack.build import executor as build
    from cudastack.registry import cluster
    from cudastack import lock

    for mod in (bake, build, cluster, lock):
        assert mod.write_atomic is write_atomic, mod.__name__
    from stackprobe import report
    from stackprobe.runtime import report as rreport

    assert report.write_atomic is write_atomic and rreport.write_atomic is write_atomic
