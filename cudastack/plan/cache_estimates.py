"""What the dry run expects each node to take: building it (the build records of earlier runs at the same hash,
else a source node's unit-cost estimate) or pulling it from the registry node cache (the compressed size its
manifest lists, at a measured or configured rate). Where there is no basis the figure is "no estimate" with the
reason, never a guess.

Sources of each figure:

* **past builds**: every ``<state>/records/build-*.json`` (:mod:`cudastack.build.executor`). A node entry counts when its
  ``hash`` is the planned node's whole hash, its status is "built" and its ``duration_s`` is a positive number of
  seconds; the newest such record wins (records are named by their run id, a UTC timestamp). The same hash means
  the same inputs (:mod:`cudastack.plan.hash`); a figure from another host or builder says which. An entry of the
  hash whose duration is not a positive number, and a file that is not JSON or not a build record, are not used;
  where that leaves no estimate, the reason names them.
* **unit costs** (source and aot nodes only, when no record has the hash): :func:`cudastack.plan.costs.cost_estimate`.
* **measured node times** (when neither of the above gives a figure: the nodes that install wheels or copy files):
  ``cudastack/node_times.yaml``, one measured build of the node per toolchain with what was built, where and when
  (:func:`measured_times`); the figure says it is a measurement of that node, not of this hash.
* **compressed size**: the node's manifest as the registry serves it (``skopeo inspect --raw``,
  :func:`cudastack.registry.digest.skopeo_manifest`): ``config.size`` plus every ``layers[].size`` (OCI image-spec
  "Image Manifest" and Docker "Image Manifest V2, Schema 2": a descriptor's size is the stored blob's byte count,
  i.e. compressed). An index or manifest list is followed to this host's platform. A blob an earlier pulled node
  of the plan brings is counted once; layers this engine already holds are not fetched again, so the figure is an
  upper bound.
* **rate**: ``CUDASTACK_NODE_CACHE_MIBPS`` (MiB/s, a positive number) when set; else the newest record that
  pulled from the same registry host: its pulled nodes' ``downloaded_bytes`` (the sizes the engine reports while
  it downloads the layers, :meth:`cudastack.build.node_cache.NodeCache.restore`) over their ``pull_s``. A run that
  downloaded less than :data:`MIN_MEASURED_BYTES` is no measurement. Else "no past pull measured: size only".
"""
from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from cudastack.core.errors import StackError, UsageError

RATE_ENV = "CUDASTACK_NODE_CACHE_MIBPS"
MIN_MEASURED_BYTES = 1 << 20          # below this a pull's time is its round trips, not its bandwidth
_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json",
                "application/vnd.docker.distribution.manifest.list.v2+json")
Blobs = Union[list, str]              # [(digest, compressed bytes)] of one manifest, or why it could not be read


@dataclass(frozen=True)
class PastBuild:
    """A node built before at the same hash: ``seconds`` it took, the ``record`` file, its ``run`` id, ``host``
    and ``builder`` ("" when built on the run's own engine)."""

    seconds: float
    record: str
    run: str
    host: str
    builder: str = ""


@dataclass(frozen=True)
class PullRate:
    """A pull rate in MiB/s and where it comes from (the environment variable, or a measured run)."""

    mib_s: float
    source: str


@dataclass
class History:
    """What ``<state>/records`` says: ``builds`` {node hash: newest :class:`PastBuild`}, ``rejected`` {node hash:
    why an entry of it was not used}, ``unreadable`` ["file (why)"], ``pulls`` [(record file, run id, registry
    host, downloaded bytes, seconds, nodes)] newest first, and how many ``records`` were read from ``folder``."""

    folder: str
    records: int = 0
    builds: dict = field(default_factory=dict)
    rejected: dict = field(default_factory=dict)
    unreadable: list = field(default_factory=list)
    pulls: list = field(default_factory=list)


def _seconds(value) -> Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    return float(value) if ok else None


