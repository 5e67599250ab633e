"""Lesson 03's checks. bos_tracker: a callback written otherwise passes, one built on the package's measures
(attention_sink, published_measures, sink_tracker) is refused with their hint, a wrong share no typical mistake
explains gets the generic hint, and the reference records in train() what the package's attention_sink measures.
sink_head_interval: minigate.stats.t_quantile against the tables, the check's models clear of the threshold, the
reference's interval, a correct answer written otherwise, the hints for a wrong count and a wrong interval, and the
count of trained models. That the references pass and a stub falls back is tests/test_checks.py's, and that each
typical mistake earns its hint tests/test_check_mutations.py's, for every check."""

import dataclasses
import sys

import pytest
import torch

import minigate
from minigate import analysis, data
from minigate.analysis import SINK_THRESHOLD, attention_sink, sink_tracker, uniform_first_token_share
from minigate.course import checks
from minigate.course.checks import lesson03 as l3
from minigate.presets import PRESETS, model_config
from minigate.stats import t_quantile
from minigate.train import train


def _tracker_on(share_of):
    """A correct tracker built on a package measure: share_of(model, tokens) -> the (layer, head) shares."""
    def tracker(tokens):
        def callback(step, model, history):
            share = share_of(model, tokens)
            layer, head = divmod(int(share.argmax()), share.shape[1])
            return {"max_head": share.max().item(), "layer": layer, "head": head}
        return callback
    return tracker


def _tracker_on_published_measures(tokens):
    def callback(step, model, history):
        m = minigate.analysis.published_measures(model, tokens)
        return {"max_head": m.max_head, "layer": m.max_head_at[0], "head": m.max_head_at[1]}
    return callback


def _shares_by_hooks(model, tokens):  # each head's mean on key 0, collected by a hook of one's own: the steps
    shares = {}

    def keep(pattern, hook):
        shares[hook.layer] = pattern[..., 0].mean((0, 2))

    model.run_with_hooks(tokens, fwd_hooks=[(lambda name: name.endswith("attn.hook_pattern"), keep)])
    return torch.stack([shares[layer] for layer in range(model.cfg.n_layers)])


def test_a_tracker_that_collects_the_pattern_with_its_own_hook_passes(capsys):
    tracker = _tracker_on(_shares_by_hooks)
    assert checks.bos_tracker(tracker) is tracker


ONE_CALL_TRACKERS = [  # (label, a learner's bos_tracker built on the package's measures, the measure it calls first)
    ("attention_sink imported by name", _tracker_on(lambda m, t: attention_sink(m, t).share), "attention_sink"),
    ("analysis.attention_sink", _tracker_on(lambda m, t: analysis.attention_sink(m, t).share), "attention_sink"),
    ("minigate.analysis.published_measures", _tracker_on_published_measures, "published_measures"),
    ("sink_tracker imported by name", lambda tokens: sink_tracker(tokens), "sink_tracker"),
]


@pytest.mark.parametrize("label, answer, called", ONE_CALL_TRACKERS, ids=[a[0] for a in ONE_CALL_TRACKERS])
def test_a_tracker_built_on_the_packages_measures_is_refused(label, answer, called, capsys):
    """The exercise asks for the steps (run_with_cache, each head's mean on key 0, the largest head): a tracker that
    calls attention_sink, published_measures or sink_tracker, which the lesson compares it with, fails with the
    hint naming it, in one line; the refusal ends with the answer's run (the package and the reference still run)."""
    with pytest.raises(AssertionError):
        checks.bos_tracker(answer)
    hint = l3._refused_measures()[getattr(analysis, called)]
    assert capsys.readouterr().out == f"✗ bos_tracker, case tiny baseline, 3 layers x 4 heads (2 value heads): {hint}\n"
    assert sys.getprofile() is None
    tokens = l3._tokens(0, 3, 10)
    assert attention_sink(l3._tracker_model(0), tokens).share.shape == (3, 4)
    assert checks.bos_tracker(checks.reference_bos_tracker) is checks.reference_bos_tracker


