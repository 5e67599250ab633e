"""Course tooling: `python -m minigate.course build [--check] | grade NOTEBOOK... | nbgrader DIR | report`.

    build.py            solutions/ -> lessons/: answers become stubs, self-check answers stay in solutions/
    header.py           the header cells of every notebook: the Colab badge and the set-up cell (setup_cell.py),
                        from REPOSITORY and REF, the one line a fork or a release changes
    study.py            a lesson's study time, as its header and the README state it; `report`, the word counts
    checks/             the exercises' checks (`checks.<exercise>`) and `grade`, which scores learners' notebooks
    nbgrader_course.py  `nbgrader DIR`: a ready nbgrader course folder (its config is nbgrader_config.py)
    published.py        the figures lessons quote from the paper and the 1B report, the one place code reads them from
    scorecard/          lesson 08's scorecard: each claim against each setting measured, with its rule and verdict
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import checks, header
from .build import (ANSWERS, BEGIN, END, NOTEBOOK_GLOB, ROOT, STUB, MarkerError, build, lesson_from_solution, render,
                    stub_source)
from .header import GPU_LESSONS, REF, REPOSITORY, SETUP, badge, set_header
from .study import prose_words, report, study_minutes

__all__ = ["ANSWERS", "BEGIN", "END", "GPU_LESSONS", "NOTEBOOK_GLOB", "REF", "REPOSITORY", "ROOT", "SETUP", "STUB",
           "MarkerError", "badge", "build", "checks", "header", "lesson_from_solution", "main", "render", "set_header",
           "prose_words", "study_minutes", "stub_source"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["grade"]:  # python -m minigate.course grade NOTEBOOK... (checks/grade.py)
        from .checks.grade import main as grade

        return grade(argv[1:])
    if argv[:1] == ["report"]:  # python -m minigate.course report: the editor's counts (study.py, LIMITS)
        print("\n".join(report(ROOT)))
        return 0
    if argv[:1] == ["nbgrader"]:  # python -m minigate.course nbgrader DIR (nbgrader_course.py)
        from .nbgrader_course import main as nbgrader

        return nbgrader(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m minigate.course", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["build", "grade", "nbgrader", "report"],
                        help="build: lessons/ from solutions/; grade NOTEBOOK...: score learners' notebooks; "
                             "nbgrader DIR: set up an nbgrader course folder; report: the README's and lessons' "
                             "word counts against the editor's limits")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a lesson is stale")
    parser.add_argument("--solutions", type=Path, default=ROOT / "solutions")
    parser.add_argument("--lessons", type=Path, default=ROOT / "lessons")
    args = parser.parse_args(argv)
    try:
        stale = build(args.solutions, args.lessons, check=args.check)
    except MarkerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check and stale:
        print(f"stale lessons (run `python -m minigate.course build`): {', '.join(stale)}", file=sys.stderr)
        return 1
    print(f"{'stale' if args.check else 'rebuilt'}: {', '.join(stale) or 'nothing'}")
    return 0
