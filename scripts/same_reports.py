"""Run two revisions' validation suites over the same installed wheels and show that their reports are the same.

    python scripts/same_reports.py OLD_REV NEW_REV                   # every configuration, both report formats
    python scripts/same_reports.py OLD_REV NEW_REV --only sglang-0.5.23-pcie
    python scripts/same_reports.py OLD_REV NEW_REV --old-file validate/stackprobe/probes/x.py@REV

The validate half's counterpart of ``scripts/same_outputs.py`` (which checks the build half): for a change that must
not change what the suite reports (a layout move, a refactor), each revision's ``validate/`` folder is exported
(``git archive REV validate | tar -x``) into a folder of its own, and that suite's static tier
(``python -m stackprobe --json F --markdown M --quiet --arch 12.0 --world-size 8 ...``) reads the same pinned wheels
(``pip install --no-deps --target`` folders, put on ``PYTHONPATH`` after the suite folder as the tests do) with this
project's interpreter, per configuration in :data:`CONFIGS`. Each run gets an empty ``STACKPROBE_CACHE`` of its own
(nothing one revision writes is read by the other) and the same clean environment (no ``CUDA_``, ``FLASHINFER_``,
``NCCL_``, ``SGLANG_``, ``VLLM_``, ``PYTHON`` variables; ``PATH`` is the interpreter's folder and the OS folders).
The runtime tier's probe list (``python -m stackprobe.runtime list``, CPU only, no GPU touched) is compared too.

What must differ between two runs is masked, and nothing else (:data:`IGNORED`, :data:`MD_IGNORED`):

* JSON: ``created`` (the run's UTC time), ``provenance.suite_digest`` (the sha256 of the suite's own files, which a
  move changes by definition), ``options.seconds``, ``environment.health.seconds`` and
  ``environment.health.imports[*].seconds`` (measured durations);
* Markdown: the same values where the text prints them (``created <time>``, ``suite sha256:<hex>``,
  ``checks took <s> s``), masked in place so the rest of each line is still compared.

``--layout``: the change moves keys of the report (a new ``schema``): the old revision's JSON is read through the new
revision's own loader (``stackprobe.report.translate_v3`` of the new export, in a process of its own) before the
comparison, and the schema number is masked too (``schema`` in the JSON, ``schema N`` in the Markdown); every other
value, and the whole Markdown, must still be the same.

``--old-file PATH@REV`` takes one file of the old export from another revision (repeatable): for an old revision
that cannot run as committed (a file deleted a commit early), the report says which file and why.

Wheels: the folders under ``$CUDASTACK_TEST_CACHE/targets`` (default ``~/.cache/cudastack-tests/targets``) that
``tests/validate_support.pip_target`` makes; a missing one is an error naming the ``pip install`` that makes it.
Exit 0 when every output is the same, 1 when one differs (a unified diff per output), 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compare_outputs  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TARGETS = Path(os.environ.get("CUDASTACK_TEST_CACHE", Path.home() / ".cache" / "cudastack-tests")) / "targets"
#: name -> (pip target folders, suite arguments beyond COMMON); the pins are the images' (recipes/sglang.yaml,
#: recipes/flashinfer.yaml, recipes/vllm.yaml).
CONFIGS: dict[str, tuple[list[str], list[str]]] = {
    "sglang-0.5.23": (["sglang-0.5.23", "flashinfer-python-0.7.2"], ["--topology", "pcie"]),
    "sglang-0.5.23-pcie-ipc": (["sglang-0.5.23", "flashinfer-python-0.7.2"],
                               ["--topology", "pcie", "--env", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1"]),
    "sglang-0.5.23-nvlink": (["sglang-0.5.23", "flashinfer-python-0.7.2"], ["--topology", "nvlink"]),
    "sglang-0.5.9": (["sglang-0.5.9", "flashinfer-python-0.6.3"], ["--topology", "pcie"]),
    "vllm-0.33.0": (["vllm-0.33.0", "flashinfer-python-0.7.2.post1"], ["--topology", "pcie", "--engine", "vllm"]),
}
COMMON = ["--quiet", "--arch", "12.0", "--world-size", "8"]
#: JSON key paths masked before comparing ("*" is every item of a list): the run's time, the suite's own digest,
#: measured durations. Nothing else is ignored.
IGNORED: tuple[tuple[str, ...], ...] = (
    ("created",),
    ("provenance", "suite_digest"),
    ("options", "seconds"),
    ("environment", "health", "seconds"),
    ("environment", "health", "imports", "*", "seconds"),
)
#: (pattern, replacement) applied to the Markdown: the same values where the text prints them.
MD_IGNORED: tuple[tuple[str, str], ...] = (
    (r"created \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "created <time>"),
    (r"suite sha256:[0-9a-f]{64}", "suite sha256:<digest>"),
    (r"checks took \d+(?:\.\d+)? s", "checks took <s> s"),
)
MASK = "<ignored>"


def _mask_path(obj, path: tuple[str, ...]):
    if not path:
        return MASK
    head, rest = path[0], path[1:]
    if head == "*" and isinstance(obj, list):
        return [_mask_path(v, rest) for v in obj]
    if isinstance(obj, dict) and head in obj:
        return {**obj, head: _mask_path(obj[head], rest)}
    return obj


def mask_report(report: dict) -> dict:
    """A copy of a static report (the JSON ``python -m stackprobe --json`` writes, any schema) with every key path
    in :data:`IGNORED` replaced by ``"<ignored>"``; a path the report lacks is left absent (so a key one revision
    writes and the other does not still shows as a difference)."""
    for path in IGNORED:
        report = _mask_path(report, path)
    return report


def mask_markdown(text: str) -> str:
    """``text`` with the values of :data:`MD_IGNORED` masked in place."""
    for pattern, repl in MD_IGNORED:
        text = re.sub(pattern, repl, text)
    return text


def compare(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """One unified diff per output (``{name: text}``; a JSON output is masked and re-dumped with sorted keys by
    :func:`outputs`) that differs between the two revisions; an output only one revision produced differs, and a
    run that exited non-zero in either revision is one more difference (a suite that fails the same way in both
    shows nothing about the change)."""
    return compare_outputs.compare(old, new, "revision")


def outputs(report_json: str | None, markdown: str | None, name: str) -> dict[str, str]:
    """``{"NAME: json": masked JSON text, "NAME: md": masked Markdown}`` of one run (``"<not written>"`` for a
    file the run did not write)."""
    js = "<not written>" if report_json is None else json.dumps(mask_report(json.loads(report_json)), indent=1,
                                                               sort_keys=True)
    return {f"{name}: json": js, f"{name}: md": "<not written>" if markdown is None else mask_markdown(markdown)}


def export(rev: str, dest: Path, overlays: list[tuple[str, str]]) -> Path:
    """``dest/validate`` of revision ``rev`` (``git archive``), with each ``(path, other rev)`` overlay taken from
    the other revision. Raises CalledProcessError on an unknown revision or path."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "validate"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    for path, other in overlays:
        blob = subprocess.run(["git", "-C", str(ROOT), "show", f"{other}:{path}"], check=True, capture_output=True)
        (dest / path).write_bytes(blob.stdout)
    return dest / "validate"


