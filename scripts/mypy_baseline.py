"""mypy against a committed baseline that may only shrink.

    python scripts/mypy_baseline.py             # check: exit 1 on any error the baseline does not hold
    python scripts/mypy_baseline.py --update    # rewrite the baseline from the current errors

mypy runs with the project's ``[tool.mypy]`` settings (pyproject.toml). Each error is kept as
``path: [code] message`` (no line number, so an edit above an old error does not make it new); the baseline
(``scripts/mypy-baseline.txt``) holds one such line per known error, repeated as often as it occurs. A check
fails when some line occurs more often now than in the baseline, and says which; errors fixed since the
baseline are listed so that ``--update`` can drop them. Extra arguments go to mypy (e.g. the files to check).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / "scripts" / "mypy-baseline.txt"
_ERROR = re.compile(r"^(?P<path>[^:\s]+\.py):\d+(?::\d+)?: error: (?P<msg>.*?)\s+\[(?P<code>[a-z0-9-]+)\]$")


def normalise(output: str) -> Counter[str]:
    """mypy's text output -> Counter of ``path: [code] message`` (notes and the summary line are dropped)."""
    out: Counter[str] = Counter()
    for line in output.splitlines():
        m = _ERROR.match(line.strip())
        if m:
            out[f"{m['path']}: [{m['code']}] {m['msg']}"] += 1
    return out


def run_mypy(args: list[str], cwd: Path) -> str:
    p = subprocess.run([sys.executable, "-m", "mypy", "--no-error-summary", "--no-pretty", "--show-column-numbers",
                        *args], cwd=cwd, capture_output=True, text=True)
    if p.returncode not in (0, 1):          # 2: mypy itself failed (bad config, crash)
        sys.exit(f"mypy failed (exit {p.returncode}):\n{p.stdout}{p.stderr}")
    return p.stdout


def read_baseline(path: Path) -> Counter[str]:
    if not path.is_file():
        return Counter()
    return Counter(ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#"))


def write_baseline(path: Path, errors: Counter[str]) -> None:
    lines = sorted(errors.elements())
    path.write_text("# mypy errors known when this file was written; `python scripts/mypy_baseline.py --update`\n"
                    + "".join(f"{ln}\n" for ln in lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--update", action="store_true", help="rewrite the baseline from the current errors")
    ap.add_argument("--baseline", type=Path, default=BASELINE, help=f"baseline file (default {BASELINE})")
    ap.add_argument("--cwd", type=Path, default=ROOT, help="folder mypy runs in (default: the project root)")
    ns, mypy_args = ap.parse_known_args(argv)
    now = normalise(run_mypy(mypy_args, ns.cwd))
    if ns.update:
        write_baseline(ns.baseline, now)
        print(f"mypy baseline: {sum(now.values())} errors written to {ns.baseline}")
        return 0
    known = read_baseline(ns.baseline)
    new = now - known
    fixed = known - now
    if fixed:
        print(f"mypy: {sum(fixed.values())} baseline error(s) are fixed; drop them with "
              "`python scripts/mypy_baseline.py --update`:")
        for ln in sorted(fixed.elements()):
            print(f"  fixed: {ln}")
    if new:
        print(f"mypy: {sum(new.values())} new error(s), not in {ns.baseline.name} (fix them; the baseline only "
              "shrinks):")
        for ln in sorted(new.elements()):
            print(f"  NEW: {ln}")
        return 1
    print(f"mypy: {sum(now.values())} error(s), all in the baseline ({sum(known.values())} there)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
