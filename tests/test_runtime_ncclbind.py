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


def test_unique_id_is_128_bytes():
    assert ncclbind.ctypes.sizeof(ncclbind.ncclUniqueId) == 128
    assert ncclbind.DTYPES["bfloat16"] == 9 and ncclbind.SUM == 0
