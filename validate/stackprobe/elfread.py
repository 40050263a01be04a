"""The suite's own ELF reader (standard library only): the section headers, the dynamic section's
``DT_NEEDED`` entries and the dynamic symbol table of a shared object, which is all the environment health
stage and the fatbin coverage need. It travels with the suite, so these checks run in any target
environment, whatever that environment lacks (pyelftools is no dependency of an engine stack).

Layout read here, from the System V ABI's "ELF-64 Object File Format" / gABI chapter 4 (and glibc's
``elf.h``, which spells the same structures):

* file header ``e_ident`` (16 bytes: magic ``\\x7fELF``, class 1 = 32-bit / 2 = 64-bit, data 1 = little /
  2 = big endian), then ``e_shoff`` (section header table offset), ``e_shentsize``, ``e_shnum``,
  ``e_shstrndx`` (the section holding section names); ``e_shnum`` 0 with ``e_shoff`` set means the count is
  in the first section header's ``sh_size`` (and ``e_shstrndx`` 0xffff: in its ``sh_link``);
* section header: ``sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info,
  sh_addralign, sh_entsize`` (types: 2 SYMTAB, 3 STRTAB, 6 DYNAMIC, 8 NOBITS, 11 DYNSYM);
* ``.dynamic`` entries ``(d_tag, d_val)``, ``DT_NEEDED`` = 1, the value an offset into the string table the
  section's ``sh_link`` names;
* ``.dynsym`` entries (64-bit: ``st_name u32, st_info u8, st_other u8, st_shndx u16, st_value u64,
  st_size u64``; 32-bit: ``st_name, st_value, st_size u32, st_info u8, st_other u8, st_shndx u16``);
  binding ``st_info >> 4`` (0 LOCAL, 1 GLOBAL, 2 WEAK), ``st_shndx`` 0 = undefined.

Errors: :class:`ELFReadError` (a ``ValueError``) for a file that is not ELF or whose tables run past its end;
``OSError`` for one that cannot be opened.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass

SHT_NOBITS, SHT_DYNAMIC, SHT_DYNSYM = 8, 6, 11
DT_NULL, DT_NEEDED = 0, 1
STB_GLOBAL, STB_WEAK = 1, 2
SHN_UNDEF = 0


class ELFReadError(ValueError):
    """Not an ELF file, or one whose headers point outside it."""


@dataclass(frozen=True)
class Section:
    """One section header: ``name``, ``type`` (sh_type number), ``offset`` and ``size`` in bytes within the
    file, ``link`` (sh_link: the string table of a symbol or dynamic section), ``entsize``."""

    name: str
    type: int
    offset: int
    size: int
    link: int
    entsize: int


@dataclass(frozen=True)
class Symbol:
    """One dynamic symbol: ``name``, ``bind`` (0 local, 1 global, 2 weak), ``shndx`` (0: undefined here)."""

    name: str
    bind: int
    shndx: int

    @property
    def defined(self) -> bool:
        return self.shndx != SHN_UNDEF


class ELF:
    """An ELF file mapped read-only (``mmap``), closed with :meth:`close` or as a context manager.
    ``header`` holds ``machine`` (e_machine), ``flags`` (e_flags), ``osabi`` (e_ident[7]), ``abiversion``
    (e_ident[8]), ``bits`` (32/64)."""

    def __init__(self, path: str):
        self.path = path
        self._f = open(path, "rb")
        try:
            self._m = mmap.mmap(self._f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError as e:   # an empty file cannot be mapped
            self._f.close()
            raise ELFReadError(f"{path}: empty file, not ELF") from e
        try:
            self._parse_header()
            self.sections = self._read_sections()
        except (struct.error, IndexError) as e:
            self.close()
            raise ELFReadError(f"{path}: truncated or malformed ELF headers ({e})") from e
        except ELFReadError:
            self.close()
            raise

    # -- headers -------------------------------------------------------------------------------------
    def _parse_header(self) -> None:
        m = self._m
        if len(m) < 52 or m[:4] != b"\x7fELF":
            raise ELFReadError(f"{self.path}: not an ELF file (no \\x7fELF magic)")
        cls, data = m[4], m[5]
        if cls not in (1, 2) or data not in (1, 2):
            raise ELFReadError(f"{self.path}: unknown ELF class {cls} / data encoding {data}")
        self.bits = 64 if cls == 2 else 32
        self.end = "<" if data == 1 else ">"
        e = self.end
        if self.bits == 64:
            (self.type, self.machine, _v, _entry, _phoff, self.shoff, self.flags, _eh, _phes, _phn, self.shentsize,
             self.shnum, self.shstrndx) = struct.unpack_from(e + "HHIQQQIHHHHHH", m, 16)
        else:
            (self.type, self.machine, _v, _entry, _phoff, self.shoff, self.flags, _eh, _phes, _phn, self.shentsize,
             self.shnum, self.shstrndx) = struct.unpack_from(e + "HHIIIIIHHHHHH", m, 16)
        self.osabi, self.abiversion = m[7], m[8]
        self.header = {"machine": self.machine, "flags": self.flags, "osabi": self.osabi,
                       "abiversion": self.abiversion, "bits": self.bits}

    def _raw_section(self, i: int) -> tuple:
        fmt = self.end + ("IIQQQQIIQQ" if self.bits == 64 else "IIIIIIIIII")
        off = self.shoff + i * self.shentsize
        if off + struct.calcsize(fmt) > len(self._m):
            raise ELFReadError(f"{self.path}: section header {i} lies past the end of the file")
        return struct.unpack_from(fmt, self._m, off)

    def _read_sections(self) -> list[Section]:
        if not self.shoff:
            return []
        count, strndx = self.shnum, self.shstrndx
        if count == 0 or strndx == 0xFFFF:
            first = self._raw_section(0)
            count = count or first[5]
            strndx = first[6] if strndx == 0xFFFF else strndx
        raw = [self._raw_section(i) for i in range(count)]
        names = raw[strndx] if 0 <= strndx < len(raw) else None
        out = []
        for r in raw:
            name = self._string(names[4], names[5], r[0]) if names else ""
            out.append(Section(name, r[1], r[4], r[5], r[6], r[9]))
        return out

    def _string(self, table_off: int, table_size: int, i: int) -> str:
        start = table_off + i
        if i >= table_size or start >= len(self._m):
            return ""
        stop = self._m.find(b"\0", start, table_off + table_size)
        return self._m[start:stop if stop >= 0 else table_off + table_size].decode("utf-8", "replace")

    # -- queries -------------------------------------------------------------------------------------
    def section(self, name: str) -> Section | None:
        """The first section called ``name`` (``".nv_fatbin"``), or None."""
        return next((s for s in self.sections if s.name == name), None)

    def read(self, offset: int, size: int) -> bytes:
        return self._m[offset:offset + size]

    def needed(self) -> tuple[str, ...]:
        """``DT_NEEDED`` sonames in the order the dynamic section lists them (() without a dynamic section)."""
        dyn = next((s for s in self.sections if s.type == SHT_DYNAMIC), None)
        if dyn is None or dyn.type == SHT_NOBITS:
            return ()
        strtab = self.sections[dyn.link] if dyn.link < len(self.sections) else None
        if strtab is None:
            raise ELFReadError(f"{self.path}: .dynamic links string table {dyn.link}, which does not exist")
        fmt = self.end + ("qQ" if self.bits == 64 else "iI")
        step = struct.calcsize(fmt)
        out = []
        for off in range(dyn.offset, dyn.offset + dyn.size - step + 1, step):
            tag, val = struct.unpack_from(fmt, self._m, off)
            if tag == DT_NULL:
                break
            if tag == DT_NEEDED:
                out.append(self._string(strtab.offset, strtab.size, val))
        return tuple(out)

    def dynamic_symbols(self):
        """Every ``.dynsym`` entry as a :class:`Symbol` (a generator; none without a dynamic symbol table)."""
        sec = next((s for s in self.sections if s.type == SHT_DYNSYM), None)
        if sec is None or sec.link >= len(self.sections):
            return
        strtab = self.sections[sec.link]
        if self.bits == 64:
            fmt, name_i, info_i, shndx_i = self.end + "IBBHQQ", 0, 1, 3
        else:
            fmt, name_i, info_i, shndx_i = self.end + "IIIBBH", 0, 3, 5
        step = sec.entsize or struct.calcsize(fmt)
        if sec.offset + sec.size > len(self._m):
            raise ELFReadError(f"{self.path}: .dynsym runs past the end of the file")
        for off in range(sec.offset + step, sec.offset + sec.size - step + 1, step):   # entry 0 is the null symbol
            r = struct.unpack_from(fmt, self._m, off)
            yield Symbol(self._string(strtab.offset, strtab.size, r[name_i]), r[info_i] >> 4, r[shndx_i])

    def close(self) -> None:
        try:
            self._m.close()
        finally:
            self._f.close()

    def __enter__(self) -> "ELF":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
