"""Gate-clamping ablations: perplexity when the attention gates (or, as controls, other parts of the
model) are overridden, with bootstrap error bars, and an engine that runs many conditions at once.

    from minigate import ablation as ab, overrides as ov
    c = ab.chunks(val_tokens, n_chunks=50, chunk_len=256, model=model)  # (50, 257): [bos, 256 tokens] each
    ab.perplexity(model, c)                                             # the learned gates
    ab.perplexity(model, c, ov.set_gates(model, 0.116))                 # every gate fixed at 0.116
    results = ab.sweep(model, c, ab.published_conditions(model, c))     # {name: Perplexity}, batched

What a third-party analysis of the released 1B checkpoints reported (not the paper's; not checked here) (1B
headwise model, WikiText-2, 50 chunks of 512 tokens): PPL 12.39
with the learned gates; every gate fixed at 0.116 (about their mean): 277; all forced to 1: ~251,000;
all forced to 0: ~304,000; the best constant, 0.15: 112; only layer 0 forced open: ~148,000. One
number each, no error bars, no controls. Here every perplexity comes with a bootstrap interval over
chunks, and the controls ask the question those numbers cannot: is the gate special, or does *any*
co-trained part of the network break when it is pinned to a constant?

The overrides themselves (hook lists: `set_gates`, `force_layer`, `close_head`, `scale_output`, `forbid_bos`)
are in overrides.py. This module adds the overrides whose constant is measured, on the unmodified
model over the chunks being scored (`activation_moments`):
    mean_gates    the learned gate replaced by its mean: the input-independent control.
    matched_scale the factor by which forcing a layer's gates to a value changes the RMS of its attention output,
                  so "gates open" and "output scaled up as much (scale_output), gates still input-dependent"
                  compare ("matching magnitude").
    mean_output   a layer's attention output (`blocks.L.hook_attn_out`, after the gate and o_proj) or MLP output
                  (`blocks.L.hook_mlp_out`) replaced by its mean vector over all chunks and positions: the
                  input-independent constant closest (in squared error) to the real outputs.
    fixed_norm    that output rescaled at each position to the mean L2 norm: the direction (content) stays, the
                  input-dependent magnitude is pinned, which is what a clamped gate does to a head's output.
Then the condition sets (`published_conditions`, `control_conditions`, ...), `sweep`, which runs them, and
`rank_layers`, which orders a sweep's per-layer conditions by the damage they do, in nats.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from einops import rearrange, reduce
from tqdm.auto import tqdm

from .data.batches import with_bos
from .evaluation import eval_mode, token_cross_entropy
from .gate_analysis import check_layer
from .hooks import get_act_name
from .overrides import (
    Edit,
    check_gate_heads,
    check_gated,
    close_head,
    force_layer,
    output_hook,
    scale_output,
    set_gates,
)
from .presets import check_seq_len
from .stats import bootstrap_ci

SWEEP_VALUES = (0.0, 0.05, 0.1, 0.116, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0)  # the 10-value constant sweep


# -- chunks and perplexity -------------------------------------------------------------------------------
def chunks(tokens: torch.Tensor, n_chunks: int = 50, chunk_len: int = 512, bos_id: int = 0,
           model=None) -> torch.Tensor:
    """The first n_chunks non-overlapping windows of chunk_len tokens of a 1-d token stream, as a
    (n_chunks, chunk_len + 1) tensor: row i = [bos, window i]. The model reads row[:-1] and is scored
    on predicting row[1:], so every one of the chunk_len tokens is scored (as data.eval_batches does).
    Pass `model` to check chunk_len against the context it was trained for."""
    if tokens.dim() != 1:
        raise ValueError(f"tokens must be one 1-d tensor of ids (data.encode gives one), got shape "
                         f"{tuple(tokens.shape)}")
    if n_chunks < 1 or chunk_len < 1:
        raise ValueError(f"n_chunks={n_chunks}, chunk_len={chunk_len}: both must be at least 1")
    if n_chunks * chunk_len > tokens.numel():
        raise ValueError(f"the corpus has {tokens.numel()} tokens, too few for {n_chunks} chunks of {chunk_len}; "
                         f"use n_chunks <= {tokens.numel() // chunk_len} or a shorter chunk_len")
    if model is not None:
        _check_context(model, chunk_len)
    return with_bos(rearrange(tokens[: n_chunks * chunk_len], "(n l) -> n l", n=n_chunks), bos_id)


def _check_context(model, chunk_len: int):
    n = model.cfg.max_seq_len
    check_seq_len(model.cfg, "chunk_len", chunk_len, f"the model was trained for max_seq_len={n} tokens, and past "
                  f"that the perplexity would measure RoPE's extrapolation too; use chunk_len <= {n}")


def _check_chunks(model, chunk_ids: torch.Tensor):
    if chunk_ids.dim() != 2 or chunk_ids.shape[0] == 0 or chunk_ids.shape[1] < 2:
        raise ValueError(f"chunks must be a (n_chunks, chunk_len + 1) tensor from ablation.chunks(), got shape "
                         f"{tuple(chunk_ids.shape)}")
    _check_context(model, chunk_ids.shape[1] - 1)


@dataclass
class Perplexity:
    """Perplexity over chunks: exp(mean next-token loss), all chunks weighing the same (equal lengths)."""

    ppl: float
    chunk_losses: torch.Tensor  # (n_chunks,) float64: mean next-token loss (nats) of each chunk
    ci: tuple[float, float] | None  # bootstrap interval of ppl, resampling sequences: the chunks (None if ci=False)
    n_tokens: int  # tokens scored: n_chunks * chunk_len

    @property
    def loss(self) -> float:
        return self.chunk_losses.mean().item()

    def __repr__(self):
        ci = f" [{self.ci[0]:.4g}, {self.ci[1]:.4g}]" if self.ci else ""
        return f"Perplexity({self.ppl:.4g}{ci}, {len(self.chunk_losses)} chunks, {self.n_tokens} tokens)"


def _ppl_ci(chunk_losses: torch.Tensor, n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of exp(mean loss), resampling whole chunks: tokens inside a chunk are far from
    independent, chunks (the sequences) are the unit. exp is monotone, so the interval of the mean loss maps over."""
    _, lo, hi = bootstrap_ci(chunk_losses, n_boot=n_boot, ci=level, seed=seed)
    return math.exp(lo.item()), math.exp(hi.item())


