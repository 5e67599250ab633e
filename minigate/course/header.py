"""The header cells every notebook gets from the build, in solutions/ and lessons/ alike: a markdown cell tagged
`badge` gets the "Open in Colab" badge of its own notebook at REF, a code cell tagged `setup` gets SETUP (the code
in setup_cell.py: in Colab it fetches the repository at REF into ./minigate and installs minigate from it, data
included, keeping Colab's torch; locally it does nothing). Lessons in GPU_LESSONS get Colab's GPU accelerator
metadata (a T4), so Colab opens them on a GPU runtime."""

from __future__ import annotations

from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # nbformat (and jsonschema under it) costs seconds to import: only where a notebook is read
    import nbformat


# The GitHub repository (owner/name) and the release tag (or commit) that the badges open and the Colab set-up cell
# installs. A fork changes this one line and runs `python -m minigate.course build`. REF is pinned: a later push to
# the repository never changes what a learner's Colab runs; a release tags the commit (`git tag v0.2.0`) and sets it.
REPOSITORY, REF = "minigate-course/minigate", "v0.2.0"
GPU_LESSONS = ("03", "07", "08")  # lessons that want a GPU: Colab opens them on a T4 runtime


def _setup_cell(ref: str, repository: str) -> str:
    text = (Path(__file__).with_name("setup_cell.py")).read_text(encoding="utf-8")
    cell = text.split("# ── cell ──\n", 1)[1].rstrip("\n")
    return cell.replace("__REF__", ref).replace("__REPOSITORY__", repository)


SETUP = _setup_cell(REF, REPOSITORY)


def badge(path: str) -> str:
    """Markdown "Open in Colab" badge for a notebook at `path` in the repository (e.g. lessons/01_x.ipynb)."""
    return ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
            f"(https://colab.research.google.com/github/{REPOSITORY}/blob/{REF}/{path})")


def set_header(nb: nbformat.NotebookNode, path: str) -> None:
    """Write the badge and set-up cells (found by their tags) and Colab's accelerator metadata from the
    constants above; `path` is the notebook's path in the repository (solutions/NN_name.ipynb)."""
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
