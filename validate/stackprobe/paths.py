"""One record per communication path: what it needs of the box, and per engine how a user switches it on and off
(stdlib only).

The host stage (:mod:`stackprobe.host`) reads this table to decide which verdicts a P2P risk on the box touches, and
what to tell a user to switch off now. Every backend name a probe module answers for (their ``BACKENDS``, vLLM's
included) has a record; ``tests/test_host.py`` checks that, so a new path cannot be added without saying whether it
maps a peer GPU's memory.

A :class:`PathRecord` holds

* ``id`` / ``title``: the backend name in reports, and how a person names it;
* ``peer_memory``: the path maps a peer GPU's memory (CUDA IPC handles, ``cudaIpcOpenMemHandle`` or fd exchange,
  then loads/stores over PCIe or NVLink). ``"nccl"`` for NCCL's own collectives: NCCL picks P2P, SHM or NET per
  channel itself (its P2P transport is the peer-memory part);
* ``multicast``: it needs NVLink multicast (NVLS / ``multicast_ptr``), which PCIe lacks;
* ``off``: per engine, what switches it off now (a flag, or a variable to unset), for "do this now" advice.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PathRecord:
    id: str
    title: str
    peer_memory: bool | str = False
    multicast: bool = False
    off: dict = field(default_factory=dict)


NCCL = "nccl"

_RECORDS = (
    PathRecord("nccl-ring", "NCCL Ring", NCCL, off={"*": "NCCL_P2P_DISABLE=1 (NCCL then moves data over SHM, slower)"}),
    PathRecord("nccl-tree", "NCCL Tree", NCCL, off={"*": "NCCL_P2P_DISABLE=1 (NCCL then moves data over SHM, slower)"}),
    PathRecord("sglang-custom-allreduce", "SGLang custom allreduce", True,
               off={"sglang": "--disable-custom-all-reduce"}),
    PathRecord("vllm-custom-allreduce", "vLLM custom allreduce", True, off={"vllm": "--disable-custom-all-reduce"}),
    PathRecord("flashinfer-pcie-ipc-allreduce", "FlashInfer PCIe IPC allreduce", True,
               off={"sglang": "leave SGLANG_ENABLE_PCIE_IPC_ALLREDUCE unset",
                    "vllm": "leave VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC unset"}),
    PathRecord("flashinfer-allreduce-fusion", "FlashInfer allreduce fusion", True, multicast=True,
               off={"sglang": "leave out --flashinfer-allreduce-fusion-backend / --enable-flashinfer-allreduce-fusion",
                    "vllm": "leave the fusion pass off"}),
    PathRecord("flashinfer-allreduce", "FlashInfer standalone allreduce (vLLM)", True,
               off={"vllm": "leave VLLM_FLASHINFER_ALLREDUCE_BACKEND unset"}),
    PathRecord("torch-symm-mem", "torch symmetric memory", True, multicast=True,
               off={"sglang": "leave out --enable-torch-symm-mem", "vllm": "VLLM_ALLREDUCE_USE_SYMM_MEM=0"}),
    PathRecord("nccl-symm-mem", "NCCL symmetric memory", True,
               off={"sglang": "leave out --enable-symm-mem", "vllm": "leave VLLM_USE_NCCL_SYMM_MEM unset"}),
    PathRecord("ep-flashinfer-a2a", "expert parallelism over FlashInfer all-to-all", True,
               off={"sglang": "leave out --moe-a2a-backend flashinfer",
                    "vllm": "keep the default --all2all-backend allgather_reducescatter (pplx, deepep, moonep, nixl_ep "
                            "and mori map peer memory too)"}),
    PathRecord("mscclpp", "MSCCL++", True, off={"sglang": "leave out --enable-mscclpp"}),
    PathRecord("b12x", "b12x", True),
    PathRecord("quick-allreduce", "quick allreduce (ROCm)", True),
)

PATHS: dict[str, PathRecord] = {r.id: r for r in _RECORDS}


def record(backend: str) -> PathRecord | None:
    """The record of ``backend`` (a report's backend name), None for a name the table lacks (an engine-reader error
    row such as ``vllm-engine``)."""
    return PATHS.get(backend)


def maps_peer_memory(backend: str) -> bool:
    """Whether ``backend`` opens a peer GPU's memory itself (NCCL's own collectives are False here: NCCL chooses
    its transport, see :func:`is_nccl`)."""
    r = PATHS.get(backend)
    return bool(r and r.peer_memory is True)


def is_nccl(backend: str) -> bool:
    r = PATHS.get(backend)
    return bool(r and r.peer_memory == NCCL)


def switch_off(backend: str, engine: str) -> str:
    """What switches ``backend`` off now in ``engine`` ("" when the table has nothing to say)."""
    r = PATHS.get(backend)
    if r is None:
        return ""
    return r.off.get(engine) or r.off.get("*", "")
