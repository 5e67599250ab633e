"""Lesson 06's checks: a gate-override hook, a prediction of what forbidding `<bos>` costs (well-formed, in nats), and
a hook that forbids attention to `<bos>`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import math
import numbers

import torch

from .engine import NONE_HINT, Mismatch, Mistake, check, what
from .lesson05 import _gated_model

EXERCISES = ("gate_override", "predict_bos_cost", "forbid_bos")  # its check cells, in the lesson's order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried


def reference_gate_override(model, layer, value, head=None):
    """fwd_hooks [(hook name, fn)] that set the gate scores of layer `layer` (of its head `head` only, if given)
    to `value`: the overrides of minigate.overrides.force_layer and close_head, written as the hook itself
    (tests/test_lesson_06.py checks it against them), so that the check can refuse an answer that calls them."""
    return _gate_override(model, layer, value, head)


def _gate_override(model, layer, value, head=None, index="head axis", every_layer=False, returns=True,
                   point="hook_gate", whole_layer=False):
    """A gate override with switches for the typical mistakes."""
    def hook(gate, hook):
        new = gate.clone()
        if head is None or whole_layer:
            new[...] = value
        elif index == "head axis":
            new[:, :, head] = value
        elif index == "last axis":  # right for (batch, pos, head), wrong for (batch, pos, head, d_head)
            new[..., head] = value
        else:  # "second axis": a position
            new[:, head] = value
        return new if returns else None

    name = (lambda n: n.endswith(f"attn.{point}")) if every_layer else f"blocks.{layer}.attn.{point}"
    return [(name, hook)]


def _hooked_logits(model, tokens, hooks, point: str, like: str = ""):
    """The logits of `model` on `tokens` under the learner's `hooks`, or a Mismatch that says why they cannot run."""
    if hooks is None:
        raise Mismatch(NONE_HINT)
    if not isinstance(hooks, (list, tuple)) or not all(isinstance(p, tuple) and len(p) == 2 for p in hooks):
        raise Mismatch(f"return a list of (hook name, hook function) pairs, e.g. [('blocks.0.attn.{point}', "
                       f"fn)]{like}; got {what(hooks)}")
    with torch.no_grad():
        return model.run_with_hooks(tokens, fwd_hooks=hooks)


def _logits_under(make_hooks):
    """make_hooks(model, layer, value, head) -> fwd_hooks  ==>  fn(model, tokens, layer, value, head) -> logits."""
    def run(model, tokens, layer, value, head):
        return _hooked_logits(model, tokens, make_hooks(model, layer, value, head), "hook_gate",
                              ", as overrides.close_head does")
    return run


MISTAKES["gate_override"] = [
    ("last axis", partial(_gate_override, index="last axis"),
     "gate[..., head] indexes the last axis: that is the head for a headwise gate (batch, pos, head) but a "
     "head *dimension* for an elementwise one (batch, pos, head, d_head); use gate[:, :, head]"),
    ("second axis", partial(_gate_override, index="second axis"),
     "gate[:, head] sets a position, not a head: gates are (batch, pos, head[, d_head])"),
    ("every layer", partial(_gate_override, every_layer=True),
     "your hook acts on every layer: hook only f'blocks.{layer}.attn.hook_gate' (or check hook.name in a filter)"),
    ("no return", partial(_gate_override, returns=False),
     "your hook leaves the model unchanged: build the new gate and `return` it (rebinding the argument inside "
     "the hook changes nothing outside it)"),
    ("logits", partial(_gate_override, point="hook_gate_logits"),
     "you set the gate *logits* (before the sigmoid): `value` is a gate score, hook 'hook_gate' "
     "(1 = open, 0 = closed)"),
    ("whole layer", partial(_gate_override, whole_layer=True),
     "you set the whole layer: with `head` given, only gate[:, :, head] changes"),
]


def _override_hint(name: str) -> str:
    return (f"your function calls overrides.{name}: the exercise asks for the hook itself, a function of (gate, hook) "
            "that returns the new gate scores, on f'blocks.{layer}.attn.hook_gate'; overrides.force_layer and "
            "close_head are what the check compares your hooks with")


def _refused_overrides() -> dict[Callable, str]:
    """The library's one-call answers to gate_override: the overrides themselves and the Edit hook they return."""
    from ... import overrides as ov

    return {f: _override_hint(name) for name, f in [("force_layer", ov.force_layer), ("close_head", ov.close_head),
                                                    ("set_gates", ov.set_gates), ("Edit", ov.Edit.apply)]}


