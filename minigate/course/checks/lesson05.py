"""Lesson 05's checks: where the gate closes (by phase of a copy row), and the first token's gate with a CI."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from .engine import Mistake, check
from .lesson02 import QUERY0_HINT, SEPARATOR_HINT, _copy_model, _copy_parts  # copy-task rows, as in lesson 02

EXERCISES = ("gate_by_phase", "first_rest_ratio")  # its check cells, in the lesson's order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried


def _gated_model(seed: int, granularity: str, n_layers: int = 3):
    """A small seeded G1 model in eval mode: what lessons 05 and 06 check exercises on."""
    from ... import ModelConfig, Transformer

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layers=n_layers, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=48,
                      gate="G1", gate_granularity=granularity)
    return Transformer(cfg).eval()


def reference_gate_by_phase(model, tokens, layer, n_random):
    """tokens (batch, pos): copy-task rows (<bos>, n_random random symbols, the separator, the copy) -> (2, head):
    the mean gate score (blocks.{layer}.attn.hook_gate, the sigmoid) of each head of `layer`, over the rows and the
    random part's queries 1..n_random (row 0), then over the copy part's queries n_random + 1 .. (row 1, separator
    included). An elementwise gate is averaged over each head's d_head dimensions too."""
    return _gate_by_phase(model, tokens, layer, n_random)


@torch.no_grad()
def _gate_by_phase(model, tokens, layer, n_random, hook="hook_gate", start=1, split=0, average="dims",
                   squash=False):
    """The reference with switches for the typical mistakes."""
    name = f"blocks.{layer}.attn.{hook}"
    _, cache = model.run_with_cache(tokens, names_filter=name)
    g = cache[name].float()  # (batch, pos, head) headwise, (batch, pos, head, d_head) elementwise
    g = torch.sigmoid(g) if squash else g
    if g.dim() == 4 and average == "dims":
        g = g.mean(-1)  # (batch, pos, head)
    elif g.dim() == 4 and average == "heads":
        g = g.mean(2)  # (batch, pos, d_head): wrong
    parts = _copy_parts(g, n_random, start=start, split=split)
    return torch.stack([p.mean((0, 1)) for p in parts])  # (2, head)


MISTAKES["gate_by_phase"] = [
    ("logits", partial(_gate_by_phase, hook="hook_gate_logits"),
     "those are the gate *logits* (hook_gate_logits, any real number); the scores that multiply the head's "
     "output are their sigmoid, in (0, 1): read blocks.{layer}.attn.hook_gate"),
    ("sigmoid twice", partial(_gate_by_phase, squash=True),
     "hook_gate already holds the sigmoid scores: taking the sigmoid again squeezes them into (0.5, 0.73)"),
    ("query 0 in", partial(_gate_by_phase, start=0), QUERY0_HINT),
    ("separator in the random part", partial(_gate_by_phase, split=1), SEPARATOR_HINT),
    ("no d_head average", partial(_gate_by_phase, average="none"),
     "an elementwise gate has one score per head dimension, (batch, pos, head, d_head): average over d_head "
     "(the last axis) too, to get one number per head"),
    ("average heads", partial(_gate_by_phase, average="heads"),
     "that averages an elementwise gate over the heads; average over each head's d_head dimensions (the last "
     "axis) instead"),
]


def gate_by_phase(fn: Callable) -> Callable:
    """fn(model, tokens, layer, n_random) -> (2, head); see reference_gate_by_phase."""
    (m0, t0), (m1, t1), (m2, t2) = _copy_model(0, "G1"), _copy_model(1, "G1", "elementwise"), _copy_model(3, "G1")
    cases = [("tiny headwise model, layer 1, 6 random", (m0, t0, 1, 6)),
             ("tiny elementwise model, layer 0, 5 random", (m1, t1, 0, 5)),
             ("tiny headwise model, layer 0, 4 random", (m2, t2, 0, 4))]
    raises = [(r"KeyError", "the gate scores are at blocks.{layer}.attn.hook_gate: keep that name in names_filter")]
    return check("gate_by_phase", fn, reference_gate_by_phase, cases, MISTAKES["gate_by_phase"], atol=1e-6,
                 rtol=1e-5, raises=raises)


def reference_first_rest_ratio(per_prompt, seed=0):
    """per_prompt: a list of (pos,) tensors, the gate score of every token of one prompt (position 0: the first
    token) -> (ratio, low, high): the mean gate on the first tokens divided by the mean gate on every later token
    (pooled over all later tokens, so a long prompt counts more), and its 95% percentile bootstrap interval
    that resamples whole prompts (stats.bootstrap_ci: 1000 resamples drawn with `seed`)."""
    return _first_rest_ratio(per_prompt, seed)


