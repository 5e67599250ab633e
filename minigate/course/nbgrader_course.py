"""An nbgrader course folder: `python -m minigate.course nbgrader DIR [--force]`.

    DIR/nbgrader_config.py                 this package's nbgrader_config.py (timeout, release, missing cells)
    DIR/source/lessonNN/NN_name.ipynb      solutions/NN_name.ipynb: nbgrader's source notebooks (the build wrote
                                           their nbgrader cell metadata: exercise cells are answers, check cells
                                           locked tests of 1 point)
    DIR/README.md                          the instructor's commands, and how learners name their submissions

The release drops the self-check answers and points the Colab badge to lessons/ (release_lesson, named in the
config).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import nbformat

from .build import NOTEBOOK_GLOB, ROOT, without_answers
from .checks import LESSONS
from .header import set_header

CONFIG = Path(__file__).with_name("nbgrader_config.py")

README = """# minigate course folder for nbgrader

Written by `python -m minigate.course nbgrader`. nbgrader runs in this folder, in an environment with minigate and
nbgrader (`pip install "minigate[grading]"`, or `pip install -e ".[grading]"` in a checkout of the course).
Grading needs no setting: under nbgrader a blank exercise fails its check (it does not fall back to the reference as
it does for learners), one cell may run 10 minutes, and a deleted check cell is put back and graded
(`nbgrader_config.py` says how).

## The four commands (lesson 04 as the example)

```bash
nbgrader generate_assignment lesson04   # release/lesson04/: the lesson for learners, answers as stubs
nbgrader autograde lesson04             # grades submitted/<student>/lesson04/04_sinks_and_massive_activations.ipynb
nbgrader generate_feedback lesson04     # feedback/<student>/lesson04/*.html, one page per learner
nbgrader export                         # grades.csv: one row per learner and lesson
```

Hand out `release/lessonNN/` (or `nbgrader release_assignment` with an exchange); the lessons in the course's
`lessons/` folder, and their "Open in Colab" badges, are the same notebooks. Put each learner's notebook at
`submitted/<student>/lessonNN/<the lesson's file name>` (or `nbgrader collect lessonNN`), then autograde.

## How learners name their submissions

Submit the notebook under **its own file name**, for example `04_sinks_and_massive_activations.ipynb`, with nothing
added. nbgrader grades only the notebooks whose names it knows: Colab's "Copy of 04_sinks_and_massive_activations.ipynb"
or a renamed file is skipped and scores 0. In Colab: File > Download > Download .ipynb, then rename the file if needed.
Before submitting, learners can run `nbgrader validate 04_sinks_and_massive_activations.ipynb` (or the Validate
button): it fails while an exercise is blank or wrong.

## Lessons

| assignment | notebook | points (one per exercise) |
|---|---|---|
{rows}

`python -m minigate.course grade NOTEBOOK...` scores the same notebooks without nbgrader (one table, CSV or JSON).
"""


def release_lesson(nb: nbformat.NotebookNode, resources: dict) -> tuple[nbformat.NotebookNode, dict]:
    """nbgrader's first step when it releases a lesson (nbgrader_config.py): the source, a solutions notebook, without
    the self-check answers, and its Colab badge opening the lesson in lessons/ instead of the solutions."""
    name = resources.get("nbgrader", {}).get("notebook") or resources.get("metadata", {}).get("name", "")
    without_answers(nb)
    set_header(nb, f"lessons/{name}.ipynb")
    return nb, resources


def course_files(solutions: Path = ROOT / "solutions") -> dict[Path, str]:
    """{path relative to the course folder: text} of everything `nbgrader DIR` writes."""
    sources = sorted(solutions.glob(NOTEBOOK_GLOB))
    if not sources:
        raise FileNotFoundError(f"no lessons in {solutions}: run this from a checkout of the course (or pass "
                                "--solutions FOLDER)")
    files = {Path("nbgrader_config.py"): CONFIG.read_text(encoding="utf-8")}
    rows = []
    for src in sources:
        nb = nbformat.read(src, as_version=4)
        graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
        if not graded:
            raise ValueError(f"{src} has no nbgrader metadata: run `python -m minigate.course build` first")
        files[Path("source") / f"lesson{src.name[:2]}" / src.name] = src.read_text(encoding="utf-8")
        exercises = LESSONS.get(src.name[:2], ())
        rows.append(f"| lesson{src.name[:2]} | {src.name} | {len(graded)} ({', '.join(exercises)}) |")
    files[Path("README.md")] = README.replace("{rows}", "\n".join(rows))
    return files


def setup_course(directory: Path, solutions: Path = ROOT / "solutions", force: bool = False) -> list[Path]:
    """Write the course folder; refuses to overwrite a changed file unless force. Returns the files written."""
    files = course_files(solutions)
    changed = [p for p, text in files.items() if (directory / p).exists()
               and (directory / p).read_text(encoding="utf-8") != text]
    if changed and not force:
        raise FileExistsError(f"{directory} already has other versions of {', '.join(map(str, changed))}; "
                              "pass --force to overwrite them")
    for path, text in files.items():
        (directory / path).parent.mkdir(parents=True, exist_ok=True)
        (directory / path).write_text(text, encoding="utf-8")
    return sorted(files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minigate.course nbgrader", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 2)[2])
    parser.add_argument("directory", type=Path, help="the course folder (created if missing)")
    parser.add_argument("--solutions", type=Path, default=ROOT / "solutions", help="the solutions notebooks")
    parser.add_argument("--force", action="store_true", help="overwrite files that differ")
    args = parser.parse_args(argv)
    try:
        written = setup_course(args.directory, args.solutions, args.force)
    except (FileExistsError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    lessons = sorted({p.parts[1] for p in written if p.parts[0] == "source"})
    print(f"wrote {args.directory}: nbgrader_config.py, README.md, source/ ({', '.join(lessons)})")
    if importlib.util.find_spec("nbgrader") is None:
        print('nbgrader is not installed here: pip install "minigate[grading]"', file=sys.stderr)
    print(f"next: cd {args.directory} && nbgrader generate_assignment lesson01 (README.md has the rest)")
    return 0
