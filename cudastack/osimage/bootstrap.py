"""Bootstrap a Debian OS image from a Debian mirror, for hosts that cannot pull from a registry.

``mmdebstrap --variant=minbase --format=tar <suite> rootfs.tar <mirror>`` with ``SOURCE_DATE_EPOCH`` set to
the Release file's date writes the root filesystem as a tarball that is bit for bit the same on any machine
for the same Release (about 170 MB for bookworm; about 20 s on a 2-core host with a nearby mirror).
:func:`image_archive` wraps it in a ``docker load`` archive whose config is fixed too (creation time = the
Release date, sorted keys), so the image id is the same on every engine that loads it: a lockfile's OS image id
holds on a fresh builder (case C50) for as long as the mirror serves the locked Release. The image is tagged
``cudastack/debian:<suite>-<YYYYMMDD>``, the date being the ``Date:`` field of the mirror's
``dists/<suite>/Release`` file, i.e. the archive snapshot the packages came from. ``debootstrap`` + ``docker
import`` is still accepted (``tool=``), with an id of that machine's own.

What went in is recorded on the image itself as labels (``org.cudastack.os.*``: mirror, suite, variant,
Release date and sha256, the tool's version), so the lockfile can read it back with :func:`os_image_record`
together with the image id.

Re-running is cheap: when the tag already exists, nothing is downloaded or built and its image id is
returned.

Sources: mmdebstrap(1) (``--variant=minbase``; section "Reproducibility": ``SOURCE_DATE_EPOCH`` gives
bit-by-bit identical output); debootstrap(8); docker-load(1) and the image spec's config (``rootfs.diff_ids``,
the image id is the config's sha256); Debian's Release file format
(https://wiki.debian.org/DebianRepository/Format#A.22Release.22_files).
"""
from __future__ import annotations

import email.utils
import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from typing import Callable

from cudastack.core.docker_engine import docker_client
from cudastack.core.errors import EnvironmentError_, LockError, UsageError

DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_REPO = "cudastack/debian"
LABEL_PREFIX = "org.cudastack.os."
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

Progress = Callable[[str], None]
_PER_PACKAGE = ("I: Retrieving ", "I: Validating ", "I: Extracting ", "I: Unpacking ", "I: Configuring ")


def _say(progress: Progress | None, msg: str) -> None:
    if progress is not None:
        progress(msg)


def _image_id(client, tag: str) -> str | None:
    import docker

    try:
        return client.images.get(tag).id
    except docker.errors.ImageNotFound:
        return None


def release_info(suite: str, mirror: str = DEFAULT_MIRROR, timeout_s: float = 30.0) -> dict:
    """Fetch ``<mirror>/dists/<suite>/Release`` and return ``{"date": "YYYYMMDD", "date_raw": str,
    "sha256": hex, "url": str, "suite": <Suite field>, "codename": <Codename field>}``.

    Raises UsageError when the mirror has no such suite (HTTP 404) and EnvironmentError_ when the mirror
    cannot be reached or its Release file has no ``Date:`` field.
    """
    import requests

    url = f"{mirror.rstrip('/')}/dists/{suite}/Release"
    try:
        resp = requests.get(url, timeout=timeout_s)
    except requests.RequestException as exc:
        raise EnvironmentError_(
            f"Cannot reach the Debian mirror {mirror!r} ({exc.__class__.__name__}: {exc}). Check the network "
            "or proxy, or pass another mirror (for example a snapshot.debian.org URL or a local mirror)."
        ) from exc
    if resp.status_code == 404:
        raise UsageError(
            f"The mirror {mirror!r} has no suite {suite!r} ({url} returned 404). Use a Debian suite or "
            "codename the mirror carries, such as 'bookworm' or 'trixie'."
        )
    if resp.status_code != 200:
        raise EnvironmentError_(f"The mirror answered HTTP {resp.status_code} for {url}; retry or use another mirror.")
    fields: dict[str, str] = {}
    for line in resp.text.splitlines():
        if line[:1].isspace() or ":" not in line:
            continue  # continuation lines (checksum lists) and blank lines
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    if "Date" not in fields:
        raise EnvironmentError_(f"{url} has no 'Date:' field, so the snapshot cannot be named; use another mirror.")
    date = email.utils.parsedate_to_datetime(fields["Date"])
    return {
        "url": url,
        "date": date.strftime("%Y%m%d"),
        "date_raw": fields["Date"],
        "sha256": hashlib.sha256(resp.content).hexdigest(),
        "suite": fields.get("Suite", ""),
        "codename": fields.get("Codename", suite),
    }


def default_tag(suite: str, release_date: str) -> str:
    """``cudastack/debian:<suite>-<YYYYMMDD>``: the tag names the suite and the mirror's snapshot date."""
    return f"{DEFAULT_REPO}:{suite}-{release_date}"


