"""Text corpora: `load_documents(name)` -> (train documents, validation documents).

    wikitext-2       the articles of WikiText-2's *test* split, 90/10 by article (see below)
    wikitext-2-full  WikiText-2's own train / validation splits (needs the Hub or a full local copy)
    wikitext-103     WikiText-103's train / validation splits (Hub; capped at `max_chars`)
    tinystories      TinyStories train / validation (Hub; capped at `max_chars`)
    python-stdlib    the .py files of this Python's standard library, 90/10 by file (python_files.py)
    python-code      the .py files of a pinned list of pure-Python wheels (data/python-code.lock.json, fetched
                     with pip; code_wheels.py): the `code` presets' corpus, 150 MB, the same on every machine,
                     90/10 by file
    python-site      the .py files of this Python's site-packages and standard library, up to 150 MB: what
                     python-code was before it was pinned; it differs from machine to machine
    a+b              several corpora, concatenated (e.g. "python-stdlib+wikitext-2")

Where the text comes from: if the folder named by the environment variable MINIGATE_CORPORA_DIR
holds a local copy (`wikitext-2-raw/wiki.{train,valid,test}.raw`, `tinystories/TinyStories-{train,
valid}.txt`), it is read; otherwise the Hugging Face Hub (`datasets.load_dataset`). One printed line
says which. CI and the tests set MINIGATE_CORPORA_DIR=../shared/data, which holds only wiki.test.raw.
Its old name, MINIGATE_DATA_DIR, is refused with one line naming the new one.

The held-out split. Offline we only have WikiText-2's test split, so the `wikitext-2` corpus splits
it by article: an article starts at a top-level heading line ` = Title = `; article number i
(0-based, in file order) is validation if i % 10 == 9, else training. The test split has 62
articles: 56 train, 6 validation. No article is in both, and the split is the same on every machine.
The same rule (every 10th document) splits the Python corpora by file.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from .code_wheels import code_files, python_code_info
from .python_files import STDLIB_MAX_BYTES, python_site_info, site_files, stdlib_files, stdlib_info

HUB = {"wikitext-2": ("Salesforce/wikitext", "wikitext-2-raw-v1"),  # (repo, config) for datasets.load_dataset
       "wikitext-103": ("Salesforce/wikitext", "wikitext-103-raw-v1"),
       "tinystories": ("roneneldan/TinyStories", None)}
LOCAL_DIR_VAR, OLD_LOCAL_DIR_VAR = "MINIGATE_CORPORA_DIR", "MINIGATE_DATA_DIR"  # the folder of local copies
LOCAL = {"wikitext-2": "wikitext-2-raw/wiki.{split}.raw",  # file names inside MINIGATE_CORPORA_DIR
         "wikitext-103": "wikitext-103-raw/wiki.{split}.raw",
         "tinystories": "tinystories/TinyStories-{split}.txt"}
LOCAL_SPLIT = {"train": "train", "validation": "valid", "test": "test"}  # Hub split -> local file name


class DataUnavailableError(RuntimeError):
    """The text is neither in MINIGATE_CORPORA_DIR nor reachable on the Hub."""


def _say(msg: str):
    print(f"[minigate.data] {msg}", flush=True)


def local_copies() -> str | None:
    """The folder of local corpus copies, $MINIGATE_CORPORA_DIR; None if it is not set. Not the course's data/
    folder (resources.DATA_DIR). Its old name alone, $MINIGATE_DATA_DIR, is a ValueError naming the new one."""
    folder = os.environ.get(LOCAL_DIR_VAR)
    if not folder and os.environ.get(OLD_LOCAL_DIR_VAR):
        raise ValueError(f"{OLD_LOCAL_DIR_VAR} is now spelled {LOCAL_DIR_VAR}: set {LOCAL_DIR_VAR}="
                         f"{os.environ[OLD_LOCAL_DIR_VAR]} instead")
    return folder or None


# -- raw text ------------------------------------------------------------------------------------------
def _hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP probe, so an offline machine fails in seconds instead of retrying for half a minute."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True  # behind a proxy a direct probe proves nothing; let the Hub client try
    host = os.environ.get("HF_ENDPOINT", "https://huggingface.co").split("://")[-1].split("/")[0]
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _from_hub(name: str, split: str, max_chars: int | None) -> list[str]:
    repo, config = HUB[name]
    offline = any(os.environ.get(v, "").lower() in ("1", "true", "yes")
                  for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))
    local = local_copies()
    fix = (f"Either put a local copy in {LOCAL_DIR_VAR} (now {local!r}; expected file "
           f"{LOCAL[name].format(split=LOCAL_SPLIT.get(split, split))!r} inside it), "
           f"or connect to the internet so that datasets.load_dataset({repo!r}) can download it.")
    if not offline and not _hub_reachable():
        raise DataUnavailableError(f"{name} {split}: no local copy, and the Hugging Face Hub is unreachable. "
                                   + fix)
    import datasets

    try:
        ds = datasets.load_dataset(repo, config, split=split, streaming=max_chars is not None)
        rows, n = [], 0
        for row in ds:
            rows.append(row["text"])
            n += len(row["text"])
            if max_chars is not None and n >= max_chars:
                break
    except Exception as e:  # ConnectionError, offline mode, missing cache, ...: all mean "not available"
        raise DataUnavailableError(f"{name} {split}: could not load it from the Hub ({e}). {fix}") from e
    _say(f"{name} {split}: Hugging Face Hub {repo}" + (f" ({config})" if config else ""))
    return rows


def _normalize_wikitext(text: str) -> str:
    """One line per paragraph or heading, no blank lines: the Hub's rows and the .raw files agree."""
    return "".join(line.rstrip("\r\n") + "\n" for line in text.splitlines() if line.strip())


