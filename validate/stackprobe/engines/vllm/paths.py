"""Every communication setting and module the installed vLLM ships, enumerated from its own declarations (``ast``, no
import), each mapped to the suite verdict that judges it or listed as not assessed with its ``vllm/FILE:LINE``.

Where vLLM 0.33.0 declares them (the reader walks the structure, it holds no list of vLLM's names):

* server arguments: the fields of the configuration classes under ``vllm/config/`` whose name matches :data:`GROUP`
  (``ParallelConfig`` and ``EPLBConfig`` in ``config/parallel.py``, ``PassConfig`` in ``config/compilation.py``,
  ``KernelConfig``, ``SpeculativeConfig``), each field followed by its docstring (vLLM's ``--help`` text); a field
  that is also an ``EngineArgs`` field (``engine/arg_utils.py``) is the flag ``--name-with-dashes``, a
  ``PassConfig`` field is ``--compilation-config`` ``pass_config.NAME``; choices come from its ``Literal[...]`` type
  or the module-level alias it names (``All2AllBackend``, ``DCPCommBackend``);
* environment variables: the entries of ``envs.py``'s ``environment_variables`` dict, with the comment lines above
  each entry as its help and ``env_with_choices(NAME, default, [choices])`` giving choices;
* modules: ``distributed/device_communicators/*.py`` and the compilation passes under ``compilation/passes/`` whose
  file name names a collective.

A field or variable is a communication setting when its name, help or choices match :data:`TERMS` (allreduce,
all-to-all, all-gather, reduce-scatter, NCCL, symmetric memory, PCIe, P2P, DeepEP, communication, ...) or its name
matches :data:`NAME_TERMS` (expert parallelism, all2all, dual batch overlap); rendezvous settings (ports, addresses)
are left out. :data:`ASSESSED` maps the settings this suite's vLLM verdicts (:data:`.vllm_engine.DECIDERS`) read to
their backend; every other one is a not-assessed row. :func:`paths` gives those rows as engine-scope verdicts for the
report's ``paths`` (the Markdown's "Not assessed here" section).
"""
from __future__ import annotations

import ast
import re

from ... import source
from ...paths import PCIE_IPC
from ...verdict import NOT_ASSESSED, SCOPE_ENGINE, Verdict
from ...probes import enumerate_common as ec
from ..sglang import engine as se
from ..sglang.paths import CLI_TERMS as TERMS
from ..sglang.paths import RENDEZVOUS

