"""Lesson 07's check: each head's attention on the first token above what uniform causal attention would give, the
measure of the attention sink the lesson applies to the code models and to the paper's 1B models."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from .engine import Mistake, check, randn

EXERCISES = ("first_token_excess",)  # its check cells, in the lesson's order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried


def reference_first_token_excess(pattern):
    """pattern (batch, head, query, key), causal, of prompts that start with <bos> -> (head,): each head's mean
    attention on key 0 over batch and queries, minus what uniform causal attention gives on the same queries (query i
    spreads 1/(i+1) over keys 0..i, so it puts 1/(i+1) on key 0), averaged over every query, query 0 included: the
    per-head F-Attn share minus minigate.analysis.uniform_first_token_share(n_queries)."""
    return _first_token_excess(pattern)


def _first_token_excess(pattern, *, to_key=True, share_from=0, uniform="1/(i+1)", uniform_from=0, reduce="mean",
                        subtract=True, order="share - uniform", head_mean=False):
    """Explicit computation with switches for the typical mistakes."""
    p = pattern.double()
    n_queries = p.shape[-2]
    first = p[..., 0] if to_key else p[..., 0, :]  # (batch, head, query): attention *to* key 0 (or *from* query 0)
    share = first[..., share_from:].mean((0, 2))  # (head,)
    i = torch.arange(n_queries, dtype=torch.float64)
    if uniform == "1/(i+1)":
        per_query = (1 / (i + 1))[uniform_from:]
    elif uniform == "1/i":  # query 0 left out, as 1/0 would be
        per_query = 1 / i[1:]
    else:  # "1/T": spread over every key, the future ones too
        per_query = torch.full((n_queries - uniform_from,), 1 / p.shape[-1], dtype=torch.float64)
    base = per_query.mean() if reduce == "mean" else per_query.sum()
    out = share if not subtract else share - base if order == "share - uniform" else base - share
    if head_mean:  # True: one number; "expand": that number repeated for every head
        return out.mean().expand(out.shape) if head_mean == "expand" else out.mean()
    return out


def _causal_patterns(seed: int, batch: int, heads: int, n: int, sink_head: int, uniform_head: int):
    """Random causal patterns; one head leans on key 0 (a sink), one attends uniformly (its excess is exactly 0)."""
    scores = randn(batch, heads, n, n, seed=seed) * 2
    scores[:, sink_head, :, 0] += 3.0
    scores[:, uniform_head] = 0.0
    mask = torch.ones(n, n, dtype=torch.bool).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(-1)


def _explain(got, want):
    if isinstance(got, torch.Tensor) and got.is_floating_point() and torch.isinf(got).any():
        return ("your output is infinite: 1/i divides by zero at query 0, which sees one key (itself): "
                "uniform attention puts 1/(i+1) on key 0")
    return None


MISTAKES["first_token_excess"] = [
    ("no subtraction", partial(_first_token_excess, subtract=False),
     "subtract what uniform causal attention gives: the mean over queries of 1/(i+1)"),
    ("uniform minus share", partial(_first_token_excess, order="uniform - share"),
     "the excess is the head's share minus the uniform share, not uniform minus share"),
    ("from token 0", partial(_first_token_excess, to_key=False),
     "that is the attention *from* token 0 (query 0's row); we want the attention *to* key 0: "
     "pattern[..., 0] (last axis)"),
    ("averaged over heads too", partial(_first_token_excess, head_mean=True),
     "keep one number per head: average over batch and queries only, not over heads"),
    ("averaged over heads, kept per head", partial(_first_token_excess, head_mean="expand"),
     "keep each head's own number: average over batch and queries only, not over heads"),
    ("uniform over all keys, 1/T", partial(_first_token_excess, uniform="1/T"),
     "attention is causal: query i spreads over the i + 1 keys 0..i, so uniform gives key 0 1/(i+1), not 1/T"),
    ("uniform 1/i", partial(_first_token_excess, uniform="1/i"),
     "query i sees i + 1 keys (0..i, itself included): uniform gives key 0 1/(i+1), not 1/i"),
    ("uniform summed", partial(_first_token_excess, reduce="sum"),
     "average the uniform share over the queries (mean of 1/(i+1)), do not sum it"),
    ("query 0 left out of both", partial(_first_token_excess, share_from=1, uniform_from=1),
     "count every query, query 0 included, as F-Attn and uniform_first_token_share do"),
    ("uniform over queries 1..", partial(_first_token_excess, uniform_from=1),
     "average the uniform share over the same queries as the head's share: all of them, query 0 included"),
    ("share over queries 1..", partial(_first_token_excess, share_from=1),
     "average the head's share over the same queries as the uniform share: all of them, query 0 included"),
]


def first_token_excess(fn: Callable) -> Callable:
    """fn(pattern (batch, head, query, key)) -> (head,) tensor; see reference_first_token_excess."""
    cases = [("2 prompts, 3 heads, 9 positions; head 2 a sink, head 1 uniform",
              (_causal_patterns(0, 2, 3, 9, sink_head=2, uniform_head=1),)),
             ("4 prompts, 5 heads, 12 positions; head 0 a sink, head 3 uniform",
              (_causal_patterns(1, 4, 5, 12, sink_head=0, uniform_head=3),)),
             ("3 prompts, 2 heads, 6 positions; head 1 a sink, head 0 uniform",
              (_causal_patterns(2, 3, 2, 6, sink_head=1, uniform_head=0),))]
    raises = [(r"ZeroDivisionError", "query 0 sees one key (itself): uniform attention puts 1/(0 + 1) = 1 on key 0; "
               "use 1/(i+1) for query i")]
    return check("first_token_excess", fn, reference_first_token_excess, cases, MISTAKES["first_token_excess"],
                 atol=1e-6, rtol=1e-5,
                 raises=raises, explain=_explain, index_label=lambda idx: f"head {idx[0]}")
