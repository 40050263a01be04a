"""A P2P check that cannot hang the box: every GPU pair's peer copy and kernel-side peer read/write, each in a child
process with a timeout, each checked against known data.

What CUDA answers about peer access (``cudaDeviceCanAccessPeer``) is not what a peer transfer does on a host with a
translated IOMMU or ACS redirect on a PCIe switch: there the driver says yes and the transfer hangs or lands wrong
(NVIDIA/nccl#1999, vllm-project/vllm#42063). This module moves real data between every pair before any
peer-memory path is started, where a hang costs one child and a timeout, not the box:

* ``copy``: a peer copy of ``nbytes`` (default 256 KiB) of int32 with a known pattern, both directions, through
  torch (``dst.copy_(src)`` across devices, which enables peer access where CUDA allows it and issues
  ``cudaMemcpyAsync`` between the devices: a copy-engine peer transfer);
* ``kernel``: a tiny kernel that dereferences the peer's pointer, once reading the peer's buffer into local memory
  and once writing local data into the peer's buffer, both directions. It is hand-written PTX (``PTX_SOURCE``)
  loaded through the CUDA driver API with ``ctypes`` (``libcuda.so.1``: ``cuModuleLoadData``, ``cuLaunchKernel``,
  peer access by ``cuCtxEnablePeerAccess``), so it needs no compiler and no package beyond the driver.

Every step runs in its own child (``python -m stackprobe.runtime.p2pcheck --child SPEC``, :func:`_run_child`): its
own session and process group, a parent-death signal, a guard (:mod:`stackprobe.runtime.guard`) that ends the group
if this process dies, and at the end the whole group plus every process carrying the run's marker is killed, with
every wait bounded (a child stuck in the driver is named, never waited for). The child's destination buffer is filled with a sentinel before the transfer and read back
after it, so a transfer that did nothing, or part of it, does not pass.

Per pair (``"i-j"``, i < j) the status is one of :data:`STATUSES`:

* ``ok``: both steps moved the known data both ways;
* ``hang``: a step gave no answer within ``timeout`` seconds; its process group was killed (the kernel step is not
  started after a hung copy);
* ``wrong-data``: a step finished but the destination did not hold the data sent (count and first index given);
* ``unsupported``: CUDA reports no peer access between the two (``cuDeviceCanAccessPeer`` / torch's
  ``can_device_access_peer``); nothing is attempted;
* ``error``: a step failed otherwise (its message kept).

With fewer than two devices there is nothing to pair; the report says so (``note``) and starts no child.

``transfer_us``: the median over ``repeats`` timed copies of ``nbytes`` (microseconds, wall time of the copy and a
device synchronize, slower direction), per pair.

Device backends: ``cuda`` (the above) and ``cpu``: the same children, timeout, kill and data check, with the
transfer done in host memory (``array('i')`` copies for ``copy``, an element-by-element loop standing in for the
kernel), so the machinery is tested where no GPU exists.

Planted faults for tests, read only by the child: ``STACKPROBE_P2P_FAULT`` is a comma list of ``KIND:i-j[:STEP]``,
KIND ``hang`` (the child starts a helper process and then stalls inside the transfer, before it completes),
``corrupt`` (one element of the destination is changed after the transfer, before the check) or ``crash`` (the
child exits 3 mid-step); STEP ``copy`` (default) or ``kernel``.

``python -m stackprobe.runtime p2p [--device cuda|cpu] [--devices N] [--timeout S] [--out DIR]`` runs it and
writes ``p2p-check.json`` / ``p2p-check.md``.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FAULT_VAR = "STACKPROBE_P2P_FAULT"
STATUSES = ("ok", "hang", "wrong-data", "unsupported", "error")
STEPS = ("copy", "kernel")
DEFAULT_BYTES = 256 * 1024
DEFAULT_TIMEOUT = 60.0       # seconds per step: torch import and CUDA contexts on two devices take 3-10 s
DEFAULT_REPEATS = 20
SENTINEL = -1
_SEVERITY = {"hang": 5, "wrong-data": 4, "error": 3, "unsupported": 2, "ok": 1}

PTX_SOURCE = """\
.version 6.3
.target sm_75
.address_size 64

