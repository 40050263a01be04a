"""The runtime tier through the engine: SGLang's own communicators, built in a plain process group.

Where SGLang is importable (a runtime image, a GPU host), every rank of one process group builds the
communicators SGLang's ``GroupCoordinator`` builds (``srt/distributed/parallel_state.py``), with SGLang's own
classes and gate functions, and records which come up disabled and why: their own flags (``disabled``,
``available``, ``full_nvlink``...) and the log lines SGLang wrote while building them.

**Timing.** After every communicator is built, the ranks vote (SGLang's rule: a communicator disabled on any rank
is off for the group) and every communicator enabled on all ranks is timed in ONE
:meth:`stackprobe.runtime.bench.Harness.sweep` with SGLang's pynccl as the baseline (``BASELINE``): paired rounds
with rotating order, an empty-graph floor, poisoned outputs and a different input per captured call (see
:mod:`stackprobe.runtime.bench`). The parent merges the ranks and builds each timed row with the runtime
suite's own functions (:func:`stackprobe.runtime.suite.rows_from_group`: per-round mean over ranks, work = time -
floor, bootstrap 95% interval of the ratio to the baseline) and decides it with
:func:`stackprobe.runtime.verdicts.decide` (``baseline`` / ``faster`` / ``parity`` / ``slower`` /
``inconclusive``; ``blocked (wrong-result)``; ``error`` "no GPU work captured" at the floor). Rows that came up
disabled keep their own reasons (:func:`classify`).

``--reference`` adds the suite's own ``nccl-default`` (ncclAllReduce through ctypes, NCCL_ALGO/NCCL_PROTO unset)
to the same sweep, as a row of kind ``reference`` (not an SGLang communicator): on a host where pynccl is the
only enabled communicator it is the one row whose ratio and interval are measured.

Communicators (SGLang 0.5.23 names; FACTS "SGLang 0.5.23's own gates"):

* ``sglang-pynccl``: ``PyNcclCommunicator`` on the gloo group; SGLang enables it around graph capture
  (``change_state(enable=True)``), so it is timed that way;
* ``sglang-custom-allreduce``: ``dispatch_custom_allreduce`` picks the class (v2 needs full NVLink), then
  ``CustomAllreduce(group, device)``; timed outside its ``capture()`` context (its unregistered path: the input
  is copied into the pre-shared IPC buffer, which CUDA graphs capture as well), because SGLang registers graph
  buffers only when that context exits, after capture, and the harness replays each graph right after capturing
  it;
* ``sglang-torch-symm-mem``: ``TorchSymmMemCommunicator`` (size table, then ``multicast_ptr == 0``);
* ``sglang-mscclpp``: ``PyMscclppCommunicator`` (imports the standalone ``mscclpp``);
* ``sglang-pcie-ipc``: ``eligible_group`` (opt-in ``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE``) as the server would
  see it, then with the opt-in set, ``PcieIpcCommunicator``;
* ``sglang-flashinfer-fusion-workspace``: ``_resolve_backend("auto")`` and the workspace preflight
  ``_preflight_check_workspace_memory`` (multicast granularity, cuMemCreate probe, vote), plus the driver's
  ``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED``.

SGLang's server start-up publishes its config (``runtime_context.publish``), which needs the model's Hugging
Face config (transformers). Without a model the runner answers the config leaves a communicator reads with
``ServerArgs`` defaults and records every leaf it answered (``config_leaves_from_defaults``).

Run: ``python -m stackprobe.runtime.engine --world-size 2 --out DIR`` (JSON + Markdown, written atomically), or
:func:`run_engine` from Python. Each row becomes a runtime verdict of scope ``engine`` whose ``host`` says where
it was measured (case C20). ``--from-json`` re-derives the verdicts of a saved ``engine.json`` without GPUs.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path

from .. import mdtable
from ..atomic import write_atomic
from ..paths import PCIE_IPC
from .bench import Harness, Op, short_error
from .probes import KIND_BASELINE, KIND_BACKEND, Probe, _bytes_to_numel
from .verdicts import DEFAULT_TOLERANCE

COMMUNICATORS = ("sglang-pynccl", "sglang-custom-allreduce", "sglang-torch-symm-mem", "sglang-mscclpp",
                 "sglang-pcie-ipc", "sglang-flashinfer-fusion-workspace")
STATIC_BACKEND = {"sglang-pynccl": "nccl-ring", "sglang-custom-allreduce": "sglang-custom-allreduce",
                  "sglang-torch-symm-mem": "torch-symm-mem", "sglang-mscclpp": "mscclpp",
                  "sglang-pcie-ipc": PCIE_IPC,
                  "sglang-flashinfer-fusion-workspace": "flashinfer-allreduce-fusion"}
PCIE_OPT_IN = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"
BASELINE = "sglang-pynccl"          # the engine's own NCCL path: every enabled communicator's ratio is to it
REFERENCE = "nccl-default"          # the suite's baseline, timed beside it with --reference
KIND_REFERENCE = "reference"


class _LogCapture(logging.Handler):
    """Collects what SGLang's loggers write while one communicator is built."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        try:
            self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}"[:400])
        except Exception:  # noqa: BLE001
            pass


