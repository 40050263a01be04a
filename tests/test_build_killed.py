"""Case C33 for real: `invoke build` killed with SIGKILL while a node builds.

The fixture chain (tests/fixtures/recipes, images tagged cudastack-test/...) is built by a real `invoke build`
whose source node runs a long, uniquely named `sleep` inside its docker build. While that sleep runs, the
invoke process gets SIGKILL (no handler can run). Then:

* the docker CLI child and every other descendant are gone within seconds, and so is the `sleep` inside the
  build (the daemon cancelled the solve): no orphaned build keeps running;
* the run journal, written before the first docker build, says "running" and names the node being built;
* the next `invoke build` says the previous run was interrupted, its record now says "interrupted", and the
  stale `.export-*` folder the killed run left beside the wheelhouse is removed.
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
INVOKE = [sys.executable, "-m", "invoke", "-r", str(Path(__file__).resolve().parents[1])]


def _recipes(tmp_path: Path, setup_prefix: str) -> Path:
    """A copy of the fixture recipes whose cuda-ext source runs ``setup_prefix`` before its setup.py."""
    psutil = pytest.importorskip("psutil")  # noqa: F841  (the test needs it; declared in the test extra)
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


def _invoke(recipes: Path, state: Path, out) -> subprocess.Popen:
    return subprocess.Popen([*INVOKE, "build", "--cuda", "13.1", "--recipes", str(recipes), "--state-dir",
                             str(state), "--prefix", "cudastack-test", "--max-jobs", "1"],
                            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _procs_with_cmdline(psutil, cmd: list[str]) -> list:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if (p.info.get("cmdline") or []) == cmd:
            found.append(p)
    return found


@pytest.mark.docker
@pytest.mark.network
def test_sigkill_of_invoke_build_leaves_no_orphan_and_the_next_run_reports_it(tmp_path):
    import psutil

    marker = f"{random.randint(1000, 9999)}.{random.randint(100, 999)}"      # a unique `sleep` argument
    sleep_cmd = ["sleep", marker]
    recipes = _recipes(tmp_path / "a", f"import subprocess\nsubprocess.run({sleep_cmd!r})\n")
    state = tmp_path / "state"
    out_path = tmp_path / "first.out"
    with open(out_path, "wb") as out:
        proc = _invoke(recipes, state, out)
        try:
            # the base node may have to be built first (minutes); wait for the sleep inside cuda-ext's build
            deadline = time.monotonic() + 1200
            sleepers = []
            while time.monotonic() < deadline and proc.poll() is None:
                sleepers = _procs_with_cmdline(psutil, sleep_cmd)
                if sleepers:
                    break
                time.sleep(1)
            assert sleepers, f"the build never reached the sleep: {out_path.read_text(errors='replace')[-3000:]}"
            descendants = psutil.Process(proc.pid).children(recursive=True)
            assert any("docker" in " ".join(d.cmdline()) for d in descendants), descendants
            latest = json.loads((state / "records" / "latest-cu13.1.json").read_text())
            exports = list((state / "wheelhouse").glob(".export-cuda-ext-*"))
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
    # the journal was on disk before the kill: it says running and names the node being built
    assert latest["status"] == "running" and latest["pid"] == proc.pid
    assert {n["name"]: n["status"] for n in latest["nodes"]}["cuda-ext"] == "building"
    assert exports, "a wheels node builds into an export folder beside the wheelhouse"

    # no orphan: the CLI (and anything else it started) and the sleep inside the build end within seconds
    gone, alive = psutil.wait_procs(descendants, timeout=20)
    assert not alive, f"orphaned after SIGKILL of invoke: {[(p.pid, p.cmdline()) for p in alive]}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _procs_with_cmdline(psutil, sleep_cmd):
        time.sleep(1)
    assert not _procs_with_cmdline(psutil, sleep_cmd), "the build's RUN step kept running after its client died"
    assert all(p.exists() for p in exports), "the killed run could not clean up (the next run must)"

    # the next run (its cuda-ext now fails at once: the test needs only its start) reports and cleans up
    recipes2 = _recipes(tmp_path / "b", "import sys\nsys.exit('fixture: fail fast')\n")
    with open(tmp_path / "second.out", "wb") as out:
        second = _invoke(recipes2, state, out)
        rc = second.wait(timeout=1200)
    text = (tmp_path / "second.out").read_text(errors="replace")
    assert rc == 6, text                                          # the fail-fast node: BuildError
    assert f"previous run {latest['run_id']}" in text and "was interrupted while building cuda-ext" in text, text
    assert "stale export folder" in text, text
    assert not any(p.exists() for p in exports)
    old = json.loads((state / "records" / f"build-cu13.1-{latest['run_id']}.json").read_text())
    assert old["status"] == "interrupted" and "ended without recording an exit" in old["error"]
    assert {n["name"]: n["status"] for n in old["nodes"]}["cuda-ext"] == "interrupted"
    assert json.loads((state / "records" / "latest-cu13.1.json").read_text())["status"] == "failed"
    assert list((state / "wheelhouse").glob(".export-*")) == []


def test_recovery_tells_dead_runs_from_live_ones(tmp_path):
    """Without docker: a "running" journal whose pid is gone becomes "interrupted"; one whose process lives
    (this one) is left alone; stale export and secret folders go, a live run's stay."""
    from cudastack.build.executor import _proc_start, recover_interrupted, remove_stale_exports

    dead = subprocess.Popen(["true"])
    dead.wait()
    rec_dir = tmp_path / "records"
    rec_dir.mkdir()
    node = {"name": "flash-attn", "status": "building"}
    for run, pid, start in (("dead", dead.pid, "1"), ("live", os.getpid(), _proc_start(os.getpid()))):
        (rec_dir / f"build-cu13.1-{run}.json").write_text(json.dumps(
            {"run_id": run, "status": "running", "pid": pid, "proc_start": start, "host": os.uname().nodename,
             "started": "2026-01-01T00:00:00+00:00", "nodes": [dict(node)]}))
    (rec_dir / "latest-cu13.1.json").write_text((rec_dir / "build-cu13.1-dead.json").read_text())
    said: list[str] = []
    found = recover_interrupted(tmp_path, "13.1", said.append)
    assert [r["run_id"] for r in found] == ["dead"]
    dead_rec = json.loads((rec_dir / "build-cu13.1-dead.json").read_text())
    assert dead_rec["status"] == "interrupted" and dead_rec["nodes"][0]["status"] == "interrupted"
    assert json.loads((rec_dir / "latest-cu13.1.json").read_text())["status"] == "interrupted"
    assert json.loads((rec_dir / "build-cu13.1-live.json").read_text())["status"] == "running"
    assert said and "previous run dead" in said[0] and "while building flash-attn" in said[0]

    wh = tmp_path / "wheelhouse"
    for name in (f".export-flash-attn-p{dead.pid}-abc", ".export-sgl-kernel-x1y2z3", f".export-x-p{os.getpid()}-q"):
        (wh / name).mkdir(parents=True)
    (tmp_path / f".secrets-p{dead.pid}-k").mkdir()
    removed = remove_stale_exports(wh, said.append)
    assert sorted(removed) == sorted([f".export-flash-attn-p{dead.pid}-abc", ".export-sgl-kernel-x1y2z3"])
    assert [p.name for p in wh.iterdir()] == [f".export-x-p{os.getpid()}-q"]
    assert remove_stale_exports(tmp_path, said.append, ".secrets-*", "secret folders") == [f".secrets-p{dead.pid}-k"]


