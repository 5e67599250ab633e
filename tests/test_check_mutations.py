"""Every exercise's check against plausible wrong answers: each must fail with an AssertionError (never pass, never
crash inside the check); each typical mistake the check knows (checks.MISTAKES) with its own hint, most other wrong
answers with a hint for what they got wrong; and against None, a wrong type, the learner's own exception
and an untouched stub, in the default and in grading mode."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.nn.functional import scaled_dot_product_attention as sdpa_imported_alone

import minigate
from minigate import analysis
from minigate import overrides as ov
from minigate.course import checks
from minigate.course.checks import engine
from minigate.course.checks import lesson02 as l2
from minigate.course.checks import lesson03 as l3
from minigate.course.checks import lesson04 as l4
from minigate.course.checks import lesson05 as l5
from minigate.course.checks import lesson08 as l8
from minigate.analysis import attention_sink, published_measures, uniform_first_token_share
from minigate.overrides import close_head, forbid_bos
from minigate.stats import t_quantile

# what each check returns for a stub: its reference
REFERENCES = {name: getattr(checks, f"reference_{name}", None) for name in checks.EXERCISES}


@pytest.fixture(autouse=True)
def _default_mode(monkeypatch):
    monkeypatch.delenv(checks.GRADING_ENV, raising=False)
    monkeypatch.delenv("NBGRADER_EXECUTION", raising=False)
    checks.grading(None)
    yield
    checks.grading(None)


def _gqa_not_repeated(q, k, v):
    T = q.shape[-2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    return s.softmax(-1) @ v


def _tiled(q, k, v):  # k.repeat tiles the kv heads: '(g kv)'
    g = q.shape[1] // k.shape[1]
    return _gqa_not_repeated(q, k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1))


def _sdpa_repeated(q, k, v):  # the right numbers, from the fused kernel the exercise asks not to call
    g = q.shape[1] // k.shape[1]
    return sdpa_imported_alone(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), is_causal=True)


def _own_bootstrap(per_prompt, seed=0):  # a correct percentile bootstrap over prompts, but its own resamples
    first = torch.stack([p[0] for p in per_prompt]).double()
    sums = torch.stack([p[1:].sum() for p in per_prompt]).double()
    counts = torch.tensor([len(p) - 1 for p in per_prompt], dtype=torch.float64)
    ratio = lambda i: first[i].mean() / (sums[i].sum() / counts[i].sum())
    g = torch.Generator().manual_seed(seed + 123)
    boots = torch.stack([ratio(torch.randint(len(per_prompt), (len(per_prompt),), generator=g)) for _ in range(1000)])
    low, high = torch.quantile(boots, torch.tensor([0.025, 0.975], dtype=torch.float64)).tolist()
    return ratio(torch.arange(len(per_prompt))).item(), low, high, high < 1


def _noop_by_value_norm(model, tokens, layer, head):  # the proxy, as a learner might write it: |v<bos>| small
    _, cache = model.run_with_cache(tokens, names_filter=f"blocks.{layer}.attn.hook_v")
    v = cache[f"blocks.{layer}.attn.hook_v"][:, :, head // (model.cfg.n_heads // model.cfg.n_kv_heads)]
    return bool(v[:, 0].norm(dim=-1).mean() < 0.5 * v[:, 1:].norm(dim=-1).mean()), 0.0


def _headwise_not_reshaped(z, g):
    return z * torch.sigmoid(g)


def _tracker_with_tensors(tokens):  # the callback's numbers left as tensors: history.json cannot store them
    def callback(step, model, history):
        out = l3.reference_bos_tracker(tokens)(step, model, history)
        return {k: torch.tensor(v) for k, v in out.items()}
    return callback


def _tracker_filtering_scores(tokens):  # a names_filter that keeps the scores, not the pattern: KeyError
    def callback(step, model, history):
        _, cache = model.run_with_cache(tokens, names_filter=lambda name: name.endswith("attn.hook_attn_scores"))
        share = cache["blocks.0.attn.hook_pattern"][..., 0].mean((0, 2))
        return {"max_head": share.max().item(), "layer": 0, "head": int(share.argmax())}
    return callback


def _z_gated_everywhere(model, tokens, layer, n_random):  # an ungated layer has no hook_z_gated: KeyError
    name = f"blocks.{layer}.attn.hook_z_gated"
    _, cache = model.run_with_cache(tokens, names_filter=name)
    z = cache[name]
    return torch.stack([z[:, 1: n_random + 1].norm(dim=-1).mean((0, 1)), z[:, n_random + 1:].norm(dim=-1).mean((0, 1))])


def _nonlinear_inputs(model, tokens, layer, z_name="hook_z_gated"):  # m (batch, head, pos, d_model), z as cached
    names = [f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_pattern", f"blocks.{layer}.attn.{z_name}"]
    _, cache = model.run_with_cache(tokens, names_filter=names)
    x = model.blocks[layer].attn_norm(cache[names[0]]).detach()
    return cache[names[1]] @ x[:, None], cache[names[2]]


def _nonlinear_z_gated_everywhere(model, tokens, layer):  # an ungated layer has no hook_z_gated: KeyError
    m, z = _nonlinear_inputs(model, tokens, layer)
    return l2._nonlinear_share(model, tokens, layer)


def _nonlinear_mixed_dtypes(model, tokens, layer):  # lstsq refuses float64 M with float32 Z
    m, z = _nonlinear_inputs(model, tokens, layer, "hook_z")
    return torch.linalg.lstsq(m.double(), z.transpose(1, 2)).solution


def _nonlinear_heads_last(model, tokens, layer):  # M (head, N, d_model) against Z (N, head, d_head): lstsq refuses
    m, z = _nonlinear_inputs(model, tokens, layer, "hook_z")
    m, z = m.transpose(0, 1).flatten(1, 2).double(), z.flatten(0, 1).double()
    return torch.linalg.lstsq(m, z).solution


def _nonlinear_einops_grouped(model, tokens, layer):  # einops' einsum refuses '(b i)': NotImplementedError
    from einops import einsum
    m, z = _nonlinear_inputs(model, tokens, layer, "hook_z")
    return einsum(m, "b h i e -> h (b i) e")


def _noop_query_head_as_value_head(model, tokens, layer, head):  # hook_v[:, :, head] ignores GQA: IndexError there
    _, cache = model.run_with_cache(tokens, names_filter=f"blocks.{layer}.attn.hook_v")
    _ = cache[f"blocks.{layer}.attn.hook_v"][:, :, head]
    return l4._bos_noop_test(model, tokens, layer, head)


def _tracker_on_attention_sink(tokens):  # the package's measure: the exercise asks for the steps
    def callback(step, model, history):
        share = attention_sink(model, tokens).share  # imported by name
        layer, head = divmod(int(share.argmax()), share.shape[1])
        return {"max_head": share.max().item(), "layer": layer, "head": head}
    return callback


def _tracker_on_published_measures(tokens):
    def callback(step, model, history):
        m = published_measures(model, tokens)
        return {"max_head": m.max_head, "layer": m.max_head_at[0], "head": m.max_head_at[1]}
    return callback


def _tracker_around_sink_tracker(tokens):  # the package's tracker, its head added from its module's attention_sink
    track = minigate.analysis.sink_tracker(tokens)

    def callback(step, model, history):
        share = analysis.attention_sink(model, tokens).share
        return {**track(step, model, history), "layer": int(share.argmax()) // share.shape[1],
                "head": int(share.argmax()) % share.shape[1]}
    return callback


def _overrides_by_module(model, layer, value, head=None):  # the library's one-call answer
    return ov.force_layer(model, layer, value) if head is None else ov.close_head(model, layer, head, value)


def _close_head_by_name(model, layer, value, head=None):
    return close_head(model, layer, 0 if head is None else head, value)


def _edit_as_the_hook(model, layer, value, head=None):  # the library's hook object, not one of the learner's own
    return [(f"blocks.{layer}.attn.hook_gate", minigate.overrides.Edit("set", value, head))]


def _forbid_bos_by_module(model, layer, head=None):
    return minigate.overrides.forbid_bos(model, layer, head)


def _forbid_bos_shadowed():  # a learner's forbid_bos that calls the library's, imported by name before it
    library = forbid_bos

    def forbid_bos_(model, layer, head=None):
        return library(model, layer, head)
    forbid_bos_.__name__ = "forbid_bos"
    return forbid_bos_


def _override_one_pair(model, layer, value, head=None):
    return checks.reference_gate_override(model, layer, value, head)[0]


def _forbid_with_none_as_head(model, layer, head=None):  # lesson 01's one-head hook: pattern[:, None] adds an axis
    def hook(pattern, hook):
        pattern = pattern.clone()
        pattern[:, head, 1:, 0] = 0
        return pattern / pattern.sum(-1, keepdim=True)
    return [(f"blocks.{layer}.attn.hook_pattern", hook)]


def _interval_of(counts, level):  # the right t interval of a list of counts (the reference's own arithmetic)
    x = torch.tensor(counts, dtype=torch.float64)
    half = t_quantile((1 + level) / 2, len(counts) - 1) * x.std().item() / math.sqrt(len(counts))
    return x.mean().item(), x.mean().item() - half, x.mean().item() + half


def _counts_by_package(models, rows):
    return [attention_sink(m, rows).n_sink_heads for m in models]


def _interval_only(models, rows, level=0.95):  # the interval without the counts
    return l3.reference_sink_head_interval(models, rows, level)[1:]


def _counts_as_bools(models, rows, level=0.95):  # "has a sink head" per seed, not how many
    counts, *interval = l3.reference_sink_head_interval(models, rows, level)
    return [c > 0 for c in counts], *interval


def _threshold_half(models, rows, level=0.95):  # 0.5, not Gu et al.'s 0.3: the mild sink heads (0.42) go uncounted
    counts = [int((attention_sink(m, rows).share > 0.5).sum()) for m in models]
    return counts, *_interval_of(counts, level)


def _refuses_two_seeds(models, rows, level=0.95):  # `< 3` for `< 2`: two seeds do give an interval (a wide one)
    if len(models) < 3:
        raise ValueError("one seed gives no interval: train more seeds")
    return l3.reference_sink_head_interval(models, rows, level)


def _one_count_for_all(models, rows, level=0.95):  # the counts added up over the seeds
    counts, *interval = l3.reference_sink_head_interval(models, rows, level)
    return [sum(counts)], *interval


def _t_by_series(p, df):  # Student's t quantile another way: bisection on the closed-form CDF of a whole df
    def two_sided(t):  # P(|T| <= t), Abramowitz & Stegun 26.7.3-4
        theta = math.atan(t / math.sqrt(df))
        c2, term, total = math.cos(theta) ** 2, 1.0, 0.0
        if df % 2 == 0:
            for k in range(df // 2):
                total, term = total + term, term * c2 * (2 * k + 1) / (2 * k + 2)
            return math.sin(theta) * total
        term = math.cos(theta)
        for k in range((df - 1) // 2):
            total, term = total + term, term * c2 * (2 * k + 2) / (2 * k + 3)
        return 2 / math.pi * (theta + math.sin(theta) * total)
    lo, hi = 0.0, 1e4
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if two_sided(mid) < 2 * p - 1 else (lo, mid)
    return (lo + hi) / 2


def _interval_by_series(models, rows, level=0.95):  # a correct answer: the package's count, its own t
    counts = _counts_by_package(models, rows)
    n = len(counts)
    if n < 2:
        raise ValueError("need at least two seeds")
    mean = sum(counts) / n
    s = math.sqrt(sum((c - mean) ** 2 for c in counts) / (n - 1))
    half = _t_by_series((1 + level) / 2, n - 1) * s / math.sqrt(n)
    return counts, mean, mean - half, mean + half


def _interval_as_tensors(models, rows, level=0.95):  # a correct answer: counts a tensor, the rest 0-d tensors
    counts = torch.tensor(_counts_by_package(models, rows))
    if len(counts) < 2:
        raise ValueError("one seed gives no interval: train more seeds")
    x = counts.double()
    half = t_quantile((1 + level) / 2, len(x) - 1) * x.std() / len(x) ** 0.5
    return counts, x.mean(), x.mean() - half, x.mean() + half


ref = {name: REFERENCES[name] for name in checks.EXERCISES}

# wrong answers besides each check's typical mistakes (checks.MISTAKES): ones that earn a hint for a wrong structure
# or type, for the learner's exception, or the generic one
# (exercise, label, wrong function, a fragment its hint must contain, or None where any failure will do)
OTHER_WRONG_ANSWERS = [
    ("causal_attention", "k.repeat tiles", _tiled, "not '(g kv)'"),
    ("causal_attention", "GQA not repeated", _gqa_not_repeated, "repeat each kv head"),
    ("causal_attention", "F.scaled_dot_product_attention", lambda q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True, enable_gqa=True), "calls F.scaled_dot_product_attention"),
    ("causal_attention", "SDPA imported by name", _sdpa_repeated, "calls F.scaled_dot_product_attention"),
    ("attention_with_null", "only the output", lambda s, v, n: ref["attention_with_null"](s, v, n)[0],
     "expected 2 outputs"),
    ("attention_with_null", "real keys' weight instead of the null's",
     lambda s, v, n: (ref["attention_with_null"](s, v, n)[0], 1 - ref["attention_with_null"](s, v, n)[1]),
     "output 1: max |difference|"),
    ("g1_gate", "headwise not reshaped", _headwise_not_reshaped, "'b t h -> b t h 1'"),
    ("head_output_by_part", "hook_z_gated everywhere", _z_gated_everywhere, "is_gated"),
    ("split_q_proj", "q not transposed", lambda *a: (ref["split_q_proj"](*a)[0].transpose(1, 2),
                                                     ref["split_q_proj"](*a)[1]), "output 0: expected shape"),
    ("nonlinear_share", "hook_z_gated everywhere", _nonlinear_z_gated_everywhere, "is_gated"),
    ("nonlinear_share", "M in float64, Z in float32", _nonlinear_mixed_dtypes, "of one dtype"),
    ("nonlinear_share", "heads not in front", _nonlinear_heads_last, "the heads in front"),
    ("nonlinear_share", "einops einsum into '(b i)'", _nonlinear_einops_grouped, ".flatten(1, 2)"),
    ("split_q_proj", "headwise gates keep their 1", lambda qg, h, kv, d, gran: (
        ref["split_q_proj"](qg, h, kv, d, gran)[0],
        ref["split_q_proj"](qg, h, kv, d, gran)[1][..., None] if gran == "headwise"
        else ref["split_q_proj"](qg, h, kv, d, gran)[1]), "output 1: expected shape"),
    ("bos_tracker", "tensors, not numbers", _tracker_with_tensors, "plain Python numbers"),
    ("bos_tracker", "names_filter keeps the scores", _tracker_filtering_scores, "names_filter decides"),
    ("bos_tracker", "a tuple, not a dict",
     lambda t: lambda *a: tuple(l3.reference_bos_tracker(t)(*a).values()), "returns a dict of numbers"),
    ("bos_tracker", "the callback not returned", lambda t: None, "it returns the callback function"),
    ("bos_tracker", "attention_sink imported by name", _tracker_on_attention_sink, "calls analysis.attention_sink"),
    ("bos_tracker", "published_measures", _tracker_on_published_measures, "calls analysis.published_measures"),
    ("bos_tracker", "minigate.analysis.sink_tracker", _tracker_around_sink_tracker, "calls analysis.sink_tracker"),
    ("sink_head_interval", "the interval only", _interval_only, "return four things, (counts, mean, low, high)"),
    ("sink_head_interval", "a bool per seed", _counts_as_bools, "counts[0]: expected a number, got a bool"),
    ("sink_head_interval", "threshold 0.5", _threshold_half, "models[0] has 2 sink heads, yours counts 1"),
    ("sink_head_interval", "two seeds refused", _refuses_two_seeds, "your function raised ValueError: one seed"),
    ("sink_head_interval", "one count for all seeds", _one_count_for_all, "counts: one number per model"),
    ("bos_noop_test", "query head indexes hook_v", _noop_query_head_as_value_head, "value head"),
    ("bos_noop_test", "the verdict only", lambda *a: l4._bos_noop_test(*a)[0], "return two things, (is_noop, change)"),
    ("bos_noop_test", "the verdict as a word", lambda *a: ("no-op", 0.0), "is_noop: True or False"),
    ("bos_noop_test", "every head a no-op", lambda *a: (True, 0.0), "how much a head attends says nothing"),
    ("bos_noop_test", "no head a no-op", lambda *a: (False, 1.0), "5 no-op head(s) judged used and 0 used head(s)"),
    ("bos_noop_test", "the value-norm proxy, written out", _noop_by_value_norm, "a small value at <bos> is a proxy"),
    ("locate_massive", "values only", lambda c, n: l4._locate_massive(c, n)[0], "2 outputs"),
    ("locate_massive", "dimension off by one",
     lambda c, n: (l4._locate_massive(c, n)[0], l4._locate_massive(c, n)[1] + torch.tensor([0, 0, 1])), None),
    ("bos_share_by_part", "parts and heads swapped", lambda c, L, n: l4._bos_share_by_part(c, L, n).transpose(1, 2),
     "expected shape"),
    ("bos_share_by_part", "the last layer only", lambda c, L, n: l4._bos_share_by_part(c, L, n)[-1], "expected shape"),
    ("bos_share_by_part", "copy part off by 1%", lambda c, L, n: l4._bos_share_by_part(c, L, n) * torch.tensor(
        [1.0, 1.0, 1.01])[:, None], "max |difference|"),
    ("gate_by_phase", "a filter that drops the gate",
     lambda m, t, L, n: m.run_with_cache(t, names_filter=lambda x: "pattern" in x)[1][f"blocks.{L}.attn.hook_gate"],
     "names_filter"),
    ("gate_by_phase", "the next layer", lambda m, t, L, n: l5._gate_by_phase(m, t, (L + 1) % m.cfg.n_layers, n),
     "gate_by_phase, case"),
    ("first_rest_ratio", "ratio only", lambda p, s=0: l5._first_rest_ratio(p, s)[0], "return four things"),
    ("first_rest_ratio", "the interval without a verdict", lambda p, s=0: l5._first_rest_ratio(p, s)[:3],
     "return four things, (ratio, low, high, gated_more)"),
    ("first_rest_ratio", "the verdict as a word", lambda p, s=0: (*l5._first_rest_ratio(p, s)[:3], "yes"),
     "gated_more: True or False"),
    ("first_rest_ratio", "always gated more", lambda p, s=0: (*l5._first_rest_ratio(p, s)[:3], True),
     "a ratio below 1 in one sample is not yet evidence"),
    ("first_rest_ratio", "a correct bootstrap of its own", _own_bootstrap, "draw them through bootstrap_ci"),
    ("gate_override", "one pair, not a list", _override_one_pair, "list of (hook name, hook function) pairs"),
    ("gate_override", "ov.force_layer / ov.close_head", _overrides_by_module, "calls overrides.close_head"),
    ("gate_override", "close_head imported by name", _close_head_by_name, "calls overrides.close_head"),
    ("gate_override", "overrides.Edit as the hook", _edit_as_the_hook, "calls overrides.Edit"),
    ("forbid_bos", "None as a head index", _forbid_with_none_as_head, None),
    ("forbid_bos", "one pair, not a list", lambda m, L, h=None: checks.reference_forbid_bos(m, L, h)[0],
     "list of (hook name, hook function) pairs"),
    ("forbid_bos", "minigate.overrides.forbid_bos", _forbid_bos_by_module, "calls overrides.forbid_bos"),
    ("forbid_bos", "forbid_bos imported by name, then shadowed", _forbid_bos_shadowed(), "calls overrides.forbid_bos"),
    ("predict_bos_cost", "a tensor of three", lambda: torch.tensor([4.0, 0.5, 0.5]), "a list does not say"),
    ("predict_bos_cost", "a sentence", lambda: "the gated models pay less", "return a dict"),
    ("predict_bos_cost", "bools", lambda: {"baseline": 4.0, "headwise": True, "elementwise": False},
     "'headwise' is a bool"),
    ("predict_bos_cost", "the code models too",
     lambda: {"baseline": 4.0, "headwise": 0.5, "elementwise": 0.5, "code-baseline": 0.1}, "nothing else"),
    ("predict_bos_cost", "one ratio for the gated models", lambda: {"gated / baseline": 0.1}, "has no 'baseline'"),
    ("first_token_excess", "from token 0, with the package's uniform share",
     lambda p: p[..., 0, :].mean((0, 2)) - uniform_first_token_share(p.shape[-2]), "*to* key 0"),
    ("first_token_excess", "1/i from query 0: infinite",
     lambda p: p[..., 0].mean((0, 2)) - (1 / torch.arange(p.shape[-2])).mean(), "your output is infinite"),
    ("first_token_excess", "1/i in a Python loop from query 0",
     lambda p: p[..., 0].mean((0, 2)) - sum(1 / i for i in range(p.shape[-2])) / p.shape[-2], "1/(0 + 1) = 1"),
    ("first_token_excess", "(head, query): not averaged over queries",
     lambda p: p[..., 0].mean(0) - uniform_first_token_share(p.shape[-2]), "expected shape"),
    ("prediction_spread", "per position, not averaged",
     lambda x: (lambda lp: (lp.exp() * (lp - lp.exp().mean((0, 1)).log())).sum(-1))(x.log_softmax(-1)),
     "expected a single number"),
    ("prediction_spread", ".item() before averaging",
     lambda x: (lambda lp: (lp.exp() * (lp - lp.exp().mean((0, 1)).log())).sum(-1).item())(x.log_softmax(-1)),
     "average down to a single number"),
    ("prediction_spread", "softmax without dim", lambda x: ref["prediction_spread"](x.softmax().log()), "dim=-1"),
    ("prediction_spread", "entropy of the mean prediction only",
     lambda x: -torch.special.xlogy(p := x.softmax(-1).mean((0, 1)), p).sum().item(), "max |difference|"),
    ("prediction_spread", "reversed and in bits", lambda x: l8._prediction_spread(x, reverse=True, log=math.log2),
     "max |difference|"),
    ("has_gate", "smaller M-Act", l8._by_m_act, "judged gated, the baseline too"),
    ("has_gate", "a fit of each position's own input", lambda s: l8._by_share(s, mix="none"),
     "judged gated, the baseline too"),
    ("has_gate", "every model gated", lambda s: True, "judged gated, the baseline too"),
    ("has_gate", "no model gated", lambda s: False, "2 gated model(s) judged ungated and 0 ungated model(s)"),
    ("has_gate", "a share per snapshot, not a verdict", lambda s: torch.tensor([0.1, 0.2]), "one bool per snapshot"),
]
TYPICAL_MISTAKES = [(name, label, wrong, hint) for name, mistakes in checks.MISTAKES.items()
                    for label, wrong, hint in mistakes]  # each check's own, each with its targeted hint
MUTATIONS = TYPICAL_MISTAKES + OTHER_WRONG_ANSWERS
SLOW_CHECKS = ("has_gate",)  # about a second a case (it measures its models each time): make test-fast leaves them out


def _cases(table):
    """The table's rows as parameters named "exercise: label", those of SLOW_CHECKS marked slow."""
    return [pytest.param(*m, id=f"{m[0]}: {m[1]}", marks=pytest.mark.slow if m[0] in SLOW_CHECKS else ())
            for m in table]


