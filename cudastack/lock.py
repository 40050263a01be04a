"""Lockfiles: every input of a toolchain's plan pinned, every output recorded, written atomically.

``lockfiles/<toolchain>.lock.yaml`` (e.g. ``lockfiles/13.1.lock.yaml``) holds, per plan node:

* the base: the bootstrapped OS image's id plus the Debian mirror, suite and Release date/sha256 it came
  from (``base-pip``), or the NVIDIA base image's registry digest (``base-nvidia``);
* per pip install the node runs (``installs``, keyed by the build arg that carries the requirements, e.g.
  ``CUDA_PIP_SPECS``, ``PIP_SPECS``, the Dockerfile's ``VENV_PIP_SPECS``): the requested specs and the whole
  dependency closure pip resolves for the target platform, each package with version, file name, URL and
  sha256;
* sdists with sha256, git refs with their commit, local source folders with a content digest;
* ``outputs``: what a locked build produced (image id, wheel sha256) and ``pushed``: the registry digest in
  both spellings (``registry/name@sha256:...`` and enroot ``registry#name@sha256:...``).

Resolution uses pip's own resolver: ``pip install --dry-run --ignore-installed --report`` (pip >= 22.2,
"Installation Report" format version 1: ``install[].metadata.{name,version}``,
``install[].download_info.{url,archive_info.hashes}``), with ``--platform/--python-version/--implementation/
--abi --only-binary=:all:`` for the image's platform (manylinux tags from the image's glibc, PEP 600), and the
user's pip configuration switched off (``PIP_CONFIG_FILE=os.devnull``) so only the plan's indexes count.
Each install is resolved as it happens in its image: pip keeps an installed distribution that satisfies a
requirement, so the versions the parent image already holds are passed as constraints wherever they satisfy
every active requirement of the new closure (:func:`kept_pins`); otherwise pip's newest choice is pinned and a
warning notes the replacement. Sdist hashes come from the index's JSON simple API (PEP 691), which lists
every file's sha256.

Locked builds install with ``pip install --require-hashes --no-deps -r <requirements>`` (pip's
hash-checking mode: every file must match a listed hash, or pip stops and names the package), using
:func:`requirements_text` / :func:`locked_build_args`.

Writes are atomic (:mod:`stackprobe.atomic`): the whole text is rendered first, written to a temporary file
in the same folder, fsync'ed, then moved over the old file with ``os.replace`` (POSIX rename is atomic), so a
reader sees the old lockfile or the new one and a failure at any point leaves the old one byte for byte.

Errors: :class:`LockError` (exit 7) for a missing, malformed or stale lock, an unresolvable requirement or a
hash mismatch; RegistryError (exit 8) when a base image digest cannot be read.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable, Optional

import requests
import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_sdist_filename

from cudastack.credentials import redact, scrub
from cudastack import cuda_wheels
from cudastack.errors import EnvironmentError_, LockError, UsageError
from stackprobe.atomic import write_atomic  # the project's one atomic writer (re-exported here)

LOCK_VERSION = 1
PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOCKFILES_DIR = PROJECT_ROOT / "lockfiles"
DEFAULT_INDEX = "https://pypi.org/simple"
MIN_MANYLINUX_MINOR = 5         # manylinux1 == manylinux_2_5 (PEP 600)
#: glibc of well-known base distributions (Ubuntu/Debian package pages for libc6), used when the base
#: image is not on this host to ask it directly.
KNOWN_GLIBC = {"ubuntu24.04": "2.39", "ubuntu22.04": "2.35", "ubuntu20.04": "2.31", "bookworm": "2.36",
               "trixie": "2.41", "bullseye": "2.31"}
HASH_MISMATCH_HEADER = "THESE PACKAGES DO NOT MATCH THE HASHES"

Progress = Callable[[str], None]


def lock_path(toolchain: str, lockfiles_dir: str | Path | None = None) -> Path:
    """``<lockfiles_dir>/<toolchain>.lock.yaml`` (default folder: the project's ``lockfiles/``)."""
    return Path(lockfiles_dir or DEFAULT_LOCKFILES_DIR) / f"{toolchain}.lock.yaml"


# ------------------------------------------------------------------------------------------- file I/O
def render_lock(lock: dict) -> str:
    """The lockfile text: a header comment, then YAML in a stable key order (block style)."""
    head = (f"# cudastack lockfile for CUDA {lock.get('toolchain')}: every input of the plan pinned, every output "
            f"recorded.\n# Generated; do not edit. Refresh with: {lock_command(lock)}\n")
    # a URL's login (a private index's user:token) is never written (credentials.scrub)
    return head + yaml.safe_dump(scrub(lock), sort_keys=False, default_flow_style=False, width=200, allow_unicode=True)


def lock_command(lock: dict) -> str:
    """The ``invoke lock`` command line that re-creates ``lock``'s plan: toolchain, base, archs, skipped
    components (``invoke lock --cuda 12.8 --base pip --skip flash-attn``)."""
    cmd = f"invoke lock --cuda {lock.get('toolchain')}"
    if lock.get("base_kind"):
        cmd += f" --base {lock['base_kind']}"
    archs = lock.get("target_archs") or []
    if archs and list(archs) != ["12.0"]:
        cmd += f" --arch {','.join(archs)}"
    return cmd + "".join(f" --skip {s}" for s in lock.get("skipped") or [])


def plan_options(cuda: str, arch, base, skip, lockfiles_dir: str | Path | None = None) -> tuple:
    """(arch, base, skip) for a command that works from the lockfile of toolchain ``cuda``: options the user
    did not give come from the lock (its base, archs and skipped components), so `invoke build --cuda 12.8
    --locked` builds the plan that `invoke lock --cuda 12.8 --base pip --skip flash-attn` locked. Without a
    lockfile, or when every option is given, they are returned unchanged."""
    path = lock_path(str(cuda), lockfiles_dir)
    if not path.is_file():
        return arch, base, skip
    try:
        lk = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return arch, base, skip
    if not isinstance(lk, dict):
        return arch, base, skip
    return (arch if arch else (",".join(lk["target_archs"]) if lk.get("target_archs") else None),
            base or lk.get("base_kind") or None,
            skip if skip else (list(lk.get("skipped") or []) or None))


@contextlib.contextmanager
def exclusive(path: str | Path):
    """Hold an exclusive ``flock`` on the lockfile's folder while reading, changing and writing the lock, so a
    push record and a re-lock running at the same time cannot lose each other's update."""
    folder = Path(path).parent
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def write_lock(path: str | Path, lock: dict) -> None:
    """Validate ``lock`` against the schema, render it and write it atomically (see :func:`write_atomic`)."""
    check_schema(lock, str(path))
    write_atomic(path, render_lock(lock))


def load_lock(path_or_toolchain: str | Path, lockfiles_dir: str | Path | None = None) -> dict:
    """Read and schema-check a lockfile. ``path_or_toolchain``: a path, or a toolchain name ("13.1") looked
    up as ``<lockfiles_dir>/<toolchain>.lock.yaml``. Raises LockError (missing, unreadable, bad schema)."""
    p = Path(path_or_toolchain)
    is_toolchain = bool(re.fullmatch(r"\d+\.\d+", str(path_or_toolchain)))
    if is_toolchain:
        p = lock_path(str(path_or_toolchain), lockfiles_dir)
    if not p.exists():
        tc = str(path_or_toolchain) if is_toolchain else (p.name[:-len(".lock.yaml")]
                                                            if p.name.endswith(".lock.yaml") else "X")
        raise LockError(f"No lockfile at {p}. Create it with `invoke lock --cuda {tc}` and commit it.")
    try:
        data = yaml.safe_load(p.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise LockError(f"{p} is not readable YAML ({exc}). Restore it from version control or re-create it "
                        "with `invoke lock`.") from None
    check_schema(data, str(p))
    return data


_NODE_KEYS = {"kind", "method", "plan_hash", "index", "os_image", "base_image", "installs", "sdists", "git",
              "paths"}
_PKG_KEYS = {"name", "version", "filename", "url", "sha256", "requested"}


def check_schema(lock, where: str = "lock") -> None:
    """Raise LockError naming the key when ``lock`` does not follow the lockfile schema (version 1)."""
    def bad(msg):
        raise LockError(f"{where}: {msg}. Re-create the lockfile with `invoke lock --cuda X`.")

    if not isinstance(lock, dict):
        bad("the top level is not a mapping")
    if lock.get("lock_version") != LOCK_VERSION:
        bad(f"lock_version is {lock.get('lock_version')!r}, this tool reads version {LOCK_VERSION}")
    for k in ("toolchain", "cuda_version"):
        if not isinstance(lock.get(k), str):
            bad(f"'{k}' is missing or not a string")
    unknown = set(lock) - {"lock_version", "toolchain", "cuda_version", "base_kind", "target_archs", "skipped",
                           "resolver", "nodes", "outputs", "pushed", "warnings"}
    if unknown:
        bad(f"unknown top-level keys {sorted(unknown)}")
    nodes = lock.get("nodes")
    if not isinstance(nodes, dict) or not nodes:
        bad("'nodes' is missing or empty")
    for name, node in nodes.items():
        if not isinstance(node, dict):
            bad(f"nodes.{name} is not a mapping")
        extra = set(node) - _NODE_KEYS
        if extra:
            bad(f"nodes.{name} has unknown keys {sorted(extra)}")
        for arg, inst in (node.get("installs") or {}).items():
            if not isinstance(inst, dict) or not isinstance(inst.get("packages"), list):
                bad(f"nodes.{name}.installs.{arg} has no 'packages' list")
            for i, pkg in enumerate(inst["packages"]):
                if not isinstance(pkg, dict) or not {"name", "version", "sha256"} <= set(pkg) or set(pkg) - _PKG_KEYS:
                    bad(f"nodes.{name}.installs.{arg}.packages[{i}] must have name, version, sha256 "
                        f"(and optionally {sorted(_PKG_KEYS - {'name', 'version', 'sha256'})})")
                if not re.fullmatch(r"[0-9a-f]{64}", str(pkg["sha256"])):
                    bad(f"nodes.{name}.installs.{arg}.packages[{i}].sha256 is not 64 hex digits")
    for section in ("outputs", "pushed"):
        if section in lock and not isinstance(lock[section], dict):
            bad(f"'{section}' is not a mapping")


# ------------------------------------------------------------------------------------ target platform
def manylinux_platforms(glibc: str, machine: str = "x86_64") -> list[str]:
    """Every manylinux platform tag a system with ``glibc`` ("2.36") satisfies, newest first: PEP 600
    ``manylinux_2_Y_<machine>`` for Y down to 5 plus the legacy aliases manylinux2014 (2.17), manylinux2010
    (2.12) and manylinux1 (2.5) (PEP 599, 571, 513). pip's ``--platform`` takes exact tags only."""
    m = re.fullmatch(r"2\.(\d+)", glibc.strip())
    if not m:
        raise UsageError(f"glibc version {glibc!r} is not of the form 2.N (e.g. 2.36).")
    minor = int(m.group(1))
    tags = [f"manylinux_2_{y}_{machine}" for y in range(minor, MIN_MANYLINUX_MINOR - 1, -1)]
    for alias, y in (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5)):
        if minor >= y:
            tags.append(f"{alias}_{machine}")
    return tags


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


# ------------------------------------------------------------------------------------------- resolving
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


def sdist_pin(name: str, version: str, *, index: str = "", find_links: Iterable[str] = (),
              session: Optional[requests.Session] = None) -> dict:
    """The sdist of ``name==version``: ``{"name", "version", "filename", "url", "sha256"}``. From a
    find-links folder: the file's own sha256. From an index: the index's JSON simple API (PEP 691,
    ``Accept: application/vnd.pypi.simple.v1+json``), whose ``files[].hashes.sha256`` are the index's own.
    Raises LockError when no sdist of that version exists."""
    want = canonicalize_name(name)
    for folder in find_links:
        for f in sorted(Path(folder).glob("*.tar.gz")):
            try:
                n, v = parse_sdist_filename(f.name)
            except Exception:  # noqa: BLE001 - not an sdist name
                continue
            if n == want and str(v) == version:
                return {"name": want, "version": version, "filename": f.name,
                        "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
    if index == "none" or index.startswith("file:"):
        raise LockError(f"No sdist {name}=={version} in the find-links folders ({', '.join(map(str, find_links)) or 'none'}), "
                        f"and the index {index!r} has no JSON simple API (PEP 691) to ask; put the sdist in a "
                        "find-links folder or use an HTTP index that serves PEP 691 (PyPI does).")
    base = (index or DEFAULT_INDEX).rstrip("/")
    s = session or requests.Session()
    try:
        r = s.get(f"{base}/{want}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"}, timeout=60)
    except requests.RequestException as exc:
        raise LockError(f"The index {base} does not answer ({type(exc).__name__}); cannot pin sdist {name}.") from None
    if r.status_code == 404:
        raise LockError(f"The index {base} has no project {name}.")
    if "application/vnd.pypi.simple.v1+json" not in r.headers.get("Content-Type", ""):
        raise LockError(f"The index {base} does not serve the JSON simple API (PEP 691), so the sha256 of sdist "
                        f"{name}=={version} cannot be read from it; use an index that does (PyPI does).")
    for f in r.json().get("files", []):
        fn = f.get("filename", "")
        if not fn.endswith((".tar.gz", ".zip")):
            continue
        try:
            n, v = parse_sdist_filename(fn)
        except Exception:  # noqa: BLE001
            continue
        if n == want and str(v) == version and (f.get("hashes") or {}).get("sha256"):
            return {"name": want, "version": version, "filename": fn, "url": f.get("url", ""),
                    "sha256": f["hashes"]["sha256"]}
    raise LockError(f"The index {base} has no sdist of {name}=={version}; check the version in the recipe.")


def git_pin(url: str, ref: str = "", commit: str = "") -> dict:
    """``{"url", "ref", "commit"}``. A recipe's 40-hex ``commit`` is the pin; with only a ``ref`` (branch or
    tag) the commit is read with ``git ls-remote`` (peeled tags preferred). Raises LockError when the ref
    does not exist or the remote does not answer."""
    if commit and re.fullmatch(r"[0-9a-f]{40}", commit):
        return {"url": url, "ref": ref, "commit": commit}
    if not ref:
        raise LockError(f"git source {url} names neither a commit nor a ref.")
    try:
        proc = subprocess.run(["git", "ls-remote", url, ref, f"{ref}^{{}}"], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LockError(f"git ls-remote {url} {ref} failed ({type(exc).__name__}).") from None
    if proc.returncode != 0:
        raise LockError(f"git ls-remote {url} {ref} failed: {proc.stderr.strip()[-300:]}")
    refs = dict(reversed(line.split("\t", 1)) for line in proc.stdout.splitlines() if "\t" in line)
    for key in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref):
        if key in refs:
            return {"url": url, "ref": ref, "commit": refs[key]}
    raise LockError(f"The git remote {url} has no ref {ref!r}.")


# ------------------------------------------------------------------------------------ what a node installs
_ARG_DEFAULT_RE = re.compile(r"^\s*ARG\s+([A-Z0-9_]*PIP_SPECS)\s*=\s*(\"[^\"]*\"|'[^']*'|\S+)", re.M)


def node_installs(node) -> dict[str, dict]:
    """The pip installs a plan node runs, keyed by the build arg holding the requirements:
    ``{"CUDA_PIP_SPECS": {"specs": [...], "no_deps": False}, ...}``. Build args ending in ``PIP_SPECS`` and
    a source build's ``BUILD_DEPS`` (its build backend, installed with dependencies), plus
    ``ARG X_PIP_SPECS=default`` lines of the node's Dockerfile that the plan does not override.
    Wheel nodes fetch with ``--no-deps``; source nodes (sdist/git/path) are pinned separately."""
    out: dict[str, dict] = {}
    df = (node.inputs or {}).get("dockerfile", "")
    for m in _ARG_DEFAULT_RE.finditer(df or ""):
        name, val = m.group(1), m.group(2).strip("\"'")
        if name not in node.build_args and val.split():
            out[name] = {"specs": val.split(), "no_deps": False}
    for name, val in node.build_args.items():
        if not (name.endswith("PIP_SPECS") or name == "BUILD_DEPS") or not val.split():
            continue
        if node.kind == "wheels" and node.method == "source" and name == "PIP_SPECS":
            continue
        out[name] = {"specs": val.split(), "no_deps": node.kind == "wheels" and name != "BUILD_DEPS"}
    return dict(sorted(out.items()))


def _requested_specs(specs: list[str]) -> list[str]:
    return sorted(specs)


def _source_entry(node) -> dict:
    entry = ((node.inputs or {}).get("recipe") or {}).get("toolchain_entry") or {}
    return entry if isinstance(entry, dict) else {}


# ------------------------------------------------------------------------------------------- the lock
def resolve_lock(plan, *, target: Optional[dict] = None, python: str = sys.executable, client=None,
                 find_links: Iterable[str] = (), progress: Progress = lambda s: None) -> dict:
    """Pin every input of ``plan`` (a :class:`cudastack.model.Plan`) and return the lock (a dict; write it
    with :func:`write_lock`). ``target``: see :func:`target_for_plan` (default: asked of the plan's base).
    ``python``: the interpreter whose pip resolves; its ``major.minor`` must equal the target's, because pip
    evaluates environment markers with the running interpreter. ``client``: docker SDK client (for the OS
    image record); ``find_links``: extra local folders of distributions (outputs of an earlier lock are
    merged by :func:`lock_plan`).
    Raises LockError / RegistryError / UsageError; nothing is written here."""
    target = target or target_for_plan(plan, client=client)
    proc = subprocess.run([python, "-c", "import sys, pip; print('%d.%d' % sys.version_info[:2], pip.__version__)"],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise LockError(f"{python} cannot run pip: {proc.stderr.strip()[-300:]}")
    host_py, pip_version = proc.stdout.split()
    if host_py != target["python_version"]:
        raise EnvironmentError_(
            f"The images run Python {target['python_version']} but {python} is Python {host_py}; pip evaluates "
            f"environment markers with the interpreter it runs in. Pass --python /path/to/python{target['python_version']} "
            f"(with pip >= 22.2) to `invoke lock`, or lock a base whose Python is {host_py} (--base; toolchains.yaml "
            "lists each base's python). Nothing was written."
        )
    find_links = [str(f) for f in find_links]
    nodes: dict[str, dict] = {}
    warnings: list[str] = []
    seen: dict[str, tuple[str, str]] = {}
    for node in plan.nodes:
        entry: dict = {"kind": node.kind}
        if node.method:
            entry["method"] = node.method
        entry["plan_hash"] = node.hash
        index = getattr(node, "index_secret", "") or node.build_args.get("PIP_INDEX_URL", "")
        extra = node.build_args.get("PIP_EXTRA_INDEX_URL", "")
        entry["index"] = redact(index) or DEFAULT_INDEX
        if node.kind == "base-pip":
            entry["os_image"] = _os_image_record(node.build_args.get("OS_IMAGE", ""), client)
            progress(f"{node.name}: OS image {entry['os_image']['tag']} = {entry['os_image']['image_id'][:19]}")
        elif node.kind == "base-nvidia":
            from cudastack import registry
            ref = node.build_args.get("BASE_IMAGE", "")
            digest = registry.resolve_digest(ref)
            r = registry.parse_reference(ref)
            entry["base_image"] = {"ref": ref, "digest": digest, "reference": r.with_digest(digest).pinned()}
            progress(f"{node.name}: {ref} = {digest}")
        installs = {}
        for arg, inst in node_installs(node).items():
            progress(f"{node.name}: resolving {arg} ({' '.join(inst['specs'])})")
            held = {} if arg in SEPARATE_PREFIX_INSTALLS or inst["no_deps"] else _chain_pins(plan, node, nodes)
            kw = dict(target=target, index=index, extra_index=extra, find_links=find_links, no_deps=inst["no_deps"],
                      python=python, where=f"node {node.name} ({arg})")
            requires: dict = {}
            pkgs = pip_resolve(inst["specs"], requires=requires, **kw)
            keep = kept_pins(held, inst["specs"], pkgs, requires, target) if held else {}
            if keep and any(p["version"] != keep.get(p["name"], p["version"]) for p in pkgs):
                try:
                    pkgs = pip_resolve(inst["specs"], constraints=keep, **kw)
                except LockError:
                    warnings.append(f"{node.name} ({arg}): the versions its parent image holds could not all be "
                                    "kept; pinned the newest resolution instead")
            if not inst["no_deps"]:   # one CUDA release for the toolkit wheels of this environment (C25)
                pkgs, note = cuda_wheels.cohere(pkgs, requires, inst["specs"],
                                                lambda cons: pip_resolve(inst["specs"], constraints={**keep, **cons}, **kw))
                if note:
                    warnings.append(f"{node.name} ({arg}): {note}")
            installs[arg] = {"requested": _requested_specs(inst["specs"]), "no_deps": inst["no_deps"],
                             "packages": pkgs}
            where_key = arg if arg in SEPARATE_PREFIX_INSTALLS else "env"
            for p in pkgs:
                prev = seen.get((where_key, p["name"]))
                if prev and prev[0] != p["version"]:
                    warnings.append(f"{p['name']}: {prev[1]} installs {prev[0]}, {node.name} ({arg}) installs "
                                    f"{p['version']} on top")
                seen[(where_key, p["name"])] = (p["version"], f"{node.name} ({arg})")
            progress(f"{node.name}: {arg}: {len(pkgs)} packages pinned")
        if installs:
            entry["installs"] = installs
        if node.kind == "wheels" and node.method == "source":
            src = _source_entry(node)
            if src.get("sdist"):
                sd = src["sdist"]
                entry["sdists"] = [sdist_pin(sd["package"], str(sd["version"]), index=index, find_links=find_links)]
                progress(f"{node.name}: sdist {entry['sdists'][0]['filename']} sha256 {entry['sdists'][0]['sha256'][:12]}")
            elif src.get("git"):
                g = src["git"]
                entry["git"] = [git_pin(g["url"], g.get("ref", ""), g.get("commit", ""))]
            elif node.build_args.get("PIP_SPECS", "").strip() == "./src" or src.get("path"):
                from cudastack.plan import dir_digest
                folder = (getattr(node, "context", {}) or {}).get("src") or src.get("path")
                entry["paths"] = [{"path": Path(folder).name, "sha256": dir_digest(folder)}]
        nodes[node.name] = entry
    lock = {
        "lock_version": LOCK_VERSION,
        "toolchain": plan.toolchain,
        "cuda_version": plan.cuda_version,
        "base_kind": plan.base_kind,
        "target_archs": list(plan.target_archs),
        **({"skipped": list(plan.skipped)} if getattr(plan, "skipped", None) else {}),
        "resolver": {"tool": f"pip {pip_version} install --dry-run --report (installation report v1)",
                     "python_version": target["python_version"], "glibc": target["glibc"],
                     "machine": target["machine"], "implementation": target["implementation"],
                     "resolved_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")},
        "nodes": nodes,
    }
    if warnings:
        lock["warnings"] = warnings
    check_schema(lock, "the resolved lock")
    return lock


def _os_image_record(tag: str, client) -> dict:
    if not tag:
        raise LockError("The base-pip node has no OS_IMAGE build arg; the plan is incomplete.")
    try:
        from cudastack.bootstrap import os_image_record
        rec = os_image_record(tag)
    except UsageError:
        raise LockError(f"The OS image {tag} is not on this host, so its id cannot be pinned. Bootstrap it first "
                        "(invoke bootstrap-base) and lock again.") from None
    return {k: v for k, v in rec.items() if v != "" or k in ("tag", "image_id")}


#: Installs that go to their own prefix (``pip install --target``), not into the image's Python environment:
#: the base-pip image's CUDA toolkit wheels (images/base-pip.Dockerfile installs them into /opt/cuda-wheels).
SEPARATE_PREFIX_INSTALLS = ("CUDA_PIP_SPECS",)


def _chain_pins(plan, node, resolved: dict[str, dict]) -> dict[str, str]:
    """{name: version} the image chain under ``node`` already holds in its Python environment: the installs of
    its image parent and that parent's ancestors (first parent of each node), from ``resolved`` lock entries.
    pip keeps an installed version that satisfies a new requirement, so the node's resolution starts from
    these (as constraints)."""
    pins: dict[str, str] = {}
    chain = []
    cur = node
    while cur.parents:
        parent = next((n for n in plan.nodes if n.name == cur.parents[0]), None)
        if parent is None or parent.kind == "wheels":
            break
        chain.append(parent.name)
        cur = parent
    for name in reversed(chain):
        for arg, inst in (resolved.get(name, {}).get("installs") or {}).items():
            if arg in SEPARATE_PREFIX_INSTALLS or inst.get("no_deps"):
                continue
            pins.update({p["name"]: p["version"] for p in inst["packages"]})
    return pins


def lock_plan(plan, path: str | Path, *, only: Iterable[str] = (), kept: Optional[list] = None, **kw) -> dict:
    """Resolve ``plan`` and write the lock to ``path`` atomically (the old lock stays byte for byte on any
    error). Keeps outputs/pushed entries of nodes whose lock entry (plan hash, closures, sdists, base) and whose
    ancestors' entries are unchanged, read again just before the write (under :func:`exclusive`), so a push
    recorded while resolving is not lost; a node whose closure moved loses its outputs (they were built from the
    old one). ``only``: node names whose entries are refreshed; every other node keeps the old lock's entry as
    it is (LockError when the old lock has none), and ``kept`` (a list, when given) receives one line per kept
    node whose fresh resolution differed (what a full relock would have moved). Returns the lock."""
    only = list(only)
    lock = resolve_lock(plan, **kw)
    with exclusive(path):
        previous = None
        if Path(path).exists():
            try:
                previous = load_lock(path)
            except LockError:
                previous = None
        if only:
            unknown = [n for n in only if n not in lock["nodes"]]
            if unknown:
                raise UsageError(f"--node {', '.join(unknown)}: not a node of the plan "
                                 f"({', '.join(lock['nodes'])}).")
            old_nodes = (previous or {}).get("nodes") or {}
            for n in lock["nodes"]:
                if n in only:
                    continue
                if n not in old_nodes:
                    raise LockError(f"Refreshing only {', '.join(only)}: the existing lock {path} has no entry for "
                                    f"node {n} to keep. Lock the whole plan (no --node). Nothing was written.")
                if old_nodes[n] != lock["nodes"][n] and kept is not None:
                    moved = sorted(k for k in set(old_nodes[n]) | set(lock["nodes"][n])
                                   if old_nodes[n].get(k) != lock["nodes"][n].get(k))
                    kept.append(f"{n}: kept the old entry; a fresh resolution differs in {', '.join(moved)}")
                lock["nodes"][n] = old_nodes[n]
            fresh = [w for w in lock.get("warnings") or [] if any(w.startswith(f"{n} (") or f" {n} (" in w
                                                                  for n in only)]
            merged = list((previous or {}).get("warnings") or []) + [w for w in fresh if w not in
                                                                     ((previous or {}).get("warnings") or [])]
            lock.pop("warnings", None)
            if merged:
                lock["warnings"] = merged
        if previous:
            same = {n for n, e in lock["nodes"].items() if (previous.get("nodes") or {}).get(n) == e}

            def unchanged(n: str) -> bool:   # the node's entry and every ancestor's are what they were
                node = next((x for x in plan.nodes if x.name == n), None)
                return n in same and node is not None and all(unchanged(p) for p in node.parents)

            kept_out = {n: v for n, v in (previous.get("outputs") or {}).items() if unchanged(n)}
            kept_push = {n: v for n, v in (previous.get("pushed") or {}).items() if n in kept_out}
            if kept_out:
                lock["outputs"] = kept_out
            if kept_push:
                lock["pushed"] = kept_push
        write_lock(path, lock)
    return lock


# ------------------------------------------------------------------------------------------- checking
def _refresh(lock: dict) -> str:
    return f"Refresh it with `{lock_command(lock)}` and commit the new lockfile."


def stale_entries(plan, lock: dict, *, client=None) -> list[str]:
    """Every way ``lock`` does not match ``plan``, one line each naming the lock entry (empty: it matches).
    Compares toolchain, node set and kind/method, each pip install's requested specs and index, the sdist/git
    pins, the OS image's current local id (when ``client`` is given) and the base image reference."""
    out = []
    if lock.get("toolchain") != plan.toolchain or lock.get("cuda_version") != plan.cuda_version:
        out.append(f"toolchain: the lock is for CUDA {lock.get('toolchain')} ({lock.get('cuda_version')}), the plan "
                   f"for {plan.toolchain} ({plan.cuda_version})")
    if lock.get("base_kind") and lock.get("base_kind") != plan.base_kind:
        out.append(f"base_kind: the lock pins the '{lock.get('base_kind')}' base, the plan uses '{plan.base_kind}'")
    lnodes = lock.get("nodes") or {}
    for node in plan.nodes:
        e = lnodes.get(node.name)
        if e is None:
            out.append(f"nodes.{node.name}: not in the lock (a new component)")
            continue
        if e.get("kind") != node.kind or (e.get("method") or "") != (node.method or ""):
            out.append(f"nodes.{node.name}.kind: the lock has {e.get('kind')} {e.get('method') or ''}".rstrip()
                       + f", the plan {node.kind} {node.method or ''}".rstrip())
        index = node.build_args.get("PIP_INDEX_URL", "") or DEFAULT_INDEX
        if e.get("index", DEFAULT_INDEX) != index:
            out.append(f"nodes.{node.name}.index: the lock used {e.get('index')}, the plan uses {index}")
        want = {arg: _requested_specs(i["specs"]) for arg, i in node_installs(node).items()}
        have = {arg: i.get("requested", []) for arg, i in (e.get("installs") or {}).items()}
        for arg in sorted(set(want) | set(have)):
            if want.get(arg) != have.get(arg):
                out.append(f"nodes.{node.name}.installs.{arg}.requested: the lock has "
                           f"{' '.join(have.get(arg) or []) or 'nothing'}, the recipes ask for "
                           f"{' '.join(want.get(arg) or []) or 'nothing'}")
        src = _source_entry(node) if node.kind == "wheels" and node.method == "source" else {}
        if src.get("sdist"):
            sd = src["sdist"]
            pins = [(p.get("name"), p.get("version")) for p in e.get("sdists") or []]
            if (canonicalize_name(sd["package"]), str(sd["version"])) not in pins:
                out.append(f"nodes.{node.name}.sdists: the lock has {pins or 'none'}, the recipe asks for "
                           f"{sd['package']}=={sd['version']}")
        if src.get("git"):
            g = src["git"]
            pins = [(p.get("url"), p.get("commit")) for p in e.get("git") or []]
            if g.get("commit") and (g["url"], g["commit"]) not in pins:
                out.append(f"nodes.{node.name}.git: the lock pins {pins or 'nothing'}, the recipe asks for "
                           f"{g['url']}@{g['commit']}")
        if src.get("path") and e.get("paths"):
            from cudastack.plan import dir_digest
            folder = (getattr(node, "context", {}) or {}).get("src") or src["path"]
            try:
                now = dir_digest(folder)
            except OSError:
                now = "missing"
            if now != e["paths"][0].get("sha256"):
                out.append(f"nodes.{node.name}.paths: the source folder {Path(folder).name} changed since it was "
                           f"locked (sha256 {now[:12]} now, {str(e['paths'][0].get('sha256'))[:12]} locked)")
        if node.kind == "base-pip":
            tag = node.build_args.get("OS_IMAGE", "")
            rec = e.get("os_image") or {}
            if rec.get("tag") != tag:
                out.append(f"nodes.{node.name}.os_image.tag: the lock has {rec.get('tag')}, the plan uses {tag}")
            elif client is not None:
                try:
                    current = client.images.get(tag).id
                except Exception:  # noqa: BLE001
                    current = None
                if current is None:
                    out.append(f"nodes.{node.name}.os_image: {tag} is not on this host (locked id "
                               f"{str(rec.get('image_id'))[:19]}); bootstrap it again or load it")
                elif current != rec.get("image_id"):
                    out.append(f"nodes.{node.name}.os_image.image_id: {tag} is now {current[:19]} on this host, the "
                               f"lock pins {str(rec.get('image_id'))[:19]} (the OS image was bootstrapped again)")
        if node.kind == "base-nvidia":
            ref = node.build_args.get("BASE_IMAGE", "")
            rec = e.get("base_image") or {}
            if ref not in (rec.get("ref"), rec.get("reference") if getattr(plan, "locked", False) else None):
                out.append(f"nodes.{node.name}.base_image.ref: the lock has {(e.get('base_image') or {}).get('ref')}, "
                           f"the plan uses {ref}")
    skipped = set(getattr(plan, "skipped", []) or [])
    for name in sorted(set(lnodes) - {n.name for n in plan.nodes} - skipped):
        out.append(f"nodes.{name}: in the lock but no longer in the plan")
    return out


def verify_plan_against_lock(plan, lock: dict, *, client=None, where: str = "the lockfile") -> None:
    """Raise LockError listing every stale entry (see :func:`stale_entries`) and how to refresh the lock."""
    stale = stale_entries(plan, lock, client=client)
    if stale:
        raise LockError(f"{where} does not match the recipes: " + "; ".join(stale) + ". " + _refresh(lock))


# ------------------------------------------------------------------------------------------- locked builds
def requirements_text(lock: dict, node: str, arg: str) -> str:
    """A pip requirements file in hash-checking mode for install ``arg`` of ``node``: one
    ``name==version --hash=sha256:...`` line per package of the closure, sorted. Install it with
    ``pip install --require-hashes --no-deps -r FILE`` (plus the node's index options).
    Raises LockError when the lock has no such install."""
    try:
        inst = lock["nodes"][node]["installs"][arg]
    except (KeyError, TypeError):
        raise LockError(f"The lock has no install {arg} for node {node}. {_refresh(lock)}") from None
    lines = [f"# {node} {arg}: {' '.join(inst.get('requested', []))} (cudastack lock, hash-checking mode)"]
    for p in sorted(inst["packages"], key=lambda p: p["name"]):
        lines.append(f"{p['name']}=={p['version']} --hash=sha256:{p['sha256']}")
    return "\n".join(lines) + "\n"


def locked_build_args(lock: dict, node) -> dict[str, str]:
    """Docker build args a locked build of ``node`` (a plan Node) adds: for each pip install ``X`` (a build arg
    ``X_PIP_SPECS`` or ``BUILD_DEPS``), ``X_LOCKED`` = the hash-checking requirements text
    (:func:`requirements_text`); for an NVIDIA base ``BASE_IMAGE`` = ``name@sha256:...``. Each component
    Dockerfile (images/*.Dockerfile) writes a non-empty ``*_LOCKED`` text to a file and runs
    ``pip install --require-hashes --no-deps -r`` on it (``pip download`` for wheel nodes) instead of the
    unlocked install. Sdists are checked on the host (:func:`locked_sdist_sha256`). Call
    :func:`verify_plan_against_lock` first."""
    e = (lock.get("nodes") or {}).get(node.name)
    if e is None:
        raise LockError(f"The lock has no node {node.name}. {_refresh(lock)}")
    args = {f"{arg}_LOCKED": requirements_text(lock, node.name, arg) for arg in (e.get("installs") or {})}
    if e.get("base_image"):
        args["BASE_IMAGE"] = e["base_image"]["reference"]
    return args


def locked_sdist_sha256(lock: dict, node: str) -> dict[str, str]:
    """{sdist file name: sha256} the lock pins for a source node (empty when it pins none)."""
    return {p["filename"]: p["sha256"] for p in ((lock.get("nodes") or {}).get(node) or {}).get("sdists") or []}


def apply_lock(plan, lock: dict) -> None:
    """Turn ``plan`` (a BuildPlan, verified against ``lock``) into its locked build, in place: each node gets
    its :func:`locked_build_args`, a sdist node the pinned digests (``node.sdist["sha256_locked"]``:
    {file name: sha256}, checked by the executor before unpacking), and a new hash = sha256 over (plan hash, locked args, parents' locked hashes),
    so a locked build never reuses an image an unlocked build made under the plan's tag (same repository,
    tag = the locked hash's first 16 hex digits). ``PARENT_IMAGE`` follows the parents' new tags; the plan
    hash stays in ``node.inputs["plan_hash"]``. Applying twice is a no-op."""
    from cudastack.plan import content_hash

    if getattr(plan, "locked", False):
        return
    new_tags: dict[str, str] = {}
    for node in plan.nodes:
        old_tag = node.tag
        args = locked_build_args(lock, node)
        sd = locked_sdist_sha256(lock, node.name)
        if getattr(node, "sdist", None) and sd:
            node.sdist = dict(node.sdist, sha256_locked=sd)
        parent = node.build_args.get("PARENT_IMAGE")
        if parent in new_tags:
            node.build_args["PARENT_IMAGE"] = new_tags[parent]
        node.build_args.update(args)
        h = content_hash({"plan_hash": node.hash, "locked_build_args": args, "sdists": sd,
                          "parents": {p: plan.node(p).hash for p in node.parents}})
        node.inputs = dict(node.inputs or {}, plan_hash=node.hash)
        node.hash = h
        node.tag = f"{old_tag.rsplit(':', 1)[0]}:{h[:16]}"
        new_tags[old_tag] = node.tag
    plan.locked = True


def explain_pip_hash_failure(output: str, lock: Optional[dict] = None) -> Optional[LockError]:
    """Turn pip's hash-checking failure (``THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS
    FILE``, followed by ``name==version from URL:`` / ``Expected sha256 ...`` / ``Got ...`` lines) into a
    LockError that starts "the lock and the index disagree on <package>" and names each package, or None when
    ``output`` holds no such failure. Either side can be the wrong one: the lockfile may have been edited, or
    the index may serve another file than the one that was locked."""
    if HASH_MISMATCH_HEADER not in output:
        return None
    block = output.split(HASH_MISMATCH_HEADER, 1)[1]
    found, names = [], []
    for m in re.finditer(r"^\s+([A-Za-z0-9_.\-\[\],]+==\S+) from (\S+?):?\s*\n\s+Expected sha256 ([0-9a-f]+)\s*\n"
                         r"\s+Got\s+([0-9a-f]+)", block, re.M):
        names.append(m.group(1))
        found.append(f"{m.group(1)} (file {m.group(2).rsplit('/', 1)[-1]}: the lock pins sha256 "
                     f"{m.group(3)[:16]}..., the downloaded file has {m.group(4)[:16]}...)")
    if not found:
        found = [ln.strip() for ln in block.splitlines() if "==" in ln][:5]
        names = [ln.split()[0] for ln in found]
    refresh = lock_command(lock) if lock else "invoke lock --cuda X"
    return LockError(
        f"The lock and the index disagree on {', '.join(names) or 'a package'}: pip's hash-checking mode refused "
        + "; ".join(found) + ". Either the lockfile was changed since it was made (see `git diff lockfiles/`; "
        "`invoke build --locked --dry-run` checks every locked hash against the index) or the index serves another "
        "file than the one that was locked (re-uploaded, tampered with, or a mirror of another build): find out "
        f"which before trusting either. If the index's file is intended, refresh the lock with `{refresh}` and "
        "review the diff. The lockfile was not changed."
    )


def install_locked(lock: dict, node: str, arg: str, *, target_dir: str | Path, python: str = sys.executable,
                   find_links: Iterable[str] = (), timeout: float = 3600) -> list[str]:
    """Install install ``arg`` of ``node`` into ``target_dir`` on this host with pip in hash-checking mode
    (``pip install --require-hashes --no-deps --target DIR -r <requirements>`` from the node's locked index),
    exactly what a locked image build runs inside its Dockerfile. Returns the installed ``name==version``
    list. Raises LockError naming every package whose file no longer matches its locked sha256."""
    e = lock["nodes"].get(node) or {}
    index = e.get("index", DEFAULT_INDEX)
    with tempfile.TemporaryDirectory(prefix="cudastack-locked-") as tmp:
        req = Path(tmp) / f"{arg}.txt"
        req.write_text(requirements_text(lock, node, arg))
        cmd = [python, "-m", "pip", "install", "--quiet", "--require-hashes", "--no-deps", "--no-cache-dir",
               "--target", str(target_dir), "-r", str(req)] + _cert_args() + index_args(index, "", find_links)
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_clean_env(), timeout=timeout)
    if proc.returncode != 0:
        err = explain_pip_hash_failure(proc.stdout + proc.stderr, lock)
        if err:
            raise err
        raise LockError(f"The locked install of {node} {arg} failed: {proc.stderr.strip()[-800:]}")
    return [f"{p['name']}=={p['version']}" for p in lock["nodes"][node]["installs"][arg]["packages"]]


