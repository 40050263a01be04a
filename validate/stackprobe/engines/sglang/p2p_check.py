"""SGLang's own P2P check, read from its installed source: does it check P2P before its custom allreduce, or trust
the driver? :func:`sglang_p2p_check` returns ``{"checks": bool, "how": one sentence, "where": [file:line], "turn_on":
what makes it check}`` and raises LookupError when it does not find what it looks for (a release it does not know).
Named by :attr:`stackprobe.engines.sglang.SGLang.p2p_check_ref`; the host stage's verdicts carry the answer
(:func:`stackprobe.host.apply`, ``engine_check``).

Source: SGLang's ``monkey_patch_p2p_access_check`` (sglang 0.5.23 ``srt/utils/common.py:2567-2575``, called from
``srt/distributed/bootstrap.py:124-125`` unless ``--enable-p2p-check``).
"""
from __future__ import annotations

from ...source import matching_lines as _lines


def sglang_p2p_check() -> dict:
    from . import engine as se
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
