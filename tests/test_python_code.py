"""The python-code corpus, the token cache, and the `code` preset's plumbing (a CPU-sized run)."""

import hashlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import minigate
from minigate import data
from minigate.cli import main
from minigate.presets import PRESETS, TrainConfig, model_config

SMALL = 2_000_000  # bytes of python-code for the tests (the preset reads up to 150 MB)
LOCK = Path(minigate.resources.DATA_DIR) / data.code_wheels.LOCK_FILE


def test_the_tests_read_one_wheel_of_the_pinned_list():
    # conftest.py points MINIGATE_CODE_LOCK at a one-wheel subset: the entry must be the lock's own, byte for byte
    real, small = data.load_lock(LOCK), data.load_lock()
    assert len(small.wheels) == 1 and small.wheels[0] in real.wheels and small.sha256 != real.sha256
    assert (small.max_bytes, small.per_wheel_max_bytes) == (real.max_bytes, real.per_wheel_max_bytes)


def test_the_lock_pins_permissive_pure_python_wheels_with_room_for_code_gpu():
    lock = data.load_lock(LOCK)
    assert len({w.name for w in lock.wheels}) == len(lock.wheels) >= 40
    assert all(w.file.endswith("-none-any.whl") and len(w.sha256) == 64 for w in lock.wheels)
    assert {w.kind for w in lock.wheels} == {"general", "numerical", "web", "tooling"}
    permissive = ("MIT", "BSD", "Apache", "PSF")
    assert all(any(p in w.license for p in permissive) and "GPL" not in w.license for w in lock.wheels), \
        [w.license for w in lock.wheels]
    assert lock.per_wheel_max_bytes <= 0.08 * lock.max_bytes  # no package dominates the mix
    # code-gpu reads 3000 x 32 x 512 = 49M tokens; the tokenizer takes about 3 bytes of Python per token
    t = PRESETS["code-gpu"].train
    assert lock.max_bytes >= 3 * t.steps * t.batch_size * t.seq_len
    readme = (LOCK.parent / "README.md").read_text()
    assert all(f"{w.name} {w.version}" in readme for w in lock.wheels)  # data/README.md lists each, with licence


def test_python_code_is_deterministic_capped_deduplicated_and_split_by_file():
    files = data.code_files(SMALL)
    assert files == data.code_files(SMALL) and len(files) > 20
    labels = [label for label, _ in files]
    assert all(label.startswith("werkzeug/") and label.endswith(".py") for label in labels)
    assert labels == sorted(labels, key=lambda s: hashlib.sha1(s.encode()).hexdigest())  # today's order rule
    skipped = {"test", "tests", "testing", "__pycache__"}
    assert not any(skipped & set(label.split("/")[:-1]) for label in labels)
    assert len({b for _, b in files}) == len(files) and all(files_b for _, files_b in files)  # no empty, no twins
    few = data.code_files(100_000)
    assert sum(len(b) for _, b in few) <= 100_000 and [lab for lab, _ in few] == [
        lab for lab in labels if lab in {x for x, _ in few}]  # a smaller cap keeps the same order
    train, val = data.train_val_split(files)
    assert not set(train) & set(val) and len(val) == len(files) // 10
    info = data.python_code_info(SMALL)
    assert info["files"] == len(files) and info["bytes"] == sum(len(b) for _, b in files) <= SMALL
    assert info["lock_sha256"] == data.load_lock().sha256 and len(info["sha256"]) == 64


@pytest.mark.slow
def test_python_code_does_not_depend_on_what_is_installed(tmp_path, monkeypatch):
    before = data.python_code_info(SMALL)
    extra = tmp_path / "site-packages" / "some_new_package"
    extra.mkdir(parents=True)
    (extra / "__init__.py").write_text("def installed():\n    return 'a package installed after the first run'\n")
    monkeypatch.setattr("site.getsitepackages", lambda: [str(tmp_path / "site-packages")])
    data.python_files.SITE.all_files.cache_clear()
    try:
        assert any("some_new_package" in str(p) for p in data.site_files(10**12))  # python-site reads it...
        assert data.python_code_info(SMALL) == before  # ...python-code does not
    finally:
        data.python_files.SITE.all_files.cache_clear()


