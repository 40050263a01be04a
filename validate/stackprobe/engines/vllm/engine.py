"""vLLM's own answer for every allreduce path, read from the installed vLLM's source (``ast``, no import).

The same rules as SGLang's (:mod:`.sglang_engine`): each condition on vLLM's path from its variable or server
argument to the communicator being built and chosen is a :class:`~.sglang_engine.Gate`, and one rule
(:meth:`~.sglang_engine.EngineAnswer.verdict`) makes the user's status (on by default, opt-in, on as configured,
start-up failure if set, falls back if set, preempted, blocked, not integrated, not installed). A gate this reader
cannot find is an ``error`` verdict naming ``vllm <version>`` and the file (:class:`~.sglang_engine.GateNotFound`),
never a pass; each gate cites ``vllm/FILE:LINE``.

Where vLLM 0.33.0 keeps each gate (the reader finds them by name, not by line):

* environment variables and their defaults: ``vllm/envs.py``'s ``environment_variables`` dict, each entry a
  ``lambda`` around ``os.getenv("NAME", "<default>")``;
* the TP allreduce dispatch: ``CudaCommunicator.all_reduce`` in
  ``distributed/device_communicators/cuda_communicator.py`` (NCCL symmetric memory, quick allreduce, FlashInfer
  PCIe IPC, FlashInfer allreduce, AITER, custom allreduce, torch symmetric memory, pynccl, in that order);
* custom allreduce: ``CustomAllreduce`` in ``custom_all_reduce.py`` (its world sizes, and the "more than two
  PCIe-only GPUs" rule ``same_node and world_size > 2 and not fully_connected``);
* torch symmetric memory: ``SymmMemCommunicator`` in ``symm_mem.py`` and its size table
  ``SYMM_MEM_ALL_REDUCE_MAX_SIZES`` in ``all_reduce_utils.py``, keyed by the device capability as a string
  (``"9.0"``; ``capability.as_version_str()``);
* NCCL symmetric memory: ``VLLM_USE_NCCL_SYMM_MEM`` and ``NCCL_SYMM_MEM_ALL_REDUCE_CONFIG`` (``all_reduce_utils.py``);
* FlashInfer PCIe IPC: ``flashinfer_pcie_ipc_all_reduce.py`` (``_SUPPORTED_WORLD_SIZES``, ``_SUPPORTED_DTYPES``);
* FlashInfer allreduce (standalone) and the allreduce + RMSNorm fusion pass: ``FI_ALLREDUCE_FUSION_MAX_SIZE_MB`` in
  ``compilation/passes/fusion/allreduce_rms_fusion.py``, keyed by ``capability.to_int()`` (``90``), and the pass's
  default ``enable_allreduce_rms_fusion`` in ``config/vllm.py``;
* quick allreduce: built only under ``current_platform.is_rocm()`` (ROCm MI300; never on CUDA);
* all-to-all backends for expert parallelism: ``All2AllBackend`` in ``config/parallel.py``;
* b12x: vLLM's ``vllm.general_plugins`` entry points of the installed b12x distribution.
"""
from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

from ... import source
from ...env import dist_version
from ...paths import PCIE_IPC
from ...serverconfig import ServerConfig
from ...verdict import (BLOCKED, ERROR, GATE_NOT_INSTALLED, GATE_NOT_INTEGRATED, GATE_PYTHON, GATE_SETTING,
                       GATE_TOPOLOGY, LIFT_NOTHING, LIFT_PACKAGE, LIFT_SETTING, NOT_INTEGRATED, ON_AS_CONFIGURED,
                       ON_BY_DEFAULT, PREEMPTED, SCOPE_ENGINE, SKIPPED, Verdict)
from ..sglang import engine as se
from ..sglang.engine import EngineAnswer, Gate, GateNotFound

DIST = "vllm"
DC = "distributed/device_communicators"
CUDA_COMM = f"{DC}/cuda_communicator.py"
UTILS = f"{DC}/all_reduce_utils.py"
FUSION = "compilation/passes/fusion/allreduce_rms_fusion.py"

#: the backends vLLM answers for, in report order (names shared with SGLang's where the path is the same library's)
BACKENDS = ("vllm-custom-allreduce", "torch-symm-mem", "nccl-symm-mem", PCIE_IPC,
            "flashinfer-allreduce", "flashinfer-allreduce-fusion", "quick-allreduce", "ep-flashinfer-a2a", "b12x")

#: where a decode-step allreduce goes when vLLM's out-of-place paths decline: pynccl
PYNCCL = "NCCL (pynccl, vLLM's last step of CudaCommunicator.all_reduce)"


@dataclass
class Engine(se.Engine):
    """The installed vLLM: ``version`` (distribution metadata) and ``root`` (the ``vllm`` folder). Same methods as
    :class:`.sglang_engine.Engine`; errors name ``vllm <version>`` and ``vllm/FILE``."""

    version: str
    root: Path
    title: str = "vLLM"
    dist: str = DIST
    pkg = "vllm"

    def cls(self, rel: str, name: str) -> ast.ClassDef:
        c = next((n for n in ast.walk(self.tree(rel)) if isinstance(n, ast.ClassDef) and n.name == name), None)
        if c is None:
            raise GateNotFound(f"gate not found in vllm {self.version} at vllm/{rel}: no class {name}")
        return c

    def method(self, rel: str, cls: str, name: str) -> ast.FunctionDef:
        fn = next((n for n in self.cls(rel, cls).body if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if fn is None:
            raise GateNotFound(f"gate not found in vllm {self.version} at vllm/{rel}: no method {cls}.{name}")
        return fn

    def table(self, rel: str, name: str):
        """A module-level literal table and its ``vllm/FILE:LINE``; GateNotFound when absent or not literal."""
        try:
            value, line = source.module_assignment(self.file(rel), name)
        except (source.SourceNotFound, ValueError, SyntaxError) as e:
            raise GateNotFound(f"gate not found in vllm {self.version} at vllm/{rel}: no module-level literal "
                               f"{name} ({e})") from e
        return value, f"vllm/{rel}:{line}"

    def class_attr(self, rel: str, cls: str, attr: str):
        try:
            value, line = source.class_attribute(self.file(rel), cls, attr)
        except (source.SourceNotFound, ValueError) as e:
            raise GateNotFound(f"gate not found in vllm {self.version} at vllm/{rel}: {cls}.{attr} ({e})") from e
        return value, f"vllm/{rel}:{line}"


def installed() -> Engine | None:
    """The installed vLLM, or None (no distribution metadata or no importable ``vllm`` folder)."""
    ver, root = dist_version(DIST), source.package_dir("vllm")
    if ver is None or root is None:
        return None
    return Engine(ver, root)


def _where(eng: Engine, rel: str, node: ast.AST, text: str = "") -> str:
    return f"vllm/{rel}:{getattr(node, 'lineno', '?')}" + (f" `{text}`" if text else "")


def _find(fn: ast.AST, pred, what: str, eng: Engine, rel: str):
    node = next((n for n in ast.walk(fn) if pred(n)), None)
    if node is None:
        raise GateNotFound(f"gate not found in vllm {eng.version} at vllm/{rel}: {what}")
    return node


# --- environment variables ------------------------------------------------------------------------
def env_default(eng: Engine, name: str) -> tuple[bool, str, str]:
    """``(on by default, raw default text, "vllm/envs.py:LINE ...")`` for ``name`` in ``envs.py``'s
    ``environment_variables``: the entry's ``os.getenv(name, "<default>")`` read through its ``bool(int(...))`` or
    ``== "1"`` wrapper. Raises GateNotFound when the entry or a literal default is missing, or the wrapper is another."""
    rel = "envs.py"
    for d in (n for n in ast.walk(eng.tree(rel)) if isinstance(n, ast.Dict)):
        for k, v in zip(d.keys, d.values):
            if not (isinstance(k, ast.Constant) and k.value == name):
                continue
            call = next((c for c in ast.walk(v) if isinstance(c, ast.Call) and len(c.args) >= 2
                         and isinstance(c.args[0], ast.Constant) and c.args[0].value == name
                         and ast.unparse(c.func) in ("os.getenv", "os.environ.get", "getenv")), None)
            if call is None or not isinstance(call.args[1], ast.Constant):
                break
            raw, text = str(call.args[1].value), ast.unparse(v)
            if "bool(int(" in text.replace(" ", ""):
                on = int(raw) != 0
            elif re.search(r"==\s*['\"]1['\"]", text):
                on = raw == "1"
            elif ".lower()" in text and "true" in text.lower():
                on = raw.lower() in ("1", "true")
            else:
                raise GateNotFound(f"gate not readable in vllm {eng.version} at vllm/{rel}:{k.lineno}: {name}'s "
                                   f"parser `{text}` is neither bool(int(...)) nor == '1'")
            return on, raw, f"vllm/{rel}:{k.lineno} `{text}`"
    raise GateNotFound(f"gate not found in vllm {eng.version} at vllm/{rel}: {name} is not an entry of "
                       "environment_variables with a literal os.getenv default")


def _var_given(ctx, name: str) -> str | None:
    sc = getattr(ctx, "server_config", None)
    return sc.var(name) if sc is not None else None


def _truthy(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


def env_gate(eng: Engine, ctx, name: str, what: str) -> Gate:
    """The gate of a vLLM variable: on by default (admits unless the configuration sets it to 0) or an opt-in
    (admits when the configuration sets it to 1)."""
    on, raw, where = env_default(eng, name)
    given = _var_given(ctx, name)
    value = f"{name} default {raw!r} ({'on' if on else 'off'} by default)" + (f"; the configuration sets {given!r}"
                                                                             if given is not None else "")
    if on:
        off = given is not None and not _truthy(given)
        return Gate(f"{name}", not off, where, GATE_SETTING, f"the configuration sets {name}={given}, which turns "
                    f"{what} off", LIFT_SETTING, f"leave {name} unset", value=value, flag=name, configured=off)
    set_ = given is not None and _truthy(given)
    return Gate(f"{name}", set_, where, GATE_SETTING, f"{name} is off by default (default {raw!r})", LIFT_SETTING,
                f"{name}=1 (off by default in vllm {eng.version})", value=value, flag=name, opt_in=True,
                configured=set_)


# --- server arguments -----------------------------------------------------------------------------
ARG_FILE = "engine/arg_utils.py"


def engine_fields(eng: Engine) -> dict[str, str]:
    """``EngineArgs`` field name -> ``vllm/engine/arg_utils.py:LINE``: vLLM turns each into ``--name-with-dashes``."""
    c = eng.cls(ARG_FILE, "EngineArgs")
    out = {n.target.id: f"vllm/{ARG_FILE}:{n.lineno}" for n in c.body
           if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    if not out:
        raise GateNotFound(f"gate not found in vllm {eng.version} at vllm/{ARG_FILE}: EngineArgs has no fields")
    return out


def parse_config(server_args: str, env: list[str] | tuple, eng: Engine | None) -> ServerConfig:
    """``server_args`` tokenised like SGLang's (:func:`.sglang_flags.parse_server_config`, unchecked there), then each
    flag checked against the installed vLLM's ``EngineArgs`` fields (``--disable-custom-all-reduce`` is the field
    ``disable_custom_all_reduce``; ``--no-x`` negates field ``x``). Raises
    :class:`.sglang_flags.ConfigError` naming the flag and where vLLM's flags are read."""
    from ..sglang.flags import ConfigError, parse_server_config

    cfg = parse_server_config(server_args, env, None)
    if eng is None:
        return cfg
    fields = engine_fields(eng)
    for flag in cfg.args:
        dest = flag[2:].split(".")[0].replace("-", "_")
        if dest not in fields and dest.removeprefix("no_") not in fields:
            raise ConfigError(f"--server-args: {flag} is not a server argument of the installed vllm {eng.version} "
                              f"(its flags are EngineArgs' fields in vllm/{ARG_FILE}); fix the spelling, drop the "
                              "flag, or pass --engine sglang when the flags are SGLang's.")
    for flag in INT_FLAGS:
        if flag in cfg.args and not _is_int(cfg.args[flag]):
            raise ConfigError(f"--server-args: {flag} {cfg.args[flag]!r} is not an integer (vLLM parses it with int "
                              f"and stops on anything else; the verdicts read it as a GPU count); give a whole "
                              f"number, e.g. {flag} 2.")
    if "--compilation-config" in cfg.args:
        try:
            compilation_config(cfg.args["--compilation-config"])
        except ValueError as e:
            raise ConfigError(f"--server-args: {e}. vLLM parses this flag with json.loads and stops on anything else; "
                              "give one JSON object, e.g. --compilation-config '{\"pass_config\": "
                              "{\"fuse_allreduce_rms\": true}}'.") from e
    return cfg


#: the integer flags the verdicts read (a GPU count each); a value that is not a whole number is a usage error
INT_FLAGS = ("--data-parallel-size", "--tensor-parallel-size", "--pipeline-parallel-size")


def _is_int(value) -> bool:
    if value is True or value is None:
        return False
    try:
        int(str(value))
    except ValueError:
        return False
    return True


def compilation_config(value) -> dict:
    """``--compilation-config``'s value as vLLM reads it (``json.loads``: ``EngineArgs``' dict-typed flags go through
    ``parse_type(json.loads)`` in ``engine/arg_utils.py``): the JSON object as a dict; ``{}`` when unset (None).
    Raises ValueError naming the value when it is not a JSON object (never matched by substring)."""
    if value is None:
        return {}
    try:
        got = json.loads(value) if isinstance(value, str) else value
    except ValueError as e:
        raise ValueError(f"--compilation-config {value!r} is not valid JSON ({e})") from e
    if not isinstance(got, dict):
        raise ValueError(f"--compilation-config {value!r} is not a JSON object")
    pc = got.get("pass_config")
    if pc is not None and not isinstance(pc, dict):
        raise ValueError(f"--compilation-config {value!r}: its pass_config is not a JSON object")
    return got


def field_default(eng: Engine, rel: str, cls: str, name: str):
    for n in eng.cls(rel, cls).body:
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name) and n.target.id == name and n.value:
            try:
                return ast.literal_eval(n.value), f"vllm/{rel}:{n.lineno} {cls}.{name}"
            except ValueError:
                return ast.unparse(n.value), f"vllm/{rel}:{n.lineno} {cls}.{name}"
    raise GateNotFound(f"gate not found in vllm {eng.version} at vllm/{rel}: no field {cls}.{name} with a default")


def _flag(ctx, name: str):
    sc = getattr(ctx, "server_config", None)
    return sc.flag(name) if sc is not None else None


# --- the decode tensor and the capability keys -----------------------------------------------------
def decode_tensor():
    from ..sglang.dispatch import DecodeTensor
    return DecodeTensor.from_workload()


def capability_key(target, keys) -> object:
    """The key vLLM looks a target up by in a table with these ``keys``: ``"12.0"`` (``as_version_str``) for string
    keys, ``120`` (``to_int``) for integer keys of three digits, ``(12, 0)`` for tuple keys."""
    sample = next(iter(keys), None)
    if isinstance(sample, str):
        return target.cc
    if isinstance(sample, tuple):
        return (target.major, target.minor)
    return target.major * 10 + target.minor


# --- one decider per backend ----------------------------------------------------------------------
def _ans(backend, eng, ctx) -> EngineAnswer:
    return EngineAnswer(backend, eng, ctx)


def _custom_allreduce(ctx, eng: Engine) -> Verdict:
    rel = f"{DC}/custom_all_reduce.py"
    ans = _ans("vllm-custom-allreduce", eng, ctx)
    default, where = field_default(eng, "config/parallel.py", "ParallelConfig", "disable_custom_all_reduce")
    given = _flag(ctx, "--disable-custom-all-reduce") is not None
    ans.add(Gate("server argument --disable-custom-all-reduce", not given and default is False, where, GATE_SETTING,
                 "the configuration asked about sets --disable-custom-all-reduce", LIFT_SETTING,
                 "leave --disable-custom-all-reduce unset", value=f"default {default!r}: on by default",
                 flag="--disable-custom-all-reduce", configured=given))
    sizes, where_ws = eng.class_attr(rel, "CustomAllreduce", "_SUPPORTED_WORLD_SIZES")
    ans.add(Gate("CustomAllreduce._SUPPORTED_WORLD_SIZES", ctx.world_size in sizes, where_ws, GATE_PYTHON,
                 f"world size {ctx.world_size} is not in {sizes}: it disables itself with a warning", LIFT_SETTING,
                 f"a TP size in {sizes}", value=sizes, on_fail="decline", falls_to=PYNCCL))
    init = eng.method(rel, "CustomAllreduce", "__init__")
    rule = _find(init, lambda n: isinstance(n, ast.If) and "fully_connected" in ast.unparse(n.test)
                 and "world_size > 2" in ast.unparse(n.test) and any(isinstance(b, ast.Return) for b in n.body),
                 "no `if ... world_size > 2 and not fully_connected: return` in CustomAllreduce.__init__", eng, rel)
    ok = ctx.world_size <= 2 or ctx.topology == "nvlink"
    ans.add(Gate("NVLink rule (more than two PCIe-only GPUs)", ok, _where(eng, rel, rule, ast.unparse(rule.test)),
                 GATE_TOPOLOGY, f"custom allreduce disables itself on more than two GPUs that are not all connected by "
                 f"NVLink (fully_connected: NVML NVLink status, vllm/platforms/cuda.py is_fully_connected); "
                 f"{ctx.topology} at world size {ctx.world_size}", LIFT_NOTHING,
                 f"nothing on {ctx.topology} beyond TP 2", value=f"{ctx.topology}, ws {ctx.world_size}",
                 on_fail="decline", falls_to=PYNCCL))
    table, where_t = eng.table(UTILS, "CUSTOM_ALL_REDUCE_MAX_SIZES")
    v = ans.verdict(f"vLLM {eng.version} builds CustomAllreduce on every TP group and it serves tensors up to its "
                    "max_size (8 MiB by default)")
    v.add("CUSTOM_ALL_REDUCE_MAX_SIZES keys (device capability)", sorted(table),
          f"{where_t}: sizes the buffer only when torch symmetric memory is on; not a gate "
          f"({capability_key(ctx.target, table)!r} {'is' if capability_key(ctx.target, table) in table else 'is not'} a key)")
    return v


def _symm_mem_table(ctx, eng: Engine, ans: EngineAnswer) -> None:
    rel = f"{DC}/symm_mem.py"
    table, where_t = eng.table(UTILS, "SYMM_MEM_ALL_REDUCE_MAX_SIZES")
    if not isinstance(table, dict) or not table:
        raise GateNotFound(f"gate not readable in vllm {eng.version} at {where_t}: SYMM_MEM_ALL_REDUCE_MAX_SIZES is "
                           "not a non-empty dict")
    init = eng.method(rel, "SymmMemCommunicator", "__init__")
    check = _find(init, lambda n: isinstance(n, ast.If) and isinstance(n.test, ast.Compare)
                  and isinstance(n.test.ops[0], ast.NotIn) and "SYMM_MEM_ALL_REDUCE_MAX_SIZES" == ast.unparse(n.test.comparators[0])
                  and "capability" in ast.unparse(n.test.left) and any(isinstance(b, ast.Return) for b in n.body),
                  "no `if <capability> not in SYMM_MEM_ALL_REDUCE_MAX_SIZES: return` in SymmMemCommunicator.__init__",
                  eng, rel)
    key = capability_key(ctx.target, table)
    keys = sorted(table, key=str)
    ans.add(Gate("SYMM_MEM_ALL_REDUCE_MAX_SIZES keys (device capability)", key in table,
                 f"{where_t} (ast); checked at {_where(eng, rel, check, ast.unparse(check.test))}", GATE_PYTHON,
                 f"SYMM_MEM_ALL_REDUCE_MAX_SIZES has keys {keys} only: no {key!r}, so SymmMemCommunicator disables "
                 "itself with a warning; no CUDA upgrade lifts a Python table", LIFT_PACKAGE,
                 f"a vllm release whose SYMM_MEM_ALL_REDUCE_MAX_SIZES has key {key!r}", value=keys, on_fail="decline",
                 falls_to=PYNCCL))
    if key in table:
        sizes = table[key]
        ans.add(Gate(f"SYMM_MEM_ALL_REDUCE_MAX_SIZES[{key!r}] world sizes", ctx.world_size in sizes, where_t,
                     GATE_PYTHON, f"no entry for world size {ctx.world_size} (has {sorted(sizes)})", LIFT_PACKAGE,
                     f"a vllm release whose table admits world size {ctx.world_size}", value=sorted(sizes),
                     on_fail="decline", falls_to=PYNCCL))
    mc = _find(init, lambda n: isinstance(n, ast.Compare) and isinstance(n.left, ast.Attribute)
               and n.left.attr == "multicast_ptr" and isinstance(n.ops[0], ast.Eq),
               "no `handle.multicast_ptr == 0` check in SymmMemCommunicator.__init__", eng, rel)
    ans.add(Gate("multicast pointer check", ctx.topology == "nvlink", _where(eng, rel, mc, ast.unparse(mc)),
                 GATE_TOPOLOGY, f"SymmMemCommunicator disables itself when the rendezvous handle has no multicast "
                 f"pointer; {ctx.topology} GPUs have no multicast", LIFT_NOTHING,
                 f"nothing on {ctx.topology}: it needs multicast (NVSwitch)", value=f"topology {ctx.topology}",
                 on_fail="decline", falls_to=PYNCCL))


def _torch_symm_mem(ctx, eng: Engine) -> Verdict:
    ans = _ans("torch-symm-mem", eng, ctx)
    ans.add(env_gate(eng, ctx, "VLLM_ALLREDUCE_USE_SYMM_MEM", "torch symmetric memory"))
    _symm_mem_table(ctx, eng, ans)
    return ans.verdict(f"vLLM {eng.version} builds SymmMemCommunicator on the TP group and it serves bf16 tensors up "
                       "to its table's size")


def _nccl_symm_mem(ctx, eng: Engine) -> Verdict:
    ans = _ans("nccl-symm-mem", eng, ctx)
    ans.add(env_gate(eng, ctx, "VLLM_USE_NCCL_SYMM_MEM", "NCCL symmetric memory"))
    cfg, where = eng.table(UTILS, "NCCL_SYMM_MEM_ALL_REDUCE_CONFIG")
    try:
        low = cfg["min_world_size"]
        ranges, above = cfg["custom_ar_preferred_ranges"], cfg["always_use_above_world_size"]
    except (KeyError, TypeError) as e:
        raise GateNotFound(f"gate not readable in vllm {eng.version} at {where}: NCCL_SYMM_MEM_ALL_REDUCE_CONFIG lacks "
                           f"{e}") from e
    ws = ctx.world_size
    ans.add(Gate("NCCL_SYMM_MEM_ALL_REDUCE_CONFIG world size", ws >= low and (ws in ranges or ws > above), where,
                 GATE_PYTHON, f"world size {ws}: below min_world_size {low}, or neither tuned ({sorted(ranges)}) nor "
                 f"above {above}", LIFT_SETTING, f"a TP size >= {low}", value=cfg, on_fail="decline", falls_to=PYNCCL))
    t = decode_tensor().to_json()
    band = ranges.get(ws)
    claims = band is None and ws > above or band is not None and (t["bytes"] <= band[0] or t["bytes"] >= band[1])
    fn = eng.function(UTILS, "should_nccl_symm_mem_allreduce")
    ans.add(Gate("per-call size rule (should_nccl_symm_mem_allreduce)", claims, f"vllm/{UTILS}:{fn.lineno}",
                 GATE_PYTHON, f"the decode tensor ({t['bytes']} bytes, bf16 {t['shape']}) lies inside "
                 f"custom_ar_preferred_ranges[{ws}] {band}, where vLLM leaves it to the next path", LIFT_NOTHING,
                 "a decode tensor outside that band (<= lower or >= upper bound)", value={"bytes": t["bytes"], "band": band},
                 on_fail="decline", falls_to="the next step of CudaCommunicator.all_reduce"))
    built = all(g.admits for g in ans.gates[:-1])      # every gate but the per-call size rule
    rule = {"band": band, "above": above, "where": f"vllm/{UTILS}:{fn.lineno}", "built": built}
    v = ans.verdict(f"vLLM {eng.version} tries NCCL symmetric memory first for this tensor")
    v.add("per-call size rule (rows -> claims)", rule, f"vllm/{UTILS}:{fn.lineno} should_nccl_symm_mem_allreduce")
    v.warnings.append("NCCL symmetric memory needs vLLM's NCCL allocator, compiled at start-up with torch's "
                      "load_inline (vllm/distributed/device_communicators/pynccl_allocator.py compile_nccl_allocator: "
                      "a host compiler and NCCL headers; it disables itself if that fails), and whether NCCL's "
                      "symmetric kernels run over PCIe is NCCL's runtime choice: not read here")
    return v


def _pcie_ipc(ctx, eng: Engine) -> Verdict:
    rel = f"{DC}/flashinfer_pcie_ipc_all_reduce.py"
    ans = _ans(PCIE_IPC, eng, ctx)
    ans.add(env_gate(eng, ctx, "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC", "FlashInfer PCIe IPC allreduce"))
    sizes, where = eng.table(rel, "_SUPPORTED_WORLD_SIZES")
    ans.add(Gate("_SUPPORTED_WORLD_SIZES", ctx.world_size in sizes, where, GATE_PYTHON,
                 f"world size {ctx.world_size} is not in {list(sizes)}", LIFT_SETTING, f"a TP size in {list(sizes)}",
                 value=list(sizes), on_fail="decline", falls_to=PYNCCL))
    dtypes_node = _find(eng.tree(rel), lambda n: isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "_SUPPORTED_DTYPES" for t in n.targets),
        "no module-level _SUPPORTED_DTYPES", eng, rel)
    dtypes = [ast.unparse(e).removeprefix("torch.") for e in getattr(dtypes_node.value, "elts", [])]
    t = decode_tensor()
    ans.add(Gate("_SUPPORTED_DTYPES", t.dtype in dtypes, _where(eng, rel, dtypes_node), GATE_PYTHON,
                 f"the model dtype {t.dtype} is not in {dtypes}", LIFT_SETTING, f"a model dtype in {dtypes}",
                 value=dtypes, on_fail="decline", falls_to=PYNCCL))
    from ...source import package_dir
    fi = package_dir("flashinfer")
    fi_ver = dist_version("flashinfer-python")
    has = bool(fi and source.find_files_containing(fi / "comm", "PcieIpcAllReduceWorkspace")) if fi else False
    ans.add(Gate("flashinfer.comm.PcieIpcAllReduceWorkspace", has,
                 f"vllm/{rel} `_pcie_ipc_available = hasattr(flashinfer_comm, 'PcieIpcAllReduceWorkspace')`",
                 GATE_NOT_INSTALLED if not fi else GATE_PYTHON,
                 "not installed: flashinfer-python" if not fi else
                 f"flashinfer-python {fi_ver} has no PcieIpcAllReduceWorkspace: vLLM warns and falls back",
                 LIFT_PACKAGE, "a flashinfer-python release whose flashinfer/comm defines PcieIpcAllReduceWorkspace "
                 f"({_own_pin_words(eng, 'flashinfer-python')})",
                 value=f"flashinfer-python {fi_ver or 'absent'}", on_fail="decline", falls_to=PYNCCL))
    uncaught = _pcie_ipc_setup_uncaught(eng)
    v = ans.verdict(f"vLLM {eng.version} builds FlashInferPcieIpcAllReduce on the TP group and sets its workspace up "
                    "before CUDA graph capture (warmup_flashinfer_pcie_ipc_allreduce: no capture sizes, as with "
                    "--enforce-eager, or multi-ubatch execution leave it unset), for {bf16, fp16} 2-D tensors of the "
                    "model's hidden size that FlashInfer's workspace.supports() admits. vLLM catches nothing in that "
                    "set-up: a failed JIT build, CUDA IPC open or tune stops start-up rather than falling back to "
                    f"pynccl ({'; '.join(uncaught)})")
    v.add("set-up with no exception handler (a failure stops start-up, no fall-back)", uncaught,
          "ast: no try/except around these calls")
    if uncaught:
        v.add("caveat: ", "a failed set-up (JIT build, CUDA IPC open, tune) stops start-up: vLLM catches nothing "
              "around it, unlike SGLang's fall-back to NCCL", uncaught[0].split(" `")[0])
    off = _pcie_ipc_turned_off_by(eng, ctx)
    v.add("do not set with it", off, f"vllm/{CUDA_COMM} CudaCommunicator.__init__ "
          "`use_flashinfer_pcie_ipc_allreduce = ... and not envs.X`")
    return v


def own_pin(eng: Engine, dist: str) -> tuple[str | None, str]:
    """``("flashinfer-python==0.7.2.post1", "vllm-0.33.0.dist-info METADATA Requires-Dist")``: the installed vLLM's
    own requirement on ``dist``, read from the distribution metadata next to ``eng.root`` (the ``vllm`` folder's
    ``*.dist-info``; an edited copy's too). ``(None, why)`` when that metadata or such a requirement is not found:
    never an invented pin."""
    want = re.sub(r"[-_.]+", "-", dist).lower()
    dists = [d for d in metadata.distributions(path=[str(eng.root.parent)])
             if re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower() == DIST]
    if not dists:
        return None, f"no vllm distribution metadata next to vllm/ ({eng.root.parent.name})"
    d = dists[0]
    where = f"vllm-{d.version}.dist-info METADATA Requires-Dist"
    for req in d.requires or []:
        m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
        if m and re.sub(r"[-_.]+", "-", m.group(1)).lower() == want:
            return req.strip(), where
    return None, f"{where} names no {dist}"


def _own_pin_words(eng: Engine, dist: str) -> str:
    pin, where = own_pin(eng, dist)
    return f"vLLM's own pin: {pin}, {where}" if pin else f"vLLM's own pin not read: {where}"


def _nccl_algo_pinned_by(eng: Engine, name: str) -> tuple[str, str] | None:
    """``("ring,tree;allreduce:tree", "vllm/FILE:LINE")``: the ``NCCL_ALGO`` value vLLM itself sets when ``envs.<name>``
    is on, read from the installed source: a module that names ``NCCL_ALGO`` and has an ``if envs.<name>:`` whose body
    calls a function of that module which sets it (a ``{"NCCL_ALGO": "..."}`` literal, as passed to ``pin_nccl_env``,
    or ``os.environ["NCCL_ALGO"] = "..."``). vllm 0.33.0: ``init_batch_invariance`` (``model_executor/determinism/
    batch_invariant.py:1435``) calls ``override_envs_for_invariance``, whose pin is ``"NCCL_ALGO": "ring,tree;
    allreduce:tree"`` (``:1419``): allreduce on Tree, not Ring. None when no such setting is read."""
    for path in source.find_files_containing(eng.root, "NCCL_ALGO"):
        try:
            tree = source.parse(path)
        except (SyntaxError, ValueError, OSError):
            continue
        rel = path.relative_to(eng.root).as_posix()
        fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for branch in (n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test) == f"envs.{name}"):
            body = [x for st in branch.body for x in ast.walk(st)]
            reached = body + [x for c in body if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                              and c.func.id in fns for x in ast.walk(fns[c.func.id])]
            for n in reached:
                if isinstance(n, ast.Dict):
                    for k, v in zip(n.keys, n.values):
                        if isinstance(k, ast.Constant) and k.value == "NCCL_ALGO" and isinstance(v, ast.Constant):
                            return str(v.value), _where(eng, rel, k)
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant) \
                        and any(ast.unparse(t) in ("os.environ['NCCL_ALGO']", 'os.environ["NCCL_ALGO"]')
                                for t in n.targets):
                    return str(n.value.value), _where(eng, rel, n)
    return None


