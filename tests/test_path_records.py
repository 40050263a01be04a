"""One record per communication path (stackprobe.paths): every backend a probe answers for has one, every record's
library probe exists and answers for it, and every table that used to keep its own copy agrees with the records.
Each check is a function returning the disagreements as lines, run on the real tables and, as its failing twin, on a
planted record or a planted table entry."""
from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

from stackprobe import paths as P

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "validate" / "stackprobe"


def _probe_modules() -> list:
    from stackprobe.probes import probes
    from stackprobe.engines.vllm import engine as vllm_engine
    return [*probes(), vllm_engine]


def unrecorded(records, modules) -> list[str]:
    """Backends a probe module answers for (its ``BACKENDS``) and runtime rows it names (its ``RUNTIME``) that no
    record holds."""
    ids = {r.id for r in records}
    rows = {n for r in records for names in r.runtime.values() for n in names}
    out = [f"{m.__name__} answers for {b}, which has no record" for m in modules for b in m.BACKENDS if b not in ids]
    out += [f"{m.__name__} names runtime row {n}, which no record lists" for m in modules
            for names in (getattr(m, "RUNTIME", None) or {}).values() for n in names if n not in rows]
    return out


def probe_mismatches(records) -> list[str]:
    """Records whose library probe module does not exist, does not answer for the record's id, or whose ``RUNTIME``
    is not the record's ``runtime``."""
    out = []
    for r in records:
        if not r.library_probe:
            continue
        try:
            mod = importlib.import_module(r.library_module)
        except ModuleNotFoundError:
            out.append(f"{r.id}: library probe {r.library_module} does not exist")
            continue
        if r.id not in getattr(mod, "BACKENDS", ()):
            out.append(f"{r.id}: {r.library_module} does not answer for it (BACKENDS)")
        elif r.runtime != (getattr(mod, "RUNTIME", None) or {}):
            out.append(f"{r.id}: runtime {r.runtime} != {r.library_module}.RUNTIME")
    return out


def live_tables() -> dict:
    """The consumer tables as the modules hold them now."""
    from stackprobe import health_jitcache
    from stackprobe.probes import flashinfer_fusion, needs
    from stackprobe.engines.sglang import paths as sglang_paths
    from stackprobe.engines.vllm import paths as vllm_paths
    from stackprobe.runtime import STATIC_NAME, dispatch, engine, p2p
    return {"NEEDS": dict(needs.NEEDS), "BACKEND_MODULE_FN": dict(health_jitcache.BACKEND_MODULE_FN),
            "MODULE_FN": flashinfer_fusion.MODULE_FN, "rows": {"sglang": dict(dispatch.SGLANG.rows),
                                                               "vllm": dict(dispatch.VLLM.rows)},
            "pcie": {"sglang": (dispatch.SGLANG.pcie_opt_in, dispatch.SGLANG.pcie_attr),
                     "vllm": (dispatch.VLLM.pcie_opt_in, dispatch.VLLM.pcie_attr)},
            "ENGINE_PCIE_OPT_IN": engine.PCIE_OPT_IN, "STATIC_BACKEND": dict(engine.STATIC_BACKEND),
            "STATIC_NAME": dict(STATIC_NAME), "NEEDS_P2P": tuple(p2p.NEEDS_P2P),
            "ASSESSED": dict(vllm_paths.ASSESSED), "JUDGED_FLAGS": dict(sglang_paths.JUDGED_FLAGS)}


