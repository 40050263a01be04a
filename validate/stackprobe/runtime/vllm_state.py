"""vLLM's parallel state brought up as its own worker does, and which path served each TP all_reduce.

The second engine of the runtime tier (the first: :mod:`stackprobe.runtime.sglang_state`). In one rank process,
vllm 0.33.0 as installed (every step names what it called; a step that fails is recorded with its own error and the
later steps are not run):

1. the user's server arguments are parsed by vLLM's own parser (``EngineArgs.add_cli_args`` on a
   ``FlexibleArgumentParser``, then ``EngineArgs.from_cli_args``: ``vllm/engine/arg_utils.py``);
2. a ``ParallelConfig`` from them with the fields of ``EngineArgs.create_engine_config``'s (``arg_utils.py:2569``)
   that the TP group's communicators read (tensor-parallel size = the group's world size,
   ``disable_custom_all_reduce``; ``enable_expert_parallel`` and ``all2all_backend`` recorded: the TP group is
   built with ``use_all2all=False``), whose ``_verify_args`` asks the platform (``use_custom_allreduce()``,
   ``config/parallel.py:1167``), inside a ``VllmConfig`` without a model (so ``use_cumem_cudagraph_pool``, which
   decides custom allreduce's graph-buffer registration, keeps its default), set as the current config;
3. vLLM's own ``init_worker_distributed_environment`` (``vllm/v1/worker/gpu_worker.py``): its all-reduce switch
   (``set_custom_all_reduce(not parallel_config.disable_custom_all_reduce)``), ``init_distributed_environment`` and
   ``ensure_model_parallel_initialized``; where that module does not import, those three calls from
   ``vllm.distributed.parallel_state`` (the report says which; ``init_batch_invariance`` and the EPLB override are
   then not run);
   then, where the PCIe IPC communicator was built, vLLM's warmup step for it (:func:`setup_pcie_ipc`);
4. the TP group's ``CudaCommunicator`` attributes are listed (built or not, ``disabled``, the log lines vLLM wrote),
   and the group's own ``all_reduce`` is called at the decode shape (bf16 ``[rows, hidden]``), eagerly and, on
   CUDA, inside its own ``graph_capture()``, with every method ``CudaCommunicator.all_reduce`` can end in observed
   (:func:`observe`): the path recorded is the first method the call reached, not one derived from the order.

vLLM builds no device communicator at world size 1 (``GroupCoordinator.__init__``: ``use_device_communicator and
self.world_size > 1``) and its ``all_reduce`` returns the input there; the report says so ("input returned
unchanged").

:class:`VllmDispatchProbe` is the dispatch probe's rank side for vLLM (``python -m stackprobe.runtime dispatch
--engine vllm``): :mod:`stackprobe.runtime.dispatch` times the path that served against the same group with only
that path switched off (its ``disabled`` flag, as vLLM's own code switches a communicator off).

Run alone: ``python -m stackprobe.runtime.vllm_state --server-args "..." --world-size 1`` (one JSON object on
stdout).
"""
from __future__ import annotations

import contextlib
import shlex
import sys
import traceback
from pathlib import Path

from .dispatch import VLLM, SglangDispatchProbe
from .dispatch import switched_off as dispatch_switched_off

# the methods vllm 0.33.0's CudaCommunicator.all_reduce can end in (vllm/distributed/device_communicators/
# cuda_communicator.py:372-446), by the attribute holding the communicator, in the order the dispatch asks them
# (NCCL symmetric memory, :data:`NCCL_SYMM`, is asked before all of them; ROCm's batch-invariant all_reduce between
# custom allreduce and torch symmetric memory is not observed: it reads "no observed method"; behind pynccl only
# ``torch.distributed.all_reduce`` on the device group, observed too)
SERVING = {"qr_comm": ("quick_all_reduce",), "fi_pcie_ipc_ar_comm": ("all_reduce",), "fi_ar_comm": ("all_reduce",),
           "aiter_ar_comm": ("custom_all_reduce",), "ca_comm": ("custom_all_reduce",),
           "symm_mem_comm": ("all_reduce",), "pynccl_comm": ("all_reduce",)}
COMMS = tuple(SERVING) + ("all2all_manager",)
#: NCCL symmetric memory is no attribute: the dispatch calls ``torch.ops.vllm.all_reduce_symmetric_with_copy``
#: when ``should_nccl_symm_mem_allreduce`` admits the tensor (registered by ``register_nccl_symmetric_ops``)
NCCL_SYMM = "nccl_symm_mem"
#: the variables vLLM's TP group reads when it builds its communicators (vllm/envs.py)
ENV_VARS = ("VLLM_ALLREDUCE_USE_SYMM_MEM", "VLLM_ALLREDUCE_USE_FLASHINFER", "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC",
            "VLLM_USE_NCCL_SYMM_MEM", "VLLM_BATCH_INVARIANT", "VLLM_DISABLE_PYNCCL", "VLLM_FLASHINFER_ALLREDUCE_BACKEND")
