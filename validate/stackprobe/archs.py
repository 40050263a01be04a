"""Compute-capability arithmetic shared by the build side and the validation suite (stdlib only).

An *arch spec* is what users type: ``12.0``, ``12.0a``, ``12.0f``, ``120``, ``sm_120a``,
``compute_120f``, ``12.0+PTX``. It parses to :class:`Arch` (major, minor, suffix, ptx).

Compatibility rules (NVIDIA CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility";
CUDA 12.8/12.9 release notes; NVIDIA technical blog "NVIDIA Blackwell and NVIDIA CUDA 12.9 Introduce
Family-Specific Architecture Features"):

* no suffix: "a cubin object generated for compute capability X.y will only execute on devices of compute
  capability X.z where z >= y" (binary compatibility within a major, upward in the minor);
* ``a`` (architecture-specific): runs only on exactly that compute capability, unlocks arch-specific
  instructions; exists since CUDA 12.0 for sm_90a, 12.8 for sm_100a/sm_120a;
* ``f`` (family-specific): runs on the same major with equal or higher minor (the family); exists
  from CUDA 12.9;
* PTX: plain PTX JIT-compiles for any equal or higher compute capability, ``f`` PTX within its
  family, ``a`` PTX only on its own compute capability; the driver must know the PTX ISA version
  (see :mod:`stackprobe.driver`).

Which toolkit supports which arch is *data* (``recipes/toolchains.yaml``), handed in by the caller;
inside an image the suite asks the installed nvcc (``nvcc --list-gpu-code``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_SPEC = re.compile(
    r"^(?:(?P<kind>sm|compute)_)?(?P<major>\d{1,3})(?:\.(?P<minor>\d))?(?P<suffix>[af])?(?P<ptx>\+PTX)?$",
    re.IGNORECASE,
)


class ArchSpecError(ValueError):
    """Raised for an arch spec that is not a compute capability; the message lists valid forms."""


@dataclass(frozen=True, order=True)
class Arch:
    """One target compute capability. ``major``/``minor`` as in ``torch.cuda.get_device_capability()``."""

    major: int
    minor: int
    suffix: str = ""  # "", "a" or "f"
    ptx: bool = False  # also embed PTX (TORCH_CUDA_ARCH_LIST "12.0+PTX")

    # --- spellings -----------------------------------------------------------------------------
    @property
    def cc(self) -> str:
        """``"12.0"``: the plain compute capability, as TORCH_CUDA_ARCH_LIST writes it."""
        return f"{self.major}.{self.minor}"

    @property
    def number(self) -> int:
        """``120``: the integer nvcc uses in ``sm_120``."""
        return self.major * 10 + self.minor

    @property
    def sm(self) -> str:
        """``"sm_120a"``: the SASS target name, suffix included."""
        return f"sm_{self.number}{self.suffix}"

    @property
    def compute(self) -> str:
        """``"compute_120a"``: the virtual (PTX) target name, suffix included."""
        return f"compute_{self.number}{self.suffix}"

    def gencode(self) -> str:
        """nvcc ``-gencode`` argument producing SASS (and PTX when ``ptx``), e.g.
        ``arch=compute_120a,code=[sm_120a,compute_120a]``."""
        codes = [self.sm] + ([self.compute] if self.ptx else [])
        code = codes[0] if len(codes) == 1 else "[" + ",".join(codes) + "]"
        return f"arch={self.compute},code={code}"

    def with_suffix(self, suffix: str) -> "Arch":
        return Arch(self.major, self.minor, suffix, self.ptx)

    def __str__(self) -> str:
        return f"{self.cc}{self.suffix}{'+PTX' if self.ptx else ''}"

    # --- compatibility -------------------------------------------------------------------------
    def sass_runs_on(self, device: "Arch") -> bool:
        """Whether SASS built for ``self`` (this is the *code* target) runs on a GPU of compute
        capability ``device`` (its suffix is ignored): :meth:`sass_level` is not None."""
        return self.sass_level(device) is not None

    def sass_level(self, device: "Arch") -> str | None:
        """How SASS for ``self`` runs on ``device``: ``"exact"`` (same compute capability, any suffix),
        ``"family"`` (an ``f`` cubin of the same major, lower minor), ``"same-major"`` (a plain cubin of the
        same major, lower minor: NVIDIA's binary compatibility rule X.y -> X.z, z >= y), or None (does not
        run: another major, a higher minor, or an ``a`` cubin of another compute capability).
        Source: CUDA C++ Programming Guide, "Binary Compatibility"; CUDA 12.9 family-specific targets."""
        if self.major != device.major:
            return None
        if device.minor == self.minor:
            return "exact"
        if device.minor < self.minor or self.suffix == "a":
            return None
        return "family" if self.suffix == "f" else "same-major"

    def ptx_jits_on(self, device: "Arch") -> bool:
        """Whether PTX for ``self`` can be JIT-compiled by the driver for ``device``.
        Plain PTX is forward compatible (any higher compute capability); ``a`` PTX only on the exact
        one; ``f`` PTX on the same family."""
        if self.suffix == "a":
            return (self.major, self.minor) == (device.major, device.minor)
        if self.suffix == "f":
            return self.major == device.major and device.minor >= self.minor
        return (device.major, device.minor) >= (self.major, self.minor)


VALID_FORMS = "12.0, 12.0a, 12.0f, 12.0+PTX, 120, sm_120, sm_120a, compute_120f"


def parse_arch(spec: str) -> Arch:
    """Parse one arch spec (see module doc). Raises :class:`ArchSpecError` naming the valid forms."""
    text = str(spec).strip()
    m = _SPEC.match(text)
    if not m:
        raise ArchSpecError(
            f"'{spec}' is not a compute capability. Write it as one of: {VALID_FORMS} "
            f"(for an RTX PRO 6000 Blackwell / RTX 50xx that is 12.0)."
        )
    major = int(m.group("major"))
    minor = m.group("minor")
    if minor is None:
        # "120" -> 12.0, "90" -> 9.0, "100" -> 10.0
        digits = m.group("major")
        if len(digits) < 2:
            raise ArchSpecError(f"'{spec}' is ambiguous: write the minor too (for example {digits}.0). Valid forms: {VALID_FORMS}.")
        major, minor = int(digits[:-1]), int(digits[-1])
    else:
        minor = int(minor)
    suffix = (m.group("suffix") or "").lower()
    return Arch(major, int(minor), suffix, bool(m.group("ptx")))


def parse_arch_list(specs: str | list[str]) -> list[Arch]:
    """Parse a list written with ``;``, ``,`` or spaces (TORCH_CUDA_ARCH_LIST style) or a Python list."""
    if isinstance(specs, str):
        items = [s for s in re.split(r"[;,\s]+", specs) if s]
    else:
        items = [str(s) for s in specs]
    return [parse_arch(s) for s in items]


def version_tuple(version: str) -> tuple[int, ...]:
    """``"13.1.1"`` -> ``(13, 1, 1)``; ignores non-numeric tails."""
    out = []
    for part in str(version).split("."):
        digits = re.match(r"\d+", part)
        if not digits:
            break
        out.append(int(digits.group()))
    return tuple(out)


def cuda_wheel_release(name: str, version: str) -> str:
    """The CUDA release ("13.0") a CUDA toolkit component wheel belongs to. Most carry it in their first two
    numbers (nvidia-cuda-nvcc 13.0.88 is CUDA 13.0). From CUDA 13.4 the nvidia-cuda-cccl wheel is versioned
    ``13.3.<CCCL minor>.<CCCL patch>.<build>``: 13.3.4.2.1 is CCCL 3.4.2 of CUDA 13.4, 13.3.5.0.6 is CCCL 3.5.0
    of CUDA 13.5 (CUDA 13.4 and 13.5 release notes, Table 1 "Component Versions": CCCL 3.N ships with
    CUDA 13.N), so its release is 13.<CCCL minor>."""
    parts = str(version).split(".")
    if name.replace("_", "-").lower().startswith("nvidia-cuda-cccl") and len(parts) == 5 and parts[:2] == ["13", "3"]:
        return f"13.{parts[2]}"
    return ".".join(parts[:2])
