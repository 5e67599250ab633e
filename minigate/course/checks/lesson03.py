"""Lesson 03's check: a train() callback that tracks the largest head's attention on <bos> during training."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from functools import partial

import torch

from .engine import NONE_HINT, Mismatch, Mistake, check, what

EXERCISES = ("bos_tracker",)  # its check cells, in the lesson's order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried

# ── a callback that watches the sink form ───────────────────────────────────────────────────────────

KEYS = ("bos_share", "layer", "head")  # what the callback returns, in the order the check compares them


def reference_bos_tracker(tokens):
    """tokens (batch, pos), <bos> first -> a train() callback(step, model, history) -> {"bos_share": float,
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
        return {"bos_share": share.max().item(), "layer": layer, "head": head}
    return callback


def _tracked(make_callback):
    """make_callback(tokens) -> callback  ==>  fn(model, tokens) -> (bos_share, layer, head), float64, what the
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
            raise Mismatch(f"a train() callback returns a dict of numbers, {{'bos_share': ..., 'layer': ..., "
                           f"'head': ...}}; got {what(out)}")
        missing = [k for k in KEYS if k not in out]
        if missing:
            raise Mismatch(f"the callback's dict has no key {missing[0]!r}: return {{'bos_share': ..., 'layer': ..., "
                           f"'head': ...}}")
        for k in KEYS:
            v = out[k]
            if isinstance(v, torch.Tensor):
                raise Mismatch(f"{k!r} is {what(v)}: return plain Python numbers (.item(), int(...)); train() keeps "
                               "them in history.metrics, which history.json stores as JSON")
            if k != "bos_share" and not (isinstance(v, numbers.Integral) and not isinstance(v, bool)):
                raise Mismatch(f"{k!r} is an index: expected an int, got {what(v)}")
            if not isinstance(v, numbers.Real) or isinstance(v, bool):
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


def bos_tracker(fn: Callable) -> Callable:
    """fn(tokens) -> a train() callback (step, model, history) -> {"bos_share", "layer", "head"}; checked by calling
    the callback on tiny models as train() does; see reference_bos_tracker."""
    cases = [("tiny baseline, 3 layers x 4 heads (2 value heads)", (_tracker_model(0), _tokens(0, 3, 10))),
             ("tiny gated model, 2 layers x 3 heads", (_tracker_model(1, "G1", 2, 3, 3), _tokens(1, 2, 12))),
             ("tiny baseline, 4 layers x 2 heads", (_tracker_model(3, n_layers=4, n_heads=2, n_kv_heads=1),
                                                    _tokens(2, 4, 8)))]
    raises = [(r"KeyError", "names_filter decides what the cache keeps: let through blocks.{L}.attn.hook_pattern "
                            "for every layer L, e.g. names_filter=lambda name: name.endswith('attn.hook_pattern')")]
    return check("bos_tracker", fn, reference_bos_tracker, cases, MISTAKES["bos_tracker"], atol=1e-6, rtol=1e-5,
                 raises=raises, wrap=_tracked, index_label=lambda idx: repr(KEYS[idx[0]]))
