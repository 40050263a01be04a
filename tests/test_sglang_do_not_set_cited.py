"""Every entry of SGLang's "do not set with it" list for the PCIe IPC allreduce
(:func:`stackprobe.probes.pcie_ipc_engine.do_not_set`) cites, read from the installed source, the line where the
setting takes effect against PCIe IPC (``where``: the condition or the dispatch step) and where SGLang reads it
(``read_at``); on the real sglang 0.5.23 wheel (+ flashinfer-python 0.7.2), and sglang 0.5.9 (no PCIe IPC: no list).

Before: ``--enable-symm-mem``, ``SGLANG_USE_1STAGE_ALLREDUCE=1`` and ``SGLANG_ENABLE_DETERMINISTIC_INFERENCE=1`` read
"(... serves instead)" with no line, and ``--enable-deterministic-inference`` cited only its ``NCCL_ALGO`` pin.

One test per kind of entry: an earlier dispatch step takes the tensor (``--enable-symm-mem``), the communicator is not
built (``eligible_group``'s ``if deterministic``: the flag and both variables), a path decided per call at run time
(``--enable-mscclpp`` with an importable mscclpp package). Failing twins: copies of the wheel where the lines moved
(the new lines are cited, never the stale ones) or where the read is gone (the entry is not assessed, no claim).

A variable SGLang overwrites from a flag on every start-up is not a setting of its own (maintainer review of 0.5.23):
``handle_environment_variables`` (``serving_hook.py:444``) writes SGLANG_ENABLE_DETERMINISTIC_INFERENCE from
``--enable-deterministic-inference`` unconditionally, run by ``run_resolution_pipeline`` (``pipeline.py:332``), so
``SGLANG_ENABLE_DETERMINISTIC_INFERENCE=1`` is not listed; the flag's entry says so, lists everything its branch sets
or switches off (``also_sets``), and the caveat that SGLANG_USE_1STAGE_ALLREDUCE, when set, decides first
(``parallel_state.py:1359-1360``). Twins: the write made conditional (the variable is listed again), an extra
``os.environ`` write in the branch (listed), the precedence removed (no caveat).
"""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from validate_support import engine_copy, suite_env

pytestmark = pytest.mark.network

PCIE = "sglang/srt/distributed/device_communicators/pcie_ipc_ar.py"
PS = "sglang/srt/distributed/parallel_state.py"
ALLOC = "sglang/srt/distributed/device_communicators/pynccl_allocator.py"
HOOK = "sglang/srt/arg_groups/serving_hook.py"
ATT = "sglang/srt/arg_groups/attention_hook.py"
PIPE = "sglang/srt/arg_groups/pipeline.py"
PIN = '                os.environ["NCCL_ALGO"] = "allreduce:tree"\n'
RUNS = "    run_hook(handle_environment_variables, server_args)\n"
DET_IF = "    if deterministic:\n        _warn_deterministic_wins()\n"
SYMM_READ = "def is_symmetric_memory_enabled():\n    try:\n        return get_exec().comm.enable_symm_mem\n"
ONE_STAGE = ("        if envs.SGLANG_USE_1STAGE_ALLREDUCE.is_set():\n"
             "            return envs.SGLANG_USE_1STAGE_ALLREDUCE.get()\n"
             "        return envs.SGLANG_ENABLE_DETERMINISTIC_INFERENCE.get()\n")
FLAG_SETS = ('    envs.SGLANG_ENABLE_DETERMINISTIC_INFERENCE.set(\n'
             '        "1" if cfg.enable_deterministic_inference else "0"\n    )\n')
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
CITE = re.compile(r"(sglang/[\w/]+\.py):(\d+)")


