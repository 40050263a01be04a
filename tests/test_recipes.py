"""Recipes: the real recipes load and form consistent version sets; malformed recipes fail with file + key.
No Docker."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cudastack.core.errors import RecipeError, UsageError
from cudastack.recipes.load import load_recipes
from recipe_support import edit

FIXTURE_RECIPES = Path(__file__).parent / "fixtures" / "recipes"




def test_real_recipes_load_with_both_toolchains_and_every_component():
    r = load_recipes()
    assert {"12.8", "13.1"} <= set(r.toolchains)
    assert r.toolchains["13.1"].cuda_version == "13.1.1"
    assert r.toolchains["12.8"].cuda_version.startswith("12.8.")
    assert {c.stem for c in r.components.values()} >= {"base", "torch", "flash-attn", "sgl-kernel", "flashinfer", "sglang"}
    # 12.8's pip base has no nvcc (CUDA 12 wheels ship only ptxas); 13.1's has
    assert r.toolchains["12.8"].bases["pip"].has_nvcc is False
    assert r.toolchains["13.1"].bases["pip"].has_nvcc is True
    assert r.toolchains["12.8"].default_base == "nvidia"


def _pins(r, tc, runtime="runtime"):
    """{name: version} the image chain of runtime node ``runtime`` pins (SGLang's by default; vLLM's is "vllm")."""
    from cudastack.recipes.graph import chain_pins

    return {n: v for n, (v, _) in chain_pins(r.components, tc, runtime).items()}


def _exact_pins(requires_dist: list[str], names: set[str]) -> dict[str, str]:
    """{name: version} of the ``name==version`` requirements among ``requires_dist`` (Requires-Dist strings)
    that apply without extras on Linux/CPython 3.11, for the canonical ``names`` only."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    env = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "python_version": "3.11", "python_full_version": "3.11.2", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}
    out = {}
    for line in requires_dist:
        req = Requirement(line)
        name = canonicalize_name(req.name)
        if name not in names or (req.marker and not req.marker.evaluate(env)):
            continue
        exact = [s.version for s in req.specifier if s.operator == "=="]
        out[name] = exact[0] if exact else str(req.specifier) or "(unpinned)"
    return out


def test_exact_pins_reads_requires_dist():
    rd = ["torch==2.14.1", "flashinfer_python[cu13]==0.7.2", "sgl-kernel>=0.3", "decord; extra == 'video'",
          "torchao==0.9.0; sys_platform == 'darwin'"]
    names = {"torch", "flashinfer-python", "sgl-kernel", "decord", "torchao"}
    assert _exact_pins(rd, names) == {"torch": "2.14.1", "flashinfer-python": "0.7.2", "sgl-kernel": ">=0.3"}


@pytest.mark.network
@pytest.mark.parametrize("tc", ["12.8", "13.1"])
def test_version_sets_match_the_measured_pypi_metadata(tc):
    """The runtime recipe's ``requires`` and the component recipes' pins equal what the pinned sglang wheel's
    METADATA on PyPI demands (read through pip's installation report, as `invoke lock` reads it)."""
    from packaging.utils import canonicalize_name

    from cudastack import lock as L
    from lock_support import TARGET

    r = load_recipes()
    runtime = r.component("sglang")
    spec = next(p for p in runtime.toolchains[tc].packages if p.startswith("sglang=="))
    requires: dict = {}
    L.pip_resolve([spec], target=dict(TARGET, python_version="3.11"), no_deps=True, requires=requires)
    pins = {canonicalize_name(k): v for k, v in _pins(r, tc).items()}
    stack = {"torch", "sgl-kernel", "sglang-kernel", "flashinfer-python", "flashinfer-cubin", "flash-attn"}
    measured = _exact_pins(requires["sglang"]["requires_dist"], stack)
    assert {"torch", "flashinfer-python"} <= set(measured), measured
    assert {canonicalize_name(k): v for k, v in runtime.toolchains[tc].requires.items()} == measured, \
        f"{spec}'s METADATA pins {measured}; recipes/sglang.yaml says {runtime.toolchains[tc].requires}"
    assert {n: pins.get(n) for n in measured} == measured, f"recipes pin {pins}; {spec} demands {measured}"
    assert pins["torch"] == r.toolchains[tc].torch_version


