"""Data: corpora and the held-out split, the tokenizer, batches that start with <bos>, clear errors."""

import os
import subprocess
import sys
import time

import pytest
import torch

from minigate import data

TEXT = """ = Alpha =
 Alpha is a letter .
 = = History = =
 It came first .
 = Beta =
 Beta follows alpha .
"""


def test_articles_split_at_top_level_headings_only():
    arts = data.articles(TEXT)
    assert [a.splitlines()[0] for a in arts] == [" = Alpha =", " = Beta ="]
    assert "History" in arts[0] and "".join(arts) == TEXT


def test_train_val_split_is_every_tenth_document():
    train, val = data.train_val_split(list(range(25)))
    assert val == [9, 19] and train == [i for i in range(25) if i not in (9, 19)]


def test_wikitext_held_out_split_shares_no_article_with_training(capsys):
    train, val = data.load_documents("wikitext-2")
    said = capsys.readouterr().out
    assert "local copy $MINIGATE_CORPORA_DIR/wikitext-2-raw/" in said  # it says which source it read,
    assert os.environ["MINIGATE_CORPORA_DIR"] not in said  # with no path of this machine
    assert (len(train), len(val)) == (56, 6)
    titles = lambda docs: [d.splitlines()[0] for d in docs]
    assert len(set(titles(train) + titles(val))) == 62  # every article in exactly one part
    assert not set(titles(train)) & set(titles(val))
    assert all(data.corpora._HEADING.fullmatch(t.strip()) for t in titles(train + val))
    # no validation paragraph appears in the training text
    train_lines = {line for d in train for line in d.splitlines()[1:] if len(line) > 80}
    assert not any(line in train_lines for d in val for line in d.splitlines()[1:] if len(line) > 80)
    assert data.load_documents("wikitext-2") == (train, val)  # deterministic


def test_python_stdlib_corpus_split_by_file_and_capped():
    files = data.stdlib_files(max_bytes=300_000)
    assert files == data.stdlib_files(max_bytes=300_000)
    assert 0 < sum(p.stat().st_size for p in files) <= 300_000
    assert not any({"test", "tests", "site-packages"} & set(p.parts) for p in files)
    train, val = data.stdlib_documents("train", 300_000), data.stdlib_documents("validation", 300_000)
    assert len(val) == len(files) // 10 and len(train) + len(val) == len(files)
    assert not set(train) & set(val)
    assert data.stdlib_info(300_000)["python"] == sys.version.split()[0]


def test_tokenizer_training_is_deterministic_with_bos_first():
    docs = data.load_documents("wikitext-2")[0][:5]
    a, b = data.train_tokenizer(docs, 400), data.train_tokenizer(docs, 400)
    assert a.to_str() == b.to_str()
    assert a.token_to_id("<bos>") == 0 and a.get_vocab_size() == 400
    text = "Gated attention ☃ naïve\n\tdef f(x): return x"  # byte-level: anything round-trips
    assert a.decode(a.encode(text).ids) == text
    with pytest.raises(ValueError, match="empty"):
        data.train_tokenizer(["", "  "], 400)


def test_shipped_tokenizer():
    tok = data.get_tokenizer()
    assert tok.bos_id == 0 and tok.vocab_size == 4096
    code = "def f(x):\n    return x ** 2  # square\n"
    assert tok.decode(tok.encode(code)) == code
    assert len(tok.encode(code)) < len(code) / 2  # it learned Python, not just bytes


def test_encode_takes_any_tokenizer_the_package_hands_out():
    from transformers import PreTrainedTokenizerFast

    docs = ["def f(x):\n    return x", "The gate closes. "]
    tok = data.get_tokenizer()
    expected = tok.encode(docs[0]) + tok.encode(docs[1])
    hf = data.TextTokenizer(PreTrainedTokenizerFast(tokenizer_object=tok.tok))  # as a 1B model's tokenizer is
    for t in (tok.tok, tok, hf):
        assert data.encode(docs, t).tolist() == expected
    assert data.encode(docs[1], tok).tolist() == tok.encode(docs[1])
    with pytest.raises(TypeError, match="get_tokenizer"):
        data.encode(docs, "gpt2")


