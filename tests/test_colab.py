"""The lessons' set-up cell in a simulated Colab, end to end (lessons 01 and 04).

What is simulated, and how:
- Colab's Python with its libraries but without minigate: a fresh virtual environment whose only extra
  path is a folder of links to this environment's site-packages, minigate (and its editable-install hooks)
  left out. pip then installs into the new environment and never touches this one.
- Colab's ipywidgets 7.7.1 (with the widgetsnbextension 3.6 it requires), installed into that environment
  from PyPI when PyPI can be reached (CI can); otherwise the test runs with this environment's ipywidgets.
- `google.colab` imported in the kernel, a scratch folder standing in for /content as the kernel's working
  directory (so it is on sys.path, as /content is in Colab).
- GitHub: git's `url.<base>.insteadOf` (through GIT_CONFIG_COUNT/KEY/VALUE) answers
  https://github.com/<REPOSITORY> with a clone of this checkout whose tag REF points at HEAD, so the cell
  fetches the committed HEAD exactly as Colab would fetch the release.

Runs: lesson 01 in a fresh "/content" (fetch, install, run; the set-up cell run a second time does nothing);
then minigate is uninstalled, leaving /content/minigate behind (a namespace-package trap: the folder imports as
an empty `minigate`), and lesson 04's set-up and import cells run (install from the existing folder; the rest of
lesson 04 is what `make test` runs twice anyway). About 40 s on 2 cores.
MINIGATE_COLAB_OUT=<folder> keeps the executed notebooks there.
"""

import json
import os
import shutil
import site
import subprocess
import venv
from pathlib import Path

import nbformat
import pytest

from minigate import course


def _colab_widgets() -> list[str]:
    """Colab's ipywidgets 7.7.1 and what it requires, installed without dependencies; `notebook` (which
    widgetsnbextension 3.6 requires) in the release that matches this environment's JupyterLab (notebook 7.N
    goes with JupyterLab 4.N), so that pip's resolver in the set-up cell finds everything satisfied, as in Colab."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        notebook = f"notebook~=7.{version('jupyterlab').split('.')[1]}.0"
    except PackageNotFoundError:
        notebook = "notebook"
    return ["ipywidgets==7.7.1", "widgetsnbextension==3.6.10", "ipython_genutils==0.2.0", notebook]


def _site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _hidden(name: str) -> bool:
    """Entries of site-packages that make minigate importable (or run code at start-up)."""
    return name.startswith(("minigate", "__editable__")) or name.endswith(".pth") or name == "__pycache__"


@pytest.fixture(scope="module")
def colab(tmp_path_factory):
    root = tmp_path_factory.mktemp("colab")
    # Colab's libraries: every package of this environment but minigate
    base = root / "colab-libraries"
    base.mkdir()
    for folder in dict.fromkeys(site.getsitepackages()):
        for entry in Path(folder).iterdir():
            if not _hidden(entry.name) and not (base / entry.name).exists():
                (base / entry.name).symlink_to(entry)
    env_dir = root / "python"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    fake = root / "colab-module"
    (fake / "google" / "colab").mkdir(parents=True)  # `google` stays a namespace package (protobuf's is one too)
    (fake / "google" / "colab" / "__init__.py").write_text('"""A stand-in for Colab\'s google.colab."""\n')
    (_site_packages(python) / "colab_libraries.pth").write_text(f"{fake}\n{base}\n")
    env = {**os.environ, "PYTHONNOUSERSITE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    check = subprocess.run([str(python), "-c", "import torch, ipykernel, minigate"], cwd=root, env=env,
                           capture_output=True, text=True)
    assert "No module named 'minigate'" in check.stderr, check.stderr  # the deps are there, minigate is not
    widgets = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *_colab_widgets()],
                             env=env, capture_output=True, text=True, timeout=300)
    # GitHub: a clone of this checkout, with the pinned REF at HEAD
    upstream = root / "github.git"
    head = subprocess.run(["git", "-C", str(course.ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    subprocess.run(["git", "clone", "-q", "--bare", "--shared", str(course.ROOT), str(upstream)], check=True)
    subprocess.run(["git", "-C", str(upstream), "tag", "-f", course.REF, head], check=True, capture_output=True)
    kernel_env = {
        "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": f"url.{upstream}.insteadOf",
        "GIT_CONFIG_VALUE_0": f"https://github.com/{course.REPOSITORY}",
        "PYTHONNOUSERSITE": "1", "PYTHONPATH": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
    }
    spec = root / "jupyter" / "kernels" / "colab"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}",
                 "--IPKernelApp.exec_lines=import google.colab"],  # Colab's kernel has it imported
        "display_name": "simulated Colab", "language": "python", "env": kernel_env}))
    content = root / "content"
    content.mkdir()
    return dict(root=root, python=python, env=env, content=content, jupyter=root / "jupyter", head=head,
                colab_widgets=widgets.returncode == 0, widgets_log=widgets.stderr)


