"""Turning a plan into its locked build (cudastack.lock.apply_lock) and the executor's locked-build checks that
need no Docker: the runtime's WHEELS_LOCKED lines, a sdist whose sha256 differs from the lock, and pip's
hash-checking refusal read from a BuildKit log. The Docker half (the Dockerfiles installing in hash-checking
mode, a changed hash stopping a real build) is tests/test_registry_fixture_chain.py."""
from __future__ import annotations

import hashlib
import json

import pytest

from cudastack.build import executor as B
from cudastack.build import context as build_context
from cudastack.build import context as build_context
from cudastack import lock as L
from cudastack.core.errors import LockError
from cudastack.plan.planner import make_plan
from cudastack.plan.rules import Resources

SMALL = Resources(2, 24.0, "test: 2 cores, 24 GiB")


def synthetic_lock(plan) -> dict:
    """A schema-valid lock for ``plan`` with made-up digests: one package per requested spec."""
    nodes = {}
    for n in plan.nodes:
        e = {"kind": n.kind, "plan_hash": n.hash, "index": L.DEFAULT_INDEX, "installs": {}}
        if n.method:
            e["method"] = n.method
        for arg, inst in L.node_installs(n).items():
            pkgs = []
            for s in inst["specs"]:
                name, _, ver = s.partition("==")
                name = name.split("[")[0]
                pkgs.append({"name": name, "version": ver or "1", "filename": f"{name}-{ver}.whl",
                             "sha256": hashlib.sha256(s.encode()).hexdigest(), "requested": True})
            e["installs"][arg] = {"requested": sorted(inst["specs"]), "no_deps": inst["no_deps"], "packages": pkgs}
        if n.sdist:
            e["sdists"] = [{"name": n.sdist["package"], "version": str(n.sdist["version"]),
                            "filename": "flash_attn-2.8.3.post2.tar.gz", "url": "https://example.invalid/x.tar.gz",
                            "sha256": "5" * 64}]
        if n.kind == "base-pip":
            e["os_image"] = {"tag": n.build_args["OS_IMAGE"], "image_id": "sha256:" + "6" * 64}
        if n.kind == "base-nvidia":
            ref = n.build_args["BASE_IMAGE"]
            e["base_image"] = {"ref": ref, "digest": "sha256:" + "7" * 64,
                               "reference": ref.rsplit(":", 1)[0] + "@sha256:" + "7" * 64}
        nodes[n.name] = e
    return {"lock_version": 1, "toolchain": plan.toolchain, "cuda_version": plan.cuda_version,
            "base_kind": plan.base_kind, "target_archs": plan.target_archs,
            "resolver": {"tool": "pip", "python_version": "3.11", "glibc": "2.36", "machine": "x86_64",
                         "implementation": "cp"}, "nodes": nodes}


@pytest.mark.parametrize("base", ["pip", "nvidia"])
def test_apply_lock_gives_locked_args_tags_and_parent_chain(base):
    plan = make_plan(None, "13.1", base=base, resources=SMALL)
    lock = synthetic_lock(plan)
    L.check_schema(lock)
    L.verify_plan_against_lock(plan, lock)
    before = {n.name: (n.hash, n.tag) for n in plan.nodes}
    L.apply_lock(plan, lock)
    assert plan.locked
    for n in plan.nodes:
        old_hash, old_tag = before[n.name]
        assert n.hash != old_hash and n.tag != old_tag
        assert n.tag.rsplit(":", 1) == [old_tag.rsplit(":", 1)[0], n.hash[:16]]   # same repository
        assert n.inputs["plan_hash"] == old_hash
        parent = n.build_args.get("PARENT_IMAGE")
        if parent:
            assert parent in {p.tag for p in plan.nodes}, f"{n.name}: PARENT_IMAGE {parent} is not a locked tag"
    base_node = plan.nodes[0]
    if base == "pip":
        assert "--hash=sha256:" in base_node.build_args["CUDA_PIP_SPECS_LOCKED"]
    else:
        assert base_node.build_args["BASE_IMAGE"].endswith("@sha256:" + "7" * 64)
    assert "--hash=sha256:" in base_node.build_args["VENV_PIP_SPECS_LOCKED"]
    assert "torch==" in plan.node("torch").build_args["PIP_SPECS_LOCKED"]
    assert "SUITE_PIP_SPECS_LOCKED" in plan.node("runtime").build_args
    assert plan.node("flash-attn").sdist["sha256_locked"] == {"flash_attn-2.8.3.post2.tar.gz": "5" * 64}
    # the applied plan still matches its lock (push_locked verifies again), and applying twice changes nothing
    L.verify_plan_against_lock(plan, lock)
    tags = [n.tag for n in plan.nodes]
    L.apply_lock(plan, lock)
    assert [n.tag for n in plan.nodes] == tags


