"""Source methods for every component: the recipes' `source:` blocks (torch, sgl-kernel), --method / --source,
url + sha256, git and path sources with patches and subdir, CMake defines, and the dry run's costs (arch flags,
compile units counted from the source, jobs, time from the measured unit costs). No Docker, except the git
source, which needs the git client (a local repository, no network)."""
from __future__ import annotations

import hashlib
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from cudastack.plan import costs
from cudastack.core.errors import BuildError, RecipeError, UsageError
from cudastack.plan.planner import make_plan, render_plan
from cudastack.recipes.load import load_recipes
from cudastack.recipes.select import select_methods
from cudastack.plan.rules import Resources
from cudastack.plan.sources import materialise
from recipe_support import edit

RES = Resources(2, 23.5, "test builder")
SGL_CMAKE = """\
set(SOURCES
    "csrc/a.cu"
    "csrc/b.cu"
    "csrc/ext.cc"   # a comment
    "${repo-dep_SOURCE_DIR}/csrc/c.cu"
)
Python_add_library(common_ops_sm90_build MODULE WITH_SOABI ${SOURCES})
Python_add_library(common_ops_sm100_build MODULE WITH_SOABI ${SOURCES})
file(GLOB GEN_SRCS "${CMAKE_CURRENT_SOURCE_DIR}/gen/*.cu")
file(GLOB DEP_SRCS "${repo-fa_SOURCE_DIR}/hopper/*_sm90.cu")
list(APPEND GEN_SRCS "csrc/flash_extension.cc")
Python_add_library(flash_ops MODULE WITH_SOABI ${GEN_SRCS} ${DEP_SRCS})
"""


def _plan(method=None, source=None, recipes=None, cuda="13.1"):
    r = select_methods(load_recipes(recipes), cuda, method or {}, source or {})
    return make_plan(r, cuda, resources=RES)


@pytest.fixture
def sgl_checkout(tmp_path) -> Path:
    """A folder shaped like sgl-kernel: a CMakeLists.txt whose targets list 2 x (3 .cu + 1 .cc) + 2 globbed
    .cu + 1 .cc, and one glob over a FetchContent folder that is not there."""
    root = tmp_path / "sgl-kernel"
    (root / "gen").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text(SGL_CMAKE)
    for n in ("g1.cu", "g2.cu"):
        (root / "gen" / n).write_text("")
    return root


# ------------------------------------------------------------------------------------ the real recipes
def test_real_recipes_keep_the_wheel_and_offer_a_source_build():
    r = load_recipes()
    torch = r.component("torch").toolchains["13.1"]
    assert torch.method == "wheel" and torch.alternative is not None
    alt = torch.alternative
    assert alt.url["url"].endswith("/v2.14.1/pytorch-v2.14.1.tar.gz") and len(alt.url["sha256"]) == 64
    assert {"USE_CUDA", "USE_NCCL", "USE_DISTRIBUTED", "BUILD_TEST", "USE_FLASH_ATTENTION"} <= set(alt.knobs)
    sgl = r.component("sgl-kernel").toolchains["13.1"]
    assert sgl.method == "wheel" and sgl.alternative.upstream and not sgl.alternative.source_kind
    assert sgl.alternative.cmake_defines == {"ENABLE_BELOW_SM90": "OFF"}
    assert "sm_120a" in sgl.alternative.arch_flags
    assert r.component("sgl-kernel").parallelism.threads_defines == ("SGL_KERNEL_COMPILE_THREADS",)


