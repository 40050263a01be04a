"""Case C50: a lock that works on another machine. The pip base's OS image is made with mmdebstrap under
SOURCE_DATE_EPOCH (the Release's date) and loaded from an archive whose config is fixed, so bootstrapping the
same Release again (another machine, or this engine after the image is gone) gives the same image id, and
``invoke build --locked`` on an engine without the image makes it again and checks it. Where it cannot (the mirror
moved past the locked Release; a lock made by debootstrap) the build is refused before any download, naming why.

The two bootstraps run in two engines: this host's, and a second, empty dockerd (its own data root, as a fresh
builder has; ``second_dockerd`` of tests/test_builder_integration.py), where ``ensure_locked_os_image`` makes the
image again through the docker CLI pointed at it. Both share this host's mmdebstrap and mirror, not a second
machine's; the image id depends only on the archive's config bytes, which hold the rootfs tarball's sha256."""
from __future__ import annotations

import hashlib
import json
import os
import tarfile
from types import SimpleNamespace

import pytest

from cudastack.core.errors import LockError
from test_builder_integration import second_dockerd  # noqa: F401 - the fixture: a second, empty dockerd

pytestmark = [pytest.mark.docker, pytest.mark.network]

TAG = "cudastack-test/debian:c50"


@pytest.fixture
def client():
    from cudastack.core.docker_engine import docker_client
    c = docker_client()
    yield c
    try:
        c.images.remove(TAG, force=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


def _plan(tag: str):
    return SimpleNamespace(nodes=[SimpleNamespace(name="base", kind="base-pip", build_args={"OS_IMAGE": tag})])


def test_c50_a_second_bootstrap_of_the_locked_release_gives_the_locked_id(client, second_dockerd, monkeypatch):
    import docker

    from cudastack.osimage.bootstrap import bootstrap_os_image, os_image_record
    from cudastack.lock.apply import ensure_locked_os_image

    lines: list[str] = []
    first = bootstrap_os_image("bookworm", tag=TAG, progress=lines.append)
    assert any("SOURCE_DATE_EPOCH=" in s for s in lines), lines
    rec = os_image_record(TAG)
    assert rec["tool"].startswith("mmdebstrap ") and rec["image_id"] == first
    lock = {"nodes": {"base": {"os_image": rec}}}
    _, sock = second_dockerd
    other = docker.DockerClient(base_url=f"unix://{sock}")
    assert not other.images.list(), "the second engine is not empty"
    monkeypatch.setenv("DOCKER_HOST", f"unix://{sock}")       # the docker CLI that loads the image: the second engine
    said: list[str] = []
    ensure_locked_os_image(_plan(TAG), lock, other, say=said.append)
    assert other.images.get(TAG).id == first, "the same Release bootstrapped in another engine gave another image id"
    assert any("making it again from the locked Release" in s for s in said), said
    # present there now: nothing is made again
    said.clear()
    ensure_locked_os_image(_plan(TAG), lock, other, say=said.append)
    assert not said


def test_c50_a_mirror_past_the_locked_release_is_refused_before_the_download(client):
    from cudastack.osimage.bootstrap import bootstrap_os_image

    lines: list[str] = []
    with pytest.raises(LockError, match="moved past the locked Release.*Relock"):
        bootstrap_os_image("bookworm", tag=TAG, progress=lines.append, expect_release_sha256="0" * 64)
    assert not lines, "refused before the bootstrap started"
    assert not client.images.list(name=TAG)


def test_c50_a_lock_made_by_debootstrap_asks_for_one_relock(client):
    from cudastack.lock.apply import ensure_locked_os_image

    rec = {"tag": TAG, "image_id": "sha256:" + "ea" * 32, "suite": "bookworm", "mirror": "http://deb.debian.org/debian",
           "variant": "minbase", "release-sha256": "ab" * 32, "debootstrap": "debootstrap 1.0.128+nmu2+deb12u2"}
    with pytest.raises(LockError, match="made by debootstrap 1.0.128.*does not\\s+reproduce.*Relock once"):
        ensure_locked_os_image(_plan(TAG), {"nodes": {"base": {"os_image": rec}}}, client)
    assert not client.images.list(name=TAG)


def test_image_archive_id_is_the_config_digest_and_moves_with_its_inputs(tmp_path):
    """Unit: the archive's image id is the sha256 of the config it holds, the same for the same inputs, and
    another for another rootfs byte or another label (so an id match means the same content)."""
    from cudastack.osimage.bootstrap import image_archive

    rootfs = tmp_path / "rootfs.tar"
    with tarfile.open(rootfs, "w") as t:
        info = tarfile.TarInfo("etc/os-release")
        data = b"ID=debian\n"
        info.size, info.mtime = len(data), 0
        t.addfile(info, __import__("io").BytesIO(data))
    kw = dict(labels={"suite": "bookworm"}, epoch=1783764997, created_by="test")
    a = image_archive(str(rootfs), str(tmp_path / "a.tar"), "x:1", **kw)
    b = image_archive(str(rootfs), str(tmp_path / "b.tar"), "y:2", **kw)
    assert a == b, "the tag is not part of the image id"
    with tarfile.open(tmp_path / "a.tar") as t:
        manifest = json.loads(t.extractfile("manifest.json").read())
        cfg = t.extractfile(manifest[0]["Config"]).read()
    assert "sha256:" + hashlib.sha256(cfg).hexdigest() == a
    assert json.loads(cfg)["created"] == "2026-07-11T10:16:37Z"
    assert image_archive(str(rootfs), str(tmp_path / "c.tar"), "x:1", **dict(kw, labels={"suite": "trixie"})) != a
    with open(rootfs, "ab") as f:
        f.write(b"\0" * 512)
    assert image_archive(str(rootfs), str(tmp_path / "d.tar"), "x:1", **kw) != a
    assert os.path.getsize(tmp_path / "a.tar") > 0
