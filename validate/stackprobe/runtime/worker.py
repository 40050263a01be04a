"""One rank of one probe: ``python -m stackprobe.runtime.worker SPEC.json RANK``.

Started by :mod:`stackprobe.runtime.orchestrate`, one process per GPU, all ranks of a probe in one process
group. The spec (JSON) holds: ``probe`` (``module:attr``), ``world_size``, ``store`` (a FileStore path shared by
the ranks), ``device`` (``cuda`` or ``cpu``), ``config`` (:class:`~stackprobe.runtime.bench.BenchConfig` fields),
``result_dir``, ``backends`` (the rows wanted from the group). Rank ``r`` writes ``result_dir/rank{r}.json``
atomically: ``{"rank", "env", "baseline", "sweep", "backends": [...]}``.

A rank never outlives the suite: it asks the kernel for SIGKILL when its parent dies (``PR_SET_PDEATHSIG``,
set again here in case the parent died before the orchestrator's pre-exec hook ran) and exits at once when its
parent is already gone (``STACKPROBE_PARENT_PID`` differs from ``getppid()``).
An exception escapes (non-zero exit, traceback in the log): the orchestrator reports it as a crash with the
log's last lines.
"""
from __future__ import annotations

import importlib
import json
import os
import platform
import sys
import time

from .children import set_parent_death_signal


class RankContext:
    """What a probe sees: ``rank``, ``world_size``, ``device`` (``cuda:N`` or ``cpu``), ``store`` (a
    ``torch.distributed.Store``), ``config`` (BenchConfig), ``barrier()`` (over a gloo group), ``log(msg)``."""

    def __init__(self, rank: int, world_size: int, device: str, store, config, spec: dict):
        self.rank, self.world_size, self.device, self.store, self.config, self.spec = (
            rank, world_size, device, store, config, spec)
        self.t0 = time.perf_counter()

    def barrier(self) -> None:
        import torch.distributed as dist
        if self.world_size > 1:
            dist.barrier()

    def log(self, msg: str) -> None:
        print(f"[rank {self.rank} +{time.perf_counter() - self.t0:6.1f}s] {msg}", flush=True)

    def share_bytes(self, key: str, make) -> bytes:
        """Rank 0 calls ``make()`` and publishes the bytes under ``key``; every rank returns them."""
        if self.rank == 0:
            value = make()
            self.store.set(key, value)
            return value
        return bytes(self.store.get(key))


def env_info(device: str) -> dict:
    """Software and hardware facts of this rank: versions, GPU name, compute capability, NCCL version."""
    import torch
    info = {"python": platform.python_version(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "hostname": platform.node(),
            "env": {k: v for k, v in os.environ.items()
                    if k.startswith(("NCCL_", "TORCH_SYMM", "NVSHMEM_", "CUDA_VISIBLE"))}}
    if device.startswith("cuda"):
        idx = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(idx)
        info.update({"gpu_name": props.name, "compute_capability": f"{props.major}.{props.minor}",
                     "gpu_count": torch.cuda.device_count(),
                     "gpu_memory_gib": round(props.total_memory / 2**30, 1)})
        try:
            v = torch.cuda.nccl.version()
            info["torch_nccl_version"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as exc:  # torch without NCCL
            info["torch_nccl_version"] = f"unavailable: {exc}"
    return info


def orphaned() -> bool:
    want = os.environ.get("STACKPROBE_PARENT_PID")
    return bool(want) and os.getppid() != int(want)


def load_probe(ref: str):
    module, _, attr = ref.partition(":")
    obj = getattr(importlib.import_module(module), attr)
    return obj() if isinstance(obj, type) else obj


def main(argv: list[str] | None = None) -> int:
    import signal
    argv = sys.argv[1:] if argv is None else argv
    set_parent_death_signal(signal.SIGKILL)
    if orphaned():
        return 70
    spec_path, rank = argv[0], int(argv[1])
    with open(spec_path) as f:
        spec = json.load(f)
    world_size = spec["world_size"]
    import torch
    import torch.distributed as dist

    from ..atomic import write_atomic
    from .bench import BenchConfig

    device = spec["device"]
    if device == "cuda":
        local = rank % max(torch.cuda.device_count(), 1)
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    store = dist.FileStore(spec["store"], world_size)
    dist.init_process_group(backend="gloo", store=store, rank=rank, world_size=world_size)
    ctx = RankContext(rank, world_size, device, store, BenchConfig(**spec["config"]), spec)
    probe = load_probe(spec["probe"])
    ctx.log(f"probe {spec['probe']} world size {world_size} on {device} "
            f"(NCCL_ALGO={os.environ.get('NCCL_ALGO', '')!r})")
    result = {"rank": rank, "env": env_info(device), **probe.run(ctx)}
    out = os.path.join(spec["result_dir"], f"rank{rank}.json")
    write_atomic(out, json.dumps(result, default=str))
    ctx.log("done")
    try:
        ctx.barrier()
        dist.destroy_process_group()
    except Exception:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
