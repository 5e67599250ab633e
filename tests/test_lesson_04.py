"""Lesson 04's bos_share_by_part: the reference agrees with a plain loop on a real copy-task model's patterns, and
with the package's F-Attn. That the references pass and a stub falls back is tests/test_checks.py's, and that each
typical mistake earns its hint tests/test_check_mutations.py's, for every check."""

import pytest

from minigate.analysis import attention_sink
from minigate.course import checks, release
from minigate.data import copy_task


def test_reference_equals_a_plain_loop_on_the_shipped_baseline():
    model = release.shipped("copy-baseline")
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


# ── bos_noop_test's planted models ────────────────────────────────────────────────────────────────────

from minigate.course.checks import lesson04 as l4  # noqa: E402


@pytest.mark.parametrize("label, planted", l4.NOOP_CASES, ids=[c[0] for c in l4.NOOP_CASES])
def test_noop_models_plant_their_labels_with_margins(label, planted):
    """Each planted no-op moves the loss by under NOOP / 10 when its <bos> value is zeroed, each planted constant by
    over 5 NOOP: the reference's verdicts are the planted labels, on any float path."""
    model, tokens, labels = l4._noop_model(*planted)
    changes = []
    for layer, heads in enumerate(labels):
        for head, is_noop in heads.items():
            verdict, change = checks.reference_bos_noop_test(model, tokens, layer, head)
            assert verdict == is_noop
            assert abs(change) < l4.NOOP / 10 if is_noop else abs(change) > 5 * l4.NOOP, (layer, head, change)
            changes.append(change)
    assert any(labels[0].values()) and not all(labels[0].values())  # both kinds


def test_noop_first_case_breaks_every_shortcut():
    """On the first case the value-norm proxy and the share disagree with the planted labels, a constant's removal
    lowers the loss, a no-op's moves it by more than 0.0, and each typical mistake gives verdicts of its own (so
    each earns its own hint)."""
    model, tokens, labels = l4._noop_model(*l4.NOOP_CASES[0][1])
    truth = [float(v) for heads in labels for v in heads.values()]
    ratio = l4._verdicts(l4.partial(l4._bos_noop_test, test="ratio"))(model, tokens).tolist()
    assert sum(r != t for r, t in zip(ratio, truth, strict=True)) >= 3
    changes = [checks.reference_bos_noop_test(model, tokens, L, h)[1] for L in range(2) for h in range(4)]
    assert min(changes) < -5 * l4.NOOP  # a used constant whose removal helps: the one-sided rule calls it a no-op
    assert any(c != 0 for c, t in zip(changes, truth, strict=True) if t)
    vectors = [tuple(l4._verdicts(fn)(model, tokens).tolist())
               for fn in (checks.reference_bos_noop_test, *(f for _, f, _ in l4.MISTAKES["bos_noop_test"]))]
    assert len(set(vectors)) == len(vectors)


def test_noop_an_answer_with_another_threshold_and_hook_passes(capsys):
    """A learner's own threshold anywhere between the planted no-ops and constants passes; so does zeroing <bos>'s
    value through a hook written otherwise (in place, on the slice)."""
    import torch
    import torch.nn.functional as F

    def fn(model, tokens, layer, head):
        kv = head * model.cfg.n_kv_heads // model.cfg.n_heads
        name = f"blocks.{layer}.attn.hook_v"

        def loss(hooks):
            with torch.no_grad():
                logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
            return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).item()

        def zero(v, hook):
            v = v.clone()
            v[:, 0, kv].zero_()
            return v

        change = loss([(name, zero)]) - loss([])
        return abs(change) <= 0.003, change
    assert checks.bos_noop_test(fn) is fn