def _do_not_set(venv, paths) -> dict[str, dict]:
    p = subprocess.run([str(venv), "-c", DO_NOT_SET], capture_output=True, text=True, env=suite_env(paths),
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return {a["setting"]: a for a in json.loads(p.stdout.strip().splitlines()[-1])}


def _line(wheel, cite: str) -> str:
    """The text at ``sglang/FILE:LINE`` in ``wheel`` (AssertionError when the file or the line is not there)."""
    m = CITE.fullmatch(cite)
    assert m, cite
    lines = (wheel / m.group(1)).read_text().splitlines()
    assert int(m.group(2)) <= len(lines), cite
    return lines[int(m.group(2)) - 1]


def _assert_cited(wheel, a: dict, where_has: str, read_has: str) -> None:
    """``where`` and ``read_at`` name lines of the wheel holding ``where_has`` / ``read_has``; every file:line in
    ``why`` and in the note the cause prints exists; the note prints ``where``."""
    from stackprobe.userwords import _unassessed

    assert not _unassessed(a), a
    assert where_has in _line(wheel, a["where"]), (a["where"], _line(wheel, a["where"]))
    assert read_has in _line(wheel, a["read_at"]), (a["read_at"], _line(wheel, a["read_at"]))
    for cite in CITE.finditer(a["why"] + " " + a["note"]):
        _line(wheel, cite.group(0))
    assert a["note"].endswith(a["where"]) or f"({a['where']})" in a["note"]


@pytest.fixture(scope="module")
def released(venv, sglang, fi):
    return _do_not_set(venv, [sglang, fi])


@pytest.fixture(scope="module")
def moved(sglang, tmp_path_factory):
    """sglang 0.5.23 with two comment lines above ``if deterministic:`` and one above the symmetric-memory read."""
    return engine_copy(sglang, tmp_path_factory.mktemp("sg-moved"), {
        PCIE: (DET_IF, "    # moved\n    # moved\n" + DET_IF),
        ALLOC: (SYMM_READ, SYMM_READ.replace("    try:\n", "    # moved\n    try:\n"))})


@pytest.fixture(scope="module")
def unread(sglang, tmp_path_factory):
    """sglang 0.5.23 where the reads are gone: ``_deterministic_collectives_enabled`` no longer reads
    SGLANG_USE_1STAGE_ALLREDUCE, ``is_symmetric_memory_enabled`` no longer reads ``enable_symm_mem``, and the flag no
    longer sets SGLANG_ENABLE_DETERMINISTIC_INFERENCE."""
    return engine_copy(sglang, tmp_path_factory.mktemp("sg-unread"), {
        PS: (ONE_STAGE, "        return envs.SGLANG_ENABLE_DETERMINISTIC_INFERENCE.get()\n"),
        ALLOC: (SYMM_READ, SYMM_READ.replace("enable_symm_mem", "symm_mem_on")),
        HOOK: (FLAG_SETS, "    pass\n")})


# --- 0.5.23: one test per kind ------------------------------------------------------------------------------------
def test_an_earlier_step_cites_the_step_and_where_it_reads_the_flag(sglang, released):
    symm = released["--enable-symm-mem"]
    assert symm["then"] == "nccl-symm-mem"
    _assert_cited(sglang, symm, "self.is_symmetric_memory_enabled()", "enable_symm_mem")
    assert symm["where"].startswith(f"{PS}:") and symm["read_at"].startswith(f"{ALLOC}:")
    assert "before PCIe IPC's step" in symm["why"]


def test_not_built_cites_eligible_groups_condition_and_the_variables_read(sglang, released):
    a = released["SGLANG_USE_1STAGE_ALLREDUCE=1"]
    assert a["then"] == "NCCL (pynccl)", a
    _assert_cited(sglang, a, "if deterministic:", "SGLANG_USE_1STAGE_ALLREDUCE")
    assert a["where"].startswith(f"{PCIE}:") and "_deterministic_collectives_enabled" in a["why"]


def test_the_flag_cites_the_variable_it_sets_and_keeps_its_nccl_algo_pin(sglang, released):
    det = released["--enable-deterministic-inference"]
    assert det["then"] == "NCCL (pynccl, allreduce algorithm tree)"
    _assert_cited(sglang, det, "if deterministic:", "SGLANG_ENABLE_DETERMINISTIC_INFERENCE")
    sets = re.search(rf"it sets SGLANG_ENABLE_DETERMINISTIC_INFERENCE \(({HOOK}:\d+)\)", det["why"])
    assert sets and "SGLANG_ENABLE_DETERMINISTIC_INFERENCE.set(" in _line(sglang, sets.group(1))
    assert det["why"].endswith("; it sets NCCL_ALGO=allreduce:tree (sglang/srt/arg_groups/attention_hook.py:676)")


def test_a_path_decided_at_run_time_cites_the_exclusion_in_pcie_ipcs_step(venv, sglang, fi, mscclpp_pkg):
    m = _do_not_set(venv, [sglang, fi, mscclpp_pkg])["--enable-mscclpp"]
    assert m["then"] == "mscclpp"
    _assert_cited(sglang, m, "not should_use_pymscclpp_allreduce", "use_mscclpp")
    assert m["note"].startswith("MSCCL++ serves captured decode instead: ")


def test_every_entry_of_the_release_is_cited(released):
    assert set(released) == {"--enable-symm-mem", "--enable-deterministic-inference", "SGLANG_USE_1STAGE_ALLREDUCE=1"}
    assert all(a.get("where") and a.get("read_at") for a in released.values())


# --- failing twins ------------------------------------------------------------------------------------------------
def test_twin_moved_lines_are_cited_where_they_are_now(venv, moved, fi, sglang, released):
    out = _do_not_set(venv, [moved, fi])
    for setting in ("--enable-deterministic-inference", "SGLANG_USE_1STAGE_ALLREDUCE=1"):
        a, old = out[setting], released[setting]
        _assert_cited(moved, a, "if deterministic:", "SGLANG_")
        assert int(a["where"].rsplit(":", 1)[1]) == int(old["where"].rsplit(":", 1)[1]) + 2
        assert old["where"] not in a["why"] + a["note"] + a["where"]
        assert "if deterministic:" not in _line(moved, old["where"])       # the stale line holds something else
    symm, old = out["--enable-symm-mem"], released["--enable-symm-mem"]
    _assert_cited(moved, symm, "self.is_symmetric_memory_enabled()", "enable_symm_mem")
    assert int(symm["read_at"].rsplit(":", 1)[1]) == int(old["read_at"].rsplit(":", 1)[1]) + 1
    assert old["read_at"] not in symm["why"] + symm["note"]


def test_twin_a_read_that_is_gone_leaves_the_entry_not_assessed(venv, unread, fi, released):
    from stackprobe.userwords import _unassessed

    out = _do_not_set(venv, [unread, fi])
    for setting in ("--enable-symm-mem",):
        a = out[setting]
        assert _unassessed(a) and a["then"] == "" and "where" not in a, a
        assert a["note"].startswith("not assessed: with it set the dispatch read gives ")
        assert "was not found in its source" in a["note"]
    # deterministic mode is run from _deterministic_collectives_enabled's own code (test_sglang_fail_open point 3): it no
    # longer reads SGLANG_USE_1STAGE_ALLREDUCE, nor does the flag write the variable it reads, so neither turns PCIe
    # IPC off here and neither is listed (they read "not assessed" while the dispatch assumed 0.5.23's logic)
    assert "SGLANG_USE_1STAGE_ALLREDUCE=1" not in out and "--enable-deterministic-inference" not in out, out
    # the flag no longer writes the variable, so it is a setting of its own again: listed, and its read cited
    kept = out["SGLANG_ENABLE_DETERMINISTIC_INFERENCE=1"]
    _assert_cited(unread, kept, "if deterministic:", "SGLANG_ENABLE_DETERMINISTIC_INFERENCE")
    assert "SGLANG_ENABLE_DETERMINISTIC_INFERENCE=1" not in released
    assert not _unassessed(released["--enable-symm-mem"])


# --- a variable SGLang overwrites from a flag; what the flag's branch sets; which variable decides first ------------
@pytest.fixture(scope="module")
def edited(sglang, tmp_path_factory):
    """sglang 0.5.23 where the write of SGLANG_ENABLE_DETERMINISTIC_INFERENCE sits under ``if
    cfg.enable_deterministic_inference:`` (no longer on every start-up), the deterministic branch writes one more
    variable after NCCL_ALGO, and ``_deterministic_collectives_enabled`` no longer lets SGLANG_USE_1STAGE_ALLREDUCE
    decide first."""
    return engine_copy(sglang, tmp_path_factory.mktemp("sg-edited"), {
        HOOK: (FLAG_SETS, "    if cfg.enable_deterministic_inference:\n    " + FLAG_SETS.replace("\n    ", "\n        ")),
        ATT: (PIN, PIN + '                os.environ["NCCL_TWIN_EXTRA"] = "1"\n'),
        PS: (ONE_STAGE, "        return envs.SGLANG_ENABLE_DETERMINISTIC_INFERENCE.get() or "
                        "envs.SGLANG_USE_1STAGE_ALLREDUCE.get()\n")})


def test_a_variable_the_flag_overwrites_at_start_up_is_not_listed_and_the_flag_says_so(sglang, released):
    assert "SGLANG_ENABLE_DETERMINISTIC_INFERENCE=1" not in released
    det = released["--enable-deterministic-inference"]
    [o] = det["overwrites"]
    assert o["variable"] == "SGLANG_ENABLE_DETERMINISTIC_INFERENCE" and o["flag"] == "--enable-deterministic-inference"
    assert "envs.SGLANG_ENABLE_DETERMINISTIC_INFERENCE.set(" in _line(sglang, o["set_at"])
    assert _line(sglang, o["set_at"]).startswith("    envs.")          # a statement of the function's own body
    assert f"run_hook({o['function']}, server_args)" in _line(sglang, o["runs_at"])
    assert o["runs_at"].startswith(f"{PIPE}:") and o["caller"] == "run_resolution_pipeline"
    [on] = o["also_on"]             # rl_on_policy_target declares the flag on itself
    assert "cfg.rl_on_policy_target is not None" in _line(sglang, CITE.search(on).group(0))
    said = (f"SGLANG_ENABLE_DETERMINISTIC_INFERENCE set alone has no effect: SGLang overwrites it from "
            f"--enable-deterministic-inference at start-up ({o['set_at']}, in handle_environment_variables, which "
            f"run_resolution_pipeline runs on every launch, {o['runs_at']})")
    assert said in det["why"] and said in det["note"]      # the summary prints why, the answer's cause the note


def test_also_sets_lists_every_variable_the_branch_writes_and_the_paths_it_switches_off(sglang, released):
    det = released["--enable-deterministic-inference"]
    also = det["also_sets"]
    for item in also:               # every item cites a line of the wheel naming what it sets
        what = item.split("=")[0].split(" ")[0]
        text = _line(sglang, CITE.findall(item)[-1][0] + ":" + CITE.findall(item)[-1][1])
        assert (what in text if not what.startswith("--") else what[2:].replace("-", "_") in text), (item, text)
    names = [x.split("=")[0].split(" ")[0] for x in also]
    for var in ("NCCL_ALGO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "SGLANG_FLASHINFER_MOE_FUSED_FINALIZE",
                "SGLANG_ENABLE_DETERMINISTIC_INFERENCE"):
        assert var in names, (var, also)
    assert any(x.startswith("NCCL_MIN_NCHANNELS=SGLANG_DETERMINISTIC_NCCL_NCHANNELS (default 8, sglang/srt/environ.py:")
               for x in also), also
    assert any(x.startswith(f"--disable-custom-all-reduce on ({ATT}:") for x in also), also
    assert any(x.startswith(f"--enable-torch-symm-mem off ({ATT}:") for x in also), also
    assert "SGLANG_FLASHINFER_MOE_FUSED_FINALIZE='0'" in " ".join(also)
    assert "NCCL_TWIN_EXTRA" not in " ".join(also)
    # a flag whose test only passes the flag to a call is not its branch (speculative_hook's ROCm check)
    assert not any("speculative" in x for x in also), also


def test_the_deterministic_flag_says_which_variable_decides_first(sglang, released):
    det = released["--enable-deterministic-inference"]
    cav = det["caveat"]
    lines = re.search(rf"({PS}):(\d+)-(\d+)", cav)
    assert lines and "SGLANG_USE_1STAGE_ALLREDUCE.is_set()" in _line(sglang, f"{lines.group(1)}:{lines.group(2)}")
    assert "return envs.SGLANG_USE_1STAGE_ALLREDUCE.get()" in _line(sglang, f"{lines.group(1)}:{lines.group(3)}")
    assert cav.startswith("unless SGLANG_USE_1STAGE_ALLREDUCE is set: _deterministic_collectives_enabled returns it "
                          "first") and "SGLANG_USE_1STAGE_ALLREDUCE=0 beside --enable-deterministic-inference keeps" in cav
    assert cav in det["why"] and cav in det["note"]
    assert "caveat" not in released["SGLANG_USE_1STAGE_ALLREDUCE=1"]


def test_twin_edited_overwrite_conditional_extra_write_and_no_precedence(venv, edited, fi, released):
    out = _do_not_set(venv, [edited, fi])
    var = out["SGLANG_ENABLE_DETERMINISTIC_INFERENCE=1"]          # written only under the flag: a setting again
    _assert_cited(edited, var, "if deterministic:", "SGLANG_ENABLE_DETERMINISTIC_INFERENCE")
    det = out["--enable-deterministic-inference"]
    assert "overwrites" not in det and "has no effect" not in det["why"]
    extra = next(x for x in det["also_sets"] if x.startswith("NCCL_TWIN_EXTRA="))
    # written beside the NCCL_ALGO pin, under the same inner condition (TP > 1, not ROCm), which the entry names
    assert extra == (f"NCCL_TWIN_EXTRA='1' ({ATT}:{int(CITE.search(extra).group(2))}, only when cfg.tp_size > 1 and "
                     "not (get_platform().is_hip))")
    assert 'os.environ["NCCL_TWIN_EXTRA"]' in _line(edited, CITE.search(extra).group(0))
    assert "caveat" not in det and "unless SGLANG_USE_1STAGE_ALLREDUCE" not in det["why"]
    assert "caveat" in released["--enable-deterministic-inference"]


@pytest.fixture(scope="module")
def not_run(sglang, tmp_path_factory):
    """sglang 0.5.23 whose resolution pipeline no longer runs handle_environment_variables."""
    return engine_copy(sglang, tmp_path_factory.mktemp("sg-not-run"), {PIPE: (RUNS, "")})


def test_twin_a_write_that_is_not_seen_to_run_overwrites_nothing(venv, not_run, fi):
    out = _do_not_set(venv, [not_run, fi])
    assert "SGLANG_ENABLE_DETERMINISTIC_INFERENCE=1" in out
    assert "overwrites" not in out["--enable-deterministic-inference"]


GATE = """
import ast, json, sys
from stackprobe.probes import Context, pcie_ipc_engine as pe
from stackprobe.engines.sglang import engine as se, dispatch as dw
from stackprobe.archs import parse_arch
from stackprobe.serverconfig import ServerConfig
eng = se.installed()
cfg = ServerConfig(args=json.loads(sys.argv[1]), env={"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": "1", **json.loads(sys.argv[2])},
                   source="test")
ctx = Context(target=parse_arch("12.0"), env={}, coverage={}, world_size=8, topology="pcie", server_config=cfg)
tree = eng.tree(pe.PCIE_FILE)
fn = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "eligible_group")
g = pe.deterministic_gate(ctx, eng, fn, tree)
print(json.dumps({"serves": dw.read_dispatch(eng, ctx).serves, "admits": g.admits, "decided by": g.value["decided by"]}))
"""


def _gate(venv, paths, args: dict, env: dict) -> dict:
    p = subprocess.run([str(venv), "-c", GATE, json.dumps(args), json.dumps(env)], capture_output=True, text=True,
                       env=suite_env(paths), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_the_overwritten_variable_given_alone_keeps_pcie_ipc_on_in_the_dispatch_and_the_gate(venv, sglang, fi):
    det_env = {"SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "1"}
    alone = _gate(venv, [sglang, fi], {}, det_env)
    assert alone["serves"] == "flashinfer-pcie-ipc-allreduce" and alone["admits"] is True, alone
    assert alone["decided by"].startswith("SGLANG_ENABLE_DETERMINISTIC_INFERENCE=1 is not read: SGLang overwrites it "
                                          "from --enable-deterministic-inference at start-up (" + HOOK + ":")
    flag = _gate(venv, [sglang, fi], {"--enable-deterministic-inference": True}, {})
    assert flag["serves"] != "flashinfer-pcie-ipc-allreduce" and flag["admits"] is False, flag


def test_twin_a_variable_written_only_under_the_flag_is_read_when_given(venv, edited, fi):
    alone = _gate(venv, [edited, fi], {}, {"SGLANG_ENABLE_DETERMINISTIC_INFERENCE": "1"})
    assert alone["serves"] != "flashinfer-pcie-ipc-allreduce" and alone["admits"] is False, alone
    assert alone["decided by"].startswith("SGLANG_ENABLE_DETERMINISTIC_INFERENCE=1 (")


# --- sglang 0.5.9: no PCIe IPC, nothing to leave unset --------------------------------------------------------------
def test_0_5_9_has_no_pcie_ipc_so_no_list(venv, sglang059, fi, sglang, released):
    assert not (sglang059 / PCIE).exists() and (sglang / PCIE).is_file()
    assert _do_not_set(venv, [sglang059, fi]) == {}
    assert released                     # the twin: the release that has it lists settings


ENGINE = "sglang/srt/entrypoints/engine.py"
MIXING = ('        if cfg.dcp_size > 1:\n            os.environ["NCCL_GRAPH_MIXING_SUPPORT"] = "0"\n')


def test_a_write_under_a_further_condition_in_the_flags_branch_says_when(released, sglang, venv, fi, tmp_path):
    """A second review: "--enable-symm-mem also sets NCCL_GRAPH_MIXING_SUPPORT='0' (engine.py:1920)" was said as if
    the flag alone set it; the write sits under ``if cfg.dcp_size > 1:`` inside the flag's branch (engine.py:1918-1920),
    so the entry names that condition. Twin: a copy without the inner ``if`` says it without a condition."""
    assert (sglang / ENGINE).read_text().count(MIXING) == 1
    also = released["--enable-symm-mem"]["also_sets"]
    mixing = [x for x in also if x.startswith("NCCL_GRAPH_MIXING_SUPPORT=")]
    assert mixing == [f"NCCL_GRAPH_MIXING_SUPPORT='0' ({ENGINE}:1920, only when cfg.dcp_size > 1)"], also
    assert any(x.startswith("NCCL_CUMEM_ENABLE=") and "only when" not in x for x in also)     # the flag's own writes
    flat = engine_copy(sglang, tmp_path / "flat", {ENGINE: (MIXING, '        os.environ["NCCL_GRAPH_MIXING_SUPPORT"] = "0"\n')})
    also = _do_not_set(venv, [flat, fi])["--enable-symm-mem"]["also_sets"]
    assert [x for x in also if x.startswith("NCCL_GRAPH_MIXING_SUPPORT=")] == [
        f"NCCL_GRAPH_MIXING_SUPPORT='0' ({ENGINE}:1919)"], also


def test_symm_mem_names_the_torch_compile_exception_and_its_twin_without_the_branch(venv, sglang, fi, released,
                                                                                    tmp_path):
    """A reviewer's point: ``--enable-symm-mem`` preempts PCIe IPC except inside code torch.compile traces, where
    ``GroupCoordinator.all_reduce`` returns from ``if torch.compiler.is_compiling():`` (sglang 0.5.23
    ``parallel_state.py:716``) before the symmetric-memory step and the run-time choice tries PCIe IPC (``:970``).
    Twin: a copy without that branch gives no such exception (before, no entry named it)."""
    why = released["--enable-symm-mem"]["why"]
    assert "except inside code torch.compile traces (--enable-torch-compile" in why, why
    m = re.search(r"\((sglang/[^:]+):(\d+)-\d+\) and the run-time choice tries PCIe IPC \(sglang/[^:]+:(\d+) ", why)
    assert m, why
    lines = (sglang / m.group(1)).read_text().splitlines()
    assert "torch.compiler.is_compiling()" in lines[int(m.group(2)) - 1]
    assert 'return "pcie_ipc"' in lines[int(m.group(3)) - 1]
    no_branch = engine_copy(sglang, tmp_path / "no-compile", {PS: ("        if torch.compiler.is_compiling():\n"
                                                                   "            if self._can_use_flashinfer_allreduce",
                                                                   "        if False:\n"
                                                                   "            if self._can_use_flashinfer_allreduce")})
    # (the dispatch reader refuses that copy's unmapped step, so the twin reads the exception's own reader)
    from stackprobe.engines.sglang import engine as se
    from stackprobe.probes.pcie_ipc_engine import _compile_bypass

    line = int(released["--enable-symm-mem"]["where"].rsplit(":", 1)[1])
    assert "torch.compile" in _compile_bypass(se.Engine("0.5.23", sglang / "sglang"), line)
    assert _compile_bypass(se.Engine("0.5.23", no_branch / "sglang"), line) == ""