def _allreduce_algo(spec: str) -> str:
    """The allreduce algorithms an ``NCCL_ALGO`` value allows: ``"tree"`` for ``"ring,tree;allreduce:tree"`` (a
    ``<collective>:<list>`` part for allreduce wins over the plain list), the plain list otherwise."""
    parts = [x.strip() for x in spec.split(";") if x.strip()]
    own = next((x.split(":", 1)[1] for x in parts if x.lower().startswith("allreduce:")), None)
    return own if own is not None else next((x for x in parts if ":" not in x), spec)


def _pcie_ipc_turned_off_by(eng: Engine, ctx) -> list[dict]:
    """``[{"setting": "VLLM_BATCH_INVARIANT=1", "then": "NCCL (pynccl, allreduce algorithm tree)", "where": "vllm/FILE:LINE",
    "why": ...}]``: the variables whose ``not envs.X`` sits in ``CudaCommunicator.__init__``'s assignment of
    ``use_flashinfer_pcie_ipc_allreduce`` (vllm 0.33.0 ``cuda_communicator.py:73-76``: ``... and not
    envs.VLLM_BATCH_INVARIANT``): set to 1, vLLM never builds the PCIe IPC communicator and the decode allreduce
    goes on down the dispatch to pynccl (``all_reduce``, ``cuda_communicator.py:432-438``; on PCIe at world size 8 no
    custom allreduce comes before it). ``then`` names an NCCL algorithm only where vLLM's own source pins one under
    that variable (:func:`_nccl_algo_pinned_by`; batch-invariant mode pins allreduce to Tree,
    ``batch_invariant.py:1419``), else it reads ``NCCL (pynccl)``: NCCL then picks its algorithm itself. A variable the
    configuration already sets is left out (the answer is then about that configuration). Raises GateNotFound when no
    such assignment is found. At world size 2 or on NVLink, where custom allreduce is built and comes first, the
    entry claims nothing: ``"then": ""`` and a ``not assessed:`` note."""
    fn = eng.method(CUDA_COMM, "CudaCommunicator", "__init__")
    found = [n for n in ast.walk(fn) if isinstance(n, ast.Assign)
             and any(ast.unparse(t).endswith("use_flashinfer_pcie_ipc_allreduce") for t in n.targets)
             and "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC" in ast.unparse(n.value)]
    if not found:
        raise GateNotFound(f"gate not found in vllm {eng.version} at vllm/{CUDA_COMM}: CudaCommunicator.__init__ no "
                           "longer assigns use_flashinfer_pcie_ipc_allreduce from VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC")
    out = []
    for node in found:
        for n in ast.walk(node.value):
            if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not) and isinstance(n.operand, ast.Attribute) \
                    and ast.unparse(n.operand.value) == "envs":
                name = n.operand.attr
                if _var_given(ctx, name) is not None:
                    continue
                ws, topo = getattr(ctx, "world_size", None), getattr(ctx, "topology", None)
                if ws is None or ws <= 2 or topo == "nvlink":
                    # custom allreduce is built here (custom_all_reduce.py:267 refuses only ws > 2 without full
                    # NVLink) and comes before pynccl in all_reduce: what serves then is not read by this entry
                    out.append({"setting": f"{name}=1", "where": _where(eng, CUDA_COMM, n), "then": "",
                                "note": f"not assessed: PCIe IPC is not built, and at world size {ws} on {topo} "
                                        "vLLM's custom allreduce may take the tensor before pynccl "
                                        "(its own checks decide at run time)"})
                    continue
                pin = _nccl_algo_pinned_by(eng, name)
                why = f"use_flashinfer_pcie_ipc_allreduce is ... and not envs.{name}: PCIe IPC is not built"
                if pin is not None:
                    why += f"; it sets NCCL_ALGO={pin[0]} ({pin[1]})"
                out.append({"setting": f"{name}=1", "where": _where(eng, CUDA_COMM, n), "why": why,
                            "then": f"NCCL (pynccl, allreduce algorithm {_allreduce_algo(pin[0])})" if pin is not None
                            else "NCCL (pynccl)"})
    return out


def _not_in_try(fn: ast.AST, node: ast.AST) -> bool:
    """Whether ``node`` (inside ``fn``) lies outside every ``try`` body of ``fn`` that has an ``except`` handler."""
    return not any(isinstance(t, ast.Try) and t.handlers and any(node is n for b in t.body for n in ast.walk(b))
                   for t in ast.walk(fn))


def _pcie_ipc_setup_uncaught(eng: Engine) -> list[str]:
    """``["vllm/FILE:LINE `call`", ...]``: the PCIe IPC set-up calls that no ``try``/``except`` wraps, from the
    workspace's construction and tune in ``FlashInferPcieIpcAllReduce.setup`` up to ``kernel_warmup``'s call of
    ``warmup_flashinfer_pcie_ipc_allreduce``. Raises GateNotFound when a call is missing or a handler now wraps it
    (vLLM then catches the failure: this reader does not know where it goes)."""
    rel = f"{DC}/flashinfer_pcie_ipc_all_reduce.py"
    warm = "model_executor/warmup/kernel_warmup.py"
    setup = eng.method(rel, "FlashInferPcieIpcAllReduce", "setup")
    warmup = eng.function(rel, "warmup_flashinfer_pcie_ipc_allreduce")
    kw = eng.function(warm, "kernel_warmup")
    steps = ((setup, rel, "PcieIpcAllReduceWorkspace", "FlashInferPcieIpcAllReduce.setup builds the workspace"),
             (setup, rel, ".tune", "FlashInferPcieIpcAllReduce.setup tunes the workspace"),
             (warmup, rel, ".setup", "warmup_flashinfer_pcie_ipc_allreduce calls setup"),
             (kw, warm, "warmup_flashinfer_pcie_ipc_allreduce", "kernel_warmup calls warmup_flashinfer_pcie_ipc_allreduce"))
    out = []
    for fn, r, marker, what in steps:
        call = _find(fn, lambda n, m=marker: isinstance(n, ast.Call) and ast.unparse(n.func).endswith(m),
                     f"no call ending in {marker} ({what})", eng, r)
        if not _not_in_try(fn, call):
            raise GateNotFound(f"gate changed in vllm {eng.version} at vllm/{r}:{call.lineno}: {what} inside a "
                               "try/except now; this suite does not read where that failure goes")
        out.append(_where(eng, r, call, ast.unparse(call.func)))
    return out


def _fi_size_table(ctx, eng: Engine):
    table, where = eng.table(FUSION, "FI_ALLREDUCE_FUSION_MAX_SIZE_MB")
    if not isinstance(table, dict) or not table:
        raise GateNotFound(f"gate not readable in vllm {eng.version} at {where}: FI_ALLREDUCE_FUSION_MAX_SIZE_MB is "
                           "not a non-empty dict")
    key = capability_key(ctx.target, table)
    return table, where, key