def gate_override(fn: Callable) -> Callable:
    """fn(model, layer, value, head=None) -> fwd_hooks; checked by running tiny headwise and elementwise models
    with its hooks against overrides.force_layer / close_head, which an answer must not call itself."""
    models = {gran: _gated_model(seed, gran) for seed, gran in enumerate(["headwise", "elementwise"])}
    tokens = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(6))
    cases = [(f"{gran}, layer {layer}, " + (f"head {head}" if head is not None else "every head") + f" = {value}",
              (models[gran], tokens, layer, value, head))
             for gran, layer, value, head in [("headwise", 1, 0.0, 2), ("headwise", 0, 1.0, None),
                                              ("elementwise", 2, 0.0, 1), ("elementwise", 1, 0.25, None),
                                              ("elementwise", 0, 1.0, 3)]]
    raises = [(r"IndexError", "a headwise gate is (batch, pos, head), an elementwise one (batch, pos, head, d_head): "
                              "gate[:, :, head] picks the head in both")]
    return check("gate_override", fn, reference_gate_override, cases, MISTAKES["gate_override"], atol=1e-5,
                 rtol=1e-4, raises=raises, wrap=_logits_under, refuse=_refused_overrides())


# ── predict, then measure: what forbidding <bos> costs each copy model ────────────────────────────────────

PREDICTED_MODELS = ("baseline", "headwise", "elementwise")  # the copy models of the lesson, as it names them


def reference_predict_bos_cost():
    """The paper's story as a prediction, in nats per token, of the loss increase when <bos> is forbidden in every
    layer of each copy model: the baseline loses the sink its <bos> heads park on and pays a few nats (say 4), a gated
    model, which can close those heads instead, little (0.5). The lesson uses it until the learner writes their own;
    a prediction has no right answer, so the check only asks that it be well-formed (_read_prediction)."""
    return {"baseline": 4.0, "headwise": 0.5, "elementwise": 0.5}


LIST_HINT = ("return a dict that names each model, {'baseline': ..., 'headwise': ..., 'elementwise': ...}: a list "
             "does not say which number is which")
NAMES_HINT = ("name the models as the lesson does: 'baseline', 'headwise', 'elementwise' (not 'copy-baseline', ...)")
RATIO_HINT = ("a baseline of exactly 1 looks like ratios to the baseline: give each model's own loss increase in nats "
              "(if you do mean 1 nat for the baseline, write 1.01)")
PERPLEXITY_HINT = ("more than 100 nats per token: is that a perplexity? The cost in nats is ln(perplexity with <bos> "
                   "forbidden / learned perplexity)")
NEGATIVE_HINT = ("a negative cost says forbidding <bos> *lowers* the loss: the cost is the loss with <bos> forbidden "
                 "minus the learned loss (about 0 for a model that does not need <bos>)")


def _missing_hint(model: str) -> str:
    return f"your prediction has no '{model}': give one number of nats for each of baseline, headwise and elementwise"


def _not_a_number_hint(model: str, value) -> str:
    return (f"'{model}' is {what(value)}, not a number: write the loss increase you expect in nats (e.g. 0.5), "
            "even if you are unsure")


def _not_finite_hint(model: str, value: float) -> str:
    return f"'{model}' is {value}: give a finite number of nats"


def _read_prediction(prediction) -> torch.Tensor:
    """A learner's prediction {model: nats} -> (3,) float64 tensor in PREDICTED_MODELS' order, or a Mismatch whose
    message is the hint for what makes it ill-formed (the hints of MISTAKES["predict_bos_cost"])."""
    if prediction is None:
        raise Mismatch(NONE_HINT)
    if isinstance(prediction, (list, tuple)) or (isinstance(prediction, torch.Tensor) and prediction.dim() == 1):
        raise Mismatch(LIST_HINT)
    if not isinstance(prediction, dict):
        raise Mismatch(f"return a dict {{'baseline': nats, 'headwise': nats, 'elementwise': nats}}; got "
                       f"{what(prediction)}")
    keys = {str(k) for k in prediction}
    missing = [model for model in PREDICTED_MODELS if model not in prediction]
    if missing and any(k != missing[0] and k.split("-")[-1] == missing[0] for k in keys):  # 'copy-headwise'
        raise Mismatch(NAMES_HINT)
    if missing:
        raise Mismatch(_missing_hint(missing[0]))
    extra = sorted(keys - set(PREDICTED_MODELS))
    if extra:
        raise Mismatch(f"your prediction names {extra[0]!r}: give one number for each of baseline, headwise and "
                       "elementwise, nothing else")
    values = []
    for model in PREDICTED_MODELS:
        v = prediction[model]
        if isinstance(v, torch.Tensor) and v.numel() == 1 and not v.is_complex() and v.dtype != torch.bool:
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, numbers.Real):
            raise Mismatch(_not_a_number_hint(model, v))
        if not math.isfinite(v):
            raise Mismatch(_not_finite_hint(model, float(v)))
        values.append(float(v))
    if any(v > 100 for v in values):
        raise Mismatch(PERPLEXITY_HINT)
    if any(v < 0 for v in values):
        raise Mismatch(NEGATIVE_HINT)
    if values[0] == 1:
        raise Mismatch(RATIO_HINT)
    return torch.tensor(values, dtype=torch.float64)


