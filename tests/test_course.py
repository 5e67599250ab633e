"""The lesson builder on small synthetic notebooks, and the real solutions/ and lessons/ folders."""

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from minigate import course
from minigate.course import checks

EXERCISE = """import torch

def double(x):
    \"\"\"Twice x.\"\"\"
    ### BEGIN SOLUTION
    y = x + x
    return y
    ### END SOLUTION

class Box:
    def area(self):
        if True:
            ### BEGIN SOLUTION
            return 4
            ### END SOLUTION"""


def write_solution(folder, name="01_demo.ipynb", exercise=EXERCISE, exercise_outputs=()):
    nb = new_notebook(cells=[
        new_markdown_cell("# Demo"),
        new_code_cell(exercise, execution_count=1, outputs=list(exercise_outputs)),
        new_code_cell("double = checks.double(double)\nprint(double(2))", execution_count=2,
                      outputs=[new_output("stream", name="stdout", text="✓ double: passed (3 cases)\n4\n")]),
        new_code_cell("1 + 1", execution_count=3,
                      outputs=[new_output("execute_result", data={"text/plain": "2"}, execution_count=3)]),
    ])
    folder.mkdir(exist_ok=True)
    nbformat.write(nb, folder / name)
    return nb


@pytest.fixture
def dirs(tmp_path):
    return tmp_path / "solutions", tmp_path / "lessons"


def test_markers_become_stubs_at_the_marker_indentation(dirs):
    sol, les = dirs
    write_solution(sol)
    # the first build also writes nbgrader metadata into the solution (nbgrader's source notebook)
    assert course.build(sol, les) == ["solutions/01_demo.ipynb", "01_demo.ipynb"]
    lesson = nbformat.read(les / "01_demo.ipynb", as_version=4)
    src = lesson.cells[1].source
    assert "    # YOUR CODE HERE\n    raise NotImplementedError()\n\nclass Box:" in src
    assert src.endswith("\n            # YOUR CODE HERE\n            raise NotImplementedError()")
    assert "### " not in src and "x + x" not in src and '"""Twice x."""' in src
    assert lesson.cells[1].outputs == [] and lesson.cells[1].execution_count == 1
    # the solutions keep their markers and their answer
    assert "### BEGIN SOLUTION\n    y = x + x" in nbformat.read(sol / "01_demo.ipynb", as_version=4).cells[1].source


def test_the_lesson_runs_and_the_stored_check_output_becomes_the_notice(dirs):
    sol, les = dirs
    write_solution(sol)
    course.build(sol, les)
    lesson = nbformat.read(les / "01_demo.ipynb", as_version=4)
    assert lesson.cells[2].outputs[0].text == checks.not_implemented_notice("double") + "\n4\n"
    assert lesson.cells[3].outputs == nbformat.read(sol / "01_demo.ipynb", as_version=4).cells[3].outputs
    namespace = {}
    exec(lesson.cells[1].source, namespace)  # the exercise cell only defines: it runs, silently
    with pytest.raises(NotImplementedError):
        namespace["double"](2)


def test_build_is_idempotent_and_check_sees_no_stale_lesson(dirs):
    sol, les = dirs
    write_solution(sol)
    course.build(sol, les)
    before = (les / "01_demo.ipynb").read_bytes()
    assert course.build(sol, les) == [] and course.build(sol, les, check=True) == []
    assert (les / "01_demo.ipynb").read_bytes() == before


def test_check_names_stale_missing_and_orphaned_lessons(dirs, capsys):
    sol, les = dirs
    write_solution(sol)
    write_solution(sol, "02_other.ipynb")
    course.build(sol, les)
    write_solution(sol, exercise=EXERCISE.replace("x + x", "2 * x").replace("Twice", "Double"))  # stale
    (les / "02_other.ipynb").unlink()  # missing
    write_solution(les, "09_orphan.ipynb")  # no solution
    args = ["build", "--check", "--solutions", str(sol), "--lessons", str(les)]
    assert course.main(args) == 1
    assert "01_demo.ipynb, 02_other.ipynb, 09_orphan.ipynb" in capsys.readouterr().err
    assert course.main(args[:1] + args[2:]) == 0  # build
    assert course.main(args) == 0
    assert sorted(p.name for p in les.iterdir()) == ["01_demo.ipynb", "02_other.ipynb"]