def test_a_source_block_is_no_input_of_the_wheel_node(recipes_copy):
    """The wheel nodes' hashes (and so every cached image and lock) do not move when a source block is added,
    changed or removed; they do when the wheel pin changes (the check can fail)."""
    before = {n.name: n.hash for n in make_plan(recipes_copy, "13.1", resources=RES).nodes}
    edit(recipes_copy / "torch.yaml", lambda d: d["toolchains"]["13.1"].pop("source"))
    edit(recipes_copy / "sgl-kernel.yaml", lambda d: d["toolchains"]["13.1"]["source"].update(upstream="elsewhere"))
    assert {n.name: n.hash for n in make_plan(recipes_copy, "13.1", resources=RES).nodes} == before
    edit(recipes_copy / "sgl-kernel.yaml", lambda d: d["toolchains"]["13.1"].update(packages=["sglang-kernel==0.4.9"]))
    edit(recipes_copy / "sglang.yaml", lambda d: d["toolchains"]["13.1"]["requires"].update({"sglang-kernel": "0.4.9"}))
    after = {n.name: n.hash for n in make_plan(recipes_copy, "13.1", resources=RES).nodes}
    assert after["sgl-kernel"] != before["sgl-kernel"] and after["torch"] == before["torch"]


# ------------------------------------------------------------------------------------- --method, --source
def test_method_source_swaps_in_the_source_build(sgl_checkout):
    plan = _plan({"torch": "source", "sgl-kernel": "source"}, {"sgl-kernel": str(sgl_checkout)})
    torch, sgl = plan.node("torch"), plan.node("sgl-kernel")
    assert torch.method == "source" and torch.dockerfile == "images/image-source.Dockerfile"
    assert torch.fetch["kind"] == "url" and torch.build_args["SOURCE_DIR"] == "src"
    knobs = {k.name: k.value for k in torch.knobs}
    assert knobs["TORCH_CUDA_ARCH_LIST"] == "12.0" and knobs["BUILD_TEST"] == "0" and knobs["MAX_JOBS"] == "2"
    sk = {k.name: k for k in sgl.knobs}
    assert sk["CMAKE_ARGS"].value == "-DENABLE_BELOW_SM90=OFF -DSGL_KERNEL_COMPILE_THREADS=1"
    assert "CMAKE_ARGS" in sgl.parallel_knobs          # carries a thread count: passed, not hashed
    assert sgl.build_args["SOURCE_DIR"] == "src" and sgl.context["src"] == str(sgl_checkout)
    # the children of a source-built torch build on it
    assert sgl.build_args["PARENT_IMAGE"] == torch.tag
    assert plan.node("runtime").hash != _plan().node("runtime").hash


@pytest.mark.parametrize("method, source, needle", [
    ({"torch": "compile"}, {}, "the method is 'wheel' or 'source'"),
    ({"flashinfer": "source"}, {}, "no source build for CUDA 13.1"),
    ({"flash-attn": "wheel"}, {}, "names no wheel to use instead"),
    ({"sgl-kernel": "source"}, {}, "--source sgl-kernel=DIR"),
    ({}, {"torch": "/tmp"}, "add --method torch=source"),
    ({"torch": "source"}, {"torch": "/nonexistent/torch"}, "is not a folder"),
    ({"nosuch": "source"}, {}, "Unknown component 'nosuch'"),
])
def test_method_and_source_errors_are_one_paragraph_usage_errors(method, source, needle):
    with pytest.raises(UsageError) as exc:
        _plan(method, source)
    assert needle in str(exc.value) and "\n" not in str(exc.value)


# ------------------------------------------------------------------------------------------- the loader
@pytest.mark.parametrize("change, needle", [
    (lambda s: s["url"].update(sha256="abc"), "64 hex digits"),
    (lambda s: s["url"].update(url="https://example.org/torch"), "is not the http(s) URL of a source archive"),
    (lambda s: s.update(git={"url": "https://example.org/x.git", "commit": "v1.0"}), "exactly one of"),
    (lambda s: s.update(unit_cost="fast"), "is not a measured unit class"),
    (lambda s: s.update(colour="red"), "unknown key"),
    (lambda s: s.update(subdir="../up"), "a folder inside the source"),
    (lambda s: s.update(patches=[{"file": "/etc/passwd", "replace": "a", "with": "b"}]), "a path inside the source"),
    (lambda s: s.pop("url"), "must say where the source comes from"),
    (lambda s: s.update(arch_flags=["sm120"]), "is not a SASS target"),
    (lambda s: s.update(cmake_defines={"1BAD": "x"}), "is not a CMake cache variable name"),
    (lambda s: s.update(units_from="all"), "is not allowed here"),
])
def test_bad_source_blocks_are_recipe_errors(recipes_copy, change, needle):
    edit(recipes_copy / "torch.yaml", lambda d: change(d["toolchains"]["13.1"]["source"]))
    with pytest.raises(RecipeError) as exc:
        load_recipes(recipes_copy)
    assert needle in str(exc.value) and "torch.yaml" in str(exc.value)