def _text_ids(n=1000):
    return torch.arange(n) % 97 + 1  # no 0: the bos id never occurs in the text


def test_training_batches_are_seeded_windows_after_bos():
    tokens = _text_ids()
    g = lambda seed: torch.Generator().manual_seed(seed)
    x1, y1 = data.sample_batch(tokens, 8, 16, 0, g(1))
    x2, y2 = data.sample_batch(tokens, 8, 16, 0, g(1))
    x3, _ = data.sample_batch(tokens, 8, 16, 0, g(2))
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and not torch.equal(x1, x3)
    assert x1.shape == y1.shape == (8, 16)
    assert (x1[:, 0] == 0).all() and (x1[:, 1:] != 0).all()
    assert torch.equal(x1[:, 1:], y1[:, :-1])  # targets are the inputs shifted by one
    for row in y1:  # each target row is a contiguous window of the corpus (which counts 1..97, 1..97, ...)
        assert torch.equal(row, (row[0] - 1 + torch.arange(16)) % 97 + 1)


def test_eval_batches_are_fixed_non_overlapping_windows():
    tokens = _text_ids(100)
    batches = list(data.eval_batches(tokens, 4, 16, 0))
    ys = torch.cat([y for _, y in batches])
    assert ys.shape == (6, 16) and torch.equal(ys.flatten(), tokens[:96])  # 6 windows, tail of 4 dropped
    assert all((x[:, 0] == 0).all() and torch.equal(x[:, 1:], y[:, :-1]) for x, y in batches)
    assert len(list(data.eval_batches(tokens, 4, 16, 0, max_batches=1))) == 1


def test_empty_or_too_short_corpus_errors():
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="empty"):
        data.sample_batch(torch.tensor([], dtype=torch.long), 2, 16, 0, g)
    with pytest.raises(ValueError, match=r"has 10 tokens.*seq_len=16 needs 16"):
        data.sample_batch(_text_ids(10), 2, 16, 0, g)
    with pytest.raises(ValueError, match=r"validation corpus has 5 tokens"):
        next(data.eval_batches(_text_ids(5), 2, 16, 0))


@pytest.mark.slow
def test_missing_local_copy_offline_fails_fast_naming_both_fixes(tmp_path):
    env = dict(os.environ, MINIGATE_CORPORA_DIR=str(tmp_path / "nowhere"), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    code = "from minigate import data; data.load_documents('wikitext-2')"
    t0 = time.time()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert time.time() - t0 < 30
    assert r.returncode != 0 and "DataUnavailableError" in r.stderr
    assert "MINIGATE_CORPORA_DIR" in r.stderr and "wiki.test.raw" in r.stderr and "internet" in r.stderr


def test_the_old_name_of_the_local_copies_folder_is_refused_in_one_line_naming_the_new(monkeypatch, capsys):
    folder = os.environ["MINIGATE_CORPORA_DIR"]
    monkeypatch.delenv("MINIGATE_CORPORA_DIR")
    monkeypatch.setenv("MINIGATE_DATA_DIR", folder)
    with pytest.raises(ValueError, match="MINIGATE_DATA_DIR is now spelled MINIGATE_CORPORA_DIR: set") as e:
        data.load_text("wikitext-2", "test")
    assert "\n" not in str(e.value) and folder in str(e.value)
    assert "local copy" not in capsys.readouterr().out  # nothing was read under the old name


def test_unreachable_hub_fails_without_retrying(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGATE_CORPORA_DIR", str(tmp_path))
    for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(data.corpora, "_hub_reachable", lambda timeout=3.0: False)
    with pytest.raises(data.DataUnavailableError, match="unreachable.*MINIGATE_CORPORA_DIR"):
        data.load_text("wikitext-2", "validation")
    with pytest.raises(ValueError, match="unknown corpus"):
        data.load_documents("wikitext-3")
