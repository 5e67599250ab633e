"""The lessons' set-up cell in a simulated Colab, end to end (lessons 01 and 04), in CI.

tests/colab_env.py builds the simulation (what is simulated, and how, is in its docstring): here Colab's libraries are
this environment's without minigate, with Colab's versions of every package in COLAB there but torch (COLAB_HEAVY: a
4 GB CUDA build) installed over them from PyPI when PyPI can be reached (CI can; otherwise the test runs with this
environment's versions, warning), about 55 s. `make test-colab` runs every lesson with Colab's Python and torch too.

Runs: lesson 01 in a fresh "/content" (fetch, install, run; the set-up cell run a second time does nothing; it
installs minigate and changes no other package, pip list before and after); then minigate is uninstalled, leaving
/content/minigate behind (a namespace-package trap: the folder imports as an empty `minigate`), and lesson 04's
set-up and import cells run (install from the existing folder; the rest of lesson 04 is what `make test` runs twice
anyway). About 100 s on 2 cores.
MINIGATE_COLAB_OUT=<folder> keeps the executed notebooks there.
"""

import json
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from colab_env import (COLAB, COLAB_HEAVY, COLAB_SNAPSHOT, canonical, colab, floors, install_colab, linked_env,
                        off_colab, pip_versions, run_lesson, setup_changes, site_packages)

import minigate
from minigate import course


@pytest.fixture(scope="module")
def sim(tmp_path_factory):
    root = tmp_path_factory.mktemp("colab")
    python = linked_env(root / "python")
    sim = colab(root, python)
    check = subprocess.run([str(python), "-c", "import torch, ipykernel, minigate"], cwd=root, env=sim["env"],
                           capture_output=True, text=True)
    assert "No module named 'minigate'" in check.stderr, check.stderr  # the deps are there, minigate is not
    pip = install_colab(python, COLAB_HEAVY)  # Colab's versions over this environment's, torch left as it is
    (content := root / "content").mkdir()
    return dict(sim, content=content, colab_installed=pip.returncode == 0, pip_log=pip.stdout + pip.stderr)


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


PROBE = """import json, os, sys, torch, ipywidgets, minigate
print(json.dumps({
    "cwd_on_path": os.getcwd() in [os.path.abspath(p) for p in sys.path],
    "minigate": minigate.__file__, "data": str(minigate.resources.DATA_DIR), "torch": torch.__file__,
    "ipywidgets": ipywidgets.__version__, "prefix": sys.prefix}))"""


def test_every_package_and_the_data_ship():
    """pyproject.toml lists the packages by hand (it maps minigate._data to data/): a new subpackage must be added."""
    listed = tomllib.loads((course.ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = {".".join(p.parent.relative_to(course.ROOT).parts) for p in (course.ROOT / "minigate").rglob("__init__.py")}
    assert found | {"minigate._data"} == set(listed), "add the new package to [tool.setuptools] packages"


def test_the_floors_are_the_lower_of_colabs_and_cis_versions():
    """pyproject.toml's floor of each dependency is the lower of Colab's version (COLAB in tests/colab_env.py) and this
    environment's (CI's), so that installing minigate in Colab upgrades nothing Colab ships; one Colab lacks (None in
    COLAB) is at most CI's version. requires-python takes in Colab's Python and this one."""
    import sys
    from importlib.metadata import version

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    python = tomllib.loads((course.ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    here = ".".join(map(str, sys.version_info[:2]))
    for version_ in (COLAB["python"], here):
        assert SpecifierSet(python).contains(version_), f"requires-python {python} leaves out Python {version_}"
    colab = {canonical(name): v for name, v in COLAB.items()}
    for name, floor in floors().items():
        assert canonical(name) in colab, f"{name}: is it in Colab ({COLAB_SNAPSHOT})? Add it to COLAB, None if not"
        ci, theirs = Version(version(name)), colab[canonical(name)]
        if theirs is None:
            assert Version(floor) <= ci, f"{name}>={floor}: above CI's {ci}"
        else:
            assert Version(floor) == min(Version(theirs), ci), (
                f"{name}>={floor}: the floor is the lower of Colab's {theirs} and CI's {ci}")


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
@pytest.mark.slow
def test_lessons_run_in_a_simulated_colab(sim):
    site = site_packages(sim["python"])
    import torch

    before = pip_versions(sim["python"])  # Colab as the learner finds it (pip list takes seconds: read once)
    if sim["colab_installed"]:
        wrong = off_colab(before, COLAB_HEAVY)
        assert not wrong, f"not Colab's versions, {{name: (Colab's, installed)}}: {wrong}"
    else:
        import warnings

        warnings.warn(f"no PyPI: ran with this environment's versions, not Colab's ({sim['pip_log'][-300:]})",
                      stacklevel=1)
    # lesson 01 in a fresh Colab: the set-up cell fetches REF (here: this checkout's files) and installs minigate,
    # and changes no other package (Colab's versions stay: pyproject.toml's floors are at most Colab's)
    nb, setup = run_lesson(sim, "01_attention_and_sinks.ipynb", sim["content"], extra=[PROBE])
    changed = setup_changes(before, pip_versions(sim["python"]))
    assert not changed, f"the set-up cell changed more than minigate, {{name: (before, after)}}: {changed}"
    first, again, probe = _text(nb.cells[setup]), _text(nb.cells[-2]), json.loads(_text(nb.cells[-1]))
    assert first.startswith(f"minigate {minigate.__version__} ({course.REF}) from https://github.com/{course.REPOSITORY}"
                            f"; data in {site / 'minigate' / '_data'}; torch {torch.__version__}"), first
    assert again == first  # run again: nothing to do, the same line
    clone = sim["content"] / "minigate"
    assert subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip() == sim["head"]
    assert probe["cwd_on_path"] and probe["prefix"] == str(sim["root"] / "python")
    assert Path(probe["minigate"]).is_relative_to(site)  # installed, not the checkout nor the clone
    assert Path(probe["data"]) == site / "minigate" / "_data"
    # Colab's torch kept: nothing installed over it, the kernel imports the one that was there
    assert not (site / "torch").exists() and probe["torch"] == str(sim["root"] / "python" / "libraries" / "torch" /
                                                                   "__init__.py")
    if sim["colab_installed"]:
        assert probe["ipywidgets"] == COLAB["ipywidgets"]  # Colab's ipywidgets kept; lesson 01's explorer ran under it
        explorer = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})
                    and "explorer" in o["data"].get("text/plain", "")]
        assert explorer, f"the attention explorer displays its picture under ipywidgets {COLAB['ipywidgets']}"

    # the /content/minigate folder stays, minigate is gone: `import minigate` now finds the folder as an empty
    # namespace package; the set-up cell must see through it and install from the folder
    subprocess.run([str(sim["python"]), "-m", "pip", "uninstall", "-q", "-y", "minigate"], env=sim["env"], check=True)
    trap = subprocess.run([str(sim["python"]), "-c", "import minigate; print(minigate.__file__)"],
                          cwd=sim["content"], env=sim["env"], capture_output=True, text=True, check=True)
    assert trap.stdout.strip() == "None"
    nb, setup = run_lesson(sim, "04_sinks_and_massive_activations.ipynb", sim["content"], extra=[PROBE], whole=False)
    assert _text(nb.cells[setup]) == first
    assert Path(json.loads(_text(nb.cells[-1]))["minigate"]).is_relative_to(site)
