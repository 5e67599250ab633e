"""Grading for instructors: `python -m minigate.course grade` scores notebooks with a known number of solved
exercises, and the build's nbgrader metadata marks every exercise and check cell."""

import csv
import json
import os

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from minigate import course
from minigate.course import checks
from minigate.course.checks import grade

IMPORTS = "import torch\nfrom einops import rearrange\nfrom minigate.course import checks"
SOLVED = {
    "g1_gate": "def g1_gate(z, gate_logits):\n    if gate_logits.dim() == 3:\n"
               "        gate_logits = rearrange(gate_logits, 'b t h -> b t h 1')\n"
               "    return z * torch.sigmoid(gate_logits)",
    "nonlinear_share": "def nonlinear_share(model, tokens, layer):\n"
                       "    a = f'blocks.{layer}.attn.'\n"
                       "    out = a + ('hook_z_gated' if model.cfg.is_gated(layer) else 'hook_z')\n"
                       "    names = [f'blocks.{layer}.hook_resid_pre', a + 'hook_pattern', out]\n"
                       "    _, cache = model.run_with_cache(tokens, names_filter=names)\n"
                       "    x = model.blocks[layer].attn_norm(cache[names[0]]).detach()\n"
                       "    m = (cache[names[1]] @ x[:, None]).transpose(0, 1).flatten(1, 2).double()\n"
                       "    z = rearrange(cache[out], 'b i h d -> h (b i) d').double()\n"
                       "    r = z - m @ torch.linalg.lstsq(m, z).solution\n"
                       "    return r.pow(2).sum((1, 2)) / z.pow(2).sum((1, 2))",
}
WRONG_EXCESS = "def first_token_excess(pattern):\n    return pattern[..., 0].mean((0, 2))  # uniform not subtracted"


def stub(name, args="*args"):
    return f"def {name}({args}):\n    # YOUR CODE HERE\n    raise NotImplementedError()"


def notebook(path, exercises):
    """A learner's notebook: an imports cell, then per exercise its cell and its check cell; one cell raises."""
    cells = [new_code_cell(IMPORTS)]
    for name, source in exercises:
        cells += [new_code_cell(source), new_code_cell(f"{name} = checks.{name}({name})")]
    cells.insert(3, new_code_cell("1 / 0  # an error of the learner's between exercises: grading goes on"))
    nb = new_notebook(cells=cells, metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                            "language": "python"}})
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
def test_grade_scores_known_notebooks(tmp_path, capsys):
    mixed = notebook(tmp_path / "alice.ipynb", [  # 2 solved, 1 wrong, 1 not attempted
        ("g1_gate", SOLVED["g1_gate"]), ("split_q_proj", stub("split_q_proj")),
        ("first_token_excess", WRONG_EXCESS), ("nonlinear_share", SOLVED["nonlinear_share"])])
    untouched = notebook(tmp_path / "bob.ipynb", [(name, stub(name)) for name in
                                                  ("g1_gate", "split_q_proj", "first_token_excess",
                                                   "nonlinear_share")])
    rc = course.main(["grade", str(mixed), str(untouched), "--csv", str(tmp_path / "s.csv"),
                      "--json", str(tmp_path / "s.json"), "--timeout", "120"])
    out = capsys.readouterr().out
    assert rc == 0
    rows = {line.split()[0]: line for line in out.splitlines()}
    assert rows["exercise"].split() == ["exercise", "alice.ipynb", "bob.ipynb"]
    assert rows["g1_gate"].split() == ["g1_gate", "passed", "not", "attempted"]
    assert rows["split_q_proj"].split() == ["split_q_proj", "not", "attempted", "not", "attempted"]
    assert rows["first_token_excess"].split() == ["first_token_excess", "failed", "not", "attempted"]
    assert rows["nonlinear_share"].split() == ["nonlinear_share", "passed", "not", "attempted"]
    assert rows["total"].split() == ["total", "2/4", "passed", "0/4", "passed"]

    with open(tmp_path / "s.csv", newline="", encoding="utf-8") as f:
        records = list(csv.DictReader(f))
    assert len(records) == 8
    excess = next(r for r in records if r["notebook"] == str(mixed) and r["exercise"] == "first_token_excess")
    assert excess["status"] == "failed" and "subtract what uniform" in excess["message"]  # the check's own hint

    data = json.loads((tmp_path / "s.json").read_text())
    assert [(n["passed"], n["exercises"]) for n in data["notebooks"]] == [(2, 4), (0, 4)]
    assert data["notebooks"][1]["results"]["g1_gate"]["status"] == "not attempted"


