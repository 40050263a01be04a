"""The test suite knows its footprint (issue: 19 GB of caches and 17 images kept, no preflight, and a full disk
read as 132 network failures), and the fast lane catches a test that needs a service without its marker.

* `scripts/test_footprint.py preflight` refuses (exit 5) when a place the run writes has less than the need
  free, naming the place, its free GiB and the figure; the twin passes on a place with room.
* `after` reports a full disk as a full disk: on a 64 MiB tmpfs filled to the brim it says THE DISK FILLED.
* `clean` removes the test cache folder and only images under the tests' prefix.
* The fast lane's guard (tests/fast_lane.py): an unmarked test that connects to the internet or to Docker fails
  with the marker it lacks; a marked one is not run; a test that needs neither passes.
* `scripts/dev.sh` installs each package once ("installing docker.io docker.io") and stops the dockerd it started.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import textwrap
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOOTPRINT = [sys.executable, str(ROOT / "scripts" / "test_footprint.py")]


@pytest.fixture
def tiny_fs(tmp_path):
    where = tmp_path / "tiny"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield where
    subprocess.run(["umount", str(where)], check=False)


def _run(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([*FOOTPRINT, *args], capture_output=True, text=True, timeout=120, env={**os.environ, **env})


def test_preflight_refuses_a_small_disk_naming_place_and_figure(tiny_fs, tmp_path):
    env = {"TMPDIR": str(tiny_fs), "CUDASTACK_TEST_CACHE": str(tiny_fs / "cache")}
    r = _run("preflight", "--fast", env=env)
    assert r.returncode == 5, r.stderr
    assert f"temporary folder at {tiny_fs}: 0.1 GiB free, the fast lane needs about 2 GiB" in r.stderr
    assert "bash scripts/dev.sh clean-tests" in r.stderr
    ok = _run("preflight", "--fast", env={"TMPDIR": str(tmp_path), "CUDASTACK_TEST_DISK_GIB": "0.01"})
    assert ok.returncode == 0, ok.stderr


def test_after_reports_a_full_disk_as_full(tiny_fs):
    env = {"TMPDIR": str(tiny_fs)}
    calm = _run("after", "--fast", env=env)
    assert calm.returncode == 0 and "THE DISK FILLED" not in calm.stderr, calm.stderr
    # fill it as a download would: write until the kernel says ENOSPC
    with open(tiny_fs / "fill", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 2**20)
        except OSError:
            pass
    full = _run("after", "--fast", env=env)
    assert full.returncode == 1, full.stderr
    assert "THE DISK FILLED during the tests" in full.stderr and "Connection interrupted" in full.stderr


@pytest.mark.docker
def test_clean_removes_the_cache_folder_and_only_the_tests_images(tmp_path, docker_engine_scratch):
    client, made = docker_engine_scratch
    images = client.images.list()
    if not images:
        pytest.skip("no image on this engine to tag")        # (CI mode turns this into a failure)
    prefix = f"cudastack-test-clean-{uuid.uuid4().hex[:8]}"
    ours, other = f"{prefix}/x:1", f"{prefix}-other/x:1"
    images[0].tag(f"{prefix}/x", "1")
    images[0].tag(f"{prefix}-other/x", "1")
    made += [ours, other]
    cache = tmp_path / "cache"
    (cache / "pip").mkdir(parents=True)
    (cache / "pip" / "blob").write_bytes(b"x" * 4096)
    r = _run("clean", env={"CUDASTACK_TEST_CACHE": str(cache), "CUDASTACK_TEST_IMAGE_PREFIX": prefix})
    assert r.returncode == 0, r.stderr
    assert not cache.exists() and f"removed 1 test image tag(s) ({prefix}/...)" in r.stdout, r.stdout
    tags = {t for img in client.images.list() for t in img.tags}
    assert ours not in tags and other in tags


GUARDED = textwrap.dedent('''
    import socket
    import pytest

    def test_unmarked_reaches_the_internet():
        socket.create_connection(("151.101.0.223", 443), timeout=5)       # pypi.org's address

    def test_unmarked_reaches_docker():
        import docker
        docker.from_env().ping()

    @pytest.mark.network
    def test_marked_reaches_the_internet():
        socket.create_connection(("151.101.0.223", 443), timeout=5)

    def test_needs_nothing(tmp_path):
        (tmp_path / "f").write_text("ok")
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        socket.create_connection(srv.getsockname(), timeout=5).close()   # loopback stays allowed
''')


def test_the_fast_lane_fails_a_test_that_needs_a_service_without_its_marker(tmp_path):
    (tmp_path / "test_guarded.py").write_text(GUARDED)
    env = {**os.environ, "CUDASTACK_FAST_LANE": "1", "PYTHONPATH": str(ROOT / "tests"), "CUDASTACK_REQUIRE_ALL": "1"}
    env.pop("DOCKER_HOST", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "fast_lane", "-p", "no:cacheprovider", "-q", "-rA",
                        "-m", "not docker and not registry and not network and not gpu and not stack",
                        str(tmp_path / "test_guarded.py")], capture_output=True, text=True, timeout=300, env=env,
                       cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "FAILED test_guarded.py::test_unmarked_reaches_the_internet" in out
    assert "carries no network (or registry) marker" in out
    assert "FAILED test_guarded.py::test_unmarked_reaches_docker" in out and "fast-lane-no-docker" in out
    assert "PASSED test_guarded.py::test_needs_nothing" in out
    assert "test_marked_reaches_the_internet" not in out.split("short test summary")[-1]
    assert "2 failed, 1 passed, 1 deselected" in out, out[-800:]
    # the twin: off the fast lane the guard does nothing (the unmarked internet test is not failed by it)
    off = subprocess.run([sys.executable, "-m", "pytest", "-p", "fast_lane", "-p", "no:cacheprovider", "-q",
                          str(tmp_path / "test_guarded.py"), "-k", "needs_nothing"], capture_output=True, text=True,
                         timeout=300, env={**env, "CUDASTACK_FAST_LANE": "0"}, cwd=tmp_path)
    assert off.returncode == 0, off.stdout[-800:]


def test_the_network_lane_fails_a_network_test_that_reaches_docker_without_its_marker(tmp_path):
    """The network lane (CUDASTACK_NETWORK_LANE=1) runs beside the Docker lane: a test there that reaches the
    engine fails naming the docker marker; the internet stays reachable for it (only checked as not refused by the
    guard: the marked internet test is deselected here, so no connection leaves this host)."""
    (tmp_path / "test_guarded.py").write_text(GUARDED)
    env = {**os.environ, "CUDASTACK_NETWORK_LANE": "1", "PYTHONPATH": str(ROOT / "tests")}
    env.pop("DOCKER_HOST", None)
    env.pop("CUDASTACK_FAST_LANE", None)
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "fast_lane", "-p", "no:cacheprovider", "-q", "-rA",
                        "-k", "reaches_docker or needs_nothing", str(tmp_path / "test_guarded.py")],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "FAILED test_guarded.py::test_unmarked_reaches_docker" in out and "fast-lane-no-docker" in out
    assert "carries no docker marker" in out and "it needs the docker marker" in out
    assert "PASSED test_guarded.py::test_needs_nothing" in out
    # the twin: without the lane's variable the guard leaves DOCKER_HOST alone
    env_off = {**env, "CUDASTACK_NETWORK_LANE": "0", "DOCKER_HOST": "unix:///nonexistent/elsewhere.sock"}
    off = subprocess.run([sys.executable, "-m", "pytest", "-p", "fast_lane", "-p", "no:cacheprovider", "-q", "-rA",
                          "-k", "reaches_docker", str(tmp_path / "test_guarded.py")], capture_output=True, text=True,
                         timeout=300, env=env_off, cwd=tmp_path)
    text = off.stdout + off.stderr
    assert "FAILED test_guarded.py::test_unmarked_reaches_docker" in text      # no engine at elsewhere.sock
    assert "network lane" not in text and "fast-lane-no-docker" not in text and "docker marker" not in text


def test_dev_sh_names_each_package_once():
    text = (ROOT / "scripts" / "dev.sh").read_text()
    start, end = text.index("need_pkgs=()"), text.index("python3 -c 'import venv, ensurepip'")
    # every check fails on an empty PATH: each package must be listed once
    script = ("set -uo pipefail\nfast=0\ncommand() { return 1; }\n" + text[start:end]
              + 'printf "%s\\n" "${need_pkgs[@]}"\n')
    r = subprocess.run(["/bin/bash", "-c", script], capture_output=True, text=True, timeout=60,
                       env={"PATH": "/nonexistent", "HOME": "/nonexistent"})
    pkgs = r.stdout.split()
    assert "docker.io" in pkgs and len(pkgs) == len(set(pkgs)), pkgs


def test_dev_sh_takes_a_zombie_dockerd_as_stopped():
    """A daemon that exited but is not reaped yet (the shell is busy in its EXIT trap; seen under load in a CI run:
    'still runs 30 s after SIGTERM' for a stand-in that had exited) is stopped: ``kill -0`` alone answers yes for
    a zombie. A Python parent that does not reap its exited child holds the zombie here."""
    text = (ROOT / "scripts" / "dev.sh").read_text()
    funcs = text[text.index("dockerd_pid=\n"):text.index("trap stop_dockerd EXIT")]
    holder = subprocess.Popen([sys.executable, "-c", "import os, time\npid = os.fork()\nif pid == 0:\n    os._exit(0)\n"
                               "print(pid, flush=True)\ntime.sleep(60)\n"], stdout=subprocess.PIPE, text=True)
    try:
        zombie = int(holder.stdout.readline())
        time.sleep(0.5)
        assert "Z" in Path(f"/proc/{zombie}/status").read_text().split("State:")[1].split()[0]
        script = ("log() { printf '[setup] %s\\n' \"$*\" >&2; }\nkeep_dockerd=0\n" + funcs
                  + f"dockerd_pid={zombie}\nstop_dockerd\n")
        t0 = time.monotonic()
        r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
        assert time.monotonic() - t0 < 10 and "still runs" not in r.stderr, r.stderr
    finally:
        holder.kill()
        holder.wait()


def test_dev_sh_stops_the_dockerd_it_started_and_keeps_it_on_request(tmp_path):
    """The EXIT trap of dev.sh with a stand-in daemon (a sleep started the same way): stopped by default;
    kept with --keep-dockerd, with the command that stops it."""
    text = (ROOT / "scripts" / "dev.sh").read_text()
    start, end = text.index("dockerd_pid=\n"), text.index("trap stop_dockerd EXIT")
    funcs = text[start:end]
    for keep, stopped in (("0", True), ("1", False)):
        script = ("log() { printf '[setup] %s\\n' \"$*\" >&2; }\n" + f"keep_dockerd={keep}\n" + funcs
                  + "trap stop_dockerd EXIT\nnohup sleep 300 >/dev/null 2>&1 &\ndockerd_pid=$!\necho $dockerd_pid\n")
        r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
        pid = int(r.stdout.split()[0])
        alive = Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
        try:
            assert alive is not stopped, (keep, r.stderr)
            if not stopped:
                assert f"stop it with 'kill {pid}'" in r.stderr, r.stderr
            else:
                assert "stopping the dockerd this script started" in r.stderr, r.stderr
        finally:
            if alive:
                os.kill(pid, 15)


def test_a_warm_cache_is_taken_off_the_need(tmp_path):
    """The full run's need (caches + images + headroom) counts the caches a previous run left: a warm cache of 3 GiB
    asks 3 GiB less than an empty one."""
    cold = tmp_path / "cold"
    cold.mkdir()
    warm = tmp_path / "warm"
    warm.mkdir()
    with open(warm / "wheel.bin", "wb") as f:
        f.truncate(3 * 2**30)    # sparse: its size counts, not its blocks
    def need(cache):
        r = _run("preflight", env={"CUDASTACK_TEST_CACHE": str(cache), "TMPDIR": str(tmp_path)})
        line = next(ln for ln in r.stderr.splitlines() if "test caches" in ln)
        return float(line.rsplit("needs about ", 1)[1].split(" GiB")[0])
    assert need(cold) - need(warm) == pytest.approx(3.0, abs=0.01)
