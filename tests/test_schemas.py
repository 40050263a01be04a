"""The committed JSON Schemas match the models, the committed recipes follow them, and the model errors read
as one line naming the key. No Docker."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from cudastack.core import schemas
from cudastack.recipes.models import ComponentFile, ToolchainsFile

ROOT = Path(__file__).resolve().parents[1]
RECIPE_DIRS = [ROOT / "recipes", ROOT / "tests" / "fixtures" / "recipes"]


def test_committed_schemas_match_the_models():
    assert schemas.stale() == [], "regenerate with `python -m cudastack.core.schemas --write` and commit the result"


def _copy_schemas(tmp_path: Path) -> Path:
    for rel in schemas.SCHEMAS:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, tmp_path / rel)
    return tmp_path


def test_a_stale_or_missing_schema_is_caught_and_rewritten(tmp_path):
    root = _copy_schemas(tmp_path)
    assert schemas.stale(root) == []
    rel = "recipes/schema/component.schema.json"
    data = json.loads((root / rel).read_text())
    del data["$defs"]["EntrySpec"]["properties"]["patches"]      # a model gained a key, the file did not
    (root / rel).write_text(json.dumps(data, indent=2) + "\n")
    (root / "recipes/schema/toolchains.schema.json").unlink()
    assert sorted(schemas.stale(root)) == sorted([rel, "recipes/schema/toolchains.schema.json"])
    assert sorted(schemas.write(root)) == sorted([rel, "recipes/schema/toolchains.schema.json"])
    assert schemas.stale(root) == []


def test_check_command_exits_1_on_a_stale_schema(tmp_path, monkeypatch, capsys):
    root = _copy_schemas(tmp_path)
    monkeypatch.setattr(schemas, "ROOT", root)
    assert schemas.main(["--check"]) == 0
    (root / "recipes/schema/toolchains.schema.json").write_text("{}\n")
    assert schemas.main(["--check"]) == 1
    assert "toolchains.schema.json is stale" in capsys.readouterr().err


def _validator(rel: str) -> jsonschema.Draft202012Validator:
    schema = json.loads((ROOT / rel).read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _errors(v: jsonschema.Draft202012Validator, data) -> list[str]:
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(data)]


@pytest.mark.parametrize("folder", RECIPE_DIRS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_committed_recipes_follow_the_json_schema(folder):
    tc = _validator("recipes/schema/toolchains.schema.json")
    comp = _validator("recipes/schema/component.schema.json")
    files = sorted(folder.glob("*.yaml"))
    assert len(files) >= 3
    for f in files:
        v = tc if f.name == "toolchains.yaml" else comp
        assert _errors(v, yaml.safe_load(f.read_text())) == [], f


def test_the_json_schema_rejects_what_the_loader_rejects():
    comp = _validator("recipes/schema/component.schema.json")
    data = yaml.safe_load((ROOT / "recipes" / "flash-attn.yaml").read_text())
    data["toolchains"]["13.1"]["methdo"] = "source"
    data["knobs"]["lower_case"] = "1"
    data["toolchains"]["13.1"]["sdist"]["version"] = "latest"
    bad = {"/".join(map(str, e.absolute_path)) for e in comp.iter_errors(data)}
    assert bad == {"toolchains/13.1", "knobs", "toolchains/13.1/sdist"}   # sdist: "a mapping or null" fails


def test_key_path_quotes_keys_with_dots():
    assert schemas.key_path(("toolchains", "13.1", "patches", 0, "file")) == 'toolchains."13.1".patches[0].file'
    assert schemas.key_path(("knobs", "bad name", "[key]")) == 'knobs."bad name"'


def test_explain_is_one_line_with_allowed_keys_and_further_errors():
    data = yaml.safe_load((ROOT / "recipes" / "toolchains.yaml").read_text())
    tc = data["toolchains"]["13.1"]
    tc["bases"]["pip"]["has_nvc"] = tc["bases"]["pip"].pop("has_nvcc")
    tc["torch"]["version"] = "two"
    with pytest.raises(ValidationError) as e:
        ToolchainsFile.model_validate(data)
    text = schemas.explain(e.value, ToolchainsFile)
    assert "\n" not in text
    assert text.startswith("""key 'toolchains."13.1".bases.pip.has_nvc': unknown key (allowed here: has_nvcc, """
                           "os_image, os_suite, pip_specs, python, wheel_root). Did you mean 'has_nvcc'?")
    assert """Also key 'toolchains."13.1".bases.pip.has_nvcc': required key is missing.""" in text
    assert """Also key 'toolchains."13.1".torch.version': 'two' is not a version number""" in text


def test_explain_counts_what_it_leaves_out():
    with pytest.raises(ValidationError) as e:
        ComponentFile.model_validate({"a": 1, "b": 2, "c": 3, "d": 4})
    text = schemas.explain(e.value, ComponentFile)
    assert text.startswith("key 'a': unknown key (allowed here: arch_knob, ")
    assert text.endswith("(4 more.)")   # b, c, d unknown; kind, needs, toolchains missing: 7 in all


@pytest.mark.parametrize("lockfile", sorted((ROOT / "lockfiles").glob("*.lock.yaml")), ids=lambda p: p.name)
def test_committed_lockfiles_follow_the_json_schema(lockfile):
    v = _validator("lockfiles/schema/lock.schema.json")
    assert _errors(v, yaml.safe_load(lockfile.read_text())) == [], lockfile


def test_the_lock_json_schema_rejects_a_bad_digest_and_an_unknown_key():
    v = _validator("lockfiles/schema/lock.schema.json")
    data = yaml.safe_load((ROOT / "lockfiles" / "13.1.lock.yaml").read_text())
    data["nodes"]["torch"]["installs"]["PIP_SPECS"]["packages"][0]["sha256"] = "xyz"
    data["nodes"]["torch"]["surprise"] = 1
    bad = {"/".join(map(str, e.absolute_path)) for e in v.iter_errors(data)}
    assert bad == {"nodes/torch", "nodes/torch/installs/PIP_SPECS/packages/0/sha256"}


def test_an_empty_yaml_value_is_an_empty_mapping_or_list_not_a_missing_key():
    f = ComponentFile.model_validate(yaml.safe_load("kind: base\nneeds:\nknobs:\ntoolchains:\n  '13.1':\n"))
    assert f.needs == [] and f.knobs == {} and f.toolchains["13.1"].packages == []
    with pytest.raises(ValidationError) as e:       # where a string is due, empty is still an error
        ComponentFile.model_validate(yaml.safe_load("kind:\nneeds: []\ntoolchains: {}\n"))
    assert schemas.explain(e.value, ComponentFile).startswith("key 'kind': nothing (an empty value) is not allowed here")
