"""Data: text corpora, a byte-level BPE tokenizer, and batches that always start with <bos>.

Corpora (`load_documents(name)` -> train documents, validation documents):

    wikitext-2       the articles of WikiText-2's *test* split, 90/10 by article (see below)
    wikitext-2-full  WikiText-2's own train / validation splits (needs the Hub or a full local copy)
    tinystories      TinyStories train / validation (Hub; capped at `max_chars`)
    wikitext-103     WikiText-103's train / validation splits (Hub; capped at `max_chars`)
    tinystories      TinyStories train / validation (Hub; capped at `max_chars`)
    python-stdlib    the .py files of this Python's standard library, 90/10 by file
    python-code      the .py files of this Python's site-packages and standard library (the `code`
                     preset's corpus: ~150 MB on a full install, read once in a 3000-step run), 90/10 by file
    a+b              several corpora, concatenated (e.g. "python-stdlib+wikitext-2")

Where the text comes from: if the folder named by the environment variable MINIGATE_DATA_DIR
holds a local copy (`wikitext-2-raw/wiki.{train,valid,test}.raw`, `tinystories/TinyStories-{train,
valid}.txt`), it is read; otherwise the Hugging Face Hub (`datasets.load_dataset`). One printed line
says which. CI and the tests set MINIGATE_DATA_DIR=../shared/data, which holds only wiki.test.raw.

The held-out split. Offline we only have WikiText-2's test split, so the `wikitext-2` corpus splits
it by article: an article starts at a top-level heading line ` = Title = `; article number i
(0-based, in file order) is validation if i % 10 == 9, else training. The test split has 62
articles: 56 train, 6 validation. No article is in both, and the split is the same on every machine.
The same rule (every 10th document) splits the `python-stdlib` corpus by file.

python-stdlib: the .py files under `sysconfig.get_paths()["stdlib"]`, minus test folders,
site-packages and the generated codec tables in encodings/. Files are ordered by a hash of their
relative path (deterministic, but mixing packages, so a size cap keeps a varied sample) and taken
until `max_bytes`. The standard library changes between Python versions, so this corpus does too:
`stdlib_info()` records the version, and so does every run's history.

python-code: the same rule over every site-packages folder too (`site.getsitepackages()` and the user
site), with test folders skipped, ordered by a hash of the path relative to its root, capped at
`CODE_MAX_BYTES`. Every machine has one, of a different size: `python_code_info()` records what was read
(Python version, files, bytes, a content hash), and `minigate train` writes it into run.json.

Token cache: `encode_corpus(name, tokenizer)` tokenizes a corpus once (batched, with a progress bar) and
keeps the ids in `MINIGATE_CACHE_DIR` (default ~/.cache/minigate/tokens) as uint16 (int32 past 65,536
tokens), keyed by a hash of the documents and of the tokenizer; the next run reads them in a second.

The tokenizer (`data/tokenizer.json`, used by the shipped checkpoints): byte-level BPE, vocab 4096,
`<bos>` = id 0, trained by `build_tokenizer()` (or `python -m minigate.data build-tokenizer`) on the
training documents of "python-stdlib+wikitext-2" with the default cap, under Python 3.11.7.
Training is deterministic; another Python version gives a slightly different stdlib and tokenizer.

Batches: a training example is `bos` followed by a random window of the token stream, the target
is the same window shifted by one: x = [bos, t1 .. t_{L-1}], y = [t1 .. t_L] for seq_len L. So every
sequence starts with <bos> (where the paper's attention sinks sit) and every position has a target.
Evaluation uses fixed, non-overlapping windows instead, so every validation token is scored once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import socket
import sys
import sysconfig
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS = "<bos>"
from .resources import DATA_DIR  # noqa: E402  (data/ of a checkout, or minigate/_data/ when installed)

DEFAULT_TOKENIZER = DATA_DIR / "tokenizer.json"
STDLIB_MAX_BYTES = 6_000_000  # default cap of the python-stdlib corpus (the full 3.11 stdlib is ~10 MB)
CODE_MAX_BYTES = 150_000_000  # default cap of python-code (the `code` preset reads it once); a smaller one for a
#                               quick try or a test: the environment variable MINIGATE_CODE_MAX_BYTES
HUB = {"wikitext-2": ("Salesforce/wikitext", "wikitext-2-raw-v1"),  # (repo, config) for datasets.load_dataset
       "wikitext-103": ("Salesforce/wikitext", "wikitext-103-raw-v1"),
       "tinystories": ("roneneldan/TinyStories", None)}
LOCAL = {"wikitext-2": "wikitext-2-raw/wiki.{split}.raw",  # file names inside MINIGATE_DATA_DIR
         "wikitext-103": "wikitext-103-raw/wiki.{split}.raw",
         "tinystories": "tinystories/TinyStories-{split}.txt"}
LOCAL_SPLIT = {"train": "train", "validation": "valid", "test": "test"}  # Hub split -> local file name


class DataUnavailableError(RuntimeError):
    """The text is neither in MINIGATE_DATA_DIR nor reachable on the Hub."""


# -- raw text ------------------------------------------------------------------------------------------
def _say(msg: str):
    print(f"[minigate.data] {msg}", flush=True)


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
    local = os.environ.get("MINIGATE_DATA_DIR")
    fix = (f"Either put a local copy in MINIGATE_DATA_DIR (now {local!r}; expected file "
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
    Reads MINIGATE_DATA_DIR's local copy if there is one, else the Hub; prints which."""
    if name == "python-stdlib":
        return "".join(stdlib_documents(split))
    if name not in HUB:
        raise ValueError(f"unknown dataset {name!r}; known: {sorted(HUB) + ['python-stdlib']}")
    if split not in LOCAL_SPLIT or (name == "tinystories" and split == "test"):
        raise ValueError(f"{name} has no split {split!r}; use 'train' or 'validation'"
                         + (" or 'test'" if name.startswith("wikitext") else ""))
    local_dir = os.environ.get("MINIGATE_DATA_DIR")
    path = Path(local_dir) / LOCAL[name].format(split=LOCAL_SPLIT[split]) if local_dir else None
    if path is not None and path.is_file():
        text = path.read_text(encoding="utf-8")
        if max_chars is not None:
            text = text[:max_chars]
        _say(f"{name} {split}: local copy {path}")
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


