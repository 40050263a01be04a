"""The lock's uv resolver (cudastack.lock.resolve_uv) against pip's: the same lock from a local PEP 503 index of tiny
wheels (no network), and, marked ``network``, from PyPI for a small real node, installed afterwards in
pip's hash-checking mode."""
from __future__ import annotations

import subprocess
import sys

import pytest

from cudastack import lock as L
from cudastack.lock import resolve_uv as U
from cudastack.core.errors import LockError, UsageError
from cudastack.plan.model import Node, Plan
from lock_support import TARGET, make_index, make_wheel
from test_lock_resolve import tiny_plan, tiny_index  # noqa: F401 - tiny_index used by the fixture

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


@pytest.fixture
def index(tmp_path):
    return tiny_index(tmp_path / "idx")


def chain_plan(index_url: str, held: str, app: str) -> Plan:
    """base (image: pip installs ``held``) -> app (image on base: pip installs ``app`` with deps)."""
    nodes = [Node("base", "image", "images/image.Dockerfile", [], {"PIP_SPECS": held, "PIP_INDEX_URL": index_url},
                  hash="a" * 64, method="wheel", inputs={"dockerfile": "ARG PIP_SPECS\n"}),
             Node("app", "image", "images/image.Dockerfile", ["base"], {"PIP_SPECS": app, "PIP_INDEX_URL": index_url},
                  hash="b" * 64, method="wheel", inputs={"dockerfile": "ARG PIP_SPECS\n"})]
    return Plan("9.9", "9.9.0", ["12.0"], "pip", nodes, "wheelhouse/cu9.9")


@pytest.fixture
def chain_index(tmp_path):
    """tinyapp 1.0 (tinylib[fast]>=1.0), tinyapp 2.0 (tinylib>=1.1), tinylib 1.0 and 1.1 (extra fast:
    tinyfast), tinyfast 0.1."""
    w = tmp_path / "files"
    lib = ["tinyfast; extra == 'fast'"]
    return make_index(tmp_path, [make_wheel(w, "tinyapp", "1.0", ["tinylib[fast]>=1.0"]),
                                 make_wheel(w, "tinyapp", "2.0", ["tinylib>=1.1"]),
                                 make_wheel(w, "tinylib", "1.0", lib, extras=["fast"]),
                                 make_wheel(w, "tinylib", "1.1", lib, extras=["fast"]),
                                 make_wheel(w, "tinyfast", "0.1")])


def test_uv_and_pip_lock_the_tiny_plan_alike(index):
    by_pip = L.resolve_lock(tiny_plan(index), target=TARGET)
    by_uv = L.resolve_lock(tiny_plan(index), target=TARGET, resolver=U.uv_resolve)
    assert by_uv["nodes"] == by_pip["nodes"]
    assert by_uv["resolver"]["tool"].startswith(f"uv {U.uv_version()} pip compile")
    assert by_pip["resolver"]["tool"].startswith("pip ")


@pytest.mark.parametrize("app, lib", [("tinyapp==1.0", "1.0"), ("tinyapp==2.0", "1.1")])
def test_uv_keeps_what_the_parent_holds_as_pip_does(chain_index, app, lib):
    """The parent holds tinylib 1.0: tinyapp 1.0 accepts it (kept), tinyapp 2.0 needs >=1.1 (replaced, and no
    warning: the Requires-Dist uv's resolver reads from the wheels say so before a constrained re-resolve)."""
    plan = chain_plan(chain_index, "tinylib==1.0", app)
    by_pip = L.resolve_lock(plan, target=TARGET)
    by_uv = L.resolve_lock(chain_plan(chain_index, "tinylib==1.0", app), target=TARGET, resolver=U.uv_resolve)
    pins = {p["name"]: p["version"] for p in by_uv["nodes"]["app"]["installs"]["PIP_SPECS"]["packages"]}
    assert pins["tinylib"] == lib
    assert by_uv["nodes"] == by_pip["nodes"]
    assert [w for w in by_uv.get("warnings", []) if "could not all be kept" in w] == []


