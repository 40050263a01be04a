"""One engine registry (issue 36 item 1): a third engine, ``toyserve`` (tests/fixtures/engine_toy: its plug-in and two
releases of a source tree shaped like an engine's), registered with one call, appears in the static report (JSON
and Markdown), the summary block and headline, the runtime tier's plan of dispatch runs and the comparison of two
reports, with no edit outside its folder; unregistered, the same runs show it nowhere."""
from __future__ import annotations

import ast
import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from stackprobe import engines
from stackprobe.report import Report, comparison_markdown
from stackprobe.static import run_static
from stackprobe.summary import block
from stackprobe.userwords import headline_line

TOY = Path(__file__).parent / "fixtures" / "engine_toy"
VALIDATE = Path(__file__).parent.parent / "validate" / "stackprobe"
# P2P reported off between GPU 0 and 1 (the shape of python -m stackprobe.runtime p2p's report)
P2P_OFF = {"peers": {"count": 2, "cuda": {"0-1": False, "1-0": False}, "nvml": {}, "errors": []},
           "iommu": {"mode": "passthrough", "units": [], "group_types": {}, "cmdline": []},
           "acs": {"source": "lspci -vvv", "redirecting": [], "bridges_with_acs": 0}, "env": {}}


def _field_line(site: Path) -> int:
    text = (site / "toyserve" / "server_args.py").read_text().splitlines()
    return next(i for i, line in enumerate(text, 1) if "enable_toy_allreduce: bool" in line)


@pytest.fixture
def toy_on_path(monkeypatch):
    """The plug-in importable and toyserve 1.0 installed (its folder on sys.path); the caller picks the release."""
    monkeypatch.syspath_prepend(str(TOY))
    monkeypatch.syspath_prepend(str(TOY / "site-1.0"))
    yield
    engines.unregister("toyserve")


def _use(site: Path) -> None:
    """Swap the toyserve release on sys.path for the one in ``site``."""
    sys.path[:] = [p for p in sys.path if not p.startswith(str(TOY / "site-"))]
    sys.path.insert(0, str(site))
    importlib.invalidate_caches()


def _static(tmp_path: Path, name: str, server_args: str = "") -> tuple[Report, dict, str]:
    chosen = engines.select("auto")
    configs = {e.name: e.parse_config(server_args, []) for e in chosen}
    rep = run_static(engines=chosen, engine_configs=configs, server_config=configs[chosen[0].name], label=name)
    path = tmp_path / f"{name}.json"
    rep.write_json(path)
    loaded = Report.load(path)      # as `compare` reads it
    return loaded, json.loads(path.read_text()), loaded.to_markdown()


def _runtime_plan(tmp_path: Path) -> dict:
    """What the runtime tier plans per engine, without GPUs: the engine dispatch runs ``--runtime`` makes for a report
    that lists toyserve, whether ``python -m stackprobe.runtime dispatch --engine toyserve`` is accepted, and the
    dispatch probe's plan for toyserve where P2P is off."""
    from stackprobe.runtime.__main__ import build_parser
    from stackprobe.runtime.dispatch import dispatch_plans, engine_of, plan
    out: dict = {"runs": [(rt.name, d) for rt, d in dispatch_plans(["toyserve"], str(tmp_path / "rt"))]}
    try:
        out["cli_engine"] = build_parser().parse_args(["dispatch", "--engine", "toyserve"]).engine
    except SystemExit as exc:
        out["cli_engine"] = f"refused ({exc.code})"
    try:
        out["plan"] = plan("", {"TOYSERVE_PCIE_IPC": "1"}, 2, P2P_OFF, engine_of("toyserve"))
    except ValueError as exc:
        out["plan"] = str(exc)
    return out


