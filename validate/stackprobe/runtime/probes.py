"""Runtime probes. A *row* is one backend or one setting at one world size; a *probe* is what one process
group runs. Every probe process measures the baseline and its candidates side by side (paired rounds, see
:mod:`stackprobe.runtime.bench`), so each candidate's ratio comes from the same processes, clocks and links.

The baseline, ``nccl-default``, is NCCL as a serving engine runs it: ``NCCL_ALGO`` and ``NCCL_PROTO`` unset,
``ncclAllReduce`` called through ctypes on the current CUDA stream, the way SGLang's pynccl wrapper calls it
(``sglang/srt/distributed/device_communicators/pynccl.py``). On CPU (``--device cpu``) the baseline is
``torch-gloo``.

Rows have a ``kind``:

* ``baseline``: the reference, ratio 1 by definition;
* ``backend``: another allreduce implementation (torch.distributed, torch symm-mem, FlashInfer ...);
* ``setting``: NCCL with one knob changed. Settings are ranked apart from backends: a setting is only usable
  where its precondition holds, so each carries ``precondition`` (from NCCL's documentation, cited) and
  ``sglang`` (whether SGLang as shipped meets it).

A setting has a ``scope``: ``communicator`` when NCCL reads it at ``ncclCommInitRank`` (``NCCL_ALGO`` and
``NCCL_PROTO`` are read in ``ncclTopoTuneModel`` at communicator init, upstream ``src/graph/tuning.cc``): the
probe sets it only around that communicator's init, in the same process as the baseline; ``process`` when NCCL
caches it for the whole process (``NCCL_GRAPH_MIXING_SUPPORT`` is an ``NCCL_PARAM``, read once): the suite then
alternates whole process groups (baseline, setting, setting, baseline, ...) over ``--rounds``.

A probe object has ``name``, ``label``, ``kind``, ``device``, ``requires``, ``min_world_size``, ``group`` (the
process group that runs it), ``env`` (process-wide variables, ``process`` scope only),
``skip_reason(world_size, gpus)`` and, for the group's lead, ``run(ctx) -> dict`` (``{"baseline", "sweep",
"backends": [{"backend", "label", "kind", "info", "checks", "failure"}]}``).
"""
from __future__ import annotations

import importlib.util
import os

from ..paths import PCIE_IPC
from .bench import Harness, Op, short_error

KIND_BASELINE, KIND_BACKEND, KIND_SETTING = "baseline", "backend", "setting"
VERDICT_SETTING = "setting"
VERDICT_GRAPH = "cuda-graph"
VERDICT_ERROR = "error"
BASELINE_CUDA = "nccl-default"
BASELINE_CPU = "torch-gloo"

NCCL_ENV_DOC = "NCCL documentation, Environment Variables (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)"
NCCL_GRAPH_DOC = ("NCCL documentation, Environment Variables: NCCL_GRAPH_MIXING_SUPPORT (since 2.13), and Using "
                  "NCCL with CUDA Graphs (docs.nvidia.com/deeplearning/nccl/user-guide/docs/usage/cudagraph.html)")

