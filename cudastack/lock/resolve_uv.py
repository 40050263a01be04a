"""The lock's second resolver: uv's (``uv pip compile``), behind the interface of :func:`cudastack.lock.pip_resolve`.

``uv pip compile --format pylock.toml --python-platform x86_64-manylinux_2_Y --python-version 3.11 --no-build``
resolves requirements for a target platform and Python without running that Python (uv evaluates PEP 508
markers for the target it is given; pip evaluates some with the interpreter it runs in). Its PEP 751 output
(``pylock.toml``: ``packages[].{name, version, wheels[].{url, hashes.sha256}}``) lists, per package, only the
wheels that install on the target, each with the sha256 the index publishes, so the lock keeps one file and
one hash per package, as with pip's installation report. (``--generate-hashes`` in requirements.txt form lists
every file of the version instead, for all platforms: :func:`requirements_hash_counts` counts them.)

Sources: uv's ``pip compile`` reference (https://docs.astral.sh/uv/reference/cli/#uv-pip-compile: ``--python-
platform``, ``--python-version``, ``--no-build``, ``--format pylock.toml``, ``--index-strategy``, ``--no-config``),
PEP 751 (pylock.toml), PEP 658 (a wheel's core metadata served at ``<file URL>.metadata``).

What differs from pip, and how this module makes them agree:

* uv by default takes each package from the first index that has it (``first-index``); pip merges every
  index. ``--index-strategy unsafe-best-match`` is passed so both see the same candidates.
* uv reads no pip configuration; ``--no-config`` and dropping ``UV_*`` variables make the plan's indexes the
  only sources, as :func:`cudastack.lock._clean_env` does for pip. The CA bundle of an intercepting proxy is
  passed as ``SSL_CERT_FILE`` (uv reads it).
* uv's ``--python-platform`` names a fixed set of manylinux levels (2_17, 2_28, 2_31 ... 2_40 in uv 0.13):
  :func:`uv_platform` takes the newest one the image's glibc satisfies, never a newer one.
* uv's output has no Requires-Dist; when ``requires`` is asked for (the lock's :func:`kept_pins` and
  :func:`cudastack.lock.cuda_wheels.cohere` read it), each resolved wheel's core metadata is read from the index
  (PEP 658, one small request per package; the PyPI JSON API or the wheel itself where a mirror lacks it) and the extras each package was asked for are derived from the
  closure (a fixpoint over the Requires-Dist whose markers hold on the target).

Errors: LockError (exit 7) for an unresolvable requirement, a package without a wheel for the target or without
a sha256; EnvironmentError_ when uv is not installed.
"""
from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterable, Optional

import requests
from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from cudastack.core.errors import EnvironmentError_, LockError

#: manylinux levels uv's ``--python-platform`` accepts for x86_64/aarch64 (uv 0.13 ``pip compile --help``).
UV_MANYLINUX_MINORS = (17, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40)


def uv_binary() -> str:
    """Path of the uv executable: the one the ``uv`` Python package ships, else ``uv`` on PATH."""
    try:
        from uv import find_uv_bin
        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise EnvironmentError_("uv is not installed, so `invoke lock --resolver uv` cannot run. It is a dependency of "
                            "this project: reinstall it (`pip install -e .`) or `pip install uv`, or lock with "
                            "--resolver pip.")


def uv_version(uv: Optional[str] = None) -> str:
    """``uv --version``'s version ("0.13.9")."""
    out = subprocess.run([uv or uv_binary(), "--version"], capture_output=True, text=True, check=True).stdout
    return out.split()[1]


