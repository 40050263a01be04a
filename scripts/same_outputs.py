"""Run the same commands in two checkouts of the project and show that what they print and write is the same.

    python scripts/same_outputs.py OLD_TREE NEW_TREE              # the quick set: plans, bake file, cluster job
    python scripts/same_outputs.py OLD_TREE NEW_TREE --full       # also locked dry runs, a fresh lock, a report

For a change that must not change behaviour (a layout move, a refactor): each command runs in OLD_TREE and then
in NEW_TREE with that tree's own package (``PYTHONPATH=TREE:TREE/validate``, ``python -m invoke`` in the tree),
its standard output and the files it writes kept apart per tree. The paths a command is given (state folder,
output folder, lockfiles copy) are the same absolute paths for both trees, and the tree's own path reads
``<tree>`` (a dry run names its recipes folder), so a path that lands in an output does not read as a difference. Standard error is kept but not compared (progress lines carry timings).

Outputs compared byte for byte: the dry run of several plans (toolchains, bases, ``--only``, an arch list, a
source method), the buildx bake file, the Slurm and Kubernetes cluster jobs; with ``--full`` also
``build --locked --dry-run`` of 12.8 and 13.1 (the lock verified against each tree's plan, which reads the
package index), ``invoke lock`` of 12.8 into a copy of the lockfiles (a fresh resolution: run back to back, the
index should not move between the two), and ``invoke validate`` of this environment. What differs between any
two runs is masked before comparing (:func:`normalise`: time stamps, durations, the interpreter's and the
tree's own paths; JSON keys in ``VOLATILE``), and nothing else.

Exit 0 when every output is the same, 1 when one differs (a unified diff is printed), 2 on bad arguments.
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

#: (name, invoke arguments, files the command writes under OUT, full set only); "{out}" and "{state}" are
#: replaced by the run's absolute output and state folders.
COMMANDS: list[tuple[str, list[str], list[str], bool]] = [
    ("plan-13.1", ["plan", "--cuda", "13.1", "--state-dir", "{state}"], [], False),
    ("plan-12.8", ["plan", "--cuda", "12.8", "--state-dir", "{state}"], [], False),
    ("plan-13.1-nvidia", ["plan", "--cuda", "13.1", "--base", "nvidia", "--state-dir", "{state}"], [], False),
    ("plan-12.8-pip", ["plan", "--cuda", "12.8", "--base", "pip", "--skip", "flash-attn", "--state-dir", "{state}"],
     [], False),
    ("plan-13.1-only-vllm", ["plan", "--cuda", "13.1", "--only", "vllm", "--state-dir", "{state}"], [], False),
    ("plan-13.1-archs-source", ["plan", "--cuda", "13.1", "--arch", "9.0;12.0", "--method", "torch=source",
                                "--state-dir", "{state}"], [], False),
    ("bake-13.1", ["bake", "--cuda", "13.1", "--output", "{out}/bake/docker-bake.json", "--state-dir", "{state}"],
     ["bake/docker-bake.json"], False),
    ("cluster-slurm", ["cluster-job", "--cuda", "13.1", "--scheduler", "slurm", "--nodes", "2", "--gpus", "8",
                       "--image", "registry.example:5000/cudastack/cu13.1@sha256:" + "ab" * 32,
                       "--output", "{out}/job.sbatch"], ["job.sbatch"], False),
    ("cluster-k8s", ["cluster-job", "--cuda", "13.1", "--scheduler", "kubernetes", "--gpus", "8",
                     "--image", "registry.example:5000/cudastack/cu13.1@sha256:" + "ab" * 32,
                     "--output", "{out}/job.k8s.yaml"], ["job.k8s.yaml"], False),
    ("locked-dry-run-13.1", ["build", "--cuda", "13.1", "--locked", "--dry-run", "--state-dir", "{state}"], [], True),
    ("locked-dry-run-12.8", ["build", "--cuda", "12.8", "--locked", "--dry-run", "--state-dir", "{state}"], [], True),
    ("lock-12.8", ["lock", "--cuda", "12.8", "--lockfiles", "{out}/lockfiles"], ["lockfiles/12.8.lock.yaml"], True),
    ("validate-here", ["validate", "--out", "{out}/validate", "--markdown", "{out}/validate.md"],
     ["validate/*.json", "validate.md"], True),
]
#: JSON keys whose values record when, how long or where a run happened, masked before a report is compared.
VOLATILE = {"generated_at", "started_at", "finished_at", "duration_s", "elapsed_s", "wall_s", "seconds", "hostname",
            "created", "timestamp"}


def _mask(obj):
    if isinstance(obj, dict):
        return {k: ("<masked>" if k in VOLATILE else _mask(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_mask(v) for v in obj]
    return obj


def _read(path: Path) -> str:
    text = path.read_text(errors="replace")
    if path.suffix == ".json":
        try:
            return json.dumps(_mask(json.loads(text)), indent=1, sort_keys=True)
        except json.JSONDecodeError:
            return text
    return text


def run_tree(tree: Path, out: Path, state: Path, full: bool, only: list[str]) -> dict[str, str]:
    """{output name: text} of every command run in ``tree``; ``out`` is emptied first and holds the files the
    commands write (the tree's lockfiles are copied into ``out/lockfiles`` for ``invoke lock``)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copytree(tree / "lockfiles", out / "lockfiles")
    env = dict(os.environ, PYTHONPATH=f"{tree}{os.pathsep}{tree / 'validate'}", PYTHONDONTWRITEBYTECODE="1")
    results: dict[str, str] = {}
    for name, args, files, is_full in COMMANDS:
        if (is_full and not full) or (only and name not in only):
            continue
        argv = [a.replace("{out}", str(out)).replace("{state}", str(state)) for a in args]
        print(f"  {tree.name}: invoke {' '.join(argv)}", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, "-m", "invoke", *argv], cwd=tree, env=env, capture_output=True,
                              text=True, timeout=3600)
        results[f"{name}: exit"] = str(proc.returncode)
        results[f"{name}: stdout"] = proc.stdout
        (out / f"{name}.stderr").write_text(proc.stderr)
        for pattern in files:
            for f in sorted(out.glob(pattern)) or [out / pattern]:
                results[f"{name}: {f.relative_to(out)}"] = _read(f) if f.is_file() else "<not written>"
    return {k: normalise(v, tree) for k, v in results.items()}