@contextlib.contextmanager
def captured_logs(name: str = "sglang"):
    """What the ``name`` logger (SGLang's, or ``vllm``) writes while inside, at DEBUG."""
    h = _LogCapture()
    root = logging.getLogger(name)
    old = root.level
    root.addHandler(h)
    root.setLevel(logging.DEBUG)
    try:
        yield h.lines
    finally:
        root.removeHandler(h)
        root.setLevel(old)


class _DefaultLeaves:
    """Stands in for SGLang's published config bag (``get_exec()``): a leaf ``exec.comm.X`` is answered
    with ``ServerArgs().X`` (its default) and recorded."""

    def __init__(self, server_args, read: list, path=()):
        object.__setattr__(self, "_sa", server_args)
        object.__setattr__(self, "_read", read)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name):
        if hasattr(self._sa, name):
            value = getattr(self._sa, name)
            self._read.append(f"{'.'.join(self._path + (name,))}={value!r}")
            return value
        return _DefaultLeaves(self._sa, self._read, self._path + (name,))


def _install_config_defaults(world_size: int) -> list:
    """Where SGLang's config is not published, answer ``get_exec()`` reads with ServerArgs defaults (tp_size =
    world size) in every communicator module. Returns the list the answered leaves are appended to."""
    import importlib

    from sglang.srt import runtime_context as rc
    try:
        rc.get_exec()
        return []        # published by a real SGLang start-up: nothing to stand in for
    except Exception:  # noqa: BLE001
        pass
    from sglang.srt.server_args import ServerArgs
    sa = ServerArgs(model_path="unused-by-the-communicators", tp_size=world_size)
    read: list = []
    bag = _DefaultLeaves(sa, read, ("exec",))
    getter = lambda: bag  # noqa: E731
    rc.get_exec = getter
    for mod in ("sglang.srt.distributed.device_communicators.torch_symm_mem",
                "sglang.srt.distributed.device_communicators.pymscclpp",
                "sglang.srt.distributed.device_communicators.pcie_ipc_ar",
                "sglang.srt.layers.flashinfer_comm_fusion"):
        try:
            m = importlib.import_module(mod)
            if hasattr(m, "get_exec"):
                m.get_exec = getter
        except Exception:  # noqa: BLE001 - the communicator's own build reports its import failure
            pass
    return read


def _state(obj, names=("disabled", "available", "full_nvlink", "world_size", "max_size")) -> dict:
    out = {}
    for n in names:
        if hasattr(obj, n):
            v = getattr(obj, n)
            out[n] = v if isinstance(v, (bool, int, float, str, type(None))) else str(v)
    return out


def _row(name: str, label: str) -> dict:
    """One communicator's record on one rank (the harness's measurements live in the rank's shared ``sweep``)."""
    return {"backend": name, "label": label, "kind": KIND_BASELINE if name == BASELINE else KIND_BACKEND,
            "info": {"constructed": False, "enabled": False, "why": "", "state": {}, "log": []}, "checks": {},
            "failure": None}


def _why_from_log(lines: list[str]) -> str:
    warn = [ln for ln in lines if ln.startswith(("WARNING", "ERROR"))]
    return (warn or lines or [""])[-1]


