"""The python-code corpus, the token cache, and the `code` preset's plumbing (a CPU-sized run)."""

import json

import numpy as np
import pytest
import torch

import minigate
from minigate import data
from minigate.cli import main
from minigate.presets import PRESETS, TrainConfig, model_config

SMALL = 2_000_000  # bytes of python-code for the tests (the preset reads up to 150 MB)


def test_python_code_is_deterministic_capped_and_split_by_file():
    files = data.code_files(SMALL)
    assert files == data.code_files(SMALL) and len(files) > 20
    assert sum(p.stat().st_size for p in files) <= SMALL
    skipped = {"test", "tests", "testing", "__pycache__"}
    assert not any(skipped & set(p.parts) for p in files) and all(p.suffix == ".py" for p in files)
    roots = data.python_files.CODE.roots()
    assert any("site-packages" in str(r) for r in roots) and any("site-packages" not in str(r) for r in roots)
    train, val = data.train_val_split(files)
    assert not set(train) & set(val) and len(val) == len(files) // 10
    labels = [lab for _, lab, _ in data.python_files.CODE.all_files()]
    assert labels[:50] == sorted(labels[:50], key=lambda s: __import__("hashlib").sha1(s.encode()).hexdigest())
    info = data.python_code_info(SMALL)
    assert info["files"] == len(files) and info["bytes"] <= SMALL and len(info["sha256"]) == 64
    assert info["python"] == __import__("sys").version.split()[0]


def test_load_documents_python_code_honours_the_cap(monkeypatch):
    monkeypatch.setenv("MINIGATE_CODE_MAX_BYTES", str(SMALL))
    train, val = data.load_documents("python-code")
    assert len(train) + len(val) == len(data.code_files(SMALL))
    assert sum(len(d.encode()) for d in train + val) <= SMALL + 10_000  # decoding may replace a few bytes


def test_token_cache_matches_encode_and_is_keyed_by_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGATE_CACHE_DIR", str(tmp_path))
    tok = data.load_tokenizer()
    docs = data.code_documents("validation", SMALL)
    ids = data.encode_cached(docs, tok)
    assert ids.dtype == torch.int32 and torch.equal(ids.long(), data.encode(docs, tok))
    (cached,) = (tmp_path / "tokens").iterdir()
    assert cached.suffix == ".uint16" and cached.stat().st_size == 2 * ids.numel()
    assert np.array_equal(np.fromfile(cached, dtype=np.uint16), ids.numpy())

    def no_encoding(*a, **k):
        raise AssertionError("the cache should have been read")

    monkeypatch.setattr(type(tok), "encode_batch", no_encoding, raising=False)
    with pytest.raises(AssertionError):  # the patch bites on a miss...
        data.encode_cached(docs[:3], tok)
    assert torch.equal(data.encode_cached(docs, tok), ids)  # ...and a hit never encodes
    monkeypatch.undo()
    monkeypatch.setenv("MINIGATE_CACHE_DIR", str(tmp_path))
    other = data.train_tokenizer(docs[:20], vocab_size=300)
    data.encode_cached(docs, other)
    assert len(list((tmp_path / "tokens").iterdir())) == 2  # another tokenizer, another entry


def test_code_gpu_preset_is_the_measured_gpu_recipe():
    p = PRESETS["code-gpu"]
    assert p.corpus == "python-code" and p.probe == "wikitext-2"
    cfg = model_config("code-gpu", "headwise")
    sizes = (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_ff, cfg.max_seq_len)
    assert sizes == (6, 256, 8, 32, 768, 512)
    t = p.train
    assert (t.steps, t.batch_size, t.seq_len, t.lr, t.warmup_steps, t.weight_decay) == (3000, 32, 512, 3e-3, 300, 0.1)
    assert t.compile == "auto" and t.min_lr_ratio == 0.1
    assert 6.0e6 < minigate.Transformer(model_config("code-gpu")).num_params() < 6.5e6
    with pytest.raises(ValueError, match="compile"):
        TrainConfig(compile="sometimes")


def test_code_preset_is_the_measured_cpu_recipe():
    # docs/experiments.md section 13: the recipe of the shipped code-* checkpoints (pilot P4, carried on)
    p = PRESETS["code"]
    assert p.corpus == "python-code" and p.probe == "wikitext-2"
    cfg = model_config("code", "elementwise")
    sizes = (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.d_ff, cfg.max_seq_len)
    assert sizes == (4, 128, 4, 32, 384, 512)
    t = p.train
    assert (t.steps, t.batch_size, t.seq_len, t.lr, t.warmup_steps, t.weight_decay) == (4000, 8, 512, 3e-3, 100, 0.1)
    assert (t.schedule, t.decay_frac, t.min_lr_ratio) == ("wsd", 0.2, 0.1)  # constant lr to step 3200, then down
    assert t.compile is False and t.precision == "auto"  # bf16 on a CPU with native bf16, else fp32
    assert 1.3e6 < minigate.Transformer(model_config("code")).num_params() < 1.45e6


def test_code_gpu_preset_trains_a_cpu_sized_run_and_records_the_corpus(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINIGATE_CODE_MAX_BYTES", str(SMALL))
    out = tmp_path / "code"
    shrink = ["--set", "batch_size=2", "--set", "seq_len=64", "--set", "eval_batches=1", "--set", "eval_every=1"]
    assert main(["train", "--preset", "code-gpu", "--variant", "elementwise", "--out", str(out), "--steps", "2",
                 "--quiet", "--threads", "1", *shrink]) == 0
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["corpus"] == "python-code" and run_json["python_code"]["bytes"] <= SMALL
    assert run_json["python_code"]["sha256"] == data.python_code_info(SMALL)["sha256"]
    assert run_json["train"]["compile"] == "auto"  # compiled on CUDA only: this CPU run was eager
    history = json.loads((out / "history.json").read_text())
    assert [m["step"] for m in history["metrics"]] == [1, 2] and history["metrics"][-1]["m_act"] > 0
    assert minigate.from_pretrained(out / "model").cfg.gate_granularity == "elementwise"


def test_python_code_info_names_no_path_of_this_machine():
    info = data.python_code_info(SMALL)
    assert info["roots"][0] == "stdlib" and set(info["roots"][1:]) <= {"site-packages"}
    assert "/" not in json.dumps(info) and "\\\\" not in json.dumps(info)  # run.json travels with checkpoints