CONFIG_DIR = "config"
ENVS = "envs.py"
ARG_FILE = "engine/arg_utils.py"
COMM_DIR = "distributed/device_communicators"
PASS_DIR = "compilation/passes"
#: configuration classes read for server arguments (communication, MoE/expert parallelism, parallel, speculative,
#: compilation passes, kernels)
GROUP = re.compile(r"parallel|eplb|comm|moe|speculative|^PassConfig$|^KernelConfig$", re.IGNORECASE)
#: what marks a setting in its name alone: expert parallelism, the all-to-all backend, dual batch overlap, sequence
#: parallelism
NAME_TERMS = re.compile(r"expert_parallel|all2all|\bdbo\b|enable_dbo|_DBO_|sequence_parallel|async_tp", re.IGNORECASE)
#: an environment variable that names where a process group meets, or a timeout, or where the front end's RPC
#: socket lives: none selects a path
ENV_RENDEZVOUS = re.compile(r"_(PORT|PORTS|ADDR|IP|HOST)$|TIMEOUT|(?:^|_)RPC(?:_|$)")
#: :data:`TERMS` plus vLLM's own NCCL wrapper (``\bnccl`` does not match inside "pynccl") and torch.distributed
VTERMS = re.compile(TERMS.pattern + r"|pynccl|torch\.distributed", re.IGNORECASE)
#: words that match a collective term without naming one: ``collective_rpc`` is vLLM's worker RPC
NOT_A_COLLECTIVE = re.compile(r"collective_rpc", re.IGNORECASE)
#: settings that place ranks on devices or NICs (GPU id maps, GPU-to-NIC maps): which device, not which path
PLACEMENT = re.compile(r"gpu_ids|(?:^|_)NIC(?:_|$)", re.IGNORECASE)
#: diagnostics: logging and debug output select no path
DIAGNOSTIC = re.compile(r"(?:^|[_.])(?:log|debug)(?:_|$)", re.IGNORECASE)
#: help that puts a setting on the KV-cache transfer of disaggregated serving, not on the TP collectives
KV_TRANSFER = re.compile(r"kv_transfer|kv[ -]cache transfer|\bkv transfer|disaggregat", re.IGNORECASE)
#: help that says the setting is for one model ("Kimi-K3 only."): not a path a deployment of another model chooses
MODEL_ONLY = re.compile(r"^[A-Z][\w.]*(?:[ -][\w.]+)?\s+only\b")
#: a setting for another platform, by its name's tokens or its help: it does not apply on an NVIDIA target
OTHER_PLATFORM = re.compile(r"(?:^|_)(?:ROCM|AITER|HIP)(?:_|$)")
OTHER_PLATFORM_HELP = re.compile(r"\bon ROCm:|\bROCm only|\bMI3\S* cards|\bAITER's")
#: a variable that names a file location (a cache root, a directory): a judged module may read it, it selects no path
LOCATION = re.compile(r"_(ROOT|DIR|HOME)$")
#: help that names a kernel for compute capability 10.x only (SM100, Blackwell B200/GB200)
SM100_ONLY = re.compile(r"\bSM100\b|\bsm_?100a?\b")

#: settings one of this suite's vLLM verdicts reads -> that verdict's backend (``.vllm_engine.DECIDERS``); a choice of
#: ``--all2all-backend`` is ``"--all2all-backend <choice>"``, a pass setting ``"pass_config.<name>"``
ASSESSED = {
    "--disable-custom-all-reduce": "vllm-custom-allreduce",
    "VLLM_ALLREDUCE_USE_SYMM_MEM": "torch-symm-mem",
    "VLLM_USE_NCCL_SYMM_MEM": "nccl-symm-mem",
    "VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC": PCIE_IPC,
    "VLLM_ALLREDUCE_USE_FLASHINFER": "flashinfer-allreduce",
    "pass_config.fuse_allreduce_rms": "flashinfer-allreduce-fusion",
    "pass_config.fi_allreduce_fusion_max_size_mb": "flashinfer-allreduce-fusion",
    "--enable-expert-parallel": "ep-flashinfer-a2a",
    "VLLM_FLASHINFER_ALLREDUCE_BACKEND": "flashinfer-allreduce-fusion",
    "--all2all-backend flashinfer_all2allv": "ep-flashinfer-a2a",
    "--all2all-backend flashinfer_nvlink_two_sided": "ep-flashinfer-a2a",
    "--all2all-backend flashinfer_nvlink_one_sided": "ep-flashinfer-a2a",
}
#: modules of ``distributed/device_communicators`` -> (backend judging it, or "" with why it is not assessed)
MODULES = {
    "aiter_custom_all_reduce.py": ("", "does not apply here: ROCm only (AITER's custom allreduce)"),
    "all2all.py": ("ep-flashinfer-a2a", "the all-to-all managers (the FlashInfer ones judged; the others are listed as "
                                        "--all2all-backend choices)"),
    "all_reduce_utils.py": ("nccl-symm-mem", "the size tables of NCCL and torch symmetric memory"),
    "base_device_communicator.py": ("", "the communicators' base class; not a path of its own"),
    "cpu_communicator.py": ("", "CPU only"),
    "cuda_communicator.py": ("nccl-ring", "CudaCommunicator.all_reduce: the dispatch order the suite reads"),
    "cuda_wrapper.py": ("", "CUDA runtime bindings used by the IPC communicators; not a path of its own"),
    "custom_all_reduce.py": ("vllm-custom-allreduce", ""),
    "flashinfer_all_reduce.py": ("flashinfer-allreduce", ""),
    "flashinfer_pcie_ipc_all_reduce.py": (PCIE_IPC, ""),
    "pynccl.py": ("nccl-ring", ""),
    "pynccl_wrapper.py": ("nccl-ring", ""),
    "pynccl_allocator.py": ("nccl-symm-mem", ""),
    "quick_all_reduce.py": ("quick-allreduce", ""),
    "symm_mem.py": ("torch-symm-mem", ""),
    "mnnvl_compat.py": ("", "multi-node NVLink (MNNVL) helpers for FlashInfer's all-to-all; not judged on their own"),
    "shm_broadcast.py": ("", "the engine's shared-memory message queue, not a collective"),
    "shm_object_storage.py": ("", "shared-memory object storage for inputs, not a collective"),
    "shm_tensor_arena.py": ("", "shared-memory arena for the engine-to-worker broadcast, not a collective"),
    "xpu_communicator.py": ("", "Intel XPU only"),
}
PASSES = {"allreduce_rms_fusion.py": "flashinfer-allreduce-fusion"}


