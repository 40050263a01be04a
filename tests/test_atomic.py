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


def _fifo_reader(fifo, got: list):
    import threading

    def read():
        with open(fifo, "rb") as f:
            got.append(f.read())
    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("through_link", [False, True])
def test_a_destination_that_is_not_a_regular_file_is_written_in_place_never_replaced(tmp_path, through_link):
    """``--json /dev/null`` run as root once renamed a temporary file over /dev/null (an empty regular file
    afterwards). A FIFO stands in for the device here (no root needed), and a link to it for ``/dev/stdout``: the
    bytes reach the reader and the FIFO is still a FIFO, with no temporary file left beside it. The twin: a regular
    file is still replaced atomically (a new inode)."""
    import stat as st

    from stackprobe.atomic import atomic_path, not_a_regular_file, write_atomic

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    dest = fifo
    if through_link:
        dest = tmp_path / "stdout-like"
        dest.symlink_to(fifo)
    assert not_a_regular_file(dest)
    got: list = []
    t = _fifo_reader(fifo, got)
    write_atomic(dest, "report\n")
    t.join(10)
    assert got == [b"report\n"] and st.S_ISFIFO(os.stat(fifo).st_mode)
    got2: list = []
    t = _fifo_reader(fifo, got2)
    with atomic_path(dest) as p:
        p.write_text("figure")
    t.join(10)
    assert got2 == [b"figure"] and st.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(x.name for x in tmp_path.iterdir()) == sorted({"pipe", dest.name})
    regular = tmp_path / "r.json"
    regular.write_text("old")
    before = os.stat(regular).st_ino
    assert not not_a_regular_file(regular) and not not_a_regular_file(tmp_path / "absent")
    write_atomic(regular, "new")
    assert regular.read_text() == "new" and os.stat(regular).st_ino != before
