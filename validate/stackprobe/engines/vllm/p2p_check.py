"""vLLM's own P2P check, read from its installed source: does it check P2P before its custom allreduce, or trust the
driver? :func:`vllm_p2p_check` returns the dict :func:`stackprobe.engines.sglang.p2p_check.sglang_p2p_check`
describes and raises LookupError on a release it does not know. Named by
:attr:`stackprobe.engines.vllm.VLLM.p2p_check_ref`.

Source: vLLM's ``VLLM_SKIP_P2P_CHECK`` (``envs.py``) and ``_can_p2p``
(``distributed/device_communicators/custom_all_reduce.py``).
"""
from __future__ import annotations

from ...source import matching_lines as _lines


def vllm_p2p_check() -> dict:
    from . import engine as ve
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