def test_the_table_has_five_wrong_answers_per_exercise():
    counts = {name: sum(m[0] == name for m in MUTATIONS) for name in checks.EXERCISES}
    assert all(n >= 5 for n in counts.values()), counts
    assert {m[0] for m in MUTATIONS} == set(checks.EXERCISES)
    assert set(checks.MISTAKES) == set(checks.EXERCISES)  # every check has typical mistakes of its own
    labels = [(m[0], m[1]) for m in MUTATIONS]
    assert len(labels) == len(set(labels)), "two wrong answers of one exercise share a label"


def _fails_in_one_line(name, wrong, capsys) -> str:
    with pytest.raises(AssertionError) as info:  # an AssertionError: nothing else escapes the check
        getattr(checks, name)(wrong)
    out = capsys.readouterr().out
    assert out.startswith(f"✗ {name}, case ") and out.count("\n") == 1, out
    assert str(info.value) in out
    return out


@pytest.mark.parametrize("name, label, wrong, hint", _cases(TYPICAL_MISTAKES))
def test_every_typical_mistake_fails_with_its_own_hint(name, label, wrong, hint, capsys):
    """A learner's function that makes the mistake fails its check with that mistake's hint, nothing else."""
    out = _fails_in_one_line(name, wrong, capsys)
    assert out.endswith(f": {hint}\n"), out


