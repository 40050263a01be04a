"""Runtime probes: one class per backend family; each instance runs inside every rank of its process group.

A probe has

* ``name`` (the backend name in reports), ``label`` (what is measured, in words);
* ``env``: variables its process group needs set before anything starts (``NCCL_ALGO`` must be set before
  the communicator is created, so every NCCL setting is its own process group);
* ``skip_reason(world_size, gpus)``: asked in the parent before any process starts; a string means skipped
  (library not installed, too few GPUs), ``None`` means run;
* ``run(ctx) -> list[dict]``: one dict per backend measured, ``{"backend", "label", "sweep": [...],
  "checks": {...}, "info": {...}, "failure": {"kind", "message"} | None}`` (sweep records from
  :class:`~stackprobe.runtime.bench.Harness`).

Backends whose libraries are absent (SGLang custom allreduce, FlashInfer, MSCCL++, b12x) are registered with
the modules they need, so the report says why they were skipped; those without a runner yet say so.
"""
from __future__ import annotations

import importlib.util
import os
import traceback

from .bench import Harness, Op, short_error

VERDICT_SETTING = "setting"
VERDICT_GRAPH = "cuda-graph"
VERDICT_ERROR = "error"


def _module_missing(names: tuple[str, ...]) -> str | None:
    for name in names:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except (ImportError, ValueError):
            return name
    return None


class Probe:
    name = ""
    label = ""
    requires: tuple[str, ...] = ("torch",)
    device = "cuda"
    env: dict[str, str] = {}
    min_world_size = 1
    backends: tuple[str, ...] = ()

    def skip_reason(self, world_size: int, gpus: int) -> str | None:
        missing = _module_missing(self.requires)
        if missing:
            return f"not installed: Python module '{missing}' is not importable"
        if self.device == "cuda" and gpus < world_size:
            return f"needs {world_size} GPUs, {gpus} present"
        if world_size < self.min_world_size:
            return f"needs world size >= {self.min_world_size}"
        return None

    def backend_names(self) -> tuple[str, ...]:
        return self.backends or (self.name,)

    def run(self, ctx) -> list[dict]:  # pragma: no cover - abstract
        raise NotImplementedError


def _bytes_to_numel(nbytes: int, dtype) -> int:
    import torch
    item = torch.empty((), dtype=dtype).element_size()
    if nbytes % item:
        raise ValueError(f"message size {nbytes} B is not a multiple of the element size {item} B")
    return nbytes // item


