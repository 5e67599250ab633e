"""The tokenizer and the token cache.

The tokenizer (`data/tokenizer.json`, used by the shipped checkpoints): byte-level BPE, vocab 4096,
`<bos>` = id 0, trained by `build_tokenizer()` (or `python -m minigate.data build-tokenizer`) on the
training documents of "python-stdlib+wikitext-2" with the default cap, under Python 3.11.7.
Training is deterministic; another Python version gives a slightly different stdlib and tokenizer.

Token cache: `encode_corpus(name, tokenizer)` tokenizes a corpus once (batched, with a progress bar) and
keeps the ids in `MINIGATE_CACHE_DIR` (default ~/.cache/minigate/tokens) as uint16 (int32 past 65,536
tokens), keyed by a hash of the documents and of the tokenizer; the next run reads them in a second.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from ..resources import DATA_DIR  # data/ of a checkout, or minigate/_data/ when installed
from .corpora import _say, load_documents

BOS = "<bos>"  # the token that starts every sequence, id 0 in minigate's tokenizer
DEFAULT_TOKENIZER = DATA_DIR / "tokenizer.json"


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
