"""Lesson 08's checks: loss spikes, and Qwen3-Next's gated q_proj in minigate's layout."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from einops import rearrange

from .engine import NONE_HINT, Mismatch, Mistake, check, randn, what

EXERCISES = ("loss_spikes", "qwen3_next_q_proj")  # its check cells, in the lesson's order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried

# ── loss spikes ──────────────────────────────────────────────────────────────────────────────────────

def reference_loss_spikes(losses, factor, window):
    """The 1-based steps whose loss is above `factor` times the mean of the `window` losses just before it;
    a step needs `window` earlier losses to be judged (what train() records in History.spikes)."""
    x = torch.as_tensor(losses, dtype=torch.float64)
    if x.numel() <= window:
        return []
    csum = torch.cat([torch.zeros(1, dtype=torch.float64), x.cumsum(0)])
    i = torch.arange(window, x.numel())  # 0-based indices with `window` predecessors
    mean_before = (csum[i] - csum[i - window]) / window
    return (i[x[i] > factor * mean_before] + 1).tolist()


def _loss_spikes(losses, factor, window, *, one_based=True, include_self=False, partial=False, all_previous=False,
                 span=None):
    """Plain loop with switches for the typical mistakes (span: how many earlier losses are averaged, if not
    `window`; a step is judged once it has that many)."""
    span = window if span is None else span
    out = []
    for i, loss in enumerate(losses):
        before = losses[max(0, i + 1 - span): i + 1] if include_self else losses[:i] if all_previous \
            else losses[max(0, i - span): i]
        if not before or (i < span and not partial):
            continue
        if loss > factor * sum(before) / len(before):
            out.append(i + 1 if one_based else i)
    return out


def _is_step(x) -> bool:
    if isinstance(x, torch.Tensor):
        x = x.item() if x.numel() == 1 and not x.is_complex() and x.dtype != torch.bool else None
    elif type(x).__module__ == "numpy" and not getattr(x, "shape", ()):
        x = x.item()
    return isinstance(x, (int, float)) and not isinstance(x, bool) and float(x).is_integer()


def _steps(f: Callable) -> Callable:
    """f(losses, factor, window) -> spike steps  ==>  the same as a long tensor, or a Mismatch that names what
    the function returned instead of a list of steps."""
    def run(losses, factor, window):
        out = f(losses, factor, window)
        if out is None:
            raise Mismatch(NONE_HINT)
        if isinstance(out, torch.Tensor):
            out = out.flatten().tolist()
        if isinstance(out, (set, frozenset)):
            raise Mismatch("return a list of the spike steps in increasing order, not a set")
        if not isinstance(out, (list, tuple, range)):
            raise Mismatch(f"return a list of the spike steps (ints), got {what(out)}")
        if any(isinstance(x, bool) for x in out):
            raise Mismatch("return the spike steps themselves (e.g. [40, 90]), not a True/False per step")
        bad = next((x for x in out if not _is_step(x)), "none")
        if bad != "none":
            raise Mismatch(f"each spike is a step number (an int); your list holds {what(bad)}")
        return torch.tensor([int(float(x)) for x in out], dtype=torch.long)
    return run


def _which_steps(got, want):
    """Which flagged steps are not spikes, and which spikes are missed."""
    if not (isinstance(got, torch.Tensor) and got.dim() == 1):
        return None
    g, w = got.tolist(), want.tolist()
    extra, missing = sorted(set(g) - set(w)), sorted(set(w) - set(g))
    if not extra and not missing:
        return "return each spike step once, in increasing order" if g != w else None
    return "; ".join(([f"step(s) {extra} flagged but not spikes"] if extra else [])
                     + ([f"spike step(s) {missing} missed"] if missing else []))


def _spike_cases():
    """(label, (losses, factor, window)) cases; the fourth holds a borderline step (see its comment)."""
    def curve(seed, n, spikes, decay=0.02, noise=0.05):  # spikes: {step (1-based): height factor}
        base = 2.0 + 6.0 * torch.exp(-decay * torch.arange(n, dtype=torch.float64))
        for step, height in spikes.items():
            base[step - 1] *= height
        return (base + randn(n, seed=seed).double() * noise).tolist()

    # step 30 of the fourth case is a borderline: 1.23x is below factor x the mean of the 5 losses before it
    # (they hold the 1.25x spike at step 25) but above factor x the mean of the 4 just before it
    return [("120 steps, spikes at 40 and 90, factor 1.5, window 20", (curve(0, 120, {40: 2, 90: 2}), 1.5, 20)),
            ("a spike at step 4, inside the first window", (curve(1, 60, {4: 1.6, 30: 1.6}), 1.3, 10)),
            ("fast early decline, two spikes in a row",
             (curve(2, 50, {12: 1.5, 13: 1.5, 35: 1.5}, decay=0.15), 1.2, 5)),
            ("a small spike (1.25x) at factor 1.2, and 1.23x just `window` steps after it",
             (curve(3, 40, {25: 1.25, 30: 1.23}, decay=0.0, noise=0.01), 1.2, 5)),
            ("no spikes", (curve(4, 40, {}), 1.5, 10))]


MISTAKES["loss_spikes"] = [
    ("0-based", partial(_loss_spikes, one_based=False),
     "steps are 1-based, as in History.step: the first loss is step 1, so losses[i] is step i + 1"),
    ("own loss included", partial(_loss_spikes, include_self=True),
     "the running mean is over the `window` losses *before* the step; including the step's own loss dampens "
     "the spike it should reveal"),
    ("partial windows", partial(_loss_spikes, partial=True),
     "no step is judged before `window` earlier losses exist: steps 1..window are never spikes"),
    ("window - 1 losses", lambda losses, factor, window: _loss_spikes(losses, factor, window, span=window - 1),
     "average the `window` losses before step i, losses[i - window:i] (0-based i): that is window losses, "
     "not window - 1"),
    ("window + 1 losses", lambda losses, factor, window: _loss_spikes(losses, factor, window, span=window + 1),
     "average the `window` losses before step i, losses[i - window:i] (0-based i): that is window losses, "
     "not window + 1"),
    ("every earlier loss", partial(_loss_spikes, all_previous=True),
     "use the mean of the last `window` losses only, not of every earlier loss: the loss falls during "
     "training, so an old mean is too high and hides spikes"),
]


def loss_spikes(fn: Callable) -> Callable:
    """fn(losses: list of floats, factor, window) -> list of the 1-based steps that are loss spikes."""
    cases = _spike_cases()
    return check("loss_spikes", fn, reference_loss_spikes, cases, MISTAKES["loss_spikes"], atol=0, rtol=0,
                 explain=_which_steps, wrap=_steps)


# ── Qwen3-Next's gated q_proj in minigate's layout ───────────────────────────────────────────────────

def reference_qwen3_next_q_proj(weight, n_heads, n_kv_heads, head_dim):
    """Qwen3-Next's q_proj weight (n_heads * 2 * head_dim, d_model), whose rows come per query head as
    [query_h | gate_h], -> minigate's G1 elementwise layout: per kv head, [queries of its group | their gates]."""
    g, D = n_heads // n_kv_heads, head_dim
    rows = []
    for kv in range(n_kv_heads):
        heads = range(kv * g, (kv + 1) * g)  # the query heads that share kv head `kv`
        rows += [h * 2 * D + i for h in heads for i in range(D)]  # their queries: first half of each head's rows
        rows += [h * 2 * D + D + i for h in heads for i in range(D)]  # then their gates: the second half
    return weight[rows]