def _where(rel: str, line: int) -> str:
    return f"vllm/{rel}:{line}"


def _aliases(tree: ast.Module) -> dict[str, ast.AST]:
    return {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}


def _literal_choices(node, aliases: dict, depth: int = 0) -> list:
    """Choices of a field's type: the strings of a ``Literal[...]``, through ``X | None`` and module-level aliases."""
    if node is None or depth > 4:
        return []
    out: list = []
    for n in ast.walk(node):
        if isinstance(n, ast.Subscript) and ast.unparse(n.value).split(".")[-1] == "Literal":
            out += [c.value for c in ast.walk(n.slice) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
        elif isinstance(n, ast.Name) and n.id in aliases:
            out += _literal_choices(aliases[n.id], {k: v for k, v in aliases.items() if k != n.id}, depth + 1)
    return list(dict.fromkeys(out))


def _is_setting(name: str, help_text: str, choices) -> bool:
    """Whether a field or variable is a communication setting: its name (``_`` read as spaces too, so
    ``..._NCCL_...`` matches ``\\bnccl``), help or choices match :data:`VTERMS`, or its name :data:`NAME_TERMS`; then
    not when it is noise by rule: a placement (:data:`PLACEMENT`), a diagnostic (:data:`DIAGNOSTIC`), a KV-transfer
    setting (:data:`KV_TRANSFER`) or one model's (:data:`MODEL_ONLY`)."""
    help_text = NOT_A_COLLECTIVE.sub("", help_text)
    if PLACEMENT.search(name) or DIAGNOSTIC.search(name) or KV_TRANSFER.search(help_text) or MODEL_ONLY.search(help_text):
        return False
    return ec.names_setting(VTERMS, name, help_text, choices or (), NAME_TERMS)


def _applies(name: str, help_text: str) -> str:
    """"" or why the setting does not apply on an NVIDIA target of another compute capability: another platform
    (:data:`OTHER_PLATFORM`), or an SM100 kernel (:data:`SM100_ONLY`; vllm 0.33.0 ``VLLM_ENABLE_GEMM_RS``)."""
    if OTHER_PLATFORM.search(name) or OTHER_PLATFORM_HELP.search(help_text):
        return "does not apply here: ROCm only"
    if SM100_ONLY.search(help_text):
        return "does not apply here unless the target is compute capability 10.x: an SM100 kernel"
    return ""


def read_by_judged_modules(eng) -> dict[str, str]:
    """``{VLLM_NAME: "vllm/FILE:LINE"}``: the variables (``envs.NAME``) read by a module this suite maps to a backend
    (:data:`MODULES` with a backend, :data:`PASSES`), first read. Such a variable changes a judged path whatever its
    help says: vllm 0.33.0 ``VLLM_BATCH_INVARIANT`` (``cuda_communicator.py:71``: no FlashInfer or PCIe IPC
    allreduce), ``VLLM_DISABLE_PYNCCL`` (``pynccl.py:127``: torch.distributed instead)."""
    out: dict[str, str] = {}
    files = [(COMM_DIR, m) for m, (b, _) in MODULES.items() if b] + [(PASS_DIR, m) for m in PASSES]
    for rel, name in files:
        path = eng.root / rel / name
        try:
            tree = source.parse(path)
        except (SyntaxError, ValueError, OSError):
            continue
        for n in sorted((x for x in ast.walk(tree) if isinstance(x, ast.Attribute) and x.attr.startswith("VLLM_")
                         and ast.unparse(x.value) == "envs"), key=lambda x: x.lineno):
            out.setdefault(n.attr, _where(f"{rel}/{name}", n.lineno))
    return out


def config_settings(eng) -> list[dict]:
    """The communication fields of the configuration classes under ``vllm/config/`` matching :data:`GROUP`.
    Returns ``[{"setting" (``--flag``, ``pass_config.NAME`` or ``Class.NAME``), "group" (class), "where"
    (``vllm/config/FILE:LINE``), "help" (the field's docstring), "choices"}]``."""
    try:
        engine_args = {n.target.id for n in eng.cls(ARG_FILE, "EngineArgs").body
                       if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    except se.GateNotFound:
        engine_args = set()
    out = []
    for path in sorted((eng.root / CONFIG_DIR).glob("*.py")):
        try:
            tree = source.parse(path)
        except (SyntaxError, ValueError, OSError):
            continue
        aliases = _aliases(tree)
        rel = f"{CONFIG_DIR}/{path.name}"
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and GROUP.search(n.name)):
            body = cls.body
            for i, f in enumerate(body):
                if not (isinstance(f, ast.AnnAssign) and isinstance(f.target, ast.Name)) or f.target.id.startswith("_"):
                    continue
                nxt = body[i + 1] if i + 1 < len(body) else None
                doc = nxt.value.value if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) \
                    and isinstance(nxt.value.value, str) else ""
                help_text = " ".join(doc.split())
                choices = _literal_choices(f.annotation, aliases)
                name = f.target.id
                if not _is_setting(name, help_text, choices):
                    continue
                setting = ("--" + name.replace("_", "-") if name in engine_args and cls.name != "PassConfig"
                           else f"pass_config.{name}" if cls.name == "PassConfig" else f"{cls.name}.{name}")
                if RENDEZVOUS.search(setting.replace("_", "-")):
                    continue
                out.append({"setting": setting, "group": cls.name, "where": _where(rel, f.lineno),
                            "help": help_text, "choices": choices, "applies": _applies(name, help_text)})
    return out


