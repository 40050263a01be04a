"""Plan: rules before any build (C1-C4, C8, C10, pip base without nvcc), hashes (stable, sensitive to the
right inputs only), --skip, and the dry-run text. No Docker."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cudastack.core.errors import ArchError, UsageError
from cudastack.plan.planner import PROJECT_ROOT, content_hash, make_plan, render_plan
from recipe_support import edit
from cudastack.plan.rules import Resources

SMALL = Resources(2, 24.0, "test: 2 cores, 24 GiB")   # the C8 builder
BIG = Resources(64, 512.0, "test: 64 cores, 512 GiB")
FIXTURE_RECIPES = Path(__file__).parent / "fixtures" / "recipes"


def plan(cuda="13.1", **kw):
    kw.setdefault("resources", SMALL)
    return make_plan(kw.pop("recipes", None), cuda, **kw)


def knobs(p, node):
    return {k.name: k for k in p.node(node).knobs}


def hashes(p):
    return {n.name: n.hash for n in p.nodes}




# ------------------------------------------------------------------------------------- DAG shape
def test_13_1_plan_is_the_full_dag_with_the_compiling_nodes_last_before_runtime():
    p = plan()
    names = [n.name for n in p.nodes if n.name not in ("vllm-torch", "vllm")]   # SGLang's chain (vLLM's: below)
    assert names[0] == "base" and names[1] == "torch" and names[-1] == "runtime"
    assert set(names[2:5]) == {"flashinfer", "sgl-kernel", "flash-attn"}
    assert names[3:5] == ["flash-attn", "flashinfer"]    # the source and aot builds go last (file order)
    assert p.node("runtime").parents[0] == "torch"       # image parent first
    assert set(p.node("runtime").parents) == {"torch", "flash-attn", "sgl-kernel", "flashinfer"}
    assert p.base_kind == "pip" and p.nodes[0].kind == "base-pip"
    assert p.node("torch").build_args["PIP_SPECS"] == "torch==2.14.1"
    assert p.node("runtime").build_args["PIP_SPECS"] == "sglang==0.5.23 torchvision==0.29.2"
    assert p.node("sgl-kernel").build_args["PIP_SPECS"] == "sglang-kernel==0.4.10"
    for n in p.nodes[1:]:
        assert n.build_args["PARENT_IMAGE"] == p.node(n.parents[0]).tag
    for n in p.nodes:
        assert n.hash in (n.tag.split(":")[1] + n.hash[16:],) and len(n.hash) == 64


def test_12_8_defaults_to_the_nvidia_base_and_its_own_torch_line():
    p = plan("12.8")
    assert p.base_kind == "nvidia"
    assert p.nodes[0].build_args["BASE_IMAGE"] == "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"
    assert p.node("torch").build_args["PIP_SPECS"] == "torch==2.9.1"
    assert p.node("sgl-kernel").build_args["PIP_SPECS"] == "sgl-kernel==0.3.21"
    assert p.node("runtime").build_args["FLASHINFER_CUDA_ARCH_LIST"] == "12.0a"   # C4


def test_fixture_recipes_give_a_three_node_chain():
    p = make_plan(FIXTURE_RECIPES, "13.1", resources=SMALL)
    assert [(n.name, n.kind, n.parents) for n in p.nodes] == [
        ("base", "base-pip", []), ("cuda-ext", "wheels", ["base"]), ("runtime", "runtime", ["base", "cuda-ext"])]
    ext = p.node("cuda-ext")
    assert ext.method == "source" and ext.build_args["SOURCE_DIR"] == "src" and ext.context["src"].endswith("cuda_ext")
    assert knobs(p, "cuda-ext")["CUDA_EXT_ARCHS"].value == "120"


# ----------------------------------------------------------------------------------- rules C1-C4
def test_c1_arch_12_1_on_cuda_12_8_is_refused_naming_the_minimum():
    with pytest.raises(ArchError) as e:
        plan("12.8", archs="12.1")
    assert "CUDA >= 12.9" in str(e.value) and "--cuda 13.1" in str(e.value)
    assert e.value.exit_code == 4


@pytest.mark.parametrize("arch", ["7.0", "6.1", "5.0", "12.0;7.2"])
def test_c2_archs_dropped_by_cuda_13_are_refused(arch):
    with pytest.raises(ArchError, match=r"CUDA 13.0 dropped arch"):
        plan("13.1", archs=arch)


def test_c2_the_same_arch_is_fine_on_cuda_12():
    p = plan("12.8", archs="7.0;12.0")
    assert knobs(p, "flash-attn")["FLASH_ATTN_CUDA_ARCHS"].value == "70;120"


def test_c3_family_suffix_on_12_8_is_refused_suggesting_a():
    with pytest.raises(ArchError) as e:
        plan("12.8", archs="12.0f")
    assert "12.0a" in str(e.value) and "CUDA >= 12.9" in str(e.value)


def test_c3_a_suffix_is_accepted_on_12_8_and_f_on_13_1():
    assert plan("12.8", archs="12.0a").node("runtime").build_args["FLASHINFER_CUDA_ARCH_LIST"] == "12.0a"
    assert plan("13.1", archs="12.0f").node("runtime").build_args["FLASHINFER_CUDA_ARCH_LIST"] == "12.0f"


def test_bad_arch_spelling_is_an_arch_error():
    with pytest.raises(ArchError, match="not a compute capability"):
        plan("13.1", archs="blackwell")


def test_c4_flashinfer_gets_an_explicit_suffix_per_toolchain():
    for cuda, want in (("12.8", "12.0a"), ("13.1", "12.0f")):
        p = plan(cuda)
        k = knobs(p, "runtime")["FLASHINFER_CUDA_ARCH_LIST"]
        assert k.value == want and k.source == "toolchain"
    # an explicit suffix from the command line is used verbatim
    assert plan("13.1", archs="12.0a").node("runtime").build_args["FLASHINFER_CUDA_ARCH_LIST"] == "12.0a"


def test_pip_base_for_cuda_12_with_a_source_recipe_is_refused():
    with pytest.raises(ArchError) as e:    # an impossible toolkit combination: exit 4 (README)
        plan("12.8", base="pip")
    assert e.value.exit_code == 4
    msg = str(e.value)
    assert "flash-attn" in msg and "--base nvidia" in msg and "--skip flash-attn" in msg and "13.x" in msg


def test_pip_base_for_cuda_12_is_fine_without_source_recipes():
    p = plan("12.8", base="pip", skip=["flash-attn"])
    assert p.base_kind == "pip" and "flash-attn" not in [n.name for n in p.nodes]
    assert p.nodes[0].build_args["CUDA_WHEEL_ROOT"] == ""


def test_unknown_base_and_cuda():
    with pytest.raises(UsageError, match="Unknown base 'conda'"):
        plan("13.1", base="conda")
    with pytest.raises(UsageError, match=r"Unknown CUDA version '11.8'.*12.8, 13.1"):
        plan("11.8")


# --------------------------------------------------------------------------------- C8 memory rule
def test_c8_flash_attn_on_a_24_gib_2_core_builder():
    k = knobs(plan(resources=SMALL), "flash-attn")
    assert k["MAX_JOBS"].value == "2" and k["MAX_JOBS"].source == "memory-rule"
    assert "9 GiB per job" in k["MAX_JOBS"].why and "24.0 GiB" in k["MAX_JOBS"].why
    assert k["NVCC_THREADS"].value == "1" and k["NVCC_THREADS"].source == "memory-rule"


def test_c8_memory_bounds_jobs_on_a_many_core_small_memory_builder():
    k = knobs(plan(resources=Resources(32, 24.0, "t")), "flash-attn")
    assert k["MAX_JOBS"].value == "2"                # 0.9 * 24 / 9 = 2.4
    assert k["NVCC_THREADS"].value == "4"            # the recipe's threads fit the cores
    k = knobs(plan(resources=Resources(2, 6.0, "t")), "flash-attn")
    assert k["MAX_JOBS"].value == "1"                # never below one job
    k = knobs(plan(resources=BIG), "flash-attn")
    assert k["MAX_JOBS"].value == "51" and k["NVCC_THREADS"].value == "1"


def test_c8_cli_overrides_win_and_say_so():
    k = knobs(plan(max_jobs=1, nvcc_threads=2), "flash-attn")
    assert (k["MAX_JOBS"].value, k["MAX_JOBS"].source) == ("1", "cli")
    assert (k["NVCC_THREADS"].value, k["NVCC_THREADS"].source) == ("2", "cli")
    k = knobs(plan(max_jobs=8), "flash-attn")
    assert "OOM" in k["MAX_JOBS"].why
    with pytest.raises(UsageError):
        plan(max_jobs=0)


def test_c8_rule_is_printed_in_the_dry_run():
    text = render_plan(plan(resources=SMALL))
    assert "Memory rule (C8)" in text and "floor(0.9 x memory" in text
    assert "MAX_JOBS=2  [memory-rule]" in text and "9 GiB per compile job" in text


# ----------------------------------------------------------------------------------- C10 sgl-kernel
def test_c10_sgl_kernel_wheel_gets_no_torch_arch_list(recipes_copy):
    p = plan()
    assert "TORCH_CUDA_ARCH_LIST" not in knobs(p, "sgl-kernel")
    assert any("ignores TORCH_CUDA_ARCH_LIST" in n and "sm_120a" in n for n in p.node("sgl-kernel").notes)


def test_c10_sgl_kernel_from_source_uses_its_own_knobs(recipes_copy):
    def to_source(d):
        d["toolchains"]["13.1"] = {"method": "source", "sdist": {"package": "sglang-kernel", "version": "0.4.10"},
                                   "build_deps": ["scikit-build-core==0.11.6", "cmake==4.1.0"]}
    edit(recipes_copy / "sgl-kernel.yaml", to_source)
    p = plan(recipes=recipes_copy, archs="12.0;8.0")
    k = knobs(p, "sgl-kernel")
    assert "TORCH_CUDA_ARCH_LIST" not in k
    assert k["SGL_KERNEL_COMPILE_THREADS"].source == "memory-rule"
    assert k["MAX_JOBS"].value == k["CMAKE_BUILD_PARALLEL_LEVEL"].value == "2"
    assert k["CMAKE_BUILD_TYPE"].value == "Release"
    assert p.node("sgl-kernel").build_args["BUILD_DEPS"] == "scikit-build-core==0.11.6 cmake==4.1.0"
    assert any("sgl-kernel" in w and "8.0" in w for w in p.warnings)     # 8.0 is not hard-coded


# ----------------------------------------------------------------------------------------- hashes
def test_hashes_are_stable_and_ignore_the_builder_size():
    assert hashes(plan()) == hashes(plan())
    assert hashes(plan(resources=SMALL)) == hashes(plan(resources=BIG))      # parallelism is not hashed
    assert hashes(plan(max_jobs=1)) == hashes(plan())
    assert content_hash({"b": 1, "a": [1, 2]}) == content_hash({"a": [1, 2], "b": 1})


def test_hashes_differ_between_toolchains_and_bases():
    a, b = hashes(plan("13.1")), hashes(plan("12.8"))
    assert not set(a.values()) & set(b.values())
    assert hashes(plan("13.1", base="nvidia"))["base"] != a["base"]


def test_changing_one_component_recipe_changes_only_it_and_the_runtime(recipes_copy):
    before = hashes(plan(recipes=recipes_copy))
    edit(recipes_copy / "flashinfer.yaml",
         lambda d: d["toolchains"]["13.1"].__setitem__("packages", ["flashinfer-python==0.7.2", "flashinfer-cubin==0.7.2"]))
    after = hashes(plan(recipes=recipes_copy))
    assert {n for n in before if before[n] != after[n]} == {"flashinfer", "runtime"}


def test_comments_and_descriptions_do_not_change_hashes(recipes_copy):
    before = hashes(plan(recipes=recipes_copy))
    p = recipes_copy / "flash-attn.yaml"
    p.write_text("# a new comment\n" + p.read_text().replace('description: "flash-attn 2', 'description: "FA2'))
    assert hashes(plan(recipes=recipes_copy)) == before


def test_changing_the_toolchain_changes_every_node(recipes_copy):
    before = hashes(plan(recipes=recipes_copy))
    edit(recipes_copy / "toolchains.yaml",
         lambda d: d["toolchains"]["13.1"]["bases"]["pip"].__setitem__("os_image", "cudastack-test/debian:trixie"))
    after = hashes(plan(recipes=recipes_copy))
    assert all(before[n] != after[n] for n in before)


def test_changing_a_dockerfile_changes_its_nodes_and_their_descendants(tmp_path):
    images = tmp_path / "images"
    shutil.copytree(PROJECT_ROOT / "images", images)
    before = hashes(plan(images_dir=images))
    with open(images / "wheels.Dockerfile", "a") as f:
        f.write("\n# changed\n")
    after = hashes(plan(images_dir=images))
    assert {n for n in before if before[n] != after[n]} == {"sgl-kernel", "flash-attn", "runtime"}
    with open(images / "wheels-aot.Dockerfile", "a") as f:     # 13.1's flashinfer is built ahead of time
        f.write("\n# changed\n")
    again = hashes(plan(images_dir=images))
    assert {n for n in after if after[n] != again[n]} == {"flashinfer", "runtime"}


def test_changing_the_target_arch_changes_only_arch_dependent_nodes():
    a, b = hashes(plan(archs="12.0")), hashes(plan(archs="12.0;9.0"))
    assert {n for n in a if a[n] != b[n]} == {"flash-attn", "flashinfer", "runtime", "vllm"}   # aot: FLASHINFER_CUDA_ARCH_LIST; vllm: its runtime env


def test_local_source_content_is_hashed(tmp_path):
    fx = tmp_path / "fixtures"
    shutil.copytree(FIXTURE_RECIPES.parent / "recipes", fx / "recipes")
    shutil.copytree(FIXTURE_RECIPES.parent / "cuda_ext", fx / "cuda_ext")
    before = hashes(make_plan(fx / "recipes", "13.1", resources=SMALL))
    (fx / "cuda_ext" / "src" / "kernel.cu").write_text((fx / "cuda_ext" / "src" / "kernel.cu").read_text() + "\n// x\n")
    after = hashes(make_plan(fx / "recipes", "13.1", resources=SMALL))
    assert {n for n in before if before[n] != after[n]} == {"cuda-ext", "runtime"}


# ------------------------------------------------------------------------------------------ skips
def test_skip_drops_the_wheel_from_the_runtime():
    p = plan(skip=["flash-attn"])
    assert "flash-attn" not in [n.name for n in p.nodes] and "flash-attn" not in p.node("runtime").parents
    assert p.skipped == ["flash-attn"]
    assert p.node("runtime").hash != plan().node("runtime").hash
    assert p.node("flashinfer").hash == plan().node("flashinfer").hash


def test_skip_errors():
    with pytest.raises(UsageError, match="Unknown component 'flash'"):
        plan(skip=["flash"])
    with pytest.raises(UsageError, match="Cannot skip 'base'"):
        plan(skip=["base"])
    with pytest.raises(UsageError, match="Cannot skip 'torch'"):
        plan(skip=["torch"])
    assert [n.name for n in plan(skip=["sglang", "vllm"]).nodes][-1] == "flashinfer"   # by file stem
    with pytest.raises(UsageError, match="Cannot skip 'vllm-torch': 'vllm' needs it"):
        plan(skip=["vllm-torch"])


# --------------------------------------------------------------------------------------- rendering
def test_dry_run_text_lists_every_node_hash_state_and_knob_source():
    p = plan()
    cached = {n.name: n.name in ("base", "torch") for n in p.nodes}
    text = render_plan(p, cached)
    for n in p.nodes:
        assert n.hash in text and n.tag in text
    assert text.count(" cached") >= 2 and "to build" in text
    assert "FLASH_ATTN_CUDA_ARCHS=120  [default]" in text
    assert "FLASH_ATTENTION_FORCE_BUILD=TRUE  [recipe]" in text
    assert "FLASHINFER_CUDA_ARCH_LIST=12.0f  [toolchain]" in text
    assert "CUDA_VERSION=13.1.1  [toolchain]" in text
    assert "2 of 8 nodes cached" in text     # SGLang's six nodes and vLLM's two (vllm-torch, vllm)
    assert "FLASH_ATTN_CUDA_ARCHS=120  [cli]" in render_plan(plan(archs="12.0"))


def test_dry_run_12_8_shows_its_versions():
    text = render_plan(plan("12.8"))
    for s in ("torch==2.9.1", "sglang==0.5.9", "sgl-kernel==0.3.21", "flashinfer-python==0.6.3",
              "FLASHINFER_CUDA_ARCH_LIST=12.0a", "nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04"):
        assert s in text


def _invoke(*args):
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=PROJECT_ROOT, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": "unix:///nonexistent.sock"})


def test_cli_dry_run_and_exit_codes():
    r = _invoke("plan", "--cuda", "12.8")
    assert r.returncode == 0, r.stderr
    assert "torch==2.9.1" in r.stdout and "Cached state unknown" in r.stdout
    # the dry run rehearses the build: with no engine it prints the same plan, then refuses as the build does
    r = _invoke("build", "--cuda", "12.8", "--dry-run")
    assert r.returncode == 5 and "torch==2.9.1" in r.stdout, r.stderr
    assert "Docker engine and BuildKit: REFUSED (exit 5)" in r.stdout and "error: No Docker engine answers" in r.stderr
    r = _invoke("build", "--cuda", "12.9", "--dry-run")
    assert r.returncode == 2 and "Known toolchains: 12.8, 13.1" in r.stderr
    r = _invoke("build", "--cuda", "12.8", "--arch", "12.1", "--dry-run")
    assert r.returncode == 4 and "CUDA >= 12.9" in r.stderr
    r = _invoke("build", "--cuda", "13.1", "--skip", "nope", "--dry-run")
    assert r.returncode == 2 and "Unknown component" in r.stderr
    r = _invoke("build", "--cuda", "13.1", "--max-jobs", "two", "--dry-run")
    assert r.returncode == 2


def test_cli_build_without_a_daemon_says_how_to_start_one():
    r = _invoke("build", "--cuda", "13.1")
    assert r.returncode == 5 and "dockerd" in r.stderr


def test_cli_help_documents_every_flag():
    r = _invoke("--help", "build")
    for flag in ("--cuda", "--arch", "--base", "--dry-run", "--skip", "--max-jobs", "--nvcc-threads", "--ca-bundle",
                 "--recipes", "--state-dir"):
        assert flag in r.stdout
    assert "--=STRING" not in r.stdout


def test_a_probe_change_leaves_every_tag_unchanged(tmp_path):
    """The suite travels with the runtime image but is not part of its hash: a probe change needs no rebuild,
    relock or repush (reports name the suite by its own digest)."""
    suite = tmp_path / "stackprobe"
    shutil.copytree(PROJECT_ROOT / "validate" / "stackprobe", suite, ignore=shutil.ignore_patterns("__pycache__"))
    before = plan(stackprobe_dir=suite)
    (suite / "probes" / "nccl.py").write_text((suite / "probes" / "nccl.py").read_text() + "\n# a probe change\n")
    after = plan(stackprobe_dir=suite)
    assert hashes(before) == hashes(after) and [n.tag for n in before.nodes] == [n.tag for n in after.nodes]
    assert before.node("runtime").context["stackprobe"] == str(suite)          # still copied into the image
    # the Dockerfile of the runtime node, by contrast, is an input
    images = tmp_path / "images"
    shutil.copytree(PROJECT_ROOT / "images", images)
    (images / "runtime.Dockerfile").write_text((images / "runtime.Dockerfile").read_text() + "\n# changed\n")
    assert hashes(plan(stackprobe_dir=suite, images_dir=images))["runtime"] != hashes(before)["runtime"]


def test_the_dry_run_shortens_a_long_build_arg_and_says_how_much_it_left_out():
    from cudastack.plan.render import ARG_LINES, _arg_text
    closure = "\n".join(f"pkg{i}==1.0 --hash=sha256:{i:064d}" for i in range(40))
    shown = _arg_text("PIP_SPECS_LOCKED", closure)
    assert shown.splitlines()[:ARG_LINES] == closure.splitlines()[:ARG_LINES]
    assert f"... {40 - ARG_LINES} more lines" in shown
    assert "pkg39==" not in shown
    short = "\n".join(closure.splitlines()[:ARG_LINES])
    assert _arg_text("PIP_SPECS_LOCKED", short) == short          # at the limit: whole, no count
    assert _arg_text("WHEEL_NAMES", "") == "(filled at build time)"