def _well_formed(make_prediction):
    """make_prediction() -> {model: nats}  ==>  a function whose output is the same for every well-formed prediction
    (so any one passes) and that raises the hint of an ill-formed one."""
    def run():
        _read_prediction(make_prediction())
        return torch.zeros(())
    return run


def _prediction(values=(4.0, 0.5, 0.5), keys=PREDICTED_MODELS, drop=None, as_list=False):
    """A prediction with switches for the typical mistakes."""
    if as_list:
        return list(values)
    return {k: v for k, v in zip(keys, values, strict=True) if k != drop}


MISTAKES["predict_bos_cost"] = [
    ("a model missing", partial(_prediction, drop="elementwise"), _missing_hint("elementwise")),
    ("the lesson's full names", partial(_prediction, keys=tuple(f"copy-{k}" for k in PREDICTED_MODELS)), NAMES_HINT),
    ("a word, not a number", partial(_prediction, values=(4.0, "less", "less")),
     _not_a_number_hint("headwise", "less")),
    ("a nan", partial(_prediction, values=(4.0, float("nan"), 0.5)), _not_finite_hint("headwise", float("nan"))),
    ("ratios to the baseline", partial(_prediction, values=(1.0, 0.1, 0.1)), RATIO_HINT),
    ("perplexities", partial(_prediction, values=(3000.0, 9.0, 9.0)), PERPLEXITY_HINT),
    ("learned minus forbidden", partial(_prediction, values=(-4.0, -0.5, -0.5)), NEGATIVE_HINT),
    ("a list", partial(_prediction, as_list=True), LIST_HINT),
]


RECORDED = "recorded (a prediction cannot be wrong: the check only reads it; the measurement below judges it)"


def predict_bos_cost(fn: Callable) -> Callable:
    """fn() -> {'baseline': nats, 'headwise': nats, 'elementwise': nats}: a prediction, so any well-formed one is
    recorded, not passed (finite, non-negative numbers of nats, one per copy model); an ill-formed one fails with a
    targeted hint."""
    return check("predict_bos_cost", fn, reference_predict_bos_cost, [("your prediction", ())],
                 MISTAKES["predict_bos_cost"], wrap=_well_formed, accepted=RECORDED)


def reference_forbid_bos(model, layer, head=None):
    """fwd_hooks [(hook name, fn)] that forbid attention to <bos> (key 0) in layer `layer` (in its head `head` only,
    if given): every query but query 0 gets weight 0 on key 0, and its row is renormalised over the other keys
    (minigate.overrides.forbid_bos, written as the hook itself: tests/test_lesson_06.py checks it against it, and
    the check refuses an answer that calls it)."""
    heads = slice(None) if head is None else head

    def forbid(pattern, hook):  # pattern (batch, head, query, key)
        p = pattern.clone()
        p[:, heads, 1:, 0] = 0
        total = p.sum(-1, keepdim=True)  # a row left with nothing (every other key underflowed) stays 0, not 0/0
        return torch.where(total > 0, p / total, p)

    return [(f"blocks.{layer}.attn.hook_pattern", forbid)]


FORBID_BOS_HINT = ("your function calls overrides.forbid_bos: the exercise asks for the hook itself, a function of "
                   "(pattern, hook) that zeroes key 0 for queries 1.. on f'blocks.{layer}.attn.hook_pattern' and "
                   "renormalises the rows; overrides.forbid_bos is what the check compares your hooks with")


def _forbid_bos(model, layer, head=None, first_query=1, axis="key", renorm="row sum", all_heads=False,
                every_layer=False, returns=True):
    """A <bos>-forbidding hook with switches for the typical mistakes."""
    heads = slice(None) if head is None or all_heads else head

    def hook(pattern, hook):  # pattern (batch, head, query, key)
        p = pattern.clone()
        if axis == "key":
            p[:, heads, first_query:, 0] = 0
        else:  # "query": pattern[..., 0, :], query 0's row
            p[:, heads, 0, :] = 0
        if renorm == "row sum":
            p = p / p.sum(-1, keepdim=True)
        elif renorm == "query sum":
            p = p / p.sum(-2, keepdim=True)
        elif renorm == "softmax":
            p = p.softmax(-1)
        return p if returns else None

    name = (lambda n: n.endswith("attn.hook_pattern")) if every_layer else f"blocks.{layer}.attn.hook_pattern"
    return [(name, hook)]


