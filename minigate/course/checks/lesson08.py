"""Lesson 08's checks: how much a model's predictions depend on the context, Qwen3-Next's gated q_proj in
minigate's layout, and the capstone: which of these models has a gate, judged on models the lesson never shows."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch
from einops import einsum, rearrange

from .engine import NONE_HINT, Mismatch, Mistake, check, randn

EXERCISES = ("prediction_spread", "qwen3_next_q_proj", "has_gate")  # its check cells, in the lesson's order
MISTAKES: dict[str, list[Mistake]] = {}  # exercise -> its typical mistakes, each with its hint, in the order tried

# ── prediction spread ────────────────────────────────────────────────────────────────────────────────

def reference_prediction_spread(logits):
    """logits (batch, pos, vocab) -> the mean over every (window, position) of KL(p_i || p_mean), in nats: p_i the
    predicted next-token distribution there, p_mean the mean of all of them. Computed as entropies: the mean of
    KL(p_i || p_mean) is H(p_mean) - mean_i H(p_i) (the mutual information between the position and the token)."""
    p = logits.double().softmax(-1).flatten(0, -2)  # (batch * pos, vocab)
    entropy = lambda q: -torch.special.xlogy(q, q).sum(-1)
    return (entropy(p.mean(0)) - entropy(p).mean()).item()


def _prediction_spread(logits, *, reverse=False, mean_of="probs", over=(0, 1), softmax_dim=-1, vocab="sum",
                       log=math.log, reduce="mean"):
    """Direct KL(p_i || p_mean) with switches for the typical mistakes."""
    logp = logits.double().log_softmax(softmax_dim)
    p = logp.exp()
    mean = p.mean(over, keepdim=True) if mean_of == "probs" else logits.double().mean(over, keepdim=True).softmax(-1)
    logm = mean.log()
    kl = mean * (logm - logp) if reverse else p * (logp - logm)  # (batch, pos, vocab)
    kl = (kl.sum(-1) if vocab == "sum" else kl.mean(-1)) / log(math.e)  # (batch, pos), in nats or in bits
    if reduce == "batchmean":  # F.kl_div(..., reduction="batchmean") on (batch, pos, vocab): sum / batch
        return (kl.sum() / logits.shape[0]).item()
    return kl.mean().item()


MISTAKES["prediction_spread"] = [
    ("KL the other way round", partial(_prediction_spread, reverse=True),
     "KL(p_i || p_mean) weights log(p_i / p_mean) by p_i, each position's own prediction, not by p_mean "
     "(F.kl_div(input, target) computes KL(target || input), with input in log space)"),
    ("softmax of the mean logits", partial(_prediction_spread, mean_of="logits"),
     "p_mean is the mean of the predicted probabilities, softmax(logits).mean(...), not the softmax of the mean "
     "logits"),
    ("mean over the batch only", partial(_prediction_spread, over=0),
     "p_mean averages the predictions over every position of every window (dims 0 and 1), not per position over "
     "the batch"),
    ("mean over each window only", partial(_prediction_spread, over=1),
     "p_mean averages the predictions over every window too (dims 0 and 1), not within each window"),
    ("softmax over positions", partial(_prediction_spread, softmax_dim=1),
     "each prediction is a distribution over the vocabulary: softmax over the last dimension"),
    ("softmax over windows", partial(_prediction_spread, softmax_dim=0),
     "each prediction is a distribution over the vocabulary: softmax over the last dimension (F.softmax without "
     "dim picks dim 0 on a 3-d tensor)"),
    ("mean over the vocabulary", partial(_prediction_spread, vocab="mean"),
     "KL sums over the vocabulary; only the positions (and windows) are averaged"),
    ("in bits", partial(_prediction_spread, log=math.log2),
     "in nats, like the loss: the natural log, not log2"),
    ("kl_div batchmean", partial(_prediction_spread, reduce="batchmean"),
     "average over positions as well: F.kl_div's reduction='batchmean' divides by the first dimension only (the "
     "batch), so on (batch, pos, vocab) it is pos times too large; flatten to (batch * pos, vocab) first"),
]


def prediction_spread(fn: Callable) -> Callable:
    """fn(logits (batch, pos, vocab)) -> the mean KL, in nats, from each position's predicted next-token distribution
    to the mean of all of them (see reference_prediction_spread)."""
    def logits(shape, seed, scale):
        return randn(*shape, seed=seed) * scale

    same = logits((1, 1, 6), 5, 2.0).expand(3, 4, 6).clone()  # one prediction everywhere
    cases = [("2 windows of 3 positions, 5 tokens", (logits((2, 3, 5), 0, 1.0),)),
             ("4 x 6 positions, 7 tokens, peaked predictions", (logits((4, 6, 7), 1, 4.0),)),
             ("1 window of 5 positions", (logits((1, 5, 4), 2, 2.0),)),
             ("3 windows of 1 position", (logits((3, 1, 6), 3, 2.0),)),
             ("8 x 16 positions, 50 tokens, nearly flat", (logits((8, 16, 50), 4, 0.3),)),
             ("the same prediction everywhere: 0", (same,))]
    return check("prediction_spread", fn, reference_prediction_spread, cases, MISTAKES["prediction_spread"],
                 raises=[(r"cannot be converted to (a )?Scalar|only one element tensors",
                          "average down to a single number (over windows and positions) before .item()"),
                         (r"softmax\(\) (received an invalid|missing)",
                          "give softmax / log_softmax the vocabulary axis: dim=-1")])


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


# ── the capstone: which of these models has a gate? ─────────────────────────────────────────────────────

@dataclass(frozen=True)
class Snapshot:
    """What the capstone lets a classifier see of a model run on some tokens: per layer, the attention patterns
    and the residual stream before and after attention. Nothing of the gate: no hook_gate, no parameters, no config."""
    patterns: tuple  # per layer: (batch, head, query_pos, key_pos)
    resid_pre: tuple  # per layer: (batch, pos, d_model), the residual stream entering the block
    resid_mid: tuple  # per layer: (batch, pos, d_model), after attention added its output, before the MLP

    def __repr__(self) -> str:
        b, h, t, _ = self.patterns[0].shape
        return f"Snapshot({len(self.patterns)} layers, {h} heads, d_model {self.resid_pre[0].shape[-1]}, {b} x {t})"


@torch.no_grad()
def snapshot(model, tokens) -> Snapshot:
    """model run on tokens (batch, pos), keeping blocks.L.attn.hook_pattern, hook_resid_pre and hook_resid_mid."""
    L = range(model.cfg.n_layers)
    keep = lambda name: name.endswith(("attn.hook_pattern", "hook_resid_pre", "hook_resid_mid"))
    _, cache = model.run_with_cache(tokens.to(model.device), names_filter=keep)
    get = lambda hook: tuple(cache[f"blocks.{layer}.{hook}"].float().cpu() for layer in L)
    return Snapshot(get("attn.hook_pattern"), get("hook_resid_pre"), get("hook_resid_mid"))


def anonymous_models(seed: int = 0) -> dict[str, Snapshot]:
    """The lesson's six: the shipped code trio on 16 held-out prose windows of 64 tokens and the copy trio on 16 rows,
    shuffled and named A-F. reveal(seed) says which is which."""
    from ... import data, measure
    from ..release import shipped

    prose = measure.prose_windows(data.DEFAULT_TOKENIZER)[:16, :64]
    rows = data.copy_task(16, seed=11)[:, :-1]
    shots = [(name, snapshot(shipped(name), prose if name.startswith("code") else rows)) for name in _SHOWN]
    order = list(range(len(shots)))
    random.Random(seed).shuffle(order)
    return {"ABCDEF"[k]: shots[i][1] for k, i in enumerate(order)}


_SHOWN = [f"{task}-{name}" for task in ("code", "copy") for name in ("baseline", "headwise", "elementwise")]


def reveal(seed: int = 0) -> dict[str, str]:
    """{letter: the shipped model behind it} of anonymous_models(seed)."""
    order = list(range(len(_SHOWN)))
    random.Random(seed).shuffle(order)
    return {"ABCDEF"[k]: _SHOWN[i] for k, i in enumerate(order)}


def _unseen(seed: int, gate: str, granularity: str = "headwise", n_layers: int = 2, n_heads: int = 4,
            n_kv_heads: int = 2, d_model: int = 32, head_dim: int = 8) -> Snapshot:
    """An untrained model of a shape the lesson never shows, on 16 random rows of 32 tokens (<bos> first)."""
    from ...config import ModelConfig
    from ...model import Transformer

    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=80, d_model=d_model, n_layers=n_layers, n_heads=n_heads, n_kv_heads=n_kv_heads,
                      head_dim=head_dim, d_ff=2 * d_model, gate=gate, gate_granularity=granularity)
    tokens = torch.randint(1, 80, (16, 32), generator=torch.Generator().manual_seed(seed))
    tokens[:, 0] = 0
    return snapshot(Transformer(cfg).eval(), tokens)


def held_out() -> list[tuple[str, list[tuple[Snapshot, bool]]]]:
    """The check's models, none of them shown in the lesson: (what they are, [(snapshot, has a gate)])."""
    from ... import data
    from ..release import shipped

    rows = data.induction_task(16, seed=12)[:, :-1]
    trained = [(snapshot(shipped(f"induction-{n}"), rows), n != "baseline")
               for n in ("elementwise", "baseline", "headwise")]
    untrained = [(_unseen(21, "G1"), True), (_unseen(22, "none"), False),
                 (_unseen(23, "G1", "elementwise", n_layers=3, n_heads=3, n_kv_heads=1, d_model=48, head_dim=16), True),
                 (_unseen(24, "none", n_layers=3, n_heads=3, n_kv_heads=1, d_model=48, head_dim=16), False),
                 (_unseen(25, "none", n_heads=2, n_kv_heads=2, head_dim=16), False)]
    return [("the shipped induction trio (another task), shuffled", trained),
            ("five untrained models of other shapes (GQA, MQA, 2-3 layers), shuffled", untrained)]


