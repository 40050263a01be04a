"""Issue 39 ("every verdict a maintainer would sign"), the review's left-over verdict readings, each read from the real
wheels from PyPI (vllm 0.33.0, sglang 0.5.23, flashinfer-python 0.7.2) with a failing twin: an edited copy of the
wheel's source file that gives the old, wrong answer where the new reading gives the right one.

1. What serves once a variable turns vLLM's PCIe IPC off is read, not named: ``VLLM_BATCH_INVARIANT=1`` leaves the
   decode allreduce on pynccl (``cuda_communicator.py:432-438``) with ``NCCL_ALGO=ring,tree;allreduce:tree`` pinned
   by vLLM itself (``model_executor/determinism/batch_invariant.py:1419``): Tree, not the "nccl-ring" once written
   for every such variable.
2. An expert kernel whose device check is not read (no target to judge it against, a body this reader does not
   follow) is "not assessed: <why>" and never counted as admitting; where an admitting kernel's device check holds
   only given a ``has_*``/``is_*`` predicate taken as true, the entry names it and where it is defined
   (FlashInferExperts: ``has_flashinfer_cutlass_fused_moe()``, ``vllm/utils/flashinfer.py:564``).
3. A setting after which SGLang's dispatch (PCIe IPC on) is undecided and no step read takes the tensor is kept as
   "not assessed" (``"then": ""``, a ``not assessed:`` note) and the report's headline and Summary list it under not
   assessed, not under "do not set with it"; it was dropped. The case: ``--enable-mscclpp`` with the mscclpp package
   importable, in a copy of sglang 0.5.23 without the ``return "pymscclpp"`` step (``parallel_state.py:982-983``):
   ``should_use_pymscclpp_allreduce`` decides PCIe IPC's own step (``:969-975``) at run time and nothing read takes
   the tensor.
4. SGLang's fusion flag on a target its platform check refuses: where the flag's choices are not read, the "do not
   set" phrase says so (not assessed) instead of naming ``auto`` as if it were the one value read (sglang 0.5.23
   ``arg_groups/fields/exec_.py:770-771``: ``Optional[Literal["auto", "trtllm", "mnnvl", "cutedsl"]]``).
5. The Summary's "do not set" line for a value whose set-up raises without NVLink (vLLM's one-sided FlashInfer
   all-to-all, FlashInfer's NVLink check) is worded from the report's topology: "on PCIe" only where PCIe was
   detected or given, "on PCIe (assumed, not read: ...)" where it was assumed, "on this topology (not read; ...)"
   where the report names none.
6. Issue 39 point 10 (review "partly right"): every concrete expert-kernel class is read on its own (inherited
   checks included), with the activation format it declares, its parallel-config and device checks (FILE:LINE read
   from the source) and the TODO/FIXME comments in those methods: HummingExpertsBase's three subclasses apart
   (BatchedHummingGroupedExperts takes BatchedExperts), FlashInferExperts' fp8 TODO (flashinfer_cutlass_moe.py:198).
"""
from __future__ import annotations

import json
import subprocess

import pytest

from test_validate_verdicts_signed import drive  # noqa: F401 - the shared static-tier driver fixture
from validate_support import engine_copy, pip_target, suite_env

pytestmark = pytest.mark.network

BI = "vllm/model_executor/determinism/batch_invariant.py"
PIN = '"NCCL_ALGO": "ring,tree;allreduce:tree",'


@pytest.fixture(scope="module")
def vllm033():
    return pip_target("vllm==0.33.0")