@pytest.mark.parametrize("file, change, needle", [
    ("flash-attn.yaml", lambda e: e.update(source={"upstream": "x"}), "only a wheel entry of an image or wheels"),
    ("sglang.yaml", lambda e: e.update(source={"upstream": "x"}), "only a wheel entry of an image or wheels"),
    ("flashinfer.yaml", lambda e: e.update(cmake_defines={"A": "1"}), "goes under `source:`"),
    ("flash-attn.yaml", lambda e: e.update(url={"url": "https://example.org/fa.tar.gz", "sha256": "a" * 64}),
     "exactly one of"),
])
def test_source_keys_only_where_they_apply(recipes_copy, file, change, needle):
    """A `source:` block only on a wheel entry of an image/wheels node; source keys only on source entries; one
    location per source entry (the pydantic models and recipes._entry; each case fails on the real recipes)."""
    edit(recipes_copy / file, lambda d: change(d["toolchains"]["13.1"]))
    with pytest.raises(RecipeError) as exc:
        load_recipes(recipes_copy)
    assert needle in str(exc.value) and file in str(exc.value) and "\n" not in str(exc.value)


def test_patches_on_a_wheel_entry_are_refused(recipes_copy):
    edit(recipes_copy / "sgl-kernel.yaml",
         lambda d: d["toolchains"]["13.1"].update(patches=[{"file": "a", "replace": "b", "with": "c"}]))
    with pytest.raises(RecipeError, match="goes under `source:`"):
        load_recipes(recipes_copy)


# ------------------------------------------------------------------------------------------------ costs
def test_dry_run_prints_arch_flags_units_jobs_and_time(sgl_checkout, tmp_path, recipes_copy):
    plan = _plan({"torch": "source", "sgl-kernel": "source"}, {"sgl-kernel": str(sgl_checkout)})
    text = render_plan(plan, None, state_dir=str(tmp_path / "state"))
    torch_part = text.split("] torch ")[1].split("\n[")[0]
    assert "archs   sm_120  (TORCH_CUDA_ARCH_LIST=12.0)" in torch_part
    # not fetched: the recipe's reference count (the official wheel's fatbin containers), and it says so
    assert "units   475 .cu x 1 archs + 0 C/C++  -- the recipe's units_reference (fatbin containers" in torch_part
    assert "counted from the source once it is here: the archive is not in the state folder yet" in torch_part
    aten = costs.unit_costs()["classes"]["aten"]
    assert f"time    about {costs._fmt(475 * (aten['cu_front_seconds'] + aten['cu_seconds_per_arch']) / 2)}" in torch_part
    # without a reference count nothing is guessed
    edit(recipes_copy / "torch.yaml", lambda d: d["toolchains"]["13.1"]["source"].pop("units_reference"))
    bare = render_plan(_plan({"torch": "source"}, recipes=recipes_copy), None, state_dir=str(tmp_path / "state"))
    bare_torch = bare.split("] torch ")[1].split("\n[")[0]
    assert "units   unknown until fetched" in bare_torch and "time    unknown until the source is fetched" in bare_torch
    sgl_part = text.split("] sgl-kernel ")[1].split("\n[")[0]
    assert "archs   sm_90 sm_90a sm_100a sm_103a sm_120a" in sgl_part
    # 2 targets x (2 .cu + 1 dep .cu + 1 .cc) + flash_ops (2 globbed .cu + 1 .cc; the FetchContent glob unresolved)
    assert "units   8 .cu x 5 archs + 3 C/C++" in sgl_part
    assert "unresolved globs: ${repo-fa_SOURCE_DIR}/hopper/*_sm90.cu" in sgl_part
    cls = costs.unit_costs()["classes"]["cutlass"]
    expect = (8 * (cls["cu_front_seconds"] + 5 * cls["cu_seconds_per_arch"]) + 3 * cls["cpp_seconds"]) / 2
    assert f"time    about {costs._fmt(expect)} with 2 jobs (memory rule) on 2 cores" in sgl_part
    assert "    archs " not in text.split("] runtime ")[1].split("\n[")[0]     # nodes that compile nothing get none


