"""Lesson 06's checks: a gate-override hook, and a hook that forbids attention to `<bos>`."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from .engine import NONE_HINT, Mismatch, Mistake, check, what
from .lesson05 import _gated_model

EXERCISES = ("gate_override", "forbid_bos")  # its check cells, in the lesson's order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried


def reference_gate_override(model, layer, value, head=None):
    """fwd_hooks [(hook name, fn)] that set the gate scores of layer `layer` (of its head `head` only, if given)
    to `value`: the overrides of minigate.overrides.force_layer and close_head."""
    from ... import overrides as ov

    return ov.force_layer(model, layer, value) if head is None else ov.close_head(model, layer, head, value)


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


def gate_override(fn: Callable) -> Callable:
    """fn(model, layer, value, head=None) -> fwd_hooks; checked by running tiny headwise and elementwise models
    with its hooks against overrides.force_layer / close_head."""
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
                 rtol=1e-4, raises=raises, wrap=_logits_under)


def reference_forbid_bos(model, layer, head=None):
    """fwd_hooks [(hook name, fn)] that forbid attention to <bos> (key 0) in layer `layer` (in its head `head` only,
    if given): every query but query 0 gets weight 0 on key 0, and its row is renormalised over the other keys
    (minigate.overrides.forbid_bos)."""
    from ... import overrides as ov

    return ov.forbid_bos(model, layer, head)


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
    its hooks against overrides.forbid_bos."""
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
                 raises=raises, explain=_nan_hint, wrap=_logits_forbidding,
                 index_label=lambda idx: f"batch {idx[0]}, position {idx[1]}, logit {idx[2]}")
