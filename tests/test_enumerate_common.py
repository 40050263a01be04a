"""stackprobe.probes.enumerate_common, what the SGLang and vLLM path enumerations share: the comment block right
above a declaration (up to the first line that is no comment), its help text without separator lines, and the term
filter (a name's ``_`` read as spaces, so ``\\bnccl`` finds ``SGLANG_NCCL_...``; the raw name alone would not)."""
from __future__ import annotations

import re

from stackprobe.probes import enumerate_common as ec

TEXT = """X = 1
# an older note, cut off by the line below

# ==========
# Uses NCCL for the
#   all-gather.
# ----------
NAME = Env()
"""


def test_comment_above_stops_at_the_first_line_that_is_no_comment():
    lines = TEXT.splitlines()
    block = ec.comment_above(lines, 8)
    assert block == lines[3:7]
    assert ec.comment_help(block) == "Uses NCCL for the all-gather."
    # every comment line of a range counts, the blank line and separators left out (vLLM's envs.py entries)
    assert ec.comment_help(lines[0:7]) == "an older note, cut off by the line below Uses NCCL for the all-gather."
    assert ec.comment_above(lines, 1) == [] and ec.comment_help(["# ==", "#", "# - # -"]) == ""


def test_names_setting_reads_the_name_with_spaces_its_help_and_choices():
    terms, name_terms = re.compile(r"\bnccl", re.IGNORECASE), re.compile(r"all2all")
    assert not terms.search("SGLANG_NCCL_X"), "the twin: the raw name alone misses it"
    assert ec.names_setting(terms, "SGLANG_NCCL_X", "")
    assert ec.names_setting(terms, "X", "uses NCCL") and ec.names_setting(terms, "X", "", ["nccl"])
    assert ec.names_setting(terms, "enable_all2all", "", name_terms=name_terms)
    assert not ec.names_setting(terms, "SGLANG_PYNCCL_X", "no", ["a", "b"], name_terms)


def test_parse_with_lines_is_none_on_a_file_that_does_not_parse(tmp_path):
    good, bad = tmp_path / "a.py", tmp_path / "b.py"
    good.write_text(TEXT)
    bad.write_text("def (:\n")
    tree, lines = ec.parse_with_lines(good)
    assert lines == TEXT.splitlines() and tree.body[-1].lineno == 8
    assert ec.parse_with_lines(bad) is None and ec.parse_with_lines(tmp_path / "absent.py") is None
