"""SGLang's parallel state brought up as its own tests do, and which path served each TP all_reduce.

In one rank process (``python -m stackprobe.runtime.sglang_state --server-args "..." --world-size 1``):

1. the server arguments are parsed by SGLang's own parser (``ServerArgs.add_cli_args`` +
   ``ServerArgs.from_cli_args``, sglang ``srt/server_args.py``), ``--model-path dummy`` added when absent (as
   ``sglang.test.test_utils.publish_build_topology`` does), ``tp_size`` set to the group's world size;
2. its launch environment is applied (``_set_envs_and_config`` of ``srt/entrypoints/engine.py``) where that
   module imports; when it does not, the report says why and the variables stay as they were;
3. ``init_distributed_environment``, then SGLang's config published (``runtime_context.publish``, role
   ``test``, the world group kept: ``publish_build_topology``'s steps) and ``initialize_model_parallel``;
4. the TP group's communicators are listed (built or not, ``disabled``, the log lines SGLang wrote), and its
   own ``all_reduce`` is called inside its own ``graph_capture()`` at the decode shape (bf16 ``[rows, hidden]``)
   with every method the dispatch can end in observed (:func:`observe`): the path recorded is the method
   that was actually called, not one derived from the order.

Output: one JSON object on stdout (``{"server_args", "launch_env", "communicators", "served", ...}``).
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import shlex
import sys
import traceback

# the methods SGLang 0.5.23's GroupCoordinator.all_reduce can end in (srt/distributed/parallel_state.py:
# all_reduce, _all_reduce_out_place, _all_reduce_in_place), by the attribute holding the communicator
SERVING = {"ca_comm": ("custom_all_reduce",), "pcie_ipc_comm": ("pcie_ipc_all_reduce",),
           "qr_comm": ("quick_all_reduce",), "pymscclpp_comm": ("all_reduce",),
           "torch_symm_mem_comm": ("all_reduce",), "pynccl_comm": ("all_reduce", "outplace_all_reduce")}
COMMS = tuple(SERVING) + ("hpu_communicator", "xpu_communicator")
LAUNCH_VARS = ("NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "CUDA_DEVICE_MAX_CONNECTIONS", "TRTLLM_ENABLE_PDL",
               "NCCL_GRAPH_MIXING_SUPPORT", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE")


@contextlib.contextmanager
def observe(group, calls: list):
    """While inside, every serving method of ``group``'s communicators, its ``_flashinfer_allreduce`` and
    ``torch.distributed.all_reduce`` append ``"<attr>.<method>"`` to ``calls`` before running."""
    import torch.distributed as dist
    undo = []

    def wrap(obj, name, label):
        orig = getattr(obj, name)

        def observed(*a, **k):
            calls.append(label)
            return orig(*a, **k)
        setattr(obj, name, observed)
        undo.append((obj, name, orig))
    for attr, methods in SERVING.items():
        comm = getattr(group, attr, None)
        for m in methods if comm is not None else ():
            if hasattr(comm, m):
                wrap(comm, m, f"{attr}.{m}")
    if hasattr(group, "_flashinfer_allreduce"):
        wrap(group, "_flashinfer_allreduce", "flashinfer_allreduce")
    wrap(dist, "all_reduce", "torch.distributed.all_reduce")
    try:
        yield calls
    finally:
        for obj, name, orig in reversed(undo):
            if obj is dist:
                setattr(obj, name, orig)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)      # the instance attribute goes; the class's method shows again
                if getattr(obj, name) is not orig:
                    setattr(obj, name, orig)


def construction_gates(source: str) -> dict:
    """Where ``GroupCoordinator.__init__`` builds each communicator of :data:`COMMS`, and the ``if`` tests that
    must hold for it to be built, read from ``source`` (the text of the installed
    ``sglang/srt/distributed/parallel_state.py``).

    Returns ``{attr: {"built_at": line, "tests": [{"line", "test"}, ...]}}`` (outermost test first; a test on an
    ``else`` branch reads ``not (...)``); an attribute the constructor never assigns a call to maps to
    ``{"built_at": None, "tests": []}``. Line numbers are the file's. Raises ValueError when the source has no
    ``GroupCoordinator.__init__`` (a moved class: the caller reports the gates as unread, never guessed)."""
    tree = ast.parse(source)
    init = next((f for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "GroupCoordinator"
                 for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    if init is None:
        raise ValueError("no GroupCoordinator.__init__ in parallel_state.py: the communicators' gates are unread")
    out: dict = {a: {"built_at": None, "tests": []} for a in COMMS}

    def assigned(node) -> str | None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if not isinstance(getattr(node, "value", None), ast.Call):
            return None
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" and t.attr in out:
                return t.attr
        return None

    def walk(stmts, tests):
        for st in stmts:
            attr = assigned(st)
            if attr and out[attr]["built_at"] is None:
                out[attr] = {"built_at": st.lineno, "tests": list(tests)}
            if isinstance(st, ast.If):
                text = ast.get_source_segment(source, st.test) or ast.unparse(st.test)
                walk(st.body, tests + [{"line": st.lineno, "test": " ".join(text.split())}])
                walk(st.orelse, tests + [{"line": st.lineno, "test": f"not ({' '.join(text.split())})"}])
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    walk(getattr(st, field, []) or [], tests)
    walk(init.body, [])
    return out


def served_by(group, tensor) -> dict:
    """Call ``group.all_reduce(tensor)`` once under :func:`observe`: ``{"path", "calls", "same_tensor"}``;
    ``path`` is the first observed call; when the dispatch called none it is ``"input returned unchanged"``
    (world size 1) or, where a new tensor came back, ``"no observed method"`` (a path :data:`SERVING` does not
    list: the attribution is unknown, never guessed)."""
    calls: list = []
    with observe(group, calls):
        out = group.all_reduce(tensor)
    path = calls[0] if calls else ("input returned unchanged" if out is tensor else "no observed method")
    return {"path": path, "calls": calls, "same_tensor": out is tensor}


def parse_server_args(text: str, world_size: int):
    """SGLang's ``ServerArgs`` from a command-line string, by SGLang's own parser."""
    from sglang.srt.server_args import ServerArgs
    argv = shlex.split(text or "")
    if "--model-path" not in argv and "--model" not in argv:
        argv += ["--model-path", "dummy"]
    p = argparse.ArgumentParser()
    ServerArgs.add_cli_args(p)
    sa = ServerArgs.from_cli_args(p.parse_args(argv))
    asked = sa.tp_size
    sa.tp_size = world_size
    return sa, asked


def _comm_state(comm) -> dict:
    if comm is None:
        return {"built": False}
    out = {"built": True, "class": type(comm).__name__}
    for k in ("disabled", "available", "world_size", "full_nvlink", "max_size"):
        if hasattr(comm, k):
            v = getattr(comm, k)
            out[k] = v if isinstance(v, (bool, int, float, str, type(None))) else str(v)
    return out


def apply_all_reduce_flags(ps) -> dict:
    """The server's all-reduce switches, as SGLang 0.5.23's launch sets them before building its groups
    (``srt/distributed/bootstrap.py`` ``_set_all_reduce_flags``: ``set_custom_all_reduce(not
    comm.disable_custom_all_reduce)``, ``set_mscclpp(comm.enable_mscclpp)``,
    ``set_torch_symm_mem_all_reduce(comm.enable_torch_symm_mem)``), read from the published config. Called here
    rather than imported: ``bootstrap`` imports the HTTP server stack. Returns the values set."""
    from sglang.srt.runtime_context import get_exec
    comm = get_exec().comm
    flags = {"custom_all_reduce": not comm.disable_custom_all_reduce, "mscclpp": bool(comm.enable_mscclpp),
             "torch_symm_mem_all_reduce": bool(comm.enable_torch_symm_mem)}
    ps.set_custom_all_reduce(flags["custom_all_reduce"])
    ps.set_mscclpp(flags["mscclpp"])
    ps.set_torch_symm_mem_all_reduce(flags["torch_symm_mem_all_reduce"])
    return flags


def bring_up(server_args: str, world_size: int = 1, rank: int = 0, backend: str = "nccl",
             init_method: str = "tcp://127.0.0.1:29633", rows: int = 12, hidden: int = 7168,
             before=None, after=None) -> dict:
    """Steps 1-4 of the module docstring in this process; returns the report (never raises: a failed step is
    recorded with its error and the later steps are not run). Where ``torch.distributed`` is already
    initialized (a runtime-tier rank), SGLang's ``init_distributed_environment`` keeps that default group and
    ``init_method`` is unused.

    ``before()``: called first (a caller's set-up, e.g. stand-ins for CUDA-only classes on CPU). ``after(tp,
    rep)``: called with SGLang's TP ``GroupCoordinator`` after the observations and before the groups are
    destroyed; what it returns is stored as ``rep["after"]`` (an exception there is recorded like any step's)."""
    import torch

    from .engine import captured_logs
    rep: dict = {"world_size": world_size, "rank": rank, "backend": backend, "steps": []}
    try:
        if before is not None:
            before()
        sa, asked = parse_server_args(server_args, world_size)
        rep["server_args"] = {"text": server_args, "tp_size_asked": asked, "tp_size_used": world_size,
                              "disable_custom_all_reduce": getattr(sa, "disable_custom_all_reduce", None),
                              "enable_symm_mem": getattr(sa, "enable_symm_mem", None),
                              "enable_torch_symm_mem": getattr(sa, "enable_torch_symm_mem", None)}
        rep["steps"].append("server args parsed by ServerArgs.add_cli_args/from_cli_args")
        before = {k: os.environ.get(k) for k in LAUNCH_VARS}
        try:
            from sglang.srt.entrypoints.engine import _set_envs_and_config
            _set_envs_and_config(sa)
            rep["launch_env"] = {"applied": True}
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on without it
            rep["launch_env"] = {"applied": False, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        rep["launch_env"].update(before=before, after={k: os.environ.get(k) for k in LAUNCH_VARS})
        from sglang.srt.distributed import parallel_state as ps
        try:
            with open(ps.__file__, encoding="utf-8") as fh:
                rep["construction_gates"] = construction_gates(fh.read())
        except (OSError, SyntaxError, ValueError) as exc:
            rep["construction_gates"] = {"unread": f"{type(exc).__name__}: {exc}"}
        from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
        if backend == "nccl":
            torch.cuda.set_device(rank % max(torch.cuda.device_count(), 1))
        ps.init_distributed_environment(world_size=world_size, rank=rank, distributed_init_method=init_method,
                                        local_rank=rank, backend=backend)
        reset_context()
        try:
            publish(sa, role="test", ranks=SpawnRanks(world_rank=rank))
            rep["resolution"] = "SGLang's resolution pipeline ran (ServerArgs.resolve_once)"
        except Exception as exc:  # noqa: BLE001 - no model here: publish the parsed record unresolved, and say so
            rep["resolution"] = (f"not run: {type(exc).__name__}: {str(exc)[:300]} (the pipeline reads the model's "
                                 "config); the parsed arguments were published unresolved")
            sa, _ = parse_server_args(server_args, world_size)
            sa._resolution_finished = True
            reset_context()
            publish(sa, role="test", ranks=SpawnRanks(world_rank=rank))
        get_parallel().override_permanently(world_group=ps._WORLD)
        rep["steps"].append("init_distributed_environment + publish")
        try:
            rep["all_reduce_flags"] = apply_all_reduce_flags(ps)
        except Exception as exc:  # noqa: BLE001 - recorded; the group is built with SGLang's module defaults
            rep["all_reduce_flags"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        with captured_logs() as log:
            ps.initialize_model_parallel(backend=backend, enable_symm_mem=bool(getattr(sa, "enable_symm_mem", False)))
        rep["steps"].append("initialize_model_parallel")
        tp = ps.get_tp_group()
        rep["log"] = log[-30:]
        rep["communicators"] = {a: _comm_state(getattr(tp, a, None)) for a in COMMS}
        from sglang.srt.distributed.device_communicators import pcie_ipc_ar
        rep["pcie_ipc_eligible_group"] = bool(pcie_ipc_ar.eligible_group(
            group_name="tp", world_size=tp.world_size, deterministic=tp._deterministic_collectives_enabled()))
        observe_and_destroy(ps, tp, rep, served_by=served_by, rows=rows, hidden=hidden, backend=backend, after=after)
    except Exception as exc:  # noqa: BLE001
        rep["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        rep["traceback"] = traceback.format_exc()[-2000:]
    return rep


def observe_and_destroy(ps, tp, rep: dict, *, served_by, rows: int, hidden: int, backend: str, after=None) -> None:
    """The tail both engines' bring-ups share, on the tensor-parallel group ``tp`` of the engine's
    ``parallel_state`` module ``ps``: one bf16 ``rows x hidden`` all-reduce observed eager (``served_by(tp, x)``:
    the engine's own observer) into ``rep["served_eager"]`` and, with ``backend`` "nccl", inside the engine's
    ``tp.graph_capture()`` context while a CUDA graph is captured (then replayed) into
    ``rep["served_in_graph_capture"]``; ``rep["after"] = after(tp, rep)`` when given; then the engine's own
    teardown (``ps.destroy_model_parallel``, ``ps.destroy_distributed_environment``; their errors are ignored)."""
    import torch

    dev = tp.device if backend == "nccl" else torch.device("cpu")
    x = torch.ones(rows, hidden, dtype=torch.bfloat16, device=dev)
    rep["served_eager"] = served_by(tp, x)
    if backend == "nccl":
        with tp.graph_capture() as gc:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=gc.stream):
                rep["served_in_graph_capture"] = served_by(tp, x)
        g.replay()
        torch.cuda.synchronize()
    rep["steps"].append("all_reduce observed")
    rep["shape"] = [rows, hidden]
    if after is not None:
        rep["after"] = after(tp, rep)
        rep["steps"].append("after")
    with contextlib.suppress(Exception):
        ps.destroy_model_parallel()
        ps.destroy_distributed_environment()


def main(argv=None) -> int:
    return state_main("python -m stackprobe.runtime.sglang_state", __doc__.split("\n")[0], bring_up, argv)


def state_main(prog: str, description: str, bring_up, argv=None) -> int:
    """The command line of an engine's bring-up module (``bring_up(server_args, world_size, backend=, rows=,
    hidden=)``): its report as one JSON line on stdout; exit 0, or 1 when the report holds an ``error``."""
    a = argparse.ArgumentParser(prog=prog, description=description)
    a.add_argument("--server-args", default="")
    a.add_argument("--world-size", type=int, default=1)
    a.add_argument("--backend", default="nccl", choices=("nccl", "gloo"))
    a.add_argument("--rows", type=int, default=12, help="decode rows (batch x draft tokens)")
    a.add_argument("--hidden", type=int, default=7168)
    ns = a.parse_args(argv)
    rep = bring_up(ns.server_args, ns.world_size, backend=ns.backend, rows=ns.rows, hidden=ns.hidden)
    print(json.dumps(rep, default=str))
    return 0 if "error" not in rep else 1


if __name__ == "__main__":
    sys.exit(main())
