"""Static probes, one module per backend. Each module is the backend's unit and exposes

* ``BACKENDS``: the backend names it answers for;
* ``library_gate(ctx) -> list[Verdict]`` (scope "library"): does the library (FlashInfer, torch, NCCL,
  MSCCL++, sgl-kernel) admit the target: its code, tables and binaries;
* ``engine_gate(ctx) -> list[Verdict]`` (scope "engine"): will the installed SGLang enable it on the
  target host (topology, world size): every condition on its path, read from its source
  (:mod:`.sglang_engine`); ``skipped (not installed: sglang)`` without SGLang;
* ``RUNTIME``: ``{"library": runtime backends timing the library kernel (:mod:`stackprobe.runtime.probes`),
  "engine": runtime rows of SGLang's own communicator (:mod:`stackprobe.runtime.engine`)}``;
* ``probe(ctx)``: both answers, library first. :func:`probes` lists the modules in report order.

A probe reads the gate from the installed package (calls its gate code in a child interpreter or
reads its table with ``ast``), never from a copy of a version's table in this suite.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from ..archs import Arch
from ..serverconfig import NO_FLAGS, ServerConfig


@dataclass
class Context:
    """What every static probe gets.

    ``target``: the compute capability asked for (suffix ignored for coverage decisions).
    ``env``: :func:`stackprobe.env.collect` output. ``coverage``: package name -> PackageCoverage.
    ``world_size``: the tensor-parallel size the verdicts are for (GPUs per node, default 8).
    ``topology``: "pcie" | "nvlink"; ``topology_source`` says whether it was detected or assumed.
    ``jit_compile``: run compile-only JIT builds (minutes; cached by content under ``cache_dir``).
    ``server_config``: the engine flags and variables the verdicts are for (:data:`NO_FLAGS`: change nothing).
    ``engine_configs``: per engine name, the flags as that engine checked them (``--engine vllm``); absent: ``server_config``.
    """

    target: Arch
    env: dict
    coverage: dict
    world_size: int = 8
    topology: str = "pcie"
    topology_source: str = "assumed"
    jit_compile: bool = False
    cache_dir: Path = field(default_factory=lambda: Path(os.environ.get("STACKPROBE_CACHE", Path.home() / ".cache" / "stackprobe")))
    timeout: float = 180.0
    server_config: ServerConfig = NO_FLAGS
    engine_configs: dict = field(default_factory=dict)   # engine name -> its ServerConfig (stackprobe.engines)


def _load():
    from . import (b12x, ep_flashinfer_a2a, flashinfer_fusion, flashinfer_pcie_ipc, mscclpp, nccl, sglang_custom_ar,
                   torch_symm_mem)
    return [nccl, flashinfer_fusion, sglang_custom_ar, torch_symm_mem, ep_flashinfer_a2a, flashinfer_pcie_ipc, b12x,
            mscclpp]


def probes():
    """The probe modules in report order."""
    return _load()
