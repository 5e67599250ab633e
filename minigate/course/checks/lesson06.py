"""Lesson 06's checks: a gate-override hook, and layers ranked by the damage their override does."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import torch

from .engine import NONE_HINT, Mismatch, check, what
from .lesson05 import _gated_model

EXERCISES = ("gate_override", "rank_layers")  # its check cells, in the lesson's order


def reference_gate_override(model, layer, value, head=None):
    """fwd_hooks [(hook name, fn)] that set the gate scores of layer `layer` (of its head `head` only, if given)
    to `value`: the overrides of minigate.ablation.force_layer and close_head."""
    from ... import ablation as ab

    return ab.force_layer(model, layer, value) if head is None else ab.close_head(model, layer, head, value)


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


def _logits_under(make_hooks):
    """make_hooks(model, layer, value, head) -> fwd_hooks  ==>  fn(model, tokens, layer, value, head) -> logits."""
    def run(model, tokens, layer, value, head):
        hooks = make_hooks(model, layer, value, head)
        if hooks is None:
            raise Mismatch(NONE_HINT)
        if not isinstance(hooks, (list, tuple)) or not all(isinstance(p, tuple) and len(p) == 2 for p in hooks):
            raise Mismatch(f"return a list of (hook name, hook function) pairs, e.g. [('blocks.0.attn.hook_gate', "
                           f"fn)], as ablation.close_head does; got {what(hooks)}")
        with torch.no_grad():
            return model.run_with_hooks(tokens, fwd_hooks=hooks)
    return run


def gate_override(fn: Callable) -> Callable:
    """fn(model, layer, value, head=None) -> fwd_hooks; checked by running tiny headwise and elementwise models
    with its hooks against ablation.force_layer / close_head."""
    models = {gran: _gated_model(seed, gran) for seed, gran in enumerate(["headwise", "elementwise"])}
    tokens = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(6))
    cases = [(f"{gran}, layer {layer}, " + (f"head {head}" if head is not None else "every head") + f" = {value}",
              (models[gran], tokens, layer, value, head))
             for gran, layer, value, head in [("headwise", 1, 0.0, 2), ("headwise", 0, 1.0, None),
                                              ("elementwise", 2, 0.0, 1), ("elementwise", 1, 0.25, None),
                                              ("elementwise", 0, 1.0, 3)]]
    variant = lambda **kw: _logits_under(lambda m, L, v, h: _gate_override(m, L, v, h, **kw))
    mistakes = [
        (variant(index="last axis"),
         "gate[..., head] indexes the last axis: that is the head for a headwise gate (batch, pos, head) but a "
         "head *dimension* for an elementwise one (batch, pos, head, d_head); use gate[:, :, head]"),
        (variant(index="second axis"),
         "gate[:, head] sets a position, not a head: gates are (batch, pos, head[, d_head])"),
        (variant(every_layer=True),
         "your hook acts on every layer: hook only f'blocks.{layer}.attn.hook_gate' (or check hook.name in a filter)"),
        (variant(returns=False),
         "your hook leaves the model unchanged: build the new gate and `return` it (rebinding the argument inside "
         "the hook changes nothing outside it)"),
        (variant(point="hook_gate_logits"),
         "you set the gate *logits* (before the sigmoid): `value` is a gate score, hook 'hook_gate' "
         "(1 = open, 0 = closed)"),
        (variant(whole_layer=True), "you set the whole layer: with `head` given, only gate[:, :, head] changes"),
    ]
    learner = _logits_under(fn)
    raises = [(r"IndexError", "a headwise gate is (batch, pos, head), an elementwise one (batch, pos, head, d_head): "
                              "gate[:, :, head] picks the head in both")]
    result = check("gate_override", learner, _logits_under(reference_gate_override), cases, mistakes,
                   atol=1e-5, rtol=1e-4, raises=raises)
    return fn if result is learner else reference_gate_override


def reference_rank_layers(results, kind="open"):
    """results {condition name: ablation.Perplexity} with "learned" and "L{layer} {kind}" entries (others are
    ignored) -> [(layer, damage)], most damaging first; damage = loss increase over the learned model, in nats
    (= ln(ppl / ppl_learned))."""
    return _rank_layers(results, kind)


def _rank_layers(results, kind, pattern="exact", damage="nats", descending=True, pairs=True):
    base = results["learned"]
    found = []
    for name, r in results.items():
        if pattern == "exact":
            m = re.fullmatch(rf"L(\d+) {re.escape(kind)}", name)
            layer = int(m[1]) if m else None
        elif pattern == "prefix":  # also catches head conditions such as "L0H3 closed"
            m = re.match(r"L(\d+)", name)
            layer = int(m[1]) if m and name.endswith(" " + kind) else None
        else:  # "one digit": name[1]
            layer = int(name[1]) if re.fullmatch(rf"L(\d+) {re.escape(kind)}", name) else None
        if layer is None:
            continue
        d = {"nats": r.loss - base.loss, "ppl difference": r.ppl - base.ppl, "ppl ratio": r.ppl / base.ppl,
             "absolute": r.loss}[damage]
        found.append((layer, d))
    found.sort(key=lambda p: p[1], reverse=descending)
    return found if pairs else [layer for layer, _ in found]


def _fake_results(seed: int, n_layers: int, n_heads: int = 2):
    """A sweep-like {name: Perplexity} with distinct, made-up chunk losses."""
    from ...ablation import Perplexity

    g = torch.Generator().manual_seed(seed)

    def ppl(level):
        losses = (level + 0.1 * torch.rand(4, generator=g)).double()
        return Perplexity(ppl=math.exp(losses.mean().item()), chunk_losses=losses, ci=None, n_tokens=4 * 16)

    out = {"learned": ppl(3.0), "gates=0.5": ppl(6.0)}
    levels = 3.2 + 5 * torch.randperm(2 * n_layers, generator=g).double() / n_layers
    for L in range(n_layers):
        out[f"L{L} open"], out[f"L{L} closed"] = ppl(levels[2 * L].item()), ppl(levels[2 * L + 1].item())
    for L in range(min(2, n_layers)):
        for h in range(n_heads):
            out[f"L{L}H{h} closed"] = ppl(9.0 + h + L)  # more damaging than any layer: a trap for loose matching
    return out


def rank_layers(fn: Callable) -> Callable:
    """fn(results {name: Perplexity}, kind="open") -> [(layer, damage in nats)], most damaging first."""
    cases = [("4 layers, kind='open'", (_fake_results(0, 4), "open")),
             ("4 layers with head conditions, kind='closed'", (_fake_results(1, 4), "closed")),
             ("12 layers, kind='open'", (_fake_results(2, 12), "open"))]
    mistakes = [
        (lambda r, k: _rank_layers(r, k, descending=False), "most damaging first: sort by damage, descending"),
        (lambda r, k: _rank_layers(r, k, pairs=False), "return (layer, damage) pairs, not only the layers"),
        (lambda r, k: _rank_layers(r, k, damage="ppl difference"),
         "damage is a loss difference in nats, ln(ppl / ppl_learned) = r.loss - learned.loss, not ppl - ppl_learned"),
        (lambda r, k: _rank_layers(r, k, damage="ppl ratio"),
         "damage is ln(ppl / ppl_learned) (the loss difference), not the ratio itself"),
        (lambda r, k: _rank_layers(r, k, damage="absolute"),
         "damage is measured against the learned model: subtract results['learned'].loss"),
        (lambda r, k: _rank_layers(r, k, pattern="prefix"),
         "'L0H3 closed' is a head condition, not a layer one: match the whole name, e.g. "
         "re.fullmatch(rf'L(\\d+) {kind}', name)"),
        (lambda r, k: _rank_layers(r, k, pattern="one digit"),
         "layer numbers can have two digits ('L10 open'): parse all of them, e.g. int(name[1:].split()[0])"),
    ]
    mistakes = [(_as_rows(wrong), hint) for wrong, hint in mistakes]
    learner = _as_rows(fn)
    result = check("rank_layers", learner, _as_rows(reference_rank_layers), cases, mistakes, atol=1e-9, rtol=1e-9,
                   index_label=lambda idx: f"item {idx[0]}" + ("'s layer" if idx[1:] == (0,) else "'s damage"
                                                               if idx[1:] == (1,) else ""),
                   explain=_count_hint)
    return fn if result is learner else reference_rank_layers


def _count_hint(got, want):
    if isinstance(got, torch.Tensor) and got.dim() >= 1 and got.shape[0] != want.shape[0]:
        return (f"expected {want.shape[0]} (layer, damage) pairs, one per 'L<layer> <kind>' condition, got "
                f"{got.shape[0]}")
    return None


def _is_number(x) -> bool:
    if isinstance(x, torch.Tensor):
        return x.numel() == 1 and not x.is_complex()
    return isinstance(x, (int, float)) and not isinstance(x, bool) or type(x).__module__ == "numpy" and not x.shape


def _as_rows(f: Callable) -> Callable:
    """f(results, kind) -> [(layer, damage)]  ==>  g(results, kind) -> a (n, 2) float64 tensor; a list of numbers
    becomes (n,); anything that is not numbers or pairs of numbers is a Mismatch that says so."""
    def run(results, kind):
        ranked = f(results, kind)
        if ranked is None:
            raise Mismatch(NONE_HINT)
        if isinstance(ranked, torch.Tensor):
            raise Mismatch("return a list of (layer, damage) pairs, most damaging first, not a tensor (a float32 "
                           "tensor also rounds the damage)")
        if not isinstance(ranked, (list, tuple)):
            raise Mismatch(f"return a list of (layer, damage) pairs, most damaging first; got {what(ranked)}")
        rows = []
        for i, item in enumerate(ranked):
            if _is_number(item):
                rows.append([float(item)])
            elif isinstance(item, (tuple, list)) and all(_is_number(x) for x in item):
                rows.append([float(x) for x in item])
            else:
                shown = f"({', '.join(type(x).__name__ for x in item)})" if isinstance(item, (tuple, list)) \
                    else type(item).__name__
                raise Mismatch(f"item {i} is a {shown}: each item must be a (layer, damage) pair of numbers, e.g. "
                               "(3, 0.42): the layer number parsed from the name, damage = r.loss - learned.loss")
        if len({len(r) for r in rows}) > 1:
            raise Mismatch("every item must be a (layer, damage) pair of numbers")
        out = torch.tensor(rows, dtype=torch.float64).reshape(len(rows), -1) if rows else torch.zeros(0, 2)
        return out[:, 0] if out.shape[1] == 1 else out
    return run
