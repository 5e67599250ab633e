"""A lesson's study time, as its header and the README state it (CONTRIBUTING.md, "Lesson conventions")."""

from __future__ import annotations

import re


from .build import ANSWERS, STUB, stub_source

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # nbformat (and jsonschema under it) costs seconds to import: only where a notebook is read
    import nbformat


EXERCISE_BUDGET = re.compile(r"^#{2,3} Exercise\b[^\n]*\(about (\d+) minutes\)", re.M)  # a heading's own budget
DEFAULT_BUDGET = 10  # minutes for an exercise whose heading states none
# ARENA's rating, on the line under the heading: "> Difficulty: 🔴🔴⚪⚪⚪ · Importance: 🔵🔵🔵🔵⚪"
EXERCISE_RATING = re.compile(r"^#{2,3} Exercise\b[^\n]*\(about (\d+) minutes\)\n\n"
                             r"> Difficulty: (🔴*)(⚪*) · Importance: (🔵*)(⚪*)$", re.M)


def exercise_budgets(nb: nbformat.NotebookNode) -> list[int]:
    """The minutes each exercise heading budgets ("### Exercise 2 · Is the sink a no-op? (about 15 minutes)")."""
    return [int(m) for cell in nb.cells if cell.cell_type == "markdown" for m in EXERCISE_BUDGET.findall(cell.source)]


def exercise_ratings(nb: nbformat.NotebookNode) -> list[tuple[int, int, int]]:
    """(minutes, difficulty 1-5, importance 1-5) of each exercise whose heading has its rating line under it."""
    return [(int(m), len(d), len(i)) for cell in nb.cells if cell.cell_type == "markdown"
            for m, d, d0, i, i0 in EXERCISE_RATING.findall(cell.source) if len(d + d0) == len(i + i0) == 5]


def prose_words(nb: nbformat.NotebookNode) -> int:
    """Every word of a notebook's markdown, answers and self-check included, counted as study_minutes counts them
    (runs of letters, digits and underscores): what the course's word budget (tests/test_course.py) limits."""
    return sum(len(re.findall(r"\w+", cell.source)) for cell in nb.cells if cell.cell_type == "markdown")


def study_minutes(nb: nbformat.NotebookNode) -> int:
    """A lesson's study time in minutes: prose at 120 words a minute, code at 6 lines a minute, printed output at 20
    lines a minute (tables of numbers are read, not skimmed), each exercise's own budget from its heading
    ("(about N minutes)"; 10 where a heading states none) and 5 for the self-check, rounded to 5. Counted on the
    lesson (stubs, not answers), without the header line, the set-up cell, the deep dive and the self-check."""
    words = lines = exercises = output = 0
    for cell in nb.cells:
        tags = cell.metadata.get("tags", [])
        if cell.cell_type == "markdown":
            if "badge" not in tags and ANSWERS not in tags and not cell.source.startswith(("## Check yourself",
                                                                                         "## Deep dive")):
                words += len(re.findall(r"\w+", re.sub(r"\*\*Study time:\*\*.*", "", cell.source, flags=re.S)))
        elif "setup" not in tags:
            source, n = stub_source(cell.source)
            lines += len(source.splitlines())
            output += sum(len(o.get("text", "").splitlines())
                          for o in cell.get("outputs", []) if o.get("output_type") == "stream")
            exercises += n + source.count(STUB[1]) * (n == 0)
    budgets = exercise_budgets(nb)[:exercises]
    exercise_minutes = sum(budgets) + DEFAULT_BUDGET * (exercises - len(budgets))
    minutes = words / 120 + lines / 6 + output / 20 + exercise_minutes + 5
    return 5 * round(minutes / 5)


# ── the editor's limits (issue 55): what a learner reads before and in each lesson ─────────────────────────────────
LIMITS = {"readme": 1500, "lessons": 13000, "lesson": 1900, "stretch": 250, "output": 300}


def words(text: str) -> int:
    """Words as the course counts them (runs of letters, digits and underscores), HTML comments left out."""
    return len(re.findall(r"\w+", re.sub(r"<!--.*?-->", " ", text, flags=re.S)))