.visible .entry stackprobe_peer_copy(.param .u64 param_src, .param .u64 param_dst, .param .u32 param_n)
{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [param_src];
    ld.param.u64 %rd2, [param_dst];
    ld.param.u32 %r1, [param_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.u32 %p1, %r5, %r1;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.u32 %rd5, %r5, 4;
    add.s64 %rd6, %rd3, %rd5;
    add.s64 %rd7, %rd4, %rd5;
    ld.global.u32 %r6, [%rd6];
    st.global.u32 [%rd7], %r6;
DONE:
    ret;
}
"""
"""One thread per int32 element: ``dst[k] = src[k]``. Either pointer may be the peer's (kernel-side peer read when
``src`` is, write when ``dst`` is). PTX ISA 6.3 / sm_75: the driver JIT-compiles it for the GPU present (PTX ISA
reference, "Release notes": 6.3 added sm_75)."""


# --- planted faults (read in the child only) ---------------------------------------------------------------------
def parse_faults(text: str) -> list[dict]:
    """``"hang:0-1,corrupt:1-2:kernel"`` -> ``[{"kind", "pair", "step"}]``. Raises ``ValueError`` naming a bad
    item."""
    out = []
    for item in (t.strip() for t in (text or "").split(",")):
        if not item:
            continue
        parts = item.split(":")
        if len(parts) not in (2, 3) or parts[0] not in ("hang", "corrupt", "crash") or \
                (len(parts) == 3 and parts[2] not in STEPS):
            raise ValueError(f"{FAULT_VAR} item {item!r}: write KIND:i-j[:STEP] with KIND hang|corrupt|crash "
                             f"and STEP {'|'.join(STEPS)}")
        out.append({"kind": parts[0], "pair": _pair_key(*parts[1].split("-")), "step": parts[2] if len(parts) == 3
                    else "copy"})
    return out


def _pair_key(a, b) -> str:
    i, j = sorted((int(a), int(b)))
    return f"{i}-{j}"


def pattern(n: int, a: int, b: int, step: str) -> list[int]:
    """The known data for one direction: int32 values that differ per element, per direction and per step (a
    transfer that delivered another pair's or another step's data does not pass)."""
    import zlib
    seed = (a * 131 + b * 17 + zlib.crc32(step.encode())) * 2654435761
    return [((k * 2246822519 + seed) & 0x7FFFFFFF) for k in range(n)]


def compare(got, expected) -> dict:
    """``{"ok", "mismatches", "first_bad": index | None, "got", "expected"}`` (values at the first bad index)."""
    bad = [k for k, (g, e) in enumerate(zip(got, expected)) if g != e]
    if len(got) != len(expected):
        bad = bad or [min(len(got), len(expected))]
    first = bad[0] if bad else None
    return {"ok": not bad, "mismatches": len(bad) + abs(len(got) - len(expected)), "first_bad": first,
            "got": (int(got[first]) if first is not None and first < len(got) else None),
            "expected": (int(expected[first]) if first is not None and first < len(expected) else None)}


# --- the child ---------------------------------------------------------------------------------------------------
class _Events:
    def __init__(self, path: str):
        self.f = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed at exit, written line by line

    def emit(self, **rec) -> None:
        self.f.write(json.dumps(rec) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())


class _Faults:
    def __init__(self, faults: list[dict], pair: str, step: str, events: _Events):
        self.kinds = {f["kind"] for f in faults if f["pair"] == pair and f["step"] == step}
        self.events = events

    def stall_point(self) -> None:
        """Inside the transfer, before it is waited for: a planted hang starts a helper (which must not survive
        the kill either) and stalls; a planted crash exits."""
        if "crash" in self.kinds:
            os._exit(3)
        if "hang" in self.kinds:
            import subprocess
            helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.events.emit(event="helper", pid=helper.pid)
            while True:
                time.sleep(1)

    @property
    def corrupt(self) -> bool:
        return "corrupt" in self.kinds


class CpuBackend:
    """Host memory standing in for two devices: the same child, timeout, kill and data check as on GPUs."""

    name = "cpu"

    def __init__(self, count: int):
        self.count = count

    def can_access_peer(self, a: int, b: int) -> tuple[bool, str]:
        ok = a < self.count and b < self.count
        return ok, "" if ok else f"device {max(a, b)} not present ({self.count} simulated)"

    def _arr(self, values):
        from array import array
        return array("i", values)

    def copy(self, a, b, data, faults, repeats):
        src, dst = self._arr(data), self._arr([SENTINEL] * len(data))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst[:] = src
            times.append((time.perf_counter() - t0) * 1e6)
        dst[:] = self._arr([SENTINEL] * len(data))
        dst[:] = src
        faults.stall_point()
        if faults.corrupt:
            dst[len(dst) // 2] ^= 0x55
        return list(dst), times

    def kernel(self, a, b, data, faults, repeats, mode):
        src, dst = self._arr(data), self._arr([SENTINEL] * len(data))
        t0 = time.perf_counter()
        for k in range(len(src)):      # one "thread" per element, as the PTX kernel
            dst[k] = src[k]
        faults.stall_point()
        if faults.corrupt:
            dst[len(dst) // 2] ^= 0x55
        return list(dst), [(time.perf_counter() - t0) * 1e6]

    def close(self):
        pass


class TorchCudaBackend:
    """The copy step on GPUs: torch tensors, ``dst.copy_(src)`` across devices."""

    name = "cuda"

    def __init__(self):
        import torch
        self.torch = torch

    def can_access_peer(self, a: int, b: int) -> tuple[bool, str]:
        t = self.torch
        n = t.cuda.device_count()
        if max(a, b) >= n:
            return False, f"GPU {max(a, b)} not visible ({n} visible)"
        if a == b:
            return True, ""            # the self-test: one device, no peer access involved
        ok = bool(t.cuda.can_device_access_peer(a, b))
        return ok, "" if ok else f"CUDA reports no peer access from GPU {a} to GPU {b} (cudaDeviceCanAccessPeer)"

    def copy(self, a, b, data, faults, repeats):
        t = self.torch
        src = t.tensor(data, dtype=t.int32, device=f"cuda:{a}")
        dst = t.full((len(data),), SENTINEL, dtype=t.int32, device=f"cuda:{b}")
        dst.copy_(src)                     # warm-up (enables peer access)
        self._sync(a, b)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src)
            self._sync(a, b)
            times.append((time.perf_counter() - t0) * 1e6)
        dst.fill_(SENTINEL)
        self._sync(a, b)
        dst.copy_(src)
        faults.stall_point()
        self._sync(a, b)
        if faults.corrupt:
            dst[len(data) // 2] ^= 0x55
            self._sync(a, b)
        return dst.cpu().tolist(), times

    def _sync(self, a, b):
        self.torch.cuda.synchronize(a)
        self.torch.cuda.synchronize(b)

    def close(self):
        pass


class DriverKernelBackend:
    """The kernel step on GPUs: :data:`PTX_SOURCE` through the CUDA driver API (``libcuda.so.1`` via ctypes), on the
    devices' primary contexts, with peer access enabled from the launching device to the other."""

    name = "cuda"

    def __init__(self):
        import ctypes as C
        self.C = C
        try:
            self.cu = C.CDLL("libcuda.so.1")
        except OSError as exc:
            raise RuntimeError(f"the CUDA driver library libcuda.so.1 does not load: {exc}") from None
        cu, u64, P = self.cu, C.c_uint64, C.POINTER
        sig = {"cuInit": [C.c_uint], "cuDeviceGet": [P(C.c_int), C.c_int], "cuDeviceGetCount": [P(C.c_int)],
               "cuDeviceCanAccessPeer": [P(C.c_int), C.c_int, C.c_int],
               "cuDevicePrimaryCtxRetain": [P(C.c_void_p), C.c_int], "cuCtxSetCurrent": [C.c_void_p],
               "cuCtxEnablePeerAccess": [C.c_void_p, C.c_uint], "cuMemAlloc_v2": [P(u64), C.c_size_t],
               "cuMemFree_v2": [u64], "cuMemcpyHtoD_v2": [u64, C.c_void_p, C.c_size_t],
               "cuMemcpyDtoH_v2": [C.c_void_p, u64, C.c_size_t], "cuMemsetD32_v2": [u64, C.c_uint, C.c_size_t],
               "cuModuleLoadData": [P(C.c_void_p), C.c_char_p],
               "cuModuleGetFunction": [P(C.c_void_p), C.c_void_p, C.c_char_p],
               "cuLaunchKernel": [C.c_void_p, C.c_uint, C.c_uint, C.c_uint, C.c_uint, C.c_uint, C.c_uint, C.c_uint,
                                  C.c_void_p, P(C.c_void_p), P(C.c_void_p)],
               "cuCtxSynchronize": [], "cuGetErrorString": [C.c_int, P(C.c_char_p)]}
        for name, args in sig.items():
            fn = getattr(cu, name)
            fn.argtypes, fn.restype = args, C.c_int
        self.check(cu.cuInit(0), "cuInit")
        self.ctx: dict[int, object] = {}
        self.funcs: dict[int, object] = {}

    def check(self, res: int, what: str) -> None:
        if res != 0:
            s = self.C.c_char_p()
            self.cu.cuGetErrorString(res, self.C.byref(s))
            raise RuntimeError(f"{what}: {(s.value or b'?').decode()} (CUresult {res})")

    def _dev(self, i: int):
        d = self.C.c_int()
        self.check(self.cu.cuDeviceGet(self.C.byref(d), i), f"cuDeviceGet({i})")
        return d.value

    def _ctx(self, i: int):
        if i not in self.ctx:
            c = self.C.c_void_p()
            self.check(self.cu.cuDevicePrimaryCtxRetain(self.C.byref(c), self._dev(i)), f"cuDevicePrimaryCtxRetain({i})")
            self.ctx[i] = c
        self.check(self.cu.cuCtxSetCurrent(self.ctx[i]), f"cuCtxSetCurrent({i})")
        return self.ctx[i]

    def can_access_peer(self, a: int, b: int) -> tuple[bool, str]:
        n = self.C.c_int()
        self.check(self.cu.cuDeviceGetCount(self.C.byref(n)), "cuDeviceGetCount")
        if max(a, b) >= n.value:
            return False, f"GPU {max(a, b)} not visible ({n.value} visible)"
        if a == b:
            return True, ""
        ok = self.C.c_int()
        self.check(self.cu.cuDeviceCanAccessPeer(self.C.byref(ok), self._dev(a), self._dev(b)),
                   "cuDeviceCanAccessPeer")
        return bool(ok.value), "" if ok.value else \
            f"CUDA reports no peer access from GPU {a} to GPU {b} (cuDeviceCanAccessPeer)"

    def _alloc(self, i: int, nbytes: int) -> int:
        self._ctx(i)
        p = self.C.c_uint64()
        self.check(self.cu.cuMemAlloc_v2(self.C.byref(p), nbytes), f"cuMemAlloc on GPU {i}")
        return p.value

    def _func(self, i: int):
        self._ctx(i)
        if i not in self.funcs:
            mod, fn = self.C.c_void_p(), self.C.c_void_p()
            self.check(self.cu.cuModuleLoadData(self.C.byref(mod), PTX_SOURCE.encode()), f"cuModuleLoadData on GPU {i}")
            self.check(self.cu.cuModuleGetFunction(self.C.byref(fn), mod, b"stackprobe_peer_copy"),
                       "cuModuleGetFunction")
            self.funcs[i] = fn
        return self.funcs[i]

    def _launch(self, on: int, src: int, dst: int, n: int) -> None:
        C = self.C
        fn = self._func(on)
        args = [C.c_uint64(src), C.c_uint64(dst), C.c_uint32(n)]
        params = (C.c_void_p * 3)(*[C.cast(C.pointer(x), C.c_void_p) for x in args])
        threads = 256
        self.check(self.cu.cuLaunchKernel(fn, (n + threads - 1) // threads, 1, 1, threads, 1, 1, 0, None, params,
                                          None), f"cuLaunchKernel on GPU {on}")

    def kernel(self, a, b, data, faults, repeats, mode):
        """``mode`` ``read``: the kernel runs on ``b`` and reads ``a``'s buffer (peer) into ``b``'s; ``write``: it runs
        on ``a`` and writes ``a``'s buffer into ``b``'s (peer). Either way the data goes from ``a`` to ``b``."""
        C = self.C
        n = len(data)
        nbytes = 4 * n
        on, peer = (b, a) if mode == "read" else (a, b)
        peer_ctx = self._ctx(peer)       # retained (and current) first, then the launching device's made current
        self._ctx(on)
        res = self.cu.cuCtxEnablePeerAccess(peer_ctx, 0) if on != peer else 0
        if res not in (0, 704):          # 704: CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED
            self.check(res, f"cuCtxEnablePeerAccess (GPU {on} -> GPU {peer})")
        self._func(on)                   # the PTX JIT-compiled and loaded before any timing
        src, dst = self._alloc(a, nbytes), self._alloc(b, nbytes)
        host = (C.c_int32 * n)(*data)
        self._ctx(a)
        self.check(self.cu.cuMemcpyHtoD_v2(src, C.cast(host, C.c_void_p), nbytes), "cuMemcpyHtoD")
        times = []
        try:
            for _ in range(max(1, repeats)):
                self._ctx(b)
                self.check(self.cu.cuMemsetD32_v2(dst, SENTINEL & 0xFFFFFFFF, n), "cuMemsetD32")
                self.check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")
                self._ctx(on)
                t0 = time.perf_counter()
                self._launch(on, src, dst, n)
                faults.stall_point()
                self.check(self.cu.cuCtxSynchronize(), f"the peer {mode} kernel on GPU {on}")
                times.append((time.perf_counter() - t0) * 1e6)
            if faults.corrupt:
                bad = C.c_int32(data[n // 2] ^ 0x55)
                self._ctx(b)
                self.check(self.cu.cuMemcpyHtoD_v2(dst + 4 * (n // 2), C.cast(C.pointer(bad), C.c_void_p), 4),
                           "cuMemcpyHtoD")
            out = (C.c_int32 * n)()
            self._ctx(b)
            self.check(self.cu.cuMemcpyDtoH_v2(C.cast(out, C.c_void_p), dst, nbytes), "cuMemcpyDtoH")
            return list(out), times
        finally:
            self._ctx(a)
            self.cu.cuMemFree_v2(src)
            self._ctx(b)
            self.cu.cuMemFree_v2(dst)

    def close(self):
        pass


def child_main(spec_path: str) -> int:
    """One step for one pair, both directions; writes JSON lines (``start``, ``helper``, ``direction``, ``result``)
    to the spec's ``events`` file. Exit 0 when it wrote a result (whatever the data said)."""
    spec = json.loads(Path(spec_path).read_text())
    ev = _Events(spec["events"])
    ev.emit(event="start", pid=os.getpid())
    i, j, step, n = spec["i"], spec["j"], spec["step"], spec["nbytes"] // 4
    try:
        faults = _Faults(parse_faults(os.environ.get(FAULT_VAR, "")), _pair_key(i, j), step, ev)
        backend: Any    # CpuBackend, TorchCudaBackend (copy) or DriverKernelBackend (kernel)
        if spec["device"] == "cpu":
            backend = CpuBackend(spec["count"])
        elif step == "copy":
            backend = TorchCudaBackend()
        else:
            backend = DriverKernelBackend()
        for a, b in ((i, j), (j, i)):
            ok, why = backend.can_access_peer(a, b)
            if not ok:
                ev.emit(event="result", status="unsupported", reason=why)
                return 0
        dirs = []
        modes = ("copy",) if step == "copy" else ("read", "write")
        for a, b in ((i, j),) if i == j else ((i, j), (j, i)):
            for mode in modes:
                data = pattern(n, a, b, step + mode)
                if mode == "copy":
                    got, times = backend.copy(a, b, data, faults, spec["repeats"])
                else:
                    got, times = backend.kernel(a, b, data, faults, spec["repeats"], mode)
                rec = {"from": a, "to": b, "mode": mode, "us": round(statistics.median(times), 2) if times else None,
                       **compare(got, data)}
                ev.emit(event="direction", **rec)
                dirs.append(rec)
        bad = [d for d in dirs if not d["ok"]]
        ev.emit(event="result", status="wrong-data" if bad else "ok", directions=dirs,
                reason="; ".join(f"{d['mode']} {d['from']}->{d['to']}: {d['mismatches']} of {n} int32 differ, first "
                                 f"at {d['first_bad']} (got {d['got']}, sent {d['expected']})" for d in bad[:2])
                + (f"; {len(bad) - 2} more direction(s) wrong" if len(bad) > 2 else ""))
    except Exception as exc:  # noqa: BLE001 - reported as the step's error
        ev.emit(event="result", status="error", reason=f"{type(exc).__name__}: {exc}")
    return 0


# --- the parent --------------------------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def run_step(step: str, i: int, j: int, *, device: str = "cuda", nbytes: int = DEFAULT_BYTES,
             timeout: float = DEFAULT_TIMEOUT, repeats: int = DEFAULT_REPEATS, count: int = 2,
             env: dict[str, str] | None = None) -> dict:
    """Run one step (``copy`` | ``kernel``) for the pair ``i``-``j`` in a child with ``timeout`` seconds. Returns
    ``{"step", "status", "reason", "seconds", "directions": [{"from", "to", "mode", "us", "ok", "mismatches",
    "first_bad", ...}], "pids": [child and its helpers], "killed_pids", "leftover_pids", "returncode"}``.
    ``leftover_pids``: the child's processes still alive after the step (checked by pid; must be empty)."""
    from .orchestrate import child_env
    tmp = Path(tempfile.mkdtemp(prefix="stackprobe-p2p-"))
    try:
        spec = {"i": i, "j": j, "step": step, "device": device, "nbytes": nbytes, "repeats": repeats,
                "count": count, "events": str(tmp / "events.jsonl")}
        (tmp / "spec.json").write_text(json.dumps(spec))
        t0 = time.monotonic()
        res = _run_child([sys.executable, "-m", "stackprobe.runtime.p2pcheck", "--child", str(tmp / "spec.json")],
                         child_env({}, base=env), timeout, tmp / "child.log")
        seconds = round(time.monotonic() - t0, 3)
        events = []
        try:
            for line in (tmp / "events.jsonl").read_text().splitlines():
                try:
                    events.append(json.loads(line))
                except ValueError:
                    pass
        except OSError:
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    pids = [e["pid"] for e in events if e.get("event") in ("start", "helper")]
    time.sleep(0.05)
    directions = [{k: v for k, v in e.items() if k != "event"} for e in events if e.get("event") == "direction"]
    out: dict = {"step": step, "seconds": seconds, "returncode": res["returncode"], "pids": pids,
           "killed_pids": res["killed_pids"], "leftover_pids": sorted(set(p for p in pids if _alive(p))
                                                                      | set(res["survivors"])),
           "directions": directions}
    result = next((e for e in events if e.get("event") == "result"), None)
    if res["timed_out"]:
        done = ", ".join(f"{d['mode']} {d['from']}->{d['to']}" for d in directions) or "none"
        out.update(status="hang", reason=f"no answer within {timeout:g} s (directions finished before it: {done}); "
                                         f"the child's process group was killed")
    elif result is not None:
        out.update(status=result["status"], reason=result.get("reason", ""))
    else:
        tail = " | ".join(res["tail"])
        out.update(status="error", reason=f"the child exited {res['returncode']} without a result"
                                          + (f": {tail}" if tail else ""))
    return out


def _run_child(cmd: list[str], env: dict[str, str], timeout: float, log: Path) -> dict:
    """Run ``cmd`` in its own session with output to ``log``, for at most ``timeout`` seconds, so that nothing it
    started survives and this process never blocks on it: the child dies with this process
    (``PR_SET_PDEATHSIG``), a guard (:mod:`stackprobe.runtime.guard`) ends its group if this process dies first,
    and at the end its process group (TERM, then KILL) and every process carrying the run's marker are killed;
    every wait is bounded (a process stuck in the driver that ignores SIGKILL is named in ``survivors``, not
    waited for). Returns ``{"returncode" (None on timeout), "timed_out", "killed_pids", "survivors", "tail"}``."""
    import signal
    import subprocess
    import uuid

    from .children import die_with_parent
    from .orchestrate import RUN_ID_VAR, _killpg, _start_guard, _stop_guard, processes_with_marker
    run_id = uuid.uuid4().hex
    env = dict(env, **{RUN_ID_VAR: run_id, "STACKPROBE_PARENT_PID": str(os.getpid())})
    with open(log, "wb") as lf:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=lf, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=die_with_parent(signal.SIGKILL))
    guard = _start_guard(proc.pid, run_id, {k: v for k, v in env.items() if k != RUN_ID_VAR})
    timed_out, killed = False, []
    try:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        if proc.poll() is None:
            _killpg(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + 2.0
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        _killpg(proc.pid, signal.SIGKILL)            # the group: helpers the child started, even after it exited
        deadline = time.monotonic() + 10.0
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(3):
            strays = [p for p in processes_with_marker(run_id) if p != os.getpid()]
            if not strays:
                break
            for pid in strays:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.2)
        _stop_guard(guard)
    survivors = ([proc.pid] if proc.poll() is None else []) + [p for p in processes_with_marker(run_id)
                                                                if p != os.getpid()]
    try:
        tail = [ln for ln in log.read_text(errors="replace").strip().splitlines() if ln.strip()][-3:]
    except OSError:
        tail = []
    return {"returncode": None if timed_out else proc.returncode, "timed_out": timed_out, "killed_pids": killed,
            "survivors": sorted(set(survivors)), "tail": tail}


def pairs(devices: list[int]) -> list[tuple[int, int]]:
    """Unordered pairs ``(i, j)``, i < j, of ``devices``."""
    d = sorted(set(devices))
    return [(d[a], d[b]) for a in range(len(d)) for b in range(a + 1, len(d))]


def check_pair(i: int, j: int, **kw) -> dict:
    """Both steps for one pair: ``{"pair": "i-j", "gpus": [i, j], "status", "reason", "transfer_us", "steps":
    {step: run_step record}}``. The kernel step is not started after a copy that hung or was unsupported."""
    steps = {"copy": run_step("copy", i, j, **kw)}
    c = steps["copy"]["status"]
    if c in ("hang", "unsupported"):
        steps["kernel"] = {"step": "kernel", "status": "not run", "reason": f"the peer copy was {c}",
                           "directions": [], "pids": [], "killed_pids": [], "leftover_pids": []}
    else:
        steps["kernel"] = run_step("kernel", i, j, **kw)
    worst = max((s for s in steps.values() if s["status"] in _SEVERITY), key=lambda s: _SEVERITY[s["status"]])
    copies = [d["us"] for d in steps["copy"]["directions"] if d.get("us") is not None]
    return {"pair": f"{i}-{j}", "gpus": [i, j], "status": worst["status"],
            "reason": "" if worst["status"] == "ok" else f"{worst['step']}: {worst['reason']}",
            "transfer_us": max(copies) if copies else None, "steps": steps}


def run_check(devices: list[int] | None = None, *, device: str = "cuda", nbytes: int = DEFAULT_BYTES,
              timeout: float = DEFAULT_TIMEOUT, repeats: int = DEFAULT_REPEATS, env: dict[str, str] | None = None,
              progress=None, self_test: bool = False) -> dict:
    """The check over every pair of ``devices`` (default: every visible GPU, ``nvidia-smi -L`` without a CUDA
    context here; on ``cpu`` two simulated devices). Returns ``{"kind": "p2p-check", "created", "device",
    "devices", "nbytes", "timeout_s", "repeats", "note", "pairs": [check_pair records], "summary": {status: n},
    "leftover_pids"}``. ``note`` is set (and ``pairs`` empty) when there is nothing to pair; then
    ``self_test`` runs both steps from the one device to itself (``"self_test"``: a :func:`check_pair` record; not
    a peer transfer: it shows that the check's own copy, PTX kernel and data check work on this host). Raises
    ``ValueError`` for a device other than cuda/cpu or a non-positive size, timeout or repeat count."""
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device {device!r}: write cuda or cpu")
    if nbytes < 4 or timeout <= 0 or repeats < 1:
        raise ValueError(f"size {nbytes} B, timeout {timeout} s, repeats {repeats}: the size must be at least 4 "
                         "bytes (one int32), the timeout positive and repeats at least 1")
    if devices is None:
        if device == "cuda":
            from .gpus import gpu_count
            devices = list(range(gpu_count()))
        else:
            devices = [0, 1]
    progress = progress or (lambda m: None)
    rep: dict = {"kind": "p2p-check", "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                 "device": device, "devices": sorted(set(devices)), "nbytes": nbytes, "timeout_s": timeout,
                 "repeats": repeats, "note": None, "pairs": []}
    if len(set(devices)) < 2:
        what = "GPU" if device == "cuda" else "device"
        rep["note"] = (f"nothing to pair: {len(set(devices))} {what}{'s' if len(set(devices)) != 1 else ''} visible"
                       f"{' (' + ', '.join(str(d) for d in sorted(set(devices))) + ')' if devices else ''}; a peer "
                       "transfer needs two (CUDA_VISIBLE_DEVICES, if set, limits what is visible)")
    for i, j in pairs(devices):
        progress(f"p2p check {i}-{j}: copy, then kernel read/write")
        rec = check_pair(i, j, device=device, nbytes=nbytes, timeout=timeout, repeats=repeats,
                         count=max(devices) + 1, env=env)
        progress(f"p2p check {i}-{j}: {rec['status']}" + (f" ({rec['reason']})" if rec["reason"] else ""))
        rep["pairs"].append(rec)
    if self_test and len(set(devices)) == 1:
        d = sorted(set(devices))[0]
        progress(f"p2p self-test on device {d} (copy and kernel read/write from the device to itself)")
        rep["self_test"] = check_pair(d, d, device=device, nbytes=nbytes, timeout=timeout, repeats=repeats,
                                      count=d + 1, env=env)
        progress(f"p2p self-test: {rep['self_test']['status']} {rep['self_test']['reason']}")
    rep["summary"] = {s: sum(1 for p in rep["pairs"] if p["status"] == s) for s in STATUSES}
    rep["leftover_pids"] = sorted({p for r in rep["pairs"] + ([rep["self_test"]] if "self_test" in rep else [])
                                   for s in r["steps"].values() for p in s["leftover_pids"]})
    return rep


def gate_reason(report: dict | None, devices: list[int]) -> str | None:
    """None when every pair of ``devices`` passed the check in ``report``; else why a peer-memory path must not
    start on them: the pairs that did not pass with their status and reason, or that the check did not cover
    them / did not run."""
    if len(set(devices)) < 2:
        return None
    if not report:
        return "not started: the P2P check did not run before it, so no pair of its GPUs is known to pass"
    by = {p["pair"]: p for p in report.get("pairs", [])}
    bad = []
    for i, j in pairs(devices):
        p = by.get(f"{i}-{j}")
        if p is None:
            bad.append(f"GPU {i}-{j} not checked")
        elif p["status"] != "ok":
            bad.append(f"GPU {i}-{j} {p['status']} ({p['reason']})")
    if not bad:
        return None
    return ("not started: the P2P check did not pass on " + "; ".join(bad) + ". A peer-memory path on these GPUs "
            "would meet the same failure (a hang or wrong data); check the IOMMU mode (iommu=pt), ACS on the PCIe "
            "switches and NCCL_P2P_DISABLE before enabling it")


def peer_memory_paths() -> frozenset[str]:
    """Names of the rows that map a peer GPU's memory and so start only on pairs that passed: every runtime row of a
    probe module (its ``RUNTIME``) whose backend's path record says it maps peer memory
    (:func:`stackprobe.paths.maps_peer_memory`: custom allreduce, PCIe IPC, FlashInfer fusion, torch symmetric
    memory, MSCCL++ ...), plus the engine communicators of :data:`stackprobe.runtime.p2p.NEEDS_P2P`. NCCL's own rows
    are not among them: NCCL picks its transport itself."""
    from .. import paths
    from ..probes import probes
    from . import p2p
    names = set(p2p.NEEDS_P2P)
    for mod in probes():
        for backend in getattr(mod, "BACKENDS", ()):
            if not paths.maps_peer_memory(backend):
                continue
            names.add(backend)
            for rows in (getattr(mod, "RUNTIME", None) or {}).values():
                names.update(rows)
    return frozenset(names)


def summary_line(report: dict | None, device: str | None = "cuda") -> str:
    """One line for the runtime report: the P2P check's per-pair outcome, or why it did not run."""
    if report is None:
        return ("P2P check: not run (CPU run: no GPU pairs)" if device != "cuda" else
                "P2P check: not run (fewer than two GPUs in the largest group); peer-memory rows not started")
    if report.get("note"):
        return f"P2P check: {report['note']}"
    per = ", ".join(f"{p['pair']} {p['status']}" + (f" ({p['transfer_us']:.1f} us)" if p.get("transfer_us") else "")
                    for p in report["pairs"])
    return (f"P2P check before any peer-memory path ({report['nbytes']} B peer copy and kernel-side read/write per "
            f"pair, each in a child with a {report['timeout_s']:g} s timeout): {per}")


def markdown(report: dict) -> str:
    """A short Markdown page of one :func:`run_check` report."""
    from .. import mdtable
    lines = ["# P2P check (peer copy and kernel-side peer read/write, each in a child with a timeout)", "",
             f"- device {report['device']}, devices {report['devices']}, {report['nbytes']} B per transfer, "
             f"timeout {report['timeout_s']:g} s per step, {report['repeats']} timed repeats; created "
             f"{report['created']}"]
    if report.get("note"):
        lines += [f"- {report['note']}"]
    if report["pairs"]:
        lines += [f"- summary: {', '.join(f'{k} {v}' for k, v in report['summary'].items() if v)}", ""]
        lines += mdtable.table(("pair", "status", "copy", "kernel read/write", "small transfer (us)", "why"),
                               ((p["pair"], p["status"], p["steps"]["copy"]["status"], p["steps"]["kernel"]["status"],
                                 "-" if p["transfer_us"] is None else f"{p['transfer_us']:.1f}", p["reason"] or "-")
                                for p in report["pairs"]))
    st = report.get("self_test")
    if st:
        us = "-" if st["transfer_us"] is None else f"{st['transfer_us']:.1f} us"
        lines += [f"- self-test, device {st['gpus'][0]} to itself (not a peer transfer; shows the check's copy, "
                  f"kernel and data check work here): **{st['status']}** (copy {st['steps']['copy']['status']}, "
                  f"kernel read/write {st['steps']['kernel']['status']}, {us})"
                  + (f": {st['reason']}" if st["reason"] else "")]
    if report.get("leftover_pids"):
        lines += ["", f"**Processes still alive after the check: {report['leftover_pids']}**"]
    return "\n".join(lines) + "\n"


def write(report: dict, out_dir: str | Path) -> dict[str, Path]:
    """``p2p-check.json`` and ``p2p-check.md`` under ``out_dir``."""
    from ..atomic import write_atomic
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    paths = {"json": d / "p2p-check.json", "md": d / "p2p-check.md"}
    write_atomic(paths["json"], json.dumps(report, indent=2) + "\n")
    write_atomic(paths["md"], markdown(report))
    return paths


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        from .children import set_parent_death_signal
        import signal
        set_parent_death_signal(signal.SIGKILL)
        raise SystemExit(child_main(sys.argv[2]))
    raise SystemExit("usage: python -m stackprobe.runtime p2p [--device cuda|cpu] [--out DIR] "
                     "(this module's own entry is the check's child)")
