"""The editor's limits (issue 55, course/study.py LIMITS) hold on the course as it is, and a course over them is named
line by line."""

import shutil

import nbformat

from minigate import course
from minigate.course.study import LIMITS, over_limits


def test_the_course_keeps_to_the_editors_limits():
    over = over_limits(course.ROOT)
    assert not over, "over the editor's limits (python -m minigate.course report):\n" + "\n".join(over)


def test_a_course_over_the_limits_is_named_line_by_line(tmp_path):
    for folder in ("lessons", "solutions"):
        (tmp_path / folder).mkdir()
    shutil.copy(course.ROOT / "README.md", tmp_path / "README.md")
    prose = " ".join(["word"] * (LIMITS["stretch"] + 1))
    talk = nbformat.v4.new_code_cell("print(...)", outputs=[nbformat.v4.new_output(
        "stream", name="stdout", text=" ".join(["out"] * (LIMITS["output"] + 1)))])
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(prose), talk])
    for folder in ("lessons", "solutions"):
        nbformat.write(nb, tmp_path / folder / "01_x.ipynb")
    assert over_limits(tmp_path) == [f"01_x: cell 0 starts {LIMITS['stretch'] + 1} words of prose, over "
                                     f"{LIMITS['stretch']}", f"01_x: cell 1 prints {LIMITS['output'] + 1} words, over "
                                     f"{LIMITS['output']}"]
    (tmp_path / "README.md").write_text(" ".join(["w"] * (LIMITS["readme"] + 1)))
    assert over_limits(tmp_path)[0] == f"README.md: {LIMITS['readme'] + 1:,} words, over {LIMITS['readme']:,}"
