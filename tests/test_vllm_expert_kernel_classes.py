"""vLLM's expert-kernel list for the two-sided all-to-all, as a maintainer review of the 0.33.0 report read it
(points 11-15), checked on the real wheel; each reading has a failing twin on an edited copy of the wheel.

11. a device check that branches on the platform (``if p.is_cuda():``) and compares capability tuples
    (``(9, 0) <= (cap.major, cap.minor) < (13, 0)``) is read: OAITritonExperts / UnfusedOAITritonExperts admit 12.0;
12. a composite (FallbackExperts) admits only where the halves its own ``get_clses`` returns admit;
13. only kernel classes are listed: a plain mixin (TrtLlmFp8ExpertsBase) and a shared parent vLLM names nowhere else
    (Mxfp8TritonExpertsBase) are listed apart, as bases;
14. two kernel classes of one name (CPUExpertsInt4) are told apart by file;
15. a kernel whose ``_supports_parallel_config`` raises (NaiveBatchedExperts) is refused with FILE:LINE, not dropped.
"""
from __future__ import annotations

import pytest

from test_verdict_leftovers import _entry, _kernels, _line, _rec, vllm033  # noqa: F401 - the shared wheel fixture
from validate_support import engine_copy

pytestmark = pytest.mark.network

FM = "vllm/model_executor/layers/fused_moe/experts"
OAI = f"{FM}/gpt_oss_triton_kernels_moe.py"
GATE = "        return cap is not None and (9, 0) <= (cap.major, cap.minor) < (13, 0)\n"
TOC = f"{FM}/triton_cutlass_moe.py"
HALVES = "        return (CutlassExpertsFp8, TritonExperts)\n"
NAIVE = f"{FM}/fused_batched_moe.py"
NAIVE_RAISE = ("    def _supports_parallel_config(moe_parallel_config: FusedMoEParallelConfig) -> bool:\n"
               "        raise NotImplementedError(\n"
               "            \"NaiveBatchedExperts is not yet used by an Oracle. \"\n")


def _labels(k: dict, key: str) -> list[str]:
    return [e.split(" (")[0] for e in k[key]]


# --- 11: the OAI Triton device gate (a platform branch, a tuple range) ---------------------------------------------
def test_point11_oai_triton_experts_admit_12_0_read_from_their_tuple_range(venv, vllm033):
    k = _kernels(venv, [vllm033], "12.0")
    dev = _line(vllm033, OAI, "def _triton_kernel_moe_supports_current_device")
    assert (vllm033 / OAI).read_text().count(GATE) == 1 and dev < _line(vllm033, OAI, GATE.rstrip("\n"))
    par = 1045      # BaseOAITritonExperts._supports_parallel_config, its body `return True`
    lines = (vllm033 / OAI).read_text().splitlines()
    assert lines[par - 1].startswith("    def _supports_parallel_config(") and lines[par].strip() == "return True"
    for cls in ("OAITritonExperts", "UnfusedOAITritonExperts"):
        r = _rec(k, cls)
        assert (r["verdict"], r["parallel_config"], r["device"], r["format"]) == ("admit", True, True, "Standard"), r
        assert r["format_where"] in (f"{OAI}:1105", f"{OAI}:1200")
        assert r["device_assumes"] == ["has_triton_kernels()"]
        assert _entry(k, "admit", cls).startswith(f"{cls} ({OAI}:{par}, from BaseOAITritonExperts); device check ")
    # the same range read for other targets: 9.0 inside it, 8.9 and 13.0 outside
    assert "OAITritonExperts" in _labels(_kernels(venv, [vllm033], "9.0"), "admit")
    for cc in ("8.9", "13.0"):
        assert _rec(_kernels(venv, [vllm033], cc), "OAITritonExperts")["verdict"] == "other_device", cc


def test_point11_twin_a_range_that_ends_below_12_0_or_an_unread_branch_admits_nothing(venv, vllm033, tmp_path):
    """Twins: a copy whose range ends at (12, 0) files both under other_device; one whose platform branch asks
    something this reader does not know leaves both not assessed, never admitted."""
    short = engine_copy(vllm033, tmp_path / "a", {OAI: (GATE, GATE.replace("(13, 0)", "(12, 0)"))})
    k = _kernels(venv, [short], "12.0")
    assert {_rec(k, c)["verdict"] for c in ("OAITritonExperts", "UnfusedOAITritonExperts")} == {"other_device"}
    odd = engine_copy(vllm033, tmp_path / "b", {OAI: ("    if p.is_cuda():\n        cap = p.get_device_capability()",
                                                      "    if p.unread_check():\n        cap = p.get_device_capability()")})
    k = _kernels(venv, [odd], "12.0")
    for cls in ("OAITritonExperts", "UnfusedOAITritonExperts"):
        assert _rec(k, cls)["verdict"] == "unknown" and not _entry(k, "admit", cls)
        assert "; not assessed: its device check" in _entry(k, "unknown", cls)
        assert "p.unread_check()" in _entry(k, "unknown", cls)


