"""The ctypes NCCL binding without a GPU: library discovery and its error when no libnccl loads."""
import pytest

from stackprobe.runtime import ncclbind


def test_override_path_is_the_only_candidate(monkeypatch):
    monkeypatch.setenv("STACKPROBE_NCCL_SO", "/nonexistent/libnccl.so.2")
    assert ncclbind.find_libnccl() == ["/nonexistent/libnccl.so.2"]
    with pytest.raises(OSError, match="could not load libnccl; tried /nonexistent/libnccl.so.2"):
        ncclbind.NcclLibrary()


def test_error_carries_the_nccl_result_name():
    e = ncclbind.NcclError("ncclAllGather", 5, "invalid usage", "no algorithm/protocol available")
    assert e.name == "ncclInvalidUsage" and "no algorithm/protocol available" in str(e)


# ncclDataType_t and ncclRedOp_t as NVIDIA's nccl.h (src/nccl.h.in) numbers them, written out by hand
NCCL_H = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6, "float32": 7,
          "float64": 8, "bfloat16": 9}
NCCL_SUM = 0


class _Recorder:
    """Stands in for the loaded libnccl at the unit's edge: records each call's arguments, returns success."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def fn(*args):
            self.calls.append((name, args))
            return 0
        return fn


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "float64", "int32", "int64", "uint8", "int8"])
def test_collectives_pass_nccl_h_codes_counts_and_the_stream(dtype):
    torch = pytest.importorskip("torch")
    lib = ncclbind.NcclLibrary.__new__(ncclbind.NcclLibrary)
    lib.lib, lib.has_last_error = _Recorder(), False
    comm = ncclbind.NcclComm.__new__(ncclbind.NcclComm)
    comm.lib, comm.comm, comm.rank, comm.world_size = lib, ncclbind.ncclComm_t(1234), 0, 2
    t = getattr(torch, dtype)
    inp, out = torch.zeros(24, dtype=t), torch.zeros(24, dtype=t)
    comm.all_reduce(inp, out, stream=77)
    comm.all_gather(inp[:12], out, stream=77)
    comm.reduce_scatter(inp, out[:12], stream=77)
    (f1, a1), (f2, a2), (f3, a3) = lib.lib.calls
    assert f1 == "ncclAllReduce" and a1[2:5] == (24, NCCL_H[dtype], NCCL_SUM)
    assert a1[0].value == inp.data_ptr() and a1[1].value == out.data_ptr() and a1[6].value == 77
    assert f2 == "ncclAllGather" and a2[2:4] == (12, NCCL_H[dtype])           # sendcount
    assert f3 == "ncclReduceScatter" and a3[2:5] == (12, NCCL_H[dtype], NCCL_SUM)  # recvcount


def test_a_dtype_nccl_lacks_is_refused():
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="NCCL has no data type for torch.complex64"):
        ncclbind.NcclComm._dtype(torch.zeros(1, dtype=torch.complex64))


def test_a_unique_id_of_the_wrong_size_is_refused():
    with pytest.raises(ValueError, match="128 bytes"):
        ncclbind.NcclComm(None, b"short", 0, 2)