def prose_stretches(nb: nbformat.NotebookNode) -> list[tuple[int, int]]:
    """(first markdown cell, words) of each run of markdown cells with no code cell between them."""
    import nbformat

    runs, start, n = [], None, 0
    for i, cell in enumerate([*nb.cells, nbformat.v4.new_code_cell()]):
        if cell.cell_type == "markdown":
            start, n = (i if start is None else start), n + words(cell.source)
        elif start is not None:
            runs.append((start, n))
            start, n = None, 0
    return runs


def output_words(nb: nbformat.NotebookNode) -> list[tuple[int, int]]:
    """(code cell, words) of what each code cell prints or displays as text (its plain-text outputs)."""
    out = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            text = "".join("".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                           for o in cell.get("outputs", []) if o.get("output_type") != "error")
            out.append((i, words(text)))
    return out


def counts(root) -> dict:
    """What the editor's limits (LIMITS) hold: {"readme": words, "lessons": total words, "per_lesson": {stem: (words,
    (cell, longest prose stretch), (cell, wordiest output))}}; words of each lesson's markdown (lessons/), outputs from
    solutions/, where they are stored."""
    import nbformat

    from pathlib import Path

    root = Path(root)
    per = {}
    for path in sorted((root / "lessons").glob("0*.ipynb")):
        nb, sol = nbformat.read(path, as_version=4), nbformat.read(root / "solutions" / path.name, as_version=4)
        per[path.stem] = (prose_words(nb), max(prose_stretches(nb), key=lambda r: r[1]),
                          max(output_words(sol), key=lambda r: r[1]))
    return {"readme": words((root / "README.md").read_text(encoding="utf-8")),
            "lessons": sum(n for n, _, _ in per.values()), "per_lesson": per}


def over_limits(root) -> list[str]:
    """One line per count over its limit (none when the course keeps to LIMITS)."""
    c = counts(root)
    over = [f"README.md: {c['readme']:,} words, over {LIMITS['readme']:,}"] if c["readme"] > LIMITS["readme"] else []
    if c["lessons"] > LIMITS["lessons"]:
        over.append(f"all lessons: {c['lessons']:,} words, over {LIMITS['lessons']:,}")
    for stem, (n, (cell, stretch), (ocell, out)) in c["per_lesson"].items():
        over += [f"{stem}: {what}, over {limit}" for what, value, limit in (
            (f"{n:,} words", n, LIMITS["lesson"]), (f"cell {cell} starts {stretch} words of prose", stretch,
             LIMITS["stretch"]), (f"cell {ocell} prints {out} words", out, LIMITS["output"])) if value > limit]
    return over


def report(root) -> list[str]:
    """The counts the editor's limits (LIMITS) hold: the README's words, each lesson's markdown (lessons/), its longest
    prose stretch and its wordiest output (solutions/, where the outputs are stored), each marked over or within."""
    c = counts(root)
    mark = lambda n, limit: f"{n:>6,}{' over' if n > limit else ''}"
    lines = [f"README.md: {mark(c['readme'], LIMITS['readme'])} words (at most {LIMITS['readme']:,})",
             f"{'lesson':34s} {'words':>11s} {'longest prose (cell)':>24s} {'wordiest output (cell)':>26s}"]
    for stem, (n, (cell, stretch), (ocell, out)) in c["per_lesson"].items():
        lines.append(f"{stem:34s} {mark(n, LIMITS['lesson']):>11s} "
                     f"{mark(stretch, LIMITS['stretch']) + f' ({cell})':>24s} "
                     f"{mark(out, LIMITS['output']) + f' ({ocell})':>26s}")
    lines.append(f"{'all lessons':34s} {mark(c['lessons'], LIMITS['lessons']):>11s}   limits: {LIMITS['lesson']:,} a "
                 f"lesson, {LIMITS['lessons']:,} in all, {LIMITS['stretch']} a prose stretch, {LIMITS['output']} an "
                 "output")
    return lines