def load_text(name: str, split: str, max_chars: int | None = None) -> str:
    """The raw text of one split of a dataset: "wikitext-2" (train, validation, test), "tinystories"
    (train, validation) or "python-stdlib" (train, validation of the by-file split).
    Reads MINIGATE_CORPORA_DIR's local copy if there is one, else the Hub; prints which."""
    if name == "python-stdlib":
        return "".join(stdlib_documents(split))
    if name not in HUB:
        raise ValueError(f"unknown dataset {name!r}; known: {sorted(HUB) + ['python-stdlib']}")
    if split not in LOCAL_SPLIT or (name == "tinystories" and split == "test"):
        raise ValueError(f"{name} has no split {split!r}; use 'train' or 'validation'"
                         + (" or 'test'" if name.startswith("wikitext") else ""))
    local_dir = local_copies()
    path = Path(local_dir) / LOCAL[name].format(split=LOCAL_SPLIT[split]) if local_dir else None
    if path is not None and path.is_file():
        text = path.read_text(encoding="utf-8")
        if max_chars is not None:
            text = text[:max_chars]
        _say(f"{name} {split}: local copy ${LOCAL_DIR_VAR}/{LOCAL[name].format(split=LOCAL_SPLIT[split])}")
    else:
        rows = _from_hub(name, split, max_chars)  # wikitext rows are lines, tinystories rows are stories
        sep = "" if name.startswith("wikitext") else "\n<|endoftext|>\n"  # as in the TinyStories .txt files
        text = "".join(r.rstrip() + sep if sep else r for r in rows)
    return _normalize_wikitext(text) if name.startswith("wikitext") else text


# -- documents and the held-out split ------------------------------------------------------------------
_HEADING = re.compile(r"= [^=].* =")  # a stripped top-level heading; sections are "= = Section = ="


def articles(text: str) -> list[str]:
    """Split WikiText into articles, each starting at its ` = Title = ` line (text before the first
    heading, if any, is dropped)."""
    out: list[list[str]] = []
    for line in text.splitlines(keepends=True):
        if _HEADING.fullmatch(line.strip()):
            out.append([])
        if out:
            out[-1].append(line)
    return ["".join(a) for a in out]


def train_val_split(docs: list, every: int = 10) -> tuple[list, list]:
    """Deterministic held-out split by document: number i goes to validation if i % every == every - 1
    (so 10% with every=10), else to training. Documents are never cut, so none is in both."""
    train = [d for i, d in enumerate(docs) if i % every != every - 1]
    val = [d for i, d in enumerate(docs) if i % every == every - 1]
    return train, val


def _python_documents(name: str, files: list, split: str) -> list[str]:
    """One document per file, the train or validation files (90/10 by file) of a Python corpus: files are paths,
    or (label, bytes) pairs read from wheels."""
    if split not in ("train", "validation"):
        raise ValueError(f"{name} has splits 'train' and 'validation', not {split!r}")
    read = lambda f: (f[1] if isinstance(f, tuple) else f.read_bytes()).decode("utf-8", errors="replace")
    return [read(f) for f in train_val_split(files)[split == "validation"]]


def stdlib_documents(split: str, max_bytes: int | None = STDLIB_MAX_BYTES) -> list[str]:
    """python-stdlib's train or validation files (90/10 by file), one document per file."""
    return _python_documents("python-stdlib", stdlib_files(max_bytes), split)


def code_documents(split: str, max_bytes: int | None = None) -> list[str]:
    """python-code's train or validation files (90/10 by file), one document per file."""
    return _python_documents("python-code", code_files(max_bytes), split)


def site_documents(split: str, max_bytes: int | None = None) -> list[str]:
    """python-site's train or validation files (90/10 by file), one document per file."""
    return _python_documents("python-site", site_files(max_bytes), split)


def load_documents(name: str, max_chars: int | None = 50_000_000) -> tuple[list[str], list[str]]:
    """(train documents, validation documents) of a corpus (see the module docstring for the names).
    `max_chars` caps each split of tinystories (its train split is 1.9 GB)."""
    if "+" in name:
        parts = [load_documents(n, max_chars) for n in name.split("+")]
        return [d for tr, _ in parts for d in tr], [d for _, va in parts for d in va]
    if name == "wikitext-2":
        return train_val_split(articles(load_text("wikitext-2", "test")))
    if name == "wikitext-2-full":
        return articles(load_text("wikitext-2", "train")), articles(load_text("wikitext-2", "validation"))
    if name == "wikitext-103":
        return articles(load_text(name, "train", max_chars)), articles(load_text(name, "validation", max_chars))
    if name == "tinystories":
        def stories(split):
            text = load_text("tinystories", split, max_chars)
            return [d.strip() + "\n" for d in text.split("<|endoftext|>") if d.strip()]

        return stories("train"), stories("validation")
    if name in ("python-stdlib", "python-site"):
        info, documents = ((stdlib_info(), stdlib_documents) if name == "python-stdlib"
                           else (python_site_info(), site_documents))
        _say(f"{name}: {info['files']} files, {info['bytes']:,} bytes, Python {info['python']}")
        return documents("train"), documents("validation")
    if name == "python-code":
        info = python_code_info()
        _say(f"python-code: {info['files']} files of {info['wheels']} pinned wheels, {info['bytes']:,} bytes, "
             f"SHA-256 {info['sha256'][:12]}")
        return code_documents("train"), code_documents("validation")
    raise ValueError(f"unknown corpus {name!r}; known: wikitext-2, wikitext-2-full, wikitext-103, tinystories, "
                     "python-stdlib, python-code, python-site, or several joined with '+'")
