"""Source builds: where a component's source comes from and how it reaches the build context.

A source entry names one location (:mod:`cudastack.recipes.load`): ``sdist`` (PyPI, :func:`cudastack.build.executor.fetch_sdist`),
``url`` (an upstream release archive with its sha256), ``git`` (URL + 40-hex commit) or ``path`` (a local
folder, or a checkout given with ``--source NAME=DIR``), optionally a ``subdir`` (the folder inside it that
holds the build, e.g. ``sgl-kernel`` in the sglang repository) and ``patches`` (literal ``replace`` ->
``with`` edits, applied after ``subdir``; one that matches nothing fails the build before any compile).

:func:`materialise` puts the tree, patched, at ``<context>/src``: ``url`` is downloaded once into
``<state>/sources/`` and checked against the recipe's sha256 on every use; ``git`` is cloned into
``<state>/sources/git-<commit>`` and checked out at the pinned commit (a ref that moved does not matter:
the commit is what is built); ``path`` is copied (build outputs and ``.git`` left out).

:func:`cmake_args_knob` folds a recipe's ``cmake_defines`` and the memory rule's thread count (for CMake
cache variables such as sgl-kernel's ``SGL_KERNEL_COMPILE_THREADS``, which is no environment variable) into
one ``CMAKE_ARGS`` knob, which scikit-build-core and torch's setup.py both pass to CMake.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

from cudastack.core.credentials import redact, scrub
from cudastack.core.errors import BuildError
from cudastack.plan.model import Knob

Say = Callable[[str], None]
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "dist", "*.egg-info", ".pytest_cache", ".git")


def cmake_args_knob(component, entry, knobs: list[Knob], parallel: list[Knob]) -> tuple[list[Knob], list[str]]:
    """Return ``knobs`` with a ``CMAKE_ARGS`` knob holding ``-DNAME=VALUE`` for each of the entry's
    ``cmake_defines`` and each ``parallelism.threads_defines`` (given the memory rule's thread count, taken
    from the first threads knob in ``parallel``), appended to a CMAKE_ARGS the recipe already sets. Second
    value: ["CMAKE_ARGS"] when it carries a thread count (a parallelism knob: passed, not hashed; the
    defines themselves are hashed with the recipe), else []."""
    defines = dict(entry.cmake_defines)
    par = component.parallelism
    threads = next((k for k in parallel if par and k.name in par.threads_knobs), None)
    if par and par.threads_defines:
        value = threads.value if threads else str(par.nvcc_threads)
        for name in par.threads_defines:
            defines[name] = value
    if not defines:
        return knobs, []
    prior = next((k for k in knobs if k.name == "CMAKE_ARGS"), None)
    words = ([prior.value] if prior and prior.value else []) + [f"-D{k}={v}" for k, v in defines.items()]
    why = (f"recipe cmake_defines ({component.file.name})"
           + (f"; {', '.join(par.threads_defines)} = the memory rule's threads" if par and par.threads_defines else ""))
    knob = Knob("CMAKE_ARGS", " ".join(words), "memory-rule" if par and par.threads_defines else "recipe", why)
    out = [k for k in knobs if k.name != "CMAKE_ARGS"] + [knob]
    return out, (["CMAKE_ARGS"] if par and par.threads_defines else [])


def sha256_file(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def archive_name(url: str) -> str:
    """The cache file name of a source archive URL (its last path segment)."""
    return url.rstrip("/").rsplit("/", 1)[-1]


def fetch_archive(url: str, sha256: str, cache_dir: Path, *, ca_bundle: str | None = None,
                  say: Say | None = None) -> Path:
    """Download ``url`` into ``cache_dir`` once; return its path after checking ``sha256`` (every call).
    Raises BuildError when the download fails or the file's sha256 is not the recipe's (the file is then
    not kept)."""
    import requests

    dest = cache_dir / archive_name(url)
    if dest.is_file():
        got = sha256_file(dest)
        if got == sha256:
            return dest
        dest.unlink()
    cache_dir.mkdir(parents=True, exist_ok=True)
    if say:
        say(f"  fetching {redact(url)}")
    tmp = dest.with_name(f".{dest.name}.part")
    try:
        if url.startswith("file://"):
            shutil.copyfile(url[len("file://"):], tmp)
        else:
            with requests.get(url, stream=True, timeout=600, verify=ca_bundle or True) as resp:
                resp.raise_for_status()
                with open(tmp, "wb") as out:
                    for chunk in resp.iter_content(1 << 20):
                        out.write(chunk)
        got = sha256_file(tmp)
        if got != sha256:
            raise BuildError(f"{redact(url)}: sha256 {got} is not the recipe's {sha256}; the file was not used. "
                             "Check the URL, or update the recipe's sha256 from the release's published checksum.")
        os.replace(tmp, dest)
    except (requests.RequestException, OSError) as exc:
        raise BuildError(f"Downloading {redact(url)} failed: {scrub(str(exc))}. Check the network, or unpack the "
                         "release yourself and pass it with --source NAME=DIR.") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def git_checkout(url: str, commit: str, cache_dir: Path, *, say: Say | None = None) -> Path:
    """A clone of ``url`` at ``commit`` in ``cache_dir/git-<commit>`` (made once, checked each time: HEAD must
    be ``commit``). Submodules are initialised. Raises BuildError naming the failing git command."""
    dest = cache_dir / f"git-{commit}"

    def git(*args: str, cwd: Path | None = None) -> str:
        r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=3600)
        if r.returncode != 0:
            raise BuildError(f"`git {' '.join(args)}` failed for {redact(url)}: {scrub(r.stderr.strip()[-400:])}. "
                             "Check the URL and the commit, or give a checkout with --source NAME=DIR.")
        return r.stdout.strip()

    if dest.is_dir():
        if git("rev-parse", "HEAD", cwd=dest) == commit:
            return dest
        shutil.rmtree(dest)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".git-", dir=cache_dir))
    try:
        if say:
            say(f"  cloning {redact(url)} at {commit[:12]}")
        git("clone", "--no-checkout", url, str(tmp / "repo"))
        git("checkout", "--detach", commit, cwd=tmp / "repo")
        git("submodule", "update", "--init", "--recursive", cwd=tmp / "repo")
        os.replace(tmp / "repo", dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def unpack(archive: Path, dest_parent: Path) -> Path:
    """Unpack ``archive`` under a fresh temporary folder in ``dest_parent``; return its single top folder
    (or the folder itself when the archive has several entries at the top)."""
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=dest_parent))
    try:
        if archive.name.endswith(".zip"):
            with zipfile.ZipFile(archive) as z:
                z.extractall(tmp)
        else:
            with tarfile.open(archive) as t:
                t.extractall(tmp, filter="data")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)     # nothing half-unpacked is left behind
        raise
    tops = list(tmp.iterdir())
    return tops[0] if len(tops) == 1 and tops[0].is_dir() else tmp


def apply_patches(root: Path, patches: list[dict], what: str) -> None:
    """Apply literal patches ({file, replace, with}) under ``root``. BuildError when a file is missing or a
    ``replace`` text matches nothing (the patch no longer applies to this source)."""
    for pt in patches:
        target = root / pt["file"]
        if not target.is_file():
            raise BuildError(f"Patch for {what}: {pt['file']} does not exist in the source.")
        text = target.read_text()
        if pt["replace"] not in text:
            raise BuildError(f"Patch for {what}: '{pt['replace']}' matches nothing in {pt['file']}; the recipe's "
                             "patch no longer applies to this source.")
        target.write_text(text.replace(pt["replace"], pt["with"]))


def materialise(spec: dict, dest: Path, cache_dir: Path, *, ca_bundle: str | None = None,
                say: Say | None = None) -> dict:
    """Put the source ``spec`` (a PlannedNode's ``fetch``) at ``dest`` (which must not exist), ``subdir``
    taken and patches applied. Returns what was used, for the build record: {"kind", "from", "sha256" |
    "commit", "patches"}."""
    kind = spec["kind"]
    if kind == "url":
        archive = fetch_archive(spec["url"], spec["sha256"], cache_dir, ca_bundle=ca_bundle, say=say)
        root = unpack(archive, dest.parent)
        used = {"kind": "url", "from": redact(spec["url"]), "sha256": spec["sha256"]}
    elif kind == "git":
        clone = git_checkout(spec["url"], spec["commit"], cache_dir, say=say)
        root = Path(tempfile.mkdtemp(prefix=".copy-", dir=dest.parent)) / "tree"
        shutil.copytree(clone, root, ignore=shutil.ignore_patterns(".git"), symlinks=True)
        used = {"kind": "git", "from": redact(spec["url"]), "commit": spec["commit"]}
    elif kind == "path":
        root = Path(tempfile.mkdtemp(prefix=".copy-", dir=dest.parent)) / "tree"
        shutil.copytree(spec["path"], root, ignore=_IGNORE, symlinks=True)
        used = {"kind": "path", "from": spec["path"]}
    else:
        raise BuildError(f"Unknown source kind {kind!r}.")
    tmpdir = next(p for p in [root, *root.parents] if p.name.startswith((".unpack-", ".copy-")))
    try:
        if spec.get("subdir"):
            root = root / spec["subdir"]
            if not root.is_dir():
                raise BuildError(f"The source {used['from']} has no folder {spec['subdir']} (the recipe's subdir).")
        apply_patches(root, spec.get("patches", []), used["from"])
        shutil.move(str(root), str(dest))
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    used["patches"] = [p["file"] for p in spec.get("patches", [])]
    return used