@functools.lru_cache(maxsize=1)
def _all_stdlib_files() -> tuple[tuple[Path, int], ...]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "encodings"}
    files = [p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts[:-1])]
    files.sort(key=lambda p: hashlib.sha1(p.relative_to(root).as_posix().encode()).hexdigest())
    return tuple((p, p.stat().st_size) for p in files)


def stdlib_files(max_bytes: int | None = STDLIB_MAX_BYTES) -> list[Path]:
    """The stdlib .py files of the python-stdlib corpus, in their fixed (hashed-path) order."""
    out, total = [], 0
    for p, size in _all_stdlib_files():
        if size == 0 or (max_bytes is not None and total + size > max_bytes):
            continue  # empty __init__.py files add nothing; a file that would overflow the cap is skipped
        out.append(p)
        total += size
    return out


def stdlib_info(max_bytes: int | None = STDLIB_MAX_BYTES) -> dict:
    """What python-stdlib contains here: Python version, folder, file count and bytes."""
    files = stdlib_files(max_bytes)
    return {"python": sys.version.split()[0], "stdlib": sysconfig.get_paths()["stdlib"],
            "files": len(files), "bytes": sum(p.stat().st_size for p in files), "max_bytes": max_bytes}


def stdlib_documents(split: str, max_bytes: int | None = STDLIB_MAX_BYTES) -> list[str]:
    """python-stdlib's train or validation files (90/10 by file), one document per file."""
    if split not in ("train", "validation"):
        raise ValueError(f"python-stdlib has splits 'train' and 'validation', not {split!r}")
    files = train_val_split(stdlib_files(max_bytes))[split == "validation"]
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


_SKIP_CODE = {"test", "tests", "testing", "idle_test", "__pycache__", "encodings"}