def _find_tool(tool: str | None) -> str:
    """The bootstrap program: ``tool`` (a path or a name on PATH), default ``mmdebstrap``. Raises
    EnvironmentError_ naming the Debian package when it is not found."""
    name = tool or "mmdebstrap"
    if os.path.isfile(name) and os.access(name, os.X_OK):
        return name
    # root's PATH has /usr/sbin, other users' often not
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin")
    if not found:
        pkg = "debootstrap" if os.path.basename(name).startswith("debootstrap") else "mmdebstrap"
        raise EnvironmentError_(
            f"{os.path.basename(name)} was not found ({name}). Install it (`sudo apt-get install {pkg}` on "
            "Debian/Ubuntu) or pull a Debian image from a registry instead."
        )
    return found


def is_reproducible(tool_version: str) -> bool:
    """Whether an OS image made by ``tool_version`` (the ``tool`` label, e.g. ``mmdebstrap 1.3.5``) comes out
    bit for bit the same from the same Release: mmdebstrap with ``SOURCE_DATE_EPOCH`` (its manual, section
    "Reproducibility"); debootstrap writes the time of the run into the tree."""
    return tool_version.startswith("mmdebstrap ")


def release_epoch(release_date: str) -> int:
    """``SOURCE_DATE_EPOCH`` for a bootstrap: the Release file's ``Date:`` as Unix seconds."""
    return int(email.utils.parsedate_to_datetime(release_date).timestamp())


