"""Data, one module per concern; every name is importable from `minigate.data` too.

    corpora.py       text corpora (WikiText, TinyStories from the Hub or a local copy; the Python corpora):
                     load_documents(name) -> (train documents, validation documents)
    code_wheels.py   python-code: the .py files of a pinned list of wheels (data/python-code.lock.json)
    python_files.py  the Python-files corpora of this Python, python-stdlib and python-site: one rule, two settings
    tokenizer.py     the byte-level BPE tokenizer, encode, and the on-disk token cache (encode_corpus)
    batches.py       batches that start with <bos>: sample_batch (training), eval_batches (evaluation)
    tasks.py         the synthetic copy and induction tasks, and their CopyTokenizer
    prompts.py       the course's prompt sets by input type

    python -m minigate.data build-tokenizer     # retrain data/tokenizer.json
    python -m minigate.data fetch-code          # fetch python-code's pinned wheels into the cache
"""

from .batches import check_length, eval_batches, sample_batch, with_bos
from .code_wheels import CorpusLockError, code_files, code_max_bytes, load_lock, python_code_info
from .corpora import (HUB, LOCAL, LOCAL_SPLIT, DataUnavailableError, articles, code_documents, load_documents,
                      load_text, site_documents, stdlib_documents, train_val_split)
from .prompts import PROMPT_DIR, PROMPT_TYPES, load_prompts
from .python_files import (SITE_MAX_BYTES, STDLIB_MAX_BYTES, python_site_info, site_files, stdlib_files,
                           stdlib_info)
from .tasks import INDUCTION_FIRST, TASKS, CopyTokenizer, copy_task, induction_task, task_rows
from .tokenizer import (BOS, DEFAULT_TOKENIZER, TextTokenizer, build_tokenizer, encode, encode_cached, encode_corpus,
                        get_tokenizer, load_tokenizer, train_tokenizer)

__all__ = ["BOS", "SITE_MAX_BYTES", "CorpusLockError", "load_lock", "python_site_info", "site_documents", "site_files",
           "DEFAULT_TOKENIZER", "HUB", "INDUCTION_FIRST", "LOCAL", "LOCAL_SPLIT", "PROMPT_DIR",
           "PROMPT_TYPES", "STDLIB_MAX_BYTES", "TASKS", "CopyTokenizer", "DataUnavailableError", "TextTokenizer",
           "articles", "build_tokenizer", "check_length", "code_documents", "code_files", "code_max_bytes", "copy_task",
           "encode", "encode_cached", "encode_corpus", "eval_batches", "get_tokenizer", "induction_task",
           "load_documents", "load_prompts", "load_text", "load_tokenizer", "python_code_info", "sample_batch",
           "stdlib_documents", "stdlib_files", "stdlib_info", "task_rows", "train_tokenizer", "train_val_split",
           "with_bos"]
