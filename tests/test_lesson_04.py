"""Lesson 04's bos_share_by_part: the reference agrees with a plain loop on a real copy-task model's patterns, and
with the package's F-Attn. That the references pass and a stub falls back is tests/test_checks.py's, and that each
typical mistake earns its hint tests/test_check_mutations.py's, for every check."""

import pytest

import minigate
from minigate.analysis import attention_sink
from minigate.course import checks
from minigate.data import copy_task


def test_reference_equals_a_plain_loop_on_the_shipped_baseline():
    model = minigate.shipped("copy-baseline")
    x = copy_task(8, seed=3)[:, :-1]
    _, cache = model.run_with_cache(x, names_filter=lambda n: n.endswith("attn.hook_pattern"))
    got = checks.reference_bos_share_by_part(cache, model.cfg.n_layers, 32)  # (layer, 3, head)
    assert got.shape == (model.cfg.n_layers, 3, model.cfg.n_heads)
    for layer in range(model.cfg.n_layers):
        p = cache[f"blocks.{layer}.attn.hook_pattern"]
        for h in range(p.shape[1]):
            for row, queries in enumerate((range(0, 64), range(1, 33), range(33, 64))):
                values = [p[b, h, q, 0].item() for b in range(8) for q in queries]
                assert got[layer, row, h].item() == pytest.approx(sum(values) / len(values), abs=1e-6)
    assert got[:, 0].mean().item() == pytest.approx(attention_sink(model, x).f_attn, abs=1e-6)  # F-Attn follows