class SglangEngineProbe(Probe):
    """All of SGLang's communicators in one process group (see the module docstring)."""

    name = "sglang-engine"
    label = "SGLang's own communicators, built as its GroupCoordinator builds them"
    requires = ("torch", "sglang")
    backends = COMMUNICATORS
    min_world_size = 2

    reference = False   # also time the suite's nccl-default beside pynccl (spec "reference": true)

    def setup(self, ctx) -> None:
        """Process groups and config stand-ins, as SGLang's GroupCoordinator has them: ``cpu_group`` (gloo,
        the world group) and ``device_group`` (NCCL)."""
        import torch
        import torch.distributed as dist

        self.torch = torch
        self.cpu_group = dist.group.WORLD          # gloo, as SGLang's cpu_group
        self.device = torch.device(ctx.device)
        self.dtype = getattr(torch, ctx.config.dtype)
        self.device_group = dist.new_group(backend="nccl")
        self.defaults_read = _install_config_defaults(ctx.world_size)

    def builders(self) -> list:
        """``[(row name, builder)]`` in SGLang's order; each builder returns its row and may register a timing
        maker with :meth:`_enable_timing`."""
        return list(zip(COMMUNICATORS, (self._pynccl, self._custom_ar, self._symm_mem, self._mscclpp,
                                        self._pcie_ipc, self._fusion)))

    def run(self, ctx) -> dict:
        """Build every communicator, then time the enabled ones in one sweep. Returns the rank's result:
        ``{"baseline": BASELINE, "sweep": Harness.sweep(...), "backends": [row, ...]}``."""
        self.ctx = ctx
        self.reference = bool(ctx.spec.get("reference", self.reference))
        self.defaults_read = []
        self.timing: dict[str, tuple] = {}     # name -> (maker, context manager factory or None)
        self.setup(ctx)
        rows = []
        for name, fn in self.builders():
            try:
                rows.append(fn())
            except Exception as exc:  # noqa: BLE001 - one communicator's failure is its row, not the run's
                r = _row(name, "")
                r["failure"] = {"kind": "error", "message": short_error(exc)}
                r["info"]["traceback"] = traceback.format_exc()[-1500:]
                self.timing.pop(r["backend"], None)
                rows.append(r)
            ctx.barrier()
        for r in rows:
            r["info"]["config_leaves_from_defaults"] = sorted(set(self.defaults_read))
        sweep, closers = [], []
        try:
            if self.reference:
                rows.append(self._reference(closers))
            sweep = self._time_enabled(rows)
        finally:
            for close in closers:
                with contextlib.suppress(Exception):
                    close()
        return {"baseline": BASELINE, "sweep": sweep, "backends": rows}

    # --- timing ------------------------------------------------------------------------------------
    def _enable_timing(self, name: str, make_op, context=None) -> None:
        """Register ``make_op`` (bytes -> :class:`~stackprobe.runtime.bench.Op`) for the one sweep; ``context``:
        a factory of the context manager the communicator is timed inside (pynccl's ``change_state``)."""
        self.timing[name] = (make_op, context)

    def _vote(self, rows: list[dict]) -> list[str]:
        """Names enabled on every rank (SGLang's rule: one rank's disable turns it off for the group), in row
        order with the baseline first. Every rank gets the same list, so every rank enters the same collectives."""
        import torch.distributed as dist
        mine = sorted(n for n in self.timing
                      if next((r for r in rows if r["backend"] == n), {}).get("info", {}).get("enabled")
                      or n == REFERENCE)
        everyone = [None] * self.ctx.world_size
        dist.all_gather_object(everyone, mine, group=self.cpu_group)
        common = set(mine).intersection(*map(set, everyone))
        order = [r["backend"] for r in rows]
        return sorted(common, key=lambda n: (n != BASELINE, order.index(n) if n in order else len(order)))

    def _time_enabled(self, rows: list[dict]) -> list[dict]:
        names = self._vote(rows)
        by_name = {r["backend"]: r for r in rows}
        for r in rows:
            r["info"]["timed"] = r["backend"] in names
        if not names:
            return []
        makers = {n: self.timing[n][0] for n in names}
        try:
            with contextlib.ExitStack() as stack:
                for n in names:
                    if self.timing[n][1] is not None:
                        stack.enter_context(self.timing[n][1]())
                return Harness(self.ctx, self.ctx.config).sweep(makers, self.name)
        except Exception as exc:  # noqa: BLE001 - the sweep itself could not run: every timed row says so
            for n in names:
                by_name[n]["failure"] = {"kind": "error", "message": f"timing failed: {short_error(exc)}"}
            return []

    def _reference(self, closers: list) -> dict:
        from .probes import _nccl_maker, nccl_comm
        row = _row(REFERENCE, "the suite's nccl-default (ctypes ncclAllReduce, NCCL_ALGO/NCCL_PROTO unset): "
                              "a reference beside SGLang's pynccl, not an SGLang communicator")
        row["kind"] = KIND_REFERENCE
        comm, info = nccl_comm(self.ctx, "engine-reference")
        closers.append(comm.destroy)
        row["info"].update(info, constructed=True, enabled=True, why="")
        self._enable_timing(REFERENCE, _nccl_maker(self.ctx, comm))
        return row

    def _buffers(self, nbytes: int):
        n = _bytes_to_numel(nbytes, self.dtype)
        return self.torch.empty(n, dtype=self.dtype, device=self.device)

    # --- the communicators -------------------------------------------------------------------------
    def _pynccl(self) -> dict:
        from sglang.srt.distributed.device_communicators.pynccl import PyNcclCommunicator

        row = _row("sglang-pynccl", "PyNcclCommunicator (SGLang's NCCL, enabled around graph capture)")
        with captured_logs() as log:
            comm = PyNcclCommunicator(group=self.cpu_group, device=self.device)
        info = row["info"]
        info.update(constructed=True, state=_state(comm), log=log[-20:])
        info["state_as_built"] = dict(info["state"])
        info["enabled"] = bool(getattr(comm, "available", False))
        info["why"] = ("built disabled: SGLang turns it on with change_state(enable=True) around CUDA graph capture"
                       if comm.disabled and info["enabled"] else _why_from_log(log) or "")
        self.pynccl = comm
        if info["enabled"]:
            def make_op(nbytes):
                buf = self._buffers(nbytes)
                return Op(buf, buf, lambda: comm.all_reduce(buf), in_place=True)
            self._enable_timing(row["backend"], make_op, lambda: comm.change_state(enable=True))
        return row

    def _build(self, info: dict, make) -> object | None:
        """Build one SGLang communicator with ``make()`` while capturing SGLang's log; record in ``info`` whether
        it was constructed, its state, the exception (SGLang's GroupCoordinator logs it and falls back to NCCL),
        the log lines, whether it came up enabled (``not comm.disabled``) and why not. Returns it when enabled."""
        with captured_logs() as log:
            try:
                comm = make()
                info.update(constructed=True, state=_state(comm))
            except Exception as exc:  # noqa: BLE001 - one communicator's failure is its row
                info["exception"] = short_error(exc)
                comm = None
        info["log"] = log[-20:]
        info["enabled"] = comm is not None and not getattr(comm, "disabled", True)
        info["why"] = "" if info["enabled"] else (info.get("exception") or _why_from_log(log))
        return comm if info["enabled"] else None

    def _p2p_skip(self, row: dict) -> bool:
        """P2P first (:mod:`stackprobe.runtime.p2p`): a peer-memory path is not built where P2P is off or
        unknown-and-risky between the group's GPUs; the row then says so (``info["p2p_skip"]``)."""
        from . import p2p
        report = self.ctx.spec.get("p2p") or p2p.host_report()
        why = p2p.skip_reason(report, list(range(self.ctx.world_size)))
        if why:
            row["info"].update(why=why, p2p_skip=True, p2p={"iommu": report["iommu"]["mode"],
                                                           "risks": p2p.risks(report)})
        return bool(why)

    def _custom_ar(self) -> dict:
        row = _row("sglang-custom-allreduce", "CustomAllreduce as dispatch_custom_allreduce picks it")
        if self._p2p_skip(row):
            return row
        from sglang.srt.distributed.device_communicators import custom_all_reduce as ca_mod

        info = row["info"]
        def make():
            cls = ca_mod.dispatch_custom_allreduce(group=self.cpu_group, device=self.device)
            info["class"] = cls.__name__
            return cls(group=self.cpu_group, device=self.device)
        comm = self._build(info, make)
        if info["enabled"]:
            def make_op(nbytes):
                buf = self._buffers(nbytes)
                out = {"t": None}

                def run():
                    out["t"] = comm.custom_all_reduce(buf)
                return Op(buf, None, run, out_fn=lambda: out["t"])
            info["timed_as"] = ("custom_all_reduce outside capture(): the unregistered path (input copied into the "
                                "pre-shared IPC buffer); SGLang's capture() registers graph buffers when it exits")
            self._enable_timing(row["backend"], make_op)
        return row

    def _symm_mem(self) -> dict:
        from sglang.srt.distributed.device_communicators.torch_symm_mem import TorchSymmMemCommunicator

        row = _row("sglang-torch-symm-mem", "TorchSymmMemCommunicator")
        info = row["info"]
        info["multicast_env"] = {k: os.environ.get(k) for k in ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "NCCL_NVLS_ENABLE")}
        comm = self._build(info, lambda: TorchSymmMemCommunicator(group=self.cpu_group, device=self.device))
        if info["enabled"]:
            def make_op(nbytes):
                buf = self._buffers(nbytes)
                out = self.torch.empty_like(buf)
                return Op(buf, out, lambda: comm.all_reduce(buf, out=out))
            self._enable_timing(row["backend"], make_op)
        return row

    def _mscclpp(self) -> dict:
        from sglang.srt.distributed.device_communicators.pymscclpp import PyMscclppCommunicator

        row = _row("sglang-mscclpp", "PyMscclppCommunicator")
        info = row["info"]
        comm = self._build(info, lambda: PyMscclppCommunicator(group=self.cpu_group, device=self.device))
        if info["enabled"]:
            def make_op(nbytes):
                buf = self._buffers(nbytes)
                out = {"t": None}

                def run():
                    out["t"] = comm.all_reduce(buf)
                return Op(buf, None, run, out_fn=lambda: out["t"] if out["t"] is not None else buf)
            self._enable_timing(row["backend"], make_op)
        return row

    def _pcie_ipc(self) -> dict:
        row = _row("sglang-pcie-ipc", "PcieIpcCommunicator (FlashInfer PCIe IPC allreduce)")
        if self._p2p_skip(row):
            return row
        from sglang.srt.distributed.device_communicators import pcie_ipc_ar

        info = row["info"]
        ws = self.ctx.world_size
        as_served = pcie_ipc_ar.eligible_group(group_name="tp", world_size=ws, deterministic=False)
        info["eligible_group_as_served"] = {"value": bool(as_served), PCIE_OPT_IN: os.environ.get(PCIE_OPT_IN)}
        old = os.environ.get(PCIE_OPT_IN)
        os.environ[PCIE_OPT_IN] = "1"
        try:
            info["eligible_group_with_opt_in"] = bool(pcie_ipc_ar.eligible_group(group_name="tp", world_size=ws,
                                                                                 deterministic=False))
            comm = None
            with captured_logs() as log:
                try:
                    comm = pcie_ipc_ar.PcieIpcCommunicator(group=self.device_group, device=self.device,
                                                           cpu_group=self.cpu_group)
                    info.update(constructed=True, state=_state(comm))
                except Exception as exc:  # noqa: BLE001 - SGLang logs "Setup FlashInfer PCIe-IPC allreduce failed"
                    info["exception"] = short_error(exc)
            info["log"] = log[-20:]
        finally:
            if old is None:
                os.environ.pop(PCIE_OPT_IN, None)
            else:
                os.environ[PCIE_OPT_IN] = old
        info["enabled"] = bool(as_served) and comm is not None and not getattr(comm, "disabled", False)
        why = []
        if not as_served:
            why.append(f"not built as served: {PCIE_OPT_IN} is off (default False)")
        if comm is None:
            why.append(f"with the opt-in set the build failed: {info.get('exception') or _why_from_log(info['log'])}")
        elif getattr(comm, "disabled", False):
            why.append(f"with the opt-in set it came up disabled: {_why_from_log(info['log'])}")
        info["why"] = "; ".join(why)
        return row

    def _fusion(self) -> dict:
        import torch

        from sglang.srt.layers import flashinfer_comm_fusion as fus

        row = _row("sglang-flashinfer-fusion-workspace", "FlashInfer allreduce fusion: SGLang's backend check and "
                                                         "workspace preflight")
        info = row["info"]
        why = []
        try:
            info["resolve_backend_auto"] = fus._resolve_backend("auto", False)
        except Exception as exc:  # noqa: BLE001 - a ValueError here is SGLang refusing the platform
            info["resolve_backend_auto"] = f"raised {short_error(exc)}"
            why.append(f"_resolve_backend refused: {short_error(exc)}")
        info["flashinfer_comm_available"] = fus._flashinfer_comm is not None
        info["multicast_supported"] = _multicast_attribute(torch.cuda.current_device())
        with captured_logs() as log:
            try:
                ok = fus._preflight_check_workspace_memory(world_size=self.ctx.world_size, max_token_num=2048,
                                                           hidden_dim=7168, dtype=torch.bfloat16,
                                                           cpu_group=self.cpu_group)
            except Exception as exc:  # noqa: BLE001
                ok = None
                info["exception"] = short_error(exc)
        info["preflight"] = ok
        info["log"] = log[-20:]
        info["constructed"] = ok is not None
        if ok is False:
            why.append(f"workspace preflight skipped fusion: {_why_from_log(log)}")
        if not info["flashinfer_comm_available"]:
            why.append("flashinfer.comm allreduce_fusion API not importable here (SGLang returns before building "
                       "the workspace)")
        # the multicast query alone, with SGLang's own size function and a POSIX-FD allocation (non-fabric branch)
        info["multicast_granularity_query"] = _granularity(fus, self.ctx.world_size)
        info["enabled"] = bool(ok) and info["flashinfer_comm_available"] and not str(
            info["resolve_backend_auto"]).startswith("raised")
        info["why"] = "; ".join(why)
        return row


