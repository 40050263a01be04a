"""Process orchestration of the runtime tier, for real on CPU: worker processes, process groups, timeouts,
cleanup, crash reports, the environment every probe process gets, and that nothing outlives a killed suite."""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from stackprobe.runtime.orchestrate import MULTICAST_OFF, child_env, processes_with_marker, run_probe

pytest.importorskip("torch")

CFG = {"sizes": [4096, 65536], "dtype": "float32", "warmup": 1, "rounds": 3, "sweep_rounds": 2, "graph_calls": 10,
       "graph_replays": 1}
FIX = "test_runtime_fixture_probes"


def test_hanging_probe_is_killed_reported_as_hang_and_leaves_no_process():
    t0 = time.monotonic()
    run = run_probe(f"{FIX}:HangProbe", 2, CFG, device="cpu", timeout=20)
    elapsed = time.monotonic() - t0
    assert run.status == "hang"
    assert elapsed < 45
    assert any("hanging now" in ln for ln in run.tail), run.tail
    pids = [int(p) for ln in run.tail for p in re.findall(r"(?:child|detached) pid (\d+)", ln)]
    assert len(pids) == 2, run.tail
    # the detached grandchild left the process group; the run marker found and killed it
    assert run.killed_pids, "the detached grandchild should have been killed by the marker scan"
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, pid
    assert run.leftover_pids == []
    assert processes_with_marker(run.run_id) == []


def test_crashing_rank_is_reported_with_its_last_lines_and_the_group_is_ended():
    t0 = time.monotonic()
    run = run_probe(f"{FIX}:CrashProbe", 2, CFG, device="cpu", timeout=120, crash_grace=2)
    assert run.status == "crash"
    assert run.failed_rank == 1
    assert run.returncodes[1] not in (0, None)
    text = "\n".join(run.tail)
    assert "injected failure on rank 1" in text and "about to fail on purpose" in text
    assert time.monotonic() - t0 < 60, "rank 0 must be ended after the grace period, not at the timeout"
    assert processes_with_marker(run.run_id) == []


@pytest.mark.parametrize("world_size", [2, 3])  # nothing may assume two ranks
def test_gloo_probe_runs_for_real_with_multicast_off_in_every_rank(world_size):
    run = run_probe("stackprobe.runtime.probes:group_gloo", world_size, CFG, device="cpu", timeout=120)
    assert run.status == "ok", run.tail
    assert len(run.ranks) == world_size
    for rank in run.ranks:
        env = rank["env"]["env"]
        for k, v in MULTICAST_OFF.items():
            assert env[k] == v
        assert rank["baseline"] == "torch-gloo" and rank["backends"][0]["backend"] == "torch-gloo"
        sweep = rank["sweep"]
        assert [r["bytes"] for r in sweep] == CFG["sizes"]
        for r, rounds in zip(sweep, (3, 2)):   # rounds at the decode size, sweep rounds elsewhere
            u, floor = r["units"]["torch-gloo"], r["units"]["__floor__"]
            assert u["eager_correct"] and u["sequence_correct"] and u["timed_correct"], u
            assert len(u["samples_us"]) == len(floor["samples_us"]) == rounds
            assert min(u["samples_us"]) > 0
    assert processes_with_marker(run.run_id) == []


def test_child_env_sets_multicast_off_unless_overridden_explicitly():
    env = child_env({"NCCL_ALGO": "Tree"}, base={"NCCL_NVLS_ENABLE": "1", "PATH": "/bin"})
    assert env["NCCL_NVLS_ENABLE"] == "0"  # a parent's setting does not turn multicast on
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1" and env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["NCCL_ALGO"] == "Tree"
    env = child_env({"NCCL_ALGO": "Tree"}, {"NCCL_ALGO": "Ring", "NCCL_NVLS_ENABLE": "1"}, base={})
    assert env["NCCL_ALGO"] == "Ring" and env["NCCL_NVLS_ENABLE"] == "1"  # explicit user overrides win
    # an NCCL setting left in the shell does not reach the baseline
    env = child_env({}, base={"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL", "NCCL_GRAPH_MIXING_SUPPORT": "0", "X": "1"})
    assert not {"NCCL_ALGO", "NCCL_PROTO", "NCCL_GRAPH_MIXING_SUPPORT"} & set(env) and env["X"] == "1"
    assert child_env({}, {"NCCL_PROTO": "Simple"}, base={"NCCL_PROTO": "LL"})["NCCL_PROTO"] == "Simple"