def uv_platform(glibc: str, machine: str = "x86_64") -> str:
    """uv's ``--python-platform`` for an image with ``glibc`` ("2.36" -> ``x86_64-manylinux_2_36``): the newest
    manylinux level uv names that the glibc satisfies (PEP 600). Raises LockError below glibc 2.17."""
    minor = int(glibc.split(".")[1])
    fits = [m for m in UV_MANYLINUX_MINORS if m <= minor]
    if not fits:
        raise LockError(f"uv resolves for manylinux 2.17 or newer; the image's glibc is {glibc}. Lock with "
                        "--resolver pip.")
    return f"{machine}-manylinux_2_{fits[-1]}"


def target_tags(target: dict) -> list[Tag]:
    """The wheel tags the target installs, most preferred first (pip's order: CPython ABI, abi3, none; newest
    manylinux first)."""
    from cudastack.pkgindex.wheels import manylinux_platforms

    py = tuple(int(x) for x in target["python_version"].split("."))
    plats = manylinux_platforms(target["glibc"], target["machine"])
    abi = f"{target['implementation']}{py[0]}{py[1]}"
    return list(cpython_tags(py, [abi], plats)) + list(compatible_tags(py, abi, plats))


def _uv_env(cert: Optional[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "PIP_"))}
    env["UV_NO_PROGRESS"] = "1"
    if cert:
        env["SSL_CERT_FILE"] = cert
    return env


def _cert() -> Optional[str]:
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        v = os.environ.get(var)
        if v and os.path.exists(v):
            return v
    return None


def _source_args(index: str, extra_index: str, find_links: Iterable[str]) -> list[str]:
    from cudastack.lock.model import DEFAULT_INDEX

    out = ["--no-index"] if index == "none" else ["--index-url", index or DEFAULT_INDEX]
    for e in (extra_index or "").split():
        out += ["--extra-index-url", e]
    for f in find_links:
        out += ["--find-links", str(f)]
    return out


def compile_command(specs_file: str, out_file: str, *, target: dict, index: str = "", extra_index: str = "",
                    find_links: Iterable[str] = (), no_deps: bool = False, constraints_file: Optional[str] = None,
                    fmt: str = "pylock.toml", cache_dir: Optional[str] = None, uv: Optional[str] = None) -> list[str]:
    """The ``uv pip compile`` command line for ``target`` (see :func:`cudastack.lock.target_for_plan`)."""
    cmd = [uv or uv_binary(), "pip", "compile", specs_file, "-o", out_file, "--format", fmt, "--quiet",
           "--no-config", "--no-header", "--no-annotate", "--no-build", "--index-strategy", "unsafe-best-match",
           "--python-version", target["python_version"],
           "--python-platform", uv_platform(target["glibc"], target["machine"])]
    if fmt == "requirements.txt":
        cmd.append("--generate-hashes")
    if no_deps:
        cmd.append("--no-deps")
    if constraints_file:
        cmd += ["--constraint", constraints_file]
    cmd += ["--cache-dir", cache_dir] if cache_dir else []
    return cmd + _source_args(index, extra_index, find_links)


def _run_uv(cmd: list[str], specs: list[str], where: str, timeout: float) -> None:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_uv_env(_cert()), timeout=timeout)
    except subprocess.TimeoutExpired:
        raise LockError(f"uv did not finish resolving {' '.join(specs)} within {timeout:.0f} s.") from None
    if proc.returncode != 0:
        detail = " ".join(ln.strip() for ln in proc.stderr.strip().splitlines()[-8:])[-800:]
        raise LockError(f"uv could not resolve {' '.join(specs)} for {where or 'the target platform'}: {detail} "
                        "Check the pins in the recipe (the version must exist on the index for the target Python "
                        "and platform); nothing was written.")


def _constraints_text(constraints: dict[str, str]) -> str:
    return "".join(f"{n}{v}\n" if v[:1] in "=<>!~" else f"{n}=={v}\n" for n, v in sorted(constraints.items()))