def _driver():
    try:
        from sglang.srt.utils import get_cuda_driver_bindings
        return get_cuda_driver_bindings()
    except Exception:  # noqa: BLE001
        from cuda.bindings import driver
        return driver


def _multicast_attribute(device: int):
    """The driver's ``CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`` for ``device`` (1 on NVSwitch systems)."""
    try:
        drv = _driver()
        err, val = drv.cuDeviceGetAttribute(drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED, device)
        return {"value": int(val), "error": None if err == drv.CUresult.CUDA_SUCCESS else str(err)}
    except Exception as exc:  # noqa: BLE001
        return {"value": None, "error": short_error(exc)}


def _granularity(fus, world_size: int):
    """SGLang's ``_flashinfer_trtllm_workspace_allocation_sizes`` (which calls cuMulticastGetGranularity) with a
    POSIX-file-descriptor allocation, as SGLang uses without fabric handles; a query, nothing allocated."""
    import torch
    try:
        drv = _driver()
        prop = drv.CUmemAllocationProp()
        prop.requestedHandleTypes = drv.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        prop.type = drv.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location = drv.CUmemLocation()
        prop.location.type = drv.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = torch.cuda.current_device()
        sizes = fus._flashinfer_trtllm_workspace_allocation_sizes(drv, prop, world_size, 2048, 7168, torch.bfloat16)
        return {"ok": True, "allocation_sizes": sizes}
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "error": short_error(exc)}


