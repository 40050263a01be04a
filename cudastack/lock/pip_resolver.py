"""pip's resolver for the images' platform: the target (Python, glibc, manylinux tags, PEP 508 markers), the
clean pip environment, and one resolution as pip's installation report (:func:`pip_resolve`).

Resolution runs ``pip install --dry-run --ignore-installed --report`` (pip >= 22.2, "Installation Report"
format version 1: ``install[].metadata.{name,version}``, ``install[].download_info.{url,archive_info.hashes}``),
with ``--platform/--python-version/--implementation/--abi --only-binary=:all:`` for the image's platform
(manylinux tags from the image's glibc, PEP 600), and the user's pip configuration switched off
(``PIP_CONFIG_FILE=os.devnull``) so only the plan's indexes count. :func:`kept_pins` applies pip's rule that an
installed distribution satisfying a requirement is kept.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterable, Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from cudastack.core.errors import LockError
from cudastack.lock.model import DEFAULT_INDEX
# the one builder of the manylinux tag list (also behind the radar's wheel tags), re-exported
from cudastack.pkgindex.wheels import MIN_MANYLINUX_MINOR, manylinux_platforms  # noqa: F401

#: glibc of well-known base distributions (Ubuntu/Debian package pages for libc6), used when the base
#: image is not on this host to ask it directly.
KNOWN_GLIBC = {"ubuntu24.04": "2.39", "ubuntu22.04": "2.35", "ubuntu20.04": "2.31", "bookworm": "2.36",
               "trixie": "2.41", "bullseye": "2.31"}


def target_for_plan(plan, *, glibc: Optional[str] = None, client=None) -> dict:
    """The platform the plan's images run pip on: ``{"python_version": "3.11", "glibc": "2.36",
    "machine": "x86_64", "implementation": "cp"}``. Python comes from the toolchain's base choice; glibc
    from ``glibc``, else by asking the OS/base image when it is on this host (``getconf GNU_LIBC_VERSION``),
    else from :data:`KNOWN_GLIBC` by the image's suite/tag. Raises LockError when neither works."""
    base = plan.nodes[0]
    bc = (base.inputs.get("toolchain") or {}).get("base_choice") or {}
    py = str(bc.get("python") or "")
    if not re.fullmatch(r"3\.\d+", py):
        raise LockError(f"The plan's base choice names no Python version ({py!r}); add `python:` to the base in "
                        "toolchains.yaml.")
    image = base.build_args.get("OS_IMAGE") or base.build_args.get("BASE_IMAGE", "")
    if not glibc and client is not None:
        try:
            client.images.get(image)          # only an image already here: never pull to ask
            out = client.containers.run(image, ["getconf", "GNU_LIBC_VERSION"], remove=True)
            glibc = out.decode().split()[-1]
        except Exception:  # noqa: BLE001 - any failure falls back to the table
            glibc = None
    if not glibc:
        key = next((k for k in KNOWN_GLIBC if k in image or k == bc.get("os_suite")), None)
        glibc = KNOWN_GLIBC.get(key) if key else None
    if not glibc:
        raise LockError(f"Cannot tell the glibc version of the base image {image!r} (it is not on this host and "
                        "not a known distribution); pass --glibc 2.N.")
    return {"python_version": py, "glibc": glibc, "machine": "x86_64", "implementation": "cp"}


def _clean_env() -> dict:
    """The environment pip runs in: no PIP_* variables, no pip config files (only the plan's indexes count);
    the CA bundle of an intercepting proxy is kept (it is TLS trust, not a package source)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _cert_args() -> list[str]:
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        v = os.environ.get(var)
        if v and os.path.exists(v):
            return ["--cert", v]
    return []


def index_args(index: str, extra_index: str = "", find_links: Iterable[str] = ()) -> list[str]:
    """pip options for the node's package sources. ``index`` "" means PyPI; "none" means ``--no-index``."""
    out = []
    if index == "none":
        out.append("--no-index")
    else:
        out += ["--index-url", index or DEFAULT_INDEX]
    for e in (extra_index or "").split():
        out += ["--extra-index-url", e]
    for f in find_links:
        out += ["--find-links", str(f)]
    return out


def _pkg_from_report(item: dict) -> dict:
    meta = item.get("metadata") or {}
    info = item.get("download_info") or {}
    url = info.get("url", "")
    archive = info.get("archive_info") or {}
    sha = (archive.get("hashes") or {}).get("sha256")
    if not sha and str(archive.get("hash", "")).startswith("sha256="):
        sha = archive["hash"].split("=", 1)[1]
    name = meta.get("name", "?")
    if "vcs_info" in info or "dir_info" in info:
        raise LockError(f"pip resolved {name} from a {'VCS' if 'vcs_info' in info else 'local folder'} source "
                        f"({url}); lock those as git/path sources of their recipe, not as a dependency.")
    if not sha:
        raise LockError(f"The index gave no sha256 for {name} {meta.get('version')} ({url}); use an index that "
                        "publishes hashes (PyPI does).")
    pkg = {"name": canonicalize_name(name), "version": meta.get("version", "?"),
           "filename": url.rsplit("/", 1)[-1].split("#", 1)[0], "sha256": sha}
    if url.startswith(("https://", "http://")):
        pkg["url"] = url.split("#", 1)[0]
    if item.get("requested"):
        pkg["requested"] = True
    return pkg


