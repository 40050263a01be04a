"""A CPU stand-in for the engine runner (no tests here; the workers import it): :class:`CpuEngineProbe` keeps
:class:`stackprobe.runtime.engine.SglangEngineProbe`'s run (build every communicator, vote, one paired
``Harness.sweep`` with ``sglang-pynccl`` as the baseline) and replaces SGLang's communicators with gloo ops that
behave in known ways:

* ``sglang-pynccl``: a real gloo allreduce in place (the baseline);
* ``sglang-custom-allreduce``: enabled, a real gloo allreduce out of place that writes its output on the first
  call only (stale afterwards): must come out ``wrong-result``;
* ``sglang-torch-symm-mem``: enabled on rank 0, disabled on rank 1 with SGLang's multicast message: the vote must
  keep it out of the sweep on every rank (else rank 0 would wait in a collective alone);
* ``sglang-mscclpp``: enabled, a correct gloo allreduce out of place: measured, with an interval;
* ``sglang-pcie-ipc``: its build raises;
* ``sglang-flashinfer-fusion-workspace``: enabled, with no timing op.
"""
from stackprobe.runtime.bench import Op
from stackprobe.runtime.engine import COMMUNICATORS, SglangEngineProbe, _row


class CpuEngineProbe(SglangEngineProbe):
    name = "fixture-engine-cpu"
    label = "the engine runner's sweep and vote on gloo stand-ins"
    requires = ("torch",)
    device = "cpu"

    def setup(self, ctx):
        import torch
        import torch.distributed as dist
        self.torch = torch
        self.cpu_group = dist.group.WORLD
        self.device = torch.device("cpu")
        self.dtype = getattr(torch, ctx.config.dtype)

    def builders(self):
        return list(zip(COMMUNICATORS, (self._fake_pynccl, self._fake_stale, self._fake_split_vote,
                                        self._fake_correct, self._fake_raises, self._fake_untimed)))

    def _enabled(self, name):
        row = _row(name, "gloo stand-in")
        row["info"].update(constructed=True, enabled=True)
        return row

    def _gloo(self, nbytes, in_place, stale_after_first=False):
        import torch.distributed as dist
        buf = self._buffers(nbytes)
        out = buf if in_place else self.torch.empty_like(buf)
        state = {"calls": 0}

        def run():
            state["calls"] += 1
            if stale_after_first and state["calls"] > 1:
                return
            if in_place:
                dist.all_reduce(buf)
            else:
                tmp = buf.clone()
                dist.all_reduce(tmp)
                out.copy_(tmp)
        return Op(buf, out, run, in_place=in_place, graphable=False)

    def _fake_pynccl(self):
        row = self._enabled("sglang-pynccl")
        self._enable_timing(row["backend"], lambda n: self._gloo(n, True))
        return row

    def _fake_stale(self):
        row = self._enabled("sglang-custom-allreduce")
        self._enable_timing(row["backend"], lambda n: self._gloo(n, False, stale_after_first=True))
        return row

    def _fake_split_vote(self):
        row = self._enabled("sglang-torch-symm-mem")
        if self.ctx.rank == 0:
            self._enable_timing(row["backend"], lambda n: self._gloo(n, False))
        else:
            row["info"].update(enabled=False, why="WARNING sglang...torch_symm_mem: TorchSymmMemCommunicator: "
                                                  "torch symmetric memory multicast operations are not supported.")
        return row

    def _fake_correct(self):
        row = self._enabled("sglang-mscclpp")
        self._enable_timing(row["backend"], lambda n: self._gloo(n, False))
        return row

    def _fake_raises(self):
        raise RuntimeError("planted build failure")

    def _fake_untimed(self):
        return self._enabled("sglang-flashinfer-fusion-workspace")


class CpuP2pGateProbe(CpuEngineProbe):
    """The engine runner's own builders for the two peer-memory paths (custom allreduce, PCIe IPC) beside a
    gloo baseline: with the P2P report the parent hands over (spec ``p2p``) saying off, both must be skipped
    before SGLang is imported."""
    name = "fixture-engine-p2p-gate"

    def builders(self):
        return [("sglang-pynccl", self._fake_pynccl), ("sglang-custom-allreduce", self._custom_ar),
                ("sglang-pcie-ipc", self._pcie_ipc)]
