"""The upgrade radar: `invoke outdated` and `invoke scan` against the real index (downloads cached by hash
under $CUDASTACK_TEST_CACHE/radar), and each check failing on bad input through a package index served on
127.0.0.1."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from cudastack.radar import walk as R
from cudastack.radar import scan as S
from cudastack.core.errors import RegistryError, UsageError
from cudastack.pkgindex.client import Index
from stackprobe.archs import parse_arch
from cudastack.recipes.load import load_recipes
from radar_support import (FakeIndex, check_engine_refuses, check_held_by_engine, comm_py, radar_row,
                           make_sdist, make_wheel)

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("CUDASTACK_TEST_CACHE", Path.home() / ".cache" / "cudastack-tests")) / "radar"


def invoke(*args, env=None, timeout=1800) -> subprocess.CompletedProcess:
    e = dict(os.environ, CUDASTACK_CACHE=str(CACHE))
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=e, capture_output=True, text=True,
                          timeout=timeout)


# ------------------------------------------------------------------------------------ real index
@pytest.mark.network
def test_scan_flashinfer_finds_the_first_release_admitting_12_for_fusion(tmp_path):
    # an open range: the answer must stay true when FlashInfer publishes a release (relations, not today's newest)
    r = invoke("scan", "--package", "flashinfer-python", "--versions", "0.6.10..", "--arch", "12.0",
               "--json", str(tmp_path / "scan.json"))
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout
    rep = json.loads((tmp_path / "scan.json").read_text())
    newest = Version(rep["versions"][-1])
    assert newest >= Version("0.7.4")                   # a release known to exist
    # read from each release's own flashinfer/jit/comm.py (FACTS: [9, 10] through 0.6.16, [9, 10, 12] from 0.6.17)
    fusion = rep["lifts"]["fusion"]
    assert fusion["state"] == "lifted-in-range" and fusion["first"] == "0.6.17" and fusion["monotone"], fusion
    before, after = Version(fusion["before"]), Version(fusion["after"])
    assert Version("0.6.16") <= before < Version("0.6.17") < after <= newest
    gate = lambda v, g="fusion": rep["scans"][str(v)]["gates"][g]["value"]  # noqa: E731
    assert gate(before) == [9, 10] and 12 in gate("0.6.17") and 12 in gate(after)
    assert "fusion: first release that lifts it: 0.6.17 ([9, 10, 12]" in out, out
    assert "Assumption: each gate is monotone" in out
    # the MNNVL module: blocked through 0.7.4; a later release may lift it, and then it is named as the first
    mnnvl = rep["lifts"]["jit:gen_trtllm_mnnvl_comm_module"]
    if mnnvl["state"] == "never-lifted":
        assert 12 not in gate(newest, "jit:gen_trtllm_mnnvl_comm_module")
        assert f"no release in range lifts it; newest {newest} reads [9, 10" in out
    else:
        assert mnnvl["state"] == "lifted-in-range" and Version(mnnvl["first"]) > Version("0.7.4"), mnnvl
    # a second run reads every scan from the cache: no download
    r2 = invoke("scan", "--package", "flashinfer-python", "--versions", "0.6.10..")
    assert r2.returncode == 0 and "'downloads': 0" in r2.stderr and r2.stdout == out


@pytest.mark.network
def test_scan_sglang_reads_engine_gates_from_the_wheel():
    ix = Index(cache=CACHE)
    s = S.scan_release(ix, "sglang", Version("0.5.23"), parse_arch("12.0"))
    ca, sm = s.gates["custom-allreduce"], s.gates["symm-mem-table"]
    assert ca.admits is False and "world_size > 2" in ca.value, ca
    assert sm.admits is False and sm.value["keys"] == [9, 10] and sm.value["lookup"] == "get", sm
    # at world size 2 the custom allreduce rule admits
    s2 = S.scan_release(ix, "sglang", Version("0.5.23"), parse_arch("12.0"), world_size=2)
    assert s2.gates["custom-allreduce"].admits is True


@pytest.mark.network
def test_torch_metadata_is_read_with_range_requests_not_a_download(tmp_path):
    ix = Index(cache=tmp_path)
    ck = R.Checker(ix, load_recipes(), load_recipes().toolchain("13.2"))
    cu, ev = ck.torch_cuda(Version("2.15.0"))
    assert cu == (13, 2) and "cuda-toolkit" in ev
    assert ix.stats["downloads"] == 0 and ix.stats["metadata_fetched"] == 1
    # a kernel wheel's CUDA build from the libcudart soname its libraries need, also by range reads
    kf = lambda v: next(f for f in ix.project("sglang-kernel").files[Version(v)] if f.filename.endswith("x86_64.whl"))  # noqa: E731
    assert ix.cuda_runtime_major(kf("0.4.1"))[0] == 12
    assert ix.cuda_runtime_major(kf("0.4.10"))[0] == 13
    assert ix.stats["downloads"] == 0
    assert any("sglang-kernel 0.4.1" in r and "CUDA 12 build" in r
               for r in ck.reasons("sglang-kernel", Version("0.4.1"), {}, "", "wheel"))


@pytest.mark.network
def test_outdated_names_the_pins_that_hold_each_toolchain(tmp_path):
    r = invoke("outdated", "--out", str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    data = json.loads((tmp_path / "radar.json").read_text())
    # 13.1: sglang 0.5.23 pins torch 2.14.1; every newer torch (2.15.0 at least) is refused, 2.15.0 being a CUDA 13.2 build
    row = check_held_by_engine(data, "13.1", "torch", "2.14.1", known_newer="2.15.0")
    assert row["locked"] == "2.14.1"
    assert any(h.startswith("cuda-variant: torch ") and "CUDA 13." in h for h in row["held_back_by"]), row
    md = (tmp_path / "cu13.1.md").read_text()
    assert "Requires-Dist `torch==2.14.1`" in next(ln for ln in md.splitlines() if ln.startswith("| torch |"))
    # 13.2: torch moved alone is refused, naming the engine's pin
    check_engine_refuses(data, "13.2", "sglang 0.5.23", "torch==2.14.1", "torch")
    # 12.8: FlashInfer held at 0.6.3 by sglang 0.5.9; a move to the newest is a what-if that breaks that pin, read by
    # validate's own engine readers on the two sets (the PCIe IPC module is new: an AOT module to build)
    fi = check_held_by_engine(data, "12.8", "flashinfer-python", "0.6.3", known_newer="0.7.4")
    assert f"{fi['newest']} (newest): what-if: breaks sglang 0.5.9's pin `flashinfer_python==0.6.3`" in fi["move"], fi
    if fi["newest"] == "0.7.4":
        assert "AOT module to build: the PCIe IPC allreduce module" in fi["move"], fi["move"]
    # 13.1, vLLM's own chain: vllm 0.33.0 holds its torch at 2.14.0 and FlashInfer at 0.7.2.post1 (cu13.1-vllm.md)
    check_held_by_engine(data, "13.1", "torch", "2.14.0", known_newer="2.14.1", runtime="vllm")
    check_held_by_engine(data, "13.1", "flashinfer-python", "0.7.2.post1", known_newer="0.7.4", runtime="vllm")
    assert [r["component"] for r in next(t for t in data if t.get("runtime") == "vllm")["rows"]][2:4] == ["b12x", "vllm"]
    assert (tmp_path / "cu13.1-vllm.md").is_file() and not any(t.get("runtime") == "vllm" for t in data
                                                               if t["toolchain"] != "13.1")


@pytest.mark.network
@pytest.mark.docker     # the dry run checks the engine and its disk, as the build does
def test_build_dry_run_plans_13_2_and_a_real_build_is_refused_by_the_engine_pin():
    r = invoke("build", "--cuda", "13.2", "--dry-run", timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Plan for CUDA 13.2 (toolkit 13.2.2)" in r.stdout and "PIP_SPECS=torch==2.15.0" in r.stdout
    assert "REFUSED for a real build" in r.stderr and "Requires-Dist `torch==2.14.1`" in r.stderr
    r = invoke("build", "--cuda", "13.2", timeout=300)     # refused before any Docker work
    assert r.returncode == 3, r.stderr
    assert "sglang 0.5.23" in r.stderr and "recipes/torch.yaml toolchains.13.2 pins torch 2.15.0" in r.stderr


# ------------------------------------------------------------------------------------ failing cases
def _fake_flashinfer(folder: Path, majors_by_version: dict[str, list[int]]):
    for v, m in majors_by_version.items():
        make_wheel(folder, "flashinfer-python", v, files={"flashinfer/__init__.py": "", "flashinfer/jit/__init__.py": "",
                                                           "flashinfer/jit/comm.py": comm_py(m)})


def test_bisection_finds_the_first_lifting_release_on_a_local_index(tmp_path):
    (tmp_path / "w").mkdir()
    _fake_flashinfer(tmp_path / "w", {"1.0": [9, 10], "1.1": [9, 10], "1.2": [9, 10], "1.3": [9, 10, 12],
                                      "1.4": [9, 10, 12], "1.5": [9, 10, 12]})
    with FakeIndex(tmp_path / "w") as fx:
        rep = S.scan_package(Index(fx.url, cache=tmp_path / "c"), "flashinfer-python", "1.0..1.5", "12.0")
    r = rep.lifts["fusion"]
    assert str(r["first"]) == "1.3" and str(r["before"]) == "1.2" and str(r["after"]) == "1.4" and r["monotone"]
    assert len(rep.scans) < 6          # bisection: not every release was scanned


def test_a_gate_that_regresses_is_reported_not_monotone(tmp_path):
    (tmp_path / "w").mkdir()
    _fake_flashinfer(tmp_path / "w", {"1.0": [9, 10], "1.1": [9, 10], "1.2": [9, 10, 12], "1.3": [9, 10],
                                      "1.4": [9, 10, 12]})
    with FakeIndex(tmp_path / "w") as fx:
        ix = Index(fx.url, cache=tmp_path / "c")
        rep = S.scan_package(ix, "flashinfer-python", None, "12.0")
        text = S.render_scan(rep)
        assert not rep.lifts["fusion"]["monotone"] and "1.3" in map(str, rep.lifts["fusion"]["contradictions"])
        assert "NOT MONOTONE" in text
        full = S.scan_package(ix, "flashinfer-python", None, "12.0", scan_all=True)
        assert not full.lifts["fusion"]["monotone"]


def test_a_gate_no_release_lifts_is_said_so(tmp_path):
    (tmp_path / "w").mkdir()
    _fake_flashinfer(tmp_path / "w", {"1.0": [9, 10], "1.1": [9, 10]})
    with FakeIndex(tmp_path / "w") as fx:
        rep = S.scan_package(Index(fx.url, cache=tmp_path / "c"), "flashinfer-python", None, "12.0")
    assert rep.lifts["fusion"]["state"] == "never-lifted" and rep.lifts["fusion"]["first"] is None
    assert "no release in range lifts it" in S.render_scan(rep)


def _fake_stack(folder: Path, sglang_requires: list[str], kernel_torch: str = "2.15.0"):
    folder.mkdir(exist_ok=True)
    make_wheel(folder, "sglang", "0.5.23", sglang_requires)
    make_wheel(folder, "torch", "2.15.0", ["cuda-toolkit[cudart]==13.2.2"], tag="cp311-cp311-manylinux_2_28_x86_64")
    make_wheel(folder, "sglang-kernel", "0.4.10", [f"torch=={kernel_torch}"], tag="cp310-abi3-manylinux2014_x86_64")
    make_wheel(folder, "flashinfer-python", "0.7.4", ["torch"])
    make_wheel(folder, "torchvision", "0.29.2", ["torch>=2.14.0"], tag="py3-none-manylinux_2_28_x86_64")


def test_an_engine_pin_refuses_a_component_moved_alone(tmp_path):
    recipes = load_recipes()
    tc = recipes.toolchain("13.2")
    _fake_stack(tmp_path / "blocks", ["torch==2.14.1", "sglang-kernel==0.4.10"])
    with FakeIndex(tmp_path / "blocks") as fx:
        conflicts = R.engine_pin_conflicts(recipes, tc, Index(fx.url, cache=tmp_path / "c1"))
    assert len(conflicts) == 1 and "Requires-Dist `torch==2.14.1`" in conflicts[0]
    assert "recipes/torch.yaml toolchains.13.2 pins torch 2.15.0" in conflicts[0]
    # the same stack with the engine admitting torch 2.15.0: nothing refused
    _fake_stack(tmp_path / "agrees", ["torch==2.15.0", "sglang-kernel==0.4.10", "flashinfer-python==0.7.4"])
    with FakeIndex(tmp_path / "agrees") as fx:
        assert R.engine_pin_conflicts(recipes, tc, Index(fx.url, cache=tmp_path / "c2")) == []
    # a kernel that pins another torch is named too
    _fake_stack(tmp_path / "kernel", ["torch==2.15.0"], kernel_torch="2.14.1")
    with FakeIndex(tmp_path / "kernel") as fx:
        c = R.engine_pin_conflicts(recipes, tc, Index(fx.url, cache=tmp_path / "c3"))
    assert len(c) == 1 and c[0].startswith("sglang-kernel 0.4.10") and "`torch==2.14.1`" in c[0]


def test_a_download_whose_hash_differs_is_refused_and_not_kept(tmp_path):
    (tmp_path / "w").mkdir()
    _fake_flashinfer(tmp_path / "w", {"1.0": [9, 10]})
    with FakeIndex(tmp_path / "w", bad_hash={"flashinfer_python-1.0-py3-none-any.whl"}) as fx:
        ix = Index(fx.url, cache=tmp_path / "c")
        f = ix.project("flashinfer-python").files[Version("1.0")][0]
        with pytest.raises(RegistryError, match="hashes to sha256"):
            ix.download(f)
    assert not list((tmp_path / "c" / "files").rglob("*.whl"))


def test_an_index_without_pep691_json_and_an_unknown_project_are_clear_errors(tmp_path):
    (tmp_path / "w").mkdir()
    _fake_flashinfer(tmp_path / "w", {"1.0": [9, 10]})
    with FakeIndex(tmp_path / "w", html=True) as fx:
        with pytest.raises(RegistryError, match="PEP 691"):
            Index(fx.url, cache=tmp_path / "c").project("flashinfer-python")
    with FakeIndex(tmp_path / "w") as fx:
        with pytest.raises(UsageError, match="has no project 'no-such-thing'"):
            Index(fx.url, cache=tmp_path / "c").project("no-such-thing")
    with pytest.raises(RegistryError, match="cannot be reached"):
        Index("http://127.0.0.1:9/simple", cache=tmp_path / "c2").project("torch")


def test_metadata_falls_back_to_a_download_when_ranges_are_ignored_and_is_cached_by_hash(tmp_path):
    (tmp_path / "w").mkdir()
    make_wheel(tmp_path / "w", "sglang", "1.0", ["torch==2.14.1"])
    with FakeIndex(tmp_path / "w", ranges=False) as fx:
        ix = Index(fx.url, cache=tmp_path / "c")
        f = ix.project("sglang").files[Version("1.0")][0]
        assert [str(r) for r in ix.requires(f)] == ["torch==2.14.1"]
        n = len(fx.requests)
        ix2 = Index(fx.url, cache=tmp_path / "c")
        ix2.requires(ix2.project("sglang").files[Version("1.0")][0])
        assert len(fx.requests) == n          # page (ttl) and metadata (by hash) both from the cache


def test_bad_flags_are_refused(tmp_path):
    with pytest.raises(UsageError, match="A..B"):
        S.parse_range("zero..one")
    r = invoke("scan", "--package", "flashinfer-python", "--arch", "12.9z", env={"CUDASTACK_INDEX": "http://127.0.0.1:9/simple"})
    assert r.returncode == 4 and "--arch" in r.stderr
    r = invoke("scan")
    assert r.returncode == 2 and "--package" in r.stderr
    r = invoke("outdated", "--cuda", "99.9", "--out", str(tmp_path))
    assert r.returncode == 2 and "Unknown CUDA version '99.9'" in r.stderr and not list(tmp_path.iterdir())


def test_python_tag_and_cuda_variant_hold_releases_back(tmp_path):
    recipes = load_recipes()
    w = tmp_path / "w"
    _fake_stack(w, ["torch==2.14.1"])
    for py in ("cp311", "cp312"):
        make_wheel(w, "torch", "2.14.1", ["cuda-toolkit[cudart]==13.0.3"], tag=f"{py}-{py}-manylinux_2_28_x86_64")
    make_wheel(w, "torch", "2.16.0", ["cuda-toolkit[cudart]==13.0.3"], tag="cp313-cp313-manylinux_2_28_x86_64")
    with FakeIndex(w) as fx:
        ck = R.Checker(Index(fx.url, cache=tmp_path / "c"), recipes, recipes.toolchain("13.1"))
        tag = ck.reasons("torch", Version("2.16.0"), {}, "", "wheel")
        assert len(tag) == 1 and tag[0].startswith("python-tag: no wheel for Python 3.11") and "cp313" in tag[0]
        cuda = ck.reasons("torch", Version("2.15.0"), {}, "", "wheel")
        assert len(cuda) == 1 and cuda[0].startswith("cuda-variant: torch 2.15.0's PyPI build is CUDA 13.2")
        assert ck.reasons("torch", Version("2.14.1"), {}, "", "wheel") == []
        ck12 = R.Checker(ck.index, recipes, recipes.toolchain("12.8"))
        assert ck12.reasons("torch", Version("2.14.1"), {}, "", "wheel")[0].startswith("cuda-variant")


# ------------------------------------------------------------------------------------ range reads, moved releases
def _kernel_so(major: int) -> bytes:
    """Bytes standing for a kernel's shared object: a dynamic-section string naming libcudart.so.<major>."""
    return b"\x7fELF" + b"\0" * 4096 + f"libcudart.so.{major}".encode() + b"\0" * 4096


