"""Lesson 03's new check, next_token_loss: the reference passes, each typical mistake earns its hint, a stub
falls back to the reference, and the reference is the loss train() minimises (train.evaluate on real windows)."""

import math

import pytest
import torch
import torch.nn.functional as F

from minigate import ModelConfig, Transformer
from minigate.course import checks
from minigate.data import eval_batches
from minigate.train import evaluate

L = checks._next_token_loss


def test_reference_passes_and_is_returned(capsys):
    assert checks.next_token_loss(checks.reference_next_token_loss) is checks.reference_next_token_loss
    assert "✓ next_token_loss: passed (3 cases)" in capsys.readouterr().out


def test_a_float32_cross_entropy_answer_passes(capsys):
    fn = lambda logits, tokens: F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    assert checks.next_token_loss(fn) is fn


@pytest.mark.parametrize("wrong, hint", [
    (lambda lg, tk: L(lg, tk, shift="none"), "no shift"),
    (lambda lg, tk: L(lg, tk, shift="left"), "shifted the wrong way"),
    (lambda lg, tk: L(lg, tk, shift="roll"), "torch.roll wraps around"),
    (lambda lg, tk: L(lg, tk, divide="sum"), "a sum, not a mean"),
    (lambda lg, tk: L(lg, tk, divide="all tokens"), "not by b * t"),
    (lambda lg, tk: L(lg, tk, norm=None), "not log-probabilities"),
    (lambda lg, tk: L(lg, tk, norm=1), "log_softmax over the wrong axis"),
])
def test_each_mistake_gets_its_hint(wrong, hint, capsys):
    with pytest.raises(AssertionError):
        checks.next_token_loss(wrong)
    out = capsys.readouterr().out
    assert hint in out and out.startswith("✗ next_token_loss"), out


def test_stub_falls_back_to_the_reference(capsys):
    def stub(logits, tokens):
        raise NotImplementedError()
    assert checks.next_token_loss(stub) is checks.reference_next_token_loss
    assert "next_token_loss not implemented yet" in capsys.readouterr().out


def test_reference_is_what_train_evaluates():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=2, n_kv_heads=2, head_dim=16,
                                    d_ff=64, max_seq_len=16)).eval()
    stream = torch.randint(1, 64, (200,), generator=torch.Generator().manual_seed(1))
    x, y = next(iter(eval_batches(stream, 4, 16, 0, 1)))
    rows = torch.cat([x, y[:, -1:]], dim=1)  # [<bos>, w_0 .. w_15]: the window with its targets
    with torch.no_grad():
        got = checks.reference_next_token_loss(model(rows), rows).item()
    assert got == pytest.approx(evaluate(model, stream, 16, batch_size=4, max_batches=1), abs=1e-5)
    assert got == pytest.approx(math.log(64), abs=0.5)  # an untrained model is close to uniform
