"""Every communication path the installed SGLang ships, enumerated, and the environment its engine sets.

:func:`inventory` lists each module under ``srt/distributed/device_communicators/``, every ``--moe-a2a-backend``
choice (read from the release's own flag definition), NCCL symmetric memory (``--enable-symm-mem``), NCCL NVLS
(``--enable-nccl-nvls``), DP attention (``--attn-dp-size``, 0.5.9: ``--dp-size`` with ``--enable-dp-attention``),
FlashInfer's fusion-only allreduce and the multimem all-gather module: each maps to the suite backend that judges
it, or is ``not-assessed`` with why. A module the suite does not know is the finding "unknown communication path:
not assessed", naming it and the ``parallel_state.py`` line that uses it. :func:`paths` gives the not-assessed
ones as engine-scope verdicts. :func:`launch_environment` runs ``_set_envs_and_config``
(``srt/entrypoints/engine.py``) for a configuration: what the engine sets before its workers start.
"""
from __future__ import annotations

import re

from ..verdict import NOT_ASSESSED, SCOPE_ENGINE, Verdict
from . import sglang_engine as se
from . import sglang_flags as sf
from .sglang_pyeval import UNKNOWN, Evaluator, Unbound

COMM_DIR = "srt/distributed/device_communicators"
ENGINE_FILE = "srt/entrypoints/engine.py"
# module -> (suite backend judging it, or "" with why it is not assessed)
MODULES = {
    "all_reduce_utils.py": ("torch-symm-mem", "size table of the torch symm-mem communicator"),
    "cuda_wrapper.py": ("", "CUDA runtime bindings used by the IPC communicators; not a path of its own"),
    "custom_all_reduce.py": ("sglang-custom-allreduce", ""),
    "custom_all_reduce_ops.py": ("sglang-custom-allreduce", ""),
    "custom_all_reduce_utils.py": ("sglang-custom-allreduce", ""),
    "custom_all_reduce_v2.py": ("sglang-custom-allreduce", ""),
    "pcie_ipc_ar.py": ("flashinfer-pcie-ipc-allreduce", ""),
    "pymscclpp.py": ("mscclpp", ""),
    "pynccl.py": ("nccl-ring", ""),
    "pynccl_wrapper.py": ("nccl-ring", ""),
    "pynccl_allocator.py": ("", "NCCL symmetric memory's allocator (--enable-symm-mem): see nccl-symm-mem"),
    "torch_symm_mem.py": ("torch-symm-mem", ""),
    "quick_all_reduce.py": ("", "quick allreduce is built only on ROCm (is_hip())"),
    "hpu_communicator.py": ("", "Intel Gaudi (HPU) only"),
    "xpu_communicator.py": ("", "Intel XPU only"),
    "npu_communicator.py": ("", "Ascend NPU only"),
    "shm_broadcast.py": ("", "the scheduler's shared-memory message queue, not a collective"),
    "mooncake_transfer_engine.py": ("", "KV-cache transfer for prefill/decode disaggregation, not a TP collective"),
    "triton_symm_mem_ag.py": ("", "multimem all-gather (Kimi's EAGLE-3 draft); without multicast it falls back to "
                              "NCCL; not judged by this suite"),
    "vocab_gather.py": ("", "vocabulary-parallel logits gather; not judged by this suite"),
}
A2A_JUDGED = {"flashinfer": "ep-flashinfer-a2a", "none": ""}


def _use_line(engine: se.Engine, module: str) -> str:
    """``sglang/srt/distributed/parallel_state.py:L`` of the first line naming ``module`` (its import), or ""."""
    stem = module.removesuffix(".py")
    for rel in ("srt/distributed/parallel_state.py",):
        p = engine.root / rel
        if p.is_file():
            for i, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
                if re.search(rf"\b{re.escape(stem)}\b", line):
                    return f"sglang/{rel}:{i}"
    return ""