def test_metadata_and_the_cudart_soname_are_read_with_range_requests_on_a_local_index(tmp_path):
    (tmp_path / "w").mkdir()
    big = {f"sgl_kernel/blob{i}.bin": os.urandom(300_000) for i in range(4)}     # > 1 MiB: ranges must pay off
    make_wheel(tmp_path / "w", "sglang-kernel", "0.4.10", ["torch"], tag="cp310-abi3-manylinux2014_x86_64",
               files={**big, "sgl_kernel/common_ops.so": _kernel_so(13)})
    with FakeIndex(tmp_path / "w") as fx:
        ix = Index(fx.url, cache=tmp_path / "c")
        f = ix.project("sglang-kernel").files[Version("0.4.10")][0]
        assert [str(r) for r in ix.requires(f)] == ["torch"]
        assert ix.cuda_runtime_major(f) == (13, f"{f.filename}: sgl_kernel/common_ops.so needs libcudart.so.13")
        assert ix.stats["downloads"] == 0 and ix.stats["metadata_fetched"] == 1
        assert fx.range_requests and all(p.endswith(f.filename) for p, _ in fx.range_requests)
        fetched = sum(int(b) - int(a) + 1 for _, rng in fx.range_requests
                      for a, b in [rng.split("=")[1].split("-")])
        assert fetched < f.size            # not the whole wheel