@pytest.mark.parametrize("name, label, wrong, hint", _cases(OTHER_WRONG_ANSWERS))
def test_every_other_wrong_answer_fails_with_its_hint(name, label, wrong, hint, capsys):
    out = _fails_in_one_line(name, wrong, capsys)
    if hint is not None:
        assert hint in out, out


@pytest.mark.parametrize("name", checks.EXERCISES)
def test_the_reference_passes(name, capsys):
    assert getattr(checks, name)(ref[name]) is ref[name]
    assert checks.PASSED_RE.fullmatch(capsys.readouterr().out.strip())


# correct answers written otherwise than the reference: each must pass
OTHER_RIGHT_ANSWERS = [
    ("sink_head_interval", "the package's count and t from the closed-form CDF", _interval_by_series),
    ("sink_head_interval", "tensors for counts and numbers", _interval_as_tensors),
]


@pytest.mark.parametrize("name, label, right", OTHER_RIGHT_ANSWERS,
                         ids=[f"{m[0]}: {m[1]}" for m in OTHER_RIGHT_ANSWERS])
def test_a_correct_answer_written_otherwise_passes(name, label, right, capsys):
    assert getattr(checks, name)(right) is right
    assert checks.PASSED_RE.fullmatch(capsys.readouterr().out.strip())