def image_archive(rootfs_tar: str, dest: str, tag: str, *, labels: dict, epoch: int, created_by: str) -> str:
    """Write ``dest``: a ``docker load`` archive (docker-save layout: ``manifest.json``, the config JSON, one
    layer) holding ``rootfs_tar`` as its only layer, the config written with sorted keys and the creation time
    ``epoch``, so the image id (sha256 of the config) depends only on the layer's bytes, ``labels`` and ``tag``'s
    absence from the config. Returns the image id (``sha256:<hex>``). Source: the image spec's config and
    docker's ``image/tarexport`` layout (manifest ``Config``, ``RepoTags``, ``Layers``)."""
    import json
    import tarfile

    h = hashlib.sha256()
    with open(rootfs_tar, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    diff_id = "sha256:" + h.hexdigest()
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(os.uname().machine, os.uname().machine)
    config = {"architecture": arch, "os": "linux", "created": created,
              "config": {"Env": [f"PATH={_PATH}", "LANG=C.UTF-8"], "Cmd": ["/bin/bash"],
                         "Labels": {LABEL_PREFIX + k: v for k, v in labels.items()}},
              "rootfs": {"type": "layers", "diff_ids": [diff_id]},
              "history": [{"created": created, "created_by": created_by}]}
    cfg = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    image_id = hashlib.sha256(cfg).hexdigest()
    layer = f"{diff_id.split(':')[1]}/layer.tar"
    manifest = json.dumps([{"Config": f"{image_id}.json", "RepoTags": [tag], "Layers": [layer]}]).encode()

    def add(tar, name, data=None, path=None):
        info = tarfile.TarInfo(name)
        info.mtime, info.mode = epoch, 0o644
        if path is not None:
            info.size = os.path.getsize(path)
            with open(path, "rb") as f:
                tar.addfile(info, f)
        else:
            info.size = len(data)
            tar.addfile(info, __import__("io").BytesIO(data))
    with tarfile.open(dest, "w") as tar:
        add(tar, f"{image_id}.json", cfg)
        add(tar, layer, path=rootfs_tar)
        add(tar, "manifest.json", manifest)
    return "sha256:" + image_id


def bootstrap_os_image(
    suite: str = "bookworm",
    mirror: str = DEFAULT_MIRROR,
    tag: str | None = None,
    progress: Progress | None = None,
    *,
    variant: str = "minbase",
    tool: str | None = None,
    docker_cli: str | None = None,
    workdir: str | None = None,
    expect_release_sha256: str | None = None,
) -> str:
    """Make (or find) a local Debian OS image and return its image id (``"sha256:..."``).

    ``suite``: Debian suite or codename. ``mirror``: Debian archive URL (``http://deb.debian.org/debian``, a
    ``https://snapshot.debian.org/archive/debian/<timestamp>`` URL pins an exact snapshot). ``tag``: local
    image tag; default :func:`default_tag` (suite + the mirror's Release date). ``progress``: called with one
    line per step (the tool's own ``I:`` lines included, prefixed with elapsed seconds). ``tool``: the
    bootstrap program, default ``mmdebstrap``: with ``SOURCE_DATE_EPOCH`` set to the Release's date its
    tarball is bit for bit the same on every machine for the same Release, and the image is loaded from an
    archive whose config is fixed too (:func:`image_archive`), so the image id is the same everywhere
    (case C50). ``debootstrap`` (+ ``docker import``) still works, with an id of this machine's own.
    ``docker_cli``: the docker client used for ``docker load``/``import`` (default: ``docker`` on PATH).
    ``workdir``: parent folder of the temporary files (needs about 400 MB free). ``expect_release_sha256``:
    refuse (LockError, before any download but the Release file) when the mirror serves another Release.

    Idempotent: when ``tag`` exists locally its id is returned and nothing runs (with ``tag`` given this needs
    no network; with the default tag only the Release file is fetched). The record of what went in is on the
    image as labels; see :func:`os_image_record`.

    Raises EnvironmentError_ (exit 5) when not root (the tools need root to create device nodes and chroot),
    when the tool or the docker client is missing, when no daemon answers, or when the bootstrap or the load
    fails (with the last lines of its output); UsageError (exit 2) for an unknown suite; LockError (exit 7) when
    ``expect_release_sha256`` is not the mirror's.
    """
    if not suite or "/" in suite or " " in suite:
        raise UsageError(f"Suite {suite!r} is not a Debian suite name; pass a codename such as 'bookworm'.")
    client = docker_client()
    rel = None
    if tag is None:  # the default tag names the mirror's snapshot date: one small download to know it
        rel = release_info(suite, mirror)
        tag = default_tag(suite, rel["date"])
    if image_id := _image_id(client, tag):
        _say(progress, f"OS image {tag} exists ({image_id[:19]}); skipping the bootstrap")
        return image_id

    # Everything that can be checked cheaply comes before the download.
    if os.geteuid() != 0:
        raise EnvironmentError_(
            "Bootstrapping an OS image needs root: the bootstrap creates device nodes and chroots into the new "
            "root filesystem. Run this step as root (e.g. `sudo -E invoke ...`), or pull a Debian image from a "
            "registry and pass it as the OS image instead."
        )
    prog = _find_tool(tool)
    mm = not os.path.basename(prog).startswith("debootstrap")
    docker_bin = docker_cli or shutil.which("docker")
    if not docker_bin:
        raise EnvironmentError_("No docker client found on PATH; install Debian's docker.io (or docker-ce-cli).")

    rel = rel or release_info(suite, mirror)
    if expect_release_sha256 and rel["sha256"] != expect_release_sha256:
        raise LockError(
            f"The mirror {mirror} now serves the {suite} Release of {rel['date_raw']} (sha256 {rel['sha256'][:16]}), "
            f"not the one the lock pins (sha256 {expect_release_sha256[:16]}): the mirror has moved past the locked "
            "Release, so the locked OS image cannot be made again bit for bit. Relock (`invoke lock ...`) to take "
            "the new Release, or load the locked OS image from where it was made (`docker save` / `docker load`)."
        )
    ver = subprocess.run([prog, "--version"], capture_output=True, text=True).stdout.strip()
    epoch = release_epoch(rel["date_raw"])
    labels = {
        "mirror": mirror,
        "suite": suite,
        "codename": rel["codename"],
        "variant": variant,
        "release-date": rel["date_raw"],
        "release-sha256": rel["sha256"],
        "tool": ver,
    }
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="cudastack-rootfs-", dir=workdir)
    rootfs = os.path.join(tmp, "rootfs.tar" if mm else "rootfs")
    try:
        _say(progress, f"{os.path.basename(prog)} --variant={variant} {suite} from {mirror} (snapshot {rel['date']}"
             + (f", SOURCE_DATE_EPOCH={epoch}" if mm else "") + ") ...")
        cmd = ["nice", "-n", "10", prog, f"--variant={variant}"] + (["--format=tar"] if mm else []) + \
            [suite, rootfs, mirror]
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch)) if mm else None
        rc, tail = _run_tool(cmd, env, progress, t0)
        if rc != 0:
            raise EnvironmentError_(
                f"{os.path.basename(prog)} failed (exit {rc}) for suite {suite!r} from {mirror}. Last "
                "lines: " + " | ".join(tail) + ". Check the mirror and free disk space, then retry."
            )
        want = None
        if mm:
            archive = os.path.join(tmp, "image.tar")
            want = image_archive(rootfs, archive, tag, labels=labels, epoch=epoch,
                                 created_by=f"{ver} --variant={variant} {suite} {mirror}")
            _say(progress, f"[{time.monotonic() - t0:5.1f}s] docker load -> {tag} ({want[:19]})")
            imp = subprocess.run([docker_bin, "load", "-q", "-i", archive], capture_output=True, text=True)
            tar_rc = 0
        else:
            _debootstrap_slim(rootfs)
            changes = [f"ENV PATH={_PATH}", "ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]']
            changes += [f"LABEL {LABEL_PREFIX}{k}={_label_value(v)}" for k, v in labels.items()]
            _say(progress, f"[{time.monotonic() - t0:5.1f}s] docker import -> {tag}")
            import_cmd = [docker_bin, "import"]
            for ch in changes:
                import_cmd += ["--change", ch]
            import_cmd += ["-", tag]
            tar = subprocess.Popen(["tar", "--numeric-owner", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
            imp = subprocess.run(import_cmd, stdin=tar.stdout, capture_output=True, text=True)
            assert tar.stdout is not None
            tar.stdout.close()
            tar_rc = tar.wait()
        if tar_rc != 0 or imp.returncode != 0:
            raise EnvironmentError_(
                f"Loading the rootfs as {tag} failed (tar exit {tar_rc}, docker exit {imp.returncode}): "
                f"{imp.stderr.strip()[-500:]}. Check that the daemon has disk space, then retry."
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    image_id = _image_id(client, tag)
    if not image_id:
        raise EnvironmentError_(f"docker reported success but {tag} does not exist; retry.")
    if want and image_id != want:
        raise EnvironmentError_(f"docker load gave {tag} the id {image_id}, not the archive's config digest {want}: "
                                "this engine rewrites image configs; load the archive into a classic engine.")
    _say(progress, f"[{time.monotonic() - t0:5.1f}s] OS image {tag} = {image_id}")
    return image_id


def _run_tool(cmd: list[str], env: dict | None, progress, t0: float) -> tuple[int, list[str]]:
    """Run the bootstrap tool, one progress line per step; returns its exit code and its last 15 lines. Its own
    process group: a terminal's Ctrl-C reaches this process only, which then stops the tool and keeps reading its
    output while it cleans up (:func:`_stop_tool`; an interrupted tool whose output pipe was closed died of SIGPIPE
    in its clean-up and left its chroot's /proc, /sys and /dev mounts and its temp dir behind)."""
    tail: list[str] = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          process_group=0) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                line = line.rstrip()
                tail = (tail + [line])[-15:]
                # one line per step, not one per package
                if not line.startswith(_PER_PACKAGE) or line.startswith(("I: Retrieving Release",
                                                                         "I: Retrieving Packages")):
                    _say(progress, f"[{time.monotonic() - t0:5.1f}s] {line}")
        except KeyboardInterrupt:
            _stop_tool(proc, progress)
            raise
    return proc.returncode, tail


def _stop_tool(proc: subprocess.Popen, progress) -> None:
    """Stop an interrupted bootstrap tool so that it cleans up after itself: SIGINT (mmdebstrap and debootstrap
    unmount what they mounted in the chroot and remove their temp dir on it), its output read until it exits (a
    closed pipe would end its clean-up with SIGPIPE), SIGKILL after 120 s."""
    import signal

    _say(progress, "interrupted: stopping the bootstrap and letting it unmount and remove its temp dir")
    try:
        proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 120
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip():
                _say(progress, f"  {line.rstrip()}")
            if time.monotonic() > deadline:
                break
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except (subprocess.TimeoutExpired, OSError, ValueError):
        proc.kill()


def _debootstrap_slim(rootfs: str) -> None:
    """apt's downloaded lists and debs are not part of the OS (mmdebstrap leaves them out itself)."""
    for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
        path = os.path.join(rootfs, sub)
        for name in os.listdir(path) if os.path.isdir(path) else []:
            full = os.path.join(path, name)
            if os.path.isfile(full):
                os.unlink(full)


def _label_value(value: str) -> str:
    """Quote a LABEL value for ``docker import --change`` (Dockerfile syntax, double quotes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def os_image_record(tag: str) -> dict:
    """What the lockfile records about an OS image: ``{"tag", "image_id", "mirror", "suite", "codename",
    "variant", "release-date", "release-sha256", "tool"}`` read from the image's labels (the last seven
    are empty strings for an image that was not made by :func:`bootstrap_os_image`; ``tool`` is the bootstrap
    program's version, read from the older ``debootstrap`` label on images made before mmdebstrap).

    Raises EnvironmentError_ when no daemon answers and UsageError when ``tag`` does not exist.
    """
    client = docker_client()
    import docker

    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound as exc:
        raise UsageError(f"No local image {tag!r}; bootstrap it first (bootstrap_os_image) or pass an existing tag.") from exc
    labels = image.labels or {}
    record = {"tag": tag, "image_id": image.id}
    for key in ("mirror", "suite", "codename", "variant", "release-date", "release-sha256"):
        record[key] = labels.get(LABEL_PREFIX + key, "")
    record["tool"] = labels.get(LABEL_PREFIX + "tool") or labels.get(LABEL_PREFIX + "debootstrap", "")
    return record
