"""Run the validation suite (``python -m stackprobe``) in the current environment or inside images, and
compare the reports.

Inside an image: the docker SDK runs ``<python> -m stackprobe --json - ...`` with ``--rm`` and no
network (the static tier needs none). The image's Python is found among :data:`PYTHON_CANDIDATES`. By
default this checkout's ``validate/`` folder is mounted read-only and put on PYTHONPATH, so a probe change
needs no image rebuild (the suite is not part of the runtime image's hash); ``image_suite=True`` runs the
copy the image carries instead (when it has one). Every report gets ``provenance``: the digest of the suite
that ran (computed by that suite), the image's id, repo digests, the plan hash and node from its labels,
and the lockfile entry whose outputs or push record that image id. Errors:
:class:`cudastack.core.errors.ValidationError` (exit code 9) when the image does not exist, it has no Python, or the
suite failed in it; :class:`cudastack.core.errors.EnvironmentError_` (exit 5, as for build) when no Docker engine
answers (the client is :func:`cudastack.core.docker_engine.docker_client`, bound to the CLI's engine).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath

from cudastack.core.paths import PROJECT_ROOT
from cudastack.core.errors import UsageError, ValidationError
from cudastack.jobs.output import json_output
from cudastack.plan.rules import parse_target_arch

PYTHON_CANDIDATES = ("/opt/venv/bin/python", "python3", "python")
SUITE_DIR = PROJECT_ROOT / "validate"
LOCK_DIR = PROJECT_ROOT / "lockfiles"
#: where reports go unless --out names a folder: inside .stack/, which .gitignore covers
DEFAULT_OUT = ".stack/validate"
MOUNT_AT = "/opt/stackprobe-src"


def suite_args(target_arch: str = "12.0", *, label: str = "", jit_compile: bool = False, world_size: int = 8,
               topology: str = "auto", extra: list[str] | None = None, server_args: str = "",
               server_env: dict | None = None, engine: str = "auto") -> list[str]:
    """The suite's command-line flags (JSON report on stdout). ``server_args`` / ``server_env``: the serving engine's
    flags and variables the verdicts are for (the suite's ``--server-args`` / ``--env``; it checks the flags against
    the installed engine and exits 2 on one it does not define). ``engine``: the suite's ``--engine`` (``sglang``,
    ``vllm`` or ``auto``: whichever is installed, both when both are); ``auto`` is not passed (the suite's default)."""
    args = ["--json", "-", "--quiet", "--target-arch", str(target_arch), "--world-size", str(int(world_size)),
            "--topology", topology]
    if engine != "auto":
        args += ["--engine", engine]
    if server_args:
        args.append(f"--server-args={server_args}")
    for k, v in (server_env or {}).items():
        args += ["--env", f"{k}={v}"]
    if label:
        args += ["--label", label]
    if jit_compile:
        args.append("--jit-compile")
    return args + list(extra or [])


def _parse_report(stdout: str, where: str):
    from stackprobe.api import Report, ReportError

    try:
        return Report.from_json(json.loads(stdout))
    except (json.JSONDecodeError, ReportError) as e:
        raise ValidationError(f"the suite in {where} did not print a report ({e}); its output began: {stdout[:300]!r}") from e


def validate_here(target_arch: str = "12.0", *, python: str | None = None, timeout: float = 1800, **kw):
    """Run the suite with ``python`` (default: this interpreter) in the current environment."""
    cmd = [python or sys.executable, "-m", "stackprobe"] + suite_args(target_arch, **kw)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode == 2:
        raise UsageError(p.stderr.strip().replace("stackprobe: ", "", 1))
    if p.returncode != 0:
        raise ValidationError(f"the suite failed here (exit {p.returncode}): {p.stderr.strip()[-800:]}")
    return _parse_report(p.stdout, "this environment")


def _client(client=None):
    if client is not None:
        return client
    from cudastack.core.docker_engine import docker_client

    return docker_client()       # EnvironmentError_ (exit 5) when no engine answers, as for build


def _run(client, image: str, cmd: list[str], *, volumes: dict | None = None, env: dict | None = None,
         timeout: float = 1800, hide: list[str] | None = None) -> tuple[int, str, str]:
    """Run ``cmd`` in a throw-away container; returns (exit code, stdout, stderr). ``hide``: absolute folders
    covered with an empty read-only tmpfs in that container (the image is not changed). A command that cannot
    start (no such executable) gives exit code 127."""
    import docker

    try:
        ctr = client.containers.create(image, cmd, volumes=volumes or {}, environment=env or {},
                                       network_disabled=True, entrypoint=[],
                                       tmpfs={d: "ro,size=64k" for d in hide or ()})
    except docker.errors.ImageNotFound:
        raise
    except docker.errors.APIError as e:
        return 127, "", str(e)
    try:
        try:
            ctr.start()
        except docker.errors.APIError as e:   # exec format / executable not found
            return 127, "", str(e)
        try:
            rc = ctr.wait(timeout=timeout).get("StatusCode", 1)
        except Exception as e:  # noqa: BLE001 - timeout from the HTTP client
            ctr.kill()
            raise ValidationError(f"the suite in {image} ran over {timeout:.0f} s and was stopped") from e
        out = ctr.logs(stdout=True, stderr=False).decode(errors="replace")
        err = ctr.logs(stdout=False, stderr=True).decode(errors="replace")
        return rc, out, err
    finally:
        try:
            ctr.remove(force=True)
        except Exception:  # noqa: BLE001
            pass


def find_python(client, image: str) -> str:
    """The first of :data:`PYTHON_CANDIDATES` that runs in ``image``. Raises ValidationError."""
    tried = []
    for py in PYTHON_CANDIDATES:
        rc, out, err = _run(client, image, [py, "-c", "import sys; print(sys.version_info[0])"], timeout=120)
        if rc == 0 and out.strip() == "3":
            return py
        tried.append(f"{py}: {(err or out).strip()[:120] or f'exit {rc}'}")
    raise ValidationError(f"image {image} has no Python 3 to run the suite (tried {'; '.join(tried)}). "
                          "Validate a runtime image built by `invoke build` (it has /opt/venv/bin/python).")


def lock_entry(image_id: str, lock_dir: str | Path = LOCK_DIR) -> dict | None:
    """The lockfile entry that records ``image_id`` (an ``outputs`` or ``pushed`` record):
    ``{"lockfile", "node", "plan_hash", "tag", "pushed"}``, or None when no lockfile names it."""
    import yaml

    for path in sorted(Path(lock_dir).glob("*.lock.yaml")):
        try:
            lock = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        pushed = lock.get("pushed") or {}
        for node, out in (lock.get("outputs") or {}).items():
            push = pushed.get(node) or {}
            if image_id and image_id in (out.get("image_id"), push.get("image_id")):
                return {"lockfile": path.name, "node": node, "plan_hash": ((lock.get("nodes") or {}).get(node) or {}).get("plan_hash"),
                        "tag": out.get("tag"), "pushed": push.get("reference")}
    return None


def image_provenance(client, image: str, lock_dir: str | Path = LOCK_DIR) -> dict:
    """Id, repo digests, cudastack labels (plan hash, node) and lock entry of ``image``."""
    img = client.images.get(image)
    labels = ((img.attrs or {}).get("Config") or {}).get("Labels") or {}
    return {"ref": image, "id": img.id, "repo_digests": list((img.attrs or {}).get("RepoDigests") or []),
            "node": labels.get("org.cudastack.node"), "plan_hash": labels.get("org.cudastack.hash"),
            "lock_entry": lock_entry(img.id, lock_dir)}


def check_hidden(folders) -> list[str]:
    """``--hide`` values as absolute, normalised folder paths; UsageError for a relative path, ``/`` itself or
    a path with ``..`` (checked before any container starts)."""
    out = []
    for d in folders or ():
        p = PurePosixPath(str(d))
        if not p.is_absolute() or ".." in p.parts or str(p) == "/":
            raise UsageError(f"--hide {d!r}: give an absolute folder inside the image, e.g. --hide /usr/local/cuda/bin "
                             "(it is covered with an empty read-only folder in the validation container only).")
        out.append(str(p))
    return out


def validate_image(image: str, target_arch: str = "12.0", *, client=None, timeout: float = 1800,
                   image_suite: bool = False, extra_env: dict | None = None,
                   hide: list[str] | None = None, **kw):
    """Run the static suite inside ``image`` (``docker run --rm``, no network) and return its Report.

    Mounts this checkout's ``validate/`` read-only (ahead of any copy in the image) unless ``image_suite``,
    which uses the image's own suite when ``import stackprobe`` works there (and mounts the checkout's when
    it does not). ``extra_env``: variables set in the
    container on top of the image's (e.g. ``CUDA_HOME=/nonexistent`` and a ``PATH`` without the toolkit, to
    validate the image as a host without nvcc would run it); recorded in the report's options. ``hide``: folders
    covered with an empty read-only tmpfs in the container (e.g. every ``bin`` folder holding an nvcc, so the
    suite runs as on a host where none exists; :func:`check_hidden`), also recorded. The report's ``provenance`` names the
    suite digest and the image (:func:`image_provenance`). Raises ValidationError (image missing, no Python,
    suite failed) or UsageError (bad target arch).
    """
    import docker

    client = _client(client)
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ValidationError(f"image {image} does not exist on this Docker engine: build it (`invoke build --cuda 13.1`) "
                              "or pull it, then pass its tag or digest to --image.") from None
    py = find_python(client, image)
    use_image = image_suite
    rc, _, _ = _run(client, image, [py, "-c", "import stackprobe"], timeout=120) if use_image else (1, "", "")
    volumes, env, how = {}, {}, "image's own suite"
    if rc != 0:
        volumes = {str(SUITE_DIR): {"bind": MOUNT_AT, "mode": "ro"}}
        env = {"PYTHONPATH": MOUNT_AT}
        how = f"suite mounted read-only from {SUITE_DIR}"
    kw.setdefault("label", image)
    env = dict(env, **(extra_env or {}))
    hide = check_hidden(hide)
    if hide:       # a folder the image lacks would be created empty and hide nothing: refuse a typo
        rc, out, _ = _run(client, image, [py, "-c", "import os, sys; print(' '.join(p for p in sys.argv[1:] "
                                          "if not os.path.isdir(p)))", *hide], timeout=120)
        if rc != 0 or out.strip():
            raise UsageError(f"--hide {out.strip() or ' '.join(hide)}: no such folder in {image}, so nothing would be "
                             "hidden. Give folders the image has (e.g. /usr/local/cuda/bin); nothing was validated.")
    rc, out, err = _run(client, image, [py, "-m", "stackprobe"] + suite_args(target_arch, **kw),
                        volumes=volumes, env=env, timeout=timeout, hide=hide)
    if rc == 2:
        raise UsageError(err.strip().replace("stackprobe: ", "", 1))
    if rc != 0:
        raise ValidationError(f"the suite failed in {image} (exit {rc}, {how}): {err.strip()[-800:]}")
    report = _parse_report(out, image)
    report.options["ran_in"] = {"image": image, "python": py, "suite": how}
    if extra_env:
        report.options["ran_in"]["env"] = dict(extra_env)
    if hide:
        report.options["ran_in"]["hidden"] = list(hide)
    toolchain = (client.images.get(image).labels or {}).get("org.cudastack.toolchain")
    if toolchain:
        report.options["ran_in"]["toolchain"] = toolchain
    report.provenance = dict(report.provenance or {}, image=image_provenance(client, image), suite=how)
    return report


def toolchain_of(report) -> tuple[int, ...] | None:
    """The CUDA toolchain a report's environment was built for, as a version tuple ((12, 8), (13, 1)): the
    image's ``org.cudastack.toolchain`` label, else the CUDA release of nvcc under CUDA_HOME, else torch's
    CUDA. None when none is known."""
    ran_in = report.options.get("ran_in", {})
    env = report.environment or {}
    for value in (ran_in.get("toolchain"), ((env.get("nvcc") or {}).get("cuda_home_nvcc") or {}).get("release"),
                  (env.get("torch") or {}).get("cuda")):
        m = re.match(r"(\d+)\.(\d+)", str(value or ""))
        if m:
            return int(m.group(1)), int(m.group(2))
    return None


def older_to_newer(reports: list, labels: list[str]) -> tuple[list, list[str]]:
    """``reports`` and their ``labels`` ordered from older to newer toolchain (see :func:`toolchain_of`), so
    a comparison reads before -> after. Reports of the same toolchain keep the given order; when any
    report's toolchain is unknown, the given order is kept as a whole."""
    keys = [toolchain_of(r) for r in reports]
    if any(k is None for k in keys):
        return list(reports), list(labels)
    known = [k for k in keys if k is not None]     # all of them (checked above)
    order = sorted(range(len(reports)), key=lambda i: known[i])
    return [reports[i] for i in order], [labels[i] for i in order]


def safe_name(image: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", image)[:120]


def validate_many(images: list[str], target_arch: str = "12.0", *, out_dir: str | Path | None = None,
                  say=print, order: str = "toolchain", figure: str | Path | None = None, **kw) -> tuple[list, str]:
    """Validate each image (or the current environment when ``images`` is empty); write each JSON
    report to ``out_dir`` when given; return (reports, Markdown: the comparison for two or more, the
    matrix for one). ``order``: ``toolchain`` (default) puts reports and comparison columns from older to
    newer toolchain (:func:`older_to_newer`); ``given`` keeps the order of ``images``. ``figure``: the file the
    comparison's Markdown goes to; for two or more reports its PNG (paths x images, :mod:`stackprobe.statusplot`) is
    drawn beside it and the comparison opens with it (or says matplotlib is not installed)."""
    if order not in ("toolchain", "given"):
        raise UsageError(f"--order {order!r}: use toolchain (older to newer) or given (as the images are listed).")
    from stackprobe.api import comparison_markdown

    image_suite = kw.pop("image_suite", False)
    if not images:
        say("validating the current environment")
        reports = [validate_here(target_arch, **kw)]
    else:
        reports = []
        for img in images:
            say(f"validating {img}")
            reports.append(validate_image(img, target_arch, image_suite=image_suite, **kw))
    if out_dir:
        out = Path(out_dir)
        for r, name in zip(reports, images or ["current-environment"]):
            dest = out / f"{safe_name(name)}.json"
            r.write_json(dest)
            say(f"report: {dest}")
    if len(reports) == 1:
        return reports, reports[0].to_markdown()
    labels = list(images)
    if order == "toolchain":
        reports, labels = older_to_newer(reports, labels)
    from stackprobe.api import write_beside
    head = write_beside(reports, labels, figure) if figure else ""
    return reports, head + comparison_markdown(reports, labels)


def _strict(reports) -> None:
    """``--strict``: exit :class:`UnhealthyEnvironment`'s code naming the first error of each unhealthy report."""
    from cudastack.core.errors import UnhealthyEnvironment
    from stackprobe.api import health_errors as errors

    bad = [(r.label or "this environment", errs) for r in reports if (errs := errors(r.environment.get("health")))]
    if bad:
        exc = UnhealthyEnvironment("; ".join(f"{label}: {len(e)} environment health error(s), first: {e[0]['message']}"
                                             for label, e in bad))
        raise exc


def last_built_images(state_dir: str | Path | None = None) -> list[dict]:
    """The runtime images the last build of each toolchain made or found cached, newest record first:
    ``[{"tag", "toolchain", "node", "finished", "record"}]`` read from ``<state_dir>/records/latest-cu*.json``
    (default: the project's ``.stack/``); a runtime node counts when its record says built, skipped (cached)
    or pulled. Unreadable records are passed over."""
    import json

    from cudastack.core.paths import PROJECT_ROOT

    rec_dir = Path(state_dir or PROJECT_ROOT / ".stack") / "records"
    found = []
    for p in sorted(rec_dir.glob("latest-cu*.json")):
        try:
            rec = json.loads(p.read_text())
        except (OSError, ValueError):
            continue
        for n in rec.get("nodes") or []:
            if n.get("kind") == "runtime" and n.get("status") in ("built", "skipped", "pulled") and n.get("tag"):
                found.append({"tag": n["tag"], "toolchain": rec.get("toolchain"), "node": n.get("name"),
                              "finished": rec.get("finished") or rec.get("started") or "", "record": str(p)})
    return sorted(found, key=lambda f: f["finished"], reverse=True)


def no_engine_hint(reports, state_dir: str | Path | None = None) -> str | None:
    """For ``invoke validate`` without ``--image`` where no serving engine (SGLang, vLLM) is installed (a
    builder): one paragraph saying that the engine answers could not be given here and naming the images the
    last build made, as ``invoke validate --image <tag>`` commands; None where an engine is installed."""
    pk = {}
    for r in reports:
        pk.update({k: v for k, v in ((r.environment or {}).get("packages") or {}).items() if v})
    if pk.get("sglang") or pk.get("vllm"):
        return None
    images = last_built_images(state_dir)
    head = ("No serving engine (SGLang, vLLM) is installed in this environment, so the engine answers above read "
            "'not installed' and only the libraries' answers stand.")
    if not images:
        return (head + " No build record names a runtime image yet: build one (`invoke build --cuda 13.1 --dry-run` "
                "first), then validate the tag its last line prints with `invoke validate --image <tag>`.")
    cmds = "; ".join(f"`invoke validate --image {i['tag']}` ({i['node']} of CUDA {i['toolchain']}, {i['finished']})"
                     for i in images)
    return head + f" Validate the images your last build made instead: {cmds}."


def validate(*, image=None, target_arch="12.0", out=DEFAULT_OUT, markdown=None, jit_compile=False,
             world_size=8, topology="auto", image_suite=False, order="toolchain", env=None,
             hide=None, server_args="", strict=False, engine="auto", json_out=None):
    """`invoke validate`: validate images (or this environment): which allreduce backends can work for the target
    arch, and why. Its flags' values as keywords (see :mod:`cudastack.cli.validate`); raises StackError."""
    try:
        ws = int(world_size)
    except (TypeError, ValueError):
        raise UsageError(f"--world-size {world_size!r}: give a whole number of GPUs.") from None
    if topology not in ("auto", "pcie", "nvlink"):
        raise UsageError(f"--topology {topology!r}: use auto, pcie or nvlink.")
    from stackprobe.api import engine_choices
    choices = engine_choices()
    if engine not in choices:
        raise UsageError(f"--engine {engine!r}: use one of {', '.join(choices)} (auto: whichever serving engine is "
                         "installed, both when both are).")
    extra_env = {}
    for item in env or []:
        k, sep, v = str(item).partition("=")
        if not sep or not k or not k.replace("_", "").isalnum():
            raise UsageError(f"--env {item!r}: write NAME=VALUE, e.g. --env CUDA_HOME=/nonexistent.")
        extra_env[k] = v
    parse_target_arch(target_arch)       # a bad arch: exit 4 before any work
    hidden = check_hidden(hide)
    if hidden and not image:
        raise UsageError("--hide applies to --image runs (it covers folders of the image in its container).")
    reports, text = validate_many(list(image or []), str(target_arch), out_dir=out, order=str(order), figure=markdown,
                            jit_compile=bool(jit_compile),
                            world_size=ws, topology=topology, say=lambda m: print(m, file=sys.stderr),
                            **({"image_suite": True} if image_suite else {}),
                            **({"extra_env": extra_env} if extra_env and image else {}),
                            **({"server_env": extra_env} if extra_env else {}),
                            **({"server_args": str(server_args)} if server_args else {}),
                            **({"engine": str(engine)} if engine != "auto" else {}),
                            **({"hide": hidden} if hidden else {}))
    with json_output(json_out) as box:
        print(text)
        box["data"] = [r.to_json() for r in reports]
    if markdown:
        from stackprobe.api import write_atomic
        write_atomic(markdown, text)
    if not image and (hint := no_engine_hint(reports)):
        print(hint, file=sys.stderr)
    if strict:
        _strict(reports)