# ------------------------------------------------------------------------------------------- outputs
def update_lock(path: str | Path, fn: Callable[[dict], None]) -> dict:
    """Load the lock at ``path``, apply ``fn`` (mutates the dict), validate and write atomically, all under
    :func:`exclusive`."""
    with exclusive(path):
        lock = load_lock(path)
        fn(lock)
        write_lock(path, lock)
    return lock


def record_outputs(path: str | Path, node: str, *, image_id: Optional[str] = None, tag: Optional[str] = None,
                   wheels: Optional[list[dict]] = None) -> dict:
    """Record what a locked build of ``node`` produced: ``outputs.<node>.{image_id, tag, wheels: [{filename,
    sha256}]}``. Raises LockError when the lock has no such node."""
    def fn(lock):
        if node not in lock["nodes"]:
            raise LockError(f"The lock has no node {node}; {_refresh(lock)}")
        out = lock.setdefault("outputs", {}).setdefault(node, {})
        if image_id:
            out["image_id"] = image_id
        if tag:
            out["tag"] = tag
        if wheels is not None:
            out["wheels"] = [{"filename": w["filename"], "sha256": w["sha256"]} for w in wheels]
    return update_lock(path, fn)


def wheel_records(folder: str | Path, names: Optional[Iterable[str]] = None) -> list[dict]:
    """``[{"filename", "sha256"}]`` for the wheels in ``folder`` (all ``*.whl`` or only ``names``)."""
    files = [Path(folder) / n for n in names] if names else sorted(Path(folder).glob("*.whl"))
    return [{"filename": f.name, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()} for f in files]