def test_an_unrecognised_wrong_share_gets_the_generic_hint(capsys):
    def halved(tokens):
        def callback(step, model, history):
            out = checks.reference_bos_tracker(tokens)(step, model, history)
            return dict(out, max_head=out["max_head"] / 2)
        return callback
    with pytest.raises(AssertionError):
        checks.bos_tracker(halved)
    assert "at 'max_head' (yours is lower)" in capsys.readouterr().out


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
    assert abs(last["max_head"] - share.max().item()) < 1e-6
    assert (last["layer"], last["head"]) == divmod(int(share.argmax()), share.shape[1])
    assert all(type(last[k]) is int for k in ("layer", "head")) and type(last["max_head"]) is float


# ── exercise 2: sink heads over seeds, with a t interval ──────────────────────────────────────────────────────────

@pytest.mark.parametrize("p, df, want", [(0.975, 1, 12.7062047), (0.975, 3, 3.1824463), (0.975, 5, 2.5705818),
                                         (0.975, 30, 2.0422725), (0.95, 2, 2.9199856), (0.995, 1, 63.6567412),
                                         (0.9995, 1, 636.6192488), (0.975, 4, 2.7764451), (0.75, 10, 0.6998121)])
def test_t_quantile_matches_the_tables(p, df, want):
    assert t_quantile(p, df) == pytest.approx(want, abs=1e-6)
    assert t_quantile(1 - p, df) == pytest.approx(-want, abs=1e-6)  # symmetric


def test_t_quantile_is_exact_where_the_t_distribution_has_a_closed_form():
    """df = 1 is the Cauchy distribution, tan(pi (p - 1/2)); df = 2 has t = (2p - 1) sqrt(2 / (4 p (1 - p)))."""
    import math

    for p in (0.55, 0.8, 0.9, 0.975, 0.999):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p))), rel=1e-10)
    assert t_quantile(0.5, 7) == 0.0
    assert t_quantile(0.975, 1e7) == pytest.approx(1.959964, abs=1e-5)  # the normal's, in the limit


@pytest.mark.parametrize("df", [0.5, 2.5, 4.7, 29.3])
def test_t_quantile_takes_fractional_degrees_of_freedom(df):
    """scipy.stats.t's quantile of a df that is not whole, against the t density integrated from 0 to it (Simpson's
    rule on 2,000 intervals): P(0 < T < t) = p - 1/2."""
    import math

    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = lambda x: math.exp(log_c - (df + 1) / 2 * math.log1p(x * x / df))  # noqa: E731
    for p in (0.6, 0.9, 0.975):
        t = t_quantile(p, df)
        n, h = 2000, t / 2000
        area = h / 3 * sum(density(i * h) * (1 if i in (0, n) else 4 if i % 2 else 2) for i in range(n + 1))
        assert area == pytest.approx(p - 0.5, abs=1e-9)
    assert t_quantile(0.975, 2) > t_quantile(0.975, 2.5) > t_quantile(0.975, 3)  # between its whole neighbours


def test_t_quantile_takes_one_element_tensors_and_returns_a_float():
    got = t_quantile(torch.tensor(0.975), torch.tensor(4))
    assert type(got) is float and got == pytest.approx(2.7764451, abs=1e-6)


@pytest.mark.parametrize("p, df", [(0.975, 0), (0.975, -1), (1.0, 3), (0.0, 3), (0.975, float("inf")), (0.975, True),
                                   (float("nan"), 3), (0.975, float("nan")), ("0.975", 3), (0.975, "4")])
def test_t_quantile_refuses_what_has_no_quantile(p, df):
    with pytest.raises(ValueError, match="^t_quantile: [^\n]+$"):  # one line, naming the function
        t_quantile(p, df)
    try:
        t_quantile(p, df)
    except ValueError as e:  # the check tells a learner's own refusal of one seed from the library's by this
        assert "seed" not in str(e)


