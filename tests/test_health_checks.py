"""Unit tests (no network) of the health stage's own ELF reader, its "not assessed" wording, the conditional
known-bad data and the import walk behind the driver floors. Real files throughout: shared objects built with
gcc, a package tree written to disk; each check also has a twin that must not fire."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validate"))

from stackprobe import health_floors, health_report, known_bad  # noqa: E402
from stackprobe.elfread import ELF, ELFReadError  # noqa: E402
from stackprobe.health_elf import cuda_majors, expected_library, needed, undefined_symbols  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the shared objects")


@pytest.fixture(scope="module")
def libs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("elf")
    (d / "rt.c").write_text("int rt_probe(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(d / "libcudart.so"), str(d / "rt.c"),
                    "-Wl,-soname,libcudart.so.13"], check=True)
    (d / "m.c").write_text("extern int rt_probe(void); extern int ncclCommResume(void *);\n"
                           "int entry(void) { return rt_probe() + ncclCommResume(0); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(d / "m.so"), str(d / "m.c"), f"-L{d}", "-Wl,--no-as-needed",
                    "-lcudart", "-Wl,--allow-shlib-undefined"], check=True)
    return d


def test_own_reader_reads_dt_needed_and_dynsym_like_readelf(libs):
    so = str(libs / "m.so")
    assert needed(so)[0] == "libcudart.so.13" and cuda_majors(needed(so)) == {"libcudart.so.13": 13}
    with ELF(so) as e:
        syms = {s.name: s for s in e.dynamic_symbols()}
    assert syms["entry"].defined and not syms["ncclCommResume"].defined and syms["ncclCommResume"].bind == 1
    if shutil.which("readelf"):
        out = subprocess.run(["readelf", "-d", so], capture_output=True, text=True).stdout
        assert [ln.split("[")[1].rstrip("]") for ln in out.splitlines() if "(NEEDED)" in ln] == list(needed(so))
    assert undefined_symbols(so, ("ncclComm",)) == ["ncclCommResume"]
    assert expected_library("ncclCommResume") == "libnccl.so.2"


def test_own_reader_refuses_a_non_elf_file_with_its_name(tmp_path):
    bad = tmp_path / "fake.so"
    bad.write_bytes(b"not an elf at all" * 8)
    with pytest.raises(ELFReadError, match="fake.so: not an ELF"):
        ELF(str(bad))


def test_health_section_never_says_no_errors_when_a_check_did_not_run():
    gap = {"check": "requirements", "what": "declared requirements", "why": "no parser"}
    md = "\n".join(health_report.markdown({"findings": [], "not_assessed": [gap]}))
    assert "no errors:" not in md and "> **not assessed: declared requirements (no parser)**" in md
    assert health_report.summary({"findings": [], "not_assessed": [gap]}) == \
        "health: no errors; not assessed: declared requirements"
    # the twin: everything ran
    assert "no errors:" in "\n".join(health_report.markdown({"findings": [], "not_assessed": []}))


def _entry(tmp_path, extra: str) -> known_bad.KnownBad:
    f = tmp_path / "kb.toml"
    f.write_text('[[release]]\nid = "x"\npackage = "nccl"\nversions = "==2.27.5"\nsymptom = "s"\n'
                 'fixed_in = "none named"\nworkaround = "unset it"\nsource = "u"\n' + extra)
    return known_bad.load(f)[0]


def test_known_bad_conditions_env_world_size_and_sizes(tmp_path):
    e = _entry(tmp_path, 'env = { NCCL_P2P_DISABLE = "1" }\nworld_size = "==2"\nmessage_bytes = ">=524288"\n')
    on = {"env": {"NCCL_P2P_DISABLE": "1"}, "world_size": 2}
    assert e.applies("2.27.5", context=on)
    assert not e.applies("2.27.5", context={"env": {}, "world_size": 2})                      # variable unset
    assert not e.applies("2.27.5", context={"env": {"NCCL_P2P_DISABLE": "1"}, "world_size": 4})
    assert e.applies("2.27.5", context={"env": {"NCCL_P2P_DISABLE": "1"}})                   # world size unknown
    assert "not known here" in e.condition({"env": {"NCCL_P2P_DISABLE": "1"}})
    text = e.describe("2.27.5", on)
    assert "(43,008 B at 3 tokens) is below it" in text and "from 37 tokens" in text and e.lift() == "unset it"


def test_known_bad_rejects_a_malformed_condition(tmp_path):
    with pytest.raises(known_bad.KnownBadError, match="no operator"):
        _entry(tmp_path, 'world_size = "2"\n')
    with pytest.raises(known_bad.KnownBadError, match="env must be a table"):
        _entry(tmp_path, 'env = { NCCL_P2P_DISABLE = 1 }\n')


def test_the_shipped_data_carries_nvidia_nccl_1852_with_its_conditions():
    e = next(x for x in known_bad.load() if x.id == "nccl-2.27.5-shm-p2p-disabled-512k")
    assert dict(e.env) == {"NCCL_P2P_DISABLE": "1"} and e.message_bytes == ">=524288" and "1852" in e.source


def test_import_walk_finds_cuda_bindings_through_the_package_and_not_elsewhere(tmp_path, monkeypatch):
    pkg = tmp_path / "fakefi"
    (pkg / "comm").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import util\n")
    (pkg / "util.py").write_text("import os\n")
    (pkg / "comm" / "__init__.py").write_text("from .ar import run\n")
    (pkg / "comm" / "ar.py").write_text("from .nv import x\ndef run():\n    import cuda.bindings.runtime\n")
    (pkg / "comm" / "nv.py").write_text("try:\n    from cuda.bindings import driver\nexcept ImportError:\n    driver = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    health_floors._package_root.cache_clear()
    health_floors.bindings_import.cache_clear()
    hit = health_floors.bindings_import(("fakefi.comm",))
    assert hit["module"] == "fakefi.comm.nv" and hit["line"] == 2 and hit["chain"] == ["fakefi.comm", "fakefi.comm.ar",
                                                                                         "fakefi.comm.nv"]
    assert health_floors.bindings_import(("fakefi.util",)) is None    # a function-body import does not count either


def test_comparison_row_names_what_was_not_assessed():
    from types import SimpleNamespace
    gap = {"check": "shared_objects", "what": "shared-object dependencies of x", "why": "unreadable"}
    reps = [SimpleNamespace(environment={"health": {"findings": [], "not_assessed": [gap], "blocks": {}}}),
            SimpleNamespace(environment={"health": {"findings": [], "not_assessed": [], "blocks": {}}})]
    row = next(line for line in health_report.comparison(reps, ["a", "b"]) if line.startswith("| errors"))
    assert "**not assessed**: shared-object dependencies of x (unreadable)" in row and row.endswith("| no errors |")


def test_health_line_shows_the_loaded_nccl_beside_a_disagreeing_wheel():
    nccl = {"library": "/x/libnccl.so.2", "version": "2.26.2", "version_string": "2.26.2+cuda12.2",
            "wheel": {"dist": "nvidia-nccl-cu13", "version": "2.30.7", "record": "differs"}}
    md = "\n".join(health_report.markdown({"findings": [], "nccl": nccl}))
    assert "(2.26.2+cuda12.2; wheel metadata nvidia-nccl-cu13 2.30.7, the file differs from its RECORD)" in md
    same = dict(nccl, wheel={"dist": "nvidia-nccl-cu13", "version": "2.26.2", "record": "matches"})
    assert "wheel metadata" not in "\n".join(health_report.markdown({"findings": [], "nccl": same}))