def record_push(path: str | Path, node: str, pushed) -> dict:
    """Record a push of ``node`` (a :class:`cudastack.registry.PushedImage`): ``pushed.<node>.{reference,
    enroot, digest, image_id, tag}``. Never records credentials (the PushedImage holds none)."""
    def fn(lock):
        if node not in lock["nodes"]:
            raise LockError(f"The lock has no node {node}; {_refresh(lock)}")
        lock.setdefault("pushed", {})[node] = dict(pushed.as_dict())
    return update_lock(path, fn)


def locked_files(lock: dict) -> list[dict]:
    """Every file the lock pins by sha256 for download from an index: each install's packages and each sdist,
    as ``{"node", "where" (e.g. "installs.PIP_SPECS" or "sdists"), "name", "version", "filename", "sha256",
    "index"}`` (the node's index; find-links-only nodes, ``index: none``, are left out)."""
    out = []
    for node, e in (lock.get("nodes") or {}).items():
        index = e.get("index") or DEFAULT_INDEX
        if index == "none" or index.startswith("file:"):
            continue
        groups = [(f"installs.{arg}", i.get("packages") or []) for arg, i in (e.get("installs") or {}).items()]
        groups.append(("sdists", e.get("sdists") or []))
        for where, pkgs in groups:
            for p in pkgs:
                if p.get("filename") and p.get("sha256"):
                    out.append({"node": node, "where": where, "name": canonicalize_name(p.get("name", "")),
                                "version": str(p.get("version", "")), "filename": p["filename"],
                                "sha256": str(p["sha256"]).lower(), "index": index})
    return out


