"""What each backend needs to load, next to the probe modules' ``BACKENDS`` names: the one table the
environment health stage (:mod:`stackprobe.health`) reads to decide, before any gate is read, which backends a
broken install blocks.

Each :class:`Need` lists

* ``dists``: the distributions (PyPI names) whose broken install blocks the backend; one of a tuple is enough
  (``("sglang-kernel", "sgl-kernel")``: either spelling); a distribution that is not installed is the probes'
  "not installed" answer, not a broken install;
* ``modules``: (module, providing distributions) imported for real, in a child interpreter, for the library
  answer (only where a providing distribution is installed);
* ``engine_modules``: SGLang modules on the engine's path (imported only where sglang is installed);
* ``jit``: the library path is a module FlashInfer JIT-compiles at first use (so the nvcc it would use matters,
  case C46).

``tests/test_health.py`` checks that the table names exactly the backends the probe modules answer for.
"""
from __future__ import annotations

from dataclasses import dataclass

TORCH = ("torch", ("torch",))
FLASHINFER = ("flashinfer-python",)
SGL_KERNEL = ("sglang-kernel", "sgl-kernel")
_DC = "sglang.srt.distributed.device_communicators."


@dataclass(frozen=True)
class Need:
    dists: tuple = ()
    modules: tuple = ()
    engine_modules: tuple = ()
    jit: bool = False


_FI_MODULES = (TORCH, ("flashinfer", FLASHINFER), ("flashinfer.comm", FLASHINFER))

NEEDS: dict[str, Need] = {
    "nccl-ring": Need(("torch",), (TORCH, ("torch.distributed", ("torch",))), (_DC + "pynccl",)),
    "nccl-tree": Need(("torch",), (TORCH, ("torch.distributed", ("torch",))), (_DC + "pynccl",)),
    "flashinfer-allreduce-fusion": Need(("torch",) + FLASHINFER, _FI_MODULES, ("sglang.srt.layers.flashinfer_comm_fusion",),
                                        jit=True),
    "sglang-custom-allreduce": Need(("torch",) + SGL_KERNEL, (TORCH, ("sgl_kernel", SGL_KERNEL)),
                                    (_DC + "custom_all_reduce",)),
    "torch-symm-mem": Need(("torch",), (TORCH, ("torch.distributed._symmetric_memory", ("torch",))),
                           (_DC + "torch_symm_mem",)),
    "ep-flashinfer-a2a": Need(("torch",) + FLASHINFER, _FI_MODULES, (), jit=True),
    "flashinfer-pcie-ipc-allreduce": Need(("torch",) + FLASHINFER, _FI_MODULES, (_DC + "pcie_ipc_ar",), jit=True),
    "b12x": Need(("torch", "b12x"), (TORCH, ("b12x", ("b12x",)))),
    "mscclpp": Need(("torch", "mscclpp"), (TORCH, ("mscclpp", ("mscclpp",))), (_DC + "pymscclpp",)),
}


def need(backend: str) -> Need:
    """The :class:`Need` of ``backend``; raises KeyError naming the table for a backend it lacks."""
    try:
        return NEEDS[backend]
    except KeyError:
        raise KeyError(f"backend {backend!r} is not in stackprobe.probes.needs.NEEDS: add what it needs to load") from None