def _fi_table_gate(ctx, eng, who: str) -> Gate:
    table, where, key = _fi_size_table(ctx, eng)
    row = table.get(key) or {}
    return Gate("FI_ALLREDUCE_FUSION_MAX_SIZE_MB keys (device capability)", ctx.world_size in row,
                f"{where} (ast), looked up with capability.to_int() (vllm/config/compilation.py "
                "PassConfig.default_fi_allreduce_fusion_max_size_mb)", GATE_PYTHON,
                f"FI_ALLREDUCE_FUSION_MAX_SIZE_MB has keys {sorted(table)} only" + (
                    f" (row {key!r} lacks world size {ctx.world_size})" if key in table else f": no {key!r}")
                + f", so {who} disables itself with a warning; no CUDA upgrade lifts a Python table", LIFT_PACKAGE,
                f"a vllm release whose FI_ALLREDUCE_FUSION_MAX_SIZE_MB has key {key!r} with world size {ctx.world_size}",
                value=sorted(table), on_fail="decline", falls_to=PYNCCL)


def _flashinfer_allreduce(ctx, eng: Engine) -> Verdict:
    rel = f"{DC}/flashinfer_all_reduce.py"
    ans = _ans("flashinfer-allreduce", eng, ctx)
    ans.add(env_gate(eng, ctx, "VLLM_ALLREDUCE_USE_FLASHINFER", "the standalone FlashInfer allreduce"))
    init = eng.method(rel, "FlashInferAllReduce", "__init__")
    sized = _find(init, lambda n: isinstance(n, ast.Call) and "default_fi_allreduce_fusion_max_size_mb" in ast.unparse(n.func),
                  "FlashInferAllReduce.__init__ no longer sizes itself with default_fi_allreduce_fusion_max_size_mb",
                  eng, rel)
    # the line that reads the default table (its own warning then names the world size, not the capability); the
    # pass_config override fi_allreduce_fusion_max_size_mb does not reach this standalone path
    ans.add(_fi_table_gate(ctx, eng, f"FlashInferAllReduce (vllm/{rel}:{sized.lineno}, reading only the default "
                                     "table: PassConfig.fi_allreduce_fusion_max_size_mb does not reach it)"))
    return ans.verdict(f"vLLM {eng.version} builds FlashInferAllReduce (FlashInfer's allreduce_fusion kernel, "
                       "pattern kAllReduce) on the TP group")


def _fusion_pass(ctx, eng: Engine) -> Verdict:
    ans = _ans("flashinfer-allreduce-fusion", eng, ctx)
    fn = eng.function("config/vllm.py", "enable_allreduce_rms_fusion")
    text = ast.unparse(fn)
    fam = [int(m) for m in re.findall(r"is_device_capability_family\((\d+)\)", text)]
    exact = [int(m) for m in re.findall(r"is_device_capability\((\d+)\)", text)]
    if not fam and not exact:
        raise GateNotFound(f"gate not readable in vllm {eng.version} at vllm/config/vllm.py:{fn.lineno}: "
                           "enable_allreduce_rms_fusion names no device capability")
    code = ctx.target.major * 10 + ctx.target.minor
    auto = code in exact or any(code // 10 == f // 10 for f in fam)
    cc = _flag(ctx, "--compilation-config")
    try:
        pass_config = compilation_config(cc).get("pass_config") or {}
    except ValueError as e:
        return _cc_not_assessed(ctx, eng, str(e))
    asked = bool(pass_config.get("fuse_allreduce_rms"))
    flag = '--compilation-config {"pass_config": {"fuse_allreduce_rms": true}}'
    ans.add(Gate("pass default (enable_allreduce_rms_fusion at -O2)", auto or asked,
                 f"vllm/config/vllm.py:{fn.lineno} enable_allreduce_rms_fusion", GATE_SETTING,
                 f"on by default only for device capability family {fam} or capability {exact}; {ctx.target.cc} is "
                 "neither", LIFT_SETTING, flag, value={"family": fam, "exact": exact}, flag="--compilation-config",
                 set_to="'{\"pass_config\": {\"fuse_allreduce_rms\": true}}'", opt_in=not auto, configured=asked))
    init = eng.method(FUSION, "AllReduceFusionPass", "__init__")
    call = _find(init, lambda n: isinstance(n, ast.Call) and "flashinfer_max_size" in ast.unparse(n.func),
                 "AllReduceFusionPass.__init__ no longer reads pass_config.flashinfer_max_size", eng, FUSION)
    override, fi_sizes = _fi_override(eng)
    given = pass_config.get(FI_OVERRIDE)
    gate = _fi_table_gate(ctx, eng, f"AllReduceFusionPass ({_where(eng, FUSION, call, ast.unparse(call.func))})")
    past = ("what happens past the size (FlashInfer's allreduce-fusion workspace: its multicast backend fails on PCIe, "
            "then the trtllm one) is not read here (runtime)")
    example = f'--compilation-config {{"pass_config": {{"fuse_allreduce_rms": true, "{FI_OVERRIDE}": N}}}}'
    beyond = _fusion_workspace(eng, ctx)
    if given is not None:
        gate = replace(gate, admits=ctx.world_size in fi_sizes, value={"keys": gate.value, FI_OVERRIDE: given},
                       where=f"{gate.where}; overridden by PassConfig.{FI_OVERRIDE} ({override})")
    # where the override reaches a workspace FlashInfer admits for the target and vLLM catches its failure, the table
    # is one more setting to give (an opt-in to measure), not a wall
    settable = beyond is not None and beyond["admits"] is True and ctx.world_size in fi_sizes
    ans.add(replace(gate, lift=LIFT_SETTING, opt_in=settable and not gate.admits, flag="--compilation-config",
                    set_to=f'\'{{"pass_config": {{"fuse_allreduce_rms": true, "{FI_OVERRIDE}": N}}}}\'',
                    configured=given is not None and gate.admits,
                    cause=gate.cause.replace("; no CUDA upgrade lifts a Python table", "")
                    + f"; PassConfig.{FI_OVERRIDE}, unset here, would replace the table ({override})",
                    lift_detail=f"{example} (N in MB; PassConfig.{FI_OVERRIDE} replaces the table, {override}); "
                                + (beyond["text"] if beyond else past)))
    envb = _fi_backend_env(eng)
    chosen = _var_given(ctx, envb["name"]) if envb else None
    if envb and beyond and chosen == "mnnvl" and ctx.topology == "pcie":
        # an explicit mnnvl has no trtllm fallback: its multicast workspace fails on PCIe, recorded and not raised
        ans.add(Gate(f"{envb['name']}=mnnvl (no trtllm fallback)", False, envb["where"], GATE_TOPOLOGY,
                     f"{envb['name']}=mnnvl returns (backend, False): no trtllm fallback, and mnnvl's "
                     "workspace needs NVSwitch multicast, which PCIe lacks; the failure is recorded, not raised, so "
                     "the pass stays unfused without a word", LIFT_SETTING,
                     f"unset {envb['name']} (or set it to auto or trtllm)", value={envb["name"]: chosen},
                     flag=envb["name"], on_fail="decline",
                     falls_to="the unfused allreduce and RMSNorm (the communicator's own allreduce)"))
    env_words = ""
    if envb:
        env_words = (f"{envb['name']} ({envb['env_where']}, default {envb['default']!r}, choices {envb['choices']}) "
                     f"sits on this path: any value but auto returns (backend, False) at {envb['where']}, so there "
                     "is no trtllm fallback: =mnnvl on PCIe leaves the pass unfused (a silent fall-back), =trtllm "
                     "skips the MNNVL attempt")
    size_words = _fusion_size_words(eng, ctx)
    v = ans.verdict(f"vLLM {eng.version}'s compile pass fuses allreduce + RMSNorm into FlashInfer's kernel"
                    + (f"; {beyond['text']}" if beyond else "") + (f"; {env_words}" if env_words else "")
                    + f"; {size_words}")
    if v.lift_detail and size_words not in v.lift_detail and "fi_allreduce_fusion_max_size_mb" in v.lift_detail:
        v.lift_detail += f"; {size_words}" + (f"; do not set {envb['name']}=mnnvl on PCIe" if envb else "")
    if beyond:
        v.add("past the size table: FlashInfer's workspace on one node", beyond, beyond["where"])
    if envb:
        v.add(f"{envb['name']}: an explicit backend has no trtllm fallback", envb, envb["where"])
    oneshot = _fusion_oneshot(eng, ctx)
    if oneshot is not None and v.status in ("opt-in", "on-as-configured"):
        v.add("caveat: ", oneshot[0], oneshot[1])
    return _fusion_warn(v, given, beyond, past)


def _fusion_oneshot(eng: Engine, ctx) -> tuple[str, str] | None:
    """The strategy the fusion pass picks on the target, when it writes to every peer at once: vllm 0.33.0's
    ``_select_flashinfer_allreduce_use_oneshot`` returns ``max_one_shot_size is None or ...``
    (``allreduce_rms_fusion.py:176``) and ``_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB`` (``:132``) has no entry for 120, so
    one-shot at every size: each rank writes its whole input to all its peers (over PCIe here), the pattern vLLM's
    own custom allreduce refuses without full NVLink. ``(text, "vllm/FILE:LINE; :LINE")``; None when the table has
    the target, or either is not found (nothing is claimed then)."""
    tree = eng.tree(FUSION)
    table = next((n for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign)) and "_FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB"
                  in [t.id for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)]),
                 None)
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef)
               and n.name == "_select_flashinfer_allreduce_use_oneshot"), None)
    if table is None or fn is None or table.value is None:
        return None
    try:
        keys = sorted(ast.literal_eval(table.value))
    except (ValueError, TypeError, SyntaxError):
        return None
    ret = next((r for r in ast.walk(fn) if isinstance(r, ast.Return) and r.value is not None
                and ast.unparse(r.value).startswith("max_one_shot_size is None or")), None)
    code = ctx.target.major * 10 + ctx.target.minor
    if ret is None or code in keys or ctx.world_size < 3:
        return None
    return (f"one-shot at every size on {ctx.target.cc}: _FI_ALLREDUCE_ONE_SHOT_MAX_SIZES_MB has keys {keys}, no "
            f"{code}, and a missing entry selects one-shot, so each rank writes its input to all {ctx.world_size - 1} "
            f"peers at once ({ctx.topology}); a torch.compile pass: nothing is fused with --enforce-eager",
            f"vllm/{FUSION}:{table.lineno}; :{ret.lineno}")


def _fusion_warn(v: Verdict, given, beyond, past) -> Verdict:
    if given is not None:
        v.warnings.append(f"PassConfig.{FI_OVERRIDE}={given} replaces the size table; "
                          + (beyond["text"] if beyond else past))
    return v


def _fusion_workspace(eng: Engine, ctx) -> dict | None:
    """What the fusion pass reaches once the size table is overridden, read from the installed vLLM and FlashInfer:
    the backend chosen for one node (``distributed/device_communicators/flashinfer_all_reduce.py``: ``mnnvl`` with
    ``allow_trtllm_fallback``, vllm 0.33.0 ``:157-163``; then ``trtllm`` when that workspace is None, ``:226-232``),
    whether a failed workspace is caught (``_fi_ar_workspace_failed = True``: the pass stays unfused, no raise), and
    the majors FlashInfer's ``gen_trtllm_comm_module`` admits (``flashinfer/jit/comm.py``, :func:`_trtllm_comm_majors`).
    Returns ``{"admits", "text", "where", "majors"}`` (``admits`` None and the text saying not assessed when those
    majors are not read: never taken as admitting), or None when a piece of vLLM's is not found (the lift then says it
    is not read)."""
    rel = f"{DC}/flashinfer_all_reduce.py"
    try:
        tree = eng.tree(rel)
    except GateNotFound:
        return None
    single = next((n for n in ast.walk(tree) if isinstance(n, ast.If) and "node_count == 1" in ast.unparse(n.test)
                   and "allow_trtllm_fallback = True" in ast.unparse(n)), None)
    fallback = next((n for n in ast.walk(tree) if isinstance(n, ast.If) and "allow_trtllm_fallback" in
                     ast.unparse(n.test) and "backend = 'trtllm'" in ast.unparse(n)), None)
    failed = next((n for n in ast.walk(tree) if isinstance(n, ast.Assign)
                   and ast.unparse(n.targets[0]) == "_fi_ar_workspace_failed" and ast.unparse(n.value) == "True"), None)
    if single is None or fallback is None or failed is None:
        return None
    majors, fi_where = _trtllm_comm_majors()
    admits = None if majors is None else ctx.target.major in majors
    where = (f"vllm/{rel}:{single.lineno}-{single.end_lineno} (one node: mnnvl, trtllm allowed); "
             f"vllm/{rel}:{fallback.lineno}-{fallback.end_lineno} (trtllm when mnnvl's workspace is None); "
             f"vllm/{rel}:{failed.lineno} (a failed workspace is recorded, not raised)")
    head = (f"past the size table, on one node vLLM tries FlashInfer's mnnvl workspace and falls back to trtllm "
            f"({where}); ")
    if admits is None:
        text = head + (f"whether FlashInfer's trtllm workspace admits {ctx.target.cc} is not assessed: the majors of "
                       f"its gen_trtllm_comm_module were not read ({fi_where})")
    else:
        text = head + (f"FlashInfer's gen_trtllm_comm_module admits majors {majors} ({fi_where}; "
                       f"{'so ' + ctx.target.cc + ' is admitted' if admits else 'not ' + ctx.target.cc}); a failure "
                       "there leaves the pass unfused rather than stopping start-up: worth measuring, with the caveat "
                       "that its one-shot kernel writes to every peer at once, which over PCIe is every GPU's link at "
                       "the same time")
    return {"admits": admits, "text": text, "where": where, "majors": majors}


def _trtllm_comm_majors() -> tuple[list[int] | None, str]:
    """``([9, 10, 12], "flashinfer/jit/comm.py:LINE (flashinfer-python V)")``: the majors the installed FlashInfer's
    ``gen_trtllm_comm_module`` passes as ``supported_major_versions=[...]`` (a literal list; flashinfer-python
    0.7.2.post1 ``jit/comm.py:198``), or ``(None, why)`` when they are not read: FlashInfer or that file absent, the
    function gone, no such keyword, or a value that is not a literal list (never taken as admitting)."""
    from ...probes import flashinfer_common as fic
    try:
        path = fic.comm_source()
        tree = source.parse(path)
    except (source.SourceNotFound, SyntaxError, ValueError, OSError) as e:
        return None, f"flashinfer/jit/comm.py not read: {e}"
    ver = f"flashinfer-python {dist_version('flashinfer-python')}"
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "gen_trtllm_comm_module"), None)
    if fn is None:
        return None, f"flashinfer/jit/comm.py ({ver}) defines no gen_trtllm_comm_module"
    kws = [k for n in ast.walk(fn) if isinstance(n, ast.Call) for k in n.keywords
           if k.arg == "supported_major_versions"]
    if len(kws) != 1:
        return None, (f"flashinfer/jit/comm.py:{fn.lineno} ({ver}) gen_trtllm_comm_module passes "
                      f"supported_major_versions {len(kws)} times, not once")
    try:
        majors = ast.literal_eval(kws[0].value)
    except ValueError:
        majors = None
    if not isinstance(majors, (list, tuple)) or not all(isinstance(m, int) for m in majors):
        return None, (f"flashinfer/jit/comm.py:{kws[0].value.lineno} ({ver}) supported_major_versions="
                      f"`{ast.unparse(kws[0].value)}` is not a literal list of majors")
    return sorted(majors), f"flashinfer/jit/comm.py:{kws[0].value.lineno} ({ver})"


def _fi_backend_env(eng: Engine) -> dict | None:
    """The environment variable that picks FlashInfer's allreduce workspace backend, read from the installed vLLM:
    ``_resolve_fi_ar_backend`` in ``distributed/device_communicators/flashinfer_all_reduce.py`` assigns
    ``backend = envs.<NAME>`` and, for any value but ``"auto"``, returns ``(backend, False)``: no trtllm fallback
    (vllm 0.33.0: ``VLLM_FLASHINFER_ALLREDUCE_BACKEND``, ``envs.py:1811``, choices auto/trtllm/mnnvl; the return at
    ``flashinfer_all_reduce.py:154``). Returns ``{"name", "env_where", "default", "choices", "where"}`` or None when
    the function or that early return is not found."""
    rel = f"{DC}/flashinfer_all_reduce.py"
    try:
        fn = eng.function(rel, "_resolve_fi_ar_backend")
    except GateNotFound:
        return None
    read = next((n for n in ast.walk(fn) if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "backend"
                 and isinstance(n.value, ast.Attribute) and ast.unparse(n.value).startswith("envs.")), None)
    early = next((n for n in ast.walk(fn) if isinstance(n, ast.If) and re.fullmatch(
        r"backend != ['\"]auto['\"]", ast.unparse(n.test))), None)
    ret = next((b for b in early.body if isinstance(b, ast.Return) and isinstance(b.value, ast.Tuple)
                and len(b.value.elts) == 2 and isinstance(b.value.elts[1], ast.Constant)
                and b.value.elts[1].value is False), None) if early is not None else None
    if read is None or ret is None:
        return None
    name = read.value.attr   # type: ignore[attr-defined]
    env_where, default, choices = "vllm/envs.py", None, None
    try:
        tree = eng.tree("envs.py")
        for d in (n for n in ast.walk(tree) if isinstance(n, ast.Dict)):
            for k, v in zip(d.keys, d.values):
                if isinstance(k, ast.Constant) and k.value == name:
                    env_where = f"vllm/envs.py:{k.lineno}"
                    if isinstance(v, ast.Call) and len(v.args) >= 3:
                        default = ast.literal_eval(v.args[1])
                        choices = ast.literal_eval(v.args[2])
    except (GateNotFound, ValueError):
        pass
    return {"name": name, "env_where": env_where, "default": default, "choices": choices,
            "where": _where(eng, rel, ret, ast.unparse(ret))}


