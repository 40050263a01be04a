"""Bytes and seconds of `invoke outdated`, cold and warm, for this tree's radar and for the radar before the site
readers ("today's radar", a git revision), in one run, with their answers compared.

    python benchmarks/radar_bytes.py                      # --cuda 13.1, both radars, cold then warm
    python benchmarks/radar_bytes.py --all                # every toolchain (the old radar downloads about 6 GB)
    python benchmarks/radar_bytes.py --baseline REV --only new

Each radar runs as ``python -m invoke outdated`` in its own tree (both extracted with ``git archive`` into a
temporary folder: the checkout is not touched, and edits made in it during the run change nothing) with an empty cache (``CUDASTACK_CACHE`` and ``STACKPROBE_CACHE`` in
a temporary folder: cold), then again on the same cache (warm). Bytes are what the index answered: every HTTP
response's ``Content-Length`` (project pages, PEP 658 metadata, range reads, whole downloads), summed by a hook on
``requests.Session.send`` in the radar's own process. The answers compared are the columns that do not depend on how
a move is read: per toolchain, chain and component, pinned, newest, newest allowed and held back by.

Prints one table (radar, run, MB, seconds, HTTP responses) and the answer comparison; exit 1 when the answers
differ or a radar fails. Needs the network (PyPI) and git.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# runs `invoke outdated` in this process with every response's Content-Length summed into a file at exit
_COUNTER = r"""
import atexit, json, runpy, sys
import requests
_n = {"bytes": 0, "responses": 0}
_send = requests.Session.send
def send(self, request, **kw):
    r = _send(self, request, **kw)
    _n["responses"] += 1
    try:
        _n["bytes"] += int(r.headers.get("content-length") or 0)
    except ValueError:
        pass
    return r
requests.Session.send = send
out = sys.argv[1]
atexit.register(lambda: open(out, "w").write(json.dumps(_n)))
sys.argv = ["invoke"] + sys.argv[2:]
runpy.run_module("invoke", run_name="__main__")
"""


def baseline_rev() -> str:
    """The parent of the commit that added the site fetcher (cudastack/radar/sitefetch.py): the radar before it."""
    out = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", "cudastack/radar/sitefetch.py"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    if not out:
        raise SystemExit("no commit adds cudastack/radar/sitefetch.py: pass --baseline REV")
    return out[-1] + "^"


def extract(rev: str, dest: Path) -> Path:
    """The tree of ``rev`` under ``dest`` (``git archive``; the checkout is untouched)."""
    dest.mkdir(parents=True, exist_ok=True)
    arch = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch, check=True)
    return dest


def run_radar(tree: Path, cache: Path, args: list[str], out: Path) -> dict:
    """One `invoke outdated` in ``tree`` on ``cache``: {"bytes", "responses", "seconds", "rc", "json"}."""
    count = out.with_suffix(".count.json")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDASTACK_", "STACKPROBE_", "PYTHONPATH"))}
    env.update(CUDASTACK_CACHE=str(cache / "cudastack"), STACKPROBE_CACHE=str(cache / "stackprobe"),
               PYTHONPATH=os.pathsep.join([str(tree), str(tree / "validate")]))
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", _COUNTER, str(count), "outdated", "--out", str(out), *args], cwd=tree,
                       env=env, capture_output=True, text=True)
    secs = time.time() - t0
    n = json.loads(count.read_text()) if count.is_file() else {"bytes": 0, "responses": 0}
    res = {"seconds": secs, "rc": p.returncode, **n, "json": None, "stderr": p.stderr[-2000:]}
    js = sorted(out.glob("radar*.json"))
    if js:
        res["json"] = json.loads(js[0].read_text())
    return res


def answers(data: list | None) -> dict:
    """(toolchain, runtime, component) -> (pinned, newest, newest allowed, held back by) of a radar.json."""
    out = {}
    for t in data or []:
        for r in t["rows"]:
            out[(t["toolchain"], t.get("runtime", ""), r["component"])] = (
                r["pinned"], r["newest"], r["newest_allowed"], tuple(r["held_back_by"]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all", action="store_true", help="every toolchain (default: --cuda 13.1)")
    ap.add_argument("--cuda", default="13.1", help="the toolchain without --all (default 13.1)")
    ap.add_argument("--baseline", help="git revision of today's radar (default: before the site readers)")
    ap.add_argument("--rev", default="HEAD", help="git revision of the site radar (default HEAD: committed code only, "
                    "so edits in the working tree during the run cannot change it)")
    ap.add_argument("--only", choices=("both", "new", "old"), default="both")
    ap.add_argument("--keep", action="store_true", help="keep the temporary caches and outputs")
    a = ap.parse_args(argv)
    args = [] if a.all else ["--cuda", a.cuda]
    work = Path(tempfile.mkdtemp(prefix="radar-bench-"))
    trees = {}
    if a.only in ("both", "new"):
        trees[f"site radar ({a.rev})"] = extract(a.rev, work / "new")
    if a.only in ("both", "old"):
        rev = a.baseline or baseline_rev()
        trees[f"today's radar ({rev})"] = extract(rev, work / "baseline")
    results: dict = {}
    for label, tree in trees.items():
        cache = work / f"cache-{len(results)}"
        for run in ("cold", "warm"):
            out = work / f"out-{len(results)}-{run}"
            r = run_radar(tree, cache, args, out)
            results[(label, run)] = r
            print(f"{label:40} {run:5} {r['bytes'] / 1e6:10.1f} MB {r['seconds']:8.1f} s {r['responses']:6} responses"
                  f"  rc {r['rc']}", flush=True)
            if r["rc"] != 0:
                print(r["stderr"], file=sys.stderr)
    what = " ".join(args) or "(every toolchain)"
    print(f"\n`invoke outdated {what}`\n\n| radar | run | MB | seconds | HTTP responses |\n| --- | --- | --- | --- | --- |")
    for (label, run), r in results.items():
        print(f"| {label} | {run} | {r['bytes'] / 1e6:.1f} | {r['seconds']:.1f} | {r['responses']} |")
    rc = 1 if any(r["rc"] != 0 for r in results.values()) else 0
    colds = [answers(r["json"]) for (lab, run), r in results.items() if run == "cold"]
    if len(colds) == 2:
        a0, a1 = colds
        diff = sorted(k for k in set(a0) | set(a1) if a0.get(k) != a1.get(k))
        print(f"\nanswers (pinned, newest, newest allowed, held back by): {len(a0)} rows, "
              + ("the same" if not diff else f"{len(diff)} differ: {diff}"))
        rc = rc or (1 if diff else 0)
    if not a.keep:
        import shutil
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"kept: {work}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
