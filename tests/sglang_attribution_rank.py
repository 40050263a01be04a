"""One rank of the attribution test (no tests here; tests/test_runtime_sglang_dispatch.py starts two).

``python sglang_attribution_rank.py RANK PORT CASE`` with SGLang (an installed copy or an edited one) on
PYTHONPATH: gloo at world size 2, SGLang's real ``init_distributed_environment`` and a real
``GroupCoordinator`` for the TP ranks, then two communicator stand-ins planted at the unit's edge (the
``ca_comm`` and ``pcie_ipc_comm`` attributes: both enabled, both accepting the tensor) and the group's own
``all_reduce`` called once under :func:`stackprobe.runtime.sglang_state.served_by`. Prints one JSON line.

Why stand-ins and not the real bring-up on CPU: SGLang 0.5.23's ``GroupCoordinator.all_reduce``
(srt/distributed/parallel_state.py, ``if input_.is_cpu``) sends every CPU tensor to the shm/gloo path before
any communicator is asked, and custom allreduce / PCIe IPC / pynccl need CUDA to be built. So the tensor is a
``meta`` tensor (not CPU, no storage) and the communicators are stand-ins; the dispatch between them is
SGLang's own code. ``outplace_all_reduce`` / ``inplace_all_reduce`` are SGLang custom ops registered for the
CUDA key (srt/utils/common.py ``direct_register_custom_op``), which on a meta tensor would run their fake
implementation; here they are bound to their Python function, the call SGLang's eager path makes for plain
CUDA tensors (srt/utils/custom_op.py ``_call_directly_in_eager``).

CASE: ``both`` (both stand-ins accept), ``unobserved`` (as ``both`` with sglang_state.SERVING emptied: the
observation turned off).
"""
import json
import sys

import torch


class StandIn:
    """A communicator that accepts every tensor and returns a fresh one; ``disabled`` False."""
    disabled = False

    def __init__(self, name):
        self.name = name

    def should_custom_ar(self, x):
        return True

    def should_pcie_ipc_ar(self, x):
        return True

    def custom_all_reduce(self, x):
        return torch.empty_like(x)

    def pcie_ipc_all_reduce(self, x):
        return torch.empty_like(x)


def main(rank: int, port: int, case: str) -> None:
    from sglang.srt.distributed import parallel_state as ps

    from stackprobe.runtime import sglang_state
    ps.init_distributed_environment(world_size=2, rank=rank, distributed_init_method=f"tcp://127.0.0.1:{port}",
                                    local_rank=rank, backend="gloo")
    tp = ps.GroupCoordinator(group_ranks=[[0, 1]], local_rank=rank, torch_distributed_backend="gloo",
                             use_pynccl=False, use_mscclpp=False, use_custom_allreduce=False,
                             use_torch_symm_mem_all_reduce=False, use_hpu_communicator=False,
                             use_xpu_communicator=False, group_name="tp")
    for name in ("outplace_all_reduce", "inplace_all_reduce"):
        setattr(ps, name, getattr(ps, name).__wrapped__)
    tp.ca_comm, tp.pcie_ipc_comm = StandIn("ca"), StandIn("pcie_ipc")
    if case == "unobserved":
        sglang_state.SERVING = {}
    x = torch.empty(12, 64, dtype=torch.bfloat16, device="meta")
    rep = sglang_state.served_by(tp, x)
    rep.update(rank=rank, sglang=ps.__file__, world_size=tp.world_size)
    print(json.dumps(rep))


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