def _fusion_size_words(eng: Engine, ctx) -> str:
    """Guidance for N in ``fi_allreduce_fusion_max_size_mb`` from the workload preset the suite uses
    (:func:`decode_tensor`: hidden and dtype) and the decode widths vLLM captures (:func:`capture_widths`): one row
    is hidden x element size bytes, so N MB covers N x 1048576 / that many rows. vllm 0.33.0 at hidden 7168 bf16:
    14,336 B a row, 73 rows per MB; the captured widths reach 512 rows on 12.0, which N=7 covers."""
    t = decode_tensor()
    row = t.hidden * (4 if t.dtype == "float32" else 2)
    per_mb = (1 << 20) // row
    words = (f"N in MB bounds the tensor the pass fuses: one decode row at hidden {t.hidden} {t.dtype} is {row:,} B, "
             f"so N MB covers N x 1048576 / {row:,} rows ({per_mb} rows per MB; N=1 covers {per_mb} rows)")
    try:
        widths, where = capture_widths(eng, t.tokens, ctx.target)
    except GateNotFound:
        return words + "; the captured decode widths are not read here"
    top = max(widths)
    need = -(-top * row // (1 << 20))
    return words + f"; the captured decode widths reach {top} rows ({where.split(' ')[0]}), which N={need} covers"


#: the PassConfig field that replaces FI_ALLREDUCE_FUSION_MAX_SIZE_MB in PassConfig.flashinfer_max_size
FI_OVERRIDE = "fi_allreduce_fusion_max_size_mb"


def _cc_not_assessed(ctx, eng: Engine, why: str) -> Verdict:
    """The fusion pass's answer when ``--compilation-config`` cannot be read: not assessed, naming the value."""
    v = Verdict("flashinfer-allreduce-fusion", ERROR, scope=SCOPE_ENGINE, host=se.target_host(ctx),
                cause=f"not assessed: {why}; vLLM parses the flag with json.loads and stops on anything else, so "
                      "whether the allreduce + RMSNorm pass is asked for is not read (never matched by substring)",
                lift_detail="give --compilation-config one JSON object, e.g. "
                            '\'{"pass_config": {"fuse_allreduce_rms": true}}\'')
    v.add("vllm version", eng.version, "distribution metadata")
    return v.add("--compilation-config as given", _flag(ctx, "--compilation-config"), "the configuration asked about")


def _fi_override(eng: Engine) -> tuple[str, list]:
    """``("vllm/config/compilation.py:LINE PassConfig.fi_allreduce_fusion_max_size_mb, honoured at ...", [2, 4, 8,
    16])``: the field, the line of ``PassConfig.flashinfer_max_size`` that reads it before the table's default
    (``max_size_mb = self.fi_allreduce_fusion_max_size_mb``, then ``if max_size_mb is None:`` the table), and the world
    sizes that function admits at all (``FI_SUPPORTED_WORLD_SIZES``). Raises GateNotFound when any is missing (the
    override may be gone: the table then decides alone)."""
    rel = "config/compilation.py"
    field_line = next((n.lineno for n in eng.cls(rel, "PassConfig").body if isinstance(n, ast.AnnAssign)
                       and isinstance(n.target, ast.Name) and n.target.id == FI_OVERRIDE), None)
    if field_line is None:
        raise GateNotFound(f"gate not found in vllm {eng.version} at vllm/{rel}: no field PassConfig.{FI_OVERRIDE}")
    fn = eng.method(rel, "PassConfig", "flashinfer_max_size")
    read = _find(fn, lambda n: isinstance(n, ast.Assign) and ast.unparse(n.value) == f"self.{FI_OVERRIDE}",
                 f"PassConfig.flashinfer_max_size no longer reads self.{FI_OVERRIDE}", eng, rel)
    var = ast.unparse(read.targets[0])
    _find(fn, lambda n: isinstance(n, ast.If) and ast.unparse(n.test) == f"{var} is None"
          and "default_fi_allreduce_fusion_max_size_mb" in ast.unparse(n),
          f"PassConfig.flashinfer_max_size no longer falls to the table only when {var} is None", eng, rel)
    ws = _find(fn, lambda n: isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "FI_SUPPORTED_WORLD_SIZES",
               "PassConfig.flashinfer_max_size has no FI_SUPPORTED_WORLD_SIZES", eng, rel)
    try:
        sizes = list(ast.literal_eval(ws.value))
    except (ValueError, TypeError) as e:
        raise GateNotFound(f"gate not readable in vllm {eng.version} at vllm/{rel}:{ws.lineno}: "
                           f"FI_SUPPORTED_WORLD_SIZES is not a literal ({e})") from e
    return (f"vllm/{rel}:{field_line} PassConfig.{FI_OVERRIDE}, honoured at vllm/{rel}:{read.lineno} "
            f"`{ast.unparse(read)}` for world sizes {sizes} (vllm/{rel}:{ws.lineno})"), sizes


def _quick_allreduce(ctx, eng: Engine) -> Verdict:
    init = eng.method(CUDA_COMM, "CudaCommunicator", "__init__")
    site = _find(init, lambda n: isinstance(n, ast.If) and "is_rocm" in ast.unparse(n.test) and any(
        "QuickAllReduce(" in ast.unparse(b) for b in n.body), "QuickAllReduce is no longer built under is_rocm()",
        eng, CUDA_COMM)
    v = Verdict("quick-allreduce", NOT_INTEGRATED, scope=SCOPE_ENGINE, gate=GATE_NOT_INTEGRATED, lift=LIFT_NOTHING,
                host=se.target_host(ctx),
                cause=f"vLLM {eng.version} builds QuickAllReduce only on ROCm (MI300): "
                      f"{_where(eng, CUDA_COMM, site, 'current_platform.is_rocm()')}; on a CUDA target it never exists",
                lift_detail="nothing on CUDA (ROCm only)")
    v.add("vllm version", eng.version, "distribution metadata")
    return v.add("engine gate: ROCm only", {"admits": False, "value": "CUDA target"}, _where(eng, CUDA_COMM, site))


def _all2all(ctx, eng: Engine) -> Verdict:
    ans = _ans("ep-flashinfer-a2a", eng, ctx)
    lit = _find(eng.tree("config/parallel.py"), lambda n: isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == "All2AllBackend" for t in n.targets), "no All2AllBackend", eng,
        "config/parallel.py")
    names = [e.value for e in ast.walk(lit.value) if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    fi = [n for n in names if n.startswith("flashinfer")]
    if not fi:
        return Verdict("ep-flashinfer-a2a", NOT_INTEGRATED, scope=SCOPE_ENGINE, gate=GATE_NOT_INTEGRATED, lift=LIFT_PACKAGE,
                       host=se.target_host(ctx), cause=f"not integrated in vllm {eng.version}: All2AllBackend names no "
                       f"flashinfer backend ({names})", lift_detail="a vllm release with a FlashInfer all-to-all backend")
    default, where = field_default(eng, "config/parallel.py", "ParallelConfig", "all2all_backend")
    given = str(_flag(ctx, "--all2all-backend") or "")
    ep = _flag(ctx, "--enable-expert-parallel") is not None
    ans.add(Gate("--enable-expert-parallel", ep, field_default(eng, "config/parallel.py", "ParallelConfig",
                                                               "enable_expert_parallel")[1],
                 GATE_SETTING, "expert parallelism is off by default", LIFT_SETTING, "--enable-expert-parallel",
                 flag="--enable-expert-parallel", opt_in=True, configured=ep))
    managers = _managers(eng, fi)
    checks = {n: _moe_ep_nvlink_check(eng, managers[n]) for n in fi if n in managers}
    raising = [n for n in fi if checks.get(n, (False, ""))[0]]
    # a backend whose set-up raises without NVLink is no alternative on PCIe
    usable = [n for n in fi if n not in raising] if ctx.topology == "pcie" else list(fi)
    pick = next((n for n in usable if "two_sided" in n), usable[0] if usable else
                next((n for n in fi if "two_sided" in n), fi[0]))
    alts = [n for n in usable if n != pick]
    ans.add(Gate("--all2all-backend", given in fi, where, GATE_SETTING, f"--all2all-backend defaults to {default!r}",
                 LIFT_SETTING, f"--all2all-backend {pick}" + (f" (or {', '.join(alts)})" if alts else ""),
                 value={"default": default, "flashinfer": fi, "managers": managers},
                 flag="--all2all-backend", set_to=pick, opt_in=True, configured=given in fi))
    dp_where = _use_all2all(eng)
    dp = _int_flag(ctx, "--data-parallel-size")
    ans.add(Gate("--data-parallel-size > 1 (ParallelConfig.use_all2all)", dp > 1, dp_where, GATE_SETTING,
                 f"no all-to-all manager is built at data parallel size {dp}: ParallelConfig.use_all2all needs "
                 "data_parallel_size > 1 (or expert parallelism with prefill context parallelism), and the EP group "
                 "is made with use_all2all from it", LIFT_SETTING,
                 "--data-parallel-size 2 (or more; it takes DP x TP GPUs: on 8 GPUs that is TP 4 x DP 2, a smaller TP "
                 "allreduce than the one read here)",
                 value={"data_parallel_size": dp}, flag="--data-parallel-size", set_to="2", opt_in=True,
                 configured=dp > 1))
    if pick in raising and ctx.topology == "pcie":
        # every FlashInfer backend of this release raises without NVLink: setting it is a start-up failure
        ans.add(Gate(f"FlashInfer NVLink check ({pick} set-up)", False, checks[pick][1], GATE_TOPOLOGY,
                     f"{pick} ({managers[pick]}) builds its communication through flashinfer.moe_ep, whose "
                     "mnnvl_mapping_and_config raises RuntimeError when any EP rank lacks NVLink; vLLM does not catch "
                     "it", LIFT_NOTHING, f"nothing on PCIe: every FlashInfer all-to-all backend of vllm {eng.version} "
                     f"({', '.join(fi)}) needs NVLink", value={n: checks[n][0] for n in checks}, on_fail="raise",
                     raises=f"RuntimeError from flashinfer.moe_ep's NVLink check ({checks[pick][1]})"))
    need = _flashinfer_needs(eng, managers.get(pick, ""))
    if need is not None and need["missing"]:
        # the manager's constructor asserts the FlashInfer names it needs: a FlashInfer without them fails start-up
        ans.add(Gate(f"FlashInfer provides what {managers[pick]} asserts", False, need["assert_where"], GATE_PYTHON,
                     f"{managers[pick]}.__init__ asserts {need['check']}() ({need['check_where']}), which needs "
                     f"{', '.join(need['needs'])} from FlashInfer; the installed flashinfer-python "
                     f"{need['flashinfer'] or '?'} lacks {', '.join(need['missing'])}", LIFT_PACKAGE,
                     f"a flashinfer-python that still ships {', '.join(need['missing'])} (vllm {eng.version} pins "
                     f"{need['pin'] or 'its own'}), or a vllm release that no longer needs it",
                     value=need, on_fail="raise",
                     raises=f"AssertionError from {managers[pick]}.__init__ ({need['assert_where']})"))
    others = ", ".join(n for n in fi if n not in raising) or "none"
    ended = "".join(f"; {n} is a start-up failure without NVLink: {checks[n][1]}" if ctx.topology == "pcie"
                    else f"; {n} needs NVLink: {checks[n][1]}" for n in raising)
    v = ans.verdict(f"vLLM {eng.version} dispatches MoE tokens through FlashInfer's all-to-all ({', '.join(fi)}); "
                    f"the {'PCIe' if ctx.topology == 'pcie' else ctx.topology} outcome of {others} is not read "
                    "here (runtime): no check on their path in vLLM or FlashInfer declines the topology, and "
                    "FlashInfer's MNNVL memory uses POSIX-fd handles where FABRIC ones are not supported" + ended)
    for n in fi:
        if n in checks and checks[n][0]:
            v.add(f"{n} set-up: FlashInfer's NVLink check (raises, vLLM does not catch it)", True, checks[n][1])
        elif n in checks:
            v.add(f"{n} set-up: FlashInfer's NVLink check", False, checks[n][1])
    kernels = expert_kernels(eng, pick, ctx.target, ctx.world_size or 8)
    if kernels["refuse"] and "two_sided" in pick:
        v.cause += "; " + _kernel_words(kernels, ctx.target)
        v.add("expert kernels and the two-sided all-to-all (_supports_parallel_config, _supports_current_device)",
              kernels, "vllm/model_executor/layers/fused_moe/**/*.py (ast)")
    dep = _deprecated_import(eng, managers.get(pick, ""))
    if dep:
        v.cause += f"; {dep}"
        v.warnings.append(dep)
    rel = f"{DC}/all2all.py"
    tree = eng.tree(rel)
    owner = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == managers.get(pick)), tree)
    mn = next((n for n in ast.walk(owner) if isinstance(n, ast.ImportFrom)
               and (n.module or "").startswith(("flashinfer.comm.mnnvl", "flashinfer.moe_ep"))), None)
    if mn is not None:
        v.add("MNNVL transport import (inside the manager's initialize(), not a check)", ast.unparse(mn),
              _where(eng, rel, mn))
    v.add("FlashInfer MNNVL memory handle fall-back", *_mnnvl_posix_fallback())
    return v


def _flashinfer_needs(eng: Engine, manager: str) -> dict | None:
    """What a FlashInfer all-to-all manager's constructor asserts: its ``assert has_...()`` call in
    ``distributed/device_communicators/all2all.py``, that function's ``required_functions`` list of (module, name) in
    ``utils/flashinfer.py``, and which of them the installed FlashInfer's source lacks (a module file that does not
    exist, or a name it neither defines nor imports at top level). None when the manager asserts nothing of the kind
    or FlashInfer is not installed (its library answer says so)."""
    rel = f"{DC}/all2all.py"
    cls = next((n for n in eng.tree(rel).body if isinstance(n, ast.ClassDef) and n.name == manager), None)
    init = next((n for n in (cls.body if cls else []) if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    check = next((n for n in ast.walk(init) if isinstance(n, ast.Assert) and isinstance(n.test, ast.Call)
                  and isinstance(n.test.func, ast.Name) and n.test.func.id.startswith("has_")), None) if init else None
    fi_root = source.package_dir("flashinfer")
    if check is None or fi_root is None:
        return None
    name = check.test.func.id  # type: ignore[attr-defined]
    urel = "utils/flashinfer.py"
    fn = source.functions(eng.tree(urel)).get(name)
    if fn is None:
        raise GateNotFound(f"gate not found in vllm {eng.version} at vllm/{urel}: no function {name}")
    lst = next((n for n in ast.walk(fn) if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) ==
                "required_functions"), None)
    sub = next((n for n in ast.walk(fn) if isinstance(n, ast.Call) and ast.unparse(n.func) == "_get_submodule"
                and n.args and isinstance(n.args[0], ast.Constant)), None)
    names = next((n for n in ast.walk(fn) if isinstance(n, ast.Tuple) and n.elts
                  and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in n.elts)), None)
    try:
        if lst is not None:       # 0.33.0: required_functions = [(module, name), ...]
            needs = [tuple(x) for x in ast.literal_eval(lst.value)]
        elif sub is not None and names is not None:   # 0.34.0: hasattr(_get_submodule(module), name) for name in (...)
            needs = [(sub.args[0].value, e.value) for e in names.elts]  # type: ignore[attr-defined]
        else:
            raise GateNotFound(f"gate not found in vllm {eng.version} at vllm/{urel}:{fn.lineno}: {name} names neither "
                               "a required_functions list nor _get_submodule(...) with a tuple of names")
    except (ValueError, TypeError) as e:
        raise GateNotFound(f"gate not readable in vllm {eng.version} at vllm/{urel}:{fn.lineno}: {e}") from e
    missing = [f"{m}.{a}" for m, a in needs if not _defines(fi_root, m, a)]
    try:
        reqs = metadata.requires("vllm") or []
    except metadata.PackageNotFoundError:   # an edited copy without its dist-info: no pin to name
        reqs = []
    pin = next((r for r in reqs if r.replace("_", "-").startswith("flashinfer-python") and "extra ==" not in r), "")
    return {"check": name, "check_where": f"vllm/{urel}:{fn.lineno}", "assert_where": _where(eng, rel, check),
            "needs": [f"{m}.{a}" for m, a in needs], "missing": missing, "pin": pin,
            "flashinfer": dist_version("flashinfer-python")}


def _defines(root: Path, module: str, attr: str) -> bool:
    """Whether the installed package at ``root`` (the ``flashinfer`` folder) has ``module`` with top-level ``attr``
    (a def, class, assignment or import of that name), read from its source without importing it."""
    parts = module.split(".")[1:]
    base = root.joinpath(*parts)
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    if not path.is_file():
        return False
    try:
        tree = source.parse(path)
    except (SyntaxError, ValueError, OSError):
        return False
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == attr:
            return True
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(isinstance(t, ast.Name) and t.id == attr for t in targets):
                return True
        if isinstance(n, (ast.Import, ast.ImportFrom)) and any((al.asname or al.name.split(".")[-1]) == attr
                                                               for al in n.names):
            return True
        if isinstance(n, (ast.Import, ast.ImportFrom)) and any(al.name == "*" for al in n.names):
            return True   # a star import: the name may come with it (not decided against FlashInfer)
    return False


#: the platform predicates of ``vllm.platforms`` read for a CUDA target (``vllm/platforms/interface.py``)
_PLATFORM = {"is_cuda": True, "is_cuda_alike": True, "is_rocm": False, "is_xpu": False, "is_cpu": False,
             "is_tpu": False, "supports_mx": False}