def env_settings(eng) -> list[dict]:
    """The communication variables of ``envs.py``'s ``environment_variables`` dict: ``[{"setting" (NAME), "group":
    "envs.py", "where" (``vllm/envs.py:LINE`` of the entry), "help" (the comment lines above it), "choices"
    (``env_with_choices``' list)}]``."""
    parsed = ec.parse_with_lines(eng.root / ENVS)
    if parsed is None:
        return []
    tree, lines = parsed
    table = next((n.value for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign)) and isinstance(n.value, ast.Dict)
                  and ast.unparse(n.targets[0] if isinstance(n, ast.Assign) else n.target) == "environment_variables"),
                 None)
    if table is None:
        return []
    read = read_by_judged_modules(eng)
    out, prev_end = [], table.lineno
    for k, v in zip(table.keys, table.values):
        if not (isinstance(k, ast.Constant) and isinstance(k.value, str)):
            prev_end = getattr(v, "end_lineno", prev_end)
            continue
        help_text = ec.comment_help(lines[prev_end:k.lineno - 1])
        prev_end = getattr(v, "end_lineno", k.lineno) or k.lineno
        choices = []
        for c in ast.walk(v):
            if isinstance(c, ast.Call) and ast.unparse(c.func).endswith("env_with_choices") and len(c.args) >= 3:
                choices = [e.value for e in ast.walk(c.args[2]) if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if not k.value.startswith("VLLM_") or ENV_RENDEZVOUS.search(k.value):
            continue                    # a system variable vLLM also reads (LD_LIBRARY_PATH), or a rendezvous
        if k.value in read and not LOCATION.search(k.value):
            help_text = f"read by {read[k.value]} (a module of a judged path). {help_text}".strip()
        elif not _is_setting(k.value, help_text, choices):
            continue
        out.append({"setting": k.value, "group": "envs.py", "where": _where(ENVS, k.lineno), "help": help_text,
                    "choices": choices, "applies": _applies(k.value, help_text)})
    return out


def _removed_choices(eng, field: str) -> dict[str, str]:
    """Choices ``engine/arg_utils.py`` takes off a field's command line (``parallel_kwargs["all2all_backend"]
    ["choices"].remove(PASSTHROUGH_ALL2ALL_BACKEND)`` in vllm 0.33.0, the name resolved in ``vllm/config/*.py``):
    ``{choice: "vllm/engine/arg_utils.py:LINE"}``."""
    try:
        tree = eng.tree(ARG_FILE)
    except (se.GateNotFound, OSError, SyntaxError, ValueError):
        return {}
    consts: dict[str, str] = {}
    for path in sorted((eng.root / CONFIG_DIR).glob("*.py")):
        try:
            for n in source.parse(path).body:
                if not isinstance(n, (ast.Assign, ast.AnnAssign)):
                    continue
                target = n.targets[0] if isinstance(n, ast.Assign) else n.target
                if isinstance(target, ast.Name) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str):
                    consts.setdefault(target.id, n.value.value)
        except (SyntaxError, ValueError, OSError):
            continue
    out = {}
    for c in ast.walk(tree):
        if not (isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "remove" and c.args):
            continue
        owner = ast.unparse(c.func.value)
        if f"'{field}'" not in owner or "'choices'" not in owner:
            continue
        arg = c.args[0]
        value = arg.value if isinstance(arg, ast.Constant) else consts.get(ast.unparse(arg))
        if isinstance(value, str):
            out[value] = _where(ARG_FILE, c.lineno)
    return out