def test_a_folder_with_no_compile_unit_is_unknown_never_zero(tmp_path):
    (tmp_path / "empty").mkdir()
    c = costs.count_units({"kind": "path", "path": str(tmp_path / "empty")}, {}, tmp_path)
    assert not c.known and "no compile unit found" in c.how


def test_units_of_a_fetched_archive_are_counted(tmp_path):
    """A url source already in the state folder is counted from the archive (no unpacking)."""
    state = tmp_path / "state"
    (state / "sources").mkdir(parents=True)
    arc = state / "sources" / "proj-1.0.tar.gz"
    with tarfile.open(arc, "w:gz") as t:
        for name in ("proj-1.0/aten/k.cu", "proj-1.0/aten/h.cpp", "proj-1.0/test/t.cu", "proj-1.0/docs/x.cpp"):
            info = tarfile.TarInfo(name)
            info.size = 0
            t.addfile(info, io.BytesIO(b""))
    c = costs.count_units({"kind": "url", "url": "https://example.org/proj-1.0.tar.gz", "sha256": "0" * 64}, {},
                          state)
    assert (c.known, c.cu, c.cpp) == (True, 1, 1)
    missing = costs.count_units({"kind": "url", "url": "https://example.org/other.tar.gz"}, {}, state)
    assert not missing.known and "not in the state folder" in missing.how


@pytest.mark.parametrize("style, value, sep, want", [
    ("torch-list", "12.0", ";", ["sm_120"]),
    ("torch-list", "9.0;12.0+PTX", ";", ["sm_90", "sm_120", "compute_120"]),
    ("numbers", "120", ";", ["sm_120"]),
    ("suffixed", "12.0f", " ", ["sm_120f"]),
    ("suffixed", "12.0a 12.1a", " ", ["sm_120a", "sm_121a"]),
])
def test_arch_flags_follow_each_knob_style(style, value, sep, want):
    assert costs.arch_flags(style, value, sep) == want


def test_setup_py_source_lists_are_counted(tmp_path):
    (tmp_path / "csrc").mkdir()
    for n in ("a.cu", "b.cu", "api.cpp", "unused.cu"):
        (tmp_path / "csrc" / n).write_text("")
    (tmp_path / "setup.py").write_text('srcs = ["csrc/api.cpp", "csrc/a.cu", "csrc/b.cu", "csrc/gone.cu"]\n')
    c = costs.count_in(costs.Tree.folder(tmp_path))
    assert (c.cu, c.cpp) == (2, 1) and "setup.py" in c.how


# ------------------------------------------------------------------------------------- sources + patches
def _tarball(tmp_path: Path) -> tuple[Path, str]:
    src = tmp_path / "pkg-1.0"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "setup.py").write_text("FLAGS = '-std=c++17'\n")
    arc = tmp_path / "pkg-1.0.tar.gz"
    with tarfile.open(arc, "w:gz") as t:
        t.add(src, arcname="pkg-1.0")
    return arc, hashlib.sha256(arc.read_bytes()).hexdigest()


PATCH = [{"file": "setup.py", "replace": "-std=c++17", "with": "-std=c++20", "why": "test"}]


