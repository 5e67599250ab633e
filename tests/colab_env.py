"""minigate installed as learners get it, not editable: a wheel of this checkout, environments to install it into, and
a simulated Colab. tests/test_package_data.py, tests/test_colab.py, `make test` and `make test-colab` use it.

    python tests/colab_env.py wheel DIR             # the wheel, in DIR, installed into DIR/env (make test)
    python tests/colab_env.py colab [NOTEBOOK...]   # every lesson (or these) in a simulated Colab (make test-colab)

COLAB below is the one place where Colab's versions are written (from Google's snapshot of Colab's runtime, named
there). What is simulated, and how:
- Colab's Python and libraries, two ways. In tests/test_colab.py (CI): this environment's packages without minigate
  (`linked_env`), every package of COLAB but torch (COLAB_HEAVY) installed over them from PyPI at Colab's version
  (`install_colab`, with what they need that this environment lacks; about 55 s), when PyPI can be reached. In make
  test-colab (`pypi_colab`): a new environment of Colab's Python with every package of COLAB at Colab's version from
  PyPI, checked after the install (pip fills in what they need, at its newest); a dependency of minigate that Colab
  lacks goes in at its floor in pyproject.toml. PyPI's torch for Linux is a CUDA build, with its nvidia-* wheels
  about 4 GB to download and install; without a GPU it runs on the CPU.
- Both check that the lessons' set-up cell installs minigate and changes no other package (`pip list` before and
  after, `setup_changes`): pyproject.toml's floors are at most Colab's versions, so pip upgrades nothing in Colab.
- `google.colab` imported in the kernel, a fresh scratch folder standing in for /content as the kernel's working
  directory (so it is on sys.path, as /content is in Colab).
- GitHub: git's `url.<base>.insteadOf` (through GIT_CONFIG_COUNT/KEY/VALUE) answers https://github.com/<REPOSITORY>
  with a repository holding this checkout's files (`git_files`: the working tree, committed or not) in one commit
  tagged REF, so the set-up cell fetches them exactly as Colab would fetch the release.
MINIGATE_COLAB_OUT=<folder> keeps the executed notebooks there.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
import time
import tomllib
import venv
import warnings
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]

# Colab's GPU runtime as Google's public snapshot records it: repository googlecolab/backend-info, commit a724079 of
# 2026-08-19 ("Upgrade to Python 3.13"), Python from os-info-gpu.txt, every other version from pip-freeze.gpu.txt.
# To update from a newer snapshot: copy each version below from those two files (and look there for a new dependency
# of minigate); pyproject.toml's floors follow, the lower of Colab's and CI's version (tests/test_colab.py checks).
# COLAB is what make test-colab installs (pypi_colab) and tests/test_colab.py installs but torch (colab_over): every
# dependency of minigate (None: Colab lacks it, and it is installed at its floor), then the kernel and widget stack
# the lessons run under, then the libraries datasets reads with. Python: the newest 3.13 at hand (Colab's 3.13.15).
COLAB_SNAPSHOT = "googlecolab/backend-info a724079 (2026-08-19): os-info-gpu.txt, pip-freeze.gpu.txt"
COLAB: dict[str, str | None] = {
    "python": "3.13",  # 3.13.15
    # minigate's dependencies (pyproject.toml), each one preinstalled in Colab
    "torch": "2.11.0",  # Colab's is 2.11.0+cu128; PyPI's 2.11.0 for Linux is a CUDA build too (CUDA 13), 4 GB
    "numpy": "2.1.3",
    "einops": "0.8.2",
    "safetensors": "0.8.0",
    "huggingface_hub": "1.27.0",
    "tokenizers": "0.22.2",
    "transformers": "5.15.0",
    "datasets": "4.0.0",
    "matplotlib": "3.10.0",
    "ipywidgets": "7.7.1",
    "tqdm": "4.67.3",
    "ipython": "7.34.0",
    "nbformat": "5.11.1",
    "nbclient": "0.10.4",
    "jupyter_client": "7.4.9",
    "filelock": "3.32.3",
    "scipy": "1.16.3",
    "psutil": "5.9.5",
    # the kernel and the widgets: ipykernel runs the lessons, notebook 6 and widgetsnbextension 3 go with ipywidgets 7
    "ipykernel": "6.17.1",
    "jupyter_core": "5.9.1",
    "traitlets": "5.7.1",
    "pyzmq": "26.2.1",
    "tornado": "6.5.7",
    "notebook": "6.5.7",
    "widgetsnbextension": "3.6.10",
    "jupyterlab_widgets": "3.0.16",
    "ipython-genutils": "0.2.0",
    # what datasets reads and fetches with
    "pandas": "2.2.3",
    "pyarrow": "18.1.0",
    "fsspec": "2025.3.0",
}
# Colab's versions that do not install here, each with the nearest that does: {name: version installed instead}
COLAB_SUBSTITUTES: dict[str, str] = {}
# what tests/test_colab.py (CI) leaves at this environment's version: torch's CUDA build is a 4 GB download
COLAB_HEAVY = ("torch",)


def canonical(name: str) -> str:
    """A distribution's name as pip compares them (PEP 503): huggingface_hub, huggingface-hub -> huggingface-hub."""
    return re.sub(r"[-_.]+", "-", name).lower()