def table_mismatches(records, t: dict) -> list[str]:
    """Each consumer table against what the records say, one line per entry that disagrees."""
    by_id = {r.id: r for r in records}
    out = []
    want = {r.id: r.needs for r in records if r.needs is not None}
    if t["NEEDS"] != want:
        diff = sorted(b for b in set(t["NEEDS"]) | set(want) if t["NEEDS"].get(b) != want.get(b))
        out.append(f"probes.needs.NEEDS differs from the records on {diff}")
    want = {r.id: r.needs.jit_generator for r in records if r.needs is not None and r.needs.jit_generator}
    if t["BACKEND_MODULE_FN"] != want:
        out.append(f"health_jitcache.BACKEND_MODULE_FN {t['BACKEND_MODULE_FN']} != records {want}")
    if t["MODULE_FN"] != by_id[P.FUSION].needs.jit_generator:
        out.append(f"flashinfer_fusion.MODULE_FN {t['MODULE_FN']} != the record's jit_generator")
    return out + _engine_mismatches(records, t)


def _engine_mismatches(records, t: dict) -> list[str]:
    """The runtime tier's and the engines' tables against the records' per-engine facts."""
    by_id = {r.id: r for r in records}
    out = []
    for eng, rows in t["rows"].items():
        for r in records:
            e = r.engines.get(eng)
            if e is not None and e.communicator and rows.get(e.communicator) != e.row:
                out.append(f"runtime.dispatch rows[{eng}][{e.communicator}] = {rows.get(e.communicator)!r}, "
                           f"record {r.id} says {e.row!r}")
    for eng, (switch, attr) in t["pcie"].items():
        e = by_id[P.PCIE_IPC].engines[eng]
        if (switch, attr) != (e.switch, e.communicator):
            out.append(f"runtime.dispatch {eng}: PCIe IPC switch/communicator {(switch, attr)} != record's "
                       f"{(e.switch, e.communicator)}")
    if t["ENGINE_PCIE_OPT_IN"] != by_id[P.PCIE_IPC].engines["sglang"].switch:
        out.append(f"runtime.engine.PCIE_OPT_IN {t['ENGINE_PCIE_OPT_IN']} != the record's SGLang switch")
    return out + _per_record_mismatches(records, t)


def _per_record_mismatches(records, t: dict) -> list[str]:
    out = []
    for r in records:
        e = r.engines.get("sglang")
        if e is not None and e.row in t["STATIC_BACKEND"] and t["STATIC_BACKEND"][e.row] != r.id:
            out.append(f"runtime.engine.STATIC_BACKEND[{e.row}] = {t['STATIC_BACKEND'][e.row]}, record says {r.id}")
        for names in r.runtime.values():
            for n in names:
                if t["STATIC_NAME"].get(n, r.id) not in (r.id, P.NCCL_RING, P.NCCL_TREE):
                    out.append(f"runtime.STATIC_NAME[{n}] = {t['STATIC_NAME'][n]}, record {r.id} lists it")
        for eng, table in (("vllm", t["ASSESSED"]), ("sglang", t["JUDGED_FLAGS"])):
            e = r.engines.get(eng)
            if e is not None and e.switch in table and table[e.switch] != r.id:
                out.append(f"{eng} settings table[{e.switch}] = {table[e.switch]}, record {r.id} has it as its switch")
    peer_rows = {r.engines["sglang"].row for r in records if r.peer_memory is True and "sglang" in r.engines}
    out += [f"runtime.p2p.NEEDS_P2P lists {n}, which is no peer-memory path's SGLang row"
            for n in t["NEEDS_P2P"] if n not in peer_rows]
    return out


def stray_literals(root: Path, backend: str) -> list[str]:
    """FILE:LINE of every ``"<backend>"`` string literal under ``root`` outside ``paths.py``: code names the path by
    its constant in :mod:`stackprobe.paths`."""
    pat = re.compile(r"[\"']" + re.escape(backend) + r"[\"']")
    return [f"{f.relative_to(root)}:{i}" for f in sorted(root.rglob("*.py")) if f.name != "paths.py" or
            f.parent != root for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1)
            if pat.search(line)]


# --- the real tables ---------------------------------------------------------------------------------------------
def test_every_backend_and_runtime_row_a_probe_names_has_a_record():
    assert unrecorded(P.records(), _probe_modules()) == []