def _logits_forbidding(make_hooks):
    """make_hooks(model, layer, head) -> fwd_hooks  ==>  fn(model, tokens, layer, head) -> logits."""
    def run(model, tokens, layer, head):
        return _hooked_logits(model, tokens, make_hooks(model, layer, head), "hook_pattern")
    return run


def _bos_model(seed: int, gate: str = "none", n_heads: int = 4, n_kv_heads: int = 2, head_dim: int = 8):
    """A small seeded model whose weights are large enough that every head's attention, <bos> included, is uneven:
    forbidding <bos> in any one head moves the logits well beyond the check's tolerance."""
    from ... import ModelConfig, Transformer

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=3, n_heads=n_heads, n_kv_heads=n_kv_heads,
                      head_dim=head_dim, d_ff=48, gate=gate, gate_granularity="headwise")
    model = Transformer(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3)
    return model


def _nan_hint(got, want):
    if isinstance(got, torch.Tensor) and got.shape == want.shape and got.isnan().any() and not want.isnan().any():
        return ("your hooks make NaNs: a row of the pattern with nothing left in it, divided by its sum, is 0/0 "
                "(query 0 can only attend to <bos>: leave its row as it is)")
    return None


MISTAKES["forbid_bos"] = [
    ("query 0 included", partial(_forbid_bos, first_query=0),
     "query 0 can only attend to <bos> (itself): zeroing its weight leaves a row of zeros, and 0/0 = NaN; forbid "
     "key 0 for queries 1.. only: pattern[:, :, 1:, 0]"),
    ("the row, not the column", partial(_forbid_bos, axis="query"),
     "pattern[..., 0, :] is query 0's row; <bos> is key 0, on the last axis: pattern[:, :, 1:, 0]"),
    ("no renormalisation", partial(_forbid_bos, renorm=None),
     "the rows no longer sum to 1: divide each by its sum over the keys, pattern / pattern.sum(-1, keepdim=True)"),
    ("pattern[..., 0] = 0 alone", partial(_forbid_bos, first_query=0, renorm=None),
     "the rows no longer sum to 1: divide each by its sum over the keys, pattern / pattern.sum(-1, keepdim=True)"),
    ("renormalised over queries", partial(_forbid_bos, renorm="query sum"),
     "renormalise each query's row over the keys (the last axis, sum(-1)), not over the queries"),
    ("a second softmax", partial(_forbid_bos, renorm="softmax"),
     "the pattern is already a softmax: renormalise by dividing each row by its sum (a second softmax flattens "
     "it)"),
    ("every head", partial(_forbid_bos, all_heads=True),
     "with `head` given, forbid <bos> in that head only: pattern[:, head, 1:, 0], not pattern[:, :, 1:, 0]"),
    ("every layer", partial(_forbid_bos, every_layer=True),
     "your hooks act on every layer: hook only f'blocks.{layer}.attn.hook_pattern' (or check hook.name)"),
    ("no return", partial(_forbid_bos, returns=False),
     "your hook leaves the model unchanged: build the new pattern and `return` it (rebinding the argument inside "
     "the hook changes nothing outside it)"),
]


def forbid_bos(fn: Callable) -> Callable:
    """fn(model, layer, head=None) -> fwd_hooks that forbid attention to <bos>; checked by running tiny models with
    its hooks against overrides.forbid_bos, which an answer must not call itself."""
    from ... import overrides as ov

    models = {"baseline": _bos_model(0), "headwise": _bos_model(1, "G1"),
              "baseline, 6 heads x 4, 3 kv heads": _bos_model(2, n_heads=6, n_kv_heads=3, head_dim=4)}
    tokens = torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(6))
    cases = [(f"{name}, layer {layer}, " + (f"head {head}" if head is not None else "every head"),
              (models[name], tokens, layer, head))
             for name, layer, head in [("baseline", 2, 1), ("headwise", 0, None), ("headwise", 1, 3),
                                       ("baseline, 6 heads x 4, 3 kv heads", 1, 5),
                                       ("baseline, 6 heads x 4, 3 kv heads", 2, None)]]
    raises = [(r"IndexError", "the pattern is (batch, head, query, key): key 0 of queries 1.. of head h is "
                              "pattern[:, h, 1:, 0]")]
    return check("forbid_bos", fn, reference_forbid_bos, cases, MISTAKES["forbid_bos"], atol=1e-5, rtol=1e-4,
                 raises=raises, explain=_nan_hint, wrap=_logits_forbidding, refuse={ov.forbid_bos: FORBID_BOS_HINT},
                 index_label=lambda idx: f"batch {idx[0]}, position {idx[1]}, logit {idx[2]}")
