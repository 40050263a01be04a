"""The facts a README carries, kept when it is rewritten.

A fact is a figure (a number with its unit, or with the word beside it when it has none: versions, durations,
sizes, counts, ratios, file:line citations) or a link or path (a Markdown link's target, a token with a ``/`` or a
known file suffix). ``extract`` lists them from a README before a move; ``check`` then finds each one in the README or
in a page under ``docs/``, and names every fact found in none of them.

Matching is on normalised text: Markdown emphasis (``*``) and code marks (`````) removed, every run of white space
made one space, so re-wrapping a paragraph or dropping bold keeps a fact; changing a figure, its unit or the word
beside it does not.

Usage::

    python scripts/readme_facts.py extract README.md --out tests/data/readme_facts.txt
    python scripts/readme_facts.py check [--list tests/data/readme_facts.txt] [--root .]

``check`` exits 0 when every fact is found, 1 naming each missing fact and the files read, 2 for bad input (a list
or root that does not exist).
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LIST = ROOT / "tests" / "data" / "readme_facts.txt"

# Words that make a number a measurement when they follow it (time, size, rate, share, count).
UNITS = {
    "s", "ms", "us", "ns", "min", "h", "GiB", "GB", "MiB", "MB", "KiB", "KB", "kB", "B", "TB", "%", "x", "MiB/s",
    "bytes", "units", "tests", "nodes", "packages", "releases", "lines", "words", "characters", "GPUs", "GPU",
    "cores", "calls", "runs", "claims", "verdicts", "layers", "steps", "files", "rows", "requests", "archs",
    "pieces", "images", "days", "seconds", "minutes", "hours", "commands", "modules", "pulls", "pull(s)",
}
PATH_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".toml", ".json", ".sh", ".cu", ".txt", ".so", ".whl", ".Dockerfile",
                 ".sbatch", ".lock")
_LEAD = "([{\"'<|"
_TRAIL = ")]}\"'>,.;:!?|"
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def normalise(text: str) -> str:
    """The text a fact is matched in: ``*`` and backticks removed, white space runs made one space."""
    return " ".join(text.replace("`", "").replace("*", "").split())


def _core(tok: str, start: int) -> tuple[str, int]:
    """A token without the punctuation around it, and where that core starts in the text."""
    lead = len(tok) - len(tok.lstrip(_LEAD))
    core = tok[lead:].rstrip(_TRAIL)
    return core, start + lead


def _is_path(core: str) -> bool:
    if core.endswith(PATH_SUFFIXES) or re.search(r"\.(py|md|yaml|toml|json|sh|cu|so)(:\d+)?$", core):
        return True
    return bool(re.search(r"[A-Za-z0-9_.~$-]/|/[A-Za-z0-9_.$-]", core)) and bool(re.search(r"[A-Za-z]", core))


def _unit(tok: str) -> str | None:
    word = tok.rstrip(_TRAIL) if tok not in UNITS else tok
    return word if word in UNITS else None


def _figure(text: str, toks: list[tuple[str, int]], i: int) -> tuple[str | None, int]:
    """The figure that token ``i`` starts, as a literal substring of ``text`` (None when it holds no digit), and
    the index of its last token (a unit it took in is not the start of another figure)."""
    core, start = _core(*toks[i])
    if not re.search(r"\d", core) or "](" in core:      # a link's parts are listed as paths
        return None, i
    end = start + len(core)
    j = i + 1
    extended = False
    while j < len(toks):                                  # "41 GiB", "1 h 14 min", "28 min 6 s"
        unit = _unit(toks[j][0])
        if not unit:
            break
        end = toks[j][1] + len(unit)
        extended = True
        if unit == toks[j][0] and j + 2 < len(toks) and re.fullmatch(r"\d+(\.\d+)?", toks[j + 1][0]) and _unit(toks[j + 2][0]):
            j += 2
            continue
        break
    last = j if extended else i
    if not extended and re.fullmatch(r"\d{1,3}", core):  # a bare small number: keep the word beside it
        prev = _core(*toks[i - 1]) if i > 0 else ("", 0)
        nxt = _core(*toks[i + 1]) if i + 1 < len(toks) else ("", 0)
        if re.search(r"[A-Za-z]", prev[0]) and "](" not in prev[0]:
            start = prev[1]
        elif re.search(r"[A-Za-z]", nxt[0]):
            end = nxt[1] + len(nxt[0].split("](")[0])
        else:
            return None, i                                # "10" alone would be found anywhere: no fact
    return text[start:end], last


def extract(markdown: str) -> list[str]:
    """Every fact of ``markdown``, in order of first appearance, each once (see the module docstring)."""
    text = normalise(markdown)
    facts: dict[str, None] = {}
    for m in _LINK.finditer(text):
        facts.setdefault(m.group(1), None)
    toks = [(m.group(0), m.start()) for m in re.finditer(r"\S+", text)]
    taken = -1                                            # the last token a figure took in
    for i, (tok, start) in enumerate(toks):
        if i > taken:
            fig, taken = _figure(text, toks, i)
            if fig and fig.strip():
                facts.setdefault(fig, None)
        offset = 0
        for part in tok.split("]("):                      # [label](target): the label's path and the target's
            core, _ = _core(part, start + offset)
            offset += len(part) + 2
            if core and _is_path(core):
                facts.setdefault(core, None)
    return list(facts)


def pages(root: Path) -> list[Path]:
    """The files a fact may live in: the README and every Markdown page under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def missing(facts: list[str], root: Path) -> list[str]:
    """The facts found in none of ``pages(root)``."""
    texts = [normalise(p.read_text()) for p in pages(root) if p.is_file()]
    return [f for f in facts if not any(f in t for t in texts)]