def _code_roots() -> list[Path]:
    """The standard library, then every site-packages folder of this Python (no duplicates)."""
    import site

    roots = [sysconfig.get_paths()["stdlib"], *site.getsitepackages(), site.getusersitepackages(),
             sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    out = []
    for r in roots:
        p = Path(r).resolve()
        if p.is_dir() and p not in out:
            out.append(p)
    return out


@functools.lru_cache(maxsize=1)
def _all_code_files() -> tuple[tuple[Path, str, int], ...]:
    """(path, label, size) of every .py file under the roots, test folders skipped, in hashed order of
    "<root kind>/<path relative to its root>" so the order is the same wherever Python is installed."""
    files = []
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    for root in _code_roots():
        kind = "stdlib" if root == stdlib else "site-packages"
        for p in root.rglob("*.py"):
            rel = p.relative_to(root)
            parts = set(rel.parts[:-1])
            if parts & _SKIP_CODE or (kind == "stdlib" and parts & {"site-packages", "dist-packages"}):
                continue
            if any(r != root and r.is_relative_to(root) and p.is_relative_to(r) for r in _code_roots()):
                continue  # site-packages inside the stdlib folder: counted under its own root
            files.append((p, f"{kind}/{rel.as_posix()}"))
    files.sort(key=lambda f: hashlib.sha1(f[1].encode()).hexdigest())
    return tuple((p, label, p.stat().st_size) for p, label in files)


def code_max_bytes() -> int:
    return int(os.environ.get("MINIGATE_CODE_MAX_BYTES") or CODE_MAX_BYTES)


def code_files(max_bytes: int | None = None) -> list[Path]:
    """The .py files of the python-code corpus, in their fixed (hashed-path) order, up to max_bytes
    (None: code_max_bytes(), i.e. CODE_MAX_BYTES unless MINIGATE_CODE_MAX_BYTES says otherwise)."""
    max_bytes = max_bytes or code_max_bytes()
    out, total = [], 0
    for p, _, size in _all_code_files():
        if size == 0 or (max_bytes is not None and total + size > max_bytes):
            continue
        out.append(p)
        total += size
    return out


def code_documents(split: str, max_bytes: int | None = None) -> list[str]:
    """python-code's train or validation files (90/10 by file), one document per file."""
    if split not in ("train", "validation"):
        raise ValueError(f"python-code has splits 'train' and 'validation', not {split!r}")
    files = train_val_split(code_files(max_bytes))[split == "validation"]
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


def python_code_info(max_bytes: int | None = None) -> dict:
    """What python-code holds on this machine: Python version, files, bytes, and a SHA-256 of the contents."""
    return _code_info(max_bytes or code_max_bytes())


@functools.lru_cache(maxsize=4)
def _code_info(max_bytes: int) -> dict:
    files, h, total = code_files(max_bytes), hashlib.sha256(), 0
    for p in files:
        b = p.read_bytes()
        h.update(hashlib.sha256(b).digest())
        total += len(b)
    return {"python": sys.version.split()[0], "roots": [str(r) for r in _code_roots()], "files": len(files),
            "bytes": total, "max_bytes": max_bytes, "sha256": h.hexdigest()}


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
    if name == "python-code":
        info = python_code_info()
        _say(f"python-code: {info['files']} files, {info['bytes']:,} bytes, Python {info['python']}")
        return code_documents("train"), code_documents("validation")
    if name == "tinystories":
        def stories(split):
            text = load_text("tinystories", split, max_chars)
            return [d.strip() + "\n" for d in text.split("<|endoftext|>") if d.strip()]

        return stories("train"), stories("validation")
    if name == "python-stdlib":
        info = stdlib_info()
        _say(f"python-stdlib: {info['files']} files, {info['bytes']:,} bytes, Python {info['python']}")
        return stdlib_documents("train"), stdlib_documents("validation")
    raise ValueError(f"unknown corpus {name!r}; known: wikitext-2, wikitext-2-full, wikitext-103, tinystories, "
                     "python-stdlib, python-code, or several joined with '+'")


# -- tokenizer -----------------------------------------------------------------------------------------
def train_tokenizer(texts, vocab_size: int = 4096) -> Tokenizer:
    """Train a byte-level BPE (GPT-2 style: any byte sequence encodes, no unknown token) with <bos>
    as id 0. `texts`: a string or a list of strings (documents). Deterministic for the same input."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not any(t.strip() for t in texts):
        raise ValueError("cannot train a tokenizer on empty text")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def build_tokenizer(path: str | Path = DEFAULT_TOKENIZER, vocab_size: int = 4096) -> Tokenizer:
    """Rebuild the shipped tokenizer: trained on the training documents of python-stdlib+wikitext-2."""
    train_docs, _ = load_documents("python-stdlib+wikitext-2")
    tok = train_tokenizer(train_docs, vocab_size)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    _say(f"tokenizer: vocab {tok.get_vocab_size()}, Python {sys.version.split()[0]} stdlib, saved to {path}")
    return tok


def load_tokenizer(path: str | Path = DEFAULT_TOKENIZER) -> Tokenizer:
    """Load a tokenizer.json (default: the one the shipped checkpoints use)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer at {path}; build one with "
                                "`python -m minigate.data build-tokenizer`")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception with a serde message
        raise ValueError(f"{path} is not a valid tokenizer.json ({str(e).splitlines()[0] if str(e) else e!r}); "
                         "pass the tokenizer.json a model was trained with (e.g. data/tokenizer.json)") from None


