"""What ``scripts/same_outputs.py`` and ``scripts/same_reports.py`` share: comparing the named outputs of two runs
(``{name: text}``, an old and a new one) and printing the verdict.

A command's exit status is one output among the others, keyed ``"NAME: exit"``; a run that exited non-zero in
either of the two is a difference of its own, so a command that fails the same way in both never reads as a pass.
"""
from __future__ import annotations

import difflib


def compare(old: dict[str, str], new: dict[str, str], where: str) -> list[str]:
    """One line per ``"NAME: exit"`` output that is not ``"0"`` (``NAME exited N in the old WHERE``), then one
    unified diff per output that differs between ``old`` and ``new`` (an output only one of them has differs:
    the other reads ``<missing>``)."""
    diffs = [f"{key.split(': ')[0]} exited {tree[key]} in the {label} {where}"
             for label, tree in (("old", old), ("new", new)) for key in sorted(tree)
             if key.endswith(": exit") and tree[key] != "0"]
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key, "<missing>"), new.get(key, "<missing>")
        if a != b:
            diffs.append("".join(difflib.unified_diff(a.splitlines(True), b.splitlines(True),
                                                      f"old {key}", f"new {key}", n=2)))
    return diffs


def verdict(diffs: list[str], names: list[str], old: object, new: object) -> int:
    """Print the differences and ``DIFFERENT: ...`` (exit status 1), or ``IDENTICAL: ...`` naming every output
    compared (exit status 0)."""
    if diffs:
        print("\n".join(diffs))
        print(f"DIFFERENT: {len(diffs)} output(s) differ between {old} and {new}")
        return 1
    print(f"IDENTICAL: every output of {', '.join(names)} is the same in {old} and {new}")
    return 0
