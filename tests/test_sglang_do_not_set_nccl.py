"""SGLang's "do not set with it" list for the PCIe IPC allreduce (:func:`stackprobe.probes.pcie_ipc_engine.do_not_set`)
on the real sglang 0.5.23 wheel (+ flashinfer-python 0.7.2), each with a failing twin:

1. Where pynccl serves instead, ``then`` reads ``NCCL (pynccl)`` and names the allreduce algorithm only where SGLang's
   own code that the setting reaches pins ``NCCL_ALGO``: ``--enable-deterministic-inference`` sets
   ``NCCL_ALGO='allreduce:tree'`` (``sglang/srt/arg_groups/attention_hook.py:676``), so Tree, with that file:line;
   ``SGLANG_USE_1STAGE_ALLREDUCE=1`` and ``SGLANG_ENABLE_DETERMINISTIC_INFERENCE=1`` set no ``NCCL_ALGO`` that is read,
   so no algorithm is named. Before: ``"nccl-ring"`` for all of them. Twin: a copy of the wheel without the
   ``NCCL_ALGO`` line names no algorithm for the flag either. (``where`` is the line that turns PCIe IPC off:
   tests/test_sglang_do_not_set_cited.py; the pin is the end of ``why``.)
2. A setting whose dispatch read raises is kept as not assessed (``"then": ""``, a ``not assessed:`` note naming the
   error), listed by userwords under not assessed; it was skipped (``except Exception: continue``).
"""
from __future__ import annotations

import json
import subprocess

import pytest

from validate_support import engine_copy, suite_env

pytestmark = pytest.mark.network

HOOK = "sglang/srt/arg_groups/attention_hook.py"
PIN = '                os.environ["NCCL_ALGO"] = "allreduce:tree"\n'
DO_NOT_SET = """
import json
from stackprobe.probes import Context, pcie_ipc_engine as pe
from stackprobe.engines.sglang import engine as se
from stackprobe.engines.sglang import dispatch as dw
from stackprobe.archs import parse_arch
from stackprobe.serverconfig import ServerConfig
RAISE_FOR = {raise_for!r}
if RAISE_FOR:
    real = dw.read_dispatch
    def read_dispatch(eng, ctx, config=None):
        if RAISE_FOR in config.args or RAISE_FOR in config.env:
            raise ValueError("a step this reader cannot evaluate")
        return real(eng, ctx, config=config)
    dw.read_dispatch = read_dispatch
ctx = Context(target=parse_arch("12.0"), env={{}}, coverage={{}}, world_size=8, topology="pcie",
              server_config=ServerConfig(args={{}}, env={{}}, source="test"))
print(json.dumps(pe.do_not_set(se.installed(), ctx)))
"""


def _do_not_set(venv, paths, raise_for: str = "") -> dict[str, dict]:
    p = subprocess.run([str(venv), "-c", DO_NOT_SET.format(raise_for=raise_for)], capture_output=True, text=True,
                       env=suite_env(paths), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return {a["setting"]: a for a in json.loads(p.stdout.strip().splitlines()[-1])}


@pytest.fixture(scope="module")
def released(venv, sglang, fi):
    return _do_not_set(venv, [sglang, fi])


@pytest.fixture(scope="module")
def sglang_no_pin(sglang, tmp_path_factory):
    """sglang 0.5.23 without ``os.environ["NCCL_ALGO"] = "allreduce:tree"`` (attention_hook.py:676)."""
    return engine_copy(sglang, tmp_path_factory.mktemp("sg-no-pin"), {HOOK: (PIN, "                pass\n")})


def test_deterministic_inference_leaves_pynccl_with_the_allreduce_pinned_to_tree(sglang, released):
    assert PIN in (sglang / HOOK).read_text().splitlines(keepends=True)[675]     # line 676 of the release
    det = released["--enable-deterministic-inference"]
    assert det["then"] == "NCCL (pynccl, allreduce algorithm tree)"
    assert det["why"].endswith(f"; it sets NCCL_ALGO=allreduce:tree ({HOOK}:676)")   # after why PCIe IPC is off
    assert det["where"].startswith("sglang/srt/distributed/device_communicators/pcie_ipc_ar.py:")
    # the pin sits under the branch's own conditions (CUDA, TP > 1), which the entry names
    assert (f"NCCL_ALGO='allreduce:tree' ({HOOK}:676, only when cfg.tp_size > 1 and not (get_platform().is_hip))"
            in det["also_sets"]), det["also_sets"]
    assert "ring" not in det["then"]


def test_variables_that_pin_no_algorithm_name_none(released):
    # SGLANG_ENABLE_DETERMINISTIC_INFERENCE=1 alone is not listed: SGLang overwrites it from the flag at start-up
    # (serving_hook.py:444-446; tests/test_sglang_do_not_set_cited.py)
    assert "SGLANG_ENABLE_DETERMINISTIC_INFERENCE=1" not in released
    a = released["SGLANG_USE_1STAGE_ALLREDUCE=1"]
    assert a["then"] == "NCCL (pynccl)", a
    assert "NCCL_ALGO" not in a["why"] and a["also_sets"] == []
    assert not any(a["then"] == "nccl-ring" for a in released.values())


def test_twin_without_the_nccl_algo_line_no_algorithm_is_named(venv, sglang_no_pin, fi):
    det = _do_not_set(venv, [sglang_no_pin, fi])["--enable-deterministic-inference"]
    assert det["then"] == "NCCL (pynccl)"
    assert "NCCL_ALGO" not in det["why"] and not any(x.startswith("NCCL_ALGO=") for x in det["also_sets"])


def test_a_setting_whose_dispatch_read_raises_is_not_assessed(venv, sglang, fi, released):
    from stackprobe.userwords import _unassessed

    out = _do_not_set(venv, [sglang, fi], raise_for="--enable-symm-mem")
    symm = out["--enable-symm-mem"]
    assert symm["then"] == "" and symm["also_sets"] == []
    assert symm["note"] == ("not assessed: the dispatch read with it set raised ValueError: a step this reader cannot "
                            "evaluate")
    assert _unassessed(symm)
    assert out["--enable-deterministic-inference"] == released["--enable-deterministic-inference"]


def test_twin_the_same_setting_read_without_the_error_is_assessed(released):
    from stackprobe.userwords import _unassessed

    symm = released["--enable-symm-mem"]
    assert symm["then"] == "nccl-symm-mem" and not _unassessed(symm)
