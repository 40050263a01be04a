"""The dispatch probe's rank side on CPU (no tests here; tests/test_runtime_dispatch_probe.py runs it).

:class:`StandInDispatchProbe` is :class:`stackprobe.runtime.dispatch.SglangDispatchProbe` with SGLang's three
CUDA-only communicator classes replaced at the unit's edge, before the bring-up, in the modules
``GroupCoordinator.__init__`` imports them from (sglang 0.5.23 ``srt/distributed/parallel_state.py``):
``pynccl.PyNcclCommunicator``, ``custom_all_reduce.dispatch_custom_allreduce`` and
``pcie_ipc_ar.PcieIpcCommunicator``. SGLang's own code decides which of them to build (``use_pynccl``, the
custom-allreduce switch set from ``--disable-custom-all-reduce``, ``eligible_group`` reading
``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE``) and which one serves each call. The decode tensor is a ``meta`` tensor,
because SGLang sends every CPU tensor to gloo before asking a communicator (``if input_.is_cpu``); each stand-in
does real work instead: one gloo all_reduce of a CPU fp32 buffer of the same element count, filled as the probe
fills its input (the out-of-place ones return it, so their sum is checked), then ``COST_MS[name]`` ms of sleep.
The sleep, not the 2-core CPU's gloo latency, sets the cost: a path that costs 1 ms against a fallback that
costs 8 ms must come out faster on a loaded host too.

``STANDIN_MODE`` in the rank's environment plants a fault: ``ok``; ``hang-setup`` (the custom-allreduce
constructor never returns: a hang in the bring-up's set-up); ``sticky`` (custom allreduce ignores being switched
off); ``wrong`` (custom allreduce returns zeros).
"""
import contextlib

import torch
import torch.distributed as dist

from dispatch_standin_base import CustomAllreduceFaults, Work

from stackprobe.runtime.dispatch import SglangDispatchProbe, fill



class _Work(Work):
    def __init__(self, group, name):
        super().__init__(group, name)

    def reduce(self, x):
        buf = torch.empty(x.numel(), dtype=torch.float32)
        fill(buf, dist.get_rank(self.group))
        dist.all_reduce(buf, group=self.group)
        self.cost()
        return buf


class StandInCA(CustomAllreduceFaults, _Work):
    def __init__(self, group, device):
        super().__init__(group)


class StandInPcieIpc(_Work):
    def __init__(self, group, device, cpu_group=None):
        super().__init__(cpu_group or group, "pcie_ipc")
        self.disabled = False

    def should_pcie_ipc_ar(self, x):
        return not self.disabled

    def pcie_ipc_all_reduce(self, x):
        return self.reduce(x)


class StandInPynccl(_Work):
    def __init__(self, group, device, **kw):
        super().__init__(group, "pynccl")
        self.disabled, self.available, self.world_size = False, True, dist.get_world_size(group)

    @contextlib.contextmanager
    def change_state(self, enable=None, **kw):
        yield

    def all_reduce(self, x, *a, **k):
        self.reduce(x)

    def outplace_all_reduce(self, x, *a, **k):
        return self.reduce(x)


class StandInDispatchProbe(SglangDispatchProbe):
    def before(self, ctx) -> None:
        from sglang.srt.distributed import parallel_state as ps
        from sglang.srt.distributed.device_communicators import custom_all_reduce, pcie_ipc_ar, pynccl
        pynccl.PyNcclCommunicator = StandInPynccl
        custom_all_reduce.dispatch_custom_allreduce = lambda group, device: StandInCA
        pcie_ipc_ar.PcieIpcCommunicator = StandInPcieIpc
        # SGLang's custom ops are registered for the CUDA key (srt/utils/common.py direct_register_custom_op); its
        # eager path for plain tensors calls the Python function (srt/utils/custom_op.py _call_directly_in_eager)
        for name in ("outplace_all_reduce", "inplace_all_reduce"):
            setattr(ps, name, getattr(ps, name).__wrapped__)

    def tensor(self, tp, rows, hidden, ctx):
        return torch.empty(rows, hidden, dtype=torch.bfloat16, device="meta")