def uv_resolve(specs: list[str], *, target: dict, index: str = "", extra_index: str = "",
               find_links: Iterable[str] = (), no_deps: bool = False, python: str = sys.executable,
               where: str = "", timeout: float = 1800, constraints: Optional[dict[str, str]] = None,
               requires: Optional[dict] = None, cache_dir: Optional[str] = None) -> list[dict]:
    """:func:`cudastack.lock.pip_resolve` with uv's resolver: the same arguments and the same result,
    ``[{"name", "version", "filename", "url"?, "sha256", "requested"?}]`` sorted by name, one wheel per
    package (the target's most preferred tag, :func:`target_tags`). ``python`` is accepted and unused (uv
    needs no interpreter of the target's version). ``requires`` is filled as pip_resolve fills it, from each
    wheel's PEP 658 core metadata. ``cache_dir``: uv's cache (default: uv's own). Raises LockError."""
    if not specs:
        return []
    data = tomllib.loads(_compile_text(specs, constraints, where, timeout, target=target, index=index,
                                       extra_index=extra_index, find_links=find_links, no_deps=no_deps,
                                       cache_dir=cache_dir))
    requested = set()
    for s in specs:
        try:
            requested.add(canonicalize_name(Requirement(s).name))
        except InvalidRequirement:
            pass
    tags = {t: i for i, t in enumerate(target_tags(target))}
    chosen = [_pkg_from_pylock(p, tags, requested) for p in data.get("packages", [])]
    pkgs = sorted((pkg for pkg, _ in chosen), key=lambda p: p["name"])
    if requires is not None:
        requires.update(closure_requires(pkgs, specs, target, sources={pkg["name"]: src for pkg, src in chosen}))
    return pkgs


def _pkg_from_pylock(p: dict, tags: dict, requested: set) -> tuple[dict, str]:
    """(the lock's package entry, the chosen wheel's URL) for one ``[[packages]]`` table of uv's pylock.toml."""
    name = canonicalize_name(p.get("name", "?"))
    wheels = []
    for w in p.get("wheels") or []:
        url = w.get("url") or w.get("path") or ""
        fname = w.get("name") or url.rsplit("/", 1)[-1].split("#", 1)[0]
        try:
            rank = min(tags.get(t, len(tags)) for t in parse_wheel_filename(fname)[3])
        except Exception:  # noqa: BLE001 - not a wheel file name
            continue
        wheels.append((rank, fname, url, (w.get("hashes") or {}).get("sha256")))
    if not wheels:
        what = "a source tree or sdist" if (p.get("sdist") or p.get("directory") or p.get("vcs")) else "no file"
        raise LockError(f"uv resolved {name} {p.get('version')} to {what}, not a wheel for the target; the lock "
                        "pins wheels only (lock source builds as sdist/git/path sources of their recipe).")
    rank, fname, url, sha = min(wheels)
    if rank >= len(tags):
        raise LockError(f"uv resolved {name} {p.get('version')} to wheels none of which installs on the target "
                        f"({', '.join(w[1] for w in wheels)}); check the target's Python and glibc.")
    if not sha:
        raise LockError(f"The index gave no sha256 for {name} {p.get('version')} ({url}); use an index that "
                        "publishes hashes (PyPI does).")
    pkg = {"name": name, "version": str(p.get("version", "?")), "filename": fname, "sha256": sha.lower()}
    if url.startswith(("https://", "http://")):
        pkg["url"] = url
    if name in requested:
        pkg["requested"] = True
    return pkg, url