def _first_rest_ratio(per_prompt, seed=0, ratio="pooled", first_in_rest=False, unit="prompt", invert=False,
                      fixed_seed=False):
    from ...stats import bootstrap_ci

    seed = 0 if fixed_seed else seed
    start = 0 if first_in_rest else 1
    if unit == "token":  # every token a unit: (token, 2) = (is first, gate)
        rows = torch.cat([torch.stack([torch.arange(len(p)) == 0, p.double()], 1).double() for p in per_prompt])

        def stat(x, dim):
            first, g = x.unbind(-1)
            f, r = (g * first).sum(dim) / first.sum(dim), (g * (1 - first)).sum(dim) / (1 - first).sum(dim)
            return r / f if invert else f / r

        return tuple(bootstrap_ci(rows, stat=stat, seed=seed))
    n_rest = lambda p: torch.tensor(len(p) - start, dtype=torch.float64)
    units = torch.stack([torch.stack([p[0].double(), p[start:].double().sum(), n_rest(p)])
                         for p in per_prompt])  # (prompt, 3): first gate, sum and number of the later gates

    def stat(x, dim):
        f, s, n = x.unbind(-1)
        if ratio == "per_prompt":
            r = f / (s / n)
            return (1 / r).mean(dim) if invert else r.mean(dim)
        rest = (s / n).mean(dim) if ratio == "prompt_means" else s.sum(dim) / n.sum(dim)
        return rest / f.mean(dim) if invert else f.mean(dim) / rest

    return tuple(bootstrap_ci(units, stat=stat, seed=seed))


MISTAKES["first_rest_ratio"] = [
    ("upside down", partial(_first_rest_ratio, invert=True),
     "the ratio is upside down: first-token mean / later-token mean (below 1 when the first token is gated more)"),
    ("first in rest", partial(_first_rest_ratio, first_in_rest=True),
     "the 'rest' includes the first token: average the gates at positions 1.. only"),
    ("per-prompt ratios", partial(_first_rest_ratio, ratio="per_prompt"),
     "that is the mean of per-prompt ratios; take the ratio of the two means instead (first-token mean over "
     "prompts / later-token mean pooled over every later token)"),
    ("prompt means", partial(_first_rest_ratio, ratio="prompt_means"),
     "the later tokens' mean weights every prompt equally; pool them: (sum of all later gates) / (number of "
     "later tokens), so a long prompt counts more, as the reported numbers do"),
    ("tokens resampled", partial(_first_rest_ratio, unit="token"),
     "that resamples tokens; tokens of one prompt are not independent: resample whole prompts (one row per "
     "prompt holding its first gate, the sum of its later gates and their number)"),
    ("seed ignored", partial(_first_rest_ratio, fixed_seed=True),
     "the interval ignores `seed`: pass it on (bootstrap_ci(..., seed=seed))"),
]


OWN_BOOTSTRAP_HINT = ("your ratio is right, your interval is not bootstrap_ci's: the check compares it with the exact "
                      "resamples minigate.stats.bootstrap_ci(units, stat=..., seed=seed) draws, so a bootstrap of "
                      "your own, even a correct one, draws others and gives another interval; draw them through "
                      "bootstrap_ci")


def _own_bootstrap(got, want):
    """The hint for a right ratio with an interval from some other bootstrap (got, want: 3-tuples, as_tree'd)."""
    if isinstance(got, tuple) and len(got) == 3 and all(isinstance(x, torch.Tensor) and x.numel() == 1 for x in got):
        if torch.isclose(got[0].double().reshape(()), want[0].double(), atol=1e-6, rtol=1e-5):
            return OWN_BOOTSTRAP_HINT
    return None


def first_rest_ratio(fn: Callable) -> Callable:
    """fn(per_prompt: list of (pos,) tensors, seed=0) -> (ratio, low, high); see reference_first_rest_ratio. The
    interval must be bootstrap_ci's own (the same resamples, from `seed`): another bootstrap, even a correct one, gets
    OWN_BOOTSTRAP_HINT, which says so."""
    def prompts(seed, n, max_len):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(3, max_len + 1, (n,), generator=g).tolist()
        out = []
        for length in lengths:
            p = torch.sigmoid(torch.randn(length, generator=g) - 1)  # gate scores in (0, 1)
            p[0] = p[0] * 0.4  # a first token with a lower gate, as in the paper
            out.append(p)
        return out

    cases = [("12 prompts of 3-12 tokens, seed 0", (prompts(0, 12, 12), 0)),
             ("20 prompts of 3-30 tokens, seed 1", (prompts(1, 20, 30), 1)),
             ("3 prompts, seed 2", (prompts(2, 3, 8), 2))]
    return check("first_rest_ratio", fn, reference_first_rest_ratio, cases, MISTAKES["first_rest_ratio"],
                 atol=1e-6, rtol=1e-5, explain=_own_bootstrap)