class _Reader:
    """Three-valued reading of an expert kernel's ``_supports_parallel_config`` / ``_supports_current_device`` body:
    True, False or None (not read). ``config``: ``FusedMoEParallelConfig`` field values; ``props``: its properties'
    return expressions (read from ``model_executor/layers/fused_moe/config.py``, evaluated with the same fields);
    ``cap``: the target's capability as an int (120 for 12.0). A call this reader does not know (``has_...()``) is
    taken as True and kept in ``assumed`` (a library-availability check answered by the library's own probe), with
    where it is defined and why it was not read in ``assumed_where``; what made an answer None is in ``unread`` (the
    expression or statement and its line), so a kernel left unread says why."""

    def __init__(self, config: dict, props: dict, cap: int, resolve=None, parts=None):
        self.config, self.props, self.cap, self.resolve = config, props, cap, resolve
        # parts: a composite kernel's halves (:class:`_Parts`): ``cls.get_clses()``-style calls resolved to classes
        # and their own ``_supports_*`` answers; None: another class's method is not read
        self.parts = parts
        self.bound: dict[str, object] = {}      # local name -> a class key it names (a composite's half)
        self.assumed: list[str] = []
        self.assumed_where: list[str] = []
        self.unread: list[str] = []
        self.names: dict[str, str] = {}
        self.consts: dict = {}
        self.depth = 0

    def _cap_arg(self, node: ast.AST):
        try:
            v = ast.literal_eval(node)
        except ValueError:
            return None
        if isinstance(v, tuple) and len(v) == 2:
            return v[0] * 10 + v[1]
        return v if isinstance(v, int) else None

    def _miss(self, node: ast.AST, what: str = ""):
        """Record what could not be read (``what`` or the node's text, with its line); returns None."""
        self.unread.append(f"{what or ast.unparse(node)[:80]} (line {getattr(node, 'lineno', '?')})")
        return None

    def value(self, node: ast.AST, self_name: str = ""):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return self.consts[node.id] if node.id in self.consts else self._miss(node)
        if isinstance(node, ast.Tuple):
            vals = [self.value(e, self_name) for e in node.elts]
            return None if None in vals else tuple(vals)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and self.names.get(node.value.id) == "capability" and node.attr in ("major", "minor"):
            return self.cap // 10 if node.attr == "major" else self.cap % 10
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if self.names.get(node.value.id) == "config" or (self_name and node.value.id == self_name):
                if node.attr in self.config:
                    return self.config[node.attr]
                if node.attr in self.props:
                    return self.value(self.props[node.attr], "self")
            return self._miss(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            x = self.value(node.operand, self_name)
            return None if x is None else not x
        if isinstance(node, ast.BoolOp):
            vals = [self.value(v, self_name) for v in node.values]
            if isinstance(node.op, ast.And):
                return False if False in vals else (True if all(v is True for v in vals) else None)
            return True if True in vals else (False if all(v is False for v in vals) else None)
        if isinstance(node, ast.Compare):
            return self._compare(node, self_name) if len(node.ops) == 1 else self._chain(node, self_name)
        if isinstance(node, ast.Call):
            return self._call(node)
        return self._miss(node)

    def _chain(self, node: ast.Compare, self_name: str):
        """A chained comparison: ``a <= b < c`` is ``a <= b and b < c``."""
        terms = [node.left, *node.comparators]
        vals = [self._compare(ast.Compare(left=terms[i], ops=[op], comparators=[terms[i + 1]]), self_name)
                for i, op in enumerate(node.ops)]
        return False if False in vals else (True if all(v is True for v in vals) else self._miss(node))

    def _compare(self, node: ast.Compare, self_name: str):
        if isinstance(node.ops[0], ast.IsNot) \
                and isinstance(node.left, ast.Name) and self.names.get(node.left.id) == "capability" \
                and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value is None:
            return True     # a CUDA target has a device capability
        if isinstance(node.ops[0], (ast.In, ast.NotIn)):
            a, b = self.value(node.left, self_name), self.value(node.comparators[0], self_name)
            if a is None or not isinstance(b, (tuple, list, set, frozenset)):
                return None
            return (a in b) == isinstance(node.ops[0], ast.In)
        a, b = self.value(node.left, self_name), self.value(node.comparators[0], self_name)
        if a is None or b is None:
            return None
        op = type(node.ops[0])
        ordered = (isinstance(a, int) and isinstance(b, int)) or (
            isinstance(a, tuple) and isinstance(b, tuple) and all(isinstance(x, int) for x in a + b))
        table = {ast.Eq: a == b, ast.NotEq: a != b, ast.Lt: a < b, ast.LtE: a <= b, ast.Gt: a > b,
                 ast.GtE: a >= b} if ordered else {ast.Eq: a == b, ast.NotEq: a != b}
        return table.get(op)

    def _call(self, node: ast.Call):
        if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and node.func.value.id in self.bound and self.parts is not None:   # a composite's half, asked
            got = self.parts.ask(self.bound[node.func.value.id], node.func.attr)
            return self._miss(node, f"{ast.unparse(node)}: {self.parts.why}") if got is None else got
        if isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) \
                and self.names.get(node.func.value.id, node.func.value.id) in ("platform", "current_platform"):
            name, arg = node.func.attr, self._cap_arg(node.args[0]) if node.args else None
            if name in _PLATFORM:
                return _PLATFORM[name]
            if name == "is_device_capability" and arg is not None:
                return self.cap == arg
            if name == "is_device_capability_family" and arg is not None:
                return self.cap // 10 == arg // 10
            if name == "has_device_capability" and arg is not None:
                return self.cap >= arg
            return self._miss(node)
        if isinstance(node.func, ast.Name) and not node.args and self.resolve \
                and self.depth < 3:
            got = self.resolve(node.func.id)
            if got is not None:     # a vLLM function of the same release: read its body too
                sub = _Reader(self.config, self.props, self.cap, got[2])
                sub.consts, sub.depth = got[1], self.depth + 1
                ans = sub.body(got[0], "")
                if ans is not None or not node.func.id.startswith(("has_", "is_")):
                    self.assumed += sub.assumed
                    self.assumed_where += sub.assumed_where
                    if ans is None:
                        self.unread += [f"{ast.unparse(node)} -> {u}" for u in sub.unread] or [
                            f"{ast.unparse(node)} (line {node.lineno})"]
                    return ans
                self.assumed_where.append(
                    f"{ast.unparse(node)} taken as true: its body (vllm/{got[3]}:{got[0].lineno}) is not read here "
                    f"({'; '.join(sub.unread[:1]) or 'a statement this reader does not follow'})")
                self.assumed.append(ast.unparse(node))
                return True
        if isinstance(node.func, ast.Name) and node.func.id.startswith(("has_", "is_")) \
                and node.func.id != "isinstance":
            self.assumed.append(ast.unparse(node))
            self.assumed_where.append(f"{ast.unparse(node)} taken as true: not read here (no vLLM function of that "
                                      "name without arguments found)")
            return True
        return self._miss(node)

    def body(self, fn: ast.FunctionDef, alias: str):
        """The function's answer: aliases (``p = <param or current_platform>``), ``if <test>: return False`` guards,
        ``if <test>:`` blocks whose test is read (the taken branch is read, the other skipped), a composite's
        ``a, b = cls.get_clses()`` (with ``parts``) and the final ``return``; None where the body has any other
        statement or calls another class's method this reader is not given."""
        self.names = {alias: "config"} if alias else {}
        self.names["current_platform"] = "platform"
        done, got = self._block(fn.body, [])
        return got if done else self._miss(fn, "no return statement")

    def _bind(self, st: ast.stmt) -> bool:
        """An alias, a capability read or a composite's halves (``a, b = cls.m()``): recorded, True."""
        if not (isinstance(st, ast.Assign) and len(st.targets) == 1):
            return False
        t, v = st.targets[0], st.value
        if isinstance(t, ast.Name) and isinstance(v, ast.Name) and v.id in self.names:
            self.names[t.id] = self.names[v.id]
            return True
        if isinstance(t, ast.Name) and isinstance(v, ast.Call) and not v.args and isinstance(v.func, ast.Attribute) \
                and v.func.attr == "get_device_capability" and isinstance(v.func.value, ast.Name) \
                and self.names.get(v.func.value.id) == "platform":
            self.names[t.id] = "capability"
            return True
        if isinstance(t, ast.Tuple) and all(isinstance(e, ast.Name) for e in t.elts) and self.parts is not None \
                and isinstance(v, ast.Call) and not v.args and isinstance(v.func, ast.Attribute) \
                and isinstance(v.func.value, ast.Name) and v.func.value.id in ("cls", "self"):
            keys = self.parts.classes(v.func.attr)
            if keys is None or len(keys) != len(t.elts):
                return False
            self.bound.update({e.id: k for e, k in zip(t.elts, keys)})  # type: ignore[attr-defined]
            return True
        return False

    def _block(self, stmts: list, guards: list) -> tuple[bool, object]:
        """(returned, answer) of a statement list; ``returned`` False when it falls through."""
        for st in stmts:
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant):
                continue
            if isinstance(st, ast.ImportFrom) or self._bind(st):
                continue
            if isinstance(st, ast.If) and not st.orelse and len(st.body) == 1 and isinstance(st.body[0], ast.Return) \
                    and isinstance(st.body[0].value, ast.Constant) and st.body[0].value.value is False:
                g = self.value(st.test)
                if g is True:
                    return True, False
                guards.append(g)
                continue
            if isinstance(st, ast.If):
                g = self.value(st.test)
                if g is None:
                    return True, self._miss(st.test, f"if {ast.unparse(st.test)[:70]}")
                done, got = self._block(st.body if g else st.orelse, guards)
                if done:
                    return True, got
                continue
            if isinstance(st, ast.Return) and st.value is not None:
                if self.parts is None and any(
                        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                        and n.func.attr.startswith("_supports_") for n in ast.walk(st.value)):
                    # it asks other classes (FallbackExperts): not read here
                    return True, self._miss(st, "it asks another class's _supports_ method")
                got = self.value(st.value)
                return True, (None if (got is True and None in guards) else got)
            return True, self._miss(st, f"a statement it does not follow ({type(st).__name__})")
        return False, None