def test_the_locked_os_image_id_is_an_input_of_every_locked_tag():
    """The pip base's OS image is content (reproducible since C50): another locked OS image id gives the base
    another locked tag, and every node above it follows; the same id gives the same tags."""
    tags = []
    for os_id in ("6" * 64, "6" * 64, "8" * 64):
        plan = make_plan(None, "13.1", base="pip", resources=SMALL)
        lock = synthetic_lock(plan)
        lock["nodes"][plan.nodes[0].name]["os_image"]["image_id"] = "sha256:" + os_id
        L.apply_lock(plan, lock)
        tags.append([n.tag for n in plan.nodes])
    assert tags[0] == tags[1]
    assert all(a != b for a, b in zip(tags[0], tags[2]))


def test_build_deps_are_locked_with_their_dependencies(recipes_copy):
    from recipe_support import edit

    def add_deps(d):
        d["toolchains"]["13.1"]["build_deps"] = ["scikit-build-core==0.11.6"]
    edit(recipes_copy / "flash-attn.yaml", add_deps)
    plan = make_plan(recipes_copy, "13.1", resources=SMALL)
    inst = L.node_installs(plan.node("flash-attn"))
    assert inst == {"BUILD_DEPS": {"specs": ["scikit-build-core==0.11.6"], "no_deps": False}}


def _wheelhouse(tmp_path, plan, files: dict[str, bytes]) -> B.Wheelhouse:
    wh = B.Wheelhouse(tmp_path / "wh")
    wh.path.mkdir(parents=True)
    digests = {}
    for name, data in files.items():
        (wh.path / name).write_bytes(data)
        digests[name] = hashlib.sha256(data).hexdigest()
    m = {"nodes": {"flash-attn": {"hash": plan.node("flash-attn").hash, "tag": "", "wheels":
                                  {k: v for k, v in digests.items() if k.startswith("flash")}},
                   "flashinfer": {"hash": plan.node("flashinfer").hash, "tag": "", "wheels":
                                  {k: v for k, v in digests.items() if k.startswith("flashinfer")}}}}
    wh.manifest_path.write_text(json.dumps(m))
    return wh


def test_wheels_locked_lists_only_wheels_the_closure_does_not_name(tmp_path):
    plan = make_plan(None, "13.1", resources=SMALL)
    files = {"flash_attn-2.8.3.post2-cp311-cp311-linux_x86_64.whl": b"built here",
             "flashinfer_python-0.7.2-py3-none-any.whl": b"from pypi"}
    wh = _wheelhouse(tmp_path, plan, files)
    closure = "# runtime PIP_SPECS\nflashinfer-python==0.7.2 --hash=sha256:" + "a" * 64 + "\nsglang==0.5.23 --hash=sha256:" + "b" * 64
    text = build_context.wheels_locked(closure, sorted(files), wh, plan, plan.node("runtime"))
    assert text == ("/wheelhouse/flash_attn-2.8.3.post2-cp311-cp311-linux_x86_64.whl --hash=sha256:"
                    + hashlib.sha256(b"built here").hexdigest())


def test_sdist_with_another_sha256_than_the_lock_stops_before_unpacking(tmp_path, monkeypatch):
    plan = make_plan(None, "13.1", resources=SMALL)
    L.apply_lock(plan, synthetic_lock(plan))         # pins sha256 5555... for the flash-attn sdist
    archive = tmp_path / "sdists" / "flash_attn-2.8.3.post2.tar.gz"
    archive.parent.mkdir()
    archive.write_bytes(b"not the locked file")
    # _make_context looks fetch_sdist up in cudastack.build.context, where it lives
    monkeypatch.setattr(build_context, "fetch_sdist", lambda *a, **k: (archive, hashlib.sha256(archive.read_bytes()).hexdigest()))
    node = plan.node("flash-attn")
    with pytest.raises(LockError) as err:
        B._make_context(tmp_path / "ctx", node, B.Wheelhouse(tmp_path / "wh"), plan)
    msg = str(err.value)
    assert "flash_attn-2.8.3.post2.tar.gz" in msg and "nodes.flash-attn.sdists" in msg and "5555" in msg
    assert not (tmp_path / "ctx" / f"flash-attn-{node.hash[:16]}" / "src").exists()


def test_locked_failure_reads_pip_hash_refusal_from_a_buildkit_log(tmp_path):
    log = tmp_path / "base.log"
    log.write_text(
        "#7 [3/6] RUN ... pip install -q --require-hashes --no-deps -r /tmp/venv-locked.txt\n"
        "#7 3.104 ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have updated "
        "the package versions, please update the hashes. Otherwise, examine the package contents carefully; "
        "someone may have tampered with them.\n"
        "#7 3.104     packaging==25.0 from https://files.example/packaging-25.0-py3-none-any.whl:\n"
        "#7 3.104         Expected sha256 " + "0" * 64 + "\n"
        "#7 3.104              Got        " + "c" * 64 + "\n"
        "#7 ERROR: process \"/bin/sh -c ...\" did not complete successfully: exit code: 1\n")
    err = B.locked_failure("base", log)
    assert isinstance(err, LockError)
    assert "packaging==25.0" in str(err) and "packaging-25.0-py3-none-any.whl" in str(err) and str(log) in str(err)
    assert "Locked build of base: the lock and the index disagree on packaging==25.0:" in str(err)
    log.write_text("#7 3.1 ERROR: No matching distribution found for torch==9.9\n")
    assert B.locked_failure("base", log) is None