# --- 12: a composite admits only where its halves do ----------------------------------------------------------------
def test_point12_fallback_experts_refuse_as_their_halves_read_from_get_clses_do(venv, vllm033):
    k = _kernels(venv, [vllm033], "12.0")
    for cls, halves, rel in (("TritonOrCutlassExperts", ["CutlassExpertsFp8", "TritonExperts"], TOC),
                             ("TritonOrDeepGemmExperts", ["DeepGemmExperts", "TritonExperts"],
                              f"{FM}/triton_deep_gemm_moe.py")):
        r = _rec(k, cls)
        assert (r["verdict"], r["parallel_config"]) == ("refuse", False), r
        assert [h.split(" (")[0] for h in r["halves"]] == halves
        assert r["halves_where"] == f"{rel}:{_line(vllm033, rel, '        return (' + halves[0])}"
        assert all(_rec(k, h)["parallel_config"] is False for h in halves)
        e = _entry(k, "refuse", cls)
        assert all(f"{h} (" in e and ") refuses" in e for h in halves), e
        assert f"{cls} refuses as its halves do ({', '.join(halves)}, from " in k["words"]
    assert not any(e.startswith("TritonOr") for e in k["unknown"] + k["admit"])


def test_point12_twin_halves_that_admit_make_it_admit_one_refusing_half_refuses_unread_halves_not_assessed(
        venv, vllm033, tmp_path):
    both = engine_copy(vllm033, tmp_path / "a", {TOC: (HALVES, "        return (FlashInferExperts, FlashInferExperts)\n")})
    r = _rec(_kernels(venv, [both], "12.0"), "TritonOrCutlassExperts")
    assert (r["verdict"], r["parallel_config"], r["device"], r["format"]) == ("admit", True, True, "Standard"), r
    one = engine_copy(vllm033, tmp_path / "b", {TOC: (HALVES, "        return (FlashInferExperts, TritonExperts)\n")})
    k = _kernels(venv, [one], "12.0")
    assert _rec(k, "TritonOrCutlassExperts")["verdict"] == "refuse"
    e = _entry(k, "refuse", "TritonOrCutlassExperts")
    assert "FlashInferExperts (" in e and "TritonExperts (" in e
    unread = engine_copy(vllm033, tmp_path / "c", {TOC: (HALVES, "        return _pick_classes()\n")})
    k = _kernels(venv, [unread], "12.0")
    assert _rec(k, "TritonOrCutlassExperts")["verdict"] == "unknown"
    assert "; not assessed: " in _entry(k, "unknown", "TritonOrCutlassExperts")
    assert _rec(k, "TritonOrDeepGemmExperts")["verdict"] == "refuse"     # the other composite is still read


# --- 13: only kernel classes are listed -------------------------------------------------------------------------------
def test_point13_a_mixin_and_a_shared_parent_are_listed_apart_as_bases(venv, vllm033):
    k = _kernels(venv, [vllm033], "12.0")
    names = {r["class"] for r in k["classes"]}
    for base, why in (("TrtLlmFp8ExpertsBase", "not a kernel class"), ("Mxfp8TritonExpertsBase", "a shared parent")):
        assert base not in names
        assert not any(e.startswith(base + " (") for key in ("admit", "refuse", "other_device", "unknown")
                       for e in k[key])
        hit = [b for b in k["bases"] if b.startswith(base + " (")]
        assert len(hit) == 1 and why in hit[0], k["bases"]
    mixin = _line(vllm033, f"{FM}/trtllm_fp8_moe.py", "class TrtLlmFp8ExpertsBase:")
    parent = _line(vllm033, f"{FM}/mxfp8_emulation_moe.py", "class Mxfp8TritonExpertsBase(TritonExperts):")
    assert any(b.startswith(f"TrtLlmFp8ExpertsBase ({FM}/trtllm_fp8_moe.py:{mixin}): ") for b in k["bases"])
    assert "Mxfp8EmulationTritonExperts" in names and "TrtLlmFp8ExpertsModular" in names
    assert f"left out as no kernel vLLM selects: TrtLlmFp8ExpertsBase (experts/trtllm_fp8_moe.py:{mixin}, a mixin), " \
           f"Mxfp8TritonExpertsBase (experts/mxfp8_emulation_moe.py:{parent}, a shared parent)" in k["words"]


