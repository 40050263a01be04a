"""The runtime tier through the engine: SGLang's own communicators, built in a plain process group.

Where SGLang is importable (a runtime image, a GPU host), every rank of one process group builds the
communicators SGLang's ``GroupCoordinator`` builds (``srt/distributed/parallel_state.py``), with SGLang's own
classes and gate functions, and records which come up disabled and why: their own flags (``disabled``,
``available``, ``full_nvlink``...) and the log lines SGLang wrote while building them. Enabled ones are timed
with the suite's harness (:class:`stackprobe.runtime.bench.Harness`), eager and in CUDA graphs, against
SGLang's pynccl in the same run.

Communicators (SGLang 0.5.23 names; FACTS "SGLang 0.5.23's own gates"):

* ``sglang-pynccl``: ``PyNcclCommunicator`` on the gloo group; SGLang enables it around graph capture
  (``change_state(enable=True)``), so it is timed that way;
* ``sglang-custom-allreduce``: ``dispatch_custom_allreduce`` picks the class (v2 needs full NVLink), then
  ``CustomAllreduce(group, device)``;
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

Run: ``python -m stackprobe.runtime.engine --world-size 2 --out DIR`` (JSON + Markdown), or
:func:`run_engine` from Python. Each row becomes a runtime verdict of scope ``engine`` whose ``host`` says where
it was measured (case C20).
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

from .bench import Harness, Op, short_error
from .probes import Probe, _bytes_to_numel

COMMUNICATORS = ("sglang-pynccl", "sglang-custom-allreduce", "sglang-torch-symm-mem", "sglang-mscclpp",
                 "sglang-pcie-ipc", "sglang-flashinfer-fusion-workspace")
STATIC_BACKEND = {"sglang-pynccl": "nccl-ring", "sglang-custom-allreduce": "sglang-custom-allreduce",
                  "sglang-torch-symm-mem": "torch-symm-mem", "sglang-mscclpp": "mscclpp",
                  "sglang-pcie-ipc": "flashinfer-pcie-ipc-allreduce",
                  "sglang-flashinfer-fusion-workspace": "flashinfer-allreduce-fusion"}
PCIE_OPT_IN = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE"


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
def captured_logs():
    h = _LogCapture()
    root = logging.getLogger("sglang")
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
    return {"backend": name, "label": label, "info": {"constructed": False, "enabled": False, "why": "", "state": {},
                                                      "log": []}, "sweep": [], "checks": {}, "failure": None}


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

    def run(self, ctx) -> list[dict]:
        import torch
        import torch.distributed as dist

        self.ctx = ctx
        self.torch = torch
        self.cpu_group = dist.group.WORLD          # gloo, as SGLang's cpu_group
        self.device = torch.device(ctx.device)
        self.dtype = getattr(torch, ctx.config.dtype)
        self.device_group = dist.new_group(backend="nccl")
        self.defaults_read = _install_config_defaults(ctx.world_size)
        rows = []
        self.pynccl = None
        for fn in (self._pynccl, self._custom_ar, self._symm_mem, self._mscclpp, self._pcie_ipc, self._fusion):
            try:
                rows.append(fn())
            except Exception as exc:  # noqa: BLE001 - one communicator's failure is its row, not the run's
                name = fn.__name__.strip("_")
                r = _row(f"sglang-{name}", "")
                r["failure"] = {"kind": "error", "message": short_error(exc)}
                r["info"]["traceback"] = traceback.format_exc()[-1500:]
                rows.append(r)
            ctx.barrier()
        for r in rows:
            r["info"]["config_leaves_from_defaults"] = sorted(set(self.defaults_read))
        return rows

    # --- timing ------------------------------------------------------------------------------------
    def _time(self, row: dict, make_op) -> None:
        try:
            row["sweep"] = Harness(self.ctx, self.ctx.config).sweep(make_op, row["backend"])
        except Exception as exc:  # noqa: BLE001
            row["failure"] = {"kind": "error", "message": f"timing failed: {short_error(exc)}"}

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
            with comm.change_state(enable=True):
                self._time(row, make_op)
        return row

    def _custom_ar(self) -> dict:
        from sglang.srt.distributed.device_communicators import custom_all_reduce as ca_mod

        row = _row("sglang-custom-allreduce", "CustomAllreduce as dispatch_custom_allreduce picks it")
        info = row["info"]
        with captured_logs() as log:
            try:
                cls = ca_mod.dispatch_custom_allreduce(group=self.cpu_group, device=self.device)
                info["class"] = cls.__name__
                comm = cls(group=self.cpu_group, device=self.device)
                info.update(constructed=True, state=_state(comm))
            except Exception as exc:  # noqa: BLE001 - SGLang's GroupCoordinator logs and falls back to NCCL
                info["exception"] = short_error(exc)
                comm = None
        info["log"] = log[-20:]
        info["enabled"] = comm is not None and not getattr(comm, "disabled", True)
        info["why"] = "" if info["enabled"] else (info.get("exception") or _why_from_log(log))
        if info["enabled"]:
            def make_op(nbytes):
                buf = self._buffers(nbytes)
                out = {"t": None}

                def run():
                    out["t"] = comm.custom_all_reduce(buf)
                return Op(buf, None, run, out_fn=lambda: out["t"])
            ctxmgr = comm.capture() if hasattr(comm, "capture") else contextlib.nullcontext()
            with ctxmgr:
                self._time(row, make_op)
        return row

    def _symm_mem(self) -> dict:
        from sglang.srt.distributed.device_communicators.torch_symm_mem import TorchSymmMemCommunicator

        row = _row("sglang-torch-symm-mem", "TorchSymmMemCommunicator")
        info = row["info"]
        info["multicast_env"] = {k: os.environ.get(k) for k in ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "NCCL_NVLS_ENABLE")}
        with captured_logs() as log:
            try:
                comm = TorchSymmMemCommunicator(group=self.cpu_group, device=self.device)
                info.update(constructed=True, state=_state(comm))
            except Exception as exc:  # noqa: BLE001
                info["exception"] = short_error(exc)
                comm = None
        info["log"] = log[-20:]
        info["enabled"] = comm is not None and not comm.disabled
        info["why"] = "" if info["enabled"] else (info.get("exception") or _why_from_log(log))
        if info["enabled"]:
            def make_op(nbytes):
                buf = self._buffers(nbytes)
                out = self.torch.empty_like(buf)
                return Op(buf, out, lambda: comm.all_reduce(buf, out=out))
            self._time(row, make_op)
        return row

    def _mscclpp(self) -> dict:
        from sglang.srt.distributed.device_communicators.pymscclpp import PyMscclppCommunicator

        row = _row("sglang-mscclpp", "PyMscclppCommunicator")
        info = row["info"]
        with captured_logs() as log:
            try:
                comm = PyMscclppCommunicator(group=self.cpu_group, device=self.device)
                info.update(constructed=True, state=_state(comm))
            except Exception as exc:  # noqa: BLE001
                info["exception"] = short_error(exc)
                comm = None
        info["log"] = log[-20:]
        info["enabled"] = comm is not None and not comm.disabled
        info["why"] = "" if info["enabled"] else (info.get("exception") or _why_from_log(log))
        if info["enabled"]:
            def make_op(nbytes):
                buf = self._buffers(nbytes)
                out = {"t": None}

                def run():
                    out["t"] = comm.all_reduce(buf)
                return Op(buf, None, run, out_fn=lambda: out["t"] if out["t"] is not None else buf)
            self._time(row, make_op)
        return row

    def _pcie_ipc(self) -> dict:
        from sglang.srt.distributed.device_communicators import pcie_ipc_ar

        row = _row("sglang-pcie-ipc", "PcieIpcCommunicator (FlashInfer PCIe IPC allreduce)")
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
def _decode_median(row: dict, mode: str = "graph"):
    for rec in row.get("sweep") or []:
        m = (rec.get(mode) or {}).get("median_us")
        if m is not None:
            return m, rec.get("bytes") or rec.get("size_bytes")
    return None, None


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


def engine_verdicts(ranks: list[dict], host: dict) -> list:
    """Runtime verdicts (scope ``engine``) from the ranks' rows: a communicator that came up disabled is
    ``blocked`` with its own reason (rank 0's; any rank's disable counts, as SGLang votes); an enabled one is
    compared with SGLang's pynccl at the decode size in the same run (graph time)."""
    from ..verdict import (BLOCKED, ERROR, GATE_CRASH, GATE_NEEDS_RUNTIME, GATE_PASSES, GATE_WRONG, SCOPE_ENGINE,
                           SKIPPED, UNBLOCKED, WORKS_SLOWER,
                           Verdict)

    rows = {r["backend"]: r for r in ranks[0]["backends"]}
    base, _ = _decode_median(rows.get("sglang-pynccl", {}))
    out = []
    for name, row in rows.items():
        infos = [next((b for b in rk["backends"] if b["backend"] == name), {}).get("info", {}) for rk in ranks]
        info = row.get("info", {})
        v = Verdict(name, BLOCKED, tier="runtime", scope=SCOPE_ENGINE, host=dict(host),
                    measurements={"world_size": host.get("world_size")})
        v.add("as built (rank 0)", {k: info.get(k) for k in ("constructed", "enabled", "state", "class", "preflight",
                                                             "resolve_backend_auto", "multicast_supported",
                                                             "eligible_group_as_served", "eligible_group_with_opt_in",
                                                             "multicast_granularity_query", "exception") if k in info},
              "SGLang's own classes, this host")
        v.add("SGLang log while building (rank 0)", info.get("log", [])[-6:], "logging 'sglang'")
        if info.get("config_leaves_from_defaults"):
            v.add("config leaves answered from ServerArgs defaults", info["config_leaves_from_defaults"], "no model: not published")
        enabled = all(i.get("enabled") for i in infos)
        if row.get("failure"):
            v.status, v.gate, v.cause = ERROR, GATE_CRASH, row["failure"]["message"]
        elif not enabled:
            why = info.get("why") or next((i.get("why") for i in infos if i.get("why")), "") or "disabled"
            v.gate = classify(why)
            v.cause = f"SGLang built it disabled here: {why}"
        else:
            med, nbytes = _decode_median(row)
            v.measurements.update({"graph_median_us": med, "bytes": nbytes, "pynccl_graph_median_us": base})
            wrong = [rec for rec in row.get("sweep") or [] if rec.get("graph_correct") is False or rec.get("eager_correct") is False]
            if wrong:
                v.status, v.gate, v.cause = BLOCKED, GATE_WRONG, "enabled, but a checked result was wrong"
            elif name == "sglang-pynccl":
                v.status, v.gate = GATE_PASSES, ""
                v.cause = (f"enabled (SGLang's NCCL path, the baseline): {med:.2f} us per call in a CUDA graph"
                           if med is not None else "enabled (SGLang's NCCL path, the baseline); no timing")
            elif med is None or base is None:
                v.status, v.gate, v.cause = SKIPPED, GATE_NEEDS_RUNTIME, "enabled; no comparable timing"
            else:
                v.status = UNBLOCKED if med < base else WORKS_SLOWER
                v.gate = ""
                v.cause = f"enabled by SGLang here; {med:.2f} us per call in a CUDA graph vs pynccl {base:.2f} us"
        out.append(v)
    return out


