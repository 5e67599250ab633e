"""Defined before used: every glossary term's first use in the lessons is in or after the cell that defines it, and
docs/glossary.md lists each term with that cell (minigate/course/glossary.py)."""

import json
import re

import pytest

from minigate.course import ROOT
from minigate.course.glossary import GLOSSARY, first_uses, uses

FOUND = first_uses(ROOT / "lessons")


@pytest.mark.parametrize("term", GLOSSARY)
def test_a_term_is_defined_before_its_first_use(term):
    first, defined = FOUND[term]
    lesson, words = GLOSSARY[term]
    assert defined is not None, f"{term!r}: lesson {lesson} no longer holds its definition {words!r}"
    assert first is not None and first >= defined, (
        f"{term!r} is used in lesson {first[0]} cell {first[1]}, before lesson {defined[0]} cell {defined[1]} defines "
        "it: define it there, or say it another way until then")


def test_the_glossary_doc_gives_each_terms_defining_cell():
    doc = (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| (.+?) \| (lesson \d\d, cell \d+) \|", doc, flags=re.M))
    assert {t.strip("`") for t in rows} == set(GLOSSARY)
    for term, (_, (lesson, cell)) in FOUND.items():
        assert rows.get(term, rows.get(f"`{term}`")) == f"lesson {lesson}, cell {cell}", term


def test_the_check_fails_when_a_definition_is_removed_or_a_use_moves_first(tmp_path, monkeypatch):
    src = ROOT / "lessons" / "02_gated_attention.ipynb"
    nb = json.loads(src.read_text(encoding="utf-8"))
    (tmp_path / src.name).write_text(json.dumps(nb))
    assert first_uses(tmp_path)["SDPA"][1] is not None
    for cell in nb["cells"]:  # the definition gone: SDPA has no defining cell
        cell["source"] = "".join(cell["source"]).replace("SDPA (scaled dot-product attention)", "SDPA")
    (tmp_path / src.name).write_text(json.dumps(nb))
    assert first_uses(tmp_path)["SDPA"][1] is None
    nb = json.loads(src.read_text(encoding="utf-8"))  # a use before the definition: a new first cell saying SDPA
    nb["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": "SDPA, unexplained"})
    (tmp_path / src.name).write_text(json.dumps(nb))
    first, defined = first_uses(tmp_path)["SDPA"]
    assert first == ("02", 0) and first < defined


def test_a_use_is_a_whole_word():
    assert uses("F-Attn", "its F-Attn falls") and not uses("F-Attn", "F-Attn-like") and not uses("wsd", "wsdx")