def _stack_13x(w: Path, forward: bool) -> None:
    """A local index holding what the radar reads for CUDA 13.1 and 13.2 (as PyPI had it when the pins were
    written); ``forward``: upstream has since published a newer torch (a CUDA 13.3 build), FlashInfer, kernel,
    toolkit and an engine that pins them."""
    w.mkdir(exist_ok=True)
    cu = lambda v: [f"cuda-toolkit[cudart]=={v}"]  # noqa: E731
    torch = {"2.14.1": cu("13.0.3"), "2.15.0": cu("13.2.2")}
    fi = {"0.7.2": [9, 10], "0.7.3": [9, 10, 12], "0.7.4": [9, 10, 12]}
    engines = {"0.5.23": ["torch==2.14.1", "sglang-kernel==0.4.10", "flashinfer-python==0.7.2"]}
    kernels, toolkits = ["0.4.10"], ["13.1.1", "13.2.2"]
    if forward:
        torch["2.16.0"] = cu("13.3.0")
        fi["0.8.0"] = [9, 10, 12, 13]
        engines["0.5.24"] = ["torch==2.16.0", "sglang-kernel==0.5.0", "flashinfer-python==0.8.0"]
        kernels.append("0.5.0")
        toolkits.append("13.3.0")
    for v, req in torch.items():
        make_wheel(w, "torch", v, req, tag="cp311-cp311-manylinux_2_28_x86_64")
    _fake_flashinfer(w, fi)
    for v, req in engines.items():
        make_wheel(w, "sglang", v, req)
    for v in kernels:
        make_wheel(w, "sglang-kernel", v, ["torch"], tag="cp310-abi3-manylinux2014_x86_64",
                   files={"sgl_kernel/common_ops.so": _kernel_so(13)})
    for v in toolkits:
        make_wheel(w, "cuda-toolkit", v, tag="py3-none-manylinux_2_28_x86_64")
    make_sdist(w, "flash-attn", "2.8.3.post2", ["torch"])


