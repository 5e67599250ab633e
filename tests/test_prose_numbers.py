"""Prose = output: a lesson's text states only numbers its cells print, or figures quoted from a named publication;
the README's prose only numbers a generated source prints (course/prose.py: generated_sources), or its own quoted
figures."""

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from minigate.course.prose import (FRONT_DOCS, generated_sources, prose_numbers, readme_paragraphs, readme_unsourced,
                                    unprinted)
from minigate.course.published import PUBLISHED, README_QUOTED
from minigate.course import ROOT

SOLUTIONS = sorted((ROOT / "solutions").glob("0*.ipynb"))


def test_numbers_are_decimals_and_ratios_outside_code_math_and_links():
    text = ("The head puts 0.27 on <bos>, 4.5x less with the gate and 2 × fewer heads; `0.99` in code, $0.5$ in math, "
            "[v2.13.0](https://x.org/1.25), arXiv 2505.06708, torch 2.13.0, 12 heads, step 2500, a 20,000x gap."
            "\n```\nx = 3.14\n```")
    assert prose_numbers(text) == ["0.27", "4.5x", "2x"]


def test_a_number_counts_as_printed_only_as_a_number_of_its_own():
    nb = new_notebook(cells=[
        new_markdown_cell("F-Attn 0.27 (4.5x less), M-Act 71.3 and 0.5"),
        new_code_cell("print(...)", outputs=[new_output("stream", name="stdout", text="f_attn 0.27  ratio 4.5\n"),
                                             new_output("execute_result", data={"text/plain": "10.5, 71.35"})]),
    ])
    assert unprinted(nb, "99") == [(0, "71.3"), (0, "0.5")]


@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.name[:2] for p in SOLUTIONS])
def test_every_number_in_a_lesson_is_printed_by_it_or_published(path):
    nb = nbformat.read(path, as_version=4)
    missing = unprinted(nb, path.name[:2])
    assert not missing, (f"{path.name} states numbers none of its cells prints (cell, number): {missing}; print them, "
                         "say them without the number, or add a published figure with its source to "
                         "minigate/course/published.py")


@pytest.mark.parametrize("lesson", sorted(PUBLISHED))
def test_every_published_figure_is_still_quoted_where_the_list_says(lesson):
    path = next(p for p in SOLUTIONS if p.name.startswith(lesson))
    stated = {n for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "markdown"
              for n in prose_numbers("".join(cell["source"]))}
    stale = sorted(set(PUBLISHED[lesson]) - stated)
    assert not stale, f"minigate/course/published.py lists {stale} for lesson {lesson}, which its text no longer states"
    assert all(source.strip() for source in PUBLISHED[lesson].values())


DOCS = {name: (ROOT / name).read_text(encoding="utf-8") for name in FRONT_DOCS}


@pytest.mark.parametrize("doc", FRONT_DOCS)
def test_the_readme_states_only_numbers_a_generated_source_prints(doc):
    """Every decimal and ratio of the README's hand-written paragraphs (and of the reference pages it links in docs/)
    is printed by a notebook's outputs, the READMEs' generated text (scripts/readme.py), a data/seeds file as the
    lessons print it, a table of docs/gpu.md or the lessons' study times, or is one of the README's own quoted figures
    with its source (published.README_QUOTED)."""
    missing = readme_unsourced(DOCS[doc], generated_sources(ROOT), README_QUOTED)
    assert not missing, (f"{doc} states numbers no generated source prints (paragraph, number): {missing}; "
                         "restate them from a source, or list a figure measured once with where it was measured in "
                         "minigate/course/published.py's README_QUOTED")


def test_every_readme_quoted_figure_is_still_in_the_readme():
    stated = {n for text in DOCS.values() for para in readme_paragraphs(text) for n in prose_numbers(para)}
    stale = sorted(set(README_QUOTED) - stated)
    assert not stale, f"README_QUOTED lists {stale}, which neither the README nor its docs/ pages state any longer"
    assert all(source.strip() for source in README_QUOTED.values())


def test_the_sources_are_the_generated_ones():
    """The notebooks' outputs, the READMEs' generated spans (which tests/test_release.py holds to the stored numbers),
    what the lessons print of each seeds file, docs/gpu.md's tables."""
    names = set(generated_sources(ROOT))
    assert {f"solutions/{p.name} (outputs)" for p in SOLUTIONS} <= names
    assert {"README.md (headline code, scripts/readme.py)", "README.md (seedline code, scripts/readme.py)",
            "data/checkpoints/README.md (table code, scripts/readme.py)",
            "data/checkpoints/README.md (table code-moe, scripts/readme.py)",
            "data/seeds/code.json (release.spread_lines)", "docs/gpu.md (tables)"} <= names


def test_the_generated_spans_are_not_prose():
    """The text between scripts/readme.py's markers is generated: the prose check reads the paragraphs around it."""
    text = "Before 0.27. <!-- minigate:effect code -->It is 4.5x smaller.<!-- /minigate:effect code --> After 0.5."
    assert readme_unsourced(text, {"s": "0.27 0.5"}, {}) == []
    assert readme_unsourced(text.replace("After 0.5", "After 0.6"), {"s": "0.27 0.5"}, {}) == [
        ("Before 0.27. After 0.6.", "0.6")]


def test_a_readme_number_that_drifts_from_its_source_is_caught():
    sources = {"measurements.json": "F-Attn above uniform 4.5x smaller; largest head 0.27", "docs": "| 31.2% |"}
    readme = ("# Title\n\nThe largest head puts 0.27 on the first token, 4.5x less with the gate.\n\n"
              "| table | 9.9 |\n|---|---|\n\n```\nx = 3.3\n```\n\nPython >= 3.10, torch 2.13, 8 x 512 tokens.\n\n"
              "transformers / minigate 4.5x the speed; torch 2.13.0")
    assert readme_unsourced(readme, sources, {}) == []  # tables, code, versions and sizes are not prose; a ratio
    assert readme_unsourced(readme.replace("minigate 4.5x", "minigate 4.4x"), sources, {})[0][1] == "4.4x"  # is one
    drifted = readme.replace("4.5x less", "4.6x less").replace("0.27", "0.28")
    assert readme_unsourced(drifted, sources, {}) == [("The largest head puts 0.28 on", "0.28"),
                                                      ("The largest head puts 0.28 on", "4.6x")]
    assert readme_unsourced(drifted, sources, {"0.28": "x", "4.6x": "y"}) == []  # quoted, with a source
    assert readme_unsourced("It is 0.27x smaller.", sources, {}) == [("It is 0.27x smaller.", "0.27x")]  # digits alone
