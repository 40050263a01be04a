"""Lockfile I/O: schema, atomic writes (the old file survives any failure byte for byte), outputs records."""
from __future__ import annotations

import os

import pytest
import yaml

from cudastack import lock as L
from cudastack.core.errors import LockError


def _lock(**extra):
    d = {
        "lock_version": 1, "toolchain": "9.9", "cuda_version": "9.9.0", "base_kind": "pip", "target_archs": ["12.0"],
        "resolver": {"tool": "pip", "python_version": "3.11", "glibc": "2.36", "machine": "x86_64",
                     "implementation": "cp"},
        "nodes": {"app": {"kind": "image", "method": "wheel", "plan_hash": "ab" * 32, "index": "https://pypi.org/simple",
                          "installs": {"PIP_SPECS": {"requested": ["tinyapp==1.0"], "no_deps": False, "packages": [
                              {"name": "tinyapp", "version": "1.0", "filename": "tinyapp-1.0-py3-none-any.whl",
                               "sha256": "1" * 64, "requested": True},
                              {"name": "tinylib", "version": "1.1", "filename": "tinylib-1.1-py3-none-any.whl",
                               "sha256": "2" * 64}]}}}},
    }
    d.update(extra)
    return d


def test_roundtrip_and_header(tmp_path):
    p = tmp_path / "9.9.lock.yaml"
    L.write_lock(p, _lock())
    text = p.read_text()
    assert text.startswith("# cudastack lockfile for CUDA 9.9")
    assert "invoke lock --cuda 9.9" in text
    assert L.load_lock(p) == _lock()
    assert L.load_lock("9.9", lockfiles_dir=tmp_path) == _lock()
    assert oct(p.stat().st_mode & 0o777) == oct(0o644)


def test_missing_lock_says_how_to_make_it(tmp_path):
    with pytest.raises(LockError, match="invoke lock --cuda 9.9"):
        L.load_lock("9.9", lockfiles_dir=tmp_path)


@pytest.mark.parametrize("mutate, match", [
    (lambda d: d.update(lock_version=2), "lock_version"),
    (lambda d: d.pop("toolchain"), "toolchain"),
    (lambda d: d.update(surprise=1), r"key 'surprise': unknown key \(allowed here: base_kind, cuda_version, "),
    (lambda d: d["nodes"]["app"].update(extra=1), r"key 'nodes.app.extra': unknown key \(allowed here: base_image, "),
    (lambda d: d["nodes"]["app"]["installs"]["PIP_SPECS"]["packages"][0].pop("sha256"), r"packages\[0\]"),
    (lambda d: d["nodes"]["app"]["installs"]["PIP_SPECS"]["packages"][1].update(sha256="xyz"), "64 hex"),
])
def test_schema_errors_name_the_key(tmp_path, mutate, match):
    d = _lock()
    mutate(d)
    p = tmp_path / "bad.lock.yaml"
    p.write_text(yaml.safe_dump(d))
    with pytest.raises(LockError, match=match):
        L.load_lock(p)


def test_atomic_write_keeps_old_file_on_failure(tmp_path, monkeypatch):
    p = tmp_path / "9.9.lock.yaml"
    L.write_lock(p, _lock())
    before = p.read_bytes()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    changed = _lock()
    changed["cuda_version"] = "9.9.1"
    with pytest.raises(OSError):
        L.write_lock(p, changed)
    assert p.read_bytes() == before
    assert [f.name for f in tmp_path.iterdir()] == [p.name], "the temp file must be removed"


def test_invalid_lock_is_never_written(tmp_path):
    p = tmp_path / "9.9.lock.yaml"
    L.write_lock(p, _lock())
    before = p.read_bytes()
    bad = _lock()
    bad["nodes"] = {}
    with pytest.raises(LockError):
        L.write_lock(p, bad)
    assert p.read_bytes() == before


