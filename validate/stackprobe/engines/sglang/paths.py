"""Every communication path the installed SGLang ships, enumerated, and the environment its engine sets.

:func:`inventory` lists each module under ``srt/distributed/device_communicators/``, every ``--moe-a2a-backend``
choice (read from the release's own flag definition), NCCL symmetric memory (``--enable-symm-mem``), NCCL NVLS
(``--enable-nccl-nvls``), DP attention (``--attn-dp-size``, 0.5.9: ``--dp-size`` with ``--enable-dp-attention``),
FlashInfer's fusion-only allreduce and the multimem all-gather module, and every other communication flag the
release declares (:func:`cli_flags`, :func:`field_flags`): each maps to the suite backend that judges it, or is
``not-assessed`` with why and its ``sglang/FILE:LINE``. A module the suite does not know is the finding "unknown communication path:
not assessed", naming it and the ``parallel_state.py`` line that uses it. :func:`paths` gives the not-assessed
ones as engine-scope verdicts. :func:`launch_environment` runs ``_set_envs_and_config``
(``srt/entrypoints/engine.py``) for a configuration: what the engine sets before its workers start.
"""
from __future__ import annotations

import re

from ...paths import PCIE_IPC
from ...verdict import NOT_ASSESSED, SCOPE_ENGINE, Verdict
from ...probes import enumerate_common as ec
from . import engine as se
from . import flags as sf
from .pyeval import UNKNOWN, Evaluator, Unbound

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
    "pcie_ipc_ar.py": (PCIE_IPC, ""),
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
    """Every path: ``{"path", "kind" ("module" / "moe-a2a-backend" / "server flag" / "server flag (add_argument)" /
    "server flag (field group)" / "kernel module"), "maps_to" (suite backend or ""), "status" ("assessed" /
    "not-assessed" / "unknown"), "why", "where"}``. The communication flags come from :func:`cli_flags` (the
    release's ``add_argument`` calls: all of sglang 0.5.9's) and :func:`field_flags` (0.5.23's field groups); a flag
    in :data:`JUDGED_FLAGS` is ``assessed`` with its backend, every other one ``not-assessed`` with its line."""
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
    a2a_choices = (a2a.choices or next((tuple(f["choices"]) for f in cli_flags(engine)
                                        if f["flag"] == a2a.flag and f["choices"]), ())) if a2a else ()
    for choice in a2a_choices:
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
    # add_argument calls first: sglang 0.5.9's help text and flag declaration are there, not on the dataclass field
    for f in cli_flags(engine) + field_flags(engine):
        if f["flag"] in listed or RENDEZVOUS.search(f["flag"]):
            continue
        listed.add(f["flag"])
        judged = JUDGED_FLAGS.get(f["flag"])
        kind = "server flag (field group)" if f.get("source") != "add_argument" else "server flag (add_argument)"
        choices = f" (choices: {', '.join(map(str, f['choices']))})" if f.get("choices") else ""
        if judged:
            out.append({"path": f["flag"], "kind": kind, "maps_to": judged, "where": f["where"], "status": "assessed",
                        "why": f"judged by the {judged} verdict"})
            continue
        out.append({"path": f["flag"], "kind": kind, "maps_to": "", "where": f["where"],
                    "status": "not-assessed", "why": f"a communication setting of the {f['group']} group this suite "
                    f"does not judge: {f['help'][:200]}{choices}"})
    for e in env_settings(engine):
        judged = JUDGED_ENVS.get(e["flag"])
        if judged and not any((d / m).is_file() for m, (b, _) in MODULES.items() if b == judged):
            judged = None               # the path that reads it is not in this release (sglang 0.5.9: no PCIe IPC)
        if judged:
            out.append({"path": e["flag"], "kind": "environment variable", "maps_to": judged, "where": e["where"],
                        "status": "assessed", "why": f"judged by the {judged} verdict"})
            continue
        out.append({"path": e["flag"], "kind": "environment variable", "maps_to": "", "where": e["where"],
                    "status": "not-assessed", "why": (e["applies"] + "; " if e["applies"] else "")
                    + f"a communication variable of srt/environ.py this suite does not judge: {e['help'][:200]}"})
    models = model_stems(engine)
    kdir = engine.root / KERNEL_DIR
    for p in sorted(kdir.glob("*.py")) if kdir.is_dir() else []:
        if p.name == "__init__.py" or _model_of(p.stem, models):
            continue                    # a kernel for one named model (srt/models/<model>.py): not a path to choose
        out.append({"path": f"{KERNEL_DIR}/{p.name}", "kind": "kernel module", "maps_to": "",
                    "where": f"sglang/{KERNEL_DIR}/{p.name}", "status": "not-assessed",
                    "why": ("does not apply here: ROCm only (a HIP kernel); " if p.stem.endswith("_hip") else "")
                    + "a communication kernel module this suite does not judge on its own"})
    return out