def test_uv_requires_carry_the_extras_asked_for(chain_index):
    """tinyapp 1.0 asks for tinylib[fast]: the derived extras name it, and tinyfast is in both closures."""
    req: dict = {}
    pkgs = U.uv_resolve(["tinyapp==1.0"], target=TARGET, index=chain_index, requires=req)
    assert [p["name"] for p in pkgs] == ["tinyapp", "tinyfast", "tinylib"]
    assert req["tinylib"]["extras"] == ["fast"] and req["tinyapp"]["requires_dist"] == ["tinylib[fast]>=1.0"]
    assert [p["name"] for p in L.pip_resolve(["tinyapp==1.0"], target=TARGET, index=chain_index)] == \
        ["tinyapp", "tinyfast", "tinylib"]


def test_uv_unresolvable_pin_names_it_and_writes_nothing(index, tmp_path):
    p = tmp_path / "9.9.lock.yaml"
    L.lock_plan(tiny_plan(index), p, target=TARGET, resolver=U.uv_resolve)
    before = p.read_bytes()
    with pytest.raises(LockError, match="uv could not resolve tinyapp==7.0"):
        L.lock_plan(tiny_plan(index, app_spec="tinyapp==7.0"), p, target=TARGET, resolver=U.uv_resolve)
    assert p.read_bytes() == before


