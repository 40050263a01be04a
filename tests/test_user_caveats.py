"""What a user who switches a path on must know, read from the source and put beside the setting in the summary (a
fresh review of the 2026-12-07 reports, PARTLY points): vLLM's allreduce+RMSNorm fusion picks one-shot at every
size on 12.0 (each rank writes to all peers over PCIe); vLLM's PCIe IPC set-up is not caught (a failure stops
start-up); SGLang 0.5.9's MSCCL++ at world size 8 runs a one-shot kernel. Each is read from the release's code and
cited; a release whose code differs (twins on edited copies) gets no such caveat, never an invented one."""
from __future__ import annotations

import pytest

from test_verdict_leftovers import vllm033  # noqa: F401 - the shared wheel fixture
from validate_support import engine_copy

pytestmark = pytest.mark.network

FUSION = "vllm/compilation/passes/fusion/allreduce_rms_fusion.py"
TABLE_HEAD = "_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB: dict[int, dict[int, float]] = {\n"
MSCCLPP = "sglang/srt/distributed/device_communicators/pymscclpp.py"


def _ctx(ws: int = 8, topology: str = "pcie"):
    from stackprobe.archs import parse_arch
    from stackprobe.probes import Context
    from stackprobe.serverconfig import ServerConfig

    return Context(target=parse_arch("12.0"), env={}, coverage={}, topology=topology, world_size=ws,
                   server_config=ServerConfig(args={}, env={}))


def _line(root, rel: str, needle: str) -> int:
    return next(i for i, t in enumerate((root / rel).read_text().splitlines(), 1) if needle in t)


def test_vllm_fusion_one_shot_at_every_size_is_read_and_its_twin_with_a_120_entry_says_nothing(vllm033, tmp_path):
    from stackprobe.engines.vllm import engine as ve

    text, where = ve._fusion_oneshot(ve.Engine("0.33.0", vllm033 / "vllm"), _ctx())
    assert "keys [90, 100, 103, 107], no 120" in text and "all 7 peers at once (pcie)" in text, text
    table = _line(vllm033, FUSION, "_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB: dict")
    ret = _line(vllm033, FUSION, "return max_one_shot_size is None or")
    assert where == f"{FUSION}:{table}; :{ret}"
    assert ve._fusion_oneshot(ve.Engine("0.33.0", vllm033 / "vllm"), _ctx(ws=2)) is None   # two GPUs: one peer
    copy = engine_copy(vllm033, tmp_path / "a", {FUSION: (TABLE_HEAD, TABLE_HEAD + "    120: {8: 1},\n")})
    assert ve._fusion_oneshot(ve.Engine("0.33.0", copy / "vllm"), _ctx()) is None
    gone = engine_copy(vllm033, tmp_path / "b", {FUSION: ("return max_one_shot_size is None or",
                                                          "return max_one_shot_size is not None and")})
    assert ve._fusion_oneshot(ve.Engine("0.33.0", gone / "vllm"), _ctx()) is None


def test_mscclpp_one_shot_context_at_world_size_8_is_read_and_its_twin_two_shot_says_nothing(sglang059, tmp_path):
    from stackprobe.engines.sglang import engine as se
    from stackprobe.probes.mscclpp import _one_shot_at

    path = sglang059 / MSCCLPP
    line = _line(sglang059, MSCCLPP, "self.context_selection = MscclContextSelection.MSCCL1SHOT1NODELL")
    assert _one_shot_at(se.Engine("0.5.9", sglang059 / "sglang"), path, 8) == ("MSCCL1SHOT1NODELL", f"{MSCCLPP}:{line}")
    assert _one_shot_at(se.Engine("0.5.9", sglang059 / "sglang"), path, 4) is None
    copy = engine_copy(sglang059, tmp_path / "a", {MSCCLPP: ("MscclContextSelection.MSCCL1SHOT1NODELL",
                                                             "MscclContextSelection.MSCCL2SHOT1NODELL")})
    assert _one_shot_at(se.Engine("0.5.9", copy / "sglang"), copy / MSCCLPP, 8) is None


def test_a_caveat_goes_beside_the_setting_in_the_summary_and_only_there():
    from stackprobe.userwords import CAVEAT, user_caveats
    from stackprobe.verdict import Verdict

    v = Verdict("flashinfer-allreduce-fusion", "opt-in", "cause", "setting", "x")
    assert user_caveats(v) == ""
    v.add(CAVEAT, "one-shot at every size", "vllm/f.py:132; :176")
    v.add("past the size table", "not a caveat", "vllm/g.py:1")
    assert user_caveats(v) == " [caveat: one-shot at every size (vllm/f.py:132; :176)]"
