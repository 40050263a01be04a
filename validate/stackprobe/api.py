"""The validate half's public interface for the build half: ``cudastack/`` imports :mod:`stackprobe` only through
this module (``tests/test_module_structure.py`` holds it to that). It re-exports; the code stays where it lives.

``import stackprobe.api`` uses the standard library only and loads two small base modules (:mod:`stackprobe.atomic`,
:mod:`stackprobe.archs`); every other name is imported from its module on first use (a module-level
``__getattr__``), so a build-half command that only writes a file or reads an arch does not load the suite.

Files, written atomically (:mod:`stackprobe.atomic`)

* ``write_atomic(path, data) -> Path``: replace ``path`` with ``data`` (``str`` as UTF-8, or bytes): a temp file
  beside it, fsync'ed, given the umask's mode, renamed over it; creates parent folders. Raises OSError, after
  removing the temp file; ``path`` then keeps its old bytes.
* ``atomic_path(path)``: context manager yielding a temp ``Path`` beside ``path`` for the caller to write; moved
  over ``path`` when the block ends without an exception, removed when it raises.

Compute capabilities (:mod:`stackprobe.archs`)

* ``Arch``: one target compute capability, a frozen ordered dataclass (``major``, ``minor`` as in
  ``torch.cuda.get_device_capability()``, ``suffix`` ``""`` / ``"a"`` / ``"f"``, ``ptx``).
* ``ArchSpecError`` (ValueError): an arch spec that is not a compute capability; the message lists valid forms.
* ``parse_arch(spec) -> Arch``: one spec (``12.0``, ``12.0a``, ``12.0f``, ``120``, ``sm_120a``, ``compute_120f``,
  ``12.0+PTX``). Raises ArchSpecError.
* ``parse_arch_list(specs) -> list[Arch]``: a list written with ``;``, ``,`` or spaces, or a Python list.
* ``version_tuple(version) -> tuple[int, ...]``: ``"13.1.1"`` -> ``(13, 1, 1)``; non-numeric tails ignored.
* ``cuda_wheel_release(name, version) -> str``: the CUDA release (``"13.0"``) a CUDA toolkit component wheel
  belongs to (nvidia-cuda-cccl from 13.4 is versioned by CCCL; see the function).

Serving engines (:mod:`stackprobe.engines`)

* ``engine_choices() -> tuple[str, ...]``: the ``--engine`` values, ``"auto"`` and every registered engine's
  name, read from the registry when called.

Reports (:mod:`stackprobe.report`, :mod:`stackprobe.statusplot`, :mod:`stackprobe.health_stage`)

* ``Report``: one suite run (``Report.from_json(dict)``, ``.to_json()``, ``.to_markdown()``, ``.write_json(path)``).
* ``ReportError`` (ValueError): a JSON document that is not a stackprobe report, or has an unknown schema.
* ``comparison_markdown(reports, labels=None) -> str``: the comparison matrix of several reports, one row per
  backend, one status column per report.
* ``suite_digest(root=<this suite>) -> str``: ``"sha256:<hex>"`` over the suite's ``*.py`` files, naming which
  suite produced a result.
* ``write_beside(reports, labels, markdown_path) -> str``: draw the comparison as ``<markdown_path>.png`` and return
  the Markdown to open the comparison with (a no-plot note, and no PNG, when matplotlib is not installed).
* ``health_errors(health) -> list[dict]``: the environment health findings of level ``"error"`` in a report's
  ``environment["health"]`` (``None`` -> ``[]``): what ``--strict`` fails on.

The static tier over released packages laid out as folders (:mod:`stackprobe.site`), for the radar

* ``site_run(roots, target="12.0", *, world_size=8, topology="pcie", engine="auto", toolkit=None, ...) -> dict``:
  the static tier over the site ``roots`` (folders, first wins, as on ``sys.path``) in a child interpreter;
  ``target``: a compute capability, ``toolkit``: the CUDA release of the image's nvcc (None: none). Returns
  ``{"report": report JSON, "headline": {engine: sentence}, "seconds": float}``. Raises ``SiteError``.
* ``SiteError`` (RuntimeError): the site could not be read (a missing folder, or the child failed).
* ``site_statuses(result) -> dict``: ``{(who, backend): {"status", "gate", "cause"}}`` of a ``site_run`` result;
  ``who`` is an engine's name or ``"library"``.
* ``site_status_word(status) -> str``: one such entry as a word (``"absent"`` for None; the gate in brackets
  for blocked / skipped / error).
* ``site_changes(old, new) -> list[dict]``: per engine and backend whose status moved between two results,
  ``{"engine", "backend", "old", "new", "deciding"}``.
* ``move_costs(old_roots, new_roots) -> list[str]``: what moving FlashInfer between two sites costs besides the
  statuses (an ahead-of-time module to rebuild, a tune cache to redo), one sentence each.

The suite's readers over an unpacked release, for the radar's gates

* ``SourceNotFound`` (LookupError): a package, file, function or name not in the source read.
* ``find_files_containing(root, needle, glob="**/*.py") -> list[Path]``, ``find_assignment(root, name,
  glob="**/*.py") -> (Path, value, line)``, ``class_attribute(path, cls, attr) -> (value, line)``: ``ast``-based
  source lookups (:mod:`stackprobe.source`); the last two raise SourceNotFound, and SyntaxError / ValueError for
  source they cannot read.
* ``flashinfer_module_majors(fn_name, root=None) -> (majors | None, where)``,
  ``flashinfer_all_module_majors(root=None) -> {fn: majors | None}``: ``supported_major_versions`` of FlashInfer's
  ``gen_*`` JIT modules in ``flashinfer/jit/comm.py`` (None: every arch); raise SourceNotFound
  (:mod:`stackprobe.probes.flashinfer_common`).
* ``find_pcie_world_size_rule(root) -> (N, "file:line `test`") | None``: SGLang custom allreduce's
  ``world_size > N and not <nvlink>`` rule; ``short_source_path(path) -> str``: a path from its ``sglang/`` folder
  on (:mod:`stackprobe.probes.sglang_custom_ar`).
* ``SYMM_MEM_TABLE`` (str): the name of SGLang's torch symmetric-memory size table;
  ``symm_mem_lookup_style(root) -> ("get" | "subscript" | "unknown", "file:line")``: how SGLang indexes it
  (:mod:`stackprobe.probes.torch_symm_mem`).
* ``coverage_scan_files(files, target, reader="auto", package="", version="") -> PackageCoverage``: SASS/PTX
  coverage of ``files`` ([(relative name, absolute path)]) for ``target`` (an Arch); ``COVERAGE_LEVELS``: its
  levels, best first (``"native"`` ... ``"none"``); ``is_coverage_candidate(name) -> bool``: whether a file name
  is one the coverage reader opens (``.so``, ``.so.N``, ``.cubin``) (:mod:`stackprobe.coverage`).
* ``radar_reader_files() -> list[Path]``: the source files whose code decides a radar gate (source,
  flashinfer_common, sglang_custom_ar, torch_symm_mem, coverage, then SGLang's dispatch, pyeval and engine readers
  that custom allreduce's PCIe rule runs on, in that order), which the radar hashes into its scan cache key.

Markdown tables (:mod:`stackprobe.mdtable`)

* ``md_header(names, right=()) -> list[str]``: a table's heading and delimiter lines (``right``: right-aligned
  column indices); ``md_row(cells, limit=LIMIT) -> str``: one escaped, capped line; ``MdSpill``: the text cut from
  cells, kept for headings below the table.
"""
from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from stackprobe.archs import Arch, ArchSpecError, cuda_wheel_release, parse_arch, parse_arch_list, version_tuple
from stackprobe.atomic import atomic_path, write_atomic

