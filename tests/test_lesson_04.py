"""Lesson 04's new check, bos_share_by_part: the reference passes, each mistake earns its hint, a stub falls back,
and the reference agrees with a plain loop on a real copy-task model's patterns."""

import pytest

import minigate
from minigate.course import checks
from minigate.data import copy_task

B = checks._bos_share_by_part


def test_reference_passes_and_is_returned(capsys):
    fn = lambda p, n: checks.reference_bos_share_by_part(p, n).clone()
    assert checks.bos_share_by_part(fn) is fn
    assert "✓ bos_share_by_part: passed (2 cases)" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, hint", [
    (lambda p, n: B(p, n, start=0), "leave out query 0"),
    (lambda p, n: B(p, n, split=-1), "1..n_random inclusive"),
    (lambda p, n: B(p, n, split=1), "separator"),
    (lambda p, n: B(p, n, to_key=False), "*from* <bos>"),
    (lambda p, n: B(p, n, head_mean=True), "one number per head"),
])
def test_each_mistake_gets_its_hint(wrong, hint, capsys):
    with pytest.raises(AssertionError):
        checks.bos_share_by_part(wrong)
    assert hint in capsys.readouterr().out


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
