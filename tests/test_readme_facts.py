"""The README as a front page, with nothing lost: every figure and link/path the old README carried
(tests/data/readme_facts.txt, listed by scripts/readme_facts.py before the move to docs/) is in README.md or a
page under docs/, and the README stays short. Failing twins: a fact removed from every page, or a whole page
deleted, is named as missing, by the function and by the command line. Every relative link and #anchor of the
README and docs/ resolves (a planted broken one is caught)."""
from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "readme_facts.py"
LIST = ROOT / "tests" / "data" / "readme_facts.txt"

_spec = importlib.util.spec_from_file_location("readme_facts", SCRIPT)
assert _spec and _spec.loader
rf = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rf)


@pytest.fixture
def tree(tmp_path) -> Path:
    """A copy of the README and docs/, to plant removals in."""
    shutil.copy(ROOT / "README.md", tmp_path / "README.md")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    return tmp_path


def test_every_fact_of_the_old_readme_is_in_the_readme_or_docs():
    facts = rf.read_list(LIST)
    assert len(facts) > 600                       # the list of the 817-line README, not an empty file
    assert rf.missing(facts, ROOT) == []


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200, len(lines)
    text = "\n".join(lines)
    for must in ("bash scripts/dev.sh build --cuda 13.1", "bash scripts/dev.sh test", "SGLANG_ENABLE_PCIE_IPC_ALLREDUCE=1",
                 "--flashinfer-allreduce-fusion-backend", "python3 -m stackprobe.host", "python3 -m stackprobe.runtime p2p"):
        assert must in text, must
    linked = {p.split("#")[0] for p in re.findall(r"\]\((docs/[^)\s]+)\)", text)}
    assert linked and all((ROOT / p).is_file() for p in linked), linked
    assert {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")} - {"docs/index.md"} <= linked


def test_the_list_holds_figures_with_their_units_and_the_links():
    facts = set(rf.read_list(LIST))
    assert {"1 h 14 min", "41 GiB", "3 min 43 s", "0.901-0.913", "2.14.1", "results/validate/",
            "results/2xH200-SM90-NVLink/README.md", "sglang/srt/distributed/bootstrap.py:125"} <= facts


def test_extract_keeps_units_context_and_link_targets():
    md = ("Built in **1 h 14 min** on `41 GiB` ([`results/x/`](results/x/README.md)); world size 8, "
          "[9, 10] admitted, `layers/communicator.py:91`, torch 2.14.1.\n")
    assert rf.extract(md) == ["results/x/README.md", "1 h 14 min", "41 GiB", "results/x/", "size 8", "10] admitted",
                              "layers/communicator.py:91", "2.14.1"]
    facts = rf.extract(md)
    assert "size 8" in facts and "layers/communicator.py:91" in facts and "2.14.1" in facts
    assert not any(f.strip().isdigit() for f in facts)        # a bare "10" would be found anywhere: not a fact


def test_rewrapping_keeps_a_fact_changing_it_loses_it(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# x\n")
    (tmp_path / "docs" / "extra.md").write_text("it took 1 h\n14   min, **41 GiB**\n")
    assert rf.missing(["1 h 14 min", "41 GiB"], tmp_path) == []
    (tmp_path / "docs" / "extra.md").write_text("it took 1 h 15 min, 41 GB\n")
    assert rf.missing(["1 h 14 min", "41 GiB"], tmp_path) == ["1 h 14 min", "41 GiB"]


def test_a_planted_removal_is_caught(tree):
    facts = rf.read_list(LIST)
    assert rf.missing(facts, tree) == []
    for p in [tree / "README.md", *(tree / "docs").glob("*.md")]:
        p.write_text(p.read_text().replace("1 h 14 min", "about an hour"))
    assert "1 h 14 min" in rf.missing(facts, tree)


def test_a_deleted_page_is_caught_by_the_command(tree):
    (tree / "docs" / "radar.md").unlink()
    r = subprocess.run([sys.executable, str(SCRIPT), "check", "--root", str(tree), "--list", str(LIST)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "missing: 0.6.16.post4" in r.stdout               # the radar's bisection figure lived only there
    ok = subprocess.run([sys.executable, str(SCRIPT), "check"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, str(SCRIPT), "check", "--root", str(tree / "nowhere")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "run `extract` first" in bad.stderr


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces made hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(root: Path) -> list[str]:
    """Every relative link of README.md and docs/*.md whose file, or whose #anchor in a Markdown file, is not there."""
    out = []
    for page in rf.pages(root):
        text = page.read_text()
        targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"^\[[^\]]+\]: (\S+)", text, re.M)
        for t in targets:
            if re.match(r"[a-z]+:", t):
                continue
            path, _, anchor = t.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                out.append(f"{page.relative_to(root)}: {t} (no such file)")
            elif anchor and dest.suffix == ".md":
                slugs = {_slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), re.M)}
                if anchor not in slugs:
                    out.append(f"{page.relative_to(root)}: {t} (no such heading)")
    return out


def test_every_link_of_the_readme_and_docs_resolves():
    assert broken_links(ROOT) == []


def test_a_broken_link_or_anchor_is_caught(tree):
    shutil.copytree(ROOT / "results", tree / "results")
    assert broken_links(tree) == []
    page = tree / "docs" / "index.md"
    page.write_text(page.read_text() + "\n[x](results.md#no-such-heading) [y](../results/nowhere/)\n")
    assert broken_links(tree) == ["docs/index.md: results.md#no-such-heading (no such heading)",
                                  "docs/index.md: ../results/nowhere/ (no such file)"]