# --- verdicts ------------------------------------------------------------------------------------------
def classify(why: str) -> str:
    """The gate kind of a communicator's own reason for coming up disabled (first match wins: a default-off
    opt-in is a setting even when what follows it mentions PCIe)."""
    from ..verdict import GATE_NEEDS_RUNTIME, GATE_NOT_INSTALLED, GATE_PYTHON, GATE_SETTING, GATE_TOPOLOGY
    low = why.lower()
    if "is off (default" in low or "opt-in" in low:
        return GATE_SETTING
    if "no module named" in low or "not importable" in low or "failed to import" in low:
        return GATE_NOT_INSTALLED
    if "multicast" in low or "nvlink" in low or "pcie-only" in low:
        return GATE_TOPOLOGY
    if "not supported" in low or "refused" in low or "requires" in low:
        return GATE_PYTHON
    return GATE_NEEDS_RUNTIME


class EngineRecordError(ValueError):
    """Rank records this runner cannot read (e.g. an engine.json written by the harness before paired rounds)."""


def _timed_rows(ranks: list[dict]) -> dict[str, dict]:
    """The runtime suite's rows (:func:`stackprobe.runtime.suite.rows_from_group`: ranks merged round by round,
    work = time - floor, bootstrap 95% interval of the ratio to ``sglang-pynccl``) by name."""
    from types import SimpleNamespace

    from .suite import rows_from_group
    if not ranks or any("sweep" not in rk or "baseline" not in rk for rk in ranks):
        raise EngineRecordError(
            "these rank records have no shared paired sweep ('baseline' and 'sweep' per rank): they were written "
            "by the engine runner before it timed every communicator in one Harness.sweep with paired rounds, "
            "and hold per-communicator medians that no interval can be computed from. Re-run "
            "'python -m stackprobe.runtime.engine' on the GPU host to get records this version can read.")
    run = SimpleNamespace(status="ok", seconds=None, leftover_pids=[], env={}, ranks=ranks,
                          world_size=len(ranks), tail=[])
    names = [b["backend"] for b in ranks[0]["backends"]]
    return {r["backend"]: r for r in rows_from_group(run, names, {}, ranks[0]["baseline"], {})}