def _result(chunk_losses: torch.Tensor, chunk_len: int, ci: bool, n_boot: int) -> Perplexity:
    return Perplexity(ppl=math.exp(chunk_losses.mean().item()), chunk_losses=chunk_losses,
                      ci=_ppl_ci(chunk_losses, n_boot) if ci else None,
                      n_tokens=len(chunk_losses) * chunk_len)


def _losses(model, rows: torch.Tensor) -> torch.Tensor:
    """rows (batch, chunk_len + 1) -> (batch,) mean next-token loss of each row, float64."""
    x, y = rows[:, :-1].to(model.device), rows[:, 1:].to(model.device)
    loss = token_cross_entropy(model(x), y, reduction="none")  # (batch, chunk_len)
    return reduce(loss, "b t -> b", "mean").double().cpu()


@torch.no_grad()
def _looped_losses(model, chunk_ids: torch.Tensor, fwd_hooks, batch_size: int, bar=None) -> torch.Tensor:
    out = []
    with model.hooks(fwd_hooks):
        for i in range(0, chunk_ids.shape[0], batch_size):
            out.append(_losses(model, chunk_ids[i: i + batch_size]))
            if bar is not None:
                bar.update(out[-1].numel())
    return torch.cat(out)


def perplexity(model, chunk_ids: torch.Tensor, fwd_hooks: Iterable[tuple] = (), ci: bool = True,
               n_boot: int = 1000, batch_size: int = 16) -> Perplexity:
    """Perplexity of the model on chunk_ids, the rows of `chunks()`, with `fwd_hooks` attached (any hook
    list, e.g. `overrides.set_gates(model, 0.1)`). Batched over chunks, no gradients."""
    _check_chunks(model, chunk_ids)
    with eval_mode(model):
        losses = _looped_losses(model, chunk_ids, list(fwd_hooks), batch_size)
    return _result(losses, chunk_ids.shape[1] - 1, ci, n_boot)


# -- measured constants: means and norms on the unmodified model -------------------------------------------
@dataclass
class Moments:
    """An activation's statistics over all chunks and positions."""

    mean: torch.Tensor  # the mean, over (chunk, position), of the activation: shape = its trailing dims
    mean_norm: float  # mean L2 norm over the last dim (meaningful for (.., d_model) outputs)
    rms: float  # sqrt(mean of squares) over every element