def _qwen3_next_q_proj(weight, n_heads, n_kv_heads, head_dim, *, source="per head", gate_first=False,
                       group="(kv g)", target="per kv group", inner="g d"):
    """einops version with switches for the typical mistakes."""
    two = "(two h d)" if source == "all queries first" else "(h two d)"
    w = rearrange(weight, f"{two} m -> h two d m", two=2, h=n_heads)
    if gate_first:
        w = w.flip(1)
    if target == "unchanged":
        return weight
    if target == "all queries first":
        return rearrange(w, "h two d m -> (two h d) m")
    w = rearrange(w, f"{group} two d m -> kv two g d m", kv=n_kv_heads)
    return rearrange(w, f"kv two g d m -> (kv two {inner}) m")


MISTAKES["qwen3_next_q_proj"] = [
    ("unchanged", partial(_qwen3_next_q_proj, target="unchanged"),
     "the rows need reordering: Qwen3-Next has per query head [query_h | gate_h], minigate per kv head "
     "[queries of its group heads | gates of those heads]"),
    ("gate first", partial(_qwen3_next_q_proj, gate_first=True),
     "in each head's 2 * head_dim rows Qwen3-Next puts the query first, then the gate (torch.chunk(..., 2) "
     "returns query_states, gate)"),
    ("source all queries first", partial(_qwen3_next_q_proj, source="all queries first"),
     "Qwen3-Next's rows are not [all queries | all gates]: its forward views q_proj's output as "
     "(..., n_heads, 2 * head_dim), so each head's query and gate rows sit together"),
    ("target all queries first", partial(_qwen3_next_q_proj, target="all queries first"),
     "the gates go after the queries of their own kv group, not after all queries (the two agree only "
     "when n_kv_heads = 1)"),
    ("(g kv)", partial(_qwen3_next_q_proj, group="(g kv)"),
     "query head h shares kv head h // (n_heads // n_kv_heads): consecutive heads form a group, heads are "
     "not dealt out to the kv heads in turn"),
    ("(d g)", partial(_qwen3_next_q_proj, inner="d g"),
     "within a group the rows go head by head, each head's head_dim rows together: '(g d)', not '(d g)'"),
]


def qwen3_next_q_proj(fn: Callable) -> Callable:
    """fn(weight (n_heads * 2 * head_dim, d_model), n_heads, n_kv_heads, head_dim) -> the same rows reordered
    into minigate's per-kv-group G1 elementwise layout (see reference_qwen3_next_q_proj)."""
    shapes = [(4, 2, 4, 8), (6, 3, 2, 4), (8, 2, 2, 3), (4, 1, 4, 8)]  # (heads, kv heads, head_dim, d_model)
    cases = [(f"h={H} kv={K} d={D}", (randn(H * 2 * D, M, seed=i), H, K, D)) for i, (H, K, D, M) in enumerate(shapes)]
    return check("qwen3_next_q_proj", fn, reference_qwen3_next_q_proj, cases, MISTAKES["qwen3_next_q_proj"], atol=0,
                 rtol=0)