def engine_verdicts(ranks: list[dict], host: dict, tolerance: float = DEFAULT_TOLERANCE) -> list:
    """Runtime verdicts (scope ``engine``) from the ranks' records (``{"baseline", "sweep", "backends"}`` each):

    * a communicator that came up disabled (on any rank: SGLang votes) is ``blocked`` with its own reason
      (rank 0's, else the first rank's that has one) and the gate :func:`classify` reads from it;
    * one whose build raised is ``error`` (gate ``crash``);
    * one enabled but without a timing op here (the PCIe IPC communicator, the fusion workspace preflight) is
      ``skipped``;
    * one enabled and timed is decided by :func:`stackprobe.runtime.verdicts.decide` with ``sglang-pynccl`` as
      the baseline and ``tolerance`` (fraction; 0.05 = 5 %): ``baseline``, ``faster`` / ``parity`` / ``slower``
      / ``inconclusive`` from the 95% interval of the paired ratio, ``blocked`` (``wrong-result``) on a wrong
      checked result, ``error`` at or below the empty-graph floor ("no GPU work captured").

    Raises :class:`EngineRecordError` for records without the shared paired sweep."""
    from ..verdict import (BLOCKED, ERROR, GATE_CRASH, GATE_NEEDS_RUNTIME, GATE_TOPOLOGY, LIFT_UNKNOWN, SCOPE_ENGINE,
                           SCOPE_LIBRARY, SKIPPED, Verdict)
    from .verdicts import decide

    timed = _timed_rows(ranks)
    baseline = ranks[0]["baseline"]
    out = []
    for name, meta in ((b["backend"], b) for b in ranks[0]["backends"]):
        infos = [next((b for b in rk["backends"] if b["backend"] == name), {}).get("info", {}) for rk in ranks]
        info = meta.get("info", {})
        row = timed.get(name, {})
        enabled = all(i.get("enabled") for i in infos)
        failure = row.get("failure") or meta.get("failure")
        if enabled and not failure and all(i.get("timed") for i in infos):
            v = decide(dict(row, world_size=len(ranks)), tolerance, None, baseline, dict(host))
            v.scope, v.host = SCOPE_ENGINE, dict(host)
            if row.get("kind") == KIND_REFERENCE:   # the suite's own NCCL call: never SGLang's answer
                v.scope = SCOPE_LIBRARY
                v.warnings.append("reference row: the suite's own NCCL call, not an SGLang communicator")
        else:
            v = Verdict(name, BLOCKED, tier="runtime", scope=SCOPE_ENGINE, host=dict(host),
                        measurements={"world_size": host.get("world_size")})
            if failure:
                v.status, v.gate, v.cause = ERROR, GATE_CRASH, failure["message"]
            elif any(i.get("p2p_skip") for i in infos):
                why = next(i["why"] for i in infos if i.get("p2p_skip"))
                v.status, v.gate, v.lift, v.cause = SKIPPED, GATE_TOPOLOGY, LIFT_UNKNOWN, why
            elif not enabled:
                why = info.get("why") or next((i.get("why") for i in infos if i.get("why")), "") or "disabled"
                v.gate = classify(why)
                v.cause = f"SGLang built it disabled here: {why}"
            else:
                v.status, v.gate, v.lift = SKIPPED, GATE_NEEDS_RUNTIME, LIFT_UNKNOWN
                v.cause = "enabled by SGLang here; this runner has no timing op for it"
        v.add("as built (rank 0)", {k: info.get(k) for k in ("constructed", "enabled", "timed", "state", "class",
                                                             "preflight", "resolve_backend_auto",
                                                             "multicast_supported", "eligible_group_as_served",
                                                             "eligible_group_with_opt_in",
                                                             "multicast_granularity_query", "exception", "timed_as",
                                                             "nccl_version") if k in info},
              "SGLang's own classes, this host")
        v.add("SGLang log while building (rank 0)", info.get("log", [])[-6:], "logging 'sglang'")
        if info.get("config_leaves_from_defaults"):
            v.add("config leaves answered from ServerArgs defaults", info["config_leaves_from_defaults"], "no model: not published")
        out.append(v)
    return out


