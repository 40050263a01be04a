"""One account of a run's end (issue: a stop reported two ways, a refusal later called an interruption).

Real runs of `invoke build` on the fixture chain (tests/fixtures/recipes: base -> cuda-ext -> runtime, images
tagged cudastack-test/...), each started in a session of its own and stopped as a terminal stops it: SIGINT to
the whole process group (the docker CLI included, unless the build put it in a group of its own). At each point
the run must end "interrupted": exit 130, a message that says where it stopped, what was done and how to
resume, a record whose status is "interrupted", and never "failed" or a compiler's lines.

* while the first node is on its way (the OS image, the base: whatever is running 2 s after the plan line);
* while cuda-ext's source build runs (a uniquely named `sleep` inside its setup.py, as tests/test_build_killed.py);
* by SIGTERM while cuda-ext's build runs (a stopped session or CI job).

Then a rerun finishes, and says nothing about an earlier run having been "interrupted: its process ended
without recording an exit" (every record above was closed by its own run).

Without Docker: a refusal before any build (too little disk on a small tmpfs state folder) leaves no journal,
so the next run cannot call it an interruption; a failure's message leads with the first error, not the
compiler's last warning.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
INVOKE = [sys.executable, "-m", "invoke", "-r", str(ROOT)]


def _recipes(tmp_path: Path, setup_prefix: str = "") -> Path:
    src = tmp_path / "cuda_ext"
    shutil.copytree(FIXTURES / "cuda_ext", src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    setup = src / "setup.py"
    setup.write_text(setup_prefix + setup.read_text())
    recipes = tmp_path / "recipes"
    shutil.copytree(FIXTURES / "recipes", recipes)
    ext = recipes / "cuda-ext.yaml"
    d = yaml.safe_load(ext.read_text())
    d["toolchains"]["13.1"]["path"] = str(src)
    ext.write_text(yaml.safe_dump(d))
    return recipes


def _start(recipes: Path, state: Path, out, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([*INVOKE, "build", "--cuda", "13.1", "--recipes", str(recipes), "--state-dir", str(state),
                             "--prefix", "cudastack-test", "--max-jobs", "1", *extra],
                            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _wait_for(pred, proc: subprocess.Popen, what: str, out_path: Path, timeout: float = 1500) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if pred():
            return
        time.sleep(0.5)
    raise AssertionError(f"never reached {what}: {out_path.read_text(errors='replace')[-3000:]}")


def _sleepers(marker: str) -> bool:
    import psutil

    return any((p.info.get("cmdline") or []) == ["sleep", marker] for p in psutil.process_iter(["cmdline"]))


def _assert_interrupted(proc: subprocess.Popen, out_path: Path, state: Path, sig: str) -> dict:
    rc = proc.wait(timeout=180)
    text = out_path.read_text(errors="replace")
    assert rc == 130, f"exit {rc}:\n{text[-3000:]}"
    assert "interrupted: Build stopped by " + sig in text, text[-3000:]
    assert "To resume, run the same command again" in text, text[-2000:]
    assert "failed" not in text.split("interrupted: ")[-1], text[-2000:]
    assert "Traceback" not in text and "error:" not in text, text[-3000:]
    latest = json.loads((state / "records" / "latest-cu13.1.json").read_text())
    assert latest["status"] == "interrupted", latest
    assert "failed" not in {n["status"] for n in latest["nodes"]}, latest["nodes"]
    assert latest["error"] in text
    assert not list((state / "wheelhouse").glob(".export-*")), "an interrupted run leaves no export folder"
    return latest


@pytest.mark.docker
@pytest.mark.network
def test_stops_at_three_points_of_a_real_build_read_interrupted_and_the_rerun_finishes(tmp_path):
    pytest.importorskip("psutil")
    state = tmp_path / "state"
    marker = f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"
    slow = _recipes(tmp_path / "slow", f"import subprocess\nsubprocess.run(['sleep', {marker!r}])\n")

    # 1: 2 s after the plan line, whatever runs then (the OS image, the base node, or its cache check)
    out1 = tmp_path / "one.out"
    with open(out1, "wb") as out:
        proc = _start(slow, state, out)
        _wait_for(lambda: "nodes," in out1.read_text(errors="replace"), proc, "the plan line", out1)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGINT)
        first = _assert_interrupted(proc, out1, state, "SIGINT")
    statuses = {n["name"]: n["status"] for n in first["nodes"]}
    assert statuses["runtime"] == "not reached" and "Not reached: " in first["error"], first

    # 2: during cuda-ext's compile (the sleep in its setup.py), after the base is built or cached
    out2 = tmp_path / "two.out"
    with open(out2, "wb") as out:
        proc = _start(slow, state, out)
        _wait_for(lambda: _sleepers(marker), proc, "cuda-ext's build", out2)
        os.killpg(proc.pid, signal.SIGINT)
        second = _assert_interrupted(proc, out2, state, "SIGINT")
    statuses = {n["name"]: n["status"] for n in second["nodes"]}
    assert statuses == {"base": statuses["base"], "cuda-ext": "interrupted", "runtime": "not reached"}, statuses
    assert statuses["base"] in ("built", "skipped")
    assert "while building cuda-ext after" in second["error"] and "base" in second["error"].split("Done")[1]
    assert "previous run" not in out2.read_text(errors="replace"), "run 1 closed its own record"

    # 3: SIGTERM (a stopped session) during the same compile
    out3 = tmp_path / "three.out"
    with open(out3, "wb") as out:
        proc = _start(slow, state, out)
        _wait_for(lambda: _sleepers(marker), proc, "cuda-ext's build", out3)
        os.kill(proc.pid, signal.SIGTERM)
        third = _assert_interrupted(proc, out3, state, "SIGTERM")
    assert {n["name"]: n["status"] for n in third["nodes"]}["base"] == "skipped"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _sleepers(marker):
        time.sleep(1)
    assert not _sleepers(marker), "the build's RUN step kept running after the stop"

    # the rerun (no sleep) finishes; no earlier run is reported as killed
    fast = _recipes(tmp_path / "fast")
    out4 = tmp_path / "four.out"
    with open(out4, "wb") as out:
        rc = _start(fast, state, out).wait(timeout=1800)
    text = out4.read_text(errors="replace")
    assert rc == 0, text[-3000:]
    assert "was interrupted" not in text and "ended without recording an exit" not in text, text
    assert json.loads((state / "records" / "latest-cu13.1.json").read_text())["status"] == "ok"


def _small_fs(tmp_path: Path, mib: int = 64) -> Path:
    """A tmpfs of ``mib`` MiB mounted at a new folder (root only; skip elsewhere), unmounted by the caller."""
    where = tmp_path / "small"
    where.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", "tmpfs", str(where)], capture_output=True,
                       text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    return where


def test_a_disk_refusal_leaves_no_journal_and_the_rerun_does_not_call_it_interrupted(tmp_path, monkeypatch):
    """Before: the run journal was written before the disk check, so a refusal (exit 5) left a "running"
    record, and the next run opened with "previous run ... was interrupted"."""
    monkeypatch.delenv("CUDASTACK_NO_DISK_CHECK", raising=False)     # the disk check is under test here
    from cudastack.build.executor import run_build
    from cudastack.core.errors import EnvironmentError_
    from cudastack.plan.planner import make_plan
    from cudastack.plan.rules import Resources
    from cudastack.recipes.load import load_recipes

    small = _small_fs(tmp_path)
    try:
        plan = make_plan(load_recipes(FIXTURES / "recipes"), "13.1", archs="12.0", resources=Resources(2, 8.0),
                         prefix="cudastack-test")

        class _NoImages:        # the engine's edge only: nothing cached, its data root on the small filesystem
            builds_issued = 0
            buildkit = type("B", (), {"describe": staticmethod(lambda: "none"), "docker": "docker"})()

            def exists(self, tag):
                return False

            def root_dir_free_gib(self):
                return str(small), shutil.disk_usage(small).free / 2**30

        said: list[str] = []
        with pytest.raises(EnvironmentError_, match="Too little free disk") as exc:
            run_build(plan, state_dir=small / "state", engine=_NoImages(), say=said.append)
        assert exc.value.exit_code == 5
        assert not list((small / "state").glob("records/*.json")), "a refusal must leave no journal"
        said.clear()
        with pytest.raises(EnvironmentError_):
            run_build(plan, state_dir=small / "state", engine=_NoImages(), say=said.append)
        assert not any("interrupted" in s for s in said), said
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_a_failure_leads_with_its_first_error_not_the_last_warning():
    """Before: the message ended with the step's last lines (deprecation warnings after the error)."""
    from cudastack.build.engine import _build_error
    from cudastack.build.progress import _Progress

    prog = _Progress()
    lines = ["#9 [builder 4/5] RUN python setup.py bdist_wheel", "#9 1.0 [1/3] nvcc kernel.cu",
             '#9 2.0 kernel.cu(12): error: identifier "undefined_thing" is undefined',
             "#9 2.1 1 error detected in the compilation of kernel.cu", "#9 2.2 FAILED: kernel.o"]
    lines += [f"#9 3.{i} /usr/include/x.h:{i}: warning: 'thing' is deprecated [-Wdeprecated-declarations]"
              for i in range(40)]
    lines += ["#9 ERROR: process did not complete successfully: exit code: 1"]
    for ln in lines:
        prog.feed(ln)
    err = _build_error("cuda-ext", 12.0, 1, Path("/x.log"), prog)
    first_line = str(err).splitlines()[0]
    assert 'first error: kernel.cu(12): error: identifier "undefined_thing" is undefined' in first_line
    assert str(err).index("undefined_thing") < str(err).index("deprecated")
    # its twin: a step with no recognisable error line names none
    plain = _Progress()
    for ln in ["#9 [builder 4/5] RUN false", "#9 0.1 warning: nothing here", "#9 ERROR: exit code: 1"]:
        plain.feed(ln)
    assert "first error" not in str(_build_error("x", 1.0, 1, Path("/x.log"), plain))
    # nvcc's own fatal line ("nvcc fatal   : ...") is the first error, not pip's summary that follows it
    nv = _Progress()
    for ln in ["#6 [builder 2/2] RUN pip wheel .", "#6 1.2   nvcc -gencode=arch=compute_999,code=sm_999 kernel.cu",
               "#6 1.3   nvcc fatal   : Unsupported gpu architecture 'compute_999'",
               "#6 1.4   error: subprocess-exited-with-error", "#6 1.5 ERROR: Failed to build one or more wheels",
               "#6 ERROR: process did not complete successfully: exit code: 1"]:
        nv.feed(ln)
    assert "first error: nvcc fatal : Unsupported gpu architecture 'compute_999'" in str(
        _build_error("cuda-ext", 2.0, 1, Path("/x.log"), nv)).splitlines()[0]