#: SGLang's environment variables (``class Envs`` in ``srt/environ.py``, sglang 0.5.9 and 0.5.23)
ENVIRON = "srt/environ.py"
#: variables one of this suite's verdicts reads -> that verdict's backend: the PCIe IPC opt-in and its row bound
#: (``sglang_pcie_ipc``), and the two that turn deterministic collectives on (``pcie_ipc_engine.deterministic_gate``)
JUDGED_ENVS = {"SGLANG_ENABLE_PCIE_IPC_ALLREDUCE": PCIE_IPC,
               "SGLANG_PCIE_IPC_MAX_NUMEL": PCIE_IPC,
               "SGLANG_USE_1STAGE_ALLREDUCE": PCIE_IPC,
               "SGLANG_ENABLE_DETERMINISTIC_INFERENCE": PCIE_IPC}
#: a variable for another platform (by the tokens of its name): it does not apply on an NVIDIA target
OTHER_PLATFORM = re.compile(r"(?:^|_)(HIP|AITER|ROCM|AMD|NPU|XPU|HPU)(?:_|$)")
#: ... or by its help: "on ROCm", "MI3* cards", "AITER's"
OTHER_PLATFORM_HELP = re.compile(r"\bon (?:ROCm|AMD|Ascend|NPU)\b|\bMI3\S* cards|\bAITER's")
#: a variable for diagnostics (debug output, logging): it selects no path
DIAGNOSTIC = re.compile(r"(?:^|_)(DEBUG|LOG|LOGGING|PROFILE|PROFILER)(?:_|$)")
#: model module names too generic to mark a kernel or variable as model-specific
GENERIC_MODEL_STEMS = frozenset({"utils", "registry", "transformers", "torch_native_llama"})


def model_stems(engine: se.Engine) -> list[str]:
    """The module names under ``srt/models/`` (one per model family: ``muse_spark``, ``inkling``, ``beam``,
    ``kimi_k3`` in sglang 0.5.23), longest first, less :data:`GENERIC_MODEL_STEMS`."""
    d = engine.root / "srt" / "models"
    stems = {p.stem for p in d.glob("*.py") if not p.stem.startswith("_")} if d.is_dir() else set()
    return sorted(stems - GENERIC_MODEL_STEMS, key=len, reverse=True)


def _model_of(name: str, models: list[str]) -> str:
    """The model a kernel file stem or a variable name is for: a model module name that is a whole ``_``-separated
    token run of it (``muse_spark_all_gather`` -> ``muse_spark``, ``SGLANG_KIMI_K3_...`` -> ``kimi_k3``); names of
    three letters or fewer only at the start. "" when none."""
    low = name.lower()
    for m in models:
        if low == m or low.startswith(m + "_") or (len(m) > 3 and re.search(rf"(?:^|_){re.escape(m)}(?:_|$)", low)):
            return m
    return ""