if TYPE_CHECKING:
    from stackprobe.coverage import LEVELS as COVERAGE_LEVELS
    from stackprobe.coverage import _candidate as is_coverage_candidate
    from stackprobe.coverage import scan_files as coverage_scan_files
    from stackprobe.engines import choices as engine_choices
    from stackprobe.probes.sglang_custom_ar import find_pcie_world_size_rule
    from stackprobe.probes.sglang_custom_ar import short as short_source_path
    from stackprobe.health_stage import errors as health_errors
    from stackprobe.mdtable import Spill as MdSpill
    from stackprobe.mdtable import header as md_header
    from stackprobe.mdtable import row as md_row
    from stackprobe.probes.flashinfer_common import all_module_majors as flashinfer_all_module_majors
    from stackprobe.probes.flashinfer_common import module_majors as flashinfer_module_majors
    from stackprobe.probes.torch_symm_mem import TABLE as SYMM_MEM_TABLE
    from stackprobe.probes.torch_symm_mem import lookup_style as symm_mem_lookup_style
    from stackprobe.report import Report, ReportError, comparison_markdown, suite_digest
    from stackprobe.site import SiteError, move_costs
    from stackprobe.site import _word as site_status_word
    from stackprobe.site import changes as site_changes
    from stackprobe.site import run as site_run
    from stackprobe.site import statuses as site_statuses
    from stackprobe.source import SourceNotFound, class_attribute, find_assignment, find_files_containing
    from stackprobe.statusplot import write_beside

