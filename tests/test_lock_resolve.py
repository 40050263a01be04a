"""Lock resolution with pip's real resolver over a local PEP 503 index of tiny wheels; stale locks; hash
changes upstream caught by pip's hash-checking mode. No Docker, no network."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from cudastack import lock as L
from cudastack.core.errors import LockError
from cudastack.plan.model import Node, Plan
from lock_support import TARGET, make_index, make_wheel, tiny_index


def tiny_plan(index_url: str, *, app_spec="tinyapp==1.0", ext_spec="tinyext==0.1", sdist=None) -> Plan:
    """base (image, no pip) -> app (image: pip installs app_spec with deps) -> ext (wheels: --no-deps)
    [-> src (wheels, source from an sdist)]."""
    nodes = [
        Node("app", "image", "images/image.Dockerfile", [], {"PIP_SPECS": app_spec, "PIP_INDEX_URL": index_url},
             hash="a" * 64, method="wheel", inputs={"dockerfile": "ARG PIP_SPECS\n"}),
        Node("ext", "wheels", "images/wheels.Dockerfile", ["app"],
             {"METHOD": "wheel", "PIP_SPECS": ext_spec, "PIP_INDEX_URL": index_url},
             hash="b" * 64, method="wheel"),
    ]
    if sdist:
        nodes.append(Node("src", "wheels", "images/wheels.Dockerfile", ["app"],
                          {"METHOD": "source", "PIP_SPECS": f"{sdist[0]}=={sdist[1]}", "PIP_INDEX_URL": index_url},
                          hash="c" * 64, method="source",
                          inputs={"recipe": {"toolchain_entry": {"method": "source",
                                                                 "sdist": {"package": sdist[0], "version": sdist[1]}}}}))
    return Plan("9.9", "9.9.0", ["12.0"], "pip", nodes, "wheelhouse/cu9.9")


@pytest.fixture
def index(tmp_path):
    return tiny_index(tmp_path / "idx")


def test_resolve_pins_the_closure(index, tmp_path):
    lock = L.resolve_lock(tiny_plan(index), target=TARGET)
    app = lock["nodes"]["app"]["installs"]["PIP_SPECS"]
    assert app["requested"] == ["tinyapp==1.0"]
    assert [(p["name"], p["version"]) for p in app["packages"]] == [("tinyapp", "1.0"), ("tinylib", "1.1")]
    wheel = tmp_path / "idx" / "files" / "tinylib-1.1-py3-none-any.whl"
    import hashlib
    assert app["packages"][1]["sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()
    ext = lock["nodes"]["ext"]["installs"]["PIP_SPECS"]
    assert ext["no_deps"] is True and [p["name"] for p in ext["packages"]] == ["tinyext"]
    assert lock["resolver"]["python_version"] == TARGET["python_version"]
    # the lock round-trips through the file format
    p = tmp_path / "9.9.lock.yaml"
    L.write_lock(p, lock)
    assert L.load_lock(p) == lock
    assert L.stale_entries(tiny_plan(index), lock) == []


def test_unresolvable_pin_leaves_lock_untouched(index, tmp_path):
    p = tmp_path / "9.9.lock.yaml"
    L.lock_plan(tiny_plan(index), p, target=TARGET)
    before = p.read_bytes()
    with pytest.raises(LockError, match="tinyapp==7.0"):
        L.lock_plan(tiny_plan(index, app_spec="tinyapp==7.0"), p, target=TARGET)
    assert p.read_bytes() == before


def test_stale_lock_names_the_entry(index, tmp_path):
    lock = L.resolve_lock(tiny_plan(index), target=TARGET)
    p = tmp_path / "9.9.lock.yaml"
    L.write_lock(p, lock)
    before = p.read_bytes()
    newer = tiny_plan(index, ext_spec="tinyext==0.2")
    with pytest.raises(LockError) as exc:
        L.verify_plan_against_lock(newer, L.load_lock(p))
    msg = str(exc.value)
    assert "nodes.ext.installs.PIP_SPECS.requested" in msg and "tinyext==0.2" in msg and "tinyext==0.1" in msg
    assert "invoke lock --cuda 9.9" in msg
    assert "nodes.app" not in msg
    assert p.read_bytes() == before
    # a node the lock does not know, and one it knows that the plan dropped
    plan = tiny_plan(index)
    plan.nodes[1].name = "ext2"
    stale = L.stale_entries(plan, lock)
    assert any("nodes.ext2: not in the lock" in s for s in stale)
    assert any("nodes.ext: in the lock but no longer" in s for s in stale)


def test_outputs_survive_relock_only_for_unchanged_nodes(index, tmp_path):
    p = tmp_path / "9.9.lock.yaml"
    L.lock_plan(tiny_plan(index), p, target=TARGET)
    L.record_outputs(p, "app", image_id="sha256:" + "1" * 64)
    L.record_outputs(p, "ext", image_id="sha256:" + "2" * 64)
    plan = tiny_plan(index)
    plan.nodes[1].hash = "d" * 64           # ext changed (e.g. its Dockerfile)
    lock = L.lock_plan(plan, p, target=TARGET)
    assert set(lock["outputs"]) == {"app"}


def test_a_locked_build_after_a_plan_change_keeps_its_outputs_through_a_relock(index, tmp_path):
    """A node's plan changed without touching any pin (e.g. the suite code in the runtime's context): the lock
    still verifies, the locked build records its outputs and the plan hash it used, and relocking the same
    plan keeps them. A push of the node's previous image is dropped when the new image is recorded."""
    from cudastack.registry.client import PushedImage

    p = tmp_path / "9.9.lock.yaml"
    L.lock_plan(tiny_plan(index), p, target=TARGET)
    d = "sha256:" + "4" * 64
    L.record_outputs(p, "app", image_id="sha256:" + "1" * 64)
    L.record_push(p, "app", PushedImage(d, f"r:5000/app@{d}", f"r:5000#app@{d}", "sha256:" + "1" * 64, "r:5000/app:1"))
    changed = tiny_plan(index)
    changed.nodes[0].hash = "e" * 64                      # the app node's plan changed, its pins did not
    L.verify_plan_against_lock(changed, L.load_lock(p))
    record = {"nodes": [{"name": "app", "status": "built", "image_id": "sha256:" + "9" * 64, "tag": "cudastack-test/app:9",
                         "plan_hash": "e" * 64}]}
    lock = L.record_build_outputs(p, record)
    assert lock["nodes"]["app"]["plan_hash"] == "e" * 64
    assert lock["outputs"]["app"]["image_id"] == "sha256:" + "9" * 64 and "pushed" not in lock
    relocked = L.lock_plan(changed, p, target=TARGET)
    assert relocked["outputs"]["app"]["image_id"] == "sha256:" + "9" * 64


