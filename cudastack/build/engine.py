"""The Docker engine: BuildKit builds through the docker CLI, everything else through the docker SDK.

Why two clients: docker-py drives the classic builder only (no ``RUN --mount=type=cache``, no
``--secret``), so builds shell out to the docker CLI with BuildKit; the SDK does daemon checks, inspect,
tag and exists.

BuildKit path detection (:func:`find_buildkit`), in order over every ``docker`` on PATH and
``/usr/bin/docker``:

1. a client with the buildx plugin (``docker buildx version`` answers): ``docker buildx build``
   (``--load`` to put an image in the engine's store);
2. a client older than 23.0: ``DOCKER_BUILDKIT=1 docker build`` (from 23.0 on, ``docker build`` with
   BuildKit is a front for buildx and fails when the plugin is missing: docker 23.0 release notes).

If neither exists, :class:`EnvironmentError_` says to install ``docker-buildx`` (or Debian's ``docker.io``,
whose 20.10 client does BuildKit by itself).

The build child (the docker CLI, which holds the BuildKit session) dies with its parent: it is started with
Linux's parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGTERM)``, prctl(2)), so a SIGKILL of this process,
which runs no handler, still ends the CLI; its session closes and the daemon cancels the solve instead of
finishing the step as an orphan. Ctrl-C and SIGTERM (turned into KeyboardInterrupt by the tasks,
:mod:`cudastack.core.stop`) terminate it explicitly; the CLI runs in its own process group, so a terminal's Ctrl-C
reaches this process only, and a CLI that exits non-zero after a stop request is reported as interrupted.

Each build streams BuildKit's plain progress into a log file (the whole log) and onto the terminal as one
status line per step with the elapsed time (on a terminal, a line redrawn in place; the display and the
progress parser are :mod:`cudastack.build.progress`). A failing build raises :class:`BuildError` with the
last lines of the failing step and the log's path.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from cudastack.core import stop
from cudastack.core.credentials import scrub
from cudastack.core.docker_engine import docker_client
from cudastack.build.progress import BuildDisplay, Say, _fmt_s, _Progress
from cudastack.core.errors import BuildError, EnvironmentError_, UsageError

SYSTEM_CA_BUNDLES = ("/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
                     "/etc/ssl/cert.pem", "/etc/ssl/ca-bundle.pem")


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def output_spec(output_dir) -> str:
    """``type=local,dest=<output_dir>`` for ``--output``. BuildKit reads the value as one CSV record (buildx
    ``util/buildflags``), so a folder whose path holds a comma or a double quote is written as a quoted CSV field
    (``"dest=/a,b"``, inner quotes doubled); any other path as it is."""
    dest = f"dest={output_dir}"
    if any(c in dest for c in ',"'):
        dest = '"' + dest.replace('"', '""') + '"'
    return f"type=local,{dest}"


# ------------------------------------------------------------------------------------- BuildKit path
@dataclass(frozen=True)
class BuildKitPath:
    """How builds reach BuildKit: ``docker`` (client path), ``mode`` "buildx" | "env", client version."""

    docker: str
    mode: str
    version: str

    def describe(self) -> str:
        how = "docker buildx build" if self.mode == "buildx" else "DOCKER_BUILDKIT=1 docker build"
        return f"{how} ({self.docker}, client {self.version})"


def _client_candidates() -> list[str]:
    seen: list[str] = []
    for d in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin", "/usr/local/bin", "/bin"]:
        p = os.path.join(d or ".", "docker")
        if os.path.isfile(p) and os.access(p, os.X_OK):
            real = os.path.realpath(p)
            if real not in [os.path.realpath(s) for s in seen]:
                seen.append(p)
    return seen


PR_SET_PDEATHSIG = 1          # <linux/prctl.h>


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that makes the child receive ``sig`` when the process
    that started it dies, for whatever reason (SIGKILL included): ``prctl(PR_SET_PDEATHSIG, sig)``. If the
    parent is already gone by the time the child runs it (the race prctl(2) describes), the child sends
    itself ``sig``. None off Linux (no such call; the child then outlives a killed parent).
    The signal is tied to the thread that calls Popen: call it from a thread that lives as long as the build
    (the main thread here)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl    # looked up here: no dlopen after fork
    parent = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), sig)

    return preexec


def _run(cmd: list[str], env: dict | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def find_buildkit(candidates: list[str] | None = None) -> BuildKitPath:
    """Pick a docker client that can drive BuildKit (see module doc). Raises EnvironmentError_ listing
    what was tried when none can."""
    tried = []
    for docker in candidates if candidates is not None else _client_candidates():
        try:
            ver = _run([docker, "version", "--format", "{{.Client.Version}}"])
            version = (ver.stdout or "").strip().splitlines()[0] if ver.stdout.strip() else ""
            if not version:
                m = re.search(r"Version:\s*(\S+)", ver.stdout + ver.stderr)
                version = m.group(1) if m else "?"
            bx = _run([docker, "buildx", "version"])
        except (OSError, subprocess.TimeoutExpired) as exc:
            tried.append(f"{docker} ({exc.__class__.__name__})")
            continue
        if bx.returncode == 0:
            return BuildKitPath(docker, "buildx", version)
        vt = _version_tuple(version)
        if vt and vt < (23,):
            return BuildKitPath(docker, "env", version)
        tried.append(f"{docker} (client {version}: no buildx plugin, and from 23.0 on `docker build` needs it)")
    raise EnvironmentError_(
        "No docker client can drive BuildKit (needed for cache mounts and build secrets). Tried: "
        f"{'; '.join(tried) or 'no docker client on PATH'}. Install the buildx plugin "
        "(`apt-get install docker-buildx` or docker-buildx-plugin from Docker's repository), or Debian's "
        "`docker.io` package, whose 20.10 client runs BuildKit with DOCKER_BUILDKIT=1.")


def default_ca_bundle() -> str | None:
    """The system CA bundle (for an intercepting HTTPS proxy inside builds), or None where none exists.
    ``SSL_CERT_FILE`` wins when it names a file."""
    env = os.environ.get("SSL_CERT_FILE")
    if env and os.path.isfile(env):
        return env
    for p in SYSTEM_CA_BUNDLES:
        if os.path.isfile(p):
            return p
    return None


def resolve_ca_bundle(ca_bundle: str | None) -> str | None:
    """``--ca-bundle`` (must exist) or the system default. UsageError for a missing file."""
    if ca_bundle:
        if not os.path.isfile(ca_bundle):
            raise UsageError(f"--ca-bundle {ca_bundle}: no such file. Pass a PEM bundle, or leave the flag out "
                             "to use the system bundle.")
        return os.path.abspath(ca_bundle)
    return default_ca_bundle()


# -------------------------------------------------------------------------------------------- builds
@dataclass
class BuildResult:
    duration_s: float
    log: str
    steps: int = 0
    cached_steps: int = 0
    counter: str = ""


class Engine:
    """One Docker engine: the SDK client for inspect/tag/exists, the CLI for BuildKit builds.
    ``builds_issued`` counts every ``docker build`` this object started (a no-op rebuild leaves it 0)."""

    def __init__(self, buildkit: BuildKitPath, client):
        self.buildkit = buildkit
        self.client = client
        self.builds_issued = 0
        self.child_pid: int | None = None       # the docker CLI of the build in progress
        self.on_child: Callable[[int], None] | None = None   # told each build child's pid (the run journal)

    # --- construction / preflight ---------------------------------------------------------------
    @classmethod
    def connect(cls, buildkit: BuildKitPath | None = None) -> "Engine":
        """Ping the daemon through the SDK (EnvironmentError_ with how to start one) and find a
        BuildKit path (EnvironmentError_ with what to install)."""
        client = docker_client()
        return cls(buildkit or find_buildkit(), client)

    def info(self) -> dict:
        return self.client.info()

    def root_dir_free_gib(self) -> tuple[str, float | None]:
        """The daemon's data folder and its free space (GiB), None when it is not on this host."""
        root = self.info().get("DockerRootDir", "/var/lib/docker")
        try:
            return root, shutil.disk_usage(root).free / 2**30
        except OSError:
            return root, None

    def resources(self):
        """The builder's cores and memory. For a daemon on this host, this host's view (which knows
        available memory); else what ``docker info`` reports."""
        from cudastack.plan.rules import host_resources
        from cudastack.plan.rules import Resources

        host = str(getattr(self.client.api, "base_url", ""))
        if "unix" in host or "localhost" in host or "127.0.0.1" in host or "http+docker" in host:
            return host_resources()
        info = self.info()
        return Resources(int(info.get("NCPU", 1)), round(info.get("MemTotal", 2**30) / 2**30, 1),
                         f"docker info of {host}")

    # --- images ---------------------------------------------------------------------------------
    def exists(self, tag: str) -> bool:
        import docker

        try:
            self.client.images.get(tag)
            return True
        except docker.errors.ImageNotFound:
            return False

    def inspect(self, tag: str) -> dict:
        """``{"id": "sha256:...", "size_bytes": int, "created": str, "labels": {name: value}}`` of a local image."""
        img = self.client.images.get(tag)
        return {"id": img.id, "size_bytes": int(img.attrs.get("Size", 0)), "created": img.attrs.get("Created", ""),
                "labels": dict((img.attrs.get("Config") or {}).get("Labels") or {})}

    def tag(self, source: str, target: str) -> None:
        repo, _, tag = target.rpartition(":")
        self.client.images.get(source).tag(repo, tag)

    # --- build ----------------------------------------------------------------------------------
    def build_command(self, *, context: str, dockerfile: str, tag: str | None = None, target: str | None = None,
                      build_args: dict[str, str] | None = None, secrets: dict[str, str] | None = None,
                      output_dir: str | None = None, labels: dict[str, str] | None = None,
                      builder=None, push: bool = False) -> tuple[list[str], dict]:
        """The docker CLI command line and environment for one BuildKit build (pure). ``builder``: a
        :class:`cudastack.build.builders.Builder` (or its name) to build on: ``docker buildx build --builder NAME``,
        or for a ``docker``-driver builder, which is a docker context, ``docker --context CTX buildx build``
        (buildx refuses --builder for another context's docker driver). Needs the buildx path. ``push``: the
        builder pushes the image to ``tag`` (a registry reference) instead of loading it (``--push``; buildx only).
        ``CUDASTACK_BUILD_NETWORK`` in the environment (e.g. ``host``) becomes ``--network``: for a Docker host
        whose default bridge cannot attach build containers ("could not find bridge docker0"); the network mode
        is no input of the cache."""
        bk = self.buildkit
        env = dict(os.environ)
        name = getattr(builder, "name", builder)
        if (builder or push) and bk.mode != "buildx":
            raise UsageError(f"--builder {name} needs the docker buildx plugin; this client ({bk.docker}) builds "
                             "with DOCKER_BUILDKIT=1 docker build. Install docker-buildx, or build without --builder.")
        if bk.mode == "buildx":
            if builder is not None and getattr(builder, "driver", "") == "docker":
                cmd = [bk.docker, "--context", builder.endpoint or name, "buildx", "build"]
            else:
                cmd = [bk.docker, "buildx", "build"] + (["--builder", name] if builder else [])
            if not output_dir:
                cmd.append("--push" if push else "--load")
        else:
            cmd = [bk.docker, "build"]
            env["DOCKER_BUILDKIT"] = "1"
        cmd += ["--progress=plain", "-f", dockerfile]
        if os.environ.get("CUDASTACK_BUILD_NETWORK"):
            cmd += ["--network", os.environ["CUDASTACK_BUILD_NETWORK"]]
        if tag:
            cmd += ["-t", tag]
        if target:
            cmd += ["--target", target]
        for k, v in (build_args or {}).items():
            cmd += ["--build-arg", f"{k}={v}"]
        for sid, src in (secrets or {}).items():
            cmd += ["--secret", f"id={sid},src={src}"]
        for k, v in (labels or {}).items():
            cmd += ["--label", f"{k}={v}"]
        if output_dir:
            cmd += ["--output", output_spec(output_dir)]
        cmd.append(context)
        return cmd, env

    def build(self, *, name: str, log_path: str | Path, say: Say | None = None, **kwargs) -> BuildResult:
        """Run one build (arguments as :meth:`build_command`), streaming progress and writing the full log
        to ``log_path`` (appended). Raises BuildError with the failing step's last lines and the log path."""
        cmd, env = self.build_command(**kwargs)
        say = say or (lambda s: print(s, file=sys.stderr, flush=True))
        log_path = Path(log_path)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.builds_issued += 1
        self.child_pid = None
        prog = _Progress()
        t0 = time.monotonic()
        display = BuildDisplay(name, prog, say, t0)

        with open(log_path, "a", encoding="utf-8", errors="replace") as log:
            log.write(scrub(f"$ {' '.join(cmd)}\n"))
            log.flush()
            try:
                # its own process group: a terminal's Ctrl-C reaches only this process, which ends the CLI itself
                # (below), so the build is always reported as interrupted, never as failed by a CLI that died first
                proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                        errors="replace", bufsize=1, preexec_fn=die_with_parent(), process_group=0)
            except OSError as exc:
                raise EnvironmentError_(f"Could not run {cmd[0]}: {exc}.") from exc
            self.child_pid = proc.pid
            if self.on_child is not None:
                self.on_child(proc.pid)
            display.start()
            try:
                assert proc.stdout is not None
                for line in proc.stdout:
                    line = scrub(line)       # pip prints index URLs; a login never reaches the log
                    log.write(line)
                    log.flush()          # `tail -f` on the log follows the build
                    display.line(line.rstrip("\n"))
                rc = proc.wait()
            except KeyboardInterrupt as exc:
                stop.note()
                proc.terminate()       # the CLI closes its BuildKit session: the solve is cancelled, nothing tagged
                proc.wait()
                exc.counter = prog.counter  # type: ignore[attr-defined]  # read by run_build
                raise
            finally:
                display.stop()
            log.write(f"# exit {rc} after {time.monotonic() - t0:.1f}s\n")
        dur = time.monotonic() - t0
        if rc != 0 and stop.requested():    # the CLI ended because the run was being stopped: not a failure
            stopped = KeyboardInterrupt()
            stopped.counter = prog.counter  # type: ignore[attr-defined]
            raise stopped
        if rc != 0:
            raise _build_error(name, dur, rc, log_path, prog)
        return BuildResult(dur, str(log_path), len(prog.steps), len(prog.cached), prog.counter)


def _build_error(name: str, dur: float, rc: int, log_path: Path, prog: _Progress) -> BuildError:
    first = prog.first_error_line()
    err = BuildError(f"Building {name} failed after {_fmt_s(dur)} (docker exit {rc})"
                     + (f"; first error: {first[:300]}" if first else "") + f". Full log: {log_path}")
    # keep the excerpt's line breaks (StackError joins whitespace in the one-paragraph message)
    err.excerpt = prog.failure_excerpt()
    err.log_path = str(log_path)
    err.counter = prog.counter
    err.args = (f"{err.args[0]}\n{err.excerpt}",)
    return err