def env_settings(engine: se.Engine) -> list[dict]:
    """The communication variables of SGLang's ``class Envs`` in ``srt/environ.py`` (read with ``ast``): every
    ``SGLANG_NAME = Env...(...)`` whose name (its ``_`` read as spaces) or the comment lines right above it match
    :data:`CLI_TERMS`, less diagnostics (:data:`DIAGNOSTIC`) and variables for one named model (:func:`_model_of`).
    sglang 0.5.23 gives ``SGLANG_SYMM_MEM_PREALLOC_GB_SIZE``, ``SGLANG_CUSTOM_ALL_REDUCE_V2_MAX_SIZE_KB``,
    ``SGLANG_DETERMINISTIC_NCCL_NCHANNELS``, ``SGLANG_DP_USE_REDUCE_SCATTER`` among others. Returns ``[{"flag" (the
    name), "where" ("sglang/srt/environ.py:LINE"), "help", "applies" ("" or "does not apply here: ...")}]``; [] when
    the release has no such file or class."""
    import ast

    parsed = ec.parse_with_lines(engine.root / ENVIRON)
    if parsed is None:
        return []
    tree, lines = parsed
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Envs"), None)
    models = model_stems(engine)
    out = []
    for n in cls.body if cls else []:
        if not isinstance(n, (ast.Assign, ast.AnnAssign)):
            continue
        target = n.targets[0] if isinstance(n, ast.Assign) else n.target
        if not (isinstance(target, ast.Name) and target.id.startswith("SGLANG_") and isinstance(n.value, ast.Call)
                and ast.unparse(n.value.func).startswith("Env")):
            continue
        name = target.id
        help_text = ec.comment_help(ec.comment_above(lines, n.lineno))
        if not ec.names_setting(CLI_TERMS, name, help_text) or RENDEZVOUS.search(name.lower().replace(
                "_", "-")) or DIAGNOSTIC.search(name) or _model_of(name.removeprefix("SGLANG_"), models):
            continue
        applies = "does not apply here: for another platform (ROCm, NPU, XPU or HPU)" if (
            OTHER_PLATFORM.search(name) or OTHER_PLATFORM_HELP.search(help_text)) else ""
        out.append({"flag": name, "where": f"sglang/{ENVIRON}:{n.lineno}", "help": help_text, "applies": applies})
    return out


#: where sglang 0.5.23 keeps its communication kernels (enumerated, not judged one by one)
KERNEL_DIR = "kernels/ops/communication"
#: the field groups of the installed server arguments read for communication settings: class names (0.5.23
#: ``srt/arg_groups/fields``: ExecComm, ExecMoe, Parallel, Spec) or ``ServerArgs`` (0.5.9)
GROUP = re.compile(r"comm|moe|parallel|spec|^ServerArgs$", re.IGNORECASE)
#: what marks a communication setting in a field's name or help
COMM_TERMS = re.compile(r"all[_ -]?reduce|a2a|all[_ -]?to[_ -]?all|all[_ -]?gather|reduce[_ -]?scatter|collective|"
                        r"\bnccl|symm|communicat|reduction|comm[_ ]backend", re.IGNORECASE)
#: flags whose answer one of this suite's verdicts gives -> that verdict's backend (the rest of the installed
#: release's communication flags are listed as not assessed). ``--moe-a2a-backend`` is listed per choice, and
#: ``--enable-symm-mem`` / ``--enable-nccl-nvls`` / DP attention / the fusion backend flag by the named rows of
#: :func:`inventory`; tests check that each backend here is one the suite answers for.
JUDGED_FLAGS = {"--moe-a2a-backend": "ep-flashinfer-a2a", "--enable-flashinfer-allreduce-fusion":
                "flashinfer-allreduce-fusion", "--flashinfer-allreduce-fusion-backend": "flashinfer-allreduce-fusion",
                "--disable-custom-all-reduce": "sglang-custom-allreduce", "--enable-mscclpp": "mscclpp",
                "--enable-torch-symm-mem": "torch-symm-mem",
                "--enable-deterministic-inference": PCIE_IPC,
                # the fusion's off switch: it clears the fusion backend (sglang 0.5.23 arg_groups/overrides.py:1006),
                # so the start-up failure the fusion verdict warns of cannot follow
                "--enforce-disable-flashinfer-allreduce-fusion": "flashinfer-allreduce-fusion"}