def test_point13_twin_a_subclass_without_the_kernel_base_is_a_mixin_and_a_named_parent_is_a_kernel(
        venv, vllm033, tmp_path):
    rel = f"{FM}/trtllm_fp8_moe.py"
    mod = "class TrtLlmFp8ExpertsModular(TrtLlmFp8ExpertsBase, mk.FusedMoEExpertsModular):"
    copy = engine_copy(vllm033, tmp_path / "a", {rel: (mod, "class TrtLlmFp8ExpertsModular(TrtLlmFp8ExpertsBase):")})
    k = _kernels(venv, [copy], "12.0")
    assert "TrtLlmFp8ExpertsModular" not in {r["class"] for r in k["classes"]}
    assert any(b.startswith("TrtLlmFp8ExpertsModular (") and "not a kernel class" in b for b in k["bases"])
    aiter = f"{FM}/aiter_mxfp8_moe.py"
    named = "class AiterMxfp8Experts(Mxfp8TritonExpertsBase):"
    copy = engine_copy(vllm033, tmp_path / "b", {aiter: (named, "DEFAULT_EXPERTS = Mxfp8TritonExpertsBase\n\n\n" + named)})
    k = _kernels(venv, [copy], "12.0")
    assert not any(b.startswith("Mxfp8TritonExpertsBase (") for b in k["bases"])
    assert _rec(k, "Mxfp8TritonExpertsBase")["verdict"] == "refuse"


# --- 14: same-named classes told apart by file -----------------------------------------------------------------------
def test_point14_two_cpu_experts_int4_are_told_apart_by_file(venv, vllm033):
    k = _kernels(venv, [vllm033], "12.0")
    recs = [r for r in k["classes"] if r["class"] == "CPUExpertsInt4"]
    mono = _line(vllm033, f"{FM}/cpu_int4_moe.py", "class CPUExpertsInt4(")
    modular = _line(vllm033, f"{FM}/cpu_moe.py", "class CPUExpertsInt4(")
    assert sorted((r["label"], r["where"], r["verdict"]) for r in recs) == [
        (f"CPUExpertsInt4 [experts/cpu_int4_moe.py:{mono}]", f"{FM}/cpu_int4_moe.py:{mono}", "refuse"),
        (f"CPUExpertsInt4 [experts/cpu_moe.py:{modular}]", f"{FM}/cpu_moe.py:{modular}", "other_device")]
    assert f"CPUExpertsInt4 [experts/cpu_int4_moe.py:{mono}]" in _labels(k, "refuse")
    assert f"CPUExpertsInt4 [experts/cpu_moe.py:{modular}]" in _labels(k, "other_device")
    assert "CPUExpertsInt4," not in k["words"] and f"CPUExpertsInt4 [experts/cpu_moe.py:{modular}]" in k["words"]
    assert [r["label"] for r in k["classes"] if r["class"] == "FlashInferExperts"] == ["FlashInferExperts"]


def test_point14_twin_once_the_names_differ_no_file_is_added(venv, vllm033, tmp_path):
    copy = engine_copy(vllm033, tmp_path / "a", {f"{FM}/cpu_int4_moe.py": ("class CPUExpertsInt4(",
                                                                           "class CPUExpertsInt4Mono(")})
    k = _kernels(venv, [copy], "12.0")
    assert [r["label"] for r in k["classes"] if r["class"] == "CPUExpertsInt4"] == ["CPUExpertsInt4"]
    assert "CPUExpertsInt4 [" not in k["words"] and "CPUExpertsInt4Mono" in _labels(k, "refuse")


# --- 15: a check that raises is a refusal with its line -------------------------------------------------------------
def test_point15_naive_batched_experts_raises_and_is_refused_with_its_line(venv, vllm033):
    k = _kernels(venv, [vllm033], "12.0")
    text = (vllm033 / NAIVE).read_text()
    assert text.count(NAIVE_RAISE) == 1
    at = text[: text.index(NAIVE_RAISE)].count("\n") + 2     # the raise, the line below the def
    assert at == 616
    r = _rec(k, "NaiveBatchedExperts")
    assert (r["verdict"], r["raises"], r["parallel_where"]) == ("refuse", "NotImplementedError", f"{NAIVE}:{at}")
    assert _entry(k, "refuse", "NaiveBatchedExperts") == \
        f"NaiveBatchedExperts ({NAIVE}:{at}); raises NotImplementedError: not usable"
    assert f"NaiveBatchedExperts (experts/fused_batched_moe.py:{at}) raises NotImplementedError: not usable" \
        in k["words"]
    assert "NaiveBatchedExperts" in _labels(_kernels(venv, [vllm033], "none"), "refuse")   # no target: still refused


