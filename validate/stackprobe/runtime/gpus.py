"""The GPUs this host shows, read without creating a CUDA context in this process: ``nvidia-smi`` where it is
on ``PATH``, else torch. A module of its own below :mod:`.suite` and :mod:`.p2pcheck`, which both count GPUs (the
suite runs the P2P check first, so the check cannot import the suite).
"""
from __future__ import annotations

import os
import shutil
import subprocess


def _smi(*args: str) -> str:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return ""
    try:
        return subprocess.run([exe, *args], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def gpu_count() -> int:
    """GPUs visible to this host, without creating a CUDA context here (``nvidia-smi -L``, else torch)."""
    if shutil.which("nvidia-smi"):
        out = _smi("-L")
        n = sum(1 for ln in out.splitlines() if ln.startswith("GPU "))
        vis = os.environ.get("CUDA_VISIBLE_DEVICES")
        if vis is not None:
            n = min(n, len([v for v in vis.split(",") if v.strip()]))
        return n
    try:
        import torch
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0