def _parallel_config(eng: Engine, backend: str, world: int) -> tuple[dict, dict, str]:
    """``FusedMoEParallelConfig`` as vLLM builds it for ``--enable-expert-parallel --all2all-backend <backend>
    --data-parallel-size 2`` on ``world`` GPUs (TP world/2, EP = all GPUs, no EPLB, no sequence or context
    parallelism): its fields, its properties' return expressions and ``vllm/FILE:LINE`` of the class."""
    rel = "model_executor/layers/fused_moe/config.py"
    cls = eng.cls(rel, "FusedMoEParallelConfig")
    props = {}
    for b in cls.body:
        if isinstance(b, ast.FunctionDef) and any(ast.unparse(d) == "property" for d in b.decorator_list):
            rets = [s for s in b.body if isinstance(s, ast.Return) and s.value is not None]
            if len(rets) == 1 and rets[0] is b.body[-1]:
                props[b.name] = rets[0].value
    config = {"tp_size": max(world // 2, 1), "pcp_size": 1, "dp_size": 2, "ep_size": max(world, 2), "sp_size": 1,
              "use_ep": True, "all2all_backend": backend, "enable_eplb": False}
    return config, props, f"vllm/{rel}:{cls.lineno}"


def _module_consts(tree: ast.Module) -> dict:
    """A module's top-level literal constants (``frozenset({...})``, ``set(...)`` and ``tuple(...)`` of a literal
    read as that literal)."""
    consts = {}
    for n in tree.body:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            val = n.value.args[0] if (isinstance(n.value, ast.Call) and ast.unparse(n.value.func) in (
                "frozenset", "set", "tuple") and len(n.value.args) == 1) else n.value
            try:
                consts[n.targets[0].id] = ast.literal_eval(val)
            except (ValueError, TypeError, SyntaxError):
                pass
    return consts


def _resolver(eng: Engine, rel: str, trees: dict):
    """``name -> (FunctionDef, module constants, resolver) or None`` for a function defined in ``vllm/<rel>`` or
    imported there from another vLLM module (``from vllm.X import name``); ``trees`` caches parsed modules."""
    def find(name: str):
        tree = trees.get(rel) or eng.tree(rel)
        trees[rel] = tree
        imp = next((n for n in tree.body if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("vllm.")
                    and any(a.name == name and a.asname is None for a in n.names)), None)
        target, mrel = (tree, rel) if imp is None else (None, (imp.module or "").split(".", 1)[1].replace(".", "/") + ".py")
        if target is None:
            try:
                target = eng.tree(mrel)
            except (GateNotFound, source.SourceNotFound, OSError, SyntaxError):
                return None
        fn = next((n for n in target.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
        if fn is None:
            return None
        return fn, _module_consts(target), _resolver(eng, mrel, trees), mrel
    return find


_CAVEAT = re.compile(r"#\s*((?:TODO|FIXME|XXX|HACK)\b.*)")


def _module_rel(eng: Engine, dotted: str) -> str | None:
    """``vllm.a.b`` -> ``a/b.py`` (or ``a/b/__init__.py``) when that file is in the installed vLLM, else None."""
    if not dotted.startswith("vllm."):
        return None
    base = dotted.split(".", 1)[1].replace(".", "/")
    for rel in (f"{base}.py", f"{base}/__init__.py"):
        if (eng.root / rel).is_file():
            return rel
    return None


#: a class statement and its bases' text (one line), for the scan of modules outside ``fused_moe/``
_CLASS_LINE = re.compile(r"^class\s+\w+\s*\(([^)]*)\)", re.M)


class _Hierarchy:
    """Every class under ``model_executor/layers/fused_moe`` of the installed vLLM, read from source: ``classes``
    ``(rel, name) -> ClassDef``, each class's bases resolved through its own module (a class of that module, a
    ``from vllm.X import Name`` or ``import vllm.X as mk`` / ``mk.Name``), its method resolution order (C3 over the
    bases it could resolve; ``partial`` names those it could not) and which methods stay abstract."""

    def __init__(self, eng: Engine, root: Path, *, subclasses_elsewhere: bool = False):
        """``subclasses_elsewhere``: also read every module of the release outside ``root`` that defines a class
        naming one of ``root``'s classes among its bases (a model's own kernel subclass, e.g. under ``models/``),
        so no kernel class is missed for living in another folder."""
        self.eng = eng
        self.classes: dict[tuple[str, str], ast.ClassDef] = {}
        self.by_name: dict[str, list[tuple[str, str]]] = {}
        self.names: dict[str, dict[str, tuple[str, str]]] = {}    # rel -> local name -> (rel, name) of a class
        self.mods: dict[str, dict[str, str]] = {}                  # rel -> module alias -> rel
        self.lines: dict[str, list[str]] = {}
        self.partial: dict[tuple[str, str], list[str]] = {}
        self._mro: dict[tuple[str, str], list[tuple[str, str]]] = {}
        trees: dict[str, ast.Module] = {}
        for p in sorted(root.rglob("*.py")) if root.is_dir() else []:
            self._add(p, p.read_text(encoding="utf-8", errors="replace"), trees)
        if subclasses_elsewhere and root.is_dir():
            known = set(self.by_name)
            for p in sorted(eng.root.rglob("*.py")):
                if root in p.parents:
                    continue
                text = p.read_text(encoding="utf-8", errors="replace")
                if any(b.strip().rsplit(".", 1)[-1] in known for m in _CLASS_LINE.finditer(text)
                       for b in m.group(1).split(",")):
                    self._add(p, text, trees)
        self._resolve(trees)

    def _add(self, p: Path, text: str, trees: dict) -> None:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return
        rel = p.relative_to(self.eng.root).as_posix()
        trees[rel], self.lines[rel] = tree, text.splitlines()
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            self.classes.setdefault((rel, cls.name), cls)
            self.by_name.setdefault(cls.name, []).append((rel, cls.name))

    def _resolve(self, trees: dict) -> None:
        eng = self.eng
        for rel, tree in trees.items():
            names, mods = {}, {}
            pkg = rel.rsplit("/", 1)[0].replace("/", ".")
            for n in ast.walk(tree):
                if isinstance(n, ast.Import):
                    for a in n.names:
                        m = _module_rel(eng, a.name)
                        if m and a.asname:
                            mods[a.asname] = m
                elif isinstance(n, ast.ImportFrom):
                    mod = n.module or ""
                    if n.level:
                        up = pkg.split(".")[: len(pkg.split(".")) - (n.level - 1)]
                        mod = "vllm." + ".".join(up + ([mod] if mod else []))
                    for a in n.names:
                        sub = _module_rel(eng, f"{mod}.{a.name}")
                        m = _module_rel(eng, mod)
                        if sub is not None:
                            mods[a.asname or a.name] = sub
                        elif m is not None and (m, a.name) in self.classes:
                            names[a.asname or a.name] = (m, a.name)
            self.names[rel], self.mods[rel] = names, mods

    def base(self, rel: str, node: ast.expr) -> tuple[str, str] | None:
        if isinstance(node, ast.Name):
            if (rel, node.id) in self.classes:
                return rel, node.id
            if node.id in self.names.get(rel, {}):
                return self.names[rel][node.id]
            only = self.by_name.get(node.id, [])
            return only[0] if len(only) == 1 else None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            m = self.mods.get(rel, {}).get(node.value.id)
            if m is not None:
                return (m, node.attr) if (m, node.attr) in self.classes else None
        return None

    def mro(self, key: tuple[str, str], seen=()) -> list[tuple[str, str]]:
        if key in self._mro:
            return self._mro[key]
        cls, rel = self.classes[key], key[0]
        bases = []
        for b in cls.bases:
            got = self.base(rel, b)
            if got is None or got in seen or got == key:
                if ast.unparse(b) not in ("ABC", "abc.ABC", "object", "Generic") and not ast.unparse(b).startswith(
                        "Generic["):
                    self.partial.setdefault(key, []).append(ast.unparse(b))
                continue
            bases.append(got)
        seqs = [list(self.mro(b, seen + (key,))) for b in bases] + [list(bases)]
        out = [key]
        while any(seqs):
            seqs = [s for s in seqs if s]
            head = next((s[0] for s in seqs if not any(s[0] in t[1:] for t in seqs)), seqs[0][0])
            out.append(head)
            seqs = [s[1:] if s[0] == head else s for s in seqs]
        self._mro[key] = out
        return out

    def method(self, key: tuple[str, str], name: str) -> tuple[ast.FunctionDef, str, str] | None:
        """The first definition of ``name`` along the class's method resolution order: (def, rel, defining class)."""
        for k in self.mro(key):
            fn = next((b for b in self.classes[k].body if isinstance(b, ast.FunctionDef) and b.name == name), None)
            if fn is not None:
                return fn, k[0], k[1]
        return None

    def abstract(self, key: tuple[str, str]) -> set[str]:
        """The methods still ``@abstractmethod`` along the class's method resolution order."""
        left: set[str] = set()
        for k in reversed(self.mro(key)):
            for b in self.classes[k].body:
                if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    if any(ast.unparse(d).split(".")[-1] == "abstractmethod" for d in b.decorator_list):
                        left.add(b.name)
                    else:
                        left.discard(b.name)
                elif isinstance(b, ast.Assign):
                    left -= {t.id for t in b.targets if isinstance(t, ast.Name)}
        return left

    def caveats(self, rel: str, fn: ast.FunctionDef) -> list[str]:
        """``vllm/FILE:LINE: TODO ...`` for each TODO/FIXME/XXX/HACK comment inside ``fn`` (its continuation comment
        lines joined to it)."""
        lines, out = self.lines.get(rel, []), []
        i = fn.lineno - 1
        while i < min(fn.end_lineno or fn.lineno, len(lines)):
            m = _CAVEAT.search(lines[i])
            if m is None:
                i += 1
                continue
            text, j = m.group(1).strip(), i + 1
            while j < len(lines) and lines[j].strip().startswith("#") and not _CAVEAT.search(lines[j]):
                text += " " + lines[j].strip().lstrip("#").strip()
                j += 1
            out.append(f"vllm/{rel}:{i + 1}: {text}")
            i = j
        return out


class _Parts:
    """A composite kernel's halves (vLLM's FallbackExperts: ``experts_cls, fallback_cls = cls.get_clses()``), read
    from source: ``classes(m)`` resolves the classes the class's own ``m`` returns (a single ``return (A, B)``, each
    name resolved through the module that returns it) and records where; ``ask(half, method)`` is that half's own
    answer (:func:`_gate`), so a composite admits only where every half it asks admits. ``why``: what was not read."""

    def __init__(self, eng: Engine, h: "_Hierarchy", key, config: dict, props: dict, cap, trees: dict, depth: int):
        self.eng, self.h, self.key, self.config, self.props, self.cap = eng, h, key, config, props, cap
        self.trees, self.depth = trees, depth
        self.halves: list = []
        self.where = ""
        self.why = "not read"
        self.answers: dict = {}

    def classes(self, method: str):
        got = self.h.method(self.key, method)
        if got is None:
            return None
        fn, rel, _ = got
        body = [st for st in fn.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
        if len(body) != 1 or not isinstance(body[0], ast.Return) or not isinstance(body[0].value, ast.Tuple):
            return None
        keys = [self.h.base(rel, e) for e in body[0].value.elts]
        if None in keys:
            return None
        self.halves, self.where = keys, f"vllm/{rel}:{body[0].lineno}"
        return keys

    def ask(self, half, method: str):
        if self.depth >= 3 or method not in ("_supports_parallel_config", "_supports_current_device"):
            self.why = f"{half[1]}.{method} is not read here"
            return None
        ans, reader, got = _gate(self.eng, self.h, half, method, self.config, self.props, self.cap, self.trees,
                                 self.depth + 1)
        where = f"vllm/{got[1]}:{got[0].lineno}" if got is not None else "none found"
        self.answers[(half, method)] = (ans, where, list(reader.assumed_where) if reader is not None else [])
        if ans is None:
            self.why = f"{half[1]}'s {method} ({where}) is not read here" + (
                f" ({reader.unread[0]})" if reader is not None and reader.unread else "")
        return ans


def _raises(fn: ast.FunctionDef) -> ast.Raise | None:
    """The ``raise`` a method's body starts with (after its docstring): it can never answer."""
    body = [st for st in fn.body if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant))]
    return body[0] if body and isinstance(body[0], ast.Raise) else None


def _gate(eng: Engine, h: "_Hierarchy", key, method: str, config: dict, props: dict, cap, trees: dict, depth: int = 0):
    """A kernel class's own answer to ``method`` (``_supports_parallel_config`` for the deployment's config, or
    ``_supports_current_device`` on ``cap``; None for the device check without a capability): (True / False / None,
    the reader, (def, rel, defining class) or None). A composite's halves are read through :class:`_Parts`."""
    got = h.method(key, method)
    if got is None or (method == "_supports_current_device" and cap is None):
        return None, None, got
    fn, rel, _ = got
    if _raises(fn) is not None:
        return None, None, got
    args = [a.arg for a in fn.args.args if a.arg not in ("cls", "self")]
    parts = _Parts(eng, h, key, config, props, cap, trees, depth)
    dev = method == "_supports_current_device"
    reader = _Reader(config, props, (cap or 0) if not dev else cap, _resolver(eng, rel, trees) if dev else None, parts)
    ans = reader.body(fn, "" if dev else (args[0] if args else ""))
    return ans, reader, got


#: the activation formats whose match with the all-to-all this reader judges (FusedMoEActivationFormat in
#: vllm 0.33.0 modular_kernel.py); any other is not assessed
KNOWN_FORMATS = ("Standard", "BatchedExperts")


def _format_verdict(fmt: str | None, fwhere: str, want: str) -> tuple[str, str] | None:
    """``("refuse" | "unknown", words)`` when the kernel's activation format decides (modular_kernel.py
    is_supported_config: the prepare/finalize's format must match): another known format refuses; an unread one, or
    one this reader does not know (:data:`KNOWN_FORMATS`; vllm 0.34.0 adds PaddedStandard), is not assessed, never
    passed unchecked; None when it matches ``want``."""
    if fmt in KNOWN_FORMATS:
        return None if fmt == want else ("refuse", f"; activation format {fmt} ({fwhere})")
    if fmt is None:
        return "unknown", f"; not assessed: its activation format is not read here ({fwhere})"
    return "unknown", (f"; not assessed: its activation format {fmt} ({fwhere}) is not one this reader knows "
                       f"({', '.join(KNOWN_FORMATS)}), so whether it matches the {want} the all-to-all hands over is "
                       "not read")


def _format_of(h: _Hierarchy, key, parts: _Parts | None = None) -> tuple[str | None, str]:
    """The activation format a kernel class declares: ``Standard`` / ``BatchedExperts`` (the attribute its
    ``activation_format`` returns) and ``vllm/FILE:LINE`` of that return; a composite that returns its halves' format
    (``a, b = cls.get_clses(); return a.activation_format()``) declares the halves' own when every half declares the
    same one (read through ``parts``); None otherwise."""
    got = h.method(key, "activation_format")
    if got is None:
        return None, "no activation_format found"
    fn, rel, _ = got
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) == 1 and isinstance(body[0], ast.Return) and isinstance(body[0].value, ast.Attribute):
        return body[0].value.attr, f"vllm/{rel}:{body[0].lineno}"
    span = f"vllm/{rel}:{fn.lineno}-{fn.end_lineno}"
    first = body[0] if body else None
    if parts is None or not isinstance(first, ast.Assign) or not isinstance(first.value, ast.Call) \
            or not isinstance(first.value.func, ast.Attribute):
        return None, span
    halves = parts.classes(first.value.func.attr)
    last = body[-1]
    if not halves or not (isinstance(last, ast.Return) and isinstance(last.value, ast.Call) and isinstance(
            last.value.func, ast.Attribute) and last.value.func.attr == "activation_format"):
        return None, span
    fmts = [_format_of(h, k) for k in halves]
    if any(f is None for f, _ in fmts) or len({f for f, _ in fmts}) != 1:
        return None, span + " (its halves' formats: " + ", ".join(f"{k[1]} {f or 'not read'} ({w})" for k, (f, w)
                                                                   in zip(halves, fmts)) + ")"
    return fmts[0][0], f"{span}, its halves' ({', '.join(w for _, w in fmts)})"


def _composite_words(parts: _Parts, method: str) -> str:
    """``; halves A (vllm/FILE:LINE) refuses, B (...) admits (their classes from vllm/FILE:LINE)``."""
    said = {"True": "admits", "False": "refuses", "None": "not read"}
    got = [(k, parts.answers.get((k, method))) for k in parts.halves]
    return "; its halves " + ", ".join(f"{k[1]} ({a[1]}) {said[str(a[0])]}" if a else f"{k[1]} not asked"
                                       for k, a in got) + f" (from {parts.where})"


def _classify_kernel(eng: Engine, h: _Hierarchy, key, config: dict, props: dict, cap, want: str, trees: dict,
                     label: str = ""):
    """One concrete expert kernel class's reading for :func:`expert_kernels`: a record (class, where, format and
    its FILE:LINE, parallel / device answers and their FILE:LINE, caveats in its own gate methods, assumed
    predicates) with ``key`` one of admit, refuse, other_device, unknown and ``entry`` (the list's string). A kernel
    whose parallel-config method raises (NotImplementedError) is refused (``raises NotImplementedError: not usable``
    with FILE:LINE of the raise); a composite (FallbackExperts) is read through its halves. ``want``: the
    all-to-all's activation format; ``label``: the class's name as listed (with its file where names repeat)."""
    rel, name = key
    label = label or name
    fn, prel, powner = h.method(key, "_supports_parallel_config")  # type: ignore[misc]
    inherit = f", from {powner}" if powner != name else ""
    entry = f"{label} (vllm/{prel}:{fn.lineno}{inherit})"
    rec = {"class": name, "label": label, "where": f"vllm/{rel}:{h.classes[key].lineno}", "format": "not read",
           "format_where": "", "parallel_config": None, "parallel_where": f"vllm/{prel}:{fn.lineno}",
           "device": None, "device_where": "", "caveats": [], "assumed": [], "device_assumes": [],
           "is_supported_config": ""}

    def out(k: str, e: str, assumed=()):
        rec["verdict"], rec["assumed"] = k, list(assumed)
        return k, e, list(assumed), rec
    raised = _raises(fn)
    if raised is not None:
        exc = raised.exc.func if isinstance(raised.exc, ast.Call) else raised.exc
        rec["parallel_where"], rec["raises"] = f"vllm/{prel}:{raised.lineno}", ast.unparse(exc) if exc else "again"
        return out("refuse", f"{label} (vllm/{prel}:{raised.lineno}{inherit}); raises {rec['raises']}: not usable")
    got, reader, _ = _gate(eng, h, key, "_supports_parallel_config", config, props, cap, trees)
    fparts = _Parts(eng, h, key, config, props, cap, trees, 0)
    fmt, fwhere = _format_of(h, key, fparts)
    dev = h.method(key, "_supports_current_device")
    span = f"vllm/{dev[1]}:{dev[0].lineno}-{dev[0].end_lineno}" if dev is not None else ""
    device, dreader, _ = _gate(eng, h, key, "_supports_current_device", config, props, cap, trees)
    caveats = []
    for m in ("_supports_parallel_config", "_supports_current_device", "activation_format"):
        g = h.method(key, m)
        if g is not None:
            caveats += [c for c in h.caveats(g[1], g[0]) if c not in caveats]
    own = h.method(key, "is_supported_config")
    root = next((k[1] for k in reversed(h.mro(key)) if any(
        isinstance(b, ast.FunctionDef) and b.name == "_supports_parallel_config" for b in h.classes[k].body)), "")
    rec.update({"format": fmt or "not read", "format_where": fwhere, "parallel_config": got, "device": device,
                "device_where": span, "caveats": caveats,
                "device_assumes": list(dreader.assumed) if dreader is not None else [],
                "is_supported_config": (f"vllm/{own[1]}:{own[0].lineno}, in {own[2]}"
                                        if own is not None and own[2] != root else "")})
    if h.partial.get(key):
        rec["bases_not_read"] = h.partial[key]
    pparts = reader.parts if reader is not None else None
    if pparts is not None and pparts.halves:
        rec["halves"] = [f"{k[1]} (vllm/{k[0]}:{h.classes[k].lineno})" for k in pparts.halves]
        rec["halves_where"] = pparts.where
    if got is False:
        return out("refuse", entry + (_composite_words(pparts, "_supports_parallel_config")
                                      if pparts is not None and pparts.halves else ""))
    if got is None:
        return out("unknown", entry + (f"; not assessed: its _supports_parallel_config is not read here "
                                       f"({'; '.join(reader.unread[:1]) if reader else 'not followed'})"))
    fverdict = _format_verdict(fmt, fwhere, want)
    if fverdict is not None:
        return out(fverdict[0], entry + fverdict[1])
    if dev is None:
        return out("unknown", entry + "; not assessed: no _supports_current_device found (its device check is not "
                                      "read)")
    if cap is None:
        return out("unknown", entry + f"; not assessed: no target capability to judge its device check {span} against")
    if device is False:
        return out("other_device", entry)
    if device is None:
        why = "; ".join(dreader.unread[:1]) if dreader is not None else f"it raises ({_raises(dev[0]).lineno})"  # type: ignore[union-attr]
        return out("unknown", entry + f"; not assessed: its device check {span} is not read here ({why or 'not followed'})")
    assumed, assumed_where = _assumptions(dreader)
    entry += f"; device check {span}" + "".join(f"; assumes {a}" for a in assumed_where)
    rec["device_assumes"] = assumed
    return out("admit", entry, assumed)


def _assumptions(reader) -> tuple[list[str], list[str]]:
    """The predicates a device reading took as true, its own and its composite halves' (names, and where/why)."""
    assumed, assumed_where = list(reader.assumed), list(reader.assumed_where)
    for (_a, _w, aw) in (reader.parts.answers.values() if reader.parts is not None else ()):
        assumed_where += [a for a in aw if a not in assumed_where]
        assumed += [a.split(" taken as true")[0] for a in aw if a.split(" taken as true")[0] not in assumed]
    return assumed, assumed_where


def _kernel_base(h: _Hierarchy, key) -> tuple[str, str] | None:
    """The class along ``key``'s method resolution order that declares ``_supports_parallel_config`` abstract (the
    modular-kernel expert base, ``modular_kernel.py`` FusedMoEExperts); None for a plain mixin."""
    for k in h.mro(key):
        fn = next((b for b in h.classes[k].body if isinstance(b, ast.FunctionDef)
                   and b.name == "_supports_parallel_config"), None)
        if fn is not None and any(ast.unparse(d).split(".")[-1] == "abstractmethod" for d in fn.decorator_list):
            return k
    return None


def _named_elsewhere(eng: Engine, name: str, cache: dict) -> bool:
    """Whether ``name`` is used anywhere in the installed vLLM other than as a class statement's base, in an import
    or in a string / comment (read from the source of every file whose text has the name)."""
    if name in cache:
        return cache[name]
    if "" not in cache:     # every file's text, read once
        cache[""] = [p.read_text(encoding="utf-8", errors="replace") for p in sorted(eng.root.rglob("*.py"))]
    word = re.compile(rf"\b{re.escape(name)}\b")
    used = False
    for text in cache[""]:
        if name not in text or not word.search(text):
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            used = True     # unreadable: not told apart as never selected
            break
        skip = {id(b) for n in ast.walk(tree) if isinstance(n, ast.ClassDef) for b in n.bases}
        for n in ast.walk(tree):
            if isinstance(n, (ast.Name, ast.Attribute)) and id(n) not in skip \
                    and (n.id if isinstance(n, ast.Name) else n.attr) == name:
                used = True
                break
        if used:
            break
    cache[name] = used
    return used


def expert_kernels(eng: Engine, backend: str, target=None, world: int = 8) -> dict:
    """Every concrete MoE expert kernel class of the installed vLLM (a class under ``model_executor/layers/fused_moe``
    that descends from the modular-kernel expert base, the class declaring ``_supports_parallel_config`` abstract
    (:func:`_kernel_base`), and whose method resolution order, read from source, leaves no ``@abstractmethod``
    unimplemented; a subclass that inherits its checks is read on its own, with its own activation format) and its
    own answer for the deployment ``--all2all-backend <backend>`` with expert and data parallelism
    (:func:`_parallel_config`, whose properties are read from the release's ``config.py``): its
    ``_supports_parallel_config``, its ``activation_format`` against the all-to-all's (``modular_kernel.py``
    ``is_supported_config``), and whether its ``_supports_current_device`` admits ``target`` (a capability; None: not
    judged). Returns ``{"admit": [...], "refuse": [...], "other_device": [...], "unknown": [...], "config":
    "vllm/FILE:LINE", "format": the all-to-all's, "assumed": {...}, "caveats": {...}, "classes": [...],
    "bases": [...]}``; entries are ``Class (vllm/FILE:LINE)`` of the parallel-config method (``, from Base`` where
    inherited), admitted ones with ``; device check vllm/FILE:LINE-LINE`` appended; two kernel classes of the same
    name are listed as ``Name [FILE:LINE]`` (the class's own file and line, under ``fused_moe/``). ``other_device``:
    admits the backend but its device check refuses the target; ``unknown``: not assessed, never counted as
    admitting: a method this reader does not follow (a call it does not know, a branch on something it cannot
    read), a format it cannot read, a kernel with no device check, or no target to judge one against, each entry
    ending ``; not assessed: <why>``. A kernel whose parallel-config method raises is refused: ``; raises
    NotImplementedError: not usable`` with FILE:LINE of the raise. A composite (FallbackExperts: ``a, b =
    cls.get_clses()`` then ``a._supports_x(...) and b._supports_x(...)``) is read through the halves its own
    ``get_clses`` returns: it admits only where every half admits. Device checks that compare capability tuples
    (``(9, 0) <= (cap.major, cap.minor) < (13, 0)``) or branch on the platform (``if p.is_cuda():``) are read. An
    admitted kernel whose device check holds only given a ``has_*``/``is_*`` predicate this reader takes as true names
    it: ``; assumes has_x() taken as true: its body (vllm/FILE:LINE) is not read here (...)``. ``caveats``: per
    class, each TODO/FIXME/XXX/HACK comment inside the gate methods it resolves to (``vllm/FILE:LINE: TODO ...``).
    ``classes``: one record per class (format and its FILE:LINE, parallel-config and device answers with their
    FILE:LINE, caveats, verdict). ``bases``: classes left out of the lists, each with why: a plain mixin that carries
    a ``_supports_parallel_config`` but does not descend from the kernel base, or a kernel class that other kernel
    classes derive from and that vLLM names nowhere else (never selected). vllm 0.33.0 on 12.0 with
    ``flashinfer_nvlink_two_sided``: FlashInferExperts (``experts/flashinfer_cutlass_moe.py:194`` returns True, with
    the TODO at ``:198`` that per-tensor fp8 kernels don't work with MNNVL FlashInfer all-to-alls; its device check
    ``:128-139`` admits capability family 120), HummingIndexedExperts and HummingGroupedExperts (Standard,
    ``experts/fused_humming_moe.py:682`` / ``:894``; HummingExpertsBase's checks ``:420`` and ``:403-409``),
    OAITritonExperts and UnfusedOAITritonExperts (``experts/gpt_oss_triton_kernels_moe.py:1045``, Standard, device
    gate ``(9, 0) <= cap < (13, 0)`` on CUDA, given has_triton_kernels()) admit; BatchedHummingGroupedExperts
    (BatchedExperts, ``:1029``) refuses by format; Triton (``experts/triton_moe.py:187-191``), DeepGEMM, CUTLASS,
    Marlin and the two FallbackExperts (their halves refuse) refuse; NaiveBatchedExperts raises."""
    root = eng.root / "model_executor" / "layers" / "fused_moe"
    config, props, where = _parallel_config(eng, backend, world)
    cap = target.major * 10 + target.minor if target is not None else None
    fmt_reader = _Reader(config, props, cap or 0)
    want_batched = fmt_reader.value(props["use_batched_activation_format"], "self") is True \
        if "use_batched_activation_format" in props else False
    want = "BatchedExperts" if want_batched else "Standard"
    out: dict = {"admit": [], "refuse": [], "other_device": [], "unknown": [], "config": where, "format": want,
                 "assumed": {}, "caveats": {}, "classes": [], "bases": []}
    h = _Hierarchy(eng, root, subclasses_elsewhere=True)
    trees: dict[str, ast.Module] = {}
    keys: list = []
    named: dict[str, list] = {}
    for key in h.classes:
        if h.method(key, "_supports_parallel_config") is None or h.abstract(key):
            continue
        if _kernel_base(h, key) is None:
            out["bases"].append(f"{key[1]} (vllm/{key[0]}:{h.classes[key].lineno}): not a kernel class (no "
                                "modular-kernel expert base among its bases), a mixin its subclasses share")
            continue
        keys.append(key)
    cache: dict = {}
    for key in list(keys):
        subs = sorted(k[1] for k in keys if k != key and key in h.mro(k)[1:])
        if subs and not _named_elsewhere(eng, key[1], cache):
            out["bases"].append(f"{key[1]} (vllm/{key[0]}:{h.classes[key].lineno}): a shared parent of "
                                f"{', '.join(subs)}, named nowhere else in vLLM (never selected)")
            keys.remove(key)
    for key in keys:
        named.setdefault(key[1], []).append(key)
    for key in keys:
        label = key[1] if len(named[key[1]]) == 1 else \
            f"{key[1]} [{key[0].replace('model_executor/layers/fused_moe/', '')}:{h.classes[key].lineno}]"
        got = _classify_kernel(eng, h, key, config, props, cap, want, trees, label)
        out[got[0]].append(got[1])
        out["classes"].append(got[3])
        if got[2]:
            out["assumed"][label] = got[2]
        if got[3]["caveats"]:
            out["caveats"][label] = got[3]["caveats"]
    return out


def _refusal_words(recs: dict, rel) -> str:
    """The refusals that need a reason: a kernel whose check raises, a composite whose halves refuse."""
    words = ""
    raised = [r for r in recs.values() if r.get("raises")]
    if raised:
        words += "; of those, " + "; ".join(f"{r['label']} ({rel(r['parallel_where'])}) raises {r['raises']}: not usable"
                                            for r in raised)
    halves = [r for r in recs.values() if r.get("verdict") == "refuse" and r.get("halves")]
    if halves:
        words += "; of those, " + "; ".join(
            f"{r['label']} refuses as its halves do ({', '.join(h.split(' (')[0] for h in r['halves'])}, from "
            f"{rel(r['halves_where'])})" for r in halves)
    return words


def _bases_words(bases: list[str], rel) -> str:
    """The classes left out of the lists (a mixin, a shared parent never selected), with their file."""
    return "; left out as no kernel vLLM selects: " + ", ".join(
        f"{b.split(' (')[0]} ({rel(b.split(' (')[1].split(')')[0])}, {'a mixin' if 'mixin' in b else 'a shared parent'})"
        for b in bases) if bases else ""


def _kernel_words(kernels: dict, target) -> str:
    """The expert-kernel sentence of the EP answer: which kernels admit the all-to-all on ``target`` (with the
    ``FILE:LINE`` of their own predicates, the activation format each declares and where, and any TODO/FIXME in its
    own gate methods), which refuse it (and which of those only by activation format, though their parallel-config
    and device checks admit the target), and which were not read, grouped by the class whose unread method they
    inherit (never "none admit" while some are not read); the full entries are the evidence's."""
    def short(e: str) -> str:
        return e.split(" (")[0]

    def lines(e: str) -> str:
        return ", ".join(re.findall(r"vllm/model_executor/layers/fused_moe/(\S+?:[\d-]+)", e))

    def rel(w: str) -> str:
        return w.replace("vllm/model_executor/layers/fused_moe/", "")
    recs = {r.get("label", r["class"]): r for r in kernels.get("classes", [])}
    cc = target.cc if target is not None else "this target"
    words = (f"the MoE expert kernel must admit the two-sided all-to-all (each kernel's own _supports_parallel_config "
             f"for the FusedMoEParallelConfig of {kernels['config']}, its activation format and its "
             f"_supports_current_device on {cc}): ")

    def extra(name: str) -> str:
        r = recs.get(name)
        if r is None:
            return ""
        out = f", {r['format']} format ({rel(r['format_where'])})"
        cav = r.get("caveats") or []
        if cav:
            out += ", with a caveat in its own code the check does not act on: " + "; ".join(
                f"{rel(c.split(': ', 1)[0])} \"{c.split(': ', 1)[1]}\"" for c in cav)
        if r.get("is_supported_config"):
            out += f", and its own is_supported_config ({rel(r['is_supported_config'])}) adds checks not read here"
        return out
    if kernels["admit"]:
        words += f"on {cc} " + "; ".join(
            f"{short(k)} ({lines(k)}" + (f"; given {', '.join(kernels['assumed'][short(k)])}"
                                        if short(k) in kernels["assumed"] else "") + ")" + extra(short(k))
            for k in kernels["admit"]) + (" admits it" if len(kernels["admit"]) == 1 else " admit it")
    elif kernels["unknown"]:
        words += f"no kernel read here admits it on {cc}"
    else:
        words += f"none admits it on {cc}"
    if kernels["refuse"]:
        words += f"; {', '.join(short(k) for k in kernels['refuse'])} refuse it"
    by_format = [r for r in recs.values() if r.get("verdict") == "refuse" and r["parallel_config"] is True
                 and r["device"] is True]
    if by_format:
        words += "; of those, " + "; ".join(
            f"{r.get('label', r['class'])} ({rel(r['parallel_where'])}, {rel(r['device_where'])}) admits the parallel config and {cc} "
            f"but declares the {r['format']} format ({rel(r['format_where'])})" for r in by_format) + \
            f", where the all-to-all hands over {kernels.get('format', 'Standard')}"
    words += _refusal_words(recs, rel)
    if kernels["other_device"]:
        words += f"; {', '.join(short(k) for k in kernels['other_device'])} admit it but their device check refuses {cc}"
    if kernels["unknown"]:
        groups: dict[str, list[str]] = {}
        for k in sorted(kernels["unknown"], key=lambda e: (lines(e), short(e))):
            m = re.search(r", from (\w+)\)", k.split(";")[0])
            groups.setdefault(m.group(1) if m else short(k), []).append(short(k))
        words += "; not assessed (not counted as admitting), not read here: " + ", ".join(
            g if names == [g] else f"{g} ({', '.join(names)})" for g, names in groups.items())
    return words + _bases_words(kernels.get("bases") or [], rel) + "; the model's quantization decides which kernel is chosen"


def _deprecated_import(eng: Engine, manager: str) -> str:
    """A sentence when ``manager`` (in ``all2all.py``) imports a FlashInfer class the installed FlashInfer marks
    deprecated (a ``@deprecated(...)`` decorator on the class: flashinfer-python 0.7.2.post1
    ``comm/trtllm_alltoall.py:434-447`` on ``MnnvlMoe``, deprecated since 0.7.1), else ""."""
    rel = f"{DC}/all2all.py"
    cls = next((n for n in eng.tree(rel).body if isinstance(n, ast.ClassDef) and n.name == manager), None)
    if cls is None:
        return ""
    for imp in (n for n in ast.walk(cls) if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("flashinfer")):
        mod = imp.module or ""
        try:
            path = source.module_file(mod)
            tree = source.parse(path)
        except (source.SourceNotFound, SyntaxError, OSError):
            continue
        for a in imp.names:
            c = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == a.name), None)
            if c is None:
                continue
            dec = next((d for d in c.decorator_list if "deprecated" in ast.unparse(d)), None)
            if dec is not None:
                since = re.search(r"deprecated::\s*([\d.]+)", ast.get_docstring(c) or "")
                return (f"{manager} uses FlashInfer's {a.name}, deprecated"
                        + (f" since {since.group(1)}" if since else "")
                        + f" ({mod.replace('.', '/')}.py:{dec.lineno}-{c.lineno}: `{ast.unparse(dec)[:80]}`)")
    return ""


