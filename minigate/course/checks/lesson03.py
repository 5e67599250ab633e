"""Lesson 03's checks: a train() callback that tracks the largest head's attention on <bos> during training, and the
sink-head count of models trained over several seeds with a t interval on its mean."""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Callable
from functools import partial

import torch

from .engine import NONE_HINT, Mismatch, Mistake, check, is_number, what

EXERCISES = ("bos_tracker", "sink_head_interval")  # its check cells, in the lesson's order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried

# ── a callback that watches the sink form ───────────────────────────────────────────────────────────

KEYS = ("max_head", "layer", "head")  # what the callback returns, in the order the check compares them


def reference_bos_tracker(tokens):
    """tokens (batch, pos), <bos> first -> a train() callback(step, model, history) -> {"max_head": float,
    "layer": int, "head": int}: the largest share of attention any one head puts on <bos> (key 0), each head's share
    averaged over the prompts and every query position (query 0 included), and that head's layer and index: the
    package's attention_sink(model, tokens).share.max(), the max_head that analysis.sink_tracker records."""
    return _bos_tracker(tokens)


def _bos_tracker(tokens, to_key=True, reduce="mean", first_query=0, swap=False, layers="all"):
    """The reference with switches for the typical mistakes."""
    def callback(step, model, history):
        n_layers = model.cfg.n_layers
        names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(n_layers)]
        names = names[-1:] if layers == "last" else names
        _, cache = model.run_with_cache(tokens.to(model.device), names_filter=lambda name: name in names)
        shares = []
        for name in names:
            p = cache[name].double()  # (batch, head, query, key)
            a = p[..., first_query:, 0] if to_key else p[..., 0, :]  # (batch, head, query) or (batch, head, key)
            if reduce == "mean":
                shares.append(a.mean((0, 2)))
            elif reduce == "max over prompts":  # each prompt's share, then the largest prompt
                shares.append(a.mean(2).amax(0))
            else:  # "max": the largest single weight, query 0's 1.0
                shares.append(a.amax((0, 2)))
        share = torch.stack(shares)  # (layer, head)
        layer, head = divmod(int(share.argmax()), share.shape[1])
        layer += n_layers - len(names)
        if swap:
            layer, head = head, layer
        return {"max_head": share.max().item(), "layer": layer, "head": head}
    return callback


def _tracked(make_callback):
    """make_callback(tokens) -> callback  ==>  fn(model, tokens) -> (max_head, layer, head), float64, what the
    callback returns when train() calls it (eval mode, no gradients). A Mismatch when it cannot be read."""
    def run(model, tokens):
        from ...checkpoint import History

        callback = make_callback(tokens)
        if callback is None:
            raise Mismatch(f"bos_tracker: {NONE_HINT} (it returns the callback function it defines)")
        if not callable(callback):
            raise Mismatch(f"bos_tracker(tokens) must return the callback, a function of (step, model, history); "
                           f"got {what(callback)}")
        with torch.no_grad():
            out = callback(100, model.eval(), History())
        if out is None:
            raise Mismatch(f"the callback: {NONE_HINT} (it returns a dict of numbers for history.metrics)")
        if not isinstance(out, dict):
            raise Mismatch(f"a train() callback returns a dict of numbers, {{'max_head': ..., 'layer': ..., "
                           f"'head': ...}}; got {what(out)}")
        missing = [k for k in KEYS if k not in out]
        if missing:
            raise Mismatch(f"the callback's dict has no key {missing[0]!r}: return {{'max_head': ..., 'layer': ..., "
                           f"'head': ...}}")
        for k in KEYS:
            v = out[k]
            if isinstance(v, torch.Tensor):
                raise Mismatch(f"{k!r} is {what(v)}: return plain Python numbers (.item(), int(...)); train() keeps "
                               "them in history.metrics, which history.json stores as JSON")
            if k != "max_head" and not (isinstance(v, numbers.Integral) and not isinstance(v, bool)):
                raise Mismatch(f"{k!r} is an index: expected an int, got {what(v)}")
            if not is_number(v):
                raise Mismatch(f"expected a number for {k!r}, got {what(v)}")
        return torch.tensor([float(out[k]) for k in KEYS], dtype=torch.float64)
    return run