def read_list(path: Path) -> list[str]:
    """The facts of a committed list: one a line; ``#`` lines are its header."""
    return [ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("extract", help="list the facts of a README")
    ex.add_argument("readme", type=Path)
    ex.add_argument("--out", type=Path, help="write the list here (default: standard output)")
    ex.add_argument("--source", default="", help="where the README came from, for the list's header")
    ck = sub.add_parser("check", help="find every listed fact in README.md or docs/*.md")
    ck.add_argument("--list", type=Path, default=DEFAULT_LIST)
    ck.add_argument("--root", type=Path, default=ROOT)
    a = ap.parse_args(argv)
    if a.cmd == "extract":
        if not a.readme.is_file():
            print(f"readme_facts: {a.readme} is not a file; give the README to list facts from.", file=sys.stderr)
            return 2
        facts = extract(a.readme.read_text())
        head = ["# Facts of the README before it became a front page: every figure and every link or path.",
                "# Made by `python scripts/readme_facts.py extract`; checked by tests/test_readme_facts.py: each line",
                "# must appear in README.md or docs/*.md (Markdown emphasis and white space normalised).",
                f"# Source: {a.source or a.readme.name}. {len(facts)} facts."]
        body = "\n".join(head + facts) + "\n"
        if a.out:
            a.out.parent.mkdir(parents=True, exist_ok=True)
            a.out.write_text(body)
        else:
            sys.stdout.write(body)
        return 0
    if not a.list.is_file() or not (a.root / "README.md").is_file():
        print(f"readme_facts: need the list {a.list} and {a.root / 'README.md'}; run `extract` first or pass "
              "--list/--root.", file=sys.stderr)
        return 2
    facts = read_list(a.list)
    lost = missing(facts, a.root)
    for f in lost:
        print(f"missing: {f}")
    read = ", ".join(str(p.relative_to(a.root)) for p in pages(a.root) if p.is_file())
    print(f"{len(facts) - len(lost)} of {len(facts)} facts found in {read}", file=sys.stderr)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
