"""The radar's site readers: wheels laid out by HTTP range reads (a local index on 127.0.0.1 offline, PyPI's real
wheels in the network tests), validate's own static tier run over the site, and what a move changes and costs.

Done-when cases of the upgrade-radar issue (network): flashinfer-python 0.7.2.post1 -> 0.7.4 under vllm 0.33.0
(the PCIe IPC module to rebuild, its tune version 4 -> 5; the two-sided all-to-all), vllm 0.33.0 -> 0.34.0 (not
installable while flashinfer-python 0.7.3 is absent; the two-sided all-to-all through flashinfer.moe_ep)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from packaging.version import Version

from cudastack.core.errors import RegistryError
from cudastack.pkgindex.client import Index
from cudastack.radar import moves, sitefetch
from cudastack.radar import walk as R
from cudastack.radar.checks import Checker
from cudastack.recipes.load import load_recipes
from radar_support import FakeIndex, make_wheel, radar_row
from stackprobe import site

CACHE = Path(os.environ.get("CUDASTACK_TEST_CACHE", Path.home() / ".cache" / "cudastack-tests")) / "radar"


# ------------------------------------------------------------------------------------ laying wheels out (offline)
def _big_wheel(w: Path) -> Path:
    blobs = {f"pkg/_lib{i}.so": os.urandom(400_000) for i in range(5)}        # incompressible: 2 MB of "binaries"
    src = {f"pkg/mod{i}.py": f"X{i} = {i}\n" * 50 for i in range(30)}
    return make_wheel(w, "pkg", "1.0", ["torch==2.14.0"], files={**blobs, **src, "pkg/__init__.py": ""},
                      tag="cp311-cp311-manylinux_2_28_x86_64")


def test_a_wheel_is_laid_out_with_its_metadata_and_python_files_only_by_range_reads(tmp_path):
    (tmp_path / "w").mkdir()
    whl = _big_wheel(tmp_path / "w")
    with FakeIndex(tmp_path / "w") as fx:
        ix = Index(fx.url, cache=tmp_path / "c")
        f = ix.project("pkg").files[Version("1.0")][0]
        root = sitefetch.lay_out(ix, f, "py")
        assert (root / "pkg" / "mod7.py").read_text().startswith("X7 = 7")
        assert (root / "pkg-1.0.dist-info" / "METADATA").is_file() and not list(root.rglob("*.so"))
        assert ix.stats["downloads"] == 0 and fx.range_requests
        assert ix.stats["bytes_ranged"] < whl.stat().st_size / 4, ix.stats     # the .so members never travelled
        meta = sitefetch.lay_out(ix, f, "meta")
        assert not (meta / "pkg").exists() and (meta / "pkg-1.0.dist-info" / "METADATA").is_file()
        n = len(fx.requests)
        assert sitefetch.lay_out(Index(fx.url, cache=tmp_path / "c"), f, "py") == root
        assert len(fx.requests) == n              # the second lay-out is the cached folder: nothing fetched


def test_a_server_that_ignores_ranges_gets_a_checked_whole_download(tmp_path):
    (tmp_path / "w").mkdir()
    whl = _big_wheel(tmp_path / "w")
    with FakeIndex(tmp_path / "w", ranges=False) as fx:
        ix = Index(fx.url, cache=tmp_path / "c")
        root = sitefetch.lay_out(ix, ix.project("pkg").files[Version("1.0")][0], "py")
        assert (root / "pkg" / "mod0.py").is_file() and not list(root.rglob("*.so"))
        assert ix.stats["downloads"] == 1 and ix.stats["bytes_downloaded"] == whl.stat().st_size
    with FakeIndex(tmp_path / "w", ranges=False, bad_hash={whl.name}) as fx:      # planted: the hash differs
        ix = Index(fx.url, cache=tmp_path / "c2")
        with pytest.raises(RegistryError, match="hashes to sha256"):
            sitefetch.lay_out(ix, ix.project("pkg").files[Version("1.0")][0], "py")
        assert not list((tmp_path / "c2").glob("site/*-py/pkg"))


def test_a_member_outside_the_wheel_folder_is_refused(tmp_path):
    (tmp_path / "w").mkdir()
    make_wheel(tmp_path / "w", "evil", "1.0", files={"../escape.py": "x = 1\n"})
    with FakeIndex(tmp_path / "w") as fx:
        ix = Index(fx.url, cache=tmp_path / "c")
        with pytest.raises(RegistryError, match="outside its folder"):
            sitefetch.lay_out(ix, ix.project("evil").files[Version("1.0")][0], "py")
    assert not (tmp_path / "escape.py").exists()


def test_bad_lay_out_requests_are_refused(tmp_path):
    from radar_support import make_sdist
    (tmp_path / "w").mkdir()
    make_sdist(tmp_path / "w", "src", "1.0")
    with FakeIndex(tmp_path / "w") as fx:
        ix = Index(fx.url, cache=tmp_path / "c")
        f = ix.project("src").files[Version("1.0")][0]
        with pytest.raises(ValueError, match="not a wheel"):
            sitefetch.lay_out(ix, f, "py")
        with pytest.raises(ValueError, match="what='all'"):
            sitefetch.lay_out(ix, f, "all")


# ------------------------------------------------------------------------------------ the tier on a site (offline)
def _dist(root: Path, name: str, version: str, requires: list[str] = (), files: dict | None = None) -> Path:
    d = root / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("\n".join(["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
                                          + [f"Requires-Dist: {r}" for r in requires]) + "\n")
    for rel, text in (files or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_tier_on_a_site_sees_only_the_site_and_reads_torchs_cuda_build_from_its_metadata(tmp_path):
    # the interpreter running these tests has a torch installed; the site has none of its own
    empty = site.run([_dist(tmp_path / "empty", "nothing", "1.0")], engine="vllm")
    env = empty["report"]["environment"]
    assert "torch" not in env["packages"] and env["torch"]["import_error"] == "torch is not in the site"
    assert all(v["status"] == "skipped" for v in empty["report"]["verdicts"] if v.get("engine") == "vllm"), empty
    # torch laid out as metadata only: its version and CUDA build from Requires-Dist, nothing imported
    t = site.run([_dist(tmp_path / "t", "torch", "2.15.0", ["cuda-toolkit[cudart]==13.2.2", "filelock"])], engine="vllm")
    torch = t["report"]["environment"]["torch"]
    assert torch["version"] == "2.15.0" and torch["cuda"] == "13.2" and "Requires-Dist" in torch["cuda_source"]
    assert "not assessed" in t["report"]["environment"]["health"]["imports_not_assessed"]
    # planted: a CPU build pins no CUDA runtime, and says so
    cpu = site.run([_dist(tmp_path / "cpu", "torch", "2.15.0", ["filelock"])], engine="vllm")
    assert cpu["report"]["environment"]["torch"]["cuda"] is None


def test_a_missing_site_folder_is_a_clear_error(tmp_path):
    with pytest.raises(site.SiteError, match="site folder"):
        site.run([tmp_path / "nope"])


def _result(statuses: dict, headline: str = "h") -> dict:
    return {"headline": {"vllm": headline}, "report": {"verdicts": [
        {"backend": b, "status": s, "gate": g, "cause": c, "scope": "engine", "engine": "vllm", "tier": "static"}
        for b, (s, g, c) in statuses.items()]}}


def test_changes_name_each_moved_status_with_its_deciding_line():
    old = _result({"ep-flashinfer-a2a": ("opt-in", "setting", "opt-in: set --all2all-backend"),
                   "b12x": ("not-integrated", "not-integrated", "no")})
    new = _result({"ep-flashinfer-a2a": ("startup-failure-if-set", "topology", "all2all.py:659 asserts"),
                   "b12x": ("not-integrated", "not-integrated", "no")}, headline="h2")
    assert site.changes(old, new) == [{"engine": "vllm", "backend": "ep-flashinfer-a2a", "old": "opt-in",
                                       "new": "startup-failure-if-set", "deciding": "all2all.py:659 asserts"}]
    assert site.headline_change(old, new) == {"vllm": ("h", "h2")}
    assert site.changes(old, old) == [] and site.headline_change(old, old) == {}      # twin: nothing moved


def _flashinfer_tree(root: Path, tune: int, calls: list[str]) -> Path:
    body = "\n".join(f"    module.{c}()" for c in calls)
    files = {"flashinfer/__init__.py": "", "flashinfer/jit/comm.py": "def gen_pcie_ipc_comm_module():\n    pass\n",
             "flashinfer/comm/pcie_ipc_tuning.py": f"_PCIE_IPC_MEMOP_TUNE_VERSION = {tune}\n",
             "flashinfer/comm/pcie_ipc_ar.py": ("from ..jit.comm import gen_pcie_ipc_comm_module\n\n"
                                                "def get_pcie_ipc_comm_module():\n"
                                                "    module = gen_pcie_ipc_comm_module().build_and_load()\n"
                                                f"{body}\n    return module\n")}
    return _dist(root, "flashinfer-python", "1.0", files=files)


def test_move_costs_read_an_aot_module_to_rebuild_and_a_tune_cache_to_redo(tmp_path):
    old = _flashinfer_tree(tmp_path / "old", 4, ["init", "all_reduce"])
    new = _flashinfer_tree(tmp_path / "new", 5, ["init", "all_reduce", "set_ce_slow_hops"])
    costs = site.move_costs([old], [new])
    assert len(costs) == 2, costs
    assert costs[0].startswith("AOT module to rebuild: the PCIe IPC allreduce module") and "set_ce_slow_hops" in costs[0]
    assert costs[1].startswith("tune cache to redo: _PCIE_IPC_MEMOP_TUNE_VERSION 4 -> 5")
    # twins: the same module and tune version cost nothing; a removed call is no rebuild either
    same = _flashinfer_tree(tmp_path / "same", 4, ["init", "all_reduce"])
    assert site.move_costs([old], [same]) == []
    fewer = _flashinfer_tree(tmp_path / "fewer", 4, ["init"])
    assert site.move_costs([old], [fewer]) == []
    assert site.move_costs([tmp_path / "none"], [new]) == []        # no FlashInfer in the old site: nothing compared
    older = _dist(tmp_path / "older", "flashinfer-python", "0.6", files={"flashinfer/__init__.py": ""})
    assert site.move_costs([older], [new])[0].startswith("AOT module to build: the PCIe IPC allreduce module")


# ------------------------------------------------------------------------------------ real wheels (network)
def _vllm_row(tmp_path: Path, component: str) -> tuple[dict, Checker]:
    recipes = load_recipes()
    ix = Index(cache=CACHE)
    r = R.radar("13.1", index=ix, recipes=recipes, runtime="vllm")
    data = [R.to_json(r)]
    ck = Checker(ix, recipes, recipes.toolchain("13.1"), "vllm")
    return radar_row(data, "13.1", component, "vllm"), ck


def _reader_says(ck: Checker, detail: dict, backend: str) -> tuple[str, str]:
    """(old, new) status of ``backend`` that validate's readers give on the pinned set and the move's set."""
    base = moves.statuses_of_base(ck, "12.0", 8, "pcie")
    new = moves.run_site(ck, moves.Candidate(detail["set"]), "12.0", 8, "pcie")
    a, b = site.statuses(base).get(("vllm", backend)), site.statuses(new).get(("vllm", backend))
    return site._word(a), site._word(b)


@pytest.mark.network
def test_flashinfer_0_7_4_under_vllm_0_33_0_costs_a_pcie_ipc_rebuild_and_its_tune_cache(tmp_path):
    row, ck = _vllm_row(tmp_path, "flashinfer-python")
    assert row["pinned"] == "0.7.2.post1" and Version(row["newest"]) >= Version("0.7.4")
    d = next(x for x in row["move_detail"] if x["version"] == "0.7.4" or x["label"] == "newest")
    assert d["set"]["flashinfer-python"] == row["newest"] and d["set"]["vllm"] == "0.33.0"
    assert any("breaks vllm 0.33.0's pin `flashinfer-python==0.7.2.post1`" in b for b in d["breaks"]), d
    if d["version"] == "0.7.4":
        assert any(c.startswith("AOT module to rebuild: the PCIe IPC allreduce module (gen_pcie_ipc_comm_module)")
                   and "set_ce_slow_hops" in c for c in d["costs"]), d["costs"]
        assert any("tune cache to redo: _PCIE_IPC_MEMOP_TUNE_VERSION 4 -> 5" in c for c in d["costs"]), d["costs"]
        assert "costs: AOT module to rebuild" in row["move"]
    # the two-sided all-to-all: the row says exactly what validate's readers say on the two sets
    old, new = _reader_says(ck, d, "ep-flashinfer-a2a")
    assert old == "opt-in"
    if new != old:
        assert f"vllm ep-flashinfer-a2a: {old} -> {new}" in row["move"]
    else:
        assert not any(m["backend"] == "ep-flashinfer-a2a" for m in d["changes"])


@pytest.mark.network
def test_flashinfer_0_7_4_under_vllm_0_33_0_makes_two_sided_a_startup_failure(tmp_path):
    """0.7.4 deletes flashinfer.comm.trtllm_alltoall; vllm 0.33.0's FlashInferNVLinkTwoSidedManager asserts
    has_flashinfer_nvlink_two_sided(), which needs its MnnvlMoe: opt-in on 0.7.2.post1 (the twin, the move's left
    side), start-up failure on 0.7.4."""
    row, _ = _vllm_row(tmp_path, "flashinfer-python")
    assert "vllm ep-flashinfer-a2a: opt-in -> startup-failure-if-set" in row["move"], row["move"]


@pytest.mark.network
def test_vllm_0_34_0_is_not_installable_without_flashinfer_0_7_3_and_is_read_as_a_what_if(tmp_path):
    row, ck = _vllm_row(tmp_path, "vllm")
    assert row["pinned"] == "0.33.0" and Version(row["newest"]) >= Version("0.34.0")
    d = next(x for x in row["move_detail"] if x["label"] == "newest")
    if d["version"] == "0.34.0":
        assert any(b.startswith("not installable: vllm 0.34.0 Requires-Dist `flashinfer-python==0.7.3`")
                   and "what-if read with flashinfer-python" in b for b in d["breaks"]), d["breaks"]
        assert Version(d["set"]["flashinfer-python"]) >= Version("0.7.4")
    old, new = _reader_says(ck, d, "ep-flashinfer-a2a")
    assert old == "opt-in"
    assert (f"vllm ep-flashinfer-a2a: {old} -> {new}" in row["move"]) is (new != old), row["move"]


@pytest.mark.network
def test_vllm_0_34_0_makes_two_sided_a_startup_failure_without_nvlink(tmp_path):
    row, _ = _vllm_row(tmp_path, "vllm")
    assert "vllm ep-flashinfer-a2a: opt-in -> startup-failure-if-set" in row["move"], row["move"]
    d = next(x for x in row["move_detail"] if x["label"] == "newest")
    m = next(m for m in d["changes"] if m["backend"] == "ep-flashinfer-a2a")
    assert "nvlink_common.py" in m["deciding"] or "mnnvl_mapping_and_config" in m["deciding"], m


@pytest.mark.network
def test_scan_gives_the_engine_answers_of_each_release_read_on_a_site():
    recipes = load_recipes()
    ix = Index(cache=CACHE)
    ans = moves.engine_answers(ix, recipes, "vllm", [Version("0.33.0"), Version("0.34.0")])
    assert ans["toolchain"] == "13.1" and ans["runtime"] == "vllm" and ans["engine"] == "vllm"
    a, b = ans["releases"]["0.33.0"], ans["releases"]["0.34.0"]
    assert a["breaks"] == [] and a["statuses"]["ep-flashinfer-a2a"] == "opt-in"
    assert any("flashinfer-python==0.7.3" in x for x in b["breaks"]) and b["set"]["vllm"] == "0.34.0"
    text = moves.render_engine_answers(ans, "vllm")
    assert f"ep-flashinfer-a2a: {b['statuses']['ep-flashinfer-a2a']} (was opt-in)" in text, text
    assert ix.stats.get("bytes_downloaded", 0) == 0         # the engine answers take no whole file


def test_scan_engine_answers_name_the_chain_or_say_none_reads_it():
    recipes = load_recipes()
    tc, rt = moves.chain_for(recipes, "vllm")
    assert rt == "vllm" and "vllm" in Checker(Index(), recipes, tc, rt).pins
    tc2, rt2 = moves.chain_for(recipes, "sglang")
    assert rt2 != "vllm"
    assert moves.chain_for(recipes, "no-such-package") is None      # planted: nothing installs it
    none = moves.engine_answers(Index(), recipes, "no-such-package", [Version("1.0")])
    assert none["not_read"].startswith("no image chain in the recipes installs no-such-package")
    assert moves.render_engine_answers(none, "no-such-package").startswith("engine answers: not read:")


@pytest.mark.network
def test_the_radar_json_keeps_each_moves_set_changes_and_headlines(tmp_path):
    row, _ = _vllm_row(tmp_path, "flashinfer-python")
    d = row["move_detail"][0]
    assert set(d) >= {"version", "label", "set", "breaks", "changes", "costs", "headline", "notes"}
    assert d["headline"]["old"]["vllm"].startswith("with no flags: a decode-step allreduce takes")
    json.dumps(row)