_HREF_HASH = re.compile(r"""<a\s[^>]*href=["']([^"'#]*)#sha256=([0-9a-fA-F]{64})["'][^>]*>\s*([^<\s]+)\s*</a>""", re.I)


def published_hashes(index: str, project: str, *, session: Optional[requests.Session] = None,
                     timeout: float = 60) -> dict[str, str]:
    """{file name: sha256} that a simple index publishes for ``project``: the JSON simple API (PEP 691,
    ``files[].{filename, hashes.sha256}``) when the index serves it, else the HTML simple API (PEP 503: each
    link's ``#sha256=`` fragment). Raises ``requests.RequestException`` when the index does not answer and
    LookupError when it has no such project (404)."""
    s = session or requests.Session()
    base = index.rstrip("/")
    r = s.get(f"{base}/{canonicalize_name(project)}/", timeout=timeout,
              headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"}, verify=_verify_arg())
    if r.status_code == 404:
        raise LookupError(project)
    r.raise_for_status()
    if "application/vnd.pypi.simple.v1+json" in r.headers.get("Content-Type", ""):
        return {f["filename"]: str((f.get("hashes") or {}).get("sha256", "")).lower()
                for f in r.json().get("files", []) if f.get("filename")}
    return {m.group(3): m.group(2).lower() for m in _HREF_HASH.finditer(r.text)}


def _verify_arg():
    for var in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "PIP_CERT"):
        v = os.environ.get(var)
        if v and os.path.exists(v):
            return v
    return True


