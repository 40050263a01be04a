"""SGLang's PCIe IPC readers (sglang 0.5.23 + flashinfer-python 0.7.2, the path ``SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1``
turns on) never admit what they cannot read: each reading below says "not assessed" with its reason where the source
or the configuration does not decide it. One test on the real wheel per kind, and a failing twin (an edited copy of
the wheel) that gave the wrong, admitting answer before:

1. the row bound (``pcie_ipc.row_bound``) in a release with no max-batch-size flag read "admits": not assessed, naming
   the flags searched; the dispatch is then undecided (PCIe IPC's per-call check is not taken as passing);
2. a supported-sizes constant that is not a literal was read as the numbers in its expression: not assessed unless
   the safe evaluator (``pyeval``) computes it to numbers (``(2, 4) + (8,)`` is read, a comprehension is not);
3. deterministic mode where ``_deterministic_collectives_enabled`` is missing (or reads what the reader cannot
   evaluate) fell back to the assumed 0.5.23 logic ("off"): not assessed;
4. the conditions under which SGLang turns ``--enable-deterministic-inference`` on itself (``also_on``:
   ``cfg.rl_on_policy_target is not None``, ``attention_hook.py:586``) were shown but not used: the gate treats the
   flag as on where the configuration meets one, and says not assessed where one cannot be judged;
5. an enumeration error in ``paths()`` (GateNotFound: the argument files define no flag) dropped the not-assessed rows:
   it is one ``sglang-paths`` row saying not assessed, with the error;
6. a non-numeric value of a numeric flag (``--cuda-graph-max-bs-decode abc``) crashed the engine sections with a
   traceback: the CLI stops before any reading with one paragraph naming the flag, its type and what to write.
"""
from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from validate_support import engine_copy, suite_env

pytestmark = pytest.mark.network

PCIE = "sglang/srt/distributed/device_communicators/pcie_ipc_ar.py"
PS = "sglang/srt/distributed/parallel_state.py"
EXEC = "sglang/srt/arg_groups/fields/exec_.py"
ATT = "sglang/srt/arg_groups/attention_hook.py"
OPT_IN = "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1"

READ = """
import json, sys
from types import SimpleNamespace
from stackprobe.archs import parse_arch
from stackprobe.engines.sglang import dispatch as dw, engine as se, flags as sf, pcie_ipc as pi
from stackprobe.probes import Context, flashinfer_pcie_ipc as fp
from stackprobe.serverconfig import ServerConfig
args, env = sys.argv[1], sys.argv[2:]
eng = se.installed()
sc = sf.parse_server_config(args, env, eng) if not args.startswith("raw:") else ServerConfig(
    args=dict(a.split("=", 1) for a in args[4:].split()), env=dict(e.split("=", 1) for e in env), source="test")
ctx = Context(target=parse_arch("12.0"), env={}, coverage={}, world_size=8, topology="pcie", server_config=sc)
t = dw.DecodeTensor.from_workload()
out = {"admission": {e.what: e.value for e in pi.pcie_ipc_admission(eng, sc, t, 8)}}
try:
    d = dw.read_dispatch(eng, ctx)
    out["dispatch"] = {"serves": d.serves, "undecided": d.undecided}
except (dw.DispatchError, se.GateNotFound) as e:
    out["dispatch"] = {"error": str(e)}
v = fp.engine_gate(ctx)[0]
out["verdict"] = {"status": v.status, "cause": v.cause}
print(json.dumps(out, default=str))
"""