def test_a_wheel_that_is_not_the_pinned_one_is_a_one_line_error_naming_it(tmp_path, monkeypatch):
    lock = data.load_lock()
    (wheel,) = lock.wheels
    (tmp_path / wheel.file).write_bytes(b"not the wheel")
    with pytest.raises(data.CorpusLockError, match=f"not the pinned {wheel.name}=={wheel.version}") as e:
        data.code_wheels.fetch(lock, tmp_path)
    assert "\n" not in str(e.value) and "delete it" in str(e.value)


def test_offline_with_an_empty_cache_the_error_says_what_to_fetch_and_how(tmp_path, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "no-wheels-here"))
    with pytest.raises(data.CorpusLockError) as e:
        data.code_wheels.fetch(data.load_lock(), tmp_path / "cache")
    said = str(e.value)
    assert "\n" not in said and "werkzeug-" in said and "PIP_FIND_LINKS" in said and "python-code.lock.json" in said


@pytest.mark.slow
def test_a_folder_of_the_wheels_stands_in_for_the_index(tmp_path, monkeypatch):
    # a learner behind a proxy: `python -m minigate.data fetch-code --dest DIR` where there is internet, then pip
    # reads DIR with no index
    lock = data.load_lock()
    folder = tmp_path / "wheels"
    data.code_wheels.fetch(lock, folder)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    (got,) = data.code_wheels.fetch(lock, tmp_path / "cache")
    assert got.read_bytes() == (folder / lock.wheels[0].file).read_bytes()


def test_load_documents_python_code_honours_the_cap(monkeypatch):
    monkeypatch.setenv("MINIGATE_CODE_MAX_BYTES", "200000")
    train, val = data.load_documents("python-code")
    assert len(train) + len(val) == len(data.code_files(200_000)) and val
    assert sum(len(d.encode()) for d in train + val) <= 200_000 + 10_000  # decoding may replace a few bytes


@pytest.mark.slow
def test_python_site_is_this_pythons_code_as_before():
    files = data.site_files(SMALL)
    assert files == data.site_files(SMALL) and len(files) > 20
    assert sum(p.stat().st_size for p in files) <= SMALL
    skipped = {"test", "tests", "testing", "__pycache__"}
    assert not any(skipped & set(p.parts) for p in files) and all(p.suffix == ".py" for p in files)
    roots = data.python_files.SITE.roots()
    assert any("site-packages" in str(r) for r in roots) and any("site-packages" not in str(r) for r in roots)
    labels = [lab for _, lab, _ in data.python_files.SITE.all_files()]
    assert labels[:50] == sorted(labels[:50], key=lambda s: hashlib.sha1(s.encode()).hexdigest())
    info = data.python_site_info(SMALL)
    assert info["files"] == len(files) and info["bytes"] <= SMALL and len(info["sha256"]) == 64
    assert info["python"] == sys.version.split()[0]
    train, val = data.load_documents("python-site")
    assert len(train) > len(val) > 0


@pytest.mark.slow
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


@pytest.mark.slow
def test_code_gpu_preset_trains_a_cpu_sized_run_and_records_the_corpus(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MINIGATE_CODE_MAX_BYTES", str(SMALL))
    out = tmp_path / "code"
    shrink = ["--set", "batch_size=2", "--set", "seq_len=64", "--set", "eval_batches=1", "--set", "eval_every=1"]
    assert main(["train", "--preset", "code-gpu", "--variant", "elementwise", "--out", str(out), "--steps", "2",
                 "--quiet", "--threads", "1", *shrink]) == 0
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["corpus"] == "python-code" and run_json["python_code"]["bytes"] <= SMALL
    assert run_json["python_code"] == data.python_code_info(SMALL)
    assert run_json["train"]["compile"] == "auto"  # compiled on CUDA only: this CPU run was eager
    history = json.loads((out / "history.json").read_text())
    assert [m["step"] for m in history["metrics"]] == [1, 2] and history["metrics"][-1]["m_act"] > 0
    assert minigate.from_pretrained(out / "model").cfg.gate_granularity == "elementwise"


def test_python_code_info_names_no_path_of_this_machine():
    info = data.python_code_info(SMALL)
    assert set(info) == {"lock_sha256", "wheels", "files", "bytes", "max_bytes", "sha256"}
    assert "/" not in json.dumps(info) and "\\\\" not in json.dumps(info)  # run.json travels with checkpoints