def inventory(eng) -> list[dict]:
    """Every communication setting and module: ``{"path", "kind" ("server argument" / "environment variable" /
    "all2all-backend" / "module" / "compilation pass"), "maps_to" (suite backend or ""), "status" ("assessed" /
    "not-assessed" / "unknown"), "why", "where"}``."""
    out = []
    for s in config_settings(eng) + env_settings(eng):
        kind = "environment variable" if s["group"] == "envs.py" else "server argument"
        if s["setting"] == "--all2all-backend" and s["choices"]:
            off_cli = _removed_choices(eng, "all2all_backend")
            for c in s["choices"]:
                judged = ASSESSED.get(f"--all2all-backend {c}", "")
                why = f"judged by the {judged} verdict" if judged else \
                    "an expert-parallel all-to-all backend this suite does not judge"
                if c in off_cli:
                    why += f"; not a command-line choice (taken off at {off_cli[c]}): only vLLM itself sets it"
                out.append({"path": f"--all2all-backend {c}", "kind": "all2all-backend", "maps_to": judged,
                            "where": s["where"], "status": "assessed" if judged else "not-assessed", "why": why})
            continue
        judged = ASSESSED.get(s["setting"], "")
        choices = f" (choices: {', '.join(map(str, s['choices']))})" if s["choices"] else ""
        applies = s.get("applies", "")
        out.append({"path": s["setting"], "kind": kind, "maps_to": judged, "where": s["where"],
                    "status": "assessed" if judged else "not-assessed",
                    "why": f"judged by the {judged} verdict" if judged else (applies + "; " if applies else "")
                    + f"a communication setting of {s['group']} this suite does not judge: {s['help'][:200]}{choices}"})
    for rel, table in ((COMM_DIR, {k: v for k, v in MODULES.items()}), (PASS_DIR, {k: (v, "") for k, v in PASSES.items()})):
        d = eng.root / rel
        files = sorted(d.rglob("*.py")) if d.is_dir() else []
        for p in files:
            if p.name == "__init__.py" or (rel == PASS_DIR and not TERMS.search(p.stem)):
                continue
            where = f"vllm/{p.relative_to(eng.root).as_posix()}"
            known = table.get(p.name)
            kind = "module" if rel == COMM_DIR else "compilation pass"
            if known is None:
                out.append({"path": p.relative_to(eng.root / rel).as_posix(), "kind": kind, "maps_to": "",
                            "status": "unknown", "where": where,
                            "why": f"unknown communication path: not assessed (vllm {eng.version} ships {where}; this "
                                   "suite has no rule for it)"})
                continue
            out.append({"path": p.name, "kind": kind, "maps_to": known[0], "where": where,
                        "status": "assessed" if known[0] else "not-assessed", "why": known[1]})
    return out


