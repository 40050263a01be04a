"""vLLM's runtime image as recipes: its own image chain (vllm-torch -> vllm) on the shared base, because vllm 0.33.0
pins torch==2.14.0 and flashinfer-python==0.7.2.post1 where SGLang 0.5.23 pins torch==2.14.1 and 0.7.2. The plan names
that difference; a chain whose pins contradict vLLM's recorded ``requires`` is a recipe error naming file and key;
toolchains that cannot take vLLM's CUDA 13.0 torch say so in one line. No Docker."""
from __future__ import annotations

import pytest

from cudastack.core.errors import RecipeError, UsageError
from cudastack.plan.planner import make_plan, render_plan
from cudastack.plan.graph import only_skips
from cudastack.recipes.graph import chain_pins, stack_differences
from cudastack.recipes.load import load_recipes
from cudastack.plan.rules import Resources
from recipe_support import edit

RES = Resources(2, 23.4, "test")


def _plan(cuda="13.1", recipes=None, **kw):
    return make_plan(recipes, cuda, resources=RES, **kw)


def test_vllm_is_its_own_chain_on_the_shared_base_and_the_plan_names_the_torch_conflict():
    r = load_recipes()
    vllm = {n: v for n, (v, _) in chain_pins(r.components, "13.1", "vllm").items()}
    sgl = {n: v for n, (v, _) in chain_pins(r.components, "13.1", "runtime").items()}
    assert vllm["torch"] == "2.14.0" and sgl["torch"] == "2.14.1"
    assert vllm["flashinfer-python"] == "0.7.2.post1" and sgl["flashinfer-python"] == "0.7.2"
    assert vllm["vllm"] == "0.33.0" and vllm["b12x"] == "1.5.1" and "sglang" not in vllm and "vllm" not in sgl
    [line] = stack_differences(r.components, "13.1")
    assert "torch 2.14.1 (torch.yaml) vs 2.14.0 (vllm-torch.yaml)" in line
    assert "flashinfer-python 0.7.2 (flashinfer.yaml) vs 0.7.2.post1 (vllm.yaml)" in line
    assert "sglang==0.5.23" in line and "vllm==0.33.0" in line and "sharing base" in line
    p = _plan()
    assert p.node("vllm").parents == ["vllm-torch"] and p.node("vllm-torch").parents == ["base"]
    assert p.node("vllm-torch").build_args["PIP_SPECS"] == "torch==2.14.0"
    assert p.node("vllm").build_args["PIP_SPECS"].split()[0] == "vllm==0.33.0"
    assert p.node("vllm").build_args["FLASHINFER_CUDA_ARCH_LIST"] == "12.0f"   # its own arch knob (C4)
    assert p.node("vllm").tag.split(":")[0].endswith("/cu13.1-pip-sm120-vllm")   # arch-dependent: its env knobs
    text = render_plan(p)
    assert "Engine stacks: runtimes runtime (sglang==0.5.23) and vllm (vllm==0.33.0) pin different versions" in text
    assert "One image cannot hold both" in text


def test_the_sglang_runtime_does_not_take_knobs_from_the_vllm_chain(recipes_copy):
    """The runtime collects the environment knobs of its own chain only: a knob planted on vllm-torch reaches vLLM's
    runtime and not SGLang's, whose hash stays as it was."""
    before = _plan(recipes=recipes_copy)
    edit(recipes_copy / "vllm-torch.yaml", lambda d: d.update(arch_knob={"style": "torch-list", "knob": "VLLM_TEST_ARCHS",
                                                                         "scope": "env"}))
    after = _plan(recipes=recipes_copy)
    assert after.node("vllm").build_args.get("VLLM_TEST_ARCHS") == "12.0"
    assert "VLLM_TEST_ARCHS" not in after.node("runtime").build_args
    assert after.node("runtime").hash == before.node("runtime").hash
    assert after.node("vllm").hash != before.node("vllm").hash


def test_a_chain_pinning_a_torch_vllm_does_not_accept_is_refused_naming_file_and_key(recipes_copy):
    """Planted fault: vLLM's torch node pinned to SGLang's torch 2.14.1, which vllm 0.33.0's METADATA refuses."""
    edit(recipes_copy / "vllm-torch.yaml", lambda d: d["toolchains"]["13.1"].update(packages=["torch==2.14.1"]))
    with pytest.raises(RecipeError) as e:
        load_recipes(recipes_copy)
    msg = str(e.value)
    assert "vllm.yaml" in msg and 'toolchains."13.1".requires.torch' in msg
    assert "torch==2.14.0 is required" in msg and "vllm-torch.yaml pins torch==2.14.1" in msg
    assert "base -> vllm-torch -> vllm" in msg and "Pin torch==2.14.0 in vllm-torch.yaml" in msg


def test_one_chain_cannot_hold_two_versions_of_a_package(recipes_copy):
    """Planted fault: vLLM's runtime also pins torch, at another version than its own torch node."""
    edit(recipes_copy / "vllm.yaml", lambda d: d["toolchains"]["13.1"]["packages"].append("torch==2.14.1"))
    with pytest.raises(RecipeError, match=r"vllm-torch.yaml key .*: pins torch==2.14.0 but vllm.yaml pins torch==2.14.1 in the same "
                                          r"image chain \(base -> vllm-torch -> vllm\)"):
        load_recipes(recipes_copy)


