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

``tests/test_health.py`` checks that the table names exactly the backends the probe modules answer for. The facts
are the path records' (:class:`stackprobe.paths.Needs`, ``PathRecord.needs``): this module reads them and keeps no
copy (``tests/test_path_records.py``).
"""
from __future__ import annotations

from .. import paths as P
from ..paths import FLASHINFER, PATHS, SGL_KERNEL, TORCH, records
from ..paths import Needs as Need

__all__ = ["FLASHINFER", "NEEDS", "Need", "SGL_KERNEL", "TORCH", "need"]

#: the order the health stage imports and reports in (the report's warnings and imports lists follow it): kept as it
#: was before the facts moved to the records, so the reports do not change; a record not named here comes after
ORDER = (P.NCCL_RING, P.NCCL_TREE, P.FUSION, P.SGLANG_CUSTOM_AR, P.TORCH_SYMM_MEM, P.EP_A2A, P.PCIE_IPC, P.B12X,
         P.MSCCLPP)
#: backend -> what it needs to load: every path record that says (vLLM's own communicators say nothing here)
NEEDS: dict[str, Need] = {b: n for b in ORDER for n in [PATHS[b].needs] if n is not None}
NEEDS.update({r.id: n for r in records() for n in [r.needs] if n is not None and r.id not in NEEDS})


def need(backend: str) -> Need:
    """The :class:`Need` of ``backend``; raises KeyError naming the table for a backend it lacks."""
    try:
        return NEEDS[backend]
    except KeyError:
        raise KeyError(f"backend {backend!r} is not in stackprobe.probes.needs.NEEDS: add what it needs to load") from None
