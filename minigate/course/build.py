"""Build the learners' notebooks from the solutions: `python -m minigate.course build [--check]`.

    solutions/NN_name.ipynb  (source of truth, run and stored with outputs)
        │  every block between `### BEGIN SOLUTION` and `### END SOLUTION` -> a stub at the marker's indentation:
        │      # YOUR CODE HERE
        │      raise NotImplementedError()
        ▼
    lessons/NN_name.ipynb    (generated: never edit by hand)

Rules that keep `pytest --nbval lessons/` green (the build enforces the first two):
- A marker sits inside a function (indented): the lesson's exercise cell then only *defines* a function,
  so running it prints nothing. An exercise cell produces no output in the solutions either.
- The exercise cell keeps its execution_count and gets empty outputs, so nbval checks that it stays silent.
- A check cell `f = checks.f(f)` prints `✓ f: passed (N cases)` in the solutions; in the lesson the stub
  raises NotImplementedError, the check prints a notice and returns the reference. The build rewrites
  every stored "passed" line of the solutions into that notice, so the lesson's stored outputs are what
  it prints when run untouched. Every other cell keeps the solutions' stored outputs.

The build also writes the header cells (header.py) and nbgrader's cell metadata (checks/grade.py) into the
solutions. A markdown cell tagged `answers` (the self-check answers) stays in the solutions and is left out of
the lesson.
"""

from __future__ import annotations

from pathlib import Path


from .checks import PASSED_RE, not_implemented_notice
from .checks.grade import set_nbgrader
from .header import set_header

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # nbformat (and jsonschema under it) costs seconds to import: only where a notebook is read
    import nbformat

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"
ANSWERS = "answers"  # tag of the markdown cell with the self-check answers: solutions only


class MarkerError(ValueError):
    """A solution marker that cannot be turned into a stub; the message names file, cell and line."""


def stub_source(source: str, where: str = "") -> tuple[str, int]:
    """Replace every marked block of one cell's source by a stub. Returns (new source, number of blocks)."""
    out, begin_line, n = [], None, 0
    for lineno, line in enumerate(source.split("\n"), start=1):
        marker = line.strip()
        if marker == BEGIN:
            if begin_line is not None:
                raise MarkerError(f"{where}line {lineno}: {BEGIN} inside the block opened at line {begin_line}")
            indent = line[:len(line) - len(line.lstrip())]
            if not indent:
                raise MarkerError(f"{where}line {lineno}: {BEGIN} at top level; put the exercise inside a "
                                  "function so that the lesson's cell only defines it and runs in CI")
            begin_line, n = lineno, n + 1
            out += [indent + s for s in STUB]
        elif marker == END:
            if begin_line is None:
                raise MarkerError(f"{where}line {lineno}: {END} without a {BEGIN}")
            begin_line = None
        elif begin_line is None:
            out.append(line)
    if begin_line is not None:
        raise MarkerError(f"{where}line {begin_line}: {BEGIN} never closed by {END}")
    return "\n".join(out), n


def _notice_outputs(outputs: list) -> None:
    """Rewrite `✓ name: passed (N cases)` lines of stdout streams into the not-implemented notice."""
    for out in outputs:
        if out.get("output_type") == "stream" and out.get("name") == "stdout":
            out["text"] = PASSED_RE.sub(lambda m: not_implemented_notice(m.group(1)), out["text"])


def without_answers(nb: nbformat.NotebookNode) -> None:
    """Leave out the markdown cells tagged `answers` (the self-check answers)."""
    nb.cells = [c for c in nb.cells if ANSWERS not in c.metadata.get("tags", [])]


def lesson_from_solution(nb: nbformat.NotebookNode, name: str = "") -> nbformat.NotebookNode:
    """The lesson notebook for one solutions notebook (a new object; `nb` is left untouched)."""
    import nbformat

    lesson = nbformat.from_dict(nb)  # deep copy
    set_header(lesson, f"lessons/{Path(name).name}")
    without_answers(lesson)
    for i, cell in enumerate(lesson.cells):
        where = f"{name}: cell {i}, "
        if cell.cell_type != "code":
            if BEGIN in cell.source or END in cell.source:
                raise MarkerError(f"{where}solution markers are only allowed in code cells")
            continue
        cell.source, n_blocks = stub_source(cell.source, where)
        if n_blocks == 0:
            _notice_outputs(cell.outputs)
        elif cell.outputs:
            raise MarkerError(f"{where}an exercise cell must print nothing (it only defines functions); "
                              "move demos and checks to the next cell")
    return lesson


def render(nb: nbformat.NotebookNode) -> str:
    """Stable JSON text of a notebook: what nbformat.write would store."""
    import nbformat

    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def build(solutions: Path = ROOT / "solutions", lessons: Path = ROOT / "lessons", check: bool = False) -> list[str]:
    """Write (or with check=True, only compare) every lesson, and the header cells of every solution.
    Returns the names of the stale or orphaned lessons, and "solutions/<name>" for stale headers."""
    import nbformat

    stale, expected = [], set()
    for src in sorted(solutions.glob(NOTEBOOK_GLOB)):
        expected.add(src.name)
        solution = nbformat.read(src, as_version=4)
        before = nbformat.from_dict(solution)
        set_header(solution, f"solutions/{src.name}")
        set_nbgrader(solution)  # nbgrader metadata on exercise and check cells; the lesson copies it
        if solution != before:  # compared as data: a solution saved by Jupyter is not reformatted
            stale.append(f"solutions/{src.name}")
            if not check:
                src.write_text(render(solution), encoding="utf-8")
        text = render(lesson_from_solution(solution, str(src)))
        dst = lessons / src.name
        if not dst.exists() or dst.read_text(encoding="utf-8") != text:
            stale.append(src.name)
            if not check:
                lessons.mkdir(parents=True, exist_ok=True)
                dst.write_text(text, encoding="utf-8")
    for orphan in sorted(p.name for p in lessons.glob(NOTEBOOK_GLOB) if p.name not in expected):
        stale.append(orphan)
        if not check:
            (lessons / orphan).unlink()  # a lesson whose solution was renamed or removed
    return stale