def test_flash_attn_is_a_source_recipe_with_a_memory_budget():
    fa = load_recipes().component("flash-attn")
    assert all(e.method == "source" for e in fa.toolchains.values())
    assert fa.parallelism.memory_gib_per_job == 9 and fa.parallelism.nvcc_threads == 4
    assert fa.knobs["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    assert fa.arch_knob.knob == "FLASH_ATTN_CUDA_ARCHS"


def test_sgl_kernel_recipe_knows_it_ignores_torch_cuda_arch_list():  # C10
    sk = load_recipes().component("sgl-kernel")
    assert sk.arch_knob.style == "cmake-fixed"
    assert "TORCH_CUDA_ARCH_LIST" in sk.arch_knob.ignores
    assert ("12.0a", "12.8") in sk.arch_knob.covers


def test_dag_comes_from_the_data_fixture_chain():
    r = load_recipes(FIXTURE_RECIPES)
    assert list(r.toolchains) == ["13.1"]
    kinds = {c.name: (c.kind, c.needs) for c in r.components.values()}
    assert kinds == {"base": ("base", []), "cuda-ext": ("wheels", ["base"]), "runtime": ("runtime", ["base", "cuda-ext"])}
    assert r.component("cuda-ext").toolchains["13.1"].path.name == "cuda_ext"


def test_unknown_key_names_file_and_key(recipes_copy):
    edit(recipes_copy / "flashinfer.yaml", lambda d: d["toolchains"]["13.1"].__setitem__("methdo", "wheel"))
    with pytest.raises(RecipeError) as e:
        load_recipes(recipes_copy)
    assert "flashinfer.yaml" in str(e.value) and """key 'toolchains."13.1".methdo'""" in str(e.value)
    assert "allowed here: build_deps, cmake_defines, git, index, knobs, method, modules, packages" in str(e.value)
    assert e.value.exit_code == 3


def test_unknown_top_level_key(recipes_copy):
    edit(recipes_copy / "torch.yaml", lambda d: d.__setitem__("neds", ["base"]))
    with pytest.raises(RecipeError, match=r"torch.yaml.*'neds'"):
        load_recipes(recipes_copy)


def test_unknown_key_in_toolchains_file(recipes_copy):
    edit(recipes_copy / "toolchains.yaml", lambda d: d["toolchains"]["13.1"].__setitem__("cuda_verison", "13.1.1"))
    with pytest.raises(RecipeError, match=r'toolchains.yaml.*toolchains\."13\.1"\.cuda_verison.*allowed here: bases, cuda_version'):
        load_recipes(recipes_copy)


def test_missing_pin_is_an_error(recipes_copy):
    edit(recipes_copy / "torch.yaml", lambda d: d["toolchains"]["13.1"].__setitem__("packages", ["torch>=2.14"]))
    with pytest.raises(RecipeError, match=r"torch.yaml.*packages\[0\].*not pinned"):
        load_recipes(recipes_copy)


def test_missing_sdist_version_is_an_error(recipes_copy):
    edit(recipes_copy / "flash-attn.yaml", lambda d: d["toolchains"]["13.1"]["sdist"].pop("version"))
    with pytest.raises(RecipeError, match=r"flash-attn.yaml.*sdist.version.*missing"):
        load_recipes(recipes_copy)


def test_git_source_must_pin_a_commit(recipes_copy):
    def to_git(d):
        d["toolchains"]["13.1"].pop("sdist")
        d["toolchains"]["13.1"]["git"] = {"url": "https://example.org/flash-attention.git", "commit": "v2.8.3"}
    edit(recipes_copy / "flash-attn.yaml", to_git)
    with pytest.raises(RecipeError, match=r"git.commit.*40-hex"):
        load_recipes(recipes_copy)


def test_source_recipe_needs_a_memory_budget(recipes_copy):
    edit(recipes_copy / "flash-attn.yaml", lambda d: d.pop("parallelism"))
    with pytest.raises(RecipeError, match=r"flash-attn.yaml.*parallelism.*memory_gib_per_job"):
        load_recipes(recipes_copy)


def test_every_toolchain_needs_an_entry(recipes_copy):
    edit(recipes_copy / "flashinfer.yaml", lambda d: d["toolchains"].pop("12.8"))
    with pytest.raises(RecipeError, match=r'flashinfer.yaml.*toolchains\."12\.8".*missing'):
        load_recipes(recipes_copy)


def test_inconsistent_version_set_is_an_error(recipes_copy):
    edit(recipes_copy / "sgl-kernel.yaml",
         lambda d: d["toolchains"]["13.1"].__setitem__("packages", ["sglang-kernel==0.4.9"]))
    with pytest.raises(RecipeError, match=r"sglang.yaml.*sglang-kernel==0.4.10.*sgl-kernel.yaml.*0.4.9"):
        load_recipes(recipes_copy)


def test_torch_pin_must_match_the_toolchain_torch_line(recipes_copy):
    edit(recipes_copy / "toolchains.yaml", lambda d: d["toolchains"]["13.1"]["torch"].__setitem__("version", "2.13.0"))
    with pytest.raises(RecipeError, match=r"torch==2.14.1.*2.13.0"):
        load_recipes(recipes_copy)


def test_unquoted_boolean_knob_is_an_error(recipes_copy):
    edit(recipes_copy / "flash-attn.yaml", lambda d: d["knobs"].__setitem__("FLASH_ATTENTION_FORCE_BUILD", True))
    with pytest.raises(RecipeError, match=r"FLASH_ATTENTION_FORCE_BUILD.*quote"):
        load_recipes(recipes_copy)


def test_dangling_needs_and_cycles(recipes_copy, tmp_path):
    edit(recipes_copy / "flashinfer.yaml", lambda d: d.__setitem__("needs", ["torchh"]))
    with pytest.raises(RecipeError, match=r"flashinfer.yaml.*needs\[0\].*torchh"):
        load_recipes(recipes_copy)
    fx = tmp_path / "fx"
    shutil.copytree(FIXTURE_RECIPES, fx)
    (fx / "cuda-ext.yaml").write_text((FIXTURE_RECIPES / "cuda-ext.yaml").read_text().replace(
        "path: ../cuda_ext", f"path: {(FIXTURE_RECIPES.parent / 'cuda_ext').resolve()}"))
    edit(fx / "base.yaml", lambda d: d.__setitem__("needs", ["runtime"]))
    with pytest.raises(RecipeError, match=r"base node needs nothing"):
        load_recipes(fx)


def test_unknown_cuda_version_lists_the_known_ones():
    with pytest.raises(UsageError, match=r"Unknown CUDA version '12.9'.*12.8, 13.1"):
        load_recipes().toolchain("12.9")


def test_unknown_component_lists_the_known_ones():
    with pytest.raises(UsageError, match=r"Unknown component 'flash_attn'.*flash-attn"):
        load_recipes().component("flash_attn")


def test_patches_are_validated(recipes_copy):
    fa = load_recipes(recipes_copy).component("flash-attn").toolchains["13.1"]
    assert fa.patches and fa.patches[0]["file"] == "setup.py" and fa.patches[0]["with"] == "-std=c++20"
    edit(recipes_copy / "flash-attn.yaml",
         lambda d: d["toolchains"]["13.1"]["patches"][0].__setitem__("file", "../outside.py"))
    with pytest.raises(RecipeError, match=r"patches\[0\].file"):
        load_recipes(recipes_copy)
    edit(recipes_copy / "flash-attn.yaml",
         lambda d: d["toolchains"]["13.1"]["patches"][0].__setitem__("file", "setup.py"))
    edit(recipes_copy / "sgl-kernel.yaml",      # a wheel entry: nothing is compiled, nothing to patch
         lambda d: d["toolchains"]["13.1"].__setitem__("patches", [{"file": "a", "replace": "b", "with": "c"}]))
    with pytest.raises(RecipeError, match=r"sgl-kernel.yaml.*patches.*only source recipes"):   # any source kind, never a wheel
        load_recipes(recipes_copy)
