"""Lesson 04's new check, bos_share_by_part: the reference passes, a stub falls back, and the reference agrees with a
plain loop on a real copy-task model's patterns. That each typical mistake earns its hint is
tests/test_check_mutations.py's, for every check."""

import pytest

import minigate
from minigate.course import checks
from minigate.data import copy_task


def test_reference_passes_and_is_returned(capsys):
    fn = lambda p, n: checks.reference_bos_share_by_part(p, n).clone()
    assert checks.bos_share_by_part(fn) is fn
    assert "✓ bos_share_by_part: passed (2 cases)" in capsys.readouterr().out


def test_stub_falls_back_to_the_reference(capsys):
    def stub(p, n):
        raise NotImplementedError()
    assert checks.bos_share_by_part(stub) is checks.reference_bos_share_by_part
    assert "bos_share_by_part" in capsys.readouterr().out


def test_reference_equals_a_plain_loop_on_the_shipped_baseline():
    model = minigate.shipped("copy-baseline")
    x = copy_task(8, seed=3)[:, :-1]
    _, cache = model.run_with_cache(x, names_filter=lambda n: n == "blocks.0.attn.hook_pattern")
    p = cache["blocks.0.attn.hook_pattern"]
    got = checks.reference_bos_share_by_part(p, 32)
    for h in range(p.shape[1]):
        rand = [p[b, h, q, 0].item() for b in range(8) for q in range(1, 33)]
        copy = [p[b, h, q, 0].item() for b in range(8) for q in range(33, 64)]
        assert got[0, h].item() == pytest.approx(sum(rand) / len(rand), abs=1e-6)
        assert got[1, h].item() == pytest.approx(sum(copy) / len(copy), abs=1e-6)