def _tracker_model(seed: int, gate: str = "none", n_layers: int = 3, n_heads: int = 4, n_kv_heads: int = 2):
    """A small seeded model with weights large enough that its heads' attention on <bos> differs from head to head."""
    from ... import ModelConfig, Transformer

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                      head_dim=8, d_ff=48, gate=gate)
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return model


def _tokens(seed: int, batch: int, pos: int) -> torch.Tensor:
    tokens = torch.randint(1, 50, (batch, pos), generator=torch.Generator().manual_seed(seed))
    tokens[:, 0] = 0  # <bos>
    return tokens


MISTAKES["bos_tracker"] = [
    ("from <bos>", partial(_bos_tracker, to_key=False),
     "that is the attention *from* <bos> (query 0's row, pattern[..., 0, :]); the sink is the attention *to* "
     "key 0: pattern[..., 0], the last axis"),
    ("max over everything", partial(_bos_tracker, reduce="max"),
     "a head's share is its *mean* weight on <bos> over the prompts and queries: the largest single weight is "
     "always 1.0 (query 0 can only attend to <bos>); take the largest over (layer, head) only"),
    ("max over prompts", partial(_bos_tracker, reduce="max over prompts"),
     "average each head's share over the prompts too (mean over batch and queries, pattern[..., 0].mean((0, 2))); "
     "the largest is taken over (layer, head) only"),
    ("query 0 left out", partial(_bos_tracker, first_query=1),
     "average over every query position, query 0 included, as attention_sink does for the recorded "
     "max_head (pattern[..., 0], not pattern[..., 1:, 0])"),
    ("layer and head swapped", partial(_bos_tracker, swap=True),
     "layer and head are swapped: with the shares stacked as (layer, head), divmod(flat index, n_heads) gives "
     "(layer, head)"),
    ("last layer only", partial(_bos_tracker, layers="last"),
     "look at every layer's pattern, blocks.{L}.attn.hook_pattern for L in range(model.cfg.n_layers): the "
     "largest head can sit in any layer"),
]


def _tracker_hint(name: str, what: str) -> str:
    return (f"your tracker calls analysis.{name}: the exercise asks for the steps themselves (run_with_cache on every "
            "blocks.{L}.attn.hook_pattern, each head's mean attention on key 0, the largest head); " + what)


def _refused_measures() -> dict[Callable, str]:
    """The library's one-call answers to bos_tracker: its tracker and the measures that hold max_head and its head."""
    from ... import analysis

    return {analysis.sink_tracker: _tracker_hint("sink_tracker", "sink_tracker is the package's own tracker"),
            analysis.published_measures: _tracker_hint("published_measures", "its max_head is what the package's "
                                                       "tracker records"),
            analysis.attention_sink: _tracker_hint("attention_sink", "attention_sink is what the copy-task cell "
                                                   "compares your tracker with")}


def bos_tracker(fn: Callable) -> Callable:
    """fn(tokens) -> a train() callback (step, model, history) -> {"max_head", "layer", "head"}; checked by calling
    the callback on tiny models as train() does; see reference_bos_tracker. An answer that calls the package's
    measures (sink_tracker, published_measures, attention_sink) fails with its hint: the lesson asks for the steps."""
    cases = [("tiny baseline, 3 layers x 4 heads (2 value heads)", (_tracker_model(0), _tokens(0, 3, 10))),
             ("tiny gated model, 2 layers x 3 heads", (_tracker_model(1, "G1", 2, 3, 3), _tokens(1, 2, 12))),
             ("tiny baseline, 4 layers x 2 heads", (_tracker_model(3, n_layers=4, n_heads=2, n_kv_heads=1),
                                                    _tokens(2, 4, 8)))]
    raises = [(r"KeyError", "names_filter decides what the cache keeps: let through blocks.{L}.attn.hook_pattern "
                            "for every layer L, e.g. names_filter=lambda name: name.endswith('attn.hook_pattern')")]
    return check("bos_tracker", fn, reference_bos_tracker, cases, MISTAKES["bos_tracker"], atol=1e-6, rtol=1e-5,
                 raises=raises, wrap=_tracked, index_label=lambda idx: repr(KEYS[idx[0]]), refuse=_refused_measures())