def verify_locked_hashes(lock: dict, *, cache_dirs: Iterable[str | Path] = (), session=None,
                         where: str = "the lockfile", fetch: Optional[Callable[[str, str], dict]] = None,
                         logins: Optional[dict[str, str]] = None) -> dict:
    """Check every sha256 the lock pins (:func:`locked_files`) against what the node's index publishes for
    that file (:func:`published_hashes`, one request per project), or, where the index does not answer, against
    a cached copy of the file in ``cache_dirs`` (the sdist cache, the wheelhouse). Returns ``{"checked",
    "index", "cached", "unchecked": [file, ...], "unreachable": {index: reason}}``.

    Raises LockError (exit 7) naming each package, its node and install, the locked and the published sha256,
    when the lock pins a hash the index does not publish for that file, or a file the index no longer lists.
    A lock edited by hand or a re-uploaded file thus fails here, before any build. ``fetch`` (index, project)
    -> {file: sha256} replaces the HTTP lookup (tests). ``logins``: {index URL as locked (no login): the same
    URL with its login} for private indexes (the plan's :attr:`PlannedNode.index_secret`)."""
    from concurrent.futures import ThreadPoolExecutor

    files = locked_files(lock)
    projects = sorted({(f["index"], f["name"]) for f in files})
    s = session or requests.Session()
    logins = logins or {}
    get = fetch or (lambda index, project: published_hashes(logins.get(index, index), project, session=s))

    def one(key):
        try:
            return key, get(*key), None
        except LookupError:
            return key, {}, None
        except requests.RequestException as exc:
            code = getattr(getattr(exc, "response", None), "status_code", None)
            return key, None, f"{type(exc).__name__}" + (f" HTTP {code}" if code else "")

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, projects))
    published = {k: v for k, v, _ in results}
    unreachable = {k[0]: err for k, _, err in results if err}
    cache: dict[str, Path] = {}
    for d in cache_dirs:
        d = Path(d)
        if d.is_dir():
            for p in d.rglob("*"):
                if p.is_file():
                    cache.setdefault(p.name, p)
    bad, unchecked = [], []
    n_index = n_cached = 0
    for f in files:
        pub = published.get((f["index"], f["name"]))
        label = (f"{f['name']}=={f['version']} (node {f['node']}, {f['where']}, file {f['filename']})")
        if pub is not None:
            got = pub.get(f["filename"])
            if got is None:
                bad.append(f"{label}: the index {f['index']} does not list that file")
            elif got != f["sha256"]:
                bad.append(f"{label}: the lock pins sha256 {f['sha256']}, the index publishes {got}")
            else:
                n_index += 1
            continue
        cached = cache.get(f["filename"])
        if cached is not None:
            got = hashlib.sha256(cached.read_bytes()).hexdigest()
            if got != f["sha256"]:
                bad.append(f"{label}: the lock pins sha256 {f['sha256']}, the cached file {cached} has {got}")
            else:
                n_cached += 1
        else:
            unchecked.append(f["filename"])
    if bad:
        raise LockError(
            f"{where} pins hashes that the package index does not publish: " + "; ".join(bad) + ". A hand edit, a "
            "merge gone wrong or a file re-uploaded to the index: pip would refuse these in hash-checking mode. "
            f"Restore the lockfile from version control, or refresh it with `{lock_command(lock)}` and review "
            "the diff. Nothing was built and the lockfile was not changed.")
    return {"checked": n_index + n_cached, "index": n_index, "cached": n_cached, "unchecked": unchecked,
            "unreachable": unreachable}