class NcclDirectProbe(Probe):
    """NCCL allreduce called directly (ctypes ``ncclAllReduce`` on the current stream), as SGLang's pynccl does
    inside its CUDA graphs, with the algorithm forced by ``NCCL_ALGO``; optionally the same allreduce through
    ``torch.distributed`` (ProcessGroupNCCL) beside it. With ``collectives`` it also captures all_gather and
    reduce_scatter in CUDA graphs, as a serving step does (case C12)."""

    def __init__(self, name: str, algo: str, label: str, torch_distributed: bool = False,
                 collectives: bool = False, extra_env: dict[str, str] | None = None):
        self.name, self.label = name, label
        self.env = {"NCCL_ALGO": algo, **(extra_env or {})}
        self.torch_distributed = torch_distributed
        self.collectives = collectives
        self.backends = (name, f"torch-distributed-{name}") if torch_distributed else (name,)

    def run(self, ctx) -> list[dict]:
        import torch
        import torch.distributed as dist

        from .ncclbind import NcclComm, NcclLibrary

        lib = NcclLibrary()
        uid = ctx.share_bytes(f"{self.name}/nccl-unique-id", lib.unique_id)
        comm = NcclComm(lib, uid, ctx.rank, ctx.world_size)
        info = {"libnccl": lib.path, "nccl_version": ".".join(map(str, lib.version)),
                "NCCL_ALGO": os.environ.get("NCCL_ALGO", ""), "call": "ncclAllReduce on the current stream (ctypes)"}
        ctx.log(f"NCCL {info['nccl_version']} from {lib.path}")
        dtype = getattr(torch, ctx.config.dtype)
        h = Harness(ctx, ctx.config)

        def make_op(nbytes):
            n = _bytes_to_numel(nbytes, dtype)
            inp = torch.empty(n, dtype=dtype, device=ctx.device)
            out = torch.empty_like(inp)
            return Op(inp, out, lambda: comm.all_reduce(inp, out))

        results = [{"backend": self.name, "label": self.label, "info": info,
                    "sweep": h.sweep(make_op, self.name), "checks": {}, "failure": None}]
        if self.torch_distributed:
            pg = dist.new_group(backend="nccl")

            def make_td(nbytes):
                n = _bytes_to_numel(nbytes, dtype)
                buf = torch.empty(n, dtype=dtype, device=ctx.device)
                return Op(buf, buf, lambda: dist.all_reduce(buf, group=pg), in_place=True)

            results.append({"backend": f"torch-distributed-{self.name}",
                            "label": f"torch.distributed.all_reduce (ProcessGroupNCCL), NCCL_ALGO={self.env['NCCL_ALGO']}",
                            "info": {"NCCL_ALGO": os.environ.get("NCCL_ALGO", ""), "call": "torch.distributed.all_reduce"},
                            "sweep": h.sweep(make_td, f"torch-distributed-{self.name}"), "checks": {},
                            "failure": None})
        if self.collectives:
            checks = self.check_collectives(ctx, comm, dtype)
            results[0]["checks"] = checks
            results[0]["failure"] = collective_failure(checks, self.env["NCCL_ALGO"])
        if not results[0]["failure"]:
            comm.destroy()  # after a failed collective the process exit releases the communicator
        return results

    def check_collectives(self, ctx, comm, dtype) -> dict:
        """all_reduce, all_gather and reduce_scatter at the decode size: one eager call, then
        ``graph_calls`` calls captured in one CUDA graph and replayed, each result checked."""
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
                res.zero_()
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
                res.zero_()
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
            ctx.log(f"{coll} under NCCL_ALGO={os.environ.get('NCCL_ALGO', '')}: {rec}")
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
            kinds.add(VERDICT_SETTING if ("InvalidUsage" in err or "NCCL_ALGO" in err) else VERDICT_ERROR)
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
    (``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``), so only P2P algorithms are used."""

    requires = ("torch", "torch.distributed._symmetric_memory")

    def __init__(self, variant: str):
        self.variant = variant
        self.name = f"torch-symm-mem-{variant.replace('_', '-')}"
        self.label = ("torch.ops.symm_mem.one_shot_all_reduce_out" if variant == "one_shot"
                      else "torch.ops.symm_mem.two_shot_all_reduce_ (in place)")

    def run(self, ctx) -> list[dict]:
        import torch
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        info = {"variant": self.variant}
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
        buf = symm_mem.empty(max_numel, dtype=dtype, device=ctx.device)
        symm_mem.rendezvous(buf, gname)
        ops = torch.ops.symm_mem
        h = Harness(ctx, ctx.config)

        def make_op(nbytes):
            n = _bytes_to_numel(nbytes, dtype)
            view = buf[:n]
            if self.variant == "one_shot":
                out = torch.empty(n, dtype=dtype, device=ctx.device)
                if hasattr(ops, "one_shot_all_reduce_out"):
                    return Op(view, out, lambda: ops.one_shot_all_reduce_out(view, "sum", gname, out))
                holder = {}

                def run():
                    holder["out"] = ops.one_shot_all_reduce(view, "sum", gname)
                return Op(view, None, run, out_fn=lambda: holder["out"])
            return Op(view, view, lambda: ops.two_shot_all_reduce_(view, "sum", gname), in_place=True)

        return [{"backend": self.name, "label": self.label, "info": info, "sweep": h.sweep(make_op, self.name),
                 "checks": {}, "failure": None}]


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

    name = "flashinfer-pcie-ipc-allreduce"
    label = "FlashInfer PcieIpcAllReduceWorkspace.all_reduce (CUDA IPC, out of place)"
    requires = ("torch", "flashinfer")
    min_world_size = 2

    def run(self, ctx) -> list[dict]:
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

        try:
            sweep = Harness(ctx, ctx.config).sweep(make_op, self.name)
        finally:
            for ws in workspaces:   # collective, in the same order on every rank
                try:
                    ws.destroy()
                except Exception as exc:  # noqa: BLE001 - reported; the process exit frees the rest
                    info["destroy_error"] = short_error(exc)
                    ctx.log(f"{self.name}: workspace teardown failed: {info['destroy_error']}")
                    break
        return [{"backend": self.name, "label": self.label, "info": info, "sweep": sweep, "checks": {},
                 "failure": None}]


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

    def run(self, ctx) -> list[dict]:
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

        try:
            sweep = Harness(ctx, ctx.config).sweep(make_op, self.name)
        finally:
            try:
                ws.destroy()
            except Exception as exc:  # noqa: BLE001 - reported; the process exit frees it
                info["destroy_error"] = short_error(exc)
        return [{"backend": self.name, "label": self.label, "info": info, "sweep": sweep, "checks": {},
                 "failure": None}]


class GlooProbe(Probe):
    """``torch.distributed.all_reduce`` over gloo on CPU tensors (float32): the CPU-only path that lets the
    orchestration, reports and plots run for real without GPUs. No CUDA graphs."""

    name = "torch-gloo"
    label = "torch.distributed.all_reduce over gloo (CPU, float32)"
    device = "cpu"

    def run(self, ctx) -> list[dict]:
        import torch
        import torch.distributed as dist
        dtype = getattr(torch, ctx.config.dtype)
        h = Harness(ctx, ctx.config)

        def make_op(nbytes):
            buf = torch.empty(_bytes_to_numel(nbytes, dtype), dtype=dtype)
            return Op(buf, buf, lambda: dist.all_reduce(buf), in_place=True, graphable=False)

        return [{"backend": self.name, "label": self.label, "info": {}, "sweep": h.sweep(make_op, self.name),
                 "checks": {}, "failure": None}]


class NotRunnableProbe(Probe):
    """A backend this suite knows and reports, with the modules it needs. When they are all importable the
    probe still reports skipped with ``runner_missing``: no measurement is invented."""

    def __init__(self, name: str, label: str, requires: tuple[str, ...], note: str, min_world_size: int = 1):
        self.name, self.label, self.requires, self.note, self.min_world_size = (
            name, label, requires, note, min_world_size)

    def skip_reason(self, world_size: int, gpus: int) -> str | None:
        reason = super().skip_reason(world_size, gpus)
        if reason:
            return reason
        return f"installed, but this suite has no runtime runner for it yet ({self.note})"


def registry() -> dict[str, Probe]:
    """Every runtime probe by name, the baseline first. Order is the report's order. ``torch-gloo`` is the
    CPU path (``--device cpu``); every other probe is a GPU probe."""
    probes: list[Probe] = [
        NcclDirectProbe("nccl-ring", "Ring", "NCCL Ring, ncclAllReduce called directly on the current stream",
                        torch_distributed=True),
        NcclDirectProbe("nccl-tree", "Tree", "NCCL_ALGO=Tree process-wide (as users set it)", collectives=True),
        NcclDirectProbe("nccl-allreduce-tree", "allreduce:tree",
                        "NCCL_ALGO=allreduce:tree (per-collective form)", collectives=True),
        # NCCL's support for mixing captured and uncaptured NCCL work (NCCL_GRAPH_MIXING_SUPPORT, default 1 since
        # NCCL 2.13) costs time per captured call; measured here, turning it off took 42 KB Ring from ~16 to ~6 us
        NcclDirectProbe("nccl-ring-graph-mixing-off", "Ring",
                        "NCCL Ring, direct, NCCL_GRAPH_MIXING_SUPPORT=0 (no captured/uncaptured NCCL mixing)",
                        extra_env={"NCCL_GRAPH_MIXING_SUPPORT": "0"}),
        SymmMemProbe("one_shot"),
        SymmMemProbe("two_shot"),
        NotRunnableProbe("sglang-custom-allreduce", "SGLang CustomAllreduce (sgl_kernel)", ("sglang", "sgl_kernel"),
                         "sglang.srt.distributed.device_communicators.custom_all_reduce", min_world_size=2),
        FlashInferFusionProbe(),
        FlashInferPcieIpcProbe(),
        NotRunnableProbe("ep-flashinfer-a2a", "EP over FlashInfer all-to-all", ("flashinfer",),
                         "flashinfer.comm MNNVL all-to-all", min_world_size=2),
        NotRunnableProbe("mscclpp", "MSCCL++ allreduce", ("mscclpp",), "mscclpp", min_world_size=2),
        NotRunnableProbe("b12x", "b12x PCIe allreduce (b12x.comm.pcie)", ("b12x",),
                         "b12x.comm.pcie, CuTe DSL kernels; b12x 1.5.1 needs torch>=2.12 and nvidia-cutlass-dsl 4.8",
                         min_world_size=2),
        GlooProbe(),
    ]
    return {p.name: p for p in probes}


def probe_ref(name: str) -> str:
    """``module:attr`` reference a worker can import for a registered probe (see :func:`by_name`)."""
    return f"{__name__}:by_name_{name.replace('-', '_')}"


def by_name(name: str) -> Probe:
    return registry()[name]


def __getattr__(attr: str):
    # workers import probes as "stackprobe.runtime.probes:by_name_<name>"
    if attr.startswith("by_name_"):
        want = attr[len("by_name_"):]
        for name, p in registry().items():
            if name.replace("-", "_") == want:
                return p
    raise AttributeError(attr)


def format_exc_tail(limit: int = 3000) -> str:
    return traceback.format_exc()[-limit:]