# Each setting: its variables, scope, NCCL's precondition and whether SGLang as shipped meets it.
SETTINGS: dict[str, dict] = {
    "nccl-ring": {
        "env": {"NCCL_ALGO": "Ring"}, "scope": "communicator",
        "precondition": "NCCL_ALGO restricts every collective of every communicator in the process to the listed "
                        "algorithms; Ring implements all collectives, so nothing else changes",
        "source": NCCL_ENV_DOC + ", NCCL_ALGO",
        "sglang": {"meets": True, "note": "SGLang does not set NCCL_ALGO; a user may export it, and Ring serves "
                                          "every collective SGLang issues"}},
    "nccl-tree": {
        "env": {"NCCL_ALGO": "Tree"}, "scope": "communicator", "collectives": True,
        "precondition": "NCCL_ALGO restricts every collective to the listed algorithms; all_gather and "
                        "reduce_scatter have no Tree algorithm, so they fail (ncclInvalidUsage)",
        "source": NCCL_ENV_DOC + ", NCCL_ALGO",
        "sglang": {"meets": False, "note": "SGLang issues all_gather (logits, DP attention) and reduce_scatter on "
                                           "its NCCL groups: process-wide Tree breaks them (case C12)"}},
    "nccl-allreduce-tree": {
        "env": {"NCCL_ALGO": "allreduce:tree"}, "scope": "communicator", "collectives": True,
        "precondition": "the per-function form restricts allreduce only (NCCL_ALGO '<function>:<list>' syntax, "
                        "upstream src/graph/tuning.cc parseList); other collectives keep NCCL's choice",
        "source": NCCL_ENV_DOC + ", NCCL_ALGO",
        "sglang": {"meets": True, "note": "SGLang does not set NCCL_ALGO; the per-function form leaves its "
                                          "all_gather and reduce_scatter alone"}},
    "nccl-graph-mixing-off": {
        "env": {"NCCL_GRAPH_MIXING_SUPPORT": "0"}, "scope": "process",
        "precondition": "no uncaptured NCCL operation may be launched on a communicator while a CUDA graph "
                        "holding NCCL work on that communicator is outstanding (launched, not yet finished), and "
                        "no two graphs may use it in parallel from different streams",
        "source": NCCL_GRAPH_DOC,
        "sglang": {"meets": False, "note": "not shown: SGLang runs prefill eagerly and decode as CUDA graphs on the "
                                           "same tensor-parallel group, and its overlap scheduler (on by default) "
                                           "launches the next batch while the previous one may still run; it "
                                           "does not set the variable, so treat it as unsafe until shown safe"}},
}


def _module_missing(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):
            return name
    return None


class Probe:
    """A row the suite knows. Subclasses that lead a process group implement :meth:`candidates`."""

    name = ""
    label = ""
    kind = KIND_BACKEND
    requires: tuple[str, ...] = ("torch",)
    device = "cuda"
    env: dict[str, str] = {}
    scope = "communicator"
    min_world_size = 2
    group = ""

    def skip_reason(self, world_size: int, gpus: int) -> str | None:
        missing = _module_missing(self.requires)
        if missing:
            return f"not installed: Python module '{missing}' is not importable"
        if self.device == "cuda" and gpus < world_size:
            return f"needs {world_size} GPUs, {gpus} present"
        if world_size < self.min_world_size:
            return "no peers: world size 1 moves no data between GPUs" if world_size == 1 else \
                f"needs world size >= {self.min_world_size}"
        return None

    def setting(self) -> dict | None:
        return SETTINGS.get(self.name)

    def candidates(self, ctx, wanted: list[str]) -> list[dict]:
        """``[{"backend", "label", "kind", "make": nbytes -> Op, "info", "after": fn | None, "close": fn | None}]``
        for the rows of this group named in ``wanted`` (all when ``None``)."""
        return []

    def run(self, ctx) -> dict:
        """Baseline + this group's candidates, paired, at every size; then each candidate's ``after`` hook
        (collective checks). Returns the rank's result (see module doc)."""
        wanted = ctx.spec.get("backends")  # None: every row of the group
        base = make_baseline(ctx)
        cands = self.candidates(ctx, wanted)
        makers = {base["backend"]: base["make"]}
        makers.update({c["backend"]: c["make"] for c in cands})
        sweep = Harness(ctx, ctx.config).sweep(makers, self.group or self.name)
        out = []
        for c in [base] + cands:
            meta = {k: c.get(k) for k in ("backend", "label", "kind", "info")}
            meta["checks"], meta["failure"] = {}, None
            if c.get("after"):
                meta["checks"], meta["failure"] = c["after"]()
            out.append(meta)
        for c in [base] + cands:
            if c.get("close"):
                c["close"]()
        return {"baseline": base["backend"], "sweep": sweep, "backends": out}


def _bytes_to_numel(nbytes: int, dtype) -> int:
    import torch
    item = torch.empty((), dtype=dtype).element_size()
    if nbytes % item:
        raise ValueError(f"message size {nbytes} B is not a multiple of the element size {item} B")
    return nbytes // item