def test_the_run_lock_tells_a_live_holder_from_a_stale_record(tmp_path):
    """Without docker: a "running" record whose lock file no process holds is interrupted even though its pid
    and start time are this live process's (what a recycled pid looks like to the pid check); one whose lock a
    live process holds is left alone, with its export folder, until that holder is SIGKILLed; then the record,
    the folder and the lock file all go."""
    from cudastack.build.executor import _proc_start, recover_interrupted, remove_stale_exports, remove_stale_locks
    from cudastack.build.journal import lock_held, lock_name

    rec_dir, locks, wh = tmp_path / "records", tmp_path / "locks", tmp_path / "wheelhouse"
    rec_dir.mkdir()
    locks.mkdir()
    wh.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\nfrom cudastack.build.journal import RunLock\n"
         "with RunLock(Path(sys.argv[1])) as lk:\n    print(lk.name, flush=True)\n    time.sleep(600)\n",
         str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "validate")])})
    try:
        assert holder.stdout.readline().strip() == lock_name(holder.pid)
        stale = lock_name(os.getpid() + 1_000_000)            # a lock file left behind, no holder
        (tmp_path / stale).touch()
        assert lock_held(tmp_path / lock_name(holder.pid)) is True and lock_held(tmp_path / stale) is False
        for run, pid, lock in (("stale", os.getpid(), stale), ("held", holder.pid, lock_name(holder.pid))):
            (rec_dir / f"build-cu13.1-{run}.json").write_text(json.dumps(
                {"run_id": run, "status": "running", "pid": pid, "proc_start": _proc_start(pid), "lock": lock,
                 "host": os.uname().nodename, "started": "2026-01-01T00:00:00+00:00", "nodes": []}))
        (wh / f".export-x-p{holder.pid}-q").mkdir()
        said: list[str] = []
        assert [r["run_id"] for r in recover_interrupted(tmp_path, "13.1", said.append)] == ["stale"]
        assert json.loads((rec_dir / "build-cu13.1-held.json").read_text())["status"] == "running"
        assert remove_stale_exports(wh, said.append, locks=locks) == []
        assert remove_stale_locks(tmp_path) == [Path(stale).name]
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    # the kernel dropped the lock with its holder: the same checks now call the run dead
    assert lock_held(tmp_path / lock_name(holder.pid)) is False
    assert [r["run_id"] for r in recover_interrupted(tmp_path, "13.1", said.append)] == ["held"]
    assert remove_stale_exports(wh, said.append, locks=locks) == [f".export-x-p{holder.pid}-q"]
    assert remove_stale_locks(tmp_path) == [Path(lock_name(holder.pid)).name]
    assert list(locks.iterdir()) == []


def test_child_started_with_die_with_parent_ends_when_its_parent_is_sigkilled(tmp_path):
    """Without docker: the engine's preexec_fn (PR_SET_PDEATHSIG) on a plain child. The parent, SIGKILLed,
    runs no handler; the child still ends within seconds. Started without it, the child outlives the parent."""
    import psutil

    script = ("import subprocess, sys, time\n"
              "from cudastack.build.engine import die_with_parent\n"
              "use = sys.argv[1] == 'yes'\n"
              "p = subprocess.Popen(['sleep', '321.%s' % sys.argv[2]], preexec_fn=die_with_parent() if use else None)\n"
              "print(p.pid, flush=True)\n"
              "time.sleep(600)\n")
    results = {}
    for use in ("yes", "no"):
        parent = subprocess.Popen([sys.executable, "-c", script, use, str(os.getpid())], stdout=subprocess.PIPE,
                                  text=True, cwd=ROOT)
        child = psutil.Process(int(parent.stdout.readline()))
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        try:
            child.wait(timeout=10)
            results[use] = "ended"
        except psutil.TimeoutExpired:
            results[use] = "orphan"
            child.kill()
    assert results == {"yes": "ended", "no": "orphan"}
