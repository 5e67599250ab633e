"""Lesson 05's checks: where the gate closes (by phase of a copy row), and the first token's gate with a CI."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from functools import partial

import torch

from .engine import NONE_HINT, Mismatch, Mistake, check, what
from .lesson02 import QUERY0_HINT, SEPARATOR_HINT, _copy_model, _copy_parts  # copy-task rows, as in lesson 02

EXERCISES = ("gate_by_phase", "first_rest_ratio")  # its check cells, in the lesson's order
NO_EFFECT_SEED = 5  # the seed of first_rest_ratio's case with no planted effect
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
    token) -> (ratio, low, high, gated_more): the mean gate on the first tokens divided by the mean gate on every later
    token (pooled over all later tokens, so a long prompt counts more), its 95% percentile bootstrap interval that
    resamples whole prompts (stats.bootstrap_ci: 1000 resamples drawn with `seed`; tokens of one prompt are not
    independent draws), and whether the data support "the first token is gated more": the whole interval below 1."""
    return _first_rest_ratio(per_prompt, seed)


def _first_rest_ratio(per_prompt, seed=0, ratio="pooled", first_in_rest=False, unit="prompt", invert=False,
                      fixed_seed=False, verdict="interval"):
    from ...stats import bootstrap_ci

    seed = 0 if fixed_seed else seed
    start = 0 if first_in_rest else 1
    if unit == "token":  # every token a unit: (token, 2) = (is first, gate)
        rows = torch.cat([torch.stack([torch.arange(len(p)) == 0, p.double()], 1).double() for p in per_prompt])

        def stat(x, dim):
            first, g = x.unbind(-1)
            f, r = (g * first).sum(dim) / first.sum(dim), (g * (1 - first)).sum(dim) / (1 - first).sum(dim)
            return r / f if invert else f / r

        return _with_verdict(bootstrap_ci(rows, stat=stat, seed=seed), verdict)
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

    return _with_verdict(bootstrap_ci(units, stat=stat, seed=seed), verdict)


def _with_verdict(interval, verdict="interval"):
    """(ratio, low, high) -> (ratio, low, high, gated_more), the verdict by the rule `verdict` names."""
    ratio, low, high = interval
    gated_more = {"interval": high < 1, "point": ratio < 1, "excludes 1": not low <= 1 <= high}[verdict]
    return ratio, low, high, bool(gated_more)


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
     "that resamples tokens; tokens of one prompt are not independent (a prompt's gates rise and fall together), so "
     "the interval comes out too narrow: resample whole prompts (one row per prompt holding its first gate, the sum "
     "of its later gates and their number)"),
    ("seed ignored", partial(_first_rest_ratio, fixed_seed=True),
     "the interval ignores `seed`: pass it on (bootstrap_ci(..., seed=seed))"),
    ("the point estimate decides", partial(_first_rest_ratio, verdict="point"),
     "a ratio below 1 in one sample is not yet evidence: here the interval reaches past 1, so another sample of "
     "prompts could give a ratio above it. Claim 'gated more' only when the whole interval lies below 1"),
    ("an interval off 1 on either side", partial(_first_rest_ratio, verdict="excludes 1"),
     "an interval wholly above 1 says the first token is gated *less*: 'gated more' needs the whole interval below "
     "1 (high < 1)"),
]


OWN_BOOTSTRAP_HINT = ("your ratio is right, your interval is not bootstrap_ci's: the check compares it with the exact "
                      "resamples minigate.stats.bootstrap_ci(units, stat=..., seed=seed) draws, so a bootstrap of "
                      "your own, even a correct one, draws others and gives another interval; draw them through "
                      "bootstrap_ci")


def _own_bootstrap(got, want):
    """The hint for a right ratio with an interval from some other bootstrap (got, want: _read_four's tensors)."""
    if isinstance(got, torch.Tensor) and got.shape == want.shape == (4,):
        if torch.isclose(got[0], want[0], atol=1e-6, rtol=1e-5) and not torch.allclose(got[1:3], want[1:3]):
            return OWN_BOOTSTRAP_HINT
    return None


def _read_four(fn: Callable) -> Callable:
    """fn(per_prompt, seed) -> (ratio, low, high, gated_more)  ==>  a float64 tensor of the four (True: 1.0)."""
    def run(per_prompt, seed):
        out = fn(per_prompt, seed)
        if out is None:
            raise Mismatch(NONE_HINT)
        if not isinstance(out, (tuple, list)) or len(out) != 4:
            raise Mismatch(f"return four things, (ratio, low, high, gated_more); got {what(out)}")
        values = [x.item() if isinstance(x, torch.Tensor) and x.numel() == 1 else x for x in out]
        for name, v in zip(("ratio", "low", "high"), values, strict=False):
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise Mismatch(f"{name}: expected a number, got {what(v)}")
        if not isinstance(values[3], bool):
            raise Mismatch(f"gated_more: True or False, your verdict on the claim; got {what(values[3])}")
        return torch.tensor([float(v) for v in values], dtype=torch.float64)
    return run


def _prompts(seed: int, n: int, max_len: int, first: float = 0.4) -> list[torch.Tensor]:
    """n prompts of 3..max_len tokens, gate scores in (0, 1), the first token's scaled by `first`."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(3, max_len + 1, (n,), generator=g).tolist()
    out = []
    for length in lengths:
        p = torch.sigmoid(torch.randn(length, generator=g) - 1)  # gate scores in (0, 1)
        p[0] = p[0] * first
        out.append(p)
    return out


def _no_effect(seed: int, n: int = 6, length: int = 40) -> list[torch.Tensor]:
    """n prompts whose later gates sit at a level of their own (0.2 to 0.8, as prompts differ), and a first token with
    the same gate in every prompt, 0.5: the mean level, so no planted effect (a true ratio of 1)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        level = 0.2 + 0.6 * torch.rand((), generator=g)
        p = (level + 0.03 * torch.randn(length, generator=g)).clamp(0.01, 0.99)
        p[0] = 0.5
        out.append(p)
    return out


def first_rest_ratio(fn: Callable) -> Callable:
    """fn(per_prompt: list of (pos,) tensors, seed=0) -> (ratio, low, high, gated_more); see
    reference_first_rest_ratio. Two cases are planted: one with no effect, whose ratio is below 1 by chance (the
    interval over prompts reaches past 1, one over tokens does not), and one whose first token is gated *less*. The
    interval must be bootstrap_ci's own (the same resamples, from `seed`): another bootstrap, even a correct one, gets
    OWN_BOOTSTRAP_HINT, which says so."""
    cases = [("12 prompts of 3-12 tokens, seed 0", (_prompts(0, 12, 12), 0)),
             ("20 prompts of 3-30 tokens, seed 1", (_prompts(1, 20, 30), 1)),
             ("3 prompts, seed 2", (_prompts(2, 3, 8), 2)),
             (f"6 prompts that differ, no planted effect, seed {NO_EFFECT_SEED}", (_no_effect(NO_EFFECT_SEED), 3)),
             ("30 prompts, the first token gated less, seed 4", (_prompts(4, 30, 20, first=1.6), 4))]
    return check("first_rest_ratio", fn, reference_first_rest_ratio, cases, MISTAKES["first_rest_ratio"],
                 atol=1e-6, rtol=1e-5, explain=_own_bootstrap, wrap=_read_four)