def _pip_failure(stderr: str, specs: list[str], where: str) -> LockError:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip().startswith("ERROR")]
    detail = " ".join(lines[-3:]) or stderr.strip()[-600:]
    return LockError(f"pip could not resolve {' '.join(specs)} for {where}: {detail} Check the pins in the recipe "
                     "(the version must exist on the index for the target Python and platform); nothing was written.")


def pip_resolve(specs: list[str], *, target: dict, index: str = "", extra_index: str = "",
                find_links: Iterable[str] = (), no_deps: bool = False, python: str = sys.executable,
                where: str = "", timeout: float = 1800, constraints: Optional[dict[str, str]] = None,
                requires: Optional[dict] = None) -> list[dict]:
    """Resolve ``specs`` (requirement strings) with pip's resolver for ``target`` (see
    :func:`target_for_plan`) and return the install set: ``[{"name", "version", "filename", "url"?,
    "sha256", "requested"?}]`` sorted by name. ``no_deps`` resolves only the named packages (a wheel node's
    ``pip download --no-deps``). ``constraints``: {name: version or specifier} passed as a pip constraints
    file (what the image already holds; ``"==13.0.*"`` keeps a CUDA wheel on a release). ``requires``: when a dict is given, it is filled with {name: [Requires-Dist
    strings]} of every resolved package (from the report's metadata). Runs ``python -m pip install --dry-run
    --ignore-installed --report``; nothing is installed. Raises LockError (pip < 22.2, unresolvable, no hash)."""
    if not specs:
        return []
    py_nodot = target["python_version"].replace(".", "")
    with tempfile.TemporaryDirectory(prefix="cudastack-lock-") as tmp:
        report = os.path.join(tmp, "report.json")
        cmd = [python, "-m", "pip", "install", "--dry-run", "--quiet", "--report", report, "--ignore-installed",
               "--target", os.path.join(tmp, "target"), "--only-binary=:all:",
               "--python-version", target["python_version"], "--implementation", target["implementation"],
               "--abi", f"{target['implementation']}{py_nodot}", "--abi", "abi3", "--abi", "none",
               "--no-cache-dir"]
        for plat in manylinux_platforms(target["glibc"], target["machine"]):
            cmd += ["--platform", plat]
        if no_deps:
            cmd.append("--no-deps")
        if constraints:
            cfile = os.path.join(tmp, "constraints.txt")
            Path(cfile).write_text("".join(f"{n}{v}\n" if v[:1] in "=<>!~" else f"{n}=={v}\n"
                                           for n, v in sorted(constraints.items())))
            cmd += ["--constraint", cfile]
        cmd += _cert_args() + index_args(index, extra_index, find_links) + list(specs)
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(), timeout=timeout)
        except subprocess.TimeoutExpired:
            raise LockError(f"pip did not finish resolving {' '.join(specs)} within {timeout:.0f} s.") from None
        if proc.returncode != 0:
            if "no such option: --report" in proc.stderr or "no such option: --dry-run" in proc.stderr:
                raise LockError(f"{python} has a pip older than 22.2 (no --dry-run --report); upgrade it.")
            raise _pip_failure(proc.stderr, specs, where or "the target platform")
        data = json.loads(Path(report).read_text())
    if str(data.get("version")) != "1":
        raise LockError(f"pip wrote an installation report of version {data.get('version')!r}; this tool reads "
                        "version 1 (pip >= 22.2).")
    pkgs = [_pkg_from_report(i) for i in data.get("install", [])]
    if requires is not None:
        for i in data.get("install", []):
            meta = i.get("metadata") or {}
            requires[canonicalize_name(meta.get("name", "?"))] = {
                "requires_dist": list(meta.get("requires_dist") or []),
                "extras": list(i.get("requested_extras") or [])}
    return sorted(pkgs, key=lambda p: p["name"])


def marker_environment(target: dict) -> dict[str, str]:
    """PEP 508 marker variables of the target image (Linux, CPython, the target's Python version)."""
    return {"python_version": target["python_version"], "python_full_version": target["python_version"] + ".0",
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": target["machine"],
            "os_name": "posix", "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def kept_pins(held: dict[str, str], specs: list[str], closure: list[dict], requires: dict[str, dict],
              target: Optional[dict] = None) -> dict[str, str]:
    """The subset of ``held`` ({name: version} an image already has) that pip would keep when installing
    ``specs``: packages of the ``closure`` whose held version satisfies every requirement on them (the
    top-level ``specs`` and each closure package's Requires-Dist whose PEP 508 marker holds on ``target``
    with the extras pip requested; without ``target`` every marker counts, which can only drop a pin).
    pip's rule: an installed distribution that satisfies a requirement is not reinstalled. ``requires``:
    {name: {"requires_dist": [...], "extras": [...]}} as :func:`pip_resolve` fills it."""
    from packaging.version import InvalidVersion, Version

    env = marker_environment(target) if target else None
    in_closure = {p["name"] for p in closure}
    specifiers: dict[str, list] = {}
    texts = [(t, [""]) for t in specs]
    for info in requires.values():
        texts += [(t, [""] + list(info.get("extras") or [])) for t in info.get("requires_dist", [])]
    for text, extras in texts:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is not None and env is not None \
                and not any(req.marker.evaluate({**env, "extra": e}) for e in extras):
            continue
        specifiers.setdefault(canonicalize_name(req.name), []).append(req.specifier)
    out = {}
    for name, version in held.items():
        if name not in in_closure:
            continue
        try:
            v = Version(version)
        except InvalidVersion:
            continue
        if all(spec.contains(v, prereleases=True) for spec in specifiers.get(name, [])):
            out[name] = version
    return out
