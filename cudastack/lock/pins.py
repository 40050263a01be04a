"""Pins that are not pip closures, and the check of every pinned sha256 against its index.

* :func:`sdist_pin`: an sdist's sha256 from a find-links folder or the index's JSON simple API (PEP 691);
* :func:`git_pin`: a git ref's commit (``git ls-remote``);
* :func:`verify_locked_hashes`: every sha256 the lock pins against what the index publishes
  (:func:`published_hashes`: PEP 691 JSON, else PEP 503 HTML ``#sha256=`` fragments) or a cached file.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
from pathlib import Path
from typing import Callable, Iterable, Optional

import requests
from packaging.utils import canonicalize_name, parse_sdist_filename

from cudastack.core.errors import LockError
from cudastack.lock.model import DEFAULT_INDEX, lock_command


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
    refs: dict[str, str] = {}
    for line in proc.stdout.splitlines():       # "<sha>\t<ref>" per line
        if "\t" in line:
            sha, name = line.split("\t", 1)
            refs[name] = sha
    for key in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref):
        if key in refs:
            return {"url": url, "ref": ref, "commit": refs[key]}
    raise LockError(f"The git remote {url} has no ref {ref!r}.")


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
