"""Lesson 04's checks: where the massive activation sits, whether a <bos>-attending head is a no-op, and where each
head parks its attention, part by part (from which F-Attn follows)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from .engine import NONE_HINT, Mismatch, Mistake, check, is_number, randn, what
from .lesson02 import _copy_parts  # the random part and the copy part of copy-task rows

EXERCISES = ("locate_massive", "bos_noop_test", "bos_share_by_part")  # check cells, in lesson order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried

# ── where the massive activation sits ─────────────────────────────────────────────────────

def reference_locate_massive(cache, n_layers):
    """-> (values (layer,), where (layer, 3) long): each layer's largest |residual stream| value after the block
    (hook_resid_post, (batch, pos, d_model)) and its (prompt, position, dimension), as massive_activations() gives."""
    return _locate_massive(cache, n_layers)


def _locate_massive(cache, n_layers, absolute=True, order=(0, 1, 2), only_first=False, hook="hook_resid_post"):
    values, where = [], []
    for layer in range(n_layers):
        r = cache[f"blocks.{layer}.{hook}"].float()  # (batch, pos, d_model)
        a = r.abs() if absolute else r
        if only_first:
            a = a[:, :1]
        flat = int(a.flatten().argmax())
        idx = [int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape)]  # (prompt, position, dimension)
        values.append(a.flatten()[flat])
        where.append(torch.tensor([idx[i] for i in order]))
    return torch.stack(values), torch.stack(where)


def _resid_cache(seed: int, n_layers: int = 3, batch: int = 2, pos: int = 7, d: int = 8) -> dict:
    """A made-up cache: random residuals, one planted large negative value and one large value off position 0."""
    cache = {}
    for layer in range(n_layers):
        r = randn(batch, pos, d, seed=seed * 10 + layer)
        r[1, 0, 3] = -9.0 - layer  # the layer's largest |value| is negative, at <bos> of prompt 1
        r[0, 4, 5] = 6.0 + layer   # the largest positive value, off position 0
        cache[f"blocks.{layer}.hook_resid_pre"] = randn(batch, pos, d, seed=seed * 10 + layer + 5) * 20
        cache[f"blocks.{layer}.hook_resid_post"] = r
    return cache


MISTAKES["locate_massive"] = [
    ("signed max", partial(_locate_massive, absolute=False),
     "take absolute values: a massive activation is often large and negative"),
    ("position first", partial(_locate_massive, order=(1, 0, 2)),
     "give each place as (prompt, position, dimension), in that order "
     "(unravel the flat index over (batch, pos, d_model))"),
    ("<bos> only", partial(_locate_massive, only_first=True),
     "search every position, not only <bos>: where it sits is what we want to find out"),
    ("before the block", partial(_locate_massive, hook="hook_resid_pre"),
     "read the residual stream *after* each block: blocks.{L}.hook_resid_post"),
]


def locate_massive(fn: Callable) -> Callable:
    """fn(cache from run_with_cache, n_layers) -> (values (layer,), where (layer, 3)); see reference_locate_massive."""
    cache = _resid_cache(2, n_layers=2, batch=3, pos=5, d=6)
    for layer in range(2):  # here the largest |value| is off position 0 and positive
        cache[f"blocks.{layer}.hook_resid_post"][2, 3, 1] = 20.0 + layer
    cases = [("3 layers, planted at <bos> of prompt 1", (_resid_cache(0), 3)),
             ("2 layers, planted at position 3 of prompt 2", (cache, 2))]
    return check("locate_massive", fn, reference_locate_massive, cases, MISTAKES["locate_massive"], atol=1e-6,
                 rtol=1e-5)


# ── where each head parks its attention, part by part; F-Attn follows ────────────────────

def reference_bos_share_by_part(cache, n_layers, n_random):
    """cache with blocks.{L}.attn.hook_pattern (batch, head, query, key) of copy-task rows -> (layer, 3, head): each
    head's mean attention on key 0 (<bos>), averaged over the batch and over every query (row 0, query 0 included:
    the share F-Attn averages, so F-Attn = out[:, 0].mean(), as minigate.analysis.attention_sink(...).f_attn), over
    the random part's queries 1..n_random (row 1) and over the copy part's queries n_random+1.. (row 2)."""
    return _bos_share_by_part(cache, n_layers, n_random)


def _bos_share_by_part(cache, n_layers, n_random, first=0, start=1, split=0, to_key=True, head_mean=False,
                       whole="queries"):
    out = []
    for layer in range(n_layers):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"].double()  # (batch, head, query, key)
        p = pattern[..., 0] if to_key else pattern[..., 0, :]  # (batch, head, query)
        rand, copy = _copy_parts(p, n_random, dim=-1, start=start, split=split)
        rand, copy = rand.mean((0, 2)), copy.mean((0, 2))  # (head,) each
        every = p[..., first:].mean((0, 2)) if whole == "queries" else (rand + copy) / 2
        out.append(torch.stack([every, rand, copy]))  # (3, head)
    out = torch.stack(out).float()  # (layer, 3, head)
    return out.mean(2, keepdim=True).expand_as(out) if head_mean else out


MISTAKES["bos_share_by_part"] = [
    ("query 0 left out of row 0", partial(_bos_share_by_part, first=1),
     "row 0 averages over every query, query 0 included, as F-Attn does (query 0 always puts 1.0 on key 0)"),
    ("row 0 from the two parts", partial(_bos_share_by_part, whole="parts"),
     "row 0 is the mean over every query (query 0 included), not the mean of the two parts' means"),
    ("query 0 in the random part", partial(_bos_share_by_part, start=0),
     "leave query 0 out of the random part (row 1): <bos> can only attend to itself, so it always puts 1.0 on key 0"),
    ("split -1", partial(_bos_share_by_part, split=-1),
     "the random part's queries are positions 1..n_random inclusive: slice 1 : n_random + 1"),
    ("split +1", partial(_bos_share_by_part, split=1),
     "the separator (position n_random + 1) already belongs to the copy part: it must retrieve a_1"),
    ("from <bos>", partial(_bos_share_by_part, to_key=False),
     "that is the attention *from* <bos>; we want attention *to* key 0: pattern[..., 0] (last axis)"),
    ("head mean", partial(_bos_share_by_part, head_mean=True),
     "keep one number per head: average over batch and queries only"),
]


def _pattern_cache(seed: int, n_layers: int, b: int, h: int, t: int) -> dict:
    """A made-up cache of causal attention patterns, one per layer."""
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    return {f"blocks.{layer}.attn.hook_pattern":
            (randn(b, h, t, t, seed=seed * 10 + layer) * 3).masked_fill(mask, float("-inf")).softmax(-1)
            for layer in range(n_layers)}


def bos_share_by_part(fn: Callable) -> Callable:
    """fn(cache from run_with_cache, n_layers, n_random) -> (layer, 3, head) tensor; see
    reference_bos_share_by_part."""
    cases = [("2 layers, 4 heads, 9 positions, 3 random", (_pattern_cache(0, 2, 2, 4, 9), 2, 3)),
             ("3 layers, 2 heads, 12 positions, 6 random", (_pattern_cache(1, 3, 3, 2, 12), 3, 6))]
    return check("bos_share_by_part", fn, reference_bos_share_by_part, cases, MISTAKES["bos_share_by_part"],
                 atol=1e-6, rtol=1e-5)


# ── is a <bos> head a no-op? ──────────────────────────────────────────────────────────────

NOOP = 0.01  # nats: a head whose <bos> value can go without moving the loss this much either way is a no-op


def reference_bos_noop_test(model, tokens, layer, head):
    """tokens (batch, pos), <bos> first -> (is_noop, change): whether one head of one layer adds nothing at <bos> that
    the model uses, and the evidence: the change of the mean next-token loss (nats) when that head's value at <bos>
    (blocks.{layer}.attn.hook_v, the value head the query head reads) is set to zero, removing exactly what the head
    adds by attending to <bos>. A no-op when |change| < NOOP: a constant the model uses moves the loss either way."""
    return _bos_noop_test(model, tokens, layer, head)


def _bos_noop_test(model, tokens, layer, head, test="zero", where="bos", which_heads="one", two_sided=True,
                   threshold=NOOP):
    """The reference with switches for the typical mistakes: each returns (verdict, the number it rests on)."""
    import torch.nn.functional as F

    name = f"blocks.{layer}.attn.hook_v"
    kv = head // (model.cfg.n_heads // model.cfg.n_kv_heads)  # the value head this query head reads
    heads = slice(None) if which_heads == "all" else kv
    positions = 0 if where == "bos" else slice(None)
    with torch.no_grad():
        names = [name, f"blocks.{layer}.attn.hook_pattern"]
        _, cache = model.run_with_cache(tokens, names_filter=names)
        v = cache[name][:, :, kv].float()  # (batch, pos, d_head)
        if test == "ratio":  # the proxy: a small value at <bos>
            ratio = (v[:, 0].norm(dim=-1).mean() / v[:, 1:].norm(dim=-1).mean()).item()
            return ratio < 0.5, ratio
        if test == "share":  # "a sink is a no-op"
            share = cache[names[1]][:, head, :, 0].mean().item()
            return share > 0.3, share

        def loss(hooks):
            logits = model.run_with_hooks(tokens, fwd_hooks=hooks)  # (batch, pos, vocab)
            return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten()).item()

        value = 0.0 if test == "zero" else cache[name][:, 1:, heads].mean((0, 1))

        def replace(v, hook):  # v (batch, pos, kv_head, d_head)
            v = v.clone()
            v[:, positions, heads] = value
            return v

        change = loss([(name, replace)]) - loss([])
    if threshold == 0:
        return change == 0, change
    return (abs(change) if two_sided else change) < threshold, change


def _noop_model(kinds: list[str], n_heads: int = 4, seed: int = 0, batch: int = 4, pos: int = 12):
    """A tiny model whose heads put about 0.8 of their attention on <bos> (a hook on their scores) and whose value at
    <bos> is planted (a hook on hook_v), with tokens to run it on. kinds[layer][kv_head] says what each value head's
    <bos> value is: "N" large (twice the others' mean norm) but in o_proj's null space (to 1e-3): a no-op; "n" zero:
    a no-op; "C" small (0.3 of the others' norm), which o_proj reads: a constant; "K" large and read: a constant;
    "M" the mean of the head's values elsewhere: a constant that a mean replacement leaves as it is. -> (model,
    tokens, per layer {query head: is a no-op}), the labels planted; tests/test_lesson_04.py checks their margins."""
    from ... import ModelConfig, Transformer

    n_kv = len(kinds[0])
    g, hd = n_heads // n_kv, 8
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=40, d_model=32, n_layers=len(kinds), n_heads=n_heads, n_kv_heads=n_kv, head_dim=hd,
                      d_ff=48)
    model = Transformer(cfg).eval()
    for p in model.parameters():  # larger weights than at initialisation, so a planted constant moves the loss
        p.data.mul_(3.0)
    tokens = torch.randint(1, 40, (batch, pos), generator=torch.Generator().manual_seed(seed))
    tokens[:, 0] = 0  # <bos>
    gen = torch.Generator().manual_seed(seed + 100)
    plants = []
    for layer, heads in enumerate(kinds):
        attn = model.blocks[layer].attn

        def set_scores(scores, hook):  # (batch, head, query, key): 0 on past keys, 2.5 on key 0
            new = torch.zeros_like(scores).masked_fill(scores.isinf(), float("-inf"))
            new[..., 0] = 2.5
            return new

        attn.hook_attn_scores.add_hook(set_scores)
        plant = {}  # kv head -> its <bos> value (d_head,), or "mean"
        plants.append(plant)

        def set_v(v, hook, plant=plant):  # (batch, pos, kv_head, d_head)
            v = v.clone()
            for kv, value in plant.items():
                v[:, 0, kv] = v[:, 1:, kv].mean((0, 1)) if isinstance(value, str) else value
            return v

        attn.hook_v.add_hook(set_v)
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=f"blocks.{layer}.attn.hook_v")
            norm = cache[f"blocks.{layer}.attn.hook_v"][:, 1:].norm(dim=-1).mean().item()  # others' mean norm
            for kv, kind in enumerate(heads):
                u = torch.randn(hd, generator=gen)
                u = u / u.norm()
                if kind == "N":  # o_proj of each query head that reads this value head loses u (to 1e-3)
                    W = attn.o_proj.weight  # (d_model, n_heads * d_head)
                    for h in range(kv * g, (kv + 1) * g):
                        block = W[:, h * hd:(h + 1) * hd]
                        block -= (1 - 1e-3) * torch.outer(block @ u, u)
                plant[kv] = {"N": 2.0 * norm * u, "n": torch.zeros(hd), "C": 0.3 * norm * u, "K": 2.0 * norm * u,
                             "M": "mean"}[kind]
    labels = [{h: heads[h // g] in "Nn" for h in range(n_heads)} for heads in kinds]
    return model, tokens, labels


MISTAKES["bos_noop_test"] = [  # each gives other verdicts on the first case's 8 heads (tests/test_lesson_04.py)
    ("the value ratio as the test", partial(_bos_noop_test, test="ratio"),
     "a small value at <bos> is a proxy, not the test: a large value that o_proj ignores is unused, a small one it "
     "reads is used. Remove what the head adds (its value at <bos>) and see whether the loss moves"),
    ("a sink is a no-op", partial(_bos_noop_test, test="share"),
     "every head here puts most of its attention on <bos>; how much a head attends says nothing of whether the "
     "model uses what it fetches: remove that and see whether the loss moves"),
    ("the whole head removed", partial(_bos_noop_test, where="all"),
     "change the value at <bos> only (position 0): zeroing the head at every position removes its other work too, "
     "so a head that adds nothing at <bos> looks used"),
    ("every head of the layer removed", partial(_bos_noop_test, which_heads="all"),
     "change one head's value only (hook_v's kv_head axis): removing every head's at once lets another head's "
     "constant decide the verdict"),
    ("mean replacement", partial(_bos_noop_test, test="mean"),
     "replacing <bos>'s value by the head's mean value elsewhere *adds* that mean (a head that adds nothing looks "
     "used), and leaves a constant equal to it in place (a used head looks like a no-op): to test what the head "
     "adds, remove it: set it to zero"),
    ("one-sided", partial(_bos_noop_test, two_sided=False),
     "a constant whose removal *lowers* the loss is used too: compare |change| with NOOP, not change"),
    ("no change at all", partial(_bos_noop_test, threshold=0),
     "a head that adds almost nothing moves the loss by a little, not by exactly 0.0: compare |change| with NOOP "
     "(0.01 nats)"),
]

NOOP_CASES = [("2 layers x 4 heads", (["NCMK", "nNnN"], 4, 2)),  # (kinds, heads, seed): the labels in the notes
              ("1 layer, 4 heads reading 2 value heads (GQA)", (["NK"], 4, 0))]


def _verdicts(fn: Callable) -> Callable:
    """fn(model, tokens, layer, head) -> (is_noop, change)  ==>  the case's function of (model, tokens): a float64
    tensor of the verdicts of every (layer, head), 1.0 for a no-op. A Mismatch when an output cannot be read."""
    def run(model, tokens):
        out = []
        for layer in range(model.cfg.n_layers):
            for head in range(model.cfg.n_heads):
                got = fn(model, tokens, layer, head)
                if got is None:
                    raise Mismatch(NONE_HINT)
                if not isinstance(got, (tuple, list)) or len(got) != 2:
                    raise Mismatch(f"return two things, (is_noop, change): your verdict and the loss change it rests "
                                   f"on; got {what(got)}")
                verdict, change = (x.item() if isinstance(x, torch.Tensor) and x.numel() == 1 else x for x in got)
                if not isinstance(verdict, bool):
                    raise Mismatch(f"is_noop: True or False, got {what(verdict)}")
                if not is_number(change):
                    raise Mismatch(f"change: the loss change in nats, a number; got {what(change)}")
                out.append(float(verdict))
        return torch.tensor(out, dtype=torch.float64)
    return run


def _explain_verdicts(got, want) -> str | None:
    if not isinstance(got, torch.Tensor) or got.shape != want.shape:
        return None
    missed, false = int(((want == 1) & (got == 0)).sum()), int(((want == 0) & (got == 1)).sum())
    return (f"{missed} no-op head(s) judged used and {false} used head(s) judged no-ops: which change to the head "
            "removes exactly what it adds by attending to <bos>?")


def bos_noop_test(fn: Callable) -> Callable:
    """fn(model, tokens (batch, pos), layer, head) -> (is_noop, change), run on every head of tiny models whose <bos>
    values are planted (_noop_model): passes when it names every no-op and no other head."""
    cases = [(label, _noop_model(kinds, n_heads, seed)[:2]) for label, (kinds, n_heads, seed) in NOOP_CASES]
    raises = [(r"IndexError: index \d+ is out of bounds for dimension 2",
               "hook_v has n_kv_heads value heads: with grouped-query attention, query head h reads value head "
               "h // (model.cfg.n_heads // model.cfg.n_kv_heads)")]
    return check("bos_noop_test", fn, reference_bos_noop_test, cases, MISTAKES["bos_noop_test"], atol=0, rtol=0,
                 raises=raises, wrap=_verdicts, explain=_explain_verdicts)
