"""The `minigate` command: train writes a model that from_pretrained opens, eval, resume, Ctrl-C."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

import minigate
from minigate import data
from minigate.checkpoint import ckpt_step
from minigate.cli import main
from minigate.evaluation import evaluate



@pytest.mark.slow
def test_trained_model_reloads_with_the_same_validation_loss(tmp_path, capsys, ci_args):
    out = tmp_path / "run"
    assert main(["train", *ci_args, "--out", str(out), "--steps", "4"]) == 0
    files = {p.name for p in (out / "model").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "run.json"} <= files
    history = json.loads((out / "history.json").read_text())
    run_json = json.loads((out / "run.json").read_text())
    assert history["step"] == [1, 2, 3, 4] and run_json["corpus"] == "wikitext-2" and run_json["train"]["steps"] == 4
    assert run_json["tokenizer"] in ("data/tokenizer.json", "_data/tokenizer.json")  # no path of this machine
    assert run_json["variant"] == "headwise" and "gate" not in run_json and run_json["precision_used"] == "fp32"

    model = minigate.from_pretrained(out / "model")
    assert model.cfg.gate == "G1" and model.cfg.gate_granularity == "headwise"
    tok = data.load_tokenizer(out / "model" / "tokenizer.json")
    val = data.encode(data.load_documents("wikitext-2")[1], tok)
    train_kw = run_json["train"]
    loss = evaluate(model, val, train_kw["seq_len"], train_kw["batch_size"], train_kw["bos_id"],
                    train_kw["eval_batches"])
    assert loss == pytest.approx(history["val_loss"][-1], rel=1e-6)

    capsys.readouterr()
    assert main(["eval", str(out), "--threads", "1"]) == 0
    printed = capsys.readouterr().out
    full = evaluate(model, val, train_kw["seq_len"], 16, 0)  # eval scores the whole held-out split
    m = re.search(r"validation loss ([\d.]+), perplexity ([\d.]+)", printed)
    assert float(m[1]) == pytest.approx(full, abs=1e-4)
    assert float(m[2]) == pytest.approx(math.exp(full), rel=1e-3)

    capsys.readouterr()
    assert main(["train", *ci_args, "--out", str(out), "--steps", "4"]) == 2
    assert "already has a checkpoint; add --resume" in capsys.readouterr().err
    with pytest.warns(UserWarning, match="steps"):  # extending a finished run: it says the schedule changed
        assert main(["train", *ci_args, "--out", str(out), "--steps", "5", "--resume"]) == 0
    assert json.loads((out / "history.json").read_text())["step"] == [1, 2, 3, 4, 5]
    capsys.readouterr()
    assert main(["train", "--preset", "ci", "--variant", "none", "--out", str(out), "--resume", "--quiet"]) == 2
    assert "--variant headwise, not --preset ci --variant none" in capsys.readouterr().err


def test_command_line_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["train", "--preset", "huge", "--variant", "none", "--out", str(tmp_path)])
    assert e.value.code == 2 and "invalid choice: 'huge'" in capsys.readouterr().err
    capsys.readouterr()
    assert main(["eval", str(tmp_path)]) == 2  # bad input: one line `error: ...`, exit 2, as every other
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path} holds no model") and err.count("\n") == 1, err


def test_eval_refuses_a_tokenizer_larger_than_the_model(tmp_path, capsys):
    model = minigate.Transformer(minigate.ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, n_kv_heads=2,
                                                      head_dim=8, d_ff=48))
    minigate.save_pretrained(model, tmp_path)  # no tokenizer.json: eval uses the default tokenizer, 4096 tokens
    capsys.readouterr()
    assert main(["eval", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: tokenizer ") and "tokens but the model's vocab_size is 50" in err, err
    assert err.count("\n") == 1 and "trained with?" in err


@pytest.mark.slow
def test_ctrl_c_leaves_a_resumable_checkpoint(tmp_path, ci_args):
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "minigate.cli", "train", *ci_args, "--out", str(out), "--steps", "500"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:  # wait until training starts
        if "->" in line:
            break
    time.sleep(1.5)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "--resume" in stdout and "Traceback" not in stderr
    assert 1 <= ckpt_step(out / "checkpoint.pt") < 500
    assert not (out / "model").exists()
    assert torch.load(out / "checkpoint.pt", weights_only=True)["train_config"]["steps"] == 500


@pytest.mark.slow
def test_set_overrides_fields_records_them_and_tracks_the_sink(tmp_path, capsys, ci_args):
    out = tmp_path / "run"
    argv = ["train", *ci_args, "--out", str(out), "--steps", "2", "--set", "lr=0.01", "--set", "qk_norm=false",
            "--set", "eval_every=1"]
    assert main(argv) == 0
    run_json = json.loads((out / "run.json").read_text())
    assert run_json["train"]["lr"] == 0.01 and run_json["model"]["qk_norm"] is False
    assert minigate.from_pretrained(out / "model").cfg.qk_norm is False
    metrics = json.loads((out / "history.json").read_text())["metrics"]
    assert [m["step"] for m in metrics] == [1, 2]
    assert 0 < metrics[-1]["f_attn"] <= 1 and metrics[-1]["m_act"] > 0 and len(metrics[-1]["f_attn_per_layer"]) == 2
    # resuming rebuilds the model from run.json, overrides included
    with pytest.warns(UserWarning, match="steps"):
        assert main(["train", *ci_args, "--out", str(out), "--steps", "3", "--resume"]) == 0
    assert json.loads((out / "run.json").read_text())["model"]["qk_norm"] is False
    for bad, msg in [("lr", "FIELD=VALUE"), ("nope=1", "no such ModelConfig or TrainConfig field"),
                     ("qk_norm=maybe", "true or false"), ("n_layers=two", "expected an integer")]:
        capsys.readouterr()
        assert main(["train", *ci_args, "--out", str(tmp_path / "x"), "--set", bad]) == 2
        assert msg in capsys.readouterr().err


def test_set_reads_each_value_as_its_fields_declared_type():
    """--set text becomes the dataclass field's type: a union such as TrainConfig.compile (bool | str) takes the
    first type that reads it, so compile=false is False and compile=auto stays 'auto'."""
    from minigate.run import configs

    model_cfg, train_cfg = configs("ci", "headwise", sets={"compile": "false", "betas": "0.9,0.99", "qk_norm": "0",
                                                            "gate_bias": "-2", "eval_every": "7"})
    assert (train_cfg.compile, train_cfg.betas, model_cfg.qk_norm, model_cfg.gate_bias, train_cfg.eval_every) == \
        (False, (0.9, 0.99), False, -2.0, 7)
    assert configs("ci", "none", sets={"compile": "auto"})[1].compile == "auto"
    with pytest.raises(ValueError, match=r"^--set betas=a,b: expected numbers separated by commas$"):
        configs("ci", "none", sets={"betas": "a,b"})