def _managers(eng: Engine, names: list[str]) -> dict[str, str]:
    """``{all2all backend name: manager class}`` as ``CudaCommunicator.__init__`` builds them
    (``distributed/device_communicators/cuda_communicator.py``: the ``*Manager(...)`` call under the ``if`` that names
    the backend); a name with no such branch is left out."""
    init = eng.method(CUDA_COMM, "CudaCommunicator", "__init__")
    out: dict[str, str] = {}
    for n in ast.walk(init):
        if not isinstance(n, ast.If):
            continue
        consts = {c.value for c in ast.walk(n.test) if isinstance(c, ast.Constant) and isinstance(c.value, str)}
        hit = [x for x in names if x in consts]
        call = next((c for b in n.body for c in ast.walk(b) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
                     and c.func.id.endswith("Manager")), None) if hit else None
        if call is None:
            continue
        for x in hit:
            out.setdefault(x, getattr(call.func, "id", ""))
    return out


def _int_flag(ctx, *names: str) -> int:
    for n in names:
        val = _flag(ctx, n)
        if val is not None:
            if not _is_int(val):      # parse_config refuses it first; read here unchecked: never a guessed 1
                from ..sglang.flags import ConfigError
                raise ConfigError(f"--server-args: {n} {val!r} is not an integer; give a whole number, e.g. {n} 2.")
            return int(str(val))
    return 1


def _use_all2all(eng: Engine) -> str:
    """Where vLLM builds an all-to-all manager only when data parallelism is on: ``ParallelConfig.use_all2all``'s
    ``self.data_parallel_size > 1`` (config/parallel.py), the EP group made with ``use_all2all=`` from it
    (distributed/parallel_state.py) and ``FusedMoEParallelConfig.use_all2all_kernels``'s ``dp_size > 1``
    (model_executor/layers/fused_moe/config.py), as ``"vllm/FILE:LINE ...; ..."``. Raises GateNotFound when one is
    missing."""
    par = "config/parallel.py"
    ua = eng.method(par, "ParallelConfig", "use_all2all")
    cmp = _find(ua, lambda n: isinstance(n, ast.Compare) and ast.unparse(n) == "self.data_parallel_size > 1",
                "ParallelConfig.use_all2all no longer tests self.data_parallel_size > 1", eng, par)
    ps = "distributed/parallel_state.py"
    grp = _find(eng.tree(ps), lambda n: isinstance(n, ast.Call) and ast.unparse(n.func) == "init_model_parallel_group"
                and any(k.arg == "group_name" and isinstance(k.value, ast.Constant) and k.value.value == "ep"
                        for k in n.keywords) and any(k.arg == "use_all2all" for k in n.keywords),
                "the EP group is no longer made with init_model_parallel_group(..., group_name='ep', use_all2all=...)",
                eng, ps)
    src = next((n for n in ast.walk(eng.tree(ps)) if isinstance(n, ast.Assign)
                and ast.unparse(n.value) == "parallel_config.use_all2all"), None)
    if src is None:
        raise GateNotFound(f"gate not found in vllm {eng.version} at vllm/{ps}: use_all2all is no longer read from "
                           "parallel_config.use_all2all")
    moe = "model_executor/layers/fused_moe/config.py"
    k = eng.method(moe, "FusedMoEParallelConfig", "use_all2all_kernels")
    kc = _find(k, lambda n: isinstance(n, ast.Compare) and ast.unparse(n) == "self.dp_size > 1",
               "FusedMoEParallelConfig.use_all2all_kernels no longer tests self.dp_size > 1", eng, moe)
    return "; ".join((_where(eng, par, cmp, ast.unparse(cmp)), _where(eng, ps, src, ast.unparse(src)),
                      _where(eng, ps, grp, "init_model_parallel_group(..., group_name='ep', use_all2all=use_all2all)"),
                      _where(eng, moe, kc, ast.unparse(kc))))


def _moe_ep_nvlink_check(eng: Engine, manager: str) -> tuple[bool, str]:
    """Whether vLLM's all-to-all ``manager`` (a class of ``distributed/device_communicators/all2all.py``) reaches
    FlashInfer's NVLink check that raises: the manager imports from ``flashinfer.moe_ep``, the class it imports is
    defined in a module of the installed ``flashinfer/moe_ep`` that calls ``mnnvl_mapping_and_config``, and that
    function (``flashinfer/moe_ep/backends/split/comm/nvlink_common.py``) gathers ``nvlink_platform_supported()`` from
    every rank and raises ``RuntimeError`` on all of them if any lacks P2P-capable NVLinks (flashinfer-python
    0.7.2.post1 ``nvlink_common.py:86``; vLLM 0.33.0 reaches it from ``flashinfer_nvlink_one_sided`` only, vLLM 0.34.0
    from ``flashinfer_nvlink_two_sided`` too). Returns ``(raises, where)``; ``(False, why)`` when a link of that chain
    is not found (the verdict then says nothing of it: never a guess)."""
    rel = f"{DC}/all2all.py"
    cls = next((n for n in eng.tree(rel).body if isinstance(n, ast.ClassDef) and n.name == manager), None)
    imp = [n for n in ast.walk(cls) if isinstance(n, ast.ImportFrom) and n.module == "flashinfer.moe_ep"] \
        if cls is not None else []
    if not imp:
        return False, f"vllm/{rel}: {manager} does not import from flashinfer.moe_ep"
    fi = source.package_dir("flashinfer")
    if fi is None or not (fi / "moe_ep").is_dir():
        return False, "flashinfer/moe_ep not installed: not read"
    names = {a.name for n in imp for a in n.names}
    common = fi / "moe_ep" / "backends" / "split" / "comm" / "nvlink_common.py"
    callers = []
    for p in sorted((fi / "moe_ep").rglob("*.py")):
        text = p.read_text(encoding="utf-8", errors="replace")
        if "mnnvl_mapping_and_config(" in text and any(f"class {n}" in text for n in names):
            callers.append(p)
    if not callers or not common.is_file():
        return False, f"flashinfer/moe_ep: none of {sorted(names)} calls mnnvl_mapping_and_config: not read"
    tree = ast.parse(common.read_text(encoding="utf-8", errors="replace"))
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "mnnvl_mapping_and_config"), None)
    raise_ = None
    if fn is not None and any(isinstance(n, ast.Call) and ast.unparse(n.func).endswith("nvlink_platform_supported")
                              for n in ast.walk(fn)):
        raise_ = next((n for n in ast.walk(fn) if isinstance(n, ast.Raise) and n.exc is not None
                       and ast.unparse(n.exc).startswith("RuntimeError(")), None)
    if raise_ is None:
        return False, "nvlink_common.py: mnnvl_mapping_and_config no longer raises on a rank without NVLink: not read"
    via = callers[0].relative_to(fi.parent).as_posix()
    return True, (f"{_where(eng, rel, imp[0], 'from flashinfer.moe_ep import ...')} ({manager}) -> {via} -> "
                  f"flashinfer/moe_ep/backends/split/comm/nvlink_common.py:{raise_.lineno} `raise RuntimeError(...)` "
                  f"when nvlink_platform_supported() is False on any EP rank (flashinfer-python "
                  f"{dist_version('flashinfer-python')})")


def _mnnvl_posix_fallback() -> tuple[str, str]:
    """(what, source) for FlashInfer's MNNVL memory choosing POSIX-fd handles without FABRIC support
    (``flashinfer/comm/mnnvl.py``'s ``CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR``); evidence, not a gate."""
    fi = source.package_dir("flashinfer")
    p = fi / "comm" / "mnnvl.py" if fi else None
    if p is None or not p.is_file():
        return "not read: flashinfer-python not installed", "flashinfer/comm/mnnvl.py"
    hit = next((i for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
                if "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR" in line), None)
    if hit is None:
        return "no POSIX-fd handle type in MnnvlMemory: not read", "flashinfer/comm/mnnvl.py"
    return ("MnnvlMemory allocates with POSIX-fd handles where FABRIC handles are not supported: no topology check",
            f"flashinfer/comm/mnnvl.py:{hit} (flashinfer-python {dist_version('flashinfer-python')})")


def _b12x(ctx, eng: Engine) -> Verdict:
    try:
        eps = [e for e in metadata.distribution("b12x").entry_points if e.group == "vllm.general_plugins"]
        b12x_ver = metadata.version("b12x")
    except metadata.PackageNotFoundError:
        eps, b12x_ver = [], None
    hits = [h for h in _references(eng, "b12x.comm", "b12x_all_reduce", "b12x_allreduce")]
    if b12x_ver is None and not hits:
        v = Verdict("b12x", NOT_INTEGRATED, scope=SCOPE_ENGINE, gate=GATE_NOT_INTEGRATED, lift=LIFT_PACKAGE,
                    host=se.target_host(ctx),
                    cause=f"not integrated in vllm {eng.version} (its source never references b12x.comm, b12x's PCIe "
                          "collectives) and b12x is not installed: no vLLM plugin could add it",
                    lift_detail="a vllm release or b12x plugin that registers b12x's PCIe allreduce")
        return v.add("vllm references", hits, "vllm/**/*.py searched for b12x.comm")
    comm = [e for e in eps if re.search(r"comm|allreduce|all_reduce", f"{e.name} {e.value}", re.IGNORECASE)]
    if hits or comm:
        v = Verdict("b12x", ERROR, scope=SCOPE_ENGINE, host=se.target_host(ctx),
                    cause=f"vllm {eng.version} or b12x {b12x_ver} wires b12x's collectives in "
                          f"({hits or [e.value for e in comm]}): this suite does not read that path yet",
                    lift_detail="teach this suite the b12x allreduce gates of this release (it refuses to guess)")
        return v
    v = Verdict("b12x", NOT_INTEGRATED, scope=SCOPE_ENGINE, gate=GATE_NOT_INTEGRATED, lift=LIFT_PACKAGE,
                host=se.target_host(ctx),
                cause=f"not integrated as an allreduce in vllm {eng.version}: vLLM never references b12x.comm (b12x's "
                      f"PCIe one-shot allreduce), and b12x {b12x_ver}'s vllm.general_plugins entry points "
                      f"({', '.join(f'{e.name} = {e.value}' for e in eps) or 'none'}) register a quantization "
                      "config and a model loader, no communicator (vLLM uses b12x for GEMM, MoE and attention kernels)",
                lift_detail="a vllm release or b12x plugin that registers b12x's PCIe allreduce")
    v.add("b12x vllm.general_plugins entry points", [f"{e.name} = {e.value}" for e in eps],
          f"b12x {b12x_ver} entry_points.txt (distribution metadata)")
    return v.add("vllm references to b12x.comm", hits, "vllm/**/*.py")


def _references(eng: Engine, *needles: str) -> list[str]:
    pat = re.compile("|".join(re.escape(n) for n in needles))
    out = []
    for p in sorted(eng.root.rglob("*.py")):
        try:
            for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if pat.search(line):
                    out.append(f"vllm/{p.relative_to(eng.root).as_posix()}:{i}")
        except OSError:
            continue
    return out[:5]


DECIDERS = {"vllm-custom-allreduce": _custom_allreduce, "torch-symm-mem": _torch_symm_mem,
            "nccl-symm-mem": _nccl_symm_mem, PCIE_IPC: _pcie_ipc,
            "flashinfer-allreduce": _flashinfer_allreduce, "flashinfer-allreduce-fusion": _fusion_pass,
            "quick-allreduce": _quick_allreduce, "ep-flashinfer-a2a": _all2all, "b12x": _b12x}


#: what the installed vLLM's source must mention for a path to exist in it at all (any one of them): a path whose
#: gate is not found and whose names appear nowhere is ``not-integrated`` in that release, not an ``error``
#: (vllm 0.21.0 has no FlashInfer PCIe IPC allreduce at all)
MARKERS = {"vllm-custom-allreduce": ("CustomAllreduce",), "torch-symm-mem": ("SymmMemCommunicator",),
           "nccl-symm-mem": ("VLLM_USE_NCCL_SYMM_MEM", "all_reduce_symmetric_with_copy"),
           PCIE_IPC: ("PcieIpcAllReduce", "FLASHINFER_PCIE_IPC"),
           "flashinfer-allreduce": ("FlashInferAllReduce",), "flashinfer-allreduce-fusion": ("AllReduceFusionPass",),
           "quick-allreduce": ("QuickAllReduce",), "aiter-custom-allreduce": ("aiter_ar_comm",),
           "ep-flashinfer-a2a": ("flashinfer_all2allv", "flashinfer_nvlink"), "b12x": ("b12x",)}


def absent(backend: str, eng: Engine, ctx=None) -> Verdict | None:
    """``not-integrated`` when the installed vLLM's source mentions none of ``MARKERS[backend]`` (searched over every
    ``vllm/**/*.py``), else None (the path exists: a gate not found is then the reader's error)."""
    needles = MARKERS.get(backend)
    if not needles or _references(eng, *needles):
        return None
    v = Verdict(backend, NOT_INTEGRATED, scope=SCOPE_ENGINE, gate=GATE_NOT_INTEGRATED, lift=LIFT_PACKAGE,
                host=se.target_host(ctx) if ctx is not None else {},
                cause=f"not integrated in vllm {eng.version}: its source never mentions {' or '.join(needles)}, so "
                      "this path does not exist in this release",
                lift_detail="a vllm release that ships this path")
    return v.add("vllm references", [], f"vllm/**/*.py searched for {', '.join(needles)}")


# --- the TP allreduce dispatch ----------------------------------------------------------------------
#: what marks each step in CudaCommunicator.all_reduce's source (the call it returns), in the suite's names (pynccl's
#: step is ``nccl-ring``, as in SGLang's dispatch: NCCL with its own algorithm choice)
STEP_MARKERS = (("nccl-symm-mem", "all_reduce_symmetric_with_copy"), ("quick-allreduce", "quick_all_reduce"),
                (PCIE_IPC, "fi_pcie_ipc_ar_comm.all_reduce"),
                ("flashinfer-allreduce", "fi_ar_comm.all_reduce"), ("aiter-custom-allreduce", "aiter_ar_comm.custom_all_reduce"),
                ("vllm-custom-allreduce", "ca_comm.custom_all_reduce"), ("torch-symm-mem", "symm_mem_comm.all_reduce"),
                ("nccl-ring", "pynccl_comm.all_reduce"))


#: the call through which the pynccl step hands the tensor to NCCL via torch.distributed when pynccl is off or
#: returns None (``cuda_communicator.py`` 0.33.0 ``:435``, ``:445``): the same NCCL as ``nccl-ring``
NCCL_FALLBACK = "torch.distributed.all_reduce"


def _dispatch_groups(fn: ast.FunctionDef) -> list[tuple[ast.stmt, list[ast.stmt]]]:
    """``CudaCommunicator.all_reduce``'s body cut into its steps: each top-level statement that returns (a ``return``
    anywhere in it) with the statements since the previous step (where that step's communicator is read and called)."""
    groups: list[tuple[ast.stmt, list[ast.stmt]]] = []
    pending: list[ast.stmt] = []
    for st in fn.body:
        pending.append(st)
        if any(isinstance(n, ast.Return) for n in ast.walk(st)):
            groups.append((st, pending))
            pending = []
    return groups


def _rocm_only(st: ast.stmt) -> bool:
    """Whether ``st`` is an ``if`` whose test is ``current_platform.is_rocm()`` or an ``and`` with it as one part: a
    step never taken on a CUDA target (vllm 0.33.0 ``cuda_communicator.py:416-426``, batch-invariant allreduce)."""
    if not isinstance(st, ast.If):
        return False
    t = st.test
    parts = t.values if isinstance(t, ast.BoolOp) and isinstance(t.op, ast.And) else [t]
    return any(ast.unparse(x) == "current_platform.is_rocm()" for x in parts)


