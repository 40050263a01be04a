"""--builder for real: a second Docker engine on its own socket, data root and bridge (started here, as root), a
docker context for it, which buildx lists as a builder of the docker driver, and the fixture chain's source node
(the CUDA extension, nvcc for 12.0) sent there. Its wheel comes back into this run's wheelhouse, the local
engine gets the node's tag (a marker image labelled with the builder), and the second engine did the compile.
Before that, a parent image the builder's engine lacks is a one-paragraph error naming the fix.

Needs root, dockerd and the docker buildx plugin: either on the docker CLI already, or a docker-buildx binary
named by CUDASTACK_TEST_BUILDX (the test then points DOCKER_CONFIG at a folder of its own holding it)."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from cudastack.core.errors import UsageError

pytestmark = [pytest.mark.docker, pytest.mark.network]

FIXTURES = Path(__file__).parent / "fixtures"
PREFIX = "cudastack-test"


def _sh(*cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, check=check, **kw)


@pytest.fixture(scope="module")
def buildx_config(tmp_path_factory):
    """DOCKER_CONFIG with the buildx plugin (when it comes from CUDASTACK_TEST_BUILDX); skip when none."""
    plugin = os.environ.get("CUDASTACK_TEST_BUILDX", "")
    saved = os.environ.get("DOCKER_CONFIG")
    if plugin:
        cfg = tmp_path_factory.mktemp("dockercfg")
        (cfg / "cli-plugins").mkdir()
        shutil.copy2(plugin, cfg / "cli-plugins" / "docker-buildx")
        os.environ["DOCKER_CONFIG"] = str(cfg)
    if _sh("docker", "buildx", "version", check=False).returncode != 0:
        pytest.skip("no docker buildx plugin (set CUDASTACK_TEST_BUILDX to a docker-buildx binary)")
    yield os.environ.get("DOCKER_CONFIG", "")
    if saved is None:
        os.environ.pop("DOCKER_CONFIG", None)
    else:
        os.environ["DOCKER_CONFIG"] = saved


@pytest.fixture(scope="module")
def second_dockerd():
    """A second dockerd (own socket, data root, exec root, containerd namespace and bridge); yields (a short
    name for it, socket). Everything is removed afterwards."""
    if os.geteuid() != 0 or not shutil.which("dockerd") or not shutil.which("ip"):
        pytest.skip("needs root, dockerd and ip to start a second engine")
    # Its own bridge, never `--bridge none`: a dockerd started with the bridge disabled deletes the host's
    # `docker0` link (the other engine's default bridge), which breaks every container and RUN step there.
    had_docker0 = _sh("ip", "link", "show", "docker0", check=False).returncode == 0
    tag = f"cst{os.getpid() % 100000}"
    root = Path(tempfile.mkdtemp(prefix="cst-", dir="/tmp"))   # short: a unix socket path has a length limit
    sock = root / "sock"
    bridge = f"{tag}br"
    _sh("ip", "link", "add", bridge, "type", "bridge")
    proc = None
    try:
        _sh("ip", "addr", "add", "172.31.251.1/24", "dev", bridge)
        _sh("ip", "link", "set", bridge, "up")
        log = open(root / "dockerd.log", "w")
        proc = subprocess.Popen(["dockerd", "--data-root", str(root / "data"), "--exec-root", str(root / "exec"),
                                 "--host", f"unix://{sock}", "--pidfile", str(root / "pid"), "--bridge", bridge,
                                 "--iptables=false", "--ip-masq=false", "--containerd-namespace", tag,
                                 "--containerd-plugins-namespace", f"{tag}-p"],
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(60):
            if _sh("docker", "-H", f"unix://{sock}", "info", check=False).returncode == 0:
                break
            time.sleep(1)
        else:
            pytest.fail(f"the second dockerd did not start: {(root / 'dockerd.log').read_text()[-2000:]}")
        yield tag, sock
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        _sh("ip", "link", "del", bridge, check=False)
        _sh("umount", "-R", str(root / "exec"), check=False)
        shutil.rmtree(root, ignore_errors=True)
        if had_docker0:
            assert _sh("ip", "link", "show", "docker0", check=False).returncode == 0, \
                "the second engine removed the host's docker0 bridge"


@pytest.fixture(scope="module")
def second_engine(buildx_config, second_dockerd):
    """The second dockerd and a docker context for it (in buildx_config's DOCKER_CONFIG); yields (context name,
    socket)."""
    tag, sock = second_dockerd
    _sh("docker", "context", "create", tag, "--docker", f"host=unix://{sock}")
    try:
        yield tag, sock
    finally:
        _sh("docker", "context", "rm", "-f", tag, check=False)


def test_docker_context_use_moves_build_and_inspect_together(second_dockerd, tmp_path, monkeypatch):
    """`docker context use` to the second engine (in a DOCKER_CONFIG of this test's own, so no other docker
    client on the host is moved): the build (docker CLI) and the cache check / inspect (docker SDK, through
    cudastack.core.docker_engine) both land there; `docker context use default` brings both back."""
    from cudastack.core.docker_engine import engine_endpoint
    from cudastack.build.engine import Engine

    name, sock = second_dockerd
    cfg = tmp_path / "dockercfg"
    plugins = Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "cli-plugins"
    if plugins.is_dir():
        shutil.copytree(plugins, cfg / "cli-plugins")      # the buildx plugin, where the host's CLI has one
    cfg.mkdir(exist_ok=True)
    monkeypatch.setenv("DOCKER_CONFIG", str(cfg))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.delenv("DOCKER_CONTEXT", raising=False)
    _sh("docker", "context", "create", name, "--docker", f"host=unix://{sock}")
    _sh("docker", "context", "use", name)
    assert engine_endpoint().url == f"unix://{sock}" and f"docker context '{name}'" in engine_endpoint().source

    src = tmp_path / "ctx"
    src.mkdir()
    (src / "marker").write_text(f"{name}\n")
    (src / "Dockerfile").write_text("FROM scratch\nCOPY marker /marker\n")
    tag = f"{PREFIX}/context-agree:{name}"
    engine = Engine.connect()
    assert not engine.exists(tag)
    engine.build(name="context-agree", log_path=tmp_path / "build.log", context=str(src),
                 dockerfile=str(src / "Dockerfile"), tag=tag, say=lambda s: None)
    # the SDK sees what the CLI built, on the second engine, and the CLI agrees on its id
    cli_id = _sh("docker", "image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
    assert engine.exists(tag) and engine.inspect(tag)["id"] == cli_id
    assert _sh("docker", "-H", f"unix://{sock}", "image", "inspect", tag, check=False).returncode == 0
    # the host's default engine was not touched
    _sh("docker", "context", "use", "default")
    back = Engine.connect()
    assert not back.exists(tag), "the build landed on the default engine"
    assert _sh("docker", "image", "inspect", tag, check=False).returncode != 0


def test_unknown_builder_is_a_usage_error_before_any_build(buildx_config):
    from cudastack.build.builders import inspect_builder

    with pytest.raises(UsageError) as exc:
        inspect_builder("no-such-builder-cst")
    msg = str(exc.value)
    assert "buildx has no builder of that name" in msg and "docker context create" in msg and "\n" not in msg


def test_source_node_builds_on_the_second_engine_and_its_wheel_lands_here(second_engine, tmp_path):
    from cudastack.build.executor import run_build
    from cudastack.build.builders import check_parents, inspect_builder
    from cudastack.build.engine import Engine
    from cudastack.plan.planner import make_plan
    from cudastack.plan.rules import host_resources
    from stackprobe.coverage import read_elf

    ctx, sock = second_engine
    builder = inspect_builder(ctx)
    assert builder.driver == "docker" and builder.endpoint == ctx
    engine = Engine.connect()
    assert engine.buildkit.mode == "buildx"
    plan = make_plan(FIXTURES / "recipes", "13.1", resources=host_resources(), prefix=PREFIX, skip=["runtime"])
    base, ext = plan.node("base"), plan.node("cuda-ext")
    state = tmp_path / "state"
    run_build(make_plan(FIXTURES / "recipes", "13.1", resources=host_resources(), prefix=PREFIX,
                        skip=["runtime", "cuda-ext"]), state_dir=state, engine=engine, say=lambda s: None)
    # the builder's engine lacks the parent: one paragraph that says how to load it, before any build
    with pytest.raises(UsageError) as exc:
        check_parents(builder, plan, "source", docker=engine.buildkit.docker)
    assert base.tag in str(exc.value) and f"docker --context {ctx} load" in str(exc.value)
    save = subprocess.Popen(["docker", "save", base.tag], stdout=subprocess.PIPE)
    _sh("docker", "-H", f"unix://{sock}", "load", stdin=save.stdout)
    assert save.wait() == 0
    assert "parents present" in check_parents(builder, plan, "source", docker=engine.buildkit.docker)[0]

    if engine.exists(ext.tag):        # an earlier local build of the same node would make it "cached"
        engine.client.images.remove(ext.tag, force=True)
    lines: list[str] = []
    record = run_build(plan, state_dir=state, engine=engine, say=lines.append, builder=builder,
                       builder_nodes="source")
    entry = next(n for n in record["nodes"] if n["name"] == "cuda-ext")
    assert entry["status"] == "built" and entry["builder"] == ctx
    assert any(f"on builder {ctx}" in s for s in lines)
    (wheel, digest), = entry["wheels"].items()
    whl = state / plan.wheelhouse / wheel
    assert whl.is_file()
    so = tmp_path / "ext.so"
    with zipfile.ZipFile(whl) as z:
        so.write_bytes(z.read(next(n for n in z.namelist() if n.endswith(".so"))))
    assert {i.name for i in read_elf(str(so)) if i.kind == "sass"} == {"sm_120"}
    # here: the node's tag, a marker naming the builder; there: the compile (its build cache holds the stage)
    labels = engine.client.images.get(ext.tag).labels
    assert labels["org.cudastack.builder"] == ctx and labels["org.cudastack.hash"] == ext.hash
    du = _sh("docker", "-H", f"unix://{sock}", "system", "df", "--format", "{{.Type}} {{.TotalCount}}").stdout
    assert any(line.startswith("Build Cache") and int(line.split()[-1]) > 0 for line in du.splitlines()), du
    # a second run finds it cached (tag here, wheel in the wheelhouse): no build is issued anywhere
    again = run_build(plan, state_dir=state, engine=engine, say=lambda s: None, builder=builder)
    assert again["docker_builds"] == 0
    engine.client.images.remove(ext.tag, force=True)


def test_builder_flag_bad_input_exits_2_before_any_build(tmp_path):
    """Through invoke as a user runs it: exit 2 and one paragraph, with or without the buildx plugin (no plugin:
    it says to install one; plugin: no builder of that name), and no build record written."""
    import sys

    root = Path(__file__).resolve().parent.parent
    p = subprocess.run([sys.executable, "-m", "invoke", "-r", str(root), "build", "--cuda", "13.1", "--recipes",
                        str(FIXTURES / "recipes"), "--prefix", PREFIX, "--state-dir", str(tmp_path / "state"),
                        "--builder", "no-such-builder-cst"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 2, p.stderr
    assert ("buildx has no builder of that name" in p.stderr or "needs the docker buildx plugin" in p.stderr), p.stderr
    assert "Nothing was built." in p.stderr
    assert not (tmp_path / "state" / "records").exists()