def test_an_interrupt_message_says_where_what_was_done_and_how_to_resume(tmp_path):
    from cudastack.build.executor import interrupted_message

    rec = {"nodes": [{"name": "base", "status": "skipped"}, {"name": "torch", "status": "built"},
                     {"name": "flash-attn", "status": "interrupted", "duration_s": 1620.0, "compiled": "30/73",
                      "log": "/s/logs/r/flash-attn.log"}, {"name": "runtime", "status": "not reached"}]}
    msg = interrupted_message(rec, tmp_path / "rec.json")
    assert "while building flash-attn after 27m00s (compiled 30/73)" in msg
    assert "built torch" in msg and "already cached base" in msg and "Not reached: runtime." in msg
    assert "run the same command again" in msg and "failed" not in msg


def test_the_disk_check_skipped_on_request_says_not_checked(tmp_path, monkeypatch):
    """CUDASTACK_NO_DISK_CHECK=1 (a data root whose free space this host cannot see): no refusal, and the report
    says the disk was not checked; unset, the same small filesystem is refused."""
    from cudastack.build.context import disk_refusal
    from cudastack.plan.planner import make_plan
    from cudastack.plan.rules import Resources
    from cudastack.recipes.load import load_recipes

    small = _small_fs(tmp_path)
    try:
        plan = make_plan(load_recipes(FIXTURES / "recipes"), "13.1", archs="12.0", resources=Resources(2, 8.0),
                         prefix="cudastack-test")

        class _Root:
            def root_dir_free_gib(self):
                return str(small), shutil.disk_usage(small).free / 2**30

        monkeypatch.setenv("CUDASTACK_NO_DISK_CHECK", "1")
        need, report, refusal = disk_refusal(_Root(), plan, {}, small / "state")
        assert refusal is None and "not checked (CUDASTACK_NO_DISK_CHECK=1" in report and need > 0
        monkeypatch.delenv("CUDASTACK_NO_DISK_CHECK")
        assert disk_refusal(_Root(), plan, {}, small / "state")[2] is not None
    finally:
        subprocess.run(["umount", str(small)], check=False)