def test_header_cells_come_from_one_constant(dirs, monkeypatch):
    sol, les = dirs
    nb = write_solution(sol)
    nb.cells[:0] = [new_markdown_cell("old badge", metadata={"tags": ["badge"]}),
                    new_code_cell("old setup", metadata={"tags": ["setup"]})]
    nbformat.write(nb, sol / "01_demo.ipynb")
    assert course.build(sol, les) == ["solutions/01_demo.ipynb", "01_demo.ipynb"]
    for folder in (sol, les):
        cells = nbformat.read(folder / "01_demo.ipynb", as_version=4).cells
        assert cells[0].source == course.badge(f"{folder.name}/01_demo.ipynb") and cells[1].source == course.SETUP
        assert f"github/{course.REPOSITORY}/blob/{course.REF}/{folder.name}/01_demo.ipynb" in cells[0].source
    assert course.build(sol, les) == []
    monkeypatch.setattr(course.header, "REPOSITORY", "someone/fork")  # a fork changes one line
    assert course.build(sol, les, check=True) == ["solutions/01_demo.ipynb", "01_demo.ipynb"]
    compile(course.SETUP, "setup", "exec")


def test_the_pinned_ref_is_the_release_of_this_version():
    """The set-up cell installs REF; a release bumps the version and REF together (one tag per release)."""
    import minigate

    assert course.REF == f"v{minigate.__version__}" and f'"MINIGATE_REF", "{course.REF}"' in course.SETUP
    assert f'"https://github.com/{course.REPOSITORY}"' in course.SETUP and "/" in course.REPOSITORY
    assert "--no-deps" in course.SETUP or "torch==" in course.SETUP  # Colab's torch is never replaced


def test_gpu_lessons_get_colab_accelerator_metadata(dirs):
    sol, les = dirs
    write_solution(sol, "03_train.ipynb")
    nb = write_solution(sol, "01_demo.ipynb")
    nb.metadata.update(accelerator="GPU", colab={"gpuType": "T4", "provenance": []})  # a stale copy-paste
    nbformat.write(nb, sol / "01_demo.ipynb")
    course.build(sol, les)
    for folder in (sol, les):
        gpu = nbformat.read(folder / "03_train.ipynb", as_version=4).metadata
        assert gpu["accelerator"] == "GPU" and gpu["colab"]["gpuType"] == "T4"
        cpu = nbformat.read(folder / "01_demo.ipynb", as_version=4).metadata
        assert "accelerator" not in cpu and cpu["colab"] == {"provenance": []}
    assert course.build(sol, les, check=True) == []


def test_real_gpu_lessons_have_the_metadata():
    for path in sorted((course.ROOT / "lessons").glob(course.NOTEBOOK_GLOB)):
        meta = nbformat.read(path, as_version=4).metadata
        wants_gpu = path.name[:2] in course.GPU_LESSONS
        assert (meta.get("accelerator") == "GPU" and meta["colab"]["gpuType"] == "T4") == wants_gpu, path.name
    assert set(course.GPU_LESSONS) == {"03", "07", "08"}


def test_answers_stay_in_the_solutions(dirs):
    sol, les = dirs
    nb = write_solution(sol)
    nb.cells += [new_markdown_cell("## Check yourself\n1. Why?"),
                 new_markdown_cell("**Answers.** 1. Because.", metadata={"tags": ["answers"]})]
    nbformat.write(nb, sol / "01_demo.ipynb")
    course.build(sol, les)
    lesson = nbformat.read(les / "01_demo.ipynb", as_version=4)
    assert lesson.cells[-1].source == "## Check yourself\n1. Why?" and len(lesson.cells) == len(nb.cells) - 1
    assert "Because" not in (les / "01_demo.ipynb").read_text()
    assert nbformat.read(sol / "01_demo.ipynb", as_version=4).cells[-1].source == "**Answers.** 1. Because."