def test_flashinfer_probes_are_runners_with_a_token_shape():
    from stackprobe.runtime import probes as P

    reg = P.registry()
    for name in ("flashinfer-allreduce-fusion", "flashinfer-pcie-ipc-allreduce"):
        probe = reg[name]
        assert not isinstance(probe, P.NotRunnableProbe) and "flashinfer" in probe.requires
        assert probe.min_world_size == 2
        assert probe.skip_reason(1, 1) is not None            # world size 1, or flashinfer missing: skipped
    assert P._token_shape(43008 // 2) == (3, 7168)          # the kimi-k2 decode message
    assert P._token_shape(16 << 20 >> 1) == (2048, 4096)
    with pytest.raises(ValueError):
        P._token_shape(100)


def _alive(pid: int) -> bool:
    return psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE


def _cmd(pid: int) -> str:
    try:
        return f"{pid} {' '.join(psutil.Process(pid).cmdline())}"
    except psutil.Error:
        return str(pid)


def _guards(within: Path | None = None) -> list[int]:
    """Guard processes; with ``within``, only those whose command line names a folder under it (a runtime run's
    guard is given its scratch folder, made under TMPDIR): a guard of another suite running beside this test on the
    same host is not this run's."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            line = " ".join(p.info["cmdline"] or [])
            if "stackprobe.runtime.guard" in line and (within is None or str(within) in line):
                out.append(p.info["pid"])
        except psutil.Error:
            pass
    return out


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killing_the_suite_mid_probe_leaves_no_survivor(tmp_path, sig):
    """The parent (the suite's CLI) is killed while both ranks hang inside a probe, each with a child in its
    process group and a grandchild in a new session (like a JIT compiler): the parent-death signal ends the
    ranks, the guard kills the group and every process carrying the run's marker."""
    pidfile = tmp_path / "pids"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    guards_before = set(_guards(scratch))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent),
                                                       str(Path(__file__).resolve().parents[1] / "validate")]),
               STACKPROBE_TEST_PIDFILE=str(pidfile), TMPDIR=str(scratch))
    cmd = [sys.executable, "-m", "stackprobe.runtime", "run", "--device", "cpu", "--world-size", "2",
           "--probes", f"{FIX}:HangProbe", "--dtype", "float32", "--sizes", "4096", "--timeout", "300",
           "--out", str(tmp_path / "out")]
    parent = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300    # a loaded 2-core CI host needs minutes for the gloo group first
        files = [Path(f"{pidfile}.{r}") for r in (0, 1)]
        while time.monotonic() < deadline and not all(f.exists() and f.read_text().strip() for f in files):
            time.sleep(0.2)
        assert all(f.exists() for f in files), "the probe never started"
        # by now the baseline group (gloo) has run; the hanging group is the one in flight
        pids = [int(x) for f in files for x in f.read_text().split()]
        assert len(pids) == 6 and all(_alive(p) for p in pids)
        new_guards = set(_guards(scratch)) - guards_before
        assert new_guards, "a guard process watches the probe's process group"
        parent.send_signal(sig)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_alive(p) for p in pids + sorted(new_guards)):
            time.sleep(0.2)
        survivors = [p for p in pids + sorted(new_guards) if _alive(p)]
        assert survivors == [], f"still running after the suite was killed: {[_cmd(p) for p in survivors]}"
        # the guard removed the run's scratch folder (spec, store, rank logs)
        assert not list(scratch.glob("stackprobe-rt-*")), list(scratch.iterdir())
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()