@pytest.mark.network      # reads releases from PyPI into the test cache
@pytest.mark.parametrize("forward", [False, True], ids=["as-pinned", "newest-moved-forward"])
def test_radar_relations_hold_when_the_newest_release_moves_forward(tmp_path, forward):
    """The relations the live test asserts, on a local index, before and after upstream publishes newer
    releases: the same checks pass both times, and the newest column did move."""
    _stack_13x(tmp_path / "w", forward)
    recipes = load_recipes()
    with FakeIndex(tmp_path / "w") as fx:
        ix = Index(fx.url, cache=tmp_path / "c")
        data = [R.to_json(R.radar(tc, index=ix, recipes=recipes)) for tc in ("13.1", "13.2")]
    row = check_held_by_engine(data, "13.1", "torch", "2.14.1", known_newer="2.15.0")
    assert row["newest"] == ("2.16.0" if forward else "2.15.0")
    assert any(h.startswith("cuda-variant: torch ") for h in row["held_back_by"]), row
    check_engine_refuses(data, "13.2", "sglang 0.5.23", "torch==2.14.1", "torch")
    fi = check_held_by_engine(data, "13.1", "flashinfer-python", "0.7.2", known_newer="0.7.4")
    assert fi["newest"] == ("0.8.0" if forward else "0.7.4")
    # the move is a what-if against the engine's pin, read on the newest release whatever it is
    assert f"{fi['newest']} (newest): what-if: breaks sglang 0.5.23's pin `flashinfer-python==0.7.2`" in fi["move"], fi
    # the exact strings a test of today's index would assert are what a moved index breaks
    assert ("0.7.4 (newest): what-if" in fi["move"]) is not forward