def _read(venv, paths, args: str = "", *env: str) -> dict:
    p = subprocess.run([str(venv), "-c", READ, args, *env], capture_output=True, text=True, env=suite_env(paths),
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _not_assessed(value: dict, *needles: str) -> None:
    assert value.get("admits") is None and value.get("not_assessed"), value
    for n in needles:
        assert n in value["not_assessed"], (n, value["not_assessed"])


# --- 1. the row bound without a max-batch-size flag ---------------------------------------------------------------
def test_row_bound_reads_the_max_batch_flag_of_the_release(venv, sglang, fi):
    out = _read(venv, [sglang, fi], "--cuda-graph-max-bs-decode 4", OPT_IN)
    b = out["admission"]["row bound"]
    assert b["admits"] is True and b["rows"] == 12 and "not_assessed" not in b, b
    assert "given: --cuda-graph-max-bs-decode 4" in b["source"]
    assert out["dispatch"]["serves"] == "flashinfer-pcie-ipc-allreduce"


def test_twin_no_max_batch_flag_leaves_the_bound_not_assessed(venv, sglang, fi, tmp_path):
    """Before: ``"admits": True`` ("every decode batch that runs in a captured graph fits") with no flag read."""
    renamed = engine_copy(sglang, tmp_path / "no-mbs", {EXEC: ("    cuda_graph_max_bs_decode: A[",
                                                               "    cuda_graph_top_bs_decode: A[")})
    out = _read(venv, [renamed, fi], "", OPT_IN)
    b = out["admission"]["row bound"]
    _not_assessed(b, "defines no max-batch-size flag", "--cuda-graph-max-bs-decode / --cuda-graph-max-bs")
    assert b["why"].startswith("not assessed: ")
    assert out["dispatch"]["serves"] != "flashinfer-pcie-ipc-allreduce", out["dispatch"]
    assert "flashinfer-pcie-ipc-allreduce" in out["dispatch"]["undecided"]


def test_twin_a_text_batch_size_given_directly_is_not_assessed_not_a_crash(venv, sglang, fi):
    """A configuration built without the CLI's parse (``ServerConfig`` directly) with a text value: before, a
    ValueError traceback from ``int('abc')`` in row_bound."""
    b = _read(venv, [sglang, fi], "raw:--cuda-graph-max-bs-decode=abc", OPT_IN)["admission"]["row bound"]
    _not_assessed(b, "--cuda-graph-max-bs-decode abc", "is not a whole number")


# --- 2. a supported-sizes constant that is not a literal ----------------------------------------------------------
def test_world_sizes_literal_and_group_names_read(venv, sglang, fi):
    adm = _read(venv, [sglang, fi], "", OPT_IN)["admission"]
    assert adm["world sizes"] == {"supported": [2, 4, 8], "here": 8, "admits": True}
    assert adm["process groups"] == ["tp"]      # frozenset({"tp"}): a literal inside frozenset(...)


def test_twin_computed_world_sizes_are_not_assessed(venv, sglang, fi, tmp_path):
    """Before: the numbers in the expression, ``[2, 1, 2, 4]``, were read as the supported sizes."""
    computed = engine_copy(sglang, tmp_path / "computed", {PCIE: ("_SUPPORTED_WORLD_SIZES = (2, 4, 8)",
                                                                  "_SUPPORTED_WORLD_SIZES = tuple(n * 2 for n in (1, 2, 4))")})
    out = _read(venv, [computed, fi], "", OPT_IN)
    _not_assessed(out["admission"]["world sizes"], "not a literal and does not evaluate to numbers")
    assert out["admission"]["world sizes"]["supported"] is None
    assert "world sizes are not assessed" in out["dispatch"]["error"], out["dispatch"]
    # the engine verdict's own world-size gate (probes/flashinfer_pcie_ipc.py) reads the same way: before, it took
    # the numbers in the expression, [1, 2, 4, 2], found no 8 and declined with "supports world sizes [1, 2, 2, 4]"
    v = out["verdict"]
    assert v["status"] == "not-assessed" and "not a literal and does not evaluate to numbers" in v["cause"], v


def test_evaluable_world_sizes_are_read_through_the_safe_evaluator(venv, sglang, fi, tmp_path):
    summed = engine_copy(sglang, tmp_path / "summed", {PCIE: ("_SUPPORTED_WORLD_SIZES = (2, 4, 8)",
                                                              "_BASE = (2, 4)\n_SUPPORTED_WORLD_SIZES = _BASE + (8,)")})
    out = _read(venv, [summed, fi], "", OPT_IN)
    assert out["admission"]["world sizes"] == {"supported": [2, 4, 8], "here": 8, "admits": True}
    assert out["dispatch"]["serves"] == "flashinfer-pcie-ipc-allreduce"


# --- 3. _deterministic_collectives_enabled missing or unreadable --------------------------------------------------
DET_DEF = "    def _deterministic_collectives_enabled() -> bool:\n"
DET_RET = "        return envs.SGLANG_ENABLE_DETERMINISTIC_INFERENCE.get()\n"


def test_deterministic_mode_is_run_from_its_own_code(venv, sglang, fi):
    det = _read(venv, [sglang, fi], "", OPT_IN, "SGLANG_USE_1STAGE_ALLREDUCE=1")["admission"][
        "deterministic inference turns it off"]
    assert det["on"] is True and "not_assessed" not in det, det
    det = _read(venv, [sglang, fi], "", OPT_IN)["admission"]["deterministic inference turns it off"]
    assert det["on"] is False and "not_assessed" not in det, det


def test_twin_missing_deterministic_function_is_not_assessed(venv, sglang, fi, tmp_path):
    """Before: ``"on": False`` from the assumed 0.5.23 logic, and the dispatch read PCIe IPC as serving."""
    gone = engine_copy(sglang, tmp_path / "gone", {PS: (DET_DEF, DET_DEF.replace("enabled", "on"))})
    out = _read(venv, [gone, fi], "", OPT_IN)
    det = out["admission"]["deterministic inference turns it off"]
    assert det["on"] is None and "has no _deterministic_collectives_enabled" in det["not_assessed"], det
    assert "not assessed" in out["dispatch"]["error"], out["dispatch"]


def test_twin_deterministic_function_reading_more_is_not_assessed(venv, sglang, fi, tmp_path):
    """Before: the assumed logic ignored the extra read and answered "off"."""
    more = engine_copy(sglang, tmp_path / "more", {PS: (DET_RET, DET_RET.replace(".get()", ".get() or _rl_mode()"))})
    det = _read(venv, [more, fi], "", OPT_IN)["admission"]["deterministic inference turns it off"]
    assert det["on"] is None and "reads `_rl_mode()`" in det["not_assessed"], det


# --- 4. SGLang's own also_on: --rl-on-policy-target turns deterministic inference on ------------------------------
def test_rl_on_policy_target_turns_deterministic_on_so_pcie_ipc_is_not_built(venv, sglang, fi):
    """Before: the gate read deterministic mode off (only --enable-deterministic-inference counted) and the verdict was
    on-as-configured; SGLang declares the flag on itself under ``cfg.rl_on_policy_target is not None``."""
    out = _read(venv, [sglang, fi], "--rl-on-policy-target fsdp", OPT_IN)
    assert out["verdict"]["status"] == "falls-back-if-set", out["verdict"]
    assert "SGLang turns --enable-deterministic-inference on itself when `cfg.rl_on_policy_target is not None` " \
           f"({ATT}:" in out["verdict"]["cause"]
    assert out["admission"]["deterministic inference turns it off"]["on"] is True
    assert out["dispatch"]["serves"] == "nccl-ring"
    plain = _read(venv, [sglang, fi], "", OPT_IN)
    assert plain["verdict"]["status"] == "on-as-configured" and plain["dispatch"]["serves"] == \
        "flashinfer-pcie-ipc-allreduce"


def test_twin_an_also_on_condition_the_configuration_cannot_decide_is_not_assessed(venv, sglang, fi, tmp_path):
    """The condition also reads ``_rl_mode()`` (not a server flag): before, the gate ignored it and answered
    on-as-configured."""
    cond = engine_copy(sglang, tmp_path / "cond", {ATT: ("    if cfg.rl_on_policy_target is not None:\n",
                                                         "    if cfg.rl_on_policy_target is not None or _rl_mode():\n")})
    out = _read(venv, [cond, fi], "", OPT_IN)
    assert out["verdict"]["status"] == "not-assessed", out["verdict"]
    assert out["verdict"]["cause"].startswith("not assessed: ") and "`_rl_mode()`" in out["verdict"]["cause"]
    det = out["admission"]["deterministic inference turns it off"]
    assert det["on"] is None and "_rl_mode()" in det["not_assessed"], det
    assert "not assessed" in out["dispatch"]["error"]
    # given the flag, the condition holds before the unread part: judged, on
    out = _read(venv, [cond, fi], "--rl-on-policy-target fsdp", OPT_IN)
    assert out["verdict"]["status"] == "falls-back-if-set", out["verdict"]


# --- 5. a reader error in paths() -----------------------------------------------------------------------------------
SECTIONS = """
import json
from types import SimpleNamespace
from stackprobe.archs import parse_arch
from stackprobe.engines.sglang import engine_sections
from stackprobe.probes import Context
from stackprobe.serverconfig import ServerConfig
ctx = Context(target=parse_arch("12.0"), env={}, coverage={}, world_size=8, topology="pcie",
              server_config=ServerConfig(args={}, env={}, source="test"))
report = SimpleNamespace(environment={})
out = engine_sections(report, ctx)
print(json.dumps({"paths": out.get("paths"), "launch": out.get("launch_environment")}, default=str))
"""


def _sections(venv, paths) -> dict:
    p = subprocess.run([str(venv), "-c", SECTIONS], capture_output=True, text=True, env=suite_env(paths), timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_paths_enumerates_the_release(venv, sglang, fi):
    rows = _sections(venv, [sglang, fi])["paths"]
    assert rows and all(r["status"] == "not-assessed" for r in rows)
    assert "sglang-paths" not in {r["backend"] for r in rows}


def test_twin_an_enumeration_error_is_a_not_assessed_row(venv, sglang, fi, tmp_path):
    """The argument files gone (server_flags raises GateNotFound): before, ``paths`` was missing from the section."""
    bare = engine_copy(sglang, tmp_path / "bare", {})
    (bare / "sglang/srt/server_args.py").unlink()
    shutil.rmtree(bare / "sglang/srt/arg_groups")
    rows = _sections(venv, [bare, fi])["paths"]
    assert rows is not None, "paths dropped"
    row = next(r for r in rows if r["backend"] == "sglang-paths")
    assert row["status"] == "not-assessed"
    assert row["cause"].startswith("not assessed: the settings and modules sglang 0.5.23 ships could not be "
                                   "enumerated (GateNotFound: ")
    assert "no server flag defined" in row["cause"]


# --- 6. a non-numeric value of a numeric flag -----------------------------------------------------------------------
def _cli(venv, paths, server_args: str):
    return subprocess.run([str(venv), "-m", "stackprobe", "--json", "-", "--quiet", "--target-arch", "12.0",
                           "--world-size", "8", f"--server-args={server_args}", "--env", OPT_IN],
                          capture_output=True, text=True, env=suite_env(paths), timeout=900)


def test_a_text_value_of_a_numeric_flag_is_a_usage_error_naming_it(venv, sglang, fi):
    """Before: a ValueError traceback from the engine sections (``int('abc')`` in row_bound) after the whole reading."""
    p = _cli(venv, [sglang, fi], "--cuda-graph-max-bs-decode abc")
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert "Traceback" not in p.stderr and p.stdout == ""
    err = p.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("stackprobe: --server-args: --cuda-graph-max-bs-decode 'abc' is not a whole number: "
                          "sglang 0.5.23 reads --cuda-graph-max-bs-decode as int (sglang/srt/arg_groups/fields/exec_.py:")
    assert "write --cuda-graph-max-bs-decode followed by a whole number, e.g. --cuda-graph-max-bs-decode 8" in err
    p = _cli(venv, [sglang, fi], "--cuda-graph-bs-decode 1 2 x")
    assert p.returncode == 2 and "--cuda-graph-bs-decode 'x' is not a whole number" in p.stderr, p.stderr[-2000:]


def test_twin_the_numeric_type_is_read_from_the_release(venv, sglang, fi, tmp_path):
    """A copy where the field is typed ``Optional[str]``: the same text value parses (the check reads the release's
    type, it is no list of flag names), and the row bound, which needs a number, says not assessed."""
    text = engine_copy(sglang, tmp_path / "text", {EXEC: (
        '    cuda_graph_max_bs_decode: A[\n        Optional[int], "Maximum batch size captured for the decode cuda graph."',
        '    cuda_graph_max_bs_decode: A[\n        Optional[str], "Maximum batch size captured for the decode cuda graph."')})
    b = _read(venv, [text, fi], "--cuda-graph-max-bs-decode abc", OPT_IN)["admission"]["row bound"]
    _not_assessed(b, "is not a whole number")
