"""Lesson 03's check, bos_tracker: the reference passes, other correct callbacks pass, a wrong share no typical mistake
explains gets the generic hint, a stub falls back, and the reference records in train() what the package's
attention_sink measures. That each typical mistake earns its hint is tests/test_check_mutations.py's, for every
check."""

import dataclasses

import pytest
import torch

import minigate
from minigate import data
from minigate.analysis import attention_sink
from minigate.course import checks
from minigate.presets import PRESETS, model_config
from minigate.train import train


def test_reference_passes_and_is_returned(capsys):
    assert checks.bos_tracker(checks.reference_bos_tracker) is checks.reference_bos_tracker
    assert "✓ bos_tracker: passed (3 cases)" in capsys.readouterr().out


def test_a_callback_built_on_attention_sink_passes(capsys):
    def tracker(tokens):
        def callback(step, model, history):
            share = attention_sink(model, tokens).share  # (layer, head), float32
            layer, head = divmod(int(share.argmax()), share.shape[1])
            return {"bos_share": share.max().item(), "layer": layer, "head": head, "step_seen": step}
        return callback
    assert checks.bos_tracker(tracker) is tracker


def test_an_unrecognised_wrong_share_gets_the_generic_hint(capsys):
    def halved(tokens):
        def callback(step, model, history):
            out = checks.reference_bos_tracker(tokens)(step, model, history)
            return dict(out, bos_share=out["bos_share"] / 2)
        return callback
    with pytest.raises(AssertionError):
        checks.bos_tracker(halved)
    assert "at 'bos_share' (yours is lower)" in capsys.readouterr().out


def test_stub_falls_back_to_the_reference(capsys):
    def stub(tokens):
        raise NotImplementedError()
    assert checks.bos_tracker(stub) is checks.reference_bos_tracker
    assert "bos_tracker not implemented yet" in capsys.readouterr().out


def test_in_train_it_records_what_attention_sink_measures():
    """A few copy-task steps with the reference as train()'s callback: history.metrics holds the largest head of
    attention_sink at each tracked step, as plain numbers."""
    cfg = dataclasses.replace(PRESETS["copy"].train, steps=4, warmup_steps=2, eval_every=4, eval_batches=1,
                              callback_every=2, device="cpu")
    rows = data.task_rows("copy", 256, cfg.seq_len, 130, seed=1)
    probe = rows[:8, :-1]
    torch.manual_seed(0)
    model = minigate.Transformer(model_config("copy", "none"))
    history = train(model, rows, rows, cfg, callback=checks.reference_bos_tracker(probe), progress=False)
    assert [m["step"] for m in history.metrics] == [2, 4]
    last = history.metrics[-1]
    share = attention_sink(model.eval(), probe).share
    assert abs(last["bos_share"] - share.max().item()) < 1e-6
    assert (last["layer"], last["head"]) == divmod(int(share.argmax()), share.shape[1])
    assert all(type(last[k]) is int for k in ("layer", "head")) and type(last["bos_share"]) is float