#: with ``--layout``: masked too (the schema number; the layout is translated, its values compared)
LAYOUT_IGNORED: tuple[tuple[str, ...], ...] = (("schema",),)
LAYOUT_MD_IGNORED: tuple[tuple[str, str], ...] = ((r"; schema \d+", "; schema <n>"),)


def translate(report_json: str, suite: Path) -> str:
    """``report_json`` in the layout of the suite in ``suite`` (its ``stackprobe.report.translate_v3``, run by this
    interpreter with only that suite on the path). Raises CalledProcessError when the suite cannot translate it."""
    code = ("import json, sys; from stackprobe.report import translate_v3; "
            "print(json.dumps(translate_v3(json.loads(sys.stdin.read()))))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"], env["PYTHONDONTWRITEBYTECODE"] = str(suite), "1"
    return subprocess.run([sys.executable, "-c", code], input=report_json, env=env, capture_output=True, text=True,
                          check=True, timeout=120).stdout


def layout_masked(res: dict[str, str]) -> dict[str, str]:
    """``res`` (:func:`outputs`) with the schema number masked as well (``--layout``)."""
    out = {}
    for k, v in res.items():
        if k.endswith(": json") and v != "<not written>":
            d = json.loads(v)
            for path in LAYOUT_IGNORED:
                d = _mask_path(d, path)
            v = json.dumps(d, indent=1, sort_keys=True)
        elif k.endswith(": md"):
            for pattern, repl in LAYOUT_MD_IGNORED:
                v = re.sub(pattern, repl, v)
        out[k] = v
    return out