def nccl_comm(ctx, key: str, env: dict[str, str] | None = None):
    """``(comm, info)``: an NCCL communicator over all ranks, with ``env`` set only around its
    ``ncclCommInitRank`` (communicator-scope settings) and restored afterwards."""
    from .ncclbind import NcclComm, NcclLibrary
    lib = NcclLibrary()
    uid = ctx.share_bytes(f"nccl-unique-id/{key}", lib.unique_id)
    saved = {k: os.environ.get(k) for k in (env or {})}
    try:
        os.environ.update(env or {})
        comm = NcclComm(lib, uid, ctx.rank, ctx.world_size)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    info = {"libnccl": lib.path, "nccl_version": ".".join(map(str, lib.version)),
            "call": "ncclAllReduce on the current stream (ctypes), as SGLang's pynccl",
            "communicator_env": dict(env or {}),
            "process_env": {k: os.environ[k] for k in ("NCCL_ALGO", "NCCL_PROTO", "NCCL_GRAPH_MIXING_SUPPORT")
                            if k in os.environ}}
    return comm, info


def _nccl_maker(ctx, comm):
    import torch
    dtype = getattr(torch, ctx.config.dtype)

    def make(nbytes):
        n = _bytes_to_numel(nbytes, dtype)
        inp = torch.empty(n, dtype=dtype, device=ctx.device)
        out = torch.empty_like(inp)
        return Op(inp, out, lambda: comm.all_reduce(inp, out))
    return make


def make_baseline(ctx) -> dict:
    """The baseline of this rank's device: ``nccl-default`` on GPUs, ``torch-gloo`` on CPU."""
    if not ctx.device.startswith("cuda"):
        return {"backend": BASELINE_CPU, "label": GlooProbe.label, "kind": KIND_BASELINE, "info": {},
                "make": _gloo_maker(ctx)}
    comm, info = nccl_comm(ctx, "baseline")
    ctx.log(f"NCCL {info['nccl_version']} from {info['libnccl']} (baseline, NCCL_ALGO/NCCL_PROTO unset)")
    return {"backend": BASELINE_CUDA, "label": NcclDefaultProbe.label, "kind": KIND_BASELINE, "info": info,
            "make": _nccl_maker(ctx, comm), "close": comm.destroy}


def _gloo_maker(ctx):
    import torch
    import torch.distributed as dist
    dtype = getattr(torch, ctx.config.dtype)

    def make(nbytes):
        buf = torch.empty(_bytes_to_numel(nbytes, dtype), dtype=dtype)
        return Op(buf, buf, lambda: dist.all_reduce(buf), in_place=True, graphable=False)
    return make


class NcclDefaultProbe(Probe):
    """The baseline and everything that shares its process group: ``torch-distributed-nccl`` and the
    communicator-scope NCCL settings (``nccl-ring``, ``nccl-tree``, ``nccl-allreduce-tree``), each on its own
    communicator created with the setting around its init. Tree settings also check all_reduce, all_gather and
    reduce_scatter eagerly and under capture (case C12)."""

    name = BASELINE_CUDA
    label = "NCCL, NCCL_ALGO/NCCL_PROTO unset, ncclAllReduce on the current stream (SGLang pynccl's call)"
    kind = KIND_BASELINE
    min_world_size = 1
    group = "nccl"

    def candidates(self, ctx, wanted):
        import torch
        import torch.distributed as dist
        out = []
        dtype = getattr(torch, ctx.config.dtype)
        for name in ("torch-distributed-nccl", "nccl-ring", "nccl-tree", "nccl-allreduce-tree"):
            if wanted is not None and name not in wanted:
                continue
            if name == "torch-distributed-nccl":
                pg = dist.new_group(backend="nccl")

                def make_td(nbytes, pg=pg):
                    buf = torch.empty(_bytes_to_numel(nbytes, dtype), dtype=dtype, device=ctx.device)
                    return Op(buf, buf, lambda: dist.all_reduce(buf, group=pg), in_place=True)
                out.append({"backend": name, "label": TorchDistributedNcclProbe.label, "kind": KIND_BACKEND,
                            "info": {"call": "torch.distributed.all_reduce (ProcessGroupNCCL)"}, "make": make_td})
                continue
            st = SETTINGS[name]
            comm, info = nccl_comm(ctx, name, st["env"])
            c = {"backend": name, "label": registry()[name].label, "kind": KIND_SETTING, "info": info,
                 "make": _nccl_maker(ctx, comm), "close": comm.destroy}
            if st.get("collectives"):
                algo = st["env"]["NCCL_ALGO"]
                c["after"] = (lambda comm=comm, algo=algo, name=name:
                              _after_collectives(ctx, comm, dtype, algo, name))
                c.pop("close")  # after a failed collective the process exit releases the communicator
            out.append(c)
        return out