def git_files() -> list[str]:
    """This checkout's files as git sees them, in their working-tree state: the tracked ones and the untracked ones it
    does not ignore (a new data file counts before it is committed)."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True, text=True, check=True).stdout
    return sorted({f for f in out.split("\0") if f and (ROOT / f).is_file()})


def clean_copy(dest: Path) -> Path:
    """A copy of git_files() in dest: none of what a checkout may also hold (a stale build/, *.egg-info, runs/)."""
    for f in git_files():
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dest / f)
    return dest


def build_wheel(out: Path) -> Path:
    """The wheel of a clean copy of this checkout, built into `out` with this environment's setuptools."""
    with tempfile.TemporaryDirectory(prefix="minigate-src-") as src:
        clean_copy(Path(src))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                        src], check=True)
    return next(out.glob("minigate-*.whl"))


def clean_env(**extra: str) -> dict[str, str]:
    """os.environ without what would put this checkout or this environment on another environment's path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return {**env, "PYTHONNOUSERSITE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


def site_packages(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def _hidden(name: str) -> bool:
    """Entries of site-packages that make minigate importable (or run code at start-up)."""
    return name.startswith(("minigate", "__editable__")) or name.endswith(".pth") or name == "__pycache__"


def linked_env(env_dir: Path) -> Path:
    """A virtual environment with this environment's packages but not minigate: its one extra path is a folder of links
    to this environment's site-packages, minigate (and its editable-install hooks) left out. pip installs into it and
    never touches this environment. Returns its python."""
    libraries = env_dir / "libraries"
    libraries.mkdir(parents=True)
    for folder in dict.fromkeys(site.getsitepackages()):
        for entry in Path(folder).iterdir():
            if not _hidden(entry.name) and not (libraries / entry.name).exists():
                (libraries / entry.name).symlink_to(entry)
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
    python = env_dir / "bin" / "python"
    (site_packages(python) / "libraries.pth").write_text(f"{libraries}\n")
    return python


def wheel_env(dest: Path) -> Path:
    """A new wheel of this checkout in dest, installed (not editable, no dependencies) into a linked_env at dest/env.
    Returns its python."""
    wheel = build_wheel(dest)
    python = linked_env(dest / "env")
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd=dest,
                   env=clean_env(), check=True)
    return python


def floors() -> dict[str, str]:
    """{dependency: its floor} from pyproject.toml, the library's and the course's (what the set-up cell installs),
    where each is written `name>=version`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["course"]
    found = {d: re.fullmatch(r"([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)", d) for d in deps}
    if not all(found.values()):
        raise ValueError(f"each dependency needs a floor, name>=version: {[d for d, m in found.items() if not m]}")
    return dict(m.groups() for m in found.values())


def colab_versions(skip=()) -> dict[str, str]:
    """{package: the version the simulated Colab installs}: COLAB's (or its substitute), a dependency of minigate that
    Colab lacks (None in COLAB, or not there) at its floor; Python and the packages in `skip` left out."""
    lacking = {name: floor for name, floor in floors().items() if COLAB.get(name) is None}
    chosen = {name: COLAB_SUBSTITUTES.get(name, v) for name, v in COLAB.items() if v is not None and name != "python"}
    return {name: v for name, v in {**chosen, **lacking}.items() if name not in skip}


def colab_pins(skip=()) -> list[str]:
    """colab_versions as pip requirements, name==version."""
    return [f"{name}=={v}" for name, v in colab_versions(skip).items()]


def pip_versions(python: Path) -> dict[str, str]:
    """{canonical name: version} of every distribution the environment of `python` has, as `pip list` gives them."""
    out = subprocess.run([str(python), "-m", "pip", "list", "--format", "json"], env=clean_env(), capture_output=True,
                         text=True, check=True)
    return {canonical(d["name"]): d["version"] for d in json.loads(out.stdout)}