#: what marks a communication setting in an ``add_argument`` call beyond :data:`COMM_TERMS` (its flag, help text or
#: choices): PCIe, P2P (the peer-access check), scattered inputs, DeepEP, MSCCL++, NVLS, the custom allreduce
CLI_TERMS = re.compile(COMM_TERMS.pattern + r"|pcie|\bp2p\b|scattered|deepep|mscclpp|\bnvls\b|custom[_ -]all",
                       re.IGNORECASE)
#: what marks one in the flag's own name only (help texts mention DP attention and overlap in passing): DP attention
#: and two-batch overlap, which change which collectives a step runs
NAME_TERMS = re.compile(r"dp-attention|batch-overlap")
#: a flag that only names where a process group meets (a port, an address, a host) sets up the rendezvous, and a
#: timeout bounds a wait: neither selects a path
RENDEZVOUS = re.compile(r"-(port|ports|addr|address|host)$|timeout")


def _strings(node) -> list[str]:
    """Every string constant under ``node``, in source order."""
    import ast
    return [c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)] if node else []


def _choices(node, consts: dict) -> list:
    """An ``add_argument``'s ``choices=``: a literal, or a module-level name of the same file (``MOE_A2A_BACKEND_CHOICES``
    in sglang 0.5.9's ``server_args.py``), a ``[*NAME, "x"]`` spread or ``list(NAME)`` of one; [] when not read."""
    import ast
    if node is None:
        return []
    try:
        v = ast.literal_eval(node)
        return list(v) if isinstance(v, (list, tuple, set)) else []
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    out: list = []
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and n.id in consts:
            out += _choices(consts[n.id], {k: v for k, v in consts.items() if k != n.id})
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append(n.value)
    return list(dict.fromkeys(out))


def _section(lines: list[str], lineno: int) -> str:
    """The comment heading the block an ``add_argument`` call sits in (``# Expert parallelism`` in 0.5.9's
    ``add_cli_args``): the nearest line above it that is a comment alone; "" when none within 400 lines."""
    for i in range(lineno - 2, max(lineno - 400, 0) - 1, -1):
        t = lines[i].strip()
        if t.startswith("#") and not t.startswith("#:"):
            return t.lstrip("# ").strip()
    return ""


def cli_flags(engine: se.Engine) -> list[dict]:
    """The communication settings among the installed SGLang's ``parser.add_argument(...)`` calls in its argument files
    (:data:`.sglang_engine.ARG_FILES`; sglang 0.5.9 declares every server flag so, in ``ServerArgs.add_cli_args`` of
    ``srt/server_args.py``, with its help text there and not on the dataclass field): a call whose flag, help text or
    choices match :data:`CLI_TERMS`, leaving out rendezvous settings (:data:`RENDEZVOUS`). Choices given as a module
    constant are resolved in the same file. Returns ``[{"flag", "group" (the section comment, or the file), "where"
    ("sglang/FILE:LINE"), "help", "choices", "source": "add_argument"}]``, one per call (its first ``--`` name)."""
    import ast

    from ... import source

    out = []
    for path in se._arg_sources(engine):
        try:
            tree = source.parse(path)
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except (SyntaxError, ValueError, OSError):
            continue
        consts = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                  if isinstance(t, ast.Name)}
        for call in ast.walk(tree):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "add_argument"):
                continue
            names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                     and a.value.startswith("--")]
            if not names or RENDEZVOUS.search(names[0]):
                continue
            kw = {k.arg: k.value for k in call.keywords if k.arg}
            help_text = " ".join(_strings(kw.get("help"))).strip()
            choices = _choices(kw.get("choices"), consts)
            if not (CLI_TERMS.search(" ".join(names)) or NAME_TERMS.search(" ".join(names)) or CLI_TERMS.search(help_text)
                    or any(CLI_TERMS.search(str(c)) for c in choices)):
                continue
            out.append({"flag": names[0], "group": _section(lines, call.lineno) or se.short(path),
                        "where": f"{se.short(path)}:{call.lineno}", "help": help_text, "choices": choices,
                        "source": "add_argument"})
    return out


