"""The project's one atomic file writer (standard library only: the suite and the build side both import it).

:func:`write_atomic` replaces a file so that a reader sees either the old bytes or the new ones, never a
mix, and a crash or a failed write leaves the old file as it was:

1. a temporary file is created in the destination's folder (same filesystem, so the rename is atomic);
2. the data is written and ``fsync``'ed;
3. its mode is set to ``0o666 & ~umask`` (what ``open(path, "w")`` would give; ``mkstemp`` alone makes
   0600, which a teammate reading a shared results folder cannot open);
4. ``os.replace`` moves it over the destination (POSIX ``rename(2)``: atomic);
5. the folder is ``fsync``'ed so the new directory entry survives a power loss (``fsync(2)``: "Calling
   fsync() does not necessarily ensure that the entry in the directory containing the file has also reached
   disk. For that an explicit fsync() on a file descriptor for the directory is also needed.").

On any failure before step 4 the temporary file is removed and the exception propagates. Files that a
library writes by name (a matplotlib figure) go through :func:`atomic_path`, which yields the temporary
path and does steps 2-5 after the caller's block succeeds.
"""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path
from typing import Iterator


def current_umask() -> int:
    """The process umask (e.g. 0o022), read from ``/proc/self/status`` (Linux >= 4.7) without changing it;
    elsewhere by setting and restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass            # some filesystems refuse fsync on a folder; the rename itself has happened
    finally:
        os.close(fd)


def not_a_regular_file(path: str | Path) -> bool:
    """True when ``path`` exists (links followed) and is neither a regular file nor a folder: a character device
    (``/dev/null``), a FIFO, a socket, or ``/dev/stdout``'s target. Such a destination is written in place: renaming a
    temporary file over it would replace the device itself (as root, ``--json /dev/null`` once turned ``/dev/null``
    into an empty regular file)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` for the caller to write; when the block ends without an
    exception the temp file is fsync'ed, given the umask's mode and moved over ``path`` (then the folder is
    fsync'ed). When the block or any step raises, the temp file is removed and ``path`` keeps its old bytes.
    Creates the parent folders. A destination that is not a regular file (:func:`not_a_regular_file`) is yielded
    itself, for the caller to write in place (no temporary file, no rename)."""
    path = Path(path)
    if not_a_regular_file(path):
        yield path
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Replace ``path`` with ``data`` (``str`` is written as UTF-8) atomically (see module doc); returns
    ``path`` as a Path. Raises what the filesystem raises (OSError), after removing the temp file."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    path = Path(path)
    if not_a_regular_file(path):        # /dev/null, /dev/stdout, a FIFO: written in place, never replaced
        with open(path, "wb") as f:
            f.write(raw)
        return path
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(raw)
    return path