def changes(before: dict[str, str], after: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    """{name: (version before, version after)} of what was installed, removed, upgraded or downgraded."""
    return {name: (before.get(name), after.get(name)) for name in sorted(before.keys() | after.keys())
            if before.get(name) != after.get(name)}


def off_colab(versions: dict[str, str], skip=()) -> dict[str, tuple[str, str | None]]:
    """{name: (Colab's version, the one in `versions`)} where pip_versions differs from colab_versions."""
    from packaging.version import Version

    have = {name: versions.get(canonical(name)) for name in colab_versions(skip)}
    return {name: (v, have[name]) for name, v in colab_versions(skip).items()
            if have[name] is None or Version(have[name]) != Version(v)}


def colab_python() -> str:
    """A python of Colab's version: $MINIGATE_COLAB_PYTHON, python3.X on PATH, or pyenv's; else this one, warning."""
    name = f"python{COLAB['python']}"
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for candidate in (os.environ.get("MINIGATE_COLAB_PYTHON"), shutil.which(name),
                      *sorted(pyenv.glob(f"{COLAB['python']}.*/bin/{name}"), reverse=True)):
        if candidate and subprocess.run([str(candidate), "-c", ""], capture_output=True).returncode == 0:
            return str(candidate)
    warnings.warn(f"no {name} (set MINIGATE_COLAB_PYTHON): Colab simulated with this Python, {sys.version.split()[0]}",
                  stacklevel=2)
    return sys.executable


def install_colab(python: Path, skip=()) -> subprocess.CompletedProcess:
    """pip installs colab_pins(skip) into the environment of `python`, with what they need that it lacks: over a
    linked_env, each one shadows this environment's copy (pip leaves the links alone). --no-compile: pip would
    byte-compile every module of the ~25 packages (transformers, pandas, scipy: most of them never imported here);
    Python compiles what the kernel imports, when it imports it."""
    return subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-compile", *colab_pins(skip)],
                          env=clean_env(), capture_output=True, text=True)


def pypi_colab(env_dir: Path) -> Path:
    """A virtual environment of Colab's Python with Colab's libraries from PyPI, each at COLAB's version (checked).
    Returns its python."""
    subprocess.run([colab_python(), "-m", "venv", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    pip = install_colab(python)
    if pip.returncode:
        raise RuntimeError(f"pip could not install Colab's libraries: {pip.stdout[-2000:]}{pip.stderr[-3000:]}")
    wrong = off_colab(pip_versions(python))
    if wrong:
        raise RuntimeError(f"not Colab's versions, {{name: (Colab's, installed)}}: {wrong}")
    return python


def github(root: Path) -> tuple[Path, str]:
    """GitHub's copy of the course: a repository of this checkout's files (git_files) in one commit tagged REF.
    Returns its folder and the commit."""
    from minigate import course

    repo = clean_copy(root / "github")
    git = ["git", "-C", str(repo), "-c", "user.name=minigate tests", "-c", "user.email=tests@localhost", "-c",
           "commit.gpgsign=false", "-c", "init.defaultBranch=main", "-c", "core.compression=0"]
    # core.compression 0 stored in it too: the set-up cell's fetch then packs the checkpoints without deflating them
    for cmd in (["init", "-q"], ["config", "core.compression", "0"], ["add", "-A", "-f"],
                ["commit", "-q", "-m", "the working tree"], ["tag", course.REF]):
        subprocess.run([*git, *cmd], check=True)
    return repo, subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


def colab(root: Path, python: Path) -> dict:
    """Colab around the environment of `python`: google.colab, GitHub, and a kernel spec "colab" (root/jupyter, for
    JUPYTER_PATH) that starts it with Colab's environment."""
    from minigate import course

    fake = root / "colab-module"
    (fake / "google" / "colab").mkdir(parents=True)  # `google` stays a namespace package (protobuf's is one too)
    (fake / "google" / "colab" / "__init__.py").write_text('"""A stand-in for Colab\'s google.colab."""\n')
    (site_packages(python) / "google_colab.pth").write_text(f"{fake}\n")
    upstream, head = github(root)
    kernel_env = {
        "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": f"url.{upstream}.insteadOf",
        "GIT_CONFIG_VALUE_0": f"https://github.com/{course.REPOSITORY}",
        "PYTHONNOUSERSITE": "1", "PYTHONPATH": "", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        # as in Colab, imports write their bytecode (install_colab leaves it to them), whatever this shell says
        "PYTHONDONTWRITEBYTECODE": "",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
    }
    spec = root / "jupyter" / "kernels" / "colab"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}",
                 "--IPKernelApp.exec_lines=import google.colab"],  # Colab's kernel has it imported
        "display_name": "simulated Colab", "language": "python", "env": kernel_env}))
    return dict(root=root, python=python, env=clean_env(), jupyter=root / "jupyter", head=head)