def test_the_closed_form_t_agrees_with_t_quantile():
    for df in (1, 2, 3, 4, 9):
        for p in (0.95, 0.975, 0.995):
            assert _t_by_series(p, df) == pytest.approx(t_quantile(p, df), rel=1e-9)


@pytest.mark.parametrize("name", checks.EXERCISES)
def test_a_function_that_forgets_return_gets_a_hint(name, capsys):
    with pytest.raises(AssertionError, match="returned None: did you forget `return`"):
        getattr(checks, name)(lambda *args, **kwargs: None)


@pytest.mark.parametrize("name", checks.EXERCISES)
def test_a_wrong_type_gets_a_hint(name, capsys):
    with pytest.raises(AssertionError, match=r"✗ .*(expected|return|got|list of)"):
        getattr(checks, name)(lambda *args, **kwargs: "a string")


@pytest.mark.parametrize("name", checks.EXERCISES)
def test_the_learners_exception_is_a_failed_case_that_names_it(name, capsys):
    def broken(*args, **kwargs):
        raise ValueError("something deep inside\nthe learner's last line")

    with pytest.raises(AssertionError) as info:
        getattr(checks, name)(broken)
    message = str(info.value)
    assert f"✗ {name}, case " in message and "your function raised ValueError: the learner's last line" in message
    assert "(inputs: " in message
    assert isinstance(info.value.__cause__, ValueError)  # chained: the learner's traceback stays available