def test_url_source_is_checked_unpacked_and_patched(tmp_path):
    arc, digest = _tarball(tmp_path)
    spec = {"kind": "url", "url": f"file://{arc}", "sha256": digest, "subdir": "sub", "patches": PATCH}
    (tmp_path / "ctx").mkdir()
    used = materialise(spec, tmp_path / "ctx" / "src", tmp_path / "cache")
    assert (tmp_path / "ctx" / "src" / "setup.py").read_text() == "FLAGS = '-std=c++20'\n"
    assert used["sha256"] == digest and used["patches"] == ["setup.py"]
    assert sorted(p.name for p in (tmp_path / "ctx").iterdir()) == ["src"]      # no temporary leftovers


@pytest.mark.parametrize("change, needle", [
    (lambda s: s.update(sha256="0" * 64), "is not the recipe's"),
    (lambda s: s.update(patches=[{"file": "setup.py", "replace": "c++14", "with": "c++20"}]), "matches nothing"),
    (lambda s: s.update(patches=[{"file": "nope.py", "replace": "a", "with": "b"}]), "does not exist"),
    (lambda s: s.update(subdir="other"), "has no folder other"),
])
def test_url_source_failures_stop_before_the_build(tmp_path, change, needle):
    arc, digest = _tarball(tmp_path)
    spec = {"kind": "url", "url": f"file://{arc}", "sha256": digest, "subdir": "sub", "patches": PATCH}
    change(spec)
    (tmp_path / "ctx").mkdir()
    with pytest.raises(BuildError, match=needle):
        materialise(spec, tmp_path / "ctx" / "src", tmp_path / "cache")
    assert not (tmp_path / "ctx" / "src").exists()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git client")
def test_git_source_is_checked_out_at_the_commit_and_patched(tmp_path):
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    run = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True).stdout  # noqa: E731
    run("init", "-q")
    (repo / "sub" / "setup.py").write_text("FLAGS = '-std=c++17'\n")
    run("add", ".")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    first = run("rev-parse", "HEAD").strip()
    (repo / "sub" / "setup.py").write_text("FLAGS = 'moved on'\n")
    run("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "two")
    spec = {"kind": "git", "url": str(repo), "commit": first, "ref": "", "subdir": "sub", "patches": PATCH}
    (tmp_path / "ctx").mkdir()
    used = materialise(spec, tmp_path / "ctx" / "src", tmp_path / "cache")
    assert (tmp_path / "ctx" / "src" / "setup.py").read_text() == "FLAGS = '-std=c++20'\n"   # the pinned commit
    assert used["commit"] == first and not (tmp_path / "ctx" / "src" / ".git").exists()
    with pytest.raises(BuildError, match="git checkout"):
        materialise({**spec, "commit": "f" * 40}, tmp_path / "ctx" / "src2", tmp_path / "cache")


def test_path_source_with_patches_is_copied_not_edited_in_place(tmp_path, recipes_copy):
    src = tmp_path / "ext"
    src.mkdir()
    (src / "setup.py").write_text("FLAGS = '-std=c++17'\n")
    (tmp_path / "ctx").mkdir()
    materialise({"kind": "path", "path": str(src), "patches": PATCH}, tmp_path / "ctx" / "src", tmp_path / "cache")
    assert (tmp_path / "ctx" / "src" / "setup.py").read_text() == "FLAGS = '-std=c++20'\n"
    assert (src / "setup.py").read_text() == "FLAGS = '-std=c++17'\n"


def test_units_from_tree_counts_every_file_not_the_lists(tmp_path):
    """torch's recipe says units_from: tree (its lists are spread over many CMake files): a top-level target
    list must not stand for the whole build."""
    (tmp_path / "CMakeLists.txt").write_text('set(S "a.cu")\nadd_library(x ${S})\n')
    for n in ("a.cu", "b.cu", "c.cpp"):
        (tmp_path / n).write_text("")
    lists = costs.count_units({"kind": "path", "path": str(tmp_path)}, {})
    tree = costs.count_units({"kind": "path", "path": str(tmp_path)}, {}, units_from="tree")
    assert (lists.cu, lists.cpp) == (1, 0) and (tree.cu, tree.cpp) == (2, 1)
    assert load_recipes().component("torch").toolchains["13.1"].alternative.units_from == "tree"
