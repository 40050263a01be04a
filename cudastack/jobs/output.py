"""The command line's one output convention for machine-readable results: ``--json FILE`` writes the task's
result as JSON to FILE (atomically: a failed task leaves no file, an old file stays whole), ``--json -`` prints
it on standard output, alone: the task's human lines go to standard error for that run, so
``invoke plan --json - | jq`` reads only the JSON. Reports, wheels and logs go to ``--out DIR`` /
``--state-dir DIR`` as before."""
from __future__ import annotations

import json
import sys
from contextlib import contextmanager, redirect_stdout
from typing import Iterator

from stackprobe.api import write_atomic


@contextmanager
def json_output(dest: str | None) -> Iterator[dict]:
    """Context for one task's ``--json`` (``dest``: None, ``-`` or a file path): yields a dict the task sets
    ``["data"]`` in (any JSON-serialisable value; dates and paths are written with ``str``). On a normal exit
    the data is written; when the task raises, nothing is. ValueError when the task set no data."""
    box: dict = {}
    if dest == "-":
        with redirect_stdout(sys.stderr):
            yield box
    else:
        yield box
    if not dest:
        return
    if "data" not in box:
        raise ValueError("--json: the task produced no result to write")
    text = json.dumps(box["data"], indent=1, default=str) + "\n"
    if dest == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        write_atomic(dest, text)