def test_the_inputs_are_described_by_shape():
    with pytest.raises(AssertionError, match=r"inputs: q \(2, 4, 6, 8\), k \(2, 2, 6, 8\), v \(2, 2, 6, 8\)"):
        checks.causal_attention(_gqa_not_repeated)


def _stub(*args, **kwargs):
    raise NotImplementedError()


@pytest.mark.parametrize("name", checks.EXERCISES)
def test_a_stub_falls_back_by_default_and_fails_in_grading_mode(name, capsys, monkeypatch):
    assert getattr(checks, name)(_stub) is ref[name]
    assert capsys.readouterr().out == checks.not_implemented_notice(name) + "\n"
    checks.grading(True)
    with pytest.raises(AssertionError, match=f"✗ {name}: not attempted"):
        getattr(checks, name)(_stub)
    checks.grading(None)
    monkeypatch.setenv(checks.GRADING_ENV, "1")
    with pytest.raises(AssertionError, match="not attempted") as info:
        getattr(checks, name)(_stub)
    assert checks.NOT_ATTEMPTED_RE.search(str(info.value))


def test_grading_switch(monkeypatch):
    assert checks.grading() is False
    monkeypatch.setenv(checks.GRADING_ENV, "1")
    assert checks.grading() is True
    assert checks.grading(False) is False and checks.grading() is False  # overrides the environment
    assert checks.grading(None) is True
    monkeypatch.setenv(checks.GRADING_ENV, "0")
    assert checks.grading() is False


