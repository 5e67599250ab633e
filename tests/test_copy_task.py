"""The marked copy task (the course's sink demonstration): data, training on rows, the CLI preset, shipped models."""

import json

import pytest
import torch

import minigate
from minigate import data
from minigate.analysis import attention_sink
from minigate.cli import main
from minigate.evaluation import evaluate
from minigate.presets import TrainConfig
from minigate.train import train
from minigate.course import release


def test_rows_are_bos_random_half_separator_then_the_copy():
    rows = data.copy_task(50, seq_len=16, n_symbols=10, seed=4)
    assert rows.shape == (50, 17)
    h = 8  # seq_len // 2 random symbols
    assert (rows[:, 0] == 0).all() and (rows[:, h + 1] == 21).all()  # <bos>, separator 2N + 1
    a = rows[:, 1: h + 1]
    assert a.min() >= 1 and a.max() <= 10
    assert torch.equal(rows[:, h + 2:], a[:, : 17 - h - 2] + 10)  # the copy, shifted into N+1..2N
    assert torch.equal(rows, data.copy_task(50, seq_len=16, n_symbols=10, seed=4))
    assert not torch.equal(rows, data.copy_task(50, seq_len=16, n_symbols=10, seed=5))
    with pytest.raises(ValueError, match="seq_len >= 4"):
        data.copy_task(3, seq_len=2)


def test_row_batches_shift_by_one_and_eval_visits_every_row_once():
    rows = data.copy_task(10, seq_len=8, n_symbols=5)
    x, y = data.sample_batch(rows, 4, 8, 0, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 8) and (x[:, 0] == 0).all() and torch.equal(x[:, 1:], y[:, :-1])
    batches = list(data.eval_batches(rows, 4, 8, 0))
    assert [b[0].shape[0] for b in batches] == [4, 4, 2]
    assert torch.equal(torch.cat([b[0] for b in batches]), rows[:, :-1])
    with pytest.raises(ValueError, match="rows have 9 tokens, but seq_len=7 needs rows of seq_len \\+ 1 = 8"):
        data.sample_batch(rows, 4, 7, 0, torch.Generator())


def test_copy_tokenizer_round_trips_and_names_the_fix():
    tok = data.CopyTokenizer()
    row = data.copy_task(1, seq_len=12)[0].tolist()
    assert tok.encode(tok.decode(row)) == row and tok.vocab_size == 130
    assert tok.encode("a3 a17 | b3") == [3, 17, 129, 67]
    with pytest.raises(ValueError, match="no token 'c3'.*a1..a64"):
        tok.encode("a1 c3")


def test_induction_rows_repeat_a_random_part_of_varying_length_after_a_random_first_token():
    N, T = 10, 40
    rows = data.induction_task(200, seq_len=T, n_symbols=N, n_first=4, p=0.2, seed=4)
    assert rows.shape == (200, T + 1)
    assert rows[:, 0].min() >= 2 * N + 2 and rows[:, 0].max() <= 2 * N + 5  # one of the 4 first-token ids
    assert len(rows[:, 0].unique()) == 4
    lengths = []
    for row in rows.tolist():
        L = row.index(2 * N + 1) - 1  # the first separator ends the random part
        a = row[1: L + 1]
        assert 4 <= L <= T - 8 and all(1 <= s <= N for s in a)
        cycle = [2 * N + 1] + [s + N for s in a]  # sep, b_1..b_L, again and again
        assert row[L + 1:] == (cycle * T)[: T - L], row
        lengths.append(L)
    assert len(set(lengths)) > 5, "the copy offset must change from row to row"
    assert abs(sum(lengths) / len(lengths) - (4 + 0.8 / 0.2)) < 1.0  # 4 + a geometric number, mean 4 + (1-p)/p
    assert torch.equal(rows, data.induction_task(200, seq_len=T, n_symbols=N, n_first=4, p=0.2, seed=4))
    assert not torch.equal(rows, data.induction_task(200, seq_len=T, n_symbols=N, n_first=4, p=0.2, seed=5))
    assert (data.induction_task(5, seq_len=T, n_symbols=N, n_first=0)[:, 0] == 0).all()  # n_first=0: <bos>
    with pytest.raises(ValueError, match="seq_len >= 12"):
        data.induction_task(3, seq_len=8)
    assert torch.equal(data.task_rows("induction", 7, 64, 146, seed=1), data.induction_task(7, 64, 64, seed=1))
    with pytest.raises(ValueError, match="unknown task 'cpy'; the tasks are"):
        data.task_rows("cpy", 7, 64, 130, seed=1)