@torch.no_grad()
def activation_moments(model, chunk_ids: torch.Tensor, names: Iterable[str] | None = None,
                       fwd_hooks: Iterable[tuple] = (), batch_size: int = 16) -> dict[str, Moments]:
    """Moments of the activations at hook points `names` (default: every gate, attention output and
    MLP output) on the chunks, in one pass, without keeping the activations."""
    _check_chunks(model, chunk_ids)
    if names is None:
        names = [n for n in model.hook_dict if n.endswith(("hook_gate", "hook_attn_out", "hook_mlp_out"))]
    sums = defaultdict(lambda: [0.0, 0.0, 0.0, 0])  # sum of x, sum of norms, sum of squares, count

    def accumulate(x, hook):
        s, x = sums[hook.name], x.double()
        s[0] = s[0] + reduce(x, "b t ... -> ...", "sum")
        s[1] += x.norm(dim=-1).sum().item()
        s[2] += x.pow(2).sum().item()
        s[3] += x.shape[0] * x.shape[1]

    with eval_mode(model):
        _looped_losses(model, chunk_ids, list(fwd_hooks) + [(n, accumulate) for n in names], batch_size)
    return {n: Moments(mean=(s[0] / s[3]).float(), mean_norm=s[1] / s[3],
                       rms=math.sqrt(s[2] / (s[3] * (s[0].numel() if torch.is_tensor(s[0]) else 1))))
            for n, s in sums.items()}


def mean_gates(model, chunk_ids: torch.Tensor, layers: Iterable[int] | None = None,
               stats: dict[str, Moments] | None = None) -> list[tuple[str, Edit]]:
    """The learned gate replaced by its mean: the input-independent control. The mean is taken on the
    unmodified model over the same chunks, over every chunk and position (the <bos> position included),
    separately for each layer and head, and for each head dimension of elementwise gates; so what is
    removed is exactly the gate's dependence on the input, not its average level. (A single global mean
    is what that analysis's 0.116 condition approximates: compare the two.) `stats`: from `activation_moments`."""
    names = [get_act_name("gate", L) for L in check_gated(model, layers)]
    stats = stats or activation_moments(model, chunk_ids, names)
    return [(name, Edit("set", stats[name].mean)) for name in names]


# -- controls with a measured constant: the same kinds of override on parts that are not gates -------------
def matched_scale(model, chunk_ids: torch.Tensor, layer: int, value: float = 1.0, batch_size: int = 16) -> float:
    """The factor by which forcing `layer`'s gates to `value` changes the RMS of that layer's attention
    output, measured on the chunks: scale_output(model, layer, matched_scale(...)) changes the output's
    size as much as the gate override does, but keeps the gate's input dependence."""
    name = get_act_name("attn_out", check_layer(model, layer))
    learned = activation_moments(model, chunk_ids, [name], batch_size=batch_size)[name].rms
    forced = activation_moments(model, chunk_ids, [name], force_layer(model, layer, value), batch_size)[name].rms
    return forced / learned


def _output_moments(model, chunk_ids, layer, component, stats) -> tuple[str, Moments]:
    """The hook name of a layer's attention (or MLP) output and its moments (from `stats`, or measured)."""
    name = output_hook(model, layer, component)
    return name, (stats or activation_moments(model, chunk_ids, [name]))[name]


def mean_output(model, chunk_ids: torch.Tensor, layer: int, component: str = "attn",
                stats: dict[str, Moments] | None = None) -> list[tuple[str, Edit]]:
    """A layer's attention (or MLP) output replaced at every position by its mean vector over the chunks."""
    name, m = _output_moments(model, chunk_ids, layer, component, stats)
    return [(name, Edit("set", m.mean))]


def fixed_norm(model, chunk_ids: torch.Tensor, layer: int, component: str = "attn",
               stats: dict[str, Moments] | None = None) -> list[tuple[str, Edit]]:
    """A layer's attention (or MLP) output rescaled, at every position, to its mean L2 norm on the chunks."""
    name, m = _output_moments(model, chunk_ids, layer, component, stats)
    return [(name, Edit("norm", m.mean_norm))]


# -- condition sets ---------------------------------------------------------------------------------------
def _fmt(v: float) -> str:
    return f"{v:g}"


def constant_conditions(model, values: Iterable[float] = SWEEP_VALUES) -> dict[str, list]:
    """{"gates=0.1": set_gates(model, 0.1), ...}: the constant sweep."""
    return {f"gates={_fmt(v)}": set_gates(model, v) for v in values}