def describe_hash_check(result: dict) -> str:
    """One line for the build's output: how many locked hashes were checked and against what."""
    line = (f"{result['checked']} locked sha256 checked ({result['index']} against the index's published hashes, "
            f"{result['cached']} against cached files)")
    if result["unchecked"]:
        why = "; ".join(f"{i}: {e}" for i, e in result["unreachable"].items()) or "no answer"
        line += (f"; {len(result['unchecked'])} not checked ({why}; pip checks them during the build): "
                 + ", ".join(result["unchecked"][:5]) + (" ..." if len(result["unchecked"]) > 5 else ""))
    return line


def prepare_locked_build(plan, path: str | Path, *, client=None, check_hashes: bool = True,
                         cache_dirs: Iterable[str | Path] = (), say: Optional[Progress] = None) -> dict:
    """For ``invoke build --locked`` (and its dry run): load the lock at ``path``, verify ``plan`` against it
    (LockError naming every stale entry, before anything is built), check every locked sha256 against the
    index or cached files (:func:`verify_locked_hashes`, with ``check_hashes``) and turn the plan into its
    locked build in place (:func:`apply_lock`: hash-checking build args, pinned sdist digests, locked node
    hashes and tags). Never writes the lock. Returns the lock."""
    lock = load_lock(path)
    verify_plan_against_lock(plan, lock, client=client, where=str(path))
    if check_hashes:
        logins = {n.build_args.get("PIP_INDEX_URL", ""): n.index_secret for n in plan.nodes
                  if getattr(n, "index_secret", "")}
        result = verify_locked_hashes(lock, cache_dirs=cache_dirs, where=str(path), logins=logins)
        if say:
            say(describe_hash_check(result))
    apply_lock(plan, lock)
    return lock