@pytest.mark.parametrize("source, message", [
    ("def f():\n    ### BEGIN SOLUTION\n    return 1", "line 2: ### BEGIN SOLUTION never closed"),
    ("def f():\n    return 1\n    ### END SOLUTION", "line 3: ### END SOLUTION without"),
    ("def f():\n    ### BEGIN SOLUTION\n    ### BEGIN SOLUTION\n    ### END SOLUTION",
     "line 3: ### BEGIN SOLUTION inside"),
    ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION", "line 1: ### BEGIN SOLUTION at top level"),
])
def test_marker_errors_name_file_cell_and_line(dirs, source, message, capsys):
    sol, les = dirs
    write_solution(sol, exercise=source)
    with pytest.raises(course.MarkerError, match=rf"01_demo.ipynb: cell 1, {message}"):
        course.build(sol, les)
    assert course.main(["build", "--solutions", str(sol), "--lessons", str(les)]) == 2
    assert message in capsys.readouterr().err and not les.exists()


def test_an_exercise_cell_with_outputs_is_refused(dirs):
    sol, les = dirs
    write_solution(sol, exercise_outputs=[new_output("stream", name="stdout", text="hi\n")])
    with pytest.raises(course.MarkerError, match="cell 1, an exercise cell must print nothing"):
        course.build(sol, les)


def test_real_lessons_are_up_to_date_with_solutions():
    """Every solutions notebook has an up-to-date lessons twin, and no lesson lacks a solution."""
    solutions = sorted(p.name for p in (course.ROOT / "solutions").glob(course.NOTEBOOK_GLOB))
    lessons = sorted(p.name for p in (course.ROOT / "lessons").glob(course.NOTEBOOK_GLOB))
    assert solutions == lessons, "run `python -m minigate.course build`"
    assert course.build(check=True) == [], "stale lessons: run `python -m minigate.course build`"
    for name in solutions:  # every lesson starts with its badge and the set-up cell
        tags = [c.metadata.get("tags", []) for c in nbformat.read(course.ROOT / "solutions" / name, 4).cells]
        assert any("badge" in t for t in tags[:3]) and any("setup" in t for t in tags[:4]), \
            f"{name}: start with a markdown cell tagged badge and a code cell tagged setup"