def paths(eng, ctx) -> list[Verdict]:
    """The not-assessed and unknown rows of :func:`inventory` as engine-scope verdicts (status ``not-assessed``,
    ``engine`` "vllm", evidence "shipped by" with the ``vllm/FILE:LINE``)."""
    out = []
    for row in inventory(eng):
        if row["status"] == "assessed":
            continue
        v = Verdict(row["path"], NOT_ASSESSED, scope=SCOPE_ENGINE, host=se.target_host(ctx) if ctx is not None else {},
                    cause=row["why"] or "not judged by this suite")
        v.engine = "vllm"
        v.add("shipped by", f"vllm {eng.version}", row["where"])
        out.append(v)
    for rel, err in se.unparsed(eng.root, (ENVS, f"{CONFIG_DIR}/*.py", f"{COMM_DIR}/*.py", "engine/arg_utils.py")):
        v = Verdict(f"vllm/{rel}", NOT_ASSESSED, scope=SCOPE_ENGINE, host=se.target_host(ctx) if ctx is not None else {},
                    cause=f"not assessed: vllm/{rel} does not parse ({err}), so the settings and paths it declares "
                          "are not listed here")
        v.engine = "vllm"
        out.append(v)
    return out


def report_paths(ctx, eng=None) -> list[dict]:
    """The report's ``paths`` entries for the installed vLLM (``eng``: an edited copy instead): :func:`paths` as JSON;
    [] without vLLM. A reader that cannot enumerate (a source that does not parse, a layout it does not know) gives one
    ``vllm-paths`` row saying so, never an empty list that reads as "nothing unjudged"."""
    from . import engine as vllm_engine

    eng = eng or vllm_engine.installed()
    if eng is None:
        return []
    try:
        rows = paths(eng, ctx)
        if not any(r["kind"] in ("server argument", "environment variable") for r in inventory(eng)):
            raise se.GateNotFound(f"no communication setting found in vllm {eng.version}'s vllm/{CONFIG_DIR}/*.py or "
                                  f"vllm/{ENVS}")
    except (se.GateNotFound, OSError, SyntaxError, ValueError) as e:
        v = Verdict("vllm-paths", NOT_ASSESSED, scope=SCOPE_ENGINE, host=se.target_host(ctx) if ctx is not None else {},
                    cause=f"not assessed: the settings and modules vllm {eng.version} ships could not be enumerated ({e})")
        v.engine = "vllm"
        return [v.to_json()]
    return [v.to_json() for v in rows]