# ── sink heads over seeds, with a t interval ──────────────────────────────────────────────────────────

ONE_SEED = "one seed gives no interval: train more seeds"
ONE_SEED_HINT = ("with one model s has no n - 1 to divide by and t no degrees of freedom: check len(models) < 2 first "
                 f"and raise ValueError({ONE_SEED!r})")


def reference_sink_head_interval(models, rows, level=0.95):
    """models: one trained model per seed; rows (batch, pos), <bos> first -> (counts, mean, low, high): counts[i] the
    number of sink heads of models[i], the heads of every layer whose attention on key 0, averaged over the rows and
    every query (query 0 included), exceeds SINK_THRESHOLD (0.3; Gu et al.): what attention_sink(model,
    rows).n_sink_heads counts; and the t interval of their mean, mean ± t_quantile((1 + level) / 2, n - 1) · s /
    sqrt(n), s the standard deviation with n - 1 in its denominator. Fewer than 2 models: ValueError(ONE_SEED)."""
    return _sink_head_interval(models, rows, level)


def _sink_head_interval(models, rows, level=0.95, count="per head", to_key=True, layers="all", quantile="t",
                        spread="standard error", refuse_one=True):
    """The reference with switches for the typical mistakes."""
    from ...analysis import SINK_THRESHOLD
    from ...stats import t_quantile

    counts = []
    for model in models:
        names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
        names = {"all": names, "first": names[:1], "last": names[-1:]}[layers]
        with torch.no_grad():
            _, cache = model.run_with_cache(rows.to(model.device), names_filter=names)
        p = torch.stack([cache[name].double() for name in names])  # (layer, batch, head, query, key)
        share = (p[..., 0] if to_key else p[..., 0, :]).mean((1, 3))  # (layer, head)
        if count == "per head":
            counts.append(int((share > SINK_THRESHOLD).sum()))
        elif count == "mean over heads":  # F-Attn > 0.3: 0 or 1
            counts.append(int(share.mean() > SINK_THRESHOLD))
        else:  # "share of heads": the sink rate
            counts.append((share > SINK_THRESHOLD).double().mean().item())
    n = len(counts)
    if n < 2 and refuse_one:
        raise ValueError(ONE_SEED)
    x = torch.tensor(counts, dtype=torch.float64)
    mean = x.mean().item()
    s = x.std(correction=0 if spread == "s with n" else 1).item() if n > 1 else math.nan
    p_level = {"t": (1 + level) / 2, "one-sided": level, "level ignored": 0.975, "df n": (1 + level) / 2}.get(quantile)
    if quantile == "z":
        factor = torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor((1 + level) / 2, dtype=torch.float64)).item()
    else:
        factor = t_quantile(p_level, n if quantile == "df n" else n - 1)
    half = factor * s / (1 if spread == "standard deviation" else math.sqrt(n))
    return counts, mean, mean - half, mean + half


def _refused(fn: Callable, e: BaseException) -> bool:
    """A ValueError the function raised itself (in its own body) or whose message names the seeds: the refusal of one
    seed, not a library's error (t_quantile with df = 0, statistics.stdev of one number) let through by accident."""
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    own = tb.tb_frame.f_code is getattr(inspect.unwrap(fn), "__code__", None)
    return isinstance(e, ValueError) and (own or "seed" in str(e).lower())