@pytest.mark.slow
def test_solutions_and_built_lessons_pass_strict_nbval(tmp_path):
    """End to end: a solved notebook with stored outputs and the lesson built from it both pass nbval."""
    import subprocess
    import sys

    exercise = ("def tracker(tokens):\n    \"\"\"A train() callback.\"\"\"\n"
                "    ### BEGIN SOLUTION\n    from minigate.course.checks import reference_bos_tracker\n"
                "    return reference_bos_tracker(tokens)\n    ### END SOLUTION")
    stdout = new_output("stream", name="stdout", text="✓ bos_tracker: passed (3 cases)\nTrue\n")
    nb = new_notebook(cells=[
        new_markdown_cell("badge", metadata={"tags": ["badge"]}),
        new_code_cell("setup", execution_count=0, metadata={"tags": ["setup"]}),
        new_code_cell("from minigate.course import checks", execution_count=1),
        new_code_cell(exercise, execution_count=2),
        new_code_cell("tracker = checks.bos_tracker(tracker)\nprint(callable(tracker(None)))",
                      execution_count=3, outputs=[stdout]),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    (tmp_path / "solutions").mkdir()
    nbformat.write(nb, tmp_path / "solutions" / "01_demo.ipynb")
    course.build(tmp_path / "solutions", tmp_path / "lessons")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "--nbval", "--nbval-current-env", "-p",
                          "no:cacheprovider", "--nbval-sanitize-with", str(course.ROOT / "lessons/nbval_sanitize.cfg"),
                          "solutions", "lessons"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "8 passed" in run.stdout, run.stdout[-3000:]


def test_lesson_headers_state_the_readme_times_and_end_with_a_self_check():
    """Study and run times: one number each, the same in the lesson's header and in the README; every lesson
    ends with 3-5 self-check questions whose answers stay in solutions/."""
    import re

    readme = (course.ROOT / "README.md").read_text(encoding="utf-8")
    study = dict(re.findall(r"^\| (\d\d) [^|]+\|[^|]+\| about (\d+) min \|", readme, flags=re.M))
    run = dict(re.findall(r"^\| (\d\d) [^|]+\|[^|]+\| about \d+ min \| (\d+) s \|$", readme, flags=re.M))
    names = sorted(p.name for p in (course.ROOT / "solutions").glob(course.NOTEBOOK_GLOB))
    assert sorted(study) == sorted(run) == [n[:2] for n in names]
    for name in names:
        header = nbformat.read(course.ROOT / "lessons" / name, as_version=4).cells[0].source
        n = name[:2]
        assert f"**Study time:** about {study[n]} minutes" in header, name
        assert int(study[n]) == course.study_minutes(nbformat.read(course.ROOT / "lessons" / name, as_version=4)), \
            f"{name}: the lesson changed; put course.study_minutes' count in its header and the README"
        assert "**Run time:**" in header and f"about {run[n]} s" in header, name
        solution = nbformat.read(course.ROOT / "solutions" / name, as_version=4).cells
        lesson = nbformat.read(course.ROOT / "lessons" / name, as_version=4).cells
        assert lesson[-1].source.startswith("## Check yourself"), name
        questions = re.findall(r"^\d\. ", lesson[-1].source, flags=re.M)
        assert 3 <= len(questions) <= 5, name
        assert "answers" in solution[-1].metadata.get("tags", []), name
        assert len(re.findall(r"^\d\. ", solution[-1].source, flags=re.M)) == len(questions), name
    hours = lambda minutes: f"{round(minutes / 30) / 2:g}"  # to the half hour
    core = sum(int(study[n]) for n in ("01", "02", "03", "04"))
    assert f"About {hours(sum(map(int, study.values())))} hours in all; lessons 01-04 (about {hours(core)} hours)" \
        in readme, "the README's total study time no longer adds up"


def test_study_minutes_counts_prose_code_and_exercises(dirs):
    sol, les = dirs
    nb = write_solution(sol)  # 1 word of prose, 2 exercise blocks (in two functions), short code cells
    base = course.study_minutes(nb)
    assert base == 5 * round((1 / 120 + 20 / 6 + 2 * 10 + 5) / 5) == 30
    course.build(sol, les)
    assert course.study_minutes(nbformat.read(les / "01_demo.ipynb", as_version=4)) == base  # stubs count the same
    nb.cells.append(new_markdown_cell("word " * 1200))  # ten more minutes of reading
    assert course.study_minutes(nb) == base + 10
    nb.cells.append(new_markdown_cell("## Deep dive (optional)\n" + "word " * 1200))  # optional: not counted
    assert course.study_minutes(nb) == base + 10
    table = new_code_cell("print(table)")
    table.outputs = [nbformat.v4.new_output("stream", name="stdout", text="0.1 0.2\n" * 200)]  # 200 lines to read
    nb.cells.append(table)
    assert course.study_minutes(nb) == base + 20
    nb.cells.append(new_markdown_cell("### Exercise 1 · A long one (about 25 minutes)\n\nWrite it."))
    assert course.study_minutes(nb) == base + 20 + 15  # its own budget (25) counts, not the default 10


def test_every_exercise_heading_states_its_budget():
    """Each lesson has one '(about N minutes)' exercise heading per graded check, and the study time counts them: 5 to
    30 minutes an exercise, up to 60 for a capstone (difficulty 5)."""
    from minigate.course import checks
    from minigate.course.study import exercise_budgets, exercise_ratings

    for path in sorted((course.ROOT / "lessons").glob(course.NOTEBOOK_GLOB)):
        nb = nbformat.read(path, as_version=4)
        budgets = exercise_budgets(nb)
        assert len(budgets) == len(checks.LESSONS[path.name[:2]]), (path.name, budgets)
        assert all(5 <= b <= (60 if d == 5 else 30) for b, d, _ in exercise_ratings(nb)), (path.name, budgets)


def test_every_exercise_states_difficulty_and_importance():
    """ARENA's rating under each exercise heading, next to its budget ('> Difficulty: 🔴🔴⚪⚪⚪ · Importance: ...')."""
    from minigate.course.study import exercise_budgets, exercise_ratings

    for path in sorted((course.ROOT / "lessons").glob(course.NOTEBOOK_GLOB)):
        nb = nbformat.read(path, as_version=4)
        ratings = exercise_ratings(nb)
        assert [r[0] for r in ratings] == exercise_budgets(nb), (path.name, "an exercise heading without its rating")
        assert all(1 <= d <= 5 and 1 <= i <= 5 for _, d, i in ratings), (path.name, ratings)


def test_a_rating_is_read_only_under_its_heading():
    from minigate.course.study import exercise_ratings

    rated = "### Exercise 1 · One (about 15 minutes)\n\n> Difficulty: 🔴🔴⚪⚪⚪ · Importance: 🔵🔵🔵🔵⚪\n\nWrite it."
    assert exercise_ratings(nbformat.v4.new_notebook(cells=[new_markdown_cell(rated)])) == [(15, 2, 4)]
    for broken in (rated.replace("🔴🔴⚪⚪⚪", "🔴🔴⚪⚪"), rated.replace("\n\n>", "\n\nSome text.\n\n>")):
        assert exercise_ratings(nbformat.v4.new_notebook(cells=[new_markdown_cell(broken)])) == []


def test_the_course_keeps_to_its_word_budget():
    """At most 18,000 words of markdown in all (answers included) and 2,800 in any one lesson: a learner reads every
    one of them, so a lesson that grows must say something else in fewer words."""
    words = {p.name: course.prose_words(nbformat.read(p, as_version=4))
             for p in sorted((course.ROOT / "solutions").glob(course.NOTEBOOK_GLOB))}
    assert len(words) >= 8
    long = {name: n for name, n in words.items() if n > 2800}
    assert not long, f"lessons over 2,800 words: {long}"
    assert sum(words.values()) <= 18_000, f"{sum(words.values())} words in all, over 18,000: {words}"


def test_prose_words_counts_every_markdown_cell():
    nb = new_notebook(cells=[new_markdown_cell("# Title\nTwo words."), new_code_cell("x = 1  # not prose"),
                             new_markdown_cell("Answers: F-Attn 0.3", metadata={"tags": ["answers"]})])
    assert course.prose_words(nb) == 3 + 5  # "F-Attn 0.3" is four runs of \w


def test_the_readme_is_a_front_door():
    """At most 1,500 words (issue 55): what the course is, the effect, how to start, the lessons, instructors; the
    reference lives in docs/ and the README links every page of it."""
    from minigate.course.study import LIMITS, words

    readme = (course.ROOT / "README.md").read_text(encoding="utf-8")
    assert words(readme) <= LIMITS["readme"], f"README.md has {words(readme)} words, over {LIMITS['readme']}"
    for page in ("package", "training", "benchmarks", "testing", "glossary", "experiments", "gpu"):
        assert f"(docs/{page}.md)" in readme, f"the README should link docs/{page}.md"
        assert (course.ROOT / "docs" / f"{page}.md").is_file()


def test_report_counts_stretches_and_outputs():
    from minigate.course.study import output_words, prose_stretches, report, words

    nb = new_notebook(cells=[new_markdown_cell("one two"), new_markdown_cell("three <!-- not counted -->"),
                             new_code_cell("x = 1"), new_markdown_cell("four five six")])
    nb.cells[2].outputs = [new_output("stream", text="printed words here\n")]
    assert words("a b_c <!-- d e -->") == 2
    assert prose_stretches(nb) == [(0, 3), (3, 3)]
    assert output_words(nb) == [(2, 3)]
    lines = report(course.ROOT)
    assert lines[0].startswith("README.md:") and len(lines) == 2 + 8 + 1
