"""What the two engines' dispatch stand-ins share (tests/sglang_dispatch_standins.py,
tests/vllm_dispatch_standins.py): the planted fault read from ``STANDIN_MODE``, each path's cost, and the custom
allreduce stand-in's behaviour. Each engine's module supplies ``reduce(x)`` (the real gloo work) and the
constructor its engine calls.
"""
import contextlib
import os
import time

import torch

COST_MS = {"ca": 1.0, "pcie_ipc": 3.0, "pynccl": 8.0}   # per call: sets each path's cost on a loaded 2-core host


def mode() -> str:
    """``STANDIN_MODE`` of this rank: ``ok``, ``hang-setup``, ``sticky``, ``wrong`` (and the vLLM module's
    ``no-setup``)."""
    return os.environ.get("STANDIN_MODE", "ok")


class Work:
    """A stand-in communicator named ``name`` ("ca", "pcie_ipc", "pynccl") on the process group ``group``."""

    def __init__(self, group, name):
        self.group, self.name = group, name

    def cost(self) -> None:
        time.sleep(COST_MS[self.name] / 1000)


class CustomAllreduceFaults(Work):
    """Custom allreduce as both engines ask it (``disabled``, ``should_custom_ar``, ``custom_all_reduce``,
    ``capture``), with the planted faults: ``hang-setup`` never returns from the constructor, ``sticky`` ignores
    being switched off, ``wrong`` returns zeros. Admits every tensor while not disabled."""

    def __init__(self, group):
        super().__init__(group, "ca")
        if mode() == "hang-setup":
            time.sleep(3600)
        self._disabled = False

    @property
    def disabled(self):
        return self._disabled

    @disabled.setter
    def disabled(self, value):
        if mode() != "sticky":
            self._disabled = value

    def should_custom_ar(self, x):
        return not self.disabled

    def custom_all_reduce(self, x):
        out = self.reduce(x)
        return torch.zeros_like(out) if mode() == "wrong" else out

    @contextlib.contextmanager
    def capture(self):
        yield