def read_history(records_dir: Union[str, Path]) -> History:
    """Read every build record in ``records_dir`` (module doc); a missing folder is an empty history."""
    folder = Path(records_dir)
    hist = History(str(folder))
    files = sorted(folder.glob("build-*.json"), key=lambda p: p.stem.rsplit("-", 1)[-1], reverse=True)
    for f in files:
        try:
            rec = json.loads(f.read_text())
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            hist.unreadable.append(f"{f.name} ({type(exc).__name__})")
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("nodes"), list):
            hist.unreadable.append(f"{f.name} (not a build record: no node list)")
            continue
        hist.records += 1
        run, host = str(rec.get("run_id") or f.stem.rsplit("-", 1)[-1]), str(rec.get("host") or "?")
        got, secs, pulled = 0, 0.0, 0
        for n in rec["nodes"]:
            if not isinstance(n, dict) or not isinstance(n.get("hash"), str):
                continue
            if n.get("status") == "built" and n["hash"] not in hist.builds:
                s = _seconds(n.get("duration_s"))
                if s is None:
                    hist.rejected.setdefault(n["hash"], f"{f.name} says it was built in {n.get('duration_s')!r} s, "
                                                        "not a positive number of seconds")
                else:
                    hist.builds[n["hash"]] = PastBuild(s, f.name, run, host, str(n.get("builder") or ""))
            c = n["cache"] if isinstance(n.get("cache"), dict) else {}
            b, s = c.get("downloaded_bytes"), _seconds(c.get("pull_s"))
            if c.get("status") == "pulled" and isinstance(b, int) and b > 0 and s:
                got, secs, pulled = got + b, secs + s, pulled + 1
        prefix = (rec.get("cache") or {}).get("prefix") if isinstance(rec.get("cache"), dict) else None
        if pulled and got >= MIN_MEASURED_BYTES and isinstance(prefix, str):
            hist.pulls.append((f.name, run, prefix.split("/", 1)[0], got, secs, pulled))
    return hist


def pull_rate(history: History, registry: str, environ=None) -> Optional[PullRate]:
    """The rate a pull from ``registry`` (host[:port]) is expected at (module doc), or None when neither the
    environment nor a record gives one. Raises UsageError for a ``CUDASTACK_NODE_CACHE_MIBPS`` that is not a
    positive number."""
    env = os.environ if environ is None else environ
    raw = (env.get(RATE_ENV) or "").strip()
    if raw:
        try:
            mib_s = float(raw)
        except ValueError:
            mib_s = float("nan")
        if not (math.isfinite(mib_s) and mib_s > 0):
            raise UsageError(f"{RATE_ENV}={raw!r}: give the node cache's pull rate in MiB/s as a positive number "
                             f"(e.g. {RATE_ENV}=95, a rate you measured), or unset it to use the rate the build "
                             "records measured.")
        return PullRate(mib_s, f"{RATE_ENV}={raw}")
    for name, run, host, got, secs, n in history.pulls:
        if host == registry:
            return PullRate(got / secs / 2**20, f"the last measured: {n} pull(s) of run {run}, {_size(got)} in "
                                                f"{_dur(secs)} from {host} ({history.folder}/{name})")
    return None


