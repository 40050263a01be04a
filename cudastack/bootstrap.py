"""Bootstrap a Debian OS image from a Debian mirror, for hosts that cannot pull from a registry.

``debootstrap --variant=minbase <suite> <rootfs> <mirror>`` builds a root filesystem (about 200 MB for
bookworm; about 25 s on a 2-core host with a nearby mirror), then ``tar | docker import`` turns it into a
local image. The image is tagged ``cudastack/debian:<suite>-<YYYYMMDD>``, the date being the ``Date:``
field of the mirror's ``dists/<suite>/Release`` file, i.e. the archive snapshot the packages came from.

What went in is recorded on the image itself as labels (``org.cudastack.os.*``: mirror, suite, variant,
Release date and sha256, debootstrap version), so the lockfile can read it back with
:func:`os_image_record` together with the image id.

Re-running is cheap: when the tag already exists, nothing is downloaded or built and its image id is
returned.

Sources: debootstrap(8) (``--variant=minbase``: only essential packages and apt); docker-import(1)
(``--change`` applies Dockerfile instructions such as ``ENV`` and ``LABEL`` to the imported image);
Debian's Release file format (https://wiki.debian.org/DebianRepository/Format#A.22Release.22_files).
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

from .docker_engine import docker_client
from .errors import EnvironmentError_, UsageError

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


def _find_debootstrap(debootstrap: str | None) -> str:
    if debootstrap:
        if os.path.isfile(debootstrap) and os.access(debootstrap, os.X_OK):
            return debootstrap
        found = shutil.which(debootstrap)
    else:
        # root's PATH has /usr/sbin, other users' often not
        found = shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin:/sbin")
    if not found:
        raise EnvironmentError_(
            f"debootstrap was not found ({debootstrap or 'debootstrap'}). Install it "
            "(`sudo apt-get install debootstrap` on Debian/Ubuntu) or pull a Debian image from a registry instead."
        )
    return found


def bootstrap_os_image(
    suite: str = "bookworm",
    mirror: str = DEFAULT_MIRROR,
    tag: str | None = None,
    progress: Progress | None = None,
    *,
    variant: str = "minbase",
    debootstrap: str | None = None,
    docker_cli: str | None = None,
    workdir: str | None = None,
) -> str:
    """Make (or find) a local Debian OS image and return its image id (``"sha256:..."``).

    ``suite``: Debian suite or codename. ``mirror``: Debian archive URL (``http://deb.debian.org/debian``, a
    ``https://snapshot.debian.org/archive/debian/<timestamp>`` URL pins an exact snapshot). ``tag``: local
    image tag; default :func:`default_tag` (suite + the mirror's Release date). ``progress``: called with one
    line per step (debootstrap's own ``I:`` lines included, prefixed with elapsed seconds).
    ``docker_cli``: the docker client used for ``docker import`` (default: ``docker`` on PATH; any version works,
    no BuildKit is needed). ``workdir``: parent folder of the temporary rootfs (needs about 300 MB free).

    Idempotent: when ``tag`` exists locally its id is returned and nothing runs (with ``tag`` given this needs
    no network; with the default tag only the Release file is fetched). The record of what went in is on the
    image as labels; see :func:`os_image_record`.

    Raises EnvironmentError_ (exit 5) when not root (debootstrap needs root to create device nodes and chroot),
    when debootstrap or the docker client is missing, when no daemon answers, or when debootstrap or the import
    fails (with the last lines of its output); UsageError (exit 2) for an unknown suite.
    """
    if not suite or "/" in suite or " " in suite:
        raise UsageError(f"Suite {suite!r} is not a Debian suite name; pass a codename such as 'bookworm'.")
    client = docker_client()
    rel = None
    if tag is None:  # the default tag names the mirror's snapshot date: one small download to know it
        rel = release_info(suite, mirror)
        tag = default_tag(suite, rel["date"])
    if image_id := _image_id(client, tag):
        _say(progress, f"OS image {tag} exists ({image_id[:19]}); skipping debootstrap")
        return image_id

    # Everything that can be checked cheaply comes before the download.
    if os.geteuid() != 0:
        raise EnvironmentError_(
            "Bootstrapping an OS image needs root: debootstrap creates device nodes and chroots into the new "
            "root filesystem. Run this step as root (e.g. `sudo -E invoke ...`), or pull a Debian image from a "
            "registry and pass it as the OS image instead."
        )
    deboot = _find_debootstrap(debootstrap)
    docker_bin = docker_cli or shutil.which("docker")
    if not docker_bin:
        raise EnvironmentError_("No docker client found on PATH; install Debian's docker.io (or docker-ce-cli).")

    rel = rel or release_info(suite, mirror)
    ver = subprocess.run([deboot, "--version"], capture_output=True, text=True).stdout.strip()
    labels = {
        "mirror": mirror,
        "suite": suite,
        "codename": rel["codename"],
        "variant": variant,
        "release-date": rel["date_raw"],
        "release-sha256": rel["sha256"],
        "debootstrap": ver,
    }
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="cudastack-rootfs-", dir=workdir)
    rootfs = os.path.join(tmp, "rootfs")
    try:
        _say(progress, f"debootstrap --variant={variant} {suite} from {mirror} (snapshot {rel['date']}) ...")
        cmd = ["nice", "-n", "10", deboot, f"--variant={variant}", suite, rootfs, mirror]
        tail: list[str] = []
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                line = line.rstrip()
                tail = (tail + [line])[-15:]
                # one line per step, not one per package
                if not line.startswith(_PER_PACKAGE) or line.startswith(("I: Retrieving Release",
                                                                         "I: Retrieving Packages")):
                    _say(progress, f"[{time.monotonic() - t0:5.1f}s] {line}")
        if proc.returncode != 0:
            raise EnvironmentError_(
                f"debootstrap failed (exit {proc.returncode}) for suite {suite!r} from {mirror}. Last lines: "
                + " | ".join(tail) + ". Check the mirror and free disk space, then retry."
            )
        # Slim the rootfs a little: apt's downloaded lists and debs are not part of the OS.
        for sub in ("var/cache/apt/archives", "var/lib/apt/lists"):
            path = os.path.join(rootfs, sub)
            for name in os.listdir(path) if os.path.isdir(path) else []:
                full = os.path.join(path, name)
                if os.path.isfile(full):
                    os.unlink(full)
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
                f"Importing the rootfs as {tag} failed (tar exit {tar_rc}, docker import exit {imp.returncode}): "
                f"{imp.stderr.strip()[-500:]}. Check that the daemon has disk space, then retry."
            )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    image_id = _image_id(client, tag)
    if not image_id:
        raise EnvironmentError_(f"docker import reported success but {tag} does not exist; retry.")
    _say(progress, f"[{time.monotonic() - t0:5.1f}s] OS image {tag} = {image_id}")
    return image_id


def _label_value(value: str) -> str:
    """Quote a LABEL value for ``docker import --change`` (Dockerfile syntax, double quotes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def os_image_record(tag: str) -> dict:
    """What the lockfile records about an OS image: ``{"tag", "image_id", "mirror", "suite", "codename",
    "variant", "release-date", "release-sha256", "debootstrap"}`` read from the image's labels (the last seven
    are empty strings for an image that was not made by :func:`bootstrap_os_image`).

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
    for key in ("mirror", "suite", "codename", "variant", "release-date", "release-sha256", "debootstrap"):
        record[key] = labels.get(LABEL_PREFIX + key, "")
    return record