def test_a_timed_out_build_leaves_no_compiler_running(tmp_path):
    """run_in_session (used for the static tier's child interpreters, which may start ninja/nvcc): a command
    whose children keep running past its timeout, one of them in a new session, leaves nothing behind."""
    from stackprobe.runtime.orchestrate import run_in_session
    pidfile = tmp_path / "pids"
    script = ("import subprocess, sys, time\n"
              "sl = [sys.executable, '-c', 'import time; time.sleep(600)']\n"
              "a = subprocess.Popen(sl); b = subprocess.Popen(sl, start_new_session=True)\n"
              f"open({str(pidfile)!r}, 'w').write(f'{{a.pid}} {{b.pid}}')\n"
              "print('compiling', flush=True); time.sleep(600)\n")
    t0 = time.monotonic()
    res = run_in_session([sys.executable, "-c", script], timeout=5)
    assert res.timed_out and res.returncode is None and time.monotonic() - t0 < 30
    assert "compiling" in res.stdout
    pids = [int(x) for x in pidfile.read_text().split()]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids), pids
    ok = run_in_session([sys.executable, "-c", "import sys; print(sys.stdin.read()[::-1])"], input="abc", timeout=30)
    assert (ok.returncode, ok.stdout.strip(), ok.timed_out) == (0, "cba", False)


def _c49(tmp_path, monkeypatch, catch: bool):
    """One run of DetachScrubProbe at world size 2; returns (run, the sleepers' pids, which are alive)."""
    pidfile = tmp_path / f"c49-{catch}"
    monkeypatch.setenv("STACKPROBE_TEST_PIDFILE", str(pidfile))
    run = run_probe(f"{FIX}:DetachScrubProbe", 2, CFG, device="cpu", timeout=120, catch_orphans=catch)
    pids = [int(Path(f"{pidfile}.{r}").read_text()) for r in (0, 1)]
    deadline = time.monotonic() + 5
    while catch and time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return run, pids, [p for p in pids if _alive(p)]


def test_c49_a_detached_environment_scrubbed_grandchild_is_caught_and_named(tmp_path, monkeypatch):
    """Case C49. With the catch (the suite is the ranks' child subreaper) the sleepers are killed and named;
    with it turned off, the same run leaves both running and names neither: the marker scan and the process
    group miss them, so the catch is what finds them."""
    run, pids, alive = _c49(tmp_path, monkeypatch, catch=True)
    assert run.status == "ok", run.tail
    assert alive == [] and set(pids) <= set(run.detached_pids) and set(pids) <= set(run.killed_pids)
    assert run.leftover_pids == []
    off, pids_off, alive_off = _c49(tmp_path, monkeypatch, catch=False)
    try:
        assert off.status == "ok"
        assert sorted(alive_off) == sorted(pids_off), "with the catch off the sleepers survive"
        assert not set(pids_off) & set(off.killed_pids + off.leftover_pids + off.detached_pids)
    finally:
        for p in pids_off:
            with __import__("contextlib").suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


def test_a_child_hook_resolves_prctl_before_the_fork():
    """The pre-exec hook calls only what was looked up in the parent: no import, no find_library."""
    import dis

    from stackprobe.runtime.children import die_with_parent
    hook = die_with_parent(signal.SIGTERM)
    ops = {i.opname for i in dis.get_instructions(hook)}
    names = {i.argval for i in dis.get_instructions(hook) if i.opname in ("LOAD_GLOBAL", "LOAD_ATTR", "LOAD_METHOD")}
    assert "IMPORT_NAME" not in ops and not names & {"ctypes", "find_library", "util", "os"}, names
    p = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], preexec_fn=hook,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stdout.strip().isdigit()