def inventory(engine: se.Engine) -> list[dict]:
    """Every path: ``{"path", "kind" ("module" / "moe-a2a-backend" / "server flag" / "dispatch step"), "maps_to"
    (suite backend or ""), "status" ("assessed" / "not-assessed" / "unknown"), "why", "where"}``."""
    out = []
    d = engine.root / COMM_DIR
    for p in sorted(d.glob("*.py")) if d.is_dir() else []:
        if p.name == "__init__.py":
            continue
        known = MODULES.get(p.name)
        where = f"sglang/{COMM_DIR}/{p.name}"
        if known is None:
            use = _use_line(engine, p.name)
            out.append({"path": p.name, "kind": "module", "maps_to": "", "status": "unknown", "where": where,
                        "why": f"unknown communication path: not assessed (sglang {engine.version} ships {where}"
                               + (f", used at {use}" if use else "") + "; this suite has no rule for it)"})
            continue
        out.append({"path": p.name, "kind": "module", "maps_to": known[0], "where": where,
                    "status": "assessed" if known[0] else "not-assessed", "why": known[1]})
    flags = sf.server_flags(engine)
    a2a = flags.get("--moe-a2a-backend")
    for choice in (a2a.choices or ()) if a2a else ():
        judged = A2A_JUDGED.get(choice)
        out.append({"path": f"--moe-a2a-backend {choice}", "kind": "moe-a2a-backend", "maps_to": judged or "",
                    "where": a2a.where, "status": "assessed" if judged is not None else "not-assessed",
                    "why": "no expert all-to-all (MoE runs tensor parallel)" if choice == "none" else
                    "" if judged else "an expert-parallel all-to-all backend this suite does not judge"})
    for flag, name, why in (("--enable-symm-mem", "nccl-symm-mem", "NCCL symmetric memory (pynccl): first in the "
                             "TP allreduce dispatch when set; this suite does not time or gate it"),
                            ("--enable-nccl-nvls", "nccl-nvls", "NCCL NVLink SHARP; needs NVSwitch multicast, "
                             "not judged by this suite"),
                            ("--attn-dp-size", "dp-attention", "DP attention removes the attention allreduce "
                             "(attention runs data parallel); not judged by this suite"),
                            ("--enable-dp-attention", "dp-attention", "DP attention (0.5.9 spelling with --dp-size); "
                             "removes the attention allreduce; not judged by this suite"),
                            ("--flashinfer-allreduce-fusion-backend", "flashinfer-allreduce-only",
                             "FlashInfer's fusion-only allreduce (a dispatch step when the fusion backend is set); "
                             "its flag is judged by the flashinfer-allreduce-fusion verdict")):
        if flag in flags:
            out.append({"path": name, "kind": "server flag", "maps_to": "", "where": f"{flags[flag].where} {flag}",
                        "status": "not-assessed", "why": why})
    listed = {r["where"].split()[-1] for r in out if r["kind"] == "server flag"} | {a2a.flag if a2a else ""}
    for f in field_flags(engine):
        if f["flag"] in listed or f["flag"] in JUDGED_FLAGS:
            continue
        out.append({"path": f["flag"], "kind": "server flag (field group)", "maps_to": "", "where": f["where"],
                    "status": "not-assessed", "why": f"a communication setting of the {f['group']} group this suite "
                    f"does not judge: {f['help'][:200]}"})
    kdir = engine.root / KERNEL_DIR
    for p in sorted(kdir.glob("*.py")) if kdir.is_dir() else []:
        if p.name != "__init__.py":
            out.append({"path": f"{KERNEL_DIR}/{p.name}", "kind": "kernel module", "maps_to": "",
                        "where": f"sglang/{KERNEL_DIR}/{p.name}", "status": "not-assessed",
                        "why": "a communication kernel module this suite does not judge on its own"})
    return out


#: where sglang 0.5.23 keeps its communication kernels (enumerated, not judged one by one)
KERNEL_DIR = "kernels/ops/communication"
#: the field groups of the installed server arguments read for communication settings: class names (0.5.23
#: ``srt/arg_groups/fields``: ExecComm, ExecMoe, Parallel, Spec) or ``ServerArgs`` (0.5.9)
GROUP = re.compile(r"comm|moe|parallel|spec|^ServerArgs$", re.IGNORECASE)
#: what marks a communication setting in a field's name or help
COMM_TERMS = re.compile(r"all[_ -]?reduce|a2a|all[_ -]?to[_ -]?all|all[_ -]?gather|reduce[_ -]?scatter|collective|"
                        r"\bnccl|symm|communicat|reduction|comm[_ ]backend", re.IGNORECASE)
#: flags whose answer one of this suite's verdicts gives (the rest of a group's communication flags are listed)
JUDGED_FLAGS = {"--moe-a2a-backend", "--enable-symm-mem", "--enable-nccl-nvls", "--attn-dp-size",
                "--enable-dp-attention", "--flashinfer-allreduce-fusion-backend", "--enable-flashinfer-allreduce-fusion",
                "--disable-custom-all-reduce", "--enable-mscclpp", "--enable-torch-symm-mem",
                "--enable-deterministic-inference"}