def _run(colab, notebook: str, monkeypatch, extra=(), whole=True):
    """Execute a lesson in the simulated Colab kernel (the whole of it, or its set-up and import cells only); returns
    the notebook and the index of its set-up cell (its last cells: the set-up cell again, then `extra`)."""
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell

    monkeypatch.setenv("JUPYTER_PATH", str(colab["jupyter"]))
    nb = nbformat.read(course.ROOT / "lessons" / notebook, as_version=4)
    setup = next(i for i, c in enumerate(nb.cells) if "setup" in c.metadata.get("tags", []))
    if not whole:  # the set-up cell and the lesson's imports, the first code cell after it
        nb.cells = nb.cells[:next(i for i in range(setup + 1, len(nb.cells)) if nb.cells[i].cell_type == "code") + 1]
    nb.cells += [new_code_cell(nb.cells[setup].source)] + [new_code_cell(src) for src in extra]
    client = NotebookClient(nb, kernel_name="colab", timeout=600, allow_errors=False,
                            resources={"metadata": {"path": str(colab["content"])}})
    client.execute()
    if os.environ.get("MINIGATE_COLAB_OUT"):  # keep the executed notebook (what a learner sees), e.g. to read it
        nbformat.write(nb, Path(os.environ["MINIGATE_COLAB_OUT"]) / notebook)
    return nb, setup


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


PROBE = """import json, os, sys, torch, ipywidgets, minigate
print(json.dumps({
    "cwd_on_path": os.getcwd() in [os.path.abspath(p) for p in sys.path],
    "minigate": minigate.__file__, "data": str(minigate.resources.DATA_DIR), "torch": torch.__file__,
    "ipywidgets": ipywidgets.__version__, "prefix": sys.prefix}))"""


def test_every_package_and_the_data_ship():
    """pyproject.toml lists the packages by hand (it maps minigate._data to data/): a new subpackage must be added."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    listed = tomllib.loads((course.ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    found = {".".join(p.parent.relative_to(course.ROOT).parts) for p in (course.ROOT / "minigate").rglob("__init__.py")}
    assert found | {"minigate._data"} == set(listed), "add the new package to [tool.setuptools] packages"


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_lessons_run_in_a_simulated_colab(colab, monkeypatch):
    site_packages = _site_packages(colab["python"])
    import torch

    # lesson 01 in a fresh Colab: the set-up cell fetches REF (here: HEAD) and installs minigate
    nb, setup = _run(colab, "01_attention_and_sinks.ipynb", monkeypatch, extra=[PROBE])
    first, again, probe = _text(nb.cells[setup]), _text(nb.cells[-2]), json.loads(_text(nb.cells[-1]))
    assert first.startswith(f"minigate 0.1.0 ({course.REF}) from https://github.com/{course.REPOSITORY}; data in "
                            f"{site_packages / 'minigate' / '_data'}; torch {torch.__version__}"), first
    assert again == first  # run again: nothing to do, the same line
    clone = colab["content"] / "minigate"
    assert subprocess.run(["git", "-C", str(clone), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip() == colab["head"]
    assert probe["cwd_on_path"] and probe["prefix"] == str(colab["root"] / "python")
    assert Path(probe["minigate"]).is_relative_to(site_packages)  # installed, not the checkout nor the clone
    assert Path(probe["data"]) == site_packages / "minigate" / "_data"
    # Colab's torch kept: nothing installed over it, the kernel imports the one that was there
    assert not (site_packages / "torch").exists() and probe["torch"] == str(colab["root"] / "colab-libraries" /
                                                                            "torch" / "__init__.py")
    if colab["colab_widgets"]:
        assert probe["ipywidgets"] == "7.7.1"  # Colab's ipywidgets kept; lesson 01's explorer ran under it
        explorer = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})
                    and "explorer" in o["data"].get("text/plain", "")]
        assert explorer, "the attention explorer displays its picture under ipywidgets 7.7.1"
    else:
        import warnings

        warnings.warn(f"no PyPI: ran with this environment's ipywidgets ({colab['widgets_log'][-300:]})", stacklevel=1)

    # the /content/minigate folder stays, minigate is gone: `import minigate` now finds the folder as an empty
    # namespace package; the set-up cell must see through it and install from the folder
    subprocess.run([str(colab["python"]), "-m", "pip", "uninstall", "-q", "-y", "minigate"], env=colab["env"],
                   check=True)
    trap = subprocess.run([str(colab["python"]), "-c", "import minigate; print(minigate.__file__)"],
                          cwd=colab["content"], env=colab["env"], capture_output=True, text=True, check=True)
    assert trap.stdout.strip() == "None"
    nb, setup = _run(colab, "04_sinks_and_massive_activations.ipynb", monkeypatch, extra=[PROBE], whole=False)
    assert _text(nb.cells[setup]) == first
    assert Path(json.loads(_text(nb.cells[-1]))["minigate"]).is_relative_to(site_packages)