#: set by this suite in every rank (multicast off); torch reads it when it sets up symmetric memory
SUITE_VARS = ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS")


def _cuda_comm_module():
    from vllm.distributed.device_communicators import cuda_communicator
    return cuda_communicator


@contextlib.contextmanager
def observe(group, calls: list):
    """While inside, every serving method of ``group.device_communicator``'s communicators (:data:`SERVING`), vLLM's
    NCCL symmetric-memory op (when it returns a tensor) and ``torch.distributed.all_reduce`` append
    ``"<attr>.<method>"`` to ``calls`` before running; the symmetric-memory op's label is taken back when the op
    returns None (the dispatch then goes on), so the first label of a call is the method that served it even
    where that method calls another observed one (the op calls ``pynccl_comm.all_reduce`` inside)."""
    import torch
    import torch.distributed as dist
    undo = []

    def wrap(obj, name, label, after=False):
        orig = getattr(obj, name)

        def observed(*a, **k):
            calls.append(label)
            at = len(calls) - 1
            out = orig(*a, **k)
            if after and out is None:
                del calls[at:]          # the op declined: neither it nor what it called served
            return out
        setattr(obj, name, observed)
        undo.append((obj, name, orig))
    dc = getattr(group, "device_communicator", None)
    for attr, methods in SERVING.items():
        comm = getattr(dc, attr, None) if dc is not None else None
        for m in methods if comm is not None else ():
            if hasattr(comm, m):
                wrap(comm, m, f"{attr}.{m}")
    ns = getattr(torch.ops, "vllm", None)
    try:
        has_symm = ns is not None and getattr(ns, "all_reduce_symmetric_with_copy", None) is not None
    except (AttributeError, RuntimeError):
        has_symm = False
    if has_symm:
        wrap(ns, "all_reduce_symmetric_with_copy", f"{NCCL_SYMM}.all_reduce_symmetric_with_copy", after=True)
    wrap(dist, "all_reduce", "torch.distributed.all_reduce")
    try:
        yield calls
    finally:
        for obj, name, orig in reversed(undo):
            if obj is dist or obj is ns:
                setattr(obj, name, orig)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)      # the instance attribute goes; the class's method shows again
                if getattr(obj, name) is not orig:
                    setattr(obj, name, orig)


@contextlib.contextmanager
def switched_off(group, attr: str):
    """Inside, the path ``attr`` is off for ``CudaCommunicator.all_reduce``: the communicator's ``disabled`` flag set
    (every step of the dispatch reads it: ``not ca_comm.disabled``, ``fi_pcie_ipc_ar_comm.should_use`` ...), the
    attribute set to None where it has none, and for :data:`NCCL_SYMM` the module's admission
    ``should_nccl_symm_mem_allreduce`` answering False."""
    if attr == NCCL_SYMM:
        mod = _cuda_comm_module()
        orig = mod.should_nccl_symm_mem_allreduce
        mod.should_nccl_symm_mem_allreduce = lambda *a, **k: False
        try:
            yield
        finally:
            mod.should_nccl_symm_mem_allreduce = orig
        return
    with dispatch_switched_off(group.device_communicator, attr):
        yield


def served_by(group, tensor) -> dict:
    """Call ``group.all_reduce(tensor)`` once under :func:`observe`: ``{"path", "calls", "same_tensor"}``; ``path``
    is the first observed call, ``"input returned unchanged"`` where the group returned its input (world size 1),
    or ``"no observed method"`` (a path :data:`SERVING` does not list: the attribution is unknown, never guessed)."""
    calls: list = []
    with observe(group, calls):
        out = group.all_reduce(tensor)
    path = calls[0] if calls else ("input returned unchanged" if out is tensor else "no observed method")
    return {"path": path, "calls": calls, "same_tensor": out is tensor}