def test_copy_tokenizer_names_the_induction_first_tokens():
    tok = data.CopyTokenizer(n_first=16)
    row = data.induction_task(1)[0].tolist()
    assert tok.vocab_size == 146 and tok.encode(tok.decode(row)) == row
    assert tok.decode(row).startswith("f") and tok.encode("f2 a3 a17 | b3") == [131, 3, 17, 129, 67]
    with pytest.raises(ValueError, match="first tokens f1..f16"):
        tok.encode("f17")


@pytest.mark.slow
def test_a_small_model_learns_the_copy_half():
    torch.manual_seed(0)
    cfg = minigate.ModelConfig(vocab_size=22, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, head_dim=16, d_ff=64,
                               max_seq_len=16)
    model = minigate.Transformer(cfg)
    rows = data.copy_task(2000, seq_len=16, n_symbols=10, seed=1)
    val = data.copy_task(64, seq_len=16, n_symbols=10, seed=2)
    before = evaluate(model, val, 16)
    train(model, rows, val, TrainConfig(steps=300, batch_size=32, seq_len=16, lr=1e-2, warmup_steps=20,  # in bf16
                                         eval_every=300, precision="fp32"), progress=False)  # it does not, here
    with torch.no_grad():
        pred = model(val[:, :-1]).argmax(-1)
    copy_acc = (pred == val[:, 1:])[:, 9:].float().mean().item()  # targets after the separator
    assert before > 3.0 and copy_acc > 0.9, (before, copy_acc)


@pytest.mark.slow
def test_cli_copy_preset_writes_a_model_without_tokenizer(tmp_path, capsys):
    out = tmp_path / "copy"
    assert main(["train", "--preset", "copy", "--variant", "headwise", "--out", str(out), "--steps", "3", "--quiet",
                 "--threads", "1"]) == 0
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["corpus"] == "copy" and run_json["model"]["vocab_size"] == 130
    assert not (out / "model" / "tokenizer.json").exists()
    assert main(["eval", str(out)]) == 0
    assert "copy held-out split, 32,768 tokens" in capsys.readouterr().out


@pytest.mark.slow
def test_cli_induction_preset_trains_on_rows_with_a_random_first_token(tmp_path, capsys):
    out = tmp_path / "induction"
    assert main(["train", "--preset", "induction", "--variant", "elementwise", "--out", str(out), "--steps", "3",
                 "--quiet", "--threads", "1"]) == 0
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["corpus"] == "induction" and run_json["model"]["vocab_size"] == 146
    assert run_json["tokenizer"] is None and run_json["variant"] == "elementwise"
    assert json.loads((out / "history.json").read_text())["step"][-1] == 3
    assert main(["eval", str(out)]) == 0
    assert "induction held-out split, 32,768 tokens" in capsys.readouterr().out


def test_shipped_copy_models_load_and_the_baseline_has_a_sink_head():
    names = release.shipped_names()
    assert {"copy-baseline"} <= set(names)
    model = release.shipped("copy-baseline")
    assert not model.training and model.cfg.gate == "none"
    stats = attention_sink(model, data.copy_task(64, seed=3)[:, :-1])
    assert stats.n_sink_heads >= 1 and stats.share.max() > 0.3
    run_json = release.shipped_run("copy-baseline")
    assert run_json["preset"] == "copy" and run_json["history"]["step"][-1] == run_json["train"]["steps"]
    with pytest.raises(FileNotFoundError, match="available: \\["):
        release.shipped("no-such-model")