def field_flags(engine: se.Engine) -> list[dict]:
    """The communication settings of the installed SGLang's server-argument field groups, read from its source
    (``ast``): every field of a class matching :data:`GROUP` in its argument files (:data:`.sglang_engine.ARG_FILES`)
    whose name or help text matches :data:`CLI_TERMS` (or whose flag matches :data:`NAME_TERMS`) and that is a command-line flag (not ``Arg(no_cli=True)``).
    sglang 0.5.23 gives, among others, ``--speculative-moe-a2a-backend`` (``fields/spec.py:181``),
    ``--dcp-comm-backend`` (``fields/parallel.py:127``), ``--enable-tp-lm-head-all-to-all``. Returns ``[{"flag",
    "group", "where", "help"}]``."""
    import ast

    from ... import source

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
                flag = "--" + f.target.id.replace("_", "-")
                if CLI_TERMS.search(f.target.id) or CLI_TERMS.search(help_text) or NAME_TERMS.search(flag):
                    out.append({"flag": "--" + f.target.id.replace("_", "-"), "group": cls.name,
                                "where": f"{se.short(path)}:{f.lineno}", "help": help_text})
    return out


#: what a reader of the enumeration raises when the installed source is not where or what it expects: each becomes a
#: not-assessed row naming it (:func:`paths`), never a dropped list that reads as "nothing unjudged"
READER_ERRORS = (se.GateNotFound, LookupError, OSError, SyntaxError, ValueError, TypeError, AttributeError)


def paths(engine: se.Engine, ctx) -> list[Verdict]:
    """The not-assessed and unknown paths of :func:`inventory` as engine-scope verdicts, status ``not-assessed``. A
    reader that cannot enumerate (GateNotFound: the argument files define no flag; a file it cannot read) gives one
    ``sglang-paths`` row saying so, with the reason, beside the files that do not parse."""
    out = []
    try:
        rows = inventory(engine)
    except READER_ERRORS as e:
        rows = []
        out.append(Verdict("sglang-paths", NOT_ASSESSED, scope=SCOPE_ENGINE, host=se.target_host(ctx),
                           cause=f"not assessed: the settings and modules sglang {engine.version} ships could not be "
                                 f"enumerated ({type(e).__name__}: {e})"))
    for row in rows:
        if row["status"] == "assessed":
            continue
        v = Verdict(row["path"], NOT_ASSESSED, scope=SCOPE_ENGINE, host=se.target_host(ctx),
                    cause=row["why"] or "not judged by this suite")
        v.add("shipped by", f"sglang {engine.version}", row["where"])
        out.append(v)
    for rel, err in se.unparsed(engine.root, UNPARSED_CHECK):
        out.append(Verdict(f"sglang/{rel}", NOT_ASSESSED, scope=SCOPE_ENGINE, host=se.target_host(ctx),
                           cause=f"not assessed: sglang/{rel} does not parse ({err}), so the settings and paths it "
                                 "declares are not listed here"))
    return out


#: the files the enumeration reads settings from; one that does not parse is named as not assessed
UNPARSED_CHECK = ("srt/server_args.py", "srt/environ.py", "srt/arg_groups/**/*.py",
                  "srt/distributed/device_communicators/*.py")


def findings(engine: se.Engine) -> list[dict]:
    """Environment findings for the modules this suite does not know (case C39); [] when the enumeration cannot be
    read (:func:`paths` then gives the not-assessed row with the reason)."""
    try:
        rows = inventory(engine)
    except READER_ERRORS:
        return []
    return [{"case": "C39", "level": "warning", "message": row["why"]} for row in rows if row["status"] == "unknown"]


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
