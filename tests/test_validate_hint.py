"""`invoke validate` where no serving engine is installed (a builder) points to the images the last build made
(`--image <tag>`), not to "pip install sglang" (issue: a user on the builder was told to install SGLang)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from cudastack.jobs.validate import last_built_images, no_engine_hint

ROOT = Path(__file__).resolve().parents[1]


def _record(state: Path, toolchain: str, status: str, finished: str) -> str:
    tag = f"cudastack-test/cu{toolchain}-pip-sm120-runtime:{finished[-2:]}ab"
    rec = {"toolchain": toolchain, "finished": finished, "status": "ok",
           "nodes": [{"name": "base", "kind": "base-pip", "status": "built", "tag": "cudastack-test/b:1"},
                     {"name": "runtime", "kind": "runtime", "status": status, "tag": tag}]}
    (state / "records").mkdir(parents=True, exist_ok=True)
    (state / "records" / f"latest-cu{toolchain}.json").write_text(json.dumps(rec))
    return tag


def _report(**packages):
    return SimpleNamespace(environment={"packages": {"torch": "2.14.1", **packages}})


def test_the_hint_names_the_last_build_s_runtime_images(tmp_path):
    new = _record(tmp_path, "13.1", "built", "2026-12-07T01:00:00+00:00")
    old = _record(tmp_path, "12.8", "skipped", "2026-12-06T01:00:00+00:00")
    assert [i["tag"] for i in last_built_images(tmp_path)] == [new, old]
    hint = no_engine_hint([_report(sglang=None)], tmp_path)
    assert f"`invoke validate --image {new}`" in hint and f"`invoke validate --image {old}`" in hint
    assert "pip install" not in hint


def test_no_hint_where_an_engine_is_installed_and_a_build_hint_where_nothing_was_built(tmp_path):
    _record(tmp_path, "13.1", "built", "2026-12-07T01:00:00+00:00")
    assert no_engine_hint([_report(sglang="0.5.23")], tmp_path) is None
    assert no_engine_hint([_report(vllm="0.33.0")], tmp_path) is None
    empty = no_engine_hint([_report()], tmp_path / "none")
    assert "No build record names a runtime image yet" in empty and "invoke build --cuda 13.1" in empty
    # a runtime node that failed or was not reached is no image to validate
    _record(tmp_path, "13.1", "interrupted", "2026-12-07T02:00:00+00:00")
    assert last_built_images(tmp_path) == []


def test_invoke_validate_here_without_an_engine_prints_the_paragraph(tmp_path):
    """For real: this test environment has neither SGLang nor vLLM installed."""
    import importlib.util

    if importlib.util.find_spec("sglang") or importlib.util.find_spec("vllm"):
        import pytest
        pytest.fail("this test needs an environment without sglang and vllm (the project's .venv)")
    p = subprocess.run([sys.executable, "-m", "invoke", "validate", "--out", str(tmp_path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "No serving engine (SGLang, vLLM) is installed in this environment" in p.stderr, p.stderr[-2000:]
    assert "invoke validate --image" in p.stderr