# ------------------------------------------------------------------------------ Requires-Dist (PEP 658)
def wheel_requires_dist(url: str, *, session: Optional[requests.Session] = None, timeout: float = 60,
                        name: str = "", version: str = "") -> list[str]:
    """The ``Requires-Dist`` lines of the wheel at ``url``. For ``file://``: the wheel's own
    ``*.dist-info/METADATA``. For http(s), in this order: its PEP 658 core metadata (``<url>.metadata``);
    where the index does not serve that (some mirrors and proxies answer 404), the PyPI JSON API of the
    release (``/pypi/<name>/<version>/json``, ``info.requires_dist``) when ``url`` is on PyPI's file host;
    else the wheel itself, downloaded to a temporary file. Raises LockError when none answers."""
    from cudastack.lock.pins import _verify_arg

    if url.startswith("file:"):
        from urllib.parse import unquote, urlparse

        return _metadata_requires(unquote(urlparse(url).path))
    s = session or requests.Session()
    errors = []
    try:
        r = s.get(url + ".metadata", timeout=timeout, verify=_verify_arg())
        if r.status_code == 200:
            return list(email.parser.Parser().parsestr(r.text, headersonly=True).get_all("Requires-Dist") or [])
        errors.append(f"{url}.metadata: HTTP {r.status_code}")
    except requests.RequestException as exc:
        errors.append(f"{url}.metadata: {type(exc).__name__}")
    if name and version and "files.pythonhosted.org" in url:
        try:
            r = s.get(f"https://pypi.org/pypi/{name}/{version}/json", timeout=timeout, verify=_verify_arg())
            if r.status_code == 200:
                return list((r.json().get("info") or {}).get("requires_dist") or [])
            errors.append(f"PyPI JSON API: HTTP {r.status_code}")
        except (requests.RequestException, ValueError) as exc:
            errors.append(f"PyPI JSON API: {type(exc).__name__}")
    try:
        with tempfile.NamedTemporaryFile(suffix=".whl") as f:
            with s.get(url, timeout=timeout, verify=_verify_arg(), stream=True) as r:
                r.raise_for_status()
                for chunk in r.iter_content(1 << 20):
                    f.write(chunk)
            f.flush()
            return _metadata_requires(f.name)
    except (requests.RequestException, OSError, StopIteration) as exc:
        errors.append(f"{url}: {type(exc).__name__}")
    raise LockError(f"Cannot read the Requires-Dist of {name or url} {version}: {'; '.join(errors)}. The lock needs "
                    "them to keep what the parent image holds; retry, or lock with --resolver pip.")


def _metadata_requires(wheel_path: str) -> list[str]:
    import zipfile

    with zipfile.ZipFile(wheel_path) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = zf.read(meta).decode("utf-8", "replace")
    return list(email.parser.Parser().parsestr(text, headersonly=True).get_all("Requires-Dist") or [])


def closure_requires(pkgs: list[dict], specs: list[str], target: dict,
                     sources: Optional[dict[str, str]] = None) -> dict[str, dict]:
    """{name: {"requires_dist": [...], "extras": [...]}} for a resolved closure, as pip's installation report
    gives it: Requires-Dist from each wheel's core metadata (:func:`wheel_requires_dist`, LockError when it
    cannot be read; a package without a URL gets an empty list; ``sources``: {name: wheel URL} where it is not the
    package's ``url``, e.g. ``file://``) and the extras asked of each package by the
    top-level ``specs`` and by the Requires-Dist whose markers hold on ``target``, to a fixpoint."""
    from cudastack.lock.pip_resolver import marker_environment

    s = requests.Session()

    def one(p):
        url = (sources or {}).get(p["name"]) or p.get("url")
        if not url:
            return p["name"], []
        return p["name"], wheel_requires_dist(url, session=s, name=p["name"], version=p["version"])

    with ThreadPoolExecutor(max_workers=8) as pool:
        rd = dict(pool.map(one, pkgs))
    extras: dict[str, set] = {p["name"]: set() for p in pkgs}
    for text in specs:
        try:
            r = Requirement(text)
        except InvalidRequirement:
            continue
        extras.setdefault(canonicalize_name(r.name), set()).update(r.extras)
    env = marker_environment(target)
    changed = True
    while changed:
        changed = False
        for owner, texts in rd.items():
            for text in texts:
                try:
                    r = Requirement(text)
                except InvalidRequirement:
                    continue
                if r.marker is not None and not any(r.marker.evaluate({**env, "extra": e})
                                                    for e in [""] + sorted(extras.get(owner, ()))):
                    continue
                have = extras.setdefault(canonicalize_name(r.name), set())
                if not set(r.extras) <= have:
                    have.update(r.extras)
                    changed = True
    return {n: {"requires_dist": rd.get(n, []), "extras": sorted(extras.get(n, ()))} for n in rd}