def normalise(text: str, tree: Path) -> str:
    """``text`` with what differs between any two runs masked: the interpreter's prefix (``<venv>``, shared by
    both trees), the tree's own path (``<tree>``), UTC time stamps (``<time>``: a lock's ``resolved_at``, a
    report's ``created``) and measured durations (``took <s> s``)."""
    text = text.replace(sys.prefix, "<venv>").replace(str(tree), "<tree>")
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)", "<time>", text)
    return re.sub(r"\btook \d+(?:\.\d+)? s\b", "took <s> s", text)


def compare(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """One unified diff per output that differs (an output only one tree produced counts as differing), and one
    line per command that failed in either tree: a command that fails the same way in both shows nothing about
    the change, so it counts as a difference too."""
    return compare_outputs.compare(old, new, "tree (see its .stderr file)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path, help="checkout before the change")
    ap.add_argument("new", type=Path, help="checkout after the change")
    ap.add_argument("--full", action="store_true", help="also the locked dry runs, a fresh lock and a report "
                                                        "(minutes; reads the package index)")
    ap.add_argument("--only", action="append", default=[], help="run only this command (repeatable; names: "
                    + ", ".join(c[0] for c in COMMANDS) + ")")
    ap.add_argument("--work", type=Path, help="folder for the outputs (default: a new temporary folder)")
    a = ap.parse_args(argv)
    for tree in (a.old, a.new):
        if not (tree / "tasks.py").is_file() or not (tree / "recipes").is_dir():
            ap.error(f"{tree} is not a checkout of this project (no tasks.py or recipes/ there): give the two "
                     "checkouts to compare, e.g. a `git worktree add /tmp/before <commit>` and this one.")
    unknown = set(a.only) - {c[0] for c in COMMANDS}
    if unknown:
        ap.error(f"--only {', '.join(sorted(unknown))}: no such command; choose from "
                 + ", ".join(c[0] for c in COMMANDS))
    work = a.work or Path(tempfile.mkdtemp(prefix="same-outputs-"))
    state, out = (work / "state").resolve(), (work / "out").resolve()
    state.mkdir(parents=True, exist_ok=True)
    results = []
    for label, tree in (("old", a.old.resolve()), ("new", a.new.resolve())):
        results.append(run_tree(tree, out, state, a.full, a.only))
        shutil.rmtree(work / f"out-{label}", ignore_errors=True)
        shutil.move(str(out), str(work / f"out-{label}"))
    diffs = compare(*results)
    names = sorted({k.split(": ")[0] for k in results[0]})
    print(f"{len(names)} commands, {len(results[0])} outputs per tree; outputs in {work}")
    return compare_outputs.verdict(diffs, names, a.old, a.new)


if __name__ == "__main__":
    sys.exit(main())
