"""The verdict model shared by the static and runtime tiers (stdlib only).

A :class:`Verdict` is one backend's answer for one target arch in one environment. It is plain data,
serialised into the versioned JSON report (``stackprobe.REPORT_SCHEMA_VERSION``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# status values
UNBLOCKED = "unblocked"            # works, correct, faster than NCCL Ring at the decode size (runtime)
GATE_PASSES = "gate-passes"        # static tier: every gate admits the target; runtime must still measure
WORKS_SLOWER = "works-but-slower"  # runtime: correct but not faster than the baseline
BLOCKED = "blocked"
SKIPPED = "skipped"
ERROR = "error"
# runtime tier, from the 95% interval of the paired ratio to the baseline (stackprobe.runtime.stats.status)
BASELINE = "baseline"
FASTER = "faster"
PARITY = "parity"
SLOWER = "slower"
INCONCLUSIVE = "inconclusive"
# engine answers in a user's words (what the user gets on the target with the configuration asked about)
ON_BY_DEFAULT = "on-by-default"          # the engine uses it with no flag set
OPT_IN = "opt-in"                        # integrated and admitted on the target once the named flag/variable is set
ON_AS_CONFIGURED = "on-as-configured"    # the configuration asked about sets it, and it serves
STARTUP_FAILURE = "startup-failure-if-set"  # setting the flag makes the server fail at start-up (the raise and its path)
FALLS_BACK = "falls-back-if-set"         # setting the flag is accepted, a check declines, the tensor goes elsewhere
PREEMPTED = "preempted"                  # an earlier path of the engine's dispatch claims the tensor first
NOT_INTEGRATED = "not-integrated"        # the installed engine never references it
NOT_INSTALLED = "not-installed"          # a package it needs is absent
NOT_ASSESSED = "not-assessed"            # a path the engine ships that this suite does not judge (say why)
USER_STATUSES = (ON_BY_DEFAULT, OPT_IN, ON_AS_CONFIGURED, STARTUP_FAILURE, FALLS_BACK, PREEMPTED, NOT_INTEGRATED,
                 NOT_INSTALLED, NOT_ASSESSED)
STATUSES = (UNBLOCKED, GATE_PASSES, WORKS_SLOWER, BLOCKED, SKIPPED, ERROR, BASELINE, FASTER, PARITY, SLOWER,
            INCONCLUSIVE) + USER_STATUSES
#: statuses of a path that would run (a post-pass such as the driver floor or a known-bad release may still close it)
OPEN_STATUSES = (GATE_PASSES, ON_BY_DEFAULT, OPT_IN, ON_AS_CONFIGURED)
#: engine statuses of a path a decode-step tensor does not take, whatever the runtime tier measures of the kernel
CLOSED_STATUSES = (BLOCKED, STARTUP_FAILURE, FALLS_BACK, PREEMPTED, NOT_INTEGRATED, NOT_INSTALLED)
#: each status in a user's words, for headlines and comparisons
USER_WORDS = {ON_BY_DEFAULT: "on by default", OPT_IN: "opt-in", ON_AS_CONFIGURED: "on as configured",
              STARTUP_FAILURE: "start-up failure if set", FALLS_BACK: "falls back if set", PREEMPTED: "preempted",
              NOT_INTEGRATED: "not integrated", NOT_INSTALLED: "not installed", NOT_ASSESSED: "not assessed",
              BLOCKED: "blocked", GATE_PASSES: "gate passes", SKIPPED: "skipped", ERROR: "error"}

# kinds of gate (why something is blocked)
GATE_TOOLCHAIN = "toolchain"          # nvcc too old / missing, arch not supported by the toolkit
GATE_PYTHON = "python-table"          # a Python list/dict/heuristic in the library admits or refuses
GATE_BINARY = "compiled-binary"       # shipped .so lacks SASS/PTX for the target
GATE_TOPOLOGY = "topology"            # needs NVLink / multicast / P2P the host lacks
GATE_CUDA_GRAPH = "cuda-graph"        # fails under CUDA graph capture
GATE_SETTING = "setting"              # an environment variable or flag (NCCL_ALGO ...)
GATE_CRASH = "crash"
GATE_HANG = "hang"
GATE_WRONG = "wrong-result"
GATE_NEEDS_RUNTIME = "needs-runtime"  # static tier cannot decide; GPUs must
GATE_NOT_INSTALLED = "not-installed"
GATE_DRIVER = "driver"                # the host's CUDA driver is below the stack's CUDA floor (R580 for 13.x)
GATE_KNOWN_BAD = "known-bad-release"  # an installed release is listed in stackprobe/data/known_bad.toml
GATE_NOT_INTEGRATED = "not-integrated"  # the installed engine never references the backend
GATE_BROKEN_INSTALL = "broken-install"  # a package it needs is installed but does not load (import error, unmet pin)
GATE_KINDS = (GATE_TOOLCHAIN, GATE_PYTHON, GATE_BINARY, GATE_TOPOLOGY, GATE_CUDA_GRAPH, GATE_SETTING,
              GATE_CRASH, GATE_HANG, GATE_WRONG, GATE_NEEDS_RUNTIME, GATE_NOT_INSTALLED, GATE_DRIVER,
              GATE_KNOWN_BAD, GATE_NOT_INTEGRATED, GATE_BROKEN_INSTALL)

# scope of an answer: does the library admit the target, or will the engine enable it on the target host
SCOPE_LIBRARY = "library"
SCOPE_ENGINE = "engine"
SCOPES = ("", SCOPE_LIBRARY, SCOPE_ENGINE)

# what would lift a block
LIFT_CUDA = "cuda-upgrade"
LIFT_PACKAGE = "package-upgrade"
LIFT_SETTING = "setting"
LIFT_REBUILD = "rebuild-with-arch"
LIFT_NOTHING = "nothing-on-this-topology"
LIFT_NONE_NEEDED = "none-needed"
LIFT_UNKNOWN = "unknown"
LIFT_DRIVER = "driver-upgrade"


@dataclass
class Evidence:
    """One observed fact: where it was read (file/function/command) and the value seen."""

    what: str                 # e.g. "gen_trtllm_comm_module supported majors"
    value: Any                # e.g. [9, 10, 12]
    source: str = ""          # e.g. "flashinfer/jit/comm.py:gen_trtllm_comm_module (ast)"

    def to_json(self) -> dict:
        return asdict(self)


@dataclass
class Verdict:
    """One backend's verdict.

    ``status``: one of :data:`STATUSES`. ``gate``: one of :data:`GATE_KINDS` when blocked/skipped
    (empty when passing). ``cause``: one sentence. ``lift``: one of the ``LIFT_*`` values and
    ``lift_detail`` says concretely what (``flashinfer-python>=0.6.17``, ``NCCL_ALGO=allreduce:tree``).
    ``tier``: "static" or "runtime". ``measurements``: runtime figures (us, GB/s) keyed by name.
    ``scope``: "library" (the library admits the target: code, tables, binaries), "engine" (the
    installed serving engine, SGLang, would enable it on the target host) or "" (older reports).
    ``host``: where a runtime verdict was measured (compute capability, topology, world size, driver,
    torch and NCCL versions); a static verdict's host is the target it was judged for.
    ``engine``: for scope "engine", the serving engine that answers (``sglang``, ``vllm``:
    :data:`stackprobe.engines.ENGINES`); "" in reports made before the engine interface (read as SGLang).
    ``host_risk``: what the box means for a path that maps peer memory, or for NCCL's transport
    (:func:`stackprobe.host.apply`): ``{"level": "risk" | "unassessed" | "unchecked" | "transport", "what", "now",
    "fix", ...}``; {} when the host says nothing about it (and in reports made before the host stage).
    """

    backend: str
    status: str
    tier: str = "static"
    gate: str = ""
    cause: str = ""
    lift: str = ""
    lift_detail: str = ""
    evidence: list[Evidence] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)
    scope: str = ""
    host: dict[str, Any] = field(default_factory=dict)
    engine: str = ""
    host_risk: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown verdict status {self.status!r}; one of {STATUSES}")
        if self.gate and self.gate not in GATE_KINDS:
            raise ValueError(f"unknown gate kind {self.gate!r}; one of {GATE_KINDS}")
        if self.scope not in SCOPES:
            raise ValueError(f"unknown verdict scope {self.scope!r}; one of {SCOPES}")

    @property
    def is_open(self) -> bool:
        """Whether the path would run as judged so far (:data:`OPEN_STATUSES`, or static and waiting for GPUs)."""
        return self.status in OPEN_STATUSES or (self.status == SKIPPED and self.gate == GATE_NEEDS_RUNTIME)

    def add(self, what: str, value: Any, source: str = "") -> "Verdict":
        self.evidence.append(Evidence(what, value, source))
        return self

    def to_json(self) -> dict:
        d = asdict(self)
        d["evidence"] = [e.to_json() for e in self.evidence]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "Verdict":
        known = set(cls.__dataclass_fields__)
        d = {k: v for k, v in d.items() if k in known}
        d["evidence"] = [Evidence(**e) for e in d.get("evidence", [])]
        return cls(**d)


def unassessed_entry(a) -> bool:
    """A "do not set with it" entry that claims nothing: the whole reading failed (``"setting": "not assessed"``, the
    error in ``then``) or one setting's effect was not decided (``"then": ""``, a ``not assessed:`` note)."""
    return isinstance(a, dict) and (a.get("setting") == "not assessed" or (
        not a.get("then") and str(a.get("note", "")).startswith("not assessed")))
