"""Known-bad releases as data: ``stackprobe/data/known_bad.toml`` (format described in the file), read
with the standard library's ``tomllib`` (Python >= 3.11) and matched against the installed versions, the
target compute capability and the topology. Verdicts cite the matching entry's ``id`` and ``source``.
"""
from __future__ import annotations

import operator
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

    def applies(self, version: str | None, target=None, topology: str = "") -> bool:
        """Whether this entry applies to ``version`` of its package on ``target`` (an Arch or "12.0")
        and ``topology`` ("pcie" / "nvlink")."""
        if not version or not version_matches(version, self.versions):
            return False
        if self.archs and target is not None:
            cc = parse_arch(target).cc if isinstance(target, str) else target.cc
            if cc not in {parse_arch(a).cc for a in self.archs}:
                return False
        if self.topology and topology and self.topology != topology:
            return False
        return True

    def describe(self, version: str) -> str:
        return (f"{self.package} {version} is a known-bad release ({self.id}): {self.symptom}; "
                f"fixed in {self.fixed_in} [{self.source}]")


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
        out.append(KnownBad(raw["id"], raw["package"], raw["versions"], raw["symptom"], raw["fixed_in"], raw["source"],
                            tuple(raw.get("archs", ())), raw.get("topology", ""), tuple(raw.get("backends", ()))))
    return out


def matches(package: str, version: str | None, target=None, topology: str = "", backend: str = "",
            entries: list[KnownBad] | None = None) -> list[KnownBad]:
    """Entries for ``package`` at ``version`` that apply on ``target``/``topology`` (and list ``backend``
    when given)."""
    entries = load() if entries is None else entries
    return [e for e in entries if e.package == package and (not backend or not e.backends or backend in e.backends)
            and e.applies(version, target, topology)]
