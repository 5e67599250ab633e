"""Prose = output: a lesson's text states only numbers its cells print, or figures quoted from a named publication."""

import json
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from minigate.course.prose import prose_numbers, unprinted
from minigate.course.published import PUBLISHED

ROOT = Path(__file__).resolve().parent.parent
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
