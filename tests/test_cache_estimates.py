"""The dry run's time each way (cudastack.plan.cache_estimates): a node to build is expected at a past build's duration at
the same hash (else its unit-cost estimate, else "no estimate" and why), a node in the registry node cache at its
manifest's compressed size over a measured or configured pull rate (else "size only").

Pure parts read build records written here; the real part fills a Debian docker-registry on loopback with the small
chain of tests/test_node_cache.py, empties the engine and reads the dry run: the nodes in the registry show their
digest, their manifest's size (checked against the manifest fetched over plain HTTP) and, once a pull was measured,
the time at that rate; a node the registry lacks shows its build estimate from the record of its build.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import requests

from cudastack.plan import cache_estimates as E
from cudastack.core.errors import RegistryError, UsageError
from registry_server import docker_config, registry_server  # noqa: F401
from test_node_cache import _big_layer_image, cleanup, empty_engine, small_plan  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
H = "ab" * 32


def _record(folder: Path, run: str, nodes: list, *, prefix: str = "", tc: str = "9.9") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    rec = {"format": 1, "run_id": run, "host": "big-host", "nodes": nodes}
    if prefix:
        rec["cache"] = {"prefix": prefix, "read_only": False}
    p = folder / f"build-cu{tc}-{run}.json"
    p.write_text(json.dumps(rec))
    return p


def _node(kind="image", method="", h=H):
    return SimpleNamespace(name="n", kind=kind, method=method, hash=h)


# ------------------------------------------------------------------------------------------ past builds
def test_a_past_build_at_the_same_hash_is_the_estimate_and_the_newest_wins(tmp_path):
    recs = tmp_path / "records"
    _record(recs, "20260101T000000.00Z", [{"hash": H, "status": "built", "duration_s": 100.0}])
    _record(recs, "20260301T000000.00Z", [{"hash": H, "status": "built", "duration_s": 754.2, "builder": "big"}],
            tc="13.1")
    secs, text = E.build_expectation(_node(), E.read_history(recs), None)
    assert secs == 754.2
    assert text.startswith("about 12 min 34 s: built in that time at this hash in run 20260301T000000.00Z on host "
                           "big-host, builder big (") and "build-cu13.1-20260301T000000.00Z.json" in text
    # another hash is no basis
    secs, text = E.build_expectation(_node(h="cd" * 32), E.read_history(recs), None)
    assert secs is None and "no past build of this hash" in text and "2 record(s) read" in text


@pytest.mark.parametrize("bad", ["754", -5, 0, True, None, float("nan")])
def test_a_wrong_duration_in_the_record_gives_no_estimate(tmp_path, bad):
    recs = tmp_path / "records"
    path = _record(recs, "20260101T000000.00Z", [{"hash": H, "status": "built", "duration_s": bad}])
    secs, text = E.build_expectation(_node(), E.read_history(recs), None)
    assert secs is None and text.startswith("no estimate (")
    assert f"{path.name} says it was built in {bad!r} s, not a positive number of seconds: not used" in text
    assert "no unit-cost estimate for an image node" in text


def test_a_node_that_was_not_built_is_no_basis(tmp_path):
    recs = tmp_path / "records"
    _record(recs, "20260101T000000.00Z", [{"hash": H, "status": s, "duration_s": 50.0}
                                          for s in ("failed", "skipped", "pulled", "interrupted")])
    secs, text = E.build_expectation(_node(), E.read_history(recs), None)
    assert secs is None and "no past build of this hash" in text


def test_an_unreadable_or_missing_record_gives_no_estimate_and_says_so(tmp_path):
    recs = tmp_path / "records"
    recs.mkdir()
    (recs / "build-cu9.9-20260101T000000.00Z.json").write_text('{"nodes": [{"hash": "' + H + '", "status": "bu')
    (recs / "build-cu9.9-20260102T000000.00Z.json").write_text('[1, 2]')
    secs, text = E.build_expectation(_node(), E.read_history(recs), None)
    assert secs is None
    assert "unreadable: build-cu9.9-20260102T000000.00Z.json (not a build record: no node list), " \
           "build-cu9.9-20260101T000000.00Z.json (JSONDecodeError)" in text
    secs, text = E.build_expectation(_node(), E.read_history(tmp_path / "no-such-folder"), None)
    assert secs is None and "0 record(s) read" in text


def test_a_source_node_without_a_record_takes_its_unit_cost_estimate(tmp_path):
    hist = E.read_history(tmp_path / "records")
    secs, text = E.build_expectation(_node("wheels", "source"), hist, 3725.0)
    assert secs == 3725.0 and text.startswith("about 1 h 02 min: the unit-cost estimate (cudastack/unit_costs.yaml")
    secs, text = E.build_expectation(_node("wheels", "source"), hist, None)
    assert secs is None and "its unit count is unknown until the source is fetched" in text


# ------------------------------------------------------------------------------------------ pull rate
def test_the_pull_rate_comes_from_the_environment_or_the_newest_measured_pull(tmp_path):
    recs = tmp_path / "records"
    pulled = {"status": "pulled", "downloaded_bytes": 100 << 20, "pull_s": 2.0}
    _record(recs, "20260101T000000.00Z", [{"hash": H, "status": "pulled", "cache": pulled}], prefix="reg:5/a")
    _record(recs, "20260102T000000.00Z", [{"hash": H, "status": "pulled", "cache": dict(pulled, pull_s=4.0)},
                                          {"hash": H, "status": "pulled", "cache": dict(pulled, pull_s=6.0)}],
            prefix="reg:5/b")
    hist = E.read_history(recs)
    rate = E.pull_rate(hist, "reg:5", environ={})
    assert rate is not None and rate.mib_s == pytest.approx(20.0)        # 200 MiB in 10 s, the newer run
    assert "the last measured: 2 pull(s) of run 20260102T000000.00Z, 200.00 MiB in 10 s from reg:5" in rate.source
    assert E.pull_rate(hist, "other:5", environ={}) is None               # another registry's pulls
    assert E.pull_rate(hist, "reg:5", environ={E.RATE_ENV: "95"}) == E.PullRate(95.0, f"{E.RATE_ENV}=95")
    for bad in ("fast", "0", "-3", "inf", "nan"):
        with pytest.raises(UsageError, match=f"{E.RATE_ENV}='{bad}': give the node cache's pull rate in MiB/s"):
            E.pull_rate(hist, "reg:5", environ={E.RATE_ENV: bad})


@pytest.mark.parametrize("cache", [{"status": "pulled", "downloaded_bytes": 1000, "pull_s": 0.01},    # < 1 MiB
                                   {"status": "pulled", "pull_s": 3.0},                               # old record
                                   {"status": "pulled", "downloaded_bytes": 5 << 20, "pull_s": 0},
                                   {"status": "pull failed", "downloaded_bytes": 5 << 20, "pull_s": 3.0}])
def test_a_pull_that_measured_nothing_gives_no_rate(tmp_path, cache):
    recs = tmp_path / "records"
    _record(recs, "20260101T000000.00Z", [{"hash": H, "status": "pulled", "cache": cache}], prefix="reg:5/a")
    assert E.pull_rate(E.read_history(recs), "reg:5", environ={}) is None
    secs, nbytes, text = E.pull_expectation([("sha256:c", 100), ("sha256:l", 3 << 20)], set(), None)
    assert secs is None and nbytes == (3 << 20) + 100
    assert text == (f"no estimate (no past pull measured: size only, the manifest's 3.00 MiB compressed; set "
                    f"{E.RATE_ENV} to a rate you measured)")


def test_a_blob_an_earlier_pulled_node_brings_is_counted_once():
    seen: set = set()
    rate = E.PullRate(1.0, "x")
    s1, n1, _ = E.pull_expectation([("sha256:c1", 1 << 20), ("sha256:base", 4 << 20)], seen, rate)
    s2, n2, t2 = E.pull_expectation([("sha256:c2", 1 << 20), ("sha256:base", 4 << 20), ("sha256:top", 2 << 20)],
                                    seen, rate)
    assert (s1, n1) == (5.0, 5 << 20) and (s2, n2) == (3.0, 3 << 20)
    assert t2.startswith("about 3.0 s: 3.00 MiB of the manifest's 7.00 MiB compressed (the rest comes with an earlier")
    assert E.pull_expectation("the registry is gone", set(), rate)[2] == \
        "no estimate (the manifest's size could not be read: the registry is gone)"


# ------------------------------------------------------------------------------------------ for real
def _manifest_size(host: str, ref: str) -> int:
    """The compressed size of a manifest's config and layers, fetched over plain HTTP (loopback, no login)."""
    name, digest = ref.split("/", 1)[1].split("@")
    m = requests.get(f"http://{host}/v2/{name}/manifests/{digest}", timeout=10, headers={"Accept": ", ".join([
        "application/vnd.docker.distribution.manifest.v2+json", "application/vnd.oci.image.manifest.v1+json"])})
    assert hashlib.sha256(m.content).hexdigest() == digest.split(":")[1]
    doc = m.json()
    return doc["config"]["size"] + sum(x["size"] for x in doc["layers"])