@pytest.mark.slow
def test_grade_a_real_lesson_solved_and_untouched(tmp_path, capsys):
    """Lesson 07's imports and its exercise: first_token_excess as in the solutions, and as the lesson's stub."""
    solution = nbformat.read(course.ROOT / "solutions" / "07_paper_1b_models.ipynb", as_version=4)
    lesson = course.lesson_from_solution(solution)
    imports = next(i for i, c in enumerate(solution.cells) if "from minigate.course import checks" in c.source)

    def exercise(nb, name):  # the exercise cell, then its check cell
        check = next(i for i, n in grade.check_cells(nb) if n == name)
        return [next(c for c in nb.cells[:check][::-1] if f"def {name}(" in c.source), nb.cells[check]]

    for label, nb in (("solved", solution), ("blank", lesson)):
        cells = [solution.cells[imports], *exercise(nb, "first_token_excess")]
        learner = new_notebook(cells=[new_code_cell(c.source) for c in cells], metadata=solution.metadata)
        nbformat.write(learner, tmp_path / f"07_{label}.ipynb")
    assert grade.main([str(tmp_path / "07_solved.ipynb"), str(tmp_path / "07_blank.ipynb"), "--timeout", "120"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].split() == ["first_token_excess", "passed", "not", "attempted"]
    assert out[2].split() == ["total", "1/1", "passed", "0/1", "passed"]


@pytest.mark.skipif(os.name != "posix", reason="Unix sockets: Linux and macOS")
def test_the_grading_kernel_needs_no_tcp_port():
    """CI once lost a grading kernel to a port race (ZMQError: Address already in use: a TCP port picked free was
    bound by a kernel nbval started meanwhile). The grading kernel's channels are Unix sockets named after it."""
    from minigate.course.checks.grade import _kernel_manager

    km, other = _kernel_manager(), _kernel_manager()
    assert km.transport == "ipc" and os.path.isabs(km.ip) and km.ip != other.ip  # each its own, from any folder
    assert len(km.ip) + len("-1") <= 104  # macOS's limit on a socket's path


@pytest.mark.slow
def test_each_notebook_s_kernel_is_shut_down_once_it_is_graded(tmp_path, monkeypatch):
    """A class's notebooks are graded one after another: each kernel (torch loaded: hundreds of MB) ends with its
    notebook, sockets and connection file removed, not when the grader exits."""
    made = []
    monkeypatch.setattr(grade, "_kernel_manager", lambda make=grade._kernel_manager: made.append(make()) or made[-1])
    path = notebook(tmp_path / "carol.ipynb", [("g1_gate", SOLVED["g1_gate"])])
    assert grade.grade_notebook(path, timeout=120)["g1_gate"][0] == "passed"
    km = made[0]
    assert not km.has_kernel and not os.path.exists(km.connection_file)
    if km.transport == "ipc":  # its five sockets
        assert not any(os.path.exists(f"{km.ip}-{i}") for i in range(1, 6))


def test_a_check_cell_is_scored_from_its_outputs():
    cell = new_code_cell("f = checks.f(f)")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="✓ f: passed (3 cases)\n")]
    assert grade.score_cell(cell, "f")[0] == "passed"
    cell.outputs = [nbformat.v4.new_output("error", ename="AssertionError", traceback=[],
                                           evalue=checks.not_attempted_message("f"))]
    assert grade.score_cell(cell, "f")[0] == "not attempted"
    cell.outputs = [nbformat.v4.new_output("error", ename="NameError", evalue="name 'f' is not defined",
                                           traceback=[])]
    assert grade.score_cell(cell, "f") == ("failed", "NameError: name 'f' is not defined")
    cell.outputs = []
    assert grade.score_cell(cell, "f") == ("failed", "the cell did not run")


def test_a_deleted_check_cell_fails():
    results = grade.complete({"a.ipynb": {"f": ("passed", ""), "g": ("passed", "")}, "b.ipynb": {"f": ("passed", "")}})
    assert results["b.ipynb"]["g"][0] == "failed" and "no check cell" in results["b.ipynb"]["g"][1]
    assert "1/2 passed" in grade.table(results).splitlines()[-1]


def test_notebooks_of_different_lessons_graded_together_are_scored_on_their_own_lesson():
    results = {"01_x.ipynb": {"causal_attention": ("passed", "")},
               "01_y.ipynb": {"attention_with_null": ("passed", "")}, "04_z.ipynb": {"locate_massive": ("passed", "")}}
    done = grade.complete(results, {"01_x.ipynb": "01", "01_y.ipynb": "01", "04_z.ipynb": "04"})
    assert list(done["01_x.ipynb"]) == ["causal_attention", "attention_with_null"]  # from its fellow lesson 01
    assert list(done["04_z.ipynb"]) == ["locate_massive"]  # not lesson 01's exercises
    totals = grade.table(done).splitlines()[-1].split()
    assert totals == ["total", "1/2", "passed", "1/2", "passed", "1/1", "passed"]


