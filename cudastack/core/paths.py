"""Where the project's own folders are: every default path (recipes/, lockfiles/, images/, validate/, .stack/)
is relative to :data:`PROJECT_ROOT`, never to the caller's working directory."""
from __future__ import annotations

from pathlib import Path

#: The repository root: the folder holding ``cudastack/``, ``recipes/``, ``lockfiles/`` and ``images/``.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