def _attention_out_share(s: Snapshot, normed: bool = True, mix: str = "keys") -> float:
    """The largest share, over layers, of attention's output (resid_mid - resid_pre) that no linear map of the
    attention-mixed normed input explains: for query i and head h, m_hi = sum_j pattern_h[i, j] x_j / rms(x_j);
    the output is one least-squares fit on every head's m side by side. An ungated layer's output is such a map
    (o_proj of each head's v_proj of its m, RMSNorm's weight folded in): its share is float rounding."""
    shares = []
    for p, pre, mid in zip(s.patterns, s.resid_pre, s.resid_mid, strict=True):
        x = pre.double()
        if normed:
            x = x / x.pow(2).mean(-1, keepdim=True).sqrt()
        if mix == "keys":
            m = einsum(p.double(), x, "b h i j, b j e -> b i h e")
        else:  # "none": each position's own input, no mixing
            m = x[:, :, None].expand(-1, -1, p.shape[1], -1)
        m = rearrange(m, "b i h e -> (b i) (h e)")
        y = rearrange((mid - pre).double(), "b i e -> (b i) e")
        residual = y - m @ torch.linalg.lstsq(m, y, driver="gelsd").solution
        shares.append((residual.pow(2).sum() / y.pow(2).sum()).item())
    return max(shares)