def run_engine(world_size: int = 2, *, out_dir: str | Path | None = None, sizes=None, timeout: float = 300.0,
               progress=print, tolerance: float = DEFAULT_TOLERANCE, rounds: int | None = None,
               reference: bool = False) -> dict:
    """Run :class:`SglangEngineProbe` at ``world_size`` and return ``{"host", "config", "tolerance", "run",
    "verdicts"}``; with ``out_dir``, also write ``engine.json`` and ``engine.md`` there (atomically).

    ``sizes``: message sizes in bytes, decode size first (default: the Kimi-K2 workload's); ``rounds``: paired
    rounds at the decode size (default :class:`~stackprobe.runtime.bench.BenchConfig`'s 30); ``tolerance``:
    the ratio's tolerance (fraction, default :data:`stackprobe.runtime.verdicts.DEFAULT_TOLERANCE`);
    ``reference``: also time the suite's ``nccl-default`` beside pynccl. Raises ``SystemExit`` with the reason
    when the probe cannot run here (no SGLang, too few GPUs)."""
    from dataclasses import asdict

    from .bench import BenchConfig
    from .orchestrate import run_probe
    from .workload import default_sizes, preset

    if not 0 < tolerance < 1:
        raise SystemExit(f"stackprobe engine runner: --tolerance {tolerance} is not a fraction in (0, 1); "
                         "use e.g. 0.05 for 5 %")
    wl = preset("kimi-k2")
    config = BenchConfig(sizes=list(sizes or default_sizes(wl)))
    if rounds is not None:
        if rounds < 2:
            raise SystemExit(f"stackprobe engine runner: --rounds {rounds}: an interval needs at least 2 rounds")
        config.rounds = rounds
    probe = SglangEngineProbe()
    skip = probe.skip_reason(world_size, _gpu_count())
    if skip:
        raise SystemExit(f"stackprobe engine runner: {skip}")
    from . import p2p
    topo = p2p.host_report()          # P2P first: read before any rank starts, handed to every rank
    run = run_probe("stackprobe.runtime.engine:SglangEngineProbe", world_size, asdict(config), timeout=timeout,
                    name=probe.name, progress=progress, extra={"reference": reference, "p2p": topo})
    host = _host(run, world_size)
    verdicts = engine_verdicts(run.ranks, host, tolerance) if run.status == "ok" else []
    result = {"host": host, "p2p": topo, "config": config.to_json(), "tolerance": tolerance, "run": run.to_json(),
              "verdicts": [v.to_json() for v in verdicts]}
    if out_dir:
        write_result(result, out_dir)
    return result