def requirements_hash_counts(specs: list[str], *, target: dict, index: str = "", no_deps: bool = False,
                             constraints: Optional[dict[str, str]] = None, cache_dir: Optional[str] = None,
                             timeout: float = 1800) -> dict[str, int]:
    """{name: number of ``--hash`` lines} in ``uv pip compile --generate-hashes`` requirements.txt output for
    ``specs``: uv lists every file of the pinned version there (all platforms and the sdist), where the lock
    and :func:`uv_resolve` keep one."""
    text = _compile_text(specs, constraints, "", timeout, target=target, index=index, no_deps=no_deps,
                         fmt="requirements.txt", cache_dir=cache_dir)
    counts: dict[str, int] = {}
    name = None
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#") and "==" in line:
            name = canonicalize_name(line.split("==", 1)[0].split("[", 1)[0].strip())
            counts[name] = 0
        if name and "--hash=sha256:" in line:
            counts[name] += 1
    return counts


def _compile_text(specs: list[str], constraints: Optional[dict[str, str]], where: str, timeout: float,
                  *, fmt: str = "pylock.toml", **compile_kw) -> str:
    """Run ``uv pip compile`` on ``specs`` (and ``constraints``) in a scratch folder and return its output
    file's text (``fmt``: "pylock.toml" or "requirements.txt"); ``compile_kw`` go to :func:`compile_command`.
    Raises LockError (uv's failure, via :func:`_run_uv`)."""
    with tempfile.TemporaryDirectory(prefix="cudastack-uv-") as tmp:
        spec_file, out = os.path.join(tmp, "requirements.in"), os.path.join(tmp, fmt)
        Path(spec_file).write_text("".join(s + "\n" for s in specs))
        cfile = None
        if constraints:
            cfile = os.path.join(tmp, "constraints.txt")
            Path(cfile).write_text(_constraints_text(constraints))
        cmd = compile_command(spec_file, out, constraints_file=cfile, fmt=fmt, **compile_kw)
        _run_uv(cmd, specs, where, timeout)
        return Path(out).read_text()


def _describe() -> str:
    return f"uv {uv_version()} pip compile --format pylock.toml (PEP 751) --no-build --python-platform/--python-version"


uv_resolve.describe = _describe   # what resolve_lock writes as the lock's resolver.tool

#: the resolver ``invoke lock`` uses unless told otherwise: uv, for the figures in results/resolver/ (same
#: closures as pip on the 12.8 and 13.1 plans in a tenth of the resolve time; a whole lock in 1/3 to 1/5)
DEFAULT_RESOLVER = "uv"
RESOLVER_NAMES = ("pip", "uv")


def choose_resolver(name: Optional[str] = None):
    """The resolve function for ``invoke lock --resolver NAME`` ("pip": :func:`cudastack.lock.pip_resolve`,
    "uv": :func:`uv_resolve`; None: :data:`DEFAULT_RESOLVER`). Raises UsageError for another name and
    EnvironmentError_ when uv is asked for and not installed, before anything is resolved."""
    from cudastack.core.errors import UsageError
    from cudastack.lock.pip_resolver import pip_resolve

    name = (name or DEFAULT_RESOLVER).strip().lower()
    if name not in RESOLVER_NAMES:
        raise UsageError(f"--resolver {name!r} is not a resolver this tool knows; use one of "
                         f"{', '.join(RESOLVER_NAMES)} (default {DEFAULT_RESOLVER}).")
    if name == "pip":
        return pip_resolve
    uv_binary()
    return uv_resolve