def test_point15_twin_a_check_that_answers_is_read_not_refused_as_raising(venv, vllm033, tmp_path):
    """The twin: a copy whose NaiveBatchedExperts._supports_parallel_config returns True is read like any other
    kernel (refused here by its BatchedExperts format, with no 'raises')."""
    ok = NAIVE_RAISE.split("\n")[0] + "\n        return True\n        raise NotImplementedError(\n"
    copy = engine_copy(vllm033, tmp_path / "a", {NAIVE: (NAIVE_RAISE.rsplit("\n", 2)[0] + "\n", ok)})
    k = _kernels(venv, [copy], "12.0")
    r = _rec(k, "NaiveBatchedExperts")
    assert "raises" not in r and r["parallel_config"] is True and r["format"] == "BatchedExperts"
    e = _entry(k, "refuse", "NaiveBatchedExperts")
    assert "raises" not in e and "; activation format BatchedExperts (" in e


# --- an activation format this reader does not know is not assessed, never passed ----------------------------------
HUM = f"{FM}/fused_humming_moe.py"
HUM_FMT = ("class HummingIndexedExperts(HummingExpertsBase):\n    def finalize_weight_and_reduce_impl(self) -> "
           "mk.TopKWeightAndReduce:\n        return TopKWeightAndReduceNoOP()\n\n    @staticmethod\n"
           "    def activation_format() -> mk.FusedMoEActivationFormat:\n"
           "        return mk.FusedMoEActivationFormat.Standard\n")


def test_an_unknown_activation_format_is_not_assessed_and_its_twin_standard_admits(venv, vllm033, tmp_path):
    """vllm 0.34.0 declares PaddedStandard for the Humming kernels; the format check knew only Standard and
    BatchedExperts, so such a kernel was admitted unchecked. An edited 0.33.0 whose HummingIndexedExperts declares
    PaddedStandard leaves that class not assessed (its format named); the real wheel (Standard) admits it."""
    assert _rec(_kernels(venv, [vllm033], "12.0"), "HummingIndexedExperts")["verdict"] == "admit"
    padded = engine_copy(vllm033, tmp_path / "p", {HUM: (HUM_FMT, HUM_FMT.replace(".Standard\n", ".PaddedStandard\n"))})
    k = _kernels(venv, [padded], "12.0")
    r = _rec(k, "HummingIndexedExperts")
    assert r["verdict"] == "unknown" and r["format"] == "PaddedStandard", r
    assert "activation format PaddedStandard" in _entry(k, "unknown", "HummingIndexedExperts")
    assert _rec(k, "HummingGroupedExperts")["verdict"] == "admit"      # the untouched sibling still reads Standard


# --- a kernel subclass outside fused_moe/ (a model's own) is read too ---------------------------------------------------
TOY = ("from vllm.model_executor.layers.fused_moe.experts.flashinfer_cutlass_moe import FlashInferExperts\n\n\n"
       "class ToyModelExperts(FlashInferExperts):\n    pass\n")


def test_a_kernel_subclass_outside_fused_moe_is_listed_with_its_file(venv, vllm033, tmp_path):
    """A reviewer's point: model-specific kernel subclasses live outside ``fused_moe/``. Real wheel: vllm 0.33.0's
    four MuseSpark kernels (``vllm/models/muse_spark/{amd,nvidia}/muse_moe_runner.py``) are read with their files:
    three refuse, the NVFP4 modular one admits the all-to-all but its device check refuses 12.0; none admits (the
    verdict does not move). Twin: a copy with a model's own subclass of FlashInferExperts under ``models/`` lists
    it, admitted through its parent's checks (before, the scan read ``fused_moe/`` only and named neither)."""
    k = _kernels(venv, [vllm033], "12.0")
    muse = {r["class"]: (r["where"].split(":")[0], r["verdict"]) for r in k["classes"] if "fused_moe" not in r["where"]}
    nv, amd = "vllm/models/muse_spark/nvidia/muse_moe_runner.py", "vllm/models/muse_spark/amd/muse_moe_runner.py"
    assert muse == {"MuseSparkTritonExperts": (amd, "refuse"), "MuseSparkAiterExperts": (amd, "refuse"),
                    "MuseSparkTrtLlmNvFp4Experts": (nv, "refuse"),
                    "MuseSparkTrtLlmNvFp4ExpertsModular": (nv, "other_device")}, muse
    assert not [e for e in k["admit"] if "MuseSpark" in e]
    copy = engine_copy(vllm033, tmp_path / "a", {})
    (copy / "vllm" / "model_executor" / "models" / "toy_moe.py").write_text(TOY)
    k2 = _kernels(venv, [copy], "12.0")
    (rec,) = [r for r in k2["classes"] if r["class"] == "ToyModelExperts"]
    assert rec["where"].startswith("vllm/model_executor/models/toy_moe.py:4"), rec
    assert rec["verdict"] == "admit" and "ToyModelExperts" in _labels(k2, "admit"), rec
    assert "FlashInferExperts" in _labels(k2, "admit")