def run_engine(world_size: int = 2, *, out_dir: str | Path | None = None, sizes=None, timeout: float = 300.0,
               progress=print) -> dict:
    """Run :class:`SglangEngineProbe` at ``world_size`` and return ``{"host", "run", "verdicts"}``; with
    ``out_dir``, also write ``engine.json`` and ``engine.md`` there."""
    from dataclasses import asdict

    from .bench import BenchConfig
    from .orchestrate import run_probe
    from .workload import default_sizes, preset

    wl = preset("kimi-k2")
    config = BenchConfig(sizes=list(sizes or default_sizes(wl)))
    probe = SglangEngineProbe()
    skip = probe.skip_reason(world_size, _gpu_count())
    if skip:
        raise SystemExit(f"stackprobe engine runner: {skip}")
    run = run_probe("stackprobe.runtime.engine:SglangEngineProbe", world_size, asdict(config), timeout=timeout,
                    name=probe.name, progress=progress)
    host = _host(run, world_size)
    verdicts = engine_verdicts(run.ranks, host) if run.status == "ok" else []
    result = {"host": host, "run": run.to_json(), "verdicts": [v.to_json() for v in verdicts]}
    if out_dir:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "engine.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
        (out / "engine.md").write_text(markdown(result))
    return result


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


def markdown(result: dict) -> str:
    h = result["host"]
    lines = ["# SGLang's communicators, built on this host", "",
             f"Host: {h.get('gpu')} (compute capability {h.get('compute_capability')}), {h.get('topology')}, world size "
             f"{h.get('world_size')}; driver {h.get('driver')}; torch {h.get('torch')}; NCCL {h.get('nccl')}; "
             f"sglang {h.get('sglang')}; multicast settings {h.get('multicast_env')}", "",
             f"Run: {result['run']['status']} in {result['run']['seconds']} s", "",
             "| communicator | status | gate | why / figures |", "| --- | --- | --- | --- |"]
    for v in result["verdicts"]:
        lines.append(f"| {v['backend']} | {v['status']} | {v['gate'] or '-'} | {str(v['cause']).replace('|', '/')} |")
    if result["run"]["status"] != "ok":
        lines += ["", "```", *result["run"].get("tail", []), "```"]
    lines += ["", "Evidence per communicator (rank 0):", ""]
    for v in result["verdicts"]:
        lines.append(f"- **{v['backend']}**")
        for e in v["evidence"]:
            lines.append(f"  - {e['what']}: `{json.dumps(e['value'], default=str)[:700]}`")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m stackprobe.runtime.engine", description=__doc__.split("\n")[0])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--out", default="stackprobe-engine")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--sizes", default="", help="comma-separated message sizes in bytes (default: the workload's)")
    p.add_argument("--from-json", metavar="ENGINE_JSON",
                   help="no GPUs: re-derive the verdicts from the rank records of a saved engine.json (this suite's rules)")
    a = p.parse_args(argv)
    if a.from_json:
        res = json.loads(Path(a.from_json).read_text())
        res["verdicts"] = [v.to_json() for v in engine_verdicts(res["run"]["ranks"], res["host"])]
        res["verdicts_derived"] = "re-derived from the saved rank records by python -m stackprobe.runtime.engine --from-json"
        Path(a.out).mkdir(parents=True, exist_ok=True)
        (Path(a.out) / "engine.json").write_text(json.dumps(res, indent=2, default=str) + "\n")
        (Path(a.out) / "engine.md").write_text(markdown(res))
        sys.stdout.write(markdown(res))
        return 0
    sizes = [int(x) for x in a.sizes.split(",") if x] or None
    t0 = time.time()
    res = run_engine(a.world_size, out_dir=a.out, sizes=sizes, timeout=a.timeout,
                     progress=lambda m: print(f"[engine] {m}", file=sys.stderr, flush=True))
    sys.stdout.write(markdown(res))
    print(f"[engine] {time.time() - t0:.1f} s; wrote {a.out}/engine.json", file=sys.stderr)
    return 0 if res["run"]["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