def layer_conditions(model, values: dict[str, float] | None = None, layers: Iterable[int] | None = None
                     ) -> dict[str, list]:
    """Every layer (or `layers`) on its own forced open and closed: {"L0 open": ..., "L0 closed": ...}."""
    values = {"open": 1.0, "closed": 0.0} if values is None else values
    return {f"L{L} {word}": force_layer(model, L, v)
            for L in check_gated(model, layers) for word, v in values.items()}


def head_conditions(model, first_layers: int = 3, value: float = 0.0) -> dict[str, list]:
    """Every head of the first `first_layers` layers (all layers if the model has fewer) closed alone."""
    return {f"L{L}H{h} closed" if value == 0 else f"L{L}H{h}={_fmt(value)}": close_head(model, L, h, value)
            for L in check_gated(model)[:first_layers] for h in range(check_gate_heads(model))}


# the setup the 1B ablations were published on: the paper's released 1B models' shape (official-checkpoints.md) and the
# 1B analysis' chunks, 50 WikiText-2 chunks of 512 tokens (forward_flops' arguments)
PUBLISHED_SETUP = dict(params=1.7e9, n_layers=28, n_heads=16, head_dim=128, n_chunks=50, chunk_len=512)


def n_published_conditions(n_layers: int, n_heads: int, first_layers: int = 3) -> int:
    """learned + gates=mean + the constant sweep + every layer open/closed + every head of the first layers."""
    return 2 + len(SWEEP_VALUES) + 2 * n_layers + min(first_layers, n_layers) * n_heads


def forward_flops(params: float, n_layers: int, n_heads: int, head_dim: int, n_chunks: int, chunk_len: int) -> float:
    """Forward FLOPs over the chunks: 2 per parameter per token, plus causal attention (q.k and
    pattern.v, 2 FLOPs per multiply-add, over chunk_len / 2 keys on average)."""
    tokens = n_chunks * chunk_len
    attention = 2 * 2 * n_layers * n_heads * head_dim * (chunk_len / 2)
    return tokens * (2 * params + attention)


def published_conditions(model, chunk_ids: torch.Tensor, first_layers: int = 3,
                         stats: dict[str, Moments] | None = None) -> dict[str, list]:
    """That analysis's ablation set, plus the mean-gate control: learned gates, gates=mean, the 10-value
    constant sweep (it holds the global 0, 0.116 and 1 overrides), every layer open and closed, every
    head of the first three layers closed."""
    return {"learned": [], "gates=mean": mean_gates(model, chunk_ids, stats=stats), **constant_conditions(model),
            **layer_conditions(model), **head_conditions(model, first_layers)}


def control_conditions(model, chunk_ids: torch.Tensor, layers: Iterable[int] | None = None,
                       stats: dict[str, Moments] | None = None) -> dict[str, list]:
    """The controls, per layer (every layer, or `layers`): its attention and MLP outputs replaced by their means
    ("L0 attn mean", "L0 mlp mean"), its attention output pinned to its mean norm ("L0 attn fixed-norm"); and on
    a gated layer, its attention output scaled as much as forcing its gates open would ("L0 attn x matched") and
    its gates replaced by their means ("L0 gates=mean"). Set them beside force_layer(model, L, 1.0)."""
    stats = stats or activation_moments(model, chunk_ids)
    out = {}
    for L in range(model.cfg.n_layers) if layers is None else [check_layer(model, L) for L in layers]:
        if model.cfg.is_gated(L):
            out[f"L{L} attn x matched"] = scale_output(model, L, matched_scale(model, chunk_ids, L, 1.0))
            out[f"L{L} gates=mean"] = mean_gates(model, chunk_ids, [L], stats)
        out[f"L{L} attn mean"] = mean_output(model, chunk_ids, L, "attn", stats)
        out[f"L{L} mlp mean"] = mean_output(model, chunk_ids, L, "mlp", stats)
        out[f"L{L} attn fixed-norm"] = fixed_norm(model, chunk_ids, L, "attn", stats)
    return out


# -- sweeps: looped, or batched along the batch dimension --------------------------------------------------
def _batchable(hooks: list) -> bool:
    return all(isinstance(name, str) and isinstance(fn, Edit) for name, fn in hooks)


def _row_hook(pieces: list[tuple[int, int, Edit]]):
    """One hook for one hook point of a stacked batch: each Edit acts on its own rows only."""

    def apply_rows(x, hook):
        out = x.clone()
        for start, stop, edit in pieces:
            out[start:stop] = edit.apply(out[start:stop])
        return out

    return apply_rows


