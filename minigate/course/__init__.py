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

Header cells, written from the constants below into solutions and lessons alike (a fork changes the
REPOSITORY line and rebuilds): a markdown cell tagged `badge` gets the "Open in Colab" badge of its own
notebook at REF, a code cell tagged `setup` gets SETUP, which in Colab fetches the repository at REF into
./minigate (/content/minigate) and installs minigate from it (its data/ ships inside the package, see
minigate/resources.py), keeping Colab's torch; locally it does nothing. Lessons in GPU_LESSONS get Colab's
GPU accelerator metadata (a T4), so Colab opens them on a GPU runtime.

A markdown cell tagged `answers` (the self-check answers) stays in the solutions and is left out of the lesson.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

from .checks import PASSED_RE, not_implemented_notice
from .checks.grade import set_nbgrader

BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"
ANSWERS = "answers"  # tag of the markdown cell with the self-check answers: solutions only

# The GitHub repository (owner/name) and the release tag (or commit) that the badges open and the Colab set-up cell
# installs. A fork changes this one line and runs `python -m minigate.course build`. REF is pinned: a later push to
# the repository never changes what a learner's Colab runs; a release tags the commit (`git tag v0.1.0`) and sets it.
REPOSITORY, REF = "minigate-course/minigate", "v0.1.0"
GPU_LESSONS = ("03", "07", "08")  # lessons that want a GPU: Colab opens them on a T4 runtime
SETUP = f"""# Set-up, safe to run twice. In Colab: fetch the course at {REF} into ./minigate (/content/minigate),
# install minigate from it (with its data) and keep Colab's own torch. Locally (`make lab`), it does nothing.
import sys

if "google.colab" in sys.modules:
    import importlib, importlib.metadata, os, subprocess

    def import_minigate():  # the installed package, or None (a bare ./minigate folder imports as an empty namespace)
        importlib.invalidate_caches()
        if getattr(sys.modules.get("minigate"), "__file__", "") is None:
            del sys.modules["minigate"]
        try:
            import minigate
        except ImportError:
            return None
        return minigate if minigate.__file__ else None

    REF = os.environ.get("MINIGATE_REF", "{REF}")  # set MINIGATE_REF to try another tag, branch or commit
    url, clone = "https://github.com/{REPOSITORY}", os.path.abspath("minigate")
    if import_minigate() is None:
        if not os.path.isfile(os.path.join(clone, "pyproject.toml")):
            for cmd in (["init", "-q", clone], ["-C", clone, "fetch", "-q", "--depth", "1", url, REF],
                        ["-C", clone, "checkout", "-q", "FETCH_HEAD"]):
                subprocess.run(["git", *cmd], check=True)
        torch_pin = f"torch=={{importlib.metadata.version('torch')}}"  # Colab's torch, left as it is
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", clone, torch_pin], check=True)
    minigate = import_minigate()
    assert minigate is not None, f"minigate did not install from {{clone}}: see the messages above"
    print(f"minigate {{minigate.__version__}} ({{REF}}) from {{url}}; data in {{minigate.resources.DATA_DIR}}; "
          f"torch {{importlib.metadata.version('torch')}}")"""


def study_minutes(nb: nbformat.NotebookNode) -> int:
    """A lesson's study time in minutes, as its header and the README state it: prose at 120 words a minute,
    code at 6 lines a minute, 10 minutes per exercise and 5 for the self-check, rounded to 5. Counted on the
    lesson (stubs, not answers), without the header line, the set-up cell, the deep dive and the self-check."""
    import re

    words = lines = exercises = 0
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type == "markdown":
            if "badge" not in tags and ANSWERS not in tags and not cell.source.startswith(("## Check yourself",
                                                                                         "## Deep dive")):
                words += len(re.findall(r"\w+", re.sub(r"\*\*Study time:\*\*.*", "", cell.source, flags=re.S)))
        elif "setup" not in tags:
            source, n = stub_source(cell.source)
            lines += len(source.splitlines())
            exercises += n + source.count(STUB[1]) * (n == 0)
    minutes = words / 120 + lines / 6 + 10 * exercises + 5
    return 5 * round(minutes / 5)


def badge(path: str) -> str:
    """Markdown "Open in Colab" badge for a notebook at `path` in the repository (e.g. lessons/01_x.ipynb)."""
    return ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"(https://colab.research.google.com/github/{REPOSITORY}/blob/{REF}/{path})")


def set_header(nb: nbformat.NotebookNode, path: str) -> None:
    """Write the badge and set-up cells (found by their tags) and Colab's accelerator metadata from the
    constants above."""
    if Path(path).name[:2] in GPU_LESSONS:
        nb.metadata["accelerator"] = "GPU"
        nb.metadata["colab"] = {**nb.metadata.get("colab", {}), "gpuType": "T4"}
    else:
        nb.metadata.pop("accelerator", None)
        if "colab" in nb.metadata:
            nb.metadata["colab"].pop("gpuType", None)
            if not nb.metadata["colab"]:
                del nb.metadata["colab"]
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if "badge" in tags and cell.cell_type == "markdown":
            cell.source = badge(path)
        elif "setup" in tags and cell.cell_type == "code":
            cell.source = SETUP


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


def lesson_from_solution(nb: nbformat.NotebookNode, name: str = "") -> nbformat.NotebookNode:
    """The lesson notebook for one solutions notebook (a new object; `nb` is left untouched)."""
    lesson = nbformat.from_dict(nb)  # deep copy
    set_header(lesson, f"lessons/{Path(name).name}")
    lesson.cells = [c for c in lesson.cells if ANSWERS not in c.metadata.get("tags", [])]
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
    text = nbformat.writes(nb)
    return text if text.endswith("\n") else text + "\n"


def build(solutions: Path = ROOT / "solutions", lessons: Path = ROOT / "lessons", check: bool = False) -> list[str]:
    """Write (or with check=True, only compare) every lesson, and the header cells of every solution.
    Returns the names of the stale or orphaned lessons, and "solutions/<name>" for stale headers."""
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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["grade"]:  # python -m minigate.course grade NOTEBOOK... (minigate/course/checks/grade.py)
        from .checks.grade import main as grade

        return grade(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m minigate.course", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["build", "grade"])
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

