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

The package, one module per job (each imports only the ones above it; no module imports this package):

* :mod:`cudastack.lock.model`: the file: path, schema, rendering, atomic and exclusive reads/writes;
* :mod:`cudastack.lock.pip_resolver`: the target platform and one pip resolution (installation report);
* :mod:`cudastack.lock.pins`: sdist and git pins, and every pinned sha256 checked against its index;
* :mod:`cudastack.lock.resolve`: a whole plan pinned (:func:`resolve_lock`) and written (:func:`lock_plan`);
* :mod:`cudastack.lock.apply`: staleness, hash-checking requirements and the plan turned into its locked build;
* :mod:`cudastack.lock.outputs`: outputs, pushes and pulls recorded in and driven from the lock, image checks.

The names below are re-exported so that ``from cudastack import lock as L; L.load_lock(...)`` keeps working.
"""
from __future__ import annotations

from cudastack.lock.model import (CUDA_WHEELS_PREFIX, DEFAULT_INDEX, DEFAULT_LOCKFILES_DIR, HASH_MISMATCH_HEADER,
                                  LOCK_VERSION, PROJECT_ROOT, SEPARATE_PREFIX_INSTALLS, Progress, check_schema,
                                  exclusive, load_lock, lock_command, lock_path, plan_options, render_lock,
                                  update_lock, write_atomic, write_lock)
from cudastack.lock.pip_resolver import (KNOWN_GLIBC, MIN_MANYLINUX_MINOR, index_args, kept_pins, manylinux_platforms,
                                         marker_environment, pip_resolve, target_for_plan)
from cudastack.lock.pins import (describe_hash_check, git_pin, locked_files, published_hashes, sdist_pin,
                                 verify_locked_hashes)
from cudastack.lock.resolve import lock_plan, node_installs, resolve_lock
from cudastack.lock.apply import (apply_lock, explain_pip_hash_failure, install_locked, locked_build_args,
                                  locked_sdist_sha256, prepare_locked_build, requirements_text, stale_entries,
                                  verify_plan_against_lock)
from cudastack.lock.outputs import (check_image_against_lock, checked_push, expected_versions, pull_locked, push_locked,
                                    record_build_outputs, record_outputs, record_push, summary, wheel_records)

__all__ = [
    # model
    "CUDA_WHEELS_PREFIX", "DEFAULT_INDEX", "DEFAULT_LOCKFILES_DIR", "HASH_MISMATCH_HEADER", "LOCK_VERSION",
    "PROJECT_ROOT", "SEPARATE_PREFIX_INSTALLS", "Progress", "check_schema", "exclusive", "load_lock", "lock_command",
    "lock_path", "plan_options", "render_lock", "update_lock", "write_atomic", "write_lock",
    # pip_resolver
    "KNOWN_GLIBC", "MIN_MANYLINUX_MINOR", "index_args", "kept_pins", "manylinux_platforms", "marker_environment",
    "pip_resolve", "target_for_plan",
    # pins
    "describe_hash_check", "git_pin", "locked_files", "published_hashes", "sdist_pin", "verify_locked_hashes",
    # resolve
    "lock_plan", "node_installs", "resolve_lock",
    # apply
    "apply_lock", "explain_pip_hash_failure", "install_locked", "locked_build_args", "locked_sdist_sha256",
    "prepare_locked_build", "requirements_text", "stale_entries", "verify_plan_against_lock",
    # outputs
    "check_image_against_lock", "checked_push", "expected_versions", "pull_locked", "push_locked", "record_build_outputs",
    "record_outputs", "record_push", "summary", "wheel_records",
]