def test_outputs_are_dropped_when_the_closure_moved_upstream(tmp_path):
    """Same recipes (same plan hashes), but the index now serves other files for the same versions: the images
    recorded as outputs were built from the old closure, so a relock must not keep them."""
    root = tmp_path / "idx"
    index = tiny_index(root)
    p = tmp_path / "9.9.lock.yaml"
    L.lock_plan(tiny_plan(index), p, target=TARGET)
    L.record_outputs(p, "app", image_id="sha256:" + "1" * 64)
    assert "app" in L.load_lock(p)["outputs"]
    tiny_index(root, payload="v2")                # same names and versions, new bytes at the same URLs
    lock = L.lock_plan(tiny_plan(index), p, target=TARGET)
    assert "outputs" not in lock


def test_upstream_hash_change_fails_hash_checking(tmp_path):
    """Lock, then the index serves another file under the same name and version: pip's hash-checking mode
    refuses it and the error names the package; the lockfile stays byte for byte."""
    root = tmp_path / "idx"
    index = tiny_index(root, payload="original")
    p = tmp_path / "9.9.lock.yaml"
    lock = L.lock_plan(tiny_plan(index), p, target=TARGET)
    before = p.read_bytes()

    # the locked install works as locked
    got = L.install_locked(lock, "app", "PIP_SPECS", target_dir=tmp_path / "site1")
    assert got == ["tinyapp==1.0", "tinylib==1.1"]
    assert (tmp_path / "site1" / "tinylib" / "__init__.py").exists()

    # upstream re-publishes tinylib 1.1 with other bytes (the index's own hash follows the new file)
    files = sorted((root / "files").glob("*.whl"))
    make_wheel(root / "files", "tinylib", "1.1", [], payload="tampered")
    make_index(root, files)
    with pytest.raises(LockError) as exc:
        L.install_locked(L.load_lock(p), "app", "PIP_SPECS", target_dir=tmp_path / "site2")
    msg = str(exc.value)
    assert "tinylib==1.1" in msg and "tinyapp" not in msg.split("refused", 1)[1].split(".", 1)[0]
    assert "invoke lock --cuda 9.9" in msg
    assert p.read_bytes() == before


def test_sdist_pin_from_find_links(tmp_path, index):
    sd = tmp_path / "sdists"
    sd.mkdir()
    (sd / "tinysrc-2.0.tar.gz").write_bytes(b"not really a tarball, but bytes with a hash")
    lock = L.resolve_lock(tiny_plan(index, sdist=("tinysrc", "2.0")), target=TARGET, find_links=[sd])
    pin = lock["nodes"]["src"]["sdists"][0]
    import hashlib
    assert pin["sha256"] == hashlib.sha256(b"not really a tarball, but bytes with a hash").hexdigest()
    assert "installs" not in lock["nodes"]["src"]
    assert L.locked_sdist_sha256(lock, "src") == {"tinysrc-2.0.tar.gz": pin["sha256"]}
    with pytest.raises(LockError, match="No sdist"):
        L.resolve_lock(tiny_plan(index, sdist=("tinysrc", "3.0")), target=TARGET, find_links=[sd])