def test_every_library_probe_exists_and_answers_for_its_record():
    assert probe_mismatches(P.records()) == []
    assert {r.library_module for r in P.records()} >= {m.__name__ for m in _probe_modules()}


def test_every_consumer_table_reads_the_records():
    assert table_mismatches(P.records(), live_tables()) == []


def test_the_pcie_ipc_id_is_spelled_once():
    assert stray_literals(SUITE, P.PCIE_IPC) == []


def test_the_consumers_hold_the_records_own_values():
    """Not copies that happen to be equal: the health stage's table holds the record's own objects."""
    from stackprobe.probes.needs import NEEDS
    assert all(NEEDS[r.id] is r.needs for r in P.records() if r.needs is not None)
    assert P.communicator_rows("sglang")["pcie_ipc_comm"] == "sglang-pcie-ipc"
    assert P.communicator_rows("nosuchengine") == {}


# --- failing twins -----------------------------------------------------------------------------------------------
def test_a_record_whose_probe_module_is_missing_or_elsewhere_is_reported():
    bad = (*P.records(), P.PathRecord("planted-path", "planted", True, library_probe="no_such_probe"),
           dataclasses.replace(P.record(P.MSCCLPP), library_probe="b12x"),
           dataclasses.replace(P.record(P.TORCH_SYMM_MEM), runtime={"library": (), "engine": ()}))
    assert probe_mismatches(bad) == [
        "planted-path: library probe stackprobe.probes.no_such_probe does not exist",
        "mscclpp: stackprobe.probes.b12x does not answer for it (BACKENDS)",
        "torch-symm-mem: runtime {'library': (), 'engine': ()} != stackprobe.probes.torch_symm_mem.RUNTIME"]


def test_a_backend_without_a_record_is_reported():
    lacking = tuple(r for r in P.records() if r.id != P.B12X)
    assert unrecorded(lacking, _probe_modules()) == [
        "stackprobe.probes.b12x answers for b12x, which has no record",
        "stackprobe.engines.vllm.engine answers for b12x, which has no record"]


def test_a_table_entry_that_disagrees_is_reported():
    t = live_tables()
    t["rows"]["sglang"]["pcie_ipc_comm"] = "sglang-something-else"
    t["BACKEND_MODULE_FN"][P.PCIE_IPC] = "gen_other_module"
    t["pcie"]["vllm"] = ("VLLM_SOMETHING", "fi_pcie_ipc_ar_comm")
    t["NEEDS_P2P"] += ("sglang-pynccl",)
    t["ASSESSED"]["VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC"] = P.FI_ALLREDUCE
    got = table_mismatches(P.records(), t)
    assert len(got) == 5, got
    assert any("rows[sglang][pcie_ipc_comm] = 'sglang-something-else'" in g for g in got)
    assert any("BACKEND_MODULE_FN" in g for g in got)
    assert any("vllm: PCIe IPC switch/communicator ('VLLM_SOMETHING'" in g for g in got)
    assert any("NEEDS_P2P lists sglang-pynccl" in g for g in got)
    assert any("vllm settings table[VLLM_ALLREDUCE_USE_FLASHINFER_PCIE_IPC]" in g for g in got)


def test_a_record_that_disagrees_with_the_tables_is_reported():
    recs = tuple(dataclasses.replace(r, needs=dataclasses.replace(r.needs, jit=False)) if r.id == P.PCIE_IPC else r
                 for r in P.records())
    got = table_mismatches(recs, live_tables())
    assert len(got) == 1 and got[0].startswith("probes.needs.NEEDS differs from the records")


def test_a_planted_literal_is_found(tmp_path):
    (tmp_path / "paths.py").write_text(f'PCIE_IPC = "{P.PCIE_IPC}"\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "reader.py").write_text(f"x = 1\nBACKENDS = ('{P.PCIE_IPC}',)\n")
    assert stray_literals(tmp_path, P.PCIE_IPC) == ["sub/reader.py:2"]
