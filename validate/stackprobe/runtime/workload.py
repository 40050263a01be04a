"""Workload model: what one decode/verify step asks of the allreduce.

A step of a tensor-parallel transformer does ``layers * allreduces_per_layer`` allreduces of
``tokens * hidden * dtype_bytes`` bytes each (attention output and MLP/MoE output per layer). The Kimi-K2-class
preset (hidden 7168, 61 layers, 2 allreduces per layer, bf16) gives 122 allreduces per verify pass of about 42 KB
each at 3 tokens (43,008 bytes): the seed workload of this project.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class Workload:
    """``hidden``: model hidden size; ``layers``; ``allreduces_per_layer``; ``tokens``: tokens per verify step
    (speculative decoding verifies several); ``dtype``: activation dtype."""

    name: str
    hidden: int
    layers: int
    allreduces_per_layer: int = 2
    tokens: int = 3
    dtype: str = "bfloat16"

    @property
    def message_bytes(self) -> int:
        """Bytes per allreduce: tokens * hidden * dtype size (43,008 for the Kimi-K2 preset at 3 tokens)."""
        return self.tokens * self.hidden * DTYPE_BYTES[self.dtype]

    @property
    def calls_per_step(self) -> int:
        return self.layers * self.allreduces_per_layer

    def with_tokens(self, tokens: int) -> "Workload":
        if tokens < 1:
            raise ValueError(f"tokens per verify step must be >= 1, got {tokens}")
        return Workload(self.name, self.hidden, self.layers, self.allreduces_per_layer, tokens, self.dtype)

    def to_json(self) -> dict:
        d = asdict(self)
        d.update(message_bytes=self.message_bytes, calls_per_step=self.calls_per_step)
        return d


PRESETS = {
    "kimi-k2": Workload("kimi-k2", hidden=7168, layers=61, allreduces_per_layer=2, tokens=3),
}


def preset(name: str, tokens: int | None = None) -> Workload:
    """A preset by name, optionally with another token count. Raises ``ValueError`` naming the presets."""
    if name not in PRESETS:
        raise ValueError(f"unknown workload preset {name!r}; known: {', '.join(sorted(PRESETS))}")
    w = PRESETS[name]
    return w.with_tokens(tokens) if tokens else w


def default_sizes(workload: Workload, largest: int = 16 * 2**20, smallest: int = 64 * 2**10,
                  factor: int = 4) -> list[int]:
    """The sweep: the workload's message size first, then ``smallest * factor**k`` up to ``largest`` (64 KB,
    256 KB, 1 MB, 4 MB, 16 MB by default), bytes."""
    if factor < 2 or smallest < 1:
        raise ValueError(f"sweep factor {factor} / smallest size {smallest}: need factor >= 2 and a positive size")
    sizes = [workload.message_bytes]
    s = smallest
    while s <= largest:
        if s != workload.message_bytes:
            sizes.append(s)
        s *= factor
    return sizes


def latency_at(points: list[tuple[int, float]], nbytes: int) -> float | None:
    """Latency (us) at ``nbytes`` from measured ``(bytes, us)`` points: exact when measured, else log-log
    interpolation between the neighbours; ``None`` outside the measured range."""
    pts = sorted(p for p in points if p[1] and p[1] > 0)
    for b, us in pts:
        if b == nbytes:
            return us
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if b0 < nbytes < b1:
            f = (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0))
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return None


def step_time(workload: Workload, points: list[tuple[int, float]]) -> float | None:
    """Allreduce time per verify step (us) = calls per step * latency at the message size."""
    us = latency_at(points, workload.message_bytes)
    return None if us is None else us * workload.calls_per_step
