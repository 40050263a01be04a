"""Probes for the P2P-check and NCCL-transport tests (no tests here; the workers import these).

* :class:`PeerPathProbe`: a gloo allreduce on CPU standing in for a peer-memory path, so the suite's rule "a
  peer-memory row starts only on pairs that passed the P2P check" runs for real in worker processes;
* :class:`NcclLogProbe`: the gloo baseline whose ranks first print, when ``NCCL_DEBUG`` is ``INFO``, the lines NCCL
  itself prints while connecting over shared memory (the format of NVIDIA/nccl ``src/transport/shm.cc``,
  v2.27.7-1 line 128, behind the ``src/debug.cc`` prefix ``host:pid:tid [dev] NCCL INFO``): the capture path of
  the runtime tier without an NCCL build on CPU;
* :class:`SilentProbe`: the same baseline printing nothing (the failing twin).
"""
import os
import socket

from stackprobe.runtime.probes import GlooProbe, _gloo_maker


class PeerPathProbe(GlooProbe):
    name = "fixture-peer-path"
    label = "gloo allreduce standing in for a peer-memory path"
    kind = "backend"
    group = "fixture-peer-path"

    def candidates(self, ctx, wanted):
        return [{"backend": self.name, "label": self.label, "kind": "backend", "info": {},
                 "make": _gloo_maker(ctx)}]


class NcclLogProbe(GlooProbe):
    name = "fixture-nccl-log"
    group = "fixture-nccl-log"

    def run(self, ctx):
        if os.environ.get("NCCL_DEBUG", "").upper() == "INFO":
            host, pid = socket.gethostname(), os.getpid()
            peer = (ctx.rank + 1) % ctx.world_size
            print(f"{host}:{pid}:{pid} [{ctx.rank}] NCCL INFO NCCL version 2.27.7+cuda12.9", flush=True)
            for ch in range(2):
                print(f"{host}:{pid}:{pid + 1} [{ctx.rank}] NCCL INFO Channel {ch:02d} : {ctx.rank}[{ctx.rank}] -> "
                      f"{peer}[{peer}] via SHM/direct/direct", flush=True)
            print(f"{host}:{pid}:{pid + 1} [{ctx.rank}] NCCL INFO Connected all rings, use ring PXN 0 GDR 0",
                  flush=True)
        return super().run(ctx)


class SilentProbe(GlooProbe):
    name = "fixture-nccl-silent"
    group = "fixture-nccl-silent"
