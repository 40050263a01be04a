"""The source path for real, in CI time: the fixture CUDA extension's recipe is switched to a wheel default with a
`source:` block (a path with a patch), `--method cuda-ext=source` selects it, and the real engine builds it with
the CUDA 13.1 toolchain's nvcc for compute capability 12.0. The wheel in the wheelhouse carries the patch (its
version) and sm_120 SASS, read with the project's own fatbin scanner (stackprobe.coverage.read_elf); the
build record names the source and the patch. A patch that no longer applies stops the build before any
compile and leaves no tag and no wheel."""
from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest

from cudastack.build.executor import run_build
from cudastack.build.engine import Engine
from cudastack.core.errors import BuildError
from cudastack.plan.planner import make_plan
from cudastack.plan.rules import host_resources
from cudastack.recipes.load import load_recipes
from cudastack.recipes.select import select_methods
from recipe_support import edit

pytestmark = [pytest.mark.docker, pytest.mark.network]

FIXTURES = Path(__file__).parent / "fixtures"
PREFIX = "cudastack-test"
VERSION_PATCH = {"file": "pyproject.toml", "replace": 'version = "0.1.0"', "with": 'version = "0.1.0+src16"',
                 "why": "shows the patched tree is what was built"}


def _fixture(tmp_path: Path, patch: dict) -> Path:
    shutil.copytree(FIXTURES / "recipes", tmp_path / "fx" / "recipes")
    shutil.copytree(FIXTURES / "cuda_ext", tmp_path / "fx" / "cuda_ext")
    recipes = tmp_path / "fx" / "recipes"

    def to_wheel_with_source(d):
        d["toolchains"]["13.1"] = {"method": "wheel", "packages": ["cuda-ext-fixture==0.1.0"],
                                   "source": {"path": "../cuda_ext", "patches": [patch]}}
    edit(recipes / "cuda-ext.yaml", to_wheel_with_source)
    return recipes


def _plan(recipes: Path):
    r = select_methods(load_recipes(recipes), "13.1", {"cuda-ext": "source"})
    return make_plan(r, "13.1", resources=host_resources(), prefix=PREFIX, skip=["runtime"])


def test_selected_source_build_is_patched_and_carries_sm_120_sass(tmp_path):
    from stackprobe.coverage import read_elf

    recipes = _fixture(tmp_path, VERSION_PATCH)
    plan = _plan(recipes)
    node = plan.node("cuda-ext")
    assert node.method == "source" and node.fetch["kind"] == "path"
    state = tmp_path / "state"
    record = run_build(plan, state_dir=state, engine=Engine.connect(), say=lambda s: None)
    entry = next(n for n in record["nodes"] if n["name"] == "cuda-ext")
    assert entry["status"] == "built" and entry["source"]["kind"] == "path"
    assert entry["source"]["patches"] == ["pyproject.toml"]
    (wheel, _), = entry["wheels"].items()
    assert wheel.startswith("cuda_ext_fixture-0.1.0+src16-"), wheel      # the patched tree was built
    so = tmp_path / "ext.so"
    with zipfile.ZipFile(state / plan.wheelhouse / wheel) as z:
        so.write_bytes(z.read(next(n for n in z.namelist() if n.endswith(".so"))))
    sass = {i.name for i in read_elf(str(so)) if i.kind == "sass"}
    assert sass == {"sm_120"}, sass
    # the fixture folder itself was not edited
    assert 'version = "0.1.0"' in (tmp_path / "fx" / "cuda_ext" / "pyproject.toml").read_text()


def test_a_patch_that_no_longer_applies_stops_before_the_compile(tmp_path):
    recipes = _fixture(tmp_path, {**VERSION_PATCH, "replace": 'version = "9.9.9"'})
    plan = _plan(recipes)
    engine = Engine.connect()
    state = tmp_path / "state"
    with pytest.raises(BuildError, match="matches nothing in pyproject.toml"):
        run_build(plan, state_dir=state, engine=engine, say=lambda s: None)
    assert not engine.exists(plan.node("cuda-ext").tag)
    wh = state / plan.wheelhouse
    assert not wh.exists() or not list(wh.glob("*.whl"))


def test_an_image_node_builds_from_source_into_its_image(tmp_path):
    """The image-node source path (what torch's source build takes), on a small source: an image component whose
    recipe defaults to a wheel gets `--method NAME=source`; images/image-source.Dockerfile builds the wheel from
    the patched tree, installs it into the image's venv and keeps it in /wheels."""
    recipes = _fixture(tmp_path, VERSION_PATCH)
    (recipes / "ext-image.yaml").write_text(
        "kind: image\nneeds: [base]\n"
        "arch_knob: {style: numbers, knob: CUDA_EXT_ARCHS, separator: ' '}\n"
        "parallelism: {memory_gib_per_job: 1, nvcc_threads: 1, jobs_knobs: [MAX_JOBS]}\n"
        "toolchains:\n  '13.1':\n    method: wheel\n    packages: ['cuda-ext-fixture==0.1.0']\n"
        "    source:\n      path: ../cuda_ext\n      patches:\n"
        "        - {file: pyproject.toml, replace: 'version = \"0.1.0\"', with: 'version = \"0.1.0+img16\"'}\n")
    r = select_methods(load_recipes(recipes), "13.1", {"ext-image": "source"})
    plan = make_plan(r, "13.1", resources=host_resources(), prefix=PREFIX, skip=["runtime", "cuda-ext"],
                     max_jobs=1)
    node = plan.node("ext-image")
    assert node.dockerfile == "images/image-source.Dockerfile" and node.build_args["SOURCE_DIR"] == "src"
    engine = Engine.connect()
    record = run_build(plan, state_dir=tmp_path / "state", engine=engine, say=lambda s: None)
    assert next(n for n in record["nodes"] if n["name"] == "ext-image")["status"] == "built"
    out = engine.client.containers.run(node.tag, ["sh", "-c", "ls /wheels; python -c 'import cuda_ext_fixture as c; "
                                                  "print(c.host_sum([1, 2, 3]), *c.compiled_archs())'"],
                                       remove=True).decode().split()
    assert out[0].startswith("cuda_ext_fixture-0.1.0+img16-") and out[1:] == ["6", "120"], out
    engine.client.images.remove(node.tag, force=True)