# ------------------------------------------------------------------------------------ vLLM's image chain
def _vllm_index(w: Path) -> None:
    """A local index with what vLLM's radar reads on 13.1: torch 2.14.0/2.14.1 (CUDA 13.0) and 2.15.0 (13.2),
    FlashInfer 0.7.2.post1 and 0.7.4, b12x 1.5.1 and a newer 1.6.0, vllm 0.33.0 (its real exact pins: torch==2.14.0,
    flashinfer-python==0.7.2.post1, b12x==1.5.1 under the `b12x` extra) and a vllm 0.34.0 on torch 2.15.0."""
    w.mkdir(exist_ok=True)
    for v, cu in (("2.14.0", "13.0.3"), ("2.14.1", "13.0.3"), ("2.15.0", "13.2.2")):
        make_wheel(w, "torch", v, [f"cuda-toolkit[cudart]=={cu}"], tag="cp311-cp311-manylinux_2_28_x86_64")
    _fake_flashinfer(w, {"0.7.2": [9, 10, 12], "0.7.2.post1": [9, 10, 12], "0.7.4": [9, 10, 12]})
    for v in ("1.5.1", "1.6.0"):
        make_wheel(w, "b12x", v, ["torch"])
    for v, (t, fi, b) in {"0.33.0": ("2.14.0", "0.7.2.post1", "1.5.1"), "0.34.0": ("2.15.0", "0.7.4", "1.6.0")}.items():
        make_wheel(w, "vllm", v, [f"torch=={t}", "torchvision==0.29.0", f"flashinfer-python=={fi}",
                                  f'b12x=={b}; extra == "b12x"'], tag="cp38-abi3-manylinux_2_28_x86_64")
    make_wheel(w, "sglang", "0.5.23", ["torch==2.14.1", "sglang-kernel==0.4.10", "flashinfer-python==0.7.2"])
    make_wheel(w, "sglang-kernel", "0.4.10", ["torch==2.14.1"], tag="cp310-abi3-manylinux2014_x86_64",
               files={"sgl_kernel/common_ops.so": _kernel_so(13)})
    make_sdist(w, "flash-attn", "2.8.3.post2", ["torch"])
    for v in ("13.1.1", "13.2.2"):
        make_wheel(w, "cuda-toolkit", v, tag="py3-none-manylinux_2_28_x86_64")