def test_the_wheel_kept_is_the_targets_preferred_one():
    tags = {t: i for i, t in enumerate(U.target_tags({"python_version": "3.11", "glibc": "2.36", "machine": "x86_64",
                                                     "implementation": "cp"}))}
    base = "https://files.example/x/"
    table = {"name": "Charset_Normalizer", "version": "3.4.0", "wheels": [
        {"url": base + "charset_normalizer-3.4.0-py3-none-any.whl", "hashes": {"sha256": "a" * 64}},
        {"url": base + "charset_normalizer-3.4.0-cp311-abi3-manylinux_2_17_x86_64.whl", "hashes": {"sha256": "c" * 64}},
        {"url": base + "charset_normalizer-3.4.0-cp311-cp311-macosx_10_9_x86_64.whl", "hashes": {"sha256": "d" * 64}},
        {"url": base + "charset_normalizer-3.4.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
         "hashes": {"sha256": "b" * 64}}]}
    pkg, url = U._pkg_from_pylock(table, tags, {"charset-normalizer"})
    assert pkg == {"name": "charset-normalizer", "version": "3.4.0", "sha256": "b" * 64, "requested": True,
                   "filename": "charset_normalizer-3.4.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                   "url": url}
    with pytest.raises(LockError, match="sdist, not a wheel"):
        U._pkg_from_pylock({"name": "x", "version": "1", "sdist": {"url": base + "x-1.tar.gz"}}, tags, set())
    with pytest.raises(LockError, match="none of which installs on the target"):
        U._pkg_from_pylock({"name": "x", "version": "1", "wheels": [
            {"url": base + "x-1-cp311-cp311-win_amd64.whl", "hashes": {"sha256": "e" * 64}}]}, tags, set())
    with pytest.raises(LockError, match="no sha256"):
        U._pkg_from_pylock({"name": "x", "version": "1", "wheels": [{"url": base + "x-1-py3-none-any.whl"}]}, tags, set())


def test_uv_platform_never_newer_than_the_glibc():
    assert U.uv_platform("2.36") == "x86_64-manylinux_2_36"
    assert U.uv_platform("2.30") == "x86_64-manylinux_2_28"
    assert U.uv_platform("2.45") == "x86_64-manylinux_2_40"
    with pytest.raises(LockError, match="2.12"):
        U.uv_platform("2.12")


def test_choose_resolver():
    assert U.choose_resolver("pip") is L.pip_resolve
    assert U.choose_resolver(None) is U.uv_resolve       # the default
    with pytest.raises(UsageError, match="--resolver 'poetry'"):
        U.choose_resolver("poetry")


def test_lock_task_refuses_an_unknown_resolver(tmp_path):
    r = subprocess.run([sys.executable, "-m", "invoke", "lock", "--cuda", "13.1", "--resolver", "poetry",
                        "--lockfiles", str(tmp_path)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2, r.stderr
    assert "--resolver 'poetry'" in r.stderr and "pip, uv" in r.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.network
def test_real_node_locks_alike_and_installs_hash_checked(tmp_path):
    """A small real node from PyPI (requests on an image that holds urllib3 2.2.3; charset-normalizer has
    CPython manylinux wheels, so the target's wheel must be picked): pip and uv pin the same files, the
    held urllib3 is kept, and uv's pins install with pip --require-hashes; a changed hash is refused."""
    target = {"python_version": "%d.%d" % sys.version_info[:2], "glibc": "2.36", "machine": "x86_64",
              "implementation": "cp"}
    idx = L.DEFAULT_INDEX
    by_pip = L.resolve_lock(chain_plan(idx, "urllib3==2.2.3", "requests==2.32.3"), target=target)
    by_uv = L.resolve_lock(chain_plan(idx, "urllib3==2.2.3", "requests==2.32.3"), target=target,
                           resolver=U.uv_resolve)
    assert by_uv["nodes"] == by_pip["nodes"]
    pkgs = {p["name"]: p for p in by_uv["nodes"]["app"]["installs"]["PIP_SPECS"]["packages"]}
    assert set(pkgs) == {"requests", "urllib3", "idna", "certifi", "charset-normalizer"}
    assert pkgs["urllib3"]["version"] == "2.2.3"
    assert "-cp3" in pkgs["charset-normalizer"]["filename"] and "manylinux" in pkgs["charset-normalizer"]["filename"]
    got = L.install_locked(by_uv, "app", "PIP_SPECS", target_dir=tmp_path / "ok")
    assert "requests==2.32.3" in got and (tmp_path / "ok" / "requests").is_dir()
    pkgs["idna"]["sha256"] = "0" * 64
    with pytest.raises(LockError, match="disagree on idna"):
        L.install_locked(by_uv, "app", "PIP_SPECS", target_dir=tmp_path / "bad")


@pytest.mark.parametrize("specs", ["tinytorch==1.0 humming==1.0", "tinytorch==1.0 needsnew==1.0", "tinytorch==1.0"])
def test_cuda_coherence_c25_is_the_same_with_uv(tmp_path, specs):
    """Case C25 through uv, on test_lock_cuda_coherence's index: the CUDA toolkit wheels kept on the runtime's
    release (or the forcing requirement named) exactly as with pip: same closure, same warnings (they quote
    Requires-Dist, which uv_resolve reads from the wheels), up to the resolver's own error text."""
    from test_lock_cuda_coherence import cuda_index, plan as cuda_plan

    idx = cuda_index(tmp_path)
    by_pip = L.resolve_lock(cuda_plan(idx, specs), target=TARGET)
    by_uv = L.resolve_lock(cuda_plan(idx, specs), target=TARGET, resolver=U.uv_resolve)
    assert by_uv["nodes"] == by_pip["nodes"]
    cut = lambda ws: [w.split(" pip: ")[0] for w in ws or []]  # noqa: E731 - the resolver's own message differs
    assert cut(by_uv.get("warnings")) == cut(by_pip.get("warnings"))


def test_unreadable_metadata_is_an_error_not_an_empty_list():
    """A wheel whose Requires-Dist cannot be read anywhere stops the lock (an empty list would let kept_pins
    keep a held version that a requirement forbids)."""
    with pytest.raises(LockError, match="Cannot read the Requires-Dist of tinyx 1.0"):
        U.wheel_requires_dist("http://127.0.0.1:9/tinyx-1.0-py3-none-any.whl", name="tinyx", version="1.0", timeout=5)