def test_an_interrupt_that_came_after_the_engine_tagged_the_node_says_it_is_kept(tmp_path):
    # seen on a real 13.1 build: SIGINT during "exporting layers" of vllm-torch; the engine still named the image
    from cudastack.build.executor import interrupted_message

    node = {"name": "vllm-torch", "status": "interrupted", "duration_s": 74.0, "log": "/s/logs/r/vllm-torch.log"}
    rec = {"nodes": [{"name": "base", "status": "built"}, dict(node, tag_at_stop="cudastack-test/x-vllm-torch:abc")]}
    msg = interrupted_message(rec, tmp_path / "rec.json")
    assert "already finished vllm-torch when the stop arrived and tagged it (cudastack-test/x-vllm-torch:abc)" in msg
    assert "no tag" not in msg and "vllm-torch starts again" not in msg
    # the twin: no tag after the stop keeps the old account
    plain = interrupted_message({"nodes": [node]}, tmp_path / "rec.json")
    assert "has no tag and no wheels" in plain and "vllm-torch starts again" in plain
    # an engine that did not answer: neither claim
    unknown = interrupted_message({"nodes": [dict(node, tag_at_stop=None)]}, tmp_path / "rec.json")
    assert "was not checked" in unknown and "has no tag" not in unknown


def test_the_tag_check_after_a_stop_records_only_what_the_engine_answers():
    from types import SimpleNamespace

    from cudastack.build.executor import _note_tag_at_stop

    node = SimpleNamespace(tag="cudastack-test/x:1")

    class Engine:
        def __init__(self, answer):
            self.answer = answer

        def exists(self, tag):
            if isinstance(self.answer, Exception):
                raise self.answer
            return self.answer

    for answer, expect in ((True, {"tag_at_stop": "cudastack-test/x:1"}), (False, {}),
                           (RuntimeError("no engine"), {"tag_at_stop": None})):
        entry: dict = {}
        _note_tag_at_stop(Engine(answer), node, entry)
        assert entry == expect, (answer, entry)