def test_a_registered_third_engine_appears_in_every_place(toy_on_path, tmp_path):
    from toyserve_engine import ToyServe
    engines.register(ToyServe)                                  # the one call
    assert "toyserve" in engines.choices() and [e.name for e in engines.select("auto")] == ["toyserve"]

    old, old_json, old_md = _static(tmp_path, "toy-1.0")
    line = _field_line(TOY / "site-1.0")
    # the static report: its engines entry, its answer read from its source (FILE:LINE), its matrix row
    assert old_json["engines"] == [{"name": "toyserve", "title": "ToyServe", "version": "1.0", "server_config": {
        "args": {}, "env": {}, "source": "", "describe": "no flags"}, "dispatch": {}}]
    # schema 4: every engine's sections in its own entry, none at the top level
    assert old_json["schema"] == 4 and not {"dispatch", "paths", "launch_environment", "server_config"} & set(old_json)
    v = next(v for v in old_json["verdicts"] if v["backend"] == "toyserve-allreduce")
    assert (v["scope"], v["engine"], v["status"]) == ("engine", "toyserve", "opt-in")
    assert f"toyserve/server_args.py:{line}" in v["cause"]
    assert {e["source"] for e in v["evidence"]} == {f"toyserve/server_args.py:{line}"}
    assert "| backend | headline | library admits the target | ToyServe 1.0 will enable it here |" in old_md
    assert "| toyserve-allreduce | opt-in | - | opt-in | - | setting |" in old_md
    # the summary block and the headline
    summary = "\n".join(block(old))
    assert "engine:             toyserve 1.0" in summary
    assert "try and measure:    toyserve-allreduce (--enable-toy-allreduce)" in summary
    assert "opt-in, worth measuring on the target: toyserve-allreduce (--enable-toy-allreduce)" in headline_line(old)
    assert "**What ToyServe does here**" in old_md
    # the runtime tier's plan
    rt = _runtime_plan(tmp_path)
    assert rt["runs"] == [("toyserve", str(tmp_path / "rt" / "toyserve"))]
    assert rt["cli_engine"] == "toyserve"
    assert [s["backend"] for s in rt["plan"]["skipped"]] == ["toyserve-custom-allreduce", "toyserve-pcie-ipc"]
    assert rt["plan"]["env"]["TOYSERVE_PCIE_IPC"] == "0"
    assert all(s["reason"].startswith("skipped: no P2P between GPU 0 and 1") for s in rt["plan"]["skipped"])
    # the comparison: toyserve 1.1 turns the path on by default; the release that moved it is named
    _use(TOY / "site-1.1")
    new, new_json, _ = _static(tmp_path, "toy-1.1")
    assert next(v for v in new_json["verdicts"] if v["backend"] == "toyserve-allreduce")["status"] == "on-by-default"
    cmp = comparison_markdown([old, new], ["toy-1.0", "toy-1.1"])
    row = next(r for r in cmp.splitlines() if r.startswith("| toyserve-allreduce |"))
    assert "**opt-in**" in row and "**on-by-default**" in row and "| yes |" in row
    assert "- toyserve-allreduce: toyserve 1.0 -> 1.1 (its gate decides)" in cmp


def test_unregistered_the_third_engine_appears_nowhere(toy_on_path, tmp_path):
    """The failing twin: the same fixture on sys.path, the same runs, no register call."""
    assert "toyserve" not in engines.choices() and "toyserve" not in engines.registered()
    assert "toyserve" not in [e.name for e in engines.select("auto")]   # here: ["sglang"], the default, not installed
    with pytest.raises(engines.EngineChoiceError, match="use one of auto, sglang, vllm"):
        engines.select("toyserve")
    old, old_json, old_md = _static(tmp_path, "toy-1.0")
    _use(TOY / "site-1.1")
    new, new_json, new_md = _static(tmp_path, "toy-1.1")
    cmp = comparison_markdown([old, new], ["toy-1.0", "toy-1.1"])
    for text in (json.dumps(old_json), old_md, json.dumps(new_json), new_md, "\n".join(block(old)),
                 headline_line(old), cmp):
        assert "toyserve" not in text.lower()
    rt = _runtime_plan(tmp_path)
    assert rt["runs"] == [] and rt["cli_engine"] == "refused (2)"
    assert rt["plan"] == "--engine 'toyserve': the dispatch probe knows sglang, vllm"


def test_the_toy_answer_is_read_from_its_source_and_can_fail(toy_on_path, tmp_path):
    """Its verdict is the reading, not a constant: the flag given turns it on as configured, a source without the
    field is an error naming release and file, and toyserve absent is not-installed."""
    from stackprobe.probes import Context
    from stackprobe.archs import parse_arch
    from toyserve_engine import ToyServe
    engines.register(ToyServe)
    toy = ToyServe()

    def answer(server_args: str = ""):
        cfg = toy.parse_config(server_args, [])
        return toy.answers(Context(target=parse_arch("12.0"), env={}, coverage={}, engine_configs={"toyserve": cfg}))[0]

    assert answer().status == "opt-in"
    assert answer("--enable-toy-allreduce").status == "on-as-configured"
    with pytest.raises(ValueError, match="toyserve 1.0 defines no --enable-magic"):
        toy.parse_config("--enable-magic", [])
    edited = tmp_path / "site-edited"
    shutil.copytree(TOY / "site-1.0", edited)
    src = edited / "toyserve" / "server_args.py"
    src.write_text(src.read_text().replace("enable_toy_allreduce: bool = False", "enable_toy_allreduce = None"))
    _use(edited)
    bad = answer()
    assert bad.status == "error" and "toyserve 1.0: toyserve/server_args.py defines no" in bad.cause
    sys.path[:] = [p for p in sys.path if p != str(edited)]
    importlib.invalidate_caches()
    assert answer().status == "not-installed"


