"""The vLLM dispatch probe's rank side on CPU (no tests here; tests/test_runtime_vllm_dispatch.py runs it).

:class:`StandInVllmDispatchProbe` is :class:`stackprobe.runtime.vllm_state.VllmDispatchProbe` with, at the unit's
edge and before the bring-up:

* the platform: vLLM on a host without a GPU resolves ``UnspecifiedPlatform``, whose config post-init cannot infer a
  device and whose TP group gets the base ``DeviceCommunicatorBase``. The stand-in is vLLM's own ``CpuPlatform``
  answering the two questions ``CudaPlatform`` answers for the TP group (``vllm/platforms/cuda.py``):
  ``use_custom_allreduce()`` True and ``get_device_communicator_cls()`` vLLM's ``CudaCommunicator``. Everything
  else (``is_cuda()`` False, so torch symmetric memory is not built; no custom-op collectives) stays the CPU's;
* vLLM's three CUDA-only communicator classes, in the modules ``CudaCommunicator.__init__`` imports them from (vllm
  0.33.0 ``vllm/distributed/device_communicators/``): ``pynccl.PyNcclCommunicator``,
  ``custom_all_reduce.CustomAllreduce`` and ``flashinfer_pcie_ipc_all_reduce.FlashInferPcieIpcAllReduce``.

vLLM's own code decides which of them to build (``set_custom_all_reduce`` from ``--disable-custom-all-reduce``,
``VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC`` read by ``vllm.envs``) and which one serves each call
(``CudaCommunicator.all_reduce``). Each stand-in does real work on the real CPU input: a gloo all_reduce of an fp32
copy, returned as a new tensor of the input's dtype (so the probe's sum check reads a real sum), then
``COST_MS[name]`` ms of sleep, which sets the cost on a loaded 2-core host.

``STANDIN_MODE`` in the rank's environment plants a fault: ``ok``; ``hang-setup`` (the custom-allreduce constructor
never returns); ``sticky`` (custom allreduce ignores being switched off); ``wrong`` (custom allreduce returns
zeros).
"""
import contextlib
import os
import time

import torch
import torch.distributed as dist

from stackprobe.runtime.vllm_state import VllmDispatchProbe

COST_MS = {"ca": 1.0, "pcie_ipc": 3.0, "pynccl": 8.0}
CUDA_COMM = "vllm.distributed.device_communicators.cuda_communicator.CudaCommunicator"


def _mode() -> str:
    return os.environ.get("STANDIN_MODE", "ok")


class _Work:
    def __init__(self, group, name):
        self.group, self.name = group, name
        self.world_size = dist.get_world_size(group)

    def reduce(self, x):
        buf = x.detach().float().clone()
        dist.all_reduce(buf, group=self.group)
        time.sleep(COST_MS[self.name] / 1000)
        return buf.to(x.dtype)


class StandInCA(_Work):
    def __init__(self, group, device, symm_mem_enabled=False, register_graph_buffers=True, **kw):
        super().__init__(group, "ca")
        if _mode() == "hang-setup":
            time.sleep(3600)
        self._disabled = False

    @property
    def disabled(self):
        return self._disabled

    @disabled.setter
    def disabled(self, value):
        if _mode() != "sticky":
            self._disabled = value

    def should_custom_ar(self, x):
        return not self.disabled

    def custom_all_reduce(self, x):
        out = self.reduce(x)
        return torch.zeros_like(out) if _mode() == "wrong" else out

    @contextlib.contextmanager
    def capture(self):
        yield


class StandInPcieIpc(_Work):
    def __init__(self, group, tune_group=None, device=None, **kw):
        super().__init__(tune_group if tune_group is not None else group, "pcie_ipc")
        self.disabled = False

    def should_use(self, x):
        return not self.disabled

    def all_reduce(self, x):
        return self.reduce(x)

    @contextlib.contextmanager
    def capture(self):
        yield


class StandInPynccl(_Work):
    def __init__(self, group, device, **kw):
        super().__init__(group, "pynccl")
        self.disabled, self.available = False, True

    def all_reduce(self, x, out_tensor=None, **k):
        return self.reduce(x)


def _platform():
    from vllm.platforms.cpu import CpuPlatform

    class CudaAnswersOnCpu(CpuPlatform):
        @classmethod
        def use_custom_allreduce(cls) -> bool:
            return True

        @classmethod
        def get_device_communicator_cls(cls) -> str:
            return CUDA_COMM
    return CudaAnswersOnCpu()


class StandInVllmDispatchProbe(VllmDispatchProbe):
    def before(self, ctx) -> None:
        import vllm.platforms as platforms
        platforms._current_platform = _platform()
        from vllm.distributed.device_communicators import custom_all_reduce, flashinfer_pcie_ipc_all_reduce, pynccl
        pynccl.PyNcclCommunicator = StandInPynccl
        custom_all_reduce.CustomAllreduce = StandInCA
        flashinfer_pcie_ipc_all_reduce.FlashInferPcieIpcAllReduce = StandInPcieIpc