@pytest.mark.network      # reads releases from PyPI into the test cache
def test_the_radar_covers_vllm_and_b12x_in_vllms_own_chain(tmp_path):
    """vLLM's radar reads vLLM's chain (its torch 2.14.0, not SGLang's 2.14.1): torch and FlashInfer are held by
    vllm 0.33.0's exact pins, b12x by the pin of its `b12x` extra (an extra the image installs), and the newer
    vllm 0.34.0 by its torch 2.15.0, a CUDA 13.2 build. SGLang's radar of the same toolchain keeps its own pins.
    Planted fault: read without the extra, the b12x pin is lost and 1.6.0 would look allowed."""
    from cudastack.radar import checks as RC

    _vllm_index(tmp_path / "w")
    recipes = load_recipes()
    assert R.runtimes(recipes, "13.1") == ["runtime", "vllm"] and R.runtimes(recipes, "12.8") == ["runtime"]
    with FakeIndex(tmp_path / "w") as fx:
        ix = Index(fx.url, cache=tmp_path / "c")
        data = [R.to_json(R.radar("13.1", index=ix, recipes=recipes, runtime=rt, verdicts=False))
                for rt in ("runtime", "vllm")]
        sgl, vl = data
        assert vl["runtime"] == "vllm" and vl["engine"].startswith("vllm 0.33.0")
        assert [r["component"] for r in vl["rows"]] == ["torch", "flashinfer-python", "b12x", "vllm", "cuda-toolkit"]
        check_held_by_engine(data, "13.1", "torch", "2.14.0", known_newer="2.14.1", runtime="vllm")
        check_held_by_engine(data, "13.1", "flashinfer-python", "0.7.2.post1", known_newer="0.7.4", runtime="vllm")
        check_held_by_engine(data, "13.1", "b12x", "1.5.1", known_newer="1.6.0", runtime="vllm")
        row = radar_row(data, "13.1", "vllm", "vllm")
        assert row["pinned"] == "0.33.0" and row["newest"] == "0.34.0" and row["newest_allowed"] == "0.33.0"
        assert any("vllm 0.34.0 Requires-Dist `torch==2.15.0`" in h and "CUDA 13.2" in h for h in row["held_back_by"])
        assert row["move"] == "not read (--no-verdicts)"      # vllm is read as a site like every other wheel
        assert radar_row(data, "13.1", "torch", "runtime")["pinned"] == "2.14.1"     # SGLang's chain unchanged
        # the lock is read per chain too: vLLM's torch row names vLLM's locked torch, not SGLang's
        assert radar_row(data, "13.1", "torch", "vllm")["locked"] == "2.14.0"
        assert radar_row(data, "13.1", "torch", "runtime")["locked"] == "2.14.1"
        assert R.lock_versions("13.1")["torch"] == "2.14.1"       # planted fault: the flat read takes SGLang's
        assert vl["conflicts"] == [] and "vllm's image chain" in R.render_markdown(R.radar(
            "13.1", index=ix, recipes=recipes, runtime="vllm", verdicts=False))
        assert R.out_name("13.1", "vllm") == "cu13.1-vllm.md" and R.out_name("13.1", "runtime") == "cu13.1.md"
        ck = RC.Checker(ix, recipes, recipes.toolchain("13.1"), "vllm")
        reqs, _ = R.engine_requirements(ck)
        assert str(reqs["b12x"].specifier) == "==1.5.1"
        ck.engine = "not-vllm"                                   # the planted fault: no extra read
        assert "b12x" not in ck.requires("vllm", Version("0.33.0"))[0]
