"""vLLM as a serving engine of both tiers: its :class:`VLLM` record and the readers of its installed source (this
package: ``engine`` its gates and ``CudaCommunicator.all_reduce``'s dispatch, ``paths`` the settings no verdict
judges, ``p2p_check`` its own P2P check before custom allreduce). It reuses SGLang's source-reading tools
(:mod:`stackprobe.engines.sglang.engine`'s ``Gate`` / ``GateNotFound``, the flag parser, the decode tensor)."""
from __future__ import annotations

from ..base import ServingEngine

class VLLM(ServingEngine):
    """vLLM: :func:`stackprobe.engines.vllm.engine.engine_verdicts` (its own gates and ``CudaCommunicator.all_reduce``'s
    dispatch, read from the installed vLLM); answered once for all its backends (``module`` None)."""

    name, dist, title = "vllm", "vllm", "vLLM"
    runtime_ref = "stackprobe.runtime.dispatch:VLLM"
    p2p_check_ref = f"{__package__}.p2p_check:vllm_p2p_check"

    def __init__(self):
        self._dispatch: dict = {}

    def parse_config(self, server_args, env):
        from . import engine as vllm_engine
        return vllm_engine.parse_config(server_args, env, vllm_engine.installed())

    def answers(self, ctx, module=None) -> list:
        from . import engine as vllm_engine
        verdicts, self._dispatch = vllm_engine.engine_verdicts(ctx)
        return verdicts

    def sections(self, report, ctx) -> dict:
        return {"dispatch": self._dispatch}

    def not_assessed(self, ctx) -> list:
        """:func:`stackprobe.engines.vllm.paths.report_paths` (issue 39 point 6)."""
        from .paths import report_paths
        return report_paths(ctx)