ROUNDING = 1e-5  # an ungated layer's share is float32 rounding (1e-7 and below); a gate's, however faint, is more


def reference_has_gate(s: Snapshot) -> bool:
    """Whether attention's output is non-linear in its mixed input beyond rounding, in some layer."""
    return _attention_out_share(s) > ROUNDING


def _by_first_token(s: Snapshot, below: float = 0.05) -> bool:
    """A sink-based rule: gated when the mean first-token attention above uniform is small."""
    excess = []
    for p in s.patterns:
        t = p.shape[-1]
        uniform = (1 / torch.arange(1, t + 1, dtype=p.dtype)).mean()
        excess.append(p[..., 0].mean() - uniform)
    return bool(torch.stack(excess).mean() < below)


def _by_m_act(s: Snapshot, below: float = 100.0) -> bool:
    """An activation-based rule: gated when M-Act (each layer's largest |residual|, averaged) is small."""
    return bool(torch.stack([mid.abs().max() for mid in s.resid_mid]).mean() < below)


def _by_share(s: Snapshot, above: float = ROUNDING, **how) -> bool:
    return _attention_out_share(s, **how) > above


MISTAKES["has_gate"] = [  # tried in this order; each names what the learner's verdicts show
    ("less first-token attention", _by_first_token,
     "first-token attention is an effect the gate may have, not its signature: an untrained model attends almost "
     "uniformly, gate or not (and on the copy task the gated models attend *more* to <bos>). Look for what only a "
     "gate can do to attention's output"),
    ("a fit of the raw residual stream", partial(_by_share, normed=False),
     "every model judged gated, the baseline too: an ungated layer's output is exactly linear (to rounding) in its "
     "attention-mixed *normed* input, sum_j pattern[i, j] x_j / rms(x_j), one least-squares map for all heads. "
     "Whatever your rule measures, the baseline has it too"),
    ("a threshold far above rounding", partial(_by_share, above=1e-2),
     "an ungated model's share is float rounding (1e-7 and below), but a faint gate (an untrained model's scores "
     "hardly move from 0.5) leaves only about 1e-3: anything clearly above rounding is a gate"),
]


def has_gate(fn: Callable) -> Callable:
    """fn(Snapshot) -> bool, run on models the lesson never shows: the shipped induction trio and untrained models of
    other shapes. Passes when it names every gated model and no other."""
    cases = [(label, (tuple(s for s, _ in models),)) for label, models in held_out()]

    def verdicts(f):
        def run(shots):
            got = tuple(f(s) for s in shots)
            if any(g is None for g in got):
                raise Mismatch(NONE_HINT)
            if not all(isinstance(g, (bool, torch.Tensor)) and torch.as_tensor(g).numel() == 1 for g in got):
                raise Mismatch("return one bool per snapshot: True when you judge the model to have a gate")
            return torch.tensor([float(bool(g)) for g in got], dtype=torch.float64)  # 1: judged gated
        return run

    def explain(got, want):
        got, want = got.tolist(), want.tolist()
        missed = sum(bool(w) and not g for g, w in zip(got, want, strict=True))
        false = sum(bool(g) and not w for g, w in zip(got, want, strict=True))
        return (f"{missed} gated model(s) judged ungated and {false} ungated model(s) judged gated: which property "
                "of attention's output can only a gate change?")

    return check("has_gate", fn, reference_has_gate, cases, MISTAKES["has_gate"], atol=0, rtol=0, wrap=verdicts,
                 explain=explain)
