"""Claims are asserts (issue 55): each claim of a lesson's summary ("What we saw", "What we measured": each bullet,
or each sentence of a cell without bullets) carries a mark [✓N], and a code cell above it carries `# ✓N` on an
assert. A claim the notebook's cells do not check fails here."""

import json

import pytest

from minigate.course import ROOT
from minigate.course.prose import asserted_marks, summary_claims, unbacked

# the lessons whose summaries carry their marks: all eight
MARKED = ("01", "02", "03", "04", "05", "06", "07", "08")
SOLUTIONS = [p for p in sorted((ROOT / "solutions").glob("0*.ipynb")) if p.name[:2] in MARKED]


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name[:2] for p in SOLUTIONS])
def test_every_summary_claim_is_asserted_above_it(path):
    missing = unbacked(json.loads(path.read_text(encoding="utf-8")))
    assert not missing, (f"{path.name}: summary claims with no [✓N] tied to an assert above them (cell, claim): "
                         f"{missing}; assert the claim in a code cell above and mark both")


def _nb(*cells):
    return {"cells": [{"cell_type": t, "source": s, "metadata": {}} for t, s in cells]}


def test_a_claim_without_its_assert_is_caught():
    code = "x = 2\nassert x > 1  # ✓1\n# ✓2: spans lines\nassert (x\n        < 3)"
    good = _nb(("code", code), ("markdown", "## What we saw\n\n- x is above 1 [✓1].\n- and below 3 [✓2]."))
    assert unbacked(good) == []
    unmarked = _nb(("code", code), ("markdown", "## What we saw\n\n- x is above 1.\n- and below 3 [✓2]."))
    assert unbacked(unmarked) == [(1, "x is above 1.")]
    no_assert = _nb(("code", code.replace("# ✓1", "")), ("markdown", "## What we saw\n\n- x is above 1 [✓1]."))
    assert unbacked(no_assert) == [(1, "x is above 1 [✓1].")]
    after = _nb(("markdown", "**What we measured.** X is above 1 [✓1]. It is below 3 [✓2]."), ("code", code))
    assert unbacked(after) == [(0, "X is above 1 [✓1]."), (0, "It is below 3 [✓2].")]  # the assert comes later
    twice = _nb(("code", code), ("markdown", "**What we measured.** X is above 1 [✓1]. Again [✓1]."))
    assert unbacked(twice) == [(1, "Again [✓1].")]


def test_marks_count_only_on_asserts():
    assert asserted_marks("print(x)  # ✓4\ny = 1\n") == set()
    assert asserted_marks("assert a, 'msg'  # ✓4") == {"4"}
    assert summary_claims("**What we measured.** One 0.27 claim. Two (a) claims.") == ["One 0.27 claim.",
                                                                                          "Two (a) claims."]