def _interval_read(fn: Callable) -> Callable:
    """fn(models, rows, level) -> (counts, mean, low, high)  ==>  a float64 tensor (mean, low, high, *counts); for one
    model, (1.0,) when fn refuses it with a ValueError. A Mismatch when the output cannot be read or one seed passes."""
    def run(models, rows, level):
        if len(models) < 2:
            try:
                fn(models, rows, level)
            except NotImplementedError:
                raise
            except Exception as e:
                if _refused(fn, e):
                    return torch.ones(1, dtype=torch.float64)
                raise Mismatch(ONE_SEED_HINT) from e
            raise Mismatch(ONE_SEED_HINT)
        out = fn(models, rows, level)
        if out is None:
            raise Mismatch(NONE_HINT)
        if not isinstance(out, (tuple, list)) or len(out) != 4:
            raise Mismatch(f"return four things, (counts, mean, low, high); got {what(out)}")
        counts, *interval = out
        if isinstance(counts, torch.Tensor) and counts.dim() == 1:
            counts = counts.tolist()
        if not isinstance(counts, (tuple, list)) or len(counts) != len(models):
            raise Mismatch(f"counts: one number per model, a list of {len(models)} here; got {what(counts)}")
        values = []
        for name, v in [*zip(("mean", "low", "high"), interval, strict=True),
                        *((f"counts[{i}]", c) for i, c in enumerate(counts))]:
            if isinstance(v, torch.Tensor) and v.numel() == 1:
                v = v.item()
            if not is_number(v):
                raise Mismatch(f"{name}: expected a number, got {what(v)}")
            values.append(float(v))
        return torch.tensor(values, dtype=torch.float64)
    return run


def _explain_counts(got, want) -> str | None:
    """The first model whose count is wrong (got and want: (mean, low, high, *counts)); None when the counts agree."""
    if not isinstance(got, torch.Tensor) or got.shape != want.shape or got.numel() < 4:
        return None
    wrong = (got[3:] != want[3:]).nonzero()
    if len(wrong) == 0:
        return None
    i = int(wrong[0, 0])
    return (f"models[{i}] has {want[3 + i].item():.0f} sink heads, yours counts {got[3 + i].item():g}: print its "
            "heads' shares, (layer, head), and compare each with SINK_THRESHOLD")


def _sink_model(kinds: list[str], gate: str = "none", n_kv_heads: int | None = None, seed: int = 0):
    """A tiny model whose heads' attention on <bos> is set by a hook on its scores: kinds[layer][head] is "S" (a
    strong sink, about 0.99 of the attention on key 0 over 12 positions), "m" (a mild one, 0.42), "u" (uniform
    attention over the past, 0.26) or "q" (quiet: query 0 alone, 1/T); every other past key scores 0."""
    from ... import ModelConfig, Transformer

    n_heads = len(kinds[0])
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=len(kinds), n_heads=n_heads,
                      n_kv_heads=n_kv_heads or n_heads, head_dim=8, d_ff=48, gate=gate)
    model = Transformer(cfg).eval()
    for layer, heads in enumerate(kinds):
        bias = torch.tensor([{"S": 6.0, "m": 1.0, "u": 0.0, "q": -6.0}[k] for k in heads])

        def set_scores(scores, hook, bias=bias):  # (batch, head, query, key): 0 on past keys, bias on key 0
            new = torch.zeros_like(scores).masked_fill(scores.isinf(), float("-inf"))
            new[..., 0] = bias.to(scores)[:, None]
            return new

        model.blocks[layer].attn.hook_attn_scores.add_hook(set_scores)  # stays on: every forward takes it
    return model


def _rows(seed: int, batch: int = 3, pos: int = 12) -> torch.Tensor:
    return _tokens(seed, batch, pos)


SINK_CASES = [  # (label, kinds of each model, model options, level): counts 2, 3, 7 / 1, 2, 0, 5 / 0, 3 / 1
    ("3 seeds, 2 layers x 4 heads, level 0.95",
     [["Sqqq", "mqqq"], ["uSqm", "qqSu"], ["SSmS", "SmSq"]], {}, 0.95),
    ("4 seeds, gated, 3 layers x 2 heads (1 key-value head), level 0.9",
     [["qq", "Sq", "qq"], ["mq", "qq", "qm"], ["qq", "qu", "qq"], ["SS", "Sm", "uS"]],
     {"gate": "G1", "n_kv_heads": 1}, 0.9),
    ("2 seeds, 2 layers x 3 heads, level 0.99", [["uqq", "quq"], ["mqS", "Suq"]], {}, 0.99),
    ("1 seed", [["Sqq", "qqq"]], {}, 0.95),  # refused
]