class TextTokenizer:
    """The thin common face of a minigate tokenizer and a transformers one: encode, decode, bos_id."""

    def __init__(self, tok):
        self.tok = tok
        self.is_hf = not isinstance(tok, Tokenizer)
        self.bos_id = tok.bos_token_id if self.is_hf else tok.token_to_id(BOS)
        self.vocab_size = len(tok) if self.is_hf else tok.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False) if self.is_hf else self.tok.encode(text).ids

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids))


def _written_by_minigate(folder: Path) -> bool:
    """A model folder minigate saved (its config.json has the "minigate" keys), or a bare tokenizer.json."""
    if not (folder / "tokenizer_config.json").exists():
        return True
    try:
        return "minigate" in json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return False


def get_tokenizer(name_or_path: str | Path | None = None) -> TextTokenizer:
    """None or a tokenizer.json path: a minigate tokenizer; anything else (a Hub id or a model
    folder, e.g. one of the paper's 1B checkpoints): `transformers.AutoTokenizer`."""
    if name_or_path is None or str(name_or_path).endswith(".json"):
        return TextTokenizer(load_tokenizer(name_or_path or DEFAULT_TOKENIZER))
    folder = Path(name_or_path)
    if (folder / "tokenizer.json").is_file() and _written_by_minigate(folder):
        return TextTokenizer(load_tokenizer(folder / "tokenizer.json"))  # a minigate model folder
    from transformers import AutoTokenizer

    return TextTokenizer(AutoTokenizer.from_pretrained(name_or_path))


def encode(docs, tokenizer: "Tokenizer | TextTokenizer") -> torch.Tensor:
    """Token ids of the documents, concatenated into one int64 tensor (no separators). The tokenizer is a
    `tokenizers.Tokenizer` or a TextTokenizer (get_tokenizer(): minigate's or a transformers one)."""
    docs = [docs] if isinstance(docs, str) else list(docs)
    if isinstance(tokenizer, TextTokenizer):
        if tokenizer.is_hf:
            rows = tokenizer.tok(docs, add_special_tokens=False)["input_ids"]
            return torch.tensor([i for row in rows for i in row], dtype=torch.long)
        tokenizer = tokenizer.tok
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"encode needs a tokenizer from minigate.data.get_tokenizer() or load_tokenizer(), "
                        f"got {type(tokenizer).__name__}")
    ids = [i for enc in tokenizer.encode_batch(docs) for i in enc.ids]
    return torch.tensor(ids, dtype=torch.long)


def _cache_dir() -> Path:
    return Path(os.environ.get("MINIGATE_CACHE_DIR") or Path.home() / ".cache" / "minigate") / "tokens"


def encode_cached(docs: list[str], tokenizer: Tokenizer, batch: int = 256, desc: str = "tokenize",
                  cache: bool = True) -> torch.Tensor:
    """encode(), batched with a progress bar, and cached on disk keyed by the documents and the tokenizer.
    Returns int32 ids (1-d); on disk uint16 when the vocabulary fits."""
    h = hashlib.sha256(tokenizer.to_str().encode())
    for d in docs:
        h.update(hashlib.sha256(d.encode("utf-8", "surrogatepass")).digest())
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 2**16 else np.int32
    path = _cache_dir() / f"{h.hexdigest()[:32]}.{np.dtype(dtype).name}"
    if cache and path.is_file():
        return torch.from_numpy(np.fromfile(path, dtype=dtype).astype(np.int32))
    from tqdm.auto import tqdm

    parts = []
    with tqdm(total=sum(map(len, docs)), unit="B", unit_scale=True, desc=desc, leave=False,
              disable=len(docs) < 2 * batch) as bar:
        for i in range(0, len(docs), batch):
            chunk = docs[i: i + batch]
            parts.extend(np.asarray(e.ids, dtype=dtype) for e in tokenizer.encode_batch(chunk))
            bar.update(sum(map(len, chunk)))
    ids = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    if cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            ids.tofile(tmp)
            os.replace(tmp, path)
        except OSError as e:  # a read-only home: tokenize every time, say so once
            _say(f"token cache not written ({e.strerror or e}); set MINIGATE_CACHE_DIR to a writable folder")
    return torch.from_numpy(ids.astype(np.int32))


