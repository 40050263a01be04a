"""The runner's path attribution (stackprobe.runtime.sglang_state.served_by) follows SGLang 0.5.23's installed
dispatch: two gloo ranks build SGLang's real GroupCoordinator, plant two communicator stand-ins that both accept
the tensor (tests/sglang_attribution_rank.py says why stand-ins: SGLang sends CPU tensors to gloo before any
communicator is asked), and record which one the group's own ``all_reduce`` called. The installed sglang asks
custom allreduce before PCIe IPC (srt/distributed/parallel_state.py, ``_resolve_outplace_all_reduce_method``);
an edited copy with those two steps swapped must be attributed to PCIe IPC. Each claim has its failing twin:
the observation turned off gives no attribution, and a copy left unswapped keeps the installed one's."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from validate_support import ROOT, engine_copy, pip_target, suite_venv

# what `import sglang.srt.distributed.parallel_state` (and server_args, runtime_context) needs beyond torch and
# the suite venv, found by importing it against `pip install --no-deps` folders (triton: srt/utils/common.py
# imports it at module level; a CUDA torch ships it, the CPU one does not)
PARALLEL_STATE_DEPS = ("orjson==3.13.0", "psutil==7.2.2", "pybase64==1.5.1", "triton==3.9.0", "pillow==13.0.0",
                       "starlette==1.10.0", "anyio==4.16.0", "msgspec==0.23.0", "pydantic-core==2.50.5",
                       "pydantic==2.14.4", "typing-inspection==0.4.5", "pyzmq==27.3.0", "ipython==9.18.1",
                       "traitlets==5.16.1", "pygments==2.21.0", "aiohttp==3.14.5", "multidict==7.2.1",
                       "attrs==26.1.0", "yarl==1.25.1", "propcache==0.5.4", "aiohappyeyeballs==2.7.1",
                       "aiosignal==1.4.0", "frozenlist==1.8.0")
PS = "sglang/srt/distributed/parallel_state.py"
CA_STEP = """        if (
            self.ca_comm is not None
            and not self.ca_comm.disabled
            and not should_use_pymscclpp_allreduce
            and self.ca_comm.should_custom_ar(input_)
        ):
            return "ca"
"""
PCIE_STEP = """        if (
            self.pcie_ipc_comm is not None
            and not self.pcie_ipc_comm.disabled
            and not should_use_pymscclpp_allreduce
            and self.pcie_ipc_comm.should_pcie_ipc_ar(input_)
        ):
            return "pcie_ipc"
"""
INSTALLED = "ca_comm.custom_all_reduce"
SWAPPED = "pcie_ipc_comm.pcie_ipc_all_reduce"


@pytest.fixture(scope="module")
def env():
    py = suite_venv()
    sglang = pip_target("sglang==0.5.23")
    deps = [str(pip_target(s)) for s in PARALLEL_STATE_DEPS]
    return py, sglang, deps


def _between(text: str) -> str:
    """The text from the custom-allreduce step to the end of the PCIe IPC step (the comment between kept)."""
    a = text.index(CA_STEP)
    b = text.index(PCIE_STEP, a) + len(PCIE_STEP)
    return text[a:b]


def _swap(sglang: Path) -> tuple[str, str]:
    old = _between((sglang / PS).read_text())
    return old, PCIE_STEP + old[len(CA_STEP):-len(PCIE_STEP)] + CA_STEP


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _attribute(env, sglang: Path, case: str = "both") -> list[dict]:
    py, _, deps = env
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([str(sglang), *deps, str(ROOT / "validate"), str(ROOT / "tests")]),
             SGLANG_LOGGING_LEVEL="warning")
    port = _free_port()
    script = ROOT / "tests" / "sglang_attribution_rank.py"
    procs = [subprocess.Popen([str(py), str(script), str(r), str(port), case], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=e) for r in (0, 1)]
    out = []
    for p in procs:
        try:
            so, se = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, se[-3000:]
        out.append(json.loads(so.strip().splitlines()[-1]))
    assert [r["world_size"] for r in out] == [2, 2]
    assert all(r["sglang"].startswith(str(sglang)) for r in out), [r["sglang"] for r in out]
    return out


@pytest.mark.network      # suite_venv installs torch from PyPI
def test_the_installed_dispatch_asks_custom_allreduce_before_pcie_ipc(env):
    ranks = _attribute(env, env[1])
    assert [r["path"] for r in ranks] == [INSTALLED, INSTALLED], ranks
    assert all(r["calls"] == [INSTALLED] for r in ranks)


@pytest.mark.network      # suite_venv installs torch from PyPI
def test_a_copy_with_the_two_steps_swapped_is_attributed_to_pcie_ipc(env, tmp_path):
    edited = engine_copy(env[1], tmp_path / "swapped", {PS: _swap(env[1])})
    text = (edited / PS).read_text()
    assert text.index(PCIE_STEP) < text.index(CA_STEP)
    assert [r["path"] for r in _attribute(env, edited)] == [SWAPPED, SWAPPED]


@pytest.mark.network      # suite_venv installs torch from PyPI
def test_a_copy_left_unswapped_keeps_the_installed_attribution(env, tmp_path):
    same = engine_copy(env[1], tmp_path / "same", {})
    assert [r["path"] for r in _attribute(env, same)] != [SWAPPED, SWAPPED]


@pytest.mark.network      # suite_venv installs torch from PyPI
def test_with_the_observation_off_nothing_is_attributed(env):
    ranks = _attribute(env, env[1], "unobserved")
    assert [r["path"] for r in ranks] == ["no observed method"] * 2, ranks
    assert [r["path"] for r in ranks] != [INSTALLED, INSTALLED]


@pytest.mark.network      # suite_venv installs torch from PyPI
def test_the_swap_edit_fails_loudly_when_the_steps_are_not_found(env, tmp_path):
    with pytest.raises(AssertionError, match="no longer contains"):
        engine_copy(env[1], tmp_path / "x", {PS: ("return \"ca_gone\"", "")})


if sys.platform != "linux":
    pytestmark = pytest.mark.skip(reason="gloo ranks over TCP on Linux")
