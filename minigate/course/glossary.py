"""The course's glossary: each term and the words of the lesson that define it. A term is used only from its defining
cell on, across the lessons in order (tests/test_glossary.py); docs/glossary.md is this table with each cell's number.

    from minigate.course.glossary import GLOSSARY, first_uses
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# term -> (lesson, the words in that lesson's markdown that define it)
GLOSSARY = {
    "first-token share": ("01", "a head's **first-token share** is its attention on position 0"),
    "F-Attn": ("01", "**F-Attn** averages it over heads, then layers"),
    "sink head": ("01", "a **sink head** has a share above 0.3"),
    "sink rate": ("01", "the **sink rate** is the fraction of sink heads"),
    "G1": ("01", "the paper's G1 gate, a head that can close instead of parking"),
    "o_proj": ("02", "the output projection `o_proj`"),
    "headwise": ("02", "per head (*headwise*)"),
    "elementwise": ("02", "per head dimension (*elementwise*)"),
    "SDPA": ("02", "SDPA (scaled dot-product attention)"),
    "wsd": ("03", "(*wsd*: warmup-stable-decay)"),
    "M-Act": ("03", "**M-Act**, the largest absolute residual-stream activation of each layer"),
    "no-op": ("04", "a `<bos>` head is a no-op (adds nothing the model uses)"),
    "fragile": ("08", "`*` fragile (resting on one model per variant"),  # lesson 06's "fragile layer" is plain English
    "unigram model": ("08", "a *unigram model* (one that knows only how often each token occurs)"),
    "study": ("08", "`research/train_study.py` trained the code recipes at other sizes and lengths"),
}
# terms whose word has a plain meaning too: only their own lesson is checked
OWN_LESSON = {"fragile", "study"}


def _markdown(folder: Path) -> list[tuple[str, int, str]]:
    """(lesson, cell index, text) of every markdown cell of the lessons, in course order."""
    out = []
    for path in sorted(folder.glob("0*.ipynb")):
        for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            if cell["cell_type"] == "markdown":
                out.append((path.name[:2], i, " ".join("".join(cell["source"]).split())))  # one space between words
    return out


def uses(term: str, text: str) -> bool:
    """Whether `text` uses `term` as a word (F-Attn, not F-Attn-like; o_proj, not o_proj_weight)."""
    return re.search(rf"(?<![\w-]){re.escape(term)}(?![\w-])", text) is not None


def first_uses(folder: Path) -> dict[str, tuple[tuple[str, int] | None, tuple[str, int] | None]]:
    """term -> ((lesson, cell) of its first use, (lesson, cell) of its definition), None where not found."""
    cells = _markdown(folder)
    out = {}
    for term, (lesson, words) in GLOSSARY.items():
        first = next(((ls, i) for ls, i, text in cells if uses(term, text)
                      and (term not in OWN_LESSON or ls == lesson)), None)
        defined = next(((ls, i) for ls, i, text in cells if ls == lesson and words in text), None)
        out[term] = first, defined
    return out