def encode_corpus(name: str, tokenizer: Tokenizer) -> tuple[torch.Tensor, torch.Tensor]:
    """(train ids, validation ids) of a corpus, tokenized once and then read from the token cache."""
    train_docs, val_docs = load_documents(name)
    return (encode_cached(train_docs, tokenizer, desc=f"tokenize {name} train"),
            encode_cached(val_docs, tokenizer, desc=f"tokenize {name} validation"))


# -- batches -------------------------------------------------------------------------------------------
def check_length(tokens: torch.Tensor, seq_len: int, what: str):
    if seq_len < 2:
        raise ValueError(f"seq_len={seq_len}: a sequence needs <bos> and at least one text token")
    if tokens.numel() == 0:
        raise ValueError(f"the {what} corpus is empty (0 tokens); check the corpus name and its source")
    if tokens.dim() == 2:  # a task's ready-made rows (see copy_task)
        if tokens.shape[1] != seq_len + 1:
            raise ValueError(f"the {what} rows have {tokens.shape[1]} tokens, but seq_len={seq_len} needs "
                             f"rows of seq_len + 1 = {seq_len + 1} (input and shifted target)")
        return
    if tokens.dim() != 1:
        raise ValueError(f"{what} tokens must be one 1-d tensor of ids (a token stream) or a 2-d tensor of "
                         f"rows (batch, seq_len + 1), got shape {tuple(tokens.shape)}")
    if tokens.numel() < seq_len:
        raise ValueError(f"the {what} corpus has {tokens.numel()} tokens, but one sequence of "
                         f"seq_len={seq_len} needs {seq_len}; use a larger corpus or a smaller seq_len")