def run_suite(suite: Path, name: str, work: Path, translate_with: Path | None = None) -> dict[str, str]:
    """Outputs of configuration ``name`` read by the suite in ``suite`` (a ``validate/`` folder); with
    ``translate_with`` (a newer suite's folder), its JSON in that suite's layout (:func:`translate`)."""
    targets, extra = CONFIGS[name]
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDA_", "FLASHINFER_", "NCCL_", "SGLANG_", "VLLM_", "PYTHON"))}
    env["PYTHONPATH"] = os.pathsep.join([str(suite)] + [str(TARGETS / t) for t in targets])
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    cache = work / "cache" / name
    shutil.rmtree(cache, ignore_errors=True)
    env["STACKPROBE_CACHE"] = str(cache)
    js, md = work / f"{name}.json", work / f"{name}.md"
    for f in (js, md):
        f.unlink(missing_ok=True)
    p = subprocess.run([sys.executable, "-m", "stackprobe", "--json", str(js), "--markdown", str(md), *COMMON,
                        *extra], env=env, cwd=work, capture_output=True, text=True, timeout=1800)
    (work / f"{name}.stderr").write_text(p.stderr)
    text = js.read_text() if js.is_file() else None
    if text is not None and translate_with is not None:
        text = translate(text, translate_with)
    res = outputs(text, md.read_text() if md.is_file() else None, name)
    res[f"{name}: exit"] = str(p.returncode)
    return res


def runtime_list(suite: Path) -> dict[str, str]:
    """The runtime tier's probe list and presets (``python -m stackprobe.runtime list``; CPU only)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA_", "NCCL_", "PYTHON"))}
    env["PYTHONPATH"], env["PYTHONDONTWRITEBYTECODE"] = str(suite), "1"
    p = subprocess.run([sys.executable, "-m", "stackprobe.runtime", "list"], env=env, capture_output=True, text=True,
                       timeout=600)
    return {"runtime-list: stdout": p.stdout, "runtime-list: exit": str(p.returncode)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", help="revision before the change")
    ap.add_argument("new", help="revision after the change")
    ap.add_argument("--only", action="append", default=[], help="run only this configuration (repeatable; names: "
                    + ", ".join(CONFIGS) + ", runtime-list)")
    ap.add_argument("--old-file", action="append", default=[], metavar="PATH@REV",
                    help="take PATH of the old export from REV (repeatable)")
    ap.add_argument("--layout", action="store_true", help="the new revision moves report keys: read the old JSON "
                    "through the new suite's translate_v3 and mask the schema number")
    ap.add_argument("--work", type=Path, help="folder for the exports and reports (default: a new temporary folder)")
    a = ap.parse_args(argv)
    unknown = set(a.only) - set(CONFIGS) - {"runtime-list"}
    if unknown:
        ap.error(f"--only {', '.join(sorted(unknown))}: no such configuration; choose from "
                 + ", ".join(CONFIGS) + ", runtime-list")
    overlays = []
    for spec in a.old_file:
        if "@" not in spec:
            ap.error(f"--old-file {spec}: give PATH@REV, e.g. validate/stackprobe/probes/x.py@abc123^")
        path, rev = spec.rsplit("@", 1)
        overlays.append((path, rev))
    for rev in (a.old, a.new):
        if subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "-q", f"{rev}^{{commit}}"],
                          capture_output=True).returncode != 0:
            ap.error(f"{rev} is not a revision of this repository: give two commits, e.g. abc123^ abc123")
    names = [n for n in CONFIGS if not a.only or n in a.only]
    missing = sorted({t for n in names for t in CONFIGS[n][0] if not (TARGETS / t / ".ready").is_file()})
    if missing:
        ap.error(f"wheel folders missing under {TARGETS}: {', '.join(missing)}; make each with "
                 "`pip install --no-deps --target <folder> NAME==VERSION` (or run the tests that pin them)")
    work = (a.work or Path(tempfile.mkdtemp(prefix="same-reports-"))).resolve()
    results = []
    suites = {"old": export(a.old, work / "tree-old", overlays), "new": export(a.new, work / "tree-new", [])}
    for label, rev in (("old", a.old), ("new", a.new)):
        suite = suites[label]
        out = work / f"out-{label}"
        out.mkdir(parents=True, exist_ok=True)
        res: dict[str, str] = {}
        for name in names:
            print(f"  {label} {rev}: {name}", file=sys.stderr, flush=True)
            res.update(run_suite(suite, name, out, suites["new"] if a.layout and label == "old" else None))
        if not a.only or "runtime-list" in a.only:
            res.update(runtime_list(suite))
        results.append(layout_masked(res) if a.layout else res)
    diffs = compare(*results)
    done = sorted({k.split(": ")[0] for k in results[0]})
    print(f"{len(done)} configurations, {len(results[0])} outputs per revision; reports in {work}")
    for name in done:
        same = all(results[0].get(k) == results[1].get(k) for k in set(results[0]) | set(results[1])
                   if k.startswith(name + ": "))
        print(f"  {name}: {'identical' if same else 'DIFFERS'}")
    return compare_outputs.verdict(diffs, done, a.old, a.new)


if __name__ == "__main__":
    sys.exit(main())