# ------------------------------------------------------------------------------------------ the manifest
def _host_platform() -> tuple[str, str]:
    m = platform.machine().lower()
    return "linux", {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(m, m)


def manifest_blobs(reference: str, *, creds: Optional[dict] = None, timeout: float = 60.0) -> list:
    """[(digest, compressed bytes)] of the config and every layer of ``reference`` (``REGISTRY/NAME@sha256:...``
    or ``:tag``) as its registry serves the manifest; an index is followed to this host's platform. Raises
    RegistryError / EnvironmentError_ (no skopeo) from the read, UsageError for a manifest without blob sizes."""
    from cudastack.registry.reference import parse_reference
    from cudastack.registry.digest import skopeo_manifest

    ref = parse_reference(reference)
    doc = json.loads(skopeo_manifest(ref, creds=creds, timeout=timeout, why="The pull estimate"))
    if doc.get("mediaType") in _INDEX_TYPES or "manifests" in doc:
        want = _host_platform()
        match = [m for m in doc.get("manifests") or [] if ((m.get("platform") or {}).get("os"),
                                                           (m.get("platform") or {}).get("architecture")) == want]
        if not match:
            raise UsageError(f"{reference} is an index with no manifest for {'/'.join(want)}.")
        doc = json.loads(skopeo_manifest(ref.with_digest(match[0]["digest"]), creds=creds, timeout=timeout,
                                         why="The pull estimate"))
    blobs = [doc.get("config") or {}] + list(doc.get("layers") or [])
    out = [(b.get("digest"), b.get("size")) for b in blobs]
    if len(out) < 2 or any(not isinstance(d, str) or not isinstance(s, int) or s < 0 for d, s in out):
        raise UsageError(f"{reference}: the manifest lists no config and layers with sizes (schema 1?).")
    return out


def read_blobs(cache, plan, remote: dict) -> dict:
    """{node name: Blobs} for every node of ``plan`` that ``remote`` (from :meth:`NodeCache.probe_plan`) says the
    node cache ``cache`` serves, read by digest. A failed read is the reason, as text."""
    from cudastack.registry.client import parse_reference
    from cudastack.registry.login import registry_credentials

    out: dict = {}
    for node in plan.nodes:
        digest = remote.get(node.name)
        if not digest:
            continue
        ref = parse_reference(cache.target(node)).with_digest(digest)
        try:
            out[node.name] = manifest_blobs(ref.pinned(), creds=registry_credentials(ref.registry))
        except StackError as exc:
            out[node.name] = str(exc)
    return out


@dataclass(frozen=True)
class MeasuredTime:
    """One measured build of a whole node (``cudastack/node_times.yaml``): ``seconds``, ``what`` was built and
    ``where`` (the builder and the source of the figure)."""

    seconds: float
    what: str
    where: str


NODE_TIMES = Path(__file__).resolve().parents[1] / "node_times.yaml"


def measured_times(toolchain: str, path: Union[str, Path] = NODE_TIMES) -> dict:
    """{node name: :class:`MeasuredTime`} of ``toolchain`` from ``path``. Raises StackError naming the entry
    when one is malformed (a toolchain or node that is not a string, seconds that are not a positive number, an
    empty ``what`` or ``where``)."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise StackError(f"{path}: cannot read the measured node times ({exc}).") from None
    out = {}
    for i, e in enumerate(data.get("nodes") or []):
        ok = (isinstance(e, dict) and isinstance(e.get("toolchain"), str) and isinstance(e.get("node"), str)
              and _seconds(e.get("seconds")) is not None and str(e.get("what") or "").strip()
              and str(e.get("where") or "").strip())
        if not ok:
            raise StackError(f"{path} nodes[{i}]: give toolchain and node (strings), seconds (a positive number), "
                             f"what and where (what was built, on which builder, from which source); got {e!r}.")
        if e["toolchain"] == toolchain:
            out[e["node"]] = MeasuredTime(float(e["seconds"]), str(e["what"]), str(e["where"]))
    return out


@dataclass
class Basis:
    """What the dry run's time lines rest on: the records' ``history``, the pull ``rate`` (None: none known),
    the ``blobs`` {node name: Blobs} of the nodes in the registry cache and the ``measured`` node times {node
    name: MeasuredTime} of the plan's toolchain."""

    history: History
    rate: Optional[PullRate] = None
    blobs: dict = field(default_factory=dict)
    measured: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ the lines
def _dur(seconds: float) -> str:
    if seconds < 60:
        return "under 0.1 s" if seconds < 0.05 else f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    h, rem = divmod(int(round(seconds)), 3600)
    return f"{h} h {rem // 60:02d} min" if h else f"{rem // 60} min {rem % 60:02d} s"


def _size(n: float) -> str:
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.2f} {unit}"
    return f"{int(n)} B"