def _check_steps_mapped(eng: Engine, fn: ast.FunctionDef) -> None:
    """Raises GateNotFound (``not assessed``) naming ``vllm/FILE:LINE`` and the step's condition when a step of
    ``CudaCommunicator.all_reduce`` (:func:`_dispatch_groups`) calls none of :data:`STEP_MARKERS` nor
    :data:`NCCL_FALLBACK` and is not a ROCm-only step: a path this reader cannot map, so what serves after it is not
    known (SGLang's reader raises the same way, ``engines/sglang/dispatch.py``)."""
    for st, group in _dispatch_groups(fn):
        if _rocm_only(st):
            continue
        calls = [ast.unparse(n.func) for g in group for n in ast.walk(g) if isinstance(n, ast.Call)]
        if NCCL_FALLBACK in calls or any(c.endswith(m) for _, m in STEP_MARKERS for c in calls):
            continue
        text = ast.unparse(st.test) if isinstance(st, ast.If) else ast.unparse(st)
        raise GateNotFound(f"not assessed: vllm {eng.version} vllm/{CUDA_COMM}:{st.lineno}: a step of "
                           f"CudaCommunicator.all_reduce (`{text[:160]}`) hands the tensor to a path this reader "
                           f"cannot map to a backend (it knows {', '.join(m for _, m in STEP_MARKERS)}); what serves "
                           "after it is not read, never a pass")


def read_dispatch(eng: Engine) -> list[tuple[str, str]]:
    """``[(backend, "vllm/FILE:LINE"), ...]``: the steps of ``CudaCommunicator.all_reduce`` in source order (the line
    of the call each step returns). A step of a path the release does not ship (:func:`absent`) is left out. Raises
    GateNotFound when a step's call is missing for a path the release has (a moved dispatch), or when a step calls
    something this reader cannot map to a backend (:func:`_check_steps_mapped`)."""
    fn = eng.method(CUDA_COMM, "CudaCommunicator", "all_reduce")
    found = []
    calls = [(n.lineno, ast.unparse(n.func)) for n in ast.walk(fn) if isinstance(n, ast.Call)]
    for backend, marker in STEP_MARKERS:
        line = min((ln for ln, text in calls if text.endswith(marker)), default=None)
        if line is None and absent(backend, eng) is not None:
            continue                 # a path this release does not ship at all: no step of its dispatch
        if line is None:
            raise GateNotFound(f"gate not found in vllm {eng.version} at vllm/{CUDA_COMM}: CudaCommunicator.all_reduce "
                               f"no longer calls {marker} (the {backend} step)")
        found.append((line, backend, f"vllm/{CUDA_COMM}:{line}"))
    _check_steps_mapped(eng, fn)
    return [(b, w) for _, b, w in sorted(found)]


def _aiter_rocm_only(eng: Engine) -> str:
    """Why the AITER step (``aiter-custom-allreduce``, which has no verdict of its own) never claims on CUDA, read
    from the installed vLLM: ``CudaCommunicator.__init__`` sets ``use_aiter_allreduce`` to an ``and`` with
    ``rocm_aiter_ops.is_custom_all_reduce_enabled()``; that classmethod of ``_aiter_ops.py`` is wrapped in
    ``@if_aiter_supported``, which calls it only when ``is_aiter_found_and_supported()`` holds, and that function's
    ``if`` needs ``current_platform.is_rocm()`` (else None / False). Returns the citations; raises GateNotFound
    naming the link not found (the step is then not assessed)."""
    init = eng.method(CUDA_COMM, "CudaCommunicator", "__init__")
    use = _find(init, lambda n: isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "use_aiter_allreduce"
                and isinstance(n.value, ast.BoolOp) and isinstance(n.value.op, ast.And)
                and any("rocm_aiter_ops.is_custom_all_reduce_enabled()" in ast.unparse(x) for x in n.value.values),
                "CudaCommunicator.__init__ no longer sets use_aiter_allreduce as `... and "
                "rocm_aiter_ops.is_custom_all_reduce_enabled()`", eng, CUDA_COMM)
    rel = "_aiter_ops.py"
    enabled = _find(eng.tree(rel), lambda n: isinstance(n, ast.FunctionDef) and n.name == "is_custom_all_reduce_enabled"
                    and any(ast.unparse(d) == "if_aiter_supported" for d in n.decorator_list),
                    "is_custom_all_reduce_enabled is no longer wrapped in @if_aiter_supported", eng, rel)
    wrap = eng.function(rel, "if_aiter_supported")
    _find(wrap, lambda n: isinstance(n, ast.If) and ast.unparse(n.test) == "is_aiter_found_and_supported()",
          "if_aiter_supported no longer calls the function only when is_aiter_found_and_supported()", eng, rel)
    sup = eng.function(rel, "is_aiter_found_and_supported")
    rocm = _find(sup, lambda n: isinstance(n, ast.If) and _rocm_only(n),
                 "is_aiter_found_and_supported no longer needs current_platform.is_rocm()", eng, rel)
    flag = "use_aiter_allreduce = ... and rocm_aiter_ops.is_custom_all_reduce_enabled()"
    return (f"ROCm only: {_where(eng, CUDA_COMM, use, flag)}; {_where(eng, rel, enabled, '@if_aiter_supported')}; "
            f"{_where(eng, rel, rocm, ast.unparse(rocm.test))}")


#: steps with no verdict of their own, and the reader that says why they never claim on a CUDA target
NO_VERDICT_STEPS = {"aiter-custom-allreduce": _aiter_rocm_only}


def _step_reading(backend: str, v: Verdict | None, eng: Engine) -> tuple[bool | None, str]:
    """``(claims, why)`` for one dispatch step: True when its path takes the decode tensor (pynccl's step always
    does; another on by default or as configured), False when it is read not to, None when it cannot be read: its
    verdict is an ``error``, or it has no verdict and no reader of :data:`NO_VERDICT_STEPS` (``why`` names it)."""
    if backend == "nccl-ring":
        return True, ""
    if v is None:
        reader = NO_VERDICT_STEPS.get(backend)
        if reader is None:
            return None, f"no verdict for {backend} (this reader has no answer for that path)"
        try:
            return False, reader(eng)
        except GateNotFound as e:
            return None, str(e)
    if v.status == ERROR:
        return None, v.cause
    return v.status in (ON_BY_DEFAULT, ON_AS_CONFIGURED), ""


def _unread_words(backend: str, where: str, why: str) -> str:
    return f"not assessed: the {backend} step ({where}) cannot be read, so what serves after it is not known: {why}"


def _nccl_symm_claims(rule: dict, nbytes: int) -> bool:
    """``should_nccl_symm_mem_allreduce``'s size rule (``all_reduce_utils.py``) for a tensor of ``nbytes``: outside
    the world size's ``custom_ar_preferred_ranges`` band (``<= lower or >= upper``), or any size above
    ``always_use_above_world_size`` (``band`` None)."""
    band = rule.get("band")
    return band is None or nbytes <= band[0] or nbytes >= band[1]


def capture_widths(eng: Engine, tokens: int, target=None) -> tuple[list[int], str]:
    """The decode widths (rows of a decode-step allreduce) vLLM captures CUDA graphs for, read from the installed
    vLLM's ``VllmConfig._set_cudagraph_sizes`` (``config/vllm.py``): its default ceiling ``default_max_graph_size``
    (vllm 0.33.0: ``1024 if current_platform.is_device_capability_family(100) else 512``, taken for ``target``), and the
    default list built up to it (``[i for i in [1, 2, 4] if i <= max_cudagraph_capture_size]``, then ``+= list(range(8,
    ..., 8))`` and ``+= list(range(256, ..., 16))``), each piece evaluated with that ceiling; plus the verify steps of
    speculative decoding at those sizes rounded up to a multiple of ``tokens`` (``CompilationConfig.
    adjust_cudagraph_sizes_for_spec_decode``); the draft model's own steps are the sizes themselves (one row per
    request). Returns (sorted widths, "vllm/FILE:LINE ..."). Raises GateNotFound when no piece is found."""
    rel = "config/vllm.py"
    fn = eng.method(rel, "VllmConfig", "_set_cudagraph_sizes")
    mx = next((n for n in ast.walk(fn) if isinstance(n, ast.Assign)
               and ast.unparse(n.targets[0]) == "default_max_graph_size"), None)
    if mx is None:
        raise GateNotFound(f"gate not found in vllm {eng.version} at vllm/{rel}: no default_max_graph_size in "
                           "VllmConfig._set_cudagraph_sizes")
    val = mx.value
    if isinstance(val, ast.IfExp):
        fams = [int(x) for x in re.findall(r"capability_family\((\d+)\)", ast.unparse(val.test))]
        hit = target is not None and any(target.major == f // 10 for f in fams)
        val = val.body if hit else val.orelse
    if not (isinstance(val, ast.Constant) and isinstance(val.value, int)):
        raise GateNotFound(f"gate not readable in vllm {eng.version} at vllm/{rel}:{mx.lineno}: default_max_graph_size "
                           f"`{ast.unparse(mx.value)}` is not a literal")
    top = val.value
    names = {"list": list, "range": range, "min": min, "max": max, "max_cudagraph_capture_size": top}
    sizes: set[int] = set()
    lines = []
    for n in ast.walk(fn):
        if isinstance(n, (ast.Assign, ast.AugAssign)):
            tgt = ast.unparse(n.targets[0] if isinstance(n, ast.Assign) else n.target)
            text = ast.unparse(n.value)
            if tgt != "cudagraph_capture_sizes" or "max_cudagraph_capture_size" not in text or "interactivity" in text:
                continue
            if isinstance(n, ast.Assign) and "[1, 2, 4]" not in text:
                continue
            try:
                got = eval(compile(ast.Expression(n.value), "<capture sizes>", "eval"),  # noqa: S307 - literal ranges
                           {"__builtins__": {}, **names})
            except Exception:  # noqa: BLE001, S112 - a piece with other names is not the default list
                continue
            sizes |= {int(x) for x in got}
            lines.append(str(n.lineno))
    if not sizes:
        raise GateNotFound(f"gate not found in vllm {eng.version} at vllm/{rel}: no default cudagraph_capture_sizes "
                           "list built up to max_cudagraph_capture_size")
    widths = set(sizes)
    if tokens > 1:
        widths |= {-(-x // tokens) * tokens for x in sizes if -(-x // tokens) * tokens <= top}
    return sorted(widths), (f"vllm/{rel}:{','.join(lines)} default capture sizes up to {top} "
                            f"(vllm/{rel}:{mx.lineno} default_max_graph_size); verify steps rounded up to multiples of "
                            f"{tokens} (adjust_cudagraph_sizes_for_spec_decode)")


def per_width(verdicts: list[Verdict], steps: list[tuple[str, str]], eng: Engine, target=None) -> dict:
    """Which path serves a decode-step allreduce at each decode width (rows = batch x tokens per request), over the
    widths vLLM captures (:func:`capture_widths`) for the workload's hidden size and dtype: the first step of the
    dispatch that claims it, where NCCL symmetric memory claims by its size rule (``all_reduce_utils.py``) and the
    other open paths claim every width. A step before it that cannot be read (:func:`_step_reading`: an ``error``
    verdict, or no verdict) makes that width ``not assessed: the <step> step (FILE:LINE) cannot be read ...``,
    never a later step serving. Returns ``{"hidden", "tokens", "widths": [{"rows", "bytes", "serves"}],
    "ranges": [{"serves", "rows": "2-9", "captured": [...]}], "source"}`` (ranges over every row count from 1 to the
    largest captured width, so a change between two captured widths is not missed)."""
    t = decode_tensor()
    by = {v.backend: v for v in verdicts}
    nccl = by.get("nccl-symm-mem")
    rule = next((e.value for e in nccl.evidence if e.what.startswith("per-call size rule (rows")), None) \
        if nccl is not None else None
    widths, where = capture_widths(eng, t.tokens, target)
    elt = 4 if t.dtype == "float32" else 2
    reads = {backend: _step_reading(backend, by.get(backend), eng) for backend, _ in steps}

    def serves(rows: int) -> str:
        for backend, at in steps:
            claims, why = reads[backend]
            if claims is None:           # a step not read: no later step is named as serving
                return _unread_words(backend, at, why)
            if backend == "nccl-symm-mem" and rule and rule.get("built"):
                if _nccl_symm_claims(rule, rows * t.hidden * elt):
                    return backend
                continue
            if claims:
                return backend
        return "nccl-ring"

    ranges: list[dict] = []
    for r in range(1, (widths[-1] if widths else 1) + 1):
        who = serves(r)
        if ranges and ranges[-1]["serves"] == who:
            ranges[-1]["last"] = r
        else:
            ranges.append({"serves": who, "first": r, "last": r})
    out = []
    for g in ranges:
        g["rows"] = f"{g['first']}" if g["first"] == g["last"] else f"{g['first']}-{g['last']}"
        g["captured"] = [w for w in widths if g["first"] <= w <= g["last"]]
        out.append({k: g[k] for k in ("serves", "rows", "captured")})
    return {"hidden": t.hidden, "tokens": t.tokens, "dtype": t.dtype, "source": where,
            "widths": [{"rows": w, "bytes": w * t.hidden * elt, "serves": serves(w)} for w in widths],
            "ranges": out}


def width_words(section: dict) -> str:
    """``nccl-symm-mem at 1 and 10-512 rows; flashinfer-pcie-ipc-allreduce at 2-9 rows`` from :func:`per_width`'s
    ranges, each path once with all its row ranges; "" when one path serves every width."""
    ranges = section.get("ranges") or []
    who: dict[str, list[str]] = {}
    for g in ranges:
        who.setdefault(g["serves"], []).append(g["rows"])
    if len(who) < 2:
        return ""
    return "; ".join(f"{b} at {' and '.join(r)} rows" for b, r in who.items())


def _behind_unread(v: Verdict, unread: str) -> None:
    """``v`` would serve, but a dispatch step before it cannot be read: an ``error`` (not assessed) naming that step."""
    v.add("verdict before the dispatch order", f"{v.status}: {v.cause}", "engine gates")
    v.status, v.gate, v.cause = ERROR, "", f"{unread}; {v.backend} comes after it"


def _preempt(v: Verdict, backend: str, serves: str, steps: list[tuple[str, str]], eng: Engine) -> None:
    v.add("verdict before the dispatch order", f"{v.status}: {v.cause}", "engine gates")
    v.status, v.gate, v.lift = PREEMPTED, GATE_SETTING, LIFT_SETTING
    first = next(w for b, w in steps if b == serves)
    v.cause = (f"vLLM {eng.version}: preempted by {serves}: CudaCommunicator.all_reduce tries {serves} first "
               f"({first}) and it claims the decode-step tensor")
    v.lift_detail = f"leave {serves} off to let {backend} serve"


def apply_dispatch(verdicts: list[Verdict], eng: Engine, config: ServerConfig | None = None, target=None) -> dict:
    """The first open path of the dispatch claims the decode tensor; a later path that would serve becomes
    ``preempted`` naming it. A step that cannot be read (:func:`_step_reading`: an ``error`` verdict, or no verdict)
    before any claim makes the answer ``not assessed`` naming that step and why, and a path after it that would serve
    becomes an ``error`` saying so (never a later step serving). Returns the report's dispatch section ``{"vllm",
    "config", "tensor", "steps", "serves", "preempted"}`` (``config``: the configuration asked about,
    ``ServerConfig.to_json()``, as SGLang's)."""
    steps = read_dispatch(eng)
    by = {v.backend: v for v in verdicts}
    serves, unread, preempted, rows = "", "", {}, []
    for backend, where in steps:
        v = by.get(backend)
        claims, why = _step_reading(backend, v, eng)
        rows.append({"backend": backend, "where": where, "status": v.status if v is not None else "-",
                     "claims": "not assessed" if claims is None else claims}
                    | ({"not assessed": why} if claims is None else {"read": why} if why else {}))
        if claims is None and not serves and not unread:
            unread = _unread_words(backend, where, why)
        if not claims:
            continue
        if unread and not serves:
            if v is not None:
                _behind_unread(v, unread)
        elif not serves:
            serves = backend
        elif v is not None:
            _preempt(v, backend, serves, steps, eng)
            preempted[backend] = serves
    serves = serves or unread
    widths: dict = {}
    try:
        widths = per_width(verdicts, steps, eng, target)
    except GateNotFound as e:
        widths = {"error": f"not assessed: the decode widths vLLM captures: {e}"}
    split = width_words(widths)
    if split:
        serves = f"{serves} at the {decode_tensor().rows}-row decode tensor; per decode width: {split}"
        for v in verdicts:
            if v.backend in {g["serves"] for g in widths["ranges"]}:
                v.cause += (f". One row count is not the answer: per decode width over the widths vLLM captures "
                            f"({widths['source']}), {split}")
                v.add("per decode width: the path that serves", widths["ranges"], widths["source"])
    for v in verdicts:
        v.add("TP allreduce dispatch: the path a decode-step allreduce takes", serves, f"vllm/{CUDA_COMM} "
              "CudaCommunicator.all_reduce")
    return {"vllm": eng.version, "config": (config or ServerConfig()).to_json(), "tensor": decode_tensor().to_json(),
            "steps": rows, "serves": serves, "preempted": preempted, "per_width": widths}


def engine_verdicts(ctx, backends=None, engine: Engine | None = None) -> tuple[list[Verdict], dict]:
    """vLLM's engine answers (scope ``engine``, ``engine="vllm"``) for ``ctx`` and its dispatch section. Without vLLM:
    one ``skipped (not installed: vllm)`` per backend and ``{}``. A gate not found is an ``error`` for that backend; a
    dispatch that cannot be read makes every would-serve answer an ``error`` too (never a pass). ``engine``: read this
    vLLM folder instead of the installed one (an edited copy)."""
    eng = engine or installed()
    names = [b for b in BACKENDS if not backends or b in backends]
    if eng is None:
        return [Verdict(b, SKIPPED, scope=SCOPE_ENGINE, gate=GATE_NOT_INSTALLED, lift=LIFT_PACKAGE, engine=DIST,
                        cause="not installed: vllm (the engine answer needs the serving engine)",
                        lift_detail="pip install vllm") for b in names], {}
    ctx = replace(ctx, server_config=(getattr(ctx, "engine_configs", None) or {}).get(DIST) or ctx.server_config)
    out = []
    for b in names:
        try:
            v = DECIDERS[b](ctx, eng)
        except GateNotFound as e:
            v = absent(b, eng, ctx) or Verdict(
                b, ERROR, scope=SCOPE_ENGINE, host=se.target_host(ctx),
                cause=f"not assessed: vllm {eng.version} is a release this reader does not know for this path: {e}",
                lift_detail="teach this suite where the gate lives in this vllm release (it refuses to guess)")
            v.add("vllm version", eng.version, "distribution metadata")
            v.add("reader", str(e), "GateNotFound")
        v.engine = DIST
        out.append(v)
    try:
        dispatch = apply_dispatch(out, eng, ctx.server_config, ctx.target)
    except GateNotFound as e:
        for v in out:
            if v.status in (ON_BY_DEFAULT, ON_AS_CONFIGURED):
                v.add("verdict before the dispatch order", f"{v.status}: {v.cause}", "engine gates")
                v.status, v.gate, v.cause = ERROR, "", f"the TP allreduce dispatch of vllm {eng.version} cannot be read: {e}"
        dispatch = {"vllm": eng.version, "config": (ctx.server_config or ServerConfig()).to_json(), "error": str(e)}
    return out, dispatch


__all__ = ["BACKENDS", "Engine", "installed", "engine_verdicts", "read_dispatch", "parse_config", "env_default",
           "BLOCKED"]