def _run(venv, paths, code: str, *argv: str):
    p = subprocess.run([str(venv), "-c", code, *argv], capture_output=True, text=True, env=suite_env(paths),
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


OFF_BY = """
import json
from types import SimpleNamespace
from stackprobe.engines.vllm import engine as ve
from stackprobe.serverconfig import ServerConfig
import sys
ws, topo = (int(sys.argv[1]), sys.argv[2]) if len(sys.argv) > 2 else (8, "pcie")
ctx = SimpleNamespace(server_config=ServerConfig(args={}, env={}, source="test"), world_size=ws, topology=topo)
print(json.dumps(ve._pcie_ipc_turned_off_by(ve.installed(), ctx)))
"""


# --- point 1: what serves once PCIe IPC is turned off ----------------------------------------------------------
def test_point1_batch_invariant_leaves_pynccl_with_the_allreduce_pinned_to_tree(venv, vllm033):
    """Before: ``"then": "nccl-ring"`` for every variable that turns PCIe IPC off; vLLM 0.33.0's batch-invariant mode
    pins NCCL allreduce to Tree."""
    off = _run(venv, [vllm033], OFF_BY)
    bi = next(a for a in off if a["setting"] == "VLLM_BATCH_INVARIANT=1")
    assert bi["then"] == "NCCL (pynccl, allreduce algorithm tree)"
    assert bi["where"] == "vllm/distributed/device_communicators/cuda_communicator.py:75"
    assert f"NCCL_ALGO=ring,tree;allreduce:tree ({BI}:1419)" in bi["why"]
    assert "ring" not in bi["then"]


def test_point1_twin_a_copy_whose_mode_pins_ring_or_nothing_reads_so(venv, vllm033, tmp_path):
    """The twin: an edited copy whose batch-invariant mode pins allreduce to Ring reads Ring (the algorithm is read,
    not written in); one that pins no NCCL_ALGO names no algorithm at all: NCCL (pynccl)."""
    ring = engine_copy(vllm033, tmp_path / "ring", {BI: (PIN, '"NCCL_ALGO": "ring",')})
    bi = next(a for a in _run(venv, [ring], OFF_BY) if a["setting"] == "VLLM_BATCH_INVARIANT=1")
    assert bi["then"] == "NCCL (pynccl, allreduce algorithm ring)"
    bare = engine_copy(vllm033, tmp_path / "bare", {BI: (PIN, "")})
    bi = next(a for a in _run(venv, [bare], OFF_BY) if a["setting"] == "VLLM_BATCH_INVARIANT=1")
    assert bi["then"] == "NCCL (pynccl)" and "NCCL_ALGO" not in bi["why"]


def test_point1_at_world_size_2_or_on_nvlink_custom_allreduce_comes_first_so_nothing_is_claimed(venv, vllm033):
    """At world size 2 (or on NVLink) vLLM builds its custom allreduce (custom_all_reduce.py:267 refuses only ws > 2
    without full NVLink), which comes before pynccl in all_reduce: the entry claims nothing (``then`` empty, a
    ``not assessed:`` note) instead of naming pynccl; the twin at world size 8 on PCIe (the test above) names pynccl."""
    from stackprobe.verdict import unassessed_entry

    for ws, topo in (("2", "pcie"), ("8", "nvlink")):
        bi = next(a for a in _run(venv, [vllm033], OFF_BY, ws, topo) if a["setting"] == "VLLM_BATCH_INVARIANT=1")
        assert bi["then"] == "" and unassessed_entry(bi), bi
        assert f"at world size {ws} on {topo}" in bi["note"] and "custom allreduce" in bi["note"]


# --- point 2: expert kernels whose device check is not read -----------------------------------------------------
FI_CUTLASS = "vllm/model_executor/layers/fused_moe/experts/flashinfer_cutlass_moe.py"
KERNELS = """
import json, sys
from stackprobe.engines.vllm import engine as ve
class T:
    cc = sys.argv[1]
    major, minor = (int(x) for x in cc.split(".")) if cc != "none" else (0, 0)
target = T if sys.argv[1] != "none" else None
k = ve.expert_kernels(ve.installed(), "flashinfer_nvlink_two_sided", target, 8)
k["words"] = ve._kernel_words(k, target)
print(json.dumps(k))
"""


def _kernels(venv, paths, target: str) -> dict:
    p = subprocess.run([str(venv), "-c", KERNELS, target], capture_output=True, text=True, env=suite_env(paths),
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


def _entry(k: dict, key: str, cls: str) -> str:
    return next((e for e in k[key] if e.startswith(cls + " (")), "")


def test_point2_no_target_means_no_kernel_admits_and_each_says_why(venv, vllm033):
    """Before: with no target capability the device check was skipped and FlashInferExperts (and every kernel whose
    parallel-config method returns True) was filed under admit."""
    k = _kernels(venv, [vllm033], "none")
    assert k["admit"] == []
    fi = _entry(k, "unknown", "FlashInferExperts")
    assert fi.endswith(f"; not assessed: no target capability to judge its device check {FI_CUTLASS}:128-139 against")
    assert "not assessed (not counted as admitting), not read here: " in k["words"]
    assert "no kernel read here admits it" in k["words"]


def test_point2_the_assumed_predicate_is_named_with_where_it_is_defined(venv, vllm033):
    """On 12.0 FlashInferExperts admits given has_flashinfer_cutlass_fused_moe(), whose body (a loop over FlashInfer
    attributes) is not read: the entry says so; a kernel whose device check is not read says why."""
    k = _kernels(venv, [vllm033], "12.0")
    fi = _entry(k, "admit", "FlashInferExperts")
    assert fi.startswith(f"FlashInferExperts ({FI_CUTLASS}:194); device check {FI_CUTLASS}:128-139; assumes "
                         "has_flashinfer_cutlass_fused_moe() taken as true: its body (vllm/utils/flashinfer.py:564) is "
                         "not read here (")
    oai = _entry(k, "admit", "OAITritonExperts")     # BaseOAITritonExperts is abstract: its subclasses are read
    assert oai.startswith("OAITritonExperts (vllm/model_executor/layers/fused_moe/experts/gpt_oss_triton_kernels_moe.py"
                          ":1045, from BaseOAITritonExperts); device check vllm/model_executor/layers/fused_moe/experts/"
                          "gpt_oss_triton_kernels_moe.py:1023-1024; assumes has_triton_kernels() taken as true: its "
                          "body (vllm/utils/import_utils.py:560) is not read here (")   # review point 11
    assert k["unknown"] == [] and "not read here: " not in k["words"]     # FallbackExperts: review point 12


def test_point2_twin_a_readable_predicate_names_no_assumption_and_an_unread_check_admits_nothing(venv, vllm033,
                                                                                              tmp_path):
    """The twin: a copy whose has_flashinfer_cutlass_fused_moe() body is a plain ``return True`` is read, and the entry
    names no assumption; a copy whose FlashInferExperts device check calls something this reader does not know files
    it as not assessed, not admitted."""
    body = '    """Return `True` if FlashInfer CUTLASS fused MoE is available."""\n    if not has_flashinfer_moe():'
    plain = engine_copy(vllm033, tmp_path / "plain",
                        {"vllm/utils/flashinfer.py": (body, body.split("\n")[0] + "\n    return True\n    if False:")})
    fi = _entry(_kernels(venv, [plain], "12.0"), "admit", "FlashInferExperts")
    assert fi == f"FlashInferExperts ({FI_CUTLASS}:194); device check {FI_CUTLASS}:128-139"
    check = "            and has_flashinfer_cutlass_fused_moe()\n        )"
    odd = engine_copy(vllm033, tmp_path / "odd",
                      {FI_CUTLASS: (check, "            and has_flashinfer_cutlass_fused_moe()\n"
                                           "            and p.some_unread_check()\n        )")})
    k = _kernels(venv, [odd], "12.0")
    assert not _entry(k, "admit", "FlashInferExperts")
    assert "; not assessed: its device check" in _entry(k, "unknown", "FlashInferExperts")
    assert "p.some_unread_check()" in _entry(k, "unknown", "FlashInferExperts")


# --- point 10 (maintainer review, "partly right"): each expert-kernel class on its own --------------------------
HUM = "vllm/model_executor/layers/fused_moe/experts/fused_humming_moe.py"
TODO = "        # TODO: the per-tensor fp8 kernels don't work with MNNVL FI A2As.\n"
HUM_DEV = "            and platform.has_device_capability((7, 5))\n"


def _line(root, rel: str, text: str) -> int:
    """1-based line of the one line of ``rel`` (in the wheel at ``root``) that starts with ``text``."""
    hits = [i for i, ln in enumerate((root / rel).read_text().splitlines(), 1) if ln.startswith(text)]
    assert len(hits) == 1, (rel, text, hits)
    return hits[0]


def _rec(k: dict, cls: str) -> dict:
    return next(r for r in k["classes"] if r["class"] == cls)


def test_point10_each_expert_class_names_its_format_its_device_check_and_its_own_caveat(venv, vllm033):
    """Review point 10 (a), (b), (c). Before: HummingExpertsBase (abstract: no activation_format) was one admitting
    entry for its three subclasses, among them BatchedHummingGroupedExperts (BatchedExperts format,
    fused_humming_moe.py:1029-1030), which the two-sided all-to-all (Standard) cannot feed; and FlashInferExperts was
    admitted without the TODO its own _supports_parallel_config carries (flashinfer_cutlass_moe.py:198: per-tensor
    fp8 kernels don't work with MNNVL FlashInfer all-to-alls) while returning True. Now each concrete class is read
    on its own (format, parallel-config and device check with FILE:LINE read from the source, caveats)."""
    k = _kernels(venv, [vllm033], "12.0")
    names = {r["class"] for r in k["classes"]}
    assert "HummingExpertsBase" not in names and not any(e.startswith("HummingExpertsBase ") for e in k["admit"])
    todo = _line(vllm033, FI_CUTLASS, TODO.rstrip("\n"))
    assert todo == 198
    fi = _rec(k, "FlashInferExperts")
    assert fi["caveats"] == [f"{FI_CUTLASS}:{todo}: TODO: the per-tensor fp8 kernels don't work with MNNVL FI A2As."]
    assert (fi["verdict"], fi["format"], fi["device"]) == ("admit", "Standard", True)
    assert fi["device_where"] == f"{FI_CUTLASS}:128-139"
    assert k["caveats"] == {"FlashInferExperts": fi["caveats"]}
    assert (f'experts/flashinfer_cutlass_moe.py:{todo} "TODO: the per-tensor fp8 kernels don\'t work with MNNVL FI '
            'A2As."') in k["words"]
    dev = f"{_line(vllm033, HUM, '    def _supports_current_device() -> bool:')}-409"
    par = _line(vllm033, HUM, "    def _supports_parallel_config(") + 0
    for cls, fmt, verdict in (("HummingIndexedExperts", "Standard", "admit"), ("HummingGroupedExperts", "Standard", "admit"),
                              ("BatchedHummingGroupedExperts", "BatchedExperts", "refuse")):
        r = _rec(k, cls)
        ret = _line(vllm033, HUM, "class " + cls) + 6      # its activation_format's return, 6 lines below the class
        assert (r["format"], r["format_where"], r["verdict"]) == (fmt, f"{HUM}:{ret}", verdict), r
        assert (r["device"], r["device_where"]) == (True, f"{HUM}:{dev}"), r
        assert r["parallel_where"] == f"{HUM}:{par}" and r["parallel_config"] is True
        assert any(e.startswith(f"{cls} ({HUM}:{par}, from HummingExpertsBase)") for e in k[verdict])
    assert _rec(k, "BatchedHummingGroupedExperts")["format_where"] == f"{HUM}:1030"
    assert (f"BatchedHummingGroupedExperts (experts/fused_humming_moe.py:{par}, experts/fused_humming_moe.py:{dev}) "
            "admits the parallel config and 12.0 but declares the BatchedExperts format "
            "(experts/fused_humming_moe.py:1030)") in k["words"]
    # (c) named one by one: the classes whose parallel config and device check both admit 12.0
    both = sorted(r["class"] for r in k["classes"] if r["parallel_config"] is True and r["device"] is True)
    assert both == ["BatchedDeepGemmExperts", "BatchedHummingGroupedExperts", "BatchedTritonExperts",
                    "FlashInferExperts", "HummingGroupedExperts", "HummingIndexedExperts", "OAITritonExperts",
                    "UnfusedOAITritonExperts"]
    assert sorted(e.split(" (")[0] for e in k["admit"]) == ["FlashInferExperts", "HummingGroupedExperts",
                                                          "HummingIndexedExperts", "OAITritonExperts",
                                                          "UnfusedOAITritonExperts"]
    # nothing is admitted whose device check or format was not read
    assert all(r["device"] is True and r["format"] == "Standard" for r in k["classes"] if r["verdict"] == "admit")


def test_point10_twin_without_the_todo_no_caveat_is_named(venv, vllm033, tmp_path):
    """The twin of (a): a copy of vllm 0.33.0 whose FlashInferExperts._supports_parallel_config has no TODO names no
    caveat (the caveat is read from the code, not written in); FlashInferExperts still admits."""
    copy = engine_copy(vllm033, tmp_path / "v", {FI_CUTLASS: (TODO, "")})
    k = _kernels(venv, [copy], "12.0")
    assert _rec(k, "FlashInferExperts")["caveats"] == [] and k["caveats"] == {}
    assert "TODO" not in k["words"] and "caveat" not in k["words"]
    assert _entry(k, "admit", "FlashInferExperts")


def test_point10_twin_a_subclass_device_check_or_format_of_its_own_is_read_for_that_class_only(venv, vllm033,
                                                                                            tmp_path):
    """The twins of (b) and (c): a copy where HummingGroupedExperts gets its own device check that refuses 12.0
    (capability 9.0 only) files it under other_device while HummingIndexedExperts still admits; one where
    BatchedHummingGroupedExperts declares Standard admits it; one where the shared base's check no longer admits 12.0
    leaves none of the three admitting; one where a subclass's device check calls something this reader does not
    know files that class as not assessed, never admitted."""
    fmt = "    def activation_format() -> mk.FusedMoEActivationFormat:\n        return mk.FusedMoEActivationFormat.Standard\n"
    grouped = "class HummingGroupedExperts(HummingExpertsBase):\n"
    own_dev = ("    @staticmethod\n    def _supports_current_device() -> bool:\n"
               "        return current_platform.is_device_capability(90)\n\n")
    copy = engine_copy(vllm033, tmp_path / "a", {HUM: (grouped, grouped + own_dev)})
    k = _kernels(venv, [copy], "12.0")
    g = _rec(k, "HummingGroupedExperts")
    assert g["verdict"] == "other_device" and g["device"] is False
    assert g["device_where"] == f"{HUM}:{_line(copy, HUM, 'class HummingGroupedExperts') + 2}-" \
                                f"{_line(copy, HUM, 'class HummingGroupedExperts') + 3}"
    assert _rec(k, "HummingIndexedExperts")["verdict"] == "admit"
    batched = "        return mk.FusedMoEActivationFormat.BatchedExperts\n\n    @staticmethod\n    def humming_gemm_type"
    assert (vllm033 / HUM).read_text().count(batched) == 1 and (vllm033 / HUM).read_text().count(fmt) == 2
    copy = engine_copy(vllm033, tmp_path / "b", {HUM: (batched, batched.replace("BatchedExperts", "Standard"))})
    b = _rec(_kernels(venv, [copy], "12.0"), "BatchedHummingGroupedExperts")
    assert (b["verdict"], b["format"]) == ("admit", "Standard")
    copy = engine_copy(vllm033, tmp_path / "c", {HUM: (HUM_DEV, "            and platform.is_device_capability(90)\n")})
    k = _kernels(venv, [copy], "12.0")
    assert not any(e.startswith("Humming") for e in k["admit"])
    assert {_rec(k, c)["device"] for c in ("HummingIndexedExperts", "HummingGroupedExperts",
                                            "BatchedHummingGroupedExperts")} == {False}
    odd = own_dev.replace("current_platform.is_device_capability(90)", "current_platform.unread_check(12)")
    copy = engine_copy(vllm033, tmp_path / "d", {HUM: (grouped, grouped + odd)})
    k = _kernels(venv, [copy], "12.0")
    assert _rec(k, "HummingGroupedExperts")["verdict"] == "unknown"
    assert "not assessed" in _entry(k, "unknown", "HummingGroupedExperts")
    assert not _entry(k, "admit", "HummingGroupedExperts") and _entry(k, "admit", "HummingIndexedExperts")


# --- point 3: an undecided setting beside SGLang's PCIe IPC is not assessed, not dropped ---------------------------
PS = "sglang/srt/distributed/parallel_state.py"
MSCCLPP_STEP = "        if self.pymscclpp_comm is not None and should_use_pymscclpp_allreduce:\n            return \"pymscclpp\"\n"
DO_NOT_SET = """
import json
from stackprobe.probes import Context, pcie_ipc_engine as pe
from stackprobe.engines.sglang import engine as se
from stackprobe.archs import parse_arch
from stackprobe.serverconfig import ServerConfig
ctx = Context(target=parse_arch("12.0"), env={}, coverage={}, world_size=8, topology="pcie",
              server_config=ServerConfig(args={}, env={}, source="test"))
print(json.dumps(pe.do_not_set(se.installed(), ctx)))
"""


@pytest.fixture(scope="module")
def sglang_no_mscclpp_step(sglang, tmp_path_factory):
    return engine_copy(sglang, tmp_path_factory.mktemp("sg-edited"), {PS: (MSCCLPP_STEP, "")})


def test_point3_an_undecided_setting_is_kept_as_not_assessed(venv, sglang_no_mscclpp_step, fi, mscclpp_pkg):
    """Before: ``continue  # nothing read takes it``: --enable-mscclpp vanished from the list."""
    out = _run(venv, [sglang_no_mscclpp_step, fi, mscclpp_pkg], DO_NOT_SET)
    m = next(a for a in out if a["setting"] == "--enable-mscclpp")
    assert m["then"] == ""
    assert m["note"].startswith("not assessed: with it set the dispatch is undecided (flashinfer-pcie-ipc-allreduce at "
                                f"{PS}:970: ")
    assert m["note"].endswith("is decided at run time) and no step read here takes the tensor instead")


def test_point3_twin_the_real_release_decides_mscclpp_takes_it(venv, sglang, fi, mscclpp_pkg):
    """The twin: with the ``return "pymscclpp"`` step in place the same reading names MSCCL++ as what serves."""
    out = _run(venv, [sglang, fi, mscclpp_pkg], DO_NOT_SET)
    m = next(a for a in out if a["setting"] == "--enable-mscclpp")
    assert m["then"] == "mscclpp" and not m["note"].startswith("not assessed")


def test_point3_the_summary_lists_it_as_not_assessed_not_as_do_not_set(drive, sglang_no_mscclpp_step, sglang, fi,
                                                                      mscclpp_pkg, nvcc131):
    """The report: the undecided --enable-mscclpp is under "not assessed" in the headline and the Summary block, never
    "( serves instead)" under "do not set with it"; the twin (the real release) lists it under "do not set with it"."""
    from stackprobe.summary import block
    from stackprobe.userwords import headline

    env = {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1"}
    _, report = drive([sglang_no_mscclpp_step, fi, mscclpp_pkg], backends=("flashinfer-pcie-ipc-allreduce",),
                      path_first=[nvcc131], env=env)
    h = headline(report)
    assert not any("--enable-mscclpp" in a for a in h["avoid"])
    na = [x for x in h["not_assessed"] if x.startswith("--enable-mscclpp with flashinfer-pcie-ipc-allreduce on ")]
    assert na and "(not assessed: with it set the dispatch is undecided" in na[0]
    lines = block(report)
    assert any(ln.startswith("not assessed (") and "--enable-mscclpp with flashinfer-pcie-ipc-allreduce on" in ln
               for ln in lines)
    assert not any(" serves instead" in ln and "--enable-mscclpp" in ln for ln in lines)
    # the path's own cause keeps it apart from the advice too (it was printed after "do not set with it:")
    causes = [v.cause for v in report.verdicts if v.backend == "flashinfer-pcie-ipc-allreduce" and "--enable-mscclpp" in v.cause]
    assert causes and all("not assessed with it: --enable-mscclpp" in c for c in causes), causes
    assert not any("do not set with it: --enable-mscclpp" in c.split("; not assessed with it:")[0] for c in causes)
    _, real = drive([sglang, fi, mscclpp_pkg], backends=("flashinfer-pcie-ipc-allreduce",), path_first=[nvcc131],
                    env=env)
    assert any(a.startswith("--enable-mscclpp (mscclpp serves instead") for a in headline(real)["avoid"])
    assert not any("--enable-mscclpp" in x for x in headline(real)["not_assessed"])


# --- point 4: the fusion flag's values, not read, are not assessed -----------------------------------------------
FUSION = "flashinfer-allreduce-fusion"
EXEC = "sglang/srt/arg_groups/fields/exec_.py"
LITERAL = 'Optional[Literal["auto", "trtllm", "mnnvl", "cutedsl"]]'


def _user_setting(d: dict) -> str:
    v = next(x for x in d["verdicts"] if x["backend"] == FUSION and x.get("engine") == "sglang")
    return next(e["value"] for e in v["evidence"] if e["what"] == "user setting")


def test_point4_unread_choices_are_not_assessed_not_auto(drive, sglang, fi, nvcc131, tmp_path):
    """Before: a copy whose flag type the reader cannot list read "--flashinfer-allreduce-fusion-backend auto", as if
    auto were the one value that reaches the raise."""
    copy = engine_copy(sglang, tmp_path / "sg", {EXEC: (LITERAL, "Optional[FusionBackendName]")})
    d, report = drive([copy, fi], backends=(FUSION,), path_first=[nvcc131])
    setting = _user_setting(d)
    assert setting.startswith("--flashinfer-allreduce-fusion-backend auto (read for auto only; its other values not "
                              "assessed: --flashinfer-allreduce-fusion-backend takes a value but its choices are not "
                              f"read here ({EXEC}:770))")
    from stackprobe.userwords import headline_line
    assert "do not set: --flashinfer-allreduce-fusion-backend auto (read for auto only" in headline_line(report)


def test_point4_twin_the_real_release_reads_every_value(drive, sglang, fi, nvcc131):
    """The twin: the release as published lists its four values, all of which reach the raise."""
    d, _ = drive([sglang, fi], backends=(FUSION,), path_first=[nvcc131])
    assert _user_setting(d).startswith("--flashinfer-allreduce-fusion-backend (any value: auto, trtllm, mnnvl, cutedsl)")
    assert "not assessed" not in _user_setting(d)


# --- point 5: "start-up failure on PCIe" only where the topology was read ----------------------------------------
def test_point5_the_start_up_failure_line_says_how_the_topology_was_known(drive, vllm033, fi):
    """Before: "start-up failure on PCIe" whatever the report's topology source (assumed, or none at all)."""
    import copy

    from stackprobe.summary import block

    _, given = drive([vllm033, fi], env={"VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": "1"}, engine="vllm",
                     backends=("ep-flashinfer-a2a",))

    def dns(report) -> list[str]:
        return [ln for ln in block(report) if ln.startswith("do not set:")]
    assert given.options["topology_source"] == "given"
    assert len(dns(given)) == 1 and "(ep-flashinfer-a2a: start-up failure on PCIe: " in dns(given)[0]
    assumed = copy.copy(given)
    assumed.options = {**given.options, "topology_source": "assumed: no GPUs here; the target host is PCIe (pass "
                                                           "--topology nvlink to change)"}
    assert "(ep-flashinfer-a2a: start-up failure on PCIe (assumed, not read: no GPUs here): " in dns(assumed)[0]
    unknown = copy.copy(given)
    unknown.options = {k: v for k, v in given.options.items() if k not in ("topology", "topology_source")}
    assert "(ep-flashinfer-a2a: start-up failure on this topology (not read; without NVLink): " in dns(unknown)[0]
    assert not any("on PCIe" in ln for ln in dns(unknown))
