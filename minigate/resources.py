"""Where the course's data lives: the tokenizer, the prompt sets and the shipped checkpoints.

    from minigate.resources import data_dir
    data_dir() / "tokenizer.json"

The files sit in the repository's `data/` folder. The same folder travels inside the package as
`minigate/_data/` (pyproject.toml maps the package `minigate._data` to `data/`), so they are found however
minigate was installed:

- from a checkout, `pip install -e .` (or `make install`): `<checkout>/data/`;
- from a git URL (`pip install git+https://github.com/...`), a wheel or a Colab set-up cell:
  `<site-packages>/minigate/_data/`.

`MINIGATE_CORPORA_DIR` is a different folder: local copies of the text corpora, e.g. WikiText-2 (see
`minigate.data.corpora`).
"""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
CANDIDATES = (PACKAGE / "_data",        # installed: a wheel, a git URL, Colab
              PACKAGE.parent / "data")  # a checkout (editable install, or running from the repository)
MARKER = "tokenizer.json"               # a folder holding it is the data folder


def data_dir() -> Path:
    """The data folder of this installation: the first candidate that holds `tokenizer.json`.

    When none does (a broken install), returns the installed location anyway, so that the first file a
    lesson opens raises FileNotFoundError naming the path it looked at."""
    for folder in CANDIDATES:
        if (folder / MARKER).is_file():
            return folder
    return CANDIDATES[0]


DATA_DIR = data_dir()