@pytest.mark.parametrize("run", ["autograde", "validate"])
def test_grading_is_on_by_default_under_nbgrader(run, monkeypatch):
    """nbgrader sets NBGRADER_EXECUTION in the notebooks it runs: no setting makes a blank lesson pass there."""
    monkeypatch.setenv("NBGRADER_EXECUTION", run)
    assert checks.grading() is True
    monkeypatch.setenv(checks.GRADING_ENV, "0")  # an explicit MINIGATE_GRADING still decides
    assert checks.grading() is False


def test_grading_mode_still_passes_solutions(capsys):
    checks.grading(True)
    assert checks.g1_gate(checks.reference_g1_gate) is checks.reference_g1_gate


# ── the generic hint: the first output outside the tolerance, its largest error, and where ───────────

def test_generic_hint_reports_the_true_largest_error_and_its_step():
    want = torch.linspace(0, 1, 100, dtype=torch.float64)
    got = want.clone()
    got[30] += 0.01  # the first element off ...
    got[80] -= 0.05  # ... and the largest error, which the hint reports
    hint = engine._generic_hint(engine.as_tree(got), engine.as_tree(want), (1e-12, 1e-6), lambda i: f"step {i[0] + 1}")
    assert hint.startswith("max |difference| = 0.05 at step 81 (yours is lower);"), hint


