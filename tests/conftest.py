"""Fixtures shared by several test files."""
from __future__ import annotations

import shutil

import pytest

from cudastack.recipes import DEFAULT_RECIPES_DIR


@pytest.fixture
def recipes_copy(tmp_path):
    """A writable copy of the real recipes folder."""
    dst = tmp_path / "recipes"
    shutil.copytree(DEFAULT_RECIPES_DIR, dst)
    return dst