def test_every_lesson_check_cell_is_found_and_gets_nbgrader_metadata():
    found = []
    for path in sorted((course.ROOT / "solutions").glob(course.NOTEBOOK_GLOB)):
        nb = nbformat.read(path, as_version=4)
        grade.set_nbgrader(nb)
        found += [name for _, name in grade.check_cells(nb)]
        metas = [c.metadata["nbgrader"] for c in nb.cells if "nbgrader" in c.metadata]
        assert len({m["grade_id"] for m in metas}) == len(metas), path  # unique grade ids
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader")
            if course.BEGIN in cell.source:
                assert meta == dict(grade=False, grade_id=meta["grade_id"], locked=False, schema_version=3,
                                    solution=True), (path, cell.source[:60])
            elif grade.CHECK_CELL_RE.search(cell.source):
                assert meta == dict(grade=True, grade_id=meta["grade_id"], locked=True, points=1, schema_version=3,
                                    solution=False)
    assert sorted(found) == sorted(checks.EXERCISES)


def test_the_build_writes_nbgrader_metadata_into_solutions_and_lessons(tmp_path):
    sol, les = tmp_path / "solutions", tmp_path / "lessons"
    sol.mkdir()
    exercise = "def double(x):\n    ### BEGIN SOLUTION\n    return x + x\n    ### END SOLUTION"
    nbformat.write(new_notebook(cells=[new_code_cell(exercise), new_code_cell("double = checks.double(double)")]),
                   sol / "01_demo.ipynb")
    course.build(sol, les)
    for folder in (sol, les):
        cells = nbformat.read(folder / "01_demo.ipynb", as_version=4).cells
        assert cells[0].metadata["nbgrader"]["solution"] and cells[0].metadata["nbgrader"]["grade_id"] == "double"
        assert cells[1].metadata["nbgrader"]["grade"] and cells[1].metadata["nbgrader"]["points"] == 1
    assert course.build(sol, les, check=True) == []  # idempotent


@pytest.mark.slow
def test_a_check_cell_deleted_from_a_notebook_graded_alone_fails(tmp_path, capsys):
    """The expected exercises come from the notebook's lesson, not only from the other notebooks graded with it."""
    solution = nbformat.read(course.ROOT / "solutions" / "07_paper_1b_models.ipynb", as_version=4)
    imports = next(c for c in solution.cells if "from minigate.course import checks" in c.source)
    check = next(i for i, n in grade.check_cells(solution) if n == "first_token_excess")
    exercise = next(c for c in solution.cells[:check][::-1] if "def first_token_excess(" in c.source)
    nb = new_notebook(cells=[new_code_cell(imports.source), new_code_cell(exercise.source, metadata=exercise.metadata)],
                      metadata=solution.metadata)  # first_token_excess's check cell deleted
    (tmp_path / "submitted" / "alice" / "lesson07").mkdir(parents=True)
    path = tmp_path / "submitted" / "alice" / "lesson07" / "Copy of 07_paper_1b_models.ipynb"
    nbformat.write(nb, path)
    assert grade.main([str(path), "--timeout", "120"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["exercise", "Copy", "of", "07_paper_1b_models.ipynb"]
    assert out[1].split() == ["first_token_excess", "failed"] and out[2].split() == ["total", "0/1", "passed"]
    results = grade.grade_notebook(path, timeout=120)
    assert "no check cell `first_token_excess = checks.first_token_excess(first_token_excess)`" in \
        results["first_token_excess"][1]


@pytest.mark.parametrize("path, exercises, lesson", [
    ("04_sinks_and_massive_activations.ipynb", [], "04"),
    ("Copy of 04_sinks_and_massive_activations.ipynb", [], "04"),
    ("submitted/alice/lesson03/anything.ipynb", [], "03"),
    ("alice.ipynb", [], None),
    ("alice.ipynb", ["locate_massive"], "04"),  # what the notebook checks decides
    ("02_renamed.ipynb", ["locate_massive"], "04"),
    ("alice.ipynb", ["locate_massive", "g1_gate"], None),  # exercises of two lessons
    ("99_other.ipynb", [], None),
])
def test_the_lesson_of_a_notebook(path, exercises, lesson):
    nb = new_notebook(cells=[new_code_cell(f"{n} = checks.{n}({n})") for n in exercises])
    assert grade.lesson_of(path, nb) == lesson


def test_columns_are_labelled_by_the_shortest_unique_end_of_their_path():
    paths = ["submitted/alice/lesson04/04_x.ipynb", "submitted/bob/lesson04/04_x.ipynb", "work/y.ipynb",
             "z.ipynb"]
    assert list(grade.labels(paths).values()) == ["alice/lesson04/04_x.ipynb", "bob/lesson04/04_x.ipynb", "y.ipynb",
                                                  "z.ipynb"]
    results = {p: {"f": ("passed", "")} for p in paths}
    assert grade.table(results).splitlines()[0].split() == ["exercise", *grade.labels(paths).values()]