def test_generic_hint_skips_differences_within_the_tolerance():
    want = (torch.ones(3), torch.ones(2, 2))
    got = (torch.ones(3) + 1e-9, torch.tensor([[1.0, 1.0], [1.0, 1.5]]))
    assert engine._generic_hint(got, want, (1e-5, 1e-4)).startswith("output 1: max |difference| = 0.5 at index [1, 1]")


def test_generic_hint_ignores_nans_where_they_are_expected():
    want = torch.tensor([float("nan"), 1.0, 2.0])
    assert "= 1 at index [2]" in engine._generic_hint(torch.tensor([float("nan"), 1.0, 3.0]), want, (1e-5, 1e-4))


def test_generic_hint_names_nans():
    hint = engine._generic_hint(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0]), (1e-5, 1e-4))
    assert "NaNs at index [1]" in hint


def test_locate_massive_blames_the_wrong_output(capsys):
    wrong = lambda c, n: (l4._locate_massive(c, n)[0] + 1, l4._locate_massive(c, n)[1])
    with pytest.raises(AssertionError, match="output 0: max |difference|"):
        checks.locate_massive(wrong)


def test_prediction_spread_reference_is_the_mean_kl_to_the_mean_prediction():
    """The entropy form of the reference agrees with the direct KL, and with F.kl_div over (batch * pos, vocab)."""
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0)) * 2
    log_p = logits.double().log_softmax(-1).flatten(0, 1)
    log_mean = log_p.exp().mean(0, keepdim=True).log().expand_as(log_p)
    kl_div = torch.nn.functional.kl_div(log_mean, log_p, reduction="batchmean", log_target=True).item()
    assert checks.reference_prediction_spread(logits) == pytest.approx(kl_div, rel=1e-9)
    assert l8._prediction_spread(logits) == pytest.approx(kl_div, rel=1e-9)


@pytest.mark.slow
def test_checks_do_not_import_the_benchmarks():
    import subprocess
    import sys

    code = "import sys, minigate.course.checks; assert not any(m.startswith('minigate.bench') for m in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
