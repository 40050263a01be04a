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
``VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC`` read by ``vllm.envs``) and the order in which ``CudaCommunicator.all_reduce``
asks them. What the stand-ins replace is each class's own per-call admission: custom allreduce admits every tensor
while not disabled (the real class also checks dtype, 16-byte alignment, size, and switches itself off above two GPUs
without full connectivity: ``custom_all_reduce.py``, what the static tier reads); PCIe IPC admits a 2-D tensor of the
hidden size and dtype its ``setup`` prepared, and only once ``setup`` ran (the real class's ``should_use`` needs the
workspace vLLM sets up at warmup, which the bring-up calls: ``vllm_state.setup_pcie_ipc``). ``FlashInferAllReduce``
and ``SymmMemCommunicator`` stay vLLM's own: the first is built and disables itself (no flashinfer, no CUDA), the
second is not built (``is_cuda()`` False); on CUDA both stand ahead of custom allreduce or pynccl.
Each stand-in does real work on the real CPU input: a gloo all_reduce of an fp32 copy, returned as a new tensor of
the input's dtype (so the probe's sum check reads a real sum), then ``COST_MS[name]`` ms of sleep, which sets the
cost on a loaded 2-core host.

``STANDIN_MODE`` in the rank's environment plants a fault: ``ok``; ``hang-setup`` (the custom-allreduce constructor
never returns); ``sticky`` (custom allreduce ignores being switched off); ``wrong`` (custom allreduce returns
zeros); ``no-setup`` (PCIe IPC's ``setup`` does nothing: no workspace, as before vLLM's warmup).
"""
import contextlib

import torch.distributed as dist

from dispatch_standin_base import CustomAllreduceFaults, Work, mode

from stackprobe.runtime.vllm_state import VllmDispatchProbe

CUDA_COMM = "vllm.distributed.device_communicators.cuda_communicator.CudaCommunicator"


class _Work(Work):
    def __init__(self, group, name):
        super().__init__(group, name)
        self.world_size = dist.get_world_size(group)

    def reduce(self, x):
        buf = x.detach().float().clone()
        dist.all_reduce(buf, group=self.group)
        self.cost()
        return buf.to(x.dtype)


class StandInCA(CustomAllreduceFaults, _Work):
    def __init__(self, group, device, symm_mem_enabled=False, register_graph_buffers=True, **kw):
        super().__init__(group)


class StandInPcieIpc(_Work):
    def __init__(self, group, tune_group=None, device=None, **kw):
        super().__init__(tune_group if tune_group is not None else group, "pcie_ipc")
        self.disabled = False
        self.workspace = None

    def setup(self, *, hidden_dim, dtype, capture_sizes, tune_cache):
        if mode() == "no-setup":
            return
        self.hidden_dim, self.dtype, self.workspace = hidden_dim, dtype, ("prepared", tuple(capture_sizes))

    def should_use(self, x):
        return (not self.disabled and self.workspace is not None and x.dim() == 2
                and x.shape[-1] == self.hidden_dim and x.dtype == self.dtype)

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
        from vllm.config import parallel
        from vllm.distributed.device_communicators import (cuda_communicator, custom_all_reduce,
                                                           flashinfer_pcie_ipc_all_reduce, pynccl)
        for mod in (parallel, cuda_communicator):     # they import current_platform: the swap must have reached them
            assert mod.current_platform is platforms._current_platform, f"{mod.__name__} kept another platform"
        pynccl.PyNcclCommunicator = StandInPynccl
        custom_all_reduce.CustomAllreduce = StandInCA
        flashinfer_pcie_ipc_all_reduce.FlashInferPcieIpcAllReduce = StandInPcieIpc
