"""The training benchmark's CPU settings contenders: each runs in a process of its own and reports rates."""

import json
import subprocess
import sys

import pytest
import torch

from minigate import hardware
from minigate.bench import train as bench_train

pytestmark = pytest.mark.slow  # each contender trains in a process of its own


def _what_a_worker_runs(name, monkeypatch) -> tuple[bool, str, bool]:
    """(allocator tuned, precision, compiled) of what settings_worker(name) really trains with: the allocator, compile
    and the training loop are recorded instead of run."""
    seen = {"tuned": False}
    monkeypatch.setattr(bench_train, "tune_cpu_allocator", lambda: seen.update(tuned=True))
    monkeypatch.setattr(torch, "compile", lambda model: lambda x: "the compiled model")

    def loop(model, logits_of, tokens, cfg, gen):
        seen.update(precision=cfg.precision, device=cfg.device,
                    compiled=logits_of(model, tokens[:8][None]) == "the compiled model")
        return [100.0, 200.0, 300.0]  # tokens/s of each step

    monkeypatch.setattr(bench_train, "plain_loop", loop)
    got = bench_train.settings_worker(name, "ci", 3)
    t = bench_train.PRESETS["ci"].train
    assert got == {"first_s": t.batch_size * t.seq_len / 100.0, "rates": [200.0, 300.0]}  # the first step apart
    assert seen["device"] == "cpu"
    return seen["tuned"], seen["precision"], seen["compiled"]


def test_settings_cover_the_allocator_precision_and_compile(monkeypatch):
    """The contenders really run glibc's and the tuned allocator, fp32 and bf16, eager and compiled; the ones the
    report names as its baseline and its compile comparison do what their names say."""
    runs = {name: _what_a_worker_runs(name, monkeypatch) for name in bench_train.SETTINGS}
    assert set(runs.values()) == {(False, "fp32", False), (True, "fp32", False), (True, "bf16", False),
                                  (True, "fp32", True), (True, "bf16", True)}
    assert runs["fp32, glibc's default allocator"] == (False, "fp32", False)
    assert runs["fp32, tuned allocator (default)"] == (True, "fp32", False)
    assert runs["fp32 + torch.compile, tuned"] == (True, "fp32", True)
    assert runs["bf16 + torch.compile, tuned"] == (True, "bf16", True)
    for compiled, eager in bench_train.COMPILED.items():  # each compiled contender is timed against its eager twin
        assert runs[compiled][:2] == runs[eager][:2] and runs[compiled][2] and not runs[eager][2]


@pytest.mark.parametrize("name", ["fp32, glibc's default allocator", "bf16 autocast, tuned allocator"])
def test_a_settings_worker_reports_its_first_step_and_the_rest(name):
    out = subprocess.run([sys.executable, "-m", "minigate.bench", "train", "--worker", name, "--preset", "ci",
                          "--steps", "3", "--threads", "1"], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["first_s"] > 0 and len(got["rates"]) == 2 and all(r > 0 for r in got["rates"])


def test_an_unknown_preset_is_one_line_of_error():
    out = subprocess.run([sys.executable, "-m", "minigate.bench", "train", "--preset", "nope"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "unknown --preset 'nope'" in out.stderr


@pytest.mark.parametrize("native", [False, True])
def test_the_precision_report_names_what_auto_chose_and_its_share_of_the_best_matmul(monkeypatch, capsys, native):
    """The hardware query is mocked; the training run and the matmuls are real (the matmul sizes small, for time)."""
    monkeypatch.delenv(hardware.PRECISION_ENV, raising=False)  # "auto" itself
    monkeypatch.setattr(hardware, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setattr(bench_train, "cpu_has_native_bf16", lambda: native)
    best = bench_train.best_matmul_rate
    monkeypatch.setattr(bench_train, "best_matmul_rate",
                        lambda dtype, device: best(dtype, device, sizes=(128, 256), seconds=0.05))
    got = bench_train.auto_precision("ci", torch.device("cpu"), steps=3, rounds=1)
    want = "bf16" if native else "fp32"
    assert got["precision"] == want and got["fraction"] == got["model_flops"] / got["best_matmul_flops"] > 0
    out = capsys.readouterr().out
    assert "precision='auto' on CPU" in out and f": {want}. train()" in out and f"best {want} matmul rate" in out


def test_training_flops_per_token_are_three_forwards():
    cfg = bench_train.model_config("ci")
    params = bench_train.Transformer(cfg).num_params()
    attention = 2 * 2 * cfg.n_layers * cfg.n_heads * cfg.head_dim * 128 / 2  # q.k and pattern.v over T/2 keys
    assert bench_train.train_flops_per_token(cfg, 128) == pytest.approx(3 * (2 * params + attention))