def test_a_torch_of_another_minor_line_is_refused_even_when_the_engine_asks_for_it(recipes_copy):
    """An engine may carry its own torch only on the toolchain's minor line (the same CUDA build): a 2.13 torch
    asked for by the runtime is still another line."""
    edit(recipes_copy / "vllm-torch.yaml", lambda d: d["toolchains"]["13.1"].update(packages=["torch==2.13.0"]))
    edit(recipes_copy / "vllm.yaml", lambda d: d["toolchains"]["13.1"]["requires"].update(torch="2.13.0"))
    with pytest.raises(RecipeError, match=r"torch==2.13.0 but toolchains.yaml says toolchain 13.1 uses the torch "
                                          r"2.14.1 line; make them agree \(the 2.13 line is another CUDA build"):
        load_recipes(recipes_copy)


def test_a_chain_torch_without_the_engine_asking_for_it_is_refused(recipes_copy):
    """vLLM's torch differs from the toolchain line only because vLLM's ``requires`` records it: drop that record
    and the 2.14.0 pin is an ordinary torch-line error."""
    edit(recipes_copy / "vllm.yaml", lambda d: d["toolchains"]["13.1"]["requires"].pop("torch"))
    with pytest.raises(RecipeError, match="torch==2.14.0 but toolchains.yaml says toolchain 13.1 uses the torch 2.14.1 "
                                          "line; make them agree; a runtime whose engine pins another torch"):
        load_recipes(recipes_copy)


def test_toolchains_that_cannot_take_vllm_say_why_in_one_line():
    p = _plan("12.8")
    assert "vllm" not in [n.name for n in p.nodes] and "vllm-torch" not in [n.name for n in p.nodes]
    assert "CUDA 13.0 build" in p.unavailable["vllm-torch"] and "2.9.1" in p.unavailable["vllm-torch"]
    text = render_plan(p)
    assert "Not built for CUDA 12.8: vllm: vllm 0.33.0 pins torch==2.14.0, a CUDA 13.0 build" in text
    assert not p.stacks                      # one runtime chain: no engine-stack line
    assert "Not built for CUDA 13.2: vllm-torch:" in render_plan(_plan("13.2"))


def test_an_unavailable_entry_needs_a_why_and_nothing_else(recipes_copy):
    edit(recipes_copy / "vllm.yaml", lambda d: d["toolchains"]["12.8"].pop("why"))
    with pytest.raises(RecipeError, match=r'toolchains."12.8".why.*needs a one-line why'):
        load_recipes(recipes_copy)
    edit(recipes_copy / "vllm.yaml", lambda d: d["toolchains"]["12.8"].update(why="x", packages=["vllm==0.33.0"]))
    with pytest.raises(RecipeError, match=r'toolchains."12.8".packages.*an unavailable entry takes only `why`'):
        load_recipes(recipes_copy)


def test_a_node_that_needs_an_unavailable_one_is_left_out_with_it(recipes_copy):
    """vllm's own 12.8 entry planted as a wheel: it still cannot be built, because its torch node cannot."""
    edit(recipes_copy / "vllm.yaml", lambda d: d["toolchains"].update({"12.8": {"method": "wheel", "packages": ["vllm==0.33.0"]}}))
    p = _plan("12.8", recipes=recipes_copy)
    assert p.unavailable["vllm"].startswith("needs vllm-torch, which CUDA 12.8 cannot take (vllm 0.33.0 pins")


def test_only_builds_a_node_and_its_chain():
    r = load_recipes()
    skip = only_skips(r, ["vllm"])
    assert sorted(skip) == ["flash-attn", "flashinfer", "sgl-kernel", "sglang", "torch"]
    p = _plan(skip=skip)
    assert [n.name for n in p.nodes] == ["base", "vllm-torch", "vllm"]
    assert p.stacks                          # the conflict is named even when SGLang's chain is left out
    with pytest.raises(UsageError, match="Unknown component 'vlm'"):
        only_skips(r, ["vlm"])


def test_only_and_skip_together_are_refused():
    from cudastack.jobs.build import only_to_skip

    with pytest.raises(UsageError, match="--only and --skip together"):
        only_to_skip(["vllm"], ["flash-attn"], None)
    assert only_to_skip(None, ["flash-attn"], None) == ["flash-attn"]


@pytest.mark.network
def test_vllm_requires_match_the_pinned_wheels_metadata_on_pypi():
    """vllm.yaml's ``requires`` equals what the vllm 0.33.0 wheel's METADATA on PyPI pins (read through pip's
    installation report, as `invoke lock` reads it), and b12x is the version its `b12x` extra pins."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    from cudastack import lock as L
    from lock_support import TARGET

    r = load_recipes()
    entry = r.component("vllm").toolchains["13.1"]
    requires: dict = {}
    L.pip_resolve(["vllm==0.33.0"], target=dict(TARGET, python_version="3.11"), no_deps=True, requires=requires)
    rd = [Requirement(x) for x in requires["vllm"]["requires_dist"]]
    exact = {canonicalize_name(q.name): next(iter(q.specifier)).version for q in rd
             if not q.marker and len(q.specifier) == 1 and next(iter(q.specifier)).operator == "=="}
    assert {canonicalize_name(k): v for k, v in entry.requires.items()} == \
        {k: exact[k] for k in ("torch", "torchvision", "torchaudio", "flashinfer-python")}
    b12x = next(q for q in rd if canonicalize_name(q.name) == "b12x")
    assert 'extra == "b12x"' in str(b12x.marker) and "b12x==1.5.1" in entry.packages
    assert str(b12x.specifier) == "==1.5.1"
