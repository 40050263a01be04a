"""The engines' own P2P checks, read from their installed source: does the engine check P2P before its custom
allreduce, or trust the driver? Each reader returns ``{"checks": bool, "how": one sentence, "where": [file:line],
"turn_on": what makes it check}`` and raises LookupError when it does not find what it looks for (a release it does not
know). The serving engines name theirs (:attr:`stackprobe.engines.ServingEngine.p2p_check_ref`); the host stage's
verdicts carry the answer (:func:`stackprobe.host.apply`, ``engine_check``).

Sources: SGLang's ``monkey_patch_p2p_access_check`` (sglang 0.5.23 ``srt/utils/common.py:2567-2575``, called from
``srt/distributed/bootstrap.py:124-125`` unless ``--enable-p2p-check``); vLLM's ``VLLM_SKIP_P2P_CHECK`` (``envs.py``) and
``_can_p2p`` (``distributed/device_communicators/custom_all_reduce.py``).
"""
from __future__ import annotations

import re
from pathlib import Path


def _lines(root: Path, rel: str, pattern: str) -> list[tuple[int, str]]:
    p = root / rel
    if not p.is_file():
        raise LookupError(f"{root.name}/{rel} does not exist in the installed release")
    rx = re.compile(pattern)
    return [(i, ln.strip()) for i, ln in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if rx.search(ln)]


def sglang_p2p_check() -> dict:
    from . import sglang_engine as se
    eng = se.installed()
    if eng is None:
        return {"error": "sglang is not installed"}
    call = []
    for rel in ("srt/distributed/bootstrap.py", "srt/model_executor/model_runner.py"):
        if (eng.root / rel).is_file():
            call += [(rel, i, t) for i, t in _lines(eng.root, rel, r"monkey_patch_p2p_access_check\(\)")]
    if not call:
        raise LookupError(f"sglang {eng.version}: no call of monkey_patch_p2p_access_check() in srt/distributed/"
                          "bootstrap.py or srt/model_executor/model_runner.py")
    try:
        arg = se.server_argument(eng, ("--enable-p2p-check",))
    except se.GateNotFound as exc:
        raise LookupError(str(exc)) from exc
    skip = _lines(eng.root, "srt/distributed/device_communicators/custom_all_reduce_utils.py", r"SGLANG_SKIP_P2P_CHECK")
    rel, line, _ = call[0]
    where = [f"sglang/{rel}:{line}", arg.get("default_where") or arg.get("where", "")]
    if skip:
        where.append(f"sglang/srt/distributed/device_communicators/custom_all_reduce_utils.py:{skip[0][0]}")
    if arg.get("default") is False:
        return {"checks": False, "where": where, "turn_on": "--enable-p2p-check",
                "how": f"SGLang {eng.version} does not check P2P by default: --enable-p2p-check is off, and without it "
                       f"sglang/{rel}:{line} replaces gpu_p2p_access_check with one that answers True for every pair; "
                       "with --enable-p2p-check it runs a P2P data test in child processes (cached per "
                       "CUDA_VISIBLE_DEVICES), which need not notice an ACS or IOMMU detour; SGLANG_SKIP_P2P_CHECK=1 "
                       "replaces either with the driver's answer for the first peer; the check guards custom "
                       "allreduce only, not PCIe IPC"}
    return {"checks": True, "where": where, "turn_on": "",
            "how": f"SGLang {eng.version} runs its data-checked P2P test before custom allreduce (--enable-p2p-check "
                   "is on by default)"}


def vllm_p2p_check() -> dict:
    from . import vllm_engine as ve
    eng = ve.installed()
    if eng is None:
        return {"error": "vllm is not installed"}
    try:
        on, raw, where = ve.env_default(eng, "VLLM_SKIP_P2P_CHECK")
    except ve.GateNotFound as exc:
        raise LookupError(str(exc)) from exc
    fn = _lines(eng.root, "distributed/device_communicators/custom_all_reduce.py", r"def _can_p2p\(")
    if not fn:
        raise LookupError(f"vllm {eng.version}: no _can_p2p in distributed/device_communicators/custom_all_reduce.py")
    w = [where.split(" ")[0], f"vllm/distributed/device_communicators/custom_all_reduce.py:{fn[0][0]}"]
    if on:
        return {"checks": False, "where": w, "turn_on": "VLLM_SKIP_P2P_CHECK=0",
                "how": f"vLLM {eng.version} trusts the driver here: VLLM_SKIP_P2P_CHECK defaults to \"{raw}\" "
                       f"({w[0]}), so _can_p2p ({w[1]}) returns torch.cuda.can_device_access_peer, which answers True "
                       "on the hosts that hang; VLLM_SKIP_P2P_CHECK=0 makes it run its data-checked test"}
    return {"checks": True, "where": w, "turn_on": "",
            "how": f"vLLM {eng.version} runs its data-checked P2P test (VLLM_SKIP_P2P_CHECK defaults to \"{raw}\")"}