def test_the_check_models_keep_every_head_and_every_mean_clear_of_the_threshold():
    """The hook sets each head's share exactly (no training, the same on every CPU); none, and no model's mean over
    heads (the 'threshold on the mean' mistake), lies within 0.04 of 0.3. The counts vary from seed to seed, so that s
    is never 0, and the 'mean over heads' and 'one layer' mistakes give other counts."""
    for j, (label, kinds, options, _) in enumerate(l3.SINK_CASES):
        rows = l3._rows(j)
        counts = []
        for i, k in enumerate(kinds):
            share = attention_sink(l3._sink_model(k, seed=i, **options), rows).share
            assert ((share - SINK_THRESHOLD).abs() > 0.04).all(), (label, k, share)
            assert abs(share.mean().item() - SINK_THRESHOLD) > 0.04, (label, k)
            counts.append(int((share > SINK_THRESHOLD).sum()))
        assert counts == [sum(c in "Sm" for c in "".join(k)) for k in kinds]
        if len(counts) > 1:
            assert len(set(counts)) > 1, label
    assert uniform_first_token_share(12) < SINK_THRESHOLD - 0.04  # "u": uniform attention over 12 positions


def test_the_interval_reference_is_the_t_interval():
    import math

    models = [l3._sink_model(k, seed=i) for i, k in enumerate(l3.SINK_CASES[0][1])]
    counts, mean, low, high = checks.reference_sink_head_interval(models, l3._rows(0))
    assert counts == [2, 3, 7] and mean == pytest.approx(4.0)
    s = math.sqrt(((2 - 4) ** 2 + (3 - 4) ** 2 + (7 - 4) ** 2) / 2)
    assert high - mean == pytest.approx(mean - low) == pytest.approx(4.3026527 * s / math.sqrt(3), rel=1e-7)
    with pytest.raises(ValueError, match="one seed gives no interval: train more seeds"):
        checks.reference_sink_head_interval(models[:1], l3._rows(0))


def test_sink_head_interval_on_attention_sink_passes(capsys):
    """A correct answer written otherwise: the package's count, statistics' mean and stdev."""
    import math
    import statistics

    def through_the_package(models, rows, level=0.95):
        counts = [attention_sink(m, rows).n_sink_heads for m in models]
        if len(counts) < 2:
            raise ValueError("train at least two seeds")
        m, s = statistics.mean(counts), statistics.stdev(counts)
        half = t_quantile(0.5 + level / 2, len(counts) - 1) * s / math.sqrt(len(counts))
        return counts, m, m - half, m + half
    assert checks.sink_head_interval(through_the_package) is through_the_package
    assert "✓ sink_head_interval: passed (4 cases)" in capsys.readouterr().out


def test_sink_head_interval_unrecognised_wrong_answers_get_hints(capsys):
    def threshold_half(models, rows, level=0.95):  # a threshold of 0.5: the mild sink heads (0.42) go uncounted
        counts = [int((attention_sink(m, rows).share > 0.5).sum()) for m in models]
        return counts, *l3._sink_head_interval(models, rows, level)[1:]

    def half_as_wide(models, rows, level=0.95):  # right counts, an interval no mistake of the table explains
        counts, mean, low, high = l3.reference_sink_head_interval(models, rows, level)
        # its low end further off than its high end: an even split would leave the largest error to the last bit
        return counts, mean, mean - (mean - low) / 2, mean + (high - mean) * 0.6

    capsys.readouterr()
    with pytest.raises(AssertionError):
        checks.sink_head_interval(threshold_half)
    assert "models[0] has 2 sink heads, yours counts 1:" in capsys.readouterr().out  # the first wrong count
    with pytest.raises(AssertionError):
        checks.sink_head_interval(half_as_wide)
    assert "at low (yours is higher)" in capsys.readouterr().out  # the generic hint, its largest error named


def test_sink_head_interval_in_the_lesson_counts_what_attention_sink_counts():
    """A few copy-task steps of two seeds: the reference counts each trained model's sink heads as n_sink_heads does."""
    cfg = dataclasses.replace(PRESETS["copy"].train, steps=6, warmup_steps=2, eval_every=6, eval_batches=1,
                              device="cpu")
    rows = data.task_rows("copy", 256, cfg.seq_len, 130, seed=1)
    probe = rows[:8, :-1]
    models = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        model = minigate.Transformer(model_config("copy", "elementwise"))
        train(model, rows, rows, dataclasses.replace(cfg, seed=seed), progress=False)
        models.append(model.eval())
    counts, mean, low, high = checks.reference_sink_head_interval(models, probe)
    assert counts == [attention_sink(m, probe).n_sink_heads for m in models]
    assert all(type(c) is int for c in counts) and low <= mean <= high
