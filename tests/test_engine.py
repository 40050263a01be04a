"""Engine: BuildKit path detection, command lines, preflight errors, progress parsing (no Docker), and real
builds on the engine (marked docker): a failing build's message, no tag on a broken image, the log file."""
from __future__ import annotations

import json
import os
import stat
import time
import uuid
from pathlib import Path

import pytest

from cudastack.build.executor import Wheelhouse, _preflight_disk
from cudastack.build.wheelhouse import sha256_file
from cudastack.build.context import unpack_patched
from cudastack.core.docker_engine import docker_client
from cudastack.build.engine import BuildKitPath, Engine, _Progress, find_buildkit, resolve_ca_bundle
from cudastack.build.progress import BuildDisplay
from cudastack.core.errors import BuildError, EnvironmentError_, UsageError
from cudastack.plan.planner import make_plan
from cudastack.plan.rules import Resources


def fake_docker(tmp_path: Path, name: str, version: str, buildx: bool) -> str:
    """A stand-in docker client script answering `version` and `buildx version` (the edge of the unit)."""
    p = tmp_path / name / "docker"
    p.parent.mkdir(parents=True)
    bx = ("echo github.com/docker/buildx v0.12.1; exit 0" if buildx
          else "echo 'docker: buildx is not a docker command' >&2; exit 1")
    p.write_text("#!/bin/sh\n"
                 f'if [ "$1" = version ]; then echo {version}; exit 0; fi\n'
                 f'if [ "$1" = buildx ]; then {bx}; fi\n'
                 "exit 1\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_buildkit_prefers_a_client_with_buildx(tmp_path):
    new_nobx = fake_docker(tmp_path, "a", "28.2.2", False)
    with_bx = fake_docker(tmp_path, "b", "27.0.1", True)
    bk = find_buildkit([new_nobx, with_bx])
    assert bk == BuildKitPath(with_bx, "buildx", "27.0.1")


def test_buildkit_falls_back_to_an_old_client_with_docker_buildkit_1(tmp_path):
    new_nobx = fake_docker(tmp_path, "a", "28.2.2", False)
    old = fake_docker(tmp_path, "b", "20.10.24+dfsg1", False)
    bk = find_buildkit([new_nobx, old])
    assert bk.mode == "env" and bk.docker == old


def test_no_buildkit_path_says_what_to_install(tmp_path):
    with pytest.raises(EnvironmentError_) as e:
        find_buildkit([fake_docker(tmp_path, "a", "28.2.2", False)])
    assert "docker-buildx" in str(e.value) and "docker.io" in str(e.value) and "28.2.2" in str(e.value)
    assert e.value.exit_code == 5
    with pytest.raises(EnvironmentError_, match="no docker client"):
        find_buildkit([])


def test_build_command_env_mode_and_buildx_mode():
    eng = Engine(BuildKitPath("/usr/bin/docker", "env", "20.10"), client=None)
    cmd, env = eng.build_command(context="/ctx", dockerfile="/x/wheels.Dockerfile", target="wheels",
                                 build_args={"A": "1 2"}, secrets={"cabundle": "/etc/ca.pem"}, output_dir="/out")
    assert env["DOCKER_BUILDKIT"] == "1"
    assert cmd[:2] == ["/usr/bin/docker", "build"] and cmd[-1] == "/ctx"
    assert "--secret" in cmd and "id=cabundle,src=/etc/ca.pem" in cmd
    assert "--output" in cmd and "type=local,dest=/out" in cmd and "A=1 2" in cmd
    eng = Engine(BuildKitPath("/usr/bin/docker", "buildx", "27.0"), client=None)
    cmd, _ = eng.build_command(context="/ctx", dockerfile="/f", tag="t:1")
    assert cmd[:3] == ["/usr/bin/docker", "buildx", "build"] and "--load" in cmd and "-t" in cmd
    cmd, _ = eng.build_command(context="/ctx", dockerfile="/f", output_dir="/o")
    assert "--load" not in cmd


def test_ca_bundle_resolution(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        resolve_ca_bundle(str(tmp_path / "missing.pem"))
    pem = tmp_path / "ca.pem"
    pem.write_text("x")
    assert resolve_ca_bundle(str(pem)) == str(pem)


def test_no_daemon_says_how_to_start_one(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(EnvironmentError_) as e:
        docker_client()
    assert "dockerd" in str(e.value) and "systemctl start docker" in str(e.value)


SAMPLE_LOG = """#1 [internal] load build definition from wheels.Dockerfile
#1 DONE 0.0s
#5 [builder 2/2] RUN pip wheel ...
#5 CACHED
#6 [builder 3/3] RUN nvcc -c kernel.cu
#6 0.512 compiling kernel.cu
#6 0.900   [1/73] ccache c++ -c flash_api.cpp
#6 1.204 kernel.cu(3): error: identifier "foo" is undefined
#6 1.210 1 error detected
#6 ERROR: process "/bin/sh -c nvcc -c kernel.cu" did not complete successfully: exit code: 2
------
 > [builder 3/3] RUN nvcc -c kernel.cu:
------
failed to solve: process "/bin/sh -c nvcc -c kernel.cu" did not complete successfully: exit code: 2
"""


def test_progress_parser_finds_the_failing_step():
    p = _Progress()
    new_steps = [p.feed(line) for line in SAMPLE_LOG.splitlines()]
    assert sum(new_steps) == 3 and p.cached == {"5"}
    assert p.counter == "1/73"
    ex = p.failure_excerpt()
    assert "failing step: [builder 3/3] RUN nvcc -c kernel.cu" in ex
    assert 'identifier "foo" is undefined' in ex and "failed to solve" in ex



def test_build_display_says_one_status_line_per_step_off_a_terminal():
    said = []
    d = BuildDisplay("node", _Progress(), said.append, time.monotonic(), tty=False)
    for line in SAMPLE_LOG.splitlines():
        d.line(line)
    # three steps start in the sample; BuildKit's [internal] ones are not announced
    assert len(said) == 2 and all(s.startswith("  [node] ") for s in said), said
    assert "[builder 2/2] RUN pip wheel" in said[0] and "[builder 3/3] RUN nvcc -c kernel.cu" in said[1]
    assert "(compiled 1/73) [builder 3/3] RUN nvcc" in d.status()     # the heartbeat's line carries the counter


def test_build_display_on_a_terminal_redraws_one_line_and_clears_it(capsys):
    said = []
    d = BuildDisplay("node", _Progress(), said.append, time.monotonic(), tty=True)
    d.start()
    for line in SAMPLE_LOG.splitlines():
        d.line(line)
    time.sleep(1.3)                      # one heartbeat: the status line redrawn in place
    d.stop()
    err = capsys.readouterr().err
    assert said == [] and "\r\033[K  [node] " in err and err.endswith("\r\033[K")

class _StubEngine:
    """Engine edge for the disk preflight: a data root with a given free space."""

    def __init__(self, free):
        self.free = free

    def root_dir_free_gib(self):
        return "/var/lib/docker", self.free


def test_too_little_disk_is_refused_before_building(tmp_path, monkeypatch):
    import shutil as _shutil
    from collections import namedtuple

    monkeypatch.delenv("CUDASTACK_NO_DISK_CHECK", raising=False)     # the disk check is under test here

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(_shutil, "disk_usage", lambda p: usage(1 << 40, 0, 1 << 40))   # the state dir: plenty
    plan = make_plan(None, "13.1", resources=Resources(2, 24.0))
    cached = {n.name: False for n in plan.nodes}
    with pytest.raises(EnvironmentError_) as e:
        _preflight_disk(_StubEngine(3.0), plan, cached, tmp_path, lambda s: None)
    assert "/var/lib/docker has 3.0 GiB free" in str(e.value) and "prune" in str(e.value)
    assert _preflight_disk(_StubEngine(500.0), plan, cached, tmp_path, lambda s: None) > 10
    assert _preflight_disk(_StubEngine(1.0), plan, {n: True for n in cached}, tmp_path, lambda s: None) == 0


def test_wheelhouse_manifest(tmp_path):
    plan = make_plan(None, "13.1", resources=Resources(2, 24.0))
    node = plan.node("flashinfer")
    wh = Wheelhouse(tmp_path / "wh")
    assert not wh.has(node)
    exported = tmp_path / "export"
    exported.mkdir()
    (exported / "flashinfer_python-0.7.2-py3-none-any.whl").write_bytes(b"wheel bytes")
    digests = wh.add(node, exported)
    assert wh.has(node, verify=True)
    assert digests == {"flashinfer_python-0.7.2-py3-none-any.whl": sha256_file(wh.path / "flashinfer_python-0.7.2-py3-none-any.whl")}
    assert json.loads(wh.manifest_path.read_text())["nodes"]["flashinfer"]["hash"] == node.hash
    (wh.path / "flashinfer_python-0.7.2-py3-none-any.whl").write_bytes(b"tampered")
    assert wh.has(node) and not wh.has(node, verify=True)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(BuildError, match="exported no wheel"):
        wh.add(plan.node("sgl-kernel"), empty)


# ------------------------------------------------------------------------------- real engine
docker_only = pytest.mark.docker


@docker_only
def test_real_build_failure_shows_the_step_and_leaves_no_tag(tmp_path):
    eng = Engine.connect()
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "present.txt").write_text("hello\n")
    df = tmp_path / "Dockerfile"
    df.write_text("FROM scratch\nCOPY present.txt /present.txt\nCOPY missing-file.txt /missing.txt\n")
    tag = f"cudastack-test/engine-fail:{uuid.uuid4().hex[:8]}"
    log = tmp_path / "logs" / "fail.log"
    with pytest.raises(BuildError) as e:
        eng.build(name="fail-node", log_path=log, say=lambda s: None, context=str(ctx), dockerfile=str(df), tag=tag)
    assert str(log) in str(e.value) and "missing-file.txt" in str(e.value)
    assert e.value.exit_code == 6
    assert not eng.exists(tag)
    assert "missing-file.txt" in log.read_text()
    assert eng.builds_issued == 1


@docker_only
def test_real_build_success_tags_and_exports(tmp_path):
    eng = Engine.connect()
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    (ctx / "a.whl").write_text(uuid.uuid4().hex)
    df = tmp_path / "Dockerfile"
    df.write_text("FROM scratch AS builder\nCOPY a.whl /wheels/a.whl\nFROM scratch AS wheels\nCOPY --from=builder /wheels/ /\n")
    tag = f"cudastack-test/engine-ok:{uuid.uuid4().hex[:8]}"
    lines = []
    out = tmp_path / "out, with a comma and a \"quote\""    # one CSV field for BuildKit: quoted by output_spec
    r = eng.build(name="ok", log_path=tmp_path / "ok.log", say=lines.append, context=str(ctx), dockerfile=str(df),
                  target="wheels", output_dir=str(out))
    assert (out / "a.whl").read_text() == (ctx / "a.whl").read_text()
    eng.build(name="ok", log_path=tmp_path / "ok.log", say=lines.append, context=str(ctx), dockerfile=str(df),
              target="builder", tag=tag)
    try:
        assert eng.exists(tag) and eng.inspect(tag)["id"].startswith("sha256:")
        assert r.duration_s > 0 and any("[ok]" in s for s in lines)
    finally:
        eng.client.images.remove(tag, force=True)
    assert os.path.getsize(tmp_path / "ok.log") > 0


def test_patched_sdist_unpacks_and_refuses_a_stale_patch(tmp_path):
    import tarfile

    src = tmp_path / "pkg-1.0"
    src.mkdir()
    (src / "setup.py").write_text('flags = ["-O3", "-std=c++17"]\n')
    archive = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(src, arcname="pkg-1.0")
    out = tmp_path / "ctx"
    out.mkdir()
    unpack_patched(archive, out / "src", [{"file": "setup.py", "replace": "-std=c++17", "with": "-std=c++20"}])
    assert (out / "src" / "setup.py").read_text() == 'flags = ["-O3", "-std=c++20"]\n'
    with pytest.raises(BuildError, match="matches nothing"):
        unpack_patched(archive, out / "src2", [{"file": "setup.py", "replace": "-std=c++14", "with": "x"}])
    assert not (out / "src2").exists()


@docker_only
def test_real_build_interrupted_by_sigterm_is_cancelled_and_untagged(tmp_path):
    """SIGTERM during a build (as when a session or CI job is stopped): the docker build is cancelled,
    nothing is tagged, and the caller sees KeyboardInterrupt (which run_build records as 'interrupted')."""
    import signal
    import subprocess
    import sys
    import time

    from cudastack.osimage.bootstrap import bootstrap_os_image

    bootstrap_os_image("bookworm", tag="cudastack-test/debian:bookworm")
    df = tmp_path / "Dockerfile"
    df.write_text(f"FROM cudastack-test/debian:bookworm\nRUN echo {uuid.uuid4().hex} && sleep 300\n")
    ctx = tmp_path / "ctx"
    ctx.mkdir()
    tag = f"cudastack-test/engine-interrupt:{uuid.uuid4().hex[:8]}"
    script = (
        "import signal, sys\n"
        "from cudastack.build.engine import Engine\n"
        "from cudastack.jobs.build import _sigterm_as_interrupt\n"
        "_sigterm_as_interrupt()\n"
        "try:\n"
        f"    Engine.connect().build(name='sleepy', log_path={str(tmp_path / 'i.log')!r}, say=print, "
        f"context={str(ctx)!r}, dockerfile={str(df)!r}, tag={tag!r})\n"
        "except KeyboardInterrupt:\n"
        "    print('INTERRUPTED'); sys.exit(3)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = tmp_path / "i.log"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not (log.exists() and "sleep 300" in log.read_text(errors="replace")):
        time.sleep(1)                                   # the engine flushes each log line as it comes
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3 and "INTERRUPTED" in out, out
    assert not Engine.connect().exists(tag)


def test_build_network_comes_from_the_environment_only_when_set(monkeypatch):
    eng = Engine(BuildKitPath("/usr/bin/docker", "buildx", "27.0"), client=None)
    monkeypatch.delenv("CUDASTACK_BUILD_NETWORK", raising=False)
    cmd, _ = eng.build_command(context="/ctx", dockerfile="/f", tag="t:1")
    assert "--network" not in cmd
    monkeypatch.setenv("CUDASTACK_BUILD_NETWORK", "host")
    cmd, _ = eng.build_command(context="/ctx", dockerfile="/f", tag="t:1")
    assert cmd[cmd.index("--network") + 1] == "host"


def test_engine_endpoint_follows_the_cli_order(tmp_path, monkeypatch):
    """DOCKER_HOST, then DOCKER_CONTEXT, then config.json's currentContext, then the default context: the
    order the docker CLI uses, read from a DOCKER_CONFIG written here (context metadata as the CLI stores it)."""
    import hashlib
    import json

    from cudastack.core.docker_engine import engine_endpoint
    from cudastack.core.errors import EnvironmentError_

    for name, sock in (("one", "/tmp/one.sock"), ("two", "/tmp/two.sock")):
        meta = tmp_path / "contexts" / "meta" / hashlib.sha256(name.encode()).hexdigest()
        meta.mkdir(parents=True)
        (meta / "meta.json").write_text(json.dumps({"Name": name, "Metadata": {},
                                                    "Endpoints": {"docker": {"Host": f"unix://{sock}"}}}))
    (tmp_path / "config.json").write_text(json.dumps({"currentContext": "one"}))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    assert engine_endpoint().url == "unix:///tmp/one.sock"
    monkeypatch.setenv("DOCKER_CONTEXT", "two")
    assert engine_endpoint().url == "unix:///tmp/two.sock" and "DOCKER_CONTEXT" in engine_endpoint().source
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:2375")
    assert engine_endpoint().source == "DOCKER_HOST=tcp://127.0.0.1:2375"
    monkeypatch.delenv("DOCKER_HOST")
    monkeypatch.setenv("DOCKER_CONTEXT", "gone")
    with pytest.raises(EnvironmentError_, match="docker context 'gone'.*docker context ls"):
        engine_endpoint()
    monkeypatch.delenv("DOCKER_CONTEXT")
    (tmp_path / "config.json").write_text("{}")
    assert engine_endpoint().kwargs == {} and engine_endpoint().source == "the default context"