def parse_server_args(text: str):
    """``(EngineArgs, left)``: vLLM's ``EngineArgs`` from a command-line string, by vLLM's own parser, and the
    arguments it does not define (``vllm serve``'s front-end flags such as ``--host``/``--port``, which no TP group
    reads; recorded, not an error). Raises ``ValueError`` for a string that is not shell-quoted, ``SystemExit``
    (argparse's) for a bad value of a flag vLLM defines."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    try:
        argv = shlex.split(text or "")
    except ValueError as exc:
        raise ValueError(f"--server-args {text!r} is not one shell-quoted string ({exc})") from None
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    ns, left = parser.parse_known_args(argv)
    return EngineArgs.from_cli_args(ns), left


def parallel_config(ea, world_size: int):
    """The ``ParallelConfig`` a TP group of ``world_size`` reads, from the parsed ``EngineArgs`` (the fields
    ``create_engine_config`` passes that the group's communicators read)."""
    from vllm.config import ParallelConfig
    return ParallelConfig(tensor_parallel_size=world_size, pipeline_parallel_size=1, data_parallel_size=1,
                          enable_expert_parallel=bool(ea.enable_expert_parallel), all2all_backend=ea.all2all_backend,
                          disable_custom_all_reduce=bool(ea.disable_custom_all_reduce))


def _comm_state(comm) -> dict:
    if comm is None:
        return {"built": False}
    out = {"built": True, "class": type(comm).__name__}
    for k in ("disabled", "available", "world_size", "fully_connected", "max_size", "max_workspace_size"):
        if hasattr(comm, k):
            v = getattr(comm, k)
            out[k] = v if isinstance(v, (bool, int, float, str, type(None))) else str(v)
    if hasattr(comm, "workspace"):
        out["workspace"] = comm.workspace is not None
    return out


def setup_pcie_ipc(tp, rows: int, hidden: int, rep: dict) -> None:
    """vLLM sets its PCIe IPC workspace up at warmup, before graph capture (``warmup_flashinfer_pcie_ipc_allreduce``,
    ``vllm/distributed/device_communicators/flashinfer_pcie_ipc_all_reduce.py``, from
    ``model_executor/warmup/kernel_warmup.py``); until then ``should_use`` declines every tensor. Here the same
    ``setup`` call with the decode shape (``rows`` as the one capture size, ``hidden``, bf16) and a tune cache in a
    temporary folder; recorded in ``rep["pcie_ipc_setup"]`` (an exception is recorded, not raised)."""
    import tempfile

    import torch
    dc = tp.device_communicator
    comm = getattr(dc, "fi_pcie_ipc_ar_comm", None) if dc is not None else None
    if comm is None or comm.disabled:
        rep["pcie_ipc_setup"] = "not run: not built" if comm is None else "not run: disabled"
        return
    try:
        cache = Path(tempfile.mkdtemp(prefix="vllm-pcie-ipc-")) / f"pcie_ipc_allreduce_tp_{tp.world_size}.json"
        comm.setup(hidden_dim=hidden, dtype=torch.bfloat16, capture_sizes=[rows], tune_cache=cache)
        rep["pcie_ipc_setup"] = {"workspace": comm.workspace is not None, "disabled": comm.disabled}
    except Exception as exc:  # noqa: BLE001 - vLLM does not catch it either: recorded as what start-up would meet
        rep["pcie_ipc_setup"] = f"failed: {type(exc).__name__}: {str(exc)[:300]}"


def _init_worker(cfg, rank: int, init_method: str, backend: str, rep: dict) -> None:
    """vLLM's own ``init_worker_distributed_environment`` (``vllm/v1/worker/gpu_worker.py``), or the same three
    calls where that module does not import (recorded in ``rep["init"]``)."""
    try:
        from vllm.v1.worker.gpu_worker import init_worker_distributed_environment
    except Exception as exc:  # noqa: BLE001 - the same steps from parallel_state, and the report says why
        from vllm.distributed import parallel_state as ps
        rep["init"] = (f"vllm.v1.worker.gpu_worker did not import ({type(exc).__name__}: {str(exc)[:200]}); its "
                       "steps called from vllm.distributed.parallel_state")
        pc = cfg.parallel_config
        ps.set_custom_all_reduce(not pc.disable_custom_all_reduce)
        ps.init_distributed_environment(pc.world_size, rank, init_method, rank, backend)
        ps.ensure_model_parallel_initialized(pc.tensor_parallel_size, pc.pipeline_parallel_size)
        return
    rep["init"] = "vllm.v1.worker.gpu_worker.init_worker_distributed_environment"
    init_worker_distributed_environment(cfg, rank, init_method, rank, backend)


def bring_up(server_args: str, world_size: int = 1, rank: int = 0, backend: str = "nccl",
             init_method: str = "tcp://127.0.0.1:29634", rows: int = 12, hidden: int = 7168,
             before=None, after=None) -> dict:
    """Steps 1-4 of the module docstring in this process; returns the report (never raises: a failed step is
    recorded with its error and the later steps are not run). Where ``torch.distributed`` is already initialized
    (a runtime-tier rank), vLLM's ``init_distributed_environment`` keeps that default group.

    ``before()``: called first (the CPU tests' stand-ins). ``after(tp, rep)``: called with vLLM's TP
    ``GroupCoordinator`` after the observations, before the groups are destroyed; what it returns is stored as
    ``rep["after"]``. The report has the keys of :func:`stackprobe.runtime.sglang_state.bring_up`'s that the
    dispatch probe reads (``steps``, ``server_args``, ``all_reduce_flags``, ``communicators``, ``served_eager``,
    ``served_in_graph_capture``, ``after``, ``error``)."""
    import os

    import torch
    rep: dict = {"engine": "vllm", "world_size": world_size, "rank": rank, "backend": backend, "steps": []}
    try:
        if before is not None:
            before()
        ea, left = parse_server_args(server_args)
        rep["server_args"] = {"text": server_args, "not_engine_args": left, "tp_size_asked": ea.tensor_parallel_size,
                              "tp_size_used": world_size, "data_parallel_size_asked": ea.data_parallel_size,
                              "disable_custom_all_reduce": ea.disable_custom_all_reduce,
                              "enable_expert_parallel": ea.enable_expert_parallel,
                              "all2all_backend": ea.all2all_backend}
        rep["steps"].append("server args parsed by EngineArgs.add_cli_args/from_cli_args")
        import vllm.envs as envs
        rep["launch_env"] = {k: {"environ": os.environ.get(k), "vllm.envs": getattr(envs, k, None)} for k in ENV_VARS}
        rep["launch_env"].update({k: {"environ": os.environ.get(k)} for k in SUITE_VARS})
        from vllm.config import VllmConfig, set_current_vllm_config
        from vllm.platforms import current_platform
        rep["platform"] = type(current_platform).__name__
        pc = parallel_config(ea, world_size)
        cfg = VllmConfig(parallel_config=pc)
        rep["parallel_config"] = {"tensor_parallel_size": cfg.parallel_config.tensor_parallel_size,
                                  "disable_custom_all_reduce": cfg.parallel_config.disable_custom_all_reduce,
                                  "enable_expert_parallel": cfg.parallel_config.enable_expert_parallel,
                                  "all2all_backend": cfg.parallel_config.all2all_backend}
        rep["steps"].append("ParallelConfig + VllmConfig")
        from vllm.distributed import parallel_state as ps

        from .engine import captured_logs
        from .sglang_state import observe_and_destroy
        if backend == "nccl":
            torch.cuda.set_device(rank % max(torch.cuda.device_count(), 1))
        with set_current_vllm_config(cfg), captured_logs("vllm") as log:
            _init_worker(cfg, rank, init_method, backend, rep)
            rep["all_reduce_flags"] = {"custom_all_reduce": bool(ps._ENABLE_CUSTOM_ALL_REDUCE)}
            rep["steps"].append("init_worker_distributed_environment")
            tp = ps.get_tp_group()
            rep["log"] = [ln for ln in log if " vllm.distributed" in ln][-40:]   # the groups' own lines
            dc = tp.device_communicator
            rep["device_communicator"] = type(dc).__name__ if dc is not None else None
            setup_pcie_ipc(tp, rows, hidden, rep)
            rep["communicators"] = {a: _comm_state(getattr(dc, a, None) if dc is not None else None) for a in COMMS}
            observe_and_destroy(ps, tp, rep, served_by=served_by, rows=rows, hidden=hidden, backend=backend,
                                after=after)
    except BaseException as exc:  # noqa: BLE001 - argparse's SystemExit for an unknown flag is a result too
        if isinstance(exc, KeyboardInterrupt):
            raise
        rep["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        rep["traceback"] = traceback.format_exc()[-2000:]
    return rep


class VllmDispatchProbe(SglangDispatchProbe):
    """The dispatch probe's rank side for vLLM: :func:`bring_up`, :func:`observe` and :func:`switched_off` on the
    TP group's ``CudaCommunicator``; the timing is :meth:`stackprobe.runtime.dispatch.SglangDispatchProbe.measure`'s."""

    name = "vllm-dispatch"
    label = "vLLM's own TP all_reduce dispatch (CudaCommunicator.all_reduce)"
    requires = ("torch", "vllm")
    group = "vllm-dispatch"
    engine = VLLM

    def bring_up(self, server_args, ctx, cfg, cuda, after) -> dict:
        return bring_up(server_args, ctx.world_size, ctx.rank, backend="nccl" if cuda else "gloo",
                        rows=cfg["rows"], hidden=cfg["hidden"], before=lambda: self.before(ctx), after=after)

    def observe(self, tp, calls):
        return observe(tp, calls)

    def switched_off(self, tp, attr):
        return switched_off(tp, attr)

    def switchable(self, tp, attr) -> bool:
        if attr == NCCL_SYMM:
            return True
        dc = getattr(tp, "device_communicator", None)
        return dc is not None and getattr(dc, attr, None) is not None


def main(argv=None) -> int:
    from .sglang_state import state_main

    return state_main("python -m stackprobe.runtime.vllm_state", __doc__.split("\n")[0], bring_up, argv)


if __name__ == "__main__":
    sys.exit(main())