def _after_collectives(ctx, comm, dtype, algo, name):
    checks = check_collectives(ctx, comm, dtype, algo)
    failure = collective_failure(checks, algo)
    if algo == "Tree" and checks.get("all_gather", {}).get("eager") == "ok":
        # NCCL 2.28 refuses all_gather under Tree: if it ran, the setting did not reach this communicator
        failure = {"kind": "error", "message": f"{name}: all_gather ran under NCCL_ALGO={algo}, so the setting did "
                   "not apply to this communicator; run this setting as process groups", "lift_detail": ""}
    return checks, failure


class TorchDistributedNcclProbe(Probe):
    name = "torch-distributed-nccl"
    label = "torch.distributed.all_reduce (ProcessGroupNCCL, in place), NCCL defaults"
    group = "nccl"


class NcclSettingProbe(Probe):
    """An NCCL setting row (see :data:`SETTINGS`). Communicator-scope ones run inside the ``nccl`` group; a
    process-scope one leads its own group, run alternately with and without its variables."""

    kind = KIND_SETTING

    def __init__(self, name: str, label: str):
        self.name, self.label = name, label
        st = SETTINGS[name]
        self.scope = st["scope"]
        self.group = "nccl" if self.scope == "communicator" else name
        self.env = dict(st["env"]) if self.scope == "process" else {}

    def run(self, ctx) -> dict:
        """Process scope: this process's own NCCL communicator (with or without the process-wide variables,
        as the suite started it) plus the floor, at the decode size only."""
        import dataclasses
        ctx.config = dataclasses.replace(ctx.config, sizes=ctx.config.sizes[:1],
                                         rounds=max(5, ctx.config.rounds // 3))
        comm, info = nccl_comm(ctx, "solo")
        unit = ctx.spec.get("unit_name") or self.name
        sweep = Harness(ctx, ctx.config).sweep({unit: _nccl_maker(ctx, comm)}, unit)
        comm.destroy()
        return {"baseline": unit, "sweep": sweep,
                "backends": [{"backend": unit, "label": self.label, "kind": self.kind, "info": info,
                              "checks": {}, "failure": None}]}


def check_collectives(ctx, comm, dtype, algo: str) -> dict:
    """all_reduce, all_gather and reduce_scatter at the decode size on ``comm``: one eager call, then
    ``graph_calls`` calls captured in one CUDA graph and replayed, each result checked (outputs poisoned first)."""
    import torch
    n = _bytes_to_numel(ctx.config.sizes[0], dtype)
    ws, rank = ctx.world_size, ctx.rank
    out: dict = {}
    h = Harness(ctx, ctx.config)
    for coll in ("all_reduce", "all_gather", "reduce_scatter"):
        rec: dict = {}
        try:
            if coll == "all_reduce":
                inp = torch.empty(n, dtype=dtype, device=ctx.device)
                h.fill(inp)
                res = torch.empty_like(inp)
                want = h.reference(n, inp.device)
                fn = lambda: comm.all_reduce(inp, res)  # noqa: E731
            elif coll == "all_gather":
                inp = torch.full((n,), float(rank + 1), dtype=dtype, device=ctx.device)
                res = torch.empty(n * ws, dtype=dtype, device=ctx.device)
                want = torch.arange(1, ws + 1, device=inp.device, dtype=torch.float32).repeat_interleave(n)
                fn = lambda: comm.all_gather(inp, res)  # noqa: E731
            else:
                inp = torch.full((n * ws,), float(rank + 1), dtype=dtype, device=ctx.device)
                res = torch.empty(n, dtype=dtype, device=ctx.device)
                want = torch.full((n,), float(ws * (ws + 1) // 2), device=inp.device)
                fn = lambda: comm.reduce_scatter(inp, res)  # noqa: E731
        except Exception as exc:
            out[coll] = {"eager": "error", "error": short_error(exc)}
            continue
        try:
            h.poison(res)
            fn()
            torch.cuda.synchronize()
            ok, _ = h.check(res, want)
            rec["eager"] = "ok" if ok else "wrong-result"
        except Exception as exc:
            rec["eager"] = "error"
            rec["eager_error"] = short_error(exc)
            h.sync_quiet()
        try:
            g = torch.cuda.CUDAGraph()
            torch.cuda.synchronize()
            with torch.cuda.graph(g):
                for _ in range(ctx.config.graph_calls):
                    fn()
            h.poison(res)
            torch.cuda.synchronize()
            ctx.barrier()
            g.replay()
            torch.cuda.synchronize()
            ok, _ = h.check(res, want)
            rec["graph"] = "ok" if ok else "wrong-result"
            del g
        except Exception as exc:
            rec["graph"] = "capture-failed"
            rec["graph_error"] = short_error(exc)
            h.sync_quiet()
        ctx.log(f"{coll} under NCCL_ALGO={algo}: {rec}")
        out[coll] = rec
    return out


def collective_failure(checks: dict, algo: str) -> dict | None:
    """Turn the collective checks into a failure: a collective that fails eagerly with an NCCL usage error
    under an ``NCCL_ALGO`` setting is a *setting* gate (C12); one that fails only under capture is a CUDA graph
    gate; a wrong result is a wrong result."""
    failed = {c: r for c, r in checks.items() if r.get("eager") != "ok" or r.get("graph") != "ok"}
    if not failed:
        return None
    parts, kinds = [], set()
    for c, r in failed.items():
        err = r.get("eager_error") or r.get("graph_error") or r.get("error") or ""
        if r.get("eager") == "error" or r.get("error"):
            # NCCL 2.28 says "no algorithm/protocol available for function AllGather" (ncclInvalidUsage when the
            # variable is process-wide, ncclInternalError when it was set around this communicator's init only)
            refused = ("InvalidUsage" in err or "NCCL_ALGO" in err or "no algorithm/protocol available" in err)
            kinds.add(VERDICT_SETTING if refused else VERDICT_ERROR)
        elif r.get("eager") == "wrong-result" or r.get("graph") == "wrong-result":
            kinds.add("wrong-result")
        else:
            kinds.add(VERDICT_GRAPH)
        parts.append(f"{c}: eager {r.get('eager')}, graph {r.get('graph', '-')}" + (f" ({err})" if err else ""))
    ok = [c for c in checks if c not in failed]
    kind = next(k for k in (VERDICT_SETTING, "wrong-result", VERDICT_GRAPH, VERDICT_ERROR) if k in kinds)
    lift = f"NCCL_ALGO=allreduce:{algo.lower()}" if kind == VERDICT_SETTING and ":" not in algo else ""
    return {"kind": kind, "lift_detail": lift, "message": f"under NCCL_ALGO={algo}: " + "; ".join(parts)
            + (f"; {', '.join(ok)} ran and captured" if ok else ""), "failed": sorted(failed), "passed": ok}


class SymmMemProbe(Probe):
    """torch symmetric memory allreduce (``torch.ops.symm_mem``): ``one_shot_all_reduce`` (every rank reads
    all peers' buffers; out of place) or ``two_shot_all_reduce_`` (reduce-scatter + all-gather over P2P; in
    place). The input lives in one symmetric buffer (``symm_mem.empty`` + ``rendezvous``); multicast is off
    (``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``), so only P2P algorithms are used. Both variants share one process
    group (``torch-symm-mem``) with the baseline."""

    requires = ("torch", "torch.distributed._symmetric_memory")
    group = "torch-symm-mem"

    def __init__(self, variant: str):
        self.variant = variant
        self.name = f"torch-symm-mem-{variant.replace('_', '-')}"
        self.label = ("torch.ops.symm_mem.one_shot_all_reduce_out" if variant == "one_shot"
                      else "torch.ops.symm_mem.two_shot_all_reduce_ (in place)")


class SymmMemGroup(Probe):
    name = "torch-symm-mem"
    group = "torch-symm-mem"

    def candidates(self, ctx, wanted):
        import torch
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        info = {}
        if hasattr(symm_mem, "set_backend"):
            try:
                symm_mem.set_backend("CUDA")
                info["symm_mem_backend"] = "CUDA"
            except Exception as exc:
                info["symm_mem_backend"] = f"default ({short_error(exc)})"
        pg = dist.new_group(backend="nccl")
        gname = pg.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            try:
                symm_mem.enable_symm_mem_for_group(gname)
            except Exception:
                pass
        dtype = getattr(torch, ctx.config.dtype)
        max_numel = _bytes_to_numel(max(ctx.config.sizes), dtype)
        bufs = {}
        ops = torch.ops.symm_mem
        out = []
        for variant in ("one_shot", "two_shot"):
            p = SymmMemProbe(variant)
            if wanted is not None and p.name not in wanted:
                continue
            buf = symm_mem.empty(max_numel, dtype=dtype, device=ctx.device)
            symm_mem.rendezvous(buf, gname)
            bufs[variant] = buf

            def make(nbytes, variant=variant, buf=buf):
                n = _bytes_to_numel(nbytes, dtype)
                view = buf[:n]
                if variant == "one_shot":
                    res = torch.empty(n, dtype=dtype, device=ctx.device)
                    if hasattr(ops, "one_shot_all_reduce_out"):
                        return Op(view, res, lambda: ops.one_shot_all_reduce_out(view, "sum", gname, res))
                    holder = {}

                    def run():
                        holder["out"] = ops.one_shot_all_reduce(view, "sum", gname)
                    return Op(view, None, run, out_fn=lambda: holder["out"])
                return Op(view, view, lambda: ops.two_shot_all_reduce_(view, "sum", gname), in_place=True)
            out.append({"backend": p.name, "label": p.label, "kind": KIND_BACKEND,
                        "info": dict(info, variant=variant), "make": make})
        return out


class FlashInferPcieIpcProbe(Probe):
    """FlashInfer's PCIe IPC allreduce (``flashinfer.comm.PcieIpcAllReduceWorkspace``, FlashInfer >= 0.7;
    upstream file flashinfer/comm/pcie_ipc_ar.py): each rank's slab is shared over CUDA IPC and the kernels use
    plain loads/stores, no NVLink and no multicast. One workspace per message size, sized to it (FlashInfer's
    docstring: the epoch double buffer sits ``world_size * max_numel`` elements apart, so an oversized
    workspace costs time at small sizes). Out of place, with the launch configuration the workspace resolves
    (its seed policy unless ``tune()`` persisted measurements on this machine; not run here), passed
    explicitly so every captured call uses the same one. World sizes 2, 4, 8; bfloat16/float16 only.
    Metadata (IPC handles, topology probe) goes over a gloo group; the kernels have no timeout, so a hang
    is caught by the orchestrator's per-probe timeout."""

    name = PCIE_IPC
    label = "FlashInfer PcieIpcAllReduceWorkspace.all_reduce (CUDA IPC, out of place)"
    requires = ("torch", "flashinfer")
    min_world_size = 2

    group = PCIE_IPC

    def candidates(self, ctx, wanted) -> list[dict]:
        import torch
        import torch.distributed as dist

        import flashinfer
        from flashinfer.comm import PcieIpcAllReduceWorkspace

        dtype = getattr(torch, ctx.config.dtype)
        group = dist.new_group(backend="gloo")
        info: dict = {"flashinfer": getattr(flashinfer, "__version__", "?"), "launch_config": {}}
        workspaces = []

        def make_op(nbytes):
            n = _bytes_to_numel(nbytes, dtype)
            ws = PcieIpcAllReduceWorkspace(group=group, max_numel=n, dtype=dtype)
            workspaces.append(ws)
            info.setdefault("profile", f"{ws.profile}: {ws.profile_reason}")
            inp = torch.empty(n, dtype=dtype, device=ctx.device)
            out = torch.empty_like(inp)
            cfg = ws.tuned_launch_config(inp)
            if cfg is None:
                raise ValueError(f"PcieIpcAllReduceWorkspace does not support {n} x {dtype} at world size "
                                 f"{ctx.world_size} (supports() is False)")
            info["launch_config"][str(nbytes)] = repr(cfg)
            return Op(inp, out, lambda: ws.all_reduce(inp, out=out, config=cfg))

        def close():
            for ws in workspaces:   # collective, in the same order on every rank
                try:
                    ws.destroy()
                except Exception as exc:  # noqa: BLE001 - reported; the process exit frees the rest
                    info["destroy_error"] = short_error(exc)
                    ctx.log(f"{self.name}: workspace teardown failed: {info['destroy_error']}")
                    break
        return [{"backend": self.name, "label": self.label, "kind": KIND_BACKEND, "info": info, "make": make_op,
                 "close": close}]


def _token_shape(numel: int) -> tuple[int, int]:
    """(tokens, hidden) for a fused-allreduce call of ``numel`` elements: hidden 7168 (the kimi-k2 preset's
    decode message is 3 x 7168) when it divides, else the largest of 4096, 2048, 1024, 512, 256 that does."""
    for hidden in (7168, 4096, 2048, 1024, 512, 256):
        if numel % hidden == 0:
            return numel // hidden, hidden
    raise ValueError(f"{numel} elements is not a whole number of tokens of any hidden size this probe uses")


class FlashInferFusionProbe(Probe):
    """FlashInfer's allreduce fusion on its TensorRT-LLM backend (``flashinfer.comm.allreduce_fusion`` with a
    ``create_allreduce_fusion_workspace(backend="trtllm")`` workspace; upstream file flashinfer/comm/allreduce.py),
    pattern ``kAllReduce`` (the allreduce alone, so it compares with Ring; serving fuses residual + RMSNorm
    into the same kernel), fp32 accumulation, one- or two-shot by FlashInfer's own heuristic. One workspace
    sized to the largest message (FlashInfer: a workspace serves any shape whose total size fits). The
    messages are shaped [tokens, hidden] by :func:`_token_shape`. Its JIT module admits compute-capability
    majors 9, 10 and 12 (FlashInfer >= 0.6.17)."""

    name = "flashinfer-allreduce-fusion"
    label = "FlashInfer allreduce_fusion, TRT-LLM backend, pattern kAllReduce (fp32 accumulation)"
    requires = ("torch", "flashinfer")
    min_world_size = 2

    group = "flashinfer-allreduce-fusion"

    def candidates(self, ctx, wanted) -> list[dict]:
        import torch
        import torch.distributed as dist

        import flashinfer
        from flashinfer.comm import AllReduceFusionPattern, allreduce_fusion, create_allreduce_fusion_workspace

        dtype = getattr(torch, ctx.config.dtype)
        group = dist.new_group(backend="nccl")
        max_numel = _bytes_to_numel(max(ctx.config.sizes), dtype)
        ws = create_allreduce_fusion_workspace(backend="trtllm", world_size=ctx.world_size, rank=ctx.rank,
                                               max_token_num=max_numel // 256, hidden_dim=256, dtype=dtype,
                                               group=group)
        info: dict = {"flashinfer": getattr(flashinfer, "__version__", "?"), "workspace": type(ws).__name__,
                      "workspace_elements": max_numel, "shapes": {}}

        def make_op(nbytes):
            tokens, hidden = _token_shape(_bytes_to_numel(nbytes, dtype))
            if not ws.is_buffer_size_sufficient(ctx.world_size, tokens, hidden, dtype):
                raise ValueError(f"the workspace does not fit [{tokens}, {hidden}]")
            info["shapes"][str(nbytes)] = [tokens, hidden]
            inp = torch.empty(tokens * hidden, dtype=dtype, device=ctx.device)
            out = torch.empty_like(inp)
            x, y = inp.view(tokens, hidden), out.view(tokens, hidden)
            return Op(inp, out, lambda: allreduce_fusion(input=x, workspace=ws, pattern=AllReduceFusionPattern.kAllReduce,
                                                         output=y, fp32_acc=True, launch_with_pdl=False))

        def close():
            try:
                ws.destroy()
            except Exception as exc:  # noqa: BLE001 - reported; the process exit frees it
                info["destroy_error"] = short_error(exc)
        return [{"backend": self.name, "label": self.label, "kind": KIND_BACKEND, "info": info, "make": make_op,
                 "close": close}]


class GlooProbe(Probe):
    """``torch.distributed.all_reduce`` over gloo on CPU tensors: the CPU baseline, which lets orchestration,
    statistics, correctness checks and reports run for real without GPUs. No CUDA graphs: a timed unit is the
    N-call sequence run eagerly."""

    name = BASELINE_CPU
    label = "torch.distributed.all_reduce over gloo (CPU)"
    kind = KIND_BASELINE
    device = "cpu"
    min_world_size = 1
    group = "gloo"


class NotRunnableProbe(Probe):
    """A backend this suite knows and reports, with the modules it needs. When they are all importable the
    probe still reports skipped: no measurement is invented."""

    def __init__(self, name: str, label: str, requires: tuple[str, ...], note: str, min_world_size: int = 2):
        self.name, self.label, self.requires, self.note, self.min_world_size = (
            name, label, requires, note, min_world_size)
        self.group = name

    def skip_reason(self, world_size: int, gpus: int) -> str | None:
        reason = super().skip_reason(world_size, gpus)
        if reason:
            return reason
        return f"installed, but this suite has no runtime runner for it yet ({self.note})"


def registry() -> dict[str, Probe]:
    """Every runtime row by name, the baseline first; the report's order within each kind. ``torch-gloo`` is
    the CPU baseline (``--device cpu``); every other row is a GPU row."""
    probes: list[Probe] = [
        NcclDefaultProbe(),
        TorchDistributedNcclProbe(),
        SymmMemProbe("one_shot"),
        SymmMemProbe("two_shot"),
        NotRunnableProbe("sglang-custom-allreduce", "SGLang CustomAllreduce (sgl_kernel)", ("sglang", "sgl_kernel"),
                         "sglang.srt.distributed.device_communicators.custom_all_reduce"),
        FlashInferFusionProbe(),
        FlashInferPcieIpcProbe(),
        NotRunnableProbe("ep-flashinfer-a2a", "EP over FlashInfer all-to-all", ("flashinfer",),
                         "flashinfer.comm MNNVL all-to-all"),
        NotRunnableProbe("mscclpp", "MSCCL++ allreduce", ("mscclpp",), "mscclpp"),
        NotRunnableProbe("b12x", "b12x PCIe allreduce (b12x.comm.pcie)", ("b12x",),
                         "b12x.comm.pcie, CuTe DSL kernels; b12x 1.5.1 needs torch>=2.12 and nvidia-cutlass-dsl 4.8"),
        NcclSettingProbe("nccl-ring", "NCCL_ALGO=Ring on its own communicator"),
        NcclSettingProbe("nccl-tree", "NCCL_ALGO=Tree (the form users export) on its own communicator"),
        NcclSettingProbe("nccl-allreduce-tree", "NCCL_ALGO=allreduce:tree on its own communicator"),
        NcclSettingProbe("nccl-graph-mixing-off", "NCCL_GRAPH_MIXING_SUPPORT=0 (process-wide; process groups "
                                                  "alternated with the baseline's)"),
        GlooProbe(),
    ]
    return {p.name: p for p in probes}


GROUP_LEADS = {"nccl": NcclDefaultProbe, "torch-symm-mem": SymmMemGroup, "gloo": GlooProbe,
               "flashinfer-allreduce-fusion": FlashInferFusionProbe,
               PCIE_IPC: FlashInferPcieIpcProbe}


def group_lead(group: str) -> Probe:
    """The probe that runs process group ``group`` in each rank."""
    if group in GROUP_LEADS:
        return GROUP_LEADS[group]()
    reg = registry()
    if group in reg and isinstance(reg[group], NcclSettingProbe):
        return reg[group]
    raise KeyError(f"no process group {group!r}")


def group_ref(group: str) -> str:
    """``module:attr`` reference a worker imports for a group (see :func:`__getattr__`)."""
    return f"{__name__}:group_{group.replace('-', '_')}"


def probe_ref(name: str) -> str:
    return group_ref(registry()[name].group)


def by_name(name: str) -> Probe:
    return registry()[name]


def __getattr__(attr: str):
    # workers import groups as "stackprobe.runtime.probes:group_<name>"
    if attr.startswith("group_"):
        want = attr[len("group_"):]
        names = set(GROUP_LEADS) | {n for n, p in registry().items() if isinstance(p, NcclSettingProbe)}
        for name in names:
            if name.replace("-", "_") == want:
                return group_lead(name)
    raise AttributeError(attr)