def test_record_outputs_and_push(tmp_path, monkeypatch):
    from cudastack.registry.client import PushedImage

    p = tmp_path / "9.9.lock.yaml"
    L.write_lock(p, _lock())
    whl = tmp_path / "w"
    whl.mkdir()
    (whl / "x-1-py3-none-any.whl").write_bytes(b"abc")
    L.record_outputs(p, "app", image_id="sha256:" + "3" * 64, tag="cudastack-test/app:1",
                     wheels=L.wheel_records(whl))
    d = "sha256:" + "4" * 64
    L.record_push(p, "app", PushedImage(d, f"127.0.0.1:5000/ci/app@{d}", f"127.0.0.1:5000#ci/app@{d}",
                                        "sha256:" + "3" * 64, "127.0.0.1:5000/ci/app:1"))
    got = L.load_lock(p)
    assert got["outputs"]["app"]["wheels"] == [{"filename": "x-1-py3-none-any.whl",
                                                "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}]
    assert got["pushed"]["app"]["enroot"] == f"127.0.0.1:5000#ci/app@{d}"
    before = p.read_bytes()
    with pytest.raises(LockError, match="no node nope"):
        L.record_outputs(p, "nope", image_id="sha256:" + "5" * 64)
    assert p.read_bytes() == before


def test_requirements_text_is_hash_checking():
    text = L.requirements_text(_lock(), "app", "PIP_SPECS")
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert lines == ["tinyapp==1.0 --hash=sha256:" + "1" * 64, "tinylib==1.1 --hash=sha256:" + "2" * 64]
    with pytest.raises(LockError, match="no install"):
        L.requirements_text(_lock(), "app", "CUDA_PIP_SPECS")


def test_manylinux_platforms():
    tags = L.manylinux_platforms("2.36")
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags
    assert tags[-3:] == ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    assert "manylinux_2_37_x86_64" not in tags


def test_explain_pip_hash_failure():
    out = ("ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have updated the "
           "package versions, please update the hashes. Otherwise, examine the package contents carefully; "
           "someone may have tampered with them.\n"
           "    tinylib==1.1 from file:///x/tinylib-1.1-py3-none-any.whl:\n"
           "        Expected sha256 " + "a" * 64 + "\n"
           "             Got        " + "b" * 64 + "\n")
    err = L.explain_pip_hash_failure(out, {"toolchain": "13.1"})
    assert "tinylib==1.1" in str(err) and "invoke lock --cuda 13.1" in str(err)
    # it names the disagreement, not a culprit: the lockfile may be the side that changed (C32)
    assert str(err).startswith("The lock and the index disagree on tinylib==1.1:"), str(err)
    assert "git diff lockfiles/" in str(err)
    assert L.explain_pip_hash_failure("all good") is None


class _Plan:
    """The two attributes lock_plan reads of a plan besides what resolve_lock (replaced here) does."""

    def __init__(self, names):
        self.nodes = [type("N", (), {"name": n, "parents": []})() for n in names]


def test_relocking_only_named_nodes_keeps_the_others_byte_for_byte(tmp_path, monkeypatch):
    path = tmp_path / "9.9.lock.yaml"
    old = _lock()
    old["nodes"]["tool"] = dict(old["nodes"]["app"], plan_hash="cd" * 32)
    L.write_lock(path, old)
    fresh = _lock()
    fresh["nodes"]["app"] = dict(fresh["nodes"]["app"], plan_hash="ef" * 32)       # the node asked for
    fresh["nodes"]["tool"] = dict(old["nodes"]["tool"], plan_hash="99" * 32)      # would have moved
    monkeypatch.setattr(L.resolve, "resolve_lock", lambda plan, **kw: yaml.safe_load(yaml.safe_dump(fresh)))
    kept: list = []
    lk = L.lock_plan(_Plan(["app", "tool"]), path, only=["app"], kept=kept)
    assert lk["nodes"]["app"]["plan_hash"] == "ef" * 32
    assert lk["nodes"]["tool"] == old["nodes"]["tool"]
    assert kept == ["tool: kept the old entry; a fresh resolution differs in plan_hash"]
    assert L.load_lock(path)["nodes"]["tool"]["plan_hash"] == "cd" * 32
    with pytest.raises(Exception, match="not a node of the plan"):
        L.lock_plan(_Plan(["app", "tool"]), path, only=["nope"])
    # a node the old lock lacks cannot be kept: nothing is written
    before = path.read_bytes()
    fresh["nodes"]["new"] = dict(fresh["nodes"]["app"])
    with pytest.raises(LockError, match="no entry for node new"):
        L.lock_plan(_Plan(["app", "tool", "new"]), path, only=["app"])
    assert path.read_bytes() == before