MISTAKES["sink_head_interval"] = [
    ("threshold on the mean over heads", partial(_sink_head_interval, count="mean over heads"),
     "you compared the mean over heads (F-Attn) with 0.3, which gives 0 or 1; the threshold is each head's: "
     "count the (layer, head) pairs whose own share exceeds 0.3, int((share > 0.3).sum())"),
    ("the share of heads", partial(_sink_head_interval, count="share of heads"),
     "that is the share of heads above 0.3 (the sink rate); count them: int((share > 0.3).sum())"),
    ("from <bos>", partial(_sink_head_interval, to_key=False),
     "that is the attention *from* <bos> (query 0's row, pattern[..., 0, :]); a sink head's attention goes *to* "
     "key 0: pattern[..., 0], averaged over the rows and every query"),
    ("layer 0 only", partial(_sink_head_interval, layers="first"),
     "you counted layer 0's heads only: a sink head can sit in any layer, so count over every "
     "blocks.{L}.attn.hook_pattern, L in range(model.cfg.n_layers)"),
    ("last layer only", partial(_sink_head_interval, layers="last"),
     "you counted the last layer's heads only (a variable overwritten in the loop over layers?): add up the sink "
     "heads of every layer"),
    ("z, not t", partial(_sink_head_interval, quantile="z"),
     "that is the normal quantile (1.96 at 95%): with a few seeds the interval takes Student's t, "
     "t_quantile((1 + level) / 2, n - 1) (4.30 for 3 seeds)"),
    ("one-sided quantile", partial(_sink_head_interval, quantile="one-sided"),
     "a two-sided interval leaves (1 - level) / 2 in each tail: t_quantile((1 + level) / 2, n - 1), not "
     "t_quantile(level, n - 1)"),
    ("level ignored", partial(_sink_head_interval, quantile="level ignored"),
     "your interval is the 95% one at every level: use the level argument, t_quantile((1 + level) / 2, n - 1)"),
    ("t with n degrees of freedom", partial(_sink_head_interval, quantile="df n"),
     "the mean's t has n - 1 degrees of freedom (one spent on the mean): t_quantile((1 + level) / 2, n - 1)"),
    ("standard deviation, not standard error", partial(_sink_head_interval, spread="standard deviation"),
     "that interval is ± t · s, the spread of single seeds; the mean's is ± t · s / sqrt(n), its standard error"),
    ("s with n", partial(_sink_head_interval, spread="s with n"),
     "s divides by n - 1, not n: torch.std's default (correction=1), not torch.std(..., correction=0) or "
     "numpy's np.std default"),
    ("one seed accepted", partial(_sink_head_interval, refuse_one=False), ONE_SEED_HINT),
]


def sink_head_interval(fn: Callable) -> Callable:
    """fn(models, rows, level) -> (counts, mean, low, high); checked on tiny models whose heads' attention on <bos>
    a hook sets (none of them near the threshold), and on one model, which it must refuse; see
    reference_sink_head_interval."""
    cases = [(label, ([_sink_model(k, seed=i, **options) for i, k in enumerate(kinds)], _rows(j), level))
             for j, (label, kinds, options, level) in enumerate(SINK_CASES)]
    raises = [(r"KeyError", "names_filter decides what the cache keeps: let through blocks.{L}.attn.hook_pattern "
                            "for every layer L, e.g. names_filter=lambda name: name.endswith('attn.hook_pattern')")]
    labels = ("the mean", "low", "high")
    return check("sink_head_interval", fn, reference_sink_head_interval, cases, MISTAKES["sink_head_interval"],
                 atol=1e-6, rtol=1e-6, raises=raises, wrap=_interval_read, explain=_explain_counts,
                 index_label=lambda idx: labels[idx[0]] if idx[0] < 3 else f"the count of models[{idx[0] - 3}]")
