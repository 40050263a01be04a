"""Case C32: a locked dry run checks every locked sha256 against the index's published hashes (or cached
files), so a hand-edited lock is refused (lock error, exit 7) naming the package and the node, and the
lockfile is left byte for byte. A real locked build that pip's hash check refuses says "the lock and the
index disagree on <package>"."""
from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from cudastack import lock as L
from cudastack.core.errors import LockError

ROOT = Path(__file__).resolve().parents[1]
INVOKE = [sys.executable, "-m", "invoke", "-r", str(Path(__file__).resolve().parents[1])]


def _dry_run(lockfiles: Path, cuda: str = "13.1") -> subprocess.CompletedProcess:
    return subprocess.run([*INVOKE, "build", "--cuda", cuda, "--locked", "--dry-run", "--lockfiles", str(lockfiles)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def _edit_one_sha256(text: str, package: str, node: str) -> tuple[str, str, str]:
    """Change the sha256 line of ``package`` inside ``node``'s block (as a hand edit would); returns
    (new text, old hash, new hash)."""
    start = text.index(f"\n  {node}:\n")
    pkg = text.index(f"- name: {package}\n", start)
    m = re.compile(r"sha256: ([0-9a-f]{64})").search(text, pkg)
    old = m.group(1)
    new = hashlib.sha256(old.encode()).hexdigest()
    return text[:m.start(1)] + new + text[m.end(1):], old, new


@pytest.mark.network
@pytest.mark.docker     # the dry run rehearses the build's checks, the engine among them (exit 5 without one)
def test_hand_edited_lock_is_refused_by_the_dry_run_naming_package_and_node(tmp_path):
    src = (ROOT / "lockfiles" / "13.1.lock.yaml").read_text()
    good = tmp_path / "good"
    good.mkdir()
    (good / "13.1.lock.yaml").write_text(src)
    ok = _dry_run(good)
    assert ok.returncode == 0, ok.stderr
    assert re.search(r"\d+ locked sha256 checked \(\d+ against the index", ok.stderr), ok.stderr
    # the arch list came from the lock, and the knobs say so (not [cli], which --arch would be)
    assert "TORCH_CUDA_ARCH_LIST=12.0  [lock]" in ok.stdout and "[cli]" not in ok.stdout, ok.stdout

    bad = tmp_path / "bad"
    bad.mkdir()
    text, old, new = _edit_one_sha256(src, "ninja", "base")
    (bad / "13.1.lock.yaml").write_text(text)
    before = (bad / "13.1.lock.yaml").read_bytes()
    r = _dry_run(bad)
    assert r.returncode == 7, r.stdout + r.stderr
    err = r.stderr
    assert "ninja==" in err and "node base" in err and new in err and old in err, err
    assert "verified against the plan" not in err and new not in r.stdout
    assert (bad / "13.1.lock.yaml").read_bytes() == before


def _lock(sha: str, filename: str = "tinylib-1.1-py3-none-any.whl") -> dict:
    return {"toolchain": "9.9", "nodes": {"tiny": {"index": "https://index.example/simple", "installs": {
        "PIP_SPECS": {"requested": ["tinylib==1.1"], "packages": [
            {"name": "tinylib", "version": "1.1", "filename": filename, "sha256": sha}]}}}}}


def test_published_hash_mismatch_and_missing_file_are_lock_errors():
    published = {("https://index.example/simple", "tinylib"): {"tinylib-1.1-py3-none-any.whl": "a" * 64}}
    fetch = lambda index, project: published[(index, project)]   # noqa: E731
    assert L.verify_locked_hashes(_lock("a" * 64), fetch=fetch)["index"] == 1
    with pytest.raises(LockError) as e:
        L.verify_locked_hashes(_lock("b" * 64), fetch=fetch)
    assert "tinylib==1.1 (node tiny, installs.PIP_SPECS" in str(e.value) and "a" * 64 in str(e.value)
    assert e.value.exit_code == 7
    with pytest.raises(LockError, match="does not list that file"):
        L.verify_locked_hashes(_lock("a" * 64, "tinylib-1.1-py3-none-manylinux_2_17_x86_64.whl"), fetch=fetch)


def test_unreachable_index_falls_back_to_cached_files(tmp_path):
    def down(index, project):
        raise requests.ConnectionError("no route")

    whl = tmp_path / "cache" / "tinylib-1.1-py3-none-any.whl"
    whl.parent.mkdir()
    whl.write_bytes(b"wheel bytes")
    digest = hashlib.sha256(b"wheel bytes").hexdigest()
    r = L.verify_locked_hashes(_lock(digest), fetch=down, cache_dirs=[tmp_path / "cache"])
    assert r["cached"] == 1 and not r["unchecked"]
    with pytest.raises(LockError, match="the cached file"):
        L.verify_locked_hashes(_lock("c" * 64), fetch=down, cache_dirs=[tmp_path / "cache"])
    r = L.verify_locked_hashes(_lock("c" * 64), fetch=down)              # nothing to check against: said so
    assert r["unchecked"] == ["tinylib-1.1-py3-none-any.whl"]
    assert "1 not checked (https://index.example/simple: ConnectionError" in L.describe_hash_check(r)