def test_register_refuses_what_is_no_engine_or_takes_a_held_name():
    class Nameless(engines.ServingEngine):
        pass

    class Impostor(engines.ServingEngine):
        name, dist, title = "vllm", "vllm-fork", "vLLM fork"

    with pytest.raises(ValueError, match="set name"):
        engines.register(Nameless)
    with pytest.raises(ValueError, match="already registered by stackprobe.engines.vllm.VLLM"):
        engines.register(Impostor)
    with pytest.raises(ValueError, match="not a stackprobe.engines.ServingEngine subclass"):
        engines.register(dict)
    assert engines.registered()["vllm"] is engines.VLLM


# modules still allowed to compare an engine's name (none: the engines' own P2P checks are an engine member now)
_LEFT: set[str] = set()


def _name_comparisons(root: Path) -> list[str]:
    """``== "sglang"`` / ``!= "vllm"`` / ``in ("sglang", ...)`` comparisons in modules outside the engines' own
    (engines/: the registry and each engine's package; probes/; the runtime's engine modules)."""
    own = {"runtime/dispatch.py", "runtime/engine.py", "runtime/sglang_state.py",
           "runtime/vllm_state.py", "runtime/probes.py"}
    found = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root).as_posix()
        if rel in own or rel.startswith(("probes/", "engines/")) or rel in _LEFT:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            for side in (node.left, *node.comparators):
                elts = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                if any(isinstance(e, ast.Constant) and e.value in ("sglang", "vllm") for e in elts):
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_the_engines_special_cases_one_by_name(tmp_path):
    assert _name_comparisons(VALIDATE) == []
    planted = tmp_path / "stackprobe"
    shutil.copytree(VALIDATE, planted, ignore=shutil.ignore_patterns("__pycache__"))
    (planted / "report.py").write_text((planted / "report.py").read_text()
                                       + "\n\ndef _planted(e):\n    return e == 'vllm'\n")
    assert [f.split(": ")[1] for f in _name_comparisons(planted)] == ["e == 'vllm'"]


def test_an_engine_whose_not_assessed_reader_crashes_gives_a_row_not_a_crashed_run(toy_on_path, tmp_path):
    """``ServingEngine.not_assessed`` that raises (a release whose source the enumeration does not expect) becomes one
    ``not-assessed`` row naming the engine and the error; the static tier still writes its report. Twin: the plain
    toy engine gives no such row."""
    from toyserve_engine import ToyServe

    class Crashing(ToyServe):
        def not_assessed(self, ctx):
            raise KeyError("a field the reader expected")

    engines.register(Crashing)
    rep, data, md = _static(tmp_path, "crashing")
    rows = [p for p in rep.paths if p["backend"] == "toyserve-paths"]
    assert [e.get("paths") for e in data["engines"] if e["name"] == "toyserve"] == [rows]
    assert rows and rows[0]["status"] == "not-assessed" and "KeyError" in rows[0]["cause"], rep.paths
    engines.unregister("toyserve")
    engines.register(ToyServe)
    plain, _, _ = _static(tmp_path, "plain")
    assert not [p for p in plain.paths if p["backend"] == "toyserve-paths"]


def test_the_host_stage_reads_an_engines_own_p2p_check_through_the_registry(toy_on_path):
    """``engines.p2p_check(name)`` (what the static tier gives ``host.apply``) runs the registered engine's own reader
    (``p2p_check_ref``): toyserve's reads its release's server_args.py, which has no skip_p2p_check field, so it says
    so; unregistered, no reader runs and the answer says no engine of that name is registered. A real engine's
    reader on its wheel: tests/test_host.py (SGLang 0.5.23 does not check by default)."""
    from toyserve_engine import ToyServe

    engines.register(ToyServe)
    try:
        assert engines.p2p_check("toyserve") == {"error": "toyserve: no skip_p2p_check field in toyserve/server_args.py"}
    finally:
        engines.unregister("toyserve")
    assert engines.p2p_check("toyserve")["error"].startswith("not assessed: no registered engine 'toyserve'")

    class Crashing(engines.ServingEngine):       # a reader that crashes is a not-assessed answer, not a crashed run
        name, dist, title = "crashing", "crashing", "Crashing"
        p2p_check_ref = "json:loads"              # json.loads() without its argument raises TypeError
    engines.register(Crashing)
    try:
        err = engines.p2p_check("crashing")["error"]
        assert err.startswith("not assessed: the P2P-check reader json:loads crashed (TypeError"), err
    finally:
        engines.unregister("crashing")

    class NoReader(engines.ServingEngine):
        name, dist, title = "noreader", "noreader", "NoReader"

    engines.register(NoReader)
    try:
        assert engines.p2p_check("noreader") == {"error": "not assessed: no reader of NoReader's own P2P check"}
    finally:
        engines.unregister("noreader")