def write_result(result: dict, out_dir: str | Path) -> None:
    """``engine.json`` and ``engine.md`` in ``out_dir``, each replaced atomically (:func:`stackprobe.atomic.write_atomic`)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "engine.json", json.dumps(result, indent=2, default=str) + "\n")
    write_atomic(out / "engine.md", markdown(result))


def _gpu_count() -> int:
    try:
        import torch
        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001
        return 0


def _host(run, world_size: int) -> dict:
    env = (run.ranks[0].get("env") if run.ranks else {}) or {}
    topo = {}
    try:
        from ..env import topology
        topo = topology()
    except Exception:  # noqa: BLE001
        pass
    driver = None
    try:
        import subprocess
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.split("\n")[0].strip() or None
    except Exception:  # noqa: BLE001
        pass
    sg = None
    try:
        from importlib import metadata
        sg = metadata.version("sglang")
    except Exception:  # noqa: BLE001
        pass
    return {"compute_capability": env.get("compute_capability"), "gpu": env.get("gpu_name"),
            "topology": ("nvlink" if topo.get("full_nvlink") else "pcie") if topo.get("pairs") else None,
            "world_size": world_size, "driver": driver, "torch": env.get("torch"),
            "nccl": env.get("torch_nccl_version"), "sglang": sg,
            "multicast_env": {k: v for k, v in (env.get("env") or {}).items() if "NVLS" in k or "MULTICAST" in k}}


def _interval(m: dict) -> str:
    if m.get("ratio_low") is None:
        return "-"
    return f"{m['ratio_to_baseline']:.3f} [{m['ratio_low']:.3f}, {m['ratio_high']:.3f}]"


def _work(m: dict) -> str:
    if m.get("work_us") is None:
        return "-"
    return f"{m['work_us']:.2f} [{m['work_low_us']:.2f}, {m['work_high_us']:.2f}]"


def markdown(result: dict) -> str:
    """The Markdown report of one engine run: host, one table row per communicator (enabled or not, status,
    gate, ratio to pynccl with its 95% interval, work per call), then each row's evidence."""
    h = result["host"]
    cfg = result.get("config") or {}
    lines = ["# SGLang's communicators, built on this host", "",
             f"Host: {h.get('gpu')} (compute capability {h.get('compute_capability')}), {h.get('topology')}, world size "
             f"{h.get('world_size')}; driver {h.get('driver')}; torch {h.get('torch')}; NCCL {h.get('nccl')}; "
             f"sglang {h.get('sglang')}; multicast settings {h.get('multicast_env')}", "",
             f"Run: {result['run']['status']} in {result['run']['seconds']} s. Timing: every enabled communicator in "
             f"one paired sweep with sglang-pynccl as the baseline ({cfg.get('rounds')} rounds at the decode size, "
             f"{cfg.get('graph_calls')} calls per CUDA graph, {cfg.get('graph_replays')} replays per trial; work = "
             f"time - empty-graph floor; tolerance {result.get('tolerance', DEFAULT_TOLERANCE):.0%}).", "",
             *mdtable.header(("communicator", "enabled", "status", "gate", "ratio to pynccl [95% interval]",
                              "work us/call [95%]", "why / figures"))]
    for v in result["verdicts"]:
        m = v.get("measurements") or {}
        built = next((e["value"] for e in v.get("evidence", []) if e["what"] == "as built (rank 0)"), {}) or {}
        lines.append(mdtable.row((v["backend"], "yes" if built.get("enabled") else "no", v["status"],
                                  v["gate"] or "-", _interval(m), _work(m), v["cause"])))
    if result["run"]["status"] != "ok":
        lines += ["", "```", *result["run"].get("tail", []), "```"]
    lines += ["", "Evidence per communicator (rank 0):", ""]
    for v in result["verdicts"]:
        lines.append(f"- **{v['backend']}**")
        for w in v.get("warnings") or []:
            lines.append(f"  - warning: {w}")
        for e in v["evidence"]:
            lines.append(f"  - {e['what']}: `{json.dumps(e['value'], default=str)[:700]}`")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m stackprobe.runtime.engine", description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--out", default="stackprobe-engine")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--sizes", default="", help="comma-separated message sizes in bytes (default: the workload's)")
    p.add_argument("--rounds", type=int, default=None, help="paired rounds at the decode size (default 30)")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help="tolerance on the ratio to pynccl, a fraction (default 0.05: see stackprobe.runtime.verdicts)")
    p.add_argument("--reference", action="store_true",
                   help="also time the suite's nccl-default beside pynccl (a reference row, not an SGLang communicator)")
    p.add_argument("--from-json", metavar="ENGINE_JSON",
                   help="no GPUs: re-derive the verdicts from the rank records of a saved engine.json (this suite's rules)")
    a = p.parse_args(argv)
    if a.from_json:
        res = json.loads(Path(a.from_json).read_text())
        try:
            res["verdicts"] = [v.to_json() for v in engine_verdicts(res["run"]["ranks"], res["host"], a.tolerance)]
        except EngineRecordError as exc:
            print(f"stackprobe engine runner: {a.from_json}: {exc}", file=sys.stderr)
            return 2
        res["tolerance"] = a.tolerance
        res["verdicts_derived"] = "re-derived from the saved rank records by python -m stackprobe.runtime.engine --from-json"
        write_result(res, a.out)
        sys.stdout.write(markdown(res))
        return 0
    sizes = [int(x) for x in a.sizes.split(",") if x] or None
    t0 = time.time()
    res = run_engine(a.world_size, out_dir=a.out, sizes=sizes, timeout=a.timeout, tolerance=a.tolerance,
                     rounds=a.rounds, reference=a.reference,
                     progress=lambda m: print(f"[engine] {m}", file=sys.stderr, flush=True))
    sys.stdout.write(markdown(res))
    print(f"[engine] {time.time() - t0:.1f} s; wrote {a.out}/engine.json", file=sys.stderr)
    return 0 if res["run"]["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