# name here -> (module, name there): imported on first use
_LAZY: dict[str, tuple[str, str]] = {
    "engine_choices": ("stackprobe.engines", "choices"),
    "Report": ("stackprobe.report", "Report"),
    "ReportError": ("stackprobe.report", "ReportError"),
    "comparison_markdown": ("stackprobe.report", "comparison_markdown"),
    "suite_digest": ("stackprobe.report", "suite_digest"),
    "write_beside": ("stackprobe.statusplot", "write_beside"),
    "health_errors": ("stackprobe.health_stage", "errors"),
    "site_run": ("stackprobe.site", "run"),
    "SiteError": ("stackprobe.site", "SiteError"),
    "site_statuses": ("stackprobe.site", "statuses"),
    "site_status_word": ("stackprobe.site", "_word"),
    "site_changes": ("stackprobe.site", "changes"),
    "move_costs": ("stackprobe.site", "move_costs"),
    "SourceNotFound": ("stackprobe.source", "SourceNotFound"),
    "find_files_containing": ("stackprobe.source", "find_files_containing"),
    "find_assignment": ("stackprobe.source", "find_assignment"),
    "class_attribute": ("stackprobe.source", "class_attribute"),
    "flashinfer_module_majors": ("stackprobe.probes.flashinfer_common", "module_majors"),
    "flashinfer_all_module_majors": ("stackprobe.probes.flashinfer_common", "all_module_majors"),
    "find_pcie_world_size_rule": ("stackprobe.probes.sglang_custom_ar", "find_pcie_world_size_rule"),
    "short_source_path": ("stackprobe.probes.sglang_custom_ar", "short"),
    "SYMM_MEM_TABLE": ("stackprobe.probes.torch_symm_mem", "TABLE"),
    "symm_mem_lookup_style": ("stackprobe.probes.torch_symm_mem", "lookup_style"),
    "coverage_scan_files": ("stackprobe.coverage", "scan_files"),
    "COVERAGE_LEVELS": ("stackprobe.coverage", "LEVELS"),
    "is_coverage_candidate": ("stackprobe.coverage", "_candidate"),
    "md_header": ("stackprobe.mdtable", "header"),
    "md_row": ("stackprobe.mdtable", "row"),
    "MdSpill": ("stackprobe.mdtable", "Spill"),
}

# the modules whose source radar_reader_files() names, in order
#: the files whose code decides a radar gate (its cache key hashes them): the readers it calls and the modules that
#: define what they call (custom allreduce's PCIe rule is ``engines/sglang/dispatch.py``'s, evaluated by
#: ``engines/sglang/pyeval.py``; ``short`` is ``engines/sglang/engine.py``'s)
_RADAR_READERS = ("stackprobe.source", "stackprobe.probes.flashinfer_common", "stackprobe.probes.sglang_custom_ar",
                  "stackprobe.probes.torch_symm_mem", "stackprobe.coverage", "stackprobe.engines.sglang.dispatch",
                  "stackprobe.engines.sglang.pyeval", "stackprobe.engines.sglang.engine")

__all__ = [
    "write_atomic", "atomic_path",
    "Arch", "ArchSpecError", "parse_arch", "parse_arch_list", "version_tuple", "cuda_wheel_release",
    "engine_choices",
    "Report", "ReportError", "comparison_markdown", "suite_digest", "write_beside", "health_errors",
    "site_run", "SiteError", "site_statuses", "site_status_word", "site_changes", "move_costs",
    "SourceNotFound", "find_files_containing", "find_assignment", "class_attribute",
    "flashinfer_module_majors", "flashinfer_all_module_majors", "find_pcie_world_size_rule", "short_source_path",
    "SYMM_MEM_TABLE", "symm_mem_lookup_style", "coverage_scan_files", "COVERAGE_LEVELS", "is_coverage_candidate",
    "radar_reader_files",
    "md_header", "md_row", "MdSpill",
]


def _module(name: str) -> ModuleType:
    """The module ``name`` of :data:`_LAZY` / :data:`_RADAR_READERS`, imported now. One ``import`` statement per
    module, so that the import graph read from the source (``tests/test_module_structure.py``) sees every edge."""
    if name == "stackprobe.coverage":
        from stackprobe import coverage
        return coverage
    if name == "stackprobe.engines":
        from stackprobe import engines
        return engines
    if name == "stackprobe.probes.sglang_custom_ar":
        from stackprobe.probes import sglang_custom_ar as custom_ar
        return custom_ar
    if name == "stackprobe.engines.sglang.dispatch":
        from stackprobe.engines.sglang import dispatch
        return dispatch
    if name == "stackprobe.engines.sglang.pyeval":
        from stackprobe.engines.sglang import pyeval
        return pyeval
    if name == "stackprobe.engines.sglang.engine":
        from stackprobe.engines.sglang import engine
        return engine
    if name == "stackprobe.health_stage":
        from stackprobe import health_stage
        return health_stage
    if name == "stackprobe.mdtable":
        from stackprobe import mdtable
        return mdtable
    if name == "stackprobe.probes.flashinfer_common":
        from stackprobe.probes import flashinfer_common
        return flashinfer_common
    if name == "stackprobe.probes.torch_symm_mem":
        from stackprobe.probes import torch_symm_mem
        return torch_symm_mem
    if name == "stackprobe.report":
        from stackprobe import report
        return report
    if name == "stackprobe.site":
        from stackprobe import site
        return site
    if name == "stackprobe.source":
        from stackprobe import source
        return source
    if name == "stackprobe.statusplot":
        from stackprobe import statusplot
        return statusplot
    raise ValueError(f"stackprobe.api does not re-export from {name!r}")


def radar_reader_files() -> list[Path]:
    """The source files of the readers the radar's gates call (see the module docstring), in a fixed order."""
    return [Path(str(_module(m).__file__)) for m in _RADAR_READERS]


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(_module(where[0]), where[1])
    globals()[name] = value          # the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