def sample_batch(tokens: torch.Tensor, batch_size: int, seq_len: int, bos_id: int,
                 generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random training windows: x = [bos, window[:-1]], y = window, both (batch, seq_len).
    The same generator state gives the same batch. Rows of a task (2-d, see copy_task): x = row[:-1],
    y = row[1:] for random rows."""
    check_length(tokens, seq_len, "training")
    if tokens.dim() == 2:
        rows = tokens[torch.randint(0, tokens.shape[0], (batch_size,), generator=generator)]
        return rows[:, :-1], rows[:, 1:]
    starts = torch.randint(0, tokens.numel() - seq_len + 1, (batch_size,), generator=generator)
    y = torch.stack([tokens[s: s + seq_len] for s in starts.tolist()]).long()
    x = torch.cat([torch.full((batch_size, 1), bos_id, dtype=torch.long), y[:, :-1]], dim=1)
    return x, y


def eval_batches(tokens: torch.Tensor, batch_size: int, seq_len: int, bos_id: int,
                 max_batches: int | None = None):
    """Fixed evaluation batches: the corpus cut into non-overlapping windows of seq_len tokens (the
    tail that does not fill a window is dropped), each as x = [bos, window[:-1]], y = window."""
    check_length(tokens, seq_len, "validation")
    if tokens.dim() == 2:  # a task's rows, in order
        for b, i in enumerate(range(0, tokens.shape[0], batch_size)):
            if max_batches is not None and b >= max_batches:
                break
            yield tokens[i: i + batch_size, :-1], tokens[i: i + batch_size, 1:]
        return
    n = tokens.numel() // seq_len
    windows = tokens[: n * seq_len].view(n, seq_len)
    for b, i in enumerate(range(0, n, batch_size)):
        if max_batches is not None and b >= max_batches:
            break
        y = windows[i: i + batch_size].long()
        yield torch.cat([torch.full((y.shape[0], 1), bos_id, dtype=torch.long), y[:, :-1]], dim=1), y


# -- the marked copy task --------------------------------------------------------------------------------
def copy_task(n: int, seq_len: int = 64, n_symbols: int = 64, seed: int = 0) -> torch.Tensor:
    """`n` rows of the marked copy task, (n, seq_len + 1): x = row[:-1], y = row[1:] (see sample_batch).

    A row is  <bos>, a_1 .. a_H, <sep>, a_1 + N, a_2 + N, ...  with H = seq_len // 2 random symbols
    a_i from 1..N (N = n_symbols), a separator 2N + 1, then the random part again, shifted into N+1..2N
    (cut to the row length).
    So the vocabulary has 2N + 2 ids (<bos> = 0). The first half is unpredictable; the second half is a
    pure copy, found by a head that looks back H + 1 positions. A token's own range tells a head whether
    there is anything to copy, so a head can learn to be *off* on the random part: there, an ungated
    model parks its attention on <bos> (an attention sink), and a gated one can close the gate instead.
    docs/experiments.md logs what it shows at 2 layers."""
    if n < 1 or seq_len < 4 or n_symbols < 1:
        raise ValueError(f"copy_task(n={n}, seq_len={seq_len}, n_symbols={n_symbols}): need n >= 1, "
                         "seq_len >= 4 and n_symbols >= 1")
    g = torch.Generator().manual_seed(seed)
    h = seq_len // 2
    a = torch.randint(1, n_symbols + 1, (n, h), generator=g)
    bos, sep = torch.zeros(n, 1, dtype=torch.long), torch.full((n, 1), 2 * n_symbols + 1)
    return torch.cat([bos, a, sep, a + n_symbols], dim=1)[:, : seq_len + 1]


INDUCTION_FIRST = 16  # induction_task's first-token ids, after the copy task's 2N + 2


def induction_task(n: int, seq_len: int = 64, n_symbols: int = 64, n_first: int = INDUCTION_FIRST, p: float = 0.05,
                   seed: int = 0) -> torch.Tensor:
    """`n` rows of the variable-length induction copy, (n, seq_len + 1): x = row[:-1], y = row[1:].

    A row is  f, a_1 .. a_L, <sep>, a_1 + N .. a_L + N, <sep>, a_1 + N, ...  (repeated to the row's end):
    f is one of `n_first` first-token ids 2N + 2 .. 2N + 1 + n_first (never copied, never predictable;
    n_first=0 puts <bos> = 0 there instead), L = 4 + a geometric number of symbols (success probability
    p, mean 4 + (1 - p) / p; at most seq_len - 8), the separator is 2N + 1. Vocabulary 2N + 2 + n_first.
    Unlike copy_task, the copy offset L + 1 changes from row to row, so it must be found by content (an
    induction head), not by a fixed relative position; and with no <bos>, position 0 carries no special
    token: a sink there must be found from position alone, as in the paper's packed pretraining data.
    A token's own range (a or b) still tells a head whether there is anything to copy."""
    if n < 1 or seq_len < 12 or n_symbols < 1 or n_first < 0 or not 0 < p <= 1:
        raise ValueError(f"induction_task(n={n}, seq_len={seq_len}, n_symbols={n_symbols}, n_first={n_first}, "
                         f"p={p}): need n >= 1, seq_len >= 12, n_symbols >= 1, n_first >= 0 and 0 < p <= 1")
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g).clamp_min(1e-12)
    geometric = (u.log() / math.log1p(-p)).floor().long() if p < 1 else torch.zeros(n, dtype=torch.long)
    L = (4 + geometric).clamp(max=seq_len - 8)  # (n,) random-part lengths
    a = torch.randint(1, n_symbols + 1, (n, seq_len), generator=g)  # (n, seq_len); a row uses its first L
    j = torch.arange(1, seq_len + 1)  # (seq_len,) positions after the first token
    k = (j - L[:, None] - 1) % (L[:, None] + 1)  # (n, seq_len) place in the repeated [sep, copy] cycle
    copied = a.gather(1, (k - 1).clamp(min=0)) + n_symbols  # (n, seq_len) b_k, used where k >= 1
    body = torch.where(k == 0, 2 * n_symbols + 1, copied)  # the copy part: sep, b_1..b_L, sep, ...
    body = torch.where(j <= L[:, None], a, body)  # the random part a_1..a_L first
    first = (torch.randint(2 * n_symbols + 2, 2 * n_symbols + 2 + n_first, (n, 1), generator=g) if n_first
             else torch.zeros(n, 1, dtype=torch.long))
    return torch.cat([first, body], dim=1)


TASKS = ("copy", "induction")  # synthetic tasks: ready-made rows instead of a token stream, no tokenizer


def task_rows(task: str, n: int, seq_len: int, vocab_size: int, seed: int) -> torch.Tensor:
    """`n` rows of a synthetic task for a model with `vocab_size` ids (the vocabulary fixes n_symbols)."""
    if task == "copy":
        return copy_task(n, seq_len, (vocab_size - 2) // 2, seed=seed)
    if task == "induction":
        return induction_task(n, seq_len, (vocab_size - 2 - INDUCTION_FIRST) // 2, seed=seed)
    raise ValueError(f"unknown task {task!r}; the tasks are {TASKS}")


class CopyTokenizer:
    """Text face of the copy tasks' ids, so widgets and prompts work on copy models: symbol i of the random
    part is "a{i}", its copy is "b{i}", the separator "|", <bos> is id 0, and induction_task's first
    tokens are "f1".."f{n_first}". Same methods as TextTokenizer.

        tok = CopyTokenizer(); tok.encode("a3 a17 | b3") -> [3, 17, 129, 67]
        CopyTokenizer(n_first=16).encode("f2 a3 a17 | b3") -> [131, 3, 17, 129, 67]"""

    def __init__(self, n_symbols: int = 64, n_first: int = 0):
        self.n, self.bos_id, self.vocab_size = n_symbols, 0, 2 * n_symbols + 2 + n_first
        self.words = [BOS] + [f"a{i}" for i in range(1, self.n + 1)] + [f"b{i}" for i in range(1, self.n + 1)] + ["|"]
        self.words += [f"f{i}" for i in range(1, n_first + 1)]
        self.ids = {w: i for i, w in enumerate(self.words)}

    def encode(self, text: str) -> list[int]:
        unknown = [w for w in text.split() if w not in self.ids]
        if unknown:
            n_first = len(self.words) - 2 * self.n - 2
            firsts = f", first tokens f1..f{n_first}" if n_first else ""
            raise ValueError(f"the copy task has no token {unknown[0]!r}: write symbols a1..a{self.n}, their copies "
                             f"b1..b{self.n}{firsts} and the separator |, separated by spaces (e.g. 'a3 a17 | b3')")
        return [self.ids[w] for w in text.split()]

    def decode(self, ids) -> str:
        return " ".join(self.words[int(i)] for i in ids)


# -- prompt sets -------------------------------------------------------------------------------------------
PROMPT_DIR = DATA_DIR / "prompts"
PROMPT_TYPES = ("factual", "technical", "conversational", "repetitive", "code")


def load_prompts(type: str | None = None) -> dict[str, list[str]]:
    """The prompt sets written for this course (data/prompts/): {type: [prompt, ...]}, every type or one.
    Prose types are `<type>.txt`, one prompt per line; code is `code.json`, a list of (multi-line) snippets."""
    import json

    if type is not None and type not in PROMPT_TYPES:
        raise ValueError(f"unknown prompt type {type!r}; the types are {PROMPT_TYPES}")
    out = {}
    for kind in PROMPT_TYPES if type is None else (type,):
        txt, js = PROMPT_DIR / f"{kind}.txt", PROMPT_DIR / f"{kind}.json"
        if js.is_file():
            out[kind] = json.loads(js.read_text(encoding="utf-8"))
        else:
            out[kind] = [line.strip() for line in txt.read_text(encoding="utf-8").splitlines() if line.strip()]
    return out


def main(argv=None):
    import argparse

    p = argparse.ArgumentParser(prog="python -m minigate.data", description="minigate data utilities")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build-tokenizer",
                       help="retrain data/tokenizer.json (python-stdlib+wikitext-2, vocab 4096)")
    b.add_argument("--out", default=str(DEFAULT_TOKENIZER))
    b.add_argument("--vocab-size", type=int, default=4096)
    sub.add_parser("info", help="show what the python-stdlib corpus contains on this Python")
    args = p.parse_args(argv)
    if args.cmd == "build-tokenizer":
        build_tokenizer(args.out, args.vocab_size)
    else:
        print(stdlib_info())


if __name__ == "__main__":
    main()
