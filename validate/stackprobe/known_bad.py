"""Known-bad releases as data: ``stackprobe/data/known_bad.toml`` (format described in the file), read
with the standard library's ``tomllib`` (Python >= 3.11) and matched against the installed versions, the
target compute capability and the topology, and against the conditions an entry may carry (case C59):
environment variables, world size, host driver range and the message sizes where it bites, these last set
against the workload's allreduce sizes (:mod:`stackprobe.runtime.workload`). Verdicts cite the matching entry's
``id`` and ``source``, and its condition as it applies on this box (:meth:`KnownBad.describe`).
"""
from __future__ import annotations

import operator
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .archs import parse_arch, version_tuple

DATA = Path(__file__).with_name("data") / "known_bad.toml"
_OPS = (("<=", operator.le), (">=", operator.ge), ("==", operator.eq), ("!=", operator.ne),
        ("<", operator.lt), (">", operator.gt))
REQUIRED = ("id", "package", "versions", "symptom", "fixed_in", "source")


class KnownBadError(ValueError):
    """The data file is malformed; the message names the entry and the field."""


@dataclass(frozen=True)
class KnownBad:
    """One entry of the data file (see its header for the fields)."""

    id: str
    package: str
    versions: str
    symptom: str
    fixed_in: str
    source: str
    archs: tuple = ()
    topology: str = ""
    backends: tuple = field(default_factory=tuple)
    env: tuple = ()              # ((variable, value), ...): all must be set so
    world_size: str = ""         # comparisons, as versions: "==2", ">=2"
    driver: str = ""             # host driver range: "<580"
    message_bytes: str = ""      # where it bites: ">=524288"
    workaround: str = ""

    def applies(self, version: str | None, target=None, topology: str = "", context: dict | None = None) -> bool:
        """Whether this entry applies to ``version`` of its package on ``target`` (an Arch or "12.0")
        and ``topology`` ("pcie" / "nvlink"), under ``context`` ({"env": mapping (default ``os.environ``: the suite
        runs in the target environment), "world_size": int | None, "driver": version | None}). A condition whose
        value is not known here (no driver, no world size) does not rule the entry out; :meth:`condition` says so."""
        if not version or not version_matches(version, self.versions):
            return False
        if self.archs and target is not None:
            cc = parse_arch(target).cc if isinstance(target, str) else target.cc
            if cc not in {parse_arch(a).cc for a in self.archs}:
                return False
        if self.topology and topology and self.topology != topology:
            return False
        ctx = context or {}
        env: dict | os._Environ = ctx["env"] if ctx.get("env") is not None else os.environ
        if any(env.get(k) != v for k, v in self.env):
            return False
        if self.world_size and ctx.get("world_size") and not version_matches(str(ctx["world_size"]), self.world_size):
            return False
        if self.driver and ctx.get("driver") and not version_matches(str(ctx["driver"]), self.driver):
            return False
        return True

    def condition(self, context: dict | None = None) -> str:
        """The entry's conditions as they stand on this box: "NCCL_P2P_DISABLE=1 (set here), world size ==2 (2 here),
        messages >=524288 B (512 KiB): decode's 43,008 B allreduce is below it; prefill's reach it from 37 tokens"
        ("" for an entry without conditions)."""
        ctx = context or {}
        parts = [f"{k}={v} (set here)" for k, v in self.env]
        if self.world_size:
            ws = ctx.get("world_size")
            parts.append(f"world size {self.world_size} ({ws} here)" if ws else
                         f"world size {self.world_size} (not known here: it applies if so)")
        if self.driver:
            d = ctx.get("driver")
            parts.append(f"driver {self.driver} ({d} here)" if d else f"driver {self.driver} (no driver here to compare)")
        if self.message_bytes:
            parts.append(sizes_against_workload(self.message_bytes, ctx.get("workload")))
        return "; ".join(parts)

    def describe(self, version: str, context: dict | None = None) -> str:
        cond = self.condition(context)
        return (f"{self.package} {version} is a known-bad release ({self.id}){' when ' + cond if cond else ''}: "
                f"{self.symptom}; fixed in {self.fixed_in}"
                + (f"; workaround: {self.workaround}" if self.workaround else "") + f" [{self.source}]")

    def lift(self) -> str:
        """What lifts it: ``<package> >= fixed_in``, or the workaround where no fixed release is named."""
        name = "NCCL" if self.package == "nccl" else self.package
        return (f"{name} >= {self.fixed_in}" if self.fixed_in[:1].isdigit() else (self.workaround or self.fixed_in))