def run_lesson(sim: dict, notebook: str, content: Path, extra=(), whole=True, timeout=900):
    """Execute lessons/`notebook` in the simulated Colab's kernel, in `content` (its /content): the whole of it, or its
    set-up and import cells only. Returns the notebook and the index of its set-up cell; its last cells are the set-up
    cell again, then `extra`."""
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell

    nb = nbformat.read(ROOT / "lessons" / notebook, as_version=4)
    setup = next(i for i, c in enumerate(nb.cells) if "setup" in c.metadata.get("tags", []))
    if not whole:  # the set-up cell and the lesson's imports, the first code cell after it
        nb.cells = nb.cells[:next(i for i in range(setup + 1, len(nb.cells)) if nb.cells[i].cell_type == "code") + 1]
    nb.cells += [new_code_cell(nb.cells[setup].source)] + [new_code_cell(src) for src in extra]
    saved = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(sim["jupyter"])
    try:
        NotebookClient(nb, kernel_name="colab", timeout=timeout, allow_errors=False,
                       resources={"metadata": {"path": str(content)}}).execute()
    finally:
        if saved is None:
            del os.environ["JUPYTER_PATH"]
        else:
            os.environ["JUPYTER_PATH"] = saved
        if os.environ.get("MINIGATE_COLAB_OUT"):  # keep the executed notebook (what a learner sees), e.g. to read it
            nbformat.write(nb, Path(os.environ["MINIGATE_COLAB_OUT"]) / notebook)
    return nb, setup


def _seconds(cell) -> float:
    """How long a cell ran, from the timing nbclient records."""
    from datetime import datetime

    t = cell.metadata.get("execution", {})
    start, end = t.get("iopub.execute_input"), t.get("shell.execute_reply")
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds() if start and end else 0.0


def setup_changes(before: dict[str, str], after: dict[str, str]) -> dict[str, tuple[str | None, str | None]]:
    """What a set-up cell changed beside installing minigate (it should change nothing else: Colab's packages stay)."""
    changed = changes(before, after)
    added = changed.pop("minigate", (None, None))
    if added[0] is not None or added[1] is None:
        changed["minigate"] = added  # not installed, or it was there before
    return changed


def run_lessons(notebooks: list[str]) -> int:
    """make test-colab: each lesson end to end in a fresh simulated Colab runtime (minigate not installed, an empty
    /content) of one environment; prints each one's result and time. A lesson fails where its set-up cell changed any
    package but minigate (pip list before and after). Returns the number that failed."""
    from nbclient.exceptions import CellExecutionError

    with tempfile.TemporaryDirectory(prefix="minigate-colab-") as tmp:
        root, start = Path(tmp), time.time()
        python = pypi_colab(root / "python")
        sim = colab(root, python)
        version = subprocess.run([str(python), "-c", "import sys; print(sys.version.split()[0])"], capture_output=True,
                                 text=True, check=True).stdout.strip()
        print(f"simulated Colab ({COLAB_SNAPSHOT}), built in {time.time() - start:.0f} s: Python {version}, "
              + ", ".join(f"{name} {v}" for name, v in colab_versions().items())
              + "".join(f"; {name} {v} for Colab's {COLAB[name]}" for name, v in COLAB_SUBSTITUTES.items()), flush=True)
        failed = 0
        for i, notebook in enumerate(notebooks):
            subprocess.run([str(python), "-m", "pip", "uninstall", "-q", "-y", "minigate"], env=sim["env"],
                           capture_output=True)  # a fresh runtime: minigate not installed yet
            (content := root / f"content-{i}").mkdir()
            before, start, error = pip_versions(python), time.time(), ""
            try:
                nb, setup = run_lesson(sim, notebook, content)
            except CellExecutionError as e:
                error, nb, setup = re.sub(r"\x1b\[[0-9;]*m", "", str(e)), None, None  # without colours
            took = time.time() - start
            changed = setup_changes(before, pip_versions(python))
            if changed:
                error += f"\nthe set-up cell changed more than minigate, {{name: (before, after)}}: {changed}"
            failed += bool(error)
            setup_s = f", set-up {_seconds(nb.cells[setup]):.0f} s" if nb else ""
            print(f"{notebook:45s} {'FAILED' if error else 'passed'} {took:6.0f} s{setup_s}"
                  + ("" if changed else ", set-up changed only minigate"), flush=True)
            if error:
                print("    " + "\n    ".join(error.strip().splitlines()[-15:]), flush=True)
        print(f"{len(notebooks) - failed} passed, {failed} failed")
        return failed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("wheel", help="build the wheel into DIR and install it into DIR/env").add_argument("dir", type=Path)
    sub.add_parser("colab", help="run lessons in a simulated Colab").add_argument("notebooks", nargs="*")
    args = parser.parse_args(argv)
    if args.command == "wheel":
        start, python = time.time(), wheel_env(args.dir)
        print(f"{next(args.dir.glob('*.whl')).name} installed into {python.parents[1]} ({time.time() - start:.0f} s)")
        return 0
    notebooks = [Path(n).name for n in args.notebooks] or sorted(p.name for p in (ROOT / "lessons").glob("*.ipynb"))
    return 1 if run_lessons(notebooks) else 0


if __name__ == "__main__":
    sys.exit(main())
