"""benchmarks/cold_builder.py makes its stack's cold run cold: every BuildKit build-cache record but the cache
mounts is removed first (``prune_layer_records``), so a rebuild runs every RUN step again while apt's and pip's
downloads stay. Run on a second, empty dockerd (never on the engine the suite builds with: its layer cache would
go), with the fixture's OS image loaded into it.
"""
from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from test_builder_integration import second_dockerd  # noqa: F401 - the fixture: a second, empty dockerd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

pytestmark = [pytest.mark.docker]

OS_IMAGE = "cudastack-test/debian:bookworm"
DOCKERFILE = f"""FROM {OS_IMAGE}
RUN --mount=type=cache,target=/var/cache/probe (cat /var/cache/probe/mark || echo none) > /seen \
    && echo kept > /var/cache/probe/mark
RUN echo two > /two
"""


def _build(sock, ctx: Path) -> str:
    """``docker build`` (BuildKit) in the second engine; returns its output, where ``CACHED`` marks a served step."""
    out = subprocess.run(["docker", "-H", f"unix://{sock}", "build", "--progress", "plain", "-t", "probe:1",
                          str(ctx)], capture_output=True, text=True, env={"DOCKER_BUILDKIT": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stderr + out.stdout


def test_prune_layer_records_keeps_mounts_and_makes_the_next_build_run_every_step(engine, second_dockerd,  # noqa: F811
                                                                                  tmp_path):
    import docker

    from cold_builder import prune_build_cache_since, prune_layer_records

    if not engine.exists(OS_IMAGE):
        pytest.skip(f"{OS_IMAGE} is made by the fixture chain's tests (mmdebstrap); not here")
    _, sock = second_dockerd
    save = subprocess.Popen(["docker", "save", OS_IMAGE], stdout=subprocess.PIPE)
    subprocess.run(["docker", "-H", f"unix://{sock}", "load"], stdin=save.stdout, check=True, capture_output=True)
    assert save.wait() == 0
    (tmp_path / "Dockerfile").write_text(DOCKERFILE)
    client = docker.DockerClient(base_url=f"unix://{sock}")
    _build(sock, tmp_path)
    assert "CACHED" in _build(sock, tmp_path)          # a rebuild is served by BuildKit's records

    # the failing twin: records selected by a time after all of them: nothing goes, the rebuild is still cached
    assert prune_build_cache_since(client, datetime.now(timezone.utc) + timedelta(hours=1)) == 0
    assert "CACHED" in _build(sock, tmp_path)

    records = client.api.df()["BuildCache"]
    mounts = {r["ID"] for r in records if r.get("Type") == "exec.cachemount"}
    assert mounts and len(records) > len(mounts)
    removed = prune_layer_records(client)
    left = client.api.df()["BuildCache"] or []
    assert removed > 0
    assert {r["ID"] for r in left} == mounts, [(r["Type"], r["Description"]) for r in left]
    log = _build(sock, tmp_path)
    assert "CACHED" not in log, log[-1500:]             # every step ran again
    out = subprocess.run(["docker", "-H", f"unix://{sock}", "run", "--rm", "--network", "none", "probe:1", "cat",
                          "/seen", "/two"], capture_output=True, text=True)
    assert out.stdout.split() == ["kept", "two"], out.stderr      # the step ran again, with the mount it had
    client.close()