def sizes_against_workload(spec: str, workload=None) -> str:
    """The size condition ``spec`` (bytes, ">=524288") against the workload's allreduce sizes: the decode step's
    message (tokens x hidden x dtype bytes, :class:`stackprobe.runtime.workload.Workload`; the kimi-k2 preset by
    default) and the prefill token count from which a prefill's message meets it."""
    from .runtime.workload import DTYPE_BYTES, preset

    w = workload or preset("kimi-k2")
    per_token = w.hidden * DTYPE_BYTES[w.dtype]
    decode = w.message_bytes
    text = f"messages {spec} B"
    low = next((int(p.strip()[2:]) for p in spec.split(",") if p.strip().startswith(">=")), None)
    if low is None:
        low = next((int(p.strip()[1:]) + 1 for p in spec.split(",") if p.strip().startswith(">")), None)
    if low:
        text += f" ({low / 1024:g} KiB and more)"
    hits = version_matches(str(decode), spec)
    text += (f": {w.name}'s decode allreduce ({decode:,} B at {w.tokens} tokens) is "
             + ("inside it" if hits else "below it" if low and decode < low else "outside it"))
    if low:
        text += f"; a prefill's reaches it from {-(-low // per_token)} tokens (hidden {w.hidden}, {w.dtype})"
    return text


def version_matches(version: str, spec: str) -> bool:
    """``version`` ("2.25.1") against ``spec`` ("<2.26.2", ">=0.6.0,<0.6.17"); numeric parts only.
    Raises KnownBadError for a comparison without an operator."""
    v = version_tuple(version)
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        for sym, op in _OPS:
            if part.startswith(sym):
                ref = version_tuple(part[len(sym):].strip())
                n = max(len(v), len(ref))
                if not op(v + (0,) * (n - len(v)), ref + (0,) * (n - len(ref))):
                    return False
                break
        else:
            raise KnownBadError(f"version comparison {part!r} has no operator: write it as <X, <=X, >=X, >X, ==X or !=X")
    return True


def load(path: str | Path = DATA) -> list[KnownBad]:
    """The entries of the data file. Raises KnownBadError naming the entry and field that is wrong."""
    with open(path, "rb") as f:
        try:
            data = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise KnownBadError(f"{path}: not valid TOML: {e}") from e
    out = []
    for i, raw in enumerate(data.get("release", [])):
        missing = [k for k in REQUIRED if not raw.get(k)]
        if missing:
            raise KnownBadError(f"{path}: [[release]] #{i + 1} ({raw.get('id', 'no id')}) lacks {', '.join(missing)}")
        unknown = set(raw) - set(KnownBad.__dataclass_fields__)
        if unknown:
            raise KnownBadError(f"{path}: [[release]] {raw['id']} has unknown fields {sorted(unknown)}")
        version_matches("0", raw["versions"])       # raises on a malformed comparison
        for a in raw.get("archs", []):
            parse_arch(a)
        for k in ("world_size", "driver", "message_bytes"):
            if raw.get(k):
                version_matches("0", raw[k])   # raises on a malformed comparison
        env = raw.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise KnownBadError(f"{path}: [[release]] {raw['id']}: env must be a table of variable = \"value\" strings")
        out.append(KnownBad(raw["id"], raw["package"], raw["versions"], raw["symptom"], raw["fixed_in"], raw["source"],
                            tuple(raw.get("archs", ())), raw.get("topology", ""), tuple(raw.get("backends", ())),
                            tuple(sorted(env.items())), raw.get("world_size", ""), raw.get("driver", ""),
                            raw.get("message_bytes", ""), raw.get("workaround", "")))
    return out


def matches(package: str, version: str | None, target=None, topology: str = "", backend: str = "",
            entries: list[KnownBad] | None = None, context: dict | None = None) -> list[KnownBad]:
    """Entries for ``package`` at ``version`` that apply on ``target``/``topology`` (and list ``backend``
    when given) under ``context`` (:meth:`KnownBad.applies`)."""
    entries = load() if entries is None else entries
    return [e for e in entries if e.package == package and (not backend or not e.backends or backend in e.backends)
            and e.applies(version, target, topology, context)]