@pytest.mark.skipif(not shutil.which("git"), reason="git not installed")
def test_git_pin_reads_the_commit(tmp_path):
    repo = tmp_path / "repo"
    run = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True)  # noqa: E731
    repo.mkdir()
    run("init", "-q")
    (repo / "f").write_text("x")
    run("add", "f")
    run("-c", "user.email=a@b", "-c", "user.name=t", "commit", "-q", "-m", "one")
    run("tag", "v1")
    commit = run("rev-parse", "HEAD").stdout.strip()
    assert L.git_pin(repo.as_uri(), "v1") == {"url": repo.as_uri(), "ref": "v1", "commit": commit}
    assert L.git_pin("https://example.invalid/x", "v1", "f" * 40)["commit"] == "f" * 40
    with pytest.raises(LockError, match="no ref"):
        L.git_pin(repo.as_uri(), "v2")


def test_python_mismatch_is_refused(index):
    from cudastack.core.errors import EnvironmentError_

    other = dict(TARGET, python_version="3.99")
    with pytest.raises(EnvironmentError_, match="--python") as err:
        L.resolve_lock(tiny_plan(index), target=other)
    assert err.value.exit_code == 5 and "--base" in str(err.value)


@pytest.mark.network
def test_real_pypi_resolution_of_a_cuda_wheel():
    """The CUDA 13.1 runtime wheel from PyPI, resolved for a Debian bookworm image (glibc 2.36)."""
    # pip resolves for the image's Python 3.11 whatever this interpreter's version (--python-version)
    pkgs = L.pip_resolve(["nvidia-cuda-runtime==13.1.80"], target=dict(TARGET, python_version="3.11"),
                         no_deps=True, python=sys.executable)
    assert pkgs[0]["name"] == "nvidia-cuda-runtime" and pkgs[0]["url"].startswith("https://")
    assert len(pkgs[0]["sha256"]) == 64


def _two_images(index, child_spec):
    parent = Node("base", "image", "images/image.Dockerfile", [], {"PIP_SPECS": "tinylib==1.0", "PIP_INDEX_URL": index},
                  hash="e" * 64, method="wheel")
    child = Node("app", "image", "images/image.Dockerfile", ["base"], {"PIP_SPECS": child_spec, "PIP_INDEX_URL": index},
                 hash="f" * 64, method="wheel")
    return Plan("9.9", "9.9.0", ["12.0"], "pip", [parent, child], "wheelhouse/cu9.9")


def test_child_keeps_what_the_parent_image_holds(index):
    """pip keeps an installed version that satisfies a new requirement: tinyapp needs tinylib>=1.0 and the
    parent image holds tinylib 1.0, so the child's lock pins 1.0 (not the newest, 1.1)."""
    lock = L.resolve_lock(_two_images(index, "tinyapp==1.0"), target=TARGET)
    app = {p["name"]: p["version"] for p in lock["nodes"]["app"]["installs"]["PIP_SPECS"]["packages"]}
    assert app == {"tinyapp": "1.0", "tinylib": "1.0"}
    assert "warnings" not in lock


def test_child_that_replaces_a_parent_package_is_not_held_to_it(index):
    lock = L.resolve_lock(_two_images(index, "tinylib==1.1"), target=TARGET)
    app = {p["name"]: p["version"] for p in lock["nodes"]["app"]["installs"]["PIP_SPECS"]["packages"]}
    assert app == {"tinylib": "1.1"}
    assert any("tinylib: base (PIP_SPECS) installs 1.0, app (PIP_SPECS) installs 1.1" in w for w in lock["warnings"])


def test_push_recorded_while_relocking_is_not_lost(index, tmp_path, monkeypatch):
    """A push recorded while `invoke lock` resolves (minutes for a real plan) survives the re-lock's write."""
    from cudastack.registry.client import PushedImage

    p = tmp_path / "9.9.lock.yaml"
    L.lock_plan(tiny_plan(index), p, target=TARGET)
    L.record_outputs(p, "app", image_id="sha256:" + "1" * 64)
    real = L.pip_resolve
    d = "sha256:" + "2" * 64
    calls = []

    def resolve_and_meanwhile_push(*a, **kw):
        if not calls:
            L.record_push(p, "app", PushedImage(d, f"r.example/ci/app@{d}", f"r.example#ci/app@{d}",
                                                "sha256:" + "1" * 64, "r.example/ci/app:1"))
        calls.append(1)
        return real(*a, **kw)

    from cudastack.lock import resolve as lock_resolve   # where resolve_lock looks pip_resolve up

    monkeypatch.setattr(lock_resolve, "pip_resolve", resolve_and_meanwhile_push)
    lock = L.lock_plan(tiny_plan(index), p, target=TARGET)
    assert lock["pushed"]["app"]["digest"] == d
    assert L.load_lock(p)["pushed"]["app"]["enroot"] == f"r.example#ci/app@{d}"
