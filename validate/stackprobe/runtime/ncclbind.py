"""A small ctypes binding to libnccl, called on torch's current CUDA stream.

This is how a serving engine calls NCCL inside its CUDA graphs: SGLang's ``pynccl`` (and vLLM's, which it
derives from) load ``libnccl.so`` with ctypes and call ``ncclAllReduce`` on the current stream, with no extra
stream or event work around each call (unlike ``torch.distributed``). Signatures and enum values follow
NVIDIA's ``src/nccl.h.in`` as mirrored by ``sglang/srt/distributed/device_communicators/pynccl_wrapper.py``:

* ``ncclGetUniqueId(ncclUniqueId*)``: ``ncclUniqueId`` is 128 bytes (``NCCL_UNIQUE_ID_BYTES``);
* ``ncclCommInitRank(ncclComm_t*, int nranks, ncclUniqueId, int rank)``: the id is passed by value;
* ``ncclAllReduce(sendbuff, recvbuff, size_t count, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)``;
* ``ncclAllGather(sendbuff, recvbuff, size_t sendcount, ncclDataType_t, ncclComm_t, cudaStream_t)``;
* ``ncclReduceScatter(sendbuff, recvbuff, size_t recvcount, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t)``;
* ``ncclGetLastError(ncclComm_t)`` (NCCL >= 2.13) returns the text of the last WARN, e.g.
  ``no algorithm/protocol available for function AllGather ... NCCL_ALGO was set to Tree``.

The library is the one torch already loaded (read from ``/proc/self/maps``), else the ``nvidia-nccl-*``
wheel's, else torch's ``lib`` folder, else the system's; ``STACKPROBE_NCCL_SO`` overrides all of them.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
from pathlib import Path

ncclResult_t = ctypes.c_int
ncclComm_t = ctypes.c_void_p
cudaStream_t = ctypes.c_void_p
buffer_type = ctypes.c_void_p

# ncclDataType_t (nccl.h): bfloat16 is 9.
DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
          "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
# ncclRedOp_t
SUM = 0
# ncclResult_t names (nccl.h)
RESULTS = {0: "ncclSuccess", 1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
           4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError", 7: "ncclInProgress"}


class ncclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_byte * 128)]


class NcclError(RuntimeError):
    """An NCCL call returned non-zero. ``code`` is the ``ncclResult_t``; ``name`` its enum name
    (``ncclInvalidUsage``); the message carries ``ncclGetErrorString`` and ``ncclGetLastError``."""

    def __init__(self, func: str, code: int, text: str, last: str):
        self.func, self.code, self.name, self.last_error = func, code, RESULTS.get(code, str(code)), last
        super().__init__(f"{func} failed: {self.name} ({text}){': ' + last if last else ''}")


def _loaded_nccl() -> str | None:
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if "libnccl.so" in os.path.basename(path):
                return path
    except OSError:
        pass
    return None


def find_libnccl() -> list[str]:
    """Candidate paths of libnccl, best first (see module doc). Never empty-handed silently: the caller
    raises with the list it tried."""
    found: list[str] = []
    env = os.environ.get("STACKPROBE_NCCL_SO")
    if env:
        return [env]
    loaded = _loaded_nccl()
    if loaded:
        found.append(loaded)
    try:
        import nvidia  # namespace package of the nvidia-* wheels
        for root in list(getattr(nvidia, "__path__", [])):
            found += sorted(glob.glob(os.path.join(root, "nccl", "lib", "libnccl.so*")))
            found += sorted(glob.glob(os.path.join(root, "cu*", "lib", "libnccl.so*")))
    except ImportError:
        pass
    try:
        import torch
        found += sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libnccl.so*")))
    except ImportError:
        pass
    sys_lib = ctypes.util.find_library("nccl")
    if sys_lib:
        found.append(sys_lib)
    seen, out = set(), []
    for f in found:
        if f not in seen:
            seen.add(f)
            out.append(f)
    return out


class NcclLibrary:
    """The loaded library. ``path``: the file; ``version``: ``(major, minor, patch)`` from ``ncclGetVersion``."""

    def __init__(self, path: str | None = None):
        tried = [path] if path else find_libnccl()
        errors = []
        self.lib = None
        for cand in tried:
            try:
                self.lib = ctypes.CDLL(cand)
                self.path = cand
                break
            except OSError as exc:
                errors.append(f"{cand}: {exc}")
        if self.lib is None:
            raise OSError("could not load libnccl; tried " + ("; ".join(errors) or "nothing (no candidate found)")
                          + ". Install torch with CUDA (it ships nvidia-nccl) or set STACKPROBE_NCCL_SO.")
        L = self.lib
        L.ncclGetErrorString.restype = ctypes.c_char_p
        L.ncclGetErrorString.argtypes = [ncclResult_t]
        L.ncclGetVersion.restype = ncclResult_t
        L.ncclGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
        L.ncclGetUniqueId.restype = ncclResult_t
        L.ncclGetUniqueId.argtypes = [ctypes.POINTER(ncclUniqueId)]
        L.ncclCommInitRank.restype = ncclResult_t
        L.ncclCommInitRank.argtypes = [ctypes.POINTER(ncclComm_t), ctypes.c_int, ncclUniqueId, ctypes.c_int]
        L.ncclAllReduce.restype = ncclResult_t
        L.ncclAllReduce.argtypes = [buffer_type, buffer_type, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                    ncclComm_t, cudaStream_t]
        L.ncclAllGather.restype = ncclResult_t
        L.ncclAllGather.argtypes = [buffer_type, buffer_type, ctypes.c_size_t, ctypes.c_int, ncclComm_t,
                                    cudaStream_t]
        L.ncclReduceScatter.restype = ncclResult_t
        L.ncclReduceScatter.argtypes = [buffer_type, buffer_type, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                        ncclComm_t, cudaStream_t]
        L.ncclCommDestroy.restype = ncclResult_t
        L.ncclCommDestroy.argtypes = [ncclComm_t]
        self.has_last_error = hasattr(L, "ncclGetLastError")
        if self.has_last_error:
            L.ncclGetLastError.restype = ctypes.c_char_p
            L.ncclGetLastError.argtypes = [ncclComm_t]
        v = ctypes.c_int()
        self.check("ncclGetVersion", L.ncclGetVersion(ctypes.byref(v)))
        code = v.value  # NCCL_VERSION(X,Y,Z) = X*10000 + Y*100 + Z from 2.9 on
        self.version = (code // 10000, (code % 10000) // 100, code % 100)

    def check(self, func: str, result: int, comm=None) -> None:
        if result != 0:
            text = self.lib.ncclGetErrorString(result).decode(errors="replace")
            last = ""
            if self.has_last_error:
                raw = self.lib.ncclGetLastError(comm)
                last = raw.decode(errors="replace") if raw else ""
            raise NcclError(func, result, text, last)

    def unique_id(self) -> bytes:
        """A fresh ``ncclUniqueId`` as 128 bytes, to share with every rank (through a store or a file)."""
        uid = ncclUniqueId()
        self.check("ncclGetUniqueId", self.lib.ncclGetUniqueId(ctypes.byref(uid)))
        return bytes(uid.internal)


class NcclComm:
    """One rank's communicator, created with ``ncclCommInitRank`` on the current CUDA device.

    Every collective runs on ``stream`` (a ``cudaStream_t`` as int) or, when ``None``, on torch's current
    stream, so it is captured by an enclosing ``torch.cuda.graph``. Tensors are torch CUDA tensors;
    ``count`` arguments are derived from their ``numel``.
    """

    def __init__(self, lib: NcclLibrary, unique_id: bytes, rank: int, world_size: int):
        if len(unique_id) != 128:
            raise ValueError(f"ncclUniqueId must be 128 bytes, got {len(unique_id)}")
        self.lib, self.rank, self.world_size = lib, rank, world_size
        uid = ncclUniqueId()
        ctypes.memmove(ctypes.addressof(uid), unique_id, 128)
        self.comm = ncclComm_t()
        lib.check("ncclCommInitRank", lib.lib.ncclCommInitRank(ctypes.byref(self.comm), world_size, uid, rank))

    @staticmethod
    def _stream(stream):
        if stream is not None:
            return ctypes.c_void_p(stream)
        import torch
        return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    @staticmethod
    def _dtype(t) -> int:
        name = str(t.dtype).replace("torch.", "")
        if name not in DTYPES:
            raise TypeError(f"NCCL has no data type for {t.dtype}")
        return DTYPES[name]

    def all_reduce(self, inp, out, stream=None) -> None:
        """Sum ``inp`` over ranks into ``out`` (same shape/dtype; may be the same tensor)."""
        self.lib.check("ncclAllReduce", self.lib.lib.ncclAllReduce(
            ctypes.c_void_p(inp.data_ptr()), ctypes.c_void_p(out.data_ptr()), inp.numel(), self._dtype(inp),
            SUM, self.comm, self._stream(stream)), self.comm)

    def all_gather(self, inp, out, stream=None) -> None:
        """Gather ``inp`` (n elements) from every rank into ``out`` (world_size * n elements)."""
        self.lib.check("ncclAllGather", self.lib.lib.ncclAllGather(
            ctypes.c_void_p(inp.data_ptr()), ctypes.c_void_p(out.data_ptr()), inp.numel(), self._dtype(inp),
            self.comm, self._stream(stream)), self.comm)

    def reduce_scatter(self, inp, out, stream=None) -> None:
        """Sum ``inp`` (world_size * n elements) over ranks; rank r receives block r into ``out`` (n)."""
        self.lib.check("ncclReduceScatter", self.lib.lib.ncclReduceScatter(
            ctypes.c_void_p(inp.data_ptr()), ctypes.c_void_p(out.data_ptr()), out.numel(), self._dtype(out),
            SUM, self.comm, self._stream(stream)), self.comm)

    def destroy(self) -> None:
        if self.comm:
            self.lib.lib.ncclCommDestroy(self.comm)
            self.comm = ncclComm_t()