def record_build_outputs(path: str | Path, build_record: dict) -> dict:
    """Record a build record's results (``cudastack.build.run_build``'s dict: ``nodes[].{name, status,
    image_id, tag, plan_hash, wheels: {file: sha256}}``) into ``outputs`` of the lock at ``path``, atomically,
    for every node that was built or found cached. The node's ``plan_hash`` becomes the plan hash the build
    used (the lock was verified against that plan: a change that leaves every pin as it was, such as the
    suite's code, needs no relock), so a later relock of the same plan keeps these outputs. A push recorded
    for another image of the node is dropped: it no longer describes what the lock's outputs are."""
    def fn(lock):
        for n in build_record.get("nodes", []):
            if n.get("status") not in ("built", "skipped") or n.get("name") not in lock["nodes"]:
                continue
            if n.get("plan_hash"):
                lock["nodes"][n["name"]]["plan_hash"] = n["plan_hash"]
            pushed = (lock.get("pushed") or {}).get(n["name"])
            if pushed and n.get("image_id") and pushed.get("image_id") != n["image_id"]:
                del lock["pushed"][n["name"]]
                if not lock["pushed"]:
                    del lock["pushed"]
            out = lock.setdefault("outputs", {}).setdefault(n["name"], {})
            if n.get("image_id"):
                out["image_id"] = n["image_id"]
            if n.get("tag"):
                out["tag"] = n["tag"]
            if n.get("wheels"):
                out["wheels"] = [{"filename": f, "sha256": d} for f, d in sorted(n["wheels"].items())]
    return update_lock(path, fn)


