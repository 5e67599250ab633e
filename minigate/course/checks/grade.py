"""Score learners' notebooks: `python -m minigate.course grade NOTEBOOK... [--csv F] [--json F] [--timeout S]`.

Each notebook runs top to bottom with nbclient, in a kernel of this Python environment, in grading mode
(MINIGATE_GRADING=1: an exercise left as a stub fails its check instead of falling back to the reference), and
continues after errors, so one wrong exercise does not stop the others. An exercise is a check cell
`name = checks.name(name)`; it scores

    passed         the check printed `✓ name: passed (N cases)`
    not attempted  the exercise still raises NotImplementedError
    failed         anything else: a wrong answer, an exception, a cell that could not run, or a check cell that is
                   missing: every exercise of the notebook's lesson is expected (the lesson is the one its exercises
                   belong to, else the one its file name or folder names: `NN_name.ipynb`, "Copy of NN_name.ipynb",
                   nbgrader's `lessonNN/`), and of every notebook graded together, any exercise another one checks

The table has one row per exercise and one column per notebook (labelled by the shortest end of its path that tells
it from the others), then the totals; --csv and --json write the same results with the check's message for each
exercise.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from . import LESSONS
from .engine import GRADING_ENV, NOT_ATTEMPTED_RE, PASSED_RE

if TYPE_CHECKING:  # nbformat costs seconds to import: only where a notebook is read
    import nbformat

CHECK_CELL_RE = re.compile(r"^\s*\w+\s*=\s*checks\.(\w+)\(", re.M)
LESSON_FILE_RE = re.compile(r"(?<![0-9])([0-9]{2})_[A-Za-z]")  # 04_sinks_....ipynb, Copy of 04_sinks_....ipynb
LESSON_DIR_RE = re.compile(r"^lesson([0-9]{2})$")  # nbgrader's submitted/<student>/lesson04/


def check_cells(nb: nbformat.NotebookNode) -> list[tuple[int, str]]:
    """(cell index, exercise name) of every check cell `name = checks.name(name)`."""
    return [(i, m.group(1)) for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
            for m in [CHECK_CELL_RE.search(cell.source)] if m]


def lesson_of(path: Path | str, nb: nbformat.NotebookNode) -> str | None:
    """The lesson ("04") a learner's notebook is: the one lesson that its check cells and exercise cells (their
    nbgrader grade_id) belong to, else the one its file name or folder names; None when none is clear."""
    found = {name for _, name in check_cells(nb)}
    found |= {c.metadata.get("nbgrader", {}).get("grade_id", "").removeprefix("check_") for c in nb.cells}
    by_content = {lesson for lesson, names in LESSONS.items() if found & set(names)}
    if len(by_content) == 1:
        return by_content.pop()
    if by_content:  # exercises of several lessons: none of them is expected in full
        return None
    path = Path(path)
    named = [m.group(1) for m in LESSON_FILE_RE.finditer(path.name)]
    named += [m.group(1) for part in reversed(path.parent.parts) for m in [LESSON_DIR_RE.match(part)] if m]
    return next((n for n in named if n in LESSONS), None)


def set_nbgrader(nb: nbformat.NotebookNode, begin: str = "### BEGIN SOLUTION") -> None:
    """nbgrader cell metadata (schema 3), so nbgrader's autograder can grade the lessons, with the solutions as its
    source notebooks: an exercise cell (it holds solution markers) is a solution cell; a check cell is a locked,
    graded test worth 1 point. Run nbgrader with MINIGATE_GRADING=1 so that stubs fail."""
    checked = [name for _, name in check_cells(nb)]
    ids = set()
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        match = CHECK_CELL_RE.search(cell.source)
        if begin in cell.source:
            defs = re.findall(r"^def (\w+)", cell.source, re.M)
            grade_id = next((d for d in defs if d in checked), defs[0] if defs else f"exercise_cell_{i}")
            meta = dict(grade=False, grade_id=grade_id, locked=False, schema_version=3, solution=True)
        elif match:
            meta = dict(grade=True, grade_id=f"check_{match.group(1)}", locked=True, points=1, schema_version=3,
                        solution=False)
        else:
            continue
        if meta["grade_id"] in ids:  # grade ids must be unique in a notebook
            meta["grade_id"] += f"_cell_{i}"
        ids.add(meta["grade_id"])
        cell.metadata["nbgrader"] = meta


def _texts(cell) -> list[str]:
    """Everything a cell printed: streams, results and errors (name, value and traceback)."""
    out = []
    for o in cell.get("outputs", []):
        if o.get("output_type") == "stream":
            out.append(o.get("text", ""))
        elif o.get("output_type") == "error":
            out.append(f"{o.get('ename', '')}: {o.get('evalue', '')}")
        elif "data" in o:
            out.append(o["data"].get("text/plain", ""))
    return out


def score_cell(cell, name: str) -> tuple[str, str]:
    """(status, message) of one executed check cell."""
    text = "\n".join(_texts(cell))
    if any(m.group(1) == name for m in PASSED_RE.finditer(text)):
        return "passed", f"✓ {name}: passed"
    if any(m.group(1) == name for m in NOT_ATTEMPTED_RE.finditer(text)):
        return "not attempted", f"{name} still raises NotImplementedError"
    lines = [line for line in text.splitlines() if line.strip()]
    message = next((line for line in lines if line.startswith("✗")), lines[-1] if lines else "the cell did not run")
    return "failed", message


def _kernel_manager():
    """A kernel of this very Python (as nbval's --nbval-current-env does), in grading mode. Where the OS has them
    (Linux, macOS) it talks over Unix sockets named after the kernel, at an absolute path (the kernel runs in the
    notebook's folder) short enough for macOS's 104 characters: TCP ports are picked free and bound later, so a kernel
    started beside others (nbval's, another grader's) can lose one and die before it starts."""
    import tempfile
    import uuid

    from jupyter_client.kernelspec import KernelSpec, KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    class HereKernelSpecs(KernelSpecManager):
        def get_kernel_spec(self, kernel_name):
            return KernelSpec(argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                              display_name="minigate grading", language="python", env={GRADING_ENV: "1"})

    if os.name != "posix":
        return AsyncKernelManager(kernel_name="minigate-grading", kernel_spec_manager=HereKernelSpecs())
    name = os.path.join(tempfile.gettempdir(), f"minigate-grading-{uuid.uuid4().hex[:12]}")
    return AsyncKernelManager(kernel_name="minigate-grading", kernel_spec_manager=HereKernelSpecs(), transport="ipc",
                              connection_file=name + ".json", ip=name + "-ipc")


def grade_notebook(path: Path, timeout: int = 600) -> dict[str, tuple[str, str]]:
    """{exercise: (status, message)} for one notebook, run in grading mode in the notebook's folder."""
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, km=_kernel_manager(), timeout=timeout, allow_errors=True, interrupt_on_timeout=True,
                            resources={"metadata": {"path": str(Path(path).parent.resolve())}})
    problem = None
    try:
        client.execute(cleanup_kc=True)  # shut the kernel down now (and its sockets): a class's notebooks one by one
    except DeadKernelError as e:  # the cells after the one that killed the kernel did not run
        problem = f"the kernel died: {e}".splitlines()[0]
    lesson = lesson_of(path, nb)
    results = {name: ("failed", f"no check cell `{name} = checks.{name}({name})` in this notebook (lesson {lesson} "
                                "has one)") for name in LESSONS.get(lesson, ())}
    for index, name in check_cells(nb):
        status, message = score_cell(nb.cells[index], name)
        if problem and not nb.cells[index].get("outputs"):
            message = problem
        results[name] = (status, message)
    return results


def complete(results: dict[str, dict[str, tuple[str, str]]],
             lessons: dict[str, str | None] | None = None) -> dict[str, dict[str, tuple[str, str]]]:
    """Every notebook scored on every exercise that any notebook of the same lesson checks (lessons: {notebook:
    lesson or None}; none given: all one lesson): a check cell deleted from a notebook fails (a learner cannot skip
    an exercise by removing its check), and a notebook of another lesson is not scored on it."""
    lessons = lessons or {}
    names = {}
    for nb, per_nb in results.items():
        names.setdefault(lessons.get(nb), {}).update(dict.fromkeys(per_nb))
    return {nb: {n: per_nb.get(n, ("failed", f"no check cell `{n} = checks.{n}({n})` in this notebook"))
                 for n in names[lessons.get(nb)]} for nb, per_nb in results.items()}


def labels(paths: list[str]) -> dict[str, str]:
    """{path: the shortest end of it that no other path ends with}: submitted/alice/lesson04/04_x.ipynb and
    submitted/bob/lesson04/04_x.ipynb -> alice/lesson04/04_x.ipynb and bob/lesson04/04_x.ipynb."""
    parts = {p: Path(p).parts for p in paths}
    out = {}
    for p, own in parts.items():
        k = next((k for k in range(1, len(own)) if all(q == p or other[-k:] != own[-k:]
                                                       for q, other in parts.items())), len(own))
        out[p] = "/".join(own[-k:])
    return out


def table(results: dict[str, dict[str, tuple[str, str]]]) -> str:
    """The score table: one row per exercise, one column per notebook, and the totals."""
    names = list(dict.fromkeys(n for per_nb in results.values() for n in per_nb))
    notebooks = list(results)
    label = labels(notebooks)
    rows = [["exercise", *(label[nb] for nb in notebooks)]]
    rows += [[name, *(results[nb].get(name, ("-", ""))[0] for nb in notebooks)] for name in names]
    totals = []
    for nb in notebooks:
        statuses = [status for status, _ in results[nb].values()]
        totals.append(f"{statuses.count('passed')}/{len(statuses)} passed")
    rows.append(["total", *totals])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def write_csv(results, path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["notebook", "exercise", "status", "message"])
        for nb, per_nb in results.items():
            for name, (status, message) in per_nb.items():
                writer.writerow([nb, name, status, message])


def write_json(results, path: Path) -> None:
    data = {"notebooks": [
        {"notebook": nb, "passed": sum(s == "passed" for s, _ in per_nb.values()), "exercises": len(per_nb),
         "results": {name: {"status": s, "message": m} for name, (s, m) in per_nb.items()}}
        for nb, per_nb in results.items()]}
    Path(path).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m minigate.course grade", description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 2)[2])
    parser.add_argument("notebooks", nargs="+", type=Path, help="learners' notebooks (.ipynb)")
    parser.add_argument("--csv", type=Path, help="also write the results to this CSV file")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    args = parser.parse_args(argv)
    results, lessons = {}, {}
    for path in args.notebooks:
        try:
            results[str(path)] = grade_notebook(path, args.timeout)
            import nbformat

            lessons[str(path)] = lesson_of(path, nbformat.read(path, as_version=4))
        except (OSError, ValueError) as e:  # missing, or not a notebook
            print(f"error: cannot read {path}: {e}", file=sys.stderr)
            return 2
    results = complete(results, lessons)
    print(table(results))
    if args.csv:
        write_csv(results, args.csv)
    if args.json:
        write_json(results, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