@torch.no_grad()
def _stacked_losses(model, chunk_ids: torch.Tensor, conditions: list[list[tuple[str, Edit]]], max_batch: int,
                    bar=None) -> torch.Tensor:
    """(n_conditions, n_chunks) losses. The stacked batch is [chunks under condition 0 | chunks under
    condition 1 | ...], cut into forward passes of at most max_batch rows; in each pass every hook point
    gets one hook that applies each condition's Edits to that condition's rows."""
    n, k = chunk_ids.shape[0], len(conditions)
    losses = torch.empty(k * n, dtype=torch.float64)
    for r0 in range(0, k * n, max_batch):
        r1 = min(r0 + max_batch, k * n)
        pieces = defaultdict(list)  # hook name -> [(first row, end row, Edit)], rows local to this pass
        for c in range(r0 // n, (r1 - 1) // n + 1):
            start, stop = max(c * n, r0) - r0, min((c + 1) * n, r1) - r0
            for name, edit in conditions[c]:
                pieces[name].append((start, stop, edit))
        with model.hooks([(name, _row_hook(p)) for name, p in pieces.items()]):
            losses[r0:r1] = _losses(model, chunk_ids[torch.arange(r0, r1) % n])
        if bar is not None:
            bar.update(r1 - r0)
    return rearrange(losses, "(k n) -> k n", k=k)


def sweep(model, chunk_ids: torch.Tensor, conditions: dict[str, list], batched: bool = True, max_batch: int = 32,
          ci: bool = True, n_boot: int = 1000, progress: bool = True) -> dict[str, Perplexity]:
    """Perplexity under each condition (name -> hook list, e.g. from `published_conditions`).

    batched=True: conditions made only of Edits (every override but overrides.forbid_bos) are stacked along the
    batch dimension, max_batch rows per forward pass; the others (any other hook function) run one by one.
    batched=False: one hooked run per condition, max_batch chunks per forward. Both give the same
    numbers (to float rounding, ~1e-6); batching pays off when one condition's chunks are too few to
    keep the hardware busy (small models, or a GPU)."""
    _check_chunks(model, chunk_ids)
    if not conditions:
        raise ValueError("no conditions to run; pass e.g. constant_conditions(model)")
    for name, hooks in conditions.items():
        if not isinstance(hooks, (list, tuple)) or not all(isinstance(p, tuple) and len(p) == 2 for p in hooks):
            raise ValueError(f"conditions[{name!r}] must be a list of (hook name, fn) pairs, "
                             "e.g. overrides.set_gates(model, 0.1); [] for the unmodified model")
    names = list(conditions)
    stacked = [n for n in names if batched and _batchable(conditions[n])]
    looped = [n for n in names if n not in stacked]
    losses = {}
    with eval_mode(model), tqdm(total=len(names) * chunk_ids.shape[0], unit="chunk", disable=not progress,
                                desc="ablation sweep") as bar:
        if stacked:
            rows = _stacked_losses(model, chunk_ids, [list(conditions[n]) for n in stacked], max_batch, bar)
            losses.update(zip(stacked, rows, strict=True))
        for n in looped:
            losses[n] = _looped_losses(model, chunk_ids, list(conditions[n]), max_batch, bar)
    return {n: _result(losses[n], chunk_ids.shape[1] - 1, ci, n_boot) for n in names}


# -- reading results ------------------------------------------------------------------------------------
def rank_layers(results: dict[str, Perplexity], kind: str = "open") -> list[tuple[int, float]]:
    """[(layer, damage)], most damaging first, for a sweep's per-layer conditions.

    `results` is a sweep's {condition name: Perplexity} with a "learned" entry; the conditions ranked are the
    ones named exactly "L{layer} {kind}" (as `layer_conditions` names them: kind "open" or "closed", or any word
    of `layer_conditions(values=...)`); others, such as "L0H3 closed" or "gates=0.5", are ignored. Damage is the
    loss increase over the learned model in nats per token, r.loss - learned.loss = ln(ppl / ppl_learned)."""
    if "learned" not in results:
        raise ValueError("results need a 'learned' entry (the unmodified model) to measure damage against")
    base = results["learned"].loss
    pattern = re.compile(rf"L(\d+) {re.escape(kind)}")
    ranked = [(int(m[1]), r.loss - base) for name, r in results.items() if (m := pattern.fullmatch(name))]
    return sorted(ranked, key=lambda pair: pair[1], reverse=True)