def field_flags(engine: se.Engine) -> list[dict]:
    """The communication settings of the installed SGLang's server-argument field groups, read from its source
    (``ast``): every field of a class matching :data:`GROUP` in its argument files (:data:`.sglang_engine.ARG_FILES`)
    whose name or help text matches :data:`COMM_TERMS` and that is a command-line flag (not ``Arg(no_cli=True)``).
    sglang 0.5.23 gives, among others, ``--speculative-moe-a2a-backend`` (``fields/spec.py:181``),
    ``--dcp-comm-backend`` (``fields/parallel.py:127``), ``--enable-tp-lm-head-all-to-all``. Returns ``[{"flag",
    "group", "where", "help"}]``."""
    import ast

    from .. import source

    out = []
    for path in se._arg_sources(engine):
        try:
            tree = source.parse(path)
        except (SyntaxError, ValueError, OSError):
            continue
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and GROUP.search(n.name)):
            for f in cls.body:
                if not (isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)):
                    continue
                text = ast.unparse(f.annotation)
                if "no_cli=True" in text:
                    continue
                helps = [k.value.value for k in ast.walk(f.annotation) if isinstance(k, ast.keyword)
                         and k.arg == "help" and isinstance(k.value, ast.Constant)]
                helps += [c.value for c in ast.walk(f.annotation) if isinstance(c, ast.Constant)
                          and isinstance(c.value, str) and len(c.value) > 20][:1]
                help_text = str(helps[0]) if helps else ""
                if COMM_TERMS.search(f.target.id) or COMM_TERMS.search(help_text):
                    out.append({"flag": "--" + f.target.id.replace("_", "-"), "group": cls.name,
                                "where": f"{se.short(path)}:{f.lineno}", "help": help_text})
    return out


def paths(engine: se.Engine, ctx) -> list[Verdict]:
    """The not-assessed and unknown paths of :func:`inventory` as engine-scope verdicts, status ``not-assessed``."""
    out = []
    for row in inventory(engine):
        if row["status"] == "assessed":
            continue
        v = Verdict(row["path"], NOT_ASSESSED, scope=SCOPE_ENGINE, host=se.target_host(ctx),
                    cause=row["why"] or "not judged by this suite")
        v.add("shipped by", f"sglang {engine.version}", row["where"])
        out.append(v)
    return out


def findings(engine: se.Engine) -> list[dict]:
    """Environment findings for the modules this suite does not know (case C39)."""
    return [{"case": "C39", "level": "warning", "message": row["why"]} for row in inventory(engine)
            if row["status"] == "unknown"]


def launch_environment(engine: se.Engine, config) -> dict:
    """``{NAME: {"value": str | "set at run time", "source": "sglang/srt/entrypoints/engine.py:LINE"}}``: what
    ``_set_envs_and_config`` writes into ``os.environ`` before the workers start, for ``config`` (its flags, and its
    variables standing for the environment the server starts in); single node. Raises GateNotFound when the function
    is not found."""
    fn = engine.function(ENGINE_FILE, "_set_envs_and_config")
    envd = dict(config.env)

    def resolve(text: str):
        m = re.fullmatch(r"(?:cfg|server_args)\.(\w+)", text)
        if m:
            try:
                return sf.config_value(engine, config, "--" + m.group(1).replace("_", "-"))[0]
            except se.GateNotFound:
                return {"nnodes": 1}.get(m.group(1), UNKNOWN)
        if text == "os.environ":
            return envd
        m = re.fullmatch(r"os\.environ\.get\('(\w+)'(?:, '(.*)')?\)", text)
        if m:
            return envd.get(m.group(1), m.group(2))
        m = re.fullmatch(r"envs\.(\w+)\.get\(\)", text)
        if m:
            try:
                return envd.get(m.group(1), se.env_flag(engine, m.group(1))[0])
            except se.GateNotFound:
                return UNKNOWN
        raise Unbound(text)

    out = Evaluator(resolve, lenient=True).run(fn.body)
    res = {}
    for name, (value, line) in out.writes.items():
        if isinstance(value, tuple) and value and value[0] == "setdefault":
            value = envd.get(name, value[1])
        res[name] = {"value": "set at run time" if value is UNKNOWN else str(value),
                     "source": f"sglang/{ENGINE_FILE}:{line} _set_envs_and_config"}
    return res
