"""The nbgrader course folder with the real nbgrader, as an instructor uses it (its README's commands), on lesson 01:
a solutions submission gets full marks, a blank one 0, one with a known wrong answer and a deleted check cell 1 of 2
(the cell is put back and graded); `nbgrader validate` of the blank lesson fails; the release leaks no answers.
No MINIGATE_GRADING anywhere: grading mode comes from nbgrader itself. About a minute on 2 CPU cores."""

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from minigate import course
from minigate.course import checks
from minigate.course.nbgrader_course import main as nbgrader_main
from minigate.course.nbgrader_course import setup_course

pytest.importorskip("nbgrader", reason="nbgrader is not installed: pip install -e '.[grading]'")
pytestmark = pytest.mark.slow  # a course folder graded by nbgrader once for the file: minutes

LESSON, NOTEBOOK = "lesson01", "01_attention_and_sinks.ipynb"
NO_MASK = 'scores.masked_fill(future, float("-inf"))'  # lesson 01's mask; without it: the "no causal mask" mistake


def nbgrader(*args, cwd):
    """nbgrader's command as an instructor runs it, in this environment activated (nbgrader calls `alembic` by name)."""
    env = {k: v for k, v in os.environ.items() if k != checks.GRADING_ENV}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("OMP_NUM_THREADS", "2")
    run = subprocess.run(["nbgrader", *args], cwd=cwd, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"nbgrader {' '.join(args)} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return run.stdout + run.stderr


def submit(folder: Path, student: str, nb: nbformat.NotebookNode) -> None:
    (folder / "submitted" / student / LESSON).mkdir(parents=True)
    nbformat.write(nb, folder / "submitted" / student / LESSON / NOTEBOOK)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("course")
    assert nbgrader_main([str(folder)]) == 0
    nbgrader("generate_assignment", LESSON, cwd=folder)
    release = nbformat.read(folder / "release" / LESSON / NOTEBOOK, as_version=4)

    solution = nbformat.read(course.ROOT / "solutions" / NOTEBOOK, as_version=4)
    wrong = nbformat.from_dict(solution)
    exercise = next(c for c in wrong.cells if c.source.startswith("def causal_attention("))
    assert NO_MASK in exercise.source
    exercise.source = exercise.source.replace(NO_MASK, "scores")
    wrong.cells = [c for c in wrong.cells if c.source.strip() != "attention_with_null = "
                   "checks.attention_with_null(attention_with_null)"]  # a deleted check cell (its answer is right)
    submit(folder, "solved", solution)
    submit(folder, "blank", release)
    submit(folder, "wrong", wrong)
    log = nbgrader("autograde", LESSON, cwd=folder)
    nbgrader("export", cwd=folder)
    with open(folder / "grades.csv", newline="", encoding="utf-8") as f:
        scores = {row["student_id"]: (float(row["score"]), float(row["max_score"])) for row in csv.DictReader(f)}
    return folder, release, scores, log


def test_the_course_folder_has_config_sources_and_readme(graded):
    folder, *_ = graded
    assert (folder / "nbgrader_config.py").read_text() == (Path(course.__file__).parent / "nbgrader_config.py"
                                                           ).read_text()
    assert sorted(p.name for p in (folder / "source").iterdir()) == [f"lesson{n}" for n in checks.LESSONS]
    from traitlets.config.loader import PyFileConfigLoader  # how nbgrader reads it (and only logs its errors)

    config = PyFileConfigLoader("nbgrader_config.py", path=str(folder)).load_config()
    assert config.Execute.timeout == 600 and config.OverwriteCells.add_missing_cells is True
    assert config.GenerateAssignment.preprocessors[0] == "minigate.course.nbgrader_course.release_lesson"
    readme = (folder / "README.md").read_text()
    for command in ("generate_assignment", "autograde", "generate_feedback", "export"):
        assert f"nbgrader {command}" in readme
    assert "Copy of" in readme  # how learners name their submissions


def test_autograde_scores_full_blank_and_partial(graded):
    _, _, scores, _ = graded
    assert scores == {"solved": (2.0, 2.0), "blank": (0.0, 2.0), "wrong": (1.0, 2.0)}


def test_a_deleted_check_cell_is_put_back_and_graded(graded):
    folder, _, _, log = graded
    nb = nbformat.read(folder / "autograded" / "wrong" / LESSON / NOTEBOOK, as_version=4)
    restored = [c for c in nb.cells if "was missing from the submission" in c.source]
    assert len(restored) == 1 and "checks.attention_with_null(attention_with_null)" in restored[0].source
    assert "✓ attention_with_null: passed" in "".join(o.get("text", "") for o in restored[0].outputs)
    check = next(c for c in nb.cells if c.source.strip() == "causal_attention = checks.causal_attention("
                                                            "causal_attention)")
    assert any("no causal mask" in o.get("text", "") for o in check.outputs)  # the check's own hint
    assert "CellTimeoutError" not in log


def test_the_release_has_no_answers_and_no_badge_to_the_solutions(graded):
    _, release, _, _ = graded
    text = nbformat.writes(release)
    assert f"/blob/{course.REF}/solutions/" not in text and course.badge(f"lessons/{NOTEBOOK}") in text
    assert not [c for c in release.cells if course.ANSWERS in c.metadata.get("tags", [])]
    assert "### BEGIN SOLUTION" not in text and "raise NotImplementedError()" in text


def test_validate_fails_on_the_blank_lesson(graded, tmp_path):
    """A learner's Validate, in their own folder (no course config, no environment variable)."""
    folder, *_ = graded
    shutil.copy(folder / "release" / LESSON / NOTEBOOK, tmp_path / NOTEBOOK)
    out = nbgrader("validate", NOTEBOOK, cwd=tmp_path)
    assert "VALIDATION FAILED" in out and "not attempted" in out and "Success!" not in out


def test_setup_refuses_to_overwrite_a_changed_file(tmp_path, capsys):
    assert setup_course(tmp_path) and nbgrader_main([str(tmp_path)]) == 0  # the same files again: fine
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\n")
    assert nbgrader_main([str(tmp_path)]) == 2 and "--force" in capsys.readouterr().err
    assert nbgrader_main([str(tmp_path), "--force"]) == 0
    assert nbgrader_main([str(tmp_path / "x"), "--solutions", str(tmp_path)]) == 2  # no lessons there
