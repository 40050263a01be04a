"""scripts/same_reports.py, the check that a move in the validate half changes no report: the comparison on a real
committed report and its twins (a verdict's status changed is a difference in the JSON and the Markdown; the run's
time, the suite's digest and the measured durations are not; a key of the same name anywhere else still is; a run
that fails in both revisions is a difference), the runtime tier's probe list of one revision against itself, and
the usage errors. No network, no Docker: the committed report and ``git archive`` of this checkout only."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "same_reports.py"
_STEM = ROOT / "tests" / "data" / "schema3" / "validate" / "cudastack_cu13.1-pip-sm120-runtime_7dbd01ad3ef27600"
REPORT_JSON, REPORT_MD = Path(f"{_STEM}.json"), Path(f"{_STEM}.md")

_spec = importlib.util.spec_from_file_location("same_reports", SCRIPT)
sr = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sr)


def _pair(edit_json=None, edit_md=None):
    """(old outputs, new outputs) of the committed report against a copy edited by the two callables."""
    js, md = REPORT_JSON.read_text(), REPORT_MD.read_text()
    twin = json.loads(js)
    if edit_json:
        edit_json(twin)
    return sr.outputs(js, md, "c"), sr.outputs(json.dumps(twin), edit_md(md) if edit_md else md, "c")


def _only_ignored(d):
    d["created"] = "2030-01-01T00:00:00Z"
    d["provenance"]["suite_digest"] = "sha256:" + "0" * 64
    d["options"]["seconds"] = 1.0
    d["environment"]["health"]["seconds"] = 2.0
    for imp in d["environment"]["health"]["imports"]:
        imp["seconds"] = 9.99


def test_differing_only_in_ignored_keys_is_the_same():
    old_md = REPORT_MD.read_text()
    assert "created 2026-12-02T00:42:57Z" in old_md and "checks took 16.7 s" in old_md

    def md(t):
        return (t.replace("created 2026-12-02T00:42:57Z", "created 2030-01-01T00:00:00Z")
                .replace("suite sha256:773054bd", "suite sha256:00000000").replace("checks took 16.7 s", "checks took 3 s"))
    old, new = _pair(_only_ignored, md)
    assert old != {}, old
    assert sr.compare(old, new) == []


def test_one_verdict_changed_is_a_difference_in_json_and_markdown():
    def flip(d):
        _only_ignored(d)
        v = next(v for v in d["verdicts"] if v["backend"] == "nccl-ring")
        assert v["status"] == "gate-passes"
        v["status"] = "gate-fails"
    md = REPORT_MD.read_text()
    assert md.count("gate-passes") >= 1
    old, new = _pair(flip, lambda t: t.replace("gate-passes", "gate-fails", 1))
    diffs = sr.compare(old, new)
    assert len(diffs) == 2, diffs
    assert "+++ new c: json" in diffs[0] and '"status": "gate-fails"' in diffs[0]
    assert "+++ new c: md" in diffs[1] and "gate-fails" in diffs[1]


def test_an_ignored_name_elsewhere_is_still_compared():
    """Only the listed key paths are masked: ``seconds`` or ``created`` under another key is compared."""
    old, new = _pair(lambda d: d["verdicts"][0].__setitem__("seconds", 5.0))
    assert sr.compare(old, new) and '"seconds": 5.0' in sr.compare(old, new)[0]
    old, new = _pair(lambda d: d["options"].__setitem__("created", "x"))
    assert sr.compare(old, new)


def test_a_key_only_one_report_has_differs():
    old, new = _pair(lambda d: d["provenance"].pop("suite_digest"))
    assert sr.compare(old, new), "a report without the ignored key is not the same as one with it"


def test_a_run_failing_in_both_revisions_is_not_a_pass():
    broken = {**sr.outputs(None, None, "c"), "c: exit": "1"}
    diffs = sr.compare(broken, copy.deepcopy(broken))
    assert diffs == ["c exited 1 in the old revision", "c exited 1 in the new revision"]


def _cli(*args, env=None):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env=env)


def test_runtime_probe_list_of_one_revision_against_itself_is_identical(tmp_path):
    proc = _cli("HEAD", "HEAD", "--only", "runtime-list", "--work", str(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "IDENTICAL" in proc.stdout and "runtime-list: identical" in proc.stdout
    assert (tmp_path / "tree-old" / "validate" / "stackprobe" / "__main__.py").is_file()


def test_usage_errors(tmp_path):
    bad = _cli("no-such-rev-xyz", "HEAD")
    assert bad.returncode == 2 and "is not a revision of this repository" in bad.stderr
    assert _cli("HEAD", "HEAD", "--only", "nope").returncode == 2
    assert "give PATH@REV" in _cli("HEAD", "HEAD", "--old-file", "x.py").stderr
    env = dict(os.environ, CUDASTACK_TEST_CACHE=str(tmp_path))
    miss = _cli("HEAD", "HEAD", "--only", "sglang-0.5.9", env=env)
    assert miss.returncode == 2 and "flashinfer-python-0.6.3, sglang-0.5.9" in miss.stderr
