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
* ``off``: per engine, what switches it off now (a flag, or a variable to unset), for "do this now" advice;
* ``needs``: a :class:`Needs` (what it needs to load: distributions, modules imported for real, SGLang modules on
  the engine's path, whether FlashInfer JIT-compiles it with nvcc and with which ``flashinfer.jit`` generator),
  None for a path the health stage does not import (vLLM's own communicators); :mod:`stackprobe.probes.needs`
  and :mod:`stackprobe.health_jitcache` read it;
* ``library_probe``: the module whose ``BACKENDS`` answer for this id, a string (this module imports nothing above
  it): a file name under ``stackprobe.probes``, or a dotted name under ``stackprobe`` for an engine's own reader
  (``engines.vllm.engine``); :attr:`PathRecord.library_module` gives the full name; ``""`` where no probe module
  answers for it;
* ``runtime``: ``{"library": runtime rows timing the library kernel, "engine": rows timing the engine's
  communicator}`` (:mod:`stackprobe.runtime.probes` / :mod:`stackprobe.runtime.engine` names), the probe module's
  ``RUNTIME``;
* ``engines``: per engine an :class:`EnginePath`: the ``switch`` (flag or environment variable) that turns it on
  or off, the ``communicator`` (the attribute on SGLang's ``GroupCoordinator`` / vLLM's ``CudaCommunicator``
  that holds it; sources cited in :mod:`stackprobe.runtime.dispatch`) and the runtime tier's ``row`` for that
  communicator. :mod:`stackprobe.runtime.dispatch` builds its row tables from these.

``tests/test_path_records.py`` checks every table above against the records, with failing twins.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Needs:
    """What a path needs to load (the health stage's table, :data:`stackprobe.probes.needs.NEEDS`).

    ``dists``: distributions (PyPI names) whose broken install blocks it, one of a tuple enough
    (``("sglang-kernel", "sgl-kernel")``); ``modules``: ``(module, providing distributions)`` imported for real in a
    child interpreter; ``engine_modules``: SGLang modules on the engine's path; ``jit``: FlashInfer JIT-compiles the
    library path at first use, so the nvcc it would use matters (case C46); ``jit_generator``: the
    ``flashinfer.jit`` function that generates the module it loads ("" where none is named), the cached module
    :mod:`stackprobe.health_jitcache` checks (case C58)."""

    dists: tuple = ()
    modules: tuple = ()
    engine_modules: tuple = ()
    jit: bool = False
    jit_generator: str = ""


@dataclass(frozen=True)
class EnginePath:
    """How one engine serves a path: ``switch`` (the flag or environment variable that turns it on or off, "" where
    nothing does), ``communicator`` (the attribute holding it on the engine's communicator object) and ``row`` (the
    runtime tier's row name for that communicator)."""

    switch: str = ""
    communicator: str = ""
    row: str = ""


@dataclass(frozen=True)
class PathRecord:
    id: str
    title: str
    peer_memory: bool | str = False
    multicast: bool = False
    off: dict = field(default_factory=dict)
    needs: Needs | None = None
    library_probe: str = ""
    runtime: dict = field(default_factory=dict)
    engines: dict = field(default_factory=dict)

    @property
    def library_module(self) -> str:
        """The full module name of ``library_probe`` (``stackprobe.probes.nccl``, ``stackprobe.engines.vllm.engine``);
        "" when it has none."""
        if not self.library_probe:
            return ""
        return f"stackprobe.{self.library_probe}" if "." in self.library_probe else f"stackprobe.probes.{self.library_probe}"


NCCL = "nccl"

# the ids, for code that names one path
NCCL_RING = "nccl-ring"
NCCL_TREE = "nccl-tree"
SGLANG_CUSTOM_AR = "sglang-custom-allreduce"
VLLM_CUSTOM_AR = "vllm-custom-allreduce"
PCIE_IPC = "flashinfer-pcie-ipc-allreduce"
FUSION = "flashinfer-allreduce-fusion"
FI_ALLREDUCE = "flashinfer-allreduce"
TORCH_SYMM_MEM = "torch-symm-mem"
NCCL_SYMM_MEM = "nccl-symm-mem"
EP_A2A = "ep-flashinfer-a2a"
MSCCLPP = "mscclpp"
B12X = "b12x"
QUICK_AR = "quick-allreduce"

TORCH = ("torch", ("torch",))
FLASHINFER = ("flashinfer-python",)
SGL_KERNEL = ("sglang-kernel", "sgl-kernel")
_DC = "sglang.srt.distributed.device_communicators."
_FI_MODULES = (TORCH, ("flashinfer", FLASHINFER), ("flashinfer.comm", FLASHINFER))
_NCCL_NEEDS = Needs(("torch",), (TORCH, ("torch.distributed", ("torch",))), (_DC + "pynccl",))
_NCCL_RUNTIME = {"library": ("nccl-ring", "nccl-tree", "nccl-allreduce-tree"), "engine": ("sglang-pynccl",)}
_NCCL_OFF = {"*": "NCCL_P2P_DISABLE=1 (NCCL then moves data over SHM, slower)"}
_CA_OFF = "--disable-custom-all-reduce"

_RECORDS = (
    PathRecord(NCCL_RING, "NCCL Ring", NCCL, off=_NCCL_OFF, needs=_NCCL_NEEDS, library_probe="nccl",
               runtime=_NCCL_RUNTIME,
               engines={"sglang": EnginePath("", "pynccl_comm", "sglang-pynccl"),
                        "vllm": EnginePath("", "pynccl_comm", "vllm-pynccl")}),
    PathRecord(NCCL_TREE, "NCCL Tree", NCCL, off=_NCCL_OFF, needs=_NCCL_NEEDS, library_probe="nccl",
               runtime=_NCCL_RUNTIME),
    PathRecord(SGLANG_CUSTOM_AR, "SGLang custom allreduce", True,
               off={"sglang": _CA_OFF},
               needs=Needs(("torch",) + SGL_KERNEL, (TORCH, ("sgl_kernel", SGL_KERNEL)), (_DC + "custom_all_reduce",)),
               library_probe="sglang_custom_ar", runtime={"library": (), "engine": ("sglang-custom-allreduce",)},
               engines={"sglang": EnginePath(_CA_OFF, "ca_comm", "sglang-custom-allreduce")}),
    PathRecord(VLLM_CUSTOM_AR, "vLLM custom allreduce", True, off={"vllm": _CA_OFF}, library_probe="engines.vllm.engine",
               engines={"vllm": EnginePath(_CA_OFF, "ca_comm", "vllm-custom-allreduce")}),
    PathRecord(PCIE_IPC, "FlashInfer PCIe IPC allreduce", True,
               off={"sglang": "leave SGLANG_ENABLE_PCIE_IPC_ALLREDUCE unset",
                    "vllm": "leave VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC unset"},
               needs=Needs(("torch",) + FLASHINFER, _FI_MODULES, (_DC + "pcie_ipc_ar",), jit=True,
                           jit_generator="gen_pcie_ipc_comm_module"),
               library_probe="flashinfer_pcie_ipc",
               runtime={"library": (PCIE_IPC,), "engine": ("sglang-pcie-ipc",)},
               engines={"sglang": EnginePath("SGLANG_ENABLE_PCIE_IPC_ALLREDUCE", "pcie_ipc_comm", "sglang-pcie-ipc"),
                        "vllm": EnginePath("VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC", "fi_pcie_ipc_ar_comm",
                                           "vllm-flashinfer-pcie-ipc")}),
    PathRecord(FUSION, "FlashInfer allreduce fusion", True, multicast=True,
               off={"sglang": "leave out --flashinfer-allreduce-fusion-backend / --enable-flashinfer-allreduce-fusion",
                    "vllm": "leave the fusion pass off"},
               needs=Needs(("torch",) + FLASHINFER, _FI_MODULES, ("sglang.srt.layers.flashinfer_comm_fusion",),
                           jit=True, jit_generator="gen_trtllm_comm_module"),
               library_probe="flashinfer_fusion",
               runtime={"library": (FUSION,), "engine": ("sglang-flashinfer-fusion-workspace",)},
               engines={"sglang": EnginePath("--flashinfer-allreduce-fusion-backend", "flashinfer_allreduce",
                                             "sglang-flashinfer-fusion-workspace"),
                        "vllm": EnginePath("pass_config.fuse_allreduce_rms")}),
    PathRecord(FI_ALLREDUCE, "FlashInfer standalone allreduce (vLLM)", True,
               off={"vllm": "VLLM_ALLREDUCE_USE_FLASHINFER=0 (on by default, vllm/envs.py)"}, library_probe="engines.vllm.engine",
               engines={"vllm": EnginePath("VLLM_ALLREDUCE_USE_FLASHINFER", "fi_ar_comm",
                                           "vllm-flashinfer-allreduce")}),
    PathRecord(TORCH_SYMM_MEM, "torch symmetric memory", True, multicast=True,
               off={"sglang": "leave out --enable-torch-symm-mem", "vllm": "VLLM_ALLREDUCE_USE_SYMM_MEM=0"},
               needs=Needs(("torch",), (TORCH, ("torch.distributed._symmetric_memory", ("torch",))),
                           (_DC + "torch_symm_mem",)),
               library_probe="torch_symm_mem",
               runtime={"library": ("torch-symm-mem-one-shot", "torch-symm-mem-two-shot"),
                        "engine": ("sglang-torch-symm-mem",)},
               engines={"sglang": EnginePath("--enable-torch-symm-mem", "torch_symm_mem_comm", "sglang-torch-symm-mem"),
                        "vllm": EnginePath("VLLM_ALLREDUCE_USE_SYMM_MEM", "symm_mem_comm", "vllm-torch-symm-mem")}),
    PathRecord(NCCL_SYMM_MEM, "NCCL symmetric memory", True,
               off={"sglang": "leave out --enable-symm-mem", "vllm": "leave VLLM_USE_NCCL_SYMM_MEM unset"},
               library_probe="engines.vllm.engine",
               engines={"sglang": EnginePath("--enable-symm-mem"),
                        "vllm": EnginePath("VLLM_USE_NCCL_SYMM_MEM", "nccl_symm_mem", "vllm-nccl-symm-mem")}),
    PathRecord(EP_A2A, "expert parallelism over FlashInfer all-to-all", True,
               off={"sglang": "leave out --moe-a2a-backend flashinfer",
                    "vllm": "keep the default --all2all-backend allgather_reducescatter (pplx, deepep, moonep, nixl_ep "
                            "and mori map peer memory too)"},
               needs=Needs(("torch",) + FLASHINFER, _FI_MODULES, (), jit=True),
               library_probe="ep_flashinfer_a2a", runtime={"library": (), "engine": ()},
               engines={"sglang": EnginePath("--moe-a2a-backend"), "vllm": EnginePath("--all2all-backend")}),
    PathRecord(MSCCLPP, "MSCCL++", True, off={"sglang": "leave out --enable-mscclpp"},
               needs=Needs(("torch", "mscclpp"), (TORCH, ("mscclpp", ("mscclpp",))), (_DC + "pymscclpp",)),
               library_probe="mscclpp", runtime={"library": (), "engine": ("sglang-mscclpp",)},
               engines={"sglang": EnginePath("--enable-mscclpp", "pymscclpp_comm", "sglang-mscclpp")}),
    PathRecord(B12X, "b12x", True, needs=Needs(("torch", "b12x"), (TORCH, ("b12x", ("b12x",)))),
               library_probe="b12x", runtime={"library": (), "engine": ()}),
    PathRecord(QUICK_AR, "quick allreduce (ROCm)", True, library_probe="engines.vllm.engine",
               engines={"sglang": EnginePath("", "qr_comm", "sglang-quick-allreduce"),
                        "vllm": EnginePath("", "qr_comm", "vllm-quick-allreduce")}),
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


def records() -> tuple[PathRecord, ...]:
    """Every record, in the table's order."""
    return _RECORDS


def communicator_rows(engine: str) -> dict[str, str]:
    """``{communicator attribute: runtime row}`` of every path ``engine`` serves through a communicator (its
    :class:`EnginePath`), in the table's order; {} for an engine no record names."""
    out: dict[str, str] = {}
    for r in _RECORDS:
        e = r.engines.get(engine)
        if e is not None and e.communicator and e.communicator not in out:
            out[e.communicator] = e.row
    return out