def _block(text: str, name: str) -> str:
    return re.search(rf"^\[\d+\] {name} .*?(?=^\[\d+\] |\Z)", text, re.S | re.M).group(0)


@pytest.mark.docker
@pytest.mark.registry
def test_the_dry_run_shows_digest_and_pull_time_in_the_registry_and_build_time_otherwise(
        tmp_path, engine, cleanup, registry_server, docker_config, monkeypatch):  # noqa: F811
    from cudastack.build.executor import dry_run, run_build
    from cudastack.build.node_cache import NodeCache
    from cudastack.registry.client import push_image

    monkeypatch.delenv(E.RATE_ENV, raising=False)
    client = engine.client
    plan = small_plan(tmp_path / "chain", os.urandom(6).hex(), wheel_bytes=64 << 10)
    cleanup.append(plan)
    cache = NodeCache.open(f"{registry_server.host}/ci", client)
    state = tmp_path / "s"
    first = run_build(plan, state_dir=state, engine=engine, cache=cache, say=lambda s: None)
    by = {n["name"]: n for n in first["nodes"]}
    # the runtime leaves the registry: it is "to build" again, with the duration its record gives
    rt = by["runtime"]["cache"]
    name = rt["reference"].split("/", 1)[1].split("@")[0]
    assert requests.delete(f"http://{registry_server.host}/v2/{name}/manifests/{rt['digest']}",
                           timeout=10).status_code == 202
    # the wheels entry becomes an image whose layers never came from BuildKit (`docker import`, 4 MiB of random
    # bytes in /wheels): BuildKit keeps the layers it built on this engine, so only such a layer is downloaded
    # again once its image is removed, as on a fresh builder
    wnode = plan.node("wheels")
    src = "cudastack-test/estimate-" + os.urandom(4).hex()
    _big_layer_image(client, src, wnode, mib=4)
    pushed = push_image(f"{src}:src", cache.target(wnode), client=client)
    for ref in (f"{src}:src", cache.target(wnode)):
        client.images.remove(ref, force=True)
    by["wheels"]["cache"] = {"digest": pushed.digest, "reference": pushed.reference}
    empty_engine(client, plan)

    text = dry_run(plan, state_dir=state, engine=engine, cache=cache)
    sizes = {}
    for n in ("base", "wheels"):
        block = _block(text, n)
        assert f"in the registry cache ({by[n]['cache']['digest']}: the run pulls it)" in block
        sizes[n] = _manifest_size(registry_server.host, by[n]["cache"]["reference"])
        assert f"the manifest's {E._size(sizes[n])} compressed" in block, block
        assert "expect  pull: no estimate (no past pull measured: size only" in block, block
        assert f"build instead: about {E._dur(by[n]['duration_s'])}: built in that time at this hash in run " \
               f"{first['run_id']}" in block
    assert sizes["wheels"] > 4 << 20          # the random 4 MiB, gzip leaves them as they are
    runtime = _block(text, "runtime")
    assert "] runtime  kind runtime  to build" in runtime
    assert f"expect  build: about {E._dur(by['runtime']['duration_s'])}: built in that time at this hash" in runtime
    assert "Expected time: building about" in text and "pulling no estimate for base, wheels" in text

    # a pull measures the rate; the next dry run expects the pulls at it
    second = run_build(plan, state_dir=state, engine=engine, cache=cache, say=lambda s: None)
    assert [n["status"] for n in second["nodes"]] == ["pulled", "pulled", "built"]
    got = [n["cache"] for n in second["nodes"] if n["status"] == "pulled" and n["cache"]["pull_s"] > 0
           and n["cache"]["downloaded_bytes"] > 0]
    assert sum(c["downloaded_bytes"] for c in got) >= 4 << 20
    rate = sum(c["downloaded_bytes"] for c in got) / sum(c["pull_s"] for c in got) / 2**20
    empty_engine(client, plan)
    text = dry_run(plan, state_dir=state, engine=engine, cache=cache)
    wheels = _block(text, "wheels")
    assert f"at {rate:.1f} MiB/s, the last measured: {len(got)} pull(s) of run {second['run_id']}" in wheels, wheels
    assert re.search(r"expect  pull: about [0-9.]+ s: ", wheels)
    assert "pulling about" in text

    # a manifest the registry does not have: the read fails in one paragraph (no made-up size)
    with pytest.raises(RegistryError, match="has no manifest"):
        E.manifest_blobs(by["base"]["cache"]["reference"].rsplit("@", 1)[0] + "@sha256:" + "0" * 64)

    # a bad configured rate stops the dry run with exit 2 (through invoke, as a user runs it)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'validate'}", **{E.RATE_ENV: "fast"})
    p = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "build", "--cuda", "13.1", "--recipes",
                        str(ROOT / "tests" / "fixtures" / "recipes"), "--prefix", "cudastack-test", "--state-dir",
                        str(tmp_path / "s3"), "--dry-run", "--cache", cache.prefix], capture_output=True, text=True,
                       env=env, timeout=300)
    assert p.returncode == 2 and f"{E.RATE_ENV}='fast'" in p.stderr, p.stderr