#: Where the base-pip image installs the CUDA toolkit wheels (``pip install --target``; images/base-pip.Dockerfile).
CUDA_WHEELS_PREFIX = "/opt/cuda-wheels"
_LIST_SCRIPT = (
    "import importlib.metadata as m, json, os, sys; "
    "ls = lambda paths: sorted({(d.metadata['Name'], d.version) for d in m.distributions(path=paths)}); "
    "print(json.dumps({'env': ls(sys.path), 'prefix': ls([sys.argv[1]]) if os.path.isdir(sys.argv[1]) else []}))"
)


def expected_versions(lock: dict, nodes: Optional[Iterable[str]] = None) -> dict[tuple[str, str], tuple[str, str]]:
    """{(where, canonical name): (version, "node ARG")} of every package the lock's installs put into the image
    made of ``nodes`` (default: all nodes, in lock order); ``where`` is "env" (the image's Python environment)
    or "prefix" (:data:`CUDA_WHEELS_PREFIX`, for :data:`SEPARATE_PREFIX_INSTALLS`). A later install of a name
    in the same place overrides an earlier one."""
    want = {}
    for name, e in lock["nodes"].items():
        if nodes is not None and name not in nodes:
            continue
        for arg, inst in (e.get("installs") or {}).items():
            where = "prefix" if arg in SEPARATE_PREFIX_INSTALLS else "env"
            for p in inst["packages"]:
                want[(where, p["name"])] = (p["version"], f"{name} {arg}")
    return want


def check_image_against_lock(image: str, lock: dict, *, nodes: Optional[Iterable[str]] = None, client=None,
                             python: str = "python") -> list[str]:
    """Run ``image`` once and list every installed Python distribution (``importlib.metadata`` over the
    image's ``sys.path`` and :data:`CUDA_WHEELS_PREFIX`); return one line per locked package that is missing
    or installed at another version (empty: the image holds exactly the locked versions). ``nodes``: the
    plan nodes the image contains (default: all nodes of the lock)."""
    from cudastack.registry import docker_client

    client = client or docker_client()
    try:
        out = client.containers.run(image, [python, "-c", _LIST_SCRIPT, CUDA_WHEELS_PREFIX], remove=True,
                                    network_disabled=True, entrypoint=[])
    except Exception as exc:  # noqa: BLE001 - ContainerError, ImageNotFound, APIError
        raise LockError(f"Cannot list the Python packages in {image}: {exc}") from None
    listing = json.loads(out.decode().strip().splitlines()[-1])
    have: dict[tuple[str, str], set[str]] = {}
    for place in ("env", "prefix"):
        for name, version in listing.get(place, []):
            have.setdefault((place, canonicalize_name(name)), set()).add(version)
    problems = []
    for (place, name), (version, where) in sorted(expected_versions(lock, nodes).items()):
        got = have.get((place, name))
        loc = "" if place == "env" else f" under {CUDA_WHEELS_PREFIX}"
        if not got:
            problems.append(f"{name}=={version} ({where}) is not installed{loc}")
        elif version not in got:
            problems.append(f"{name}=={version} ({where}) is installed{loc} as {', '.join(sorted(got))}")
    return problems


def summary(lock: dict) -> str:
    """A short human listing of the lock's entries (for `invoke lock` and the closing notes)."""
    lines = [f"lock for CUDA {lock['toolchain']} ({lock['cuda_version']}), base {lock.get('base_kind')}, "
             f"resolved for Python {lock['resolver']['python_version']} glibc {lock['resolver']['glibc']}"]
    for name, e in lock["nodes"].items():
        lines.append(f"  {name} [{e['kind']}{' ' + e['method'] if e.get('method') else ''}]")
        if e.get("os_image"):
            o = e["os_image"]
            lines.append(f"    os image {o['tag']} {o['image_id']} (mirror {o.get('mirror', '?')} {o.get('suite', '')} "
                         f"Release {o.get('release-date', '?')})")
        if e.get("base_image"):
            lines.append(f"    base image {e['base_image']['reference']}")
        for arg, inst in (e.get("installs") or {}).items():
            req = {canonicalize_name(Requirement(s).name) for s in inst["requested"] if _is_req(s)}
            top = [p for p in inst["packages"] if p["name"] in req]
            lines.append(f"    {arg}: {len(inst['packages'])} packages; requested: "
                         + ", ".join(f"{p['name']}=={p['version']} sha256:{p['sha256'][:12]}" for p in top))
        for sd in e.get("sdists") or []:
            lines.append(f"    sdist {sd['filename']} sha256:{sd['sha256']}")
        for g in e.get("git") or []:
            lines.append(f"    git {g['url']} {g.get('ref', '')} @ {g['commit']}")
        for pth in e.get("paths") or []:
            lines.append(f"    source folder {pth['path']} sha256:{pth['sha256']}")
    for name, o in (lock.get("outputs") or {}).items():
        lines.append(f"  output {name}: image {o.get('image_id', '-')}"
                     + "".join(f"\n    wheel {w['filename']} sha256:{w['sha256']}" for w in o.get("wheels", [])))
    for name, p in (lock.get("pushed") or {}).items():
        lines.append(f"  pushed {name}: {p['reference']}\n    enroot {p['enroot']}")
    return "\n".join(lines)


def _is_req(s: str) -> bool:
    try:
        Requirement(s)
        return True
    except InvalidRequirement:
        return False