def build_expectation(node, history: History, unit_seconds: Optional[float],
                      measured: Optional[MeasuredTime] = None) -> tuple[Optional[float], str]:
    """(seconds or None, the text after "build") for building ``node``: a past build at its hash, else
    ``unit_seconds`` (the unit-cost estimate of a source node), else ``measured`` (a measured build of the node,
    cudastack/node_times.yaml), else "no estimate" and why. The text names its basis."""
    past = history.builds.get(node.hash)
    if past is not None:
        where = f"on host {past.host}" + (f", builder {past.builder}" if past.builder else "")
        return past.seconds, (f"about {_dur(past.seconds)}: built in that time at this hash in run {past.run} "
                              f"{where} ({history.folder}/{past.record})")
    why = [f"no past build of this hash in {history.folder} ({history.records} record(s) read)"]
    if node.hash in history.rejected:
        why.append(f"{history.rejected[node.hash]}: not used")
    if history.unreadable:
        why.append(f"unreadable: {', '.join(history.unreadable)}")
    if unit_seconds is not None:
        return unit_seconds, (f"about {_dur(unit_seconds)}: the unit-cost estimate (cudastack/unit_costs.yaml; "
                              f"{'; '.join(why)})")
    if measured is not None:
        return measured.seconds, (f"about {_dur(measured.seconds)}: a measured build of this node, not of this hash "
                                  f"({measured.what}; {measured.where}; cudastack/node_times.yaml)")
    if getattr(node, "method", "") in ("source", "aot"):
        why.append("its unit count is unknown until the source is fetched")
    else:
        why.append(f"no unit-cost estimate for {'an' if node.kind[0] in 'aeiou' else 'a'} {node.kind} node")
    return None, f"no estimate ({'; '.join(why)})"


def pull_expectation(blobs: Optional[Blobs], seen: set, rate: Optional[PullRate]) -> tuple[Optional[float], int, str]:
    """(seconds or None, bytes counted, the text after "pull") for pulling a node whose manifest lists ``blobs``;
    ``seen``: digests of blobs earlier pulled nodes bring (updated here)."""
    if blobs is None:
        return None, 0, "no estimate (the manifest was not read)"
    if isinstance(blobs, str):
        return None, 0, f"no estimate (the manifest's size could not be read: {blobs})"
    uniq = dict(blobs)
    total, new = sum(uniq.values()), sum(s for d, s in uniq.items() if d not in seen)
    seen.update(uniq)
    size = (f"the manifest's {_size(total)} compressed" if new == total else
            f"{_size(new)} of the manifest's {_size(total)} compressed (the rest comes with an earlier pulled node)")
    if rate is None:
        return None, new, (f"no estimate (no past pull measured: size only, {size}; set {RATE_ENV} to a rate you "
                           "measured)")
    secs = new / (rate.mib_s * 2**20)
    return secs, new, f"about {_dur(secs)}: {size} at {rate.mib_s:.1f} MiB/s, {rate.source}"


def summary(built: list, pulled: list, pulled_bytes: int) -> str:
    """The dry run's closing line on time: ``built`` and ``pulled`` are [(node name, seconds or None)]."""
    def part(verb: str, items: list) -> str:
        known = [s for _, s in items if s is not None]
        missing = [n for n, s in items if s is None]
        head = f"about {_dur(sum(known))} for {len(known)} node(s)" if known else "no estimate"
        return f"{verb} {head}" + (f" ({len(missing)} without an estimate: {', '.join(missing)})"
                                   if missing and known else f" for {', '.join(missing)}" if missing else "")
    parts = ([part("building", built)] if built else []) + (
        [part("pulling", pulled) + f", up to {_size(pulled_bytes)} compressed"] if pulled else [])
    return "Expected time: " + ("; ".join(parts) if parts else "none: no node is built or pulled") + "."
