"""Process orchestration: every probe in its own process group, one process per rank, with a timeout.

For a probe at world size ``n`` the orchestrator starts ``n`` worker processes (``python -m
stackprobe.runtime.worker``); rank 0 leads a new process group and every other rank joins that group (same session, as setpgid requires), so
one ``killpg`` ends them all. Each process carries ``STACKPROBE_RUN_ID`` in its environment; after the group is
ended, ``/proc/*/environ`` is scanned for that marker and any survivor (a process that left the group) is killed,
so no GPU process is left behind.

Nothing outlives the suite even when the suite itself is killed: every rank gets a parent-death signal
(``PR_SET_PDEATHSIG`` = SIGKILL, set in the pre-exec hook and again by the worker), and a guard process
(:mod:`stackprobe.runtime.guard`, own session, parent-death signal SIGTERM) kills the ranks' process group and
every process carrying the run's marker when the suite dies without cleaning up. Outcomes:

* ``ok``: every rank exited 0 and wrote its result;
* ``crash``: a rank exited non-zero or by a signal (the others are ended after a grace period); the report keeps
  the last lines of that rank's output;
* ``hang``: the timeout passed with a rank still running; all are killed; the last lines are kept.

Every child gets multicast off unconditionally (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``,
``NVSHMEM_DISABLE_NVLS=1``) unless the caller overrides one explicitly: NVLink multicast can take shared GPUs out
of service, and the PCIe target has none.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .children import become_subreaper, child_pids, die_with_parent, reap

MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# removed from the inherited environment: the baseline is NCCL as an engine runs it, and a setting row sets its
# own; only an explicit --env puts one back
NCCL_SETTINGS_UNSET = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_GRAPH_MIXING_SUPPORT")
RUN_ID_VAR = "STACKPROBE_RUN_ID"
TAIL_LINES = 30


@dataclass
class ProbeRun:
    """Outcome of one probe's process group. ``status``: ok / crash / hang. ``ranks``: each rank's result JSON
    (ok only). ``tail``: last lines of the failing (or rank 0's) output. ``leftover_pids``: processes still
    alive after cleanup (should be empty)."""

    probe: str
    world_size: int
    status: str
    seconds: float
    ranks: list[dict] = field(default_factory=list)
    tail: list[str] = field(default_factory=list)
    failed_rank: int | None = None
    returncodes: list[int | None] = field(default_factory=list)
    killed_pids: list[int] = field(default_factory=list)
    leftover_pids: list[int] = field(default_factory=list)
    detached_pids: list[int] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    run_id: str = ""
    #: NCCL's transport from the ranks' NCCL_DEBUG=INFO lines (:func:`stackprobe.runtime.nccl_transport.summarize`),
    #: when the ranks ran with NCCL_DEBUG set; None otherwise
    nccl_transport: dict | None = None

    def to_json(self) -> dict:
        return dict(self.__dict__)


def child_env(probe_env: dict[str, str], overrides: dict[str, str] | None = None,
              base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment of every probe process: the parent's without ``NCCL_ALGO``/``NCCL_PROTO``/
    ``NCCL_GRAPH_MIXING_SUPPORT``, then multicast off, then the probe's own settings, then the caller's explicit
    overrides (``--env KEY=VALUE``), which win."""
    env = dict(os.environ if base is None else base)
    for k in NCCL_SETTINGS_UNSET:
        env.pop(k, None)
    env.update(MULTICAST_OFF)
    env.update(probe_env)
    env.update(overrides or {})
    env["PYTHONUNBUFFERED"] = "1"
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def processes_with_marker(run_id: str) -> list[int]:
    """PIDs whose environment holds ``STACKPROBE_RUN_ID=run_id`` (Linux ``/proc``; empty elsewhere)."""
    needle = f"{RUN_ID_VAR}={run_id}".encode()
    pids = []
    proc = Path("/proc")
    if not proc.is_dir():
        return pids
    for d in proc.iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            environ = (d / "environ").read_bytes()
            stat = (d / "stat").read_text()
        except OSError:
            continue
        # zombies (state Z) hold no resources and vanish when reaped
        state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else ""
        if needle in environ.split(b"\0") and state != "Z":
            pids.append(int(d.name))
    return pids


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tail_lines(path: Path, n: int = TAIL_LINES, drop: str | None = None) -> list[str]:
    """The last ``n`` lines of ``path``, leaving out lines that contain ``drop`` (NCCL's INFO lines)."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln for ln in lines if drop is None or drop not in ln][-n:]


def _start_guard(pgid: int, run_id: str, env: dict[str, str], scratch: Path | None = None) -> subprocess.Popen | None:
    args = [sys.executable, "-m", "stackprobe.runtime.guard", str(pgid), run_id] + ([str(scratch)] if scratch else [])
    try:
        return subprocess.Popen(args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=die_with_parent(signal.SIGTERM))
    except OSError:
        return None


def _stop_guard(guard: subprocess.Popen | None) -> None:
    if guard is None:
        return
    try:
        guard.send_signal(signal.SIGUSR1)
        guard.wait(timeout=5)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        guard.kill()
        guard.wait(timeout=5)


def run_probe(probe_ref: str, world_size: int, config: dict, *, device: str = "cuda", timeout: float = 300.0,
              probe_env: dict[str, str] | None = None, env_overrides: dict[str, str] | None = None,
              crash_grace: float = 10.0, workdir: str | None = None, name: str | None = None,
              progress=None, extra: dict | None = None, catch_orphans: bool = True) -> ProbeRun:
    """Run one probe (``module:attr``) at ``world_size`` ranks and return its :class:`ProbeRun`.

    ``config``: :class:`~stackprobe.runtime.bench.BenchConfig` fields. ``timeout`` (s) covers the whole group;
    ``crash_grace`` (s) is how long the other ranks may run on after one rank fails before they are killed.
    ``catch_orphans``: make this process the ranks' child subreaper (:func:`~stackprobe.runtime.children.
    become_subreaper`), so a descendant that left the group and scrubbed its environment (C49) is re-parented
    here, killed after the run and named in ``detached_pids`` and ``killed_pids`` (``leftover_pids`` if it
    survives the kill). Probes run one at a time: a child this process starts from another thread during a run
    would be taken for a detached descendant.
    """
    name = name or probe_ref
    tmp = Path(tempfile.mkdtemp(prefix="stackprobe-rt-", dir=workdir))
    try:
        return _run_in(tmp, probe_ref, name, world_size, config, device, timeout, probe_env, env_overrides,
                       crash_grace, progress, extra, catch_orphans)
    finally:
        if not os.environ.get("STACKPROBE_KEEP_LOGS"):
            shutil.rmtree(tmp, ignore_errors=True)   # also when interrupted (SIGTERM, Ctrl-C): no scratch left


def _run_in(tmp: Path, probe_ref, name, world_size, config, device, timeout, probe_env, env_overrides, crash_grace,
            progress, extra, catch_orphans) -> ProbeRun:
    run_id = uuid.uuid4().hex
    env = child_env(probe_env or {}, env_overrides)
    env[RUN_ID_VAR] = run_id
    env["STACKPROBE_PARENT_PID"] = str(os.getpid())
    spec = {"probe": probe_ref, "world_size": world_size, "store": str(tmp / "store"), "device": device,
            "config": config, "result_dir": str(tmp), **(extra or {})}
    (tmp / "spec.json").write_text(json.dumps(spec))
    logs = [tmp / f"rank{r}.log" for r in range(world_size)]
    procs: list[subprocess.Popen] = []
    t0 = time.monotonic()
    pgid = None
    guard = None
    pdeath = die_with_parent(signal.SIGKILL)
    caught = catch_orphans and become_subreaper()
    children_before = set(child_pids(zombies=True)) if caught else set()
    try:
        for r in range(world_size):
            cmd = [sys.executable, "-m", "stackprobe.runtime.worker", str(tmp / "spec.json"), str(r)]
            with open(logs[r], "wb") as log:
                p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
                                     process_group=0 if r == 0 else pgid, preexec_fn=pdeath)
                if r == 0:
                    pgid = p.pid
                    guard = _start_guard(pgid, run_id, {k: v for k, v in env.items() if k != RUN_ID_VAR}, tmp)
            procs.append(p)
        status, failed = "ok", None
        fail_time = None
        while True:
            codes = [p.poll() for p in procs]
            bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
            if bad and failed is None:
                failed, fail_time, status = bad[0], time.monotonic(), "crash"
            if all(c is not None for c in codes):
                break
            now = time.monotonic()
            if fail_time is not None and now - fail_time > crash_grace:
                break
            if now - t0 > timeout:
                status = "hang" if failed is None else status
                if failed is None:
                    failed = next((r for r, c in enumerate(codes) if c is None), 0)
                break
            time.sleep(0.1)
    finally:
        killed = _cleanup(pgid, procs, run_id)
        _stop_guard(guard)
        orphans = _end_orphans(children_before | {p.pid for p in procs} | ({guard.pid} if guard else set())) \
            if caught else []
    seconds = time.monotonic() - t0
    run = ProbeRun(probe=name, world_size=world_size, status=status, seconds=round(seconds, 2),
                   returncodes=[p.returncode for p in procs], failed_rank=failed, killed_pids=killed + orphans,
                   detached_pids=orphans,
                   env={k: env[k] for k in sorted(set(MULTICAST_OFF) | set(probe_env or {}) | set(env_overrides or {}))},
                   run_id=run_id)
    drop = "NCCL INFO"      # NCCL's INFO lines (the baseline runs with NCCL_DEBUG=INFO) would hide the last error
    if status == "ok":
        for r in range(world_size):
            f = tmp / f"rank{r}.json"
            if not f.exists():
                run.status, run.failed_rank = "crash", r
                run.tail = [f"rank {r} exited 0 without writing its result"] + tail_lines(logs[r], drop=drop)
                break
            run.ranks.append(json.loads(f.read_text()))
        if run.status == "ok":
            run.tail = tail_lines(logs[0], 10, drop)
    else:
        run.tail = tail_lines(logs[failed if failed is not None else 0], drop=drop)
    run.nccl_transport = _nccl_transport(logs, env, probe_env)
    run.leftover_pids = sorted(set(processes_with_marker(run_id)) | set(p for p in orphans if _alive(p)))
    if progress:
        progress(f"{name} @ world size {world_size}: {run.status} in {run.seconds:.1f} s")
    if os.environ.get("STACKPROBE_KEEP_LOGS"):
        run.tail.append(f"(logs kept in {tmp})")
    return run


def _nccl_transport(logs: list[Path], env: dict[str, str], probe_env: dict[str, str] | None) -> dict | None:
    """NCCL's transport from the ranks' logs (:func:`stackprobe.runtime.nccl_transport.summarize`) when the probe
    asked for NCCL's log (``NCCL_DEBUG`` in its environment); None otherwise."""
    if "NCCL_DEBUG" not in (probe_env or {}):
        return None
    from .nccl_transport import summarize
    texts = []
    for lg in logs:
        try:
            texts.append(lg.read_text(errors="replace"))
        except OSError:
            pass
    return summarize(texts, env)


def _alive(pid: int) -> bool:
    st = Path(f"/proc/{pid}/stat")
    try:
        return st.read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def _end_orphans(known: set[int]) -> list[int]:
    """Kill every child of this process (the subreaper) that it did not start itself (``known``): descendants
    of the ranks re-parented here when their parent died. Repeated while more arrive (an orphan's own
    children are re-parented when it is killed). Returns their pids; each is reaped."""
    ended: list[int] = []
    for _ in range(10):
        new = [p for p in child_pids(zombies=True) if p not in known and p not in ended]
        if not new:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            ended.append(pid)
        time.sleep(0.1)
        reap(ended)
    reap(ended)
    return ended


def _cleanup(pgid: int | None, procs: list[subprocess.Popen], run_id: str) -> list[int]:
    """End the process group (TERM, then KILL), reap the ranks, and kill any process still carrying the run's
    marker. Returns the pids that had to be killed after the ranks had ended or been told to."""
    if pgid is not None:
        alive = [p for p in procs if p.poll() is None]
        if alive:
            _killpg(pgid, signal.SIGTERM)
            deadline = time.monotonic() + 3.0
            while time.monotonic() < deadline and any(p.poll() is None for p in procs):
                time.sleep(0.05)
        _killpg(pgid, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)
    killed = []
    for _ in range(3):
        strays = processes_with_marker(run_id)
        if not strays:
            break
        for pid in strays:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.2)
    return killed


@dataclass
class SessionResult:
    """Outcome of :func:`run_in_session`: ``returncode`` (None when it timed out), ``stdout``, ``stderr`` (text),
    ``timed_out``, ``killed_pids`` (processes of the session or carrying its marker that were still alive at
    the end and were killed)."""

    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    killed_pids: list[int] = field(default_factory=list)


def run_in_session(cmd: list[str], *, input: str | None = None, timeout: float = 600.0,
                   env: dict[str, str] | None = None) -> SessionResult:
    """Run a command that may start compilers (a JIT build, ninja, nvcc) so that none of them outlives it or us:
    the child starts a new session (its own process group), dies with this process (``PR_SET_PDEATHSIG``), and a
    guard (:mod:`stackprobe.runtime.guard`) kills the whole group when this process dies first. When the command
    ends or times out, the group and every process carrying the run's marker (``STACKPROBE_RUN_ID``) are killed,
    so a compiler left running by a timed-out or crashed build is ended too."""
    run_id = uuid.uuid4().hex
    env = dict(os.environ if env is None else env)
    env[RUN_ID_VAR] = run_id
    env["STACKPROBE_PARENT_PID"] = str(os.getpid())

    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL))
    guard = _start_guard(proc.pid, run_id, {k: v for k, v in env.items() if k != RUN_ID_VAR})
    timed_out, killed = False, []
    try:
        out, err = proc.communicate(input=input, timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        # end the group and every marked process first: a child that left the group may hold the pipes open
        killed = _cleanup(proc.pid, [proc], run_id)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        killed += _cleanup(proc.pid, [proc], run_id)
        _stop_guard(guard)
    return SessionResult(None if timed_out else proc.returncode, out or "", err or "", timed_out, killed)
